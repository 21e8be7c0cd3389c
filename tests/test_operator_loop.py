"""The ModelGroup loop against a fake Kubernetes API: what it writes, in which order, and when not.

The indexes are plain dicts the test controls, so it can hold them back (as a lagging watch does)
and check that the loop does not act twice on its own writes.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from dataclasses import dataclass, field
from typing import Any

import kopf

from goodput.controllers import naming
from goodput.controllers.groups import EventRecord
from goodput.controllers.observation import parse_node, parse_pod
from goodput.controllers.placement import GpuClaim
from goodput.operator.handlers import Indexes, ModelGroupLoop, Runtime
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
    conflict_on_status: bool = False

    def patch_custom(
        self, plural: str, namespace: str, name: str, patch: dict[str, Any], subresource: str | None = None
    ) -> dict[str, Any]:
        if subresource == "status":
            if self.conflict_on_status:
                raise KubeError(409, "Conflict", "the object has been modified")
            self.status_writes.append(patch)
            self.calls.append(("patch-status", name))
        else:
            self.calls.append(
                ("patch-annotations", name, *sorted(patch["metadata"]["annotations"].items())[0])
            )
        return {"metadata": {"resourceVersion": "8"}}

    def create_service(self, manifest: dict[str, Any]) -> bool:
        self.calls.append(("create-service", manifest["metadata"]["name"]))
        return True

    def create_pod(self, manifest: dict[str, Any]) -> bool:
        self.calls.append(("create-pod", manifest["metadata"]["name"]))
        return True

    def patch_pod(self, namespace: str, name: str, patch: dict[str, Any], content_type: str = "") -> None:
        kind = "release-gate" if "spec" in patch else "annotate-pod"
        self.calls.append((kind, name))

    def patch_pod_status(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        (condition,) = patch["status"]["conditions"]
        self.calls.append(("gate", name, condition["status"]))

    def delete_pod(self, namespace: str, name: str) -> None:
        self.calls.append(("delete-pod", name))

    def delete_service(self, namespace: str, name: str) -> None:
        self.calls.append(("delete-service", name))


@dataclass
class Harness:
    kube: FakeKube
    loop: ModelGroupLoop
    pods: dict[tuple[str, str], list[Any]]
    claims: dict[str, list[tuple[str, GpuClaim]]]
    events: list[EventRecord]

    def run(self) -> list[tuple[str, ...]]:
        before = len(self.kube.calls)
        asyncio.run(self.loop.reconcile())
        return self.kube.calls[before:]


def harness(
    body: dict[str, Any] | None = None,
    runtime: Runtime | None = None,
    claims: dict[str, list[tuple[str, GpuClaim]]] | None = None,
) -> Harness:
    kube = FakeKube()
    events: list[EventRecord] = []
    runtime = runtime or Runtime(
        settings=Settings(),
        kube=kube,  # type: ignore[arg-type]
        metrics=OperatorMetrics(),
        post_events=lambda _body, posted: events.extend(posted),
    )
    kube = runtime.kube  # type: ignore[assignment]
    pods: dict[tuple[str, str], list[Any]] = {}
    claims = claims if claims is not None else {"cluster": []}
    indexes = Indexes(
        group_pods=pods, gpu_claims=claims, cluster_nodes={"nodes": [parse_node(n) for n in NODES]}
    )
    raw_body: Any = copy.deepcopy(body or MODEL_GROUP)
    loop = ModelGroupLoop(runtime, kopf.Body(raw_body), indexes, logging.getLogger("test"))
    return Harness(kube, loop, pods, claims, events)


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
    assert calls[-1] == ("patch-status", "llama")
    status = h.kube.status_writes[-1]["status"]
    assert status["placingGroups"] == 2 and status["replicas"] == 0
    assert h.kube.status_writes[-1]["metadata"] == {"resourceVersion": "8"}
    assert [e.reason for e in h.events] == ["GroupCreated", "GroupCreated"]


def test_the_loop_does_not_repeat_its_own_writes_while_the_watch_lags() -> None:
    h = harness()
    h.run()
    # The index has not seen the pods, the annotation nor the status yet.
    assert h.run() == []
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
    assert calls == [("patch-status", "llama")]
    ready = next(c for c in h.kube.status_writes[0]["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert "spec.engine.image" in ready["message"]


def test_a_status_conflict_is_retried_on_the_next_pass_not_raised() -> None:
    h = harness()
    h.kube.conflict_on_status = True
    h.run()
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
