"""The endpoint picker at the protocol level: a gRPC client built from Envoy's published ext-proc
definitions (xds-protos) drives `ExternalProcessor.Process` as Envoy would, one stream per HTTP
request (request headers, buffered body, response headers, response body), and reads what the
picker answers. No Envoy runs: these prove the picker speaks the protocol as the definitions
specify and makes goodput's decisions, not how a proxy applies them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import grpc
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
from test_gateway import MODEL, completion, request_path_policy, run, sample
from waiting import until

from goodput.controllers.compile.request_path import RequestPathPolicy
from goodput.gateway.endpoint_picker import DESTINATION_HEADER, PoolState
from goodput.gateway.endpoint_picker_cli import serve_picker
from goodput.gateway.groups import GroupEndpoint, StaticGroupSource
from goodput.gateway.server import Gateway

ENDPOINT = "10.1.2.3:8000"


def header_map(headers: Sequence[tuple[str, str]]) -> ext_proc.HttpHeaders:
    return ext_proc.HttpHeaders(
        headers=base_pb2.HeaderMap(
            headers=[base_pb2.HeaderValue(key=key, raw_value=value.encode()) for key, value in headers]
        )
    )


def request_headers(path: str = "/v1/completions", **goodput: str) -> ext_proc.ProcessingRequest:
    headers = [(":method", "POST"), (":path", path), ("content-type", "application/json")]
    headers += [(f"x-goodput-{name}", value) for name, value in goodput.items()]
    return ext_proc.ProcessingRequest(request_headers=header_map(headers))


def request_body(body: dict[str, Any]) -> ext_proc.ProcessingRequest:
    raw = json.dumps(body).encode()
    return ext_proc.ProcessingRequest(request_body=ext_proc.HttpBody(body=raw, end_of_stream=True))


def response_headers(status: int = 200) -> ext_proc.ProcessingRequest:
    return ext_proc.ProcessingRequest(response_headers=header_map([(":status", str(status))]))


def response_body(chunk: bytes, end: bool) -> ext_proc.ProcessingRequest:
    return ext_proc.ProcessingRequest(response_body=ext_proc.HttpBody(body=chunk, end_of_stream=end))


def set_headers(mutation: ext_proc.HeaderMutation) -> dict[str, str]:
    return {option.header.key: option.header.raw_value.decode() for option in mutation.set_headers}


@dataclass
class Picker:
    stub: ext_proc_grpc.ExternalProcessorStub
    gateway: Gateway
    pool: PoolState

    async def ask(self, call: Any, message: ext_proc.ProcessingRequest) -> ext_proc.ProcessingResponse:
        await call.write(message)
        return await call.read()

    async def pick(self, body: dict[str, Any], **goodput: str) -> tuple[Any, ext_proc.ProcessingResponse]:
        """Open a request's stream, send its headers and body: the stream and the body's answer."""
        call = self.stub.Process()
        headers_answer = await self.ask(call, request_headers(**goodput))
        assert headers_answer.HasField("request_headers"), headers_answer
        return call, await self.ask(call, request_body(body))

    def in_flight(self) -> int:
        return sum(state.book.in_flight for state in self.gateway.groups.values())


@asynccontextmanager
async def picker(policy: RequestPathPolicy | None = None, ready: bool = True) -> AsyncIterator[Picker]:
    """The picker's gRPC service on 127.0.0.1, serving a ModelGroup with one group at ENDPOINT."""
    source = StaticGroupSource([GroupEndpoint("g1", f"http://{ENDPOINT}", ready, False)])
    gateway = Gateway(policy or request_path_policy(), source)
    pool = PoolState(gateway=gateway, refusal=None)
    async with aiohttp.ClientSession() as session:
        gateway.start(session)
        server, port = await serve_picker(pool, 0, host="127.0.0.1")
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                yield Picker(ext_proc_grpc.ExternalProcessorStub(channel), gateway, pool)
        finally:
            await server.stop(grace=None)
            await gateway.stop()


def picked_endpoint(answer: ext_proc.ProcessingResponse) -> tuple[str, str]:
    """The endpoint in the header the body's answer sets, and in the `envoy.lb` metadata."""
    assert answer.HasField("request_body"), answer
    header = set_headers(answer.request_body.response.header_mutation)[DESTINATION_HEADER]
    metadata = answer.dynamic_metadata.fields["envoy.lb"].struct_value.fields[DESTINATION_HEADER]
    return header, metadata.string_value


def immediate(answer: ext_proc.ProcessingResponse) -> tuple[int, dict[str, str], dict[str, Any]]:
    assert answer.HasField("immediate_response"), answer
    response = answer.immediate_response
    return response.status.code, set_headers(response.headers), json.loads(response.body)


