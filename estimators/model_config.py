"""Pricing a model from its own configuration: a Hugging Face `config.json` as a `ModelShape`.

A platform team serves checkpoints goodput has never seen. Their `config.json` already holds what
prices a token (layers, hidden size, attention and KV heads, head dimension, MLP and expert sizes,
vocabulary, quantisation), so the team hands it to the ModelGroup (inline, or a ConfigMap made from
the file) and goodput counts the parameters and KV bytes itself. Nothing is downloaded.

What is counted: the attention projections (grouped-query, or DeepSeek's multi-head latent
attention), the gated MLP (every supported family uses SwiGLU or GeGLU: three matrices), routed and
shared experts with their router, and the embeddings (once when tied to the output head, else
twice). Biases and norms are left out: under 0.1 % of any supported model. Quantised formats apply
to the decoder's linear layers; embeddings and the output head stay in 16 bits, as the common
quantisers leave them.

Sliding-window layers are priced as full attention. vLLM's KV-cache manager gives every group of
layers the same number of blocks, so the tokens a cache holds are those of a full-attention layer
whatever the window; and the KV a sliding layer reads per step is exact up to the window and an
upper bound past it. The window is still read and reported, so a team sees it was understood.

Errors are `ModelConfigError`s that name the missing or unusable field and what to set instead:
a ModelGroup is then not priced at all rather than priced on a guess.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from goodput.estimators.service_time import ModelShape

ACTIVATION_BYTES = 2  # bf16/fp16: what vLLM runs every supported family in
EMBEDDING_BYTES = 2


class ModelConfigError(ValueError):
    """A config.json goodput cannot price; the message names the field and what to set."""


@dataclass(frozen=True, slots=True)
class Family:
    """How one `model_type` lays out its attention and MLP, and the defaults transformers applies
    to fields its config.json may leave out."""

    attention: str  # 'gqa' or 'mla'
    experts: str  # 'none', 'mixtral', 'qwen' or 'deepseek'
    sliding: str  # 'none', 'all', 'qwen', 'alternate' (Gemma 2) or 'pattern' (Gemma 3)
    tied_embeddings: bool


FAMILIES: dict[str, Family] = {
    "llama": Family("gqa", "none", "none", tied_embeddings=False),
    "mistral": Family("gqa", "none", "all", tied_embeddings=False),
    "mixtral": Family("gqa", "mixtral", "all", tied_embeddings=False),
    "qwen2": Family("gqa", "none", "qwen", tied_embeddings=False),
    "qwen3": Family("gqa", "none", "qwen", tied_embeddings=False),
    "qwen2_moe": Family("gqa", "qwen", "qwen", tied_embeddings=False),
    "qwen3_moe": Family("gqa", "qwen", "qwen", tied_embeddings=False),
    "gemma": Family("gqa", "none", "none", tied_embeddings=True),
    "gemma2": Family("gqa", "none", "alternate", tied_embeddings=True),
    "gemma3_text": Family("gqa", "none", "pattern", tied_embeddings=True),
    "phi3": Family("gqa", "none", "all", tied_embeddings=False),
    "deepseek_v2": Family("mla", "deepseek", "none", tied_embeddings=False),
    "deepseek_v3": Family("mla", "deepseek", "none", tied_embeddings=False),
}
WHAT_TO_SET = "copy the checkpoint's config.json whole, or describe the model in spec.profile.modelShape"


@dataclass(frozen=True, slots=True)
class Quantization:
    """How a checkpoint stores its decoder weights and which GEMM format it runs.

    weight_bits: bits per quantised weight, its share of the scales included.
    gemm_precision: 'fp8' or 'fp4' when activations are quantised too (W8A8, W4A4), else 'bf16'
        (weight-only formats dequantise into BF16 GEMMs).
    """

    method: str
    weight_bits: float
    gemm_precision: str = "bf16"


UNQUANTISED = Quantization("none", 16.0)


@dataclass(frozen=True, slots=True)
class Attention:
    """Per layer: the KV cached per token and the attention's parameters and FLOP width."""

    kv_heads: int
    cached_head_dim: int
    kv_planes: int
    flops_width: int
    parameters: float


@dataclass(frozen=True, slots=True)
class Mlp:
    """The MLPs of all layers: parameters every token uses, routed experts, and the k of E."""

    shared_parameters: float
    routed_parameters: float
    active_routed_parameters: float
    experts: int = 0
    experts_per_token: int = 0
    moe_layers: int = 0


