"""The discrete-event loop: arrivals, engine steps, group lifecycle, failures, scrapes and control ticks.

Events live in one heap ordered by (time, sequence number); arrivals are read from the sorted
workload instead of being pushed. Engine steps are re-planned in place, so each engine's heap entry
carries the plan version it was made for and stale entries are skipped. Everything random is drawn
from generators seeded by (seed, purpose, group), so two policies replaying one trace see the same
step noise and ready times for the same group ordinal, and the same seed gives the same report.
"""

from __future__ import annotations

import heapq
import math
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from goodput.controllers.compile.request_path import RequestPathPolicy
from goodput.controllers.groups.lifecycle import GroupTransition
from goodput.simulator.engine import SimulatedEngine
from goodput.simulator.fleet import Fleet, FleetConfig, FleetCounts, Group, GroupPhase, LifecycleEvent
from goodput.simulator.fleet_policy import FleetObservation, FleetPolicy, GroupInfo
from goodput.simulator.gateway import SimGateway
from goodput.simulator.metrics import FleetSample, GroupScrape, MetricsHistory
from goodput.simulator.records import RequestExit, RequestLog
from goodput.simulator.workload import Workload

_STEP, _LIFECYCLE, _FAIL, _REPLACE, _SCHEDULED_FAIL, _SCRAPE, _CONTROL, _GROUPS, _HOLD, _CHILD = range(10)


@dataclass(frozen=True, slots=True)
class SimulationConfig:
    """Everything about a run except the workload and the policy."""

    fleet: FleetConfig
    seed: int = 0
    initial_groups: int = 1
    scrape_interval_seconds: float = 5.0
    scrape_delay_seconds: float = 5.0
    """Metrics a decision sees are as of `now − scrape_delay` (exporter, scrape and query lag)."""
    tail_seconds: float = 900.0
    """After the last arrival, how long in-flight requests may still finish before the run stops."""
    horizon_seconds: float | None = None
    """End of the offered window (cost is counted over [0, horizon]); default: the last arrival."""
    control_start_seconds: float = 60.0
    """First control tick: the fleet starts warm but its engines start empty, so no policy acts
    before one metrics window of real load has been seen."""
    request_path: RequestPathPolicy | None = None
    """With a request path, a gateway stands between the workload and the groups: its admission
    gates, fair queue and routing (`simulator.gateway`); without, each request goes to the fleet's
    router at once."""


@dataclass(frozen=True, slots=True)
class ScaleChange:
    """A decision that changed the desired group count."""

    time: float
    from_groups: int
    to_groups: int
    reason: str
    detail: dict[str, float | str]


@dataclass(frozen=True, slots=True)
class GroupRecord:
    name: str
    created_at: float
    ready_at: float | None
    ended_at: float | None
    final_state: str


@dataclass(frozen=True, slots=True)
class SimulationResult:
    """What a run produced: per-request outcomes, the fleet's history, and engine totals."""

    workload: Workload
    requests: dict[str, Any]
    """Columns from `RequestLog.arrays()` (numpy arrays by workload index)."""
    horizon_seconds: float
    end_seconds: float
    gpu_seconds: float
    timeline: tuple[FleetCounts, ...]
    scale_events: tuple[ScaleChange, ...]
    decisions: int
    groups: tuple[GroupRecord, ...]
    engine_totals: dict[str, float]
    wall_seconds: float
    events_processed: int
    group_transitions: tuple[tuple[float, GroupTransition], ...] = ()
    """Every move the group controller decided, with the simulated time it did (see `fleet`)."""
    backlogged_cost_by_tenant: dict[str, float] | None = None
    """With a gateway: the fair-queue cost dispatched per tenant while two or more tenants waited."""


