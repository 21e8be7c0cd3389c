"""The I/O of `goodput envelope --endpoint`: an OpenAI-compatible server (vLLM's) asked what it serves,
then sent streamed completions open loop, each timed to its first token and its last.

Every decision (rates, step lengths, bounds, verdicts) is `simulator.endpoint_sweep`'s; this module
only talks HTTP and turns what goes wrong into an `EndpointError` that names the problem and the
setting to change. Times are the event loop's clock, so a test can run the sweep on a virtual one.

Requests are `/v1/completions` with the prompt as token ids (exactly the trace's input length, on any
tokenizer: ids are drawn from a range every common vocabulary holds, seeded, so prompts share no
prefix-cache blocks) and `max_tokens` the trace's output length with `ignore_eos` and `min_tokens`
(vLLM's sampling extensions), so the server produces the trace's lengths.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from goodput.api import vllm_names
from goodput.simulator.endpoint_sweep import RequestTiming, SweepStep, arrival_offsets

PROMPT_TOKEN_IDS = (1000, 20000)
"""Token ids for prompts: ordinary tokens in every common vocabulary (special tokens sit at either
end of Llama's, Mistral's, Qwen's and Gemma's)."""


class EndpointError(Exception):
    """The endpoint cannot be measured: what went wrong, and what to set or check."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """The server under test: its base URL (without /v1), the served model name, and how long a
    reply to a single request (the checks before the sweep) may take."""

    url: str
    model: str
    timeout_seconds: float = 30.0
    api_key: str | None = None

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    @property
    def base(self) -> str:
        return self.url.rstrip("/").removesuffix("/v1")


@dataclass(frozen=True, slots=True)
class ServedModel:
    """What `/v1/models` and `/metrics` say of the served model (None: not published)."""

    max_model_len: int | None
    kv_capacity_tokens: int | None


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    """One request of a step: when it is sent (seconds from the step's start) and its lengths."""

    offset_seconds: float
    class_number: int
    input_tokens: int
    output_tokens: int
    deadline_seconds: float


def _connection_error(endpoint: Endpoint, path: str, error: Exception) -> EndpointError:
    if isinstance(error, TimeoutError):
        return EndpointError(
            f"{endpoint.base}{path} did not answer within {endpoint.timeout_seconds:g} s: check that "
            "the server is up and not overloaded, or raise --timeout-seconds"
        )
    return EndpointError(
        f"cannot reach {endpoint.base}{path} ({error}): check --endpoint (the server's base URL, "
        "e.g. http://vllm.my-team:8000) and that the server is listening there"
    )


def _http_error(endpoint: Endpoint, path: str, status: int, body: str) -> EndpointError:
    detail = body.strip().replace("\n", " ")[:300]
    hint = {
        400: "the server rejected a request (goodput envelope sends token-id prompts with vLLM's "
        "ignore_eos and min_tokens): measure a vLLM server, or check --model",
        401: "the server wants an API key: set --api-key-env to the environment variable that holds it",
        403: "the server refused the API key: check the variable --api-key-env names",
        404: "check --endpoint (the base URL, without /v1) and --model",
        429: "the server refuses load: lower --max-rate",
        503: "the server refuses load (vLLM's --max-num-queued-reqs?): raise that limit or lower --max-rate",
    }.get(status, "check the server's log")
    return EndpointError(f"{endpoint.base}{path} answered HTTP {status} ({detail or 'no body'}): {hint}")


async def _get(session: aiohttp.ClientSession, endpoint: Endpoint, path: str) -> str:
    try:
        async with asyncio.timeout(endpoint.timeout_seconds):
            async with session.get(f"{endpoint.base}{path}", headers=endpoint.headers) as response:
                body = await response.text()
                if response.status != 200:
                    raise _http_error(endpoint, path, response.status, body)
                return body
    except (aiohttp.ClientError, TimeoutError) as error:
        raise _connection_error(endpoint, path, error) from error


async def served_model(session: aiohttp.ClientSession, endpoint: Endpoint) -> ServedModel:
    """The model's limits, after checking the server serves it under `endpoint.model`."""
    body = await _get(session, endpoint, "/v1/models")
    try:
        models = {entry["id"]: entry for entry in json.loads(body)["data"]}
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise EndpointError(
            f"{endpoint.base}/v1/models is not an OpenAI model list ({body[:200]!r}): check --endpoint "
            "points at an OpenAI-compatible server such as vLLM's"
        ) from error
    if endpoint.model not in models:
        served = ", ".join(sorted(models)) or "nothing"
        raise EndpointError(
            f"{endpoint.base} does not serve model {endpoint.model!r} (it serves {served}): set --model "
            "to the served model name"
        )
    length = models[endpoint.model].get("max_model_len")
    return ServedModel(length if isinstance(length, int) else None, await _kv_capacity(session, endpoint))


async def _kv_capacity(session: aiohttp.ClientSession, endpoint: Endpoint) -> int | None:
    """KV-cache tokens from vLLM's `vllm:cache_config_info` (None when /metrics does not say)."""
    try:
        text = await _get(session, endpoint, "/metrics")
    except EndpointError:
        return None
    try:
        for family in text_string_to_metric_families(text):
            if family.name == vllm_names.CACHE_CONFIG_INFO:
                labels = family.samples[0].labels
                return int(labels["num_gpu_blocks"]) * int(labels["block_size"])
    except (ValueError, KeyError, IndexError):
        return None
    return None


async def requests_in_server(session: aiohttp.ClientSession, endpoint: Endpoint) -> int | None:
    """Requests the server runs or queues (`vllm:num_requests_running` + `_waiting`), None when its
    /metrics does not say."""
    try:
        text = await _get(session, endpoint, "/metrics")
    except EndpointError:
        return None
    names = {vllm_names.NUM_REQUESTS_RUNNING, vllm_names.NUM_REQUESTS_WAITING}
    try:
        samples = [
            sample.value
            for family in text_string_to_metric_families(text)
            if family.name in names
            for sample in family.samples
        ]
    except ValueError:
        return None
    return round(sum(samples)) if samples else None


async def settle(
    session: aiohttp.ClientSession, endpoint: Endpoint, longest_seconds: float, poll_seconds: float = 0.5
) -> None:
    """Wait until the server holds no request, so each step starts from an idle server: requests
    cancelled at their deadline may linger in its queue until it aborts them. A server with no vLLM
    metrics is not waited for; one still busy after `longest_seconds` (the polls included: the wait
    is part of the sweep's time budget) is serving someone else."""
    held: int | None = None
    try:
        async with asyncio.timeout(longest_seconds):
            while held := await requests_in_server(session, endpoint):
                await asyncio.sleep(poll_seconds)
    except TimeoutError:
        raise EndpointError(
            f"{endpoint.base} still holds {held} requests {longest_seconds:.0f} s after a step ended: "
            "other traffic reaches it or it does not abort cancelled requests; measure a server (or "
            "group) no other traffic reaches"
        ) from None


def request_body(model: str, request: PlannedRequest, rng: np.random.Generator) -> dict[str, Any]:
    """A streamed completion with exactly the planned lengths on any vocabulary."""
    prompt = rng.integers(*PROMPT_TOKEN_IDS, size=max(1, request.input_tokens)).tolist()
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": request.output_tokens,
        "min_tokens": request.output_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


@dataclass(slots=True)
class _StreamState:
    first_token: float | None = None
    last_token: float | None = None
    chunks_with_text: int = 0
    completion_tokens: int | None = None
    done: bool = False


def _read_event(endpoint: Endpoint, line: bytes, state: _StreamState, now: float) -> None:
    """One SSE line of a streamed completion into the request's state."""
    text = line.decode(errors="replace").strip()
    if not text or text.startswith(":"):
        return
    if not text.startswith("data:"):
        raise EndpointError(
            f"{endpoint.base}/v1/completions streamed a line that is not SSE data: {text[:200]!r}"
        )
    payload = text.removeprefix("data:").strip()
    if payload == "[DONE]":
        state.done = True
        return
    try:
        event = json.loads(payload)
        if "error" in event:
            raise EndpointError(
                f"{endpoint.base}/v1/completions failed a request mid-stream ({event['error']}): check the "
                "server's log"
            )
        choices = event.get("choices") or []
        usage = event.get("usage")
    except (json.JSONDecodeError, AttributeError) as error:
        raise EndpointError(
            f"{endpoint.base}/v1/completions streamed an event that is not an OpenAI completion chunk: "
            f"{payload[:200]!r}"
        ) from error
    if usage:
        state.completion_tokens = int(usage.get("completion_tokens", 0))
    if any(isinstance(c, dict) and c.get("text") for c in choices):
        state.first_token = now if state.first_token is None else state.first_token
        state.last_token = now
        state.chunks_with_text += 1


async def stream_completion(
    session: aiohttp.ClientSession, endpoint: Endpoint, body: dict[str, Any]
) -> tuple[float | None, float | None, int]:
    """(first token, last token, output tokens), seconds from the send; raises `EndpointError` on an
    answer that is not a streamed completion. Cancel it to give up at a deadline."""
    loop = asyncio.get_running_loop()
    sent = loop.time()
    state = _StreamState()
    try:
        async with session.post(
            f"{endpoint.base}/v1/completions", json=body, headers=endpoint.headers
        ) as response:
            if response.status != 200:
                raise _http_error(endpoint, "/v1/completions", response.status, await response.text())
            if not response.content_type.startswith("text/event-stream"):
                raise EndpointError(
                    f"{endpoint.base}/v1/completions answered {response.content_type!r}, not a stream of "
                    "server-sent events: goodput envelope needs an OpenAI-compatible server that streams "
                    "(vLLM's does)"
                )
            async for line in response.content:
                _read_event(endpoint, line, state, loop.time() - sent)
    except aiohttp.ClientError as error:
        raise _connection_error(endpoint, "/v1/completions", error) from error
    if not state.done:
        raise EndpointError(f"{endpoint.base}/v1/completions ended a stream without 'data: [DONE]'")
    tokens = state.completion_tokens or state.chunks_with_text
    return state.first_token, state.last_token, tokens


async def probe(session: aiohttp.ClientSession, endpoint: Endpoint) -> None:
    """One short streamed request before the sweep: a server that fails it is named before any load."""
    body = request_body(endpoint.model, PlannedRequest(0.0, 0, 16, 4, 0.0), np.random.default_rng(0))
    try:
        async with asyncio.timeout(endpoint.timeout_seconds):
            first, _, _ = await stream_completion(session, endpoint, body)
    except TimeoutError as error:
        raise _connection_error(endpoint, "/v1/completions", error) from error
    if first is None:
        raise EndpointError(f"{endpoint.base}/v1/completions streamed no token for a 4-token completion")


async def _timed(
    session: aiohttp.ClientSession, endpoint: Endpoint, request: PlannedRequest, body: dict[str, Any]
) -> RequestTiming:
    """One request of a step; past its SLO deadline it has missed and is cancelled (not an error)."""
    try:
        async with asyncio.timeout(request.deadline_seconds):
            first, last, tokens = await stream_completion(session, endpoint, body)
    except TimeoutError:
        return RequestTiming(request.class_number, None, None, request.output_tokens)
    return RequestTiming(request.class_number, first, last, tokens)


async def run_step(
    session: aiohttp.ClientSession,
    endpoint: Endpoint,
    requests: Sequence[PlannedRequest],
    seed: int,
) -> list[RequestTiming]:
    """Send each request at its offset from now, open loop (no request waits for another), and time
    them all; the first `EndpointError` cancels the rest and is raised."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    rng = np.random.default_rng([seed, 17])
    tasks: list[asyncio.Task[RequestTiming]] = []
    failures: list[asyncio.Task[RequestTiming]] = []

    def note_failure(task: asyncio.Task[RequestTiming]) -> None:
        if not task.cancelled() and task.exception() is not None:
            failures.append(task)

    try:
        for request in requests:
            body = request_body(endpoint.model, request, rng)
            delay = start + request.offset_seconds - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if failures:
                await failures[0]
            tasks.append(asyncio.create_task(_timed(session, endpoint, request, body)))
            tasks[-1].add_done_callback(note_failure)
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def plan_requests(
    step: SweepStep,
    lengths: tuple[np.ndarray, np.ndarray, np.ndarray],
    deadlines: np.ndarray,
    rng: np.random.Generator,
) -> list[PlannedRequest]:
    """The step's arrivals, each a request drawn (with replacement) from the workload's lengths:
    `lengths` is (input tokens, output tokens, class number) per request, `deadlines` their SLO
    deadlines."""
    offsets = arrival_offsets(step, rng)
    drawn = rng.integers(0, len(deadlines), size=len(offsets))
    inputs, outputs, classes = lengths
    return [
        PlannedRequest(float(offset), int(classes[i]), int(inputs[i]), int(outputs[i]), float(deadlines[i]))
        for offset, i in zip(offsets, drawn, strict=True)
    ]
