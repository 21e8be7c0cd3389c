"""Signals act on feasible demand only (goodput.controllers.autoscale with a snapshot's feasibility).

A request past its class's feasible threshold misses its TTFT on any number of groups, so the
decision sets its share aside: it never causes a scale-out and never holds a scale-in. Worlds with
infeasible demand are built from a feasible-only world by adding the infeasible share on top
(`with_infeasible`), so the feasible part is the same and the decisions can be compared.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_autoscale_properties import groups as generated_groups
from test_autoscale_world import (
    ITL_BUCKETS,
    PERMISSIVE,
    PROFILE,
    QUEUE_BUCKETS,
    TTFT_BUCKETS,
    group,
    load,
    ready_groups,
    world,
)

from goodput.api.reasons import Guard, Signal
from goodput.controllers.autoscale import decide
from goodput.controllers.autoscale.feasible_demand import floor_model
from goodput.controllers.autoscale.model import (
    ClassFeasibility,
    Decision,
    DecisionState,
    GroupMetrics,
    GroupObservation,
    ModelGroupSnapshot,
    ScalingPolicy,
    SloTargets,
)
from goodput.controllers.autoscale.snapshot import (
    ModelGroupCounts,
    clamped,
    model_group_snapshot,
)
from goodput.estimators.attainment import Histogram
from goodput.estimators.feasibility import ttft_floor_seconds
from goodput.estimators.queueing import QueuedRequest

NOW = 1000.0
THRESHOLD = 24_000


def feasibility(
    request_share: float | None, token_share: float | None = None
) -> tuple[ClassFeasibility, ...]:
    token = request_share if token_share is None else token_share
    return (ClassFeasibility("interactive", THRESHOLD, request_share, token),)


def with_infeasible(
    metrics: GroupMetrics | None, request_share: float, token_share: float
) -> GroupMetrics | None:
    """The same group with infeasible requests added: `request_share` of its requests (waiting,
    running, arriving, finishing) and `token_share` of its prompt tokens and KV are theirs; their
    first tokens all miss the TTFT target, their decode is like the others'."""
    if metrics is None:
        return None
    by_requests = 1.0 / (1.0 - request_share)
    by_tokens = 1.0 / (1.0 - token_share)
    ttft = metrics.ttft
    if ttft is not None and ttft.total > 0:
        extra = ttft.total * (by_requests - 1.0)
        ttft = Histogram(ttft.upper_bounds, (*ttft.cumulative_counts[:-1], ttft.total + extra))
    return dataclasses.replace(
        metrics,
        waiting_requests=metrics.waiting_requests * by_requests,
        running_requests=metrics.running_requests * by_requests,
        kv_usage_fraction=min(1.0, metrics.kv_usage_fraction * by_tokens),
        prompt_tokens_per_second=metrics.prompt_tokens_per_second * by_tokens,
        generation_tokens_per_second=metrics.generation_tokens_per_second * by_requests,
        # More requests, and more tokens: the mean prompt grows by by_tokens / by_requests.
        prompt_tokens_sum=metrics.prompt_tokens_sum * by_tokens,
        prompt_tokens_count=metrics.prompt_tokens_count * by_requests,
        prompt_tokens_started=metrics.prompt_tokens_started * by_tokens,
        prompts_started=metrics.prompts_started * by_requests,
        finished_requests=metrics.finished_requests * by_requests,
        ttft=ttft,
    )


def plus_infeasible(
    snapshot: ModelGroupSnapshot, request_share: float, token_share: float
) -> ModelGroupSnapshot:
    groups = tuple(
        dataclasses.replace(observed, metrics=with_infeasible(observed.metrics, request_share, token_share))
        for observed in snapshot.groups
    )
    return dataclasses.replace(snapshot, groups=groups, feasibility=feasibility(request_share, token_share))


