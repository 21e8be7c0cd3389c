"""The sweep of a live endpoint's arrival rate, as pure decisions: which rate next, how long and how
many requests a step may take, when to stop, and what the steps say (`goodput envelope --endpoint`).

The I/O (an aiohttp client that streams each request) is `simulator.endpoint_client`; everything it
decides with lives here, so the bounds and the verdict are tested without a network.

The search: the first rate is the service-time model's capacity (or `--first-rate`), capped by
`--max-rate`. While every step holds the SLO the rate doubles (`ramp_factor`), still capped; after
the first failure the search steps down by the same factor until a rate holds, or bisects
geometrically between the highest rate that held and the lowest that failed until they are within
`resolution` of each other. The capacity is the highest rate that held below the lowest that failed:
a figure only when both were seen. Held at `--max-rate`, never holding down to
`lowest_rate_fraction` of the first rate, or a budget spent before a rate failed: no figure, and the
reason says which limit to change.

Hard bounds: a step is planned only when the requests it may send fit what is left of
`--max-requests` and its arrivals, plus the longest a request may run after them (`drain_seconds`,
its SLO deadline) and the longest wait for the server to be idle again (`settle_seconds`), fit what
is left of `--max-seconds`; its rate is never above `--max-rate`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from goodput.simulator.report import ClassTargets


@dataclass(frozen=True, slots=True)
class SweepBudget:
    """What the team allows the sweep to send: at most `max_requests` requests, `max_seconds` of wall
    time from the first request on, and never an arrival rate above `max_rate_per_second`."""

    max_requests: int
    max_seconds: float
    max_rate_per_second: float

    def __post_init__(self) -> None:
        for name, value in (
            ("--max-requests", self.max_requests),
            ("--max-seconds", self.max_seconds),
            ("--max-rate", self.max_rate_per_second),
        ):
            if not value > 0:
                raise ValueError(f"{name} must be positive, got {value}")


@dataclass(frozen=True, slots=True)
class StepRule:
    """How long one rate is offered: long enough to judge, as the simulator's envelope trials are.

    A step offers arrivals for the longest of `min_seconds`, `ttft_multiple` times the tightest TTFT
    target, and the time `min_requests` take to arrive at the rate. Why: a server a little above its
    capacity first fills its running batch and only then builds a queue that grows by the overload's
    share of every second, so a request behind it misses a TTFT target T some tens of T after the
    step starts; a shorter step passes rates the server cannot sustain. `min_requests` keeps the
    attainment's own noise (a binomial share) below the margin a step is judged by."""

    min_requests: int = 200
    min_seconds: float = 30.0
    ttft_multiple: float = 20.0

    def seconds_for(self, rate_per_second: float, tightest_ttft_seconds: float) -> float:
        return max(
            self.min_seconds,
            self.ttft_multiple * tightest_ttft_seconds,
            self.min_requests / rate_per_second,
        )


@dataclass(frozen=True, slots=True)
class SweepPlan:
    """The search's settings for one endpoint and workload."""

    first_rate_per_second: float
    tightest_ttft_seconds: float
    drain_seconds: float
    """The longest a request may run after the step's last arrival: its SLO deadline (TTFT target
    plus its output's gaps at the ITL target, or the end-to-end target), after which it has missed
    and is cancelled."""
    settle_seconds: float = 0.0
    """The longest the sweep waits after a step for the server to hold no request (cancelled ones
    it has yet to abort, queued ones behind them) before the next step starts from an idle server."""
    step: StepRule = StepRule()
    ramp_factor: float = 2.0
    resolution: float = 1.1
    """Bisection stops when the lowest failing rate is within this factor of the highest passing."""
    lowest_rate_fraction: float = 1 / 16
    """How far below the first rate the search steps down before it gives up."""


@dataclass(frozen=True, slots=True)
class SweepStep:
    """One rate to offer: Poisson arrivals for `seconds`, at most `max_requests` of them."""

    rate_per_second: float
    seconds: float
    max_requests: int


@dataclass(frozen=True, slots=True)
class StepOutcome:
    """What one step measured: per class, requests judged and those that met every target."""

    step: SweepStep
    met: tuple[int, ...]
    judged: tuple[int, ...]
    passed: bool
    elapsed_seconds: float

    @property
    def requests(self) -> int:
        return sum(self.judged)

    def attainment(self, class_number: int) -> float:
        judged = self.judged[class_number]
        return self.met[class_number] / judged if judged else math.nan


StopKind = Literal["found", "held-at-max-rate", "never-held", "budget"]


@dataclass(frozen=True, slots=True)
class SweepStop:
    """The search is over: `capacity_per_second` is a figure only when `kind` is 'found'."""

    kind: StopKind
    reason: str
    capacity_per_second: float | None = None
    failing_per_second: float | None = None


def step_passes(met: Sequence[int], judged: Sequence[int], classes: Sequence[ClassTargets]) -> bool:
    """Every class with requests in the step reached its attainment target."""
    return all(
        count == 0 or hits / count >= targets.attainment
        for hits, count, targets in zip(met, judged, classes, strict=True)
    )


def _bracket(history: Sequence[StepOutcome]) -> tuple[float | None, float | None]:
    """(highest rate that held below the lowest that failed, lowest that failed)."""
    failing = min((o.step.rate_per_second for o in history if not o.passed), default=None)
    passing = [
        o.step.rate_per_second
        for o in history
        if o.passed and (failing is None or o.step.rate_per_second < failing)
    ]
    return max(passing, default=None), failing


