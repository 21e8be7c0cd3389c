"""The gateway process's front: one OpenAI-compatible server for every ModelGroup it serves.

It reads each request under the client limits (`limits.ClientLimits`: one body budget for the whole
process), looks up the ModelGroup serving the request's `model` (`registry.ServedModels`) and hands
the request to that ModelGroup's request path (`server.Gateway`), which keeps its own groups,
admission state, fair queue, tenant budgets and metrics series; nothing is shared between
ModelGroups but the process, the body budget and the upstream connection pool. ModelGroups come and
go while it serves (`serve`, `retire`): no restart, and a request queued for a ModelGroup that goes
is answered 503 rather than lost. An unknown model is a 404 naming it, in OpenAI's error shape.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import aiohttp
from aiohttp import web

from goodput.controllers.compile.request_path import RequestPathPolicy
from goodput.gateway.connections import cut_off
from goodput.gateway.ladder import RESULTS_PATH
from goodput.gateway.limits import BodyBudget, BodyLease, BodyRefusedError, ClientLimits, read_body
from goodput.gateway.metrics import GatewayMetrics
from goodput.gateway.registry import ModelClaim, ServedModels, resolve_served_models
from goodput.gateway.requests import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    BadRequestError,
    ParsedRequest,
    error_body,
    parse_request,
)
from goodput.gateway.server import Gateway, json_response

log = logging.getLogger("goodput.gateway")

# The model_group label of what the front counts before it knows a request's model (connections
# closed, bodies refused) when it serves by selector rather than one named ModelGroup.
ANY_MODEL_GROUP = "*"
MODELS_NAMED_IN_A_404 = 20


def model_claims(policy: RequestPathPolicy, created: str) -> tuple[ModelClaim, ...]:
    """The names a ModelGroup serves: its model's, then each adapter's (claimed like a model's: the
    ModelGroup created first keeps a name two claim)."""
    names = (policy.served_model, *policy.adapters.sources)
    return tuple(ModelClaim(policy.model_group, served, created) for served in names)


class GatewayFront:
    """The served ModelGroups by name, the table from model name to ModelGroup, and the HTTP app."""

    def __init__(
        self,
        *,
        metrics: GatewayMetrics | None = None,
        limits: ClientLimits | None = None,
        label: str = ANY_MODEL_GROUP,
        clock: Callable[[], float] = time.monotonic,
        bytes_per_token: float = 4.0,
        upstream_timeout_seconds: float = 600.0,
    ) -> None:
        self.metrics = metrics or GatewayMetrics()
        self.limits = limits or ClientLimits()
        self.bodies = BodyBudget(self.limits.body_budget_bytes)
        self.label = label
        self.clock = clock
        self.bytes_per_token = bytes_per_token
        self.upstream_timeout_seconds = upstream_timeout_seconds
        self.model_groups: dict[str, Gateway] = {}
        self.claims: dict[str, tuple[ModelClaim, ...]] = {}
        self.served = ServedModels({})
        self._session: aiohttp.ClientSession | None = None

    # --- the served ModelGroups ---------------------------------------------------------------

    def serve(self, gateway: Gateway, created: str = "") -> None:
        """Serve one more ModelGroup (`created`: its creationTimestamp, which settles name conflicts);
        its request path starts at once when the front is already serving."""
        name = gateway.policy.model_group
        if name in self.model_groups:
            raise ValueError(f"ModelGroup {name!r} is already served: update its policy instead")
        self.model_groups[name] = gateway
        gateway.siblings = self.model_groups.get
        self.claims[name] = model_claims(gateway.policy, created)
        if self._session is not None:
            gateway.start(self._session)
        self._resolve()

    def update_policy(self, policy: RequestPathPolicy) -> None:
        """A served ModelGroup's changed policy (`Gateway.update_policy`); a new served name takes
        effect at once, conflicts settled again."""
        name = policy.model_group
        gateway = self.model_groups.get(name)
        if gateway is None:
            raise ValueError(f"ModelGroup {name!r} is not served here: serve it first")
        gateway.update_policy(policy)
        claims = self.claims[name]
        created = claims[0].created if claims else ""
        fresh = model_claims(gateway.policy, created)
        if fresh != claims:
            self.claims[name] = fresh
            self._resolve()

    async def retire(self, name: str, reason: str) -> None:
        """Stop serving a ModelGroup: it leaves the table first, so no new request reaches it, then
        its queued requests are answered 503 with `reason`."""
        gateway = self.model_groups.pop(name, None)
        self.claims.pop(name, None)
        if gateway is None:
            return
        self._resolve()
        await gateway.retire(reason)

    def _resolve(self) -> None:
        """Recompute the table; every conflict is logged and exported per left-out ModelGroup."""
        served = resolve_served_models(claim for claims in self.claims.values() for claim in claims)
        if served.conflicts != self.served.conflicts:
            for conflict in served.conflicts:
                log.error("%s", conflict.message())
        self.metrics.name_conflicts.clear()
        for conflict in served.conflicts:
            for left_out in conflict.left_out:
                self.metrics.name_conflicts.labels(left_out, conflict.served_model).set(1)
        self.served = served

    # --- lifecycle -----------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.limits.max_body_bytes)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post(CHAT_PATH, self.proxy)
        app.router.add_post(COMPLETIONS_PATH, self.proxy)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get(RESULTS_PATH + "/{model_group}/{key}", self.result)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, _: web.Application) -> None:
        timeout = aiohttp.ClientTimeout(total=self.upstream_timeout_seconds, sock_connect=5)
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
        self._session = aiohttp.ClientSession(timeout=timeout, connector=connector, auto_decompress=False)
        for gateway in self.model_groups.values():
            gateway.start(self._session)

    async def _stop(self, _: web.Application) -> None:
        await asyncio.gather(*(gateway.stop() for gateway in self.model_groups.values()))
        if self._session is not None:
            await self._session.close()

    def count_connection_closed(self, reason: str) -> None:
        """A connection closed on its client (`connections.ConnectionGuard`), before any model is known."""
        self.metrics.connections_closed.labels(self.label, reason).inc()

    # --- handlers ------------------------------------------------------------------------------

    async def healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def models(self, _: web.Request) -> web.Response:
        """Every served model and LoRA adapter, in OpenAI's list shape, by name (an adapter's entry
        names its base model in `parent`, as vLLM's does)."""
        data = []
        for model, name in self.served.by_model.items():
            gateway = self.model_groups[name]
            if model == gateway.policy.served_model:
                data.append(gateway.model_entry())
            else:
                data.extend(entry for entry in gateway.adapter_entries() if entry["id"] == model)
        return web.json_response({"object": "list", "data": data})

    async def proxy(self, request: web.Request) -> web.StreamResponse:
        arrival = self.clock()
        with self.bodies.lease() as lease:
            try:
                parsed = await self._read_request(request, lease)
            except BodyRefusedError as refusal:
                return await self._body_refusal(request, refusal)
            except BadRequestError as error:
                return json_response(error.status, error_body(str(error), "BadRequestError", error.field))
            gateway = self.gateway_for(parsed.model)
            if gateway is None:
                return self._unknown_model(parsed)
            return await gateway.serve(request, parsed, arrival)

    async def result(self, request: web.Request) -> web.Response:
        """An AsyncBatch answer at its result URL (`ladder.LaterDesk.claim`)."""
        gateway = self.model_groups.get(request.match_info["model_group"])
        if gateway is None:
            message = "no such result: its ModelGroup is not served here"
            return json_response(404, error_body(message, "NotFoundError", None, "result_not_found"))
        return gateway.later.claim(request.match_info["key"])

    def gateway_for(self, served_model: str) -> Gateway | None:
        """The request path of the ModelGroup serving `served_model`; never another's."""
        name = self.served.by_model.get(served_model)
        return self.model_groups.get(name) if name is not None else None

    def _unknown_model(self, parsed: ParsedRequest) -> web.Response:
        names = list(self.served.by_model)
        shown = ", ".join(repr(name) for name in names[:MODELS_NAMED_IN_A_404])
        more = f" and {len(names) - MODELS_NAMED_IN_A_404} more" if len(names) > MODELS_NAMED_IN_A_404 else ""
        served = f"this gateway serves {shown}{more}" if names else "this gateway serves no model yet"
        message = f"The model {parsed.model!r} does not exist: {served} (GET /v1/models)"
        return json_response(404, error_body(message, "NotFoundError", "model", "model_not_found"))

    async def _read_request(self, request: web.Request, lease: BodyLease) -> ParsedRequest:
        """The body, read under the client limits, and parsed; the raw bytes are dropped on return
        (the lease keeps counting them until the request ends: the parsed copy is about as large)."""
        raw = await read_body(request, self.limits, lease)
        return parse_request(raw, request.path, self.bytes_per_token)

    async def _body_refusal(self, request: web.Request, refusal: BodyRefusedError) -> web.StreamResponse:
        """413, 503 or 408 for a body not read whole, and the connection not reused: aiohttp drains
        the rest of a refused body for at most its lingering time (10 s), so the client gets the answer
        rather than a reset. A client too slow to send its body in time gets its answer and the end of
        the stream at once, and the connection is cut a little later (`connections.cut_off`)."""
        self.metrics.bodies_refused.labels(self.label, refusal.code).inc()
        headers = {}
        if refusal.retry_after_seconds is not None:
            headers["Retry-After"] = str(refusal.retry_after_seconds)
        kind = "OverloadedError" if refusal.status == 503 else "BadRequestError"
        response = json_response(refusal.status, error_body(str(refusal), kind, None, refusal.code), headers)
        response.force_close()
        if refusal.close:
            await response.prepare(request)
            await response.write_eof()
            cut_off(request.transport)
        return response
