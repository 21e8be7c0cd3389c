"""One ModelGroup's request path in the gateway: admission, fair queue, routing and proxying to its
Ready leaders. The gateway process holds one per ModelGroup it serves; `front` reads each request
and hands it to the one its `model` names.

Per request: read it (400 for anything unreadable), run the admission gates on the current load
(`controllers.requests.admission`), queue what proceeds in the fair queue
(`controllers.requests.fairness`), and when a group has a free slot, dispatch the request the
counters choose to the group routing picks (`controllers.requests.routing`); then proxy the
engine's answer, streamed or not. The gateway keeps at most `max_in_flight_per_group` requests on
each group, so contention is resolved here, by fairness and deadlines, rather than in the engine's
first-come queue.

Responses carry `X-Goodput-Outcome` (admitted, degraded, deferred), `X-Goodput-Reason`,
`X-Goodput-Group` and `X-Goodput-Served-By` (ModelGroup/model revision); a degraded request also
`X-Goodput-Max-Tokens` (the lowered budget), and one served on a rung of its class's degrade ladder
`X-Goodput-Degraded` (`gateway.ladder`). A class with a session budget answers within its session
(`gateway.sessions`: 404, 409, 410 and 429 with a `session_...` code). Status codes:
400 unreadable request, unknown class, prompt beyond the context or the class's limits; 404 a
model no ModelGroup of the gateway serves; 408 a body that did not arrive in time; 409 a duplicate
idempotency key whose answer cannot be replayed; 413 a body over the size limit; 429 overload,
infeasible, tenant budget or retry budget, with Retry-After; 502 the engine failed; 503 no group
became ready in time, or the bodies in flight hold the whole body budget, or the request's
ModelGroup left the gateway while it waited, with Retry-After. What clients may hold of the gateway
(connection time, connections, body bytes) is bounded by `limits.ClientLimits`, enforced in `front`
and `connections`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from goodput.api.reasons import AdmissionReason, RouteReason
from goodput.controllers.compile.request_path import RequestPathPolicy
from goodput.controllers.requests.adapters import AdapterRefused, choose_adapter_group, with_load_time
from goodput.controllers.requests.admission import (
    AdmissionDecision,
    DrainRateMeter,
    GroupLoad,
    IdempotencyLedger,
    KeyState,
    Outcome,
    RequestShape,
    RetryBudget,
    TokenBucket,
    admit,
)
from goodput.controllers.requests.calibration import TtftCalibration, TtftCalibrationSettings
from goodput.controllers.requests.degrade import without_marks
from goodput.controllers.requests.fairness import LOWER_PRECEDENCE_LEVELS, FairQueue, QueuedItem
from goodput.controllers.requests.routing import (
    Candidate,
    GroupBook,
    Route,
    RouteRequest,
    choose_group,
    prefix_key,
)
from goodput.controllers.requests.tool_waits import WaitAction
from goodput.estimators.feasibility import ttft_floor_seconds
from goodput.estimators.work import kv_byte_seconds
from goodput.gateway.adapters import AdapterBook, AdapterLoadError, EngineCall, LoadOutcome
from goodput.gateway.groups import GroupEndpoint, GroupSource
from goodput.gateway.ladder import LaterDesk, needs_ladder, walk_ladder
from goodput.gateway.metrics import GatewayMetrics
from goodput.gateway.requests import SESSION_HEADER, ParsedRequest, error_body
from goodput.gateway.sessions import GENERATED_KEY, STREAM_KEY, SessionDesk

log = logging.getLogger("goodput.gateway")

CLASS_HEADER = "X-Goodput-Class"
TENANT_HEADER = "X-Goodput-Tenant"
RETRY_HEADER = "X-Goodput-Retry"
IDEMPOTENCY_HEADER = "Idempotency-Key"
MAX_SESSIONS = 100_000
MAX_KEPT_ANSWERS = 10_000
MAX_TRACKED_TENANTS = 10_000
# How often the deadline gate's corrections are worked out again from the requests seen: a pass over
# the recent ones, kept off each request's path.
TTFT_CORRECTION_REFRESH_SECONDS = 0.25


@dataclass(slots=True)
class Pending:
    """A request in the fair queue, waiting for a group."""

    future: asyncio.Future[str]
    work_seconds: float
    kv_tokens: int
    prefix: bytes | None
    session: str | None
    prompt_tokens: int = 0
    started: bool = False
    class_name: str = ""
    adapter: str | None = None


@dataclass(slots=True)
class TenantCorrection:
    """One tenant's measured deadline-gate error on this ModelGroup, and the correction worked out from
    it last (`due`: when to work it out again)."""

    calibration: TtftCalibration
    ttft_correction: float = 1.0
    due: float = -math.inf


@dataclass(slots=True)
class RoutedGroup:
    """One group: where its endpoints are, and what the gateway sent there (`GroupBook`)."""

    endpoint: GroupEndpoint
    book: GroupBook = field(default_factory=GroupBook)


@dataclass(frozen=True, slots=True)
class Answer:
    """A complete non-streamed answer, kept to replay for a duplicate idempotency key."""

    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)

    def response(self) -> web.Response:
        return web.Response(
            status=self.status, body=self.body, headers=self.headers, content_type="application/json"
        )


@dataclass(slots=True)
class Admitted:
    """What one request carries from admission to its answer."""

    parsed: ParsedRequest
    shape: RequestShape
    decision: AdmissionDecision
    tenant_label: str
    arrival: float
    item: QueuedItem[Pending] | None = None
    group: str | None = None
    relaying: bool = False  # a stream's first bytes went to the client
    marks: Mapping[str, str] = field(default_factory=dict)  # session and degrade headers to answer with


@dataclass(slots=True)
class StreamTimes:
    """When a relayed stream's events arrived: the first, the last, and the gaps between them (a
    chunk of several events spreads its gap over them), for the TTFT and ITL histograms."""

    first_at: float | None = None
    last_at: float = 0.0
    gaps: list[float] = field(default_factory=list)
    events: int = 0

    def arrived(self, chunk: bytes, now: float) -> bool:
        """Count the chunk's events (`data: ` lines, less the closing `[DONE]`); True for the first."""
        count = stream_events(chunk)
        if count <= 0:
            return False
        first = self.first_at is None
        if first:
            self.first_at = now
        else:
            self.gaps.append((now - self.last_at) / count)
        self.last_at = now
        self.events += count
        return first