def _decide(snapshot: ModelGroupSnapshot, policy: ScalingPolicy = PERMISSIVE) -> Decision:
    return decide(snapshot, policy, DecisionState.initial(), NOW)


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    feasible: ModelGroupSnapshot
    request_share: float
    token_share: float


CASES = [
    Case("idle fleet, half the requests infeasible", world(*ready_groups(3, 0.0, kv_usage=0.0)), 0.5, 0.9),
    Case("busy fleet, a tenth infeasible", world(*ready_groups(2, 0.9)), 0.1, 0.6),
    Case("overloaded group, most infeasible", world(*ready_groups(1, 1.5, waiting=20.0)), 0.8, 0.95),
    Case("long queue, a fifth infeasible", world(*ready_groups(4, 0.5, waiting=40.0)), 0.2, 0.7),
]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_infeasible_demand_is_set_aside(case: Case) -> None:
    alone = _decide(case.feasible)
    mixed = _decide(plus_infeasible(case.feasible, case.request_share, case.token_share))
    assert mixed.desired_groups == alone.desired_groups
    assert mixed.estimates.arrival_work_rate == pytest.approx(alone.estimates.arrival_work_rate)
    assert mixed.estimates.waiting_work_seconds == pytest.approx(alone.estimates.waiting_work_seconds)
    assert mixed.estimates.mean_input_tokens == pytest.approx(alone.estimates.mean_input_tokens)


def test_without_the_feasibility_the_same_infeasible_load_scales_out() -> None:
    """The counterfactual the cases above rest on: counted as demand, the added load asks for more."""
    feasible = world(*ready_groups(2, 0.9))
    mixed = plus_infeasible(feasible, 0.5, 0.8)
    assert _decide(dataclasses.replace(mixed, feasibility=())).desired_groups > _decide(mixed).desired_groups


LONG_PROMPT_TOKENS = 80_000
PROMPT_BUCKETS = (10.0, 1_000.0, 10_000.0, 50_000.0, 100_000.0)


def long_prompts_decoding(count: int, *, first_tokens_exported: bool = True) -> ModelGroupSnapshot:
    """One ready group after its readiness warm-up (two 4-token prompts, finished), as `count`
    80,000-token prompts have had their first token in the window: the prompt-token counter holds
    their tokens, the prompt-length histogram (observed at a request's finish) does not yet."""
    begun_tokens = count * LONG_PROMPT_TOKENS + 4.0
    figures = GroupMetrics(
        age_seconds=1.0,
        waiting_requests=0.0,
        running_requests=float(count),
        kv_usage_fraction=0.3,
        prompt_tokens_per_second=begun_tokens / 30.0,
        prompt_tokens_sum=8.0,
        prompt_tokens_count=2.0,
        prompts_started=count + 1.0 if first_tokens_exported else 0.0,
        prompt_tokens_started=begun_tokens if first_tokens_exported else 0.0,
        prompt_tokens=Histogram.from_observations(PROMPT_BUCKETS, [4, 4]),
    )
    return model_group_snapshot(
        [group(clamped(figures), name="g0")],
        ModelGroupCounts(spec_replicas=1, min_replicas=1, max_replicas=8),
        profile=PROFILE,
        policy=PERMISSIVE,
        name="default/chat",
        metrics_window_seconds=30.0,
        now=NOW,
    )


def test_long_prompts_still_decoding_are_judged_infeasible_before_any_of_them_finishes() -> None:
    (interactive,) = PERMISSIVE.classes
    assert ttft_floor_seconds(floor_model(PROFILE), LONG_PROMPT_TOKENS) > interactive.ttft_seconds
    snapshot = long_prompts_decoding(16)
    (entry,) = snapshot.feasibility
    assert entry.infeasible_token_share is not None and entry.infeasible_token_share > 0.99
    decision = _decide(snapshot)
    assert decision.desired_groups == 1
    # The counterfactual: judged by the finished warm-up prompts alone, their tokens are feasible
    # demand at four tokens a request, and ask for another group.
    assert _decide(long_prompts_decoding(16, first_tokens_exported=False)).desired_groups > 1


