"""The request path in the simulated world: the gateway's admission gates, fair queue and routing
between the workload and the simulated groups.

Every decision is a call into `controllers/` (`admission.admit`, `fairness.FairQueue`,
`routing.choose_group`, the load views' `slot_wait_seconds`, `free_dispatch_slots`,
`FairQueue.expected_work_ahead_seconds`, the `DrainRateMeter`); this module keeps only the bookkeeping the
gateway process keeps around them (`gateway/server.py`): per group the requests it has in flight,
their predicted work, their KV reservation and the prompts not started yet, the queued work by
tenant, tenant token budgets, and the exact per-request counters it exports. What the gateway
cannot see it does not read: an engine's own queue and KV state stay in the engine; the gateway
learns only what a proxy learns, a request's first streamed token and its end.

The simulation drives it: `arrive` on each arrival, `pump` whenever a slot may have freed or a group
become ready, `expire` when a held request's hold runs out, `observe_engine` after an engine step,
`lose` when a group failed with requests in flight, and `sample` at each scrape round (the
autoscaler reads its figures through the scraped history, as the operator reads them from
Prometheus).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from enum import IntEnum

import numpy as np

from goodput.api.reasons import AdmissionReason
from goodput.controllers.autoscale.model import GatewayClassFigures, GatewayObservation
from goodput.controllers.compile.request_path import RequestPathPolicy
from goodput.controllers.metric_buckets import GATEWAY_TTFT_BUCKETS_SECONDS
from goodput.controllers.requests.admission import (
    AdmissionDecision,
    DrainRateMeter,
    GroupLoad,
    Outcome,
    RequestShape,
    TokenBucket,
    admit,
)
from goodput.controllers.requests.fairness import LOWER_PRECEDENCE_LEVELS, FairQueue, QueuedItem
from goodput.controllers.requests.routing import Candidate, GroupBook, RouteRequest, choose_group
from goodput.controllers.requests.sessions import ChildGrant, Refused
from goodput.estimators.attainment import Histogram, histogram_delta
from goodput.simulator.metrics import HistogramAccumulator
from goodput.simulator.session_desk import SimSessionDesk
from goodput.simulator.workload import Workload


class GatewayTreatment(IntEnum):
    """What the request path did with one request (0: it ran without a gateway)."""

    NONE = 0
    ADMITTED = 1
    DEFERRED = 2
    """Held by the deadline gate (or for lack of a ready group) and dispatched within its hold."""
    DEGRADED = 3
    REJECTED = 4
    """Refused at the door: 429, or 503 with no ready group."""
    HOLD_EXPIRED = 5
    """Proceeded (held or queued), but no group could take it before its hold ran out: 503."""


ADMISSION_NAMES: dict[int, str] = {
    GatewayTreatment.ADMITTED: "admitted",
    GatewayTreatment.DEFERRED: "deferred",
    GatewayTreatment.DEGRADED: "degraded",
    GatewayTreatment.REJECTED: "rejected",
    GatewayTreatment.HOLD_EXPIRED: "hold_expired",
}

_OUTCOME_CODES = {
    Outcome.ADMIT: GatewayTreatment.ADMITTED,
    Outcome.DEFER: GatewayTreatment.DEFERRED,
    Outcome.DEGRADE: GatewayTreatment.DEGRADED,
}


@dataclass(slots=True)
class _ClassCounters:
    """One class's cumulative counters, as the gateway's Prometheus counters hold them."""

    offered: int = 0
    admitted: int = 0
    rejected: int = 0
    infeasible: int = 0
    attaining: int = 0
    missed: int = 0
    ttft: HistogramAccumulator = field(
        default_factory=lambda: HistogramAccumulator(GATEWAY_TTFT_BUCKETS_SECONDS)
    )


@dataclass(frozen=True, slots=True)
class GatewayClassSample:
    """One class's exported series at one scrape: queue gauges and cumulative counters."""

    class_name: str
    waiting_requests: int
    waiting_prompt_tokens: int
    waiting_work_seconds: float
    earliest_slack_seconds: float | None
    offered: int
    admitted: int
    rejected: int
    infeasible: int
    attaining: int
    missed: int
    ttft: Histogram


@dataclass(frozen=True, slots=True)
class GatewaySample:
    """The gateway's `/metrics` at one scrape."""

    classes: tuple[GatewayClassSample, ...]
    running_requests: int
    running_work_seconds: float
    routable_groups: int


