"""`decide` with a gateway in front (DESIGN §6 step 2): its exact figures replace engine inference.

Worlds are test_autoscale_world's (an H100 group of an 8B model, loads in groups' worth of
capacity); the gateway's view is built by hand as `metrics_source.gateway_from_result` would.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_autoscale_world import (
    CAPACITY,
    MEAN_INPUT,
    PERMISSIVE,
    REQUEST_WORK,
    TTFT_BUCKETS,
    ready_groups,
    world,
)

from goodput.api.reasons import ConditionType, Guard, Signal
from goodput.controllers.autoscale import decide
from goodput.controllers.autoscale.model import (
    Decision,
    DecisionState,
    GatewayClassFigures,
    GatewayObservation,
    ModelGroupSnapshot,
    ScalingPolicy,
)
from goodput.controllers.autoscale.record import autoscaler_conditions, metrics_health
from goodput.estimators.attainment import Histogram

NOW = 1000.0
CLASS = PERMISSIVE.primary_class.name
AT_ZERO = dataclasses.replace(PERMISSIVE, min_groups=0)


def held(requests: float, *, age: float = 1.0, running: float = 0.0, **figures: object) -> GatewayObservation:
    """A gateway holding `requests` of the mean shape in the primary class's queue."""
    entry = GatewayClassFigures(
        CLASS,
        waiting_requests=requests,
        waiting_prompt_tokens=requests * MEAN_INPUT,
        waiting_work_seconds=requests * REQUEST_WORK,
        **figures,  # type: ignore[arg-type]
    )
    return GatewayObservation(
        age_seconds=age,
        classes=(entry,),
        running_requests=running,
        running_work_seconds=running * REQUEST_WORK,
    )


def fronted(snapshot: ModelGroupSnapshot, gateway: GatewayObservation) -> ModelGroupSnapshot:
    return dataclasses.replace(snapshot, gateway=gateway)


def _decide(snapshot: ModelGroupSnapshot, policy: ScalingPolicy = PERMISSIVE) -> Decision:
    return decide(snapshot, policy, DecisionState.initial(), NOW)


@dataclass(frozen=True)
class Case:
    name: str
    world: ModelGroupSnapshot
    policy: ScalingPolicy
    desired: int
    reason: str
    guards: tuple[Guard, ...] = ()