class RelayedStream(web.StreamResponse):
    """A relayed stream whose head goes out in one write with its first chunk, as aiohttp's own
    `web.Response` sends its head with its body, and whose last chunk goes with the stream's end:
    two writes (system calls) fewer a request. When no chunk came with the engine's head, the relay
    sends the head alone at once, so a client never waits on the engine's first token to see it."""

    _send_headers_immediately = False


def refusal_field(reason: AdmissionReason, parsed: ParsedRequest, context_tokens: int) -> str | None:
    """The field a contract refusal (400) names, as every other 400 does: the class header, the
    prompt, or the output budget that pushed the request past the class's limit or the context."""
    if reason is AdmissionReason.UNKNOWN_CLASS:
        return CLASS_HEADER
    if reason is AdmissionReason.PROMPT_OVER_CLASS_LIMIT:
        return parsed.prompt_field
    if reason is AdmissionReason.OUTPUT_OVER_CLASS_LIMIT:
        return parsed.output_field
    if reason is AdmissionReason.BEYOND_CONTEXT:
        prompt_fits = parsed.prompt_tokens < context_tokens
        return parsed.output_field if prompt_fits and parsed.requested_output_tokens else parsed.prompt_field
    return None


def json_response(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(body, status=status, headers=headers)


def stream_events(chunk: bytes) -> int:
    """The token events in a chunk of an engine's server-sent-event stream (its closing `[DONE]`
    is none): what the gateway and the endpoint picker count as tokens generated."""
    return chunk.count(b"data: ") - chunk.count(b"data: [DONE]")


class ModelGroupRetiredError(Exception):
    """The ModelGroup a queued request waited for left the gateway; the message says how."""


class AdapterRefusedError(Exception):
    """Every serving group is in a load-failure backoff for the request's adapter."""

    def __init__(self, refused: AdapterRefused, now: float) -> None:
        super().__init__(
            f"adapter {refused.adapter!r} failed to load on every serving group; "
            f"retried after {max(0.0, refused.backoff_ends - now):.0f}s"
        )
        self.retry_after_seconds = max(1, math.ceil(refused.backoff_ends - now))


def adapter_failed_response(
    message: str, status: int, retry_after_seconds: int | None = None
) -> web.Response:
    """502 (the engine refused the load; its message quoted) or 503 (in the backoff after a failed
    load) with code `adapter_load_failed`, naming the adapter."""
    headers = {"Retry-After": str(retry_after_seconds)} if retry_after_seconds is not None else None
    kind = "UpstreamError" if status == 502 else "OverloadedError"
    return json_response(status, error_body(message, kind, "model", "adapter_load_failed"), headers)


def retired_response(reason: str) -> web.Response:
    """503 for a request whose ModelGroup left the gateway before an engine took it: the client may
    retry (the model may be served again, or by another ModelGroup)."""
    return json_response(
        503, error_body(reason, "OverloadedError", "model", "ModelGroupRetired"), {"Retry-After": "1"}
    )


class Gateway:
    """One ModelGroup's request path in the gateway process: its groups, fair queue, budgets,
    ledgers and metrics. The process serves many (`front.GatewayFront`), each with its own."""

    def __init__(
        self,
        policy: RequestPathPolicy,
        source: GroupSource,
        *,
        metrics: GatewayMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self.source = source
        self.metrics = metrics or GatewayMetrics()
        self.clock = clock
        self.retired: str | None = None  # why the ModelGroup left the gateway, once it has
        self.groups: dict[str, RoutedGroup] = {}
        self.queue: FairQueue[Pending] = FairQueue(policy.fairness)
        self.queued_work_seconds = 0.0
        self.ledger = IdempotencyLedger()
        self.answers: OrderedDict[tuple[str, str], asyncio.Future[Answer]] = OrderedDict()
        self.budgets: dict[str, TokenBucket] = {}
        self.retry_budgets: OrderedDict[str, RetryBudget] = OrderedDict()
        self.sessions: OrderedDict[str, str] = OrderedDict()
        self.meter = DrainRateMeter()
        self.calibration_settings = TtftCalibrationSettings()
        self.corrections: dict[str, TenantCorrection] = {}  # by tenant label
        self.desk = SessionDesk(clock)
        self.desk.waits.policy = policy.tool_waits
        self.desk.charge_wait = lambda wait: self.queue.charge(wait.tenant, 0.0, 0.0, wait.kv_byte_seconds)
        self.later = LaterDesk(clock)
        self.siblings: Callable[[str], Gateway | None] = lambda _name: None  # set by `front`
        self.adapters = AdapterBook(self._count_adapter_call)
        self._session: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self, session: aiohttp.ClientSession) -> None:
        """Follow the group source and publish the gauges; requests go upstream over `session`, the
        gateway process's one connection pool."""
        self._session = session
        self._tasks.append(asyncio.create_task(self.source.run(self.on_groups), name="group-source"))
        self._tasks.append(asyncio.create_task(self._publish_gauges(), name="gauges"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        await self.later.stop()

    async def retire(self, reason: str) -> None:
        """The ModelGroup left the gateway (deleted, or no longer selected): every request still
        queued is answered 503 with `reason` rather than dropped, requests in flight finish on their
        engines, and the queue gauges' series go, so the autoscaler reads no stale queue."""
        self.retired = reason
        for item in list(self.queue.items()):
            future = item.payload.future
            if not future.done():
                future.set_exception(ModelGroupRetiredError(reason))
        await self.stop()
        self.forget_gauges()

    def update_policy(self, policy: RequestPathPolicy) -> None:
        """A changed ModelGroup or SLOPolicy, applied without a restart: the next request is admitted,
        queued and routed under it. Queued requests keep their place and deadlines, tenants their
        virtual counters; a tenant budget whose limit changed starts again, full, at the new limit."""
        if policy.model_group != self.policy.model_group:
            raise ValueError(
                f"this request path is {self.policy.model_group!r}'s, not {policy.model_group!r}'s: "
                "a ModelGroup gets its own"
            )
        limits = policy.tenant_tokens_per_minute
        self.budgets = {
            tenant: bucket
            for tenant, bucket in self.budgets.items()
            if tenant in limits and bucket.burst_tokens == limits[tenant]
        }
        if _predicts_differently(self.policy, policy):  # the error measured was the old figures'
            self._forget_corrections()
        self.policy = policy
        self.queue.policy = policy.fairness
        self.desk.waits.policy = policy.tool_waits
        self._pump()

    def on_groups(self, endpoints: Mapping[str, GroupEndpoint]) -> None:
        """Replace the group set; in-flight counts of a group that stays are kept."""
        fresh: dict[str, RoutedGroup] = {}
        seen = set(self.groups)
        for name, endpoint in endpoints.items():
            state = self.groups.get(name)
            if state is None:
                fresh[name] = RoutedGroup(endpoint)
            else:
                state.endpoint = endpoint
                fresh[name] = state
        self.groups = fresh
        self.adapters.keep_groups(set(fresh))
        self.desk.waits.keep_groups(set(fresh))
        if self.policy.adapters.sources and self._session is not None:
            self._tasks = [task for task in self._tasks if not task.done()]
            for name in fresh.keys() - seen:
                self._tasks.append(asyncio.create_task(self._learn_adapters(name), name="learn-adapters"))
        routable = sum(1 for state in fresh.values() if state.endpoint.ready and not state.endpoint.draining)
        self.metrics.ready_groups.labels(self.policy.model_group).set(routable)
        self._pump()

    # --- load views ----------------------------------------------------------------------------

    def loads(self, tenant: str | None = None, priority: int = 0) -> list[GroupLoad]:
        """Each group's view for the gates; with a tenant, the queued work ahead of its next request
        is what the fair queue serves before it (`FairQueue.expected_work_ahead_seconds`: its place in
        the fair order, and what the tenants ahead of it send while it waits), spread over the
        serving groups; without one, the whole queue."""
        serving = [s for s in self.groups.values() if s.endpoint.ready and not s.endpoint.draining]
        measured = self.meter.work_seconds_per_second()
        rate = (
            measured / len(serving) if measured and serving else self.policy.capacity_work_seconds_per_second
        )
        ahead = self.queued_work_seconds
        if tenant is not None:
            ahead = self.queue.expected_work_ahead_seconds(
                tenant, priority, self.clock(), rate * len(serving)
            )
        share = ahead / len(serving) if serving else ahead
        return [
            state.book.load(
                name,
                serving=(state.endpoint.ready, state.endpoint.draining),
                waiting_work_seconds=share,
                kv_capacity_tokens=self.policy.kv_capacity_tokens - self.desk.waits.kept_tokens(name),
                capacity_work_seconds_per_second=rate,
                max_in_flight=self.policy.max_in_flight_per_group,
            )
            for name, state in self.groups.items()
        ]

    def ttft_correction(self, tenant_label: str, now: float) -> float:
        """The deadline gate's measured correction for a tenant's requests (`TtftCalibration`; 1.0
        before any was measured), worked out again at most once every TTFT_CORRECTION_REFRESH_SECONDS.

        Each tenant has its own: under fair queueing a heavy tenant's requests wait behind the light
        tenants' later arrivals, which its prediction counts only on average, while a light tenant's
        go ahead of most of the queue; one correction for both would refuse the light tenant for the
        heavy one's error."""
        entry = self.corrections.get(tenant_label)
        if entry is None:
            return 1.0
        if now >= entry.due:
            entry.ttft_correction = entry.calibration.ttft_correction(now)
            entry.due = now + TTFT_CORRECTION_REFRESH_SECONDS
        return entry.ttft_correction

    def _forget_corrections(self) -> None:
        for tenant_label in self.corrections:
            with contextlib.suppress(KeyError):
                self.metrics.ttft_correction.remove(self.policy.model_group, tenant_label)
        self.corrections.clear()

    def candidates(self) -> list[Candidate]:
        limit = self.policy.max_in_flight_per_group
        chunk = self.policy.admission.floor_model.chunk_tokens
        loads = {load.name: load for load in self.loads()}
        return [
            Candidate(loads[name], state.book.free_slots(limit, chunk)) for name, state in self.groups.items()
        ]

    # --- dispatch ------------------------------------------------------------------------------

    def _pump(self) -> None:
        """Dispatch queued requests while some routable group has a free slot."""
        now = self.clock()
        waiting_for_an_adapter_slot: list[QueuedItem[Pending]] = []
        try:
            self._dispatch_queued(now, waiting_for_an_adapter_slot)
        finally:  # back in their places once the others had their turn: nothing queued is lost
            for item in waiting_for_an_adapter_slot:
                self.queue.put_back(item)
                self._queue_work(item.payload.work_seconds)

    def _dispatch_queued(self, now: float, held_back: list[QueuedItem[Pending]]) -> None:
        """Dispatch in the fair order while a routable group has a free slot; a request for an
        adapter that no group can load now goes to `held_back` rather than hold up the rest."""
        while len(self.queue):
            candidates = self.candidates()
            if not any(c.load.serving and c.free_slots > 0 for c in candidates):
                return
            dispatch = self.queue.pop(now)
            if dispatch is None:
                return
            item = dispatch.item
            pending = item.payload
            self._unqueue_work(pending.work_seconds)
            if pending.future.done():
                self._seat_freed(now, item)
                self.queue.charge(item.tenant, -item.input_tokens, -item.expected_output_tokens)
                continue
            wait_budget = item.deadline - now
            session_group = self.sessions.get(pending.session) if pending.session else None
            request = RouteRequest(wait_budget, pending.kv_tokens, pending.prefix, session_group)
            route = (
                choose_group(candidates, request, self.policy.routing)
                if pending.adapter is None
                else self._route_adapter(candidates, request, pending.adapter, now)
            )
            if isinstance(route, AdapterRefused):
                self.queue.charge(item.tenant, -item.input_tokens, -item.expected_output_tokens)
                pending.future.set_exception(AdapterRefusedError(route, now))
                continue
            if route is None and pending.adapter is not None:  # every slot's adapter is in use
                held_back.append(item)
                continue
            self._seat_freed(now, item)
            if route is None:  # unreachable while a slot is free; keep the request rather than lose it
                self.queue.push(item)
                self._queue_work(pending.work_seconds)
                return
            self.groups[route.group].book.dispatched(
                pending.work_seconds, pending.kv_tokens, pending.prompt_tokens
            )
            self.desk.waits.written(route.group, pending.prompt_tokens, now)
            # A non-streamed answer shows no first token: its prefill is taken as started after its
            # zero-load TTFT floor; a stream's first chunk marks it sooner.
            floor = ttft_floor_seconds(self.policy.admission.floor_model, pending.prompt_tokens)
            asyncio.get_running_loop().call_later(floor, self._started, route.group, pending)
            if pending.session:
                self._remember_session(pending.session, route.group)
            pending.future.set_result(route.group)

    def _seat_freed(self, now: float, item: QueuedItem[Pending]) -> None:
        """A seat was free for a request that had waited: the drain rate the admission reads."""
        if now > item.arrival_time:
            self.meter.record(now, item.payload.work_seconds)

    def _route_adapter(
        self, candidates: list[Candidate], request: RouteRequest, adapter: str, now: float
    ) -> Route | AdapterRefused | None:
        """Route a request naming an adapter (`choose_adapter_group`) and record the choice in the
        adapter book at once, starting the load (and the eviction) it needs."""
        policy = self.policy.adapters
        holdings = self.adapters.holdings(now, policy.use_half_life_seconds)
        choice = choose_adapter_group(candidates, holdings, adapter, request, policy=policy, now=now)
        if choice is None or isinstance(choice, AdapterRefused):
            return choice
        if self._session is None:  # not started: nothing can be sent anywhere yet
            return None
        call = EngineCall(self._session, self.groups[choice.group].endpoint.base_url, choice.group)
        self.adapters.reserve(choice, adapter, call, policy=policy, now=now)
        self.metrics.adapter_routes.labels(self.policy.model_group, adapter, choice.placement.value).inc()
        reason = RouteReason.LEAST_WORK if choice.fits else RouteReason.OVER_BUDGET
        return Route(choice.group, reason)

    def _count_adapter_call(self, outcome: LoadOutcome) -> None:
        result = "succeeded" if outcome.succeeded else "failed"
        self.metrics.adapter_loads.labels(
            self.policy.model_group, outcome.adapter, outcome.action, result
        ).inc()

    async def _learn_adapters(self, group: str) -> None:
        """What a newly seen group's engine already holds (its `/v1/models`), so a gateway restart
        neither loads an adapter twice nor overfills an engine."""
        state = self.groups.get(group)
        if state is None or self._session is None:
            return
        try:
            async with self._session.get(state.endpoint.base_url + "/v1/models") as response:
                models = await response.json(content_type=None) if response.status == 200 else {}
        except (aiohttp.ClientError, TimeoutError, ValueError) as error:
            log.info("group %s: its adapters could not be read (%s); learnt from loads instead", group, error)
            return
        if group in self.groups:
            self.adapters.learn(group, models, self.policy.served_model)

    def _queue_work(self, work_seconds: float) -> None:
        self.queued_work_seconds += work_seconds

    def _unqueue_work(self, work_seconds: float) -> None:
        self.queued_work_seconds = (
            max(0.0, self.queued_work_seconds - work_seconds) if len(self.queue) else 0.0
        )

    def _remember_session(self, session: str, group: str) -> None:
        self.sessions[session] = group
        self.sessions.move_to_end(session)
        while len(self.sessions) > MAX_SESSIONS:
            self.sessions.popitem(last=False)

    def _started(self, group: str, pending: Pending) -> None:
        """The request's prefill began: its prompt leaves the group's prefill pipeline."""
        if pending.started:
            return
        pending.started = True
        state = self.groups.get(group)
        if state is not None:
            state.book.started(pending.prompt_tokens)
        self._pump()

    def _release(self, group: str, pending: Pending) -> None:
        started, pending.started = pending.started, True
        state = self.groups.get(group)
        if state is not None:
            state.book.released(
                pending.work_seconds, pending.kv_tokens, pending.prompt_tokens, started=started
            )
        self._pump()

    async def _publish_gauges(self) -> None:
        """Queue gauges once a second (the autoscaler's inputs); an O(queue) pass, off the hot path."""
        while True:
            self.publish_gauges()
            await asyncio.sleep(1.0)

    def publish_gauges(self) -> None:
        """Per class: the requests waiting here, their prompt tokens, work and least slack; every
        class of the policy is written (zeros when none waits), so a class's series never vanish."""
        name = self.policy.model_group
        now = self.clock()
        pooled = sum(c.load.capacity_work_seconds_per_second for c in self.candidates() if c.load.serving)
        wait = self.queued_work_seconds / pooled if pooled > 0 else math.inf
        by_class: dict[str, list[QueuedItem[Pending]]] = {cls: [] for cls in self.policy.admission.classes}
        for item in self.queue.items():
            by_class.setdefault(item.payload.class_name, []).append(item)
        for cls, items in by_class.items():
            earliest = min((item.deadline - now for item in items), default=math.inf)
            self.metrics.queued_requests.labels(name, cls).set(len(items))
            self.metrics.queued_work.labels(name, cls).set(sum(i.payload.work_seconds for i in items))
            self.metrics.queued_prompt_tokens.labels(name, cls).set(sum(i.input_tokens for i in items))
            self.metrics.earliest_slack.labels(name, cls).set(
                earliest - wait if math.isfinite(earliest) else math.inf
            )
        self.metrics.running_work.labels(name).set(
            sum(s.book.running_work_seconds for s in self.groups.values())
        )
        self.metrics.running_requests.labels(name).set(sum(s.book.in_flight for s in self.groups.values()))
        self.desk.publish_waiting(self)
        for tenant_label in self.corrections:
            correction = self.ttft_correction(tenant_label, now)
            self.metrics.ttft_correction.labels(name, tenant_label).set(correction)

    def forget_gauges(self) -> None:
        """Take this ModelGroup's gauge series out of the metrics (it left the gateway): a series
        left behind would show a queue nobody serves."""
        name = self.policy.model_group
        for cls in self.policy.admission.classes:
            for gauge in (
                self.metrics.queued_requests,
                self.metrics.queued_work,
                self.metrics.queued_prompt_tokens,
                self.metrics.earliest_slack,
            ):
                with contextlib.suppress(KeyError):
                    gauge.remove(name, cls)
        self._forget_corrections()
        for gauge in (self.metrics.running_work, self.metrics.running_requests, self.metrics.ready_groups):
            with contextlib.suppress(KeyError):
                gauge.remove(name)
        for action in (WaitAction.KEEP, WaitAction.OFFLOAD):
            with contextlib.suppress(KeyError):
                self.metrics.waiting_kv_tokens.remove(name, action.value)

    # --- handlers ------------------------------------------------------------------------------

    def model_entry(self) -> dict[str, Any]:
        """This ModelGroup's entry in `/v1/models` (OpenAI's model object, and vLLM's max_model_len)."""
        served = self.policy.served_model
        return {
            "id": served,
            "object": "model",
            "owned_by": "goodput",
            "root": served,
            "max_model_len": self.policy.admission.context_tokens,
        }

    def adapter_entries(self) -> list[dict[str, Any]]:
        """Each declared adapter in `/v1/models`, as vLLM lists a LoRA: `parent` is the base model,
        `root` what the adapter is loaded from."""
        served = self.policy.served_model
        return [
            {
                "id": name,
                "object": "model",
                "owned_by": "goodput",
                "root": source,
                "parent": served,
                "max_model_len": self.policy.admission.context_tokens,
            }
            for name, source in self.policy.adapters.sources.items()
        ]

    def adapter_of(self, parsed: ParsedRequest) -> str | None:
        """The adapter a request names, or None for the base model."""
        return parsed.model if self.policy.adapters.declares(parsed.model) else None

    def tenant_label(self, tenant: str) -> str:
        if tenant in self.policy.listed_tenants or tenant == self.policy.default_tenant:
            return tenant
        return "other"

    def shape_of(self, headers: Mapping[str, str], parsed: ParsedRequest, arrival: float) -> RequestShape:
        """What the gates read of a request: its body's figures and goodput's headers (`headers` is
        looked up by the headers' canonical names, so it must match names case-insensitively)."""
        return RequestShape(
            tenant=headers.get(TENANT_HEADER) or self.policy.default_tenant,
            class_name=headers.get(CLASS_HEADER),
            prompt_tokens=parsed.prompt_tokens,
            requested_output_tokens=parsed.requested_output_tokens,
            arrival_time=arrival,
            is_retry=headers.get(RETRY_HEADER, "").lower() in ("1", "true", "yes"),
        )

    async def serve(self, request: web.Request, parsed: ParsedRequest, arrival: float) -> web.StreamResponse:
        """A request for this ModelGroup's model, read whole: admit, queue, route and proxy it."""
        shape = self.shape_of(request.headers, parsed, arrival)
        tenant = shape.tenant
        key = request.headers.get(IDEMPOTENCY_HEADER)
        if key:
            duplicate = await self._duplicate(tenant, key, parsed.stream)
            if duplicate is not None:
                return duplicate
        answer_future: asyncio.Future[Answer] | None = None
        if key and not parsed.stream:
            answer_future = asyncio.get_running_loop().create_future()
            self._keep_answer((tenant, key), answer_future)
        response: web.StreamResponse | None = None
        try:
            response = await self.desk.serve(self, request, parsed, shape)
            return response
        finally:
            if key:
                self._settle_key(tenant, key, response, answer_future)

    async def _duplicate(self, tenant: str, key: str, stream: bool) -> web.StreamResponse | None:
        """The answer to a duplicate idempotency key, or None when this request owns the key."""
        state = self.ledger.claim(tenant, key, self.clock())
        if state is KeyState.NEW:
            return None
        kept = self.answers.get((tenant, key))
        if kept is not None and not stream:
            answer = await asyncio.shield(kept)
            return answer.response()
        message = (
            f"a request with Idempotency-Key {key!r} is "
            + ("in flight" if state is KeyState.IN_FLIGHT else "already answered")
            + " and its answer cannot be replayed"
        )
        return json_response(409, error_body(message, "ConflictError", IDEMPOTENCY_HEADER))

    def _keep_answer(self, key: tuple[str, str], future: asyncio.Future[Answer]) -> None:
        self.answers[key] = future
        while len(self.answers) > MAX_KEPT_ANSWERS:
            _, dropped = self.answers.popitem(last=False)
            if not dropped.done():
                dropped.cancel()

    def _settle_key(
        self,
        tenant: str,
        key: str,
        response: web.StreamResponse | None,
        answer_future: asyncio.Future[Answer] | None,
    ) -> None:
        """Complete the key when the engine answered; forget it otherwise, so a retry is new work."""
        succeeded = response is not None and response.status < 400
        if succeeded:
            self.ledger.complete(tenant, key, self.clock())
        else:
            self.ledger.release(tenant, key)
            self.answers.pop((tenant, key), None)
        if answer_future is not None and not answer_future.done():
            if isinstance(response, web.Response) and response.body is not None:
                headers = {
                    k: v for k, v in response.headers.items() if k.lower().startswith(("x-goodput", "retry"))
                }
                body = response.body if isinstance(response.body, bytes) else b""
                answer_future.set_result(Answer(response.status, body, headers))
            else:
                answer_future.set_result(
                    Answer(
                        502,
                        json.dumps(
                            error_body("the first request ended without an answer", "ServerError")
                        ).encode(),
                    )
                )

    def _count(self, admitted: Admitted) -> None:
        decision = admitted.decision
        labels = (self.policy.model_group, decision.class_name or "unknown", admitted.tenant_label)
        series = self.metrics.series
        series(self.metrics.offered, *labels).inc()
        series(self.metrics.outcomes, *labels, decision.outcome.value, decision.reason.value).inc()
        if decision.infeasible:
            series(self.metrics.infeasible, *labels).inc()
        adapter = self.adapter_of(admitted.parsed)
        if adapter is not None:
            series(
                self.metrics.adapter_requests, self.policy.model_group, adapter, decision.outcome.value
            ).inc()

    async def _admit_and_serve(
        self,
        request: web.Request,
        parsed: ParsedRequest,
        shape: RequestShape,
        marks: Mapping[str, str] | None = None,
    ) -> web.StreamResponse:
        placed = await self.place(parsed, shape, request.headers.get(SESSION_HEADER), marks, request)
        if isinstance(placed, web.StreamResponse):
            return placed
        assert placed.group is not None
        return await self._serve(request, placed, placed.group)

    async def place(
        self,
        parsed: ParsedRequest,
        shape: RequestShape,
        session: str | None,
        marks: Mapping[str, str] | None = None,
        request: web.Request | None = None,
    ) -> Admitted | web.StreamResponse:
        """Admit the request, queue it fairly and wait for a group to take it: the request path up
        to the engine, shared by the gateway's own proxy and the endpoint picker (which hands the
        chosen group to Envoy instead). Returns the request with its group set, holding a slot that
        `settle` gives back, or the answer that refuses it. The degrade ladder is walked only for
        the gateway's own proxy (`request` given): its rungs reroute, hold or answer the request
        here, which a proxy that only asks for an endpoint cannot do."""
        if self.retired is not None:  # left the gateway while this request awaited a replayed answer
            return retired_response(self.retired)
        now = self.clock()
        tenant = shape.tenant
        tenant_label = self.tenant_label(tenant)
        bucket = self._bucket(tenant, now)
        retry_budget = self.retry_budgets.get(tenant) or RetryBudget(self.policy.admission.retry_budget_ratio)
        contract = self.policy.admission.contract_for(shape.class_name)
        loads = self.loads(tenant, contract.priority if contract is not None else 0)
        adapter = self.adapter_of(parsed)
        if adapter is not None:  # a group without the adapter shows its load time as a wait
            holdings = self.adapters.holdings(now, self.policy.adapters.use_half_life_seconds)
            loads = with_load_time(loads, holdings, adapter, self.policy.adapters)
        decision = admit(
            self.policy.admission,
            shape,
            loads,
            now,
            tenant_budget=bucket,
            retry_budget=retry_budget,
            ttft_correction=self.ttft_correction(tenant_label, now),
        )
        marks = dict(marks or {})
        if (
            request is not None
            and contract is not None
            and contract.ladder is not None
            and needs_ladder(decision, marks)
        ):
            walked = await walk_ladder(self, request, parsed, shape, contract, decision, marks)
            if isinstance(walked, web.StreamResponse):
                return walked
            parsed, shape, decision = walked
        admitted = Admitted(parsed, shape, decision, tenant_label, shape.arrival_time, marks=marks)
        self._count(admitted)
        if not decision.proceeds:
            refusal = self._refusal(decision, parsed)
            refusal.headers.update(marks)
            return refusal
        self.retry_budgets[tenant] = retry_budget.after(shape.is_retry)
        self.retry_budgets.move_to_end(tenant)
        while len(self.retry_budgets) > MAX_TRACKED_TENANTS:
            self.retry_budgets.popitem(last=False)  # the least recent tenant starts a fresh budget
        if bucket is not None:
            self.budgets[tenant] = bucket.spend(decision.budget_tokens, now)
        group = await self._wait_for_group(admitted, session)
        if isinstance(group, web.Response):
            return group
        admitted.group = group
        return admitted

    def _bucket(self, tenant: str, now: float) -> TokenBucket | None:
        limit = self.policy.tenant_tokens_per_minute.get(tenant)
        if limit is None:
            return None
        bucket = self.budgets.get(tenant)
        if bucket is None:
            bucket = self.budgets[tenant] = TokenBucket.full(limit, now)
        return bucket

    def _refusal(self, decision: AdmissionDecision, parsed: ParsedRequest) -> web.Response:
        headers = {"X-Goodput-Outcome": decision.outcome.value, "X-Goodput-Reason": decision.reason.value}
        if decision.retry_after_seconds is not None:
            headers["Retry-After"] = str(decision.retry_after_seconds)
        kind = "BadRequestError" if decision.http_status == 400 else "OverloadedError"
        param = refusal_field(decision.reason, parsed, self.policy.admission.context_tokens)
        return json_response(
            decision.http_status, error_body(decision.message, kind, param, decision.reason.value), headers
        )

    async def _wait_for_group(self, admitted: Admitted, session: str | None) -> str | web.Response:
        """Queue the request fairly and wait for a slot; 503 when the hold runs out."""
        decision, shape = admitted.decision, admitted.shape
        contract = self.policy.admission.contract_for(decision.class_name)
        assert contract is not None  # admission resolved the class
        pricing = self.policy.admission.pricing
        work = pricing.prefill_work_seconds(shape.prompt_tokens) + pricing.decode_work_seconds(
            shape.prompt_tokens, decision.output_tokens
        )
        pending = Pending(
            asyncio.get_running_loop().create_future(),
            work,
            shape.prompt_tokens + decision.output_tokens,
            prefix_key(admitted.parsed.prompt_text, self.policy.routing),
            session or admitted.marks.get(SESSION_HEADER),
            shape.prompt_tokens,
            class_name=contract.name,
            adapter=self.adapter_of(admitted.parsed),
        )
        # Requests held for lack of any ready group keep their place: they are what wakes the pool.
        deferred = decision.outcome is Outcome.DEFER and decision.reason is not AdmissionReason.NO_READY_GROUP
        lower = deferred or decision.best_effort
        item = QueuedItem(
            shape.tenant,
            contract.priority + (LOWER_PRECEDENCE_LEVELS if lower else 0),
            shape.arrival_time + contract.ttft_seconds,
            shape.arrival_time,
            shape.prompt_tokens,
            decision.output_tokens,
            pending,
            work_seconds=work,
        )
        admitted.item = self.queue.push(item)
        self._queue_work(work)
        self._pump()
        hold = (
            decision.hold_seconds
            if decision.outcome is Outcome.DEFER
            else max(self.policy.admission.max_defer_seconds, contract.ttft_seconds)
        )
        if (
            pending.future.done() and pending.future.exception() is None
        ):  # dispatched at once: the common case
            return pending.future.result()
        try:
            return await asyncio.wait_for(asyncio.shield(pending.future), timeout=hold)
        except ModelGroupRetiredError as retired:
            self._refund(item.tenant, item.input_tokens + item.expected_output_tokens)
            return retired_response(str(retired))
        except AdapterRefusedError as refused:
            self._refund(item.tenant, item.input_tokens + item.expected_output_tokens)
            return adapter_failed_response(str(refused), 503, refused.retry_after_seconds)
        except TimeoutError:
            self._withdraw(item)
            message = f"no group could take the request within {hold:.1f}s"
            retry = str(max(1, math.ceil(self.policy.admission.max_defer_seconds)))
            return json_response(
                503, error_body(message, "OverloadedError", None, "HoldExpired"), {"Retry-After": retry}
            )
        except asyncio.CancelledError:
            self._withdraw(item)
            self.metrics.disconnects.labels(self.policy.model_group, "queued").inc()
            raise

    def _withdraw(self, item: QueuedItem[Pending]) -> None:
        """Take a request out of the queue (client gone or hold expired); give back what it took."""
        pending = item.payload
        if self.queue.cancel(item):
            self._unqueue_work(pending.work_seconds)
        elif pending.future.done() and not pending.future.cancelled():
            # Dispatched in the same instant: free the slot it was given.
            self._release(pending.future.result(), pending)
            self.queue.settle(item.tenant, item.expected_output_tokens, 0)
            self.queue.charge(item.tenant, -item.input_tokens, 0)
        if not pending.future.done():
            pending.future.cancel()
        self._refund(item.tenant, item.input_tokens + item.expected_output_tokens)

    def _refund(self, tenant: str, tokens: float) -> None:
        bucket = self.budgets.get(tenant)
        if bucket is not None and tokens > 0:
            self.budgets[tenant] = bucket.refund(tokens, self.clock())

    # --- proxying ------------------------------------------------------------------------------

    def _upstream_body(self, admitted: Admitted) -> dict[str, Any]:
        body = dict(admitted.parsed.body)
        if admitted.decision.class_name in self.policy.optional_context_classes:
            body = without_marks(body)  # the engine does not know the optional mark
        body[admitted.parsed.output_field] = admitted.decision.output_tokens
        return body

    def answer_headers(self, admitted: Admitted, group: str) -> dict[str, str]:
        """goodput's headers on the answer (outcome, reason, group, class; a degraded request's
        budget), which the gateway sets and the endpoint picker adds to the proxy's answer."""
        decision = admitted.decision
        headers = {
            "X-Goodput-Outcome": decision.outcome.value,
            "X-Goodput-Reason": decision.reason.value,
            "X-Goodput-Group": group,
            "X-Goodput-Class": decision.class_name or "",
            "X-Goodput-Served-By": f"{self.policy.model_group}/{self.policy.model_revision}",
            **admitted.marks,
        }
        if decision.outcome is Outcome.DEGRADE:
            headers["X-Goodput-Max-Tokens"] = str(decision.output_tokens)
            headers["X-Goodput-Best-Effort"] = "true" if decision.best_effort else "false"
        return headers

    async def _serve(self, request: web.Request, admitted: Admitted, group: str) -> web.StreamResponse:
        item = admitted.item
        assert item is not None and self._session is not None
        endpoint = self.groups[group].endpoint if group in self.groups else None
        generated = 0
        dispatched_at = self.clock()
        try:
            if endpoint is None:
                raise aiohttp.ClientError(f"group {group} went away")
            if item.payload.adapter is not None:
                await self.adapters.ready(group, item.payload.adapter)
            url = endpoint.base_url + request.path
            async with self._session.post(url, json=self._upstream_body(admitted)) as upstream:
                if admitted.parsed.stream and upstream.status == 200:
                    response, generated = await self._relay_stream(request, admitted, group, upstream)
                    return response
                response, generated = await self._relay_whole(admitted, group, upstream)
                return response
        except asyncio.CancelledError:
            stage = "streaming" if admitted.relaying else "dispatched"
            self.metrics.disconnects.labels(self.policy.model_group, stage).inc()
            raise
        except (aiohttp.ClientError, TimeoutError) as error:
            message = f"group {group} failed to answer: {error or type(error).__name__}"
            return json_response(
                502, error_body(message, "UpstreamError"), self.answer_headers(admitted, group)
            )
        except AdapterLoadError as error:
            return adapter_failed_response(str(error), 502)
        finally:
            request[GENERATED_KEY] = generated
            self.settle(admitted, group, generated, dispatched_at)

    def started(self, admitted: Admitted) -> None:
        """The placed request's first token came back: its prefill left the group's pipeline."""
        if admitted.item is not None and admitted.group is not None:
            self._started(admitted.group, admitted.item.payload)

    def settle(self, admitted: Admitted, group: str, generated: int, dispatched_at: float) -> None:
        """The placed request is over (answered, failed or abandoned): give back its slot, charge its
        tenant what it generated and refund the rest of its budget."""
        item = admitted.item
        assert item is not None
        if item.payload.adapter is not None:
            self.adapters.release(group, item.payload.adapter)
        self._release(group, item.payload)
        # KV held: the prompt for the whole residency, each output token from when it was made
        # (its gaps taken as even over the residency), priced by the policy's kvByteSeconds.
        held_seconds = self.clock() - dispatched_at
        kv = kv_byte_seconds(
            self.policy.admission.pricing.kv_bytes_per_token,
            item.input_tokens,
            generated,
            held_seconds / generated if generated else 0.0,
            held_seconds if not generated else 0.0,
        )
        self.queue.settle(item.tenant, item.expected_output_tokens, generated, kv)
        self._refund(item.tenant, max(0, item.expected_output_tokens - generated))

    async def _relay_whole(
        self, admitted: Admitted, group: str, upstream: aiohttp.ClientResponse
    ) -> tuple[web.Response, int]:
        body = await upstream.read()
        generated = 0
        if upstream.status == 200:
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                generated = int(json.loads(body)["usage"]["completion_tokens"])
            self.observe(admitted, None, (), generated)
        headers = self.answer_headers(admitted, group)
        response = web.Response(
            status=upstream.status, body=body, headers=headers, content_type="application/json"
        )
        return response, generated

    async def _relay_stream(
        self, request: web.Request, admitted: Admitted, group: str, upstream: aiohttp.ClientResponse
    ) -> tuple[web.StreamResponse, int]:
        headers = self.answer_headers(admitted, group)
        headers["Content-Type"] = upstream.headers.get("Content-Type", "text/event-stream; charset=utf-8")
        headers["Cache-Control"] = "no-cache"
        response = RelayedStream(status=200, headers=headers)
        await response.prepare(request)
        request[STREAM_KEY] = response
        admitted.relaying = True
        times = StreamTimes()
        content = upstream.content
        chunk = content.read_nowait()  # what arrived with the engine's head, if anything
        try:
            if not chunk:
                await response.write(b"")  # nothing to go with the head: it goes alone, at once
                chunk = await content.readany()
            while chunk:
                if times.arrived(chunk, self.clock()) and admitted.item is not None:
                    self._started(group, admitted.item.payload)
                if content.at_eof():  # the engine's last chunk goes with the stream's end: one write
                    break
                await response.write(chunk)
                chunk = await content.readany()
            await response.write_eof(chunk)
        except ConnectionResetError:
            # The client went away: leaving the upstream context closes the engine's stream, so
            # the engine aborts the request and its slot and counters are freed in `_serve`.
            self.metrics.disconnects.labels(self.policy.model_group, "streaming").inc()
            return response, times.events
        self.observe(admitted, times.first_at, times.gaps, times.events)
        return response, times.events

    def observe(
        self, admitted: Admitted, first_at: float | None, gaps: Sequence[float], generated: int
    ) -> None:
        """Latency histograms, and whether the request met its class's targets."""
        decision = admitted.decision
        contract = self.policy.admission.contract_for(decision.class_name)
        if contract is None:
            return
        name, cls = self.policy.model_group, contract.name
        e2e = self.clock() - admitted.arrival
        self.metrics.series(self.metrics.e2e, name, cls).observe(e2e)
        if first_at is not None:
            ttft = first_at - admitted.arrival
            self.metrics.series(self.metrics.ttft, name, cls).observe(ttft)
            self._calibrate(admitted, contract.ttft_seconds, ttft)
            itl_hist = self.metrics.series(self.metrics.itl, name, cls)
            for gap in gaps:
                itl_hist.observe(gap)
            mean_gap = sum(gaps) / len(gaps) if gaps else 0.0
            met = ttft <= contract.ttft_seconds and mean_gap <= contract.itl_seconds
        else:
            met = e2e <= contract.ttft_seconds + contract.itl_seconds * max(0, generated - 1)
        if contract.e2e_seconds is not None:
            met = met and e2e <= contract.e2e_seconds
        if not decision.best_effort:
            labels = (name, cls, admitted.tenant_label, "true" if met else "false")
            self.metrics.series(self.metrics.finished, *labels).inc()

    def _calibrate(self, admitted: Admitted, target_seconds: float, ttft_seconds: float) -> None:
        """An admitted request's first token: what the deadline gate predicted, the budget its target
        left it and what it took, all from the decision on, added to its tenant's calibration.
        Deferred and best-effort requests wait at a lower precedence than the gate priced, so they
        say nothing of its error."""
        decision = admitted.decision
        check = decision.deadline
        if check is None or decision.outcome is not Outcome.ADMIT or decision.best_effort:
            return
        entry = self.corrections.get(admitted.tenant_label)
        if entry is None:
            entry = self.corrections[admitted.tenant_label] = TenantCorrection(
                TtftCalibration(self.calibration_settings)
            )
        waited = check.waited_seconds
        entry.calibration = entry.calibration.observed(
            check.ahead_seconds, target_seconds - waited, ttft_seconds - waited, self.clock()
        )


def _predicts_differently(old: RequestPathPolicy, new: RequestPathPolicy) -> bool:
    """The figures the deadline gate predicts from changed (capacity, floors, prices, the p90 wait)."""
    return (
        old.capacity_work_seconds_per_second != new.capacity_work_seconds_per_second
        or old.admission.floor_model != new.admission.floor_model
        or old.admission.pricing != new.admission.pricing
        or old.admission.wait_p90_factor != new.admission.wait_p90_factor
    )
