"""A model priced from its own config.json: each family, each quantisation, each way a config can be
unusable (goodput.estimators.model_config).

The configurations are the pricing fields of the checkpoints' published config.json files; the
parameter counts they are checked against are the ones the model cards state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from goodput.estimators.model_config import (
    ModelConfigError,
    Quantization,
    model_shape,
    parse_model_config,
    parse_quantization,
)
from goodput.estimators.service_time import H100_80G, LLAMA_3_1_8B, StepCostModel

LLAMA_3_1_8B_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
}
MISTRAL_7B_V03 = {**LLAMA_3_1_8B_CONFIG, "model_type": "mistral", "vocab_size": 32768, "sliding_window": None}
MISTRAL_7B_V01 = {**MISTRAL_7B_V03, "vocab_size": 32000, "sliding_window": 4096}
MIXTRAL_8X7B = {
    **MISTRAL_7B_V01,
    "model_type": "mixtral",
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "sliding_window": None,
}
QWEN2_5_7B = {
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "tie_word_embeddings": False,
    "sliding_window": 131072,
    "use_sliding_window": False,
    "max_window_layers": 28,
}
QWEN1_5_MOE_A2_7B = {
    "model_type": "qwen2_moe",
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "num_experts": 60,
    "num_experts_per_tok": 4,
    "decoder_sparse_step": 1,
    "vocab_size": 151936,
    "tie_word_embeddings": False,
}
QWEN3_30B_A3B = {
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "vocab_size": 151936,
    "tie_word_embeddings": False,
}
GEMMA_2_9B = {
    "model_type": "gemma2",
    "hidden_size": 3584,
    "intermediate_size": 14336,
    "num_hidden_layers": 42,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 256,
    "vocab_size": 256000,
    "sliding_window": 4096,
}
GEMMA_3_4B = {
    "model_type": "gemma3",
    "architectures": ["Gemma3ForConditionalGeneration"],
    "text_config": {
        "model_type": "gemma3_text",
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "num_hidden_layers": 34,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "vocab_size": 262208,
        "sliding_window": 1024,
        "sliding_window_pattern": 6,
    },
    "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152},
}
PHI_3_MINI = {
    "model_type": "phi3",
    "hidden_size": 3072,
    "intermediate_size": 8192,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "vocab_size": 32064,
    "tie_word_embeddings": False,
    "sliding_window": 2047,
}
DEEPSEEK_V2_LITE = {
    "model_type": "deepseek_v2",
    "hidden_size": 2048,
    "intermediate_size": 10944,
    "moe_intermediate_size": 1408,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "num_experts_per_tok": 6,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "kv_lora_rank": 512,
    "q_lora_rank": None,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "vocab_size": 102400,
}
DEEPSEEK_V3 = {
    **DEEPSEEK_V2_LITE,
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 3,
    "q_lora_rank": 1536,
    "vocab_size": 129280,
    "num_nextn_predict_layers": 1,
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]},
}


@dataclass(frozen=True)
class FamilyCase:
    name: str
    config: dict[str, Any]
    total_billions: float
    active_billions: float
    kv_bytes_per_token: int
    experts: int = 0
    sliding_layers: int = 0


FAMILIES = [
    FamilyCase("llama-3.1-8b", LLAMA_3_1_8B_CONFIG, 8.03, 8.03, 2 * 32 * 8 * 128 * 2),
    FamilyCase("mistral-7b-v0.3", MISTRAL_7B_V03, 7.25, 7.25, 2 * 32 * 8 * 128 * 2),
    FamilyCase("mistral-7b-v0.1 (sliding window)", MISTRAL_7B_V01, 7.24, 7.24, 131072, sliding_layers=32),
    FamilyCase("mixtral-8x7b", MIXTRAL_8X7B, 46.7, 12.9, 131072, experts=8),
    FamilyCase("qwen2.5-7b (window off)", QWEN2_5_7B, 7.61, 7.61, 2 * 28 * 4 * 128 * 2),
    FamilyCase(
        "qwen1.5-moe-a2.7b (shared expert)", QWEN1_5_MOE_A2_7B, 14.3, 2.7, 2 * 24 * 16 * 128 * 2, experts=60
    ),
    FamilyCase("qwen3-30b-a3b", QWEN3_30B_A3B, 30.5, 3.3, 2 * 48 * 4 * 128 * 2, experts=128),
    FamilyCase(
        "gemma-2-9b (tied, alternating)", GEMMA_2_9B, 9.24, 9.24, 2 * 42 * 8 * 256 * 2, sliding_layers=21
    ),
    FamilyCase(
        "gemma-3-4b (text_config, 5:1)", GEMMA_3_4B, 3.88, 3.88, 2 * 34 * 4 * 256 * 2, sliding_layers=29
    ),
    FamilyCase("phi-3-mini", PHI_3_MINI, 3.82, 3.82, 2 * 32 * 32 * 96 * 2, sliding_layers=32),
    # DeepSeek's model cards count activated parameters without the input embedding (a lookup):
    # 2.4B and 37B; with it, as goodput counts what a token touches, 2.7B and 37.5B.
    FamilyCase(
        "deepseek-v2-lite (MLA, no q_lora)", DEEPSEEK_V2_LITE, 15.7, 2.4 + 0.21, 27 * 576 * 2, experts=64
    ),
    FamilyCase("deepseek-v3 (MLA, fp8)", DEEPSEEK_V3, 671.0, 37.0 + 0.93, 61 * 576 * 2, experts=256),
]


@pytest.mark.parametrize("case", FAMILIES, ids=[case.name for case in FAMILIES])
def test_each_family_counts_the_parameters_its_model_card_states(case: FamilyCase) -> None:
    architecture = parse_model_config(case.config)
    shape = model_shape(architecture, case.name)

    assert architecture.total_parameters / 1e9 == pytest.approx(case.total_billions, rel=0.015)
    assert architecture.active_parameters / 1e9 == pytest.approx(case.active_billions, rel=0.04)
    assert shape.kv_bytes_per_token == case.kv_bytes_per_token
    assert (shape.experts, architecture.sliding_layers) == (case.experts, case.sliding_layers)
    described = architecture.describe()
    assert described.startswith(f"{architecture.family}: {architecture.total_parameters / 1e9:.2f}B")
    assert ("experts" in described) == bool(case.experts)
    assert ("sliding-window" in described) == bool(case.sliding_layers)


def test_a_config_priced_llama_matches_the_catalogues_llama() -> None:
    shape = model_shape(parse_model_config(LLAMA_3_1_8B_CONFIG), "meta-llama/Llama-3.1-8B-Instruct")
    from_config = StepCostModel.from_hardware(shape, H100_80G)
    catalogue = StepCostModel.from_hardware(LLAMA_3_1_8B, H100_80G)

    for batch, context in ((1, 1000), (64, 1500), (256, 1500)):
        assert from_config.decode_step_seconds(batch, context) == pytest.approx(
            catalogue.decode_step_seconds(batch, context), rel=1e-3
        )
    assert from_config.prefill_seconds(8192) == pytest.approx(catalogue.prefill_seconds(8192), rel=1e-3)
    assert from_config.kv_capacity_tokens == pytest.approx(catalogue.kv_capacity_tokens, rel=1e-3)


def test_fields_written_as_null_are_read_as_absent_and_a_text_config_keeps_its_quantisation() -> None:
    nulls = {
        **LLAMA_3_1_8B_CONFIG,
        "head_dim": None,
        "num_key_value_heads": None,
        "tie_word_embeddings": None,
    }
    architecture = parse_model_config(nulls)
    assert (architecture.attention.cached_head_dim, architecture.attention.kv_heads) == (128, 32)
    assert not architecture.tied_embeddings
    inner = {**GEMMA_3_4B["text_config"], "quantization_config": {"quant_method": "fp8"}}
    assert parse_model_config({**GEMMA_3_4B, "text_config": inner}).quantization.method == "fp8"


def test_quantised_layers_are_stored_at_their_format_and_the_embeddings_in_16_bits() -> None:
    fp8 = parse_model_config({**LLAMA_3_1_8B_CONFIG, "quantization_config": {"quant_method": "fp8"}})
    shape = model_shape(fp8, "fp8", kv_cache_bytes=1)

    assert shape.weight_bytes == pytest.approx(fp8.linear_parameters * 1 + fp8.embedding_parameters * 2)
    assert (shape.gemm_precision, shape.kv_element_bytes, shape.dtype_bytes) == ("fp8", 1, 2)
    moe = parse_model_config({**QWEN3_30B_A3B, "quantization_config": {"quant_method": "awq", "bits": 4}})
    moe_shape = model_shape(moe, "awq")
    assert moe_shape.routed_expert_bytes == pytest.approx(moe.mlp.routed_parameters * 4.125 / 8)
    assert moe_shape.gemm_precision == "bf16"


def _compressed(weights: dict[str, Any], activations: dict[str, Any] | None = None) -> dict[str, Any]:
    scheme: dict[str, Any] = {"targets": ["Linear"], "weights": weights}
    if activations is not None:
        scheme["input_activations"] = activations
    return {"quant_method": "compressed-tensors", "config_groups": {"group_0": scheme}}


QUANTISATIONS: list[tuple[str, Any, str | None, Quantization]] = [
    ("none", None, None, Quantization("none", 16.0)),
    (
        "fp8 checkpoint",
        {"quant_method": "fp8", "activation_scheme": "dynamic"},
        None,
        Quantization("fp8", 8.0, "fp8"),
    ),
    ("fp8 at load (--quantization)", None, "fp8", Quantization("fp8", 8.0, "fp8")),
    ("fbgemm fp8", {"quant_method": "fbgemm_fp8"}, None, Quantization("fbgemm_fp8", 8.0, "fp8")),
    (
        "awq 4-bit g128",
        {"quant_method": "awq", "bits": 4, "group_size": 128},
        None,
        Quantization("awq", 4.125),
    ),
    (
        "awq 4-bit w_bit",
        {"quant_method": "awq", "w_bit": 4, "q_group_size": 64},
        None,
        Quantization("awq", 4.25),
    ),
    (
        "gptq per channel",
        {"quant_method": "gptq", "bits": 4, "group_size": -1},
        None,
        Quantization("gptq", 4.0),
    ),
    ("gptq 8-bit", {"quant_method": "gptq_marlin", "bits": 8}, None, Quantization("gptq_marlin", 8.125)),
    (
        "w8a8 fp8 (compressed-tensors)",
        _compressed({"num_bits": 8, "type": "float"}, {"num_bits": 8, "type": "float"}),
        None,
        Quantization("compressed-tensors", 8.0, "fp8"),
    ),
    (
        "w4a16 (compressed-tensors)",
        _compressed({"num_bits": 4, "type": "int", "group_size": 128}),
        None,
        Quantization("compressed-tensors", 4.125),
    ),
    (
        "nvfp4 (compressed-tensors)",
        _compressed({"num_bits": 4, "type": "float", "group_size": 16}, {"num_bits": 4, "type": "float"}),
        None,
        Quantization("compressed-tensors", 4.5, "fp4"),
    ),
    (
        "w8a8 int8: priced at the bf16 rate",
        _compressed({"num_bits": 8, "type": "int"}, {"num_bits": 8, "type": "int"}),
        None,
        Quantization("compressed-tensors", 8.0),
    ),
    (
        "modelopt fp8",
        {"quant_method": "modelopt", "quant_algo": "FP8"},
        None,
        Quantization("modelopt", 8.0, "fp8"),
    ),
    (
        "modelopt nvfp4",
        {"quant_method": "modelopt", "quant_algo": "NVFP4"},
        None,
        Quantization("modelopt", 4.5, "fp4"),
    ),
    (
        "bitsandbytes 4-bit",
        {"quant_method": "bitsandbytes", "load_in_4bit": True},
        None,
        Quantization("bitsandbytes", 4.5),
    ),
]


@pytest.mark.parametrize(
    ("section", "engine", "expected"),
    [case[1:] for case in QUANTISATIONS],
    ids=[case[0] for case in QUANTISATIONS],
)
def test_each_quantisation_gives_its_weight_bits_and_gemm_format(
    section: Any, engine: str | None, expected: Quantization
) -> None:
    assert parse_quantization(section, engine) == expected


@dataclass(frozen=True)
class BadCase:
    name: str
    config: dict[str, Any]
    mentions: tuple[str, ...]
    engine_quantization: str | None = None


def _without(config: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k != key}


BAD = [
    BadCase(
        "no layer count",
        _without(LLAMA_3_1_8B_CONFIG, "num_hidden_layers"),
        ("`num_hidden_layers`", "modelShape"),
    ),
    BadCase(
        "an unknown architecture",
        {**LLAMA_3_1_8B_CONFIG, "model_type": "gpt2"},
        ("'gpt2'", "it knows", "modelShape"),
    ),
    BadCase("no model_type", _without(LLAMA_3_1_8B_CONFIG, "model_type"), ("None", "modelShape")),
    BadCase(
        "a layer count as text",
        {**LLAMA_3_1_8B_CONFIG, "num_hidden_layers": "32"},
        ("`num_hidden_layers`", "positive integer"),
    ),
    BadCase(
        "no head_dim and heads not dividing the width",
        {**LLAMA_3_1_8B_CONFIG, "num_attention_heads": 30},
        ("`head_dim`", "hidden_size 4096"),
    ),
    BadCase(
        "KV heads not dividing query heads",
        {**LLAMA_3_1_8B_CONFIG, "num_key_value_heads": 5},
        ("num_key_value_heads 5",),
    ),
    BadCase(
        "more experts per token than experts",
        {**MIXTRAL_8X7B, "num_experts_per_tok": 9},
        ("9 experts of only 8",),
    ),
    BadCase(
        "an MoE without expert size",
        _without(QWEN3_30B_A3B, "moe_intermediate_size"),
        ("`moe_intermediate_size`",),
    ),
    BadCase("MoE layers not a list", {**QWEN3_30B_A3B, "mlp_only_layers": "all"}, ("`mlp_only_layers`",)),
    BadCase("MLA without its latent rank", _without(DEEPSEEK_V3, "kv_lora_rank"), ("`kv_lora_rank`",)),
    BadCase("a negative window", {**MISTRAL_7B_V01, "sliding_window": -1}, ("`sliding_window`",)),
    BadCase(
        "an unknown quantisation",
        {**LLAMA_3_1_8B_CONFIG, "quantization_config": {"quant_method": "hqq"}},
        ("'hqq'", "remove quantization_config"),
    ),
    BadCase(
        "compressed-tensors without weight bits",
        {**LLAMA_3_1_8B_CONFIG, "quantization_config": {"quant_method": "compressed-tensors"}},
        ("weights.num_bits",),
    ),
    BadCase(
        "gptq without bits",
        {**LLAMA_3_1_8B_CONFIG, "quantization_config": {"quant_method": "gptq"}},
        ("`bits`",),
    ),
    BadCase(
        "quantization_config not an object",
        {**LLAMA_3_1_8B_CONFIG, "quantization_config": "fp8"},
        ("`quantization_config`",),
    ),
    BadCase("--quantization awq on a 16-bit checkpoint", LLAMA_3_1_8B_CONFIG, ("--quantization awq",), "awq"),
]


@pytest.mark.parametrize("case", BAD, ids=[case.name for case in BAD])
def test_an_unusable_config_names_the_field_and_what_to_set(case: BadCase) -> None:
    with pytest.raises(ModelConfigError) as raised:
        parse_model_config(case.config, case.engine_quantization)
    assert all(text in str(raised.value) for text in case.mentions), str(raised.value)
