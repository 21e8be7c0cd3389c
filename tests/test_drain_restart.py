"""A drain survives an operator killed at any write: the loop against a fake API server that keeps
what was written, killed at each write of a scale-in in turn, then restarted with no memory.

Issue 18 found two holes: a drain vanished when the operator died after deleting the pods and
before writing status, and a drain cut short after its gates but before its marks became a deletion
without a drain. Here every write of a whole scale-in (drain start, progress, end, record, deletion)
is a crash point, and after each the restarted operator must finish the same drain: every victim
announced, its end announced and recorded exactly once with exact counts, and no rank taken out of
service without a mark or deleted before its drain is recorded.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import threading
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import kopf
import pytest
from server_side_apply import AppliedStatus

from goodput.api.reasons import EventReason
from goodput.api.times import parse_rfc3339
from goodput.controllers import naming
from goodput.controllers.events import EventRecord
from goodput.controllers.groups.drain import (
    DrainProgress,
    LeaderSample,
    encode_progress,
    parse_outcome,
    parse_progress,
)
from goodput.controllers.groups.model import WarmupOutcome
from goodput.controllers.groups.observation import parse_node, parse_pod
from goodput.controllers.groups.placement import GpuClaim
from goodput.operator.handlers import Indexes, ModelGroupLoop, PlanWrites, Runtime
from goodput.operator.metrics import OperatorMetrics
from goodput.operator.settings import Settings
from goodput.testbed import crash_points

CLIQUE = "nvidia.com/gpu.clique"
MODEL_GROUP: dict[str, Any] = {
    "apiVersion": "goodput.dev/v1alpha1",
    "kind": "ModelGroup",
    "metadata": {
        "name": "llama",
        "namespace": "serving",
        "uid": "uid-1",
        "generation": 1,
        "resourceVersion": "7",
        "annotations": {},
    },
    "spec": {
        "model": {"name": "meta-llama/Llama-3.1-70B-Instruct"},
        "engine": {"image": "vllm/vllm-openai:v0.33.0"},
        "parallelism": {"tensor": 8, "pipeline": 2, "gpusPerPod": 8},
        "replicas": 2,
        "maxReplicas": 4,
        "drain": {"maxSeconds": 600, "minLifetimeSeconds": 0},
    },
}
NODES = [
    {
        "metadata": {"name": f"{c}-{i}", "labels": {CLIQUE: c, "topology.kubernetes.io/zone": "z1"}},
        "status": {
            "allocatable": {"nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    for c in "ab"
    for i in range(2)
]
VICTIM_PODS = ("llama-g1-0", "llama-g1-1")


class OperatorKilledError(Exception):
    """The operator process died at this write (SIGKILL): nothing after it runs."""


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class FakeApiServer:
    """Keeps what was written, as the API server does; `kill_at` kills the operator at that write.

    It also checks the drain's invariants at every write, as they happen: no rank of the victim
    leaves service (gate False) without a draining-since mark, and no rank is deleted before the
    ModelGroup's status records the drain."""

    model_group: dict[str, Any] = field(default_factory=lambda: copy.deepcopy(MODEL_GROUP))
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    writes: list[tuple[str, str]] = field(default_factory=list)
    events: list[EventRecord] = field(default_factory=list)
    queued_events: list[EventRecord] = field(default_factory=list)
    kill_at: int | None = None
    dead: bool = False
    violations: list[str] = field(default_factory=list)
    status: AppliedStatus = field(default_factory=AppliedStatus)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _write(self, kind: str, name: str) -> None:
        with self.lock:
            if self.dead or (self.kill_at is not None and len(self.writes) >= self.kill_at):
                self.dead = True
                raise OperatorKilledError(f"killed before {kind} {name}")
            self.writes.append((kind, name))

    def post_events(self, _body: object, events: Any) -> None:
        """kopf's queue: posted some time later, so a kill before the pass ends loses them."""
        if not self.dead:
            self.queued_events.extend(events)

    def flush_queued_events(self) -> None:
        """The pass ended alive: kopf's queue got its Events out."""
        self.events.extend(self.queued_events)
        self.queued_events.clear()

    def create_event(self, manifest: dict[str, Any]) -> None:
        self._write("event", manifest["reason"])
        self.events.append(EventRecord(manifest["type"], manifest["reason"], manifest["message"]))

    def patch_custom(
        self, plural: str, namespace: str, name: str, patch: dict[str, Any], subresource: str | None = None
    ) -> dict[str, Any]:
        assert subresource is None, "status is written by server-side apply only"
        self._write("annotate-model-group", name)
        metadata = self.model_group["metadata"]
        metadata["annotations"].update(patch["metadata"]["annotations"])
        return self._next_version()

    def apply_custom_status(
        self, plural: str, namespace: str, name: str, body: dict[str, Any], *, field_manager: str
    ) -> dict[str, Any]:
        self._write("status", name)
        self.status.apply(body, field_manager)
        self.model_group["status"] = copy.deepcopy(self.status.status)
        return self._next_version()

    def _next_version(self) -> dict[str, Any]:
        metadata = self.model_group["metadata"]
        metadata["resourceVersion"] = str(int(metadata["resourceVersion"]) + 1)
        return {"metadata": {"resourceVersion": metadata["resourceVersion"]}}

    def create_service(self, manifest: dict[str, Any]) -> bool:
        self._write("create-service", manifest["metadata"]["name"])
        return True

    def delete_service(self, namespace: str, name: str) -> None:
        self._write("delete-service", name)

    def create_pod(self, manifest: dict[str, Any]) -> bool:
        self._write("create-pod", manifest["metadata"]["name"])
        pod = copy.deepcopy(manifest)
        pod["metadata"]["creationTimestamp"] = _now()
        self.pods[pod["metadata"]["name"]] = pod
        return True

    def patch_pod(self, namespace: str, name: str, patch: dict[str, Any], content_type: str = "") -> None:
        self._write("release" if "spec" in patch else "annotate", name)
        pod = self.pods[name]
        if "spec" in patch:
            pod["spec"].pop("schedulingGates", None)
            return
        annotations = pod["metadata"].setdefault("annotations", {})
        for key, value in patch["metadata"]["annotations"].items():
            if value is None:
                annotations.pop(key, None)
            else:
                annotations[key] = value

    def patch_pod_status(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        self._write("gate", name)
        pod = self.pods[name]
        (condition,) = patch["status"]["conditions"]
        annotations = pod["metadata"].get("annotations", {})
        if condition["status"] == "False" and naming.ANNOTATION_DRAINING_SINCE not in annotations:
            self.violations.append(f"{name} left service with no draining-since mark")
        conditions = [c for c in pod["status"]["conditions"] if c["type"] != condition["type"]]
        pod["status"]["conditions"] = [*conditions, condition]

    def delete_pod(self, namespace: str, name: str) -> None:
        self._write("delete", name)
        recorded = {r["group"] for r in self.model_group.get("status", {}).get("drain", {}).get("recent", ())}
        group = self.pods[name]["metadata"]["labels"][naming.LABEL_GROUP]
        if group == "g1" and group not in recorded:
            self.violations.append(f"{name} deleted before its drain was recorded in status")
        self.pods[name]["metadata"]["deletionTimestamp"] = _now()

    def start_every_pod(self) -> None:
        """The kubelet and the engines: every created pod bound, running and reporting healthy."""
        for index, pod in enumerate(sorted(self.pods.values(), key=lambda p: p["metadata"]["name"])):
            if pod.get("status", {}).get("phase") == "Running":
                continue
            pod["spec"]["nodeName"] = NODES[index]["metadata"]["name"]
            pod["metadata"]["annotations"][naming.ANNOTATION_MODEL_REVISION] = "main"
            pod["status"] = {
                "phase": "Running",
                "podIP": f"10.200.0.{5 + index}",
                "containerStatuses": [{"name": "vllm", "restartCount": 0}],
                "conditions": [
                    {"type": t, "status": "True", "lastTransitionTime": _now()}
                    for t in ("PodScheduled", "ContainersReady", naming.CONDITION_NCCL_HEALTHY)
                ],
            }


class Operator:
    """One operator process: a ModelGroup loop with its own memory, over the shared API server."""

    def __init__(self, api: FakeApiServer) -> None:
        self.api = api
        self.runtime = Runtime(
            settings=Settings(drain_settle_seconds=0),
            kube=api,  # type: ignore[arg-type]
            metrics=OperatorMetrics(),
            post_events=api.post_events,
        )
        self.pods: dict[tuple[str, str], list[Any]] = {}
        self.claims: dict[str, list[tuple[str, GpuClaim]]] = {"cluster": []}
        indexes = Indexes(
            group_pods=self.pods,
            gpu_claims=self.claims,
            cluster_nodes={"nodes": [parse_node(n) for n in NODES]},
            service_routes={},
        )
        body = kopf.Body(copy.deepcopy(api.model_group))
        self.loop = ModelGroupLoop(self.runtime, body, indexes, logging.getLogger("test"))

    def reconcile(self, leaders: dict[str, tuple[int, int]]) -> None:
        """One pass over what the API server holds now (the watch caught up); `leaders` is what
        each group's leader reports: (requests in flight, requests finished so far)."""
        api = self.api
        views = [v for raw in api.pods.values() if (v := parse_pod(copy.deepcopy(raw))) is not None]
        self.pods[("serving", "llama")] = views
        self.claims["cluster"] = [
            (f"serving/{v.name}", GpuClaim(8, v.node_name)) for v in views if v.node_name
        ]
        self.loop.body = kopf.Body(copy.deepcopy(api.model_group))
        for group, (in_flight, finished) in leaders.items():
            sample = LeaderSample(datetime.now(UTC), in_flight, 0, finished_total=finished)
            self.loop.leader_readings[group] = self.loop.leader_samples[group] = sample
        try:
            asyncio.run(self.loop.reconcile())
        except OperatorKilledError:
            self.api.queued_events.clear()  # died with its queue
            raise
        self.api.flush_queued_events()


def serving_cluster() -> FakeApiServer:
    """Two whole, ready groups (g0, g1), created and warmed up by the operator itself."""
    api = FakeApiServer()
    operator = Operator(api)
    operator.reconcile({})
    api.start_every_pod()
    for group in ("g0", "g1"):
        operator.loop.warmups[group] = WarmupOutcome(True, datetime.now(UTC))
    operator.reconcile({})
    assert all(
        c["status"] == "True"
        for pod in api.pods.values()
        for c in pod["status"]["conditions"]
        if c["type"] == naming.CONDITION_GROUP_READY
    ), "both groups serve before the scale-in"
    api.model_group["spec"]["replicas"] = 1
    api.writes.clear()
    api.events.clear()
    return api


def leaders(api: FakeApiServer) -> dict[str, tuple[int, int]]:
    """What the leaders report: g1 (1 in flight) is the cheaper victim; once its drain has read its
    baseline (20 finished) its last request finishes and more arrive at nobody: 3 finished, idle."""
    progress = api.pods["llama-g1-0"]["metadata"].get("annotations", {}).get(naming.ANNOTATION_DRAIN_PROGRESS)
    baseline_read = progress is not None and "baseline" in progress
    return {"g0": (3, 10), "g1": (0, 23) if baseline_read else (1, 20)}


PASSES = 10


def scale_in(api: FakeApiServer, kill_at: int | None) -> bool:
    """Run the scale-in, killing the operator at write `kill_at`; a new operator then runs it to
    the end. True if the kill happened."""
    api.kill_at = kill_at
    operator = Operator(api)
    killed = False
    for _ in range(PASSES):
        try:
            operator.reconcile(leaders(api))
        except OperatorKilledError:
            killed = True
            api.kill_at, api.dead = None, False
            operator = Operator(api)  # restarted: nothing of the old one's memory survives
    return killed


def writes_of_a_whole_scale_in() -> int:
    api = serving_cluster()
    scale_in(api, None)
    return len(api.writes)


def drain_reasons(api: FakeApiServer) -> list[str]:
    return [e.reason for e in api.events if e.reason.startswith("Drain")]


TOTAL_WRITES = writes_of_a_whole_scale_in()


@pytest.mark.parametrize("kill_at", range(TOTAL_WRITES + 1), ids=lambda k: f"killed-at-write-{k}")
def test_a_scale_in_killed_at_any_write_ends_in_one_recorded_drain(kill_at: int) -> None:
    api = serving_cluster()
    killed = scale_in(api, kill_at)
    assert killed is (kill_at < TOTAL_WRITES)
    assert_one_recorded_drain(api)


def assert_one_recorded_drain(api: FakeApiServer) -> None:
    """The scale-in ended as if nothing had happened: no invariant broken on the way, g1 announced,
    its end announced once and recorded once with exact counts, g1 deleted and g0 kept."""
    assert api.violations == []
    reasons = drain_reasons(api)
    assert EventReason.DRAIN_STARTED in reasons
    assert reasons.count(EventReason.DRAIN_FINISHED) == 1, reasons
    assert EventReason.DRAIN_TIMED_OUT not in reasons
    drain = api.model_group["status"]["drain"]
    assert [r["group"] for r in drain["recent"]] == ["g1"]
    assert (drain["drained"], drain["requestsFinished"], drain["requestsAborted"]) == (1, 3, 0)
    assert all("deletionTimestamp" in api.pods[name]["metadata"] for name in VICTIM_PODS)
    assert all("deletionTimestamp" not in api.pods[f"llama-g0-{rank}"]["metadata"] for rank in range(2))


# The test bed's crash points (goodput.testbed.crash_points, used by the e2e kill stories) die
# right after the write they name: the last write each lets through, victim g1's.
LAST_WRITE_BEFORE_DEATH = {
    "drain-marked": ("annotate", "llama-g1-"),
    "drain-gated": ("gate", "llama-g1-"),
    "drain-outcome": ("annotate", "llama-g1-"),
    "drain-deleted": ("delete-service", "llama-g1"),
}


@pytest.mark.parametrize("step", sorted(crash_points.CRASH_POINTS))
def test_each_crash_point_of_the_test_bed_dies_after_its_write_and_the_restart_finishes_the_drain(
    step: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = serving_cluster()
    writes_at_death: list[list[tuple[str, str]]] = []

    def die() -> None:
        if not writes_at_death:  # the restarted operator runs without the crash point
            writes_at_death.append(list(api.writes))
            api.dead = True
            raise OperatorKilledError(f"killed {step}")

    method = crash_points.CRASH_POINTS[step].method
    monkeypatch.setattr(PlanWrites, method, getattr(PlanWrites, method))  # put back after the test
    monkeypatch.setattr(crash_points, "_die", die)
    crash_points.arm(step)
    assert scale_in(api, None)

    (writes,) = writes_at_death
    kind, name = writes[-1]
    expected_kind, expected_name = LAST_WRITE_BEFORE_DEATH[step]
    assert kind == expected_kind and name.startswith(expected_name), writes
    kinds = [kind for kind, _ in writes]
    if step == "drain-marked":
        assert "gate" not in kinds
    if step == "drain-outcome":
        assert "delete" not in kinds and kinds.count("status") == 2  # not recorded yet
    assert_one_recorded_drain(api)


def test_the_whole_scale_in_writes_intent_before_each_act() -> None:
    """Without a kill: every mark before any gate, the outcome on every rank before the status
    write that records it, and that write before any deletion."""
    api = serving_cluster()
    scale_in(api, None)
    victim_writes = [(kind, name) for kind, name in api.writes if name in VICTIM_PODS or kind == "status"]
    kinds = [kind for kind, _ in victim_writes]
    first_gate = kinds.index("gate")
    assert kinds[:first_gate].count("annotate") >= 2  # both ranks marked draining first
    first_delete = kinds.index("delete")
    assert "status" in kinds[:first_delete]
    outcomes = [
        parse_outcome(
            api.pods[name]["metadata"]["annotations"].get(naming.ANNOTATION_DRAIN_OUTCOME),
            api.pods[name]["metadata"]["labels"][naming.LABEL_GROUP],
        )
        for name in VICTIM_PODS
    ]
    assert outcomes[0] is not None and outcomes[0] == outcomes[1]
    assert (outcomes[0].record.outcome, outcomes[0].record.requests_finished) == ("Drained", 3)


def shift_drain_back(api: FakeApiServer, seconds: float) -> None:
    """The drain's marks as they read `seconds` later: the time nobody acted on it."""
    for pod in api.pods.values():
        annotations = pod["metadata"].get("annotations", {})
        since = parse_rfc3339(annotations.get(naming.ANNOTATION_DRAINING_SINCE))
        if since is not None:
            annotations[naming.ANNOTATION_DRAINING_SINCE] = _rfc3339(since - timedelta(seconds=seconds))
        progress = parse_progress(annotations.get(naming.ANNOTATION_DRAIN_PROGRESS))
        if progress is not None and progress.baseline is not None and progress.routes_stopped_at is not None:
            earlier = DrainProgress(
                replace(progress.baseline, at=progress.baseline.at - timedelta(seconds=seconds)),
                progress.routes_stopped_at - timedelta(seconds=seconds),
            )
            annotations[naming.ANNOTATION_DRAIN_PROGRESS] = encode_progress(earlier)


def _rfc3339(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def test_a_drain_resumed_after_a_takeover_longer_than_its_limit_reads_the_leader_and_ends_drained() -> None:
    api = serving_cluster()
    api.model_group["spec"]["drain"]["maxSeconds"] = 20
    first = Operator(api)
    for _ in range(2):  # the drain starts, then reads its baseline and sees the routes gone
        first.reconcile(leaders(api))
    annotations = api.pods["llama-g1-0"]["metadata"]["annotations"]
    progress = parse_progress(annotations[naming.ANNOTATION_DRAIN_PROGRESS])
    assert progress is not None and progress.baseline is not None and progress.routes_stopped_at is not None
    # The first operator dies; the next one takes the Lease over 34.1 s after the drain began.
    shift_drain_back(api, 34.1)
    takeover = Operator(api)
    takeover.reconcile({})  # its first pass: nothing read yet
    assert drain_reasons(api) == [EventReason.DRAIN_STARTED], "judged before reading the leader"
    for _ in range(PASSES):
        takeover.reconcile(leaders(api))  # g1's leader idle, 3 finished since the baseline
    assert_one_recorded_drain(api)
    (record,) = api.model_group["status"]["drain"]["recent"]
    assert record["durationSeconds"] >= 34.1
