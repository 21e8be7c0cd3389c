"""Scale-in that loses nothing: a platform team scales a ModelGroup in while users stream tokens.

Each story runs the operator (`goodput run --standalone`), the live vLLM emulator (`goodput emulate`:
every leader an emulated vLLM 0.33 at its pod IP, timed like Llama-3.1-8B on an H100, draining on
SIGTERM for its `--shutdown-timeout` as vLLM does) and the load generator (`goodput load`: open-loop
streaming requests to the ready endpoints of a Service selecting the leaders, refreshed every 2 s,
as a router following EndpointSlices would) against the session cluster, on a GPU node of the
test's own. What the load generator saw is compared with what the operator recorded: Events,
`status.drain`, and its `goodput_drain_*` metrics.
"""

from __future__ import annotations

import json
import random
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from goodput.api.times import parse_rfc3339
from goodput.operator.engine import parse_leader_metrics
from goodput.testbed.cluster.controlplane import LocalCluster
from goodput.testbed.cluster.testing import wait_for
from goodput.testbed.crash_points import CRASH_POINTS
from goodput.testbed.operator_process import (
    EmulatorProcess,
    LoadProcess,
    OperatorProcess,
    operator_metric,
)

pytestmark = pytest.mark.e2e

POOL_LABEL = "e2e.goodput.dev/pool"
SERVED = "llama"
PORT = 8000
LABEL_MODEL_GROUP = "goodput.dev/model-group"
MODEL_GROUP_PATH = "/apis/goodput.dev/v1alpha1/namespaces/{namespace}/modelgroups/" + SERVED
SETTLE_SECONDS = 5.0
"""The operator's default `drain_settle_seconds`."""


@dataclass(frozen=True)
class Request:
    at_seconds: float
    output_tokens: int
    input_tokens: int = 64


def write_trace(path: Path, requests: list[Request]) -> str:
    """A Mooncake-style JSONL trace: exactly these requests, no shared prefixes."""
    lines = [
        json.dumps(
            {
                "timestamp": round(r.at_seconds * 1000),
                "input_length": r.input_tokens,
                "output_length": r.output_tokens,
                "hash_ids": [],
            }
        )
        for r in sorted(requests, key=lambda r: r.at_seconds)
    ]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def steady(rate: float, seconds: float, tokens: tuple[int, int], seed: int) -> list[Request]:
    """Evenly spaced arrivals with a little jitter, output lengths uniform in `tokens`."""
    rng = random.Random(seed)
    count = int(rate * seconds)
    return [
        Request(at_seconds=(i + rng.uniform(0, 0.5)) / rate, output_tokens=rng.randint(*tokens))
        for i in range(count)
    ]


def model_group(namespace: str, replicas: int, *, max_seconds: int, shutdown_seconds: int = 30) -> str:
    body = {
        "apiVersion": "goodput.dev/v1alpha1",
        "kind": "ModelGroup",
        "metadata": {"name": SERVED, "namespace": namespace},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "revision": "main", "servedName": SERVED},
            "engine": {
                "image": "vllm/vllm-openai:v0.33.0",
                "port": PORT,
                "shutdownTimeoutSeconds": shutdown_seconds,
            },
            "parallelism": {"tensor": 1, "pipeline": 1, "gpusPerPod": 1},
            "placement": {"nodeSelector": [{"key": POOL_LABEL, "value": namespace}]},
            "replicas": replicas,
            "minReplicas": 1,
            "maxReplicas": 4,
            "profile": {"gpu": "h100-80g"},
            "readiness": {"warmup": {"maxTokens": 4, "timeoutSeconds": 10}},
            "drain": {"maxSeconds": max_seconds, "onTimeout": "Abort", "minLifetimeSeconds": 0},
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": SERVED, "namespace": namespace},
        "spec": {
            "selector": {LABEL_MODEL_GROUP: SERVED, "goodput.dev/rank": "0"},
            "ports": [{"name": "http", "port": PORT, "targetPort": PORT}],
        },
    }
    return yaml.safe_dump_all([body, service])


# Fixtures: a GPU node of the test's own, the emulator, the operator.


@pytest.fixture
def gpu_node(cluster: LocalCluster, namespace: str) -> Iterator[str]:
    node = cluster.add_gpu_node(
        f"{namespace}-n0", zone=f"{namespace}-z0", clique=f"{namespace}-c0", labels={POOL_LABEL: namespace}
    )
    try:
        yield node.name
    finally:
        cluster.remove_node(node.name)


