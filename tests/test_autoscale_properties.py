"""Invariants of `decide`, checked on generated worlds, policies and histories (hypothesis).

- the result is always within [min, max] (Frozen holds the current count);
- stale or missing metrics never lower the count;
- more load never lowers the result;
- a steady load with +-10 % noise makes no change over 1,000 consecutive ticks;
- a slack that turns negative raises the count within one tick;
- stabilisation behaves as the HPA documents it: scale-down acts on the highest recommendation of
  its window, so a dip shorter than the window never scales in.

Generated groups may report TTFT, ITL, TPOT and queue-time histograms, and generated histories may
hold a goodput trial in any state, so the goodput signal is inside every invariant.
"""

from __future__ import annotations

import dataclasses
import random

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_autoscale_world import (
    CAPACITY,
    DEFAULT,
    ITL_BUCKETS,
    MEAN_INPUT,
    MEAN_OUTPUT,
    PROFILE,
    QUEUE_BUCKETS,
    TTFT_BUCKETS,
    group,
    load,
    waiting_requests_for,
    world,
)

from goodput.api.reasons import Guard, Reason, Signal, vocabulary
from goodput.controllers.autoscale import decide
from goodput.controllers.autoscale.model import (
    DecisionState,
    GoodputTrial,
    GroupMetrics,
    GroupObservation,
    Mode,
    ModelGroupSnapshot,
    Recommendation,
    ScaleEvent,
    ScalingPolicy,
    ScalingRules,
    SelectPolicy,
    SloCheck,
    StepPolicy,
    StepPolicyType,
)
from goodput.estimators.attainment import Histogram
from goodput.estimators.queueing import QueuedRequest

NOW = 10_000.0
BUDGET = 2.0 - PROFILE.prefill_seconds_p90 - PROFILE.first_decode_seconds

utilisations = st.floats(0.0, 4.0)
waitings = st.floats(0.0, 300.0)
kv_usages = st.floats(0.0, 1.0)


def _histograms(bounds: tuple[float, ...], target: float) -> st.SearchStrategy[Histogram | None]:
    """None, or a window of 0-200 observations some share of which is beyond `target`."""
    window = st.tuples(st.integers(0, 200), st.floats(0.0, 1.0)).map(
        lambda drawn: Histogram.from_observations(
            bounds,
            [target * 0.5] * (drawn[0] - round(drawn[0] * drawn[1]))
            + [target * 3] * round(drawn[0] * drawn[1]),
        )
    )
    return st.none() | window


@st.composite
def metrics(draw: st.DrawFn, fresh: bool = True) -> GroupMetrics:
    age = draw(st.floats(0.0, 59.0)) if fresh else draw(st.floats(61.0, 3600.0))
    observed = load(draw(utilisations), waiting=draw(waitings), kv_usage=draw(kv_usages), age=age)
    if not draw(st.booleans()):
        return observed
    return dataclasses.replace(
        observed,
        ttft=draw(_histograms(TTFT_BUCKETS, 2.0)),
        itl=draw(_histograms(ITL_BUCKETS, 0.08)),
        tpot=draw(_histograms(ITL_BUCKETS, 0.08)),
        queue_time=draw(_histograms(QUEUE_BUCKETS, BUDGET)),
        finished_requests=draw(st.floats(0.0, 200.0)),
    )


@st.composite
def groups(draw: st.DrawFn, unknown: str = "any") -> list[GroupObservation]:
    """Ready groups (fresh, stale or missing metrics) plus groups on their way, draining or failed.

    unknown: "any", "none" (every ready group fresh) or "some" (at least one stale or missing).
    """
    observed: list[GroupObservation] = []
    for index in range(draw(st.integers(0, 6))):
        kind = "fresh" if unknown == "none" else draw(st.sampled_from(["fresh", "fresh", "stale", "missing"]))
        if kind == "missing":
            observed.append(group(None, name=f"g{index}"))
        else:
            observed.append(group(draw(metrics(fresh=kind == "fresh")), name=f"g{index}"))
    if unknown == "some":
        kind = draw(st.sampled_from(["stale", "missing"]))
        observed.append(group(None if kind == "missing" else draw(metrics(fresh=False)), name="g-unknown"))
    for index in range(draw(st.integers(0, 2))):
        state = draw(st.sampled_from(["Placing", "Provisioning", "Warming"]))
        unschedulable = state == "Placing" and draw(st.booleans())
        observed.append(group(None, state, unschedulable=unschedulable, name=f"c{index}"))
    for index in range(draw(st.integers(0, 1))):
        observed.append(group(None, draw(st.sampled_from(["Draining", "Failed"])), name=f"x{index}"))
    return observed


