"""The hindsight oracle: what the cheapest fleet for a trace costs, as two figures named apart
(DESIGN §10).

- **Fluid bound**: every interval gets exactly the fractional number of groups its feasible work needs
  at the measured envelope C (perfect balancing, no queue carried between intervals, capacity there
  the moment it is wanted, never fewer than `min_groups`). No policy can run the same feasible work
  at C on fewer group-seconds, so at equal attainment it is a lower bound on cost *as far as C is the
  most a group sustains at the SLO*: C is measured, so the bound is as good as the measurement.
- **Searched schedule**: a real schedule of groups replayed in the simulator, built with hindsight
  from the trace's future feasible work (asked for a ready time ahead, added at most as fast as the
  step limit allows, each group kept for the minimum lifetime), scaled by one factor that a search
  over the simulator makes as small as it can while the run still reaches the attainment target.
  It is the best schedule this search finds, not a proven optimum: a one-dimensional search over a
  family of schedules.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from goodput.simulator.policy import FleetObservation, PolicyAnswer


def interval_work(
    arrival_seconds: np.ndarray, work_seconds: np.ndarray, horizon_seconds: float, interval_seconds: float
) -> np.ndarray:
    """Work (work-seconds) arriving in each interval of [0, horizon)."""
    count = max(1, math.ceil(horizon_seconds / interval_seconds))
    bins = np.minimum((arrival_seconds // interval_seconds).astype(np.int64), count - 1)
    return np.bincount(bins, weights=work_seconds, minlength=count)[:count]


def fluid_bound_gpu_hours(
    per_interval_work: np.ndarray,
    capacity_work_seconds_per_second: float,
    *,
    interval_seconds: float,
    min_groups: int,
    gpus_per_group: int,
) -> float:
    """GPU-hours of the fluid bound: fractional groups per interval, at least `min_groups`."""
    if capacity_work_seconds_per_second <= 0:
        raise ValueError("capacity_work_seconds_per_second must be positive")
    groups = np.maximum(
        float(min_groups), per_interval_work / (capacity_work_seconds_per_second * interval_seconds)
    )
    return float(groups.sum() * interval_seconds * gpus_per_group / 3600.0)


@dataclass(frozen=True, slots=True)
class ScheduleRules:
    """What a real schedule must respect."""

    interval_seconds: float = 15.0
    lead_seconds: float = 120.0
    """How far ahead capacity is asked for: placement plus the p90 of the ready time."""
    min_lifetime_seconds: float = 300.0
    """A group, once asked for, is kept this long (ModelGroup `drain.minLifetimeSeconds`)."""
    max_step_up_groups: int = 4
    """Step limit: at most max(current, this) groups added per interval (HPA's default rate policy)."""
    min_groups: int = 1
    max_groups: int = 16


def hindsight_schedule(
    per_interval_work: np.ndarray,
    capacity_work_seconds_per_second: float,
    factor: float,
    rules: ScheduleRules,
) -> np.ndarray:
    """Groups to ask for at each interval: `factor` × the work of the interval the groups would be
    ready for, kept for the minimum lifetime, raised no faster than the step limit (by starting
    earlier, never by serving late), clamped to the fleet's bounds."""
    need = np.ceil(
        factor * per_interval_work / (capacity_work_seconds_per_second * rules.interval_seconds) - 1e-9
    )
    lead = math.ceil(rules.lead_seconds / rules.interval_seconds)
    ahead = np.concatenate((need[lead:], np.full(min(lead, need.size), need[-1] if need.size else 0.0)))
    # ask for what any interval up to the ready time needs, so a group is ready before its work
    wanted = (
        np.array([ahead[max(0, i - lead) : i + 1].max() for i in range(ahead.size)]) if ahead.size else ahead
    )
    wanted = np.clip(wanted, rules.min_groups, rules.max_groups)
    # the step limit, honoured by starting earlier: walk back from every rise
    step = rules.max_step_up_groups
    for i in range(wanted.size - 1, 0, -1):
        # one interval adds at most max(current, step) groups: x + max(x, step) >= wanted[i]
        required = wanted[i] - step if wanted[i] <= 2 * step else math.ceil(wanted[i] / 2)
        wanted[i - 1] = max(wanted[i - 1], required)
    hold = max(1, math.ceil(rules.min_lifetime_seconds / rules.interval_seconds))
    kept = np.array([wanted[max(0, i - hold + 1) : i + 1].max() for i in range(wanted.size)])
    return kept.astype(np.int64)


class ScheduleFollower:
    """A policy that asks for the schedule's count at each interval: the oracle's shell in the simulator."""

    name = "oracle"

    def __init__(self, schedule: np.ndarray, rules: ScheduleRules, factor: float) -> None:
        self._schedule = schedule
        self.rules = rules
        self.factor = factor

    @property
    def interval_seconds(self) -> float:
        return self.rules.interval_seconds

    def describe(self) -> dict[str, float | str]:
        return {
            "kind": "hindsight schedule (searched)",
            "factor": self.factor,
            "lead_seconds": self.rules.lead_seconds,
            "min_lifetime_seconds": self.rules.min_lifetime_seconds,
            "peak_groups": float(self._schedule.max()) if self._schedule.size else 0.0,
        }

    def recommend(self, observation: FleetObservation) -> PolicyAnswer:
        index = min(int(observation.now // self.rules.interval_seconds), self._schedule.size - 1)
        desired = int(self._schedule[index]) if self._schedule.size else observation.min_groups
        desired = max(observation.min_groups, min(observation.max_groups, desired))
        return PolicyAnswer(
            desired, f"oracle: {desired} groups by the hindsight schedule (x{self.factor:.3g})"
        )


@dataclass(frozen=True, slots=True)
class SearchOutcome:
    factor: float
    passed: bool
    tried: tuple[tuple[float, bool], ...]


def search_factor(
    passes: Callable[[float], bool], *, low: float = 0.25, high: float = 4.0, refinements: int = 4
) -> SearchOutcome:
    """The smallest factor in [low, high] (geometric bisection) at which `passes` holds; when even
    `high` fails, `high` with passed=False."""
    tried: list[tuple[float, bool]] = []

    def check(factor: float) -> bool:
        verdict = passes(factor)
        tried.append((factor, verdict))
        return verdict

    if not check(high):
        return SearchOutcome(high, False, tuple(tried))
    if check(low):
        return SearchOutcome(low, True, tuple(tried))
    for _ in range(refinements):
        middle = math.sqrt(low * high)
        if check(middle):
            high = middle
        else:
            low = middle
    return SearchOutcome(high, True, tuple(tried))
