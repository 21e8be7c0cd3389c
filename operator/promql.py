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

When a gateway fronts the ModelGroup, its series (`goodput_gateway_*`) answer in the same query,
aggregated per SLO class (`gateway_sub_queries`); their presence is how the operator knows there is
a gateway (DESIGN §6 step 2: its exact figures then replace what is inferred from engines).

At fleet size one query per ModelGroup per interval is a thousand queries; `fleet_snapshot_query`
asks the same sub-queries once for every ModelGroup (the series keep their namespace and
ModelGroup labels: `by (namespace, model_group, group)`), so the operator sends one query per
query shape (the windows) per interval. A `Scope` is what tells the two apart: the selector's
matchers and the labels every aggregation keeps beside its own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from enum import StrEnum

from goodput.api import vllm_names as vllm

QUERY_LABEL = "goodput_query"
"""The label naming which sub-query a returned series answers."""
RUNNING_METRIC = vllm.NUM_REQUESTS_RUNNING
"""The engine gauge every leader exports while it serves: its sample age is the snapshot's age."""
POD_LABEL = "pod"
"""The label a pod scrape (a PodMonitor, the local cluster's) puts the pod's name under."""
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


class QueryQuantity(StrEnum):
    """What each sub-query measures, per group. Gauges are instant; the rest cover a window."""

    WAITING = "waiting"
    RUNNING = "running"
    KV_USAGE = "kv_usage"
    SAMPLE_AGE = "sample_age"
    PROMPT_TOKENS_RATE = "prompt_tokens_rate"
    GENERATION_TOKENS_RATE = "generation_tokens_rate"
    PROMPT_TOKENS_SUM = "prompt_tokens_sum"
    PROMPT_TOKENS_COUNT = "prompt_tokens_count"
    PROMPTS_STARTED = "prompts_started"
    PROMPT_TOKENS_STARTED = "prompt_tokens_started"
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
    # The gateway's series (`gateway/metrics.py`): per SLO class, or for the whole ModelGroup.
    GATEWAY_SAMPLE_AGE = "gateway_sample_age"
    GATEWAY_RUNNING_REQUESTS = "gateway_running_requests"
    GATEWAY_RUNNING_WORK = "gateway_running_work"
    GATEWAY_ROUTABLE_GROUPS = "gateway_routable_groups"
    GATEWAY_KEPT_SESSION_KV = "gateway_kept_session_kv"
    GATEWAY_QUEUED_REQUESTS = "gateway_queued_requests"
    GATEWAY_QUEUED_WORK = "gateway_queued_work"
    GATEWAY_QUEUED_PROMPT_TOKENS = "gateway_queued_prompt_tokens"
    GATEWAY_EARLIEST_SLACK = "gateway_earliest_slack"
    GATEWAY_ADMITTED = "gateway_admitted"
    GATEWAY_REJECTED = "gateway_rejected"
    GATEWAY_OFFERED_RECENT = "gateway_offered_recent"
    GATEWAY_INFEASIBLE = "gateway_infeasible"
    GATEWAY_ATTAINING = "gateway_attaining"
    GATEWAY_MISSED = "gateway_missed"
    GATEWAY_TTFT_BUCKETS = "gateway_ttft_buckets"
    GATEWAY_ITL_BUCKETS = "gateway_itl_buckets"


HISTOGRAM_QUANTITIES = frozenset(
    {
        QueryQuantity.TTFT_BUCKETS,
        QueryQuantity.ITL_BUCKETS,
        QueryQuantity.QUEUE_TIME_BUCKETS,
        QueryQuantity.TPOT_BUCKETS,
        QueryQuantity.PROMPT_TOKENS_BUCKETS,
        QueryQuantity.PROMPT_TOKENS_LOOKBACK_BUCKETS,
        QueryQuantity.GATEWAY_TTFT_BUCKETS,
        QueryQuantity.GATEWAY_ITL_BUCKETS,
    }
)
GATEWAY_QUANTITIES = frozenset(
    quantity for quantity in QueryQuantity if quantity.value.startswith("gateway_")
)
"""Answered by the gateway's series: one per SLO class (`slo_class`), or one for the ModelGroup."""
GATEWAY_CLASS_LABEL = "slo_class"
# The gateway's admission outcomes (controllers.requests.admission.Outcome): these proceeded to a group.
PROCEEDED_OUTCOMES = "admitted|deferred|degraded"
# Offered: every request that reached admission, whether it proceeded or was refused.
OFFERED_SELECTOR = f'outcome=~"{PROCEEDED_OUTCOMES}|rejected"'
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


