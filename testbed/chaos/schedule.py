"""The chaos run's plan: which faults and which stimuli happen when, drawn from one seed.

Pure: `plan_run(settings)` returns the same plan for the same settings, so a run that found a bug
is repeated by its seed. Three independent streams, each on its own clock:
- operator kills (SIGKILL, then a restart after a short delay), every few seconds, each aimed at a
  moment (a scale-out, readiness checks, a drain, a rollout) that the injector waits for;
- infrastructure faults one after another (API server, etcd, Prometheus, a node, a rank, an engine),
  never two at once, so each one's effect is attributable; the first ones of a run are all of
  different kinds, so even a short run covers as many kinds as fit;
- stimuli that make the operator work: the manually sized ModelGroup scaled to a new count, and
  rollouts of its pod template.
Nothing is planned in the warm-up (groups come up) or the quiet tail (everything settles).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum


class FaultKind(StrEnum):
    OPERATOR_KILL = "operator-kill"
    APISERVER_RESTART = "apiserver-restart"
    ETCD_RESTART = "etcd-restart"
    PROMETHEUS_STOP = "prometheus-stop"
    PROMETHEUS_SLOW = "prometheus-slow"
    PROMETHEUS_MISSING_SERIES = "prometheus-missing-series"
    NODE_LOST = "node-lost"
    RANK_CRASH_WARMING = "rank-crash-warming"
    RANK_CRASH_SERVING = "rank-crash-serving"
    ENGINE_HANG = "engine-hang"


INFRASTRUCTURE_FAULTS: tuple[FaultKind, ...] = tuple(k for k in FaultKind if k is not FaultKind.OPERATOR_KILL)
PROMETHEUS_FAULTS = frozenset(
    {FaultKind.PROMETHEUS_STOP, FaultKind.PROMETHEUS_SLOW, FaultKind.PROMETHEUS_MISSING_SERIES}
)


class Moment(StrEnum):
    """What an operator kill waits for (polled from the API server) before it lands."""

    SCALE_OUT = "scale-out"
    """A group placing or provisioning."""
    READINESS = "readiness"
    """A group warming: its readiness checks running."""
    DRAIN = "drain"
    """A group draining."""
    ROLLOUT = "rollout"
    """A group of an outdated pod template still there."""
    ANY = "any"
    """Whatever the operator is doing."""


MOMENTS: tuple[Moment, ...] = tuple(Moment)
HOLD_SECONDS: dict[FaultKind, tuple[float, float]] = {
    FaultKind.OPERATOR_KILL: (0.5, 3.0),  # down time before the restart
    FaultKind.APISERVER_RESTART: (1.0, 5.0),
    FaultKind.ETCD_RESTART: (1.0, 5.0),
    FaultKind.PROMETHEUS_STOP: (10.0, 25.0),
    FaultKind.PROMETHEUS_SLOW: (15.0, 30.0),
    FaultKind.PROMETHEUS_MISSING_SERIES: (15.0, 30.0),
    FaultKind.NODE_LOST: (45.0, 70.0),  # past the node monitor's 30 s grace
    FaultKind.RANK_CRASH_WARMING: (20.0, 30.0),
    FaultKind.RANK_CRASH_SERVING: (20.0, 30.0),
    FaultKind.ENGINE_HANG: (8.0, 20.0),
}
"""Per kind, the range its fault lasts before it is undone (seconds)."""
SLOW_ANSWER_SECONDS = (3.0, 6.0)
"""How late a slowed Prometheus answers: above the operator's query timeout in the chaos run."""


@dataclass(frozen=True, slots=True)
class ChaosSettings:
    duration_seconds: float
    seed: int
    warmup_seconds: float = 45.0
    quiet_tail_seconds: float = 60.0
    kill_gap_seconds: tuple[float, float] = (6.0, 16.0)
    fault_gap_seconds: tuple[float, float] = (5.0, 15.0)
    scale_gap_seconds: tuple[float, float] = (20.0, 40.0)
    rollout_every_seconds: float = 150.0
    manual_replicas: tuple[int, int] = (1, 4)

    def __post_init__(self) -> None:
        if self.duration_seconds <= self.warmup_seconds + self.quiet_tail_seconds:
            raise ValueError(
                f"duration_seconds ({self.duration_seconds:g}) must exceed warmup_seconds + "
                f"quiet_tail_seconds ({self.warmup_seconds + self.quiet_tail_seconds:g})"
            )
        low, high = self.manual_replicas
        if not 1 <= low < high:
            raise ValueError(f"manual_replicas must be 1 <= low < high, not {self.manual_replicas}")

    @property
    def chaos_ends_at_seconds(self) -> float:
        return self.duration_seconds - self.quiet_tail_seconds


