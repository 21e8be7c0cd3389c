"""The group controller's plan: lifecycle, replacement, scale and placement, from a frozen world."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from goodput.api.modelgroup import RECENT_DRAINS, DrainRecord
from goodput.api.reasons import EventReason, NoFitReason, Reason
from goodput.controllers import naming
from goodput.controllers.groups.controller import plan_model_group
from goodput.controllers.groups.drain import DecidedDrain, DrainBaseline, DrainProgress, LeaderSample
from goodput.controllers.groups.model import (
    DomainBackoff,
    Plan,
    ReadinessRules,
    WarmupOutcome,
    World,
    encode_backoffs,
    parse_backoffs,
)
from goodput.controllers.groups.observation import ConditionView, PodView, parse_pod
from goodput.controllers.groups.placement import GpuClaim, Inventory, NodeInventory, PlacementRules
from goodput.controllers.groups.pods import GroupTemplate

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
CLIQUE = "nvidia.com/gpu.clique"
ZONE = "topology.kubernetes.io/zone"
TEMPLATE = GroupTemplate(
    model_group="llama-70b",
    namespace="serving",
    uid="uid-1",
    model="meta-llama/Llama-3.1-70B-Instruct",
    model_revision="main",
    served_name="llama",
    image="vllm/vllm-openai:v0.33.0",
    args=(),
    env=(),
    requests=(),
    limits=(),
    port=8000,
    startup_timeout_seconds=1800,
    shutdown_timeout_seconds=30,
    tensor_parallel=8,
    pipeline_parallel=2,
    gpus_per_pod=8,
    topology_key=CLIQUE,
    placement_mode="Required",
)
RULES = ReadinessRules(
    model_revision="main",
    schedule_timeout_seconds=300,
    startup_timeout_seconds=1800,
    warmup_retry_seconds=5,
    drain_max_seconds=600,
    min_lifetime_seconds=300,
    backoff_seconds=300,
    warmup_prompt="Hi",
    warmup_max_tokens=4,
    warmup_timeout_seconds=30,
)
PLACEMENT = PlacementRules(topology_key=CLIQUE, spread_key=ZONE)
# 2 zones x 2 NVLink cliques x 2 nodes x 8 GPUs: room for exactly 4 groups of 16 GPUs.
NODES = tuple(
    NodeInventory(f"{clique}-{i}", tuple(sorted([(CLIQUE, clique), (ZONE, zone)])), 8)
    for zone, cliques in (("z1", ("a", "b")), ("z2", ("c", "d")))
    for clique in cliques
    for i in range(2)
)
STAGES = ("gated", "released", "bound", "running", "healthy", "ready")


def condition(status: str, at: datetime, message: str = "") -> ConditionView:
    return ConditionView(status, "", message, at)


def pod(
    group: str,
    rank: int,
    stage: str,
    *,
    domain: str = "a",
    created: datetime | None = None,
    **changes: Any,
) -> PodView:
    """A rank at a lifecycle stage; each stage includes the previous ones."""
    level = STAGES.index(stage)
    created = created or NOW - timedelta(seconds=120)
    view = PodView(
        name=naming.pod_name(TEMPLATE.model_group, group, rank),
        model_group=TEMPLATE.model_group,
        group=group,
        rank=rank,
        revision=TEMPLATE.revision,
        created_at=created,
        deleting=False,
        phase="Pending",
        node_name=None,
        ip=None,
        gated=level == 0,
        topology_domain=domain,
        replaces=None,
        draining_since=None,
        gpus=8,
        restarts=0,
        containers_ready=None,
        scheduled=None,
        group_ready=None,
        nccl_healthy=None,
        reported_model_revision=None,
    )
    if level >= STAGES.index("bound"):
        view = replace(
            view,
            node_name=f"{domain}-{rank}",
            ip=f"10.244.0.{10 + rank}",
            scheduled=condition("True", created + timedelta(seconds=2)),
        )
    if level >= STAGES.index("running"):
        view = replace(
            view, phase="Running", containers_ready=condition("True", created + timedelta(seconds=60))
        )
    if level >= STAGES.index("healthy"):
        view = replace(
            view,
            nccl_healthy=condition("True", created + timedelta(seconds=70)),
            reported_model_revision="main",
        )
    if level >= STAGES.index("ready"):
        view = replace(view, group_ready=condition("True", created + timedelta(seconds=80)))
    return replace(view, **changes)


def group(name: str, stage: str, *, domain: str = "a", **changes: Any) -> list[PodView]:
    return [pod(name, rank, stage, domain=domain, **changes) for rank in range(2)]


def world(*groups: list[PodView], desired: int, **changes: Any) -> World:
    pods = tuple(p for g in groups for p in g)
    claims = tuple(GpuClaim(p.gpus, p.node_name, CLIQUE, p.topology_domain) for p in pods)
    base = World(
        now=NOW,
        template=TEMPLATE,
        rules=RULES,
        placement=PLACEMENT,
        desired_groups=desired,
        pods=pods,
        inventory=Inventory(NODES, claims),
        ready_nodes=frozenset(n.name for n in NODES),
        group_counter=0,
    )
    return replace(base, **changes)


def states(plan: Plan) -> dict[str, str]:
    return {g.name: g.state for g in plan.groups}


def event_reasons(plan: Plan) -> list[str]:
    """Every Event the operator posts for a plan: a drain's start and end travel with their actions."""
    starts = [start.event for start in plan.drain_starts if start.event is not None]
    ends = [ended.event for ended in plan.drains_ended if ended.event is not None]
    return [event.reason for event in (*starts, *plan.events, *ends)]


