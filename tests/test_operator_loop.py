"""The ModelGroup loop against a fake Kubernetes API: what it writes, in which order, and when not.

The indexes are plain dicts the test controls, so it can hold them back (as a lagging watch does)
and check that the loop does not act twice on its own writes.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import kopf
import pytest
from waiting import until

from goodput.controllers import naming
from goodput.controllers.events import EventRecord
from goodput.controllers.groups.drain import LeaderSample, parse_progress
from goodput.controllers.groups.model import APPLY_ORDER, Plan
from goodput.controllers.groups.observation import RouteView, parse_node, parse_pod
from goodput.controllers.groups.placement import GpuClaim
from goodput.controllers.ownership import GROUP_STATUS
from goodput.operator.handlers import (
    GROUP_WRITES,
    OWN_STEPS,
    Indexes,
    ModelGroupLoop,
    PlanWrites,
    Runtime,
    run_model_group_loop,
)
from goodput.operator.kube import KubeError
from goodput.operator.metrics import OperatorMetrics
from goodput.operator.settings import Settings

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
    },
}


def node(name: str, clique: str, zone: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {CLIQUE: clique, "topology.kubernetes.io/zone": zone}},
        "status": {
            "allocatable": {"nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


NODES = [node(f"{c}-{i}", c, z) for c, z in (("a", "z1"), ("b", "z2"), ("c", "z1")) for i in range(2)]


@dataclass
class FakeKube:
    calls: list[tuple[str, ...]] = field(default_factory=list)
    status_writes: list[dict[str, Any]] = field(default_factory=list)
    # Every Event the operator posted, through kopf's queue or at once through the API.
    events: list[EventRecord] = field(default_factory=list)
    pod_patches: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    # What the next status apply, or the creation of these pods, answers instead of succeeding.
    status_failure: KubeError | None = None
    refused_pods: dict[str, KubeError] = field(default_factory=dict)
    # The ModelGroup's resourceVersion as the API server keeps it: every write moves it on.
    resource_version: int = int(MODEL_GROUP["metadata"]["resourceVersion"])

    def patch_custom(
        self, plural: str, namespace: str, name: str, patch: dict[str, Any], subresource: str | None = None
    ) -> dict[str, Any]:
        assert subresource is None, "status is written by server-side apply only"
        self.calls.append(("patch-annotations", name, *sorted(patch["metadata"]["annotations"].items())[0]))
        self.resource_version += 1
        return {"metadata": {"resourceVersion": str(self.resource_version)}}

    def apply_custom_status(
        self, plural: str, namespace: str, name: str, body: dict[str, Any], *, field_manager: str
    ) -> dict[str, Any]:
        assert (plural, field_manager) == ("modelgroups", "goodput-groups")
        if self.status_failure is not None:
            raise self.status_failure
        self.status_writes.append(body)
        self.calls.append(("apply-status", name))
        self.resource_version += 1
        return {"metadata": {"resourceVersion": str(self.resource_version)}}

    def create_service(self, manifest: dict[str, Any]) -> bool:
        self.calls.append(("create-service", manifest["metadata"]["name"]))
        return True

    def create_pod(self, manifest: dict[str, Any]) -> bool:
        name = manifest["metadata"]["name"]
        if name in self.refused_pods:
            raise self.refused_pods[name]
        self.calls.append(("create-pod", name))
        return True

    def patch_pod(self, namespace: str, name: str, patch: dict[str, Any], content_type: str = "") -> None:
        kind = "release-gate" if "spec" in patch else "annotate-pod"
        self.calls.append((kind, name))
        self.pod_patches.append((name, patch))

    def patch_pod_status(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        (condition,) = patch["status"]["conditions"]
        self.calls.append(("gate", name, condition["status"]))

    def delete_pod(self, namespace: str, name: str) -> None:
        self.calls.append(("delete-pod", name))

    def delete_service(self, namespace: str, name: str) -> None:
        self.calls.append(("delete-service", name))

    def create_event(self, manifest: dict[str, Any]) -> None:
        self.events.append(EventRecord(manifest["type"], manifest["reason"], manifest["message"]))


@dataclass
class Harness:
    kube: FakeKube
    loop: ModelGroupLoop
    pods: dict[tuple[str, str], list[Any]]
    claims: dict[str, list[tuple[str, GpuClaim]]]
    events: list[EventRecord]
    routes: dict[str, list[tuple[RouteView, ...]]] = field(default_factory=dict)

    def run(self, *, watch_lags: bool = False, fails: bool = False) -> list[tuple[str, ...]]:
        """One reconcile (`fails`: one whose write the API server refuses, as the loop sees it). Unless
        the watch lags, the loop sees the ModelGroup's latest resourceVersion (its own earlier
        writes included), as a watch that caught up delivers it."""
        if not watch_lags:
            body = self.loop.body
            metadata = {**body["metadata"], "resourceVersion": str(self.kube.resource_version)}
            self.loop.body = kopf.Body({**body, "metadata": metadata})
        before = len(self.kube.calls)
        if fails:
            with pytest.raises(KubeError):
                asyncio.run(self.loop.reconcile())
        else:
            asyncio.run(self.loop.reconcile())
        return self.kube.calls[before:]


def harness(
    body: dict[str, Any] | None = None,
    runtime: Runtime | None = None,
    claims: dict[str, list[tuple[str, GpuClaim]]] | None = None,
) -> Harness:
    kube = FakeKube()
    runtime = runtime or Runtime(
        settings=Settings(),
        kube=kube,  # type: ignore[arg-type]
        metrics=OperatorMetrics(),
        post_events=lambda _body, posted: kube.events.extend(posted),
    )
    kube = runtime.kube  # type: ignore[assignment]
    events = kube.events
    pods: dict[tuple[str, str], list[Any]] = {}
    claims = claims if claims is not None else {"cluster": []}
    routes: dict[str, list[tuple[RouteView, ...]]] = {}
    indexes = Indexes(
        group_pods=pods,
        gpu_claims=claims,
        cluster_nodes={"nodes": [parse_node(n) for n in NODES]},
        service_routes=routes,
    )
    raw_body: Any = copy.deepcopy(body or MODEL_GROUP)
    loop = ModelGroupLoop(runtime, kopf.Body(raw_body), indexes, logging.getLogger("test"))
    return Harness(kube, loop, pods, claims, events, routes)


def test_a_scale_out_records_the_counter_first_then_creates_and_releases_whole_groups() -> None:
    h = harness()
    calls = h.run()
    assert calls[0] == ("patch-annotations", "llama", naming.ANNOTATION_GROUP_COUNTER, "2")
    assert calls[1:5] == [
        ("create-service", "llama-g0"),
        ("create-pod", "llama-g0-0"),
        ("create-pod", "llama-g0-1"),
        ("release-gate", "llama-g0-0"),
    ]
    assert ("release-gate", "llama-g0-1") in calls[5:6]
    assert calls[-1] == ("apply-status", "llama")
    status = h.kube.status_writes[-1]["status"]
    assert status["placingGroups"] == 2 and status["replicas"] == 0
    # Server-side apply names the object and holds only the group controller's part: no precondition.
    assert h.kube.status_writes[-1]["metadata"] == {"name": "llama", "namespace": "serving"}
    assert set(status) <= GROUP_STATUS.fields | {"conditions"}
    assert {c["type"] for c in status["conditions"]} == GROUP_STATUS.condition_types
    assert [e.reason for e in h.events] == ["GroupCreated", "GroupCreated"]


def test_a_pod_the_api_server_refuses_is_a_warning_and_its_group_is_not_announced() -> None:
    h = harness()
    refusal = KubeError(403, "Forbidden", 'pods "llama-g1-0" is forbidden: exceeded quota: gpus')
    h.kube.refused_pods["llama-g1-0"] = refusal
    calls = h.run(fails=True)
    assert [c[1] for c in calls if c[0] == "create-pod"] == ["llama-g0-0", "llama-g0-1"]
    assert [(e.type, e.reason, e.group) for e in h.events] == [
        ("Normal", "GroupCreated", "g0"),
        ("Warning", "FailedCreate", "g1"),
    ]
    assert "exceeded quota: gpus" in h.events[-1].message
    assert h.kube.status_writes == [], "a pass that failed writes no status"


def test_a_pass_that_stops_early_does_not_announce_what_it_did_not_do() -> None:
    h = harness()
    h.kube.refused_pods["llama-g0-1"] = KubeError(500, "InternalError", "etcdserver: request timed out")
    h.run(fails=True)
    # g1 was never attempted: neither created nor announced.
    assert [(e.reason, e.group) for e in h.events] == [("FailedCreate", "g0")]


def test_the_loop_does_not_repeat_its_own_writes_while_the_watch_lags() -> None:
    h = harness()
    h.run()
    # The index has not seen the pods, the annotation nor the status yet.
    assert h.run(watch_lags=True) == []
    assert h.events[2:] == []


def test_a_failed_rank_takes_its_group_out_first_then_a_whole_replacement_comes() -> None:
    h = harness()
    h.run()
    ready_pods = []
    for index, group in enumerate(("g0", "g1")):
        for rank in range(2):
            manifest = _pod_manifest(h, group, rank)
            raw = _ready(manifest, f"{'ab'[index]}-{rank}", restarts=1 if (group, rank) == ("g1", 1) else 0)
            view = parse_pod(raw)
            assert view is not None
            ready_pods.append(view)
    h.pods[("serving", "llama")] = ready_pods
    h.claims["cluster"] = [(f"serving/{p.name}", GpuClaim(8, p.node_name)) for p in ready_pods]
    counted: Any = {
        **copy.deepcopy(MODEL_GROUP),
        "metadata": {**MODEL_GROUP["metadata"], "annotations": {naming.ANNOTATION_GROUP_COUNTER: "2"}},
    }
    h.loop.body = kopf.Body(counted)
    calls = h.run()
    gates = [c for c in calls if c[0] == "gate"]
    first_delete = next(i for i, c in enumerate(calls) if c[0] == "delete-pod")
    assert gates == [("gate", "llama-g1-0", "False"), ("gate", "llama-g1-1", "False")]
    assert all(calls.index(g) < first_delete for g in gates)
    assert {c[1] for c in calls if c[0] == "delete-pod"} == {"llama-g1-0", "llama-g1-1"}
    assert ("delete-service", "llama-g1") in calls
    assert [c[1] for c in calls if c[0] == "create-pod"] == ["llama-g2-0", "llama-g2-1"]
    assert [e.reason for e in h.events[-2:]] == ["GroupFailed", "GroupCreated"]


def test_an_invalid_spec_creates_nothing_and_says_why() -> None:
    body = copy.deepcopy(MODEL_GROUP)
    body["spec"]["engine"]["image"] = "Not A Valid Image"
    h = harness(body)
    calls = h.run()
    assert calls == [("apply-status", "llama")]
    ready = next(c for c in h.kube.status_writes[0]["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert "spec.engine.image" in ready["message"]


def test_a_failed_status_write_is_not_remembered_as_written() -> None:
    h = harness()
    h.kube.status_failure = KubeError(503, "ServiceUnavailable", "the server is shutting down")
    h.run(fails=True)
    assert h.kube.status_writes == []
    assert h.loop.written_status is None


def _pod_manifest(h: Harness, group: str, rank: int) -> dict[str, Any]:
    view = h.loop.expectations[naming.pod_name("llama", group, rank)].view
    assert view is not None
    return {
        "metadata": {
            "name": view.name,
            "creationTimestamp": "2026-03-01T11:00:00Z",
            "labels": {
                naming.LABEL_MODEL_GROUP: "llama",
                naming.LABEL_GROUP: group,
                naming.LABEL_RANK: str(rank),
                naming.LABEL_REVISION: view.revision,
            },
            "annotations": {
                naming.ANNOTATION_TOPOLOGY_DOMAIN: view.topology_domain or "",
                naming.ANNOTATION_MODEL_REVISION: "main",
            },
        },
        "spec": {"containers": [{"resources": {"requests": {"nvidia.com/gpu": "8"}}}]},
    }


def _ready(manifest: dict[str, Any], node_name: str, restarts: int) -> dict[str, Any]:
    pod = copy.deepcopy(manifest)
    pod["spec"]["nodeName"] = node_name
    at = "2026-03-01T11:01:00Z"
    pod["status"] = {
        "phase": "Running",
        "podIP": "10.200.0.5",
        "containerStatuses": [{"name": "vllm", "restartCount": restarts}],
        "conditions": [
            {"type": t, "status": "True", "lastTransitionTime": at}
            for t in (
                "PodScheduled",
                "ContainersReady",
                naming.CONDITION_NCCL_HEALTHY,
                naming.CONDITION_GROUP_READY,
            )
        ],
    }
    return pod


def test_two_model_groups_planning_a_moment_apart_never_book_the_same_gpus() -> None:
    first = harness()
    second_body = copy.deepcopy(MODEL_GROUP)
    second_body["metadata"].update(name="mistral", uid="uid-2")
    second_body["spec"]["replicas"] = 2
    # Same operator (so Events land in the first harness), same lagging GPU index.
    second = harness(second_body, runtime=first.loop.runtime, claims=first.claims)
    first.run()
    calls = second.run()
    # One domain is left after the first ModelGroup's two groups, so one group fits, not two.
    assert [c[1] for c in calls if c[0] == "create-pod"] == ["mistral-g0-0", "mistral-g0-1"]
    assert first.events[-1].message.startswith("group g0 created in nvidia.com/gpu.clique=c")
    limited = next(
        c for c in second.kube.status_writes[-1]["status"]["conditions"] if c["type"] == "ScalingLimited"
    )
    assert (limited["status"], limited["reason"]) == ("True", "InsufficientGPUs")


# Scale-in through the loop: drain, verify, remove, record.


def two_ready_groups(settings: Settings | None = None, replicas: int = 1) -> Harness:
    """A harness whose index shows groups g0 and g1 whole and ready, and `replicas` wanted."""
    runtime = None
    if settings is not None:
        kube = FakeKube()
        runtime = Runtime(
            settings=settings,
            kube=kube,  # type: ignore[arg-type]
            metrics=OperatorMetrics(),
            post_events=lambda _body, posted: kube.events.extend(posted),
        )
    h = harness(runtime=runtime)
    h.run()
    views = []
    for index, group in enumerate(("g0", "g1")):
        for rank in range(2):
            raw = _ready(_pod_manifest(h, group, rank), f"{'ab'[index]}-{rank}", restarts=0)
            raw["status"]["podIP"] = f"10.200.{index}.{5 + rank}"
            view = parse_pod(raw)
            assert view is not None
            views.append(view)
    h.pods[("serving", "llama")] = views
    h.claims["cluster"] = [(f"serving/{p.name}", GpuClaim(8, p.node_name)) for p in views]
    scaled: Any = copy.deepcopy(MODEL_GROUP)
    scaled["metadata"]["annotations"] = {naming.ANNOTATION_GROUP_COUNTER: "2"}
    scaled["spec"].update(replicas=replicas, drain={"maxSeconds": 60, "minLifetimeSeconds": 0})
    h.loop.body = kopf.Body(scaled)
    h.kube.calls.clear()
    return h


def read(h: Harness, group: str, running: int, *, finished: int, aborted: int = 0) -> None:
    """What the leader's /metrics said just now (as the loop's probe would record it)."""
    sample = LeaderSample(datetime.now(UTC), running, 0, finished_total=finished, aborted_total=aborted)
    h.loop.leader_readings[group] = h.loop.leader_samples[group] = sample


def test_scale_in_closes_admission_then_waits_for_the_endpoints_to_go_and_the_leader_to_idle() -> None:
    h = two_ready_groups(Settings(drain_settle_seconds=0))
    read(h, "g0", 3, finished=10)
    read(h, "g1", 1, finished=20)

    calls = h.run()
    # The group with less in flight goes: every rank is marked draining first (the intent, which a
    # restarted operator resumes), and only then does its gate go False on every rank.
    assert set(calls[:2]) == {("annotate-pod", "llama-g1-0"), ("annotate-pod", "llama-g1-1")}
    assert calls[2:4] == [("gate", "llama-g1-0", "False"), ("gate", "llama-g1-1", "False")]
    assert [e.reason for e in h.events[-1:]] == ["DrainStarted"]
    status = h.kube.status_writes[-1]["status"]
    assert (status["drainingGroups"], status["readyGroups"]) == (1, 1)
    drained = next(g for g in status["groups"] if g["name"] == "g1")
    assert drained["state"] == "Draining" and "drainStartedAt" in drained

    # A Service still lists the leader as ready: nothing is deleted, however idle the leader.
    h.routes["serving"] = [(RouteView("llama-g1-0", "llama", ready=True),)]
    read(h, "g1", 0, finished=21)
    assert not any(c[0] == "delete-pod" for c in h.run())
    progress = parse_progress(
        h.kube.pod_patches[-1][1]["metadata"]["annotations"][naming.ANNOTATION_DRAIN_PROGRESS]
    )
    assert progress is not None and progress.baseline is not None
    assert progress.baseline.finished_total == 21 and progress.routes_stopped_at is None

    # Out of the endpoints, and the leader idle since: every rank goes, and the drain is recorded.
    h.routes["serving"] = [(RouteView("llama-g1-0", "llama", ready=False),)]
    h.run()
    read(h, "g1", 0, finished=23)
    calls = h.run()
    # The drain's end goes on every rank and into the status first; nothing is deleted yet.
    assert not any(c[0] == "delete-pod" for c in calls)
    assert {c[1] for c in calls if c[0] == "annotate-pod"} == {"llama-g1-0", "llama-g1-1"}
    assert h.events[-1].reason == "DrainFinished" and "2 request(s) finished" in h.events[-1].message
    drain = h.kube.status_writes[-1]["status"]["drain"]
    calls = h.run()
    assert {c[1] for c in calls if c[0] == "delete-pod"} == {"llama-g1-0", "llama-g1-1"}
    assert ("delete-service", "llama-g1") in calls
    assert [e.reason for e in h.events].count("DrainFinished") == 1
    assert (drain["drained"], drain["requestsFinished"], drain["requestsAborted"]) == (1, 2, 0)
    assert drain["recent"][0]["group"] == "g1" and drain["recent"][0]["outcome"] == "Drained"
    metrics = h.loop.runtime.metrics.registry
    labels = {"namespace": "serving", "model_group": "llama"}
    assert metrics.get_sample_value("goodput_drain_requests_finished_total", labels) == 2
    assert metrics.get_sample_value("goodput_drains_total", {**labels, "outcome": "Drained"}) == 1
    assert (
        metrics.get_sample_value("goodput_drain_duration_seconds_count", {**labels, "outcome": "Drained"})
        == 1
    )


def test_a_timed_out_drain_counts_its_aborted_requests_even_when_the_status_write_fails() -> None:
    h = two_ready_groups(Settings(drain_settle_seconds=0))
    read(h, "g0", 3, finished=10)
    read(h, "g1", 1, finished=20)
    h.run()
    # The drain started long ago, and this operator has watched it all along.
    started = datetime.now(UTC) - timedelta(seconds=61)
    h.loop.acting_since = started - timedelta(seconds=1)
    h.pods[("serving", "llama")] = [
        replace(pod, draining_since=started) if pod.group == "g1" else pod
        for pod in h.pods[("serving", "llama")]
    ]
    h.loop.expectations.clear()
    read(h, "g1", 4, finished=20)
    h.kube.status_failure = KubeError(503, "ServiceUnavailable", "the server is shutting down")
    calls = h.run(fails=True)
    # Not recorded, so not deleted and not announced yet: the outcome waits on the ranks.
    assert not any(c[0] == "delete-pod" for c in calls)
    assert "DrainTimedOut" not in [e.reason for e in h.events]
    assert h.kube.status_writes == [] or "drain" not in h.kube.status_writes[-1]["status"]

    # The next pass writes what the failed one could not, once, and announces it; then the ranks go.
    h.kube.status_failure = None
    read(h, "g1", 0, finished=25)  # a later reading does not change the outcome already decided
    h.run()
    assert [e.reason for e in h.events].count("DrainTimedOut") == 1
    assert "4 request(s) aborted" in h.events[-1].message
    calls = h.run()
    assert {c[1] for c in calls if c[0] == "delete-pod"} == {"llama-g1-0", "llama-g1-1"}
    writes = [w["status"]["drain"] for w in h.kube.status_writes if "drain" in w["status"]]
    assert writes and writes[-1]["timedOut"] == 1 and writes[-1]["requestsAborted"] == 4
    assert writes[-1]["recent"][0]["onTimeout"] == "Abort"
    labels = {"namespace": "serving", "model_group": "llama"}
    assert (
        h.loop.runtime.metrics.registry.get_sample_value("goodput_drain_requests_aborted_total", labels) == 4
    )


def test_a_scale_out_during_a_drain_puts_the_group_back_instead_of_creating_one() -> None:
    h = two_ready_groups(Settings(drain_settle_seconds=0))
    read(h, "g0", 3, finished=10)
    read(h, "g1", 1, finished=20)
    h.run()
    h.loop.body = kopf.Body({**h.loop.body, "spec": {**h.loop.body["spec"], "replicas": 2}})
    calls = h.run()
    assert not any(c[0] in ("create-pod", "delete-pod") for c in calls)
    assert [c for c in calls if c[0] == "gate"] == [
        ("gate", "llama-g1-0", "True"),
        ("gate", "llama-g1-1", "True"),
    ]
    cleared = [patch["metadata"]["annotations"] for name, patch in h.kube.pod_patches[-2:]]
    assert all(a[naming.ANNOTATION_DRAINING_SINCE] is None for a in cleared)
    assert all(a[naming.ANNOTATION_DRAIN_PROGRESS] is None for a in cleared)
    assert h.events[-1].reason == "DrainCancelled"
    status = h.kube.status_writes[-1]["status"]
    assert (status["readyGroups"], status["drainingGroups"], status["drain"]["cancelled"]) == (2, 0, 1)


class Flag:
    """kopf's `stopped` flag as the loop uses it."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.waits = 0

    def __bool__(self) -> bool:
        return self.event.is_set()

    async def wait(self, timeout: float | None = None) -> Flag:
        self.waits += 1
        await self.event.wait()
        return self


