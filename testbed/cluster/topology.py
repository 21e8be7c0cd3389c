"""Fake GPU fleet shapes: zones of NVLink domains of 8-GPU nodes, rendered as Kubernetes Node objects.

Pure: a `Topology` plus a `PodNetwork` give the same nodes (names, labels, pod CIDRs, addresses) every
time, so tests can predict where the scheduler may place a pod. kwok plays the kubelet for them.
"""

from __future__ import annotations

import ipaddress
import re
import string
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

ZONE_LABEL = "topology.kubernetes.io/zone"
REGION_LABEL = "topology.kubernetes.io/region"
CLIQUE_LABEL = "nvidia.com/gpu.clique"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
HOSTNAME_LABEL = "kubernetes.io/hostname"
GPU_RESOURCE = "nvidia.com/gpu"
FAKE_NODE_LABEL = "type"  # kwok's convention: `type: kwok` marks a simulated node
REGION = "local"
# A lost node (see LocalCluster.lose_node): no stage plays its kubelet while this annotation is set.
NODE_LOST_ANNOTATION = "sim.goodput.dev/node-lost"

# Node i of a cluster owns 10.<octet>.i.0/24; the two top /24s hold node addresses and kwok's fallback pool.
MAX_NODES = 254
_NODE_ADDRESS_BLOCK = 255
_FALLBACK_POD_BLOCK = 254
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True, slots=True)
class PodNetwork:
    """Addresses of one local cluster, all inside 10.<octet>.0.0/16 plus a /30 link network.

    The /16 is routed from the host into the cluster's network namespace, where every address is
    local, so a test process can serve on any pod IP. `octet` differs between clusters on one host.
    """

    octet: int

    def __post_init__(self) -> None:
        if not 1 <= self.octet <= 254:
            raise ValueError(f"network octet must be in 1..254, got {self.octet}")

    @property
    def pod_range(self) -> str:
        return f"10.{self.octet}.0.0/16"

    @property
    def fallback_pod_cidr(self) -> str:
        """kwok's pool for a node that carries no podCIDR (a node a test created by hand)."""
        return f"10.{self.octet}.{_FALLBACK_POD_BLOCK}.0/24"

    @property
    def host_link_address(self) -> str:
        """Host end of the veth pair (with prefix length)."""
        return f"169.254.{self.octet}.1/30"

    @property
    def namespace_link_address(self) -> str:
        """Namespace end of the veth pair (with prefix length); the host routes pod traffic to it."""
        return f"169.254.{self.octet}.2/30"

    @property
    def gateway(self) -> str:
        return self.namespace_link_address.split("/")[0]

    @property
    def extension_server_address(self) -> str:
        """The one address of the node-address block no node takes (nodes start at .1): where an
        extension API server of the harness (KEDA's metrics adapter) is reached, as if a pod."""
        return f"10.{self.octet}.{_NODE_ADDRESS_BLOCK}.0"

    def node_pod_cidr(self, index: int) -> str:
        _check_node_index(index)
        return f"10.{self.octet}.{index}.0/24"

    def node_address(self, index: int) -> str:
        _check_node_index(index)
        return f"10.{self.octet}.{_NODE_ADDRESS_BLOCK}.{index + 1}"

    def node_index_of(self, pod_cidr: str) -> int | None:
        """The node index a podCIDR of this network belongs to, or None for a foreign CIDR."""
        try:
            net = ipaddress.IPv4Network(pod_cidr)
        except ValueError:
            return None
        if net.prefixlen != 24 or not net.subnet_of(ipaddress.IPv4Network(self.pod_range)):
            return None
        index = int(net.network_address.packed[2])
        return index if index < MAX_NODES else None

    def contains(self, ip: str) -> bool:
        return ipaddress.ip_address(ip) in ipaddress.ip_network(self.pod_range)


def _check_node_index(index: int) -> None:
    if not 0 <= index < MAX_NODES:
        raise ValueError(f"node index must be in 0..{MAX_NODES - 1}, got {index}")