def started(plan: Plan) -> list[tuple[str, datetime]]:
    return [(start.group, start.since) for start in plan.drain_starts]


@dataclass(frozen=True)
class LifecycleCase:
    name: str
    world: World
    # expected
    states: dict[str, str]
    releases: list[str] = field(default_factory=list)
    warmups: list[str] = field(default_factory=list)
    ready: list[str] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    reason: str | None = None


LIFECYCLE = [
    LifecycleCase(
        "a fully created gated group is released at once",
        world(group("g0", "gated"), desired=1),
        states={"g0": "Placing"},
        releases=["g0"],
    ),
    LifecycleCase(
        "a released group waits for the scheduler",
        world(group("g0", "released"), desired=1),
        states={"g0": "Placing"},
    ),
    LifecycleCase(
        "bound ranks still starting are provisioning",
        world(group("g0", "bound"), desired=1),
        states={"g0": "Provisioning"},
        reason=Reason.GROUPS_PROVISIONING,
    ),
    LifecycleCase(
        "running ranks wait for NCCL health before the warm-up",
        world(group("g0", "running"), desired=1),
        states={"g0": "Warming"},
        reason=Reason.GROUPS_WARMING,
    ),
    LifecycleCase(
        "healthy ranks get a warm-up through the leader",
        world(group("g0", "healthy"), desired=1),
        states={"g0": "Warming"},
        warmups=["g0"],
    ),
    LifecycleCase(
        "a warm-up in flight is not sent twice",
        world(group("g0", "healthy"), desired=1, warmups_in_flight=frozenset({"g0"})),
        states={"g0": "Warming"},
    ),
    LifecycleCase(
        "a passed warm-up makes the group ready on every rank",
        world(group("g0", "healthy"), desired=1, warmups={"g0": WarmupOutcome(True, NOW)}),
        states={"g0": "Ready"},
        ready=["g0"],
    ),
    LifecycleCase(
        "a failed warm-up is retried only after the retry period",
        world(
            group("g0", "healthy"),
            desired=1,
            warmups={"g0": WarmupOutcome(False, NOW - timedelta(seconds=2), "connection refused")},
        ),
        states={"g0": "Warming"},
        reason=Reason.WARMUP_FAILED,
    ),
    LifecycleCase(
        "a failed warm-up is retried after the retry period",
        world(
            group("g0", "healthy"),
            desired=1,
            warmups={"g0": WarmupOutcome(False, NOW - timedelta(seconds=6), "connection refused")},
        ),
        states={"g0": "Warming"},
        warmups=["g0"],
        reason=Reason.WARMUP_FAILED,
    ),
    LifecycleCase(
        "a rank on another model revision blocks readiness",
        world(group("g0", "healthy", reported_model_revision="v2"), desired=1),
        states={"g0": "Warming"},
        reason=Reason.REVISION_MISMATCH,
    ),
    LifecycleCase(
        "ncclCheck Skip warms up without NCCL health",
        world(
            group("g0", "running", reported_model_revision="main"),
            desired=1,
            rules=replace(RULES, nccl_required=False),
        ),
        states={"g0": "Warming"},
        warmups=["g0"],
    ),
    LifecycleCase(
        "revisionCheck false warms up without a reported revision",
        world(
            group("g0", "healthy", reported_model_revision=None),
            desired=1,
            rules=replace(RULES, revision_check=False),
        ),
        states={"g0": "Warming"},
        warmups=["g0"],
    ),
    LifecycleCase(
        "a ready group stays ready and costs nothing",
        world(group("g0", "ready"), desired=1),
        states={"g0": "Ready"},
    ),
    LifecycleCase(
        "a rank restart fails the whole group and brings a complete replacement",
        world(
            group("g0", "ready"),
            [pod("g1", 0, "ready", domain="c"), pod("g1", 1, "ready", domain="c", restarts=1)],
            desired=2,
        ),
        states={"g0": "Ready", "g1": "Failed", "g2": "Placing"},
        created=["g2"],
        deleted=["g1"],
        reason=Reason.GROUP_FAILED,
    ),
    LifecycleCase(
        "lost NCCL health fails the group",
        world(group("g0", "ready", nccl_healthy=condition("False", NOW, "all-reduce timed out")), desired=1),
        states={"g0": "Failed", "g1": "Placing"},
        created=["g1"],
        deleted=["g0"],
        reason=Reason.NCCL_UNHEALTHY,
    ),
    LifecycleCase(
        "a critical GPU fault on one rank fails the whole group",
        world(
            [
                pod("g0", 0, "ready"),
                pod("g0", 1, "ready", gpu_healthy=condition("False", NOW, "GPU 3: critical XID 79")),
            ],
            desired=1,
        ),
        states={"g0": "Failed", "g1": "Placing"},
        created=["g1"],
        deleted=["g0"],
        reason=Reason.GPU_UNHEALTHY,
    ),
    LifecycleCase(
        "a GPU warning or missing GPU evidence does not fail the group",
        world(
            [
                pod("g0", 0, "ready", gpu_healthy=condition("True", NOW, "GPU 0: clocks throttled")),
                pod("g0", 1, "ready", gpu_healthy=condition("Unknown", NOW, "NVML unavailable")),
            ],
            desired=1,
        ),
        states={"g0": "Ready"},
    ),
    LifecycleCase(
        "a hung engine fails the group",
        world(
            [
                pod("g0", 0, "ready", engine_healthy=condition("False", NOW, "no token for 300s")),
                pod("g0", 1, "ready"),
            ],
            desired=1,
        ),
        states={"g0": "Failed", "g1": "Placing"},
        created=["g1"],
        deleted=["g0"],
        reason=Reason.ENGINE_UNHEALTHY,
    ),
    LifecycleCase(
        "a rank on a node that is not ready fails the group",
        world(group("g0", "ready"), desired=1, ready_nodes=frozenset({"a-0"})),
        states={"g0": "Failed", "g1": "Placing"},
        created=["g1"],
        deleted=["g0"],
    ),
    LifecycleCase(
        "a pod that ended fails the group",
        world(group("g0", "ready", phase="Failed"), desired=1),
        states={"g0": "Failed", "g1": "Placing"},
        created=["g1"],
        deleted=["g0"],
    ),
    LifecycleCase(
        "a group left incomplete by an interrupted creation is deleted whole",
        world([pod("g0", 0, "gated")], desired=1),
        states={"g0": "Failed", "g1": "Placing"},
        created=["g1"],
        deleted=["g0"],
    ),
    LifecycleCase(
        "a rank deleted from under a group fails it",
        world([pod("g0", 0, "ready"), pod("g0", 1, "ready", deleting=True)], desired=1),
        states={"g0": "Failed", "g1": "Placing"},
        created=["g1"],
        deleted=["g0"],
    ),
    LifecycleCase(
        "groups whose pods are all terminating are gone",
        world(group("g0", "ready", deleting=True), desired=0),
        states={},
    ),
    LifecycleCase(
        "start-up past its timeout fails the group",
        world(group("g0", "bound", created=NOW - timedelta(seconds=2000)), desired=1),
        states={"g0": "Failed", "g1": "Placing"},
        created=["g1"],
        deleted=["g0"],
    ),
]


