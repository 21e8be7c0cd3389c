"""Published vLLM throughput and latency figures, with the settings to replay each one.

Each point names its source, the model (as the fields of its config.json that price it), the
accelerator, the parallelism and what the benchmark sent; `model_figures` replays it on the
service-time model (`replay.replay`) and `error` compares. The service-time model is not fitted to
any of them: every accelerator is priced from its datasheet with the efficiencies of perf-model
§1.2, and a point it misses is kept here, marked `reproduced=False` with the reason, rather than
tuned away. `bench/bench_service_time.py` prints the comparison; `tests/test_service_time_published.py`
holds the model to it.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from goodput.estimators.accelerators import GPUS
from goodput.estimators.model_config import model_shape, parse_model_config
from goodput.estimators.service_time import StepCostModel
from goodput.simulator.engine import EngineConfig
from goodput.simulator.replay import BenchmarkRun, ReplayResult, replay

TOLERANCE = 0.25

# The config.json fields that price each model, as the checkpoints on Hugging Face publish them.
LLAMA_3_8B: Mapping[str, Any] = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
}
LLAMA_3_70B: Mapping[str, Any] = {
    **LLAMA_3_8B,
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
}
LLAMA_3_405B: Mapping[str, Any] = {
    **LLAMA_3_8B,
    "hidden_size": 16384,
    "intermediate_size": 53248,
    "num_hidden_layers": 126,
    "num_attention_heads": 128,
}
QWEN3_30B_A3B: Mapping[str, Any] = {
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
FP8: Mapping[str, Any] = {"quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}}


@dataclass(frozen=True, slots=True)
class Figures:
    """A benchmark's figures; None where the source gives none."""

    output_tokens_per_second: float | None = None
    requests_per_second: float | None = None
    tpot_seconds: float | None = None
    ttft_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class PublishedPoint:
    """One published figure and everything needed to replay it.

    compared: the figures held to `TOLERANCE` (the others are printed beside them).
    kv_capacity_tokens: the KV cache the replay gives the engine; None: the model's own estimate.
    reproduced: whether the model meets the tolerance on every compared figure; `why_not` says
        what the model leaves out where it does not.
    """

    key: str
    model: str
    gpu: str
    tensor_parallel: int
    config: Mapping[str, Any]
    run: BenchmarkRun
    published: Figures
    compared: tuple[str, ...]
    source: str
    settings: str
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_cache_bytes: int = 2
    kv_capacity_tokens: int | None = None
    reproduced: bool = True
    why_not: str = ""

    def engine(self) -> EngineConfig:
        shape = model_shape(parse_model_config(self.config), self.model, kv_cache_bytes=self.kv_cache_bytes)
        cost = StepCostModel.from_hardware(shape, GPUS[self.gpu], self.tensor_parallel)
        kv_tokens = cost.kv_capacity_tokens if self.kv_capacity_tokens is None else self.kv_capacity_tokens
        return EngineConfig(
            cost=cost,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            kv_capacity_tokens=kv_tokens,
        )


def model_figures(point: PublishedPoint) -> ReplayResult:
    return replay(point.engine(), point.run)


def modelled(result: ReplayResult, figure: str) -> float:
    figures: dict[str, float] = {
        "output_tokens_per_second": result.output_tokens_per_second,
        "requests_per_second": result.requests_per_second,
        "tpot_seconds": result.mean_tpot_seconds,
        "ttft_seconds": result.mean_ttft_seconds,
    }
    return figures[figure]


def error(point: PublishedPoint, result: ReplayResult, figure: str) -> float:
    """(modelled - published) / published for one figure of a point."""
    published: float | None = getattr(point.published, figure)
    if published is None:
        raise ValueError(f"{point.key}: the source gives no {figure}")
    return (modelled(result, figure) - published) / published


def worst_error(point: PublishedPoint, result: ReplayResult) -> float:
    """The compared figure furthest from the published one, signed."""
    return max((error(point, result, figure) for figure in point.compared), key=abs)


def median_absolute_error(errors: list[float]) -> float:
    return statistics.median(abs(e) for e in errors)


