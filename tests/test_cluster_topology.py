"""Fake GPU fleet shapes: parsing, node generation and the pod network plan."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from goodput.testbed.cluster.topology import (
    CLIQUE_LABEL,
    GPU_RESOURCE,
    MAX_NODES,
    ZONE_LABEL,
    PodNetwork,
    Topology,
    extra_gpu_node,
    fake_gpu_nodes,
    first_free_node_index,
)


@dataclass(frozen=True)
class ParseCase:
    text: str
    expected: Topology


PARSE_CASES = {
    "empty keeps defaults": ParseCase("", Topology()),
    "full shape": ParseCase(
        "zones=1,domains=2,nodes=2,gpus=8",
        Topology(zones=1, domains_per_zone=2, nodes_per_domain=2, gpus_per_node=8),
    ),
    "partial shape keeps the rest": ParseCase("gpus=4", Topology(gpus_per_node=4)),
    "spaces are tolerated": ParseCase(" zones = 3 , nodes=1 ", Topology(zones=3, nodes_per_domain=1)),
    "product and memory": ParseCase(
        "product=NVIDIA-A100-SXM4-80GB,memory=81920",
        Topology(gpu_product="NVIDIA-A100-SXM4-80GB", gpu_memory_mib=81920),
    ),
}


@pytest.mark.parametrize("case", PARSE_CASES.values(), ids=PARSE_CASES.keys())
def test_parse_reads_each_key(case: ParseCase) -> None:
    assert Topology.parse(case.text) == case.expected


BAD_TOPOLOGIES = {
    "unknown key": ("racks=2", "bad topology item"),
    "missing value": ("zones", "bad topology item"),
    "not a number": ("gpus=eight", "must be an integer"),
    "zero zones": ("zones=0", "zones must be at least 1"),
    "too many nodes": ("zones=26,domains=5,nodes=2", "at most 254 nodes"),
    "more zones than letters": ("zones=27,domains=1,nodes=1", "at most 26 zones"),
}


@pytest.mark.parametrize(("text", "message"), BAD_TOPOLOGIES.values(), ids=BAD_TOPOLOGIES.keys())
def test_parse_rejects_bad_shapes_with_a_reason(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Topology.parse(text)


def test_describe_round_trips_through_parse() -> None:
    topology = Topology(
        zones=3, domains_per_zone=1, nodes_per_domain=4, gpus_per_node=4, gpu_memory_mib=40960
    )
    assert Topology.parse(topology.describe()) == topology


def test_default_fleet_names_zones_and_nvlink_domains() -> None:
    nodes = fake_gpu_nodes(Topology(), PodNetwork(200))

    assert [n.name for n in nodes] == [
        "gpu-a0-0", "gpu-a0-1", "gpu-a1-0", "gpu-a1-1", "gpu-b0-0", "gpu-b0-1", "gpu-b1-0", "gpu-b1-1",
    ]  # fmt: skip
    assert {n.clique for n in nodes} == {"zone-a.nvl0", "zone-a.nvl1", "zone-b.nvl0", "zone-b.nvl1"}
    assert nodes[0].pod_cidr == "10.200.0.0/24"
    assert nodes[7].pod_cidr == "10.200.7.0/24"
    assert nodes[7].address == "10.200.255.8"


topologies = st.builds(
    Topology,
    zones=st.integers(1, 4),
    domains_per_zone=st.integers(1, 4),
    nodes_per_domain=st.integers(1, 8),
    gpus_per_node=st.sampled_from([1, 4, 8]),
)


@given(topology=topologies, octet=st.integers(1, 254))
def test_generated_fleet_is_consistent(topology: Topology, octet: int) -> None:
    network = PodNetwork(octet)
    nodes = fake_gpu_nodes(topology, network)
    pod_range = ipaddress.IPv4Network(network.pod_range)
    pod_cidrs = [ipaddress.IPv4Network(n.pod_cidr) for n in nodes]

    assert len(nodes) == topology.node_count
    assert len({n.name for n in nodes}) == len(nodes)
    assert [n.index for n in nodes] == list(range(len(nodes)))
    # Pod CIDRs are disjoint /24s of the routed range; node addresses never collide with a pod IP.
    assert all(cidr.subnet_of(pod_range) for cidr in pod_cidrs)
    assert len(set(pod_cidrs)) == len(pod_cidrs)
    for node in nodes:
        address = ipaddress.IPv4Address(node.address)
        assert address in pod_range
        assert not any(address in cidr for cidr in pod_cidrs)
        assert address not in ipaddress.IPv4Network(network.fallback_pod_cidr)
        assert network.node_index_of(node.pod_cidr) == node.index
    # Each NVLink domain lies in one zone and holds nodes_per_domain nodes.
    by_clique: dict[str, set[str]] = {}
    for node in nodes:
        by_clique.setdefault(node.clique, set()).add(node.zone)
    assert len(by_clique) == topology.zones * topology.domains_per_zone
    assert all(len(zones) == 1 for zones in by_clique.values())
    assert all(sum(n.clique == c for n in nodes) == topology.nodes_per_domain for c in by_clique)


def test_node_manifest_carries_gpus_topology_labels_and_pod_cidr() -> None:
    node = fake_gpu_nodes(
        Topology(zones=1, domains_per_zone=1, nodes_per_domain=1, gpus_per_node=4), PodNetwork(210)
    )[0]
    manifest = node.manifest()

    assert manifest["kind"] == "Node"
    assert manifest["spec"] == {"podCIDR": "10.210.0.0/24", "podCIDRs": ["10.210.0.0/24"]}
    assert "taints" not in manifest["spec"]
    labels = manifest["metadata"]["labels"]
    assert labels[ZONE_LABEL] == "zone-a"
    assert labels[CLIQUE_LABEL] == "zone-a.nvl0"
    assert labels["kubernetes.io/hostname"] == node.name
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert labels["nvidia.com/gpu.count"] == "4"
    assert manifest["status"]["capacity"][GPU_RESOURCE] == "4"
    assert manifest["status"]["allocatable"][GPU_RESOURCE] == "4"
    assert {"type": "InternalIP", "address": "10.210.255.1"} in manifest["status"]["addresses"]


def test_extra_node_takes_its_index_slot_and_extra_labels() -> None:
    node = extra_gpu_node(
        "gpu-spare",
        index=9,
        network=PodNetwork(220),
        zone="zone-c",
        clique="zone-c.nvl9",
        labels={"pool": "spare"},
    )
    assert node.pod_cidr == "10.220.9.0/24"
    assert node.labels()["pool"] == "spare"
    assert node.labels()[CLIQUE_LABEL] == "zone-c.nvl9"


@pytest.mark.parametrize(
    "name", ["GPU-1", "-gpu", "gpu_1", "a" * 64], ids=["upper", "leading dash", "underscore", "long"]
)
def test_extra_node_refuses_names_that_are_not_dns_labels(name: str) -> None:
    with pytest.raises(ValueError, match="DNS label"):
        extra_gpu_node(name, index=0, network=PodNetwork(220), zone="z", clique="c")


FREE_INDEX_CASES = {
    "empty cluster": ([], 0),
    "first taken": ([0], 1),
    "hole is reused": ([0, 1, 3], 2),
    "unordered": ([2, 0, 1], 3),
}


@pytest.mark.parametrize(("used", "expected"), FREE_INDEX_CASES.values(), ids=FREE_INDEX_CASES.keys())
def test_first_free_node_index(used: list[int], expected: int) -> None:
    assert first_free_node_index(used) == expected


def test_first_free_node_index_fails_when_the_range_is_full() -> None:
    with pytest.raises(ValueError, match="taken"):
        first_free_node_index(range(MAX_NODES))


@pytest.mark.parametrize(
    ("cidr", "expected"),
    [
        ("10.230.4.0/24", 4),
        ("10.231.4.0/24", None),
        ("10.230.4.0/25", None),
        ("10.230.255.0/24", None),
        ("junk", None),
    ],
    ids=["own", "other cluster", "wrong size", "address block", "not a cidr"],
)
def test_node_index_of_recognises_only_node_slots_of_this_network(cidr: str, expected: int | None) -> None:
    assert PodNetwork(230).node_index_of(cidr) == expected


def test_link_network_is_a_slash_30_outside_the_pod_range() -> None:
    network = PodNetwork(240)
    link = ipaddress.IPv4Network(network.host_link_address, strict=False)
    assert link.prefixlen == 30
    assert ipaddress.IPv4Address(network.gateway) in link
    assert not link.overlaps(ipaddress.IPv4Network(network.pod_range))


@given(octet=st.integers(1, 254))
def test_the_extension_server_address_is_a_pod_address_no_node_or_pod_can_take(octet: int) -> None:
    network = PodNetwork(octet)
    address = ipaddress.ip_address(network.extension_server_address)
    pod_range = ipaddress.ip_network(network.pod_range)
    assert address in pod_range and address not in (pod_range.network_address, pod_range.broadcast_address)
    assert not address.is_loopback and not address.is_link_local  # the API server refuses such endpoints
    assert str(address) not in {network.node_address(index) for index in range(MAX_NODES)}
    assert address not in ipaddress.ip_network(network.fallback_pod_cidr)
    node_pod_blocks = [ipaddress.ip_network(network.node_pod_cidr(index)) for index in range(MAX_NODES)]
    assert not any(address in block for block in node_pod_blocks)