def test_a_stopped_loop_returns_at_once_instead_of_sleeping_out_its_interval() -> None:
    h = harness(
        runtime=Runtime(
            settings=Settings(reconcile_interval_seconds=600),
            kube=FakeKube(),  # type: ignore[arg-type]
            metrics=OperatorMetrics(),
            post_events=lambda _body, _events: None,
        )
    )

    async def scenario() -> float:
        stopped = Flag()
        task = asyncio.create_task(run_model_group_loop(h.loop.runtime, h.loop, stopped))
        await until(
            lambda: bool(h.loop.runtime.kube.calls) and stopped.waits == 1,  # type: ignore[attr-defined]
            "the first tick read and the loop waits out its interval",
        )
        began = time.monotonic()
        stopped.event.set()
        await asyncio.wait_for(task, timeout=5)
        return time.monotonic() - began

    assert asyncio.run(scenario()) < 1.0
    assert ("serving", "llama") not in h.loop.runtime.wakeups


def test_a_loop_cancelled_after_it_was_told_to_stop_ends_quietly() -> None:
    h = harness()

    async def scenario() -> asyncio.Task[None]:
        stopped = Flag()
        task = asyncio.create_task(run_model_group_loop(h.loop.runtime, h.loop, stopped))
        await until(lambda: stopped.waits == 1, "the loop waits out its interval")
        stopped.event.set()
        task.cancel()
        await asyncio.wait([task], timeout=5)
        return task

    task = asyncio.run(scenario())
    assert task.done() and not task.cancelled() and task.exception() is None