def test_a_request_is_picked_an_endpoint_and_its_streamed_answer_is_counted() -> None:
    """The pick travels in the header and the metadata alike; the answer's headers gain goodput's;
    the first event is the TTFT, each later chunk one inter-token gap (as the gateway counts what it
    relays), the end frees the slot and counts the request as finished."""

    async def main() -> None:
        async with picker() as p:
            call, answer = await p.pick(completion(stream=True), tenant="a", **{"class": "chat"})
            assert picked_endpoint(answer) == (ENDPOINT, ENDPOINT)
            assert p.in_flight() == 1
            headers = await p.ask(call, response_headers(200))
            shown = set_headers(headers.response_headers.response.header_mutation)
            assert shown["X-Goodput-Group"] == "g1" and shown["X-Goodput-Outcome"] == "admitted"
            for chunk in [b'data: {"x":1}\n\n', b'data: {"x":2}\n\ndata: {"x":3}\n\n']:
                answer = await p.ask(call, response_body(chunk, end=False))
                assert answer.HasField("response_body")
            await p.ask(call, response_body(b"data: [DONE]\n\n", end=True))
            await call.done_writing()
            assert p.in_flight() == 0
            labels = {"model_group": MODEL, "slo_class": "chat"}
            assert sample(p.gateway, "goodput_gateway_time_to_first_token_seconds_count", **labels) == 1
            assert sample(p.gateway, "goodput_gateway_inter_token_latency_seconds_count", **labels) == 1
            finished = {**labels, "tenant": "a", "slo_met": "true"}
            assert sample(p.gateway, "goodput_gateway_requests_finished_total", **finished) == 1

    run(main)


def test_a_refused_request_gets_an_immediate_response_with_goodputs_reason() -> None:
    """Contract and budget refusals answer the client from the picker, naming the reason."""

    async def main() -> None:
        policy = request_path_policy(tenant_tokens_per_minute={"a": 8})
        async with picker(policy) as p:
            _, answer = await p.pick(completion(), **{"class": "no-such-class"})
            status, headers, body = immediate(answer)
            assert status == 400 and headers["X-Goodput-Reason"] == "UnknownClass", (headers, body)
            assert body["error"]["param"] == "X-Goodput-Class"
            _, answer = await p.pick(completion(max_tokens=64, prompt="x" * 400), tenant="a")
            status, headers, body = immediate(answer)
            assert status == 429 and "Retry-After" in headers, (headers, body)
            assert headers["X-Goodput-Reason"] == body["error"]["code"]
            assert p.in_flight() == 0

    run(main)


def test_a_request_no_group_takes_is_answered_503_when_its_hold_runs_out() -> None:
    async def main() -> None:
        async with picker(request_path_policy(max_defer_seconds=0.2), ready=False) as p:
            _, answer = await p.pick(completion())
            status, headers, body = immediate(answer)
            assert status == 503 and headers["Retry-After"], body
            assert body["error"]["code"] == "HoldExpired"
            assert len(p.gateway.queue) == 0

    run(main)


def test_an_unserved_pool_an_unknown_model_and_no_body_are_refused_by_name() -> None:
    async def main() -> None:
        async with picker() as p:
            _, answer = await p.pick(completion(model="other-model"))
            status, _, body = immediate(answer)
            assert status == 404 and "other-model" in body["error"]["message"]
            reason = "InferencePool default/chat names no goodput ModelGroup: spec.selector.matchLabels ..."
            p.pool.gateway, p.pool.refusal = None, reason
            _, answer = await p.pick(completion())
            status, headers, body = immediate(answer)
            assert status == 503 and body["error"]["message"] == reason and headers["Retry-After"] == "1"
            assert body["error"]["code"] == "InferencePoolUnserved"
            bodiless = request_headers()
            bodiless.request_headers.end_of_stream = True
            status, headers, body = immediate(await p.ask(p.stub.Process(), bodiless))
            assert status == 400 and "Retry-After" not in headers, body

    run(main)


def test_a_proxy_that_streams_the_request_body_in_chunks_is_told_the_setting_it_needs() -> None:
    async def main() -> None:
        async with picker() as p:
            call = p.stub.Process()
            message = request_headers()
            message.protocol_config.request_body_mode = processing_mode_pb2.ProcessingMode.STREAMED
            status, _, body = immediate(await p.ask(call, message))
            assert status == 500 and "STREAMED" in body["error"]["message"]
            assert "BUFFERED or FULL_DUPLEX_STREAMED" in body["error"]["message"]

    run(main)