@st.composite
def step_rules(draw: st.DrawFn, max_window: float = 600.0) -> ScalingRules:
    policies = tuple(
        StepPolicy(
            draw(st.sampled_from(list(StepPolicyType))), draw(st.integers(1, 200)), draw(st.floats(1, 600))
        )
        for _ in range(draw(st.integers(1, 3)))
    )
    return ScalingRules(
        tolerance=draw(st.sampled_from([0.0, 0.05, 0.1, 0.3])),
        stabilization_window_seconds=draw(st.sampled_from([0.0, 60.0, max_window])),
        policies=policies,
        select_policy=draw(st.sampled_from(list(SelectPolicy))),
    )


@st.composite
def policies(draw: st.DrawFn, modes: tuple[Mode, ...] = (Mode.ACTIVE, Mode.ADVISORY)) -> ScalingPolicy:
    min_groups = draw(st.integers(0, 6))
    return ScalingPolicy(
        min_groups=min_groups,
        max_groups=draw(st.integers(min_groups, 12)),
        warm_groups=draw(st.integers(0, 4)),
        mode=draw(st.sampled_from(modes)),
        scale_up=draw(step_rules()),
        scale_down=draw(step_rules()),
    )


trials = st.builds(
    GoodputTrial,
    groups=st.integers(0, 15),
    baseline=st.builds(
        SloCheck,
        st.sampled_from(["ttft", "tpot", "itl_tail"]),
        st.floats(0.0, 1.0),
        st.floats(0.5, 1.0),
        st.floats(0.0, 1000.0),
    ),
    acted_at=st.floats(NOW - 900, NOW - 1),
    settled_at=st.none() | st.floats(NOW - 900, NOW - 1),
    judged=st.booleans(),
    fruitless=st.integers(0, 3),
)


@st.composite
def histories(draw: st.DrawFn) -> DecisionState:
    recommendation = st.builds(Recommendation, st.floats(NOW - 900, NOW - 1), st.integers(0, 15))
    event = st.builds(ScaleEvent, st.floats(NOW - 900, NOW - 1), st.integers(1, 5))
    return DecisionState(
        recommendations=tuple(draw(st.lists(recommendation, max_size=8))),
        scale_up_events=tuple(draw(st.lists(event, max_size=3))),
        scale_down_events=tuple(draw(st.lists(event, max_size=3))),
        started=draw(st.booleans()),
        goodput_trial=draw(st.none() | trials),
    )


def _snapshot(observed: list[GroupObservation], spec: int) -> ModelGroupSnapshot:
    return world(*observed, spec=spec)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(observed=groups(), spec=st.integers(0, 15), policy=policies(), state=histories())
def test_result_is_always_within_bounds(
    observed: list[GroupObservation], spec: int, policy: ScalingPolicy, state: DecisionState
) -> None:
    decision = decide(_snapshot(observed, spec), policy, state, NOW)
    assert policy.min_groups <= decision.desired_groups <= policy.max_groups


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(observed=groups(unknown="some"), spec=st.integers(0, 15), policy=policies(), state=histories())
def test_every_reason_a_decision_gives_is_a_word_of_the_vocabulary(
    observed: list[GroupObservation], spec: int, policy: ScalingPolicy, state: DecisionState
) -> None:
    """Decision records, Events and the ScalingLimited condition show these strings: they must be
    the words of api.reasons, not words made up where the decision is taken."""
    decision = decide(_snapshot(observed, spec), policy, state, NOW)
    words = {*vocabulary(Reason).values(), *vocabulary(Guard).values(), *vocabulary(Signal).values()}
    assert decision.reason in words
    assert decision.signal in words
    assert set(decision.guards) <= set(vocabulary(Guard).values())


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(observed=groups(), spec=st.integers(0, 15), policy=policies(modes=(Mode.FROZEN,)), state=histories())
def test_frozen_holds_the_current_count(
    observed: list[GroupObservation], spec: int, policy: ScalingPolicy, state: DecisionState
) -> None:
    decision = decide(_snapshot(observed, spec), policy, state, NOW)
    assert decision.desired_groups == spec
    assert not decision.applies


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(observed=groups(unknown="some"), policy=policies(), state=histories(), data=st.data())
def test_stale_or_missing_metrics_never_lower_the_count(
    observed: list[GroupObservation], policy: ScalingPolicy, state: DecisionState, data: st.DataObject
) -> None:
    spec = data.draw(st.integers(policy.min_groups, policy.max_groups))
    decision = decide(_snapshot(observed, spec), policy, state, NOW)
    assert decision.desired_groups >= spec


