"""A platform team's GPU nodes come and go with Karpenter: a ModelGroup grows past the nodes that
exist, Karpenter (the real controller, built from its Go module, with its KWOK cloud provider)
creates GPU nodes for the pending groups, the groups turn Ready, and after scale-in the empty nodes
go away. A NodePool that can never launch a node gets the whole waiting group released within the
bound, with a condition and an Event that say what to check and set.

Each story has its own NodePool and node label (the test's namespace), so it sees only its own nodes.
The test plays the vLLM leaders (warm-up and load); the readiness checks of the health agent are off.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from goodput.testbed.cluster import karpenter
from goodput.testbed.cluster.controlplane import LocalCluster, log_tail
from goodput.testbed.cluster.testing import wait_for
from goodput.testbed.cluster.topology import CLIQUE_LABEL
from goodput.testbed.operator_process import FakeLeaders, OperatorProcess

pytestmark = pytest.mark.e2e

POOL_LABEL = "e2e.goodput.dev/pool"
LABEL_MODEL_GROUP = "goodput.dev/model-group"
LABEL_GROUP = "goodput.dev/group"


@pytest.fixture(scope="module")
def karpenter_running(cluster: LocalCluster, goodput_crds: list[str]) -> Iterator[karpenter.KarpenterLayout]:
    layout = karpenter.start(cluster)
    try:
        yield layout
    finally:
        karpenter.stop(cluster)


def model_group(
    name: str,
    namespace: str,
    *,
    replicas: int,
    timeout_seconds: int,
    pool_label: str = POOL_LABEL,
    max_replicas: int = 4,
) -> str:
    """A 70B-style ModelGroup (two 8-GPU pods per group, held in one NVLink clique) that asks for
    nodes when none fit: `placement.nodeProvisioning.mode: Pods`."""
    body: dict[str, Any] = {
        "apiVersion": "goodput.dev/v1alpha1",
        "kind": "ModelGroup",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-70B-Instruct", "revision": "main"},
            "engine": {"image": "vllm/vllm-openai:v0.33.0"},
            "parallelism": {"tensor": 8, "pipeline": 2, "gpusPerPod": 8},
            "placement": {
                "mode": "Required",
                "nodeSelector": [{"key": pool_label, "value": namespace}],
                "nodeProvisioning": {"mode": "Pods", "provisioningTimeoutSeconds": timeout_seconds},
            },
            "replicas": replicas,
            "maxReplicas": max_replicas,
            "readiness": {"ncclCheck": "Skip", "revisionCheck": False},
            "drain": {"minLifetimeSeconds": 0},
        },
    }
    return yaml.safe_dump(body)


def karpenter_log(cluster: LocalCluster) -> str:
    return log_tail(cluster.layout.paths, karpenter.PROCESS)


def status(cluster: LocalCluster, namespace: str, name: str) -> dict[str, Any]:
    found = cluster.api.get(f"/apis/goodput.dev/v1alpha1/namespaces/{namespace}/modelgroups/{name}") or {}
    return dict(found.get("status") or {})


def condition(current: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in current.get("conditions", []) if c["type"] == kind), {})


def live_pods(cluster: LocalCluster, namespace: str) -> list[dict[str, Any]]:
    answer = cluster.api.get(f"/api/v1/namespaces/{namespace}/pods?labelSelector={LABEL_MODEL_GROUP}") or {}
    return [p for p in answer.get("items", []) if not p["metadata"].get("deletionTimestamp")]


def events(cluster: LocalCluster, namespace: str, reason: str) -> list[dict[str, Any]]:
    answer = cluster.api.get(f"/api/v1/namespaces/{namespace}/events?fieldSelector=reason%3D{reason}") or {}
    return list(answer.get("items", []))


def partial_group_nodes(cluster: LocalCluster, namespace: str, pool: str) -> list[str]:
    """Karpenter nodes holding part of a group, or nothing: what must never be left behind."""
    launched = {node["metadata"]["name"] for node in karpenter.nodes_of_pool(cluster, pool)}
    return karpenter.nodes_left_wrong(live_pods(cluster, namespace), launched, LABEL_GROUP)


def test_a_model_group_grows_onto_nodes_karpenter_creates_and_they_go_after_scale_in(
    cluster: LocalCluster,
    namespace: str,
    karpenter_running: karpenter.KarpenterLayout,
    operator: OperatorProcess,
    leaders: FakeLeaders,
) -> None:
    pool = f"{namespace}-gpu"
    clique = f"{namespace}-karpenter"
    # Two existing GPU nodes of this team: room for one group of 16 GPUs.
    existing = [
        cluster.add_gpu_node(
            f"{namespace}-n{i}", zone="zone-a", clique=f"{namespace}-c0", labels={POOL_LABEL: namespace}
        ).name
        for i in range(2)
    ]
    cluster.kubectl(
        "apply",
        "-f",
        "-",
        input=yaml.safe_dump(karpenter.node_pool(pool, labels={POOL_LABEL: namespace}, clique=clique)),
    )
    try:
        cluster.kubectl(
            "apply", "-f", "-", input=model_group("llama", namespace, replicas=1, timeout_seconds=300)
        )
        wait_for(lambda: status(cluster, namespace, "llama").get("readyGroups") == 1, timeout_seconds=90,
                 describe=lambda: f"one ready group\n{operator.log_tail()}")  # fmt: skip

        # Past the existing nodes: two more groups, four more 8-GPU nodes.
        cluster.kubectl("scale", "mg", "llama", "-n", namespace, "--replicas=3")
        wait_for(
            lambda: status(cluster, namespace, "llama").get("readyGroups") == 3,
            timeout_seconds=240,
            describe=lambda: (
                f"three ready groups; status {status(cluster, namespace, 'llama')}\n"
                f"karpenter log:\n{karpenter_log(cluster)}\noperator log:\n{operator.log_tail()}"
            ),
        )
        launched = karpenter.nodes_of_pool(cluster, pool)
        assert len(launched) == 4, [n["metadata"]["name"] for n in launched]
        assert all(n["metadata"]["labels"][CLIQUE_LABEL] == clique for n in launched)
        launched_names = {n["metadata"]["name"] for n in launched}
        by_group: dict[str, set[str]] = {}
        for pod in live_pods(cluster, namespace):
            by_group.setdefault(pod["metadata"]["labels"][LABEL_GROUP], set()).add(pod["spec"]["nodeName"])
        # Each group whole, on existing nodes or on new ones, never across both.
        assert sorted(nodes <= launched_names for nodes in by_group.values()) == [False, True, True], by_group
        assert all(nodes <= launched_names or nodes <= set(existing) for nodes in by_group.values())
        assert not partial_group_nodes(cluster, namespace, pool)
        assert condition(status(cluster, namespace, "llama"), "ScalingLimited").get("status") == "False"

        # Scale-in: goodput drains and deletes whole groups; Karpenter removes the nodes left empty.
        cluster.kubectl("scale", "mg", "llama", "-n", namespace, "--replicas=1")
        wait_for(
            lambda: (
                status(cluster, namespace, "llama").get("readyGroups") == 1
                and len(live_pods(cluster, namespace)) == 2
                and not partial_group_nodes(cluster, namespace, pool)
            ),
            timeout_seconds=180,
            describe=lambda: (
                "one group left and no empty Karpenter node: "
                f"{partial_group_nodes(cluster, namespace, pool)}\n"
                f"karpenter log:\n{karpenter_log(cluster)}"
            ),
        )
        assert len(karpenter.nodes_of_pool(cluster, pool)) < 4
    finally:
        cluster.kubectl("delete", "mg", "llama", "-n", namespace, "--wait=false", check=False)
        karpenter.delete_pool(cluster, pool)
        for name in existing:
            cluster.remove_node(name)


def test_a_node_pool_that_never_launches_releases_the_whole_group_and_says_why(
    cluster: LocalCluster,
    namespace: str,
    karpenter_running: karpenter.KarpenterLayout,
    operator: OperatorProcess,
    leaders: FakeLeaders,
) -> None:
    pool = f"{namespace}-full"
    capped = karpenter.node_pool(pool, labels={POOL_LABEL: namespace}, clique=f"{namespace}-k", gpu_limit=0)
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(capped))
    try:
        cluster.kubectl(
            "apply", "-f", "-", input=model_group("llama", namespace, replicas=1, timeout_seconds=30)
        )

        # The group is created for new nodes: its pods wait, released, pending and visible to Karpenter.
        def pending_ungated() -> bool:
            pods = live_pods(cluster, namespace)
            return len(pods) == 2 and all(not p["spec"].get("schedulingGates") for p in pods)

        wait_for(
            pending_ungated, timeout_seconds=60, describe=lambda: f"two pending ranks\n{operator.log_tail()}"
        )
        # The ModelGroup says so: Progressing, reason NodesProvisioning, naming the waiting group.
        wait_for(
            lambda: (
                condition(status(cluster, namespace, "llama"), "Progressing").get("reason")
                == "NodesProvisioning"
            ),
            timeout_seconds=30,
            describe=lambda: f"Progressing NodesProvisioning; status {status(cluster, namespace, 'llama')}",
        )

        def released() -> dict[str, Any]:
            current = status(cluster, namespace, "llama")
            limited = condition(current, "ScalingLimited")
            gone = not live_pods(cluster, namespace)
            return current if gone and limited.get("reason") == "NodeProvisioningTimeout" else {}

        final = wait_for(
            released,
            timeout_seconds=120,
            describe=lambda: (
                f"the group released; status {status(cluster, namespace, 'llama')}\n{operator.log_tail()}"
            ),
        )
        limited = condition(final, "ScalingLimited")
        assert limited["status"] == "True"
        assert "provisioningTimeoutSeconds" in limited["message"] and "NodePool" in limited["message"]
        (event,) = events(cluster, namespace, "NodeProvisioningTimeout")
        assert "deleted whole" in event["message"] and "0/2 pod(s) bound" in event["message"]
        assert final.get("readyGroups", 0) == 0
        assert karpenter.nodes_of_pool(cluster, pool) == []
    finally:
        cluster.kubectl("delete", "mg", "llama", "-n", namespace, "--wait=false", check=False)
        karpenter.delete_pool(cluster, pool)
