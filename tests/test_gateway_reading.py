"""The operator's reading of a gateway's series: the PromQL it sends (in the one snapshot query) and
the `GatewayObservation` it builds from the answer.

The answer shapes are Prometheus's instant-vector JSON, as `custom_query` returns it; the series
names are those `gateway/metrics.py` exports (a test below ties the two together).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from prometheus_client import generate_latest

from goodput.gateway.metrics import GatewayMetrics
from goodput.operator.metrics_source import gateway_from_result, reading_from_result
from goodput.operator.promql import (
    GATEWAY_QUANTITIES,
    HISTOGRAM_QUANTITIES,
    QUERY_LABEL,
    QueryQuantity,
    SeriesLabels,
    Windows,
    gateway_sub_queries,
    snapshot_query,
)

WINDOWS = Windows(rate_seconds=30, histogram_seconds=120)
CUSTOM = SeriesLabels(namespace="kubernetes_namespace", model_group="app", group="replica_group")


@pytest.mark.parametrize(
    ("quantity", "expected"),
    [
        (
            QueryQuantity.GATEWAY_QUEUED_REQUESTS,
            'sum by (slo_class) (goodput_gateway_queued_requests{namespace="ml",model_group="chat"})',
        ),
        (
            QueryQuantity.GATEWAY_EARLIEST_SLACK,
            'min by (slo_class) (goodput_gateway_earliest_slack_seconds{namespace="ml",model_group="chat"})',
        ),
        (
            QueryQuantity.GATEWAY_ADMITTED,
            "sum by (slo_class) (increase(goodput_gateway_requests_total"
            '{namespace="ml",model_group="chat",outcome=~"admitted|deferred|degraded"}[120s]))',
        ),
        (
            QueryQuantity.GATEWAY_REJECTED,
            "sum by (slo_class) (increase(goodput_gateway_requests_total"
            '{namespace="ml",model_group="chat",outcome="rejected"}[120s]))',
        ),
        (
            QueryQuantity.GATEWAY_OFFERED_RECENT,
            "sum by (slo_class) (rate(goodput_gateway_requests_total"
            '{namespace="ml",model_group="chat",outcome=~"admitted|deferred|degraded|rejected"}[30s]))',
        ),
        (
            QueryQuantity.GATEWAY_ATTAINING,
            "sum by (slo_class) (increase(goodput_gateway_requests_finished_total"
            '{namespace="ml",model_group="chat",slo_met="true"}[120s]))',
        ),
        (
            QueryQuantity.GATEWAY_TTFT_BUCKETS,
            "sum by (slo_class, le) (increase(goodput_gateway_time_to_first_token_seconds_bucket"
            '{namespace="ml",model_group="chat"}[120s]))',
        ),
        (
            QueryQuantity.GATEWAY_SAMPLE_AGE,
            'time() - max(timestamp(goodput_gateway_running_requests{namespace="ml",model_group="chat"}))',
        ),
        (
            QueryQuantity.GATEWAY_RUNNING_WORK,
            'sum(goodput_gateway_running_work_seconds{namespace="ml",model_group="chat"})',
        ),
        (
            QueryQuantity.GATEWAY_KEPT_SESSION_KV,
            'sum(goodput_gateway_waiting_session_kv_tokens{namespace="ml",model_group="chat",action="keep"})',
        ),
    ],
    ids=lambda value: str(value)[:40],
)
def test_gateway_sub_query(quantity: QueryQuantity, expected: str) -> None:
    assert gateway_sub_queries(SeriesLabels(), "ml", "chat", WINDOWS)[quantity] == expected


def test_the_gateway_is_asked_in_the_same_query_as_the_engines() -> None:
    query = snapshot_query(SeriesLabels(), "ml", "chat", WINDOWS)
    for quantity in GATEWAY_QUANTITIES:
        assert f'"{QUERY_LABEL}", "{quantity.value}", "", "")' in query, quantity
    assert set(gateway_sub_queries(SeriesLabels(), "ml", "chat", WINDOWS)) == GATEWAY_QUANTITIES


def test_the_users_label_names_select_the_gateways_series_too() -> None:
    for quantity, expression in gateway_sub_queries(CUSTOM, "ml", "chat", WINDOWS).items():
        assert '{kubernetes_namespace="ml",app="chat"' in expression, quantity


def test_every_series_the_operator_reads_is_one_the_gateway_exports() -> None:
    exported = GatewayMetrics()
    exported.running_requests.labels("chat").set(0)
    text = generate_latest(exported.registry).decode()
    names = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    suffixes = ("_total", "_bucket", "")
    for expression in gateway_sub_queries(SeriesLabels(), "ml", "chat", WINDOWS).values():
        for metric in set(_metric_names(expression)):
            assert any(metric.removesuffix(s) in names for s in suffixes if metric.endswith(s)), metric


def _metric_names(expression: str) -> list[str]:
    return [word.split("{")[0] for word in expression.replace("(", " ").split() if "goodput_gateway_" in word]


def sample(quantity: QueryQuantity, value: float | str, **labels: str) -> dict[str, Any]:
    return {"metric": {QUERY_LABEL: quantity.value, **labels}, "value": [1700000000.0, str(value)]}


def buckets(quantity: QueryQuantity, cls: str, pairs: list[tuple[str, float]]) -> list[dict[str, Any]]:
    return [sample(quantity, count, slo_class=cls, le=bound) for bound, count in pairs]


ANSWER: list[dict[str, Any]] = [
    sample(QueryQuantity.GATEWAY_SAMPLE_AGE, 1.5),
    sample(QueryQuantity.GATEWAY_RUNNING_REQUESTS, 3),
    sample(QueryQuantity.GATEWAY_RUNNING_WORK, 4.5),
    sample(QueryQuantity.GATEWAY_ROUTABLE_GROUPS, 2),
    sample(QueryQuantity.GATEWAY_KEPT_SESSION_KV, 8192),
    sample(QueryQuantity.GATEWAY_QUEUED_REQUESTS, 2, slo_class="interactive"),
    sample(QueryQuantity.GATEWAY_QUEUED_WORK, 1.25, slo_class="interactive"),
    sample(QueryQuantity.GATEWAY_QUEUED_PROMPT_TOKENS, 2048, slo_class="interactive"),
    sample(QueryQuantity.GATEWAY_EARLIEST_SLACK, -0.5, slo_class="interactive"),
    sample(QueryQuantity.GATEWAY_ADMITTED, 90, slo_class="interactive"),
    sample(QueryQuantity.GATEWAY_REJECTED, 10, slo_class="interactive"),
    sample(QueryQuantity.GATEWAY_OFFERED_RECENT, 2.5, slo_class="interactive"),
    sample(QueryQuantity.GATEWAY_INFEASIBLE, 4, slo_class="interactive"),
    sample(QueryQuantity.GATEWAY_ATTAINING, 80, slo_class="interactive"),
    sample(QueryQuantity.GATEWAY_MISSED, 8, slo_class="interactive"),
    *buckets(QueryQuantity.GATEWAY_TTFT_BUCKETS, "interactive", [("0.5", 70), ("1.0", 86), ("+Inf", 88)]),
    sample(QueryQuantity.GATEWAY_QUEUED_REQUESTS, 0, slo_class="batch"),
    sample(QueryQuantity.GATEWAY_EARLIEST_SLACK, "+Inf", slo_class="batch"),
    sample(QueryQuantity.GATEWAY_ADMITTED, "NaN", slo_class="batch"),
    # An engine series in the same answer is the engines' business.
    {"metric": {QUERY_LABEL: "waiting", "group": "g0"}, "value": [1700000000.0, "1"]},
]


def test_the_answer_becomes_the_gateways_view() -> None:
    gateway = gateway_from_result(ANSWER)
    assert gateway is not None
    assert (gateway.age_seconds, gateway.running_requests, gateway.running_work_seconds) == (1.5, 3, 4.5)
    assert gateway.routable_groups == 2
    assert gateway.kept_session_kv_tokens == 8192
    interactive = gateway.figures_for("interactive")
    assert interactive is not None
    assert (interactive.waiting_requests, interactive.waiting_work_seconds) == (2, 1.25)
    assert interactive.waiting_prompt_tokens == 2048
    assert interactive.earliest_slack_seconds == -0.5
    assert (interactive.offered_requests, interactive.admitted_requests) == (100, 90)
    assert (interactive.rejected_requests, interactive.infeasible_requests) == (10, 4)
    assert (interactive.attaining_requests, interactive.missed_requests) == (80, 8)
    assert interactive.recent_offered_per_second == 2.5
    assert interactive.ttft is not None
    assert interactive.ttft.upper_bounds == (0.5, 1.0)
    assert interactive.ttft.cumulative_counts == (70, 86, 88)
    assert interactive.itl is None


def test_an_idle_class_has_no_slack_and_nan_counts_nothing() -> None:
    gateway = gateway_from_result(ANSWER)
    assert gateway is not None
    batch = gateway.figures_for("batch")
    assert batch is not None
    assert batch.earliest_slack_seconds is None
    assert batch.admitted_requests == 0
    assert batch.recent_offered_per_second is None  # not exported: unknown, not 0
    assert gateway.earliest_slack_seconds == -0.5


@pytest.mark.parametrize(
    ("name", "answer"),
    [
        (
            "no gateway series at all",
            [{"metric": {QUERY_LABEL: "waiting", "group": "g0"}, "value": [0, "1"]}],
        ),
        (
            "queue gauges without the sample age",
            [sample(QueryQuantity.GATEWAY_QUEUED_REQUESTS, 3, slo_class="a")],
        ),
        ("a sample age that is not a number", [sample(QueryQuantity.GATEWAY_SAMPLE_AGE, "NaN")]),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_no_gateway_view_without_its_sample_age(name: str, answer: list[dict[str, Any]]) -> None:
    assert gateway_from_result(answer) is None


def test_negative_extrapolations_are_clipped_to_zero() -> None:
    gateway = gateway_from_result(
        [
            sample(QueryQuantity.GATEWAY_SAMPLE_AGE, -0.2),
            sample(QueryQuantity.GATEWAY_ADMITTED, -0.4, slo_class="a"),
            sample(QueryQuantity.GATEWAY_RUNNING_REQUESTS, "-Inf"),
        ]
    )
    assert gateway is not None
    assert gateway.age_seconds == 0.0
    figures = gateway.figures_for("a")
    assert figures is not None and figures.admitted_requests == 0.0
    assert gateway.running_requests == 0.0 and math.isfinite(gateway.running_work_seconds)


def test_one_answer_gives_both_views() -> None:
    reading = reading_from_result(ANSWER, SeriesLabels())
    assert reading.gateway is not None
    assert reading.groups == {}  # g0's engine gauges are incomplete: no metrics, as before
    assert QueryQuantity.GATEWAY_TTFT_BUCKETS in HISTOGRAM_QUANTITIES