@dataclass(frozen=True, slots=True)
class Scope:
    """Which ModelGroups a query reads: `matchers` select their series, `keys` are the labels every
    aggregation keeps before its own (none for one ModelGroup; namespace and ModelGroup for all)."""

    matchers: tuple[str, ...]
    keys: tuple[str, ...] = ()

    def selector(self, extra: str = "") -> str:
        return "{" + ",".join([*self.matchers, *([extra] if extra else [])]) + "}"

    def by(self, *labels: str) -> str:
        """`by (...)` with the scope's keys first; a bare aggregation when there are none at all."""
        kept = [*self.keys, *labels]
        return f"by ({', '.join(kept)})" if kept else ""


def model_group_scope(labels: SeriesLabels, namespace: str, model_group: str) -> Scope:
    """One ModelGroup's series."""
    return Scope(
        (
            f"{labels.namespace}={label_value(namespace)}",
            f"{labels.model_group}={label_value(model_group)}",
        )
    )


def fleet_scope(labels: SeriesLabels) -> Scope:
    """Every ModelGroup's series, kept apart by their namespace and ModelGroup labels."""
    return Scope(
        (f'{labels.namespace}!=""', f'{labels.model_group}!=""'),
        (labels.namespace, labels.model_group),
    )


def model_group_selector(labels: SeriesLabels, namespace: str, model_group: str, extra: str = "") -> str:
    """The series of one ModelGroup's leaders, e.g. `{namespace="ml",model_group="llama"}`."""
    return model_group_scope(labels, namespace, model_group).selector(extra)


def sub_queries(
    labels: SeriesLabels, namespace: str, model_group: str, windows: Windows
) -> dict[QueryQuantity, str]:
    """One ModelGroup's engine sub-queries (`scoped_sub_queries`)."""
    return scoped_sub_queries(labels, model_group_scope(labels, namespace, model_group), windows)


def scoped_sub_queries(labels: SeriesLabels, scope: Scope, windows: Windows) -> dict[QueryQuantity, str]:
    """One expression per quantity, each aggregated to one series per group (per group and `le` for
    histogram buckets) of each ModelGroup in the scope."""
    selector = scope.selector()
    by_group = scope.by(labels.group)
    by_bucket = scope.by(labels.group, "le")
    rate = f"{windows.rate_seconds}s"
    window = f"{windows.histogram_seconds}s"
    lookback = f"{max(windows.prompt_lookback_seconds, windows.histogram_seconds)}s"

    def capacity_waiting() -> str:
        by_reason = scope.selector('reason="capacity"')
        return (
            f"sum {by_group} ({vllm.NUM_REQUESTS_WAITING_BY_REASON}{by_reason}) "
            f"or sum {by_group} ({vllm.NUM_REQUESTS_WAITING}{selector})"
        )

    def increase(metric: str, span: str, extra: str = "") -> str:
        return f"sum {by_group} (increase({metric}{scope.selector(extra)}[{span}]))"

    def rate_of(metric: str) -> str:
        return f"sum {by_group} (rate({metric}{selector}[{rate}]))"

    def buckets(metric: str, span: str = window) -> str:
        return f"sum {by_bucket} (increase({metric}{selector}[{span}]))"

    return {
        QueryQuantity.WAITING: capacity_waiting(),
        QueryQuantity.RUNNING: f"sum {by_group} ({RUNNING_METRIC}{selector})",
        QueryQuantity.KV_USAGE: f"max {by_group} ({vllm.KV_CACHE_USAGE_PERC}{selector})",
        QueryQuantity.SAMPLE_AGE: f"time() - max {by_group} (timestamp({RUNNING_METRIC}{selector}))",
        QueryQuantity.PROMPT_TOKENS_RATE: rate_of(vllm.total(vllm.PROMPT_TOKENS)),
        QueryQuantity.GENERATION_TOKENS_RATE: rate_of(vllm.total(vllm.GENERATION_TOKENS)),
        QueryQuantity.PROMPT_TOKENS_SUM: increase(vllm.summed(vllm.REQUEST_PROMPT_TOKENS), rate),
        QueryQuantity.PROMPT_TOKENS_COUNT: increase(vllm.counted(vllm.REQUEST_PROMPT_TOKENS), rate),
        # The requests whose first token fell in the rate window, and their prompt tokens: the same
        # moment the prompt-token counter counts them, long before their length reaches the histogram.
        QueryQuantity.PROMPTS_STARTED: increase(vllm.counted(vllm.TIME_TO_FIRST_TOKEN_SECONDS), rate),
        QueryQuantity.PROMPT_TOKENS_STARTED: increase(vllm.total(vllm.PROMPT_TOKENS), rate),
        QueryQuantity.GENERATION_TOKENS_SUM: increase(vllm.summed(vllm.REQUEST_GENERATION_TOKENS), rate),
        QueryQuantity.GENERATION_TOKENS_COUNT: increase(vllm.counted(vllm.REQUEST_GENERATION_TOKENS), rate),
        QueryQuantity.PREFIX_HITS: increase(vllm.total(vllm.PREFIX_CACHE_HITS), rate),
        QueryQuantity.PREFIX_QUERIES: increase(vllm.total(vllm.PREFIX_CACHE_QUERIES), rate),
        QueryQuantity.FINISHED: increase(
            vllm.total(vllm.REQUEST_SUCCESS), window, f'finished_reason=~"{FINISHED_REASONS}"'
        ),
        QueryQuantity.ABORTED: increase(
            vllm.total(vllm.REQUEST_SUCCESS), window, f'finished_reason=~"{ABORTED_REASONS}"'
        ),
        QueryQuantity.REJECTED: increase(vllm.total(vllm.ADMISSION_REJECTIONS), window),
        QueryQuantity.TTFT_BUCKETS: buckets(vllm.bucket(vllm.TIME_TO_FIRST_TOKEN_SECONDS)),
        QueryQuantity.ITL_BUCKETS: buckets(vllm.bucket(vllm.INTER_TOKEN_LATENCY_SECONDS)),
        QueryQuantity.QUEUE_TIME_BUCKETS: buckets(vllm.bucket(vllm.REQUEST_QUEUE_TIME_SECONDS)),
        QueryQuantity.TPOT_BUCKETS: buckets(vllm.bucket(vllm.REQUEST_TIME_PER_OUTPUT_TOKEN_SECONDS)),
        # Prompt lengths of the window's finished requests: the infeasible share is read from them.
        QueryQuantity.PROMPT_TOKENS_BUCKETS: buckets(vllm.bucket(vllm.REQUEST_PROMPT_TOKENS)),
        QueryQuantity.PROMPT_TOKENS_LOOKBACK_BUCKETS: buckets(
            vllm.bucket(vllm.REQUEST_PROMPT_TOKENS), lookback
        ),
    }


