"""Karpenter on the local cluster: a real node autoscaler, with its KWOK cloud provider.

The controller is built from Karpenter's Go module (tools/karpenter) and runs on the host as the
control plane does, against the local API server. Its KWOK provider "launches" an instance by
creating a Node object (and deletes it to terminate one); the local kwok plays that node's kubelet
like every other fake node's, so a Karpenter node turns Ready and runs pods. The instance types it
may launch come from a file (`INSTANCE_TYPES_ENV`): GPU machines whose nodes carry `nvidia.com/gpu`
capacity; the NodePool adds the labels goodput's placement reads (GPU product and count, NVLink
clique, zone). `start` is idempotent per cluster.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from goodput.testbed.cluster import processes
from goodput.testbed.cluster.config import LOOPBACK
from goodput.testbed.cluster.controlplane import ClusterError, LocalCluster, free_ports, log_tail
from goodput.testbed.cluster.kube import ApiError, probe
from goodput.testbed.cluster.topology import (
    CLIQUE_LABEL,
    FAKE_NODE_LABEL,
    GPU_COUNT_LABEL,
    GPU_MEMORY_LABEL,
    GPU_PRESENT_LABEL,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    ZONE_LABEL,
)

NAMESPACE = "karpenter"
PROCESS = "karpenter"
CRD_DIR = "karpenter-crds"
NODE_CLASS = "goodput-gpu"
NODE_CLASS_API = "karpenter.kwok.sh/v1alpha1"
NODE_POOL_API = "karpenter.sh/v1"
INSTANCE_TYPES_ENV = "INSTANCE_TYPES_FILE_PATH"
"""Where Karpenter's KWOK provider reads its instance types from (kwok/options in its source)."""
NODEPOOL_LABEL = "karpenter.sh/nodepool"
"""The label Karpenter puts on every node it launched: the NodePool's name."""
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
CAPACITY_TYPE_LABEL = "karpenter.sh/capacity-type"
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
GPU_MEMORY_MIB = 81559
ZONES = ("zone-a", "zone-b")


@dataclass(frozen=True, slots=True)
class GpuInstanceType:
    """One machine shape Karpenter may launch: `gpus` GPUs, priced per hour, offered in `ZONES`."""

    name: str
    gpus: int
    cpu: str = "224"
    memory: str = "2Ti"
    price_per_hour: float = 98.32


INSTANCE_TYPES = (GpuInstanceType("p5.48xlarge", 8), GpuInstanceType("g6e.12xlarge", 4, "48", "384Gi", 10.49))


def instance_types_document(types: tuple[GpuInstanceType, ...] = INSTANCE_TYPES) -> list[dict[str, Any]]:
    """The KWOK provider's instance-types file: every type on demand in every zone of the cluster."""
    return [
        {
            "name": kind.name,
            "architecture": "amd64",
            "operatingSystems": ["linux"],
            "resources": {
                "cpu": kind.cpu,
                "memory": kind.memory,
                "pods": "110",
                "ephemeral-storage": "30Ti",
                GPU_RESOURCE: str(kind.gpus),
            },
            "offerings": [
                {
                    "Price": kind.price_per_hour,
                    "Available": True,
                    "Requirements": [
                        {"key": CAPACITY_TYPE_LABEL, "operator": "In", "values": ["on-demand"]},
                        {"key": ZONE_LABEL, "operator": "In", "values": [zone]},
                    ],
                }
                for zone in ZONES
            ],
        }
        for kind in types
    ]


def node_class() -> dict[str, Any]:
    return {"apiVersion": NODE_CLASS_API, "kind": "KWOKNodeClass", "metadata": {"name": NODE_CLASS}}


def node_pool(
    name: str,
    *,
    labels: dict[str, str],
    clique: str,
    gpu_limit: int | None = None,
    consolidate_after_seconds: int = 5,
    instance_type: str = "p5.48xlarge",
) -> dict[str, Any]:
    """A NodePool of 8-GPU nodes as a platform team writes one for goodput: the GPU labels placement
    reads, one NVLink clique (`clique`) so that a group's pod affinity has a domain to land in, the
    team's own `labels`, empty nodes consolidated after `consolidate_after_seconds`.

    gpu_limit: the most GPUs the pool may hold (0: a pool that can never launch a node)."""
    gpus = next(kind.gpus for kind in INSTANCE_TYPES if kind.name == instance_type)
    pool: dict[str, Any] = {
        "apiVersion": NODE_POOL_API,
        "kind": "NodePool",
        "metadata": {"name": name},
        "spec": {
            "template": {
                "metadata": {
                    "labels": {
                        FAKE_NODE_LABEL: "kwok",
                        GPU_PRESENT_LABEL: "true",
                        GPU_PRODUCT_LABEL: GPU_PRODUCT,
                        GPU_COUNT_LABEL: str(gpus),
                        GPU_MEMORY_LABEL: str(GPU_MEMORY_MIB),
                        **labels,
                    }
                },
                "spec": {
                    "nodeClassRef": {
                        "group": "karpenter.kwok.sh",
                        "kind": "KWOKNodeClass",
                        "name": NODE_CLASS,
                    },
                    "requirements": [
                        {"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": [instance_type]},
                        {"key": CAPACITY_TYPE_LABEL, "operator": "In", "values": ["on-demand"]},
                        {"key": CLIQUE_LABEL, "operator": "In", "values": [clique]},
                    ],
                    "expireAfter": "Never",
                },
            },
            "disruption": {
                "consolidationPolicy": "WhenEmptyOrUnderutilized",
                "consolidateAfter": f"{consolidate_after_seconds}s",
            },
        },
    }
    if gpu_limit is not None:
        pool["spec"]["limits"] = {GPU_RESOURCE: str(gpu_limit)}
    return pool


