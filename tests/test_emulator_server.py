"""The emulated vLLM HTTP server on loopback: its API shapes, health states, drain and faults.

These tests talk real HTTP to a server on 127.0.0.1 and assert what a client or a probe would see.
They never assert how fast anything is (benchmarks measure that); where time matters they assert
only what must hold however slow the machine is (e.g. nothing arrives while the engine hangs).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from virtual_time import run_virtual
from waiting import until, wait_until

from goodput.estimators.service_time import H100_80G, LLAMA_3_1_8B
from goodput.simulator.engine import EngineConfig
from goodput.testbed.cluster.controlplane import free_port
from goodput.testbed.emulator_engine import ServingProfile
from goodput.testbed.emulator_netns import bind_listener
from goodput.testbed.emulator_server import ServerIdentity, ServerState, VllmServer, prefix_block_ids

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SERVED = "llama-8b"


def profile(*, max_queued: int | None = None, max_model_len: int = 131072) -> ServingProfile:
    return ServingProfile(
        EngineConfig.for_hardware(LLAMA_3_1_8B, H100_80G),
        SERVED,
        max_model_len=max_model_len,
        max_num_queued_requests=max_queued,
    )


@contextlib.asynccontextmanager
async def serving(
    serving_profile: ServingProfile | None = None, *, gpus: int = 1
) -> AsyncIterator[tuple[VllmServer, str, aiohttp.ClientSession]]:
    server = VllmServer(serving_profile or profile(), ServerIdentity(MODEL, SERVED), gpus=gpus)
    await server.listen(bind_listener("127.0.0.1", 0))
    assert server.address is not None
    host, port = server.address
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        try:
            yield server, f"http://{host}:{port}", session
        finally:
            await server.close()


async def read_events(response: aiohttp.ClientResponse) -> list[Any]:
    """The SSE body as a list of decoded `data:` payloads ('[DONE]' kept as a string)."""
    body = (await response.read()).decode()
    assert body.endswith("\n\n"), "every event ends with a blank line"
    events: list[Any] = []
    for block in body.split("\n\n")[:-1]:
        assert block.startswith("data: "), f"not an SSE data event: {block!r}"
        payload = block.removeprefix("data: ")
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def completion_body(words: int, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"model": SERVED, "prompt": "word " * words, "max_tokens": max_tokens, **extra}


# ------------------------------------------------------------------------------------ API shapes
def test_health_version_and_models_answer_as_vllm_does() -> None:
    async def main() -> None:
        async with serving() as (_, url, session):
            async with session.get(f"{url}/health") as response:
                assert response.status == 200
                assert await response.read() == b""
            async with session.get(f"{url}/version") as response:
                assert await response.json() == {"version": "0.33.0"}
            async with session.get(f"{url}/v1/models") as response:
                (model,) = (await response.json())["data"]
                assert (model["id"], model["root"], model["max_model_len"]) == (SERVED, MODEL, 131072)

    asyncio.run(main())


def test_metrics_carry_dcgm_gpu_utilisation_for_each_gpu_of_the_rank_busy_while_it_computes() -> None:
    """What a GPU-utilisation autoscaler reads from the DCGM exporter: 0 while idle, most of the
    sample period while a long completion runs, on every GPU of the rank."""

    async def utilisation(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
        async with session.get(f"{url}/metrics") as response:
            text = await response.text()
        (family,) = [f for f in text_string_to_metric_families(text) if f.name == "DCGM_FI_DEV_GPU_UTIL"]
        return {sample.labels["gpu"]: sample.value for sample in family.samples}

    async def main() -> None:
        async with serving(gpus=2) as (_, url, session):
            await asyncio.sleep(1.1)  # on the virtual clock: a sample period passes at once
            assert await utilisation(session, url) == {"0": 0.0, "1": 0.0}
            body = completion_body(100, 400)
            answer = asyncio.create_task(session.post(f"{url}/v1/completions", json=body))
            await asyncio.sleep(1.2)  # on the virtual clock
            busy = await utilisation(session, url)
            assert set(busy) == {"0", "1"} and busy["0"] == busy["1"] >= 50.0, busy
            (await answer).close()

    run_virtual(main)


def test_a_streamed_completion_is_sse_chunks_then_usage_then_done() -> None:
    async def main() -> None:
        async with serving() as (_, url, session):
            body = completion_body(100, 40, stream=True, stream_options={"include_usage": True})
            async with session.post(f"{url}/v1/completions", json=body) as response:
                assert response.status == 200
                assert response.headers["Content-Type"].startswith("text/event-stream")
                events = await read_events(response)
        *chunks, usage, done = events
        assert done == "[DONE]"
        assert {chunk["object"] for chunk in chunks} == {"text_completion"}
        assert len({chunk["id"] for chunk in [*chunks, usage]}) == 1
        assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + ["length"]
        text = "".join(chunk["choices"][0]["text"] for chunk in chunks)
        assert len(text.split()) == 40
        assert usage["choices"] == []
        assert usage["usage"] == {"prompt_tokens": 100, "completion_tokens": 40, "total_tokens": 140}

    asyncio.run(main())


def test_a_streamed_chat_completion_starts_with_the_assistant_role() -> None:
    async def main() -> None:
        async with serving() as (_, url, session):
            body = {
                "messages": [{"role": "user", "content": "one two three"}],
                "max_tokens": 12,
                "stream": True,
            }
            async with session.post(f"{url}/v1/chat/completions", json=body) as response:
                *chunks, done = await read_events(response)
        assert done == "[DONE]"
        assert {chunk["object"] for chunk in chunks} == {"chat.completion.chunk"}
        deltas = [chunk["choices"][0]["delta"] for chunk in chunks]
        assert deltas[0]["role"] == "assistant"
        assert all("role" not in delta for delta in deltas[1:])
        assert len("".join(delta["content"] for delta in deltas).split()) == 12
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"

    asyncio.run(main())


@pytest.mark.parametrize(
    ("path", "body", "object_kind"),
    [
        ("/v1/completions", {"prompt": [1, 2, 3, 4, 5], "max_tokens": 7}, "text_completion"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "a b c d e"}], "max_tokens": 7},
            "chat.completion",
        ),
    ],
    ids=["completions-token-ids", "chat"],
)
def test_a_non_streamed_response_carries_the_text_and_usage(
    path: str, body: dict[str, Any], object_kind: str
) -> None:
    async def main() -> dict[str, Any]:
        async with serving() as (_, url, session), session.post(url + path, json=body) as response:
            assert response.status == 200
            result: dict[str, Any] = await response.json()
            return result

    result = asyncio.run(main())
    assert result["object"] == object_kind
    choice = result["choices"][0]
    text = choice["text"] if "text" in choice else choice["message"]["content"]
    assert len(text.split()) == 7
    assert choice["finish_reason"] == "length"
    assert result["usage"] == {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"model": "gpt-4", "prompt": "hi", "max_tokens": 4}, 404, "does not exist"),
        ({"prompt": "w " * 2000, "max_tokens": 100}, 400, "maximum context length is 2048"),
        ({"prompt": "hi", "max_tokens": 4, "n": 2}, 400, "one choice"),
        ({"prompt": ["a", "b"], "max_tokens": 4}, 400, "one prompt per request"),
        ({"prompt": "hi", "max_tokens": "many"}, 400, "integer"),
    ],
    ids=["unknown-model", "longer-than-context", "n-above-one", "batched-prompts", "bad-max-tokens"],
)
def test_bad_requests_get_vllms_error_shape(body: dict[str, Any], status: int, message: str) -> None:
    async def main() -> tuple[int, dict[str, Any]]:
        async with (
            serving(profile(max_model_len=2048)) as (_, url, session),
            session.post(f"{url}/v1/completions", json=body) as response,
        ):
            return response.status, await response.json()

    got_status, error = asyncio.run(main())
    assert got_status == status
    assert error["error"]["code"] == status
    assert message in error["error"]["message"]


def test_over_the_queue_limit_the_server_answers_503() -> None:
    async def main() -> None:
        async with serving(profile(max_queued=1)) as (server, url, session):
            long = asyncio.create_task(session.post(f"{url}/v1/completions", json=completion_body(10, 5000)))
            await until(lambda: server.engine.in_flight > 0, "the long request is in flight")
            async with session.post(f"{url}/v1/completions", json=completion_body(10, 5)) as response:
                assert response.status == 503
            assert server.engine.snapshot().admission_rejections == {"max_num_queued_reqs": 1}
            long.cancel()

    asyncio.run(main())


def test_prompts_sharing_leading_blocks_hit_the_prefix_cache() -> None:
    shared = tuple(f"s{i}" for i in range(512))
    assert prefix_block_ids((*shared, "a"), 256) == prefix_block_ids((*shared, "b"), 256)
    assert prefix_block_ids(("x", *shared[1:]), 256)[0] != prefix_block_ids(shared, 256)[0]

    async def main() -> tuple[int, int]:
        async with serving() as (server, url, session):
            for tail in ("first question", "second question"):
                body = {"prompt": " ".join(shared) + " " + tail, "max_tokens": 2}
                async with session.post(f"{url}/v1/completions", json=body) as response:
                    assert response.status == 200
            snapshot = server.engine.snapshot()
            return snapshot.prefix_cache_hits, snapshot.prompt_tokens_cached

    hits, cached = asyncio.run(main())
    assert hits == cached == 512, "the second request reuses both 256-word blocks"


# ------------------------------------------------------------------------------------ lifecycle
def test_sigterm_drain_lets_short_work_finish_aborts_the_rest_and_closes() -> None:
    async def main() -> None:
        async with serving() as (server, url, session):
            stream = {"stream": True}
            long_calls = [
                asyncio.create_task(
                    session.post(f"{url}/v1/completions", json=completion_body(50, 20000, **stream))
                )
                for _ in range(3)
            ]
            responses = [await call for call in long_calls]
            shutdown = server.terminate(1.0)
            await asyncio.sleep(0)
            assert server.state is ServerState.TERMINATING
            async with session.get(f"{url}/health") as health:
                assert health.status == 200, "vLLM keeps /health at 200 while draining"
            async with session.post(f"{url}/v1/completions", json=completion_body(5, 5, **stream)) as late:
                *late_chunks, late_done = await read_events(late)
                assert late_chunks[-1]["choices"][0]["finish_reason"] == "abort" and late_done == "[DONE]"
            for response in responses:
                *chunks, done = await read_events(response)
                assert chunks[-1]["choices"][0]["finish_reason"] == "abort"
                assert done == "[DONE]"
            await shutdown
            assert server.engine.snapshot().request_success == {"abort": 4}
            with pytest.raises(aiohttp.ClientConnectorError):
                await session.get(f"{url}/health")

    asyncio.run(main())


def test_engine_death_fails_in_flight_answers_503_then_closes_the_port() -> None:
    async def main() -> None:
        async with serving() as (server, url, session):
            response = await session.post(
                f"{url}/v1/completions", json=completion_body(50, 20000, stream=True)
            )
            first = await response.content.readline()
            assert first.startswith(b"data: ")
            dying = server.kill_engine(linger_seconds=0.5)
            await asyncio.sleep(0)
            async with session.get(f"{url}/health") as health:
                assert health.status == 503
            async with session.post(f"{url}/v1/completions", json=completion_body(5, 5)) as refused:
                assert refused.status == 500
            body = (await response.read()).decode()
            assert '"error"' in body and body.endswith("data: [DONE]\n\n")
            await dying
            assert server.engine.snapshot().request_success == {"error": 1}
            with pytest.raises(aiohttp.ClientConnectorError):
                await session.get(f"{url}/health")

    asyncio.run(main())


def test_a_hung_engine_stays_healthy_but_produces_nothing_until_it_resumes() -> None:
    async def main() -> None:
        async with serving() as (server, url, session):
            server.hang()
            response = await session.post(f"{url}/v1/completions", json=completion_body(10, 3, stream=True))
            async with session.get(f"{url}/health") as health:
                assert health.status == 200
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(response.content.readline(), 0.5)
            server.resume()
            *chunks, done = await read_events(response)
            assert done == "[DONE]" and chunks[-1]["choices"][0]["finish_reason"] == "length"

    asyncio.run(main())


def test_a_client_that_disconnects_is_not_counted_as_finished() -> None:
    async def main() -> None:
        async with serving() as (server, url, session):
            response = await session.post(f"{url}/v1/completions", json=completion_body(10, 100, stream=True))
            await response.content.readline()
            response.close()
            async with session.post(f"{url}/v1/completions", json=completion_body(10, 3)) as other:
                assert other.status == 200
            await until(lambda: not server.engine.in_flight, "the disconnected request ends")
            snapshot = server.engine.snapshot()
            assert snapshot.request_success == {"length": 1}
            assert snapshot.histograms["vllm:e2e_request_latency_seconds"].total == 1

    asyncio.run(main())


# ------------------------------------------------------------------------------------ the command
def _connect(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def test_the_command_refuses_connections_while_loading_and_drains_on_sigterm() -> None:
    port = free_port()
    load_seconds = 2.0
    command = [
        sys.executable,
        "-m",
        "goodput.testbed.cli_emulate",
        "--serve",
        f"127.0.0.1:{port}",
        "--load-seconds",
        str(load_seconds),
        "--shutdown-timeout",
        "30",
        "--log-level",
        "WARNING",
        "--model",
        MODEL,
        "--served-model-name",
        SERVED,
    ]
    started = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env={**os.environ})
    try:
        refused_at_least_once = not _connect(port)
        wait_until(
            lambda: process.poll() is not None or _connect(port), "the emulator listening", timeout_seconds=60
        )
        assert process.poll() is None, "the emulator exited while loading"
        assert refused_at_least_once
        assert time.monotonic() - started >= load_seconds, "the port opened before the load was over"
        assert process.stdout is not None
        assert process.stdout.readline().strip() == f"listening 127.0.0.1:{port} 127.0.0.1:{port}"

        async def drained_request() -> list[Any]:
            async with aiohttp.ClientSession() as session:
                body = completion_body(20, 60, stream=True)
                async with session.post(f"http://127.0.0.1:{port}/v1/completions", json=body) as response:
                    await response.content.readline()
                    process.send_signal(signal.SIGTERM)  # the request is in flight
                    return await read_events_after_first(response)

        *chunks, done = asyncio.run(drained_request())
        assert done == "[DONE]"
        assert chunks[-1]["choices"][0]["finish_reason"] == "length", "--shutdown-timeout lets it finish"
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


async def read_events_after_first(response: aiohttp.ClientResponse) -> list[Any]:
    events: list[Any] = []
    async for line in response.content:
        text = line.decode().strip()
        if text.startswith("data: "):
            payload = text.removeprefix("data: ")
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events
