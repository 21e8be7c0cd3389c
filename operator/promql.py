"""Every PromQL query the operator sends, in one place.

The autoscaler reads one ModelGroup's engine series in a single instant query: one sub-query per
quantity, each tagged with a `goodput_query` label and joined with `or`, so every value of a
snapshot is evaluated by Prometheus at the same instant and one round trip fetches all of them.
Series are aggregated per complete group (`by (group)`): the leader pod of a group exports its
engine's metrics, one series per data-parallel engine.

Label names depend on the user's scrape configuration (a PodMonitor's relabelling), so they are
settings (`SeriesLabels`): by default the ones the project's manifests and local cluster produce,
`namespace`, `model_group` and `group`. Metric names are vLLM 0.33's (vllm-contract §1.2); vLLM's
`num_requests_waiting` includes deferred requests, so the capacity backlog is read from
`num_requests_waiting_by_reason{reason="capacity"}`, falling back to the total on older engines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from enum import StrEnum

QUERY_LABEL = "goodput_query"
"""The label naming which sub-query a returned series answers."""
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


class Quantity(StrEnum):
    """What each sub-query measures, per group. Gauges are instant; the rest cover a window."""

    WAITING = "waiting"
    RUNNING = "running"
    KV_USAGE = "kv_usage"
    SAMPLE_AGE = "sample_age"
    PROMPT_TOKENS_RATE = "prompt_tokens_rate"
    GENERATION_TOKENS_RATE = "generation_tokens_rate"
    PROMPT_TOKENS_SUM = "prompt_tokens_sum"
    PROMPT_TOKENS_COUNT = "prompt_tokens_count"
    GENERATION_TOKENS_SUM = "generation_tokens_sum"
    GENERATION_TOKENS_COUNT = "generation_tokens_count"
    PREFIX_HITS = "prefix_hits"
    PREFIX_QUERIES = "prefix_queries"
    FINISHED = "finished"
    ABORTED = "aborted"
    REJECTED = "rejected"
    TTFT_BUCKETS = "ttft_buckets"
    ITL_BUCKETS = "itl_buckets"
    QUEUE_TIME_BUCKETS = "queue_time_buckets"
    TPOT_BUCKETS = "tpot_buckets"
    PROMPT_TOKENS_BUCKETS = "prompt_tokens_buckets"
    PROMPT_TOKENS_LOOKBACK_BUCKETS = "prompt_tokens_lookback_buckets"


HISTOGRAM_QUANTITIES = frozenset(
    {
        Quantity.TTFT_BUCKETS,
        Quantity.ITL_BUCKETS,
        Quantity.QUEUE_TIME_BUCKETS,
        Quantity.TPOT_BUCKETS,
        Quantity.PROMPT_TOKENS_BUCKETS,
        Quantity.PROMPT_TOKENS_LOOKBACK_BUCKETS,
    }
)
# vLLM's finished_reason values (vllm-contract §1.2): completed requests, and those that were not.
FINISHED_REASONS = "stop|length|repetition"
ABORTED_REASONS = "abort|error"


@dataclass(frozen=True, slots=True)
class SeriesLabels:
    """The label names under which Prometheus stores a pod's namespace, ModelGroup and group."""

    namespace: str = "namespace"
    model_group: str = "model_group"
    group: str = "group"

    def __post_init__(self) -> None:
        for spec in fields(self):
            value = getattr(self, spec.name)
            if not _LABEL_NAME.match(value):
                raise ValueError(f"{value!r} is not a Prometheus label name (label for {spec.name})")


@dataclass(frozen=True, slots=True)
class Windows:
    """rate_seconds: the recent window of token rates and request mix (the arrival rate must follow a
    burst within an interval or two). histogram_seconds: the SLOPolicy's goodput window, over which
    latency histograms, finished, aborted and rejected requests are counted. prompt_lookback_seconds:
    the longer span whose prompt lengths stand in when none finished within the goodput window (never
    shorter than it)."""

    rate_seconds: int
    histogram_seconds: int
    prompt_lookback_seconds: int = 600

    def __post_init__(self) -> None:
        if self.rate_seconds < 1 or self.histogram_seconds < 1:
            raise ValueError("query windows must be at least one second")


def label_value(value: str) -> str:
    """A PromQL string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def model_group_selector(labels: SeriesLabels, namespace: str, model_group: str, extra: str = "") -> str:
    """The series of one ModelGroup's leaders, e.g. `{namespace="ml",model_group="llama"}`."""
    matchers = [
        f"{labels.namespace}={label_value(namespace)}",
        f"{labels.model_group}={label_value(model_group)}",
    ]
    if extra:
        matchers.append(extra)
    return "{" + ",".join(matchers) + "}"


