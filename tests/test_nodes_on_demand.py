"""Nodes on demand: a group no existing domain fits asks a node autoscaler for nodes, and is released
whole when they do not come in time. Every case is a frozen world at an injected `now`."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_api_models import minimal_model_group_spec
from test_groups import CLIQUE, NOW, PLACEMENT, RULES, TEMPLATE, group, pod, world

from goodput.api.modelgroup import ModelGroupSpec, ModelGroupStatus
from goodput.api.reasons import EventReason, NoFitReason, Reason
from goodput.controllers import naming
from goodput.controllers.groups.controller import plan_model_group
from goodput.controllers.groups.lifecycle import GroupEvent, next_phase
from goodput.controllers.groups.model import DomainBackoff, Plan, World
from goodput.controllers.groups.placement import NoFit, ProvisionNodes, provision_or_limit
from goodput.controllers.groups.status import model_group_status
from goodput.controllers.groups.template import placement_rules, readiness_rules

NEW = naming.NEW_NODES_DOMAIN
PROVISIONING = replace(PLACEMENT, provision_nodes=True)
TIMEOUT_RULES = replace(RULES, schedule_timeout_seconds=300, provisioning_timeout_seconds=900)
# Four ready groups fill the four cliques of the test cluster: a fifth fits nowhere.
FULL = [group(f"g{i}", "ready", domain=domain) for i, domain in enumerate("abcd")]


def on_new_nodes(name: str, stage: str, **changes: Any) -> list[Any]:
    """A group created for new nodes, at a stage; bound ranks sit on a node Karpenter added."""
    pods = [pod(name, rank, stage, domain=NEW, **changes) for rank in range(2)]
    if stage in ("released", "gated"):
        return pods
    return [replace(p, node_name=f"karpenter-{p.rank}") for p in pods]


def full_world(*extra: list[Any], desired: int, **changes: Any) -> World:
    base = world(*FULL, *extra, desired=desired, group_counter=4 + len(extra), rules=TIMEOUT_RULES)
    ready_nodes = base.ready_nodes | {"karpenter-0", "karpenter-1"}
    return replace(base, ready_nodes=ready_nodes, **{"placement": PROVISIONING, **changes})


@dataclass(frozen=True)
class Case:
    name: str
    world: World
    moves: list[tuple[str, str]]  # (group, event) in the order decided
    created_for_new_nodes: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    limit: str | None = None
    events: list[str] = field(default_factory=list)
    group_reason: tuple[str, str] | None = None


CASES = [
    Case(
        "off: a group no domain fits is not created, and ScalingLimited says why",
        full_world(desired=5, placement=PLACEMENT),
        moves=[],
        limit=NoFitReason.INSUFFICIENT_GPUS,
    ),
    Case(
        "pods: a group no domain fits is created for new nodes",
        full_world(desired=5),
        moves=[("g4", "Created")],
        created_for_new_nodes=["g4"],
    ),
    Case(
        "pods: a group that fits an existing domain goes there, not to new nodes",
        world(*FULL[:3], desired=4, group_counter=3, placement=PROVISIONING),
        moves=[("g3", "Created")],
    ),
    Case(
        "pods: a group waiting within the bound stays Placing for nodes",
        full_world(on_new_nodes("g4", "released", created=NOW - timedelta(seconds=600)), desired=5),
        moves=[],
        group_reason=("g4", Reason.NODES_PROVISIONING),
    ),
    Case(
        "the schedule timeout does not cut a wait for new nodes short",
        full_world(on_new_nodes("g4", "released", created=NOW - timedelta(seconds=301)), desired=5),
        moves=[],
        group_reason=("g4", Reason.NODES_PROVISIONING),
    ),
    Case(
        "past the bound the whole group is deleted, and no nodes are asked for again",
        full_world(on_new_nodes("g4", "released", created=NOW - timedelta(seconds=901)), desired=5),
        moves=[("g4", "Replaced")],
        deleted=["g4"],
        limit=NoFitReason.NODE_PROVISIONING_TIMEOUT,
        events=[EventReason.NODE_PROVISIONING_TIMEOUT],
        group_reason=("g4", Reason.NODE_PROVISIONING_TIMEOUT),
    ),
    Case(
        "a group half bound at the bound is deleted whole: no node keeps a partial group",
        full_world(
            [
                replace(
                    pod("g4", 0, "bound", domain=NEW, created=NOW - timedelta(seconds=901)),
                    node_name="karpenter-0",
                ),
                pod("g4", 1, "released", domain=NEW, created=NOW - timedelta(seconds=901)),
            ],
            desired=5,
        ),
        moves=[("g4", "Replaced")],
        deleted=["g4"],
        limit=NoFitReason.NODE_PROVISIONING_TIMEOUT,
        events=[EventReason.NODE_PROVISIONING_TIMEOUT],
        group_reason=("g4", Reason.NODE_PROVISIONING_TIMEOUT),
    ),
    Case(
        "during the back-off no nodes are asked for",
        full_world(desired=5, backoffs=(DomainBackoff(NEW, NOW + timedelta(seconds=60), "x"),)),
        moves=[],
        limit=NoFitReason.NODE_PROVISIONING_TIMEOUT,
    ),
    Case(
        "after the back-off nodes are asked for again",
        full_world(desired=5, backoffs=(DomainBackoff(NEW, NOW - timedelta(seconds=1), "x"),)),
        moves=[("g4", "Created")],
        created_for_new_nodes=["g4"],
    ),
    Case(
        "once every pod is bound to new nodes the group proceeds as usual",
        full_world(on_new_nodes("g4", "bound", created=NOW - timedelta(seconds=901)), desired=5),
        moves=[],
        group_reason=("g4", Reason.GROUPS_PROVISIONING),
    ),
    Case(
        "scale-in deletes a group still waiting for nodes, whole",
        full_world(on_new_nodes("g4", "released"), desired=4),
        moves=[("g4", "ScaledIn")],
        deleted=["g4"],
    ),
    Case(
        "a backed-off domain is not a reason to ask for nodes",
        world(
            *FULL[:3],
            desired=4,
            group_counter=3,
            placement=PROVISIONING,
            backoffs=(DomainBackoff("d", NOW + timedelta(seconds=60), NoFitReason.INSUFFICIENT_GPUS),),
        ),
        moves=[],
        limit=NoFitReason.DOMAINS_BACKED_OFF,
    ),
]


def _moves(plan: Plan) -> list[tuple[str, str]]:
    return [(t.group, str(t.event)) for t in plan.transitions]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_nodes_on_demand(case: Case) -> None:
    plan = plan_model_group(case.world)
    assert _moves(plan) == case.moves
    assert [c.group for c in plan.creations if c.domain == NEW] == case.created_for_new_nodes
    assert [d.group for d in plan.deletions] == case.deleted
    assert (plan.placement_limit.reason if plan.placement_limit else None) == case.limit
    assert [e.reason for e in plan.events if e.type == "Warning"] == case.events
    if case.group_reason is not None:
        name, reason = case.group_reason
        assert {g.name: g.reason for g in plan.groups}[name] == reason


def test_a_deleted_group_takes_every_rank_and_the_back_off_is_recorded() -> None:
    plan = plan_model_group(
        full_world(on_new_nodes("g4", "released", created=NOW - timedelta(seconds=901)), desired=5)
    )
    (deletion,) = plan.deletions
    assert deletion.pods == tuple(naming.pod_name(TEMPLATE.model_group, "g4", rank) for rank in range(2))
    (backoff,) = [b for b in plan.backoffs if b.domain == NEW]
    assert backoff.until == NOW + timedelta(seconds=TIMEOUT_RULES.backoff_seconds)
    event = next(e for e in plan.events if e.reason == EventReason.NODE_PROVISIONING_TIMEOUT)
    # The Event says what is wrong and what to set.
    assert "0/2 pod(s) bound" in event.message
    assert "spec.placement.nodeProvisioning.provisioningTimeoutSeconds" in event.message
    assert "NodePool" in event.message
    assert "provisioningTimeoutSeconds" in (plan.placement_limit.message if plan.placement_limit else "")


def _pod_spec(plan: Plan, group_name: str) -> dict[str, Any]:
    creation = next(c for c in plan.creations if c.group == group_name)
    spec: dict[str, Any] = creation.pods[0]["spec"]
    return spec


def test_pods_for_new_nodes_hold_the_whole_group_in_one_domain() -> None:
    """Required mode: a required pod affinity to the group's own pods on the topology key, nodes that
    carry the key, the GPU request a node autoscaler sizes the node by, no domain pinned."""
    spec = _pod_spec(plan_model_group(full_world(desired=5)), "g4")
    (term,) = spec["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == CLIQUE
    assert term["labelSelector"]["matchLabels"] == {
        naming.LABEL_MODEL_GROUP: TEMPLATE.model_group,
        naming.LABEL_GROUP: "g4",
    }
    node_terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert node_terms["nodeSelectorTerms"] == [{"matchExpressions": [{"key": CLIQUE, "operator": "Exists"}]}]
    engine = spec["containers"][0]
    assert engine["resources"]["limits"][naming.GPU_RESOURCE] == str(TEMPLATE.gpus_per_pod)
    assert "karpenter.sh/do-not-disrupt" not in str(spec)


def test_preferred_mode_prefers_one_domain_for_new_nodes() -> None:
    preferred = replace(TEMPLATE, placement_mode="Preferred")
    spec = _pod_spec(plan_model_group(full_world(desired=5, template=preferred)), "g4")
    (term,) = spec["affinity"]["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["weight"] == 100 and term["podAffinityTerm"]["topologyKey"] == CLIQUE
    assert "nodeAffinity" not in spec["affinity"]


def test_a_group_for_new_nodes_is_still_created_gated_and_released_whole() -> None:
    """Gang creation is kept: every pod exists before any can bind, so no partial group is scheduled."""
    plan = plan_model_group(full_world(desired=5))
    (creation,) = plan.creations
    assert all(p["spec"]["schedulingGates"] == [{"name": naming.SCHEDULING_GATE}] for p in creation.pods)
    assert all(p["metadata"]["annotations"][naming.ANNOTATION_TOPOLOGY_DOMAIN] == NEW for p in creation.pods)


def test_the_timeout_transition_is_in_the_lifecycle() -> None:
    assert next_phase("Placing", GroupEvent.NODES_NOT_PROVISIONED) == "Failed"


@pytest.mark.parametrize(
    ("reason", "asks"),
    [
        (NoFitReason.INSUFFICIENT_GPUS, True),
        (NoFitReason.NO_ELIGIBLE_NODES, True),
        (NoFitReason.TOPOLOGY_LABEL_MISSING, True),
        (NoFitReason.DOMAINS_BACKED_OFF, False),
    ],
)
def test_only_what_new_nodes_cure_asks_for_them(reason: NoFitReason, asks: bool) -> None:
    decision = provision_or_limit(NoFit(reason, "m"), PROVISIONING, None)
    assert isinstance(decision, ProvisionNodes) is asks


def test_the_spec_block_reaches_the_rules() -> None:
    block = {"nodeProvisioning": {"mode": "Pods", "provisioningTimeoutSeconds": 120}}
    spec = ModelGroupSpec.model_validate(minimal_model_group_spec(placement=block))
    assert placement_rules(spec).provision_nodes
    assert readiness_rules(spec).provisioning_timeout_seconds == 120
    off = ModelGroupSpec.model_validate(minimal_model_group_spec())
    assert not placement_rules(off).provision_nodes


@pytest.mark.parametrize("bad", [{"mode": "Always"}, {"provisioningTimeoutSeconds": 5}])
def test_bad_node_provisioning_is_refused_naming_the_field(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="nodeProvisioning"):
        ModelGroupSpec.model_validate(minimal_model_group_spec(placement={"nodeProvisioning": bad}))


def test_pods_mode_with_a_device_class_is_refused_naming_both_fields() -> None:
    engine = {"image": "vllm/vllm-openai:v0.33.0", "gpuDeviceClassName": "gpu.nvidia.com"}
    with pytest.raises(ValueError, match=r"nodeProvisioning.*gpuDeviceClassName"):
        ModelGroupSpec.model_validate(
            minimal_model_group_spec(engine=engine, placement={"nodeProvisioning": {"mode": "Pods"}})
        )
    ModelGroupSpec.model_validate(minimal_model_group_spec(engine=engine))


@settings(max_examples=80, deadline=None)
@given(
    waited_seconds=st.integers(min_value=0, max_value=1700),
    bound=st.sets(st.integers(min_value=0, max_value=1)),
)
def test_a_group_waiting_for_nodes_is_kept_or_deleted_whole(waited_seconds: int, bound: set[int]) -> None:
    """Invariant: a group for new nodes is never deleted in part; before the bound it is never deleted
    unless every rank is bound and another rule fails it."""
    created = NOW - timedelta(seconds=waited_seconds)
    pods = [
        replace(pod("g4", r, "bound", domain=NEW, created=created), node_name=f"karpenter-{r}")
        if r in bound
        else pod("g4", r, "released", domain=NEW, created=created)
        for r in range(2)
    ]
    plan = plan_model_group(full_world(pods, desired=5))
    deleted = [d for d in plan.deletions if d.group == "g4"]
    assert all(len(d.pods) == 2 for d in deleted)
    if waited_seconds <= TIMEOUT_RULES.provisioning_timeout_seconds or len(bound) == 2:
        assert not deleted
    else:
        assert deleted


def test_progressing_says_a_group_waits_for_new_nodes() -> None:
    plan = plan_model_group(
        full_world(on_new_nodes("g4", "released", created=NOW - timedelta(seconds=60)), desired=5)
    )
    status = model_group_status(
        ModelGroupStatus(), name="llama-70b", generation=1, desired_groups=5, plan=plan, now=NOW
    )
    progressing = next(c for c in status.conditions if c.type == "Progressing")
    assert progressing.reason == Reason.NODES_PROVISIONING
    assert "g4 waiting for new nodes" in progressing.message