@dataclass(frozen=True, slots=True)
class PlannedFault:
    at_seconds: float
    """From the start of the run."""
    kind: FaultKind
    hold_seconds: float
    """How long the fault lasts before it is undone (for a kill: the down time)."""
    moment: Moment | None = None
    """For an operator kill: what it waits for before landing."""
    slow_answer_seconds: float = 0.0
    """For a slowed Prometheus: the delay of each answer."""


@dataclass(frozen=True, slots=True)
class PlannedStimulus:
    at_seconds: float
    action: str
    """'scale' (the manual ModelGroup to `replicas`) or 'rollout' (a new pod template)."""
    replicas: int = 0


@dataclass(frozen=True, slots=True)
class ChaosPlan:
    settings: ChaosSettings
    kills: tuple[PlannedFault, ...]
    faults: tuple[PlannedFault, ...]
    stimuli: tuple[PlannedStimulus, ...]

    def count_by_kind(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for fault in (*self.kills, *self.faults):
            counts[fault.kind.value] = counts.get(fault.kind.value, 0) + 1
        return counts


def plan_run(settings: ChaosSettings) -> ChaosPlan:
    """The whole run's plan from `settings.seed`; each stream draws from a generator of its own, so
    changing one stream's rules leaves the others' draws as they were."""
    return ChaosPlan(
        settings=settings,
        kills=plan_kills(settings, random.Random(f"{settings.seed}/kills")),
        faults=plan_faults(settings, random.Random(f"{settings.seed}/faults")),
        stimuli=plan_stimuli(settings, random.Random(f"{settings.seed}/stimuli")),
    )


def plan_kills(settings: ChaosSettings, rng: random.Random) -> tuple[PlannedFault, ...]:
    """Operator kills at random gaps, aimed at moments in a shuffled rotation (each moment as often)."""
    kills: list[PlannedFault] = []
    moments: list[Moment] = []
    at = settings.warmup_seconds + rng.uniform(*settings.kill_gap_seconds)
    # Judged on the moment as planned (rounded to 10 ms), so none lands on the window's end.
    while round(at, 2) < settings.chaos_ends_at_seconds:
        if not moments:
            moments = list(MOMENTS)
            rng.shuffle(moments)
        hold = rng.uniform(*HOLD_SECONDS[FaultKind.OPERATOR_KILL])
        kills.append(PlannedFault(round(at, 2), FaultKind.OPERATOR_KILL, round(hold, 2), moments.pop()))
        at += hold + rng.uniform(*settings.kill_gap_seconds)
    return tuple(kills)


def plan_faults(settings: ChaosSettings, rng: random.Random) -> tuple[PlannedFault, ...]:
    """Infrastructure faults one after another, in rounds that each hold every kind once in random
    order; a fault that would not end before the quiet tail is left out."""
    faults: list[PlannedFault] = []
    pending: list[FaultKind] = []
    at = settings.warmup_seconds + rng.uniform(*settings.fault_gap_seconds)
    while True:
        if not pending:
            pending = list(INFRASTRUCTURE_FAULTS)
            rng.shuffle(pending)
        kind = pending.pop()
        hold = rng.uniform(*HOLD_SECONDS[kind])
        if at + hold > settings.chaos_ends_at_seconds:
            break
        slow = rng.uniform(*SLOW_ANSWER_SECONDS) if kind is FaultKind.PROMETHEUS_SLOW else 0.0
        faults.append(PlannedFault(round(at, 2), kind, round(hold, 2), slow_answer_seconds=round(slow, 2)))
        at += hold + rng.uniform(*settings.fault_gap_seconds)
    return tuple(faults)


def plan_stimuli(settings: ChaosSettings, rng: random.Random) -> tuple[PlannedStimulus, ...]:
    """The manual ModelGroup scaled to a different count at random gaps, and a rollout every
    `rollout_every_seconds`, all inside the chaos window (the tail's scale is the run's final one)."""
    low, high = settings.manual_replicas
    stimuli: list[PlannedStimulus] = []
    current = low
    at = settings.warmup_seconds / 2 + rng.uniform(*settings.scale_gap_seconds)
    while at < settings.chaos_ends_at_seconds:
        current = rng.choice([n for n in range(low, high + 1) if n != current])
        stimuli.append(PlannedStimulus(round(at, 2), "scale", current))
        at += rng.uniform(*settings.scale_gap_seconds)
    rollout = settings.warmup_seconds + settings.rollout_every_seconds / 2
    while rollout < settings.chaos_ends_at_seconds:
        at = min(rollout + rng.uniform(-10, 10), settings.chaos_ends_at_seconds - 1)
        stimuli.append(PlannedStimulus(round(at, 2), "rollout"))
        rollout += settings.rollout_every_seconds
    return tuple(sorted(stimuli, key=lambda s: s.at_seconds))
