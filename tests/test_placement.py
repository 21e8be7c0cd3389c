"""Gang placement: one domain for the whole group, best fit, spread, back-off, and honest 'no fit'."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from goodput.api.modelgroup import NodeAffinityTerm, Toleration
from goodput.api.reasons import NoFitReason
from goodput.controllers.groups.placement import (
    GpuClaim,
    GroupShape,
    Inventory,
    NodeInventory,
    NoFit,
    Placed,
    PlacementRules,
    Taint,
    domain_capacities,
    fits_empty_cluster,
    place_group,
    tolerates,
)

CLIQUE = "nvidia.com/gpu.clique"
ZONE = "topology.kubernetes.io/zone"
RULES = PlacementRules(topology_key=CLIQUE, spread_key=ZONE)
GROUP_16 = GroupShape(pods=2, gpus_per_pod=8)
GROUP_8 = GroupShape(pods=1, gpus_per_pod=8)


def node(
    name: str,
    domain: str | None,
    zone: str = "z1",
    gpus: int = 8,
    *,
    schedulable: bool = True,
    taints: tuple[Taint, ...] = (),
    extra: tuple[tuple[str, str], ...] = (),
) -> NodeInventory:
    labels = [(ZONE, zone), *extra]
    if domain is not None:
        labels.append((CLIQUE, domain))
    return NodeInventory(name, tuple(sorted(labels)), gpus, schedulable, taints)


def cluster(*domains: tuple[str, str, int]) -> tuple[NodeInventory, ...]:
    """Nodes of 8 GPUs: (domain, zone, node count) per domain."""
    return tuple(node(f"{domain}-{i}", domain, zone) for domain, zone, count in domains for i in range(count))


@dataclass(frozen=True)
class PlaceCase:
    name: str
    nodes: tuple[NodeInventory, ...]
    shape: GroupShape
    claims: tuple[GpuClaim, ...] = ()
    rules: PlacementRules = RULES
    spread: dict[str, int] = field(default_factory=dict)
    backed_off: frozenset[str] = frozenset()
    # expected
    domain: str | None = None
    no_fit: NoFitReason | None = None


CASES = [
    PlaceCase("the only domain with room", cluster(("a", "z1", 1), ("b", "z1", 2)), GROUP_16, domain="b"),
    PlaceCase(
        "best fit leaves the fewest spare GPUs",
        cluster(("a", "z1", 4), ("b", "z1", 2), ("c", "z1", 3)),
        GROUP_16,
        domain="b",
    ),
    PlaceCase(
        "spread beats best fit: the zone with fewer of our groups wins",
        cluster(("a", "z1", 2), ("b", "z2", 4)),
        GROUP_16,
        spread={"z1": 1},
        domain="b",
    ),
    PlaceCase(
        "ties on spread and fit go to the first name",
        cluster(("b", "z1", 2), ("a", "z1", 2)),
        GROUP_16,
        domain="a",
    ),
    PlaceCase(
        "bound pods use their node's GPUs",
        cluster(("a", "z1", 2), ("b", "z1", 3)),
        GROUP_16,
        claims=(GpuClaim(8, node_name="a-0"),),
        domain="b",
    ),
    PlaceCase(
        "a gated group reserves GPUs in its domain before binding",
        cluster(("a", "z1", 2), ("b", "z1", 3)),
        GROUP_16,
        claims=(GpuClaim(8, None, CLIQUE, "a"), GpuClaim(8, None, CLIQUE, "a")),
        domain="b",
    ),
    PlaceCase(
        "reservations under another topology key do not count here",
        cluster(("a", "z1", 2)),
        GROUP_16,
        claims=(GpuClaim(8, None, "rack", "a"),),
        domain="a",
    ),
    PlaceCase(
        "every pod must fit on one node: two half-free nodes hold no 8-GPU pod",
        cluster(("a", "z1", 2), ("b", "z1", 3)),
        GROUP_16,
        claims=(GpuClaim(4, node_name="b-0"), GpuClaim(4, node_name="b-1"), GpuClaim(8, node_name="a-0")),
        no_fit=NoFitReason.INSUFFICIENT_GPUS,
    ),
    PlaceCase(
        "a backed-off domain is skipped",
        cluster(("a", "z1", 2), ("b", "z1", 3)),
        GROUP_16,
        backed_off=frozenset({"a"}),
        domain="b",
    ),
    PlaceCase(
        "fitting only where backed off is reported as such",
        cluster(("a", "z1", 2), ("b", "z1", 1)),
        GROUP_16,
        backed_off=frozenset({"a"}),
        no_fit=NoFitReason.DOMAINS_BACKED_OFF,
    ),
    PlaceCase(
        "Required: nodes without the topology label are no domain, and that is the reason given",
        (node("n0", None), node("n1", None)),
        GROUP_16,
        no_fit=NoFitReason.TOPOLOGY_LABEL_MISSING,
    ),
    PlaceCase(
        "Preferred: a node without the topology label is a domain of its own",
        (node("n0", None), node("n1", None)),
        GROUP_8,
        rules=PlacementRules(CLIQUE, mode="Preferred"),
        domain="node/n0",
    ),
    PlaceCase(
        "Preferred: best fit among unlabelled nodes",
        (node("n0", None, gpus=8), node("n1", None, gpus=4)),
        GroupShape(pods=1, gpus_per_pod=4),
        rules=PlacementRules(CLIQUE, mode="Preferred"),
        domain="node/n1",
    ),
    PlaceCase(
        "Preferred: a two-node group over unlabelled nodes spreads rather than waits",
        (node("n0", None), node("n1", None)),
        GROUP_16,
        rules=PlacementRules(CLIQUE, mode="Preferred"),
        domain="node/n0",
    ),
    PlaceCase(
        "Preferred: a labelled domain that holds the group whole beats single nodes",
        (node("n0", None), node("a-0", "a"), node("a-1", "a")),
        GROUP_16,
        rules=PlacementRules(CLIQUE, mode="Preferred"),
        domain="a",
    ),
    PlaceCase(
        "Preferred: a pending group on an unlabelled node holds its GPUs",
        (node("n0", None), node("n1", None)),
        GROUP_8,
        claims=(GpuClaim(8, None, CLIQUE, "node/n0"),),
        rules=PlacementRules(CLIQUE, mode="Preferred"),
        domain="node/n1",
    ),
    PlaceCase(
        "Required: labelled domains too small, unlabelled nodes unused: still short of GPUs",
        (node("a-0", "a"), node("n0", None)),
        GROUP_16,
        no_fit=NoFitReason.INSUFFICIENT_GPUS,
    ),
    PlaceCase(
        "the node selector narrows the nodes",
        cluster(("a", "z1", 2)),
        GROUP_8,
        rules=PlacementRules(CLIQUE, node_selector=(("gpu", "h200"),)),
        no_fit=NoFitReason.NO_ELIGIBLE_NODES,
    ),
    PlaceCase(
        "unready or cordoned nodes hold nothing",
        (node("a-0", "a", schedulable=False), node("a-1", "a"), node("b-0", "b"), node("b-1", "b")),
        GROUP_16,
        domain="b",
    ),
    PlaceCase(
        "a tainted node needs a toleration",
        (node("a-0", "a", taints=(Taint("gpu", "", "NoSchedule"),)), node("a-1", "a"), node("b-0", "b")),
        GROUP_16,
        no_fit=NoFitReason.INSUFFICIENT_GPUS,
    ),
    PlaceCase(
        "tolerated taints are fine",
        (node("a-0", "a", taints=(Taint("gpu", "", "NoSchedule"),)), node("a-1", "a")),
        GROUP_16,
        rules=PlacementRules(CLIQUE, tolerations=(Toleration(key="gpu", operator="Exists"),)),
        domain="a",
    ),
    PlaceCase(
        "PreferNoSchedule taints do not exclude a node",
        (node("a-0", "a", taints=(Taint("gpu", "", "PreferNoSchedule"),)), node("a-1", "a")),
        GROUP_16,
        domain="a",
    ),
    PlaceCase(
        "Preferred mode spreads a group over domains when none holds it whole",
        cluster(("a", "z1", 1), ("b", "z1", 1)),
        GROUP_16,
        rules=PlacementRules(CLIQUE, mode="Preferred"),
        domain="a",
    ),
    PlaceCase(
        "Preferred mode still needs the GPUs somewhere",
        cluster(("a", "z1", 1)),
        GROUP_16,
        rules=PlacementRules(CLIQUE, mode="Preferred"),
        no_fit=NoFitReason.INSUFFICIENT_GPUS,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_place_group(case: PlaceCase) -> None:
    decision = place_group(
        Inventory(case.nodes, case.claims),
        case.shape,
        case.rules,
        groups_by_spread_value=case.spread,
        backed_off=case.backed_off,
    )
    if case.domain is not None:
        assert isinstance(decision, Placed), decision
        assert decision.domain == case.domain
    else:
        assert isinstance(decision, NoFit), decision
        assert decision.reason == case.no_fit


def test_no_fit_names_needed_and_free_gpus_per_domain() -> None:
    nodes = cluster(("a", "z1", 2), ("b", "z1", 1))
    decision = place_group(Inventory(nodes, (GpuClaim(8, node_name="a-0"),)), GROUP_16, RULES)
    assert isinstance(decision, NoFit)
    assert decision.message == (
        "insufficient GPUs: a group needs 16 GPUs (2 pods × 8) in one nvidia.com/gpu.clique domain; "
        "free GPUs per domain: a=8, b=8"
    )


def _term(*requirements: tuple[str, str, list[str]]) -> NodeAffinityTerm:
    return NodeAffinityTerm.model_validate(
        {"matchExpressions": [{"key": k, "operator": op, "values": values} for k, op, values in requirements]}
    )


@pytest.mark.parametrize(
    ("terms", "expected_domain"),
    [
        ((_term(("pool", "In", ["b"])),), "b"),
        ((_term(("pool", "NotIn", ["a"])),), "b"),
        ((_term(("pool", "In", ["x"])), _term(("pool", "In", ["b"]))), "b"),
        ((_term(("spot", "DoesNotExist", [])),), "b"),
        ((_term(("pool", "Exists", []), ("memory", "Gt", ["80"])),), "b"),
        ((_term(("memory", "Lt", ["80"])),), "a"),
        ((_term(("pool", "In", ["c"])),), None),
    ],
    ids=["In", "NotIn", "any one term", "DoesNotExist", "every requirement of a term", "Lt", "none"],
)
def test_required_node_affinity_limits_the_eligible_nodes(
    terms: tuple[NodeAffinityTerm, ...], expected_domain: str | None
) -> None:
    nodes = (
        node("a-0", "a", extra=(("pool", "a"), ("spot", "true"), ("memory", "40"))),
        node("b-0", "b", extra=(("pool", "b"), ("memory", "141"))),
    )
    decision = place_group(Inventory(nodes), GROUP_8, PlacementRules(CLIQUE, required_node_terms=terms))
    if expected_domain is None:
        assert isinstance(decision, NoFit) and decision.reason == NoFitReason.NO_ELIGIBLE_NODES
    else:
        assert isinstance(decision, Placed) and decision.domain == expected_domain


def test_missing_label_names_the_label_and_the_nodes() -> None:
    nodes = (node("gpu-b", None), node("gpu-a", None), node("cpu", None, gpus=0), node("a-0", "a", gpus=0))
    decision = place_group(Inventory(nodes), GROUP_8, RULES)
    assert isinstance(decision, NoFit)
    assert decision.reason == NoFitReason.TOPOLOGY_LABEL_MISSING
    assert decision.message.startswith(
        "2 eligible GPU node(s) lack the topology label nvidia.com/gpu.clique and are never used in "
        "Required mode: gpu-a, gpu-b;"
    )
    assert "spec.placement.mode to Preferred" in decision.message


def test_short_of_gpus_in_required_mode_also_names_unlabelled_nodes() -> None:
    decision = place_group(Inventory((node("a-0", "a"), node("n0", None))), GROUP_16, RULES)
    assert isinstance(decision, NoFit)
    assert "free GPUs per domain: a=8; 1 eligible GPU node(s) lack the topology label" in decision.message
    assert decision.message.endswith(
        "Required mode: n0; label them, set spec.placement.topologyKey to a "
        "label they carry, or set spec.placement.mode to Preferred"
    )


def test_placing_groups_one_after_another_fills_domains_without_double_booking() -> None:
    inventory = Inventory(cluster(("a", "z1", 2), ("b", "z2", 2), ("c", "z1", 2)))
    placed = []
    for _ in range(4):
        decision = place_group(inventory, GROUP_16, RULES)
        if not isinstance(decision, Placed):
            break
        placed.append(decision.domain)
        inventory = inventory.with_group(CLIQUE, decision.domain, GROUP_16)
    assert sorted(placed) == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("tolerations", "taint", "expected"),
    [
        ((Toleration(key="gpu", operator="Exists"),), Taint("gpu", "x", "NoSchedule"), True),
        ((Toleration(key="gpu", value="x"),), Taint("gpu", "x", "NoSchedule"), True),
        ((Toleration(key="gpu", value="y"),), Taint("gpu", "x", "NoSchedule"), False),
        (
            (Toleration(key="gpu", operator="Exists", effect="NoExecute"),),
            Taint("gpu", "x", "NoSchedule"),
            False,
        ),
        ((Toleration(operator="Exists"),), Taint("anything", "x", "NoExecute"), True),
        ((), Taint("gpu", "", "NoSchedule"), False),
    ],
    ids=["exists", "equal value", "other value", "other effect", "tolerate everything", "no toleration"],
)
def test_tolerates(tolerations: tuple[Toleration, ...], taint: Taint, expected: bool) -> None:
    assert tolerates(tolerations, taint) is expected


def test_fits_empty_cluster_tells_impossible_shapes_from_busy_clusters() -> None:
    nodes = cluster(("a", "z1", 2))
    assert fits_empty_cluster(nodes, GROUP_16, RULES)
    assert not fits_empty_cluster(nodes, GroupShape(pods=1, gpus_per_pod=16), RULES)
    assert not fits_empty_cluster(nodes, GroupShape(pods=3, gpus_per_pod=8), RULES)


claims_strategy = st.lists(
    st.builds(
        GpuClaim,
        gpus=st.sampled_from([1, 2, 4, 8]),
        node_name=st.sampled_from([None, "a-0", "b-1", "c-0"]),
        topology_key=st.just(CLIQUE),
        domain=st.sampled_from(["a", "b", "c"]),
    ),
    max_size=8,
)


@settings(max_examples=200, deadline=None)
@given(
    node_counts=st.lists(st.integers(min_value=1, max_value=3), min_size=1, max_size=3),
    claims=claims_strategy,
    pods=st.integers(min_value=1, max_value=3),
    gpus_per_pod=st.sampled_from([1, 2, 4, 8]),
    backed_off=st.frozensets(st.sampled_from(["a", "b", "c"])),
)
def test_placed_groups_always_fit_their_domain(
    node_counts: list[int], claims: list[GpuClaim], pods: int, gpus_per_pod: int, backed_off: frozenset[str]
) -> None:
    """Whatever the inventory: a placed group fits, never in a backed-off domain, and the choice is stable."""
    nodes = cluster(*((domain, "z1", count) for domain, count in zip("abc", node_counts, strict=False)))
    inventory = Inventory(nodes, tuple(claims))
    shape = GroupShape(pods, gpus_per_pod)
    decision = place_group(inventory, shape, RULES, backed_off=backed_off)
    assert decision == place_group(inventory, shape, RULES, backed_off=backed_off)
    if isinstance(decision, Placed):
        assert decision.domain not in backed_off
        capacity = {c.domain: c for c in domain_capacities(inventory, RULES)}[decision.domain]
        assert capacity.pod_slots(gpus_per_pod) >= pods
        # Reserving it leaves the domain's other free GPUs exactly as they were, minus the group.
        after = {
            c.domain: c
            for c in domain_capacities(inventory.with_group(CLIQUE, decision.domain, shape), RULES)
        }
        assert after[decision.domain].free_gpus == capacity.free_gpus - shape.gpus


@settings(max_examples=100, deadline=None)
@given(
    node_counts=st.lists(st.integers(min_value=1, max_value=4), min_size=1, max_size=3),
    gpus_per_pod=st.sampled_from([2, 4, 8]),
    pods=st.integers(min_value=1, max_value=4),
)
def test_repeated_placement_never_overbooks(node_counts: list[int], gpus_per_pod: int, pods: int) -> None:
    nodes = cluster(*((domain, "z1", count) for domain, count in zip("abc", node_counts, strict=False)))
    shape = GroupShape(pods, gpus_per_pod)
    inventory = Inventory(nodes)
    groups_per_domain: dict[str, int] = {}
    for _ in range(20):
        decision = place_group(inventory, shape, RULES)
        if not isinstance(decision, Placed):
            break
        groups_per_domain[decision.domain] = groups_per_domain.get(decision.domain, 0) + 1
        inventory = inventory.with_group(CLIQUE, decision.domain, shape)
    for domain, count in groups_per_domain.items():
        domain_nodes = sum(1 for n in nodes if n.label(CLIQUE) == domain)
        assert count * pods <= domain_nodes * (8 // gpus_per_pod)


def test_groups_are_counted_in_their_own_device_resource() -> None:
    """A ModelGroup on AMD GPUs or MIG slices places by that resource's allocatable and claims, and
    nvidia.com/gpu claims on the same node take nothing from it."""
    amd = PlacementRules(CLIQUE, gpu_resource="amd.com/gpu")
    nodes = (
        NodeInventory("mi300-0", ((CLIQUE, "a"),), 0, other_devices=(("amd.com/gpu", 8),)),
        NodeInventory("mi300-1", ((CLIQUE, "b"),), 0, other_devices=(("amd.com/gpu", 8),)),
        NodeInventory("h100-0", ((CLIQUE, "c"),), 8),
    )
    claims = (
        GpuClaim(8, node_name="mi300-0", resource="amd.com/gpu"),
        GpuClaim(8, node_name="mi300-1"),  # an nvidia.com/gpu claim: not an AMD GPU
    )
    decision = place_group(Inventory(nodes, claims), GroupShape(1, 8, "amd.com/gpu"), amd)
    assert isinstance(decision, Placed) and decision.domain == "b"
    # The NVIDIA node holds no AMD GPUs, and a pending AMD group reserves its domain in AMD GPUs.
    after = Inventory(nodes, claims).with_group(CLIQUE, "b", GroupShape(1, 8, "amd.com/gpu"))
    full = place_group(after, GroupShape(1, 8, "amd.com/gpu"), amd)
    assert isinstance(full, NoFit) and full.reason == NoFitReason.INSUFFICIENT_GPUS
    assert isinstance(place_group(after, GROUP_8, RULES), Placed), "nvidia.com/gpu groups still fit on h100-0"
