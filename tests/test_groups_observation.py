"""Reading pods and nodes into views, and overlaying the operator's own not-yet-observed writes."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from goodput.controllers import naming
from goodput.controllers.groups.expectations import EXISTS, expect, expect_deleted, overlay
from goodput.controllers.groups.observation import ConditionView, gpu_claim, parse_node, parse_pod
from goodput.controllers.groups.placement import GpuClaim, Taint

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def raw_pod(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "llama-g0-1",
            "creationTimestamp": "2026-03-01T11:58:00Z",
            "labels": {
                naming.LABEL_MODEL_GROUP: "llama",
                naming.LABEL_GROUP: "g0",
                naming.LABEL_RANK: "1",
                naming.LABEL_REVISION: "abc",
            },
            "annotations": {
                naming.ANNOTATION_TOPOLOGY_KEY: "nvidia.com/gpu.clique",
                naming.ANNOTATION_TOPOLOGY_DOMAIN: "clique-a",
                naming.ANNOTATION_MODEL_REVISION: "main",
            },
        },
        "spec": {
            "nodeName": "node-1",
            "schedulingGates": [],
            "containers": [{"name": "vllm", "resources": {"requests": {"nvidia.com/gpu": "8", "cpu": "4"}}}],
        },
        "status": status,
    }


def test_a_running_rank_is_read_with_its_conditions() -> None:
    view = parse_pod(
        raw_pod(
            phase="Running",
            podIP="10.244.1.7",
            conditions=[
                {"type": "ContainersReady", "status": "True", "lastTransitionTime": "2026-03-01T11:59:00Z"},
                {
                    "type": naming.CONDITION_NCCL_HEALTHY,
                    "status": "False",
                    "reason": "AllReduceFailed",
                    "message": "timeout",
                    "lastTransitionTime": "2026-03-01T11:59:30Z",
                },
            ],
            containerStatuses=[{"name": "vllm", "restartCount": 2}],
        )
    )
    assert view is not None
    assert (view.name, view.group, view.rank, view.node_name, view.ip, view.gpus, view.restarts) == (
        "llama-g0-1",
        "g0",
        1,
        "node-1",
        "10.244.1.7",
        8,
        2,
    )
    assert view.running_and_ready and not view.gated and not view.marked_group_ready
    assert view.nccl_healthy == ConditionView(
        "False", "AllReduceFailed", "timeout", datetime(2026, 3, 1, 11, 59, 30, tzinfo=UTC)
    )
    assert view.reported_model_revision == "main"
    assert view.topology_domain == "clique-a"


def test_the_health_agents_gpu_and_engine_conditions_are_read() -> None:
    view = parse_pod(
        raw_pod(
            phase="Running",
            conditions=[
                {
                    "type": naming.CONDITION_GPU_HEALTHY,
                    "status": "False",
                    "reason": "GpuXidCritical",
                    "message": "GPU 3: critical XID 79",
                    "lastTransitionTime": "2026-03-01T11:59:40Z",
                },
                {"type": naming.CONDITION_ENGINE_HEALTHY, "status": "True", "reason": "EngineProgressing"},
            ],
        )
    )

    assert view is not None
    assert view.gpu_healthy == ConditionView(
        "False", "GpuXidCritical", "GPU 3: critical XID 79", datetime(2026, 3, 1, 11, 59, 40, tzinfo=UTC)
    )
    assert view.engine_healthy is not None and view.engine_healthy.status == "True"


def test_pods_without_our_identity_are_not_ours() -> None:
    pod = raw_pod()
    del pod["metadata"]["labels"][naming.LABEL_RANK]
    assert parse_pod(pod) is None


@pytest.mark.parametrize(
    ("pod", "claim"),
    [
        (raw_pod(phase="Running"), GpuClaim(8, "node-1", "nvidia.com/gpu.clique", "clique-a")),
        (raw_pod(phase="Succeeded"), None),
        ({"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": 2}}}]}}, GpuClaim(2)),
        ({"spec": {"containers": [{"resources": {}}]}}, None),
        (
            {
                "spec": {
                    "containers": [{"resources": {"requests": {"nvidia.com/gpu": "1"}}}],
                    "initContainers": [{"resources": {"requests": {"nvidia.com/gpu": "4"}}}],
                }
            },
            GpuClaim(4),
        ),
    ],
    ids=[
        "bound rank of ours",
        "finished pod holds nothing",
        "limits imply requests",
        "no GPUs",
        "init container",
    ],
)
def test_gpu_claims(pod: dict[str, Any], claim: GpuClaim | None) -> None:
    assert gpu_claim(pod) == claim


def test_nodes_are_read_as_inventory() -> None:
    node = parse_node(
        {
            "metadata": {"name": "n1", "labels": {"nvidia.com/gpu.clique": "a"}},
            "spec": {"taints": [{"key": "gpu", "effect": "NoSchedule"}]},
            "status": {
                "allocatable": {"nvidia.com/gpu": "8"},
                "conditions": [{"type": "Ready", "status": "False"}],
            },
        }
    )
    assert not node.ready
    assert node.inventory.allocatable_gpus == 8
    assert not node.inventory.schedulable
    assert node.inventory.taints == (Taint("gpu", "", "NoSchedule"),)
    assert node.inventory.label("nvidia.com/gpu.clique") == "a"


def _view() -> Any:
    view = parse_pod(raw_pod(phase="Running"))
    assert view is not None
    return view


def test_a_created_pod_is_seen_until_the_index_has_it() -> None:
    created = replace(_view(), phase="Pending", node_name=None)
    expectations = expect({}, created, {EXISTS}, NOW)
    pods, outstanding = overlay([], expectations, NOW)
    assert pods == (created,) and set(outstanding) == {created.name}
    pods, outstanding = overlay([created], outstanding, NOW)
    assert pods == (created,) and outstanding == {}


def test_a_written_condition_overrides_the_index_until_it_agrees() -> None:
    observed = _view()
    marked = replace(observed, group_ready=ConditionView("True", "GroupsReady", "", NOW))
    expectations = expect({}, marked, {"group_ready"}, NOW)
    pods, outstanding = overlay([observed], expectations, NOW)
    assert pods[0].marked_group_ready and outstanding
    # The server renders the condition with its own time; the status is what was written.
    agreed = replace(
        observed, group_ready=ConditionView("True", "GroupsReady", "", NOW - timedelta(seconds=1))
    )
    pods, outstanding = overlay([agreed], outstanding, NOW)
    assert pods == (agreed,) and outstanding == {}


def test_a_deleted_pod_counts_as_terminating_until_the_index_shows_it() -> None:
    observed = _view()
    expectations = expect_deleted({}, observed.name, NOW)
    pods, outstanding = overlay([observed], expectations, NOW)
    assert pods[0].deleting and outstanding
    pods, outstanding = overlay([], outstanding, NOW)
    assert pods == () and outstanding == {}


def test_expectations_expire() -> None:
    created = _view()
    expectations = expect({}, created, {EXISTS}, NOW, ttl=timedelta(seconds=30))
    pods, outstanding = overlay([], expectations, NOW + timedelta(seconds=31))
    assert pods == () and outstanding == {}


def test_later_writes_merge_with_earlier_ones() -> None:
    created = replace(_view(), gated=True)
    expectations = expect({}, created, {EXISTS}, NOW)
    expectations = expect(expectations, replace(created, gated=False), {"gated"}, NOW)
    pods, _ = overlay([], expectations, NOW)
    assert pods[0].gated is False
    pods, outstanding = overlay([created], expectations, NOW)
    assert pods[0].gated is False and outstanding[created.name].fields == frozenset({"gated"})


@pytest.mark.parametrize(
    ("statuses", "reason", "field"),
    [
        (
            {"containerStatuses": [{"name": "vllm", "state": {"waiting": {"reason": "ContainerCreating"}}}]},
            "ContainerCreating",
            None,
        ),
        (
            {
                "containerStatuses": [
                    {
                        "name": "vllm",
                        "state": {
                            "waiting": {
                                "reason": "CreateContainerConfigError",
                                "message": 'secret "hf-token" not found',
                            }
                        },
                    }
                ]
            },
            "CreateContainerConfigError",
            "spec.engine.env[].valueFrom or spec.pod.volumes",
        ),
        (
            {
                "initContainerStatuses": [
                    {
                        "name": "agent",
                        "state": {"waiting": {"reason": "ImagePullBackOff", "message": "back-off"}},
                    }
                ],
                "containerStatuses": [{"name": "vllm", "state": {"waiting": {"reason": "PodInitializing"}}}],
            },
            "ImagePullBackOff",
            "spec.engine.image (or spec.pod.imagePullSecrets)",
        ),
        ({"containerStatuses": [{"name": "vllm", "state": {"running": {}}}]}, None, None),
    ],
    ids=["progress is not a problem", "missing Secret", "init containers first", "running"],
)
def test_a_waiting_container_is_read_with_the_field_to_fix(
    statuses: dict[str, Any], reason: str | None, field: str | None
) -> None:
    view = parse_pod(raw_pod(phase="Pending", **statuses))
    assert view is not None
    if reason is None:
        assert view.waiting is None
    else:
        assert view.waiting is not None
        assert (view.waiting.reason, view.waiting.spec_field) == (reason, field)


def test_a_pod_on_another_device_resource_claims_it() -> None:
    pod = raw_pod(phase="Running")
    pod["spec"]["containers"][0]["resources"] = {"limits": {"amd.com/gpu": "4", "rdma/hca": "1"}}
    claim = gpu_claim(pod)
    assert claim is not None
    # rdma/hca sorts after amd.com/gpu; nvidia.com/gpu, when asked for, always wins.
    assert (claim.resource, claim.gpus, claim.node_name) == ("amd.com/gpu", 4, "node-1")
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "2"
    claim = gpu_claim(pod)
    assert claim is not None and (claim.resource, claim.gpus) == ("nvidia.com/gpu", 2)


def test_a_node_reports_every_device_resource() -> None:
    node = parse_node(
        {
            "metadata": {"name": "mi300-0", "labels": {}},
            "spec": {},
            "status": {
                "allocatable": {"amd.com/gpu": "8", "cpu": "224", "nvidia.com/gpu": "0", "rdma/hca": "bad"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
    )
    assert node.inventory.allocatable("amd.com/gpu") == 8
    assert node.inventory.allocatable("nvidia.com/gpu") == 0
    assert node.inventory.allocatable("example.com/none") == 0
