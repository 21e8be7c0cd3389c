"""Operator settings: flags over environment variables over defaults, and the engine HTTP helpers."""

from __future__ import annotations

import argparse

import pytest

from goodput.operator.engine import generated_tokens, in_flight_requests
from goodput.operator.settings import Settings, add_arguments, settings_from_args


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


def test_in_flight_requests_sums_running_and_waiting_over_engines() -> None:
    page = "\n".join(
        [
            "# TYPE vllm:num_requests_running gauge",
            'vllm:num_requests_running{engine="0",model_name="m"} 3.0',
            'vllm:num_requests_running{engine="1",model_name="m"} 1.0',
            'vllm:num_requests_waiting{engine="0",model_name="m"} 2.0',
            'vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 2.0',
            "vllm:num_preemptions_total 4.0",
        ]
    )
    assert in_flight_requests(page) == 6
    assert in_flight_requests("up 1\n") is None
