"""The goodput signal: SLO misses judged as the SLO defines them, scale-out only for load-driven
misses, and each scale-out a trial that must show an improvement before the next.

The world is test_autoscale_world's: an 8B group on an H100 with a 2 s TTFT and 80 ms ITL target
(percentile 0.99); the default goodput signal has an attainment floor of 0.95.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_autoscale_world import (
    ITL_BUCKETS,
    PERMISSIVE,
    PROFILE,
    QUEUE_BUCKETS,
    SLO_BATCH,
    TTFT_BUCKETS,
    group,
    load,
    world,
)

from goodput.api.reasons import Guard
from goodput.controllers.autoscale import decide
from goodput.controllers.autoscale.model import (
    Decision,
    DecisionState,
    GoodputSignal,
    GoodputTrial,
    GroupMetrics,
    ModelGroupSnapshot,
    ScalingPolicy,
    Signal,
    Signals,
    SloCheck,
    SloTargets,
)
from goodput.estimators.attainment import Histogram

NOW = 5000.0
BUDGET = 2.0 - PROFILE.prefill_seconds_p90 - PROFILE.first_decode_seconds
REQUESTS = 100.0


def shares(bounds: tuple[float, ...], fast: float, slow: float, slow_share: float) -> Histogram:
    """REQUESTS observations: a `slow_share` of them at `slow`, the rest at `fast`."""
    slow_count = round(REQUESTS * slow_share)
    return Histogram.from_observations(bounds, [fast] * (int(REQUESTS) - slow_count) + [slow] * slow_count)


HALF_LATE_TTFT = shares(TTFT_BUCKETS, 1.0, 3.0, 0.5)  # half the first tokens after the 2 s target
ON_TIME_TTFT = shares(TTFT_BUCKETS, 0.5, 0.5, 0.0)
LONG_QUEUES = shares(QUEUE_BUCKETS, 0.3, 5.0, 0.5)  # half the requests waited beyond the budget
SHORT_QUEUES = shares(QUEUE_BUCKETS, 0.3, 0.3, 0.0)
STALLED_GAPS = shares(ITL_BUCKETS, 0.02, 0.25, 0.04)  # 4 % of token gaps are prefill stalls
FEW_STALLS = shares(ITL_BUCKETS, 0.02, 0.25, 0.03)  # 97 %: above the 0.95 floor, under the p99
SMOOTH_GAPS = shares(ITL_BUCKETS, 0.02, 0.02, 0.0)
SLOW_TPOT = shares(ITL_BUCKETS, 0.03, 0.2, 0.1)  # 10 % of requests averaged over 80 ms per token
FAST_TPOT = shares(ITL_BUCKETS, 0.03, 0.03, 0.0)
FEW_TTFT = Histogram.from_observations(TTFT_BUCKETS, [3.0] * 5)
FEW_QUEUES = Histogram.from_observations(QUEUE_BUCKETS, [5.0] * 5)
OVER_FULL = 1.2 * SLO_BATCH  # more sequences per group than the ITL budget allows


def pool(metrics: GroupMetrics, count: int = 2, *, running: float | None = None) -> ModelGroupSnapshot:
    """`count` ready groups reporting the same window."""
    if running is not None:
        metrics = dataclasses.replace(metrics, running_requests=running)
    return world(*(group(metrics, name=f"g{index}") for index in range(count)))


def _policy(*, percentile: float = 0.99, max_fruitless_steps: int = 1) -> ScalingPolicy:
    return dataclasses.replace(
        PERMISSIVE,
        classes=(SloTargets("interactive", 2.0, 0.08, 0.99, percentile),),
        signals=Signals(goodput=GoodputSignal(max_fruitless_steps=max_fruitless_steps)),
    )


POLICY = _policy()


@dataclass(frozen=True)
class Case:
    name: str
    world: ModelGroupSnapshot
    desired: int
    reason: str
    policy: ScalingPolicy = POLICY
    trial: GoodputTrial | None = None
    guards: tuple[Guard, ...] = ()


def trial(
    *,
    groups: int = 2,
    within: float = 0.5,
    settled_at: float | None = NOW - 300.0,
    judged: bool = False,
    fruitless: int = 0,
) -> GoodputTrial:
    """A goodput scale-out to `groups`, taken when the TTFT share was `within`."""
    return GoodputTrial(
        groups=groups,
        baseline=SloCheck("ttft", within, 0.99, REQUESTS),
        acted_at=NOW - 400.0,
        settled_at=settled_at,
        judged=judged,
        fruitless=fruitless,
    )


# The 2 s TTFT target lies inside vLLM's (1 s, 2.5 s] bucket: 4 % of first tokens at 2.2 s met it, yet
# interpolating inside the bucket reads 0.987 within (< 0.99); 4 % at 3 s are shown late.
INSIDE_TARGET_BUCKET_TTFT = shares(TTFT_BUCKETS, 1.0, 2.2, 0.04)
PAST_TARGET_BUCKET_TTFT = shares(TTFT_BUCKETS, 1.0, 3.0, 0.04)
QUEUED_LATE = load(0.7, ttft=HALF_LATE_TTFT, queue_time=LONG_QUEUES, finished=REQUESTS)
PROMPT_LATE = load(0.7, ttft=HALF_LATE_TTFT, queue_time=SHORT_QUEUES, finished=REQUESTS)
STALLED = load(0.7, itl=STALLED_GAPS, finished=REQUESTS)

CASES = [
    Case("TTFT misses of requests queued beyond the budget add a group", pool(QUEUED_LATE), 3, "goodput"),
    Case(
        "TTFT misses without queueing at a batch within the ITL budget add nothing",
        pool(PROMPT_LATE),
        2,
        "queueWork",
    ),
    Case(
        "queue waits too few to break the bar or explain the shortfall add nothing",
        pool(
            load(
                0.7,
                ttft=HALF_LATE_TTFT,
                queue_time=Histogram.from_observations(QUEUE_BUCKETS, [0.3] * 995 + [5.0] * 5),
                finished=REQUESTS,
            )
        ),
        2,
        "queueWork",
    ),
    Case(
        "first tokens inside the target's bucket are no shown miss: no group",
        pool(load(0.7, ttft=INSIDE_TARGET_BUCKET_TTFT, queue_time=LONG_QUEUES, finished=REQUESTS)),
        2,
        "queueWork",
    ),
    Case(
        "the same share past the target's bucket is a miss and adds a group",
        pool(load(0.7, ttft=PAST_TARGET_BUCKET_TTFT, queue_time=LONG_QUEUES, finished=REQUESTS)),
        3,
        "goodput",
    ),
    Case(
        "prefill stalls in the token gaps at a batch within the ITL budget add nothing",
        pool(STALLED),
        2,
        "queueWork",
    ),
    Case(
        "token gaps beyond the ITL target with more sequences than its budget allows add a group",
        pool(STALLED, running=OVER_FULL),
        3,
        "goodput",
    ),
    Case(
        "a gap share above the floor but under the class percentile is a miss",
        pool(load(0.7, itl=FEW_STALLS, finished=REQUESTS), running=OVER_FULL),
        3,
        "goodput",
    ),
    Case(
        "the same gap share meets a class percentile of 0.95",
        pool(load(0.7, itl=FEW_STALLS, finished=REQUESTS), running=OVER_FULL),
        2,
        "queueWork",
        policy=_policy(percentile=0.95),
    ),
    Case(
        "requests whose TPOT misses the ITL target, at an over-full batch, add a group",
        pool(load(0.7, tpot=SLOW_TPOT, itl=SMOOTH_GAPS, finished=REQUESTS), running=OVER_FULL),
        3,
        "goodput",
    ),
    Case(
        "an over-full batch alone is no miss",
        pool(load(0.7, tpot=FAST_TPOT, itl=SMOOTH_GAPS, finished=REQUESTS), running=OVER_FULL),
        2,
        "queueWork",
    ),
    Case(
        "too few requests in the window are not measured",
        pool(load(0.7, ttft=FEW_TTFT, queue_time=FEW_QUEUES, finished=5)),
        2,
        "queueWork",
    ),
    Case(
        "the last goodput scale-out has not served a full window yet",
        pool(QUEUED_LATE),
        2,
        Guard.GOODPUT_AWAITING_EVIDENCE,
        trial=trial(settled_at=NOW - 30.0),
        guards=(Guard.GOODPUT_AWAITING_EVIDENCE,),
    ),
    Case(
        "the last goodput scale-out's groups are not all ready yet",
        world(*(group(QUEUED_LATE, name=f"g{i}") for i in range(2)), group(None, "Warming")),
        3,
        Guard.GOODPUT_AWAITING_EVIDENCE,
        trial=trial(groups=3, settled_at=None),
        guards=(Guard.GOODPUT_AWAITING_EVIDENCE,),
    ),
    Case(
        "a scale-out that raised no share beyond its noise is fruitless: no more groups",
        pool(QUEUED_LATE),
        2,
        Guard.GOODPUT_NOT_IMPROVING,
        trial=trial(within=0.48),
        guards=(Guard.GOODPUT_NOT_IMPROVING,),
    ),
    Case(
        "a judged fruitless scale-out keeps holding while the misses last",
        pool(QUEUED_LATE),
        2,
        Guard.GOODPUT_NOT_IMPROVING,
        trial=trial(judged=True, fruitless=1),
        guards=(Guard.GOODPUT_NOT_IMPROVING,),
    ),
    Case(
        "a scale-out that raised the share beyond its noise lets the signal add again",
        pool(QUEUED_LATE),
        3,
        "goodput",
        trial=trial(within=0.3),
    ),
    Case(
        "a second fruitless scale-out is allowed when the bound is two",
        pool(QUEUED_LATE),
        3,
        "goodput",
        policy=_policy(max_fruitless_steps=2),
        trial=trial(judged=True, fruitless=1),
    ),
    Case(
        "a fruitless trial at a lower count says nothing about this one",
        pool(QUEUED_LATE),
        3,
        "goodput",
        trial=trial(groups=1, judged=True, fruitless=1),
    ),
    Case(
        "after a fruitless trial, a lower count does not climb back to it",
        pool(QUEUED_LATE, count=1),
        1,
        Guard.GOODPUT_NOT_IMPROVING,
        trial=trial(judged=True, fruitless=1),
        guards=(Guard.GOODPUT_NOT_IMPROVING,),
    ),
    Case(
        "a trial waiting for its evidence holds its count against scale-in",
        pool(load(0.1)),
        2,
        "goodput",
        trial=trial(settled_at=NOW - 30.0),
    ),
]


def _decide(case: Case) -> Decision:
    state = DecisionState(started=True, goodput_trial=case.trial)
    return decide(case.world, case.policy, state, NOW)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_goodput_signal(case: Case) -> None:
    decision = _decide(case)
    assert decision.desired_groups == case.desired
    assert decision.reason == case.reason
    assert decision.guards == case.guards


@dataclass(frozen=True)
class TrialCase:
    name: str
    world: ModelGroupSnapshot
    before: GoodputTrial | None
    after: GoodputTrial | None
    policy: ScalingPolicy = POLICY


TRIAL_CASES = [
    TrialCase(
        "an applied goodput scale-out starts a trial against its worst check",
        pool(QUEUED_LATE),
        None,
        GoodputTrial(3, SloCheck("ttft", 0.5, 0.99, 2 * REQUESTS), acted_at=NOW),
    ),
    TrialCase(
        "a trial settles on the first tick with all its groups ready",
        pool(QUEUED_LATE),
        trial(settled_at=None),
        trial(settled_at=NOW),
    ),
    TrialCase(
        "a trial with a group still warming has not settled",
        world(group(QUEUED_LATE, name="g0"), group(None, "Warming")),
        trial(settled_at=None),
        trial(settled_at=None),
    ),
    TrialCase(
        "a fruitless trial is judged once and counted",
        pool(QUEUED_LATE),
        trial(within=0.48),
        trial(within=0.48, judged=True, fruitless=1),
    ),
    TrialCase(
        "a fruitless second trial adds to the count",
        pool(QUEUED_LATE),
        trial(within=0.48, fruitless=1),
        trial(within=0.48, judged=True, fruitless=2),
        _policy(max_fruitless_steps=2),
    ),
    TrialCase(
        "below the bound a fruitless trial is followed at once by the next, its count carried",
        pool(QUEUED_LATE),
        trial(within=0.48, fruitless=1),
        GoodputTrial(3, SloCheck("ttft", 0.5, 0.99, 2 * REQUESTS), acted_at=NOW, fruitless=2),
        _policy(max_fruitless_steps=3),
    ),
    TrialCase(
        "a met SLO ends a judged trial",
        pool(load(0.7, ttft=ON_TIME_TTFT, queue_time=SHORT_QUEUES, finished=REQUESTS)),
        trial(judged=True, fruitless=1),
        None,
    ),
    TrialCase(
        "a met SLO ends a trial before it is judged",
        pool(load(0.7, ttft=ON_TIME_TTFT, queue_time=SHORT_QUEUES, finished=REQUESTS)),
        trial(),
        None,
    ),
    TrialCase(
        "a count raised above a judged trial ends it",
        pool(load(0.7), count=4),
        trial(judged=True, fruitless=1),
        None,
    ),
    TrialCase(
        "a judged trial holds for the lower counts while the misses last",
        pool(QUEUED_LATE, count=1),
        trial(judged=True, fruitless=1),
        trial(judged=True, fruitless=1),
    ),
    TrialCase(
        "a count moved while the trial waits confounds it",
        pool(load(0.7), count=3),
        trial(),
        None,
    ),
    TrialCase(
        "a trial whose group cannot be placed is abandoned",
        world(group(load(0.7), name="g0"), group(None, "Placing", unschedulable=True)),
        trial(settled_at=None),
        None,
    ),
]


@pytest.mark.parametrize("case", TRIAL_CASES, ids=[case.name for case in TRIAL_CASES])
def test_goodput_trial_state(case: TrialCase) -> None:
    decision = decide(case.world, case.policy, DecisionState(started=True, goodput_trial=case.before), NOW)
    assert decision.next_state.goodput_trial == case.after


def test_an_advisory_goodput_scale_out_starts_no_trial() -> None:
    from goodput.controllers.autoscale.model import Mode

    decision = decide(
        pool(QUEUED_LATE), dataclasses.replace(POLICY, mode=Mode.ADVISORY), DecisionState(), NOW
    )
    assert decision.desired_groups == 3 and not decision.applies
    assert decision.next_state.goodput_trial is None


def test_the_decision_record_carries_the_checks_and_the_load_evidence() -> None:
    estimates = decide(pool(STALLED, running=OVER_FULL), POLICY, DecisionState(), NOW).to_record()[
        "estimates"
    ]
    assert isinstance(estimates, dict)
    # the 80 ms ITL target lies inside the (75 ms, 100 ms] bucket: gaps count as late past 100 ms
    assert estimates["slo_checks"] == [
        {"name": "itl_tail", "within": 0.96, "required": 0.99, "observations": 200.0, "read_at_seconds": 0.1}
    ]
    assert estimates["load_driven"] is True
    assert estimates["running_per_group"] == pytest.approx(OVER_FULL, rel=1e-5)
    assert estimates["itl_tail_seconds"] == pytest.approx(0.275)  # 0.99 of gaps: inside (0.2, 0.3]


def test_a_scale_out_on_misses_past_the_target_bucket_says_where_they_were_counted() -> None:
    world_past = pool(load(0.7, ttft=PAST_TARGET_BUCKET_TTFT, queue_time=LONG_QUEUES, finished=REQUESTS))
    decision = decide(world_past, POLICY, DecisionState(), NOW)
    goodput = next(p for p in decision.proposals if p.signal is Signal.GOODPUT)
    assert goodput.detail.startswith("ttft within target (misses counted past 2.5s, its bucket) 0.96 < 0.99")
    assert decision.next_state.goodput_trial is not None
    assert decision.next_state.goodput_trial.baseline.read_at_seconds is None


# --- Over many ticks -------------------------------------------------------------------------------

INTERVAL = 15.0


def _drive(metrics_for: object, start: int, ticks: int, policy: ScalingPolicy) -> list[Decision]:
    """Apply every decision; new groups are ready at once and report `metrics_for(count)`."""
    assert callable(metrics_for)
    state = DecisionState()
    current = start
    decisions = []
    for tick in range(ticks):
        snapshot = world(*(group(metrics_for(current), name=f"g{index}") for index in range(current)))
        decision = decide(snapshot, policy, state, NOW + tick * INTERVAL)
        decisions.append(decision)
        state = decision.next_state
        current = decision.desired_groups
    return decisions


# Every group over-full and stalled, whatever the count: misses more groups cannot remove. At u = 0.8
# per group the queueWork signal is inside its tolerance band at any count, so only goodput moves it.
STUCK = dataclasses.replace(load(0.8, itl=STALLED_GAPS, finished=REQUESTS), running_requests=OVER_FULL)


def test_when_more_groups_do_not_help_one_trial_then_the_count_holds() -> None:
    """The signal adds one group, holds it while waiting for its evidence, then stops."""
    decisions = _drive(lambda count: STUCK, 2, 60, POLICY)
    counts = [decision.desired_groups for decision in decisions]
    assert max(counts) == 3
    assert counts[-1] == 3
    assert Guard.GOODPUT_AWAITING_EVIDENCE in decisions[1].guards
    assert decisions[-1].guards == (Guard.GOODPUT_NOT_IMPROVING,)


def test_when_more_groups_help_the_signal_stops_at_the_count_that_meets_the_slo() -> None:
    """The load spreads over the groups: two are over-full and stall, three are not."""

    def metrics_for(count: int) -> GroupMetrics:
        running = 2 * OVER_FULL / count
        gaps = STALLED_GAPS if running >= SLO_BATCH else SMOOTH_GAPS
        return dataclasses.replace(load(0.7, itl=gaps, finished=REQUESTS), running_requests=running)

    decisions = _drive(metrics_for, 2, 40, POLICY)
    assert [decision.desired_groups for decision in decisions][-1] == 3
    assert decisions[-1].next_state.goodput_trial is None
    assert all(Guard.GOODPUT_NOT_IMPROVING not in decision.guards for decision in decisions)


@settings(max_examples=40, deadline=None)
@given(
    start=st.integers(1, 6),
    bound=st.integers(1, 3),
    stalled_share=st.floats(0.02, 0.5),
    over_batch=st.floats(1.0, 3.0),
)
def test_fruitless_scale_outs_are_bounded(
    start: int, bound: int, stalled_share: float, over_batch: float
) -> None:
    """Whatever the misses, when no count improves them the goodput signal adds at most `bound`
    groups: one per trial, and every trial fruitless."""
    gaps = shares(ITL_BUCKETS, 0.02, 0.25, stalled_share)
    metrics = dataclasses.replace(
        load(0.8, itl=gaps, finished=REQUESTS), running_requests=over_batch * SLO_BATCH
    )
    decisions = _drive(lambda count: metrics, start, 30 * (bound + 1), _policy(max_fruitless_steps=bound))
    assert max(decision.desired_groups for decision in decisions) == start + bound
    assert decisions[-1].desired_groups == start + bound
    assert decisions[-1].guards == (Guard.GOODPUT_NOT_IMPROVING,)


@settings(max_examples=40, deadline=None)
@given(start=st.integers(2, 8), data=st.data())
def test_after_a_fruitless_trial_other_signals_may_scale_in_and_goodput_never_climbs_back(
    start: int, data: st.DataObject
) -> None:
    """Other signals ask for fewer groups than goodput's trial reached: once it is judged they scale
    in, and the goodput signal, still seeing misses, does not add the group back."""
    wanted = data.draw(st.integers(1, start - 1))
    utilisation = wanted / (1.2 * start)  # queueWork asks for about `wanted` groups at `start`

    def metrics_for(count: int) -> GroupMetrics:
        per_group = utilisation * start / count  # the same pool load spread over the groups
        return dataclasses.replace(
            load(per_group, itl=STALLED_GAPS, finished=REQUESTS), running_requests=OVER_FULL
        )

    decisions = _drive(metrics_for, start, 80, POLICY)
    counts = [decision.desired_groups for decision in decisions]
    assert max(counts) <= start + 1
    peak = counts.index(max(counts))
    assert counts[peak:] == sorted(counts[peak:], reverse=True)  # after the peak it only goes down