def test_a_fleet_whose_only_waiting_work_is_infeasible_scales_in() -> None:
    everything_infeasible = world(*ready_groups(4, 1.0, waiting=50.0))
    snapshot = dataclasses.replace(everything_infeasible, feasibility=feasibility(1.0, 1.0))
    decision = _decide(snapshot)
    assert decision.desired_groups == PERMISSIVE.min_groups
    assert Guard.SCALE_IN_UNSAFE not in decision.guards


def test_a_gateway_queue_of_only_infeasible_prompts_scales_in() -> None:
    long_prompts = tuple(QueuedRequest(NOW - 0.5, 100_000, 200) for _ in range(30))
    snapshot = dataclasses.replace(
        world(*ready_groups(3, 0.0, kv_usage=0.0), queue=long_prompts), feasibility=feasibility(0.0)
    )
    decision = _decide(snapshot)
    assert decision.estimates.waiting_requests == 0
    assert decision.desired_groups == PERMISSIVE.min_groups


def test_feasible_requests_in_a_gateway_queue_still_count() -> None:
    mixed = tuple(QueuedRequest(NOW - 0.5, 100_000, 200) for _ in range(5)) + tuple(
        QueuedRequest(NOW - 0.5, 1000, 200) for _ in range(7)
    )
    snapshot = dataclasses.replace(world(*ready_groups(2, 0.3), queue=mixed), feasibility=feasibility(0.0))
    assert _decide(snapshot).estimates.waiting_requests == 7


def test_a_class_no_request_can_meet_never_pins_the_fleet_at_the_maximum() -> None:
    unattainable = (ClassFeasibility("interactive", 0, 1.0, 1.0, unmet_field="ttftSeconds"),)
    snapshot = dataclasses.replace(world(*ready_groups(3, 3.0, waiting=100.0)), feasibility=unattainable)
    decision = _decide(snapshot)
    assert decision.desired_groups == PERMISSIVE.min_groups
    assert decision.desired_groups < PERMISSIVE.max_groups


def test_an_unknown_share_counts_everything_and_does_not_hold_scale_in() -> None:
    unknown = feasibility(None)
    busy = world(*ready_groups(1, 1.5))
    idle = world(*ready_groups(3, 0.0, kv_usage=0.0))
    assert (
        _decide(dataclasses.replace(busy, feasibility=unknown)).desired_groups == _decide(busy).desired_groups
    )
    assert _decide(dataclasses.replace(idle, feasibility=unknown)).desired_groups == PERMISSIVE.min_groups


def test_work_that_waits_past_a_negative_queue_budget_does_not_hold_scale_in() -> None:
    """A TTFT target below the p90 prompt's service time leaves no affordable wait; the scale-in
    check used to return the current count whenever anything waited then, so the fleet never shrank."""
    tight = dataclasses.replace(PERMISSIVE, classes=(SloTargets("interactive", 0.05, 0.08),))
    snapshot = world(*ready_groups(6, 0.1, waiting=1.0))
    decision = _decide(snapshot, tight)
    assert decision.estimates.queue_budget_seconds < 0
    assert decision.desired_groups < 6
    assert Guard.SCALE_IN_UNSAFE not in decision.guards


def test_goodput_is_judged_against_the_attainable_ceiling_and_reported_against_offered() -> None:
    # 80 of 100 first tokens in time; the other 20 are prompts no group can serve in time.
    ttft = Histogram.from_observations(TTFT_BUCKETS, [0.5] * 80 + [4.0] * 20)
    observed = tuple(group(load(0.6, ttft=ttft, finished=100.0), name=f"g{index}") for index in range(2))
    snapshot = dataclasses.replace(world(*observed), feasibility=feasibility(0.2, 0.6))
    decision = _decide(snapshot)
    report = decision.estimates.goodput
    assert report is not None
    assert report.attainment_offered == pytest.approx(0.8)
    assert report.attainment_attainable == pytest.approx(1.0)
    ttft_check = next(check for check in decision.estimates.slo_checks if check.name == "ttft")
    assert ttft_check.within == pytest.approx(1.0)
    assert all(proposal.signal is not Signal.GOODPUT for proposal in decision.proposals)
    assert _decide(dataclasses.replace(snapshot, feasibility=())).estimates.slo_checks[
        0
    ].within == pytest.approx(0.8)