def scrape(group: Group, now: float) -> GroupScrape:
    """The group leader's `/metrics` at `now`."""
    engine: SimulatedEngine = group.engine
    engine.advance_to(now)
    return GroupScrape(
        group=group.name,
        serving=group.state is GroupPhase.READY,
        num_requests_running=len(engine.running),
        num_requests_waiting=len(engine.waiting),
        kv_cache_usage_perc=engine.kv_usage,
        kv_cache_size_tokens=engine.config.kv_capacity_tokens,
        prompt_tokens_total=engine.prompt_tokens_total,
        generation_tokens_total=engine.generation_tokens_total,
        prefix_cache_queries_total=engine.prefix_cache_queries_total,
        prefix_cache_hits_total=engine.prefix_cache_hits_total,
        num_preemptions_total=engine.num_preemptions_total,
        request_success_total=engine.request_success_total,
        request_prompt_tokens_sum=engine.request_prompt_tokens_sum,
        request_generation_tokens_sum=engine.request_generation_tokens_sum,
        gpu_busy_seconds_total=engine.gpu_busy_seconds_total,
        in_flight_seconds_total=engine.in_flight_seconds(now),
        waiting_prompt_tokens=engine.waiting_prompt_tokens,
        time_to_first_token_seconds=engine.ttft.snapshot(),
        inter_token_latency_seconds=engine.itl.snapshot(),
        request_queue_time_seconds=engine.queue_time.snapshot(),
        e2e_request_latency_seconds=engine.e2e.snapshot(),
        request_time_per_output_token_seconds=engine.tpot.snapshot(),
    )


class _Progress:
    """A tqdm bar over simulated seconds, on stderr, only when wanted."""

    def __init__(self, enabled: bool, total_seconds: float, label: str) -> None:
        self._bar: Any = None
        self._shown = 0
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=int(total_seconds), unit="sim-s", desc=label, file=sys.stderr, leave=False)

    def update(self, now: float) -> None:
        if self._bar is not None and int(now) > self._shown:
            self._bar.update(int(now) - self._shown)
            self._shown = int(now)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def simulate(
    workload: Workload, config: SimulationConfig, autoscaler: FleetPolicy, progress: bool = False
) -> SimulationResult:
    """Replay `workload` through a fleet driven by `autoscaler`."""
    return _Run(workload, config, autoscaler, progress).run()


