"""Capacity learnt on the cluster: the prior's C refined from the ModelGroup's own engines.

The profile's capacity C (work-seconds per second one group sustains within the SLO) is a prior: the
service-time model's, or the catalogue's behind it. The fleet is the truth. Each decision leaves
evidence (`capacity_evidence`), in ratios to the prior's C at the decision's mix (C scales the
whole grid, `CapacityProfile.calibrated`, so the ratio does not depend on the mix), and the learner
(`observe`) folds it into one number, log(learnt C / prior C):

- over: requests wait in the engines now (`waiting_per_group`): the groups serve all they can and it
  is not enough, so C is at most the work they served (plus `bound_margin`), and the estimate moves
  down to it. Not while they serve less than `burst_fraction` of the most they served within the
  SLO in the last `held_memory_seconds`, for less than `burst_seconds`: such a wait is a burst the
  rate window has not caught up with, not the groups' capacity. A miss the SLO window still
  remembers while nothing waits is no evidence either: the window outlasts the load that caused it,
  and the work served since is not what the groups can do.
- held: the SLO held, so C is at least the work served; an estimate below it moves up to it.
- headroom: the SLO held, nothing waits, and the groups served at least `probe_utilisation` of the
  capacity in use: the estimate rises by `probe_step_fraction`, at most once per
  `probe_interval_seconds` (the SLO's answer to a step takes a while to show). Capacity above the
  estimate is only found by trying it, as TCP finds a path's rate: steps up while the SLO holds,
  back to the work served when requests wait. Served work alone (a lower bound) cannot raise an
  estimate that sets the group count: the autoscaler keeps each group below the capacity it is told.

Each update moves the estimate by at most `max_step_fraction`. The value stays within
[prior / bound_factor, prior × bound_factor]: evidence that puts it further off says the profile is
wrong, which is for a person to fix. The confidence grows with the summed weight of the evidence:
weight / (weight + half_confidence_weight).

A sudden change (a new engine version, a different GPU) is not averaged away: a two-sided CUSUM on
the weighted log residual restarts the learner at the new evidence once it passes `change_threshold`,
and a change of the evidence's identity (the profile's inputs, the engine image) restarts it from the
prior. Evidence older than `stale_after_seconds` is not used: the estimate falls back to the prior
until fresh evidence arrives.

A team's `profile.capacityWorkSecondsPerSecond` is measured: it is used as given, with confidence 1,
unless the ModelGroup sets `profile.learnCapacity: true`, and then it is the learner's prior.

Everything here is pure: the state is a frozen value, `now` is passed in. The operator keeps one state
per ModelGroup in memory (lost on restart: the decision falls back to the prior and relearns), the
simulator one per run; both call the same functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from goodput.controllers.autoscale.model import CapacitySource, Decision, LearntCapacity
from goodput.estimators.capacity import CapacityProfile


@dataclass(frozen=True, slots=True)
class LearnerSettings:
    """The learner's constants; the defaults are what the operator and the simulator use."""

    bound_factor: float = 4.0
    max_step_fraction: float = 0.1
    probe_step_fraction: float = 0.05
    probe_utilisation: float = 0.6
    burst_fraction: float = 0.8
    """Requests waiting while the groups serve less than this share of the most they served within
    the SLO lately is a burst, not their capacity."""
    held_memory_seconds: float = 600.0
    """How long the most served within the SLO is remembered for that test."""
    burst_seconds: float = 60.0
    """A wait or miss that lasts this long counts whatever the groups served before: a burst is over
    by then, or the rate window has caught up with it; a slower engine is not."""
    bound_margin: float = 0.1
    waiting_per_group: float = 2.0
    """Requests waiting per group from which the groups count as saturated."""
    probe_interval_seconds: float = 60.0
    """The least time between two headroom steps: the SLO's answer to one step takes a while."""
    half_confidence_weight: float = 10.0
    stale_after_seconds: float = 1800.0
    change_drift: float = 0.1
    change_threshold: float = 1.0

    def __post_init__(self) -> None:
        if self.bound_factor <= 1:
            raise ValueError("bound_factor must be above 1")
        if not 0 < self.max_step_fraction < 1:
            raise ValueError("max_step_fraction must be in (0, 1)")
        if not 0 < self.probe_step_fraction <= self.max_step_fraction:
            raise ValueError("probe_step_fraction must be in (0, max_step_fraction]")

    @property
    def log_bound(self) -> float:
        return math.log(self.bound_factor)

    @property
    def log_step(self) -> float:
        return math.log1p(self.max_step_fraction)

    @property
    def log_probe(self) -> float:
        return math.log1p(self.probe_step_fraction)


DEFAULT_LEARNER_SETTINGS = LearnerSettings()


