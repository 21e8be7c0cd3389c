"""Gang placement: choose one topology domain where a whole replica group fits, before creating any pod.

A TP×PP group is useful only whole (design note §30): a partial group holds GPUs and serves nothing.
So the operator decides where a group goes from the node inventory, then creates every pod gated
with affinity to that domain and lets the scheduler bind them together.

Free GPUs of a node = allocatable − requests of the live pods bound to it. Pods not bound yet but
already assigned to a domain (our gated groups) are packed into that domain's nodes first, so two
groups decided a moment apart do not both count the same free GPUs.

Nodes without the topology label: in `Preferred` mode each is a domain of its own (ordinary HGX
nodes carry no `nvidia.com/gpu.clique`, and a one-node group must still be placeable there); in
`Required` mode they are never used, and a group that cannot be placed says which nodes lack the
label, so the condition points at the fix.

Among the domains that fit, the choice prefers the spread domain (e.g. zone) holding the fewest
groups of this ModelGroup, then best fit (the least spare GPUs left, to keep big holes for big
groups), then the name, so the same inventory always gives the same answer.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime

from goodput.api.modelgroup import NodeAffinityTerm, NodeSelectorRequirement, Toleration
from goodput.api.reasons import NoFitReason
from goodput.controllers import naming
from goodput.controllers.groups.pods import PlacementMode

# How many domains (or nodes) a "no fit" message lists before summarising the rest.
_DOMAINS_IN_MESSAGE = 6


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True, slots=True)
class NodeInventory:
    """A node as placement sees it. labels are (key, value) pairs."""

    name: str
    labels: tuple[tuple[str, str], ...]
    allocatable_gpus: int
    """Allocatable nvidia.com/gpu."""
    schedulable: bool = True
    taints: tuple[Taint, ...] = ()
    other_devices: tuple[tuple[str, int], ...] = ()
    """Allocatable of the node's other domain-qualified resources (amd.com/gpu, MIG profiles)."""

    def label(self, key: str) -> str | None:
        return next((value for name, value in self.labels if name == key), None)

    def allocatable(self, resource: str) -> int:
        """Allocatable devices of `resource` (the ModelGroup's `engine.gpuResourceName`)."""
        if resource == naming.GPU_RESOURCE:
            return self.allocatable_gpus
        return next((count for name, count in self.other_devices if name == resource), 0)


@dataclass(frozen=True, slots=True)
class GpuClaim:
    """GPUs requested by a live pod: bound to node_name, or only assigned to a domain (gated pods)."""

    gpus: int
    node_name: str | None = None
    topology_key: str | None = None
    domain: str | None = None
    resource: str = naming.GPU_RESOURCE


@dataclass(frozen=True, slots=True)
class Inventory:
    nodes: tuple[NodeInventory, ...]
    claims: tuple[GpuClaim, ...] = ()
    note: str = ""
    """What the counts could not see (a DeviceClass that does not exist or cannot be read): said
    with every "no fit", so the condition points at it rather than at a busy cluster."""

    def with_group(self, topology_key: str, domain: str, shape: GroupShape) -> Inventory:
        """The inventory after a group was assigned to `domain` (its pods not bound yet)."""
        added = tuple(
            GpuClaim(shape.gpus_per_pod, None, topology_key, domain, shape.resource)
            for _ in range(shape.pods)
        )
        return replace(self, claims=self.claims + added)


@dataclass(frozen=True, slots=True)
class GroupShape:
    pods: int
    gpus_per_pod: int
    resource: str = naming.GPU_RESOURCE

    @property
    def gpus(self) -> int:
        return self.pods * self.gpus_per_pod


@dataclass(frozen=True, slots=True)
class PlacementRules:
    topology_key: str
    mode: PlacementMode = "Required"
    spread_key: str | None = None
    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    gpu_resource: str = naming.GPU_RESOURCE
    """The device resource the group's pods request; nodes and claims are counted in it."""
    required_node_terms: tuple[NodeAffinityTerm, ...] = ()
    """The spec's required node affinity: a node must meet one term (empty: no constraint)."""
    provision_nodes: bool = False
    """`placement.nodeProvisioning.mode: Pods`: a group no domain fits asks for new nodes."""