def test_in_full_duplex_mode_the_headers_answer_waits_for_the_body_and_carries_the_pick() -> None:
    """FULL_DUPLEX_STREAMED: nothing is answered while the body streams in; then the headers' answer
    with the pick, then the body, whole, for the proxy to send on; the answer's chunks come back."""

    async def main() -> None:
        duplex = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
        async with picker() as p:
            call = p.stub.Process()
            message = request_headers()
            message.protocol_config.request_body_mode = duplex
            message.protocol_config.response_body_mode = duplex
            raw = json.dumps(completion()).encode()
            await call.write(message)
            await call.write(ext_proc.ProcessingRequest(request_body=ext_proc.HttpBody(body=raw[:10])))
            await call.write(ext_proc.ProcessingRequest(request_body=ext_proc.HttpBody(body=raw[10:])))
            assert p.in_flight() == 0  # nothing decided before the body is whole
            end = ext_proc.ProcessingRequest(request_body=ext_proc.HttpBody(end_of_stream=True))
            await call.write(end)
            headers = await call.read()
            assert set_headers(headers.request_headers.response.header_mutation) == {
                DESTINATION_HEADER: ENDPOINT
            }
            metadata = headers.dynamic_metadata.fields["envoy.lb"].struct_value.fields[DESTINATION_HEADER]
            assert metadata.string_value == ENDPOINT
            body = (await call.read()).request_body.response.body_mutation.streamed_response
            assert body.body == raw and body.end_of_stream
            await p.ask(call, response_headers(200))
            chunk = json.dumps({"usage": {"completion_tokens": 3}}).encode()
            echoed = await p.ask(call, response_body(chunk, end=True))
            streamed = echoed.response_body.response.body_mutation.streamed_response
            assert streamed.body == chunk and streamed.end_of_stream
            assert p.in_flight() == 0

    run(main)


def test_the_output_budget_admission_gives_reaches_the_engine_in_the_body() -> None:
    """A request without max_tokens (as a degraded one) goes on with the budget admission gave it:
    the body's answer rewrites the body and its length, as the gateway does before it proxies."""

    async def main() -> None:
        async with picker() as p:
            context = p.gateway.policy.admission.context_tokens
            _, answer = await p.pick(completion(max_tokens=None, prompt="x"))
            picked_endpoint(answer)
            mutated = answer.request_body.response.body_mutation.body
            assert 0 < json.loads(mutated)["max_tokens"] <= context
            length = set_headers(answer.request_body.response.header_mutation)["content-length"]
            assert length == str(len(mutated))

    run(main)


def test_two_tenants_share_one_slot_by_their_counters() -> None:
    """One slot: tenant a queues six requests before b's two; as each answer ends the slot goes by
    the tenants' counters, so b is not served last (the gateway's own fairness, through the picker)."""

    async def complete(call: Any) -> None:
        await call.write(response_headers(200))
        await call.read()
        await call.write(response_body(json.dumps({"usage": {"completion_tokens": 4}}).encode(), end=True))
        await call.read()

    async def main() -> None:
        async with picker(request_path_policy(max_num_seqs=1, max_defer_seconds=10)) as p:
            first, answer = await p.pick(completion(), tenant="a")
            picked_endpoint(answer)
            waiting: dict[asyncio.Task[ext_proc.ProcessingResponse], tuple[str, Any]] = {}
            for tenant in ["a"] * 6 + ["b"] * 2:
                call = p.stub.Process()
                await p.ask(call, request_headers(tenant=tenant))
                waiting[asyncio.create_task(p.ask(call, request_body(completion())))] = (tenant, call)
                await until(lambda: len(p.gateway.queue) == len(waiting), "queued behind the first")
            await complete(first)
            served: list[str] = []
            while waiting:
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                assert len(done) == 1, "one slot: one pick at a time"
                task = done.pop()
                tenant, call = waiting.pop(task)
                assert picked_endpoint(task.result())[0] == ENDPOINT
                served.append(tenant)
                await complete(call)
            assert served.index("b") <= 3 and served[:6].count("b") == 2, served

    run(main)


def test_a_stream_closed_before_its_answer_ends_frees_its_slot() -> None:
    async def main() -> None:
        async with picker() as p:
            call, answer = await p.pick(completion(stream=True))
            picked_endpoint(answer)
            await p.ask(call, response_headers(200))
            await p.ask(call, response_body(b'data: {"x":1}\n\n', end=False))
            call.cancel()
            await until(lambda: p.in_flight() == 0, "the slot given back")
            stage = {"model_group": MODEL, "stage": "streaming"}
            assert sample(p.gateway, "goodput_gateway_client_disconnects_total", **stage) == 1

    run(main)
