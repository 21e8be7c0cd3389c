"""vLLM 0.33's `/metrics` for one emulated engine: wire names, types, labels and bucket bounds.

The exposition follows vllm-contract §1.2–§1.5 so that Prometheus, the operator's PromQL and
dashboards cannot tell the emulator from vLLM by shape: counters are registered without `_total`
(prometheus_client adds it and a `_created` sample), every engine metric carries `model_name` and
`engine`, `admission_rejections` carries `model_name` and `reason` only, and `cache_config_info`
carries the cache configuration as labels plus `engine`. The values come from an `EngineSnapshot`
taken at scrape time; a prometheus_client `Collector` turns it into metric families, one
`CollectorRegistry` per emulated server.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from goodput.api import vllm_names as vllm
from goodput.estimators.attainment import Histogram
from goodput.simulator.metrics import (
    ITL_BUCKETS_SECONDS,
    REQUEST_LATENCY_BUCKETS_SECONDS,
    TTFT_BUCKETS_SECONDS,
    HistogramAccumulator,
)

VLLM_VERSION = "0.33.0"
ENGINE_LABELS = ("model_name", "engine")

ITERATION_TOKENS_BUCKETS: tuple[float, ...] = (
    1,
    8,
    16,
    32,
    64,
    128,
    256,
    512,
    1024,
    2048,
    4096,
    8192,
    16384,
)
REQUEST_PARAMS_N_BUCKETS: tuple[float, ...] = (1, 2, 5, 10, 20)
REQUEST_NUM_PREEMPTIONS_BUCKETS: tuple[float, ...] = (1, 2, 3, 4, 5, 10, 20)

VLLM_FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
"""`vllm:request_success_total{finished_reason}` values; every one is exported, zero until it happens."""
ADMISSION_REJECTION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")
WAITING_REASONS = ("capacity", "deferred")
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
CACHED_PROMPT_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")


def request_tokens_buckets(max_model_len: int) -> tuple[float, ...]:
    """vLLM's 1-2-5 series (1, 2, 5, 10, 20, 50, …) up to `max_model_len` tokens."""
    bounds: list[float] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * scale
            if value > max_model_len:
                return tuple(bounds)
            bounds.append(value)
        scale *= 10


@dataclass(frozen=True, slots=True)
class HistogramSpec:
    """One per-request or per-step histogram: its wire name, help text and bucket family."""

    name: str
    documentation: str
    bounds: tuple[float, ...]


def histogram_specs(max_model_len: int) -> tuple[HistogramSpec, ...]:
    """Every histogram vLLM 0.33 exports by default, in its definition order (contract §1.2)."""
    tokens = request_tokens_buckets(max_model_len)
    return (*_request_shape_specs(tokens), *_latency_specs(), *_preemption_and_prefill_specs(tokens))


def _request_shape_specs(tokens: tuple[float, ...]) -> tuple[HistogramSpec, ...]:
    """The request-shape histograms: token counts and sampling parameters, and tokens per step."""
    return (
        HistogramSpec(vllm.REQUEST_PROMPT_TOKENS, "Prompt tokens of each finished request.", tokens),
        HistogramSpec(vllm.REQUEST_GENERATION_TOKENS, "Generated tokens of each finished request.", tokens),
        HistogramSpec(vllm.ITERATION_TOKENS, "Tokens computed per engine step.", ITERATION_TOKENS_BUCKETS),
        HistogramSpec(
            vllm.REQUEST_MAX_NUM_GENERATION_TOKENS, "Most tokens a finished request could generate.", tokens
        ),
        HistogramSpec(
            vllm.REQUEST_PARAMS_N, "The n parameter of each finished request.", REQUEST_PARAMS_N_BUCKETS
        ),
        HistogramSpec(
            vllm.REQUEST_PARAMS_MAX_TOKENS, "The max_tokens parameter of each finished request.", tokens
        ),
    )