@dataclass(frozen=True, slots=True)
class DomainCapacity:
    """Free GPUs of one topology domain, after the claims already made on it."""

    domain: str
    spread_value: str
    free_gpus_by_node: tuple[int, ...]

    @property
    def free_gpus(self) -> int:
        return sum(self.free_gpus_by_node)

    def pod_slots(self, gpus_per_pod: int) -> int:
        return sum(free // gpus_per_pod for free in self.free_gpus_by_node)


@dataclass(frozen=True, slots=True)
class Placed:
    domain: str
    spread_value: str
    spare_gpus: int


@dataclass(frozen=True, slots=True)
class NoFit:
    reason: NoFitReason
    message: str


@dataclass(frozen=True, slots=True)
class ProvisionNodes:
    """No existing domain fits, so the group is created for nodes a node autoscaler will add: its
    pods pending and visible, held in one domain by their own affinity. `why` is the no-fit that
    made it so, for the group's creation message."""

    why: NoFit


# What new nodes can cure: GPUs that are not there, nodes that do not match, labels they lack.
# A backed-off domain is not among them: its nodes exist and will be tried again.
_CURABLE_BY_NEW_NODES = frozenset(
    {NoFitReason.INSUFFICIENT_GPUS, NoFitReason.NO_ELIGIBLE_NODES, NoFitReason.TOPOLOGY_LABEL_MISSING}
)


def tolerates(tolerations: Iterable[Toleration], taint: Taint) -> bool:
    """Kubernetes toleration matching for one taint."""
    for toleration in tolerations:
        if toleration.effect and toleration.effect != taint.effect:
            continue
        if toleration.key is None:
            if toleration.operator == "Exists":
                return True
            continue
        if toleration.key != taint.key:
            continue
        if toleration.operator == "Exists" or (toleration.value or "") == taint.value:
            return True
    return False


def meets(node: NodeInventory, requirement: NodeSelectorRequirement) -> bool:
    """Kubernetes node selector requirement matching for one node label."""
    value = node.label(requirement.key)
    match requirement.operator:
        case "In":
            return value in requirement.values
        case "NotIn":
            return value not in requirement.values
        case "Exists":
            return value is not None
        case "DoesNotExist":
            return value is None
    try:
        number, bound = int(value or ""), int(requirement.values[0])
    except (ValueError, IndexError):
        return False
    return number > bound if requirement.operator == "Gt" else number < bound


def eligible(node: NodeInventory, rules: PlacementRules) -> bool:
    """Whether a group's pod could ever be scheduled onto this node, GPUs aside."""
    if not node.schedulable:
        return False
    if any(node.label(key) != value for key, value in rules.node_selector):
        return False
    if rules.required_node_terms and not any(
        all(meets(node, requirement) for requirement in term.match_expressions)
        for term in rules.required_node_terms
    ):
        return False
    return all(
        tolerates(rules.tolerations, taint)
        for taint in node.taints
        if taint.effect in ("NoSchedule", "NoExecute")
    )


def domain_of(node: NodeInventory, rules: PlacementRules) -> str | None:
    """The topology domain of a node: its label value; without the label, the node itself in
    Preferred mode and no domain at all in Required mode."""
    value = node.label(rules.topology_key)
    if value is None and rules.mode == "Preferred":
        return naming.node_domain(node.name)
    return value


def domain_capacities(inventory: Inventory, rules: PlacementRules) -> tuple[DomainCapacity, ...]:
    """Free GPUs per topology domain among the nodes eligible under `rules`, sorted by domain name."""
    used_by_node: Counter[str] = Counter()
    pending_by_domain: defaultdict[str, list[int]] = defaultdict(list)
    for claim in inventory.claims:
        if claim.resource != rules.gpu_resource:
            continue
        if claim.node_name is not None:
            used_by_node[claim.node_name] += claim.gpus
        elif claim.topology_key == rules.topology_key and claim.domain is not None:
            pending_by_domain[claim.domain].append(claim.gpus)

    nodes_by_domain: defaultdict[str, list[NodeInventory]] = defaultdict(list)
    for node in inventory.nodes:
        domain = domain_of(node, rules)
        if domain is not None and eligible(node, rules):
            nodes_by_domain[domain].append(node)

    capacities = []
    for domain, nodes in sorted(nodes_by_domain.items()):
        free = [max(0, node.allocatable(rules.gpu_resource) - used_by_node[node.name]) for node in nodes]
        free = _pack_pending(free, pending_by_domain.get(domain, []))
        spread = sorted({node.label(rules.spread_key) or "" for node in nodes}) if rules.spread_key else [""]
        capacities.append(DomainCapacity(domain, spread[0], tuple(free)))
    return tuple(capacities)


def place_group(
    inventory: Inventory,
    shape: GroupShape,
    rules: PlacementRules,
    *,
    groups_by_spread_value: Mapping[str, int] | None = None,
    backed_off: frozenset[str] = frozenset(),
) -> Placed | NoFit:
    """The domain for one whole group, or why there is none.

    groups_by_spread_value: groups of this ModelGroup already in each spread domain.
    backed_off: domains where a recent group of this ModelGroup failed to schedule.
    """
    decision = _place(inventory, shape, rules, groups_by_spread_value, backed_off)
    if isinstance(decision, NoFit) and inventory.note:
        return replace(decision, message=f"{decision.message}; {inventory.note}")
    return decision


def _place(
    inventory: Inventory,
    shape: GroupShape,
    rules: PlacementRules,
    groups_by_spread_value: Mapping[str, int] | None,
    backed_off: frozenset[str],
) -> Placed | NoFit:
    spread_counts = groups_by_spread_value or {}
    capacities = domain_capacities(inventory, rules)
    unlabelled = unlabelled_nodes(inventory.nodes, rules)
    if unlabelled and not any(
        node.allocatable(rules.gpu_resource) > 0
        and eligible(node, rules)
        and node.label(rules.topology_key) is not None
        for node in inventory.nodes
    ):
        # Every GPU node placement could use lacks the label: that, not a busy cluster, is the limit.
        return NoFit(NoFitReason.TOPOLOGY_LABEL_MISSING, missing_label_message(unlabelled, rules))
    if not capacities:
        return NoFit(
            NoFitReason.NO_ELIGIBLE_NODES,
            f"no schedulable node matches the placement (label {rules.topology_key}, "
            "node selector and tolerations)",
        )
    fitting = [c for c in capacities if c.pod_slots(shape.gpus_per_pod) >= shape.pods]
    candidates = [c for c in fitting if c.domain not in backed_off]
    if candidates:
        best = min(
            candidates,
            key=lambda c: (spread_counts.get(c.spread_value, 0), c.free_gpus - shape.gpus, c.domain),
        )
        return Placed(best.domain, best.spread_value, best.free_gpus - shape.gpus)
    if rules.mode == "Preferred":
        # The domain is only a preference: any domain will do if the eligible nodes together fit.
        total_slots = sum(c.pod_slots(shape.gpus_per_pod) for c in capacities)
        open_domains = [c for c in capacities if c.domain not in backed_off]
        if total_slots >= shape.pods and open_domains:
            best = min(open_domains, key=lambda c: (-c.free_gpus, c.domain))
            return Placed(best.domain, best.spread_value, max(0, best.free_gpus - shape.gpus))
    if fitting:
        return NoFit(
            NoFitReason.DOMAINS_BACKED_OFF,
            f"the group fits only in {', '.join(c.domain for c in fitting)}, where a group "
            "recently failed to schedule; retrying after the back-off",
        )
    message = insufficient_gpus_message(capacities, shape, rules.topology_key)
    if unlabelled:
        message += "; " + missing_label_message(unlabelled, rules)
    return NoFit(NoFitReason.INSUFFICIENT_GPUS, message)


def provision_or_limit(
    no_fit: NoFit, rules: PlacementRules, provisioning_backed_off_until: datetime | None
) -> ProvisionNodes | NoFit:
    """What to do when no existing domain fits: ask for new nodes where the spec allows it and the
    last request did not time out lately; otherwise the no-fit stands (`ScalingLimited`)."""
    if not rules.provision_nodes or no_fit.reason not in _CURABLE_BY_NEW_NODES:
        return no_fit
    if provisioning_backed_off_until is not None:
        return NoFit(
            NoFitReason.NODE_PROVISIONING_TIMEOUT,
            f"{no_fit.message}; an earlier group got no new nodes within "
            "spec.placement.nodeProvisioning.provisioningTimeoutSeconds, so none are asked for until "
            f"{provisioning_backed_off_until.strftime('%Y-%m-%dT%H:%M:%SZ')}: check that a Karpenter "
            "NodePool or a cluster-autoscaler node group can create nodes with the group's GPUs and labels",
        )
    return ProvisionNodes(no_fit)


def unlabelled_nodes(nodes: Iterable[NodeInventory], rules: PlacementRules) -> tuple[str, ...]:
    """Names of the eligible GPU nodes that Required placement cannot use for lack of the label."""
    if rules.mode != "Required":
        return ()
    return tuple(
        sorted(
            node.name
            for node in nodes
            if node.allocatable(rules.gpu_resource) > 0
            and eligible(node, rules)
            and node.label(rules.topology_key) is None
        )
    )


def missing_label_message(node_names: tuple[str, ...], rules: PlacementRules) -> str:
    listed = ", ".join(node_names[:_DOMAINS_IN_MESSAGE])
    if len(node_names) > _DOMAINS_IN_MESSAGE:
        listed += f" and {len(node_names) - _DOMAINS_IN_MESSAGE} more"
    return (
        f"{len(node_names)} eligible GPU node(s) lack the topology label {rules.topology_key} and are "
        f"never used in Required mode: {listed}; label them, set spec.placement.topologyKey to a label "
        "they carry, or set spec.placement.mode to Preferred"
    )


def insufficient_gpus_message(
    capacities: Iterable[DomainCapacity], shape: GroupShape, topology_key: str
) -> str:
    ranked = sorted(capacities, key=lambda c: (-c.free_gpus, c.domain))
    listed = ", ".join(f"{c.domain}={c.free_gpus}" for c in ranked[:_DOMAINS_IN_MESSAGE])
    if len(ranked) > _DOMAINS_IN_MESSAGE:
        listed += f" and {len(ranked) - _DOMAINS_IN_MESSAGE} more"
    device_class = naming.device_class_of_resource(shape.resource)
    counted = f" of DeviceClass {device_class!r}" if device_class is not None else ""
    return (
        f"insufficient GPUs: a group needs {shape.gpus} GPUs{counted} ({shape.pods} pods × "
        f"{shape.gpus_per_pod}) in one {topology_key} domain; free GPUs per domain: {listed}"
    )


def fits_empty_cluster(nodes: Iterable[NodeInventory], shape: GroupShape, rules: PlacementRules) -> bool:
    """Whether any domain could hold the group if nothing else ran: False means the spec can never place."""
    empty = Inventory(tuple(nodes))
    capacities = domain_capacities(empty, rules)
    if rules.mode == "Preferred":
        return sum(c.pod_slots(shape.gpus_per_pod) for c in capacities) >= shape.pods
    return any(c.pod_slots(shape.gpus_per_pod) >= shape.pods for c in capacities)


def _pack_pending(free: list[int], pending: list[int]) -> list[int]:
    """Place pending claims best-fit-decreasing onto the nodes' free GPUs.

    A claim that fits nowhere means the domain is already over-committed: it is counted as full,
    the safe answer for a decision that must not stack a second group on the same GPUs.
    """
    free = list(free)
    for gpus in sorted(pending, reverse=True):
        fitting = [i for i, node_free in enumerate(free) if node_free >= gpus]
        if not fitting:
            return [0] * len(free)
        target = min(fitting, key=lambda i: (free[i], i))
        free[target] -= gpus
    return free
