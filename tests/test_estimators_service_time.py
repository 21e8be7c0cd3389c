"""The roofline of one engine step across accelerators, quantisations and mixtures of experts
(goodput.estimators.service_time, goodput.estimators.accelerators)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from goodput.estimators.accelerators import GPUS, GpuSpec
from goodput.estimators.service_time import (
    A100_80G,
    H100_80G,
    LLAMA_3_1_8B,
    LLAMA_3_1_70B,
    ModelShape,
    StepCostModel,
    default_batch_limits,
)

CATALOGUE = ("l4", "l40s", "a10g", "a100-40g", "a100-80g", "h100-80g", "h200", "b200", "mi300x")
# A Qwen3-30B-A3B-like mixture: 30.5B parameters of which 29B in 128 experts, 8 routed per token.
MOE = ModelShape(
    "moe",
    parameters=30.5e9,
    layers=48,
    hidden_size=2048,
    kv_heads=4,
    head_dim=128,
    stored_weight_bytes=61.0e9,
    attention_width=4096,
    active_parameters=3.3e9,
    routed_expert_bytes=58.0e9,
    experts=128,
    experts_per_token=8,
)


def test_the_catalogue_holds_the_accelerators_platform_teams_run_each_with_its_source() -> None:
    assert set(GPUS) == set(CATALOGUE)
    for gpu in GPUS.values():
        assert gpu.source, f"{gpu.name} gives no source for its figures"
        assert gpu.flops > 0 and gpu.memory_bandwidth_bytes_per_second > 0 and gpu.memory_bytes > 0
        assert gpu.fp8_flops == 0 or gpu.fp8_flops >= gpu.flops
        assert gpu.allreduce_bytes_per_second > 0


@pytest.mark.parametrize(
    ("name", "vllm_defaults"),
    [("l4", (256, 2048)), ("a100-80g", (256, 2048)), ("h100-80g", (1024, 8192)), ("h200", (1024, 8192)),
     ("b200", (1024, 16384)), ("mi300x", (1024, 16384))],
)  # fmt: skip
def test_vllm_batch_defaults_follow_the_memory_vllm_sees(name: str, vllm_defaults: tuple[int, int]) -> None:
    assert default_batch_limits(GPUS[name]) == vllm_defaults


@pytest.mark.parametrize(
    ("gpu", "precision", "flops"),
    [(H100_80G, "fp8", 1979e12), (H100_80G, "bf16", 989e12), (A100_80G, "fp8", 312e12),
     (H100_80G, "fp4", 989e12), (GPUS["b200"], "fp4", 9000e12)],
    ids=["h100-fp8-unit", "h100-bf16", "a100-fp8-weight-only", "h100-fp4-weight-only", "b200-fp4-unit"],
)  # fmt: skip
def test_a_format_without_a_unit_runs_at_the_bf16_rate_never_faster(
    gpu: GpuSpec, precision: str, flops: float
) -> None:
    assert gpu.gemm_flops(precision) == flops


def _legacy(model: ModelShape, gpu: GpuSpec, tp: int, pp: int) -> StepCostModel:
    """The step model as it was before accelerators and experts were added (perf-model §1.3),
    written out term by term: the catalogue's dense models must price exactly as they did."""
    allreduces = 0.0 if tp == 1 else 2.0 * model.layers
    stage_sends = float(pp - 1)
    usable = tp * pp * (0.90 * gpu.memory_bytes - 3e9)
    kv = 2 * model.layers * max(1, model.kv_heads // tp) * tp * model.head_dim * model.dtype_bytes
    bandwidth = gpu.memory_bandwidth_bytes_per_second * gpu.bandwidth_efficiency
    link = gpu.allreduce_bytes_per_second
    return StepCostModel(
        fixed_seconds=126e-6 + 32e-6 * model.layers + stage_sends * gpu.allreduce_latency_seconds,
        weight_read_seconds=model.parameters * model.dtype_bytes / (tp * bandwidth),
        compute_seconds_per_token=2 * model.parameters / (tp * gpu.flops * gpu.compute_efficiency),
        attention_seconds_per_unit=4
        * model.layers
        * model.hidden_size
        / (tp * gpu.flops * gpu.attention_efficiency),
        context_read_seconds_per_token=kv / (tp * bandwidth),
        seconds_per_sequence=20e-6,
        communication_fixed_seconds=allreduces * gpu.allreduce_latency_seconds,
        communication_seconds_per_token=allreduces * model.hidden_size * model.dtype_bytes / link
        + stage_sends * model.hidden_size * model.dtype_bytes / link,
        kv_capacity_tokens=max(0, int((usable - model.parameters * model.dtype_bytes) / kv)),
        kv_bytes_per_token=kv,
    )


@pytest.mark.parametrize("model", [LLAMA_3_1_8B, LLAMA_3_1_70B], ids=lambda m: m.name)
@pytest.mark.parametrize("gpu", [A100_80G, H100_80G], ids=lambda g: g.name)
@pytest.mark.parametrize(("tp", "pp"), [(1, 1), (4, 1), (8, 2)])
def test_the_catalogues_dense_models_price_exactly_as_before(
    model: ModelShape, gpu: GpuSpec, tp: int, pp: int
) -> None:
    assert StepCostModel.from_hardware(model, gpu, tp, pp) == _legacy(model, gpu, tp, pp)


def test_a_step_reads_only_the_experts_its_tokens_were_routed_to() -> None:
    """E·(1 - (1 - k/E)^B) experts of E: k for one token, nearly all for a few hundred."""
    cost = StepCostModel.from_hardware(MOE, H100_80G)
    shared = cost.weight_read_seconds
    for tokens in (1, 4, 16, 64, 512):
        touched = 1 - (1 - 8 / 128) ** tokens
        assert cost.weights_read_seconds(tokens) == pytest.approx(shared + cost.expert_read_seconds * touched)
    assert cost.weights_read_seconds(1) == pytest.approx(shared + cost.expert_read_seconds * 8 / 128)
    assert cost.weights_read_seconds(512) == pytest.approx(shared + cost.expert_read_seconds, rel=1e-9)


def test_compute_is_priced_by_active_and_memory_by_total_parameters() -> None:
    moe = StepCostModel.from_hardware(MOE, H100_80G)
    dense = dataclasses.replace(
        MOE, active_parameters=None, parameters=3.3e9, routed_expert_bytes=0.0, experts=0
    )
    active_dense = StepCostModel.from_hardware(dense, H100_80G)
    assert moe.compute_seconds_per_token == pytest.approx(active_dense.compute_seconds_per_token)
    total_bytes = MOE.weight_bytes
    assert moe.weight_read_seconds + moe.expert_read_seconds == pytest.approx(
        total_bytes / (H100_80G.memory_bandwidth_bytes_per_second * H100_80G.bandwidth_efficiency)
    )
    # KV capacity is what the total weights leave.
    assert moe.kv_capacity_tokens == int((0.9 * 80e9 - 3e9 - total_bytes) / MOE.kv_bytes_per_token)


def test_the_array_form_prices_an_moe_step_as_the_scalar_one() -> None:
    cost = StepCostModel.from_hardware(MOE, H100_80G)
    tokens = np.array([1.0, 8.0, 200.0, 4096.0])
    context = np.array([1000.0, 8000.0, 200_000.0, 0.0])
    sequences = np.array([1.0, 8.0, 200.0, 2.0])
    units = np.array([0.0, 0.0, 0.0, 4096 * 2048.0])
    array = cost.step_seconds_array(tokens, units, context, sequences)
    scalar = [cost.step_seconds(*values) for values in zip(tokens, units, context, sequences, strict=True)]
    assert array.tolist() == pytest.approx(scalar)


@given(
    experts=st.integers(2, 256),
    routed=st.integers(1, 256),
    more=st.integers(1, 64),
    batch=st.integers(1, 2048),
    context=st.integers(0, 32_768),
)
def test_more_experts_per_token_is_never_cheaper(
    experts: int, routed: int, more: int, batch: int, context: int
) -> None:
    k = min(routed, experts - 1)
    k_more = min(k + more, experts)
    expert_params = 25e9

    def step(top_k: int) -> float:
        shape = dataclasses.replace(
            MOE,
            experts=experts,
            experts_per_token=top_k,
            active_parameters=1.5e9 + expert_params * top_k / experts,
        )
        return StepCostModel.from_hardware(shape, H100_80G).decode_step_seconds(batch, context)

    assert step(k_more) >= step(k)


@given(batch=st.integers(1, 64), context=st.integers(0, 8192), tp=st.sampled_from([1, 2, 4, 8]))
def test_fp8_weights_are_never_slower_than_bf16_on_a_memory_bound_decode(
    batch: int, context: int, tp: int
) -> None:
    for gpu in GPUS.values():
        bf16 = StepCostModel.from_hardware(LLAMA_3_1_70B, gpu, tp)
        fp8_shape = dataclasses.replace(
            LLAMA_3_1_70B, stored_weight_bytes=LLAMA_3_1_70B.parameters, gemm_precision="fp8"
        )
        fp8 = StepCostModel.from_hardware(fp8_shape, gpu, tp)
        assert fp8.decode_step_seconds(batch, context) <= bf16.decode_step_seconds(batch, context)
        assert fp8.kv_capacity_tokens >= bf16.kv_capacity_tokens


@given(batch=st.integers(1, 4096), context=st.integers(0, 32_768))
def test_an_moe_step_costs_between_a_dense_model_of_its_active_and_of_its_total_parameters(
    batch: int, context: int
) -> None:
    moe = StepCostModel.from_hardware(MOE, H100_80G)
    plain = dataclasses.replace(MOE, routed_expert_bytes=0.0, experts=0, experts_per_token=0)
    as_total = StepCostModel.from_hardware(dataclasses.replace(plain, active_parameters=None), H100_80G)
    as_active = StepCostModel.from_hardware(
        dataclasses.replace(plain, stored_weight_bytes=MOE.weight_bytes - MOE.routed_expert_bytes), H100_80G
    )
    step = moe.decode_step_seconds(batch, context)
    assert (
        as_active.decode_step_seconds(batch, context) <= step <= as_total.decode_step_seconds(batch, context)
    )


def test_fp8_kv_halves_the_bytes_a_token_holds_and_mla_caches_one_latent_per_rank() -> None:
    assert dataclasses.replace(LLAMA_3_1_8B, kv_dtype_bytes=1).kv_bytes_per_token == 64 * 1024
    # DeepSeek-V3: 61 layers of a 512 + 64 latent, held whole by every tensor rank.
    mla = ModelShape("mla", 671e9, 61, 7168, kv_heads=1, head_dim=576, kv_planes=1)
    assert mla.kv_bytes_per_token == 61 * 576 * 2
    assert mla.kv_bytes_per_token_per_gpu(8) == 61 * 576 * 2
    assert mla.group_kv_bytes_per_token(8) == 8 * 61 * 576 * 2
    assert math.isclose(MOE.expert_skip_probability, 1 - 8 / 128)
