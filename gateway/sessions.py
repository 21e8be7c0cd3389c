"""The gateway's glue for session budgets (`controllers.requests.sessions`).

A request of a class with a `sessionBudget` is part of a session: with no `X-Goodput-Session` it is
a root and opens one (the gateway names it and answers the name in `X-Goodput-Session`); with
`X-Goodput-Session-Open: NAME` it is a root that names its session itself; with
`X-Goodput-Session: NAME` it is a child of that open session. A child is charged to the session's
tenant (the root's), whatever tenant it names, and admitted against what the session has left before
its class's own gates. At the session's deadline every child still in flight is cancelled (its
engine request closed) and answered 410 `session_expired`; later children get the same. Budgets come
only from the SLOPolicy: a request carrying a header that names a budget is refused (400).

Between its children a session waits, most often on a tool: when its last child in flight ends, its
KV is kept on its group, offloaded or let go (`gateway.tool_waits`), and the wait is learnt when
its next child comes.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from aiohttp import web

from goodput.controllers.requests.admission import ClassContract, RequestShape
from goodput.controllers.requests.degrade import Rung
from goodput.controllers.requests.sessions import (
    SWEEP_INTERVAL_SECONDS,
    ChildGrant,
    Refused,
    Session,
    SessionRefusal,
    SessionTable,
)
from goodput.controllers.requests.tool_waits import HeldKv, WaitAction
from goodput.gateway.ladder import DEGRADED_HEADER
from goodput.gateway.requests import SESSION_HEADER, ParsedRequest, error_body
from goodput.gateway.tool_waits import WaitCharge, WaitDesk

if TYPE_CHECKING:
    from goodput.gateway.server import Gateway

OPEN_HEADER = "X-Goodput-Session-Open"
BUDGET_HEADER_PREFIX = "x-goodput-session-budget"
STREAM_KEY = web.RequestKey("goodput.stream", web.StreamResponse)
"""The request's prepared stream, once its first bytes went out."""
GENERATED_KEY = web.RequestKey("goodput.generated", int)
"""Output tokens the engine generated for the request."""


