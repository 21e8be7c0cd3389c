"""goodput as the endpoint picker of an `InferencePool`: Envoy's external-processing stream in, the
gateway's own admission, fair queue and routing behind it, the chosen group leader out.

A proxy that implements the Gateway API Inference Extension (Envoy Gateway, Istio, kgateway) opens
one `envoy.service.ext_proc.v3.ExternalProcessor.Process` stream per HTTP request and sends what it
sees of the request and its answer. The picker reads the OpenAI request from the request headers
and the buffered body (model, stream, max_tokens, and goodput's tenant, class, session and retry
headers, as the gateway reads them), and runs it through the ModelGroup's request path
(`server.Gateway.place`: the same admission gates, fair queue and routing the gateway runs), then:

- picked: the request header `x-gateway-destination-endpoint` is set to the leader's `ip:port`, and
  the same value in the dynamic metadata namespace `envoy.lb` (the protocol allows either; both
  carry one value). A degraded request's lowered output budget is written into the body, as the
  gateway does before it proxies.
- refused or held past its hold: an immediate response with the gateway's status, `X-Goodput-*`
  headers, Retry-After and OpenAI error body (400, 404, 429, 503).
- the answer: its headers gain `X-Goodput-Outcome`, `-Reason`, `-Group`; its body is counted as the
  gateway counts what it relays (events of a stream, `usage.completion_tokens` otherwise), the first
  event marks the request's TTFT, and the end settles the slot, the tenant's counters and budget,
  and the latency histograms, so fairness and the autoscaler's signals are what the gateway's are.
  A stream that closes before the answer ended (client gone, upstream failed) settles with what
  was generated.

The picker reads the whole request body before it decides, in either request body mode a proxy
may announce (`protocol_config`): BUFFERED (the headers are answered at once, the pick rides on the
body's answer) or FULL_DUPLEX_STREAMED (the headers' answer waits for the whole body and carries the
pick; the body goes back whole after it, as the reference picker does). A proxy that announces
another request body mode gets a 500 that names the setting; one that announces none is taken as
BUFFERED. A FULL_DUPLEX_STREAMED response body is passed back chunk by chunk, unchanged.
Idempotency keys are not honoured here (the picker never holds an answer to replay).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2
from multidict import CIMultiDict

from goodput.gateway.adapters import AdapterLoadError
from goodput.gateway.requests import SESSION_HEADER, BadRequestError, error_body, parse_request
from goodput.gateway.server import (
    Admitted,
    Gateway,
    StreamTimes,
    adapter_failed_response,
    json_response,
)

DESTINATION_HEADER = "x-gateway-destination-endpoint"
DESTINATION_METADATA_NAMESPACE = "envoy.lb"
FULL_DUPLEX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
MAX_COUNTED_BODY_BYTES = 8 * 1024 * 1024  # a whole answer read for its usage; past this, not counted


@dataclass(slots=True)
class PoolState:
    """What the picker serves now: the pool's ModelGroup request path, or why it serves nothing."""

    gateway: Gateway | None = None
    refusal: str | None = "the endpoint picker has not read its InferencePool yet"
    bytes_per_token: float = 4.0


def header_map(headers: ext_proc.HttpHeaders) -> CIMultiDict[str]:
    """The proxy's header map, read case-insensitively (Envoy sends `raw_value` bytes, older
    versions `value`)."""
    read: CIMultiDict[str] = CIMultiDict()
    for header in headers.headers.headers:
        value = header.raw_value.decode("utf-8", "replace") if header.raw_value else header.value
        read.add(header.key, value)
    return read


def set_headers(headers: dict[str, str]) -> ext_proc.HeaderMutation:
    return ext_proc.HeaderMutation(
        set_headers=[
            base_pb2.HeaderValueOption(
                header=base_pb2.HeaderValue(key=key, raw_value=value.encode()),
                append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
            )
            for key, value in headers.items()
        ]
    )