class _Run:
    """One replay: the event heap (steps, scrapes, control ticks, group passes, lifecycle events and
    failures), the arrivals merged into it in time order, and what the run records."""

    def __init__(
        self, workload: Workload, config: SimulationConfig, autoscaler: FleetPolicy, progress: bool
    ) -> None:
        self.started = time.perf_counter()
        self.workload, self.config, self.autoscaler = workload, config, autoscaler
        self.log = RequestLog(workload)
        self.fleet = Fleet(config.fleet, self.log, config.seed)
        self.history = MetricsHistory()
        self.scrape_interval = (
            getattr(autoscaler, "scrape_interval_seconds", None) or config.scrape_interval_seconds
        )
        scrape_delay = getattr(autoscaler, "scrape_delay_seconds", None)
        self.scrape_delay = config.scrape_delay_seconds if scrape_delay is None else scrape_delay
        self.arrivals = workload.arrival_seconds.tolist()
        self.inputs = workload.input_tokens.tolist()
        self.outputs = workload.output_tokens.tolist()
        self.blocks = workload.prefix_blocks
        with_slots = len(config.fleet.itl_targets_seconds) > 0 and workload.class_index is not None
        self.slots = (
            workload.class_index.tolist() if with_slots and workload.class_index is not None else None
        )
        last_arrival = self.arrivals[-1] if self.arrivals else 0.0
        self.horizon = config.horizon_seconds if config.horizon_seconds is not None else last_arrival
        self.stop_at = max(self.horizon, last_arrival) + config.tail_seconds
        self.heap: list[tuple[float, int, int, int, int]] = []
        self.counter = 0
        self.scheduled_versions: dict[int, int] = {}
        self.scale_events: list[ScaleChange] = []
        self.decisions = 0
        self.states = list(GroupPhase)
        self.bar = _Progress(progress, self.stop_at - config.tail_seconds, autoscaler.name)
        self.next_arrival = 0
        self.total = len(self.arrivals)
        self.processed = 0
        self.now = 0.0
        self.gateway = SimGateway(config.request_path, workload) if config.request_path is not None else None
        self.parents = workload.parent_index.tolist() if workload.parent_index is not None else None
        self.children = _children_of(workload)
        self.children_pending = 0
        if self.parents is not None and self.gateway is None:
            raise ValueError("a workload of sessions needs the gateway: sessions are the request path's")

    def push(self, at: float, kind: int, a: int = 0, b: int = 0) -> None:
        self.counter += 1
        heapq.heappush(self.heap, (at, self.counter, kind, a, b))

    def push_lifecycle(self, events: list[LifecycleEvent]) -> None:
        for event in events:
            kind = _FAIL if event.state is GroupPhase.FAILED else _LIFECYCLE
            self.push(event.time, kind, event.group, list(GroupPhase).index(event.state))

    def schedule_step(self, group: Group) -> None:
        engine = group.engine
        if engine.step_end is not None and self.scheduled_versions.get(group.index) != engine.plan_version:
            self.scheduled_versions[group.index] = engine.plan_version
            self.push(engine.step_end, _STEP, group.index, engine.plan_version)

    def work_left(self) -> bool:
        """Arrivals to come or requests in flight: otherwise the run is over."""
        if self.gateway is not None and self.gateway.holds_requests():
            return True
        if self.children_pending:
            return True
        return self.next_arrival < self.total or any(
            group.engine.in_flight
            for group in self.fleet.groups
            if group.state in (GroupPhase.READY, GroupPhase.DRAINING)
        )

    def lose(self, indices: list[int], at: float) -> None:
        for index in indices:
            self.log.outcome[index] = RequestExit.FAILED
            self.log.finished_at[index] = at
            if self.gateway is not None:
                self.gateway.release(index)

    def run(self) -> SimulationResult:
        config = self.config
        self.push_lifecycle(self.fleet.start(config.initial_groups))
        self.push(0.0, _SCRAPE)
        self.push(config.fleet.reconcile_interval_seconds, _GROUPS)
        self.push(max(self.autoscaler.interval_seconds, config.control_start_seconds), _CONTROL)
        for failure_at in config.fleet.scheduled_failures_seconds:
            self.push(failure_at, _SCHEDULED_FAIL)
        while True:
            arrival_at = self.arrivals[self.next_arrival] if self.next_arrival < self.total else math.inf
            if (
                self.heap and self.heap[0][0] < arrival_at
            ):  # at a tie, arrivals first: they join the step composed then
                now, _, kind, a, b = heapq.heappop(self.heap)
                self.now = now
                if now > self.stop_at:
                    break
                self.processed += 1
                self.handle(kind, a, b, now)
                continue
            if self.next_arrival >= self.total:
                break
            self.arrive(arrival_at)
        self.bar.close()
        return self.result()

    def handle(self, kind: int, a: int, b: int, now: float) -> None:
        """One event off the heap."""
        if kind == _STEP:
            self.on_step(a, b, now)
        elif kind == _SCRAPE:
            self.on_scrape(now)
        elif kind == _CONTROL:
            self.on_control(now)
        elif kind == _GROUPS:
            # The group controller's periodic pass: drains progress, young groups age.
            self.push_lifecycle(self.fleet.reconcile(now))
            self.lose(self.fleet.take_aborted(), now)
            if self.work_left():
                self.push(now + self.config.fleet.reconcile_interval_seconds, _GROUPS)
        elif kind == _HOLD:
            self.on_hold_expired(a, now)
            return
        elif kind == _CHILD:
            self.children_pending -= 1
            self.log.arrival[a] = now
            self.arrive_at_gateway(a, now)
            return
        elif self.work_left():  # lifecycle and failures after the last request change nothing reported
            self.on_group_event(kind, a, b, now)
        if self.gateway is not None and kind != _SCRAPE:
            self.dispatch(now)  # a group may have become ready, or left: the queue moves on

    def on_step(self, group_index: int, plan_version: int, now: float) -> None:
        """An engine step ends, unless the engine re-planned since it was scheduled."""
        group = self.fleet.groups[group_index]
        if (
            plan_version != group.engine.plan_version
            or self.scheduled_versions.get(group_index) != plan_version
        ):
            return
        group.engine.complete_step(now)
        self.schedule_step(group)
        if self.gateway is not None:
            self.answers(group)

    def on_scrape(self, now: float) -> None:
        """Prometheus scrapes every serving or draining group's leader."""
        self.bar.update(now)
        scraped = tuple(
            scrape(group, now)
            for group in self.fleet.groups
            if group.state in (GroupPhase.READY, GroupPhase.DRAINING)
        )
        gateway = None if self.gateway is None else self.gateway.sample(now, self.serving())
        self.history.append(FleetSample(now, scraped, gateway))
        if self.work_left():
            self.push(now + self.scrape_interval, _SCRAPE)

    def observe(self, now: float) -> FleetObservation:
        """What the autoscaler sees at `now`: the counts, and the metrics as of the scrape delay."""
        fleet = self.fleet
        counts = fleet.counts(now)
        return FleetObservation(
            now=now,
            desired_groups=fleet.desired,
            placing_groups=counts.placing,
            provisioning_groups=counts.provisioning,
            ready_groups=counts.ready,
            draining_groups=counts.draining,
            min_groups=self.config.fleet.min_groups,
            max_groups=self.config.fleet.max_groups,
            metrics=self.history.view(now - self.scrape_delay),
            groups=tuple(
                GroupInfo(g.name, g.state.value, g.created_at, g.ready_at)
                for g in fleet.groups
                if g.live or g.state is GroupPhase.DRAINING
            ),
        )

    def on_control(self, now: float) -> None:
        """A control tick: the autoscaler decides, the fleet scales, a change is recorded."""
        fleet = self.fleet
        recommendation = self.autoscaler.recommend(self.observe(now))
        self.decisions += 1
        before_desired = fleet.desired
        self.push_lifecycle(fleet.scale_to(recommendation.desired_groups, now))
        if fleet.desired != before_desired:
            self.scale_events.append(
                ScaleChange(
                    now, before_desired, fleet.desired, recommendation.reason, dict(recommendation.detail)
                )
            )
        self.lose(fleet.take_aborted(), now)
        if self.work_left():
            self.push(now + self.autoscaler.interval_seconds, _CONTROL)

    def on_group_event(self, kind: int, a: int, b: int, now: float) -> None:
        """A group's lifecycle step, failure, replacement or a scheduled failure."""
        fleet = self.fleet
        if kind == _LIFECYCLE:
            self.push_lifecycle(fleet.advance_lifecycle(a, self.states[b], now))
            self.lose(fleet.take_aborted(), now)
        elif kind == _FAIL:
            lost, replace_at = fleet.fail(a, now)
            self.lose(lost, now)
            if replace_at is not None:
                self.push(replace_at, _REPLACE)
        elif kind == _REPLACE:
            self.push_lifecycle(fleet.replace(now))
            self.lose(fleet.take_aborted(), now)
        elif kind == _SCHEDULED_FAIL:
            victim = fleet.pick_failure_victim(now)
            if victim is not None:
                self.push(now, _FAIL, victim)

    def arrive(self, now: float) -> None:
        """The next request arrives: routed to a ready group, or rejected."""
        self.now = now
        index = self.next_arrival
        self.next_arrival += 1
        self.processed += 1
        if self.parents is not None and self.parents[index] >= 0:
            return  # a session's child: sent when its parent is answered (`send_children`)
        log = self.log
        if self.gateway is not None:
            self.arrive_at_gateway(index, now)
            return
        target = self.fleet.route()
        if target is None:
            log.outcome[index] = RequestExit.REJECTED_NO_CAPACITY
            log.finished_at[index] = now
            return
        engine = target.engine
        if not engine.fits(self.inputs[index]):
            log.outcome[index] = RequestExit.REJECTED_TOO_LONG
            log.finished_at[index] = now
            return
        log.group[index] = target.index
        log.routed_at[index] = now
        engine.enqueue(
            index,
            self.inputs[index],
            self.outputs[index],
            None if self.blocks is None else self.blocks[index],
            now,
            itl_slot=-1 if self.slots is None else self.slots[index],
        )
        self.schedule_step(target)
        if self.processed % 4096 == 0:
            self.bar.update(now)

    # ------------------------------------------------------------------ the gateway, when there is one
    def serving(self) -> list[int]:
        """The groups the gateway routes to (Ready, not draining); their engines report answers."""
        ready = self.fleet.serving_groups
        for group in ready:
            if group.engine.started_log is None:
                group.engine.started_log, group.engine.ended_log = [], []
        return [group.index for group in ready]

    def arrive_at_gateway(self, index: int, now: float) -> None:
        """The gates decide; a request that proceeds waits in the fair queue until its hold ends."""
        assert self.gateway is not None
        hold_until = self.gateway.arrive(index, now, self.serving())
        if hold_until is None:
            self.log.outcome[index] = RequestExit.REJECTED_ADMISSION
            self.log.finished_at[index] = now
            return
        self.push(hold_until, _HOLD, index)
        self.dispatch(now)

    def on_hold_expired(self, index: int, now: float) -> None:
        assert self.gateway is not None
        if self.gateway.expire(index, now):
            self.log.outcome[index] = RequestExit.REJECTED_ADMISSION
            self.log.finished_at[index] = now

    def dispatch(self, now: float) -> None:
        """What the gateway's pump sends now goes to the groups it chose."""
        assert self.gateway is not None
        if not len(self.gateway.queue):
            return
        log = self.log
        for sent in self.gateway.pump(now, self.serving()):
            index, group = sent.index, self.fleet.groups[sent.group]
            if not group.engine.fits(self.inputs[index]):
                self.gateway.release(index)
                log.outcome[index] = RequestExit.REJECTED_TOO_LONG
                log.finished_at[index] = now
                continue
            log.group[index] = group.index
            log.routed_at[index] = now
            group.engine.enqueue(
                index,
                self.inputs[index],
                sent.output_tokens,
                None if self.blocks is None else self.blocks[index],
                now,
                itl_slot=-1 if self.slots is None else self.slots[index],
            )
            self.schedule_step(group)

    def answers(self, group: Group) -> None:
        """First tokens and ends the gateway saw stream back from one group's step (its queue moves
        on after the event, in `handle`)."""
        gateway, engine, log = self.gateway, group.engine, self.log
        assert gateway is not None
        if engine.started_log:
            for index in engine.started_log:
                gateway.started(index)
            engine.started_log.clear()
        if engine.ended_log:
            for index in engine.ended_log:
                if log.outcome[index] == RequestExit.FINISHED:
                    gateway.finished(
                        index, log.arrival[index], log.first_token_at[index], log.finished_at[index]
                    )
                    self.send_children(index, log.finished_at[index])
                else:
                    gateway.release(index)
            engine.ended_log.clear()

    def send_children(self, index: int, answered_at: float) -> None:
        """A session's request was answered: its children follow, each after its tool wait."""
        workload = self.workload
        for child in self.children.get(index, ()):
            assert workload.after_parent_seconds is not None
            self.children_pending += 1
            self.push(answered_at + float(workload.after_parent_seconds[child]), _CHILD, child)

    def result(self) -> SimulationResult:
        log, fleet = self.log, self.fleet
        for index, outcome in enumerate(log.outcome):
            if outcome != RequestExit.PENDING:
                continue
            parent = self.parents[index] if self.parents is not None else -1
            unanswered = parent >= 0 and log.outcome[parent] != RequestExit.FINISHED
            log.outcome[index] = RequestExit.NOT_SENT if unanswered else RequestExit.UNFINISHED
        requests = log.arrays()
        gateway = self.gateway
        if gateway is not None:
            requests["admission"] = np.asarray(gateway.admission, dtype=np.int64)
            requests["infeasible"] = np.asarray(gateway.infeasible, dtype=bool)
            requests["best_effort"] = np.asarray(gateway.best_effort, dtype=bool)
            requests["served_output_tokens"] = np.asarray(gateway.served_output_tokens, dtype=np.int64)
            requests["admission_reason"] = np.asarray(gateway.reason, dtype=np.str_)
        return SimulationResult(
            workload=self.workload,
            requests=requests,
            horizon_seconds=self.horizon,
            end_seconds=min(self.now, self.stop_at),
            gpu_seconds=fleet.gpu_seconds(self.horizon),
            timeline=tuple(fleet.timeline),
            scale_events=tuple(self.scale_events),
            decisions=self.decisions,
            groups=tuple(
                GroupRecord(g.name, g.created_at, g.ready_at, g.ended_at, g.state.value) for g in fleet.groups
            ),
            engine_totals=_engine_totals(fleet),
            wall_seconds=time.perf_counter() - self.started,
            events_processed=self.processed,
            group_transitions=tuple(fleet.transitions),
            backlogged_cost_by_tenant=None if gateway is None else dict(gateway.backlogged_cost),
        )


def _children_of(workload: Workload) -> dict[int, list[int]]:
    """Each session request's children, by index (empty for a workload without sessions)."""
    if workload.parent_index is None:
        return {}
    children: dict[int, list[int]] = {}
    for child, parent in enumerate(workload.parent_index.tolist()):
        if parent >= 0:
            children.setdefault(parent, []).append(child)
    return children


def _engine_totals(fleet: Fleet) -> dict[str, float]:
    engines = [group.engine for group in fleet.groups]
    return {
        "steps": float(sum(engine.steps_total for engine in engines)),
        "gpu_busy_seconds": sum(engine.gpu_busy_seconds_total for engine in engines),
        "preemptions": float(sum(engine.num_preemptions_total for engine in engines)),
        "prefix_cache_queries_tokens": float(sum(engine.prefix_cache_queries_total for engine in engines)),
        "prefix_cache_hits_tokens": float(sum(engine.prefix_cache_hits_total for engine in engines)),
        "generation_tokens": float(sum(engine.generation_tokens_total for engine in engines)),
        "groups_created": float(len(engines)),
        "groups_failed": float(sum(1 for group in fleet.groups if group.state is GroupPhase.FAILED)),
        "requests_lost_to_failures": float(fleet.lost_requests),
    }