def test_a_new_engine_image_rolls_out_a_surge_group_first_and_says_so() -> None:
    h = two_ready_groups(replicas=2)
    body = h.loop.body
    spec = {**body["spec"], "engine": {**body["spec"]["engine"], "image": "vllm/vllm-openai:v0.34.0"}}
    h.loop.body = kopf.Body({**body, "spec": spec})
    calls = h.run()
    # One new group (maxSurge 1) is created whole; no old group is touched while it is not ready.
    assert [c for c in calls if c[0] == "create-pod"] == [
        ("create-pod", "llama-g2-0"),
        ("create-pod", "llama-g2-1"),
    ]
    assert not any(c[0] in ("gate", "delete-pod") for c in calls)
    status = h.kube.status_writes[-1]["status"]
    assert (status["updatedGroups"], status["outdatedGroups"], status["readyGroups"]) == (1, 2, 2)
    assert status["revision"] and all(g["outdated"] for g in status["groups"] if g["name"] in ("g0", "g1"))
    progressing = next(c for c in status["conditions"] if c["type"] == "Progressing")
    assert progressing["reason"] == "RollingOut"


def test_a_cancelled_drain_is_counted_even_when_that_status_write_fails() -> None:
    h = two_ready_groups(Settings(drain_settle_seconds=0))
    read(h, "g0", 3, finished=10)
    read(h, "g1", 1, finished=20)
    h.run()
    h.loop.body = kopf.Body({**h.loop.body, "spec": {**h.loop.body["spec"], "replicas": 2}})
    h.kube.status_failure = KubeError(503, "ServiceUnavailable", "the server is shutting down")
    h.run(fails=True)
    assert h.events[-1].reason == "DrainCancelled"
    h.kube.status_failure = None
    h.run()
    assert h.kube.status_writes[-1]["status"]["drain"]["cancelled"] == 1