@pytest.mark.parametrize("case", LIFECYCLE, ids=lambda case: case.name)
def test_group_lifecycle(case: LifecycleCase) -> None:
    plan = plan_model_group(case.world)
    assert states(plan) == case.states
    assert [r.group for r in plan.gate_releases] == case.releases
    assert [w.group for w in plan.warmups] == case.warmups
    assert [c.group for c in plan.ready] == case.ready
    assert [c.group for c in plan.creations] == case.created
    assert [d.group for d in plan.deletions] == case.deleted
    if case.reason is not None:
        first_not_ready = next(g for g in plan.groups if g.state not in ("Ready", "Placing"))
        assert first_not_ready.reason == case.reason


def test_a_failed_ready_group_leaves_the_ready_count_before_it_is_deleted() -> None:
    plan = plan_model_group(world(group("g0", "ready", restarts=2), desired=1))
    assert [(c.group, c.ready, c.pods) for c in plan.unready] == [
        ("g0", False, ("llama-70b-g0-0", "llama-70b-g0-1"))
    ]
    assert plan.deletions[0].pods == ("llama-70b-g0-0", "llama-70b-g0-1")
    assert plan.deletions[0].service == "llama-70b-g0"
    assert plan.creations[0].pods[0]["metadata"]["annotations"][naming.ANNOTATION_REPLACES] == "g0"
    assert event_reasons(plan) == [EventReason.GROUP_FAILED, EventReason.GROUP_CREATED]


def test_the_warm_up_goes_to_the_leader_with_the_spec_prompt() -> None:
    plan = plan_model_group(world(group("g0", "healthy"), desired=1))
    request = plan.warmups[0]
    assert request.url == "http://10.244.0.10:8000/v1/completions"
    assert request.body() == {"model": "llama", "prompt": "Hi", "max_tokens": 4, "temperature": 0}
    assert request.timeout_seconds == 30


def test_ready_time_is_split_by_phase() -> None:
    created = NOW - timedelta(seconds=100)
    plan = plan_model_group(
        world(group("g0", "healthy", created=created), desired=1, warmups={"g0": WarmupOutcome(True, NOW)})
    )
    (ready,) = plan.became_ready
    times = ready.ready_times()
    assert times is not None
    assert (
        times.placing_seconds,
        times.provisioning_seconds,
        times.warming_seconds,
        times.total_seconds,
    ) == (2.0, 58.0, 40.0, 100.0)
    assert event_reasons(plan) == [EventReason.GROUP_READY]


def test_scale_out_creates_complete_groups_spread_over_zones() -> None:
    plan = plan_model_group(world(desired=2))
    assert [(c.group, c.domain) for c in plan.creations] == [("g0", "a"), ("g1", "c")]
    assert all(len(c.pods) == 2 and c.service is not None for c in plan.creations)
    assert plan.annotations == {naming.ANNOTATION_GROUP_COUNTER: "2"}
    assert states(plan) == {"g0": "Placing", "g1": "Placing"}


def test_scale_out_beyond_capacity_creates_only_what_fits_and_says_why() -> None:
    plan = plan_model_group(world(desired=5))
    assert len(plan.creations) == 4
    assert plan.placement_limit is not None
    assert plan.placement_limit.reason == NoFitReason.INSUFFICIENT_GPUS
    assert "needs 16 GPUs" in plan.placement_limit.message


def test_other_workloads_gpus_are_respected() -> None:
    blocker = (GpuClaim(8, node_name="a-0"), GpuClaim(8, node_name="b-0"), GpuClaim(8, node_name="c-0"))
    plan = plan_model_group(world(desired=2, inventory=Inventory(NODES, blocker)))
    assert [c.domain for c in plan.creations] == ["d"]
    assert plan.placement_limit is not None


