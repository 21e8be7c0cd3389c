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

import time
from pathlib import Path

import drain_stories
import pytest
from drain_stories import (
    PORT,
    SERVED,
    SETTLE_SECONDS,
    Request,
    assert_no_request_lost,
    describe,
    drain_metric,
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

from goodput.testbed.cluster.controlplane import LocalCluster
from goodput.testbed.cluster.testing import wait_for
from goodput.testbed.operator_process import LoadProcess, OperatorProcess

pytestmark = pytest.mark.e2e

# The fixtures the stories take, by name.
gpu_node = drain_stories.gpu_node
emulator = drain_stories.emulator
operator = drain_stories.operator


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
        every_leader_generating(leaders)
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
        every_leader_generating(leaders)  # the first two long streams, 0.2 s into the load
        time.sleep(3.8)  # the four short ones in flight too
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


def test_a_scale_out_during_a_drain_puts_the_draining_group_back_in_service(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    cluster.kubectl("apply", "-f", "-", input=model_group(namespace, 2, max_seconds=120))
    leaders = serving(cluster, namespace, operator, 2)
    uids = {name: pod["metadata"]["uid"] for name, pod in live_pods(cluster, namespace).items()}
    trace = write_trace(tmp_path / "long.jsonl", steady(1, 30, (1500, 2000), seed=4))
    load = LoadProcess(cluster, f"{namespace}/{SERVED}", trace, tmp_path / "load.json", 30).start()
    try:
        every_leader_generating(leaders)
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
