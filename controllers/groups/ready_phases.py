"""A group's ready time taken apart, from what the cluster already records on its pods.

A new group is capacity only after the slowest of its ranks passed every phase, so each phase ends
when its last rank reached the phase's milestone:

    created ─Scheduling─▶ every rank bound (PodScheduled)
            ─ContainerStart─▶ every engine container running (image pull, init containers, sidecars)
            ─WeightLoad─▶ every engine answers /health (ContainersReady: weights loaded, engine up)
            ─RankFormation─▶ every rank NCCLHealthy (only where `readiness.ncclCheck` is Required)
            ─WarmUp─▶ the group-ready gate (revision check and a warm-up completion through the leader)

Knowing which phase is slow says what to fix (a registry, a weight cache, a slow fabric) and, in
the autoscaler, how far ahead a group must be asked for. The rules here:
- a phase not reached yet is unknown, never 0;
- a milestone the pods do not show although a later one is reached (a condition cleared by a
  restart of the agent) leaves its phase unknown, and its time counts in the next known phase, so
  the known phases still add up to the ready time;
- milestones are taken in order: one stamped before the previous milestone ends its phase at 0,
  one stamped after the group became ready (a condition re-written later) ends at the ready time;
- the phase in progress is Stalled once it has lasted longer than its bound: a few times what the
  ModelGroup's recent groups took in that phase, or a fixed bound before there are enough of them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from goodput.controllers.groups.observation import ConditionView, PodView


class ReadyPhase(StrEnum):
    """One phase of a group's ready time, named by what happens in it."""

    SCHEDULING = "Scheduling"
    CONTAINER_START = "ContainerStart"
    WEIGHT_LOAD = "WeightLoad"
    RANK_FORMATION = "RankFormation"
    WARM_UP = "WarmUp"


# Recent groups a phase's stall bound needs before it is measured rather than fixed.
STALL_MIN_SAMPLES = 5
# A phase is stalled past this many times the 90th percentile of the recent groups' time in it...
STALL_FACTOR = 3.0
# ...and never before this long: a phase of a few seconds jitters by more than 3x.
STALL_FLOOR_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class ReadyMilestones:
    """When a group started, and when its last rank ended each phase that applies to it (None: not
    shown by every rank). The last phase ends at the group's ready time (None: not ready yet)."""

    created_at: datetime
    ends: tuple[tuple[ReadyPhase, datetime | None], ...]


@dataclass(frozen=True, slots=True)
class PhaseTime:
    """How long a group spent in one phase; None: not over yet, or its end was not recorded."""

    phase: ReadyPhase
    seconds: float | None


@dataclass(frozen=True, slots=True)
class ReadyBreakdown:
    """A group's phases in order, the ready time, and the phase it is in while not ready.

    total_seconds: from creation to ready (the sum of the known phases); None until ready.
    current: the phase in progress (None once ready); current_seconds: how long it has lasted.
    """

    phases: tuple[PhaseTime, ...]
    total_seconds: float | None
    current: ReadyPhase | None = None
    current_seconds: float | None = None

    def seconds_of(self, phase: ReadyPhase) -> float | None:
        return next((p.seconds for p in self.phases if p.phase is phase), None)


@dataclass(frozen=True, slots=True)
class PhaseStall:
    """A phase in progress past its bound: named in an Event and in `status.readyTime.stalled`."""

    phase: ReadyPhase
    seconds: float
    bound_seconds: float
    measured: bool
    """The bound comes from recent groups' times in this phase (else it is the fixed bound)."""


def _true_since(condition: ConditionView | None) -> datetime | None:
    if condition is None or condition.status != "True":
        return None
    return condition.last_transition


def _every_rank(times: Iterable[datetime | None]) -> datetime | None:
    """When the last rank reached a milestone; None while any rank has not (or does not say when)."""
    known = list(times)
    if not known or any(t is None for t in known):
        return None
    return max(t for t in known if t is not None)


