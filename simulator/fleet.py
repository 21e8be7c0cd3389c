"""The fleet of replica groups: engines and routing, with the deployed group controller's lifecycle.

A group costs `tensor × pipeline` GPUs from the moment it starts placing until it is removed or
fails. It serves only when ready. Which groups to create, which to remove for scale-in and when a
draining group may go are decided by the operator's group controller
(`goodput.controllers.groups`), run against a simulated cluster (`group_world`): the minimum
lifetime, the drain protocol and its timeout, and putting a draining group back in service on a
scale-out hold offline as deployed. A failed group loses every request in it and is replaced as a
whole, because the desired count did not change (§5).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum

from goodput.controllers import naming
from goodput.controllers.groups.controller import plan_model_group
from goodput.controllers.groups.drain import LeaderSample
from goodput.controllers.groups.lifecycle import GroupEvent, GroupTransition
from goodput.controllers.groups.model import DomainBackoff, Plan, WarmupOutcome, World
from goodput.controllers.groups.observation import PodView
from goodput.controllers.groups.pods import render_group
from goodput.controllers.pools import wanted_groups
from goodput.simulator.engine import EngineConfig, SimulatedEngine
from goodput.simulator.group_world import (
    GroupRules,
    bound,
    cluster_nodes,
    created_pods,
    default_model_group,
    failed,
    gate,
    instant,
    inventory,
    serving,
    started,
)
from goodput.simulator.records import RequestLog


class GroupPhase(StrEnum):
    """Where a simulated group is in its life, in the API's words (`GroupState`), and Deleted once it
    is gone, as the group controller's lifecycle says it (`lifecycle.Phase`)."""

    PLACING = "Placing"
    PROVISIONING = "Provisioning"
    READY = "Ready"
    DRAINING = "Draining"
    DELETED = "Deleted"
    FAILED = "Failed"


ROUTERS = ("least-work", "least-requests", "round-robin")
# Plans per reconcile: the first, one after the warm-ups and leader reads it asked for, and so on.
_PASSES_PER_RECONCILE = 4


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
    group_rules: GroupRules | None = None
    """The ModelGroup's group controller rules (drain, minimum lifetime, template); the API's
    defaults for a one-pod group when None."""
    reconcile_interval_seconds: float = 3.0
    """How often the group controller runs without a change to wake it (the operator's default)."""

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
        "key",
        "loading_at",
        "name",
        "ready_at",
        "state",
    )

    def __init__(self, index: int, created_at: float, engine: SimulatedEngine, key: str = "") -> None:
        self.index = index
        self.name = f"group-{index}"
        # The group's name in the controller's world (its pods' group label).
        self.key = key or self.name
        self.state = GroupPhase.PLACING
        self.created_at = created_at
        self.loading_at: float | None = None
        self.ready_at: float | None = None
        self.drain_started_at: float | None = None
        self.ended_at: float | None = None
        self.engine = engine

    @property
    def live(self) -> bool:
        return self.state in (GroupPhase.PLACING, GroupPhase.PROVISIONING, GroupPhase.READY)

    def outstanding_work_tokens(self, expected_output_tokens: int) -> int:
        """What the router weighs: prompt tokens still to prefill plus a decode guess per request."""
        return int(self.engine.waiting_prompt_tokens + self.engine.in_flight * expected_output_tokens)


@dataclass(frozen=True, slots=True)
class LifecycleEvent:
    """A group's next transition, for the event loop to schedule."""

    time: float
    group: int
    state: GroupPhase


