"""`goodput envelope --endpoint` against servers that cannot be measured: each is named, with what to
set or check, and no figure is printed. The servers are small aiohttp apps on loopback, each wrong in
one way; the sweep runs on a virtual clock, so a server that never answers costs no wall time."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np
import pytest
from aiohttp import web
from virtual_time import run_virtual

from goodput.operator.cli import main
from goodput.simulator.cli_endpoint import Offered, SweepResult, measure_endpoint
from goodput.simulator.endpoint_client import Endpoint, EndpointError
from goodput.simulator.endpoint_sweep import StepRule, SweepBudget, SweepPlan
from goodput.simulator.report import ClassTargets

MODEL = "llama-8b"
CHAT = ClassTargets("chat", ttft_seconds=1.0, itl_seconds=0.1, attainment=0.9)
OFFERED = Offered(np.array([100, 200]), np.array([10, 20]), np.array([0, 0]), np.array([1.9, 2.9]))
PLAN = SweepPlan(2.0, 1.0, drain_seconds=0.0, step=StepRule(min_requests=10, min_seconds=5.0))
BUDGET = SweepBudget(max_requests=200, max_seconds=600.0, max_rate_per_second=10.0)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def models(_: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": MODEL, "max_model_len": 4096}]})


async def streamed(request: web.Request) -> web.StreamResponse:
    """A well-behaved streamed completion: one token per chunk, then usage and [DONE]."""
    body = await request.json()
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for _ in range(body["max_tokens"]):
        await response.write(b'data: {"choices": [{"index": 0, "text": " word"}]}\n\n')
    usage = {"choices": [], "usage": {"completion_tokens": body["max_tokens"]}}
    await response.write(f"data: {json.dumps(usage)}\n\n".encode())
    await response.write(b"data: [DONE]\n\n")
    return response


async def never(_: web.Request) -> web.Response:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def not_streamed(_: web.Request) -> web.Response:
    return web.json_response({"choices": [{"text": "hi"}]})


async def busy_metrics(_: web.Request) -> web.Response:
    """vLLM's gauges of a server someone else keeps busy."""
    text = 'vllm:num_requests_running{engine="0"} 3.0\nvllm:num_requests_waiting{engine="0"} 1.0\n'
    return web.Response(text=text, content_type="text/plain")


def status(code: int, text: str) -> Handler:
    async def answer(_: web.Request) -> web.Response:
        return web.Response(status=code, text=text)

    return answer