@dataclass(frozen=True, slots=True)
class KarpenterLayout:
    bin_dir: Path
    kubeconfig: Path
    instance_types_file: Path
    metrics_port: int
    health_port: int

    @property
    def health_url(self) -> str:
        return f"http://{LOOPBACK}:{self.health_port}/readyz"


def command(layout: KarpenterLayout) -> list[str]:
    """Karpenter takes no --kubeconfig flag: the client finds the cluster through $KUBECONFIG."""
    return [str(layout.bin_dir / "karpenter")]


def process_env(layout: KarpenterLayout) -> dict[str, str]:
    """Karpenter reads its options from the environment. One replica, so no leader election; a short
    batching window, as the local cluster's pending pods come in one burst."""
    return {
        **os.environ,
        "KUBECONFIG": str(layout.kubeconfig),
        "SYSTEM_NAMESPACE": NAMESPACE,
        "DISABLE_LEADER_ELECTION": "true",
        "METRICS_PORT": str(layout.metrics_port),
        "HEALTH_PROBE_PORT": str(layout.health_port),
        "BATCH_IDLE_DURATION": "1s",
        "BATCH_MAX_DURATION": "3s",
        "LOG_LEVEL": "info",
        INSTANCE_TYPES_ENV: str(layout.instance_types_file),
    }


def start(cluster: LocalCluster, *, timeout_seconds: float = 120.0) -> KarpenterLayout:
    """Install Karpenter's CRDs and its KWOKNodeClass, start the controller and wait until it is
    ready. Raises ClusterError with its log when it does not come up."""
    stop(cluster)
    crds = cluster.bin_dir / CRD_DIR
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crds))
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(crds))
    state = cluster.state_dir / "karpenter"
    state.mkdir(exist_ok=True)
    instance_types = state / "instance-types.json"
    instance_types.write_text(json.dumps(instance_types_document(), indent=2))
    _create(
        cluster,
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
    )
    _create(cluster, "/apis/karpenter.kwok.sh/v1alpha1/kwoknodeclasses", node_class())
    _mark_node_class_ready(cluster)
    layout = KarpenterLayout(cluster.bin_dir, Path(cluster.kubeconfig), instance_types, *free_ports(2))
    paths = cluster.layout.paths
    processes.spawn(
        PROCESS, command(layout), log_path=paths.log(PROCESS), pid_dir=paths.pids, env=process_env(layout)
    )
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        record = processes.read_records(paths.pids).get(PROCESS)
        if record is None or not processes.is_running(record):
            raise ClusterError(f"karpenter exited during start-up; its log:\n{log_tail(paths, PROCESS)}")
        if probe(layout.health_url)[0]:
            return layout
        time.sleep(0.5)
    raise ClusterError(f"karpenter not ready in time; its log:\n{log_tail(paths, PROCESS)}")


def stop(cluster: LocalCluster) -> bool:
    """Stop the controller (its nodes stay, as instances outlive a stopped autoscaler)."""
    record = processes.read_records(cluster.layout.paths.pids).get(PROCESS)
    return record is not None and processes.stop(record)


def _create(cluster: LocalCluster, path: str, obj: dict[str, Any]) -> None:
    try:
        cluster.api.create(path, obj)
    except ApiError as error:
        if error.status != 409:
            raise


def _mark_node_class_ready(cluster: LocalCluster) -> None:
    """A cloud provider's own controller reports its node class Ready once it has checked the
    class against the cloud (subnets, images); the KWOK provider has nothing to check and no such
    controller, so the test bed reports it, and Karpenter's NodePools turn Ready."""
    path = f"/apis/karpenter.kwok.sh/v1alpha1/kwoknodeclasses/{NODE_CLASS}"
    found = cluster.api.get(path) or {}
    generation = int(found.get("metadata", {}).get("generation") or 1)
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "Ready",
        "message": "",
        "lastTransitionTime": now,
        "observedGeneration": generation,
    }
    cluster.api.patch(f"{path}/status", {"status": {"conditions": [ready]}})


def nodes_of_pool(cluster: LocalCluster, pool: str) -> list[dict[str, Any]]:
    """The nodes Karpenter launched for `pool` that are not being deleted."""
    answer = cluster.api.get(f"/api/v1/nodes?labelSelector={NODEPOOL_LABEL}%3D{pool}") or {}
    return [node for node in answer.get("items", []) if not node["metadata"].get("deletionTimestamp")]


def delete_pool(cluster: LocalCluster, pool: str) -> None:
    """Delete a NodePool; Karpenter then removes its nodes."""
    try:
        cluster.api.delete(f"/apis/karpenter.sh/v1/nodepools/{pool}")
    except ApiError as error:
        if error.status != 404:
            raise


def nodes_left_wrong(pods: list[dict[str, Any]], launched: set[str], group_label: str) -> list[str]:
    """Launched nodes that must not be left behind once the groups settled: a node holding some ranks
    of a group whose other ranks are elsewhere (a partial group), or a node holding no rank at all
    (one consolidation should have removed). `pods`: the ModelGroup's live pods."""
    nodes_by_group: dict[str, list[str | None]] = {}
    for pod in pods:
        nodes_by_group.setdefault(pod["metadata"]["labels"][group_label], []).append(
            pod["spec"].get("nodeName")
        )
    used: set[str] = set()
    partial: set[str] = set()
    for placed in nodes_by_group.values():
        on_launched = {node for node in placed if node is not None and node in launched}
        used |= on_launched
        if on_launched and len([node for node in placed if node in launched]) != len(placed):
            partial |= on_launched
    return sorted(partial | (launched - used))