@dataclass(frozen=True, slots=True)
class ModelArchitecture:
    """What a config.json says, in the units that price a token."""

    family: str
    layers: int
    hidden_size: int
    attention_heads: int
    vocab_size: int
    tied_embeddings: bool
    attention: Attention
    mlp: Mlp
    quantization: Quantization
    sliding_window_tokens: int | None = None
    sliding_layers: int = 0

    @property
    def embedding_parameters(self) -> float:
        return float(self.vocab_size * self.hidden_size * (1 if self.tied_embeddings else 2))

    @property
    def linear_parameters(self) -> float:
        """The decoder's linear layers: what a quantisation format applies to."""
        return (
            self.layers * self.attention.parameters + self.mlp.shared_parameters + self.mlp.routed_parameters
        )

    @property
    def total_parameters(self) -> float:
        return self.linear_parameters + self.embedding_parameters

    @property
    def active_parameters(self) -> float:
        return self.total_parameters - self.mlp.routed_parameters + self.mlp.active_routed_parameters

    def describe(self) -> str:
        """One line for messages and the benchmark: what goodput understood the model to be."""
        moe = (
            f", {self.mlp.experts} experts (top-{self.mlp.experts_per_token}) in {self.mlp.moe_layers} layers"
            if self.mlp.experts
            else ""
        )
        window = (
            f", {self.sliding_layers} sliding-window layers of {self.sliding_window_tokens} tokens"
            if self.sliding_layers
            else ""
        )
        return (
            f"{self.family}: {self.total_parameters / 1e9:.2f}B parameters "
            f"({self.active_parameters / 1e9:.2f}B active), {self.layers} layers{moe}{window}, "
            f"weights {self.quantization.method} ({self.quantization.weight_bits:g} bits)"
        )


def parse_model_config(
    config: Mapping[str, Any], engine_quantization: str | None = None
) -> ModelArchitecture:
    """The architecture a config.json describes; raises ModelConfigError naming what is wrong.

    engine_quantization: vLLM's --quantization flag, for a 16-bit checkpoint quantised at load.
    A multimodal config's `text_config` is the decoder priced (its vision tower runs once per image).
    """
    text = config.get("text_config")
    if isinstance(text, Mapping):
        quantization = config.get("quantization_config") or text.get("quantization_config")
        config = {**text, "quantization_config": quantization}
    model_type = config.get("model_type")
    family = FAMILIES.get(str(model_type)) if model_type is not None else None
    if family is None:
        known = ", ".join(sorted(FAMILIES))
        raise ModelConfigError(
            f"model_type {model_type!r} is not an architecture goodput prices (it knows {known}): "
            "describe the model in spec.profile.modelShape instead"
        )
    layers = _positive_int(config, "num_hidden_layers")
    hidden = _positive_int(config, "hidden_size")
    heads = _positive_int(config, "num_attention_heads")
    window, sliding_layers = _sliding_window(config, family, layers)
    return ModelArchitecture(
        family=str(model_type),
        layers=layers,
        hidden_size=hidden,
        attention_heads=heads,
        vocab_size=_positive_int(config, "vocab_size"),
        tied_embeddings=_flag(config, "tie_word_embeddings", family.tied_embeddings),
        attention=_mla(config, hidden, heads) if family.attention == "mla" else _gqa(config, hidden, heads),
        mlp=_mlp(config, family, hidden, layers),
        quantization=parse_quantization(config.get("quantization_config"), engine_quantization),
        sliding_window_tokens=window,
        sliding_layers=sliding_layers,
    )


def model_shape(
    architecture: ModelArchitecture, name: str, *, kv_cache_bytes: int = ACTIVATION_BYTES
) -> ModelShape:
    """The service-time model's shape of an architecture; kv_cache_bytes from --kv-cache-dtype."""
    bytes_per_weight = architecture.quantization.weight_bits / 8
    routed_bytes = architecture.mlp.routed_parameters * bytes_per_weight
    return ModelShape(
        name=name,
        parameters=architecture.total_parameters,
        layers=architecture.layers,
        hidden_size=architecture.hidden_size,
        kv_heads=architecture.attention.kv_heads,
        head_dim=architecture.attention.cached_head_dim,
        dtype_bytes=ACTIVATION_BYTES,
        stored_weight_bytes=architecture.linear_parameters * bytes_per_weight
        + architecture.embedding_parameters * EMBEDDING_BYTES,
        kv_dtype_bytes=kv_cache_bytes,
        kv_planes=architecture.attention.kv_planes,
        attention_width=architecture.attention.flops_width,
        active_parameters=architecture.active_parameters,
        routed_expert_bytes=routed_bytes,
        experts=architecture.mlp.experts,
        experts_per_token=architecture.mlp.experts_per_token,
        gemm_precision=architecture.quantization.gemm_precision,
    )