def test_terminating_groups_still_hold_their_gpus_for_placement() -> None:
    terminating = [
        group(g, "ready", domain=d, deleting=True) for g, d in (("g0", "a"), ("g1", "b"), ("g2", "c"))
    ]
    plan = plan_model_group(world(*terminating, desired=2, group_counter=3))
    assert [(c.group, c.domain) for c in plan.creations] == [("g3", "d")]


def test_ordinals_only_grow() -> None:
    plan = plan_model_group(world(group("g4", "ready"), desired=2, group_counter=2))
    assert [c.group for c in plan.creations] == ["g5"]
    assert plan.annotations[naming.ANNOTATION_GROUP_COUNTER] == "6"
    assert plan_model_group(world(group("g4", "ready"), desired=1, group_counter=9)).annotations == {}


def test_schedule_timeout_deletes_the_group_and_backs_off_its_domain() -> None:
    stuck = group(
        "g0",
        "released",
        domain="a",
        created=NOW - timedelta(seconds=301),
        scheduled=condition("False", NOW, "0/8 nodes are available: 8 Insufficient nvidia.com/gpu"),
    )
    plan = plan_model_group(world(stuck, desired=1))
    assert [d.group for d in plan.deletions] == ["g0"]
    assert "Insufficient nvidia.com/gpu" in plan.groups[0].message
    (backoff,) = parse_backoffs(plan.annotations[naming.ANNOTATION_PLACEMENT_BACKOFF])
    assert (backoff.domain, backoff.until, backoff.reason) == (
        "a",
        NOW + timedelta(seconds=300),
        "InsufficientGPUs",
    )
    assert plan.backoffs == (backoff,)
    assert plan.creations[0].domain != "a"
    assert EventReason.SCHEDULE_TIMEOUT in event_reasons(plan)


def test_a_missing_volume_claim_names_the_claim_and_the_field_while_placing_and_at_the_timeout() -> None:
    unschedulable = 'persistentvolumeclaim "llama-weights" not found'
    for age_seconds, event in ((30, None), (301, EventReason.SCHEDULE_TIMEOUT)):
        stuck = group(
            "g0",
            "released",
            created=NOW - timedelta(seconds=age_seconds),
            scheduled=condition("False", NOW, unschedulable),
        )
        plan = plan_model_group(world(stuck, desired=1))
        message = plan.groups[0].message
        assert f"{unschedulable} (check spec.pod.volumes)" in message
        if event is not None:
            (timeout,) = [e for e in plan.events if e.reason == event]
            assert unschedulable in timeout.message


def test_expired_backoffs_are_dropped_and_active_ones_avoided() -> None:
    backoffs = (
        DomainBackoff("a", NOW - timedelta(seconds=1), "old"),
        DomainBackoff("c", NOW + timedelta(seconds=60), "new"),
    )
    plan = plan_model_group(world(desired=2, backoffs=backoffs))
    assert [c.domain for c in plan.creations] == ["a", "d"]
    assert parse_backoffs(plan.annotations[naming.ANNOTATION_PLACEMENT_BACKOFF]) == backoffs[1:]


def test_scale_in_removes_groups_that_serve_nothing_first() -> None:
    plan = plan_model_group(
        world(
            group("g0", "ready"),
            group("g1", "healthy", domain="c"),
            group("g2", "gated", domain="b"),
            desired=1,
        )
    )
    assert [d.group for d in plan.deletions] == ["g2", "g1"]
    assert plan.gate_releases == () and plan.warmups == ()
    assert states(plan) == {"g0": "Ready"}


def idle(*names: str, at: datetime = NOW) -> dict[str, LeaderSample]:
    return {name: LeaderSample(at=at, running=0, waiting=0) for name in names}


def test_scale_in_of_ready_groups_drains_them_first() -> None:
    old = NOW - timedelta(hours=1)
    plan = plan_model_group(
        world(
            group("g0", "ready", created=old),
            group("g1", "ready", domain="c", created=old),
            desired=1,
            leader_readings=idle("g0", "g1"),
        )
    )
    assert started(plan) == [("g1", NOW)]
    assert plan.unready == () and plan.drain_marks == ()
    assert plan.deletions == ()
    assert states(plan) == {"g0": "Ready", "g1": "Draining"}
    assert event_reasons(plan) == [EventReason.DRAIN_STARTED]
    # The drain's baseline is read as admission closes.
    assert [p.group for p in plan.leader_probes] == ["g1"]


def test_ready_leaders_are_read_before_one_is_chosen_for_scale_in() -> None:
    old = NOW - timedelta(hours=1)
    groups = (
        group("g0", "ready", created=old),
        group("g1", "ready", domain="c", created=old),
        group("g2", "healthy", domain="b"),
    )
    plan = plan_model_group(world(*groups, desired=1, leader_readings=idle("g0")))
    # The not-ready group goes at once; the ready victim waits for g1's leader to be read.
    assert [d.group for d in plan.deletions] == ["g2"]
    assert plan.unready == () and plan.drain_starts == ()
    assert [p.group for p in plan.leader_probes] == ["g1"]
    assert states(plan) == {"g0": "Ready", "g1": "Ready"}


def test_the_ready_group_holding_the_least_work_is_drained() -> None:
    old = NOW - timedelta(hours=1)
    readings = {
        "g0": LeaderSample(at=NOW, running=1, waiting=0),
        "g1": LeaderSample(at=NOW, running=9, waiting=4),
    }
    plan = plan_model_group(
        world(
            group("g0", "ready", created=old),
            group("g1", "ready", domain="c", created=old),
            desired=1,
            leader_readings=readings,
        )
    )
    assert [group for group, _ in started(plan)] == ["g0"]
    (start,) = plan.drain_starts
    assert start.event is not None and "1 running and 0 waiting" in start.event.message


