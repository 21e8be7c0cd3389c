"""The gateway's glue for the degrade ladder (`controllers.requests.degrade`): when admission would
defer or refuse a request of a class that lists rungs, walk them, and serve, reroute or refuse the
request as the rung it stops at says; every answer on a rung names it in `X-Goodput-Degraded` and is
counted by class, tenant and rung."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from aiohttp import web

from goodput.api.reasons import AdmissionReason
from goodput.controllers.requests.admission import (
    AdmissionDecision,
    ClassContract,
    Outcome,
    RequestShape,
    admit,
)
from goodput.controllers.requests.degrade import (
    Attempt,
    Ladder,
    LadderView,
    ResultBook,
    ResultState,
    Rung,
    check_fallback,
    optional_messages,
    walk,
    without_marks,
)
from goodput.gateway.requests import SESSION_HEADER, ParsedRequest, error_body

if TYPE_CHECKING:
    from goodput.gateway.server import Gateway

log = logging.getLogger("goodput.gateway")

DEGRADED_HEADER = "X-Goodput-Degraded"
# Overload and the cold-start gap: the reasons a ladder answers. A broken contract (400) or a spent
# tenant or retry budget is the client's own limit, not overload: no rung is taken for it.
LADDER_REASONS = frozenset(
    {
        AdmissionReason.DEADLINE,
        AdmissionReason.KV_HEADROOM,
        AdmissionReason.NO_READY_GROUP,
        AdmissionReason.INFEASIBLE,
    }
)
RESULTS_PATH = "/v1/goodput/results"
# How long an AsyncBatch request may wait for capacity, at the lowest precedence of the fair queue.
ASYNC_HOLD_SECONDS = 600.0
# The gateway does not tokenize; a dropped message's tokens are estimated as the request's are.
BYTES_PER_TOKEN = 4.0


def needs_ladder(decision: AdmissionDecision, marks: Mapping[str, str]) -> bool:
    """Admission would not admit the request as asked, for overload or a group still warming, and no
    rung was taken for it yet (a fallback's own ladder is not walked again)."""
    return (
        decision.outcome is not Outcome.ADMIT
        and decision.reason in LADDER_REASONS
        and DEGRADED_HEADER not in marks
    )


def message_tokens(message: Any) -> int:
    content = message.get("content", "") if isinstance(message, dict) else ""
    text = content if isinstance(content, str) else str(content)
    return max(1, math.ceil(len(text.encode()) / BYTES_PER_TOKEN))


def fallback_gateway(gateway: Gateway, contract: ClassContract, ladder: Ladder) -> Gateway | None:
    """The fallback ModelGroup's request path when the rung may use it now: served by this gateway,
    of the same family, with the class in its policy and a Ready group; None otherwise (a fallback
    that is missing or of another family is logged, never served)."""
    name = ladder.fallback_model_group
    if name is None:
        return None
    sibling = gateway.siblings(name)
    families = {name: sibling.policy.model_family} if sibling is not None else {}
    finding = check_fallback(contract.name, name, gateway.policy.model_family, families)
    if finding is not None or sibling is None:
        if finding is not None:
            log.warning("%s (%s)", finding.message, finding.problem.value)
        return None
    if sibling.policy.admission.contract_for(contract.name) is None:
        return None
    serving = any(s.endpoint.ready and not s.endpoint.draining for s in sibling.groups.values())
    return sibling if serving else None


async def walk_ladder(  # noqa: PLR0917 (the request path's whole view of one request)
    gateway: Gateway,
    request: web.Request,
    parsed: ParsedRequest,
    shape: RequestShape,
    contract: ClassContract,
    decision: AdmissionDecision,
    marks: dict[str, str],
) -> tuple[ParsedRequest, RequestShape, AdmissionDecision] | web.StreamResponse:
    """Walk the class's ladder; the request reduced (and its new decision) to serve here, or the
    answer of a terminal rung. With no rung that helps, the request goes on as admission decided."""
    ladder = contract.ladder
    assert ladder is not None
    now = gateway.clock()
    messages = parsed.body.get("messages")
    optional = {i: message_tokens(messages[i]) for i in optional_messages(parsed.body)} if messages else {}
    sibling = fallback_gateway(gateway, contract, ladder) if Rung.FALLBACK in ladder.rungs else None
    loads = gateway.loads(shape.tenant, contract.priority)

    def decide(attempt: Attempt) -> AdmissionDecision:
        reduced = replace(
            shape, prompt_tokens=attempt.prompt_tokens, requested_output_tokens=attempt.output_tokens
        )
        return admit(
            gateway.policy.admission,
            reduced,
            loads,
            now,
            tenant_budget=gateway.budgets.get(shape.tenant),
            retry_budget=gateway.retry_budgets.get(shape.tenant),
            ttft_correction=gateway.ttft_correction(gateway.tenant_label(shape.tenant), now),
        )

    view = LadderView(
        Attempt(shape.prompt_tokens, decision.output_tokens), optional, sibling is not None, True
    )
    step = walk(ladder, view, lambda attempt: decide(attempt).outcome is Outcome.ADMIT)
    if step is None:
        return parsed, shape, decision
    marks[DEGRADED_HEADER] = step.header
    tenant_label = gateway.tenant_label(shape.tenant)
    for rung in step.rungs:
        gateway.metrics.degraded.labels(gateway.policy.model_group, contract.name, tenant_label, rung).inc()
    if step.terminal is Rung.REJECT:
        from goodput.gateway.server import Admitted

        refused = replace(decision, outcome=Outcome.REJECT, http_status=429)
        gateway._count(Admitted(parsed, shape, refused, tenant_label, shape.arrival_time))  # offered, refused
        return rejected(decision, marks)
    if step.terminal is Rung.ASYNC_BATCH:
        return gateway.later.accept(gateway, request, parsed, shape, decision, marks)
    if step.terminal is Rung.FALLBACK and sibling is not None:
        body = {**parsed.body, "model": sibling.policy.served_model}
        rerouted = replace(parsed, body=body, model=sibling.policy.served_model)
        return await sibling._admit_and_serve(request, rerouted, shape, marks)
    attempt = step.attempt
    trimmed = replace(
        parsed, body=without_marks(parsed.body, attempt.dropped_messages), prompt_tokens=attempt.prompt_tokens
    )
    reduced = replace(
        shape, prompt_tokens=attempt.prompt_tokens, requested_output_tokens=attempt.output_tokens
    )
    served = decide(attempt)
    if served.outcome is Outcome.ADMIT:
        served = replace(served, outcome=Outcome.DEGRADE, message=f"served on rung {step.header}")
    return trimmed, reduced, served


def rejected(decision: AdmissionDecision, marks: Mapping[str, str]) -> web.Response:
    """429 on the Reject rung: the overload's reason and Retry-After, and the rung named."""
    headers = {**marks, "X-Goodput-Outcome": Outcome.REJECT.value, "X-Goodput-Reason": decision.reason.value}
    headers["Retry-After"] = str(decision.retry_after_seconds or 1)
    body = error_body(
        f"{decision.message}; refused on the class's Reject rung",
        "OverloadedError",
        None,
        decision.reason.value,
    )
    return web.json_response(body, status=429, headers=headers)


class LaterDesk:
    """AsyncBatch: requests accepted now (202, a result URL) and served when capacity frees, at the
    lowest precedence of the fair queue and outside their class's SLO; each answer is handed out once
    at its URL (`ResultBook`)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.book = ResultBook()
        self._tasks: set[asyncio.Task[None]] = set()

    def accept(  # noqa: PLR0917 (the request path's whole view of one request)
        self,
        gateway: Gateway,
        request: web.Request,
        parsed: ParsedRequest,
        shape: RequestShape,
        decision: AdmissionDecision,
        marks: Mapping[str, str],
    ) -> web.Response:
        key = secrets.token_urlsafe(18)
        self.book.accept(key, self.clock())
        later = replace(parsed, body={**parsed.body, "stream": False}, stream=False)
        held = replace(
            decision,
            outcome=Outcome.DEFER,
            http_status=200,
            best_effort=True,
            hold_seconds=ASYNC_HOLD_SECONDS,
            retry_after_seconds=None,
        )
        task = asyncio.create_task(self._serve(gateway, request, later, shape, held, dict(marks), key))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        url = f"{RESULTS_PATH}/{gateway.policy.model_group}/{key}"
        headers = {**marks, "Location": url, "X-Goodput-Outcome": Outcome.DEFER.value}
        body = {"object": "goodput.async_result", "id": key, "status": "accepted", "result_url": url}
        return web.json_response(body, status=202, headers=headers)

    async def _serve(  # noqa: PLR0917 (one deferred request's whole context)
        self,
        gateway: Gateway,
        request: web.Request,
        parsed: ParsedRequest,
        shape: RequestShape,
        decision: AdmissionDecision,
        marks: dict[str, str],
        key: str,
    ) -> None:
        from goodput.gateway.server import Admitted, Answer

        admitted = Admitted(parsed, shape, decision, gateway.tenant_label(shape.tenant), shape.arrival_time)
        admitted.marks = marks
        gateway._count(admitted)
        response: web.StreamResponse | None = None
        try:
            group = await gateway._wait_for_group(admitted, request.headers.get(SESSION_HEADER))
            if isinstance(group, web.StreamResponse):
                response = group
            else:
                response = await gateway._serve(request, admitted, group)
        finally:
            body = response.body if isinstance(response, web.Response) else None
            status = response.status if response is not None else 503
            headers = {
                k: v for k, v in (response.headers.items() if response else ()) if k.lower().startswith("x-")
            }
            payload = body if isinstance(body, bytes) else b'{"error": {"message": "not served"}}'
            self.book.complete(key, Answer(status, payload, headers), self.clock())

    def claim(self, key: str) -> web.Response:
        """The answer at its result URL: 202 while pending, 200 once, then 410; 404 for a key never
        issued (or forgotten)."""
        state, answer = self.book.claim(key, self.clock())
        if state is ResultState.READY:
            response: web.Response = answer.response()
            return response
        if state is ResultState.PENDING:
            return web.json_response(
                {"object": "goodput.async_result", "id": key, "status": "pending"},
                status=202,
                headers={"Retry-After": "1"},
            )
        if state is ResultState.DELIVERED:
            message = f"the answer of {key!r} was delivered already; an answer is handed out once"
            return web.json_response(error_body(message, "GoneError", None, "result_delivered"), status=410)
        message = f"no answer {key!r}: it was never issued, or it was not claimed in time"
        return web.json_response(error_body(message, "NotFoundError", None, "result_not_found"), status=404)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
