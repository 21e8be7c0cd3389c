"""The Prometheus series the autoscaler exports: per decision, its estimates, feasibility and
the health of its metrics, so a decision can be read back from a dashboard as from its record.
Declared in the style `goodput.controllers.metric_buckets` describes."""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from goodput.controllers.autoscale.model import Decision
from goodput.controllers.metric_buckets import DECISION_BUCKETS_SECONDS
from goodput.operator.promql import OFFERED_WORK_SERIES


class AutoscalerMetrics:
    """The autoscaler's own series, on the operator's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["namespace", "model_group"]
        self._declare_decisions(registry, labels)
        self._declare_estimates(registry, labels)
        self._declare_feasibility(registry, labels)
        self._declare_health(registry, labels)
        self._seen: dict[tuple[str, str], set[tuple[Gauge, tuple[str, ...]]]] = {}

    def _declare_decisions(self, registry: CollectorRegistry, labels: list[str]) -> None:
        """What each decision chose, and for which policy."""
        self.decisions = Counter(
            "goodput_autoscaler_decisions_total",
            "Scaling decisions by policy (active or shadow), mode and reason.",
            [*labels, "policy", "mode", "reason"],
            registry=registry,
        )
        self.desired_groups = Gauge(
            "goodput_autoscaler_desired_groups",
            "Groups the latest decision asked for, by policy (active or shadow).",
            [*labels, "policy"],
            registry=registry,
        )
        self.ready_groups = Gauge(
            "goodput_autoscaler_ready_groups",
            "Ready groups the latest decision counted.",
            labels,
            registry=registry,
        )
        self.proposed_groups = Gauge(
            "goodput_autoscaler_proposed_groups",
            "Groups each signal proposed in the latest decision.",
            [*labels, "policy", "signal"],
            registry=registry,
        )
        self.policy_info = Gauge(
            "goodput_autoscaler_policy_info",
            "The SLOPolicy revision and mode behind the latest decision (value 1).",
            [*labels, "policy", "slopolicy", "revision", "mode"],
            registry=registry,
        )

    def _declare_estimates(self, registry: CollectorRegistry, labels: list[str]) -> None:
        """The estimates the latest active decision read."""
        self.metric_age = Gauge(
            "goodput_autoscaler_metric_age_seconds",
            "Age of the oldest ready group's engine metrics at the latest decision.",
            labels,
            registry=registry,
        )
        self.queue_work = Gauge(
            "goodput_autoscaler_queue_work_seconds",
            "Estimated remaining work of waiting and running requests, in work-seconds.",
            labels,
            registry=registry,
        )
        self.arrival_work_rate = Gauge(
            OFFERED_WORK_SERIES,
            "Estimated arriving work, in work-seconds per second.",
            labels,
            registry=registry,
        )
        self.earliest_slack = Gauge(
            "goodput_autoscaler_earliest_slack_seconds",
            "Estimated first-token slack of a request arriving now.",
            labels,
            registry=registry,
        )
        self.kv_free = Gauge(
            "goodput_autoscaler_kv_free_ratio",
            "Free fraction of the ready groups' KV caches.",
            labels,
            registry=registry,
        )

    def _declare_feasibility(self, registry: CollectorRegistry, labels: list[str]) -> None:
        """What no number of groups can serve, and attainment against offered and attainable load."""
        self.infeasible_share = Gauge(
            "goodput_autoscaler_infeasible_share",
            "Share of the window's prompts longer than the class's feasible threshold: requests no "
            "number of groups can serve within the class's TTFT target (not scaled for).",
            [*labels, "class"],
            registry=registry,
        )
        self.feasible_prompt_tokens = Gauge(
            "goodput_autoscaler_feasible_prompt_tokens",
            "The longest prompt whose idle-group TTFT floor fits the class's target (0: none).",
            [*labels, "class"],
            registry=registry,
        )
        self.attainment = Gauge(
            "goodput_autoscaler_attainment_ratio",
            "Requests within the primary class's SLO over the goodput window, against offered requests "
            "(basis 'offered') and against those that could meet it at all (basis 'attainable').",
            [*labels, "basis"],
            registry=registry,
        )

    def _declare_health(self, registry: CollectorRegistry, labels: list[str]) -> None:
        """The autoscaler's own work: queries, failures, time per decision."""
        self.prometheus_queries = Counter(
            "goodput_autoscaler_prometheus_queries_total",
            "Prometheus queries sent by the autoscaler, by scope ('fleet': one for every ModelGroup due, "
            "'model_group': one ModelGroup's) and whether Prometheus answered.",
            ["scope", "answered"],
            registry=registry,
        )
        self.metrics_failures = Counter(
            "goodput_autoscaler_metrics_query_failures_total",
            "Ticks that could not read the metrics from Prometheus.",
            labels,
            registry=registry,
        )
        self.duration = Histogram(
            "goodput_autoscaler_decision_duration_seconds",
            "Time per decision: reading Prometheus ('metrics', with the wait for the batched query), the "
            "pure decision ('decide'), and the whole tick with its API writes ('total').",
            ["stage"],
            registry=registry,
            buckets=DECISION_BUCKETS_SECONDS,
        )

    def count_query(self, scope: str, answered: bool) -> None:
        self.prometheus_queries.labels(scope, str(answered).lower()).inc()

    def _set(self, gauge: Gauge, values: tuple[str, ...], value: float) -> None:
        gauge.labels(*values).set(value)
        self._seen.setdefault((values[0], values[1]), set()).add((gauge, values))

    def record(self, namespace: str, name: str, decision: Decision, *, policy: str, slo_policy: str) -> None:
        key = (namespace, name)
        self.decisions.labels(namespace, name, policy, decision.mode.value, decision.reason).inc()
        self._set(self.desired_groups, (*key, policy), decision.desired_groups)
        for proposal in decision.proposals:
            self._set(self.proposed_groups, (*key, policy, str(proposal.signal)), proposal.groups)
        for gauge, values in list(self._seen.get(key, ())):
            if gauge is self.policy_info and values[2] == policy:
                gauge.remove(*values)
                self._seen[key].discard((gauge, values))
        self._set(
            self.policy_info, (*key, policy, slo_policy, decision.policy_revision, decision.mode.value), 1.0
        )
        if policy != "active":
            return
        self._set(self.ready_groups, key, decision.counts.ready)
        estimates = decision.estimates
        for gauge, value in (
            (self.queue_work, estimates.queue_work_seconds),
            (self.arrival_work_rate, estimates.arrival_work_rate),
            (self.earliest_slack, estimates.earliest_slack_seconds),
            (self.kv_free, estimates.kv_free_fraction),
        ):
            if value is not None and abs(value) != float("inf"):
                self._set(gauge, key, value)
        self._record_feasibility(key, decision)

    def _record_feasibility(self, key: tuple[str, str], decision: Decision) -> None:
        for entry in decision.estimates.feasibility:
            self._set(
                self.feasible_prompt_tokens, (*key, entry.class_name), entry.longest_feasible_prompt_tokens
            )
            if entry.infeasible_request_share is not None:
                self._set(self.infeasible_share, (*key, entry.class_name), entry.infeasible_request_share)
        goodput = decision.estimates.goodput
        if goodput is None:
            return
        for basis, value in (
            ("offered", goodput.attainment_offered),
            ("attainable", goodput.attainment_attainable),
        ):
            if value is not None:
                self._set(self.attainment, (*key, basis), value)

    def record_age(self, namespace: str, name: str, age_seconds: float | None) -> None:
        if age_seconds is not None:
            self._set(self.metric_age, (namespace, name), age_seconds)

    def forget(self, namespace: str, name: str) -> None:
        for gauge, values in self._seen.pop((namespace, name), set()):
            with contextlib.suppress(KeyError):
                gauge.remove(*values)
