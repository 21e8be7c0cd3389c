"""The gateway's exact per-request figures, for people and for the autoscaler (§5).

Every request offered is counted once as offered and once under its outcome (admitted, deferred,
degraded, rejected, invalid), so attainment can be reported against offered load; infeasible ones are
counted apart as well. Labels are bounded: class names come from the SLOPolicy, tenants are the
listed ones, the default tenant, or 'other'.
"""

from __future__ import annotations

from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from goodput.controllers.metric_buckets import (
    GATEWAY_E2E_BUCKETS_SECONDS,
    GATEWAY_ITL_BUCKETS_SECONDS,
    GATEWAY_TTFT_BUCKETS_SECONDS,
)

RequestSeries = TypeVar("RequestSeries", Counter, Histogram)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._declare_outcomes(self.registry)
        self._declare_latencies(self.registry)
        self._declare_queue(self.registry)
        self._declare_adapters(self.registry)
        self._declare_tool_waits(self.registry)
        self._series: dict[tuple[Counter | Histogram, tuple[str, ...]], Counter | Histogram] = {}

    def series(self, metric: RequestSeries, *labels: str) -> RequestSeries:
        """`metric.labels(*labels)`, looked up once for each label set: prometheus_client checks and
        joins the values under a lock on every call, several times on each request's path. Counters
        and histograms only: the gateway never removes their series, so a kept child is always the
        exported one (a removed gauge series would leave a stale child behind). As bounded as the
        series themselves."""
        key = (metric, labels)
        child = self._series.get(key)
        if child is None:
            child = self._series[key] = metric.labels(*labels)
        return child  # type: ignore[return-value]  # stored under its own metric's key

    def _declare_outcomes(self, r: CollectorRegistry) -> None:
        """Every request once as offered, then by what admission made of it and how it ended."""
        labels = ["model_group", "slo_class", "tenant"]
        self.offered = Counter(
            "goodput_gateway_requests_offered_total", "Requests offered.", labels, registry=r
        )
        self.outcomes = Counter(
            "goodput_gateway_requests_total",
            "Requests by admission outcome (admitted, deferred, degraded, rejected, invalid) and reason.",
            [*labels, "outcome", "reason"],
            registry=r,
        )
        self.infeasible = Counter(
            "goodput_gateway_requests_infeasible_total",
            "Requests whose zero-load floors already miss their class's targets.",
            labels,
            registry=r,
        )
        self.finished = Counter(
            "goodput_gateway_requests_finished_total",
            "Requests answered by an engine, by whether they met every target of their class.",
            [*labels, "slo_met"],
            registry=r,
        )
        self.degraded = Counter(
            "goodput_gateway_requests_degraded_total",
            "Requests served (or refused) on a rung of their class's degrade ladder: CapOutput, "
            "DropOptionalContext, Fallback, AsyncBatch, Reject.",
            [*labels, "rung"],
            registry=r,
        )
        self.sessions = Counter(
            "goodput_gateway_session_requests_total",
            "Requests of budgeted sessions by what the session made of them: root, child, or the "
            "refusal code (session_budget_exhausted, session_expired, ...).",
            [*labels, "result"],
            registry=r,
        )
        self.disconnects = Counter(
            "goodput_gateway_client_disconnects_total",
            "Requests whose client went away before the answer ended, by stage: queued (waiting for "
            "a group), dispatched (sent to an engine, nothing relayed yet), streaming (mid-stream).",
            ["model_group", "stage"],
            registry=r,
        )
        self.connections_closed = Counter(
            "goodput_gateway_connections_closed_total",
            "Connections the gateway closed on a client, by reason: header_timeout (no whole request "
            "head in time), client_connection_limit (one more than a client address may open).",
            ["model_group", "reason"],
            registry=r,
        )
        self.bodies_refused = Counter(
            "goodput_gateway_bodies_refused_total",
            "Request bodies refused before they were read whole, by code: BodyTooLarge (413), "
            "BodyBudget (503, the bodies in flight hold the budget), BodyTimeout (408).",
            ["model_group", "code"],
            registry=r,
        )

    def _declare_tool_waits(self, r: CollectorRegistry) -> None:
        """What the gateway did with the KV of sessions waiting on a tool, and what they hold."""
        self.tool_wait_actions = Counter(
            "goodput_gateway_tool_wait_actions_total",
            "Sessions that began waiting (their last child in flight ended), by what their KV was left "
            "to: keep (GPU, next child to the same group), offload (the engines' CPU tier), recompute.",
            ["model_group", "action"],
            registry=r,
        )
        self.waiting_kv_tokens = Gauge(
            "goodput_gateway_waiting_session_kv_tokens",
            "KV tokens of sessions waiting on a tool, by action: keep (held in GPU memory, taken from "
            "the groups' KV headroom) or offload (in the engines' CPU tier).",
            ["model_group", "action"],
            registry=r,
        )

    def _declare_latencies(self, r: CollectorRegistry) -> None:
        self.ttft = Histogram(
            "goodput_gateway_time_to_first_token_seconds",
            "Time to first token as the client sees it.",
            ["model_group", "slo_class"],
            buckets=GATEWAY_TTFT_BUCKETS_SECONDS,
            registry=r,
        )
        self.itl = Histogram(
            "goodput_gateway_inter_token_latency_seconds",
            "Gaps between streamed chunks.",
            ["model_group", "slo_class"],
            buckets=GATEWAY_ITL_BUCKETS_SECONDS,
            registry=r,
        )
        self.e2e = Histogram(
            "goodput_gateway_e2e_request_latency_seconds",
            "Arrival to last byte.",
            ["model_group", "slo_class"],
            buckets=GATEWAY_E2E_BUCKETS_SECONDS,
            registry=r,
        )

    def _declare_queue(self, r: CollectorRegistry) -> None:
        """The queue by class: what the autoscaler reads instead of inferring demand from engines
        (also at zero groups, where no engine reports anything)."""
        queue_labels = ["model_group", "slo_class"]
        self.queued_work = Gauge(
            "goodput_gateway_queued_work_seconds",
            "Predicted work of requests waiting in the gateway (Q_work's waiting part).",
            queue_labels,
            registry=r,
        )
        self.queued_requests = Gauge(
            "goodput_gateway_queued_requests", "Requests waiting in the gateway.", queue_labels, registry=r
        )
        self.queued_prompt_tokens = Gauge(
            "goodput_gateway_queued_prompt_tokens",
            "Prompt tokens of the requests waiting in the gateway (KV they will need).",
            queue_labels,
            registry=r,
        )
        self.earliest_slack = Gauge(
            "goodput_gateway_earliest_slack_seconds",
            "Least first-token slack of any waiting request (deadline - now - predicted wait); "
            "+Inf when nothing waits, -Inf when requests wait and no group serves.",
            queue_labels,
            registry=r,
        )
        self.running_work = Gauge(
            "goodput_gateway_running_work_seconds",
            "Predicted remaining work of requests in flight on groups.",
            ["model_group"],
            registry=r,
        )
        self.running_requests = Gauge(
            "goodput_gateway_running_requests",
            "Requests dispatched to a group and not answered yet.",
            ["model_group"],
            registry=r,
        )
        self.name_conflicts = Gauge(
            "goodput_gateway_served_model_conflicts",
            "1 for a ModelGroup left out because another, created before it, serves the same model "
            "name (the gateway serves each name from one ModelGroup).",
            ["model_group", "served_model"],
            registry=r,
        )
        self.ready_groups = Gauge(
            "goodput_gateway_routable_groups", "Groups Ready and not draining.", ["model_group"], registry=r
        )
        self.ttft_correction = Gauge(
            "goodput_gateway_ttft_prediction_correction",
            "The factor the deadline gate applies to a tenant's predicted wait and service: the least "
            "under which its recently admitted requests the gate would still admit met their TTFT "
            "target (1 with no misses, or until enough were seen).",
            ["model_group", "tenant"],
            registry=r,
        )

    def _declare_adapters(self, r: CollectorRegistry) -> None:
        """Per LoRA adapter: bounded by the adapters the ModelGroups declare (a request naming any
        other is a 404 before it is counted)."""
        self.adapter_requests = Counter(
            "goodput_gateway_adapter_requests_total",
            "Requests naming a LoRA adapter, by admission outcome.",
            ["model_group", "adapter", "outcome"],
            registry=r,
        )
        self.adapter_routes = Counter(
            "goodput_gateway_adapter_routes_total",
            "Requests for an adapter sent to a group, by placement: held (the group held it), loaded "
            "(loaded into a free slot for it), evicted (loaded after unloading the least recently used).",
            ["model_group", "adapter", "placement"],
            registry=r,
        )
        self.adapter_loads = Counter(
            "goodput_gateway_adapter_loads_total",
            "Adapter loads and unloads the gateway asked of engines, by action (load, unload) and "
            "result (succeeded, failed).",
            ["model_group", "adapter", "action", "result"],
            registry=r,
        )
