"""The capacity learner: bounded steps, bounds around the prior, convergence on a synthetic fleet,
change detection, staleness, and what a measured figure means."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from goodput.controllers.autoscale.capacity_learner import (
    DEFAULT_LEARNER_SETTINGS,
    CapacityEvidence,
    LearnerState,
    PriorCapacity,
    capacity_identity,
    estimate,
    learns,
    observe,
)
from goodput.controllers.autoscale.model import CapacitySource

LEARNER = DEFAULT_LEARNER_SETTINGS
PRIOR = PriorCapacity(1.0)
TICK_SECONDS = 15.0


def fleet_tick(true_ratio: float, in_use_ratio: float, load: float, identity: str = "g") -> CapacityEvidence:
    """What a fleet shows when the autoscaler runs its groups at `load` of the capacity in use and
    the true capacity is `true_ratio` (both relative to the prior): the SLO holds up to the truth;
    past it requests wait and the groups serve only the truth."""
    asked = in_use_ratio * load
    if asked <= true_ratio:
        return CapacityEvidence(
            identity, lower_ratio=asked, headroom=load >= 0.6, served_work_per_group=asked
        )
    return CapacityEvidence(identity, upper_ratio=true_ratio, served_work_per_group=true_ratio)


def run_fleet(
    true_ratio: float, ticks: int, *, seed: int = 0, state: LearnerState | None = None
) -> LearnerState:
    rng = random.Random(seed)
    state = state or LearnerState()
    for tick in range(ticks):
        in_use = estimate(state, PRIOR, tick * TICK_SECONDS).work_seconds_per_second
        state = observe(state, fleet_tick(true_ratio, in_use, rng.uniform(0.7, 0.95)), tick * TICK_SECONDS)
    return state


evidence_strategy = st.builds(
    CapacityEvidence,
    identity=st.just("g"),
    upper_ratio=st.none() | st.floats(1e-6, 1e6),
    lower_ratio=st.none() | st.floats(1e-6, 1e6),
    headroom=st.booleans(),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(evidence_strategy, min_size=1, max_size=40), st.floats(0.01, 1e4))
def test_the_estimate_moves_by_bounded_steps_stays_positive_and_within_the_bounds_of_the_prior(
    evidence: list[CapacityEvidence], prior_value: float
) -> None:
    prior = PriorCapacity(prior_value)
    state = LearnerState()
    low, high = prior_value / LEARNER.bound_factor, prior_value * LEARNER.bound_factor
    for tick, item in enumerate(evidence):
        now = tick * TICK_SECONDS
        before = state
        state = observe(state, item, now)
        if state.restarts == before.restarts:
            assert abs(state.log_ratio - before.log_ratio) <= LEARNER.log_step + 1e-12
        value = estimate(state, prior, now).work_seconds_per_second
        assert value > 0
        assert low * (1 - 1e-9) <= value <= high * (1 + 1e-9)


@settings(max_examples=40, deadline=None)
@given(st.floats(0.4, 2.5), st.integers(0, 1000))
def test_a_fleet_of_any_true_capacity_within_the_bounds_is_learnt_to_a_band_around_it(
    true_ratio: float, seed: int
) -> None:
    """The autoscaler runs groups at 70-95 % of the capacity in use, so an estimate up to 1/0.7 of the
    truth can hold the SLO for a while; a miss brings it back to 1.1 × the truth (the bound margin).
    After an hour of ticks every estimate of the last quarter hour lies in that band."""
    rng = random.Random(seed)
    state = LearnerState()
    seen = []
    for tick in range(300):
        now = tick * TICK_SECONDS
        in_use = estimate(state, PRIOR, now).work_seconds_per_second
        seen.append(in_use / true_ratio)
        state = observe(state, fleet_tick(true_ratio, in_use, rng.uniform(0.7, 0.95)), now)
    assert estimate(state, PRIOR, now).source is CapacitySource.LEARNT
    assert all(0.9 <= ratio <= 1 / 0.7 * (1 + LEARNER.probe_step_fraction) for ratio in seen[-60:])


def test_confidence_grows_with_evidence() -> None:
    confidences = [
        estimate(run_fleet(1.0, ticks), PRIOR, (ticks - 1) * TICK_SECONDS).confidence
        for ticks in (5, 40, 200)
    ]
    assert 0 < confidences[0] < confidences[1] < confidences[2] < 1


@pytest.mark.parametrize(
    ("case", "new_ratio", "ticks", "restarted"),
    [
        ("a slower engine version: capacity halves, the learner restarts at it", 0.5, 8, True),
        ("a GPU a third slower: the learner restarts at it", 0.6, 10, True),
        ("a fifth slower: bounded steps follow it, no restart", 0.8, 10, False),
    ],
)
def test_a_sudden_drop_is_relearnt_not_averaged_away(
    case: str, new_ratio: float, ticks: int, restarted: bool
) -> None:
    state = run_fleet(1.0, ticks=200)
    assert state.restarts == 0
    start = 200 * TICK_SECONDS
    for tick in range(ticks):
        now = start + tick * TICK_SECONDS
        state = observe(state, CapacityEvidence("g", upper_ratio=new_ratio), now)
    assert (state.restarts == 1) is restarted, case
    learnt = estimate(state, PRIOR, now)
    assert learnt.work_seconds_per_second == pytest.approx(new_ratio * (1 + LEARNER.bound_margin), rel=0.01)
    if restarted:
        assert learnt.evidence_start is not None and learnt.evidence_start > start  # a new window


def test_noise_around_the_truth_does_not_restart_the_learner() -> None:
    assert run_fleet(1.0, ticks=400, seed=7).restarts == 0


def test_a_changed_identity_restarts_from_the_prior() -> None:
    state = run_fleet(2.0, ticks=200)
    assert estimate(state, PRIOR, 199 * TICK_SECONDS).work_seconds_per_second > 1.5
    state = observe(state, CapacityEvidence("new image", served_work_per_group=1.0), 200 * TICK_SECONDS)
    learnt = estimate(state, PRIOR, 200 * TICK_SECONDS)
    assert (learnt.source, learnt.work_seconds_per_second, learnt.reason) == (
        CapacitySource.PRIOR,
        1.0,
        "identity changed",
    )


@pytest.mark.parametrize(
    ("case", "silence_seconds", "source"),
    [
        ("evidence a minute old is used", 60.0, CapacitySource.LEARNT),
        ("evidence just inside the window is used", LEARNER.stale_after_seconds, CapacitySource.LEARNT),
        (
            "evidence past the window falls back to the prior",
            LEARNER.stale_after_seconds + 1,
            CapacitySource.PRIOR,
        ),
    ],
)
def test_stale_evidence_falls_back_to_the_prior(
    case: str, silence_seconds: float, source: CapacitySource
) -> None:
    state = run_fleet(2.0, ticks=200)
    last = state.evidence_end
    assert last is not None
    learnt = estimate(state, PRIOR, last + silence_seconds)
    assert learnt.source is source, case
    if source is CapacitySource.PRIOR:
        assert learnt.work_seconds_per_second == PRIOR.work_seconds_per_second
        assert learnt.confidence == 0.0
        assert learnt.reason.startswith("evidence stale")


def test_evidence_after_a_stale_spell_relearns_from_the_prior() -> None:
    state = run_fleet(2.0, ticks=200)
    assert state.evidence_end is not None
    later = state.evidence_end + LEARNER.stale_after_seconds + 60
    state = observe(state, CapacityEvidence("g", lower_ratio=0.8, headroom=True), later)
    assert state.log_ratio == pytest.approx(LEARNER.log_probe)  # one step up from the prior, not from 2x
    assert state.evidence_start == later


@pytest.mark.parametrize(
    ("case", "measured", "learn_capacity", "learnt"),
    [
        ("a prior is learnt by default", False, None, True),
        ("a measured figure is used as given", True, None, False),
        ("a measured figure is learnt from when asked", True, True, True),
        ("learning can be turned off", False, False, False),
    ],
)
def test_which_capacities_are_learnt(
    case: str, measured: bool, learn_capacity: bool | None, learnt: bool
) -> None:
    assert learns(measured, learn_capacity) is learnt, case


def test_a_measured_figure_used_as_given_says_so_with_full_confidence() -> None:
    state = run_fleet(2.0, ticks=50)
    used = estimate(state, PriorCapacity(3.0, measured=True, learn=False), 50 * TICK_SECONDS)
    assert (used.source, used.work_seconds_per_second, used.confidence) == (CapacitySource.MEASURED, 3.0, 1.0)


def test_nothing_learnt_yet_is_the_prior_with_no_confidence() -> None:
    used = estimate(LearnerState(), PRIOR, 0.0)
    assert (used.source, used.confidence, used.evidence_start) == (CapacitySource.PRIOR, 0.0, None)


def test_the_identity_names_the_prior_and_the_engine() -> None:
    assert capacity_identity(0.5, "vllm:v1", "h100") != capacity_identity(0.5, "vllm:v2", "h100")
    assert capacity_identity(0.5, "vllm:v1", "h100") != capacity_identity(0.6, "vllm:v1", "h100")
    assert math.isfinite(float(capacity_identity(0.5).split("|")[0]))
