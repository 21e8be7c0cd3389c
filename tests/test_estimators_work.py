"""Work pricing, KV bytes and shape buckets (goodput.estimators.work, service_time KV split)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from goodput.estimators.service_time import (
    A100_80G,
    H100_80G,
    LLAMA_3_1_8B,
    LLAMA_3_1_70B,
    ModelShape,
    StepCostModel,
)
from goodput.estimators.work import (
    ShapeBucket,
    WorkErrorProfile,
    WorkPricing,
    fit_work_error_profile,
    kv_byte_seconds,
    request_work,
    shape_bucket,
)

KIB = 1024
PRICING_8B = WorkPricing.from_step_model(StepCostModel.from_hardware(LLAMA_3_1_8B, H100_80G))


@dataclass(frozen=True)
class KvCase:
    name: str
    model: ModelShape
    tensor_parallel: int
    pipeline_parallel: int
    per_gpu_bytes: int
    group_bytes: int


KV_CASES = [
    KvCase("8b single gpu", LLAMA_3_1_8B, 1, 1, 128 * KIB, 128 * KIB),
    KvCase("70b tp8 splits heads", LLAMA_3_1_70B, 8, 1, 40 * KIB, 320 * KIB),
    KvCase("70b tp8 pp2 splits layers too", LLAMA_3_1_70B, 8, 2, 20 * KIB, 320 * KIB),
    KvCase("70b tp16 replicates heads", LLAMA_3_1_70B, 16, 1, 40 * KIB, 640 * KIB),
    KvCase("8b pp3 uneven stages take the fullest", LLAMA_3_1_8B, 1, 3, 11 * 4 * KIB, 128 * KIB),
]


@pytest.mark.parametrize("case", KV_CASES, ids=[case.name for case in KV_CASES])
def test_kv_bytes_per_token_follow_vllm_tp_pp_split(case: KvCase) -> None:
    assert (
        case.model.kv_bytes_per_token_per_gpu(case.tensor_parallel, case.pipeline_parallel)
        == case.per_gpu_bytes
    )
    assert (
        case.model.group_kv_bytes_per_token(case.tensor_parallel, case.pipeline_parallel) == case.group_bytes
    )


@pytest.mark.parametrize(
    ("model", "tensor_parallel", "expected_tokens"),
    [(LLAMA_3_1_8B, 1, 404_000), (LLAMA_3_1_70B, 4, 411_000), (LLAMA_3_1_70B, 8, 1_250_000)],
    ids=["8b tp1", "70b tp4", "70b tp8"],
)
def test_kv_capacity_matches_the_perf_model_table(
    model: ModelShape, tensor_parallel: int, expected_tokens: int
) -> None:
    capacity = StepCostModel.from_hardware(model, H100_80G, tensor_parallel).kv_capacity_tokens
    assert capacity == pytest.approx(expected_tokens, rel=0.01)


def test_replicated_heads_shrink_kv_capacity_per_token() -> None:
    """TP16 on 8 KV heads stores every head twice: half the tokens of the unreplicated estimate."""
    model = StepCostModel.from_hardware(LLAMA_3_1_70B, A100_80G, 16)
    usable = 16 * (0.90 * A100_80G.memory_bytes - 3e9) - LLAMA_3_1_70B.weight_bytes
    assert model.kv_capacity_tokens == int(usable / (640 * KIB))


def test_prefill_work_charges_new_tokens_and_their_attention_to_the_prefix() -> None:
    pricing = PRICING_8B
    full = pricing.prefill_work_seconds(4096)
    half_cached = pricing.prefill_work_seconds(4096, cached_tokens=2048)
    expected_half = 2048 * (
        pricing.prefill_seconds_per_token + pricing.prefill_seconds_per_attention_unit * (2048 + 1024)
    )
    assert half_cached == pytest.approx(expected_half)
    assert 0 < half_cached < full
    assert pricing.prefill_work_seconds(4096, cached_tokens=4096) == 0.0


def test_prefill_work_does_not_depend_on_chunking() -> None:
    """Σ p·(h + p/2) over chunks equals n·(h0 + n/2): pricing a prompt whole or chunked agrees."""
    pricing = PRICING_8B
    chunks = [512, 512, 1024, 100]
    prefix = 0
    chunked = 0.0
    for chunk in chunks:
        chunked += pricing.prefill_work_seconds(prefix + chunk, prefix)
        prefix += chunk
    assert chunked == pytest.approx(pricing.prefill_work_seconds(sum(chunks)))


@given(context=st.integers(0, 20_000), outputs=st.integers(0, 300))
def test_decode_work_equals_the_sum_of_its_tokens(context: int, outputs: int) -> None:
    pricing = PRICING_8B
    explicit = sum(pricing.decode_work_per_token(context + index) for index in range(outputs))
    assert pricing.decode_work_seconds(context, outputs) == pytest.approx(explicit, rel=1e-9, abs=1e-15)


def test_kv_byte_seconds_integrates_a_growing_context() -> None:
    """Brute-force integral: prompt held through prefill and decode, output token j held from step j."""
    bytes_per_token, prompt, outputs, gap, prefill = 1000, 50, 4, 0.1, 0.5
    explicit = prompt * bytes_per_token * (prefill + outputs * gap)
    for produced_at_step in range(1, outputs + 1):
        explicit += bytes_per_token * gap * (outputs - produced_at_step + 1)
    assert kv_byte_seconds(bytes_per_token, prompt, outputs, gap, prefill) == pytest.approx(explicit)


def test_request_work_adds_prefill_and_decode_and_prices_kv() -> None:
    work = request_work(
        PRICING_8B, 1000, 200, cached_tokens=400, inter_token_seconds=0.03, prefill_seconds=0.1
    )
    assert work.total_seconds == pytest.approx(
        PRICING_8B.prefill_work_seconds(1000, 400) + PRICING_8B.decode_work_seconds(1000, 200)
    )
    assert work.kv_bytes_peak == 1200 * 128 * KIB
    assert work.kv_byte_seconds == pytest.approx(kv_byte_seconds(128 * KIB, 1000, 200, 0.03, 0.1))


def test_long_request_costs_orders_of_magnitude_more_than_a_chat() -> None:
    """§6: one request is not one unit of demand."""
    chat = request_work(PRICING_8B, 100, 20).total_seconds
    long = request_work(PRICING_8B, 32_000, 4_000).total_seconds
    assert long / chat > 100


@pytest.mark.parametrize(
    ("input_tokens", "output_tokens", "bucket", "label"),
    [
        (1, 1, ShapeBucket(0, 0), "in<=256/out<=32"),
        (256, 32, ShapeBucket(0, 0), "in<=256/out<=32"),
        (257, 33, ShapeBucket(1, 1), "in<=1024/out<=128"),
        (32_000, 4_000, ShapeBucket(4, 4), "in<=65536/out>2048"),
        (100_000, 10, ShapeBucket(5, 0), "in>65536/out<=32"),
    ],
    ids=["smallest", "on the bounds", "just above the bounds", "long reasoning", "beyond the last bound"],
)
def test_shape_buckets(input_tokens: int, output_tokens: int, bucket: ShapeBucket, label: str) -> None:
    assert shape_bucket(input_tokens, output_tokens) == bucket
    assert bucket.label == label


def test_work_error_profile_fits_p90_per_bucket_and_falls_back_elsewhere() -> None:
    chat, reasoning, rare = ShapeBucket(0, 0), ShapeBucket(3, 4), ShapeBucket(2, 2)
    observations = [(chat, 1.0, 1.0 + index / 100) for index in range(100)]  # ratios 1.00 .. 1.99
    observations += [(reasoning, 2.0, 2.0 * (0.5 + index / 50)) for index in range(50)]  # 0.5 .. 1.48
    observations += [(rare, 1.0, 9.0)] * 5  # too few to trust
    profile = fit_work_error_profile(observations, default_p90_ratio=1.7, min_samples=20)
    assert profile.p90_ratio(chat) == pytest.approx(1.891, abs=1e-3)
    assert profile.p90_ratio(reasoning) == pytest.approx(1.382, abs=1e-3)
    assert profile.p90_ratio(rare) == 1.7
    assert profile.upper_work_seconds(2.0, chat) == pytest.approx(2 * 1.891, abs=1e-2)


def test_upper_estimate_is_never_below_the_prediction() -> None:
    overestimated = ShapeBucket(1, 1)
    profile = fit_work_error_profile([(overestimated, 2.0, 1.0)] * 30)
    assert profile.p90_ratio(overestimated) == 1.0
    assert WorkErrorProfile(default_p90_ratio=0.5).p90_ratio(overestimated) == 1.0


def test_non_finite_observations_are_ignored() -> None:
    bucket = ShapeBucket(0, 1)
    profile = fit_work_error_profile([(bucket, 1.0, math.inf)] * 30 + [(bucket, 0.0, 1.0)] * 30)
    assert profile.p90_ratio(bucket) == profile.default_p90_ratio
