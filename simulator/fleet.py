"""The fleet of replica groups: lifecycle, routing, scale-out and drain, failures.

A group costs `tensor × pipeline` GPUs from the moment it starts placing until it is removed or
fails. It serves only when ready; a draining group takes no new requests and is removed when it has
none left (DESIGN §7); a failed group loses every request in it and is replaced as a whole, because
the desired count did not change (§5).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from enum import StrEnum

from goodput.controllers.snapshot import wanted_groups
from goodput.simulator.engine import Engine, EngineConfig
from goodput.simulator.records import RequestLog


class GroupState(StrEnum):
    PLACING = "Placing"
    LOADING = "Loading"
    READY = "Ready"
    DRAINING = "Draining"
    REMOVED = "Removed"
    FAILED = "Failed"


ROUTERS = ("least-work", "least-requests", "round-robin")


@dataclass(frozen=True, slots=True)
class FleetConfig:
    """How groups come and go, and how requests are spread over them."""

    engine: EngineConfig
    gpus_per_group: int
    min_groups: int = 1
    max_groups: int = 16
    placement_seconds: float = 5.0
    """Time to bind every pod of a group (gang placement on free nodes)."""
    ready_time_median_seconds: float = 120.0
    """Median of loading: image, weights, rank initialisation, compilation, warm-up (perf-model §4.2)."""
    ready_time_sigma: float = 0.25
    """σ of the lognormal loading time around its median."""
    router: str = "least-work"
    expected_output_tokens: int = 256
    """The router's guess of a request's output length: it cannot know the true one."""
    failure_rate_per_group_hour: float = 0.0
    """Poisson failures of ready groups (per group-hour of readiness)."""
    scheduled_failures_seconds: tuple[float, ...] = ()
    """Times at which one ready group (chosen by the seed) fails."""
    replace_after_seconds: float = 0.0
    """Delay before a failed group's replacement starts placing."""
    prefix_block_tokens: int = 512
    itl_targets_seconds: tuple[float, ...] = ()
    """ITL target per SLO class (by class index): engines count each request's slower token gaps."""

    def __post_init__(self) -> None:
        if self.router not in ROUTERS:
            raise ValueError(f"unknown router {self.router!r}; choose one of {', '.join(ROUTERS)}")
        if not 0 <= self.min_groups <= self.max_groups:
            raise ValueError("need 0 <= min_groups <= max_groups")


class Group:
    """One replica group and its engine (mutable, fleet-private)."""

    __slots__ = (
        "created_at",
        "drain_started_at",
        "ended_at",
        "engine",
        "index",
        "loading_at",
        "name",
        "ready_at",
        "state",
    )

    def __init__(self, index: int, created_at: float, engine: Engine) -> None:
        self.index = index
        self.name = f"group-{index}"
        self.state = GroupState.PLACING
        self.created_at = created_at
        self.loading_at: float | None = None
        self.ready_at: float | None = None
        self.drain_started_at: float | None = None
        self.ended_at: float | None = None
        self.engine = engine

    @property
    def live(self) -> bool:
        return self.state in (GroupState.PLACING, GroupState.LOADING, GroupState.READY)

    def outstanding_work_tokens(self, expected_output_tokens: int) -> int:
        """What the router weighs: prompt tokens still to prefill plus a decode guess per request."""
        return int(self.engine.waiting_prompt_tokens + self.engine.in_flight * expected_output_tokens)


@dataclass(frozen=True, slots=True)
class LifecycleEvent:
    """A group's next transition, for the event loop to schedule."""

    time: float
    group: int
    state: GroupState


@dataclass(frozen=True, slots=True)
class FleetCounts:
    """Groups by state at one instant; `desired` is the target the fleet converges to."""

    time: float
    desired: int
    placing: int
    loading: int
    ready: int
    draining: int