# ShareGPT as vLLM's benchmark samples it: 202 input and 179 output tokens on average
# (vllm-project.github.io _posts/2024-09-05-perf-update.md, 500 prompts).
SHAREGPT_INPUT, SHAREGPT_OUTPUT = 202, 179
# MLPerf Inference v5.1's Llama 3.1 8B task: 13,368 CNN/DailyMail articles to summarise, at most 128
# output tokens (mlcommons/inference#2256), 114 on average (mlcommons/inference#2341: 1,264.46
# tokens/s over 11.07 samples/s). The input length is not published; the articles average 781
# words (See et al., 2017), about 1,000 Llama 3 tokens with the prompt template [estimate].
MLPERF_INPUT, MLPERF_OUTPUT, MLPERF_SAMPLES = 1000, 114, 13368

LAMBDA_70B_FP8_RUN = BenchmarkRun(
    input_tokens=(12, 24, 26, 9, 28, 204, 15),
    output_tokens=(119, 769, 232, 193, 740, 79, 391),
)

POINTS: tuple[PublishedPoint, ...] = (
    PublishedPoint(
        key="llama-3.1-70b-fp8/h100/lambda",
        model="neuralmagic/Meta-Llama-3.1-70B-Instruct-FP8",
        gpu="h100-80g",
        tensor_parallel=1,
        config={**LLAMA_3_70B, **FP8},
        run=LAMBDA_70B_FP8_RUN,
        published=Figures(output_tokens_per_second=100.03, tpot_seconds=0.03311, ttft_seconds=0.155),
        compared=("output_tokens_per_second", "tpot_seconds"),
        source="LambdaLabsML/vllm-benchmark results/prompt_10/1xH100-80GB-SXM/"
        "Meta-Llama-3.1-70B-Instruct-FP8_tp1_len2000.json (vLLM 0.5.4, Aug 2024)",
        settings="10 ShareGPT prompts at request rate inf, max-len 2000; the 7 that produced tokens are "
        "replayed with their recorded lengths (the file's mean TTFT also averages in the 3 that did not)",
        max_num_seqs=256,
        max_num_batched_tokens=2048,
        # 72.7 GB of weights leave ~4 GB of an H100's 79.6 GiB at vLLM's 0.9; the 80e9-byte H100 of
        # the calculator leaves none. The run held every request at once, so the replay does too.
        kv_capacity_tokens=8192,
    ),
    PublishedPoint(
        key="qwen3-30b-a3b/h100/vllm#23151",
        model="Qwen/Qwen3-30B-A3B",
        gpu="h100-80g",
        tensor_parallel=1,
        config=QWEN3_30B_A3B,
        run=BenchmarkRun.uniform(100, 2048, 1024, concurrency=10),
        published=Figures(output_tokens_per_second=740.0, tpot_seconds=0.0132, ttft_seconds=0.267),
        compared=("output_tokens_per_second", "tpot_seconds"),
        source="vllm-project/vllm PR #23151 (BF16, 1xH100, TP1)",
        settings="random dataset, 2048 input and 1024 output tokens, 10 concurrent clients; 100 prompts "
        "(the PR does not say how many), vLLM's H100 batch defaults",
        max_num_seqs=1024,
        max_num_batched_tokens=8192,
    ),
    PublishedPoint(
        key="llama-3.1-8b-fp8/h100/mlperf-v5.1",
        model="RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8",
        gpu="h100-80g",
        tensor_parallel=1,
        config={**LLAMA_3_8B, **FP8},
        run=BenchmarkRun.uniform(MLPERF_SAMPLES, MLPERF_INPUT, MLPERF_OUTPUT),
        published=Figures(output_tokens_per_second=5777.0),
        compared=("output_tokens_per_second",),
        source="Red Hat blog 'Efficient and reproducible LLM inference: Red Hat MLPerf Inference v5.1 "
        "results' (vLLM 0.10.0, Offline scenario)",
        settings=f"Offline: all {MLPERF_SAMPLES:,} samples sent at once, {MLPERF_INPUT} input [estimate] and "
        f"{MLPERF_OUTPUT} output tokens each, KV cache in BF16 "
        "(vLLM's default; the post names FP8 for the weights only), vLLM's H100 batch defaults",
        max_num_seqs=1024,
        max_num_batched_tokens=8192,
    ),
    PublishedPoint(
        key="llama-3.1-8b-fp8/l40s/mlperf-v5.1",
        model="RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8",
        gpu="l40s",
        tensor_parallel=1,
        config={**LLAMA_3_8B, **FP8},
        run=BenchmarkRun.uniform(MLPERF_SAMPLES, MLPERF_INPUT, MLPERF_OUTPUT),
        published=Figures(output_tokens_per_second=1642.0),
        compared=("output_tokens_per_second",),
        source="Red Hat blog 'Efficient and reproducible LLM inference: Red Hat MLPerf Inference v5.1 "
        "results' (vLLM 0.10.0, Offline scenario)",
        settings="as the H100 point, on one L40S with vLLM's batch defaults for it",
        max_num_seqs=256,
        max_num_batched_tokens=2048,
    ),
    PublishedPoint(
        key="llama-3-8b/h100/vllm-blog-light-load",
        model="meta-llama/Meta-Llama-3-8B-Instruct",
        gpu="h100-80g",
        tensor_parallel=1,
        config=LLAMA_3_8B,
        run=BenchmarkRun.uniform(10, SHAREGPT_INPUT, SHAREGPT_OUTPUT, concurrency=1),
        published=Figures(tpot_seconds=0.013),
        compared=("tpot_seconds",),
        source="vllm-project.github.io _posts/2024-09-05-perf-update.md ('Llama3 8B can generate 1 token "
        "every 13 ms under light load', vLLM before 0.6.0)",
        settings="one request at a time (light load) of ShareGPT's average lengths",
        max_num_seqs=256,
        max_num_batched_tokens=2048,
        reproduced=False,
        why_not="the figure is of vLLM before 0.6.0, whose CPU work (HTTP server, scheduling, input "
        "preparation) took 62 % of the time on this model and GPU (the same post); the model prices the "
        "GPU's work, which 0.6.0 brought to the fore",
    ),
    *(
        PublishedPoint(
            key=f"qwen3-30b-a3b-fp8/mi300x/vllm#17530/{isl}-{osl}",
            model="Qwen/Qwen3-30B-A3B-FP8",
            gpu="mi300x",
            tensor_parallel=1,
            config={**QWEN3_30B_A3B, **FP8},
            run=BenchmarkRun.uniform(200, isl, osl),
            published=Figures(output_tokens_per_second=published),
            compared=("output_tokens_per_second",),
            source="vllm-project/vllm PR #17530 (1xMI300X, TP1, tuned fused-MoE configurations)",
            settings=f"offline, 200 prompts of {isl} input and {osl} output tokens sent at once; 256 "
            "sequences and 16,384 tokens per step",
            max_num_seqs=256,
            max_num_batched_tokens=16384,
            reproduced=False,
            why_not="the model prices the MI300X's datasheet with the efficiencies measured on the "
            "H100, and vLLM on the MI300X reached less than half of that here; no public measurement of "
            "vLLM's efficiencies on the MI300X exists to price it better: measure "
            "capacityWorkSecondsPerSecond with a benchmark instead",
        )
        for isl, osl, published in ((1000, 2000, 4337.0), (5000, 1000, 1925.0), (10000, 500, 679.0))
    ),
    PublishedPoint(
        key="llama-3.1-405b/8xmi300x/vllm-blog",
        model="meta-llama/Llama-3.1-405B-Instruct",
        gpu="mi300x",
        tensor_parallel=8,
        config=LLAMA_3_405B,
        run=BenchmarkRun.uniform(1000, SHAREGPT_INPUT, SHAREGPT_OUTPUT),
        published=Figures(requests_per_second=5.76),
        compared=("requests_per_second",),
        source="vllm-project.github.io _posts/2024-10-23-vllm-serving-amd.md (FP16, TP8, optimised "
        "settings, vLLM 0.6 on ROCm 6.2)",
        settings="1,000 ShareGPT prompts at 1000 QPS (all at once), ShareGPT's average lengths, 512 "
        "sequences, chunked prefill off",
        max_num_seqs=512,
        max_num_batched_tokens=8192,
        reproduced=False,
        why_not="as for the MI300X MoE point: vLLM on ROCm (2024) reached well under half the datasheet "
        "roofline the model assumes with the H100's efficiencies",
    ),
)
