"""One emulated vLLM API server: vLLM 0.33's HTTP surface over a `RealtimeEngine`, with its lifecycle.

Routes (vllm-contract §2): `GET /health` and `/ping` (200 with an empty body, 503 once the engine is
dead), `GET /v1/models`, `GET /version`, `GET /load`, `GET /metrics`, and `POST /v1/completions` /
`/v1/chat/completions`, streaming (SSE `data: {...}` chunks, then `data: [DONE]`) or not. With LoRA
on (`ServingProfile.max_loras`), also vLLM's runtime adapter API: `POST /v1/load_lora_adapter`
answers after `lora_load_seconds` (400 when the adapter is already loaded, the source is unreadable
or `max_loras` adapters are loaded: the emulator is stricter than vLLM, whose CPU cache would evict,
so a gateway that overfills an engine is caught), `POST /v1/unload_lora_adapter` (404 when not
loaded); `/v1/models` lists each loaded adapter with `parent` = the base model, and a request naming
an adapter not loaded is a 404 as for any unknown model.

Lifecycle, as vLLM behaves (§2, §3.1):
- Loading: nothing listens, so connections are refused; the owner calls `listen` when the
  simulated load is over, and `/health` answers 200 from the first connection on.
- SIGTERM (`terminate`): the listener stays open and `/health` stays 200; new requests get an
  abort output at once; requests in flight run for up to `--shutdown-timeout` seconds, the rest
  are aborted (`vllm:request_success_total{finished_reason="abort"}`), then the listener closes.
- Engine death (`kill_engine`): requests in flight end with an error, `/health` turns 503, and the
  listener closes after the watchdog's delay (the API process exits).
- Hang (`hang`): `/health` stays 200 and requests are accepted, but no token is produced.

The emulator's tokenizer counts one token per whitespace-separated word of a text prompt (or one per
id of a token-id prompt) and produces exactly `max_tokens` tokens (finish_reason 'length'): it has
no end-of-sequence token. Prompts that share leading blocks of `prefix_block_tokens` words share
prefix-cache blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
import secrets
import socket
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from goodput.api import vllm_names
from goodput.simulator.vllm_metrics import VLLM_VERSION, SnapshotCollector, engine_registry
from goodput.testbed.emulator_dcgm import GpuUtilisationCollector
from goodput.testbed.emulator_engine import (
    AdmissionRejectedError,
    InvalidRequestError,
    LiveRequest,
    RealtimeEngine,
    ServingProfile,
)

log = logging.getLogger(__name__)

DEFAULT_COMPLETION_MAX_TOKENS = 16
"""OpenAI's and vLLM's default `max_tokens` for /v1/completions."""
DEFAULT_CHAT_MAX_TOKENS = 256
"""A real model stops at its end-of-sequence token; the emulator has none, so an unset chat limit
produces this many tokens."""
ENGINE_DEATH_LINGER_SECONDS = 5.0
"""vLLM's watchdog notices a dead engine within 5 s and the API process exits (§2)."""
_REGISTRY = web.AppKey("registry", CollectorRegistry)
_WORDS = (" the", " model", " emulates", " tokens", " at", " the", " pace", " of", " its", " engine")


class ServerState(enum.StrEnum):
    LOADING = "Loading"
    SERVING = "Serving"
    TERMINATING = "Terminating"
    DEAD = "Dead"
    STOPPED = "Stopped"


@dataclass(frozen=True, slots=True)
class ServerIdentity:
    """What the server says about itself: the model it loaded and the name it serves it under."""

    model: str
    served_model_name: str
    revision: str = "main"


def count_prompt_tokens(prompt: object) -> tuple[int, tuple[object, ...]]:
    """(tokens, the tokens themselves) of a completions prompt: words of a string or a list of ids."""
    if isinstance(prompt, str):
        words = tuple(prompt.split())
        return len(words), words
    if isinstance(prompt, list) and all(isinstance(token, int) for token in prompt):
        return len(prompt), tuple(prompt)
    if isinstance(prompt, list) and len(prompt) == 1:
        return count_prompt_tokens(prompt[0])
    raise InvalidRequestError("prompt must be a string or a list of token ids (one prompt per request)")