def sub_queries(
    labels: SeriesLabels, namespace: str, model_group: str, windows: Windows
) -> dict[Quantity, str]:
    """One expression per quantity, each aggregated to one series per group (per group and `le` for
    histogram buckets)."""
    selector = model_group_selector(labels, namespace, model_group)
    by_group = f"by ({labels.group})"
    by_bucket = f"by ({labels.group}, le)"
    rate = f"{windows.rate_seconds}s"
    window = f"{windows.histogram_seconds}s"
    lookback = f"{max(windows.prompt_lookback_seconds, windows.histogram_seconds)}s"

    def capacity_waiting() -> str:
        by_reason = model_group_selector(labels, namespace, model_group, 'reason="capacity"')
        return (
            f"sum {by_group} (vllm:num_requests_waiting_by_reason{by_reason}) "
            f"or sum {by_group} (vllm:num_requests_waiting{selector})"
        )

    def increase(metric: str, span: str, extra: str = "") -> str:
        chosen = model_group_selector(labels, namespace, model_group, extra) if extra else selector
        return f"sum {by_group} (increase({metric}{chosen}[{span}]))"

    def rate_of(metric: str) -> str:
        return f"sum {by_group} (rate({metric}{selector}[{rate}]))"

    def buckets(metric: str, span: str = window) -> str:
        return f"sum {by_bucket} (increase({metric}{selector}[{span}]))"

    return {
        Quantity.WAITING: capacity_waiting(),
        Quantity.RUNNING: f"sum {by_group} (vllm:num_requests_running{selector})",
        Quantity.KV_USAGE: f"max {by_group} (vllm:kv_cache_usage_perc{selector})",
        Quantity.SAMPLE_AGE: f"time() - max {by_group} (timestamp(vllm:num_requests_running{selector}))",
        Quantity.PROMPT_TOKENS_RATE: rate_of("vllm:prompt_tokens_total"),
        Quantity.GENERATION_TOKENS_RATE: rate_of("vllm:generation_tokens_total"),
        Quantity.PROMPT_TOKENS_SUM: increase("vllm:request_prompt_tokens_sum", rate),
        Quantity.PROMPT_TOKENS_COUNT: increase("vllm:request_prompt_tokens_count", rate),
        Quantity.GENERATION_TOKENS_SUM: increase("vllm:request_generation_tokens_sum", rate),
        Quantity.GENERATION_TOKENS_COUNT: increase("vllm:request_generation_tokens_count", rate),
        Quantity.PREFIX_HITS: increase("vllm:prefix_cache_hits_total", rate),
        Quantity.PREFIX_QUERIES: increase("vllm:prefix_cache_queries_total", rate),
        Quantity.FINISHED: increase(
            "vllm:request_success_total", window, f'finished_reason=~"{FINISHED_REASONS}"'
        ),
        Quantity.ABORTED: increase(
            "vllm:request_success_total", window, f'finished_reason=~"{ABORTED_REASONS}"'
        ),
        Quantity.REJECTED: increase("vllm:admission_rejections_total", window),
        Quantity.TTFT_BUCKETS: buckets("vllm:time_to_first_token_seconds_bucket"),
        Quantity.ITL_BUCKETS: buckets("vllm:inter_token_latency_seconds_bucket"),
        Quantity.QUEUE_TIME_BUCKETS: buckets("vllm:request_queue_time_seconds_bucket"),
        Quantity.TPOT_BUCKETS: buckets("vllm:request_time_per_output_token_seconds_bucket"),
        # Prompt lengths of the window's finished requests: the infeasible share is read from them.
        Quantity.PROMPT_TOKENS_BUCKETS: buckets("vllm:request_prompt_tokens_bucket"),
        Quantity.PROMPT_TOKENS_LOOKBACK_BUCKETS: buckets("vllm:request_prompt_tokens_bucket", lookback),
    }


def snapshot_query(labels: SeriesLabels, namespace: str, model_group: str, windows: Windows) -> str:
    """Every sub-query in one expression, each series tagged with `goodput_query="<quantity>"`."""
    tagged = [
        f'label_replace({expression}, "{QUERY_LABEL}", "{quantity.value}", "", "")'
        for quantity, expression in sub_queries(labels, namespace, model_group, windows).items()
    ]
    return "\n  or ".join(tagged)