CASES = [
    Case(
        "one held request wakes a pool at zero", fronted(world(spec=0), held(1)), AT_ZERO, 1, "gatewayQueue"
    ),
    Case(
        "a request in flight at zero groups (a group just drained) wakes it too",
        fronted(world(spec=0), held(0, running=1)),
        AT_ZERO,
        1,
        "gatewayQueue",
    ),
    Case("an empty gateway queue keeps zero", fronted(world(spec=0), held(0)), AT_ZERO, 0, "queueWork"),
    Case("no gateway: nothing is seen at zero", world(spec=0), AT_ZERO, 0, "minReplicas"),
    Case(
        "a stale gateway wakes nothing",
        fronted(world(spec=0), held(5, age=PERMISSIVE.staleness.max_age_seconds + 1)),
        AT_ZERO,
        0,
        "minReplicas",
    ),
    Case(
        "a stale gateway holds a scale-in the engines alone would make",
        fronted(world(*ready_groups(3, 0.1)), held(0, age=PERMISSIVE.staleness.max_age_seconds + 1)),
        PERMISSIVE,
        3,
        "StaleMetricsHoldScaleIn",
        (Guard.STALE_METRICS_HOLD_SCALE_IN,),
    ),
    Case(
        "the maximum still bounds a wake-up",
        fronted(world(spec=0), held(3)),
        dataclasses.replace(AT_ZERO, max_groups=0),
        0,
        "TooManyReplicas",
        (Guard.TOO_MANY_REPLICAS,),
    ),
    Case(
        # Engines see little (the gateway holds the backlog): 30 seconds of one group's work must
        # start within the queue budget B (about 1.8 s), so slack asks for ceil(30 / B) groups.
        "a backlog held at the gateway scales out though engines look idle",
        fronted(world(*ready_groups(2, 0.2)), held(3 * 10.0 * CAPACITY / REQUEST_WORK)),
        PERMISSIVE,
        17,
        "slack",
    ),
    Case(
        "without the gateway the same engines look like a scale-in",
        world(*ready_groups(2, 0.2)),
        PERMISSIVE,
        1,
        "queueWork",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_decision(case: Case) -> None:
    decision = _decide(case.world, case.policy)
    assert (decision.desired_groups, decision.reason) == (case.desired, case.reason)
    assert decision.guards == case.guards


def test_the_wake_up_names_the_gateway_queue_in_the_proposal() -> None:
    decision = _decide(fronted(world(spec=0), held(2)), AT_ZERO)
    wake = next(p for p in decision.proposals if p.signal is Signal.GATEWAY_QUEUE)
    assert (wake.groups, wake.value) == (1, 2.0)
    assert "gateway's queue" in wake.detail
    assert decision.to_record()["inputs"]["gateway"] == "fresh"  # type: ignore[index]
    assert not any(p.signal is Signal.SCALE_FROM_ZERO for p in decision.proposals)


def test_queue_figures_come_from_the_gateway() -> None:
    gateway = held(4, running=2)
    decision = _decide(fronted(world(*ready_groups(2, 0.2, waiting=50.0)), gateway))
    estimates = decision.estimates
    assert estimates.waiting_requests == 4
    assert estimates.running_requests == 2
    assert estimates.waiting_work_seconds == pytest.approx(4 * REQUEST_WORK)
    assert estimates.running_work_seconds == pytest.approx(2 * REQUEST_WORK)
    assert estimates.waiting_work_seconds_p90 is not None
    assert estimates.waiting_work_seconds_p90 >= estimates.waiting_work_seconds


def test_earliest_slack_is_the_gateways() -> None:
    decision = _decide(fronted(world(*ready_groups(1, 0.2)), held(1, earliest_slack_seconds=-0.25)))
    assert decision.estimates.earliest_slack_seconds == -0.25


def test_kv_demand_counts_the_prompts_the_gateway_holds() -> None:
    without = _decide(world(*ready_groups(1, 0.2))).estimates.kv_demand_tokens
    with_gateway = _decide(fronted(world(*ready_groups(1, 0.2)), held(10))).estimates.kv_demand_tokens
    assert without is not None and with_gateway is not None
    assert with_gateway - without == pytest.approx(10 * MEAN_INPUT)


def test_kv_headroom_counts_what_sessions_waiting_on_a_tool_hold() -> None:
    """Kept KV is in no engine's usage figure (a finished request's blocks count as free), yet no
    other request may use it: it is demand, and it is not headroom."""
    groups = world(*ready_groups(1, 0.2))
    waiting = _decide(fronted(groups, held(0))).estimates
    kept = _decide(fronted(groups, dataclasses.replace(held(0), kept_session_kv_tokens=5000.0))).estimates
    assert waiting.kv_demand_tokens is not None and kept.kv_demand_tokens is not None
    assert kept.kv_demand_tokens - waiting.kv_demand_tokens == pytest.approx(5000.0)
    assert waiting.kv_free_fraction is not None and kept.kv_free_fraction is not None
    assert kept.kv_free_fraction < waiting.kv_free_fraction


def test_attainment_is_against_the_gateways_offered_requests() -> None:
    ttft = Histogram.from_observations(TTFT_BUCKETS, [0.5] * 60 + [5.0] * 20)
    gateway = held(
        0,
        offered_requests=100,
        admitted_requests=80,
        rejected_requests=20,
        infeasible_requests=10,
        attaining_requests=60,
        missed_requests=20,
        ttft=ttft,
    )
    decision = _decide(fronted(world(*ready_groups(2, 0.2)), gateway))
    goodput = decision.estimates.goodput
    assert goodput is not None
    assert (goodput.offered_requests, goodput.admitted_requests, goodput.rejected_requests) == (100, 80, 20)
    assert goodput.attainment_offered == pytest.approx(0.6)
    assert goodput.attainment_admitted == pytest.approx(0.75)
    assert goodput.attainment_attainable == pytest.approx(60 / 90)
    assert goodput.request_goodput_per_second == pytest.approx(60 / decision_window())
    # The TTFT share is the clients' (gateway queue included), not the engines'.
    assert decision.estimates.ttft_attainment == pytest.approx(0.75)


def decision_window() -> float:
    return world().metrics_window_seconds


def test_attainment_is_reported_at_zero_groups_from_the_gateway() -> None:
    gateway = held(1, offered_requests=3, admitted_requests=1, rejected_requests=2)
    goodput = _decide(fronted(world(spec=0), gateway), AT_ZERO).estimates.goodput
    assert goodput is not None and goodput.attainment_offered == 0.0


def _condition_message(decision: Decision, snapshot: ModelGroupSnapshot) -> str:
    conditions = autoscaler_conditions(
        (), decision, metrics_health(snapshot, 60.0), generation=1, now=datetime(2026, 1, 1, tzinfo=UTC)
    )
    return next(c.message for c in conditions if c.type == ConditionType.SCALING_ACTIVE)


def test_a_pool_at_zero_without_a_gateway_says_it_sees_no_demand() -> None:
    snapshot = world(spec=0)
    decision = _decide(snapshot, AT_ZERO)
    assert "no gateway in front" in _condition_message(decision, snapshot)
    assert decision.to_record()["inputs"]["gateway"] == "none"  # type: ignore[index]


def test_a_pool_at_zero_with_an_idle_gateway_says_nothing_more() -> None:
    snapshot = fronted(world(spec=0), held(0))
    assert "gateway" not in _condition_message(_decide(snapshot, AT_ZERO), snapshot)


def test_figures_must_be_counts() -> None:
    with pytest.raises(ValueError, match="waiting_requests"):
        GatewayClassFigures(CLASS, waiting_requests=-1.0)
    with pytest.raises(ValueError, match="age_seconds"):
        GatewayObservation(age_seconds=float("nan"))


@given(
    waiting=st.floats(min_value=0.0, max_value=500.0),
    extra=st.floats(min_value=0.0, max_value=500.0),
    ready=st.integers(min_value=1, max_value=6),
)
def test_more_held_work_never_asks_for_fewer_groups(waiting: float, extra: float, ready: int) -> None:
    base = world(*ready_groups(ready, 0.3))
    fewer = _decide(fronted(base, held(waiting))).desired_groups
    more = _decide(fronted(base, held(waiting + extra))).desired_groups
    assert more >= fewer


@given(requests=st.integers(min_value=1, max_value=1000), max_groups=st.integers(min_value=0, max_value=5))
def test_held_requests_at_zero_wake_exactly_one_group_within_bounds(requests: int, max_groups: int) -> None:
    policy = dataclasses.replace(AT_ZERO, max_groups=max_groups)
    decision = _decide(fronted(world(spec=0), held(requests)), policy)
    assert decision.desired_groups == min(1, max_groups)
