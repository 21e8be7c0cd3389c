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
  over the simulator makes as small as it can while the run still reaches the attainment target,
  then shaved: groups taken off it one layer at a time, from the top, each change kept while the
  simulator still passes it (`shave_schedule`). When no factor reaches the target, the target is
  what the largest schedule reached (the attainment the ready time leaves within reach). It is the
  best schedule this search finds, not a proven optimum; the suite's report names any policy that
  met as many requests on fewer GPU-hours.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from goodput.simulator.fleet_policy import FleetObservation, PolicyAnswer


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

    @property
    def hold_intervals(self) -> int:
        """Intervals a group, once asked for, is kept: the minimum lifetime, at least one."""
        return max(1, math.ceil(self.min_lifetime_seconds / self.interval_seconds))


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
    hold = rules.hold_intervals
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


def keeps_rules(schedule: np.ndarray, rules: ScheduleRules) -> bool:
    """Whether a schedule stays inside the fleet's bounds, adds groups no faster than the step limit
    and keeps every group it adds for the minimum lifetime (the rules `hindsight_schedule` builds in)."""
    if schedule.size == 0:
        return True
    if int(schedule.min()) < rules.min_groups or int(schedule.max()) > rules.max_groups:
        return False
    hold = rules.hold_intervals
    for i in range(1, schedule.size):
        before, now = int(schedule[i - 1]), int(schedule[i])
        if now - before > max(before, rules.max_step_up_groups):
            return False
        if now > before and int(schedule[i : i + hold].min()) < now:
            return False
    return True


@dataclass(frozen=True, slots=True)
class ShaveOutcome:
    schedule: np.ndarray
    trials: int
    """Candidates run (each one simulator run); candidates that broke a rule were not run."""
    saved_group_intervals: int


def shave_schedule(
    schedule: np.ndarray,
    passes: Callable[[np.ndarray], bool],
    rules: ScheduleRules,
    *,
    max_trials: int = 24,
    refinements: int = 3,
) -> ShaveOutcome:
    """A cheaper schedule that still passes: groups taken off the passing `schedule` one layer at a
    time, from the top.

    Why: the factor search scales one shape, so a single busy interval, held for the minimum
    lifetime, sets the level of the whole schedule. Here each block of a layer (a run of intervals
    at or above one count) is tried without its group, then with its group asked for later and let
    go earlier (a bisection on each end, over the part of the block no higher layer stands on), and
    a change is kept when the simulator still passes it. Every candidate keeps the rules
    (`keeps_rules`); the search is greedy and bounded by `max_trials` runs, so the result is the
    best schedule it found, never more expensive than the one it started from.
    """
    shaver = _Shaver(schedule.astype(np.int64).copy(), passes, rules, max_trials, refinements)
    for level in range(int(schedule.max(initial=0)), rules.min_groups, -1):
        for start, end in _blocks(shaver.best, level):
            shaver.shave_block(start, end, level)
    saved = int(schedule.sum() - shaver.best.sum())
    return ShaveOutcome(shaver.best, shaver.trials, saved)


def _blocks(schedule: np.ndarray, level: int) -> list[tuple[int, int]]:
    """The maximal runs [start, end) of intervals at which the schedule asks for at least `level`."""
    above = np.concatenate(([0], (schedule >= level).astype(np.int8), [0]))
    edges = np.flatnonzero(np.diff(above))
    return [(int(start), int(end)) for start, end in zip(edges[0::2], edges[1::2], strict=True)]


@dataclass(slots=True)
class _Shaver:
    """The state of one shave: the best passing schedule so far and the runs spent."""

    best: np.ndarray
    passes: Callable[[np.ndarray], bool]
    rules: ScheduleRules
    max_trials: int
    refinements: int
    trials: int = 0

    def attempt(self, candidate: np.ndarray) -> bool:
        """Run one candidate if it keeps the rules and runs are left; keep it when it passes."""
        if self.trials >= self.max_trials or not keeps_rules(candidate, self.rules):
            return False
        self.trials += 1
        if self.passes(candidate):
            self.best = candidate
            return True
        return False

    def shave_block(self, start: int, end: int, level: int) -> None:
        """The block's group removed whole, else asked for later and let go earlier."""
        higher = np.flatnonzero(self.best[start:end] > level)
        if higher.size == 0 and self.attempt(_lowered(self.best, start, end)):
            return
        bare_head = int(higher[0]) if higher.size else end - start - 1
        delayed = self._trim(lambda base, k: _lowered(base, start, start + k), bare_head)
        higher = np.flatnonzero(self.best[start + delayed : end] > level)
        bare_tail = end - start - delayed - (int(higher[-1]) + 1 if higher.size else 1)
        self._trim(lambda base, k: _lowered(base, end - k, end), bare_tail)

    def _trim(self, lower: Callable[[np.ndarray, int], np.ndarray], limit: int) -> int:
        """The largest k in [0, limit] found by bisection at which `lower(best, k)` passes."""
        base = self.best
        passing, failing = 0, limit + 1
        for _ in range(self.refinements):
            if failing - passing <= 1:
                break
            middle = (passing + failing + 1) // 2
            if self.attempt(lower(base, middle)):
                passing = middle
            else:
                failing = middle
        return passing


def _lowered(schedule: np.ndarray, start: int, end: int) -> np.ndarray:
    """The schedule with one group fewer over intervals [start, end)."""
    lowered = schedule.copy()
    lowered[start:end] -= 1
    return lowered