def _latency_specs() -> tuple[HistogramSpec, ...]:
    """The latency histograms: first token, token gaps, TPOT, end to end and its phases."""
    return (
        HistogramSpec(
            vllm.TIME_TO_FIRST_TOKEN_SECONDS,
            "Seconds from a request's arrival to its first token.",
            TTFT_BUCKETS_SECONDS,
        ),
        HistogramSpec(
            vllm.INTER_TOKEN_LATENCY_SECONDS,
            "Seconds between successive outputs of a request (one per engine step).",
            ITL_BUCKETS_SECONDS,
        ),
        HistogramSpec(
            vllm.REQUEST_TIME_PER_OUTPUT_TOKEN_SECONDS,
            "Decode seconds per output token after the first, per finished request.",
            ITL_BUCKETS_SECONDS,
        ),
        HistogramSpec(
            vllm.E2E_REQUEST_LATENCY_SECONDS,
            "Seconds from a request's arrival to its last output.",
            REQUEST_LATENCY_BUCKETS_SECONDS,
        ),
        HistogramSpec(
            vllm.REQUEST_QUEUE_TIME_SECONDS,
            "Seconds a request waited before it was first scheduled.",
            REQUEST_LATENCY_BUCKETS_SECONDS,
        ),
        HistogramSpec(
            vllm.REQUEST_INFERENCE_TIME_SECONDS,
            "Seconds from a request's first scheduling to its last token.",
            REQUEST_LATENCY_BUCKETS_SECONDS,
        ),
        HistogramSpec(
            vllm.REQUEST_PREFILL_TIME_SECONDS,
            "Seconds from a request's first scheduling to its first token.",
            REQUEST_LATENCY_BUCKETS_SECONDS,
        ),
        HistogramSpec(
            vllm.REQUEST_DECODE_TIME_SECONDS,
            "Seconds from a request's first token to its last token.",
            REQUEST_LATENCY_BUCKETS_SECONDS,
        ),
    )


def _preemption_and_prefill_specs(tokens: tuple[float, ...]) -> tuple[HistogramSpec, ...]:
    """Preemptions per request, and the prompt tokens actually computed (not cached)."""
    return (
        HistogramSpec(
            vllm.REQUEST_NUM_PREEMPTIONS,
            "Preemptions of each finished request.",
            REQUEST_NUM_PREEMPTIONS_BUCKETS,
        ),
        HistogramSpec(
            vllm.REQUEST_PREFILL_KV_COMPUTED_TOKENS,
            "Prompt tokens computed (not served from the prefix cache) per finished request.",
            tokens,
        ),
    )


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """What `vllm:cache_config_info` publishes: the engine's KV cache shape (contract §1.5)."""

    block_size: int
    num_gpu_blocks: int
    kv_cache_size_tokens: int
    kv_cache_max_concurrency: float
    gpu_memory_utilization: float = 0.92
    enable_prefix_caching: bool = True
    cache_dtype: str = "auto"

    def labels(self) -> dict[str, str]:
        """Every field as a string label, as vLLM renders `CacheConfig.__dict__` (None -> 'None')."""
        return {
            "block_size": str(self.block_size),
            "cache_dtype": self.cache_dtype,
            "enable_prefix_caching": str(self.enable_prefix_caching),
            "gpu_memory_utilization": str(self.gpu_memory_utilization),
            "kv_cache_max_concurrency": str(self.kv_cache_max_concurrency),
            "kv_cache_memory_bytes": "None",
            "kv_cache_size_tokens": str(self.kv_cache_size_tokens),
            "num_cpu_blocks": "None",
            "num_gpu_blocks": str(self.num_gpu_blocks),
            "num_gpu_blocks_override": "None",
            "prefix_caching_hash_algo": "sha256",
            "sliding_window": "None",
        }


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    """One engine's metric values at one scrape. Counters are cumulative since the engine started."""

    model_name: str
    engine_index: str
    started_unix_seconds: float
    num_requests_running: int
    num_requests_waiting: int
    kv_cache_usage_perc: float
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_preemptions: int
    prompt_tokens: int
    prompt_tokens_cached: int
    generation_tokens: int
    request_success: Mapping[str, int]
    admission_rejections: Mapping[str, int]
    histograms: Mapping[str, Histogram]
    cache_config: CacheConfig
    awake: bool = True


