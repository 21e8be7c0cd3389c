"""The simulator's engine model (`simulator.engine.Engine`) driven in wall-clock time, for a live server.

The discrete-event `SimulatedEngine` already decides everything a vLLM engine decides: continuous batching,
chunked prefill, KV blocks, preemption, the prefix cache, and each step's duration from the shared
`StepCostModel`. This adapter runs it against the event loop's clock instead of an event queue:

- One timer per engine. It fires when the step in flight ends (`SimulatedEngine.step_end`), completes it
  at its planned end time (so a late wake-up never stretches the model's time), and re-arms. An
  idle engine has no timer: a thousand idle servers cost nothing.
- A run of pure decode steps is one macro-step in the model. While a streaming request is
  decoding, the timer also ticks every `stream_interval_seconds` and commits the decode steps that
  have ended (`SimulatedEngine.advance_to`), so tokens reach clients in small batches, as vLLM's
  `--stream-interval` would send them, without a wake-up per token.
- The model reports per-request events by writing its `RequestLog`. The log's columns here are
  lists that note which request a write was for (first scheduling, first token, preemption,
  finish), and a request's token count while decoding is `1 + decode steps since its first token`
  (`SimulatedEngine.clock` counts decode steps). Requests get recycled log slots, so memory stays bounded.

Engine time is the loop's monotonic clock minus time spent hung: a hang fault freezes the model,
and on resumption it continues where it stopped instead of replaying the missed steps at once.
Server-side latencies (TTFT, end-to-end) are measured on the wall clock, from the HTTP arrival,
as vLLM's front end measures them; a client sees each event up to one timer wake-up later.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from goodput.api import vllm_names as vllm
from goodput.estimators.attainment import Histogram
from goodput.simulator.engine import EngineConfig, SimulatedEngine
from goodput.simulator.metrics import ITL_BUCKETS_SECONDS, HistogramAccumulator
from goodput.simulator.records import NOT_YET, RequestExit, RequestLog
from goodput.simulator.vllm_metrics import (
    CacheConfig,
    EngineSnapshot,
    HistogramSpec,
    histogram_specs,
)
from goodput.simulator.workload import Workload

DEFAULT_MAX_MODEL_LEN = 131072
"""Llama 3.1's context length; the emulator's default `--max-model-len`."""
DEFAULT_STREAM_INTERVAL_SECONDS = 0.02
DEFAULT_PREFIX_BLOCK_TOKENS = 256
SAME_INSTANT_SECONDS = time.get_clock_info("monotonic").resolution
"""Events closer than this are simultaneous: asyncio runs every timer due within its clock's
resolution in one pass, so a step's end and an arrival that close come in either order. At such a
tie the step has ended first, whichever callback runs first."""


class AdmissionRejectedError(Exception):
    """vLLM's HTTP 503 at admission (`--max-num-queued-reqs`); `reason` is the metric's label."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class InvalidRequestError(ValueError):
    """vLLM's HTTP 400: the request can never be served (e.g. longer than the model's context)."""


DEFAULT_LORA_LOAD_SECONDS = 0.3
"""An adapter of tens of MB read from a local cache and moved to the GPU."""


@dataclass(frozen=True, slots=True)
class ServingProfile:
    """What one emulated vLLM server serves and how fast it runs."""

    engine: EngineConfig
    model_name: str
    """Served model name: the first `--served-model-name`, else the model."""
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    gpu_memory_utilization: float = 0.92
    stream_interval_seconds: float = DEFAULT_STREAM_INTERVAL_SECONDS
    prefix_block_tokens: int = DEFAULT_PREFIX_BLOCK_TOKENS
    """Prompt words per prefix-cache block: prompts sharing whole leading blocks share KV."""
    max_num_queued_requests: int | None = None
    """vLLM's `--max-num-queued-reqs`: in-flight requests above it are refused with HTTP 503."""
    seed: int = 0
    max_loras: int | None = None
    """vLLM's `--max-loras` with `--enable-lora`; None: LoRA is off (no adapter API)."""
    lora_load_seconds: float = DEFAULT_LORA_LOAD_SECONDS
    """How long `POST /v1/load_lora_adapter` takes to answer."""
    unreadable_lora_paths: frozenset[str] = frozenset()
    """Adapter sources the emulated engine cannot read: their load fails as vLLM's does."""

    @property
    def effective_max_model_len(self) -> int:
        """vLLM refuses a context longer than the KV cache holds, so the smaller of the two."""
        return max(1, min(self.max_model_len, self.engine.kv_capacity_tokens))

    def cache_config(self) -> CacheConfig:
        engine = self.engine
        return CacheConfig(
            block_size=engine.block_tokens,
            num_gpu_blocks=engine.kv_capacity_blocks,
            kv_cache_size_tokens=engine.kv_capacity_tokens,
            kv_cache_max_concurrency=round(engine.kv_capacity_tokens / self.effective_max_model_len, 2),
            gpu_memory_utilization=self.gpu_memory_utilization,
            enable_prefix_caching=engine.prefix_caching,
        )