def immediate(response: web.Response) -> ext_proc.ProcessingResponse:
    """The gateway's answer (status, `X-Goodput-*` and Retry-After headers, OpenAI error body)
    sent to the client by the proxy instead of any upstream."""
    headers = {k: v for k, v in response.headers.items() if k.lower() != "content-length"}
    body = response.body if isinstance(response.body, bytes) else b""
    return ext_proc.ProcessingResponse(
        immediate_response=ext_proc.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=response.status),
            headers=set_headers(headers),
            body=body,
            details=headers.get("X-Goodput-Reason", ""),
        )
    )


def refused(status: int, message: str, kind: str, code: str) -> ext_proc.ProcessingResponse:
    """The picker's own refusals, in the gateway's error shape; a 503 may be retried in a second."""
    retry = {"Retry-After": "1"} if status == 503 else None
    return immediate(json_response(status, error_body(message, kind, None, code), retry))


def destination_metadata(endpoint: str) -> struct_pb2.Struct:
    metadata = struct_pb2.Struct()
    metadata.update({DESTINATION_METADATA_NAMESPACE: {DESTINATION_HEADER: endpoint}})
    return metadata


@dataclass(slots=True)
class Exchange:
    """One HTTP request's stream: what the picker read of it and what it placed."""

    pool: PoolState
    clock: Callable[[], float]
    headers: CIMultiDict[str] = field(default_factory=CIMultiDict)
    body: bytearray = field(default_factory=bytearray)
    arrival: float = 0.0
    gateway: Gateway | None = None
    admitted: Admitted | None = None
    stream: bool = False
    status: int = 0
    dispatched_at: float = 0.0
    times: StreamTimes = field(default_factory=StreamTimes)  # a streamed answer's events, as relayed
    generated: int = 0
    answer: bytearray = field(default_factory=bytearray)
    settled: bool = False
    duplex_request: bool = False  # FULL_DUPLEX_STREAMED: the picker answers the headers after the body
    duplex_response: bool = False

    async def answer_to(self, message: ext_proc.ProcessingRequest) -> list[ext_proc.ProcessingResponse]:
        """The answers to one message of the proxy's (none while a duplex request body streams in)."""
        which = message.WhichOneof("request")
        if which == "request_headers":
            return self.on_request_headers(message)
        if which == "request_body":
            return await self.on_request_body(message.request_body)
        if which == "response_headers":
            return [self.on_response_headers(message.response_headers)]
        if which == "response_body":
            return [self.on_response_body(message.response_body)]
        if which == "request_trailers":
            return [ext_proc.ProcessingResponse(request_trailers=ext_proc.TrailersResponse())]
        return [ext_proc.ProcessingResponse(response_trailers=ext_proc.TrailersResponse())]

    def on_request_headers(self, message: ext_proc.ProcessingRequest) -> list[ext_proc.ProcessingResponse]:
        self.arrival = self.clock()
        self.headers = header_map(message.request_headers)
        if message.HasField("protocol_config"):
            config = message.protocol_config
            self.duplex_request = config.request_body_mode == FULL_DUPLEX
            self.duplex_response = config.response_body_mode == FULL_DUPLEX
            if config.request_body_mode not in (processing_mode_pb2.ProcessingMode.BUFFERED, FULL_DUPLEX):
                name = processing_mode_pb2.ProcessingMode.BodySendMode.Name(config.request_body_mode)
                message_text = (
                    f"the endpoint picker reads the whole request body; the proxy sends it {name} "
                    "(set processing_mode.request_body_mode: BUFFERED or FULL_DUPLEX_STREAMED)"
                )
                return [refused(500, message_text, "ServerError", "BodyModeUnsupported")]
        if message.request_headers.end_of_stream:
            return [refused(400, "a request needs a JSON body", "BadRequestError", "BadRequest")]
        if self.duplex_request:
            return []  # the headers' answer carries the pick, once the body is whole
        return [ext_proc.ProcessingResponse(request_headers=ext_proc.HeadersResponse())]

    async def on_request_body(self, body: ext_proc.HttpBody) -> list[ext_proc.ProcessingResponse]:
        self.body += body.body
        if not body.end_of_stream:
            return (
                []
                if self.duplex_request
                else [ext_proc.ProcessingResponse(request_body=ext_proc.BodyResponse())]
            )
        pick = await self.place()
        if isinstance(pick, ext_proc.ProcessingResponse):
            return [pick]
        endpoint, rewritten = pick
        headers = {DESTINATION_HEADER: endpoint}
        if rewritten is not None:
            headers["content-length"] = str(len(rewritten))
        metadata = destination_metadata(endpoint)
        if self.duplex_request:  # the headers' answer, then the body, whole, as the proxy sends it on
            whole = ext_proc.StreamedBodyResponse(body=rewritten or bytes(self.body), end_of_stream=True)
            return [
                ext_proc.ProcessingResponse(
                    request_headers=ext_proc.HeadersResponse(
                        response=ext_proc.CommonResponse(header_mutation=set_headers(headers))
                    ),
                    dynamic_metadata=metadata,
                ),
                ext_proc.ProcessingResponse(
                    request_body=ext_proc.BodyResponse(
                        response=ext_proc.CommonResponse(
                            body_mutation=ext_proc.BodyMutation(streamed_response=whole)
                        )
                    )
                ),
            ]
        common = ext_proc.CommonResponse(header_mutation=set_headers(headers))
        if rewritten is not None:
            common.body_mutation.body = rewritten
        return [
            ext_proc.ProcessingResponse(
                request_body=ext_proc.BodyResponse(response=common), dynamic_metadata=metadata
            )
        ]

    async def place(self) -> ext_proc.ProcessingResponse | tuple[str, bytes | None]:
        """Admit, queue and route the whole request: the endpoint picked and the body rewritten with
        a lowered output budget (None when unchanged), or the answer that refuses it."""
        gateway = self.pool.gateway
        if gateway is None:
            reason = self.pool.refusal or "no ModelGroup"
            return refused(503, reason, "OverloadedError", "InferencePoolUnserved")
        try:
            parsed = parse_request(bytes(self.body), self.headers.get(":path", ""), self.pool.bytes_per_token)
        except BadRequestError as error:
            return immediate(
                json_response(error.status, error_body(str(error), "BadRequestError", error.field))
            )
        if parsed.model != gateway.policy.served_model and gateway.adapter_of(parsed) is None:
            served = gateway.policy.served_model
            message = (
                f"model {parsed.model!r} is not served by this pool (it serves {served!r} and its adapters)"
            )
            return immediate(
                json_response(404, error_body(message, "NotFoundError", "model", "model_not_found"))
            )
        shape = gateway.shape_of(self.headers, parsed, self.arrival)
        placed = await gateway.place(parsed, shape, self.headers.get(SESSION_HEADER))
        if not isinstance(placed, Admitted):
            assert isinstance(placed, web.Response)  # no ladder without the gateway's own request
            return immediate(placed)
        assert placed.group is not None
        self.gateway, self.admitted, self.stream = gateway, placed, parsed.stream
        self.dispatched_at = self.clock()
        state = gateway.groups.get(placed.group)
        if state is None:  # the group left in the instant between the pick and now
            self.settle()
            return refused(503, f"group {placed.group} went away", "OverloadedError", "GroupGone")
        adapter = placed.item.payload.adapter if placed.item is not None else None
        if adapter is not None:  # the engine must hold the adapter before the proxy sends it the request
            try:
                await gateway.adapters.ready(placed.group, adapter)
            except AdapterLoadError as error:
                self.settle()
                return immediate(adapter_failed_response(str(error), 502))
        endpoint = state.endpoint.base_url.removeprefix("http://").removeprefix("https://")
        if parsed.requested_output_tokens == placed.decision.output_tokens:
            return endpoint, None
        rewritten = dict(parsed.body)
        rewritten[parsed.output_field] = placed.decision.output_tokens
        return endpoint, json.dumps(rewritten).encode()

    def on_response_headers(self, headers: ext_proc.HttpHeaders) -> ext_proc.ProcessingResponse:
        status = header_map(headers).get(":status", "0")
        self.status = int(status) if status.isdigit() else 0
        common = ext_proc.CommonResponse()
        if self.gateway is not None and self.admitted is not None and self.admitted.group is not None:
            common.header_mutation.CopyFrom(
                set_headers(self.gateway.answer_headers(self.admitted, self.admitted.group))
            )
        if headers.end_of_stream:
            self.finish()
        return ext_proc.ProcessingResponse(response_headers=ext_proc.HeadersResponse(response=common))

    def on_response_body(self, body: ext_proc.HttpBody) -> ext_proc.ProcessingResponse:
        if self.admitted is not None and self.status == 200:
            if self.stream:
                self.count_events(body.body)
            elif len(self.answer) + len(body.body) <= MAX_COUNTED_BODY_BYTES:
                self.answer += body.body
        if body.end_of_stream:
            self.finish()
        if not self.duplex_response:
            return ext_proc.ProcessingResponse(response_body=ext_proc.BodyResponse())
        chunk = ext_proc.StreamedBodyResponse(body=body.body, end_of_stream=body.end_of_stream)
        mutation = ext_proc.BodyMutation(streamed_response=chunk)  # duplex: the chunk goes on unchanged
        return ext_proc.ProcessingResponse(
            response_body=ext_proc.BodyResponse(response=ext_proc.CommonResponse(body_mutation=mutation))
        )

    def count_events(self, chunk: bytes) -> None:
        """As the gateway counts a stream it relays: the first event is the request's first token."""
        if self.times.arrived(chunk, self.clock()) and self.gateway is not None and self.admitted is not None:
            self.gateway.started(self.admitted)
        self.generated = self.times.events

    def finish(self) -> None:
        """The answer ended: observe it (a 200 only, as the gateway does) and settle."""
        if self.settled or self.gateway is None or self.admitted is None:
            return
        if self.status == 200:
            if not self.stream:
                with contextlib.suppress(ValueError, TypeError, KeyError):
                    self.generated = int(json.loads(bytes(self.answer))["usage"]["completion_tokens"])
            self.gateway.observe(self.admitted, self.times.first_at, self.times.gaps, self.generated)
        self.settle()

    def settle(self) -> None:
        if self.settled or self.gateway is None or self.admitted is None or self.admitted.group is None:
            return
        self.settled = True
        self.gateway.settle(self.admitted, self.admitted.group, self.generated, self.dispatched_at)

    def abandon(self) -> None:
        """The stream closed before the answer ended: count the disconnect, settle what was made."""
        if self.settled or self.gateway is None or self.admitted is None:
            return
        stage = "streaming" if self.times.first_at is not None else "dispatched"
        self.gateway.metrics.disconnects.labels(self.gateway.policy.model_group, stage).inc()
        self.settle()


class EndpointPickerService(ext_proc_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    """`ExternalProcessor.Process`: one stream per HTTP request, answered message by message."""

    def __init__(self, pool: PoolState, clock: Callable[[], float] = time.monotonic) -> None:
        self.pool = pool
        self.clock = clock

    async def Process(  # noqa: N802 (the protocol's method name)
        self, requests: AsyncIterator[ext_proc.ProcessingRequest], context: Any
    ) -> AsyncIterator[ext_proc.ProcessingResponse]:
        exchange = Exchange(self.pool, self.clock)
        try:
            async for message in requests:
                for answer in await exchange.answer_to(message):
                    yield answer
                    if answer.HasField("immediate_response"):
                        return
        finally:
            exchange.abandon()