class _Families:
    """Metric families of one engine, labelled and timestamped as vLLM does, in the order added."""

    def __init__(self, snapshot: EngineSnapshot) -> None:
        self.engine = [snapshot.model_name, snapshot.engine_index]
        self.created = snapshot.started_unix_seconds
        self.families: list[Metric] = []

    def gauge(self, name: str, documentation: str, value: float) -> None:
        family = GaugeMetricFamily(name, documentation, labels=ENGINE_LABELS)
        family.add_metric(self.engine, value)
        self.families.append(family)

    def labelled_gauge(self, name: str, documentation: str, label: str, values: Mapping[str, float]) -> None:
        family = GaugeMetricFamily(name, documentation, labels=[*ENGINE_LABELS, label])
        for key, value in values.items():
            family.add_metric([*self.engine, key], value)
        self.families.append(family)

    def counter(self, name: str, documentation: str, value: float) -> None:
        family = CounterMetricFamily(name, documentation, labels=ENGINE_LABELS)
        family.add_metric(self.engine, value, created=self.created)
        self.families.append(family)

    def labelled_counter(
        self, name: str, documentation: str, label: str, values: Mapping[str, float]
    ) -> None:
        family = CounterMetricFamily(name, documentation, labels=[*ENGINE_LABELS, label])
        for key, value in values.items():
            family.add_metric([*self.engine, key], value, created=self.created)
        self.families.append(family)


def metric_families(snapshot: EngineSnapshot, specs: Iterable[HistogramSpec]) -> list[Metric]:
    """The snapshot as prometheus_client metric families with vLLM's names, types and labels."""
    out = _Families(snapshot)
    _scheduler_gauges(out, snapshot)
    _cache_counters(out, snapshot)
    _token_counters(out, snapshot)
    rejections = CounterMetricFamily(
        vllm.ADMISSION_REJECTIONS,
        "Requests rejected at admission (HTTP 503).",
        labels=["model_name", "reason"],
    )
    for reason in ADMISSION_REJECTION_REASONS:
        rejections.add_metric(
            [snapshot.model_name, reason], snapshot.admission_rejections.get(reason, 0), created=out.created
        )
    out.families.append(rejections)
    for spec in specs:
        histogram = snapshot.histograms.get(spec.name) or HistogramAccumulator(spec.bounds).snapshot()
        out.families.append(_histogram_family(spec, histogram, out.engine, out.created))
    cache_labels = snapshot.cache_config.labels()
    info = GaugeMetricFamily(
        vllm.CACHE_CONFIG_INFO, "The engine's KV-cache configuration.", labels=[*cache_labels, "engine"]
    )
    info.add_metric([*cache_labels.values(), snapshot.engine_index], 1.0)
    out.families.append(info)
    return out.families


def _scheduler_gauges(out: _Families, snapshot: EngineSnapshot) -> None:
    """The scheduler's state: running and waiting requests, sleep state, KV-cache use."""
    out.gauge(
        vllm.NUM_REQUESTS_RUNNING, "Requests in the engine's running batch.", snapshot.num_requests_running
    )
    out.gauge(
        vllm.NUM_REQUESTS_WAITING,
        "Requests waiting to be scheduled (waiting for capacity plus deferred).",
        snapshot.num_requests_waiting,
    )
    out.labelled_gauge(
        vllm.NUM_REQUESTS_WAITING_BY_REASON,
        "Waiting requests by why they wait.",
        "reason",
        {"capacity": snapshot.num_requests_waiting, "deferred": 0},
    )
    out.labelled_gauge(
        vllm.ENGINE_SLEEP_STATE,
        "Engine sleep state: 1 for the current state.",
        "sleep_state",
        {state: float(snapshot.awake if state == "awake" else False) for state in SLEEP_STATES},
    )
    out.gauge(
        vllm.KV_CACHE_USAGE_PERC,
        "Fraction of KV-cache blocks held by live requests (1 = full).",
        snapshot.kv_cache_usage_perc,
    )


