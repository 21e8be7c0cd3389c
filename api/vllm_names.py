"""vLLM's metric names, spelled once: every reader (the operator's PromQL, its leader probe and
doctor, the in-pod agent) and every writer (the simulator's and the emulator's `/metrics`) imports
them from here, so a rename in vLLM is one edit and a typo cannot exist in one program only.

Each constant is a metric family's name as vLLM declares it (vLLM 0.33, the vLLM metrics contract).
prometheus_client writes a counter's samples with `_total` and a histogram's with `_bucket`,
`_sum` and `_count`: readers of the exposition or of Prometheus use `total()`, `bucket()`,
`summed()` and `counted()` rather than spelling the suffixed name. `vllm:iteration_tokens_total` is
a histogram whose family name itself ends in `_total`.

The LoRA flags, environment variable and runtime API paths are spelled here too, for the operator
that renders them, the gateway that calls them and the emulator that serves them.

This module imports nothing, so the agent (installed inside the vLLM image with loose pins) may
import it.
"""

from __future__ import annotations

from typing import Final

# Gauges.
NUM_REQUESTS_RUNNING: Final = "vllm:num_requests_running"
"""Requests in the engine's running batch; every leader exports it while it serves."""
NUM_REQUESTS_WAITING: Final = "vllm:num_requests_waiting"
NUM_REQUESTS_WAITING_BY_REASON: Final = "vllm:num_requests_waiting_by_reason"
"""Waiting requests by `reason`: 'capacity' (the backlog the autoscaler reads) or 'deferred'."""
KV_CACHE_USAGE_PERC: Final = "vllm:kv_cache_usage_perc"
"""Fraction of KV-cache blocks in use, 0..1 despite its name."""
ENGINE_SLEEP_STATE: Final = "vllm:engine_sleep_state"
CACHE_CONFIG_INFO: Final = "vllm:cache_config_info"

# Counters (family names; the samples end in `_total`).
PREFIX_CACHE_QUERIES: Final = "vllm:prefix_cache_queries"
PREFIX_CACHE_HITS: Final = "vllm:prefix_cache_hits"
EXTERNAL_PREFIX_CACHE_QUERIES: Final = "vllm:external_prefix_cache_queries"
EXTERNAL_PREFIX_CACHE_HITS: Final = "vllm:external_prefix_cache_hits"
MM_CACHE_QUERIES: Final = "vllm:mm_cache_queries"
MM_CACHE_HITS: Final = "vllm:mm_cache_hits"
NUM_PREEMPTIONS: Final = "vllm:num_preemptions"
PROMPT_TOKENS: Final = "vllm:prompt_tokens"
"""Prompt tokens, counted when the request's first token comes."""
PROMPT_TOKENS_BY_SOURCE: Final = "vllm:prompt_tokens_by_source"
PROMPT_TOKENS_CACHED: Final = "vllm:prompt_tokens_cached"
PROMPT_TOKENS_CACHED_BY_SOURCE: Final = "vllm:prompt_tokens_cached_by_source"
GENERATION_TOKENS: Final = "vllm:generation_tokens"
REQUEST_SUCCESS: Final = "vllm:request_success"
"""Finished requests by `finished_reason` (stop, length, abort, error, repetition)."""
ADMISSION_REJECTIONS: Final = "vllm:admission_rejections"

# Histograms (family names; the samples end in `_bucket`, `_sum` and `_count`).
REQUEST_PROMPT_TOKENS: Final = "vllm:request_prompt_tokens"
REQUEST_GENERATION_TOKENS: Final = "vllm:request_generation_tokens"
ITERATION_TOKENS: Final = "vllm:iteration_tokens_total"
REQUEST_MAX_NUM_GENERATION_TOKENS: Final = "vllm:request_max_num_generation_tokens"
REQUEST_PARAMS_N: Final = "vllm:request_params_n"
REQUEST_PARAMS_MAX_TOKENS: Final = "vllm:request_params_max_tokens"
TIME_TO_FIRST_TOKEN_SECONDS: Final = "vllm:time_to_first_token_seconds"
INTER_TOKEN_LATENCY_SECONDS: Final = "vllm:inter_token_latency_seconds"
REQUEST_TIME_PER_OUTPUT_TOKEN_SECONDS: Final = "vllm:request_time_per_output_token_seconds"
E2E_REQUEST_LATENCY_SECONDS: Final = "vllm:e2e_request_latency_seconds"
REQUEST_QUEUE_TIME_SECONDS: Final = "vllm:request_queue_time_seconds"
REQUEST_INFERENCE_TIME_SECONDS: Final = "vllm:request_inference_time_seconds"
REQUEST_PREFILL_TIME_SECONDS: Final = "vllm:request_prefill_time_seconds"
REQUEST_DECODE_TIME_SECONDS: Final = "vllm:request_decode_time_seconds"
REQUEST_NUM_PREEMPTIONS: Final = "vllm:request_num_preemptions"
REQUEST_PREFILL_KV_COMPUTED_TOKENS: Final = "vllm:request_prefill_kv_computed_tokens"


class Lora:
    """LoRA adapters (vLLM's `docs/features/lora.md`, `vllm/config/lora.py`): the engine flags the
    operator renders, the variable that opens the runtime adapter API, and that API's paths. Kept
    in a class of their own: the module's plain constants are metric names."""

    ENABLE_FLAG: Final = "--enable-lora"
    MAX_LORAS_FLAG: Final = "--max-loras"
    MAX_RANK_FLAG: Final = "--max-lora-rank"
    MAX_CPU_LORAS_FLAG: Final = "--max-cpu-loras"
    RUNTIME_UPDATING_ENV: Final = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
    LOAD_PATH: Final = "/v1/load_lora_adapter"
    """POST {"lora_name", "lora_path"}: 200 with a plain-text success line, 400/404 with the reason."""
    UNLOAD_PATH: Final = "/v1/unload_lora_adapter"
    """POST {"lora_name"}: 200, or 404 when the adapter is not loaded."""


class KvOffloading:
    """KV offloading to CPU memory (`vllm/config/cache.py`, vLLM 0.14 or later): the size in GiB
    across an engine's tensor-parallel ranks (unset: off), and the connector that does it."""

    SIZE_FLAG: Final = "--kv-offloading-size"
    BACKEND_FLAG: Final = "--kv-offloading-backend"


def total(counter: str) -> str:
    """A counter's sample name, as scraped and stored by Prometheus."""
    return f"{counter}_total"


def bucket(histogram: str) -> str:
    """A histogram's cumulative bucket series (labelled `le`)."""
    return f"{histogram}_bucket"


def summed(histogram: str) -> str:
    """A histogram's sum of observations."""
    return f"{histogram}_sum"


def counted(histogram: str) -> str:
    """A histogram's count of observations."""
    return f"{histogram}_count"