def gateway_sub_queries(
    labels: SeriesLabels, namespace: str, model_group: str, windows: Windows
) -> dict[QueryQuantity, str]:
    """One ModelGroup's gateway sub-queries (`scoped_gateway_sub_queries`)."""
    return scoped_gateway_sub_queries(model_group_scope(labels, namespace, model_group), windows)


# The gateway's KV of sessions waiting on a tool that stays in GPU memory (the rest is offloaded).
KEPT_SELECTOR = 'action="keep"'


def scoped_gateway_sub_queries(scope: Scope, windows: Windows) -> dict[QueryQuantity, str]:
    """The gateway's figures per ModelGroup in the scope, summed over gateway replicas: the queue per
    class now, and per class over the goodput window the outcomes and the client-side TTFT and ITL.

    The gateway labels its series `model_group` itself; the scrape adds the namespace. When no
    gateway fronts a ModelGroup these match nothing for it and its snapshot has no gateway view.
    """
    selector = scope.selector()
    whole = scope.by()
    by_class = scope.by(GATEWAY_CLASS_LABEL)
    by_bucket = scope.by(GATEWAY_CLASS_LABEL, "le")
    window = f"{windows.histogram_seconds}s"

    def counted(metric: str, extra: str = "") -> str:
        return f"sum {by_class} (increase({metric}{scope.selector(extra)}[{window}]))"

    def buckets(metric: str) -> str:
        return f"sum {by_bucket} (increase({metric}{selector}[{window}]))"

    def overall(how: str, inner: str) -> str:
        """One value per ModelGroup, over every class and gateway replica."""
        return f"{how} {whole} ({inner})" if whole else f"{how}({inner})"

    return {
        QueryQuantity.GATEWAY_SAMPLE_AGE: (
            f"time() - {overall('max', f'timestamp(goodput_gateway_running_requests{selector})')}"
        ),
        QueryQuantity.GATEWAY_RUNNING_REQUESTS: overall("sum", f"goodput_gateway_running_requests{selector}"),
        QueryQuantity.GATEWAY_RUNNING_WORK: overall("sum", f"goodput_gateway_running_work_seconds{selector}"),
        QueryQuantity.GATEWAY_ROUTABLE_GROUPS: overall("max", f"goodput_gateway_routable_groups{selector}"),
        QueryQuantity.GATEWAY_KEPT_SESSION_KV: overall(
            "sum", f"goodput_gateway_waiting_session_kv_tokens{scope.selector(KEPT_SELECTOR)}"
        ),
        QueryQuantity.GATEWAY_QUEUED_REQUESTS: f"sum {by_class} (goodput_gateway_queued_requests{selector})",
        QueryQuantity.GATEWAY_QUEUED_WORK: f"sum {by_class} (goodput_gateway_queued_work_seconds{selector})",
        QueryQuantity.GATEWAY_QUEUED_PROMPT_TOKENS: (
            f"sum {by_class} (goodput_gateway_queued_prompt_tokens{selector})"
        ),
        QueryQuantity.GATEWAY_EARLIEST_SLACK: (
            f"min {by_class} (goodput_gateway_earliest_slack_seconds{selector})"
        ),
        QueryQuantity.GATEWAY_ADMITTED: counted(
            "goodput_gateway_requests_total", f'outcome=~"{PROCEEDED_OUTCOMES}"'
        ),
        QueryQuantity.GATEWAY_REJECTED: counted("goodput_gateway_requests_total", 'outcome="rejected"'),
        QueryQuantity.GATEWAY_OFFERED_RECENT: (
            f"sum {by_class} (rate(goodput_gateway_requests_total"
            f"{scope.selector(OFFERED_SELECTOR)}[{windows.rate_seconds}s]))"
        ),
        QueryQuantity.GATEWAY_INFEASIBLE: counted("goodput_gateway_requests_infeasible_total"),
        QueryQuantity.GATEWAY_ATTAINING: counted("goodput_gateway_requests_finished_total", 'slo_met="true"'),
        QueryQuantity.GATEWAY_MISSED: counted("goodput_gateway_requests_finished_total", 'slo_met="false"'),
        QueryQuantity.GATEWAY_TTFT_BUCKETS: buckets("goodput_gateway_time_to_first_token_seconds_bucket"),
        QueryQuantity.GATEWAY_ITL_BUCKETS: buckets("goodput_gateway_inter_token_latency_seconds_bucket"),
    }