def _cache_counters(out: _Families, snapshot: EngineSnapshot) -> None:
    """Prefix and multimodal cache lookups and hits, and preemptions."""
    out.counter(vllm.PREFIX_CACHE_QUERIES, "Prefix-cache lookups, in tokens.", snapshot.prefix_cache_queries)
    out.counter(vllm.PREFIX_CACHE_HITS, "Prefix-cache hits, in tokens.", snapshot.prefix_cache_hits)
    out.counter(vllm.EXTERNAL_PREFIX_CACHE_QUERIES, "External prefix-cache lookups, in tokens.", 0)
    out.counter(vllm.EXTERNAL_PREFIX_CACHE_HITS, "External prefix-cache hits, in tokens.", 0)
    out.counter(vllm.MM_CACHE_QUERIES, "Multimodal cache lookups, in items.", 0)
    out.counter(vllm.MM_CACHE_HITS, "Multimodal cache hits, in items.", 0)
    out.counter(vllm.NUM_PREEMPTIONS, "Preemptions of running requests.", snapshot.num_preemptions)


def _token_counters(out: _Families, snapshot: EngineSnapshot) -> None:
    """Prompt tokens by source, generated tokens, and finished requests by reason."""
    out.counter(
        vllm.PROMPT_TOKENS,
        "Prompt tokens of requests that produced their first token.",
        snapshot.prompt_tokens,
    )
    out.labelled_counter(
        vllm.PROMPT_TOKENS_BY_SOURCE,
        "Prompt tokens by where their KV came from.",
        "source",
        {
            "local_compute": snapshot.prompt_tokens - snapshot.prompt_tokens_cached,
            "local_cache_hit": snapshot.prompt_tokens_cached,
            "external_kv_transfer": 0,
        },
    )
    out.counter(
        vllm.PROMPT_TOKENS_CACHED, "Prompt tokens served from a cache.", snapshot.prompt_tokens_cached
    )
    out.labelled_counter(
        vllm.PROMPT_TOKENS_CACHED_BY_SOURCE,
        "Cached prompt tokens by cache tier.",
        "source",
        {
            source: snapshot.prompt_tokens_cached if source == "device" else 0
            for source in CACHED_PROMPT_SOURCES
        },
    )
    out.counter(vllm.GENERATION_TOKENS, "Generated tokens.", snapshot.generation_tokens)
    out.labelled_counter(
        vllm.REQUEST_SUCCESS,
        "Finished requests by finish reason.",
        "finished_reason",
        {reason: snapshot.request_success.get(reason, 0) for reason in VLLM_FINISHED_REASONS},
    )


def bucket_label(bound: float) -> str:
    """The `le` label of a finite bucket bound as prometheus_client writes it ('1.0', '0.001')."""
    return repr(float(bound))


def _histogram_family(
    spec: HistogramSpec, histogram: Histogram, labels: list[str], created: float
) -> HistogramMetricFamily:
    if histogram.upper_bounds != spec.bounds:
        raise ValueError(f"{spec.name}: histogram bounds {histogram.upper_bounds} differ from the contract's")
    buckets = [
        (bucket_label(bound), float(count))
        for bound, count in zip(spec.bounds, histogram.cumulative_counts, strict=False)
    ]
    buckets.append(("+Inf", float(histogram.total)))
    family = HistogramMetricFamily(spec.name, spec.documentation, labels=ENGINE_LABELS)
    family.add_metric(labels, buckets, histogram.sum)
    family.samples.append(
        Sample(f"{spec.name}_created", dict(zip(ENGINE_LABELS, labels, strict=True)), created)
    )
    return family


class SnapshotCollector(Collector):
    """A prometheus_client collector that reads one engine's snapshot at each scrape."""

    def __init__(self, snapshot: Callable[[], EngineSnapshot], specs: tuple[HistogramSpec, ...]) -> None:
        self._snapshot = snapshot
        self._specs = specs

    def collect(self) -> Iterable[Metric]:
        return metric_families(self._snapshot(), self._specs)


def engine_registry(collector: SnapshotCollector) -> CollectorRegistry:
    """A registry of its own for one emulated server (vLLM has one per API process)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry
