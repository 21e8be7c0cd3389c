"""The engine model against hand-computed step costs: one request, a batch, chunked prefill,
arrivals mid-decode, KV exhaustion, seat limits, the prefix cache, and its bulk-decode shortcuts."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from goodput.estimators.service_time import H100_80G, LLAMA_3_1_8B, LLAMA_3_1_70B
from goodput.simulator.engine import EngineConfig, SimulatedEngine, _count_above, _Seq
from goodput.simulator.records import RequestExit, RequestLog
from goodput.simulator.workload import Workload

CONFIG = EngineConfig.for_hardware(LLAMA_3_1_8B, H100_80G)
COST = CONFIG.cost


@dataclass(frozen=True)
class Arrival:
    time: float
    prompt: int
    output: int
    blocks: tuple[int, ...] | None = None


def make_engine(
    arrivals: list[Arrival], config: EngineConfig = CONFIG, itl_targets: tuple[float, ...] = ()
) -> tuple[SimulatedEngine, RequestLog]:
    times = np.array([a.time for a in arrivals])
    workload = Workload(
        "test", times, np.array([a.prompt for a in arrivals]), np.array([a.output for a in arrivals])
    )
    log = RequestLog(workload)
    return SimulatedEngine(config, log, random.Random(0), itl_targets_seconds=itl_targets), log


def drive(
    engine: SimulatedEngine,
    log: RequestLog,
    arrivals: list[Arrival],
    observe_at: tuple[float, ...] = (),
    slot: int = -1,
) -> None:
    """Run the engine by its own clock, delivering arrivals and scrapes (advance_to) in time order."""
    pending = sorted(((a.time, 0, i) for i, a in enumerate(arrivals)))
    pending += sorted((t, 1, -1) for t in observe_at)
    pending.sort()
    while pending or engine.step_end is not None:
        next_external = pending[0][0] if pending else math.inf
        if engine.step_end is not None and engine.step_end < next_external:
            engine.complete_step(engine.step_end)
            assert engine.used_blocks <= engine.config.kv_capacity_blocks
            continue
        time, kind, index = pending.pop(0)
        if kind == 1:
            engine.advance_to(time)
            continue
        arrival = arrivals[index]
        log.routed_at[index] = time
        engine.enqueue(index, arrival.prompt, arrival.output, arrival.blocks, time, itl_slot=slot)


def decode_seconds(contexts: list[int]) -> float:
    """A decode-only step over sequences with these context lengths."""
    return COST.step_seconds(len(contexts), 0.0, sum(contexts), len(contexts))


PROFILES = {
    "llama-8b-h100-tp1": CONFIG,
    "llama-70b-h100-tp8": EngineConfig.for_hardware(LLAMA_3_1_70B, H100_80G, 8),
    "llama-70b-h100-tp4-pp2": EngineConfig.for_hardware(LLAMA_3_1_70B, H100_80G, 4, 2),
}


@pytest.mark.parametrize("profile", list(PROFILES), ids=list(PROFILES))
def test_single_request_on_an_idle_engine(profile: str) -> None:
    config = PROFILES[profile]
    cost = config.cost
    arrivals = [Arrival(0.0, 1000, 5)]
    engine, log = make_engine(arrivals, config)
    drive(engine, log, arrivals)
    prefill = cost.step_seconds(1000, 1000 * (0 + 1000 / 2), 0, 1)
    decodes = sum(cost.step_seconds(1, 0.0, 1000 + generated, 1) for generated in range(1, 5))
    assert log.first_token_at[0] == pytest.approx(prefill, rel=1e-12)
    assert log.finished_at[0] == pytest.approx(prefill + decodes, rel=1e-12)
    assert log.outcome[0] == RequestExit.FINISHED
    assert engine.generation_tokens_total == 5
    assert engine.steps_total == 5
    assert engine.used_blocks == 0


def test_a_long_prompt_is_prefilled_in_chunks_of_the_token_budget() -> None:
    arrivals = [Arrival(0.0, 20000, 1)]
    engine, log = make_engine(arrivals)
    drive(engine, log, arrivals)
    chunks = [(8192, 0), (8192, 8192), (3616, 16384)]  # (new tokens, tokens before them)
    expected = sum(COST.step_seconds(p, p * (h + p / 2), 0, 1) for p, h in chunks)
    assert log.first_token_at[0] == pytest.approx(expected, rel=1e-12)
    assert log.finished_at[0] == log.first_token_at[0]  # one output token: done at its prefill


def test_two_requests_share_prefill_and_decode_steps() -> None:
    arrivals = [Arrival(0.0, 1000, 3), Arrival(0.0, 500, 2)]
    engine, log = make_engine(arrivals)
    drive(engine, log, arrivals)
    mixed = COST.step_seconds(1500, 1000 * 500 + 500 * 250, 0, 2)
    both = decode_seconds([1001, 501])
    alone = decode_seconds([1002])
    assert log.first_token_at[0] == pytest.approx(mixed) and log.first_token_at[1] == pytest.approx(mixed)
    assert log.finished_at[1] == pytest.approx(mixed + both)
    assert log.finished_at[0] == pytest.approx(mixed + both + alone)


def test_an_arrival_joins_at_the_end_of_the_step_in_flight() -> None:
    arrivals = [Arrival(0.0, 100, 200), Arrival(0.5, 100, 2)]
    engine, log = make_engine(arrivals)
    drive(engine, log, arrivals)
    boundary = COST.step_seconds(100, 100 * 50, 0, 1)
    generated = 1
    while boundary < 0.5:  # the first request decodes alone until the newcomer's arrival
        boundary += decode_seconds([100 + generated])
        generated += 1
    assert log.scheduled_at[1] == pytest.approx(boundary, rel=1e-9)
    first_token = boundary + COST.step_seconds(1 + 100, 100 * 50, 100 + generated, 2)
    assert log.first_token_at[1] == pytest.approx(first_token, rel=1e-9)


def test_kv_exhaustion_preempts_the_newest_request_which_recomputes_later() -> None:
    small = replace(CONFIG, kv_capacity_tokens=64 * 16)  # 64 blocks
    arrivals = [Arrival(0.0, 400, 400), Arrival(0.001, 400, 400)]  # 25 blocks each, growing to 50
    engine, log = make_engine(arrivals, small)
    drive(engine, log, arrivals)
    assert log.outcome == [RequestExit.FINISHED, RequestExit.FINISHED]
    assert log.preemptions[0] == 0
    assert log.preemptions[1] >= 1
    assert engine.num_preemptions_total == log.preemptions[1]
    assert log.finished_at[0] < log.finished_at[1]
    assert engine.generation_tokens_total >= 800


def test_a_request_that_can_never_fit_the_kv_cache_is_rejected() -> None:
    small = replace(CONFIG, kv_capacity_tokens=64 * 16)
    arrivals = [Arrival(0.0, 1000, 200)]  # the prompt fits, prompt + output does not
    engine, log = make_engine(arrivals, small)
    assert engine.fits(1000) and not engine.fits(2000)
    drive(engine, log, arrivals)
    assert log.outcome[0] == RequestExit.REJECTED_TOO_LONG
    assert engine.step_end is None and engine.in_flight == 0


def test_max_num_seqs_holds_requests_in_the_waiting_queue() -> None:
    two_seats = replace(CONFIG, max_num_seqs=2)
    arrivals = [Arrival(0.0, 100, 3), Arrival(0.0, 100, 10), Arrival(0.0, 100, 3)]
    engine, log = make_engine(arrivals, two_seats)
    drive(engine, log, arrivals)
    assert log.scheduled_at[0] == log.scheduled_at[1] == 0.0
    assert log.scheduled_at[2] == pytest.approx(log.finished_at[0])


def test_a_cached_prefix_is_not_prefilled_again() -> None:
    blocks = (7, 8, 9, 10)
    arrivals = [Arrival(0.0, 2048, 2, blocks), Arrival(10.0, 2048, 2, blocks), Arrival(20.0, 2048, 2, (1, 2))]
    engine, log = make_engine(arrivals)
    drive(engine, log, arrivals)
    assert log.cached_tokens == [0, 2047, 0]  # at least one prompt token is always computed
    ttft = log.first_token_at[1] - 10.0
    assert ttft == pytest.approx(COST.step_seconds(1, 1 * (2047 + 0.5), 0, 1))
    assert engine.prefix_cache_hits_total == 2047
    assert engine.prefix_cache_queries_total == 3 * 2048


def test_slow_token_gaps_are_counted_against_the_itl_target() -> None:
    # A decoding request sees one long step when a 6000-token prompt is prefilled beside it.
    arrivals = [Arrival(0.0, 100, 60), Arrival(0.2, 6000, 1)]
    engine, log = make_engine(arrivals, itl_targets=(0.05,))
    drive(engine, log, arrivals, slot=0)
    long_step = COST.step_seconds(6001, 6000 * 3000, 100 + 10, 2)
    assert long_step > 0.05 > decode_seconds([200])
    assert log.slow_gaps[0] == 1


def test_each_finished_request_observes_its_tpot_once() -> None:
    """vllm:request_time_per_output_token_seconds: decode time over the tokens after the first, one
    observation per finished request; a one-token request has no TPOT."""
    arrivals = [Arrival(0.0, 1000, 5), Arrival(0.0, 300, 1)]
    engine, log = make_engine(arrivals)
    drive(engine, log, arrivals)
    tpot = (log.finished_at[0] - log.first_token_at[0]) / 4
    histogram = engine.tpot.snapshot()
    assert histogram.total == 1
    assert histogram.sum == pytest.approx(tpot)
    bucket = sum(bound < tpot for bound in histogram.upper_bounds)  # the first bound at or above it
    assert histogram.cumulative_counts[bucket] == 1
    assert bucket == 0 or histogram.cumulative_counts[bucket - 1] == 0


@given(
    requests=st.lists(
        st.tuples(st.floats(0, 5), st.integers(1, 3000), st.integers(1, 300)), min_size=1, max_size=25
    ),
    scrapes=st.lists(st.floats(0, 30), max_size=20),
)
@settings(max_examples=40, deadline=None)
def test_scraping_mid_macro_step_does_not_change_any_outcome(
    requests: list[tuple[float, int, int]], scrapes: list[float]
) -> None:
    arrivals = [Arrival(t, p, o) for t, p, o in sorted(requests)]
    plain, plain_log = make_engine(arrivals)
    drive(plain, plain_log, arrivals)
    observed, observed_log = make_engine(arrivals)
    drive(observed, observed_log, arrivals, observe_at=tuple(scrapes))
    assert observed_log.outcome == plain_log.outcome
    assert np.allclose(observed_log.finished_at, plain_log.finished_at, rtol=1e-9, equal_nan=True)
    assert np.allclose(observed_log.first_token_at, plain_log.first_token_at, rtol=1e-9, equal_nan=True)
    assert (
        observed.generation_tokens_total == plain.generation_tokens_total == sum(a.output for a in arrivals)
    )


@given(
    contexts=st.lists(st.integers(1, 5000), min_size=1, max_size=40),
    clock=st.integers(0, 10_000),
    steps=st.integers(1, 200),
)
def test_bulk_block_counting_matches_counting_sequence_by_sequence(
    contexts: list[int], clock: int, steps: int
) -> None:
    engine, _ = make_engine([Arrival(0.0, 1, 1)])
    engine.clock = clock
    for key, context in enumerate(contexts):
        seq = _Seq(0, context, 10**6, None, -1)
        seq.key = key
        engine._add_decoder(seq)
    expected = sum(-(-(c + steps) // 16) - -(-c // 16) for c in contexts)
    assert engine._new_decode_blocks(steps) == expected
    assert engine._next_step_blocks() == sum(1 for c in contexts if c % 16 == 0)
    assert engine.decode_blocks == sum(-(-c // 16) for c in contexts)


@given(
    threshold=st.floats(0.001, 1.0),
    first=st.floats(0.001, 1.0),
    increment=st.floats(0.0, 0.01),
    steps=st.integers(0, 500),
)
def test_counting_slow_steps_in_bulk_matches_counting_each(
    threshold: float, first: float, increment: float, steps: int
) -> None:
    expected = sum(1 for j in range(steps) if first + increment * j > threshold)
    assert _count_above(threshold, first, increment, steps) == expected