def test_only_a_spec_change_or_a_deletion_wakes_the_loop_not_a_status_or_annotation_write() -> None:
    runtime = Runtime(settings=Settings(), kube=FakeKube(), metrics=OperatorMetrics())  # type: ignore[arg-type]
    wake = runtime.wakeup("serving", "llama")
    seen: list[bool] = []

    def change(**metadata: Any) -> None:
        wake.clear()
        body = {"metadata": {**MODEL_GROUP["metadata"], **metadata}, "status": {"autoscalerState": "x"}}
        runtime.wake_on_change("serving", "llama", body)
        seen.append(wake.is_set())

    change()  # first sight
    change(resourceVersion="8")  # the autoscaler's status apply
    change(resourceVersion="9", annotations={"team": "serving"})  # a user's annotation
    change(resourceVersion="10", generation=2)  # kubectl scale, or any spec edit
    change(resourceVersion="11", generation=2, deletionTimestamp="2026-03-01T11:00:00Z")
    assert seen == [True, False, False, True, True]


# The plan's write order, as the loop applies it.

# Plan fields that are no write of the loop: what it reports, counts or remembers.
NOT_WRITTEN = frozenset(
    {
        "events",
        "drains_cancelled",
        "groups",
        "placement_limit",
        "became_ready",
        "backoffs",
        "transitions",
        "readiness_reported",
        "rollout",
        "ready_breakdowns",
        "stalls",
        "stalls_reported",
    }
)


