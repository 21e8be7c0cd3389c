"""The service-time model of one vLLM engine step, shared by the autoscaler and the simulator.

One continuous-batching step costs a fixed overhead, the GEMMs (memory- or compute-bound), prefill
attention, the KV read of decodes, a per-sequence overhead and the tensor-parallel all-reduces
(reference: perf-model §1). The coefficients are folded once per (model, GPU, parallelism) into a
`StepCostModel`, so a step costs a handful of multiply-adds: the simulator calls it on every step.

Mixture-of-experts models are priced by their active parameters for compute and their total
parameters for memory: a token multiplies through the shared weights and the k experts it is routed
to, while a step reads the shared weights and every expert some token of the batch was routed to.
With routing taken as uniform and independent per token, a batch of B tokens leaves a given expert
untouched with probability (1 - k/E)^B, so a step reads E·(1 - (1 - k/E)^B) of the E experts of a
layer: one token reads k, a batch of a few hundred reads them all. Real routers are skewed, which
touches fewer experts than this; the uniform figure is the upper bound, so a step is never priced
cheaper than the experts it may read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from goodput.estimators.accelerators import A100_80G, GPUS, H100_80G, GpuSpec

__all__ = [
    "A100_80G",
    "GPUS",
    "H100_80G",
    "LLAMA_3_1_8B",
    "LLAMA_3_1_70B",
    "MODELS",
    "GpuSpec",
    "ModelShape",
    "StepCostModel",
    "default_batch_limits",
]

Floats = npt.NDArray[np.float64]
Number = TypeVar("Number", float, Floats)


@dataclass(frozen=True, slots=True)
class ModelShape:
    """The architecture numbers that price a token of a decoder-only transformer.

    The first seven fields describe a dense model in one dtype (the catalogue's Llama entries and
    `profile.modelShape`); the rest default to that reading and are set by `model_config` for what a
    checkpoint's `config.json` says beyond it:

    dtype_bytes: bytes of an activation (and of weights and KV unless given below).
    stored_weight_bytes: bytes of the weights as loaded, quantised layers at their format.
    kv_dtype_bytes: bytes of one KV-cache element (vLLM's --kv-cache-dtype).
    kv_planes: vectors cached per KV head and token: K and V (2), or one joint latent (MLA, 1).
    attention_width: FLOPs of attention per (query, key) pair over 4: query heads × (QK + V head
        dimension) / 2; the hidden size for the Llama shapes, where the two are equal.
    active_parameters: parameters one token multiplies through (shared weights and its k experts).
    routed_expert_bytes: bytes of every routed expert, the part of the weights a step reads only
        where some token of the batch was routed.
    experts, experts_per_token: E routed experts per MoE layer and the k each token is sent to.
    gemm_precision: 'bf16', 'fp8' or 'fp4': the format of the GEMMs where the GPU has a unit for it.
    """

    name: str
    parameters: float
    layers: int
    hidden_size: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int = 2
    stored_weight_bytes: float | None = None
    kv_dtype_bytes: int | None = None
    kv_planes: int = 2
    attention_width: int | None = None
    active_parameters: float | None = None
    routed_expert_bytes: float = 0.0
    experts: int = 0
    experts_per_token: int = 0
    gemm_precision: str = "bf16"

    @property
    def weight_bytes(self) -> float:
        if self.stored_weight_bytes is not None:
            return self.stored_weight_bytes
        return self.parameters * self.dtype_bytes

    @property
    def compute_parameters(self) -> float:
        """Parameters a token's GEMMs multiply through: all of them for a dense model."""
        return self.parameters if self.active_parameters is None else self.active_parameters

    @property
    def attention_flops_width(self) -> int:
        return self.hidden_size if self.attention_width is None else self.attention_width

    @property
    def kv_element_bytes(self) -> int:
        return self.dtype_bytes if self.kv_dtype_bytes is None else self.kv_dtype_bytes

    @property
    def expert_skip_probability(self) -> float:
        """Chance that one token's routing leaves a given expert unread: 1 - k/E (1 for dense)."""
        return 1.0 - self.experts_per_token / self.experts if self.experts else 1.0

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V for one token across all layers (vLLM's AttentionSpec, standard attention)."""
        return self.kv_planes * self.layers * self.kv_heads * self.head_dim * self.kv_element_bytes

    def kv_bytes_per_token_per_gpu(self, tensor_parallel: int = 1, pipeline_parallel: int = 1) -> int:
        """KV bytes the fullest GPU of a TP×PP group holds per token.

        vLLM gives each pipeline stage a contiguous share of the layers and each tensor rank
        max(1, kv_heads // TP) heads: heads are replicated, not split, when there are fewer than ranks
        (an MLA latent, one head, is held whole by every rank).
        """
        layers_per_stage = math.ceil(self.layers / pipeline_parallel)
        heads_per_rank = max(1, self.kv_heads // tensor_parallel)
        return self.kv_planes * layers_per_stage * heads_per_rank * self.head_dim * self.kv_element_bytes

    def group_kv_bytes_per_token(self, tensor_parallel: int = 1, pipeline_parallel: int = 1) -> int:
        """GPU memory one token's KV occupies across a whole TP×PP group.

        Equal to `kv_bytes_per_token` unless KV heads are replicated over more tensor ranks than heads.
        """
        heads_per_rank = max(1, self.kv_heads // tensor_parallel)
        return (
            self.kv_planes
            * self.layers
            * heads_per_rank
            * tensor_parallel
            * self.head_dim
            * self.kv_element_bytes
        )


LLAMA_3_1_8B = ModelShape("llama-3.1-8b", 8.03e9, 32, 4096, 8, 128)
LLAMA_3_1_70B = ModelShape("llama-3.1-70b", 70.6e9, 80, 8192, 8, 128)
MODELS: dict[str, ModelShape] = {shape.name: shape for shape in (LLAMA_3_1_8B, LLAMA_3_1_70B)}


@dataclass(frozen=True, slots=True)
class StepCostModel:
    """Per-step cost coefficients of one replica group, in seconds.

    step = fixed + max(weight_read + expert_read · (1 - q^tokens), compute_per_token · tokens)
           + attention_per_unit · Σ p·(h + p/2) + context_read_per_token · Σ decode context
           + per_sequence · sequences + communication,
    with q = 1 - k/E the chance a token leaves an expert unread (module docstring); a dense model
    has no expert read, and its step is the roofline of perf-model §1.1 unchanged.
    Pipeline parallelism splits the layers over stages that run one after another for a step, so
    it adds capacity (KV, weights) but not per-step speed; each stage boundary adds a send.
    """

    fixed_seconds: float
    weight_read_seconds: float
    compute_seconds_per_token: float
    attention_seconds_per_unit: float
    context_read_seconds_per_token: float
    seconds_per_sequence: float
    communication_fixed_seconds: float
    communication_seconds_per_token: float
    kv_capacity_tokens: int
    kv_bytes_per_token: int
    expert_read_seconds: float = 0.0
    expert_skip_probability: float = 1.0

    @classmethod
    def from_hardware(
        cls,
        model: ModelShape,
        gpu: GpuSpec,
        tensor_parallel: int = 1,
        pipeline_parallel: int = 1,
        *,
        gpu_memory_utilization: float = 0.90,
        reserve_bytes_per_gpu: float = 3e9,
        seconds_per_sequence: float = 20e-6,
    ) -> StepCostModel:
        tp, pp = tensor_parallel, pipeline_parallel
        allreduces = 0.0 if tp == 1 else 2.0 * model.layers
        stage_sends = float(pp - 1)
        usable_bytes = tp * pp * (gpu_memory_utilization * gpu.memory_bytes - reserve_bytes_per_gpu)
        kv_bytes_per_token = model.group_kv_bytes_per_token(tp, pp)
        read_bytes_per_second = tp * gpu.memory_bandwidth_bytes_per_second * gpu.bandwidth_efficiency
        gemm_flops = gpu.gemm_flops(model.gemm_precision)
        activation_bytes = model.hidden_size * model.dtype_bytes
        return cls(
            fixed_seconds=126e-6 + 32e-6 * model.layers + stage_sends * gpu.allreduce_latency_seconds,
            weight_read_seconds=(model.weight_bytes - model.routed_expert_bytes) / read_bytes_per_second,
            compute_seconds_per_token=2
            * model.compute_parameters
            / (tp * gemm_flops * gpu.compute_efficiency),
            attention_seconds_per_unit=4
            * model.layers
            * model.attention_flops_width
            / (tp * gpu.flops * gpu.attention_efficiency),
            context_read_seconds_per_token=kv_bytes_per_token / read_bytes_per_second,
            seconds_per_sequence=seconds_per_sequence,
            communication_fixed_seconds=allreduces * gpu.allreduce_latency_seconds,
            communication_seconds_per_token=(allreduces * activation_bytes / gpu.allreduce_bytes_per_second)
            + stage_sends * activation_bytes / gpu.allreduce_bytes_per_second,
            kv_capacity_tokens=max(0, int((usable_bytes - model.weight_bytes) / kv_bytes_per_token)),
            kv_bytes_per_token=kv_bytes_per_token,
            expert_read_seconds=model.routed_expert_bytes / read_bytes_per_second,
            expert_skip_probability=model.expert_skip_probability,
        )

    def weights_read_seconds(self, batch_tokens: float) -> float:
        """Reading the weights a step of `batch_tokens` tokens touches: the shared ones, and the
        experts at least one of its tokens was routed to (all of them past a few hundred tokens)."""
        if self.expert_read_seconds == 0.0:
            return self.weight_read_seconds
        untouched: float = self.expert_skip_probability ** max(batch_tokens, 1.0)
        return self.weight_read_seconds + self.expert_read_seconds * (1.0 - untouched)

    def step_seconds(
        self,
        batch_tokens: float,
        prefill_attention_units: float,
        decode_context_tokens: float,
        sequences: float,
    ) -> float:
        """Duration of one step.

        batch_tokens: new prefill tokens plus one per decoding sequence.
        prefill_attention_units: Σ over prefill chunks of p·(h + p/2), p new tokens, h tokens before them.
        decode_context_tokens: Σ context length of the decoding sequences.
        sequences: sequences in the step (prefill chunks and decodes); steady-state averages may be
        fractional.
        """
        if sequences == 0:
            return 0.0
        linear = max(self.weights_read_seconds(batch_tokens), self.compute_seconds_per_token * batch_tokens)
        return self._step_sum(linear, batch_tokens, prefill_attention_units, decode_context_tokens, sequences)

    def step_seconds_array(
        self,
        batch_tokens: Floats,
        prefill_attention_units: Floats,
        decode_context_tokens: Floats,
        sequences: Floats,
    ) -> Floats:
        """`step_seconds` for many groups at once (the batched fleet engine); 0 where a step is empty.

        The scalar form stays scalar because the event engine calls it on every step with plain
        floats, where numpy's per-call overhead would dominate; both add the same terms, in one order.
        """
        weights: float | Floats = self.weight_read_seconds
        if self.expert_read_seconds != 0.0:
            untouched = np.power(self.expert_skip_probability, np.maximum(batch_tokens, 1.0))
            weights = self.weight_read_seconds + self.expert_read_seconds * (1.0 - untouched)
        linear = np.maximum(weights, self.compute_seconds_per_token * batch_tokens)
        seconds = self._step_sum(
            linear, batch_tokens, prefill_attention_units, decode_context_tokens, sequences
        )
        return np.where(sequences > 0, seconds, 0.0)

    def _step_sum(
        self,
        linear: Number,
        batch_tokens: Number,
        attention_units: Number,
        context: Number,
        sequences: Number,
    ) -> Number:
        """The step's terms added up, the GEMMs' max(weight read, compute) given: plain sums and
        products, in one order for floats and arrays alike."""
        communication = self.communication_fixed_seconds + self.communication_seconds_per_token * batch_tokens
        return (
            self.fixed_seconds
            + linear
            + self.attention_seconds_per_unit * attention_units
            + self.context_read_seconds_per_token * context
            + self.seconds_per_sequence * sequences
            + communication
        )

    def prefill_seconds(self, input_tokens: int, cached_tokens: int = 0) -> float:
        """A request's prefill alone in one step: the TTFT floor of an idle engine."""
        new_tokens = max(0, input_tokens - cached_tokens)
        if new_tokens == 0:
            return self.step_seconds(1, 0.0, cached_tokens, 1)
        units = new_tokens * (cached_tokens + new_tokens / 2)
        return self.step_seconds(new_tokens, units, 0, 1)

    def decode_step_seconds(self, batch_size: int, mean_context_tokens: float) -> float:
        """ITL of a decode-only step with `batch_size` sequences (perf-model §1.6 closed form)."""
        return self.step_seconds(batch_size, 0.0, math.ceil(batch_size * mean_context_tokens), batch_size)


def default_batch_limits(gpu: GpuSpec) -> tuple[int, int]:
    """vLLM 0.33's (max_num_seqs, max_num_batched_tokens) defaults for this GPU."""
    if gpu.memory_gib_reported >= 160:
        return 1024, 16384
    if gpu.memory_gib_reported >= 70 and not gpu.name.startswith("a100"):
        return 1024, 8192
    return 256, 2048
