"""Drains that outlive the operator: it is SIGKILLed mid-drain (at each step of a scale-in, through
the test bed's crash points, or while a drain is in flight) and restarted with no memory; every drain
still ends once, announced and counted, and no group is lost or created twice. The bed is the one of
e2e/test_drain.py (e2e/drain_stories.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import drain_stories
import pytest
from drain_stories import (
    MODEL_GROUP_PATH,
    SERVED,
    assert_no_request_lost,
    describe,
    draining_group,
    events,
    every_leader_generating,
    groups,
    live_pods,
    model_group,
    ready_endpoints,
    scale,
    serving,
    show,
    status,
    steady,
    write_trace,
)

from goodput.api.times import parse_rfc3339
from goodput.testbed.cluster.controlplane import LocalCluster
from goodput.testbed.cluster.testing import wait_for
from goodput.testbed.crash_points import CRASH_POINTS
from goodput.testbed.operator_process import LoadProcess, OperatorProcess

pytestmark = pytest.mark.e2e

# The fixtures the stories take, by name.
gpu_node = drain_stories.gpu_node
emulator = drain_stories.emulator
operator = drain_stories.operator


def test_restarting_the_operator_mid_drain_finishes_the_drain_without_losing_or_duplicating_a_group(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    cluster.kubectl("apply", "-f", "-", input=model_group(namespace, 2, max_seconds=120))
    leaders = serving(cluster, namespace, operator, 2)
    # Streams of 11 to 15 s: the draining group keeps work in flight across the restart.
    trace = write_trace(tmp_path / "long.jsonl", steady(1, 30, (1500, 2000), seed=3))
    load = LoadProcess(cluster, f"{namespace}/{SERVED}", trace, tmp_path / "load.json", 30).start()
    try:
        every_leader_generating(leaders)
        scale(cluster, namespace, 1)
        victim = draining_group(cluster, namespace)
        (survivor,) = set(leaders) - {victim}
        leader = f"{SERVED}-{victim}-0"

        def baseline_recorded() -> dict[str, Any]:
            marked = cluster.api.get(f"/api/v1/namespaces/{namespace}/pods/{leader}")["metadata"][
                "annotations"
            ]
            progress = json.loads(marked.get("goodput.dev/drain-progress") or "{}")
            return marked if "baseline" in progress else {}

        # Kill it once the drain's start and the leader's counters at that start are on the pod.
        marked = wait_for(
            baseline_recorded, timeout_seconds=20, describe="the drain's baseline on the leader"
        )
        started = marked["goodput.dev/draining-since"]
        in_flight_at_start = json.loads(marked["goodput.dev/drain-progress"])["baseline"]["inFlight"]
        operator.stop(kill=True)
        killed_at = time.monotonic()
        time.sleep(3)
        # While no operator runs the group stays out of service, whole.
        assert set(groups(cluster, namespace)) == set(leaders)
        assert leader not in ready_endpoints(cluster, namespace)
        operator.start()
        wait_for(
            lambda: (status(cluster, namespace).get("drain") or {}).get("drained") == 1,
            timeout_seconds=90,
            describe=lambda: (
                f"the drain finished after the restart\n{describe(cluster, namespace, operator)}"
            ),
        )
        finished_after_restart = time.monotonic() - killed_at
        report = load.report()
    finally:
        load.stop()

    assert_no_request_lost(report)
    final = status(cluster, namespace)
    drain = final["drain"]
    show("restart", drain, report)
    (record,) = drain["recent"]
    assert record["group"] == victim and record["outcome"] == "Drained"
    # The drain resumed from the cluster: its start is the one recorded before the restart.
    recorded_start, annotated_start = parse_rfc3339(record["startedAt"]), parse_rfc3339(started)
    assert recorded_start is not None and annotated_start is not None
    assert recorded_start == annotated_start.replace(microsecond=0)
    assert record["durationSeconds"] >= 3
    # Counted from the counters read before the restart: at least what was in flight then.
    assert record["requestsFinished"] >= in_flight_at_start >= 1
    assert finished_after_restart < 60
    # No group lost, none created twice: the survivor serves, nothing else exists.
    assert groups(cluster, namespace) == {survivor} and final["readyGroups"] == 1
    assert len(events(cluster, namespace, "GroupCreated")) == 2
    assert len(events(cluster, namespace, "DrainFinished")) == 1
    annotations = cluster.api.get(MODEL_GROUP_PATH.format(namespace=namespace))["metadata"]["annotations"]
    assert annotations["goodput.dev/group-counter"] == "2"


# Issue 18: the operator SIGKILLed at each step of a scale-in's drains, under load, then restarted.


def victim_names(events_of_kind: list[dict[str, Any]]) -> list[str]:
    return [event["message"].split()[1] for event in events_of_kind]


@pytest.mark.parametrize("step", sorted(CRASH_POINTS), ids=lambda step: step)
def test_an_operator_killed_at_any_step_of_a_scale_in_finishes_every_drain_once(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, tmp_path: Path, step: str
) -> None:
    cluster.kubectl("apply", "-f", "-", input=model_group(namespace, 3, max_seconds=120))
    leaders = serving(cluster, namespace, operator, 3)
    # The same operator, started through the test bed's crash point: it SIGKILLs itself after `step`.
    operator.stop()
    operator.kill_at = step
    operator.start()
    trace = write_trace(tmp_path / "steady.jsonl", steady(6, 40, (250, 700), seed=7))
    load = LoadProcess(cluster, f"{namespace}/{SERVED}", trace, tmp_path / "load.json", 40).start()
    try:
        every_leader_generating(leaders)
        scale(cluster, namespace, 1)
        process = operator.process
        assert process is not None
        wait_for(
            lambda: process.poll() is not None,
            timeout_seconds=60,
            describe=lambda: f"the operator killed {CRASH_POINTS[step].describe}\n{operator.log_tail(25)}",
        )
        assert process.returncode == -9, operator.log_tail(25)
        time.sleep(2)
        operator.kill_at = None
        operator.start()
        wait_for(
            lambda: (
                (status(cluster, namespace).get("drain") or {}).get("drained", 0)
                + (status(cluster, namespace).get("drain") or {}).get("timedOut", 0)
                == 2
                and len(groups(cluster, namespace)) == 1
            ),
            timeout_seconds=150,
            describe=lambda: f"both drains ended after the restart\n{describe(cluster, namespace, operator)}",
        )
        report = load.report()
    finally:
        load.stop()

    final = status(cluster, namespace)
    drain = final["drain"]
    show(f"killed {step}", drain, report)
    removed = {record["group"] for record in drain["recent"]}
    assert len(removed) == 2 and groups(cluster, namespace) == set(leaders) - removed
    # Every victim announced its drain, and the end of each drain was announced exactly once.
    assert set(victim_names(events(cluster, namespace, "DrainStarted"))) == removed
    ends = victim_names(events(cluster, namespace, "DrainFinished")) + victim_names(
        events(cluster, namespace, "DrainTimedOut")
    )
    assert sorted(ends) == sorted(removed), ends
    # No victim was deleted as a not-yet-serving group (the drain cut short, judged Warming).
    assert not [e for e in events(cluster, namespace, "GroupDeleted") if e["message"].split()[1] in removed]
    # No stream was cut without being counted as aborted.
    cut = sum(n for outcome, n in report["outcomes"].items() if outcome != "ok")
    assert cut == drain["requestsAborted"], (report["outcomes"], drain)
    assert report["sent"] == report["planned"], report
    assert final["readyGroups"] == 1 and final["drainingGroups"] == 0


def test_an_idle_drain_resumed_after_the_operator_was_away_past_its_limit_ends_drained_not_timed_out(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess
) -> None:
    """The operator dies as its drain takes an idle group out of service and stays away longer than
    the drain's limit and its final-reading grace (10 s + 5 s); the engines idle all along. The
    operator that comes back reads the leader before it judges the limit, counted from its return."""
    cluster.kubectl("apply", "-f", "-", input=model_group(namespace, 2, max_seconds=10))
    serving(cluster, namespace, operator, 2)
    operator.stop()
    operator.kill_at = "drain-gated"
    operator.start()
    scale(cluster, namespace, 1)
    process = operator.process
    assert process is not None
    wait_for(
        lambda: process.poll() is not None,
        timeout_seconds=60,
        describe=lambda: f"the operator killed after the drain's gate\n{operator.log_tail(25)}",
    )
    assert process.returncode == -9, operator.log_tail(25)
    (victim,) = {
        pod["metadata"]["labels"]["goodput.dev/group"]
        for pod in live_pods(cluster, namespace).values()
        if "goodput.dev/draining-since" in (pod["metadata"].get("annotations") or {})
    }
    time.sleep(17)
    operator.kill_at = None
    operator.start()
    restarted = time.monotonic()
    wait_for(
        lambda: len((status(cluster, namespace).get("drain") or {}).get("recent") or ()) == 1,
        timeout_seconds=60,
        describe=lambda: f"the drain ended after the restart\n{describe(cluster, namespace, operator)}",
    )
    ended_after_restart = time.monotonic() - restarted
    drain = status(cluster, namespace)["drain"]
    (record,) = drain["recent"]
    print(
        f"\n[resumed idle drain] {record['outcome']} {ended_after_restart:.1f} s after the restart, "
        f"{record['durationSeconds']} s in all (limit 10 s): {json.dumps(drain)}"
    )
    assert (record["group"], record["outcome"]) == (victim, "Drained"), describe(cluster, namespace, operator)
    assert record["durationSeconds"] > 15 and record["requestsAborted"] == 0
    assert len(events(cluster, namespace, "DrainFinished")) == 1
    assert events(cluster, namespace, "DrainTimedOut") == []