@dataclass(frozen=True, slots=True)
class _Held:
    """A request in the fair queue: its class, tenant, predicted work and what it will reserve."""

    index: int
    class_name: str
    output_tokens: int
    work_seconds: float
    kv_tokens: int
    best_effort: bool


@dataclass(frozen=True, slots=True)
class SimulatedDispatch:
    """A request the gateway sends to a group now, with the output budget it is served with."""

    index: int
    group: int
    output_tokens: int


class SimGateway:
    """One gateway process in front of the simulated groups."""

    def __init__(self, policy: RequestPathPolicy, workload: Workload) -> None:
        self.policy = policy
        count = len(workload)
        self._prompt = workload.input_tokens.tolist()
        self._output = workload.output_tokens.tolist()
        self._class_names = _names(
            workload.class_index, workload.class_names, policy.admission.default_class, count
        )
        self._tenants = _names(workload.tenant_index, workload.tenant_names, policy.default_tenant, count)
        self.queue: FairQueue[_Held] = FairQueue(policy.fairness)
        self._items: dict[int, QueuedItem[_Held]] = {}
        self._queued_work_by_tenant: dict[str, float] = {}
        self._groups: dict[int, GroupBook] = {}
        self._dispatched: dict[int, tuple[int, _Held]] = {}
        self._unstarted: set[int] = set()
        self._budgets: dict[str, TokenBucket] = {}
        self.meter = DrainRateMeter()
        self._counters = {name: _ClassCounters() for name in policy.admission.classes}
        self.admission: list[int] = [GatewayTreatment.NONE] * count
        self.reason: list[str] = [""] * count
        self.infeasible: list[bool] = [False] * count
        self.best_effort: list[bool] = [False] * count
        self.served_output_tokens: list[int] = list(self._output)
        self.backlogged_cost: dict[str, float] = {}
        """Fair-queue cost charged per tenant at dispatches made while two or more tenants waited."""
        self.sessions = SimSessionDesk(workload) if workload.has_sessions else None
        self._clock = 0.0  # the latest time the gateway was called at: when a lost request settles

    # ------------------------------------------------------------------ views for the gates
    def _rate(self, serving: int) -> float:
        measured = self.meter.work_seconds_per_second()
        if measured and serving:
            return measured / serving
        return self.policy.capacity_work_seconds_per_second

    def loads(
        self, serving: Sequence[int], now: float, tenant: str | None = None, priority: int = 0
    ) -> list[GroupLoad]:
        """Each serving group's view, as `Gateway.loads` builds it: the work queued ahead (with a
        tenant, what the fair queue serves before its next request: `expected_work_ahead_seconds`)
        spread over the serving groups."""
        rate = self._rate(len(serving))
        ahead = sum(self._queued_work_by_tenant.values())
        if tenant is not None:
            ahead = self.queue.expected_work_ahead_seconds(tenant, priority, now, rate * len(serving))
        share = ahead / len(serving) if serving else ahead
        return [
            self._groups.setdefault(group, GroupBook()).load(
                str(group),
                serving=(True, False),
                waiting_work_seconds=share,
                kv_capacity_tokens=self.policy.kv_capacity_tokens,
                capacity_work_seconds_per_second=rate,
                max_in_flight=self.policy.max_in_flight_per_group,
            )
            for group in serving
        ]

    def _work_seconds(self, prompt_tokens: int, output_tokens: int) -> float:
        pricing = self.policy.admission.pricing
        return pricing.prefill_work_seconds(prompt_tokens) + pricing.decode_work_seconds(
            prompt_tokens, output_tokens
        )

    def _bucket(self, tenant: str, now: float) -> TokenBucket | None:
        limit = self.policy.tenant_tokens_per_minute.get(tenant)
        if limit is None:
            return None
        bucket = self._budgets.get(tenant)
        if bucket is None:
            bucket = self._budgets[tenant] = TokenBucket.full(limit, now)
        return bucket

    # ------------------------------------------------------------------ arrivals
    def arrive(self, index: int, now: float, serving: Sequence[int]) -> float | None:
        """The gates on one arriving request. Returns when its hold ends if it joined the queue
        (the caller schedules `expire` then), None when it was refused at the door."""
        tenant, class_name = self._tenants[index], self._class_names[index]
        prompt, asked = self._prompt[index], self._output[index]
        self._clock = now
        grant: ChildGrant | None = None
        if self.sessions is not None:  # entered into its session before its class's gates, as live
            contract = self.policy.admission.contract_for(class_name)
            entered = self.sessions.enter(index, contract, tenant, prompt, asked, now)
            if isinstance(entered, Refused):
                self.admission[index] = GatewayTreatment.REJECTED
                self.reason[index] = entered.refusal.value
                return None
            if entered is not None:  # charged to the session's tenant, within its budget
                grant = entered
                tenant, asked = grant.tenant, grant.output_tokens
                self._tenants[index] = tenant
        shape = RequestShape(tenant, class_name, prompt, asked, now)
        bucket = self._bucket(tenant, now)
        decision = admit(
            self.policy.admission,
            shape,
            self.loads(serving, now, tenant, self._class_priority(class_name)),
            now,
            tenant_budget=bucket,
        )
        counters = self._counters.setdefault(decision.class_name or class_name, _ClassCounters())
        counters.offered += 1
        self.reason[index] = decision.reason.value
        self.infeasible[index] = decision.infeasible
        counters.infeasible += int(decision.infeasible)
        if not decision.proceeds:
            counters.rejected += 1
            self.admission[index] = GatewayTreatment.REJECTED
            self._settle(index, 0)
            return None
        counters.admitted += 1
        capped = grant is not None and grant.capped
        self.admission[index] = GatewayTreatment.DEGRADED if capped else _OUTCOME_CODES[decision.outcome]
        self.best_effort[index] = decision.best_effort
        self.served_output_tokens[index] = min(asked, decision.output_tokens)
        if bucket is not None:
            self._budgets[tenant] = bucket.spend(decision.budget_tokens, now)
        return self._enqueue(index, now, decision.output_tokens, decision)

    def _class_priority(self, class_name: str) -> int:
        contract = self.policy.admission.contract_for(class_name)
        return contract.priority if contract is not None else 0

    def _enqueue(self, index: int, now: float, output_tokens: int, decision: AdmissionDecision) -> float:
        contract = self.policy.admission.contract_for(decision.class_name)
        assert contract is not None  # admission resolved the class
        tenant, prompt = self._tenants[index], self._prompt[index]
        work = self._work_seconds(prompt, output_tokens)
        held = _Held(index, contract.name, output_tokens, work, prompt + output_tokens, decision.best_effort)
        deferred = decision.outcome is Outcome.DEFER and decision.reason is not AdmissionReason.NO_READY_GROUP
        lower = deferred or decision.best_effort
        item = QueuedItem(
            tenant,
            contract.priority + (LOWER_PRECEDENCE_LEVELS if lower else 0),
            now + contract.ttft_seconds,
            now,
            prompt,
            output_tokens,
            held,
            work_seconds=work,
        )
        self._items[index] = self.queue.push(item)
        self._queued_work_by_tenant[tenant] = self._queued_work_by_tenant.get(tenant, 0.0) + work
        hold = (
            decision.hold_seconds
            if decision.outcome is Outcome.DEFER
            else max(self.policy.admission.max_defer_seconds, contract.ttft_seconds)
        )
        return now + hold

    def _unqueue_work(self, tenant: str, work_seconds: float) -> None:
        left = self._queued_work_by_tenant.get(tenant, 0.0) - work_seconds
        if left > 1e-12 and self.queue.backlog(tenant) > 0:
            self._queued_work_by_tenant[tenant] = left
        else:
            self._queued_work_by_tenant.pop(tenant, None)

    def expire(self, index: int, now: float) -> bool:
        """A hold ran out: a request still queued leaves with a 503 (True), its budget refunded."""
        item = self._items.pop(index, None)
        if item is None or not self.queue.cancel(item):
            return False
        held = item.payload
        self._unqueue_work(item.tenant, held.work_seconds)
        bucket = self._budgets.get(item.tenant)
        if bucket is not None:
            self._budgets[item.tenant] = bucket.refund(item.input_tokens + item.expected_output_tokens, now)
        # Its admission outcome was counted when it proceeded; the 503 is counted here only.
        self.admission[index] = GatewayTreatment.HOLD_EXPIRED
        self._clock = now
        self._settle(index, 0)
        return True

    def _settle(self, index: int, generated_tokens: int) -> None:
        """A session's request left: its session is charged its prompt and what it generated (the
        live gateway's `prompt + generated`), the rest of its reservation given back."""
        if self.sessions is not None:
            self.sessions.settle(index, self._prompt[index] + generated_tokens, self._clock)

    # ------------------------------------------------------------------ dispatch
    def pump(self, now: float, serving: Sequence[int]) -> list[SimulatedDispatch]:
        """SimulatedDispatch queued requests while some serving group has a free slot (`Gateway._pump`)."""
        dispatches: list[SimulatedDispatch] = []
        self._clock = now
        limit = self.policy.max_in_flight_per_group
        chunk = self.policy.admission.floor_model.chunk_tokens
        while len(self.queue) and serving:
            candidates = [
                Candidate(load, self._groups[int(load.name)].free_slots(limit, chunk))
                for load in self.loads(serving, now)
            ]
            if not any(candidate.free_slots > 0 for candidate in candidates):
                break
            head = self.queue.peek(now)
            if head is not None and now > head.arrival_time:
                self.meter.record(now, head.payload.work_seconds)  # a seat freed while requests waited
            backlogged = self.queue.backlogged()
            popped = self.queue.pop(now)
            if popped is None:
                break
            item = popped.item
            held = item.payload
            if len(backlogged) >= 2:
                self.backlogged_cost[item.tenant] = (
                    self.backlogged_cost.get(item.tenant, 0.0) + popped.charged_cost
                )
            self._items.pop(held.index, None)
            self._unqueue_work(item.tenant, held.work_seconds)
            route = choose_group(
                candidates, RouteRequest(item.deadline - now, held.kv_tokens), self.policy.routing
            )
            if route is None:  # unreachable while a slot is free; keep the request rather than lose it
                self._items[held.index] = self.queue.push(item)
                self._queued_work_by_tenant[item.tenant] = (
                    self._queued_work_by_tenant.get(item.tenant, 0.0) + held.work_seconds
                )
                break
            group = int(route.group)
            self._groups[group].dispatched(held.work_seconds, held.kv_tokens, int(self._prompt[held.index]))
            self._dispatched[held.index] = (group, held)
            self._unstarted.add(held.index)
            dispatches.append(SimulatedDispatch(held.index, group, self.served_output_tokens[held.index]))
        return dispatches

    # ------------------------------------------------------------------ answers
    def started(self, index: int) -> None:
        """The request's first token streamed back: its prompt left the group's prefill pipeline."""
        entry = self._dispatched.get(index)
        if entry is not None and index in self._unstarted:
            self._unstarted.discard(index)
            self._groups[entry[0]].started(int(self._prompt[index]))

    def release(self, index: int, generated_tokens: int = 0) -> tuple[str, bool] | None:
        """The request left its group (answered, failed or aborted): free its slot and reservation.
        Returns its class and whether it was served best effort; None when the gateway never sent it."""
        entry = self._dispatched.pop(index, None)
        if entry is None:
            return None
        self._settle(index, generated_tokens)
        group, held = entry
        started = index not in self._unstarted
        self._unstarted.discard(index)
        self._groups[group].released(
            held.work_seconds, held.kv_tokens, int(self._prompt[index]), started=started
        )
        return held.class_name, held.best_effort

    def finished(self, index: int, arrival: float, first_token_at: float, finished_at: float) -> None:
        """An answer ended: judged against its class as `Gateway._observe` judges it."""
        self._clock = finished_at
        released = self.release(index, self.served_output_tokens[index])
        if released is None:
            return
        class_name, best_effort = released
        contract = self.policy.admission.contract_for(class_name)
        assert contract is not None
        counters = self._counters[class_name]
        ttft = first_token_at - arrival
        counters.ttft.observe(ttft)
        generated = self.served_output_tokens[index]
        mean_gap = (finished_at - first_token_at) / (generated - 1) if generated > 1 else 0.0
        met = ttft <= contract.ttft_seconds and mean_gap <= contract.itl_seconds
        if contract.e2e_seconds is not None:
            met = met and finished_at - arrival <= contract.e2e_seconds
        if not best_effort:
            counters.attaining += int(met)
            counters.missed += int(not met)

    def holds_requests(self) -> bool:
        return len(self.queue) > 0 or bool(self._dispatched)

    # ------------------------------------------------------------------ exported figures
    def sample(self, now: float, serving: Sequence[int]) -> GatewaySample:
        """Its `/metrics` now, as `Gateway.publish_gauges` and its counters write them."""
        pooled = sum(load.capacity_work_seconds_per_second for load in self.loads(serving, now))
        queued = sum(self._queued_work_by_tenant.values())
        wait = queued / pooled if pooled > 0 else math.inf
        by_class: dict[str, list[QueuedItem[_Held]]] = {name: [] for name in self._counters}
        for item in self.queue.items():
            by_class.setdefault(item.payload.class_name, []).append(item)
        classes = []
        for name, items in by_class.items():
            counters = self._counters.setdefault(name, _ClassCounters())
            earliest = min((item.deadline - now for item in items), default=math.inf)
            slack = earliest - wait if items and math.isfinite(earliest) else None
            classes.append(
                GatewayClassSample(
                    class_name=name,
                    waiting_requests=len(items),
                    waiting_prompt_tokens=sum(item.input_tokens for item in items),
                    waiting_work_seconds=sum(item.payload.work_seconds for item in items),
                    earliest_slack_seconds=slack,
                    offered=counters.offered,
                    admitted=counters.admitted,
                    rejected=counters.rejected,
                    infeasible=counters.infeasible,
                    attaining=counters.attaining,
                    missed=counters.missed,
                    ttft=counters.ttft.snapshot(),
                )
            )
        books = self._groups.values()
        return GatewaySample(
            classes=tuple(classes),
            running_requests=sum(book.in_flight for book in books),
            running_work_seconds=sum(book.running_work_seconds for book in books),
            routable_groups=len(serving),
        )


