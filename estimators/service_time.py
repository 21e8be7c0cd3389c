"""The service-time model of one vLLM engine step, shared by the autoscaler and the simulator.

One continuous-batching step costs a fixed overhead, the GEMMs (memory- or compute-bound), prefill
attention, the KV read of decodes, a per-sequence overhead and the tensor-parallel all-reduces
(reference: perf-model §1). The coefficients are folded once per (model, GPU, parallelism) into a
`StepCostModel`, so a step costs a handful of multiply-adds: the simulator calls it on every step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float64]
Number = TypeVar("Number", float, Floats)


@dataclass(frozen=True, slots=True)
class ModelShape:
    """The architecture numbers that price a token; dense decoder-only transformer."""

    name: str
    parameters: float
    layers: int
    hidden_size: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int = 2

    @property
    def weight_bytes(self) -> float:
        return self.parameters * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V for one token across all layers (vLLM's AttentionSpec, standard attention)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    def kv_bytes_per_token_per_gpu(self, tensor_parallel: int = 1, pipeline_parallel: int = 1) -> int:
        """KV bytes the fullest GPU of a TP×PP group holds per token.

        vLLM gives each pipeline stage a contiguous share of the layers and each tensor rank
        max(1, kv_heads // TP) heads: heads are replicated, not split, when there are fewer than ranks.
        """
        layers_per_stage = math.ceil(self.layers / pipeline_parallel)
        heads_per_rank = max(1, self.kv_heads // tensor_parallel)
        return 2 * layers_per_stage * heads_per_rank * self.head_dim * self.dtype_bytes

    def group_kv_bytes_per_token(self, tensor_parallel: int = 1, pipeline_parallel: int = 1) -> int:
        """GPU memory one token's KV occupies across a whole TP×PP group.

        Equal to `kv_bytes_per_token` unless KV heads are replicated over more tensor ranks than heads.
        """
        heads_per_rank = max(1, self.kv_heads // tensor_parallel)
        return 2 * self.layers * heads_per_rank * tensor_parallel * self.head_dim * self.dtype_bytes


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """Peak figures and achieved efficiencies of one accelerator."""

    name: str
    flops: float
    memory_bandwidth_bytes_per_second: float
    memory_bytes: float
    compute_efficiency: float
    attention_efficiency: float
    bandwidth_efficiency: float
    allreduce_latency_seconds: float
    allreduce_bytes_per_second: float
    memory_gib_reported: float


LLAMA_3_1_8B = ModelShape("llama-3.1-8b", 8.03e9, 32, 4096, 8, 128)
LLAMA_3_1_70B = ModelShape("llama-3.1-70b", 70.6e9, 80, 8192, 8, 128)
MODELS: dict[str, ModelShape] = {shape.name: shape for shape in (LLAMA_3_1_8B, LLAMA_3_1_70B)}

A100_80G = GpuSpec("a100-80g", 312e12, 2.039e12, 80e9, 0.70, 0.45, 0.80, 25e-6, 100e9, 80.0)
H100_80G = GpuSpec("h100-80g", 989e12, 3.35e12, 80e9, 0.65, 0.45, 0.80, 18e-6, 200e9, 79.6)
GPUS: dict[str, GpuSpec] = {gpu.name: gpu for gpu in (A100_80G, H100_80G)}


@dataclass(frozen=True, slots=True)
class StepCostModel:
    """Per-step cost coefficients of one replica group, in seconds.

    step = fixed + max(weight_read, compute_per_token · tokens) + attention_per_unit · Σ p·(h + p/2)
           + context_read_per_token · Σ decode context + per_sequence · sequences + communication.
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
        gpus = tp * pp
        allreduces = 0.0 if tp == 1 else 2.0 * model.layers
        stage_sends = float(pp - 1)
        usable_bytes = gpus * (gpu_memory_utilization * gpu.memory_bytes - reserve_bytes_per_gpu)
        kv_bytes_per_token = model.group_kv_bytes_per_token(tp, pp)
        return cls(
            fixed_seconds=126e-6 + 32e-6 * model.layers + stage_sends * gpu.allreduce_latency_seconds,
            weight_read_seconds=model.weight_bytes
            / (tp * gpu.memory_bandwidth_bytes_per_second * gpu.bandwidth_efficiency),
            compute_seconds_per_token=2 * model.parameters / (tp * gpu.flops * gpu.compute_efficiency),
            attention_seconds_per_unit=4
            * model.layers
            * model.hidden_size
            / (tp * gpu.flops * gpu.attention_efficiency),
            context_read_seconds_per_token=kv_bytes_per_token
            / (tp * gpu.memory_bandwidth_bytes_per_second * gpu.bandwidth_efficiency),
            seconds_per_sequence=seconds_per_sequence,
            communication_fixed_seconds=allreduces * gpu.allreduce_latency_seconds,
            communication_seconds_per_token=(
                allreduces * model.hidden_size * model.dtype_bytes / gpu.allreduce_bytes_per_second
            )
            + stage_sends * model.hidden_size * model.dtype_bytes / gpu.allreduce_bytes_per_second,
            kv_capacity_tokens=max(0, int((usable_bytes - model.weight_bytes) / kv_bytes_per_token)),
            kv_bytes_per_token=kv_bytes_per_token,
        )

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
        linear = max(self.weight_read_seconds, self.compute_seconds_per_token * batch_tokens)
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
        linear = np.maximum(self.weight_read_seconds, self.compute_seconds_per_token * batch_tokens)
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