def milestones_of(
    pods: Sequence[PodView], created_at: datetime, ready_at: datetime | None, *, ranks_checked: bool
) -> ReadyMilestones:
    """The milestones a group's pods show. ranks_checked: the ModelGroup requires the NCCL check,
    so rank formation is a phase of its own (else it is part of the warm-up)."""
    ends: list[tuple[ReadyPhase, datetime | None]] = [
        (ReadyPhase.SCHEDULING, _every_rank(_true_since(pod.scheduled) for pod in pods)),
        (ReadyPhase.CONTAINER_START, _every_rank(pod.engine_started_at for pod in pods)),
        (ReadyPhase.WEIGHT_LOAD, _every_rank(_true_since(pod.containers_ready) for pod in pods)),
    ]
    if ranks_checked:
        ends.append((ReadyPhase.RANK_FORMATION, _every_rank(_true_since(pod.nccl_healthy) for pod in pods)))
    ends.append((ReadyPhase.WARM_UP, ready_at))
    return ReadyMilestones(created_at, tuple(ends))


def breakdown(milestones: ReadyMilestones, now: datetime) -> ReadyBreakdown:
    """The phases' durations (see the module's rules), and the phase in progress with its age."""
    ends = milestones.ends
    ready_at = ends[-1][1]
    last_known = max((i for i, (_, end) in enumerate(ends) if end is not None), default=-1)
    previous = milestones.created_at
    phases: list[PhaseTime] = []
    current: ReadyPhase | None = None
    current_seconds: float | None = None
    for index, (phase, recorded) in enumerate(ends):
        if recorded is None:
            phases.append(PhaseTime(phase, None))
            if index > last_known and current is None:
                current, current_seconds = phase, _seconds(previous, now)
            continue
        end = max(min(recorded, ready_at) if ready_at is not None else recorded, previous)
        phases.append(PhaseTime(phase, _seconds(previous, end)))
        previous = end
    total = _seconds(milestones.created_at, previous) if ready_at is not None else None
    return ReadyBreakdown(tuple(phases), total, current, current_seconds)


def _seconds(start: datetime, end: datetime) -> float:
    return max(0.0, (end - start).total_seconds())


def nearest_rank(values: Sequence[float], quantile: float) -> float | None:
    """The nearest-rank quantile (a value that occurred, never an interpolation); None: no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    rank = max(1, math.ceil(quantile * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def stall_bounds(
    recent: Sequence[Mapping[ReadyPhase, float]], fixed_seconds: float
) -> dict[ReadyPhase, tuple[float, bool]]:
    """Each phase's stall bound and whether it was measured: STALL_FACTOR times the 90th percentile
    of the recent groups' times in it (at least STALL_FLOOR_SECONDS) once STALL_MIN_SAMPLES of them
    recorded it, else `fixed_seconds`."""
    bounds: dict[ReadyPhase, tuple[float, bool]] = {}
    for phase in ReadyPhase:
        samples = [sample[phase] for sample in recent if phase in sample]
        p90 = nearest_rank(samples, 0.9)
        if len(samples) >= STALL_MIN_SAMPLES and p90 is not None:
            bounds[phase] = (max(STALL_FLOOR_SECONDS, STALL_FACTOR * p90), True)
        else:
            bounds[phase] = (fixed_seconds, False)
    return bounds


def stalled(breakdown: ReadyBreakdown, bounds: Mapping[ReadyPhase, tuple[float, bool]]) -> PhaseStall | None:
    """The phase in progress when it has lasted past its bound; None otherwise (or once ready)."""
    if breakdown.current is None or breakdown.current_seconds is None:
        return None
    bound = bounds.get(breakdown.current)
    if bound is None or breakdown.current_seconds <= bound[0]:
        return None
    return PhaseStall(breakdown.current, breakdown.current_seconds, bound[0], bound[1])