class LiveRequest:
    """One request in the emulated engine, as its HTTP handler sees it.

    The handler waits on `changed`, then reads `tokens_ready` (tokens produced so far) and
    `finish_reason` ('length' when all `max_tokens` were produced, 'abort' or 'error' otherwise).
    """

    __slots__ = (
        "arrival_wall",
        "c0",
        "changed",
        "decoding",
        "detached",
        "finish_reason",
        "finished_wall",
        "first_token_wall",
        "max_tokens",
        "prompt_tokens",
        "scheduled_wall",
        "slot",
        "streaming",
        "tokens_ready",
    )

    def __init__(
        self, slot: int, prompt_tokens: int, max_tokens: int, streaming: bool, arrival_wall: float
    ) -> None:
        self.slot = slot
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.streaming = streaming
        self.arrival_wall = arrival_wall
        self.scheduled_wall: float | None = None
        self.first_token_wall: float | None = None
        self.tokens_ready = 0
        self.finish_reason: str | None = None
        self.finished_wall: float | None = None
        """Loop time the request ended, as the model timed it (or when it was aborted)."""
        self.changed = asyncio.Event()
        self.decoding = False
        self.c0 = 0
        """`SimulatedEngine.clock` at which this request would have produced exactly one token."""
        self.detached = False

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class _WatchedColumn(list):  # type: ignore[type-arg]
    """A RequestLog column that reports which index the engine wrote (one per event kind)."""

    __slots__ = ("_kind", "_sink")

    def __init__(self, values: list[Any], kind: str, sink: list[tuple[str, int]]) -> None:
        super().__init__(values)
        self._kind = kind
        self._sink = sink

    def __setitem__(self, index: Any, value: Any) -> None:
        super().__setitem__(index, value)
        self._sink.append((self._kind, index))

    def reset(self, index: int, value: Any) -> None:
        """Write without reporting (slot recycling)."""
        super().__setitem__(index, value)


_SCHEDULED, _FIRST_TOKEN, _PREEMPTED, _FINISHED = "scheduled", "first_token", "preempted", "finished"