def stream_of(*events: bytes) -> Handler:
    async def answer(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for event in events:
            await response.write(event)
        return response

    return answer


def failing_after(good: int) -> Handler:
    """Streams `good` completions well (the probe among them), then answers HTTP 500."""
    served = 0

    async def answer(request: web.Request) -> web.StreamResponse:
        nonlocal served
        served += 1
        if served > good:
            return web.Response(status=500, text='{"error": {"message": "EngineCore died"}}')
        return await streamed(request)

    return answer


def hanging_after(good: int) -> Handler:
    """Streams `good` completions well (the probe), then accepts requests and never answers."""
    served = 0

    async def answer(request: web.Request) -> web.StreamResponse:
        nonlocal served
        served += 1
        if served > good:
            return await never(request)
        return await streamed(request)

    return answer


def sweep(routes: dict[str, Handler] | None, model: str = MODEL) -> str:
    """The message of the `EndpointError` a sweep against a server with these routes raises (no
    server at all with None)."""

    async def run() -> SweepResult:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        endpoint = Endpoint(f"http://127.0.0.1:{port}/v1", model, timeout_seconds=30.0)
        if routes is None:
            listener.close()
            return await measure_endpoint(endpoint, OFFERED, [CHAT], PLAN, BUDGET)
        app = web.Application()
        for path, handler in {"/v1/models": models, "/v1/completions": streamed, **routes}.items():
            app.router.add_route("GET" if path != "/v1/completions" else "POST", path, handler)
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        await web.SockSite(runner, listener).start()
        try:
            return await measure_endpoint(endpoint, OFFERED, [CHAT], PLAN, BUDGET)
        finally:
            await runner.cleanup()

    with pytest.raises(EndpointError) as raised:
        run_virtual(run)
    return str(raised.value)


@pytest.mark.parametrize(
    ("routes", "model", "says"),
    [
        (None, MODEL, ["cannot reach http://127.0.0.1", "check --endpoint"]),
        ({"/v1/models": never}, MODEL, ["/v1/models did not answer within 30 s", "--timeout-seconds"]),
        ({"/v1/models": status(500, "boom")}, MODEL, ["/v1/models answered HTTP 500 (boom)"]),
        ({"/v1/models": status(200, "<html>")}, MODEL, ["is not an OpenAI model list", "OpenAI-compatible"]),
        ({}, "llama-70b", ["does not serve model 'llama-70b' (it serves llama-8b)", "set --model"]),
        ({"/v1/completions": never}, MODEL, ["/v1/completions did not answer within 30 s"]),
        ({"/v1/completions": status(401, "")}, MODEL, ["HTTP 401", "--api-key-env"]),
        (
            {"/v1/completions": status(503, "queue full")},
            MODEL,
            ["HTTP 503 (queue full)", "lower --max-rate"],
        ),
        (
            {"/v1/completions": not_streamed},
            MODEL,
            ["answered 'application/json', not a stream of server-sent events"],
        ),
        (
            {"/v1/completions": stream_of(b"data: {not json\n\n")},
            MODEL,
            ["is not an OpenAI completion chunk"],
        ),
        (
            {"/v1/completions": stream_of(b'data: {"error": {"message": "CUDA error"}}\n\n')},
            MODEL,
            ["failed a request mid-stream", "CUDA error"],
        ),
        (
            {"/v1/completions": stream_of(b'data: {"choices": [{"text": "a"}]}\n\n')},
            MODEL,
            ["ended a stream without 'data: [DONE]'"],
        ),
        (
            {"/v1/completions": failing_after(5)},
            MODEL,
            ["/v1/completions answered HTTP 500", "EngineCore died", "check the server's log"],
        ),
        (
            {"/v1/completions": hanging_after(1)},
            MODEL,
            ["none of the", "got a token", "accepts requests but does not answer"],
        ),
        (
            {"/metrics": busy_metrics},
            MODEL,
            ["still holds 4 requests 3 s after a step ended", "no other traffic reaches"],
        ),
    ],
    ids=[
        "connection-refused",
        "models-time-out",
        "models-http-error",
        "models-not-openai",
        "model-not-served",
        "completions-time-out",
        "needs-an-api-key",
        "refuses-load",
        "not-streaming",
        "malformed-event",
        "error-mid-stream",
        "stream-cut-short",
        "errors-during-the-sweep",
        "hangs-during-the-sweep",
        "busy-with-other-traffic",
    ],
)
def test_a_server_that_cannot_be_measured_is_named_with_what_to_set(
    routes: dict[str, Handler] | None, model: str, says: list[str]
) -> None:
    message = sweep(routes, model)
    for words in says:
        assert words in message, message


def test_the_command_prints_no_profile_for_a_server_that_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()
    flags = ["--endpoint", f"http://127.0.0.1:{port}", "--model", MODEL, "--out", str(tmp_path)]
    code = main(["envelope", "--trace", "synthetic:rate=2,duration=120", *flags, "--timeout-seconds", "5"])
    captured = capsys.readouterr()
    assert code != 0
    assert captured.out == ""
    assert f"cannot reach http://127.0.0.1:{port}/v1/models" in captured.err


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--max-requests", "0"], "--max-requests must be positive"),
        (["--max-rate", "-1"], "--max-rate must be positive"),
        (["--first-rate", "0"], "--first-rate must be positive"),
        (["--ttft-seconds", "1"], "--ttft-seconds and --itl-seconds go together"),
        (["--attainment", "1.5", "--ttft-seconds", "1", "--itl-seconds", "0.1"], "--attainment must be in"),
        (["--endpoint", "vllm:8000"], "--endpoint 'vllm:8000' is no URL"),
    ],
    ids=[
        "no-requests",
        "negative-rate",
        "no-first-rate",
        "half-a-class",
        "attainment-above-one",
        "not-a-url",
    ],
)
def test_bad_flags_are_named_before_any_request(
    flags: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--endpoint", "http://127.0.0.1:9", "--model", MODEL, "--out", str(tmp_path)]
    assert main(["envelope", "--trace", "synthetic:rate=2,duration=120", *base, *flags]) == 2
    assert says in capsys.readouterr().err


def test_without_model_the_command_says_to_set_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flags = ["--endpoint", "http://127.0.0.1:9", "--out", str(tmp_path)]
    assert main(["envelope", "--trace", "synthetic:rate=2,duration=120", *flags]) == 2
    assert "--endpoint needs --model" in capsys.readouterr().err