def _names(index: np.ndarray | None, names: tuple[str, ...], default: str, count: int) -> list[str]:
    """Per request, its class or tenant name (the default when the workload has none)."""
    if index is None or not names:
        return [default] * count
    return [names[int(i)] for i in index.tolist()]


def gateway_observation(
    samples: Sequence[tuple[float, GatewaySample]],
    now: float,
    window_seconds: float,
    recent_window_seconds: float | None = None,
) -> GatewayObservation | None:
    """What the operator reads from Prometheus about the gateway at `now` (`gateway_from_result`):
    the latest scrape's gauges, its age, the counters' increase over the window before it, and the
    offered requests' per-second rate over the recent window (as PromQL `rate` reads it: between the
    first and the last sample inside it)."""
    if not samples:
        return None
    latest_time, latest = samples[-1]
    earlier = next((sample for time, sample in samples if time >= latest_time - window_seconds - 1e-9), None)
    before = {entry.class_name: entry for entry in earlier.classes} if earlier is not None else {}
    recent_window = window_seconds if recent_window_seconds is None else recent_window_seconds
    first_time, first = next(
        (pair for pair in samples if pair[0] >= latest_time - recent_window - 1e-9), samples[-1]
    )
    first_offered = {entry.class_name: entry.offered for entry in first.classes}
    span = latest_time - first_time
    classes = []
    for entry in latest.classes:
        figures = _class_figures(entry, before.get(entry.class_name), earlier is latest)
        if span > 0:
            recent = (entry.offered - first_offered.get(entry.class_name, 0)) / span
            figures = replace(figures, recent_offered_per_second=max(0.0, recent))
        classes.append(figures)
    return GatewayObservation(
        age_seconds=max(0.0, now - latest_time),
        classes=tuple(classes),
        running_requests=float(latest.running_requests),
        running_work_seconds=latest.running_work_seconds,
        routable_groups=latest.routable_groups,
    )


