"""Operator settings: flags over environment variables over defaults, and the engine HTTP helpers."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime

import pytest

from goodput.controllers.groups.drain import LeaderSample
from goodput.operator.engine import generated_tokens, parse_leader_metrics
from goodput.operator.settings import Settings, add_arguments, auto_priority, settings_from_args

AT = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def parse(*argv: str, environ: dict[str, str] | None = None) -> Settings:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return settings_from_args(parser.parse_args(argv), environ or {})


def test_defaults_watch_everything_with_peering_and_json_logs() -> None:
    settings = parse()
    assert settings == Settings()
    assert (settings.namespaces, settings.standalone, settings.log_format) == ((), False, "json")
    assert settings.metrics_address == "127.0.0.1"


def test_environment_configures_and_flags_override() -> None:
    environ = {
        "GOODPUT_NAMESPACES": "serving, batch",
        "GOODPUT_STANDALONE": "true",
        "GOODPUT_METRICS_PORT": "9100",
        "GOODPUT_RECONCILE_INTERVAL_SECONDS": "2.5",
    }
    from_env = parse(environ=environ)
    assert from_env.namespaces == ("serving", "batch")
    assert from_env.standalone is True
    assert (from_env.metrics_port, from_env.reconcile_interval_seconds) == (9100, 2.5)
    flagged = parse("-n", "team-a", "--metrics-port", "0", "--liveness", "", environ=environ)
    assert (flagged.namespaces, flagged.metrics_port, flagged.liveness_endpoint) == (("team-a",), 0, None)


def test_a_malformed_boolean_is_an_error_not_false() -> None:
    with pytest.raises(ValueError, match="GOODPUT_STANDALONE"):
        parse(environ={"GOODPUT_STANDALONE": "maybe"})


@pytest.mark.parametrize(
    ("answer", "tokens"),
    [
        ({"choices": [{"text": " Bob"}], "usage": {"completion_tokens": 3}}, 3),
        ({"choices": [{"text": " Bob"}]}, 1),
        ({"choices": [{"text": ""}], "usage": {"completion_tokens": 0}}, 0),
        ({"error": "model not loaded"}, 0),
        ("not json", 0),
    ],
    ids=["usage", "text only", "empty", "error", "garbage"],
)
def test_generated_tokens(answer: object, tokens: int) -> None:
    assert generated_tokens(answer) == tokens


LEADER_PAGE = "\n".join(
    [
        "# TYPE vllm:num_requests_running gauge",
        'vllm:num_requests_running{engine="0",model_name="m"} 3.0',
        'vllm:num_requests_running{engine="1",model_name="m"} 1.0',
        'vllm:num_requests_waiting{engine="0",model_name="m"} 2.0',
        'vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 2.0',
        "vllm:num_preemptions_total 4.0",
        "# TYPE vllm:request_success_total counter",
        'vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 10.0',
        'vllm:request_success_total{engine="1",finished_reason="length",model_name="m"} 5.0',
        'vllm:request_success_total{engine="0",finished_reason="abort",model_name="m"} 2.0',
        'vllm:request_success_created{engine="0",finished_reason="stop",model_name="m"} 1.7e9',
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25',
        'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5',
        'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 800.0',
        'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 200.0',
    ]
)


def test_a_leaders_load_sums_its_engines_and_splits_aborts_from_finished_requests() -> None:
    sample = parse_leader_metrics(LEADER_PAGE, AT)
    assert sample == LeaderSample(
        at=AT,
        running=4,
        waiting=2,
        finished_total=15,
        aborted_total=2,
        kv_cache_usage=0.5,
        prefix_cache_hit_ratio=0.25,
    )
    assert sample.in_flight == 6


@pytest.mark.parametrize(
    "page",
    ["up 1\n", "", "vllm:num_requests_running{ not a metric page"],
    ids=["another exporter", "empty page", "garbage"],
)
def test_a_page_without_vllms_request_gauges_is_not_a_reading(page: str) -> None:
    assert parse_leader_metrics(page, AT) is None


def test_auto_priority_is_the_pods_own_and_stable() -> None:
    first = parse(environ={"GOODPUT_PRIORITY": "auto", "POD_ID": "goodput-7d9f-abcde"})
    again = parse(environ={"GOODPUT_PRIORITY": "auto", "POD_ID": "goodput-7d9f-abcde"})
    other = parse(environ={"GOODPUT_PRIORITY": "auto", "POD_ID": "goodput-7d9f-fghij"})
    assert first.priority == again.priority
    assert first.priority != other.priority
    assert 0 <= first.priority < 2**31
    assert parse("--priority", "auto", environ={"POD_ID": "goodput-7d9f-abcde"}).priority == first.priority
    assert parse("--priority", "7", environ={"GOODPUT_PRIORITY": "auto"}).priority == 7


def test_replicas_of_one_deployment_get_distinct_priorities() -> None:
    names = [f"goodput-5c8d7b9f6-{suffix}" for suffix in ("x2k4p", "q9z7m", "b3n8v", "w1r5t", "h6j2c")]
    assert len({auto_priority(name) for name in names}) == len(names)


def test_auto_priority_without_a_pod_name_is_an_error() -> None:
    with pytest.raises(ValueError, match="POD_ID"):
        parse(environ={"GOODPUT_PRIORITY": "auto"})


def test_a_priority_that_is_neither_a_number_nor_auto_is_refused() -> None:
    with pytest.raises(SystemExit):
        parse("--priority", "high")