def test_the_loop_applies_every_step_of_the_apply_order_and_the_order_names_every_action_of_a_plan() -> None:
    assert len(set(APPLY_ORDER)) == len(APPLY_ORDER)
    assert not set(GROUP_WRITES) & OWN_STEPS
    assert set(APPLY_ORDER) == set(GROUP_WRITES) | OWN_STEPS
    assert set(APPLY_ORDER) == {f.name for f in fields(Plan)} - NOT_WRITTEN
    for write in GROUP_WRITES.values():
        assert callable(getattr(PlanWrites, write.method)), write
    order = APPLY_ORDER.index
    # Intent before the act: the drain's mark before any gate, its outcome before any deletion and
    # before its record; gates False on failing ranks before deleting anything.
    assert order("drain_starts") < order("unready") < order("deletions")
    assert order("drain_outcomes") < order("deletions") and order("drain_outcomes") < order("drains_ended")
    assert order("annotations") < order("creations") < order("gate_releases")


def _loading_weights(manifest: dict[str, Any], node_name: str, started_seconds_ago: float) -> dict[str, Any]:
    """A rank bound and running whose engine has not answered /health since it started."""
    pod = copy.deepcopy(manifest)
    now = datetime.now(UTC)

    def ago(seconds: float) -> str:
        return (now - timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")

    pod["metadata"]["creationTimestamp"] = ago(started_seconds_ago + 20)
    pod["spec"]["nodeName"] = node_name
    pod["status"] = {
        "phase": "Running",
        "podIP": "10.200.0.6",
        "containerStatuses": [
            {"name": "vllm", "restartCount": 0, "state": {"running": {"startedAt": ago(started_seconds_ago)}}}
        ],
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": ago(started_seconds_ago + 10)},
            {"type": "ContainersReady", "status": "False", "lastTransitionTime": ago(started_seconds_ago)},
        ],
    }
    return pod