def _class_figures(
    entry: GatewayClassSample, start: GatewayClassSample | None, single_sample: bool
) -> GatewayClassFigures:
    """One class's figures: gauges as they are, counters as their increase since `start` (from zero
    for a series that appeared inside the window, as PromQL `increase` counts a new series); with a
    single sample in the window there is no increase and no latency histogram yet."""

    def increase(read: Callable[[GatewayClassSample], int]) -> float:
        return float(read(entry) - (read(start) if start is not None else 0))

    return GatewayClassFigures(
        class_name=entry.class_name,
        waiting_requests=float(entry.waiting_requests),
        waiting_prompt_tokens=float(entry.waiting_prompt_tokens),
        waiting_work_seconds=entry.waiting_work_seconds,
        earliest_slack_seconds=entry.earliest_slack_seconds,
        offered_requests=increase(lambda e: e.offered),
        admitted_requests=increase(lambda e: e.admitted),
        rejected_requests=increase(lambda e: e.rejected),
        infeasible_requests=increase(lambda e: e.infeasible),
        attaining_requests=increase(lambda e: e.attaining),
        missed_requests=increase(lambda e: e.missed),
        ttft=None
        if single_sample
        else (entry.ttft if start is None else histogram_delta(entry.ttft, start.ttft)),
    )
