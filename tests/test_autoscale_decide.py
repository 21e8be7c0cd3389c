"""`decide` on named worlds: inputs, policy, world, expected count, reason and guards.

Loads are in groups' worth of capacity (test_autoscale_world): u=1.5 on one group is 1.5 x C of
arriving work, so the queueWork signal asks for ceil(1.2 x 1.5) = 2 groups.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass

import pytest
from test_autoscale_world import (
    DEFAULT,
    MEAN_INPUT,
    MEAN_OUTPUT,
    PERMISSIVE,
    PROFILE,
    QUEUE_BUCKETS,
    TTFT_BUCKETS,
    group,
    load,
    ready_groups,
    waiting_requests_for,
    world,
)

from goodput.api.reasons import Guard, Signal
from goodput.controllers.autoscale import decide
from goodput.controllers.autoscale.model import (
    Decision,
    DecisionState,
    GroupMetrics,
    MetricStaleness,
    Mode,
    ModelGroupSnapshot,
    RequestQueue,
    ScalingPolicy,
    StaleMetricsAction,
)
from goodput.controllers.autoscale.ready_time import estimate_ready_time
from goodput.estimators.attainment import Histogram
from goodput.estimators.queueing import QueuedRequest

NOW = 1000.0
BUDGET = 2.0 - PROFILE.prefill_seconds_p90 - PROFILE.first_decode_seconds
HALF_LATE_TTFT = Histogram.from_observations(TTFT_BUCKETS, [1.0] * 50 + [3.0] * 50)
FEW_TTFT = Histogram.from_observations(TTFT_BUCKETS, [3.0] * 5)
EMPTY_TTFT = Histogram.empty(TTFT_BUCKETS)
HALF_QUEUED_LONG = Histogram.from_observations(QUEUE_BUCKETS, [0.3] * 50 + [5.0] * 50)


@dataclass(frozen=True)
class Case:
    name: str
    world: ModelGroupSnapshot
    policy: ScalingPolicy
    desired: int
    reason: str
    guards: tuple[Guard, ...] = ()


def _policy(**changes: object) -> ScalingPolicy:
    return dataclasses.replace(PERMISSIVE, **changes)


STALE = 120.0
ONE_WAITING = (QueuedRequest(NOW - 1.0, int(MEAN_INPUT), int(MEAN_OUTPUT)),)

CASES = [
    Case(
        "zero traffic scales in to the minimum",
        world(*ready_groups(3, 0.0, kv_usage=0.0)),
        PERMISSIVE,
        1,
        "minReplicas",
    ),
    Case("one group within its capacity stays", world(*ready_groups(1, 0.7)), PERMISSIVE, 1, "queueWork"),
    Case("one overloaded group scales out", world(*ready_groups(1, 1.5)), PERMISSIVE, 2, "queueWork"),
    Case(
        "metrics missing for one group hold the count",
        world(*ready_groups(2, 0.1), group(None, name="g-missing")),
        PERMISSIVE,
        3,
        Guard.MISSING_METRICS_HOLD_SCALE_IN,
        (Guard.MISSING_METRICS_HOLD_SCALE_IN,),
    ),
    Case(
        "metrics missing for one group: the known load still scales out",
        world(*ready_groups(2, 2.0), group(None, name="g-missing")),
        PERMISSIVE,
        5,
        "queueWork",
    ),
    Case(
        "all metrics stale hold the count",
        world(*ready_groups(3, 0.0, age=STALE)),
        PERMISSIVE,
        3,
        Guard.STALE_METRICS_HOLD_SCALE_IN,
        (Guard.STALE_METRICS_HOLD_SCALE_IN,),
    ),
    Case(
        "stale metrics with Freeze change nothing, even under load",
        world(*ready_groups(2, 2.0), group(load(0.0, age=STALE), name="g-stale")),
        _policy(staleness=MetricStaleness(60.0, StaleMetricsAction.FREEZE)),
        3,
        Guard.STALE_METRICS_FREEZE,
        (Guard.STALE_METRICS_FREEZE,),
    ),
    Case(
        "a histogram with no observations is no goodput signal",
        world(*(group(load(0.7, ttft=EMPTY_TTFT, itl=EMPTY_TTFT), name=f"g{i}") for i in range(2))),
        PERMISSIVE,
        2,
        "queueWork",
    ),
    Case(
        "goodput below its floor adds a group when requests wait beyond the queue budget",
        world(
            *(
                group(load(0.7, ttft=HALF_LATE_TTFT, queue_time=HALF_QUEUED_LONG), name=f"g{i}")
                for i in range(2)
            )
        ),
        PERMISSIVE,
        3,
        "goodput",
    ),
    Case(
        "goodput below its floor without queueing or an over-full batch adds nothing",
        world(*(group(load(0.7, ttft=HALF_LATE_TTFT), name=f"g{i}") for i in range(2))),
        PERMISSIVE,
        2,
        "queueWork",
    ),
    Case(
        "goodput from too few requests is not trusted",
        world(*(group(load(0.7, ttft=FEW_TTFT), name=f"g{i}") for i in range(2))),
        PERMISSIVE,
        2,
        "queueWork",
    ),
    Case("scale from zero on queued work", world(queue=ONE_WAITING), _policy(min_groups=0), 1, "queueWork"),
    Case("zero groups and no demand stay at zero", world(), _policy(min_groups=0), 0, "minReplicas"),
    Case(
        "groups on their way are capacity: a backlog does not stack decisions",
        world(
            *ready_groups(2, 0.9, waiting=waiting_requests_for(6.0, 2) / 2),
            group(None, "Warming"),
        ),
        PERMISSIVE,
        3,
        Guard.CAPACITY_COMING,
        (Guard.CAPACITY_COMING,),
    ),
    Case(
        "groups on their way do not hold back a rising arrival rate",
        world(*ready_groups(2, 2.4), group(None, "Warming")),
        PERMISSIVE,
        6,
        "queueWork",
    ),
    Case(
        "an unschedulable group holds scale-out",
        world(*ready_groups(2, 2.0), group(None, "Placing", unschedulable=True)),
        PERMISSIVE,
        3,
        Guard.UNSCHEDULABLE,
        (Guard.UNSCHEDULABLE,),
    ),
    Case("KV pressure scales out", world(*ready_groups(2, 0.5, kv_usage=0.95)), PERMISSIVE, 3, "kvCache"),
    Case(
        "scale-in waits until p90 queued work fits the remaining groups",
        world(*ready_groups(2, 0.05, waiting=waiting_requests_for(0.8 * BUDGET, 1) / 2)),
        PERMISSIVE,
        2,
        Guard.SCALE_IN_UNSAFE,
        (Guard.SCALE_IN_UNSAFE,),
    ),
    Case(
        "scale-in proceeds when the remaining groups keep the SLO",
        world(*ready_groups(2, 0.05, waiting=waiting_requests_for(0.3 * BUDGET, 1) / 2)),
        PERMISSIVE,
        1,
        "queueWork",
    ),
    Case(
        "a rise inside the tolerance band is no change",
        world(*ready_groups(3, 0.9)),
        PERMISSIVE,
        3,
        Guard.TOLERANCE,
        (Guard.TOLERANCE,),
    ),
    Case(
        "an at-risk slack skips the tolerance band",
        world(*ready_groups(10, 0.5, waiting=waiting_requests_for(BUDGET + 0.05, 10) / 10)),
        PERMISSIVE,
        11,
        "slack",
    ),
    Case(
        "step policies limit a large scale-out",
        world(*ready_groups(1, 8.0)),
        DEFAULT,
        5,  # 1 + max(100 %, 4 groups)
        Guard.SCALE_UP_LIMIT,
        (Guard.SCALE_UP_LIMIT,),
    ),
    Case(
        "the maximum bounds the count",
        world(*ready_groups(1, 8.0)),
        _policy(max_groups=4),
        4,
        Guard.TOO_MANY_REPLICAS,
        (Guard.TOO_MANY_REPLICAS,),
    ),
    Case(
        "the minimum lifts the count",
        world(*ready_groups(1, 0.2)),
        _policy(min_groups=2),
        2,
        "minReplicas",
    ),
    Case(
        "the warm floor keeps spare groups",
        world(*ready_groups(2, 0.2)),
        _policy(warm_groups=3),
        3,
        "warmFloor",
    ),
    Case(
        "a restart never scales in before a full scale-down window",
        world(*ready_groups(3, 0.0, kv_usage=0.0)),
        DEFAULT,
        3,
        Guard.SCALE_DOWN_STABILIZED,
        (Guard.SCALE_DOWN_STABILIZED,),
    ),
    Case(
        "draining and failed groups are not capacity",
        world(*ready_groups(1, 1.5), group(None, "Draining"), group(None, "Failed"), spec=2),
        PERMISSIVE,
        2,
        "queueWork",
    ),
    Case(
        "Frozen holds whatever the signals say",
        world(*ready_groups(1, 1.5)),
        _policy(mode=Mode.FROZEN),
        1,
        Guard.FROZEN,
        (Guard.FROZEN,),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_decide(case: Case) -> None:
    decision = decide(case.world, case.policy, DecisionState.initial(), NOW)
    assert decision.desired_groups == case.desired
    assert decision.reason == case.reason
    assert decision.guards == case.guards
    assert decision.current_groups == case.world.spec_replicas
    assert decision.policy_revision == case.policy.revision


def _decide(snapshot: ModelGroupSnapshot, policy: ScalingPolicy = PERMISSIVE) -> Decision:
    return decide(snapshot, policy, DecisionState.initial(), NOW)


def test_every_signal_is_reported_and_the_largest_wins() -> None:
    decision = _decide(world(*ready_groups(2, 0.5, kv_usage=0.95)))
    by_signal = {proposal.signal: proposal for proposal in decision.proposals}
    assert set(by_signal) == {Signal.QUEUE_WORK, Signal.SLACK, Signal.KV_CACHE, Signal.MIN_REPLICAS}
    assert by_signal[Signal.QUEUE_WORK].groups == 2  # 1.2 x 1.0 groups of work
    assert by_signal[Signal.KV_CACHE].groups == 3  # 1.9 caches of tokens over 0.85 usable each
    assert by_signal[Signal.KV_CACHE].value == pytest.approx(0.05)
    assert decision.signal is Signal.KV_CACHE


def test_scale_from_zero_is_proposed_explicitly() -> None:
    decision = _decide(world(queue=ONE_WAITING), _policy(min_groups=0))
    assert any(p.signal is Signal.SCALE_FROM_ZERO and p.groups == 1 for p in decision.proposals)
    assert decision.estimates.predicted_queue_wait_seconds == math.inf  # nothing serves it yet


def test_scale_from_zero_respects_the_maximum() -> None:
    decision = _decide(world(queue=ONE_WAITING), _policy(min_groups=0, max_groups=0))
    assert decision.desired_groups == 0
    assert Guard.TOO_MANY_REPLICAS in decision.guards


def test_advisory_computes_but_does_not_apply() -> None:
    decision = _decide(world(*ready_groups(1, 1.5)), _policy(mode=Mode.ADVISORY))
    assert decision.desired_groups == 2
    assert not decision.applies
    assert not decision.changes
    assert decision.next_state.scale_up_events == ()


def test_active_scale_out_is_remembered_for_the_step_policies() -> None:
    decision = _decide(world(*ready_groups(1, 1.5)))
    assert decision.applies and decision.changes
    assert [(event.at, event.groups) for event in decision.next_state.scale_up_events] == [(NOW, 1)]
    assert decision.next_state.recommendations[-1] == (NOW, 2)


def test_metrics_of_groups_that_are_not_ready_are_ignored() -> None:
    busy = load(5.0, waiting=500.0, kv_usage=0.99)
    decision = _decide(world(*ready_groups(1, 0.7), group(busy, "Draining"), spec=1))
    assert decision.desired_groups == 1
    assert decision.counts.fresh_metrics == 1


def test_exact_queue_slack_uses_each_requests_deadline() -> None:
    late = tuple(QueuedRequest(NOW - 1.95, int(MEAN_INPUT), int(MEAN_OUTPUT)) for _ in range(40))
    decision = _decide(world(*ready_groups(2, 0.5), queue=late))
    assert decision.estimates.low_slack_fraction == 1.0
    assert decision.estimates.earliest_slack_seconds is not None
    assert decision.estimates.earliest_slack_seconds < 0


def test_record_is_json_in_the_decision_log_shape() -> None:
    decision = _decide(
        world(group(None, "Warming"), queue=ONE_WAITING * 3, spec=1),
        _policy(min_groups=0, revision="slo-2026-07-16.3"),
    )
    record = json.loads(json.dumps(decision.to_record(), allow_nan=False))
    assert set(record) == {
        "model_group",
        "time",
        "policy_revision",
        "mode",
        "slo_ms",
        "inputs",
        "estimates",
        "proposals",
        "result",
        "reason",
        "capacity",
    }
    assert record["capacity"] is None  # the snapshot said nothing of where its capacity came from
    assert record["policy_revision"] == "slo-2026-07-16.3"
    assert record["slo_ms"] == {"class": "interactive", "ttft": 2000.0, "itl": 80.0}
    assert record["inputs"]["coming_groups"] == 1
    assert record["estimates"]["predicted_queue_wait_seconds"] is None  # work waits, nothing serves it
    assert record["result"]["desired_groups"] == decision.desired_groups
    assert {proposal["signal"] for proposal in record["proposals"]} >= {"queueWork", "minReplicas"}


def test_a_stale_gateway_queue_holds_scale_in() -> None:
    snapshot = dataclasses.replace(
        world(*ready_groups(3, 0.0, kv_usage=0.0)),
        queue=RequestQueue(ONE_WAITING, age_seconds=STALE),
    )
    decision = _decide(snapshot)
    assert decision.desired_groups == 3
    assert decision.guards == (Guard.STALE_METRICS_HOLD_SCALE_IN,)


def test_requests_already_lost_do_not_hide_the_wait_of_new_arrivals() -> None:
    """Every queued request is past saving, but a request arriving now must still get its first token
    in time: the slack signal sizes the pool for it."""
    lost = tuple(QueuedRequest(NOW - 5.0, int(MEAN_INPUT), int(MEAN_OUTPUT)) for _ in range(120))
    decision = _decide(world(*ready_groups(1, 0.2), queue=lost))
    slack = next(proposal for proposal in decision.proposals if proposal.signal is Signal.SLACK)
    waiting_work = decision.estimates.waiting_work_seconds
    assert waiting_work is not None
    expected = waiting_work / (decision.estimates.capacity_per_group * BUDGET)
    assert slack.groups == math.ceil(expected)
    assert decision.desired_groups == slack.groups


@pytest.mark.parametrize(
    "broken",
    [
        dataclasses.replace(load(0.0), prompt_tokens_per_second=math.nan),
        dataclasses.replace(load(0.0), kv_usage_fraction=math.inf),
        dataclasses.replace(load(0.0), prefix_hits=math.nan, prefix_queries=1.0),
    ],
    ids=["NaN rate", "infinite gauge", "NaN hit ratio"],
)
def test_non_finite_metrics_are_missing_not_numbers(broken: GroupMetrics) -> None:
    decision = _decide(world(*ready_groups(2, 0.0, kv_usage=0.0), group(broken, name="g-broken")))
    assert decision.counts.missing_metrics == 1
    assert decision.desired_groups == 3
    assert decision.guards == (Guard.MISSING_METRICS_HOLD_SCALE_IN,)


def test_non_finite_mean_lengths_fall_back_to_the_profile_mix() -> None:
    odd = dataclasses.replace(load(0.5), prompt_tokens_sum=math.inf, generation_tokens_sum=math.nan)
    decision = _decide(world(group(odd)))
    assert decision.estimates.mean_input_tokens == PROFILE.reference_input_tokens
    assert math.isfinite(decision.estimates.arrival_work_rate or math.nan)


def test_a_negative_count_is_rejected() -> None:
    with pytest.raises(ValueError, match="spec_replicas"):
        world(spec=-1)


# --- Backlog a new group can still serve ------------------------------------------------------------


def backlogged(utilisation: float, wait_seconds: float, ready_seconds: float | None) -> ModelGroupSnapshot:
    """Three ready groups at `utilisation` x C each, with a backlog that makes an arrival wait
    `wait_seconds`; a group asked for now is ready after `ready_seconds` (None: unknown)."""
    per_group = waiting_requests_for(wait_seconds, 3) / 3
    snapshot = world(*ready_groups(3, utilisation, waiting=per_group))
    return dataclasses.replace(snapshot, group_ready_seconds=ready_seconds)


@dataclass(frozen=True)
class BacklogCase:
    name: str
    utilisation: float
    ready_seconds: float | None
    scales_out: bool


BACKLOG_CASES = [
    # Spare capacity drains 8 s of backlog in about 20 s: gone long before a group ready in 120 s.
    BacklogCase("a burst's backlog the groups drain before a new one is ready", 0.6, 120.0, False),
    BacklogCase("the same backlog, ready time unknown", 0.6, None, True),
    BacklogCase("the same backlog, groups ready in seconds", 0.6, 2.0, True),
    # Arrivals above capacity: the backlog grows until new groups come, so it asks for them.
    BacklogCase("a backlog that grows", 1.3, 120.0, True),
]


@pytest.mark.parametrize("case", BACKLOG_CASES, ids=[case.name for case in BACKLOG_CASES])
def test_only_the_backlog_left_when_a_new_group_is_ready_asks_for_groups(case: BacklogCase) -> None:
    decision = decide(
        backlogged(case.utilisation, 8.0, case.ready_seconds), PERMISSIVE, DecisionState.initial(), 0.0
    )
    assert (decision.desired_groups > 3) is case.scales_out, decision.reason
    left = decision.estimates.waiting_work_at_ready_seconds
    waiting = decision.estimates.waiting_work_seconds
    assert left is not None and waiting is not None
    if case.scales_out:
        assert left > 0
    else:
        assert left == 0.0 < waiting
        queue_work = next(p for p in decision.proposals if p.signal is Signal.QUEUE_WORK)
        assert f"R={case.ready_seconds:g}s" in queue_work.detail


def test_the_backlog_left_when_ready_shrinks_with_spare_capacity_and_grows_with_excess_arrivals() -> None:
    utilisations = (0.2, 0.5, 0.8, 0.99, 1.2, 1.5)
    lefts = [
        decide(backlogged(u, 8.0, 60.0), PERMISSIVE, DecisionState.initial(), 0.0).estimates
        for u in utilisations
    ]
    for utilisation, estimates in zip(utilisations, lefts, strict=True):
        left, waiting = estimates.waiting_work_at_ready_seconds, estimates.waiting_work_seconds
        assert left is not None and waiting is not None
        if utilisation < 1.0:  # spare capacity drains some of it before a new group is ready
            assert 0.0 <= left <= waiting
        else:  # arrivals beyond capacity add their excess until then
            assert left > waiting
    left = [estimates.waiting_work_at_ready_seconds for estimates in lefts]
    assert left == sorted(left)


def test_the_measured_ready_times_replace_the_prior_and_the_record_says_which_was_used() -> None:
    """Declared: groups ready in 2 s, so the backlog asks for a group. Five groups measured took
    100-120 s: the look ahead uses their distribution, the spare capacity drains the backlog first,
    and the record says the ready time was measured."""
    snapshot = backlogged(0.6, 8.0, None)
    answers = {}
    for name, measured in (("prior", []), ("measured", [100.0, 105.0, 110.0, 115.0, 120.0])):
        estimate = estimate_ready_time(2.0, measured)
        assert estimate is not None
        looked_ahead = dataclasses.replace(
            snapshot, group_ready_seconds=estimate.seconds, group_ready_source=estimate.source
        )
        answers[name] = decide(looked_ahead, PERMISSIVE, DecisionState.initial(), 0.0)
    assert answers["prior"].desired_groups > 3
    assert answers["measured"].desired_groups == 3
    record = answers["measured"].to_record()["estimates"]
    assert (record["group_ready_seconds"], record["group_ready_source"]) == (120.0, "measured")  # type: ignore[index]
    assert answers["prior"].to_record()["estimates"]["group_ready_source"] == "prior"  # type: ignore[index]