@dataclass(frozen=True, slots=True)
class FleetCounts:
    """Groups by state at one instant; `desired` is the target the fleet converges to."""

    time: float
    desired: int
    placing: int
    provisioning: int
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
        self._rules = config.group_rules or GroupRules.for_model_group(
            default_model_group(config.gpus_per_group, config.max_groups)
        )
        # Room for every group the budget allows, twice over: draining groups hold their GPUs.
        self._nodes = cluster_nodes(self._rules, 2 * config.max_groups + 2)
        self._pods: dict[str, PodView] = {}
        self._by_key: dict[str, Group] = {}
        self._counter = 0
        self._backoffs: tuple[DomainBackoff, ...] = ()
        self._warmups: dict[str, WarmupOutcome] = {}
        self._readings: dict[str, LeaderSample] = {}
        self._recorded_drains: set[str] = set()
        self.aborted: list[int] = []
        # Every transition the group controller decided, with the simulated time it did.
        self.transitions: list[tuple[float, GroupTransition]] = []

    # ------------------------------------------------------------------ state
    def counts(self, now: float) -> FleetCounts:
        by_state = dict.fromkeys(GroupPhase, 0)
        for group in self.groups:
            by_state[group.state] += 1
        return FleetCounts(
            now,
            self.desired,
            by_state[GroupPhase.PLACING],
            by_state[GroupPhase.PROVISIONING],
            by_state[GroupPhase.READY],
            by_state[GroupPhase.DRAINING],
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

    def _new_group(self, key: str, now: float) -> Group:
        index = len(self.groups)
        engine = SimulatedEngine(
            self.config.engine,
            self._log,
            self._group_rng(index, "engine"),
            prefix_block_tokens=self.config.prefix_block_tokens,
            started_at=now,
            itl_targets_seconds=self.config.itl_targets_seconds,
        )
        group = Group(index, now, engine, key)
        self.groups.append(group)
        self._by_key[key] = group
        return group

    def start(self, initial_groups: int, now: float = 0.0) -> list[LifecycleEvent]:
        """A warm fleet: `initial_groups` groups ready at `now` (the run does not start cold). They
        have served longer than the minimum lifetime, so the controller may scale them in at once."""
        self.desired = initial_groups
        rules = self._rules
        since = instant(now - rules.rules.min_lifetime_seconds)
        events: list[LifecycleEvent] = []
        for _ in range(initial_groups):
            key = naming.group_name(self._counter)
            domain = f"d{self._counter}"
            self._counter += 1
            manifests = render_group(rules.template, key, domain, None)
            for pod in created_pods(manifests.pods, since):
                self._pods[pod.name] = serving(pod, since, rules.rules)
            group = self._new_group(key, now)
            group.loading_at = group.ready_at = now
            group.state = GroupPhase.READY
            self._ready.append(group)
            events.extend(self._failure_events(group, now))
        self._record(now)
        return events

    def world(self, now: float) -> World:
        """What the operator's group controller would see now."""
        rules = self._rules
        pods = list(self._pods.values())
        return World(
            now=instant(now),
            template=rules.template,
            rules=rules.rules,
            placement=rules.placement,
            desired_groups=self.desired,
            pods=tuple(pods),
            inventory=inventory(self._nodes, pods, rules.placement),
            ready_nodes=frozenset(node.name for node in self._nodes),
            group_counter=self._counter,
            backoffs=self._backoffs,
            warmups=dict(self._warmups),
            leader_readings=dict(self._readings),
            leader_samples=dict(self._readings),
            routed_pods=frozenset(pod.name for pod in pods if pod.marked_group_ready),
            max_replicas=self.config.max_groups,
            recorded_drains=frozenset(self._recorded_drains),
        )

    def reconcile(self, now: float) -> list[LifecycleEvent]:
        """One pass of the group controller, applied. Warm-ups and leader reads answer at once, so
        the controller plans again after them, as the operator does when they complete (bounded)."""
        events: list[LifecycleEvent] = []
        for _ in range(_PASSES_PER_RECONCILE):
            plan = plan_model_group(self.world(now))
            events.extend(self._apply(plan, now))
            if not (plan.warmups or plan.leader_probes or plan.ready or plan.drains_ended):
                break
        self._record(now)
        return events

    def _apply(self, plan: Plan, now: float) -> list[LifecycleEvent]:
        """The plan, in the operator's order, on the simulated pods and the engines."""
        at = instant(now)
        self.transitions.extend((now, step) for step in plan.transitions)
        self._counter = int(plan.annotations.get(naming.ANNOTATION_GROUP_COUNTER, self._counter))
        self._backoffs = plan.backoffs
        for start in plan.drain_starts:
            for name in start.pods:
                self._pods[name] = replace(self._pods[name], draining_since=start.since)
            self._set_gate(start.pods, False, at)
            self._stop_serving(self._by_key[start.group], now)
        for change in plan.unready:
            self._set_gate(change.pods, False, at)
            self._stop_serving(self._by_key[change.group], now)
        for outcome in plan.drain_outcomes:
            for name in outcome.pods:
                self._pods[name] = replace(self._pods[name], drain_outcome=outcome.decided)
        # The operator's status write: a drain's record precedes the deletion of its ranks.
        self._recorded_drains.update(ended.record.group for ended in plan.drains_ended)
        for deletion in plan.deletions:
            self._delete(deletion.group, deletion.pods, now, plan)
        events: list[LifecycleEvent] = []
        for creation in plan.creations:
            for pod in created_pods(creation.pods, at):
                self._pods[pod.name] = pod
            group = self._new_group(creation.group, now)
            events.append(
                LifecycleEvent(now + self.config.placement_seconds, group.index, GroupPhase.PROVISIONING)
            )
        for mark in plan.drain_marks:
            for name in mark.pods:
                self._pods[name] = replace(self._pods[name], draining_since=mark.since)
        for progress in plan.drain_progress:
            self._pods[progress.leader] = replace(
                self._pods[progress.leader], drain_progress=progress.progress
            )
        for change in plan.ready:
            self._set_gate(change.pods, True, at)
            events.extend(self._serve(self._by_key[change.group], now))
        for request in plan.warmups:
            self._warmups[request.group] = WarmupOutcome(True, at)
        for probe in plan.leader_probes:
            self._readings[probe.group] = self._read_leader(self._by_key[probe.group], now)
        return events

    def _set_gate(self, pods: tuple[str, ...], ready: bool, at: datetime) -> None:
        for name in pods:
            self._pods[name] = gate(self._pods[name], ready, at)

    def _stop_serving(self, group: Group, now: float) -> None:
        """Admission closed: a ready group drains (a failed one already stopped)."""
        if group.state is GroupPhase.READY:
            self._ready.remove(group)
            group.state = GroupPhase.DRAINING
            group.drain_started_at = now

    def _serve(self, group: Group, now: float) -> list[LifecycleEvent]:
        """The group-ready gate went True: a warmed-up group, or a draining one back in service."""
        if group.state is GroupPhase.READY:
            return []
        first = group.ready_at is None
        group.state = GroupPhase.READY
        group.drain_started_at = None
        group.ready_at = now if first else group.ready_at
        self._ready.append(group)
        return self._failure_events(group, now) if first else []

    def _delete(self, key: str, pods: tuple[str, ...], now: float, plan: Plan) -> None:
        """Every rank removed together. A drain that timed out aborts what was still in flight."""
        for name in pods:
            self._pods.pop(name, None)
        self._warmups.pop(key, None)
        self._readings.pop(key, None)
        group = self._by_key[key]
        if group.state is GroupPhase.FAILED:
            return
        if group in self._ready:
            self._ready.remove(group)
        if any(step.group == key and step.event is GroupEvent.DRAIN_TIMED_OUT for step in plan.transitions):
            self.aborted.extend(group.engine.abort_all(now))
        group.state = GroupPhase.DELETED
        group.ended_at = now

    def _read_leader(self, group: Group, now: float) -> LeaderSample:
        engine = group.engine
        engine.advance_to(now)
        return LeaderSample(
            instant(now),
            running=len(engine.running),
            waiting=len(engine.waiting),
            finished_total=engine.request_success_total,
            kv_cache_usage=engine.kv_usage,
        )

    def take_aborted(self) -> list[int]:
        """Requests aborted by drains that timed out since the last call."""
        aborted, self.aborted = self.aborted, []
        return aborted

    def advance_lifecycle(self, index: int, state: GroupPhase, now: float) -> list[LifecycleEvent]:
        """A scheduled transition of the simulated cluster is due: pods bound, then engines up."""
        group = self.groups[index]
        if not group.live:
            return []  # removed or failed before the transition
        pods = [name for name, pod in self._pods.items() if pod.group == group.key]
        if state is GroupPhase.PROVISIONING and group.state is GroupPhase.PLACING:
            for name in pods:
                self._pods[name] = bound(self._pods[name], instant(now))
            group.state = GroupPhase.PROVISIONING
            group.loading_at = now
            rng = self._group_rng(index, "ready")
            loading = self.config.ready_time_median_seconds * math.exp(
                rng.gauss(0.0, self.config.ready_time_sigma)
            )
            self._record(now)
            return [LifecycleEvent(now + loading, index, GroupPhase.READY)]
        if state is GroupPhase.READY and group.state is GroupPhase.PROVISIONING:
            for name in pods:
                self._pods[name] = started(self._pods[name], instant(now), self._rules.rules)
            return self.reconcile(now)
        return []

    def _failure_events(self, group: Group, now: float) -> list[LifecycleEvent]:
        rate = self.config.failure_rate_per_group_hour
        if rate <= 0:
            return []
        after = self._group_rng(group.index, "failure").expovariate(rate / 3600.0)
        return [LifecycleEvent(now + after, group.index, GroupPhase.FAILED)]

    def scale_to(self, desired: int, now: float) -> list[LifecycleEvent]:
        """The autoscaler's new count, clamped as the operator clamps `replicas`, reconciled."""
        self.desired = wanted_groups(desired, self.config.min_groups, self.config.max_groups)
        return self.reconcile(now)

    def fail(self, index: int, now: float) -> tuple[list[int], float | None]:
        """The group fails: its requests are lost. Returns them and when the controller sees it."""
        group = self.groups[index]
        if group.state not in (GroupPhase.READY, GroupPhase.DRAINING):
            return [], None
        if group.state is GroupPhase.READY:
            self._ready.remove(group)
        lost = group.engine.abort_all(now)
        group.state = GroupPhase.FAILED
        group.ended_at = now
        self.lost_requests += len(lost)
        self._record(now)
        return lost, now + self.config.replace_after_seconds

    def replace(self, now: float) -> list[LifecycleEvent]:
        """The controller sees the failed groups' crashed ranks and replaces them whole."""
        failed_keys = {group.key for group in self.groups if group.state is GroupPhase.FAILED}
        for name, pod in list(self._pods.items()):
            if pod.group in failed_keys and pod.rank == 0 and pod.restarts == 0:
                self._pods[name] = failed(pod)
        return self.reconcile(now)

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