def test_a_stalled_phase_is_announced_once_and_a_ready_groups_time_is_kept_in_status() -> None:
    h = harness()
    h.run()
    views = []
    for rank in range(2):
        ready = parse_pod(_ready(_pod_manifest(h, "g0", rank), f"a-{rank}", restarts=0))
        loading = parse_pod(
            _loading_weights(_pod_manifest(h, "g1", rank), f"b-{rank}", started_seconds_ago=1000)
        )
        assert ready is not None and loading is not None
        views += [ready, loading]
    h.pods[("serving", "llama")] = views
    h.claims["cluster"] = [(f"serving/{p.name}", GpuClaim(8, p.node_name)) for p in views]
    counted: Any = {
        **copy.deepcopy(MODEL_GROUP),
        "metadata": {**MODEL_GROUP["metadata"], "annotations": {naming.ANNOTATION_GROUP_COUNTER: "2"}},
    }
    h.loop.body = kopf.Body(counted)
    h.run()
    h.run()
    stalled = [e for e in h.events if e.reason == "ReadyPhaseStalled"]
    assert len(stalled) == 1, "announced once, not on every pass"
    assert stalled[0].type == "Warning" and "group g1 stalled in WeightLoad" in stalled[0].message
    ready_time = h.kube.status_writes[-1]["status"]["readyTime"]
    assert [(s["group"], s["phase"]) for s in ready_time["stalled"]] == [("g1", "WeightLoad")]
    assert [(s["group"], s["totalSeconds"]) for s in ready_time["recent"]] == [("g0", 60.0)]
    assert ready_time["p50Seconds"] == 60.0