@dataclass(frozen=True, slots=True)
class CapacityEvidence:
    """One tick's evidence, as ratios of served work per group to the prior's C at the tick's mix.

    upper_ratio: served / prior C when the SLO missed under load with requests waiting (C is at most
    this); lower_ratio: served / prior C while the SLO held (C is at least this); headroom: the SLO
    held with nothing waiting while the groups served `probe_utilisation` of the capacity in use.
    identity: what the capacity belongs to (profile inputs, engine image); a change restarts learning.
    """

    identity: str
    upper_ratio: float | None = None
    lower_ratio: float | None = None
    headroom: bool = False
    served_work_per_group: float = 0.0


@dataclass(frozen=True, slots=True)
class LearnerState:
    """What the learner remembers: log(learnt / prior), the evidence behind it and the CUSUM sums."""

    identity: str | None = None
    log_ratio: float = 0.0
    weight: float = 0.0
    evidence_start: float | None = None
    evidence_end: float | None = None
    cusum_high: float = 0.0
    cusum_low: float = 0.0
    last_probe: float | None = None
    held_mark: float | None = None
    """The most work served per group within the SLO lately (a ratio to the prior), and when."""
    held_mark_at: float | None = None
    over_since: float | None = None
    """Since when waits or misses below the held mark have gone on (None: not now)."""
    restarts: int = 0
    note: str = "no evidence yet"


def _clamp(value: float, bound: float) -> float:
    return max(-bound, min(bound, value))


def _target(
    state: LearnerState, evidence: CapacityEvidence, now: float, settings: LearnerSettings
) -> tuple[float, float]:
    """The log ratio this evidence points at and its weight; weight 0 when it says nothing new."""
    current = state.log_ratio
    target, weight = current, 0.0
    lower = evidence.lower_ratio
    if (
        evidence.upper_ratio is not None
        and evidence.upper_ratio > 0
        and not _burst(state, evidence, now, settings)
    ):
        upper = math.log(evidence.upper_ratio * (1 + settings.bound_margin))
        if upper < current:
            target, weight = upper, 1.0
    elif lower is not None and lower > 0 and math.log(lower) > current:
        target, weight = math.log(lower), 1.0
    elif evidence.headroom and (
        state.last_probe is None or now - state.last_probe >= settings.probe_interval_seconds
    ):
        target, weight = current + settings.log_probe, 0.5
    return _clamp(target, settings.log_bound), weight


def _held_mark(state: LearnerState, now: float, settings: LearnerSettings) -> float | None:
    if state.held_mark is None or state.held_mark_at is None:
        return None
    return state.held_mark if now - state.held_mark_at <= settings.held_memory_seconds else None


def _burst(state: LearnerState, evidence: CapacityEvidence, now: float, settings: LearnerSettings) -> bool:
    """Whether this tick's wait or miss is a burst: the groups served well below the most they
    served within the SLO lately, for less than `burst_seconds` so far."""
    mark = _held_mark(state, now, settings)
    upper = evidence.upper_ratio
    if mark is None or upper is None or upper >= settings.burst_fraction * mark:
        return False
    return state.over_since is None or now - state.over_since < settings.burst_seconds


def _with_marks(
    state: LearnerState, evidence: CapacityEvidence, now: float, settings: LearnerSettings
) -> LearnerState:
    """The held mark raised by this tick's evidence, and since when waits or misses have gone on."""
    over_since = (now if state.over_since is None else state.over_since) if evidence.upper_ratio else None
    if over_since != state.over_since:
        state = replace(state, over_since=over_since)
    return _with_held_mark(state, evidence, now, settings)


def _with_held_mark(
    state: LearnerState, evidence: CapacityEvidence, now: float, settings: LearnerSettings
) -> LearnerState:
    """The most served within the SLO lately, raised by this tick's evidence."""
    lower = evidence.lower_ratio
    if lower is None:
        return state
    mark = _held_mark(state, now, settings)
    if mark is not None and lower < mark:
        return state
    return replace(state, held_mark=lower, held_mark_at=now)


def observe(
    state: LearnerState,
    evidence: CapacityEvidence,
    now: float,
    settings: LearnerSettings = DEFAULT_LEARNER_SETTINGS,
) -> LearnerState:
    """The state after one tick's evidence: a bounded step towards it, or a restart on a change."""
    if state.identity is not None and state.identity != evidence.identity:
        return LearnerState(identity=evidence.identity, restarts=state.restarts + 1, note="identity changed")
    if state.identity is None:
        state = replace(state, identity=evidence.identity)
    if state.evidence_end is not None and now - state.evidence_end > settings.stale_after_seconds:
        state = LearnerState(identity=state.identity, restarts=state.restarts, note="evidence went stale")
    target, weight = _target(state, evidence, now, settings)
    state = _with_marks(state, evidence, now, settings)
    if weight <= 0:
        return state
    residual = target - state.log_ratio
    high = max(0.0, state.cusum_high + weight * residual - settings.change_drift)
    low = max(0.0, state.cusum_low - weight * residual - settings.change_drift)
    if max(high, low) > settings.change_threshold:
        return LearnerState(
            identity=state.identity,
            log_ratio=target,
            weight=weight,
            evidence_start=now,
            evidence_end=now,
            held_mark=evidence.lower_ratio,
            held_mark_at=now if evidence.lower_ratio is not None else None,
            restarts=state.restarts + 1,
            note="change detected: relearning",
        )
    step = _clamp(residual, settings.log_step)
    return replace(
        state,
        log_ratio=_clamp(state.log_ratio + step, settings.log_bound),
        weight=state.weight + weight,
        evidence_start=state.evidence_start if state.evidence_start is not None else now,
        evidence_end=now,
        cusum_high=high,
        cusum_low=low,
        last_probe=now if step > 0 and evidence.headroom else state.last_probe,
        note="learning",
    )