@pytest.fixture
def emulator(cluster: LocalCluster, namespace: str, tmp_path: Path) -> Iterator[EmulatorProcess]:
    with EmulatorProcess(cluster, namespace, tmp_path / "emulator.log") as running:
        yield running


@pytest.fixture
def operator(
    cluster: LocalCluster,
    namespace: str,
    tmp_path: Path,
    *,
    goodput_crds: list[str],
    gpu_node: str,
    emulator: EmulatorProcess,
) -> Iterator[OperatorProcess]:
    """The operator, started after the CRDs, the GPU node and the emulator, and stopped before them."""
    with OperatorProcess(cluster, namespace, tmp_path / "operator.log") as running:
        yield running


# Reading the cluster.


def status(cluster: LocalCluster, namespace: str) -> dict[str, Any]:
    found = cluster.api.get(MODEL_GROUP_PATH.format(namespace=namespace)) or {}
    return dict(found.get("status") or {})


def events(cluster: LocalCluster, namespace: str, reason: str) -> list[dict[str, Any]]:
    answer = cluster.api.get(f"/api/v1/namespaces/{namespace}/events?fieldSelector=reason%3D{reason}")
    return sorted(answer["items"] if answer else [], key=lambda e: e.get("lastTimestamp") or "")


def live_pods(cluster: LocalCluster, namespace: str) -> dict[str, dict[str, Any]]:
    answer = cluster.api.get(f"/api/v1/namespaces/{namespace}/pods?labelSelector={LABEL_MODEL_GROUP}")
    return {
        pod["metadata"]["name"]: pod
        for pod in (answer["items"] if answer else [])
        if not pod["metadata"].get("deletionTimestamp")
    }


def groups(cluster: LocalCluster, namespace: str) -> set[str]:
    return {pod["metadata"]["labels"]["goodput.dev/group"] for pod in live_pods(cluster, namespace).values()}


def ready_endpoints(cluster: LocalCluster, namespace: str) -> set[str]:
    answer = cluster.api.get(
        f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"
        f"?labelSelector=kubernetes.io/service-name%3D{SERVED}"
    )
    return {
        endpoint["targetRef"]["name"]
        for item in (answer["items"] if answer else [])
        for endpoint in item.get("endpoints") or ()
        if (endpoint.get("conditions") or {}).get("ready")
    }


def running_on(address: str) -> int:
    """Requests the engine at `address` is generating for now (its own /metrics page)."""
    with urllib.request.urlopen(f"http://{address}:{PORT}/metrics", timeout=5) as answer:
        sample = parse_leader_metrics(answer.read().decode(), datetime.now(UTC))
    return sample.running if sample is not None else 0


def describe(cluster: LocalCluster, namespace: str, operator: OperatorProcess) -> str:
    return f"status {json.dumps(status(cluster, namespace))}\noperator log:\n{operator.log_tail(25)}"


def serving(cluster: LocalCluster, namespace: str, operator: OperatorProcess, count: int) -> dict[str, str]:
    """Wait for `count` ready groups, each leader in the Service's ready endpoints; their leader IPs."""
    wait_for(
        lambda: (
            status(cluster, namespace).get("readyGroups") == count
            and len(ready_endpoints(cluster, namespace)) == count
        ),
        timeout_seconds=120,
        describe=lambda: f"{count} ready groups serving\n{describe(cluster, namespace, operator)}",
    )
    return {
        pod["metadata"]["labels"]["goodput.dev/group"]: pod["status"]["podIP"]
        for pod in live_pods(cluster, namespace).values()
    }


def scale(cluster: LocalCluster, namespace: str, replicas: int) -> None:
    cluster.api.patch(MODEL_GROUP_PATH.format(namespace=namespace), {"spec": {"replicas": replicas}})


def draining_group(cluster: LocalCluster, namespace: str) -> str:
    def found() -> str:
        draining = [
            g["name"] for g in status(cluster, namespace).get("groups", []) if g["state"] == "Draining"
        ]
        return draining[0] if draining else ""

    return str(wait_for(found, timeout_seconds=30, describe="a draining group"))


def drain_metric(operator: OperatorProcess, name: str, **labels: str) -> float:
    value = operator_metric(
        operator.metrics_port, name, {"namespace": operator.namespace, "model_group": SERVED, **labels}
    )
    return 0.0 if value is None else value