class Fleet:
    """Groups and the router. Methods return the lifecycle events the caller must schedule."""

    def __init__(self, config: FleetConfig, log: RequestLog, seed: int) -> None:
        self.config = config
        self._log = log
        self._seed = seed
        self.groups: list[Group] = []
        self.desired = 0
        self.timeline: list[FleetCounts] = []
        self._round_robin = 0
        self._ready: list[Group] = []
        self.lost_requests = 0

    # ------------------------------------------------------------------ state
    def counts(self, now: float) -> FleetCounts:
        by_state = dict.fromkeys(GroupState, 0)
        for group in self.groups:
            by_state[group.state] += 1
        return FleetCounts(
            now,
            self.desired,
            by_state[GroupState.PLACING],
            by_state[GroupState.LOADING],
            by_state[GroupState.READY],
            by_state[GroupState.DRAINING],
        )

    def _record(self, now: float) -> None:
        counts = self.counts(now)
        if self.timeline and self.timeline[-1].time == now:
            self.timeline[-1] = counts
        else:
            self.timeline.append(counts)

    @property
    def live_groups(self) -> list[Group]:
        return [group for group in self.groups if group.live]

    @property
    def serving_groups(self) -> list[Group]:
        return self._ready

    def gpu_seconds(self, until: float) -> float:
        """GPU-seconds consumed in [0, until]: every group from creation to its end."""
        total = 0.0
        for group in self.groups:
            end = until if group.ended_at is None else min(group.ended_at, until)
            total += max(0.0, end - group.created_at) * self.config.gpus_per_group
        return total

    # ------------------------------------------------------------------ lifecycle
    def _group_rng(self, index: int, purpose: str) -> random.Random:
        return random.Random(f"{self._seed}/{purpose}/{index}")

    def _create(self, now: float, ready_immediately: bool) -> tuple[Group, list[LifecycleEvent]]:
        index = len(self.groups)
        engine = Engine(
            self.config.engine,
            self._log,
            self._group_rng(index, "engine"),
            prefix_block_tokens=self.config.prefix_block_tokens,
            started_at=now,
            itl_targets_seconds=self.config.itl_targets_seconds,
        )
        group = Group(index, now, engine)
        self.groups.append(group)
        if ready_immediately:
            group.loading_at = group.ready_at = now
            group.state = GroupState.READY
            self._ready.append(group)
            return group, self._failure_events(group, now)
        return group, [LifecycleEvent(now + self.config.placement_seconds, index, GroupState.LOADING)]

    def start(self, initial_groups: int, now: float = 0.0) -> list[LifecycleEvent]:
        """A warm fleet: `initial_groups` groups ready at `now` (the run does not start cold)."""
        self.desired = initial_groups
        events: list[LifecycleEvent] = []
        for _ in range(initial_groups):
            events.extend(self._create(now, ready_immediately=True)[1])
        self._record(now)
        return events

    def advance_lifecycle(self, index: int, state: GroupState, now: float) -> list[LifecycleEvent]:
        """A scheduled transition is due: placing → loading → ready."""
        group = self.groups[index]
        if not group.live:
            return []  # removed or failed before the transition
        if state is GroupState.LOADING and group.state is GroupState.PLACING:
            group.state = GroupState.LOADING
            group.loading_at = now
            rng = self._group_rng(index, "ready")
            loading = self.config.ready_time_median_seconds * math.exp(
                rng.gauss(0.0, self.config.ready_time_sigma)
            )
            self._record(now)
            return [LifecycleEvent(now + loading, index, GroupState.READY)]
        if state is GroupState.READY and group.state is GroupState.LOADING:
            group.state = GroupState.READY
            group.ready_at = now
            self._ready.append(group)
            self._record(now)
            return self._failure_events(group, now)
        return []

    def _failure_events(self, group: Group, now: float) -> list[LifecycleEvent]:
        rate = self.config.failure_rate_per_group_hour
        if rate <= 0:
            return []
        after = self._group_rng(group.index, "failure").expovariate(rate / 3600.0)
        return [LifecycleEvent(now + after, group.index, GroupState.FAILED)]

    def scale_to(self, desired: int, now: float) -> list[LifecycleEvent]:
        """Converge the live groups to `desired`: create groups, or drain the cheapest victims."""
        self.desired = wanted_groups(desired, self.config.min_groups, self.config.max_groups)
        events = self._reconcile(now)
        self._record(now)
        return events

    def _reconcile(self, now: float) -> list[LifecycleEvent]:
        live = self.live_groups
        events: list[LifecycleEvent] = []
        for _ in range(self.desired - len(live)):
            events.extend(self._create(now, ready_immediately=False)[1])
        excess = len(live) - self.desired
        if excess > 0:
            for victim in self._victims(live, excess):
                self._drain(victim, now)
        return events

    def _victims(self, live: list[Group], count: int) -> list[Group]:
        """Cheapest first: groups not yet ready (newest first), then ready groups with least work."""
        expected = self.config.expected_output_tokens

        def cost(group: Group) -> tuple[int, float, float]:
            if group.state is not GroupState.READY:
                return (0, 0.0, -group.created_at)
            return (1, float(group.outstanding_work_tokens(expected)), -group.created_at)

        return sorted(live, key=cost)[:count]

    def _drain(self, group: Group, now: float) -> None:
        if group.state is GroupState.READY:
            self._ready.remove(group)
            group.state = GroupState.DRAINING
            group.drain_started_at = now
            self.remove_if_drained(group, now)
        else:
            group.state = GroupState.REMOVED
            group.ended_at = now

    def remove_if_drained(self, group: Group, now: float) -> bool:
        if group.state is GroupState.DRAINING and group.engine.in_flight == 0:
            group.state = GroupState.REMOVED
            group.ended_at = now
            self._record(now)
            return True
        return False

    def fail(self, index: int, now: float) -> tuple[list[int], float | None]:
        """The group fails: its requests are lost. Returns them and when its replacement is due."""
        group = self.groups[index]
        if group.state not in (GroupState.READY, GroupState.DRAINING):
            return [], None
        if group.state is GroupState.READY:
            self._ready.remove(group)
        lost = group.engine.abort_all(now)
        group.state = GroupState.FAILED
        group.ended_at = now
        self.lost_requests += len(lost)
        self._record(now)
        return lost, now + self.config.replace_after_seconds

    def replace(self, now: float) -> list[LifecycleEvent]:
        """Reconcile after a failure: bring the live groups back to the desired count."""
        events = self._reconcile(now)
        self._record(now)
        return events

    def pick_failure_victim(self, now: float) -> int | None:
        """A scheduled failure hits one ready group, chosen by the seed and the time."""
        if not self._ready:
            return None
        rng = random.Random(f"{self._seed}/scheduled-failure/{now!r}")
        return rng.choice(self._ready).index

    # ------------------------------------------------------------------ routing
    def route(self) -> Group | None:
        """The ready group the router sends the next request to, or None when none is ready."""
        ready = self._ready
        if not ready:
            return None
        if len(ready) == 1:
            return ready[0]
        router = self.config.router
        if router == "round-robin":
            self._round_robin = (self._round_robin + 1) % len(ready)
            return ready[self._round_robin]
        if router == "least-requests":
            return min(ready, key=lambda group: group.engine.in_flight)
        expected = self.config.expected_output_tokens
        best = ready[0]
        best_work = best.outstanding_work_tokens(expected)
        for group in ready[1:]:
            work = group.engine.waiting_prompt_tokens + group.engine.in_flight * expected
            if work < best_work:
                best, best_work = group, work
        return best