@dataclass(frozen=True, slots=True)
class PriorCapacity:
    """The capacity the compiled profile carries and whether the learner may refine it.

    measured: the team gave `profile.capacityWorkSecondsPerSecond`. learn: the learner's estimate is
    used (by default for a prior, not for a measured figure)."""

    work_seconds_per_second: float
    measured: bool = False
    learn: bool = True


def estimate(
    state: LearnerState | None,
    prior: PriorCapacity,
    now: float,
    settings: LearnerSettings = DEFAULT_LEARNER_SETTINGS,
) -> LearntCapacity:
    """The capacity a decision uses now: the learnt one when there is fresh evidence, else the prior
    (or the measured figure), each with its reason."""
    source = CapacitySource.MEASURED if prior.measured else CapacitySource.PRIOR
    given = LearntCapacity(source, prior.work_seconds_per_second, 1.0 if prior.measured else 0.0)
    if not prior.learn:
        return replace(given, reason="measured by the team" if prior.measured else "learning is off")
    if state is None or state.evidence_end is None:
        return replace(given, reason=state.note if state is not None else "no evidence yet")
    if now - state.evidence_end > settings.stale_after_seconds:
        return replace(given, reason=f"evidence stale (none for {now - state.evidence_end:.0f} s)")
    return LearntCapacity(
        CapacitySource.LEARNT,
        prior.work_seconds_per_second * math.exp(state.log_ratio),
        state.weight / (state.weight + settings.half_confidence_weight),
        evidence_start=state.evidence_start,
        evidence_end=state.evidence_end,
        reason=state.note,
    )


def with_capacity(profile: CapacityProfile, capacity: LearntCapacity) -> CapacityProfile:
    """The compiled profile with its capacity replaced by the one in use: the compile's own
    calibration (`CapacityProfile.calibrated`), never a second compile."""
    if math.isclose(capacity.work_seconds_per_second, profile.reference.work_per_second, rel_tol=1e-9):
        return profile
    return profile.calibrated(capacity.work_seconds_per_second)


def capacity_evidence(
    decision: Decision,
    prior: CapacityProfile,
    identity: str,
    settings: LearnerSettings = DEFAULT_LEARNER_SETTINGS,
) -> CapacityEvidence | None:
    """What one decision says about the capacity, as ratios to the `prior` profile's; None when it
    had no fresh engine figures (nothing to learn from, and nothing is made up)."""
    estimates = decision.estimates
    fresh = decision.counts.fresh_metrics
    served_total = estimates.arrival_work_rate
    if fresh <= 0 or served_total is None or not math.isfinite(served_total) or served_total <= 0:
        return None
    served = served_total / fresh
    prior_at_mix = prior.capacity_per_group(estimates.mean_input_tokens, estimates.mean_output_tokens)
    if prior_at_mix <= 0:
        return None
    waiting = (estimates.waiting_requests or 0.0) / fresh
    saturated = waiting >= settings.waiting_per_group
    held = bool(estimates.slo_checks) and estimates.load_driven is None
    busy = served >= settings.probe_utilisation * estimates.capacity_per_group
    return CapacityEvidence(
        identity=identity,
        upper_ratio=served / prior_at_mix if saturated else None,
        lower_ratio=served / prior_at_mix if held else None,
        headroom=held and not saturated and busy,
        served_work_per_group=served,
    )


def learns(measured: bool, learn_capacity: bool | None) -> bool:
    """Whether the learner refines the capacity: as `profile.learnCapacity` says, and where it says
    nothing, only a prior (a team's measured figure is used as given)."""
    return learn_capacity if learn_capacity is not None else not measured


def capacity_identity(prior_work_seconds_per_second: float, *parts: str) -> str:
    """What a learnt capacity belongs to: the prior (it changes with the profile's inputs: model,
    GPU, parallelism, engine arguments, targets) and the engine image. A change restarts learning."""
    return "|".join((f"{prior_work_seconds_per_second:.9g}", *parts))