def snapshot_query(labels: SeriesLabels, namespace: str, model_group: str, windows: Windows) -> str:
    """One ModelGroup's snapshot in one expression (`scoped_snapshot_query`)."""
    return scoped_snapshot_query(labels, model_group_scope(labels, namespace, model_group), windows)


def fleet_snapshot_query(labels: SeriesLabels, windows: Windows) -> str:
    """Every ModelGroup's snapshot in one expression: the batch of one query shape."""
    return scoped_snapshot_query(labels, fleet_scope(labels), windows)


def scoped_snapshot_query(labels: SeriesLabels, scope: Scope, windows: Windows) -> str:
    """Every sub-query in one expression, each series tagged with `goodput_query="<quantity>"`: the
    engines' per group, then the gateway's."""
    expressions = {
        **scoped_sub_queries(labels, scope, windows),
        **scoped_gateway_sub_queries(scope, windows),
    }
    tagged = [
        f'label_replace({expression}, "{QUERY_LABEL}", "{quantity.value}", "", "")'
        for quantity, expression in expressions.items()
    ]
    return "\n  or ".join(tagged)


def _pods_matcher(pods: tuple[str, ...]) -> str:
    """`pod=~"a|b"`; pod names are DNS labels, so none holds a regular expression's operator."""
    return f"{POD_LABEL}=~{label_value('|'.join(pods))}"


def leader_series_query(labels: SeriesLabels, namespace: str, pods: tuple[str, ...]) -> str:
    """Which of these leader pods Prometheus holds the engine gauge of, and under which ModelGroup
    and group labels: when the snapshot finds no group, this tells a scrape without the labels
    the autoscaler selects by from no series at all (`goodput doctor`)."""
    selector = f"{{{labels.namespace}={label_value(namespace)},{_pods_matcher(pods)}}}"
    return f"group by ({POD_LABEL}, {labels.model_group}, {labels.group}) ({RUNNING_METRIC}{selector})"


def leader_targets_query(labels: SeriesLabels, namespace: str, pods: tuple[str, ...]) -> str:
    """The scrape targets of these leader pods and whether their last scrape worked (`up`): none
    means nothing scrapes them (no monitor, or one no Prometheus selects)."""
    return f"up{{{labels.namespace}={label_value(namespace)},{_pods_matcher(pods)}}}"


OFFERED_WORK_SERIES = "goodput_autoscaler_arrival_work_rate"
"""The decision's arrival estimate in work-seconds per second (offered work where a gateway fronts
the ModelGroup, served work and the queue's growth where none does), exported by the operator under
its own `namespace` and `model_group` labels (its monitors honour them): the forecast's history."""


def offered_work_history_query(namespace: str, model_group: str) -> str:
    """One ModelGroup's offered work over time, one series whichever operator replica exported it."""
    selector = f"namespace={label_value(namespace)},model_group={label_value(model_group)}"
    return f"max({OFFERED_WORK_SERIES}{{{selector}}})"