def test_groups_younger_than_the_minimum_lifetime_are_not_drained() -> None:
    young = NOW - timedelta(seconds=100)
    plan = plan_model_group(
        world(group("g0", "ready", created=young), group("g1", "ready", created=young), desired=1)
    )
    assert plan.drain_starts == () and plan.deletions == () and plan.leader_probes == ()


@pytest.mark.parametrize(
    ("change", "drained"),
    [
        ({"max_replicas": 1}, ["g1"]),
        ({"deleting": True}, ["g1"]),
        ({"max_replicas": 2}, []),
    ],
    ids=["over maxReplicas", "model group deleted", "within maxReplicas"],
)
def test_young_groups_are_drained_only_over_max_replicas_or_on_deletion(
    change: dict[str, Any], drained: list[str]
) -> None:
    young = NOW - timedelta(seconds=100)
    plan = plan_model_group(
        world(
            group("g0", "ready", created=young),
            group("g1", "ready", created=young, domain="c"),
            desired=1,
            leader_readings=idle("g0", "g1"),
            **change,
        )
    )
    assert [group for group, _ in started(plan)] == drained


def draining(name: str, since_seconds: float, **changes: Any) -> list[PodView]:
    return group(
        name,
        "ready",
        domain="c",
        draining_since=NOW - timedelta(seconds=since_seconds),
        group_ready=condition("False", NOW),
        **changes,
    )


@dataclass(frozen=True)
class DrainCase:
    name: str
    since_seconds: float
    readings: dict[str, LeaderSample] = field(default_factory=dict)
    routed: frozenset[str] = frozenset()
    progress: DrainProgress | None = None
    deleted: bool = False
    event: str | None = None
    probed: bool = True


ROUTES_STOPPED = DrainProgress(
    baseline=DrainBaseline(NOW - timedelta(seconds=30), finished_total=40, aborted_total=0, in_flight=3),
    routes_stopped_at=NOW - timedelta(seconds=20),
)
DRAIN_CASES = [
    DrainCase(
        "idle leader after routing stopped and settled: deleted",
        30,
        {"g1": LeaderSample(NOW, 0, 0, finished_total=43)},
        progress=ROUTES_STOPPED,
        deleted=True,
        event=EventReason.DRAIN_FINISHED,
        probed=False,
    ),
    DrainCase(
        "requests in flight: keeps draining",
        30,
        {"g1": LeaderSample(NOW, 2, 1)},
        progress=ROUTES_STOPPED,
    ),
    DrainCase("load unknown: keeps draining", 30, progress=ROUTES_STOPPED),
    DrainCase(
        "idle but still a ready endpoint: keeps draining",
        30,
        {"g1": LeaderSample(NOW, 0, 0)},
        routed=frozenset({"llama-70b-g1-0"}),
        progress=ROUTES_STOPPED,
    ),
    DrainCase(
        "idle but routers not settled yet: keeps draining",
        3,
        {"g1": LeaderSample(NOW, 0, 0)},
        progress=DrainProgress(routes_stopped_at=NOW - timedelta(seconds=1)),
    ),
    DrainCase(
        "drain time is up with requests in flight: deleted, counted",
        600,
        {"g1": LeaderSample(NOW, 3, 0, finished_total=41)},
        progress=ROUTES_STOPPED,
        deleted=True,
        event=EventReason.DRAIN_TIMED_OUT,
        probed=False,
    ),
]


@pytest.mark.parametrize("case", DRAIN_CASES, ids=lambda case: case.name)
def test_draining_groups_leave_when_idle_or_out_of_time(case: DrainCase) -> None:
    pods = draining("g1", case.since_seconds)
    if case.progress is not None:
        pods[0] = replace(pods[0], drain_progress=case.progress)
    plan = plan_model_group(
        world(
            group("g0", "ready"),
            pods,
            desired=1,
            leader_readings=case.readings,
            routed_pods=case.routed,
        )
    )
    # A drain's end is written and recorded first; the ranks go in a later pass (see below).
    assert plan.deletions == ()
    assert ([p.group for p in plan.leader_probes] == ["g1"]) is case.probed
    assert event_reasons(plan) == ([case.event] if case.event else [])
    if case.deleted:
        (ended,) = plan.drains_ended
        assert ended.record.requests_finished == case.readings["g1"].finished_total - 40
        assert ended.record.requests_aborted == case.readings["g1"].in_flight
        (outcome,) = plan.drain_outcomes
        assert outcome.pods == tuple(pod.name for pod in pods)
    else:
        assert "g1" in states(plan) and plan.drains_ended == () and plan.drain_outcomes == ()


# Two idle groups were draining (20 s limit) when the operator was killed; the one that took the
# Lease over made its first pass 34.1 s after the drains began.
TAKEOVER = NOW - timedelta(seconds=0.4)
SHORT_DRAINS = replace(RULES, drain_max_seconds=20)
IDLE_SINCE_KILL = DrainProgress(
    baseline=DrainBaseline(NOW - timedelta(seconds=34), finished_total=40, aborted_total=0, in_flight=0),
    routes_stopped_at=NOW - timedelta(seconds=33),
)