def _next_rate(plan: SweepPlan, budget: SweepBudget, history: Sequence[StepOutcome]) -> float | SweepStop:
    """The rate the search wants next, before the budget is asked."""
    if not history:
        return min(plan.first_rate_per_second, budget.max_rate_per_second)
    held, failing = _bracket(history)
    if failing is None:
        assert held is not None
        if held >= budget.max_rate_per_second:
            return SweepStop(
                "held-at-max-rate",
                f"the endpoint held the SLO at --max-rate {budget.max_rate_per_second:.3g} req/s, so its "
                "capacity is above that: raise --max-rate to find where it stops holding",
            )
        return min(held * plan.ramp_factor, budget.max_rate_per_second)
    if held is None:
        lower = failing / plan.ramp_factor
        if lower < plan.first_rate_per_second * plan.lowest_rate_fraction:
            return SweepStop(
                "never-held",
                f"no rate down to {failing:.3g} req/s met the SLO: check the targets (the TTFT and ITL "
                "the endpoint reaches with little load) or the endpoint itself",
                failing_per_second=failing,
            )
        return lower
    if failing / held <= plan.resolution:
        return SweepStop(
            "found",
            f"held at {held:.3g} req/s, failed at {failing:.3g}",
            capacity_per_second=held,
            failing_per_second=failing,
        )
    return math.sqrt(held * failing)


def poisson_ceiling(expected: float) -> int:
    """A count a Poisson draw with this mean exceeds with a chance below one in a million."""
    return math.ceil(expected + 5.0 * math.sqrt(expected) + 5.0)


def next_step(
    plan: SweepPlan,
    budget: SweepBudget,
    history: Sequence[StepOutcome],
    *,
    spent_requests: int,
    spent_seconds: float,
) -> SweepStep | SweepStop:
    """The next step, or why the search stops; a step always fits what is left of the budget."""
    wanted = _next_rate(plan, budget, history)
    if isinstance(wanted, SweepStop):
        return wanted
    rate = wanted
    seconds = plan.step.seconds_for(rate, plan.tightest_ttft_seconds)
    left_requests = budget.max_requests - spent_requests
    left_seconds = budget.max_seconds - spent_seconds
    expected = rate * seconds
    longest = seconds + plan.drain_seconds + plan.settle_seconds
    if math.ceil(expected) > left_requests or longest > left_seconds:
        return _budget_stop(history, rate, longest, math.ceil(expected))
    return SweepStep(rate, seconds, min(left_requests, poisson_ceiling(expected)))


def _budget_stop(history: Sequence[StepOutcome], rate: float, seconds: float, requests: int) -> SweepStop:
    """Out of budget: with a rate that held and one that failed the figure stands, coarser than asked;
    without, there is none."""
    held, failing = _bracket(history)
    need = (
        f"the step at {rate:.3g} req/s needs about {requests} requests and {seconds:.0f} s; "
        "raise --max-requests or --max-seconds"
    )
    if held is not None and failing is not None:
        return SweepStop(
            "found",
            f"held at {held:.3g} req/s, failed at {failing:.3g} (the budget ended the bisection: {need})",
            capacity_per_second=held,
            failing_per_second=failing,
        )
    return SweepStop("budget", f"the budget ran out before the SLO stopped holding: {need}")


def arrival_offsets(step: SweepStep, rng: np.random.Generator) -> np.ndarray:
    """The step's Poisson arrival times (seconds from its start), at most `step.max_requests`."""
    count = min(int(rng.poisson(step.rate_per_second * step.seconds)), step.max_requests)
    return np.sort(rng.uniform(0.0, step.seconds, size=count))


def deadline_seconds(targets: ClassTargets, output_tokens: int) -> float:
    """The latest a request can finish and still meet its class: past it, TTFT or the mean gap
    between its tokens (or the end-to-end target) has certainly missed."""
    by_tokens = targets.ttft_seconds + max(0, output_tokens - 1) * targets.itl_seconds
    return by_tokens if targets.e2e_seconds is None else min(by_tokens, targets.e2e_seconds)


@dataclass(frozen=True, slots=True)
class RequestTiming:
    """One streamed request as the client saw it (seconds from when it was sent); None: never seen."""

    class_number: int
    first_token_seconds: float | None
    finished_seconds: float | None
    output_tokens: int


def request_met(timing: RequestTiming, targets: ClassTargets) -> bool:
    """As the simulator judges a request (`report.judge`): finished, TTFT within target, the mean gap
    between its tokens within the ITL target, and the end-to-end target when the class has one."""
    first, finished = timing.first_token_seconds, timing.finished_seconds
    if first is None or finished is None:
        return False
    gaps = timing.output_tokens - 1
    gap_ok = gaps <= 0 or (finished - first) / gaps <= targets.itl_seconds
    e2e_ok = targets.e2e_seconds is None or finished <= targets.e2e_seconds
    return first <= targets.ttft_seconds and gap_ok and e2e_ok


def judge_step(
    step: SweepStep,
    timings: Sequence[RequestTiming],
    classes: Sequence[ClassTargets],
    elapsed_seconds: float,
) -> StepOutcome:
    """The step's verdict from its requests' timings."""
    met = [0] * len(classes)
    judged = [0] * len(classes)
    for timing in timings:
        judged[timing.class_number] += 1
        met[timing.class_number] += request_met(timing, classes[timing.class_number])
    return StepOutcome(
        step, tuple(met), tuple(judged), step_passes(met, judged, classes) and any(judged), elapsed_seconds
    )
