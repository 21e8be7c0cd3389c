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

from goodput.controllers.groups import GroupTransition
from goodput.simulator.engine import Engine
from goodput.simulator.fleet import Fleet, FleetConfig, FleetCounts, Group, GroupPhase, LifecycleEvent
from goodput.simulator.metrics import FleetSample, GroupScrape, MetricsHistory
from goodput.simulator.policy import Autoscaler, FleetObservation, GroupInfo
from goodput.simulator.records import Outcome, RequestLog
from goodput.simulator.workload import Workload

_STEP, _LIFECYCLE, _FAIL, _REPLACE, _SCHEDULED_FAIL, _SCRAPE, _CONTROL, _GROUPS = range(8)


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


def scrape(group: Group, now: float) -> GroupScrape:
    """The group leader's `/metrics` at `now`."""
    engine: Engine = group.engine
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
    workload: Workload, config: SimulationConfig, autoscaler: Autoscaler, progress: bool = False
) -> SimulationResult:
    """Replay `workload` through a fleet driven by `autoscaler`."""
    started = time.perf_counter()
    log = RequestLog(workload)
    fleet = Fleet(config.fleet, log, config.seed)
    history = MetricsHistory()
    scrape_interval = getattr(autoscaler, "scrape_interval_seconds", None) or config.scrape_interval_seconds
    scrape_delay = getattr(autoscaler, "scrape_delay_seconds", None)
    scrape_delay = config.scrape_delay_seconds if scrape_delay is None else scrape_delay
    arrivals = workload.arrival_seconds.tolist()
    inputs = workload.input_tokens.tolist()
    outputs = workload.output_tokens.tolist()
    blocks = workload.prefix_blocks
    with_slots = len(config.fleet.itl_targets_seconds) > 0 and workload.class_index is not None
    slots = workload.class_index.tolist() if with_slots and workload.class_index is not None else None
    horizon = (
        config.horizon_seconds if config.horizon_seconds is not None else (arrivals[-1] if arrivals else 0.0)
    )
    stop_at = max(horizon, arrivals[-1] if arrivals else 0.0) + config.tail_seconds

    heap: list[tuple[float, int, int, int, int]] = []
    counter = 0

    def push(at: float, kind: int, a: int = 0, b: int = 0) -> None:
        nonlocal counter
        counter += 1
        heapq.heappush(heap, (at, counter, kind, a, b))

    def push_lifecycle(events: list[LifecycleEvent]) -> None:
        for event in events:
            kind = _FAIL if event.state is GroupPhase.FAILED else _LIFECYCLE
            push(event.time, kind, event.group, list(GroupPhase).index(event.state))

    scheduled_versions: dict[int, int] = {}

    def schedule_step(group: Group) -> None:
        engine = group.engine
        if engine.step_end is not None and scheduled_versions.get(group.index) != engine.plan_version:
            scheduled_versions[group.index] = engine.plan_version
            push(engine.step_end, _STEP, group.index, engine.plan_version)

    push_lifecycle(fleet.start(config.initial_groups))
    push(0.0, _SCRAPE)
    push(config.fleet.reconcile_interval_seconds, _GROUPS)
    push(max(autoscaler.interval_seconds, config.control_start_seconds), _CONTROL)
    for failure_at in config.fleet.scheduled_failures_seconds:
        push(failure_at, _SCHEDULED_FAIL)

    scale_events: list[ScaleChange] = []
    decisions = 0
    states = list(GroupPhase)
    bar = _Progress(progress, stop_at - config.tail_seconds, autoscaler.name)
    next_arrival = 0
    total = len(arrivals)
    processed = 0
    now = 0.0

    def work_left() -> bool:
        """Arrivals to come or requests in flight: otherwise the run is over."""
        return next_arrival < total or any(
            group.engine.in_flight
            for group in fleet.groups
            if group.state in (GroupPhase.READY, GroupPhase.DRAINING)
        )

    def lose(indices: list[int], at: float) -> None:
        for index in indices:
            log.outcome[index] = Outcome.FAILED
            log.finished_at[index] = at

    while True:
        arrival_at = arrivals[next_arrival] if next_arrival < total else math.inf
        if heap and heap[0][0] < arrival_at:  # at a tie, arrivals first: they join the step composed then
            now, _, kind, a, b = heapq.heappop(heap)
            if now > stop_at:
                break
            processed += 1
            if kind == _STEP:
                group = fleet.groups[a]
                engine = group.engine
                if b != engine.plan_version or scheduled_versions.get(a) != b:
                    continue
                engine.complete_step(now)
                schedule_step(group)
            elif kind == _SCRAPE:
                bar.update(now)
                history.append(
                    FleetSample(
                        now,
                        tuple(
                            scrape(group, now)
                            for group in fleet.groups
                            if group.state in (GroupPhase.READY, GroupPhase.DRAINING)
                        ),
                    )
                )
                if work_left():
                    push(now + scrape_interval, _SCRAPE)
            elif kind == _CONTROL:
                counts = fleet.counts(now)
                observation = FleetObservation(
                    now=now,
                    desired_groups=fleet.desired,
                    placing_groups=counts.placing,
                    loading_groups=counts.loading,
                    ready_groups=counts.ready,
                    draining_groups=counts.draining,
                    min_groups=config.fleet.min_groups,
                    max_groups=config.fleet.max_groups,
                    metrics=history.view(now - scrape_delay),
                    groups=tuple(
                        GroupInfo(g.name, g.state.value, g.created_at, g.ready_at)
                        for g in fleet.groups
                        if g.live or g.state is GroupPhase.DRAINING
                    ),
                )
                recommendation = autoscaler.recommend(observation)
                decisions += 1
                before_desired = fleet.desired
                push_lifecycle(fleet.scale_to(recommendation.desired_groups, now))
                if fleet.desired != before_desired:
                    scale_events.append(
                        ScaleChange(
                            now,
                            before_desired,
                            fleet.desired,
                            recommendation.reason,
                            dict(recommendation.detail),
                        )
                    )
                lose(fleet.take_aborted(), now)
                if work_left():
                    push(now + autoscaler.interval_seconds, _CONTROL)
            elif kind == _GROUPS:
                # The group controller's periodic pass: drains progress, young groups age.
                push_lifecycle(fleet.reconcile(now))
                lose(fleet.take_aborted(), now)
                if work_left():
                    push(now + config.fleet.reconcile_interval_seconds, _GROUPS)
            elif not work_left():
                continue  # lifecycle and failures after the last request change nothing reported
            elif kind == _LIFECYCLE:
                push_lifecycle(fleet.advance_lifecycle(a, states[b], now))
                lose(fleet.take_aborted(), now)
            elif kind == _FAIL:
                lost, replace_at = fleet.fail(a, now)
                lose(lost, now)
                if replace_at is not None:
                    push(replace_at, _REPLACE)
            elif kind == _REPLACE:
                push_lifecycle(fleet.replace(now))
                lose(fleet.take_aborted(), now)
            elif kind == _SCHEDULED_FAIL:
                victim = fleet.pick_failure_victim(now)
                if victim is not None:
                    push(now, _FAIL, victim)
            continue
        if next_arrival >= total:
            break
        # an arrival
        now = arrival_at
        index = next_arrival
        next_arrival += 1
        processed += 1
        target = fleet.route()
        if target is None:
            log.outcome[index] = Outcome.REJECTED_NO_CAPACITY
            log.finished_at[index] = now
            continue
        engine = target.engine
        if not engine.fits(inputs[index]):
            log.outcome[index] = Outcome.REJECTED_TOO_LONG
            log.finished_at[index] = now
            continue
        log.group[index] = target.index
        log.routed_at[index] = now
        engine.enqueue(
            index,
            inputs[index],
            outputs[index],
            None if blocks is None else blocks[index],
            now,
            itl_slot=-1 if slots is None else slots[index],
        )
        schedule_step(target)
        if processed % 4096 == 0:
            bar.update(now)

    bar.close()
    end = min(now, stop_at)
    for index, outcome in enumerate(log.outcome):
        if outcome == Outcome.PENDING:
            log.outcome[index] = Outcome.UNFINISHED
    totals = _engine_totals(fleet)
    return SimulationResult(
        workload=workload,
        requests=log.arrays(),
        horizon_seconds=horizon,
        end_seconds=end,
        gpu_seconds=fleet.gpu_seconds(horizon),
        timeline=tuple(fleet.timeline),
        scale_events=tuple(scale_events),
        decisions=decisions,
        groups=tuple(
            GroupRecord(g.name, g.created_at, g.ready_at, g.ended_at, g.state.value) for g in fleet.groups
        ),
        engine_totals=totals,
        wall_seconds=time.perf_counter() - started,
        events_processed=processed,
        group_transitions=tuple(fleet.transitions),
    )


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