# --- fields ---------------------------------------------------------------------------------------


def _positive_int(config: Mapping[str, Any], key: str, default: int | None = None) -> int:
    """A positive count; a field written as null counts as absent, as transformers reads it."""
    value = config.get(key)
    if value is None:
        value = default
    if value is None:
        raise ModelConfigError(f"config.json has no `{key}`: {WHAT_TO_SET}")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelConfigError(f"config.json's `{key}` is {value!r}, not a positive integer: {WHAT_TO_SET}")
    return value


def _count(config: Mapping[str, Any], key: str, default: int) -> int:
    """A count that may be zero (first dense layers, shared experts)."""
    value = config.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ModelConfigError(f"config.json's `{key}` is {value!r}, not a count: {WHAT_TO_SET}")
    return value


def _flag(config: Mapping[str, Any], key: str, default: bool) -> bool:
    value = config.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ModelConfigError(f"config.json's `{key}` is {value!r}, not true or false: {WHAT_TO_SET}")
    return value


def _layer_list(config: Mapping[str, Any], key: str) -> Sequence[int]:
    value = config.get(key) or []
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise ModelConfigError(
            f"config.json's `{key}` is {value!r}, not a list of layer indices: {WHAT_TO_SET}"
        )
    return value


# --- attention ------------------------------------------------------------------------------------