def _heavier(metrics: GroupMetrics, factor: float) -> GroupMetrics:
    return dataclasses.replace(
        metrics,
        waiting_requests=metrics.waiting_requests * factor,
        running_requests=metrics.running_requests * factor,
        prompt_tokens_per_second=metrics.prompt_tokens_per_second * factor,
        generation_tokens_per_second=metrics.generation_tokens_per_second * factor,
        kv_usage_fraction=min(1.0, metrics.kv_usage_fraction * factor),
    )


@st.composite
def queues(draw: st.DrawFn) -> tuple[QueuedRequest, ...] | None:
    if not draw(st.booleans()):
        return None
    request = st.builds(
        QueuedRequest,
        arrival_time=st.floats(NOW - 5, NOW),
        input_tokens=st.integers(1, 8000),
        expected_output_tokens=st.integers(1, 2000),
        running=st.booleans(),
    )
    return tuple(draw(st.lists(request, max_size=30)))


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    observed=groups(),
    spec=st.integers(0, 15),
    setup=st.tuples(policies(), histories()),
    queue=queues(),
    factor=st.floats(1.0, 5.0),
)
def test_more_load_never_lowers_the_result(
    observed: list[GroupObservation],
    spec: int,
    setup: tuple[ScalingPolicy, DecisionState],
    queue: tuple[QueuedRequest, ...] | None,
    factor: float,
) -> None:
    """More work arriving, waiting, running or holding KV, or longer predicted outputs in the queue."""
    heavier_groups = [
        observation
        if observation.metrics is None
        else dataclasses.replace(observation, metrics=_heavier(observation.metrics, factor))
        for observation in observed
    ]
    heavier_queue = (
        None
        if queue is None
        else tuple(
            dataclasses.replace(
                request, expected_output_tokens=round(request.expected_output_tokens * factor)
            )
            for request in queue
        )
    )
    policy, state = setup
    light = decide(world(*observed, spec=spec, queue=queue), policy, state, NOW)
    heavy = decide(world(*heavier_groups, spec=spec, queue=heavier_queue), policy, state, NOW)
    assert heavy.desired_groups >= light.desired_groups


def _pool(
    count: int,
    utilisation: float,
    waiting: float,
    kv_caches: float,
    rng: random.Random | None = None,
) -> ModelGroupSnapshot:
    """A pool load spread evenly over `count` fresh ready groups: `utilisation` groups' worth of
    arriving work, `waiting` requests queued, `kv_caches` whole KV caches in use. With `rng`, every
    metric of every group is off its steady value by up to +-10 %."""

    def noise() -> float:
        return 1.0 if rng is None else rng.uniform(0.9, 1.1)

    steady = load(utilisation / count, waiting=waiting / count, kv_usage=kv_caches / count)
    observed = [
        group(
            dataclasses.replace(
                steady,
                waiting_requests=steady.waiting_requests * noise(),
                running_requests=steady.running_requests * noise(),
                prompt_tokens_per_second=steady.prompt_tokens_per_second * noise(),
                generation_tokens_per_second=steady.generation_tokens_per_second * noise(),
                kv_usage_fraction=steady.kv_usage_fraction * noise(),
            ),
            name=f"g{index}",
        )
        for index in range(count)
    ]
    return world(*observed, spec=count)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    utilisation=st.floats(0.0, 8.0),
    waiting=st.floats(0.0, 150.0),
    kv_caches=st.floats(0.0, 4.0),
    seed=st.integers(0, 2**32 - 1),
)
def test_steady_load_with_ten_percent_noise_never_changes_the_count(
    utilisation: float, waiting: float, kv_caches: float, seed: int
) -> None:
    """Start at the count the steady load asks for; 1,000 noisy ticks (default behaviour) must not move it.

    A queue whose noisy wait can reach the budget is not steady: requests are about to miss their
    deadlines and acting on that is the slack signal's job, so such loads are left out.
    """
    policy = dataclasses.replace(DEFAULT, min_groups=1, max_groups=60)
    asked = decide(_pool(1, utilisation, waiting, kv_caches), policy, DecisionState.initial(), 0.0)
    settled = max(policy.min_groups, *(proposal.groups for proposal in asked.proposals))
    assume(kv_caches / settled <= 1.0)
    assume(1.1 * waiting * WORK_PER_WAITING_REQUEST / (settled * CAPACITY) < BUDGET)

    rng = random.Random(seed)
    state = DecisionState.initial()
    for tick in range(1000):
        snapshot = _pool(settled, utilisation, waiting, kv_caches, rng)
        decision = decide(snapshot, policy, state, tick * policy.interval_seconds)
        assert decision.desired_groups == settled, f"tick {tick}: {decision.reason} {decision.proposals}"
        state = decision.next_state