class RealtimeEngine:
    """One emulated group's engine on the running event loop.

    Not thread-safe: every method runs on the loop's thread (HTTP handlers, timers, scrapes).
    """

    def __init__(
        self,
        profile: ServingProfile,
        *,
        loop: asyncio.AbstractEventLoop | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.profile = profile
        self._loop = loop or asyncio.get_running_loop()
        self._origin = self._loop.time()
        self._hung_total = 0.0
        self._hung_since: float | None = None
        self._model_now = 0.0
        """Engine time the model has been brought to: `now()`, or a step's end just past it (`_catch_up`)."""
        self._closed = False
        self.started_unix_seconds = wall_clock()

        self._events: list[tuple[str, int]] = []
        self._log = _empty_log()
        self._watched: dict[str, _WatchedColumn] = {}
        for kind, name in (
            (_SCHEDULED, "scheduled_at"),
            (_FIRST_TOKEN, "first_token_at"),
            (_PREEMPTED, "preemptions"),
            (_FINISHED, "finished_at"),
        ):
            column = _WatchedColumn([], kind, self._events)
            setattr(self._log, name, column)
            self._watched[name] = column
        self.engine = SimulatedEngine(
            profile.engine,
            self._log,
            random.Random(profile.seed),
            prefix_block_tokens=profile.prefix_block_tokens,
            started_at=0.0,
        )
        self._requests: dict[int, LiveRequest] = {}
        self._free_slots: list[int] = []
        self._streaming_decoders: dict[int, LiveRequest] = {}
        self._preempted: dict[int, LiveRequest] = {}
        self._held: list[tuple[LiveRequest, tuple[int, ...] | None]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._timer_due: float | None = None
        """The engine time the armed timer is for: a step's end or a streaming tick."""

        # Metrics the model does not keep per request in vLLM's shape.
        self._specs = histogram_specs(profile.effective_max_model_len)
        self._histograms = {spec.name: HistogramAccumulator(spec.bounds) for spec in self._specs}
        self.request_success: dict[str, int] = {}
        self.admission_rejections: dict[str, int] = {}
        self.prompt_tokens = 0
        self.prompt_tokens_cached = 0
        self._prompt_computed = 0
        self._iteration_mark = (0, 0, 0)  # steps, generated tokens, prompt tokens computed
        self.delivery_lag_seconds_max = 0.0
        """Largest delay between a model event and its delivery to the handler (the stated error)."""

    # ------------------------------------------------------------------ clocks
    def now(self) -> float:
        """Engine time: the loop's clock since start, without time spent hung."""
        if self._hung_since is not None:
            return self._hung_since - self._origin - self._hung_total
        return self._loop.time() - self._origin - self._hung_total

    def _to_loop(self, engine_time: float) -> float:
        return engine_time + self._origin + self._hung_total

    @property
    def hung(self) -> bool:
        return self._hung_since is not None

    @property
    def specs(self) -> tuple[HistogramSpec, ...]:
        return self._specs

    @property
    def in_flight(self) -> int:
        return self.engine.in_flight + len(self._held)

    # ------------------------------------------------------------------ requests
    def submit(
        self,
        prompt_tokens: int,
        max_tokens: int,
        prefix_blocks: tuple[int, ...] | None = None,
        *,
        streaming: bool = False,
    ) -> LiveRequest:
        """Admit a request now; raise InvalidRequestError (HTTP 400) or AdmissionRejectedError (503)."""
        if self._closed:
            raise AdmissionRejectedError("closed", "the engine is stopped")
        limit = self.profile.effective_max_model_len
        if prompt_tokens < 1 or max_tokens < 1:
            raise InvalidRequestError("the prompt and max_tokens must each be at least one token")
        if prompt_tokens + max_tokens > limit:
            raise InvalidRequestError(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} in the "
                "completion). Please reduce the length of the messages or completion."
            )
        cap = self.profile.max_num_queued_requests
        if cap is not None and self.in_flight >= cap:
            reason = "max_num_queued_reqs"
            self.admission_rejections[reason] = self.admission_rejections.get(reason, 0) + 1
            raise AdmissionRejectedError(
                reason, f"the server holds {self.in_flight} requests, its limit is {cap}"
            )
        request = LiveRequest(self._take_slot(), prompt_tokens, max_tokens, streaming, self._loop.time())
        self._requests[request.slot] = request
        if self.hung:
            self._held.append((request, prefix_blocks))
            return request
        now = self._catch_up(self.now())
        self._enqueue(request, prefix_blocks, now)
        self._dispatch()
        self._reschedule()
        return request

    def count_shutdown_rejection(self) -> None:
        """A request added during shutdown ends at once as aborted (vLLM rejects it with an abort
        output, counted like any engine-side abort)."""
        self.request_success["abort"] = self.request_success.get("abort", 0) + 1

    def detach(self, request: LiveRequest) -> None:
        """The client went away. The model keeps computing the request (it has no per-request abort),
        but, as in vLLM, a client disconnect appears in no metric."""
        request.detached = True
        self._streaming_decoders.pop(request.slot, None)

    def _enqueue(self, request: LiveRequest, prefix_blocks: tuple[int, ...] | None, now: float) -> None:
        self._log.routed_at[request.slot] = now
        self._log.arrival[request.slot] = now
        self.engine.enqueue(request.slot, request.prompt_tokens, request.max_tokens, prefix_blocks, now)

    def _take_slot(self) -> int:
        if self._free_slots:
            return self._free_slots.pop()
        log = self._log
        slot = len(log.routed_at)
        times: tuple[list[float], ...] = (
            log.arrival,
            log.routed_at,
            log.scheduled_at,
            log.first_token_at,
            log.finished_at,
        )
        for column in times:
            column.append(NOT_YET)
        counts: tuple[list[int], ...] = (log.group, log.preemptions, log.cached_tokens, log.slow_gaps)
        for counter in counts:
            counter.append(0)
        log.outcome.append(RequestExit.PENDING)
        return slot

    def _release(self, request: LiveRequest) -> None:
        slot = request.slot
        self._requests.pop(slot, None)
        self._streaming_decoders.pop(slot, None)
        self._preempted.pop(slot, None)
        log = self._log
        for name in ("scheduled_at", "first_token_at", "finished_at"):
            self._watched[name].reset(slot, NOT_YET)
        self._watched["preemptions"].reset(slot, 0)
        log.routed_at[slot] = log.arrival[slot] = NOT_YET
        log.outcome[slot] = RequestExit.PENDING
        log.cached_tokens[slot] = log.slow_gaps[slot] = 0
        self._free_slots.append(slot)

    # ------------------------------------------------------------------ faults and shutdown
    def hang(self) -> None:
        """The engine stops making progress; HTTP stays up. Requests arriving now are held."""
        if self.hung or self._closed:
            return
        self._catch_up(self.now())
        self._dispatch()
        self._hung_since = self._loop.time()
        self._cancel_timer()

    def resume(self) -> None:
        """The hang is over: the model continues from where it froze."""
        if self._hung_since is None:
            return
        self._hung_total += self._loop.time() - self._hung_since
        self._hung_since = None
        now = max(self.now(), self._model_now)
        held, self._held = self._held, []
        for request, blocks in held:
            if not request.finished:
                self._enqueue(request, blocks, now)
        self._dispatch()
        self._reschedule()

    def abort_all(self, reason: str) -> int:
        """End every request in flight with `reason` ('abort' at shutdown, 'error' at engine death)."""
        now = max(self.now(), self._model_now)
        if not self.hung:
            now = self._catch_up(now)
            self._dispatch()
        lost = self.engine.abort_all(now)
        self._events.clear()
        victims = [self._requests[slot] for slot in lost if slot in self._requests]
        victims += [request for request, _ in self._held]
        self._held = []
        for request in victims:
            self._finish(request, reason)
        self._reschedule()
        return len(victims)

    def close(self) -> None:
        """Stop the timer for good; the engine takes no more requests."""
        self._closed = True
        self._cancel_timer()

    # ------------------------------------------------------------------ driving the model
    def _catch_up(self, now: float) -> float:
        """Complete every step that ended by `now`, each at its own end time, then commit the decode
        steps of the macro-step in flight that have ended; return the model's time now.

        Only what has ended by `now` (or at the same instant) is completed: a request arriving just
        before a step ends is queued while it runs and joins the next one, as in the event engine.
        The model's time never goes back (a step may end a hair past the clock), so nothing is
        queued before a step that has already ended."""
        engine = self.engine
        while engine.step_end is not None and engine.step_end <= now + SAME_INSTANT_SECONDS:
            engine.complete_step(engine.step_end)
            self._dispatch()
            self._observe_iterations()
        engine.advance_to(now)
        self._model_now = max(self._model_now, now)
        return self._model_now

    def _on_timer(self) -> None:
        due = self._timer_due
        self._timer = None
        self._timer_due = None
        if self._closed or self.hung:
            return
        # The loop fired the timer, so the time it was armed for has come, even where converting
        # clocks (or the loop's own resolution) puts `now()` a hair before it.
        self._catch_up(self.now() if due is None else max(self.now(), due))
        self._dispatch()
        self._publish_progress()
        self._reschedule()

    def _reschedule(self) -> None:
        if self._closed or self.hung:
            self._cancel_timer()
            return
        wake = self.engine.step_end
        if self._streaming_decoders or self._preempted:
            tick = self.now() + self.profile.stream_interval_seconds
            wake = tick if wake is None else min(wake, tick)
        if wake is None:
            self._cancel_timer()
            return
        if self._timer is not None and self._timer_due == wake:
            return  # armed for this time already (a hang cancels it, so the clocks' offset is the same)
        self._cancel_timer()
        self._timer = self._loop.call_at(self._to_loop(wake), self._on_timer)
        self._timer_due = wake

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        self._timer_due = None

    def _dispatch(self) -> None:
        """Apply the model's per-request events, in the order it wrote them."""
        if not self._events:
            return
        events = self._events[:]
        self._events.clear()
        log = self._log
        clock = self.engine.clock
        for kind, slot in events:
            request = self._requests.get(slot)
            if request is None or request.finished:
                continue
            if kind == _SCHEDULED:
                request.scheduled_wall = self._wall(log.scheduled_at[slot])
            elif kind == _FIRST_TOKEN:
                self._first_token(request, clock)
            elif kind == _PREEMPTED:
                if request.decoding:
                    request.tokens_ready = min(request.max_tokens - 1, 1 + clock - request.c0)
                    request.decoding = False
                    if self._streaming_decoders.pop(slot, None) is not None:
                        self._preempted[slot] = request
            elif kind == _FINISHED:
                if log.outcome[slot] == RequestExit.FINISHED:
                    request.tokens_ready = request.max_tokens
                    self._finish(request, "length", finished_wall=self._wall(log.finished_at[slot]))
                else:  # refused by the model as too long for its KV cache
                    self._finish(request, "error", counted=False)

    def _first_token(self, request: LiveRequest, clock: int) -> None:
        log = self._log
        slot = request.slot
        request.c0 = clock
        request.decoding = True
        request.tokens_ready = 1
        request.first_token_wall = self._wall(log.first_token_at[slot])
        cached = int(log.cached_tokens[slot])
        self.prompt_tokens += request.prompt_tokens
        self.prompt_tokens_cached += cached
        self._prompt_computed += request.prompt_tokens - cached
        if not request.detached:
            self._histograms[vllm.TIME_TO_FIRST_TOKEN_SECONDS].observe(
                request.first_token_wall - request.arrival_wall
            )
        if request.streaming and not request.detached and request.max_tokens > 1:
            self._streaming_decoders[slot] = request
        self._signal(request, request.first_token_wall)

    def _publish_progress(self) -> None:
        """Hand each streaming request the decode tokens committed since the last wake-up."""
        clock = self.engine.clock
        if self._preempted:
            self._resume_preempted(clock)
        for request in self._streaming_decoders.values():
            ready = min(request.max_tokens - 1, 1 + clock - request.c0)
            if ready > request.tokens_ready:
                request.tokens_ready = ready
                request.changed.set()

    def _resume_preempted(self, clock: int) -> None:
        """Find preempted requests that decode again and re-anchor their token count.

        The model records no event when a preempted request has recomputed its context, so this
        reads the running set (rare: only after a preemption).
        """
        for seq in self.engine.running.values():
            request = self._preempted.get(seq.index)
            if request is None or seq.computed < seq.target:
                continue
            generated = seq.base + clock - seq.prompt
            request.c0 = clock + 1 - generated
            request.decoding = True
            request.tokens_ready = max(request.tokens_ready, min(request.max_tokens - 1, generated))
            del self._preempted[seq.index]
            if request.streaming and not request.detached:
                self._streaming_decoders[seq.index] = request
            request.changed.set()

    def _finish(
        self, request: LiveRequest, reason: str, *, finished_wall: float | None = None, counted: bool = True
    ) -> None:
        request.finish_reason = reason
        request.finished_wall = finished_wall if finished_wall is not None else self._loop.time()
        if counted and not request.detached:
            self.request_success[reason] = self.request_success.get(reason, 0) + 1
            if finished_wall is not None:
                self._observe_finished(request, finished_wall)
        self._release(request)
        self._signal(request, finished_wall)

    def _observe_finished(self, request: LiveRequest, finished_wall: float) -> None:
        h = self._histograms
        log = self._log
        slot = request.slot
        arrival = request.arrival_wall
        scheduled = request.scheduled_wall if request.scheduled_wall is not None else arrival
        first = request.first_token_wall if request.first_token_wall is not None else finished_wall
        generated = request.max_tokens
        h[vllm.E2E_REQUEST_LATENCY_SECONDS].observe(finished_wall - arrival)
        h[vllm.REQUEST_QUEUE_TIME_SECONDS].observe(scheduled - arrival)
        h[vllm.REQUEST_PREFILL_TIME_SECONDS].observe(first - scheduled)
        h[vllm.REQUEST_DECODE_TIME_SECONDS].observe(finished_wall - first)
        h[vllm.REQUEST_INFERENCE_TIME_SECONDS].observe(finished_wall - scheduled)
        if generated > 1:
            h[vllm.REQUEST_TIME_PER_OUTPUT_TOKEN_SECONDS].observe((finished_wall - first) / (generated - 1))
        h[vllm.REQUEST_PROMPT_TOKENS].observe(request.prompt_tokens)
        h[vllm.REQUEST_GENERATION_TOKENS].observe(generated)
        h[vllm.REQUEST_MAX_NUM_GENERATION_TOKENS].observe(request.max_tokens)
        h[vllm.REQUEST_PARAMS_MAX_TOKENS].observe(request.max_tokens)
        h[vllm.REQUEST_PARAMS_N].observe(1)
        h[vllm.REQUEST_NUM_PREEMPTIONS].observe(log.preemptions[slot])
        h[vllm.REQUEST_PREFILL_KV_COMPUTED_TOKENS].observe(request.prompt_tokens - log.cached_tokens[slot])

    def _observe_iterations(self) -> None:
        """`vllm:iteration_tokens_total`: a run of k model steps is observed k times at its mean."""
        engine = self.engine
        steps, generated, computed = self._iteration_mark
        new_steps = engine.steps_total - steps
        if new_steps <= 0:
            return
        tokens = (engine.generation_tokens_total - generated) + (self._prompt_computed - computed)
        self._histograms[vllm.ITERATION_TOKENS].observe(tokens / new_steps, new_steps)
        self._iteration_mark = (engine.steps_total, engine.generation_tokens_total, self._prompt_computed)

    def _signal(self, request: LiveRequest, event_wall: float | None) -> None:
        if event_wall is not None:
            lag = self._loop.time() - event_wall
            self.delivery_lag_seconds_max = max(self.delivery_lag_seconds_max, lag)
        request.changed.set()

    def _wall(self, engine_time: float) -> float:
        """Loop time of an engine timestamp (NaN-safe: an unset one maps to now)."""
        return self._loop.time() if math.isnan(engine_time) else self._to_loop(engine_time)

    # ------------------------------------------------------------------ metrics
    def gpu_busy(self) -> tuple[float, float]:
        """(loop time, seconds the GPUs have computed so far): what DCGM's utilisation samples. Steps
        that have ended count; a hung engine adds nothing."""
        self._commit_ended_steps()
        return self._loop.time(), self.engine.gpu_busy_seconds_total

    def _commit_ended_steps(self) -> None:
        if not self.hung and not self._closed:
            self._catch_up(self.now())
            self._dispatch()
            self._publish_progress()
            self._reschedule()

    def snapshot(self) -> EngineSnapshot:
        """The engine's vLLM metrics now (steps that have ended are committed first)."""
        self._commit_ended_steps()
        engine = self.engine
        histograms = {name: accumulator.snapshot() for name, accumulator in self._histograms.items()}
        histograms[vllm.INTER_TOKEN_LATENCY_SECONDS] = _itl_snapshot(engine.itl)
        return EngineSnapshot(
            model_name=self.profile.model_name,
            engine_index="0",
            started_unix_seconds=self.started_unix_seconds,
            num_requests_running=len(engine.running),
            num_requests_waiting=len(engine.waiting),
            kv_cache_usage_perc=engine.kv_usage,
            prefix_cache_queries=engine.prefix_cache_queries_total,
            prefix_cache_hits=engine.prefix_cache_hits_total,
            num_preemptions=engine.num_preemptions_total,
            prompt_tokens=self.prompt_tokens,
            prompt_tokens_cached=self.prompt_tokens_cached,
            generation_tokens=engine.generation_tokens_total,
            request_success=dict(self.request_success),
            admission_rejections=dict(self.admission_rejections),
            histograms=histograms,
            cache_config=self.profile.cache_config(),
        )


def _itl_snapshot(accumulator: HistogramAccumulator) -> Histogram:
    if accumulator.bounds != ITL_BUCKETS_SECONDS:
        raise ValueError("the engine's inter-token histogram uses other bounds than vLLM's")
    return accumulator.snapshot()


def _empty_log() -> RequestLog:
    """A RequestLog whose columns grow with the emulator's request slots."""
    empty = np.zeros(0)
    return RequestLog(Workload("live", empty, empty.astype(np.int64), empty.astype(np.int64)))