def resumed_drains(readings: dict[str, LeaderSample]) -> Plan:
    pods = [draining(name, 34.1) for name in ("g1", "g2")]
    for ranks in pods:
        ranks[0] = replace(ranks[0], drain_progress=IDLE_SINCE_KILL)
    return plan_model_group(
        world(
            group("g0", "ready"),
            *pods,
            desired=1,
            rules=SHORT_DRAINS,
            acting_since=TAKEOVER,
            leader_readings=readings,
        )
    )


def test_drains_resumed_after_a_takeover_read_their_leaders_before_judging_the_time_limit() -> None:
    plan = resumed_drains({})
    assert sorted(p.group for p in plan.leader_probes) == ["g1", "g2"]
    assert plan.drains_ended == () and plan.drain_outcomes == () and event_reasons(plan) == []


def test_drains_resumed_after_a_takeover_whose_leaders_are_idle_end_as_drained() -> None:
    idle = {name: LeaderSample(NOW, 0, 0, finished_total=40) for name in ("g1", "g2")}
    plan = resumed_drains(idle)
    assert sorted((d.record.group, d.record.outcome) for d in plan.drains_ended) == [
        ("g1", "Drained"),
        ("g2", "Drained"),
    ]
    assert event_reasons(plan) == [EventReason.DRAIN_FINISHED] * 2
    assert all(
        d.record.requests_aborted == 0 and d.record.duration_seconds == 34.1 for d in plan.drains_ended
    )


def test_a_drain_this_operator_began_still_times_out_at_its_limit() -> None:
    plan = plan_model_group(
        world(
            group("g0", "ready"),
            draining("g1", 34.1),
            desired=1,
            rules=SHORT_DRAINS,
            acting_since=NOW - timedelta(seconds=60),
        )
    )
    assert [(d.record.group, d.record.outcome) for d in plan.drains_ended] == [("g1", "TimedOut")]


def test_a_draining_groups_progress_is_recorded_on_its_leader() -> None:
    reading = LeaderSample(NOW, 2, 0, finished_total=7, aborted_total=1)
    plan = plan_model_group(
        world(group("g0", "ready"), draining("g1", 2), desired=1, leader_readings={"g1": reading})
    )
    (mark,) = plan.drain_progress
    assert mark.leader == "llama-70b-g1-0"
    assert mark.progress == DrainProgress(DrainBaseline(NOW, 7, 1, 2), routes_stopped_at=NOW)


def test_scale_out_puts_a_draining_group_back_in_service() -> None:
    plan = plan_model_group(world(group("g0", "ready"), draining("g1", 10), draining("g2", 5), desired=2))
    assert plan.creations == ()
    # The drain begun last has lost the least: it is the one reused.
    assert [(c.group, c.ready) for c in plan.ready] == [("g2", True)]
    assert [(m.group, m.since) for m in plan.drain_marks] == [("g2", None)]
    assert states(plan) == {"g0": "Ready", "g1": "Draining", "g2": "Ready"}
    assert event_reasons(plan) == [EventReason.DRAIN_CANCELLED]
    assert plan.drains_cancelled == ("g2",)
    assert [p.group for p in plan.leader_probes] == ["g1"]


def test_a_draining_group_that_lost_a_rank_is_replaced_not_reused() -> None:
    broken = draining("g1", 10)
    broken[1] = replace(broken[1], restarts=1)
    plan = plan_model_group(world(group("g0", "ready"), broken, desired=2))
    assert plan.ready == ()
    assert [d.group for d in plan.deletions] == ["g1"]
    assert len(plan.creations) == 1


def test_backoffs_round_trip_and_tolerate_garbage() -> None:
    backoffs = (DomainBackoff("a", NOW, "ScheduleTimeout"),)
    assert parse_backoffs(encode_backoffs(backoffs)) == backoffs
    assert parse_backoffs("not json") == ()
    assert parse_backoffs(json.dumps([{"domain": 3}])) == ()


# Property: planning against the world it produces converges, never over-creates, and never counts
# a partial group as ready.


def apply(w: World, plan: Plan) -> World:
    """What the cluster looks like once the operator applied the plan (pods created, released, marked)."""
    pods = {p.name: p for p in w.pods}
    for deletion in plan.deletions:
        for name in deletion.pods:
            pods[name] = replace(pods[name], deleting=True)
    for creation in plan.creations:
        for manifest in creation.pods:
            view = parse_pod(manifest)
            assert view is not None
            pods[view.name] = replace(view, created_at=w.now, gated=False)
    for release in plan.gate_releases:
        for name in release.pods:
            pods[name] = replace(pods[name], gated=False)
    for start in plan.drain_starts:
        for name in start.pods:
            pods[name] = replace(
                pods[name], draining_since=start.since, group_ready=condition("False", w.now)
            )
    for outcome in plan.drain_outcomes:
        for name in outcome.pods:
            pods[name] = replace(pods[name], drain_outcome=outcome.decided)
    for change in (*plan.unready, *plan.ready):
        for name in change.pods:
            pods[name] = replace(
                pods[name], group_ready=condition("True" if change.ready else "False", w.now)
            )
    for mark in plan.drain_marks:
        for name in mark.pods:
            pods[name] = replace(pods[name], draining_since=mark.since)
    claims = tuple(GpuClaim(p.gpus, p.node_name, CLIQUE, p.topology_domain) for p in pods.values())
    counter = int(plan.annotations.get(naming.ANNOTATION_GROUP_COUNTER, w.group_counter))
    return replace(w, pods=tuple(pods.values()), inventory=Inventory(NODES, claims), group_counter=counter)


group_stage = st.sampled_from(STAGES)