WORK_PER_WAITING_REQUEST = PROFILE.pricing.prefill_work_seconds(MEAN_INPUT) + (
    PROFILE.pricing.decode_work_seconds(MEAN_INPUT, MEAN_OUTPUT)
)


def _immediate() -> ScalingRules:
    return ScalingRules(
        stabilization_window_seconds=0.0, policies=(StepPolicy(StepPolicyType.GROUPS, 1000, 1.0),)
    )


@st.composite
def scale_up_policies(draw: st.DrawFn, count: int) -> ScalingPolicy:
    """Policies that allow some scale-up above `count` right now (no window, not disabled)."""
    rules = draw(step_rules())
    return ScalingPolicy(
        min_groups=draw(st.integers(0, count)),
        max_groups=draw(st.integers(count + 1, 20)),
        scale_up=dataclasses.replace(
            rules,
            stabilization_window_seconds=0.0,
            select_policy=draw(st.sampled_from([SelectPolicy.MAX, SelectPolicy.MIN])),
        ),
        scale_down=draw(step_rules()),
    )


@settings(max_examples=200)
@given(
    count=st.integers(1, 10), utilisation=st.floats(0.0, 0.8), overrun=st.floats(0.001, 3.0), data=st.data()
)
def test_negative_slack_raises_the_count_within_one_tick(
    count: int, utilisation: float, overrun: float, data: st.DataObject
) -> None:
    """The queue's predicted wait passes the budget by any margin: the very next decision adds groups."""
    policy = data.draw(scale_up_policies(count))
    waiting = waiting_requests_for(BUDGET * (1 + overrun), count)
    decision = decide(
        _pool(count, utilisation * count, waiting, 0.2 * count), policy, DecisionState.initial(), NOW
    )
    assert decision.estimates.earliest_slack_seconds is not None
    assert decision.estimates.earliest_slack_seconds < 0
    assert decision.desired_groups > count


SCALE_DOWN_WINDOW = 300.0
INTERVAL = 15.0
STABILISING = dataclasses.replace(
    DEFAULT,
    min_groups=1,
    max_groups=40,
    scale_up=_immediate(),
    scale_down=ScalingRules(
        stabilization_window_seconds=SCALE_DOWN_WINDOW,
        policies=(StepPolicy(StepPolicyType.PERCENT, 100, 1.0),),
    ),
)


def _run(pool_loads: list[float], start: int) -> tuple[list[int], list[int]]:
    """Drive `decide` over a pool load profile (one level per tick), applying every decision.

    Returns the count after each tick and each tick's recommendation before stabilisation.
    """
    state = DecisionState.initial()
    current = start
    counts, recommendations = [], []
    for tick, pool_load in enumerate(pool_loads):
        decision = decide(_pool(current, pool_load, 0.0, 0.0), STABILISING, state, tick * INTERVAL)
        state = decision.next_state
        recommendations.append(state.recommendations[-1].groups)
        current = decision.desired_groups
        counts.append(current)
    return counts, recommendations


levels = st.lists(st.tuples(st.floats(0.0, 10.0), st.integers(1, 40)), min_size=1, max_size=6)


@settings(max_examples=40, deadline=None)
@given(profile=levels, start=st.integers(1, 12))
def test_scale_down_takes_the_highest_recommendation_of_its_window(
    profile: list[tuple[float, int]], start: int
) -> None:
    """HPA semantics at every tick: a lower recommendation moves the count down only to the highest
    recommendation inside the scale-down window (this tick's included); a higher one acts at once."""
    pool_loads = [level for level, ticks in profile for _ in range(ticks)]
    counts, recommendations = _run(pool_loads, start)
    window_ticks = int(SCALE_DOWN_WINDOW / INTERVAL)
    previous = start
    for tick, (count, recommendation) in enumerate(zip(counts, recommendations, strict=True)):
        if tick < window_ticks:
            window = [*recommendations[: tick + 1], start]  # seeded with the count at the first decision
        else:
            window = recommendations[tick - window_ticks + 1 : tick + 1]
        if recommendation >= previous:
            assert count == recommendation
        else:
            assert count == min(previous, max(window))
        previous = count


@settings(max_examples=40, deadline=None)
@given(
    dip_ticks=st.integers(1, int(SCALE_DOWN_WINDOW / INTERVAL) - 1),
    high=st.floats(3.0, 8.0),
    low=st.floats(0.0, 1.0),
)
def test_a_dip_shorter_than_the_scale_down_window_never_scales_in(
    dip_ticks: int, high: float, low: float
) -> None:
    counts, _ = _run([high] * 30 + [low] * dip_ticks + [high] * 30, start=1)
    settled = counts[29]
    assert settled > 1
    assert all(count == settled for count in counts[29:])