def count_chat_tokens(messages: object) -> tuple[int, tuple[object, ...]]:
    """(tokens, tokens) of a chat conversation: the words of every message's text content."""
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("messages must be a non-empty list")
    words: list[object] = []
    for message in messages:
        if not isinstance(message, dict):
            raise InvalidRequestError("each message must be an object with a role and content")
        content = message.get("content")
        if isinstance(content, str):
            words.extend(content.split())
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    words.extend(part["text"].split())
    return len(words), tuple(words)


def prefix_block_ids(tokens: tuple[object, ...], block_tokens: int) -> tuple[int, ...]:
    """Chained hashes of the prompt's whole leading blocks: equal ids mean an equal prefix (as vLLM's
    block hashes chain the parent block's hash)."""
    ids: list[int] = []
    parent = 0
    for start in range(0, len(tokens) - block_tokens + 1, block_tokens):
        parent = hash((parent, tokens[start : start + block_tokens]))
        ids.append(parent)
    return tuple(ids)


def token_text(start: int, count: int) -> str:
    return "".join(_WORDS[(start + offset) % len(_WORDS)] for offset in range(count))


def _error(status: int, message: str, kind: str) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return web.json_response(body, status=status)


class VllmServer:
    """One vLLM API server (a group's leader) bound to one listening socket at a time."""

    def __init__(
        self,
        profile: ServingProfile,
        identity: ServerIdentity,
        *,
        name: str = "",
        default_chat_max_tokens: int = DEFAULT_CHAT_MAX_TOKENS,
        gpus: int = 1,
        gpu_product: str = "NVIDIA H100 80GB HBM3",
    ) -> None:
        self.profile = profile
        self.gpus = gpus
        self.gpu_product = gpu_product
        self.identity = identity
        self.name = name or identity.served_model_name
        self.state = ServerState.LOADING
        self._default_chat_max_tokens = default_chat_max_tokens
        self._engine: RealtimeEngine | None = None
        self._runner: web.AppRunner | None = None
        self._handlers = 0
        self._handlers_idle = asyncio.Event()
        self._handlers_idle.set()
        self._closing: asyncio.Task[None] | None = None
        self.address: tuple[str, int] | None = None
        self.adapters: OrderedDict[str, str] = OrderedDict()
        """Loaded LoRA adapters: name -> source."""
        self.adapter_loads = 0
        """Successful `/v1/load_lora_adapter` calls, for tests that an adapter was loaded once."""

    # ------------------------------------------------------------------ lifecycle
    @property
    def engine(self) -> RealtimeEngine:
        if self._engine is None:
            raise RuntimeError(f"{self.name}: the engine has not loaded yet")
        return self._engine

    @property
    def listening(self) -> bool:
        return self._runner is not None

    async def listen(self, sock: socket.socket) -> None:
        """The load is over: start the engine and accept connections on `sock` (already bound)."""
        if self.state is not ServerState.LOADING:
            raise RuntimeError(f"{self.name}: cannot listen in state {self.state}")
        self._engine = RealtimeEngine(self.profile)
        collector = SnapshotCollector(self._engine.snapshot, self._engine.specs)
        registry = engine_registry(collector)
        engine = self._engine
        registry.register(
            GpuUtilisationCollector(
                engine.gpu_busy, gpus=self.gpus, product=self.gpu_product, rank_name=self.name
            )
        )
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app[_REGISTRY] = registry
        routes = [
            web.get("/health", self._health),
            web.get("/ping", self._health),
            web.post("/ping", self._health),
            web.get("/v1/models", self._models),
            web.get("/version", self._version),
            web.get("/load", self._load),
            web.get("/metrics", self._metrics),
            web.post("/v1/completions", self._tracked(self._completions)),
            web.post("/v1/chat/completions", self._tracked(self._chat_completions)),
        ]
        if self.profile.max_loras is not None:
            routes += [
                web.post(vllm_names.Lora.LOAD_PATH, self._load_adapter),
                web.post(vllm_names.Lora.UNLOAD_PATH, self._unload_adapter),
            ]
        app.add_routes(routes)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await runner.setup()
        site = web.SockSite(runner, sock)
        await site.start()
        self._runner = runner
        host, port = sock.getsockname()[:2]
        self.address = (host, port)
        self.state = ServerState.SERVING
        log.info("%s: serving on %s:%d", self.name, host, port)

    async def close(self) -> None:
        """Close the listener and stop the engine (the process is gone)."""
        if self._engine is not None:
            self._engine.close()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        if self.state is not ServerState.DEAD:
            self.state = ServerState.STOPPED

    def hang(self) -> None:
        if self._engine is not None and self.state is ServerState.SERVING:
            self._engine.hang()

    def resume(self) -> None:
        if self._engine is not None:
            self._engine.resume()

    def terminate(self, shutdown_timeout_seconds: float) -> asyncio.Task[None]:
        """SIGTERM: drain for up to the timeout, abort the rest, close. Idempotent."""
        if self._closing is None:
            self._closing = asyncio.create_task(self._terminate(shutdown_timeout_seconds))
        return self._closing

    def kill_engine(self, linger_seconds: float = ENGINE_DEATH_LINGER_SECONDS) -> asyncio.Task[None]:
        """The engine process died: fail what is in flight, answer 503, close after `linger_seconds`."""
        if self._closing is None or self.state is ServerState.TERMINATING:
            self._closing = asyncio.create_task(self._die(linger_seconds))
        return self._closing

    async def _terminate(self, timeout_seconds: float) -> None:
        if self.state is ServerState.LOADING:
            self.state = ServerState.STOPPED
            return
        if self.state is not ServerState.SERVING:
            return
        self.state = ServerState.TERMINATING
        log.info("%s: SIGTERM, draining for up to %.1f s", self.name, timeout_seconds)
        engine = self.engine
        deadline = time.monotonic() + max(0.0, timeout_seconds)
        while engine.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        aborted = engine.abort_all("abort")
        if aborted:
            log.info(
                "%s: aborted %d requests at the end of the %.1f s drain", self.name, aborted, timeout_seconds
            )
        await self._wait_handlers(2.0)
        await self.close()
        log.info(
            "%s: stopped (largest token delivery lag %.1f ms)",
            self.name,
            engine.delivery_lag_seconds_max * 1e3,
        )

    async def _die(self, linger_seconds: float) -> None:
        if self.state is ServerState.LOADING:
            self.state = ServerState.DEAD
            return
        if self.state in (ServerState.DEAD, ServerState.STOPPED):
            return
        self.state = ServerState.DEAD
        log.info("%s: engine died; /health answers 503, the port closes in %.1f s", self.name, linger_seconds)
        if self._engine is not None:
            self._engine.abort_all("error")
        await asyncio.sleep(linger_seconds)
        await self._wait_handlers(1.0)
        await self.close()
        log.info("%s: the API process exited", self.name)

    async def _wait_handlers(self, timeout_seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._handlers_idle.wait(), timeout_seconds)

    def _tracked(
        self, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def run(request: web.Request) -> web.StreamResponse:
            self._handlers += 1
            self._handlers_idle.clear()
            try:
                return await handler(request)
            finally:
                self._handlers -= 1
                if self._handlers == 0:
                    self._handlers_idle.set()

        return run

    # ------------------------------------------------------------------ simple routes
    async def _health(self, _: web.Request) -> web.Response:
        if self.state is ServerState.DEAD:
            return web.Response(status=503)
        return web.Response(status=200)

    async def _models(self, _: web.Request) -> web.Response:
        model = {
            "id": self.identity.served_model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "vllm",
            "root": self.identity.model,
            "parent": None,
            "max_model_len": self.profile.effective_max_model_len,
            "permission": [],
        }
        adapters = [
            {**model, "id": name, "root": source, "parent": self.identity.served_model_name}
            for name, source in self.adapters.items()
        ]
        return web.json_response({"object": "list", "data": [model, *adapters]})

    async def _load_adapter(self, request: web.Request) -> web.Response:
        body = await request.json()
        name, source = body.get("lora_name"), body.get("lora_path")
        if not isinstance(name, str) or not isinstance(source, str):
            return _error(400, "both 'lora_name' and 'lora_path' must be provided.", "BadRequestError")
        if name in self.adapters:
            return _error(400, f"The lora adapter '{name}' has already been loaded.", "InvalidUserInput")
        if self.profile.max_loras is not None and len(self.adapters) >= self.profile.max_loras:
            message = f"cannot load lora adapter '{name}': {len(self.adapters)} adapters loaded (max_loras)"
            return _error(400, message, "BadRequestError")
        await asyncio.sleep(self.profile.lora_load_seconds)
        if source in self.profile.unreadable_lora_paths:
            return _error(
                400, f"Loading lora {name} failed: No adapter found for {source}", "BadRequestError"
            )
        self.adapters[name] = source
        self.adapter_loads += 1
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def _unload_adapter(self, request: web.Request) -> web.Response:
        body = await request.json()
        name = body.get("lora_name")
        if name not in self.adapters:
            return _error(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
        del self.adapters[name]
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")

    async def _version(self, _: web.Request) -> web.Response:
        return web.json_response({"version": VLLM_VERSION})

    async def _load(self, _: web.Request) -> web.Response:
        return web.json_response({"server_load": 0})

    async def _metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(request.app[_REGISTRY])
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    # ------------------------------------------------------------------ generation
    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        if self.state is ServerState.DEAD:
            return _error(500, "EngineCore encountered an issue; the engine is dead.", "InternalServerError")
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "the request body is not valid JSON", "BadRequestError")
        if not isinstance(body, dict):
            return _error(400, "the request body must be a JSON object", "BadRequestError")
        model = body.get("model")
        known = (self.identity.served_model_name, self.identity.model)
        if model is not None and model not in known and model not in self.adapters:
            return _error(404, f"The model `{model}` does not exist.", "NotFoundError")
        try:
            if chat:
                prompt_tokens, tokens = count_chat_tokens(body.get("messages"))
                limit = (
                    body.get("max_completion_tokens")
                    or body.get("max_tokens")
                    or self._default_chat_max_tokens
                )
            else:
                prompt_tokens, tokens = count_prompt_tokens(body.get("prompt"))
                limit = body.get("max_tokens") or DEFAULT_COMPLETION_MAX_TOKENS
            if not isinstance(limit, int) or isinstance(limit, bool):
                raise InvalidRequestError("max_tokens must be an integer")
            if int(body.get("n") or 1) != 1:
                raise InvalidRequestError("the emulator generates one choice per request (n=1)")
        except (InvalidRequestError, TypeError, ValueError) as error:
            return _error(400, str(error), "BadRequestError")
        streaming = bool(body.get("stream"))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        response_id = f"{'chatcmpl' if chat else 'cmpl'}-{secrets.token_hex(16)}"
        answered_as = (
            model if isinstance(model, str) and model in self.adapters else self.identity.served_model_name
        )
        output = _Output(response_id, answered_as, chat, int(time.time()))
        if self.state is ServerState.TERMINATING:
            # vLLM rejects a request added during shutdown with an abort output, not an HTTP error.
            self.engine.count_shutdown_rejection()
            return await self._aborted_at_once(request, output, prompt_tokens, streaming, include_usage)
        blocks = prefix_block_ids(tokens, self.profile.prefix_block_tokens)
        try:
            live = self.engine.submit(prompt_tokens, limit, blocks or None, streaming=streaming)
        except InvalidRequestError as error:
            return _error(400, str(error), "BadRequestError")
        except AdmissionRejectedError as error:
            return _error(503, str(error), "ServiceUnavailableError")
        if streaming:
            return await self._stream(request, live, output, include_usage)
        return await self._complete(live, output)

    async def _complete(self, live: LiveRequest, output: _Output) -> web.StreamResponse:
        try:
            while not live.finished:
                await live.changed.wait()
                live.changed.clear()
        except asyncio.CancelledError:
            self.engine.detach(live)
            raise
        if live.finish_reason == "error":
            return _error(500, "EngineCore encountered an issue; the request failed.", "InternalServerError")
        return web.json_response(output.full(live.prompt_tokens, live.tokens_ready, live.finish_reason))

    async def _stream(
        self, request: web.Request, live: LiveRequest, output: _Output, include_usage: bool
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        sent = 0
        try:
            await response.prepare(request)
            while True:
                await live.changed.wait()
                live.changed.clear()
                ready = live.tokens_ready
                if live.finish_reason == "error":
                    await response.write(
                        _sse(
                            {
                                "error": {
                                    "message": "EngineCore encountered an issue.",
                                    "type": "InternalServerError",
                                    "code": 500,
                                }
                            }
                        )
                    )
                    break
                if ready > sent or live.finished:
                    await response.write(_sse(output.chunk(sent, ready - sent, live.finish_reason)))
                    sent = max(sent, ready)
                if live.finished:
                    if include_usage:
                        await response.write(_sse(output.usage_chunk(live.prompt_tokens, sent)))
                    break
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except ConnectionResetError:
            self.engine.detach(live)  # the client went away; vLLM aborts the request without counting it
        except asyncio.CancelledError:
            self.engine.detach(live)
            raise
        return response

    async def _aborted_at_once(
        self, request: web.Request, output: _Output, prompt_tokens: int, streaming: bool, include_usage: bool
    ) -> web.StreamResponse:
        if not streaming:
            return web.json_response(output.full(prompt_tokens, 0, "abort"))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await response.prepare(request)
        await response.write(_sse(output.chunk(0, 0, "abort")))
        if include_usage:
            await response.write(_sse(output.usage_chunk(prompt_tokens, 0)))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


class _Output:
    """The OpenAI-compatible bodies of one response (completions or chat), as vLLM shapes them."""

    __slots__ = ("chat", "created", "model", "response_id", "role_sent")

    def __init__(self, response_id: str, model: str, chat: bool, created: int) -> None:
        self.response_id = response_id
        self.model = model
        self.chat = chat
        self.created = created
        self.role_sent = False

    def chunk(self, start: int, count: int, finish_reason: str | None) -> dict[str, Any]:
        text = token_text(start, count)
        if self.chat:
            delta: dict[str, Any] = {"content": text}
            if not self.role_sent:
                delta = {"role": "assistant", "content": text}
                self.role_sent = True
            choice: dict[str, Any] = {
                "index": 0,
                "delta": delta,
                "logprobs": None,
                "finish_reason": finish_reason,
            }
            return self._envelope("chat.completion.chunk", choice)
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
        }
        return self._envelope("text_completion", choice)

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        body = self._envelope("chat.completion.chunk" if self.chat else "text_completion", None)
        body["usage"] = _usage(prompt_tokens, completion_tokens)
        return body

    def full(self, prompt_tokens: int, completion_tokens: int, finish_reason: str | None) -> dict[str, Any]:
        text = token_text(0, completion_tokens)
        if self.chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text, "tool_calls": []},
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": None,
            }
            body = self._envelope("chat.completion", choice)
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": None,
            }
            body = self._envelope("text_completion", choice)
        body["usage"] = _usage(prompt_tokens, completion_tokens)
        return body

    def _envelope(self, kind: str, choice: dict[str, Any] | None) -> dict[str, Any]:
        return {
            "id": self.response_id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": [] if choice is None else [choice],
        }


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"