@settings(max_examples=150, deadline=None)
@given(
    stages=st.lists(group_stage, max_size=5),
    desired=st.integers(min_value=0, max_value=6),
    restarted=st.sets(st.integers(min_value=0, max_value=4)),
)
def test_replanning_converges_without_over_creating(
    stages: list[str], desired: int, restarted: set[int]
) -> None:
    domains = "abcd"
    groups = [
        group(
            f"g{i}",
            stage,
            domain=domains[i % 4],
            created=NOW - timedelta(hours=1),
            restarts=1 if i in restarted else 0,
        )
        for i, stage in enumerate(stages)
    ]
    w = world(*groups, desired=desired, group_counter=len(stages))
    first = plan_model_group(w)
    after = apply(w, first)
    second = plan_model_group(after)

    active = [g for g in first.groups if g.state in ("Placing", "Provisioning", "Warming", "Ready")]
    # Exactly what is wanted, short only when nothing more fits, and over only while ready leaders
    # are read before one of them is chosen for scale-in.
    if first.placement_limit is None:
        assert len(active) >= desired
    if len(active) > desired:
        assert first.leader_probes and all(g.state == "Ready" for g in active)
    # Creations make up the shortfall and no more.
    assert len(first.creations) <= max(0, desired - (len(active) - len(first.creations)))
    # Once applied, the same world needs no further creation or deletion.
    assert second.creations == ()
    assert [d.group for d in second.deletions] == []
    # Only complete groups whose every rank is marked are counted as ready.
    for g in first.groups:
        if g.state == "Ready":
            assert len(g.pods) == TEMPLATE.pods_per_group


@settings(max_examples=50, deadline=None)
@given(
    desired=st.integers(min_value=0, max_value=8),
    stages=st.lists(group_stage, min_size=1, max_size=4),
    order=st.randoms(use_true_random=False),
)
def test_the_plan_is_a_function_of_the_world_not_of_the_order_pods_are_listed(
    desired: int, stages: list[str], order: random.Random
) -> None:
    """A restarted operator lists the same pods in another order and must pick up the same plan."""
    groups = [group(f"g{i}", stage, domain="abcd"[i % 4]) for i, stage in enumerate(stages)]
    w = world(
        *groups,
        desired=desired,
        group_counter=len(stages),
        leader_readings=idle(*(f"g{i}" for i in range(4))),
    )
    shuffled = list(w.pods)
    order.shuffle(shuffled)
    assert plan_model_group(replace(w, pods=tuple(shuffled))) == plan_model_group(w)


def test_a_group_drained_the_moment_it_became_ready_is_not_marked_ready() -> None:
    plan = plan_model_group(
        world(
            group("g0", "ready", created=NOW - timedelta(hours=1)),
            group("g1", "healthy", domain="c"),
            desired=1,
            rules=replace(RULES, min_lifetime_seconds=0),
            warmups={"g1": WarmupOutcome(True, NOW)},
            leader_readings={
                "g0": LeaderSample(NOW, running=5, waiting=0),
                "g1": LeaderSample(NOW, running=0, waiting=0),
            },
        )
    )
    assert [c.group for c in plan.ready] == []
    assert started(plan) == [("g1", NOW)]
    assert states(plan) == {"g0": "Ready", "g1": "Draining"}


def test_names_of_terminating_groups_are_not_reused() -> None:
    plan = plan_model_group(world(group("g7", "ready", deleting=True), desired=1, group_counter=0))
    assert [c.group for c in plan.creations] == ["g8"]


def test_a_group_that_lost_nccl_health_says_which_check_failed_and_how() -> None:
    """The agent's reason (a hang, an error or a slow link) and its figures reach the group's status,
    so the replacement's Event says what the all-reduce found."""
    hung = ConditionView("False", "AllReduceTimeout", "rank 8 did not finish the all-reduce within 120s", NOW)
    plan = plan_model_group(world(group("g0", "ready", nccl_healthy=hung), desired=1))
    (failed,) = (g for g in plan.groups if g.name == "g0")
    assert failed.reason == Reason.NCCL_UNHEALTHY
    assert (
        "lost NCCL health (AllReduceTimeout: rank 8 did not finish the all-reduce within 120s)"
        in failed.message
    )


# Issue 18: a drain's every step resumes from what the pods hold, wherever an operator stopped.

DRAIN_BEGAN = NOW - timedelta(seconds=40)
OUTCOME = DecidedDrain(
    record=DrainRecord(
        group="g1",
        outcome="Drained",
        started_at=DRAIN_BEGAN,
        ended_at=NOW - timedelta(seconds=2),
        duration_seconds=38.0,
        requests_finished=5,
        requests_aborted=0,
    ),
    message="group g1 drained in 38.0s",
)


def _rank(pods: list[PodView], rank: int, **changes: Any) -> list[PodView]:
    return [replace(p, **changes) if p.rank == rank else p for p in pods]


@dataclass(frozen=True)
class StoppedStart:
    name: str
    victim: list[PodView]


STOPPED_STARTS = [
    StoppedStart(
        "marked on rank 0 only, every gate still True",
        _rank(group("g1", "ready", domain="c"), 0, draining_since=DRAIN_BEGAN),
    ),
    StoppedStart(
        "marked on every rank, gate False on rank 0 only",
        _rank(
            group("g1", "ready", domain="c", draining_since=DRAIN_BEGAN),
            0,
            group_ready=condition("False", DRAIN_BEGAN),
        ),
    ),
    StoppedStart(
        "every gate False and no mark at all (closed by an operator that wrote no intent)",
        group("g1", "ready", domain="c", group_ready=condition("False", DRAIN_BEGAN)),
    ),
]