def test_the_record_carries_the_feasibility_and_both_attainments() -> None:
    ttft = Histogram.from_observations(TTFT_BUCKETS, [0.5] * 90 + [4.0] * 10)
    observed = (group(load(0.5, ttft=ttft, finished=100.0), name="g0"),)
    record = _decide(dataclasses.replace(world(*observed), feasibility=feasibility(0.1, 0.4))).to_record()
    estimates = record["estimates"]
    assert isinstance(estimates, dict)
    assert estimates["feasibility"] == [
        {
            "class": "interactive",
            "longest_feasible_prompt_tokens": THRESHOLD,
            "infeasible_request_share": 0.1,
            "infeasible_token_share": 0.4,
            "unmet_field": None,
        }
    ]
    assert estimates["goodput"]["attainment_offered"] == pytest.approx(0.9)
    assert estimates["goodput"]["attainment_attainable"] == pytest.approx(1.0)


shares = st.tuples(st.floats(0.0, 0.9), st.floats(0.0, 0.95)).map(lambda pair: (pair[0], max(pair)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generated_groups(), shares)
def test_adding_infeasible_demand_never_raises_the_desired_count(
    observed: list[GroupObservation], share: tuple[float, float]
) -> None:
    feasible = world(*observed) if observed else world(spec=0)
    request_share, token_share = share
    alone = _decide(feasible)
    mixed = _decide(plus_infeasible(feasible, request_share, token_share))
    assert mixed.desired_groups <= alone.desired_groups


def _one_slow_gap_after_a_long_wait(finished: float) -> GroupMetrics:
    """An idle group whose window shows one token gap above the ITL target and one wait beyond the
    queue budget (load-driven, as the goodput signal reads it), over `finished` requests."""
    return load(
        0.0,
        kv_usage=0.0,
        itl=Histogram(ITL_BUCKETS, (0.0,) * 7 + (1.0,) * 10),
        queue_time=Histogram(QUEUE_BUCKETS, (0.0,) * 8 + (1.0,) * 9),
        finished=finished,
    )


@pytest.mark.parametrize(
    ("name", "finished", "request_share"),
    [
        ("too few to judge, doubled by infeasible requests", 10.0, 0.5),
        ("too few to judge, a tenth more infeasible", 19.0, 0.1),
    ],
)
def test_infeasible_requests_never_bring_a_check_over_its_minimum(
    name: str, finished: float, request_share: float
) -> None:
    feasible = world(group(_one_slow_gap_after_a_long_wait(finished), name="g0"))
    alone = _decide(feasible)
    mixed = _decide(plus_infeasible(feasible, request_share, request_share))
    assert alone.estimates.slo_checks == (), name
    assert mixed.estimates.slo_checks == (), name
    assert mixed.desired_groups == alone.desired_groups == 1, name


@settings(max_examples=100, deadline=None)
@given(
    st.integers(2, 8),
    st.floats(0.0, 4.0),
    st.floats(0.0, 300.0),
    st.floats(0.0, 1.0),
)
def test_a_fleet_serving_only_infeasible_demand_can_always_scale_in(
    count: int, utilisation: float, waiting: float, kv_usage: float
) -> None:
    snapshot = dataclasses.replace(
        world(*ready_groups(count, utilisation, waiting=waiting, kv_usage=kv_usage)),
        feasibility=feasibility(1.0, 1.0),
    )
    decision = _decide(snapshot)
    assert decision.desired_groups < count
    assert Guard.SCALE_IN_UNSAFE not in decision.guards