def _gqa(config: Mapping[str, Any], hidden: int, heads: int) -> Attention:
    """Grouped-query attention: K and V of `num_key_value_heads` heads cached per token.

    transformers fills an absent `num_key_value_heads` with the query heads (multi-head attention)
    and an absent `head_dim` with hidden_size / heads; so does this.
    """
    kv_heads = _positive_int(config, "num_key_value_heads", heads)
    head_dim = config.get("head_dim")
    if head_dim is None and hidden % heads:
        raise ModelConfigError(
            f"config.json has no `head_dim` and hidden_size {hidden} is not a multiple of "
            f"num_attention_heads {heads}: {WHAT_TO_SET}"
        )
    head_dim = _positive_int(config, "head_dim", hidden // heads)
    if heads % kv_heads:
        raise ModelConfigError(
            f"config.json's num_key_value_heads {kv_heads} does not divide num_attention_heads {heads}: "
            f"{WHAT_TO_SET}"
        )
    query_width, kv_width = heads * head_dim, kv_heads * head_dim
    parameters = hidden * query_width + 2 * hidden * kv_width + query_width * hidden
    return Attention(kv_heads, head_dim, 2, query_width, float(parameters))


def _mla(config: Mapping[str, Any], hidden: int, heads: int) -> Attention:
    """DeepSeek's multi-head latent attention: one latent of kv_lora_rank + qk_rope_head_dim cached
    per token and layer (held whole by every tensor rank), queries through an optional low rank."""
    kv_rank = _positive_int(config, "kv_lora_rank")
    rope = _positive_int(config, "qk_rope_head_dim")
    nope = _positive_int(config, "qk_nope_head_dim")
    value_dim = _positive_int(config, "v_head_dim")
    q_rank = _count(config, "q_lora_rank", 0)
    query_dim = heads * (nope + rope)
    query = hidden * query_dim if q_rank == 0 else hidden * q_rank + q_rank * query_dim
    parameters = (
        query + hidden * (kv_rank + rope) + kv_rank * heads * (nope + value_dim) + heads * value_dim * hidden
    )
    flops_width = heads * (nope + rope + value_dim) // 2
    return Attention(1, kv_rank + rope, 1, flops_width, float(parameters))


# --- MLP and experts ------------------------------------------------------------------------------


def _gated(hidden: int, intermediate: int) -> float:
    return 3.0 * hidden * intermediate


def _mlp(config: Mapping[str, Any], family: Family, hidden: int, layers: int) -> Mlp:
    if family.experts == "mixtral":
        experts = _positive_int(config, "num_local_experts", 8)
        top_k = _positive_int(config, "num_experts_per_tok", 2)
        expert = _gated(hidden, _positive_int(config, "intermediate_size"))
        return _moe(layers, layers, experts, top_k, expert, shared_per_layer=hidden * experts, dense=0.0)
    if family.experts == "qwen":
        return _qwen_moe(config, hidden, layers)
    if family.experts == "deepseek":
        return _deepseek_moe(config, hidden, layers)
    return Mlp(layers * _gated(hidden, _positive_int(config, "intermediate_size")), 0.0, 0.0)


def _moe(
    layers: int,
    moe_layers: int,
    experts: int,
    top_k: int,
    expert: float,
    *,
    shared_per_layer: float,
    dense: float,
) -> Mlp:
    """MoE layers of `experts` routed experts of `expert` parameters each (top-k routed), with
    `shared_per_layer` parameters every token uses in each (router, shared experts), and `dense`
    parameters in the layers that keep a dense MLP."""
    if top_k > experts:
        raise ModelConfigError(
            f"config.json routes each token to {top_k} experts of only {experts}: {WHAT_TO_SET}"
        )
    return Mlp(
        shared_parameters=moe_layers * shared_per_layer + dense,
        routed_parameters=float(moe_layers * experts * expert),
        active_routed_parameters=float(moe_layers * top_k * expert),
        experts=experts,
        experts_per_token=top_k,
        moe_layers=moe_layers,
    )


def _qwen_moe(config: Mapping[str, Any], hidden: int, layers: int) -> Mlp:
    """Qwen2/Qwen3-MoE: every `decoder_sparse_step`-th layer not in `mlp_only_layers` is sparse;
    Qwen2-MoE adds a shared expert of `shared_expert_intermediate_size` with its one-unit gate."""
    experts = _count(config, "num_experts", 0)
    step = _positive_int(config, "decoder_sparse_step", 1)
    dense_only = set(_layer_list(config, "mlp_only_layers"))
    sparse = sum(1 for i in range(layers) if experts and i not in dense_only and (i + 1) % step == 0)
    dense = (
        (layers - sparse) * _gated(hidden, _positive_int(config, "intermediate_size"))
        if sparse < layers
        else 0.0
    )
    if sparse == 0:
        return Mlp(dense, 0.0, 0.0)
    expert = _gated(hidden, _positive_int(config, "moe_intermediate_size"))
    shared_size = _count(config, "shared_expert_intermediate_size", 0)
    shared = hidden * experts + (_gated(hidden, shared_size) + hidden if shared_size else 0.0)
    top_k = _positive_int(config, "num_experts_per_tok")
    return _moe(layers, sparse, experts, top_k, expert, shared_per_layer=shared, dense=dense)


def _deepseek_moe(config: Mapping[str, Any], hidden: int, layers: int) -> Mlp:
    """DeepSeek-V2/V3: the first `first_k_dense_replace` layers are dense (`intermediate_size`), then
    every `moe_layer_freq`-th layer holds `n_routed_experts` routed and `n_shared_experts` shared
    experts of `moe_intermediate_size` each."""
    experts = _positive_int(config, "n_routed_experts")
    first_dense = _count(config, "first_k_dense_replace", 0)
    frequency = _positive_int(config, "moe_layer_freq", 1)
    sparse = sum(1 for i in range(layers) if i >= first_dense and i % frequency == 0)
    expert = _gated(hidden, _positive_int(config, "moe_intermediate_size"))
    dense = (layers - sparse) * _gated(hidden, _positive_int(config, "intermediate_size"))
    shared = hidden * experts + _count(config, "n_shared_experts", 0) * expert
    top_k = _positive_int(config, "num_experts_per_tok")
    return _moe(layers, sparse, experts, top_k, expert, shared_per_layer=shared, dense=dense)


# --- sliding windows ------------------------------------------------------------------------------


def _sliding_window(config: Mapping[str, Any], family: Family, layers: int) -> tuple[int | None, int]:
    """(window, layers that use it), as the family's modelling code reads its config."""
    window = config.get("sliding_window")
    if family.sliding == "none" or window is None:
        return None, 0
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ModelConfigError(
            f"config.json's `sliding_window` is {window!r}, not a token count: {WHAT_TO_SET}"
        )
    if family.sliding == "qwen":
        if not config.get("use_sliding_window", False):
            return None, 0
        return window, layers - min(layers, _count(config, "max_window_layers", layers))
    if family.sliding == "alternate":
        return window, (layers + 1) // 2
    if family.sliding == "pattern":
        kinds = config.get("layer_types")
        if isinstance(kinds, list):
            return window, sum(1 for kind in kinds if kind == "sliding_attention")
        pattern = _positive_int(config, "sliding_window_pattern", 6)
        return window, sum(1 for i in range(layers) if (i + 1) % pattern)
    return window, layers


# --- quantisation ---------------------------------------------------------------------------------

QUANTISATION_METHODS = ("fp8", "fbgemm_fp8", "modelopt", "compressed-tensors", "awq", "gptq", "bitsandbytes")


def parse_quantization(section: Any, engine_quantization: str | None = None) -> Quantization:
    """How `quantization_config` (or vLLM's --quantization on a 16-bit checkpoint) stores weights."""
    if section is None:
        if engine_quantization in (None, "", "none"):
            return UNQUANTISED
        if engine_quantization in ("fp8", "fbgemm_fp8"):
            return Quantization(engine_quantization, 8.0, "fp8")
        raise ModelConfigError(
            f"--quantization {engine_quantization} needs the checkpoint's quantization_config, which "
            f"config.json does not have: {WHAT_TO_SET}"
        )
    if not isinstance(section, Mapping):
        raise ModelConfigError(
            f"config.json's `quantization_config` is {section!r}, not an object: {WHAT_TO_SET}"
        )
    method = str(section.get("quant_method", "")).lower()
    if method in ("fp8", "fbgemm_fp8"):
        return Quantization(method, 8.0, "fp8")
    if method == "modelopt":
        return _modelopt(section)
    if method == "compressed-tensors":
        return _compressed_tensors(section)
    if method in ("awq", "awq_marlin", "gptq", "gptq_marlin", "marlin"):
        return _grouped_integer(method, section)
    if method == "bitsandbytes":
        return Quantization(method, 4.5 if section.get("load_in_4bit") else 8.0)
    raise ModelConfigError(
        f"quantization_config.quant_method {method or None!r} is not one goodput prices "
        f"({', '.join(QUANTISATION_METHODS)}): remove quantization_config to price the weights in 16 bits, "
        "an upper bound on their memory and read time"
    )


def _modelopt(section: Mapping[str, Any]) -> Quantization:
    algorithm = str(section.get("quant_algo", "")).upper()
    if algorithm == "FP8":
        return Quantization("modelopt", 8.0, "fp8")
    if algorithm == "NVFP4":
        return Quantization("modelopt", 4.5, "fp4")  # an FP8 scale per 16 weights
    raise ModelConfigError(
        f"quantization_config.quant_algo {algorithm or None!r} is not one goodput prices (FP8, NVFP4): "
        "remove quantization_config to price the weights in 16 bits"
    )


def _compressed_tensors(section: Mapping[str, Any]) -> Quantization:
    """llm-compressor's format: the first config group's weight and input-activation schemes."""
    groups = section.get("config_groups")
    scheme = next(iter(groups.values()), None) if isinstance(groups, Mapping) and groups else None
    weights = scheme.get("weights") if isinstance(scheme, Mapping) else None
    if not isinstance(weights, Mapping) or not isinstance(weights.get("num_bits"), int):
        raise ModelConfigError(
            "quantization_config.config_groups has no weights.num_bits: copy the checkpoint's "
            "config.json whole, or remove quantization_config to price the weights in 16 bits"
        )
    bits = int(weights["num_bits"])
    is_float = weights.get("type") == "float"
    group = weights.get("group_size")
    scale_bits = (
        (8 if is_float and bits == 4 else 16) / group if isinstance(group, int) and group > 0 else 0.0
    )
    activations = scheme.get("input_activations") if isinstance(scheme, Mapping) else None
    gemm = "bf16"
    if isinstance(activations, Mapping) and activations.get("type") == "float":
        gemm = {8: "fp8", 4: "fp4"}.get(int(activations.get("num_bits") or 16), "bf16")
    return Quantization("compressed-tensors", bits + scale_bits, gemm)


def _grouped_integer(method: str, section: Mapping[str, Any]) -> Quantization:
    """AWQ and GPTQ: `bits`-bit integers with a 16-bit scale per `group_size` weights, dequantised
    into BF16 GEMMs."""
    bits = section.get("bits", section.get("w_bit"))
    if not isinstance(bits, int) or isinstance(bits, bool) or bits < 1:
        raise ModelConfigError(
            f"quantization_config ({method}) has no `bits`: copy the checkpoint's config.json whole"
        )
    group = section.get("group_size", section.get("q_group_size", 128))
    scale_bits = 16 / group if isinstance(group, int) and group > 0 else 0.0
    return Quantization(method, bits + scale_bits)
