"""A benchmark run replayed on one engine (goodput.simulator.replay): what a client would measure."""

from __future__ import annotations

import pytest

from goodput.estimators.service_time import H100_80G, LLAMA_3_1_8B
from goodput.simulator.engine import EngineConfig
from goodput.simulator.replay import BenchmarkRun, replay

CONFIG = EngineConfig.for_hardware(LLAMA_3_1_8B, H100_80G)
COST = CONFIG.cost


def test_one_request_costs_its_prefill_step_then_one_decode_step_per_further_token() -> None:
    """The prefill step yields the first token; each decode step reads the prompt and the tokens so far."""
    result = replay(CONFIG, BenchmarkRun((100,), (4,)))

    prefill = COST.prefill_seconds(100)
    decodes = [COST.step_seconds(1, 0.0, context, 1) for context in (101, 102, 103)]
    assert result.mean_ttft_seconds == pytest.approx(prefill)
    assert result.duration_seconds == pytest.approx(prefill + sum(decodes))
    assert result.mean_tpot_seconds == pytest.approx(sum(decodes) / 3)
    assert result.output_tokens_per_second == pytest.approx(4 / result.duration_seconds)
    assert result.requests_per_second == pytest.approx(1 / result.duration_seconds)


def test_one_client_sends_its_requests_one_after_another() -> None:
    one = replay(CONFIG, BenchmarkRun((100,), (4,)))
    three = replay(CONFIG, BenchmarkRun.uniform(3, 100, 4, concurrency=1))
    assert three.duration_seconds == pytest.approx(3 * one.duration_seconds)
    assert three.mean_ttft_seconds == pytest.approx(one.mean_ttft_seconds)


def test_requests_sent_at_once_share_steps_and_finish_sooner_than_one_by_one() -> None:
    together = replay(CONFIG, BenchmarkRun.uniform(8, 512, 64))
    apart = replay(CONFIG, BenchmarkRun.uniform(8, 512, 64, concurrency=1))
    assert together.duration_seconds < apart.duration_seconds / 4
    assert together.mean_tpot_seconds > apart.mean_tpot_seconds


def test_a_run_that_cannot_finish_or_has_no_requests_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one request"):
        replay(CONFIG, BenchmarkRun((), ()))
    tiny = EngineConfig(cost=COST, max_num_seqs=4, max_num_batched_tokens=2048, kv_capacity_tokens=64)
    with pytest.raises(ValueError, match="never finished"):
        replay(tiny, BenchmarkRun((1000,), (8,)))