class SessionDesk:
    """The sessions of one request path: the table, the children in flight, the deadline timers."""

    def __init__(self, clock: Callable[[], float], table: SessionTable | None = None) -> None:
        self.clock = clock
        self.table = table or SessionTable()
        self.children: dict[tuple[str, int], asyncio.Task[web.StreamResponse]] = {}
        self.cancelled: set[tuple[str, int]] = set()
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._swept_at = -SWEEP_INTERVAL_SECONDS
        self.waits = WaitDesk()
        self.charge_wait: Callable[[WaitCharge], object] = lambda _charge: None  # set by the gateway

    async def serve(
        self, gateway: Gateway, request: web.Request, parsed: ParsedRequest, shape: RequestShape
    ) -> web.StreamResponse:
        """The request served within its session, or as before when its class has no budget."""
        contract = gateway.policy.admission.contract_for(shape.class_name)
        if contract is None or contract.session_limits is None:
            return await gateway._admit_and_serve(request, parsed, shape)
        raised = next((h for h in request.headers if h.lower().startswith(BUDGET_HEADER_PREFIX)), None)
        if raised is not None:
            message = f"header {raised} is not accepted: session budgets come only from the SLOPolicy"
            return web.json_response(
                error_body(message, "BadRequestError", raised, "session_budget_header"), status=400
            )
        now = self.clock()
        session = self._session(gateway, request, shape, contract, now)
        if isinstance(session, Refused):
            return self._refused(gateway, shape, contract, session)
        output = shape.requested_output_tokens or contract.max_output_tokens
        output = output or gateway.policy.admission.default_output_tokens
        may_cap = contract.ladder is not None and contract.ladder.caps_output
        grant = self.table.admit_child(session, shape.prompt_tokens, output, now, may_cap=may_cap)
        if isinstance(grant, Refused):
            return self._refused(gateway, shape, contract, grant, session.name)
        charged = replace(shape, tenant=session.tenant)
        self._count(gateway, charged, contract, "root" if session.branches_used == 1 else "child")
        self._charge_wait(self.waits.resumed(session.name, gateway.policy.model_group, now))
        marks = {SESSION_HEADER: session.name}
        if grant.capped:
            marks[DEGRADED_HEADER] = Rung.CAP_OUTPUT.value
            labels = (gateway.policy.model_group, contract.name, gateway.tenant_label(session.tenant))
            gateway.metrics.degraded.labels(*labels, Rung.CAP_OUTPUT.value).inc()
        child = replace(charged, requested_output_tokens=grant.output_tokens)
        return await self._run_child(gateway, request, parsed, child, grant, marks)

    def _session(
        self, gateway: Gateway, request: web.Request, shape: RequestShape, contract: ClassContract, now: float
    ) -> Session | Refused:
        named = request.headers.get(SESSION_HEADER)
        if named:
            found = self.table.lookup(named, contract.name)
            if isinstance(found, Session) and now >= found.deadline:
                self._end(found.name, SessionRefusal.EXPIRED)
                return self.table.lookup(named, contract.name)
            return found
        if now - self._swept_at >= SWEEP_INTERVAL_SECONDS:  # idle sessions go, at most every 10 s
            self._swept_at = now
            for ended in self.table.expire(now):
                self._stop_waiting(ended.name)
                self._cancel_children(ended.name, ended.children_in_flight)
        name = request.headers.get(OPEN_HEADER) or f"gs-{secrets.token_hex(12)}"
        assert contract.session_limits is not None
        opened = self.table.open_session(name, shape.tenant, contract.name, contract.session_limits, now)
        if isinstance(opened, Session) and opened.limits.wall_clock_seconds is not None:
            delay = max(0.0, opened.deadline - now)
            loop = asyncio.get_running_loop()
            self._timers[name] = loop.call_later(delay, self._end, name, SessionRefusal.EXPIRED)
        return opened

    async def _run_child(  # noqa: PLR0917 (one child's whole context)
        self,
        gateway: Gateway,
        request: web.Request,
        parsed: ParsedRequest,
        shape: RequestShape,
        grant: ChildGrant,
        marks: dict[str, str],
    ) -> web.StreamResponse:
        """Serve the child as a task of its own, so that its session's deadline can cancel it; settle
        what it used in any case."""
        key = (grant.session, grant.child)
        task = asyncio.ensure_future(gateway._admit_and_serve(request, parsed, shape, marks))
        self.children[key] = task
        try:
            response = await task
        except asyncio.CancelledError:
            if key not in self.cancelled:
                raise  # the client went away: the cancellation was the handler's own
            return await self._expired_answer(request, grant.session, marks)
        finally:
            self.children.pop(key, None)
            self.cancelled.discard(key)
            used = shape.prompt_tokens + request.get(GENERATED_KEY, 0)
            self.table.settle(grant, used, self.clock())
            self._wait(gateway, grant.session, used)
        if not response.prepared:
            response.headers.update(marks)
        return response

    async def _expired_answer(
        self, request: web.Request, session: str, marks: dict[str, str]
    ) -> web.StreamResponse:
        """410 for a child its session's deadline cancelled; a stream already under way ends with an
        error event instead (its status went out with its first bytes)."""
        message = f"session {session!r} passed its deadline; its requests in flight were cancelled"
        body = error_body(message, "GoneError", None, SessionRefusal.EXPIRED.value)
        stream: web.StreamResponse | None = request.get(STREAM_KEY)
        if stream is not None and stream.prepared:
            try:
                await stream.write(b"data: " + json.dumps(body).encode() + b"\n\n")
                await stream.write_eof()
            except (ConnectionResetError, RuntimeError):
                pass
            return stream
        return web.json_response(body, status=410, headers=marks)

    def _end(self, name: str, why: SessionRefusal) -> None:
        """The session's deadline: end it and cancel every child still in flight."""
        timer = self._timers.pop(name, None)
        if timer is not None:
            timer.cancel()
        if self.table.get(name) is None:
            return
        self._stop_waiting(name)
        ended = self.table.end(name, why)
        self._cancel_children(name, ended.children_in_flight)

    def _wait(self, gateway: Gateway, name: str, context_tokens: int) -> None:
        """A child ended: with none of its session's left in flight, the session waits (on a tool,
        most likely). Keep, offload or recompute its KV (`choose_wait_action`); a recomputed one
        loses its group, so its next child goes wherever routing sends it."""
        session = self.table.get(name)
        group = gateway.sessions.get(name)
        if session is None or session.held or group is None:
            return
        policy = gateway.policy
        pricing = policy.admission.pricing
        capacity = policy.kv_capacity_tokens
        routed = gateway.groups.get(group)
        used = (routed.book.kv_used_tokens if routed is not None else 0) + self.waits.kept_tokens(group)
        now = self.clock()
        held = HeldKv(
            kv_tokens=context_tokens,
            kv_bytes_per_token=pricing.kv_bytes_per_token,
            recompute_seconds=pricing.prefill_work_seconds(context_tokens),
            group_kv_capacity_tokens=capacity,
            kv_pressure=min(1.0, used / capacity) if capacity > 0 else 1.0,
            offload_turnover_seconds=self.waits.turnover_seconds(group, pricing.kv_bytes_per_token, now),
        )
        choice = self.waits.waits(
            name, session.tenant, policy.model_group, session.class_name, group, held, now
        )
        if choice.action is WaitAction.RECOMPUTE:
            gateway.sessions.pop(name, None)
        gateway.metrics.series(
            gateway.metrics.tool_wait_actions, policy.model_group, choice.action.value
        ).inc()
        self.publish_waiting(gateway)

    def _stop_waiting(self, name: str) -> None:
        """The session ended: its wait is over, charged up to now."""
        self._charge_wait(self.waits.forget(name, self.clock()))

    def _charge_wait(self, charge: WaitCharge | None) -> None:
        """Charge the tenant of a kept session the GPU KV byte-seconds its wait held (fairness prices
        them by the SLOPolicy's `costWeights.kvByteSeconds`)."""
        if charge is not None and charge.kv_byte_seconds > 0:
            self.charge_wait(charge)

    def publish_waiting(self, gateway: Gateway) -> None:
        """The KV tokens waiting sessions hold, kept (GPU) and offloaded (CPU tier), once the holds
        past their predicted wait have lapsed (and been charged)."""
        for charge in self.waits.lapse(self.clock()):
            self._charge_wait(charge)
        for action in (WaitAction.KEEP, WaitAction.OFFLOAD):
            gauge = gateway.metrics.waiting_kv_tokens.labels(gateway.policy.model_group, action.value)
            gauge.set(self.waits.tokens(action))

    def _cancel_children(self, name: str, children: tuple[int, ...]) -> None:
        self._timers.pop(name, None)
        for child in children:
            task = self.children.get((name, child))
            if task is not None and not task.done():
                self.cancelled.add((name, child))
                task.cancel()

    def _refused(
        self,
        gateway: Gateway,
        shape: RequestShape,
        contract: ClassContract,
        refused: Refused,
        session: str | None = None,
    ) -> web.Response:
        self._count(gateway, shape, contract, refused.refusal.value)
        field = OPEN_HEADER if refused.refusal is SessionRefusal.EXISTS else SESSION_HEADER
        kind = "OverloadedError" if refused.http_status in (429, 503) else "BadRequestError"
        headers = {SESSION_HEADER: session} if session else {}
        if refused.refusal is SessionRefusal.TABLE_FULL:
            headers["Retry-After"] = "1"
        return web.json_response(
            error_body(refused.message, kind, field, refused.refusal.value),
            status=refused.http_status,
            headers=headers,
        )

    def _count(self, gateway: Gateway, shape: RequestShape, contract: ClassContract, result: str) -> None:
        labels = (gateway.policy.model_group, contract.name, gateway.tenant_label(shape.tenant))
        gateway.metrics.sessions.labels(*labels, result).inc()