@pytest.mark.parametrize("case", STOPPED_STARTS, ids=lambda case: case.name)
def test_a_drain_start_cut_short_is_judged_draining_and_completed(case: StoppedStart) -> None:
    plan = plan_model_group(
        world(group("g0", "ready"), case.victim, desired=1, leader_readings=idle("g0", "g1"))
    )
    # Never Warming, never deleted at once: the drain resumes from its start.
    assert states(plan) == {"g0": "Ready", "g1": "Draining"}
    assert plan.deletions == () and plan.drains_ended == ()
    (start,) = plan.drain_starts
    assert (start.group, start.pods, start.since) == ("g1", ("llama-70b-g1-0", "llama-70b-g1-1"), DRAIN_BEGAN)
    # Whether the stopped operator posted DrainStarted is unknown: the resumed start announces itself.
    assert start.event is not None and start.event.reason == EventReason.DRAIN_STARTED
    assert "resuming a drain start" in start.event.message
    # Applied, the start is complete and not repeated.
    again = plan_model_group(apply(world(group("g0", "ready"), case.victim, desired=1), plan))
    assert again.drain_starts == () and states(again)["g1"] == "Draining"


@dataclass(frozen=True)
class StoppedEnd:
    name: str
    victim: list[PodView]
    recorded: bool
    deleted: tuple[str, ...]
    outcome_written_to: tuple[str, ...]


ENDED = group(
    "g1", "ready", domain="c", draining_since=DRAIN_BEGAN, group_ready=condition("False", DRAIN_BEGAN)
)
STOPPED_ENDS = [
    StoppedEnd(
        "outcome on rank 0 only, not recorded",
        _rank(ENDED, 0, drain_outcome=OUTCOME),
        recorded=False,
        deleted=(),
        outcome_written_to=("llama-70b-g1-1",),
    ),
    StoppedEnd(
        "outcome on every rank, status write lost",
        [replace(p, drain_outcome=OUTCOME) for p in ENDED],
        recorded=False,
        deleted=(),
        outcome_written_to=(),
    ),
    StoppedEnd(
        "recorded, no rank deleted yet",
        [replace(p, drain_outcome=OUTCOME) for p in ENDED],
        recorded=True,
        deleted=("llama-70b-g1-0", "llama-70b-g1-1"),
        outcome_written_to=(),
    ),
    StoppedEnd(
        "recorded, rank 0 already deleted",
        _rank([replace(p, drain_outcome=OUTCOME) for p in ENDED], 0, deleting=True),
        recorded=True,
        deleted=("llama-70b-g1-1",),
        outcome_written_to=(),
    ),
]


@pytest.mark.parametrize("case", STOPPED_ENDS, ids=lambda case: case.name)
def test_an_ended_drain_is_rebuilt_from_its_ranks_and_recorded_before_deletion(case: StoppedEnd) -> None:
    # The leader now reports other counts: the outcome on the ranks is what counts, not a recount.
    readings = {"g1": LeaderSample(NOW, 2, 0, finished_total=99)}
    plan = plan_model_group(
        world(
            group("g0", "ready"),
            case.victim,
            desired=1,
            leader_readings=readings,
            recorded_drains=frozenset({"g1"}) if case.recorded else frozenset(),
        )
    )
    assert [pod for d in plan.deletions for pod in d.pods] == list(case.deleted)
    assert [pod for mark in plan.drain_outcomes for pod in mark.pods] == list(case.outcome_written_to)
    assert plan.creations == ()  # a leaving group is neither failed nor replaced
    assert plan.drain_starts == () and plan.ready == ()
    if case.recorded:
        assert plan.drains_ended == () and event_reasons(plan) == []
        assert "g1" not in states(plan)
    else:
        (ended,) = plan.drains_ended
        record = ended.record
        assert (record.requests_finished, record.requests_aborted, record.started_at) == (5, 0, DRAIN_BEGAN)
        assert event_reasons(plan) == [EventReason.DRAIN_FINISHED]
        assert states(plan)["g1"] == "Draining"


def test_a_leaving_group_is_not_put_back_in_service_by_a_scale_out() -> None:
    leaving = [replace(p, drain_outcome=OUTCOME) for p in ENDED]
    plan = plan_model_group(world(group("g0", "ready"), leaving, desired=2))
    assert plan.ready == () and plan.drains_cancelled == ()
    assert len(plan.creations) == 1


def test_no_more_drains_end_in_a_pass_than_the_status_keeps_so_each_is_recorded_once() -> None:
    """A drain is deleted only once `status.drain.recent` (10 records) holds it: twelve drains that
    end together end over two passes, each recorded once and deleted once."""
    names = [f"g{i}" for i in range(12)]
    pods = [
        replace(p, drain_progress=ROUTES_STOPPED) if p.rank == 0 else p
        for name in names
        for p in draining(name, 30)
    ]
    readings = {name: LeaderSample(NOW, 0, 0, finished_total=41) for name in names}
    w = world(pods, desired=0, leader_readings=readings)
    ended: list[str] = []
    deleted: list[str] = []
    recorded: frozenset[str] = frozenset()
    for _ in range(4):
        plan = plan_model_group(replace(w, recorded_drains=recorded))
        assert len(plan.drains_ended) <= RECENT_DRAINS
        ended += [e.record.group for e in plan.drains_ended if e.record.group not in recorded]
        deleted += [d.group for d in plan.deletions]
        recorded |= {e.record.group for e in plan.drains_ended}
        w = apply(w, plan)
    assert sorted(ended) == sorted(names) and sorted(deleted) == sorted(names)
