"""The autoscaler's PromQL: one instant query per ModelGroup, label names from the user's relabelling.

That Prometheus accepts and answers the query is checked against the real server in
e2e/test_autoscaler.py and recorded in test_metrics_source.py; here, what the text must say.
"""

from __future__ import annotations

import re

import pytest

from goodput.operator.metrics_source import metrics_by_group
from goodput.operator.promql import (
    HISTOGRAM_QUANTITIES,
    QUERY_LABEL,
    QueryQuantity,
    SeriesLabels,
    Windows,
    label_value,
    model_group_selector,
    snapshot_query,
    sub_queries,
)

WINDOWS = Windows(rate_seconds=45, histogram_seconds=300)
CUSTOM = SeriesLabels(namespace="kubernetes_namespace", model_group="app", group="replica_group")


def test_every_quantity_is_asked_once_and_tagged() -> None:
    query = snapshot_query(SeriesLabels(), "serving", "llama", WINDOWS)
    tags = re.findall(rf'"{QUERY_LABEL}", "([a-z_]+)", "", ""\)', query)
    assert sorted(tags) == sorted(quantity.value for quantity in QueryQuantity)
    assert query.count("\n  or label_replace(") == len(QueryQuantity) - 1


def test_each_sub_query_selects_one_model_group_and_keeps_one_series_per_group() -> None:
    for quantity, expression in sub_queries(SeriesLabels(), "serving", "llama", WINDOWS).items():
        assert '{namespace="serving",model_group="llama"' in expression, quantity
        grouping = "by (group, le)" if quantity in HISTOGRAM_QUANTITIES else "by (group)"
        assert grouping in expression, quantity


def test_the_users_label_names_are_used_everywhere() -> None:
    query = snapshot_query(CUSTOM, "serving", "llama", WINDOWS)
    assert '{kubernetes_namespace="serving",app="llama"' in query
    assert "by (replica_group)" in query and "by (replica_group, le)" in query
    assert "namespace=" not in query.replace("kubernetes_namespace=", "")
    assert "model_group=" not in query and "by (group" not in query


@pytest.mark.parametrize(
    ("quantity", "window"),
    [
        (QueryQuantity.PROMPT_TOKENS_RATE, "[45s]"),
        (QueryQuantity.GENERATION_TOKENS_RATE, "[45s]"),
        (QueryQuantity.PROMPT_TOKENS_SUM, "[45s]"),
        (QueryQuantity.PREFIX_QUERIES, "[45s]"),
        (QueryQuantity.FINISHED, "[300s]"),
        (QueryQuantity.REJECTED, "[300s]"),
        (QueryQuantity.TTFT_BUCKETS, "[300s]"),
        (QueryQuantity.QUEUE_TIME_BUCKETS, "[300s]"),
        (QueryQuantity.PROMPT_TOKENS_BUCKETS, "[300s]"),
    ],
    ids=str,
)
def test_rates_follow_the_recent_window_and_counts_the_policy_window(
    quantity: QueryQuantity, window: str
) -> None:
    expression = sub_queries(SeriesLabels(), "serving", "llama", WINDOWS)[quantity]
    assert re.findall(r"\[\d+s\]", expression) == [window]


def test_the_backlog_is_the_capacity_backlog_and_falls_back_to_the_total() -> None:
    waiting = sub_queries(SeriesLabels(), "serving", "llama", WINDOWS)[QueryQuantity.WAITING]
    by_reason, fallback = waiting.split(" or ")
    assert (
        'vllm:num_requests_waiting_by_reason{namespace="serving",model_group="llama",reason="capacity"}'
        in by_reason
    )
    assert "vllm:num_requests_waiting{" in fallback


def test_finished_and_aborted_split_vllms_finish_reasons() -> None:
    queries = sub_queries(SeriesLabels(), "serving", "llama", WINDOWS)
    assert 'finished_reason=~"stop|length|repetition"' in queries[QueryQuantity.FINISHED]
    assert 'finished_reason=~"abort|error"' in queries[QueryQuantity.ABORTED]


def test_label_values_are_quoted() -> None:
    assert label_value('a"b\\c') == '"a\\"b\\\\c"'
    assert model_group_selector(SeriesLabels(), 'we"ird', "x") == '{namespace="we\\"ird",model_group="x"}'


@pytest.mark.parametrize("name", ["model-group", "9group", "", "group}"], ids=repr)
def test_a_label_name_prometheus_cannot_store_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="not a Prometheus label name"):
        SeriesLabels(group=name)


def test_windows_are_whole_positive_seconds() -> None:
    with pytest.raises(ValueError, match="at least one second"):
        Windows(rate_seconds=0, histogram_seconds=60)


def test_an_answer_under_the_users_labels_is_read_under_them() -> None:
    answer = [
        {"metric": {QUERY_LABEL: quantity, "replica_group": "g3"}, "value": [0, "1"]}
        for quantity in ("waiting", "running", "kv_usage", "sample_age")
    ]
    assert list(metrics_by_group(answer, CUSTOM)) == ["g3"]
    assert metrics_by_group(answer, SeriesLabels()) == {}


def test_prompt_lengths_are_read_per_bucket_from_vllms_histogram() -> None:
    expression = sub_queries(SeriesLabels(), "serving", "llama", WINDOWS)[QueryQuantity.PROMPT_TOKENS_BUCKETS]
    assert "vllm:request_prompt_tokens_bucket" in expression
    assert "by (group, le)" in expression
    assert QueryQuantity.PROMPT_TOKENS_BUCKETS in HISTOGRAM_QUANTITIES


@pytest.mark.parametrize(
    ("windows", "span"),
    [
        pytest.param(Windows(rate_seconds=45, histogram_seconds=300), "[600s]", id="ten-minutes-by-default"),
        pytest.param(
            Windows(rate_seconds=45, histogram_seconds=1200), "[1200s]", id="never-shorter-than-the-window"
        ),
        pytest.param(
            Windows(rate_seconds=10, histogram_seconds=30, prompt_lookback_seconds=120), "[120s]", id="set"
        ),
    ],
)
def test_the_prompt_lookback_spans_at_least_the_goodput_window(windows: Windows, span: str) -> None:
    expression = sub_queries(SeriesLabels(), "serving", "llama", windows)[
        QueryQuantity.PROMPT_TOKENS_LOOKBACK_BUCKETS
    ]
    assert "increase(vllm:request_prompt_tokens_bucket{" in expression and expression.endswith(f"{span}))")
    assert QueryQuantity.PROMPT_TOKENS_LOOKBACK_BUCKETS in HISTOGRAM_QUANTITIES
