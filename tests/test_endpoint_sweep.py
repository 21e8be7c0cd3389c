"""The live endpoint's sweep as pure decisions: which rate next, when it stops and with what figure,
and the bounds it never passes (requests, seconds, rate) whatever the server answers."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from goodput.simulator.endpoint_sweep import (
    RequestTiming,
    StepOutcome,
    StepRule,
    SweepBudget,
    SweepPlan,
    SweepStep,
    SweepStop,
    arrival_offsets,
    deadline_seconds,
    judge_step,
    next_step,
    request_met,
)
from goodput.simulator.report import ClassTargets

CHAT = ClassTargets("chat", ttft_seconds=1.0, itl_seconds=0.05, attainment=0.9)
PLAN = SweepPlan(
    first_rate_per_second=4.0, tightest_ttft_seconds=1.0, drain_seconds=20.0, settle_seconds=20.0
)
ROOMY = SweepBudget(max_requests=100_000, max_seconds=100_000.0, max_rate_per_second=1000.0)


def outcome(rate: float, passed: bool) -> StepOutcome:
    step = SweepStep(rate, 30.0, 1000)
    return StepOutcome(step, (95 if passed else 50,), (100,), passed, 30.0)


def decide(history: list[StepOutcome], budget: SweepBudget = ROOMY, **spent: float) -> SweepStep | SweepStop:
    return next_step(
        PLAN,
        budget,
        history,
        spent_requests=int(spent.get("requests", 0)),
        spent_seconds=spent.get("seconds", 0.0),
    )


# ------------------------------------------------------------------------------------ the search
@pytest.mark.parametrize(
    ("history", "rate"),
    [
        ([], 4.0),
        ([(4.0, True)], 8.0),
        ([(4.0, True), (8.0, True)], 16.0),
        ([(4.0, False)], 2.0),
        ([(4.0, False), (2.0, False)], 1.0),
        ([(4.0, True), (8.0, False)], math.sqrt(32.0)),
        ([(4.0, True), (8.0, False), (math.sqrt(32.0), True)], math.sqrt(math.sqrt(32.0) * 8.0)),
        ([(4.0, False), (2.0, True)], math.sqrt(8.0)),
    ],
    ids=[
        "starts-at-the-first-rate",
        "a-rate-that-held-doubles",
        "keeps-doubling-while-it-holds",
        "a-first-failure-steps-down",
        "keeps-stepping-down",
        "bisects-once-bracketed",
        "bisects-above-a-held-midpoint",
        "bisects-after-stepping-down",
    ],
)
def test_the_next_rate(history: list[tuple[float, bool]], rate: float) -> None:
    decided = decide([outcome(r, passed) for r, passed in history])
    assert isinstance(decided, SweepStep)
    assert decided.rate_per_second == pytest.approx(rate)


@pytest.mark.parametrize(
    ("history", "kind", "capacity"),
    [
        ([(4.0, True), (4.3, False)], "found", 4.0),
        ([(4.0, True), (5.0, True), (5.4, False), (8.0, False)], "found", 5.0),
        ([(4.0, False), (2.0, False), (1.0, False), (0.5, False), (0.25, False)], "never-held", None),
    ],
    ids=["bracketed-within-the-resolution", "the-highest-held-below-the-lowest-failed", "nothing-held"],
)
def test_when_the_search_stops_and_with_what_figure(
    history: list[tuple[float, bool]], kind: str, capacity: float | None
) -> None:
    decided = decide([outcome(r, passed) for r, passed in history])
    assert isinstance(decided, SweepStop)
    assert (decided.kind, decided.capacity_per_second) == (kind, capacity)


def test_holding_at_the_max_rate_is_no_figure_and_says_to_raise_it() -> None:
    budget = SweepBudget(max_requests=100_000, max_seconds=100_000.0, max_rate_per_second=6.0)
    first = decide([outcome(4.0, True)], budget)
    assert isinstance(first, SweepStep) and first.rate_per_second == 6.0
    stop = decide([outcome(4.0, True), outcome(6.0, True)], budget)
    assert isinstance(stop, SweepStop)
    assert (stop.kind, stop.capacity_per_second) == ("held-at-max-rate", None)
    assert "raise --max-rate" in stop.reason


def test_a_budget_spent_before_any_failure_is_no_figure_and_names_the_limits() -> None:
    budget = SweepBudget(max_requests=300, max_seconds=100_000.0, max_rate_per_second=1000.0)
    stop = decide([outcome(4.0, True)], budget, requests=200)
    assert isinstance(stop, SweepStop)
    assert (stop.kind, stop.capacity_per_second) == ("budget", None)
    assert "--max-requests or --max-seconds" in stop.reason


def test_a_budget_spent_while_bisecting_keeps_the_bracket_it_has() -> None:
    budget = SweepBudget(max_requests=100_000, max_seconds=200.0, max_rate_per_second=1000.0)
    stop = decide([outcome(4.0, True), outcome(8.0, False)], budget, seconds=150.0)
    assert isinstance(stop, SweepStop)
    assert (stop.kind, stop.capacity_per_second, stop.failing_per_second) == ("found", 4.0, 8.0)
    assert "the budget ended the bisection" in stop.reason


@pytest.mark.parametrize(
    ("rate", "ttft", "seconds"),
    [(10.0, 1.0, 30.0), (10.0, 5.0, 100.0), (2.0, 1.0, 100.0)],
    ids=["the-floor", "twenty-ttft-targets", "enough-requests-at-a-low-rate"],
)
def test_a_step_lasts_long_enough_to_judge(rate: float, ttft: float, seconds: float) -> None:
    assert StepRule(min_requests=200, min_seconds=30.0).seconds_for(rate, ttft) == seconds


# ------------------------------------------------------------------------------------ verdicts
@pytest.mark.parametrize(
    ("timing", "met"),
    [
        (RequestTiming(0, 0.5, 0.5 + 9 * 0.05, 10), True),
        (RequestTiming(0, 1.2, 1.3, 10), False),
        (RequestTiming(0, 0.5, 0.5 + 9 * 0.06, 10), False),
        (RequestTiming(0, 0.9, 0.9, 1), True),
        (RequestTiming(0, None, None, 10), False),
    ],
    ids=["within-both", "ttft-late", "gaps-too-long", "one-token-has-no-gap", "cancelled-at-its-deadline"],
)
def test_a_request_is_judged_as_the_simulator_judges_it(timing: RequestTiming, met: bool) -> None:
    assert request_met(timing, CHAT) is met


def test_a_request_past_its_deadline_has_certainly_missed() -> None:
    deadline = deadline_seconds(CHAT, 10)
    assert deadline == pytest.approx(1.0 + 9 * 0.05)
    assert not request_met(RequestTiming(0, 0.9, deadline + 1e-6, 10), CHAT)
    bounded = ClassTargets("batch", 1.0, 0.05, e2e_seconds=0.8)
    assert deadline_seconds(bounded, 10) == 0.8


def test_a_step_holds_when_every_class_reaches_its_attainment() -> None:
    batch = ClassTargets("batch", ttft_seconds=10.0, itl_seconds=1.0, attainment=0.5)
    step = SweepStep(4.0, 30.0, 200)
    timings = [RequestTiming(0, 0.5, 0.54, 2)] * 9 + [RequestTiming(0, None, None, 2)]
    timings += [RequestTiming(1, 5.0, 5.5, 2), RequestTiming(1, None, None, 2)]
    held = judge_step(step, timings, [CHAT, batch], 40.0)
    assert (held.met, held.judged, held.passed) == ((9, 1), (10, 2), True)
    failing = judge_step(step, [*timings, RequestTiming(0, 3.0, 3.1, 2)], [CHAT, batch], 40.0)
    assert not failing.passed


# ------------------------------------------------------------------------------------ bounds
def run_search(
    plan: SweepPlan, budget: SweepBudget, holds: Callable[[float, int], bool]
) -> tuple[list[SweepStep], SweepStop]:
    """The search against a server that holds or not as `holds(rate, step number)` says, charging
    each step its worst case: every request it may send and every second it may take."""
    history: list[StepOutcome] = []
    steps: list[SweepStep] = []
    requests, seconds = 0, 0.0
    for _ in range(200):
        decided = next_step(plan, budget, history, spent_requests=requests, spent_seconds=seconds)
        if isinstance(decided, SweepStop):
            return steps, decided
        steps.append(decided)
        requests += decided.max_requests
        seconds += decided.seconds + plan.drain_seconds + plan.settle_seconds
        history.append(outcome(decided.rate_per_second, holds(decided.rate_per_second, len(steps))))
    raise AssertionError("the search did not stop within 200 steps")


plans = st.builds(
    SweepPlan,
    first_rate_per_second=st.floats(0.01, 500.0),
    tightest_ttft_seconds=st.floats(0.05, 60.0),
    drain_seconds=st.floats(0.0, 600.0),
    settle_seconds=st.floats(0.0, 600.0),
    step=st.builds(StepRule, min_requests=st.integers(1, 500), min_seconds=st.floats(1.0, 300.0)),
)
budgets = st.builds(
    SweepBudget,
    max_requests=st.integers(1, 50_000),
    max_seconds=st.floats(1.0, 20_000.0),
    max_rate_per_second=st.floats(0.01, 1000.0),
)


@settings(max_examples=300, deadline=None)
@given(plan=plans, budget=budgets, answers=st.lists(st.booleans(), max_size=60), otherwise=st.booleans())
def test_whatever_the_server_answers_the_sweep_stays_within_every_bound(
    plan: SweepPlan, budget: SweepBudget, answers: list[bool], otherwise: bool
) -> None:
    steps, _ = run_search(plan, budget, lambda _, n: answers[n - 1] if n <= len(answers) else otherwise)
    assert sum(step.max_requests for step in steps) <= budget.max_requests
    total = sum(step.seconds + plan.drain_seconds + plan.settle_seconds for step in steps)
    assert total <= budget.max_seconds + 1e-9
    assert all(0 < step.rate_per_second <= budget.max_rate_per_second for step in steps)


@settings(max_examples=300, deadline=None)
@given(plan=plans, budget=budgets, capacity=st.floats(0.001, 2000.0))
def test_a_figure_is_a_rate_that_held_just_below_one_that_failed(
    plan: SweepPlan, budget: SweepBudget, capacity: float
) -> None:
    """Against a server that holds exactly up to `capacity`, a figure is never above it, and within
    the resolution of it unless the budget cut the bisection short."""
    _, stop = run_search(plan, budget, lambda rate, _: rate <= capacity)
    if stop.capacity_per_second is None:
        return
    assert stop.failing_per_second is not None
    assert stop.capacity_per_second <= capacity < stop.failing_per_second
    if "budget" not in stop.reason:
        assert stop.failing_per_second / stop.capacity_per_second <= plan.resolution + 1e-9


@given(
    rate=st.floats(0.1, 100.0),
    seconds=st.floats(1.0, 300.0),
    cap=st.integers(0, 1000),
    seed=st.integers(0, 99),
)
def test_a_step_never_sends_more_than_it_may(rate: float, seconds: float, cap: int, seed: int) -> None:
    offsets = arrival_offsets(SweepStep(rate, seconds, cap), np.random.default_rng(seed))
    assert len(offsets) <= cap
    assert np.all(np.diff(offsets) >= 0) and np.all((offsets >= 0) & (offsets <= seconds))