def assert_no_request_lost(report: dict[str, Any]) -> None:
    failed = {outcome: n for outcome, n in report["outcomes"].items() if outcome != "ok" and n}
    assert not failed, f"the load generator saw failures: {failed}"
    assert report["outcomes"]["ok"] == report["sent"] == report["planned"], report
    assert report["not_sent"] == {"concurrency_limit": 0, "deadline": 0, "no_target": 0}, report


def show(title: str, drain: dict[str, Any], report: dict[str, Any]) -> None:
    """The figures of a story, for the record (pytest -s)."""
    print(f"\n[{title}] drains: {json.dumps(drain)}")
    print(f"[{title}] load: sent {report['sent']}, outcomes {report['outcomes']}")
    print(f"[{title}] requests per leader: {report['by_target']}")


# The stories.


def test_scaling_in_while_requests_stream_loses_no_stream(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    cluster.kubectl("apply", "-f", "-", input=model_group(namespace, 3, max_seconds=120))
    leaders = serving(cluster, namespace, operator, 3)
    # About 9 streams in flight per group, each 2 to 5 s long.
    trace = write_trace(tmp_path / "steady.jsonl", steady(6, 40, (250, 700), seed=1))
    load = LoadProcess(cluster, f"{namespace}/{SERVED}", trace, tmp_path / "load.json", 40).start()
    try:
        time.sleep(10)
        scale(cluster, namespace, 1)
        wait_for(
            lambda: (status(cluster, namespace).get("drain") or {}).get("drained") == 2,
            timeout_seconds=90,
            describe=lambda: f"two drains finished\n{describe(cluster, namespace, operator)}",
        )
        report = load.report()
    finally:
        load.stop()

    assert_no_request_lost(report)
    final = status(cluster, namespace)
    drain = final["drain"]
    show("3 -> 1", drain, report)
    assert (drain["timedOut"], drain["requestsAborted"]) == (0, 0)
    removed = {record["group"] for record in drain["recent"]}
    assert len(removed) == 2 and groups(cluster, namespace) == set(leaders) - removed
    for record in drain["recent"]:
        assert record["outcome"] == "Drained"
        # Each drained group had streams in flight when admission closed, and finished them.
        assert record["requestsFinished"] >= 1, record
        assert record["durationSeconds"] >= SETTLE_SECONDS
        # Its leader had been sent requests, and every one of them completed.
        assert report["by_target"].get(f"http://{leaders[record['group']]}:{PORT}", 0) > 0
    assert len(events(cluster, namespace, "DrainStarted")) == 2
    finished_events = events(cluster, namespace, "DrainFinished")
    assert sorted(e["message"].split()[1] for e in finished_events) == sorted(removed)
    assert events(cluster, namespace, "DrainTimedOut") == []
    assert drain_metric(operator, "goodput_drains_total", outcome="Drained") == 2
    assert drain_metric(operator, "goodput_drain_duration_seconds_count", outcome="Drained") == 2
    assert drain_metric(operator, "goodput_drain_requests_finished_total") == drain["requestsFinished"]
    assert drain_metric(operator, "goodput_drain_requests_aborted_total") == 0
    assert final["readyGroups"] == 1 and final["drainingGroups"] == 0


def test_a_drain_that_runs_out_of_time_counts_exactly_what_it_aborted(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    # vLLM aborts at once on SIGTERM (--shutdown-timeout 0); the drain gives up after 6 s.
    cluster.kubectl("apply", "-f", "-", input=model_group(namespace, 2, max_seconds=6, shutdown_seconds=0))
    leaders = serving(cluster, namespace, operator, 2)
    # Ten streams of 4000 tokens (about 30 s each), then four short ones that finish in ~1.5 s.
    requests = [Request(0.2 * i, 4000) for i in range(10)] + [Request(3 + 0.2 * i, 200) for i in range(4)]
    trace = write_trace(tmp_path / "long.jsonl", requests)
    load = LoadProcess(cluster, f"{namespace}/{SERVED}", trace, tmp_path / "load.json", 5).start()
    try:
        time.sleep(4.2)
        scale(cluster, namespace, 1)
        victim = draining_group(cluster, namespace)
        wait_for(
            lambda: (status(cluster, namespace).get("drain") or {}).get("timedOut") == 1,
            timeout_seconds=60,
            describe=lambda: f"the drain timed out\n{describe(cluster, namespace, operator)}",
        )
        report = load.report()
    finally:
        load.stop()

    drain = status(cluster, namespace)["drain"]
    show("timeout", drain, report)
    (record,) = drain["recent"]
    assert (record["group"], record["outcome"], record["onTimeout"]) == (victim, "TimedOut", "Abort")
    assert 6 <= record["durationSeconds"] < 6 + 10
    # What the clients saw aborted is what the operator counted, in status and in its metrics.
    aborted = report["outcomes"]["aborted"]
    assert aborted >= 1
    assert record["requestsAborted"] == drain["requestsAborted"] == aborted
    assert drain_metric(operator, "goodput_drain_requests_aborted_total") == aborted
    assert drain_metric(operator, "goodput_drains_total", outcome="TimedOut") == 1
    # Nothing else went wrong, and only the victim's requests were aborted.
    assert report["outcomes"]["ok"] + aborted == report["sent"] == len(requests), report
    assert aborted + record["requestsFinished"] <= report["by_target"][f"http://{leaders[victim]}:{PORT}"]
    (timed_out,) = events(cluster, namespace, "DrainTimedOut")
    assert f"{aborted} request(s) aborted" in timed_out["message"]
    assert groups(cluster, namespace) == set(leaders) - {victim}


def test_restarting_the_operator_mid_drain_finishes_the_drain_without_losing_or_duplicating_a_group(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    cluster.kubectl("apply", "-f", "-", input=model_group(namespace, 2, max_seconds=120))
    leaders = serving(cluster, namespace, operator, 2)
    # Streams of 11 to 15 s: the draining group keeps work in flight across the restart.
    trace = write_trace(tmp_path / "long.jsonl", steady(1, 30, (1500, 2000), seed=3))
    load = LoadProcess(cluster, f"{namespace}/{SERVED}", trace, tmp_path / "load.json", 30).start()
    try:
        # Whichever group is drained, it has work in flight (the load's start-up can take seconds).
        wait_for(
            lambda: all(running_on(address) >= 1 for address in leaders.values()),
            timeout_seconds=30,
            describe="both leaders generating",
        )
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


def test_a_scale_out_during_a_drain_puts_the_draining_group_back_in_service(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    cluster.kubectl("apply", "-f", "-", input=model_group(namespace, 2, max_seconds=120))
    leaders = serving(cluster, namespace, operator, 2)
    uids = {name: pod["metadata"]["uid"] for name, pod in live_pods(cluster, namespace).items()}
    trace = write_trace(tmp_path / "long.jsonl", steady(1, 30, (1500, 2000), seed=4))
    load = LoadProcess(cluster, f"{namespace}/{SERVED}", trace, tmp_path / "load.json", 30).start()
    try:
        # Whichever group is drained, it has work in flight (the load's start-up can take seconds).
        wait_for(
            lambda: all(running_on(address) >= 1 for address in leaders.values()),
            timeout_seconds=30,
            describe="both leaders generating",
        )
        scale(cluster, namespace, 1)
        victim = draining_group(cluster, namespace)
        wait_for(
            lambda: f"{SERVED}-{victim}-0" not in ready_endpoints(cluster, namespace),
            timeout_seconds=30,
            describe="the draining leader out of the endpoints",
        )
        scale(cluster, namespace, 2)
        cancelled = wait_for(
            lambda: events(cluster, namespace, "DrainCancelled"),
            timeout_seconds=30,
            describe=lambda: f"the drain cancelled\n{describe(cluster, namespace, operator)}",
        )
        # Back in service: ready again and in the Service's endpoints, the same pods.
        serving(cluster, namespace, operator, 2)
        report = load.report()
    finally:
        load.stop()

    assert_no_request_lost(report)
    final = status(cluster, namespace)
    show("cancel", final.get("drain") or {}, report)
    assert victim in cancelled[0]["message"]
    assert {name: pod["metadata"]["uid"] for name, pod in live_pods(cluster, namespace).items()} == uids
    assert groups(cluster, namespace) == set(leaders)
    assert len(events(cluster, namespace, "GroupCreated")) == 2
    assert (final["drain"]["cancelled"], final["drain"]["drained"], final["drain"]["timedOut"]) == (1, 0, 0)
    assert drain_metric(operator, "goodput_drains_total", outcome="Cancelled") == 1
    annotations = cluster.api.get(f"/api/v1/namespaces/{namespace}/pods/{SERVED}-{victim}-0")["metadata"][
        "annotations"
    ]
    assert "goodput.dev/draining-since" not in annotations and "goodput.dev/drain-progress" not in annotations
    assert {g["state"] for g in final["groups"]} == {"Ready"}


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
        time.sleep(8)
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
