"""A published vLLM benchmark replayed on the simulator's engine, to hold the service-time model to it.

A throughput or latency figure is only comparable at the settings it was measured at: the requests'
lengths, how they were sent (all at once, or by a fixed number of clients each sending the next
request when its last one finished), and the engine's batch limits. `replay` sends exactly those
requests through the same engine model the simulator runs (`engine.Engine`: continuous batching,
chunked prefill, KV blocks, priced by `StepCostModel`) and reports what `vllm bench serve` reports:
the run's duration, its output tokens per second, and the mean TTFT and TPOT over the requests.
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass

import numpy as np

from goodput.simulator.engine import EngineConfig, SimulatedEngine
from goodput.simulator.records import RequestExit, RequestLog
from goodput.simulator.workload import Workload


@dataclass(frozen=True, slots=True)
class BenchmarkRun:
    """The requests of one benchmark run and how they were sent.

    concurrency: clients that each send their next request when the last one finished (`vllm bench
        serve --max-concurrency`); None sends every request at once (request rate inf, or offline).
    """

    input_tokens: tuple[int, ...]
    output_tokens: tuple[int, ...]
    concurrency: int | None = None

    @classmethod
    def uniform(
        cls, requests: int, input_tokens: int, output_tokens: int, concurrency: int | None = None
    ) -> BenchmarkRun:
        """`requests` requests of the same lengths (a random dataset with a fixed length)."""
        return cls((input_tokens,) * requests, (output_tokens,) * requests, concurrency)


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """What the benchmark client reports, as the engine model ran it."""

    duration_seconds: float
    output_tokens_per_second: float
    requests_per_second: float
    mean_ttft_seconds: float
    mean_tpot_seconds: float


def replay(config: EngineConfig, run: BenchmarkRun) -> ReplayResult:
    """Run `run` on one engine of `config` from an idle start; deterministic (no step noise)."""
    count = len(run.input_tokens)
    if count == 0 or len(run.output_tokens) != count:
        raise ValueError("replay: one output length per request, and at least one request")
    workload = Workload(
        "replay",
        np.zeros(count),
        np.asarray(run.input_tokens, dtype=np.int64),
        np.asarray(run.output_tokens, dtype=np.int64),
    )
    log = RequestLog(workload)
    engine = SimulatedEngine(config, log, random.Random(0))
    waiting = deque(range(count))
    in_flight: set[int] = set()

    def send(now: float) -> None:
        while waiting and (run.concurrency is None or len(in_flight) < run.concurrency):
            index = waiting.popleft()
            log.arrival[index] = now
            log.routed_at[index] = now
            in_flight.add(index)
            engine.enqueue(index, run.input_tokens[index], run.output_tokens[index], None, now)

    send(0.0)
    while engine.step_end is not None:
        now = engine.step_end
        engine.complete_step(now)
        finished = {index for index in in_flight if not math.isnan(log.finished_at[index])}
        in_flight -= finished
        if finished:
            send(now)
    return _result(log, run)


def _result(log: RequestLog, run: BenchmarkRun) -> ReplayResult:
    """vLLM's benchmark arithmetic: TPOT of a request = (E2E - TTFT) / (output - 1), averaged over
    the requests with more than one output token."""
    if any(outcome != RequestExit.FINISHED for outcome in log.outcome):
        raise ValueError("replay: a request never finished (it does not fit the engine's KV cache)")
    duration = max(log.finished_at)
    ttfts = [first - arrival for first, arrival in zip(log.first_token_at, log.arrival, strict=True)]
    tpots = [
        (finished - first) / (output - 1)
        for first, finished, output in zip(
            log.first_token_at, log.finished_at, run.output_tokens, strict=True
        )
        if output > 1
    ]
    return ReplayResult(
        duration_seconds=duration,
        output_tokens_per_second=sum(run.output_tokens) / duration if duration > 0 else math.inf,
        requests_per_second=len(run.output_tokens) / duration if duration > 0 else math.inf,
        mean_ttft_seconds=sum(ttfts) / len(ttfts),
        mean_tpot_seconds=sum(tpots) / len(tpots) if tpots else 0.0,
    )