@dataclass(frozen=True, slots=True)
class Topology:
    """How many zones, NVLink domains per zone, nodes per domain and GPUs per node to fake."""

    zones: int = 2
    domains_per_zone: int = 2
    nodes_per_domain: int = 2
    gpus_per_node: int = 8
    gpu_product: str = "NVIDIA-H100-80GB-HBM3"
    gpu_memory_mib: int = 81559

    def __post_init__(self) -> None:
        for name in ("zones", "domains_per_zone", "nodes_per_domain", "gpus_per_node"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.zones > len(string.ascii_lowercase):
            raise ValueError(f"at most {len(string.ascii_lowercase)} zones, got {self.zones}")
        if self.node_count > MAX_NODES:
            raise ValueError(f"at most {MAX_NODES} nodes per cluster, got {self.node_count}")

    @property
    def node_count(self) -> int:
        return self.zones * self.domains_per_zone * self.nodes_per_domain

    @property
    def gpu_count(self) -> int:
        return self.node_count * self.gpus_per_node

    @classmethod
    def parse(cls, text: str) -> Topology:
        """Parse `zones=1,domains=2,nodes=2,gpus=8[,product=NAME][,memory=MIB]`; omitted keys: defaults."""
        keys = {"zones": "zones", "domains": "domains_per_zone", "nodes": "nodes_per_domain"}
        keys |= {"gpus": "gpus_per_node", "product": "gpu_product", "memory": "gpu_memory_mib"}
        values: dict[str, Any] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            key, sep, value = item.partition("=")
            if not sep or key.strip() not in keys:
                raise ValueError(
                    f"bad topology item {item!r}; expected one of {', '.join(keys)} as key=value"
                )
            field_name = keys[key.strip()]
            if field_name == "gpu_product":
                values[field_name] = value.strip()
                continue
            try:
                values[field_name] = int(value)
            except ValueError:
                raise ValueError(f"topology {key.strip()} must be an integer, got {value!r}") from None
        return replace(cls(), **values)

    def describe(self) -> str:
        return (
            f"zones={self.zones},domains={self.domains_per_zone},nodes={self.nodes_per_domain},"
            f"gpus={self.gpus_per_node},product={self.gpu_product},memory={self.gpu_memory_mib}"
        )


@dataclass(frozen=True, slots=True)
class FakeGpuNode:
    """One fake GPU node: where it sits in the topology and which addresses it owns."""

    name: str
    index: int
    zone: str
    clique: str
    gpus: int
    gpu_product: str
    gpu_memory_mib: int
    pod_cidr: str
    address: str
    extra_labels: tuple[tuple[str, str], ...] = field(default=())

    def labels(self) -> dict[str, str]:
        labels = {
            FAKE_NODE_LABEL: "kwok",
            HOSTNAME_LABEL: self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "node.kubernetes.io/instance-type": f"fake-{self.gpus}x-{self.gpu_product}"[:63].rstrip("-."),
            REGION_LABEL: REGION,
            ZONE_LABEL: self.zone,
            CLIQUE_LABEL: self.clique,
            GPU_PRESENT_LABEL: "true",
            GPU_PRODUCT_LABEL: self.gpu_product,
            GPU_COUNT_LABEL: str(self.gpus),
            GPU_MEMORY_LABEL: str(self.gpu_memory_mib),
        }
        labels.update(self.extra_labels)
        return labels

    def manifest(self) -> dict[str, Any]:
        """The Node object to create. Status is sent on create (as a kubelet registers) so the scheduler
        sees the GPUs at once; kwok's node stage keeps capacity and addresses it finds."""
        resources = {
            "cpu": "224",
            "memory": "2Ti",
            "pods": "110",
            "ephemeral-storage": "30Ti",
            GPU_RESOURCE: str(self.gpus),
        }
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "labels": self.labels(),
                "annotations": {
                    "kwok.x-k8s.io/node": "fake",
                    "node.alpha.kubernetes.io/ttl": "0",
                },
            },
            # No taint: every node of this cluster is fake, so workloads need no toleration.
            "spec": {"podCIDR": self.pod_cidr, "podCIDRs": [self.pod_cidr]},
            "status": {
                "capacity": dict(resources),
                "allocatable": dict(resources),
                "addresses": [
                    {"type": "InternalIP", "address": self.address},
                    {"type": "Hostname", "address": self.name},
                ],
            },
        }


def zone_name(zone_index: int) -> str:
    return f"zone-{string.ascii_lowercase[zone_index]}"


def clique_name(zone: str, domain_index: int) -> str:
    """NVLink domain id, unique in the cluster (GPU feature discovery writes `<cluster>.<clique>`)."""
    return f"{zone}.nvl{domain_index}"


def fake_gpu_nodes(topology: Topology, network: PodNetwork) -> list[FakeGpuNode]:
    """Every node of the topology, named `gpu-<zone letter><domain>-<n>`, indexed in that order."""
    nodes: list[FakeGpuNode] = []
    for z in range(topology.zones):
        zone = zone_name(z)
        for d in range(topology.domains_per_zone):
            for n in range(topology.nodes_per_domain):
                index = len(nodes)
                nodes.append(
                    FakeGpuNode(
                        name=f"gpu-{string.ascii_lowercase[z]}{d}-{n}",
                        index=index,
                        zone=zone,
                        clique=clique_name(zone, d),
                        gpus=topology.gpus_per_node,
                        gpu_product=topology.gpu_product,
                        gpu_memory_mib=topology.gpu_memory_mib,
                        pod_cidr=network.node_pod_cidr(index),
                        address=network.node_address(index),
                    )
                )
    return nodes


def extra_gpu_node(
    name: str,
    *,
    index: int,
    network: PodNetwork,
    zone: str,
    clique: str,
    gpus: int = 8,
    gpu_product: str = "NVIDIA-H100-80GB-HBM3",
    gpu_memory_mib: int = 81559,
    labels: dict[str, str] | None = None,
) -> FakeGpuNode:
    """A node a test adds to a running cluster (a replacement, a new domain, a bigger machine)."""
    if not _DNS_LABEL.match(name) or len(name) > 63:
        raise ValueError(f"node name must be a DNS label, got {name!r}")
    if gpus < 0:
        raise ValueError(f"gpus must not be negative, got {gpus}")
    return FakeGpuNode(
        name=name,
        index=index,
        zone=zone,
        clique=clique,
        gpus=gpus,
        gpu_product=gpu_product,
        gpu_memory_mib=gpu_memory_mib,
        pod_cidr=network.node_pod_cidr(index),
        address=network.node_address(index),
        extra_labels=tuple(sorted((labels or {}).items())),
    )


def first_free_node_index(used: Iterable[int]) -> int:
    """The lowest node index (hence /24 of the pod range) no existing node holds."""
    taken = set(used)
    for index in range(MAX_NODES):
        if index not in taken:
            return index
    raise ValueError(f"all {MAX_NODES} node slots of the pod range are taken")
