"""Reading one ModelGroup's engine metrics: a recorded Prometheus answer in, `GroupMetrics` and a
`ModelGroupSnapshot` out; and what happens when Prometheus does not answer.

RECORDED is a real answer of `promql.snapshot_query` (trimmed to two histograms), taken from the local
cluster's Prometheus while `goodput emulate` served two groups of an 8B model (maxNumSeqs 2) under 6
requests a second of 256-token prompts and 64-token outputs, with windows of 8 s (rates) and 30 s.
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import math
import re
import socket
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from goodput.api.conditions import Condition
from goodput.api.modelgroup import (
    GroupStatus,
    ModelGroup,
    ModelGroupStatus,
    Profile,
    ReadySample,
    ReadyTime,
    ReadyTimeSummary,
)
from goodput.api.slopolicy import SloPolicy
from goodput.controllers.autoscale import decide
from goodput.controllers.autoscale.model import DecisionState
from goodput.controllers.compile.scaling import CompiledPolicy, compile_policy
from goodput.estimators.attainment import fraction_within
from goodput.operator.metrics_source import (
    MetricsReading,
    MetricsUnavailableError,
    PrometheusConnection,
    PrometheusMetricsSource,
    build_snapshot,
    group_observations,
    histogram_from_buckets,
    metrics_by_group,
    parse_query_result,
    query_windows,
)
from goodput.operator.promql import SeriesLabels, Windows
from goodput.testbed.cluster.controlplane import free_port

RECORDED: list[dict[str, Any]] = json.loads(
    """[
{"metric":{"goodput_query":"waiting","group":"g0"},"value":[1796223986.4,"0"]},
{"metric":{"goodput_query":"waiting","group":"g1"},"value":[1796223986.4,"0"]},
{"metric":{"goodput_query":"running","group":"g0"},"value":[1796223986.4,"1"]},
{"metric":{"goodput_query":"running","group":"g1"},"value":[1796223986.4,"2"]},
{"metric":{"goodput_query":"kv_usage","group":"g0"},"value":[1796223986.4,"0.0007130689696153389"]},
{"metric":{"goodput_query":"kv_usage","group":"g1"},"value":[1796223986.4,"0.0014261379392306779"]},
{"metric":{"goodput_query":"sample_age","group":"g0"},"value":[1796223986.4,"1.9680001735687256"]},
{"metric":{"goodput_query":"sample_age","group":"g1"},"value":[1796223986.4,"1.5500001907348633"]},
{"metric":{"goodput_query":"prompt_tokens_rate","group":"g0"},"value":[1796223986.4,"768"]},
{"metric":{"goodput_query":"prompt_tokens_rate","group":"g1"},"value":[1796223986.4,"768"]},
{"metric":{"goodput_query":"generation_tokens_rate","group":"g0"},"value":[1796223986.4,"192.33333333333331"]},
{"metric":{"goodput_query":"generation_tokens_rate","group":"g1"},"value":[1796223986.4,"191.33333333333331"]},
{"metric":{"goodput_query":"prompt_tokens_sum","group":"g0"},"value":[1796223986.4,"6144"]},
{"metric":{"goodput_query":"prompt_tokens_sum","group":"g1"},"value":[1796223986.4,"6144"]},
{"metric":{"goodput_query":"prompt_tokens_count","group":"g0"},"value":[1796223986.4,"24"]},
{"metric":{"goodput_query":"prompt_tokens_count","group":"g1"},"value":[1796223986.4,"24"]},
{"metric":{"goodput_query":"generation_tokens_sum","group":"g0"},"value":[1796223986.4,"1536"]},
{"metric":{"goodput_query":"generation_tokens_sum","group":"g1"},"value":[1796223986.4,"1536"]},
{"metric":{"goodput_query":"generation_tokens_count","group":"g0"},"value":[1796223986.4,"24"]},
{"metric":{"goodput_query":"generation_tokens_count","group":"g1"},"value":[1796223986.4,"24"]},
{"metric":{"goodput_query":"prefix_hits","group":"g0"},"value":[1796223986.4,"0"]},
{"metric":{"goodput_query":"prefix_hits","group":"g1"},"value":[1796223986.4,"0"]},
{"metric":{"goodput_query":"prefix_queries","group":"g0"},"value":[1796223986.4,"6144"]},
{"metric":{"goodput_query":"prefix_queries","group":"g1"},"value":[1796223986.4,"6144"]},
{"metric":{"goodput_query":"finished","group":"g0"},"value":[1796223986.4,"90"]},
{"metric":{"goodput_query":"finished","group":"g1"},"value":[1796223986.4,"90"]},
{"metric":{"goodput_query":"aborted","group":"g0"},"value":[1796223986.4,"0"]},
{"metric":{"goodput_query":"aborted","group":"g1"},"value":[1796223986.4,"0"]},
{"metric":{"goodput_query":"rejected","group":"g0"},"value":[1796223986.4,"0"]},
{"metric":{"goodput_query":"rejected","group":"g1"},"value":[1796223986.4,"0"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g0","le":"0.001"},"value":[1796223986.4,"0"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g0","le":"0.005"},"value":[1796223986.4,"0"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g0","le":"0.01"},"value":[1796223986.4,"25.714285714285715"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g0","le":"0.02"},"value":[1796223986.4,"90"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g0","le":"0.04"},"value":[1796223986.4,"90"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g0","le":"0.06"},"value":[1796223986.4,"90"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g0","le":"0.08"},"value":[1796223986.4,"90"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g0","le":"0.1"},"value":[1796223986.4,"90"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g0","le":"0.25"},"value":[1796223986.4,"90"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g0","le":"0.5"},"value":[1796223986.4,"90"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g0","le":"0.75"},"value":[1796223986.4,"90"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g0","le":"1.0"},"value":[1796223986.4,"90"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g0","le":"2.5"},"value":[1796223986.4,"90"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g0","le":"5.0"},"value":[1796223986.4,"90"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g0","le":"7.5"},"value":[1796223986.4,"90"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g0","le":"10.0"},"value":[1796223986.4,"90"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g0","le":"20.0"},"value":[1796223986.4,"90"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g0","le":"40.0"},"value":[1796223986.4,"90"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g0","le":"80.0"},"value":[1796223986.4,"90"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g0","le":"160.0"},"value":[1796223986.4,"90"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g0","le":"640.0"},"value":[1796223986.4,"90"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g0","le":"2560.0"},"value":[1796223986.4,"90"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g0","le":"+Inf"},"value":[1796223986.4,"90"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g1","le":"0.001"},"value":[1796223986.4,"0"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g1","le":"0.005"},"value":[1796223986.4,"0"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g1","le":"0.01"},"value":[1796223986.4,"26.785714285714285"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g1","le":"0.02"},"value":[1796223986.4,"90"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g1","le":"0.04"},"value":[1796223986.4,"90"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g1","le":"0.06"},"value":[1796223986.4,"90"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g1","le":"0.08"},"value":[1796223986.4,"90"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g1","le":"0.1"},"value":[1796223986.4,"90"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g1","le":"0.25"},"value":[1796223986.4,"90"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g1","le":"0.5"},"value":[1796223986.4,"90"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g1","le":"0.75"},"value":[1796223986.4,"90"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g1","le":"1.0"},"value":[1796223986.4,"90"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g1","le":"2.5"},"value":[1796223986.4,"90"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g1","le":"5.0"},"value":[1796223986.4,"90"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g1","le":"7.5"},"value":[1796223986.4,"90"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g1","le":"10.0"},"value":[1796223986.4,"90"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g1","le":"20.0"},"value":[1796223986.4,"90"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g1","le":"40.0"},"value":[1796223986.4,"90"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g1","le":"80.0"},"value":[1796223986.4,"90"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g1","le":"160.0"},"value":[1796223986.4,"90"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g1","le":"640.0"},"value":[1796223986.4,"90"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g1","le":"2560.0"},"value":[1796223986.4,"90"]},
{"metric":{"goodput_query":"ttft_buckets","group":"g1","le":"+Inf"},"value":[1796223986.4,"90"]},
{"metric":{"goodput_query":"itl_buckets","group":"g1","le":"0.01"},"value":[1796223986.4,"5666.785714285714"]},
{"metric":{"goodput_query":"itl_buckets","group":"g1","le":"0.025"},"value":[1796223986.4,"5666.785714285714"]},
{"metric":{"goodput_query":"itl_buckets","group":"g1","le":"0.05"},"value":[1796223986.4,"5666.785714285714"]},
{"metric":{"goodput_query":"itl_buckets","group":"g1","le":"0.075"},"value":[1796223986.4,"5666.785714285714"]},
{"metric":{"goodput_query":"itl_buckets","group":"g1","le":"0.1"},"value":[1796223986.4,"5666.785714285714"]},
{"metric":{"goodput_query":"itl_buckets","group":"g1","le":"0.15"},"value":[1796223986.4,"5666.785714285714"]},
{"metric":{"goodput_query":"itl_buckets","group":"g1","le":"0.2"},"value":[1796223986.4,"5666.785714285714"]},
{"metric":{"goodput_query":"itl_buckets","group":"g1","le":"0.3"},"value":[1796223986.4,"5666.785714285714"]},
{"metric":{"goodput_query":"itl_buckets","group":"g1","le":"0.4"},"value":[1796223986.4,"5666.785714285714"]},
{"metric":{"goodput_query":"itl_buckets","group":"g1","le":"0.5"},"value":[1796223986.4,"5666.785714285714"]},
{"metric":{"goodput_query":"itl_buckets","group":"g1","le":"0.75"},"value":[1796223986.4,"5666.785714285714"]},
{"metric":{"goodput_query":"itl_buckets","group":"g1","le":"1.0"},"value":[1796223986.4,"5666.785714285714"]},
{"metric":{"goodput_query":"itl_buckets","group":"g1","le":"2.5"},"value":[1796223986.4,"5666.785714285714"]},
{"metric":{"goodput_query":"itl_buckets","group":"g1","le":"5.0"},"value":[1796223986.4,"5666.785714285714"]},
{"metric":{"goodput_query":"itl_buckets","group":"g1","le":"7.5"},"value":[1796223986.4,"5666.785714285714"]},
{"metric":{"goodput_query":"itl_buckets","group":"g1","le":"10.0"},"value":[1796223986.4,"5666.785714285714"]},
{"metric":{"goodput_query":"itl_buckets","group":"g1","le":"20.0"},"value":[1796223986.4,"5666.785714285714"]},
{"metric":{"goodput_query":"itl_buckets","group":"g1","le":"40.0"},"value":[1796223986.4,"5666.785714285714"]},
{"metric":{"goodput_query":"itl_buckets","group":"g1","le":"80.0"},"value":[1796223986.4,"5666.785714285714"]},
{"metric":{"goodput_query":"itl_buckets","group":"g1","le":"+Inf"},"value":[1796223986.4,"5666.785714285714"]}
]"""
)
LABELS = SeriesLabels()
TTFT_BOUNDS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TTFT_BOUNDS += (20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
NOW = datetime(2026, 12, 2, 15, 0, tzinfo=UTC)

MODEL_GROUP = ModelGroup.model_validate(
    {
        "metadata": {"name": "llama", "namespace": "serving"},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
            "engine": {"image": "vllm/vllm-openai:v0.33.0"},
            "parallelism": {"tensor": 1, "pipeline": 1, "gpusPerPod": 1},
            "replicas": 2,
            "maxReplicas": 4,
            "policyRef": {"name": "chat"},
            "profile": {"gpu": "h100-80g", "maxNumSeqs": 2, "maxNumBatchedTokens": 2048},
        },
    }
)
POLICY = SloPolicy.model_validate(
    {
        "metadata": {"name": "chat", "namespace": "serving"},
        "spec": {
            "revision": "r1",
            "classes": [{"name": "chat", "ttftSeconds": 1.0, "itlSeconds": 0.05}],
            "goodput": {"windowSeconds": 30},
            "autoscaling": {"intervalSeconds": 5, "signals": {"goodput": {"enabled": False}}},
        },
    }
)


def compiled() -> CompiledPolicy:
    result = compile_policy(MODEL_GROUP, POLICY)
    assert isinstance(result, CompiledPolicy)
    return result


def series(query: str, group: str, value: str, **labels: str) -> dict[str, Any]:
    return {"metric": {"goodput_query": query, "group": group, **labels}, "value": [1796223986.4, value]}


def test_a_recorded_answer_becomes_each_groups_metrics() -> None:
    metrics = metrics_by_group(RECORDED, LABELS)
    assert sorted(metrics) == ["g0", "g1"]
    g1 = metrics["g1"]
    assert (g1.waiting_requests, g1.running_requests) == (0.0, 2.0)
    assert g1.kv_usage_fraction == pytest.approx(0.0014261379392306779)
    assert g1.age_seconds == pytest.approx(1.55, abs=1e-3)
    assert (g1.prompt_tokens_per_second, g1.generation_tokens_per_second) == (
        768.0,
        pytest.approx(191.33, abs=0.01),
    )
    assert (g1.mean_input_tokens, g1.mean_output_tokens) == (256.0, 64.0)  # the load's exact shape
    assert g1.prefix_hit_fraction == 0.0
    assert (g1.finished_requests, g1.aborted_requests, g1.rejected_requests) == (90.0, 0.0, 0.0)
    assert g1.ttft is not None and g1.ttft.upper_bounds == TTFT_BOUNDS and g1.ttft.total == 90.0
    assert fraction_within(g1.ttft, 0.02) == 1.0
    assert g1.itl is not None and g1.itl.total > 0
    assert metrics["g0"].itl is None  # not in the recording: unknown, not zero
    assert g1.queue_time is None


def test_the_recorded_load_keeps_two_groups() -> None:
    """6 requests a second on two groups of about four each: the decision holds at two."""
    policy = compiled()
    status = ModelGroupStatus(
        groups=tuple(GroupStatus(name=name, state="Ready", created_at=NOW) for name in ("g0", "g1"))
    )
    snapshot = build_snapshot(
        MODEL_GROUP, status, policy, metrics_by_group(RECORDED, LABELS), now=NOW.timestamp()
    )
    decision = decide(snapshot, policy.policy, DecisionState.initial(), NOW.timestamp())
    assert (decision.counts.ready, decision.counts.fresh_metrics) == (2, 2)
    assert decision.desired_groups == 2
    assert decision.signal == "queueWork"
    assert decision.estimates.ttft_attainment == 1.0


def test_series_of_other_queries_groups_or_values_are_ignored() -> None:
    answer = [
        series("running", "g0", "1"),
        {"metric": {"goodput_query": "running"}, "value": [0, "3"]},  # no group label
        series("a_newer_query", "g0", "5"),
        series("kv_usage", "g0", "NaN"),
        {"metric": {"group": "g0"}, "value": [0, "7"]},  # not ours
    ]
    parsed = parse_query_result(answer, LABELS)
    assert list(parsed) == ["g0"]
    assert parsed["g0"].values == {"running": 1.0}


def test_a_group_without_its_engine_gauges_has_no_metrics() -> None:
    # What a leader answering only a bare /metrics page gives: no KV usage, so nothing is known.
    answer = [series("waiting", "g0", "0"), series("running", "g0", "0"), series("sample_age", "g0", "0.4")]
    assert metrics_by_group(answer, LABELS) == {}


def test_empty_windows_give_unknown_means_not_zero() -> None:
    answer = [
        series("waiting", "g0", "0"),
        series("running", "g0", "0"),
        series("kv_usage", "g0", "0"),
        series("sample_age", "g0", "1"),
        series("prompt_tokens_count", "g0", "0"),
        series("prompt_tokens_sum", "g0", "0"),
    ]
    metrics = metrics_by_group(answer, LABELS)["g0"]
    assert (metrics.mean_input_tokens, metrics.mean_output_tokens) == (None, None)
    assert (metrics.ttft, metrics.itl) == (None, None)


@pytest.mark.parametrize(
    ("pairs", "bounds", "counts"),
    [
        ([(0.1, 1.0), (math.inf, 3.0), (0.5, 2.0)], (0.1, 0.5), (1.0, 2.0, 3.0)),
        ([(0.1, 2.0), (0.5, 1.9), (math.inf, 3.0)], (0.1, 0.5), (2.0, 2.0, 3.0)),
        ([(0.1, -0.0001), (math.inf, 1.0)], (0.1,), (0.0, 1.0)),
    ],
    ids=["out of order", "crossed by extrapolation", "negative zero"],
)
def test_window_histograms_are_cumulative_and_ordered(
    pairs: list[tuple[float, float]], bounds: tuple[float, ...], counts: tuple[float, ...]
) -> None:
    histogram = histogram_from_buckets(pairs)
    assert histogram is not None
    assert (histogram.upper_bounds, histogram.cumulative_counts) == (bounds, counts)


def test_a_histogram_without_its_inf_bucket_is_unknown() -> None:
    assert histogram_from_buckets([(0.1, 1.0), (0.5, 2.0)]) is None


def test_a_group_with_unusual_buckets_loses_only_its_histogram() -> None:
    odd = [series("ttft_buckets", "g9", value, le=le) for le, value in (("0.3", "1"), ("+Inf", "2"))]
    gauges = [series(q, "g9", "0") for q in ("waiting", "running", "kv_usage", "sample_age")]
    metrics = metrics_by_group([*RECORDED, *odd, *gauges], LABELS)
    assert metrics["g9"].ttft is None and metrics["g9"].running_requests == 0.0
    assert metrics["g0"].ttft is not None and metrics["g1"].ttft is not None


def status_with(*groups: tuple[str, str], limited: str | None = None) -> ModelGroupStatus:
    conditions = ()
    if limited is not None:
        conditions = (
            Condition(
                type="ScalingLimited", status="True", last_transition_time=NOW, reason=limited, message=""
            ),
        )
    return ModelGroupStatus(
        groups=tuple(GroupStatus(name=name, state=state, created_at=NOW) for name, state in groups),  # type: ignore[arg-type]
        conditions=conditions,
    )


def test_group_states_come_from_the_status_and_metrics_only_to_ready_groups() -> None:
    metrics = metrics_by_group(RECORDED, LABELS)
    status = status_with(("g0", "Ready"), ("g1", "Draining"), ("g2", "Warming"))
    observed = group_observations(MODEL_GROUP, status, metrics, now=NOW.timestamp())
    by_name = {group.name: group for group in observed}
    assert by_name["g0"].metrics == metrics["g0"]
    assert by_name["g1"].metrics is None and by_name["g1"].state == "Draining"
    assert by_name["g2"].state == "Warming" and by_name["g2"].created_at == NOW.timestamp()
    assert len(observed) == 3  # two wanted, two live (ready and warming): none missing


def test_a_ready_group_without_series_stays_in_the_snapshot_without_metrics() -> None:
    status = status_with(("g0", "Ready"), ("g5", "Ready"))
    observed = group_observations(MODEL_GROUP, status, metrics_by_group(RECORDED, LABELS), now=0.0)
    assert [(group.name, group.metrics is None) for group in observed] == [("g0", False), ("g5", True)]


@pytest.mark.parametrize(
    ("groups", "limited", "placeholders", "unschedulable"),
    [
        ((("g0", "Ready"),), None, 1, False),
        ((("g0", "Ready"), ("g1", "Failed")), None, 1, False),
        ((("g0", "Ready"),), "InsufficientGPUs", 1, True),
        ((("g0", "Ready"),), "TooManyReplicas", 1, False),
        ((("g0", "Ready"), ("g1", "Placing"), ("g2", "Ready")), None, 0, False),
    ],
    ids=[
        "a wanted group not created yet is on its way",
        "a failed group's replacement is on its way",
        "a group that cannot be placed is unschedulable",
        "the autoscaler's own limit is not a placement problem",
        "more groups than wanted: none on the way",
    ],
)
def test_groups_wanted_but_not_created(
    groups: tuple[tuple[str, str], ...], limited: str | None, placeholders: int, unschedulable: bool
) -> None:
    observed = group_observations(MODEL_GROUP, status_with(*groups, limited=limited), {}, now=NOW.timestamp())
    wanted = [group for group in observed if group.name.startswith("wanted-")]
    assert len(wanted) == placeholders
    assert all(group.state == "Placing" and group.unschedulable is unschedulable for group in wanted)


def test_the_snapshot_carries_the_spec_count_profile_and_window() -> None:
    policy = compiled()
    snapshot = build_snapshot(MODEL_GROUP, status_with(("g0", "Ready")), policy, {}, now=1.0)
    assert (snapshot.spec_replicas, snapshot.name, snapshot.metrics_window_seconds) == (2, "llama", 30.0)
    assert snapshot.profile is policy.profile


def test_the_ready_time_a_decision_expects_is_the_declared_one_else_the_groups_measured_ones() -> None:
    measured = ModelGroupStatus(
        groups=tuple(
            GroupStatus(
                name=f"g{index}",
                state="Ready",
                created_at=NOW,
                ready_time=ReadyTime(
                    placing_seconds=1.0,
                    provisioning_seconds=seconds - 2.0,
                    warming_seconds=1.0,
                    total_seconds=seconds,
                ),
            )
            for index, seconds in enumerate((40.0, 90.0, 50.0))
        )
    )
    learnt = build_snapshot(MODEL_GROUP, measured, compiled(), {}, now=1.0)
    assert (learnt.group_ready_seconds, learnt.group_ready_source) == (50.0, "measured")
    profile = {
        **MODEL_GROUP.spec.profile.model_dump(by_alias=True, exclude_none=True),
        "readyTimeSeconds": 300,
    }
    declared = MODEL_GROUP.model_copy(
        update={"spec": MODEL_GROUP.spec.model_copy(update={"profile": Profile.model_validate(profile)})}
    )
    prior = build_snapshot(declared, measured, compiled(), {}, now=1.0)
    assert (prior.group_ready_seconds, prior.group_ready_source) == (300.0, "prior")
    # Once five groups were recorded in status.readyTime.recent (kept after the groups are gone),
    # their 90th percentile replaces the declared figure.
    recent = tuple(
        ReadySample(group=f"old{index}", ready_at=NOW, total_seconds=seconds)
        for index, seconds in enumerate((100.0, 110.0, 120.0, 130.0, 200.0))
    )
    history = measured.model_copy(update={"ready_time": ReadyTimeSummary(samples=5, recent=recent)})
    distribution = build_snapshot(declared, history, compiled(), {}, now=1.0)
    assert (distribution.group_ready_seconds, distribution.group_ready_source) == (200.0, "measured")
    assert (
        build_snapshot(
            MODEL_GROUP, status_with(("g0", "Placing")), compiled(), {}, now=1.0
        ).group_ready_seconds
        is None
    )


def _with_drain_target(drain_target_seconds: float | None, goodput_window_seconds: float) -> CompiledPolicy:
    """The test policy with its queue-work drain target (None: the signal off) and goodput window."""
    policy = compiled()
    signals = policy.policy.signals
    queue_work = (
        None
        if drain_target_seconds is None
        else dataclasses.replace(signals.queue_work, drain_target_seconds=drain_target_seconds)
    )
    scaling = dataclasses.replace(policy.policy, signals=dataclasses.replace(signals, queue_work=queue_work))
    return dataclasses.replace(policy, policy=scaling, metrics_window_seconds=goodput_window_seconds)


@pytest.mark.parametrize(
    ("name", "drain_target_seconds", "goodput_window_seconds", "setting_seconds", "rate_seconds"),
    [
        ("the setting, above a short drain target", 5.0, 300.0, 60.0, 60),
        ("a drain target longer than the setting", 600.0, 900.0, 60.0, 600),
        ("a drain target capped by the goodput window", 600.0, 300.0, 60.0, 300),
        ("the setting capped by the goodput window", 5.0, 30.0, 120.0, 30),
        ("queue work off: the setting", None, 900.0, 60.0, 60),
    ],
)
def test_the_rate_window_reads_over_the_drain_target_and_never_past_the_policy_window(
    name: str,
    drain_target_seconds: float | None,
    goodput_window_seconds: float,
    setting_seconds: float,
    rate_seconds: int,
) -> None:
    policy = _with_drain_target(drain_target_seconds, goodput_window_seconds)
    windows = query_windows(policy, setting_seconds)
    assert windows == Windows(rate_seconds=rate_seconds, histogram_seconds=round(goodput_window_seconds)), (
        name
    )


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A local port that accepts connections and never answers: a Prometheus that hangs."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(timeout=2)
        for connection in accepted:
            connection.close()
        listener.close()


def test_a_prometheus_that_is_down_is_unavailable_at_once() -> None:
    source = PrometheusMetricsSource(f"http://127.0.0.1:{free_port()}", LABELS, timeout_seconds=2.0)
    with pytest.raises(MetricsUnavailableError, match=r"is unreachable: .*Connection refused"):
        source.read("serving", "llama", Windows(60, 300))


def test_a_prometheus_that_hangs_is_unavailable_after_the_timeout(silent_port: int) -> None:
    source = PrometheusMetricsSource(f"http://127.0.0.1:{silent_port}", LABELS, timeout_seconds=0.3)
    with pytest.raises(MetricsUnavailableError, match=r"did not answer within 0.3s"):
        source.read("serving", "llama", Windows(60, 300))


# vLLM's prompt-length buckets (1-2-5 steps up to the context window) for a 128k-token model.
PROMPT_BOUNDS = (
    1,
    2,
    5,
    10,
    20,
    50,
    100,
    200,
    500,
    1000,
    2000,
    5000,
    10_000,
    20_000,
    50_000,
    100_000,
    131_072,
)


def prompt_buckets(
    group: str, prompts: list[int], query: str = "prompt_tokens_buckets"
) -> list[dict[str, Any]]:
    """The `prompt_tokens_buckets` sub-query's answer (or `query`'s) for one group that finished
    `prompts`."""
    answer = [
        series(query, group, str(sum(1 for p in prompts if p <= bound)), le=str(float(bound)))
        for bound in PROMPT_BOUNDS
    ]
    return [*answer, series(query, group, str(len(prompts)), le="+Inf")]


def ready_status() -> ModelGroupStatus:
    return ModelGroupStatus(
        groups=tuple(GroupStatus(name=name, state="Ready", created_at=NOW) for name in ("g0", "g1"))
    )


def test_prompt_lengths_give_each_class_its_threshold_and_infeasible_share() -> None:
    """Half of g1's prompts are 100k tokens: past what an idle H100 prefills within 1 s."""
    answer = [
        *RECORDED,
        *prompt_buckets("g0", [256] * 90),
        *prompt_buckets("g1", [256] * 45 + [100_000] * 45),
    ]
    metrics = metrics_by_group(answer, LABELS)
    assert metrics["g1"].prompt_tokens is not None and metrics["g1"].prompt_tokens.total == 90
    snapshot = build_snapshot(MODEL_GROUP, ready_status(), compiled(), metrics, now=NOW.timestamp())
    (chat,) = snapshot.feasibility
    assert chat.class_name == "chat"
    assert 1000 < chat.longest_feasible_prompt_tokens < 100_000
    assert chat.infeasible_request_share == pytest.approx(45 / 180)
    assert chat.infeasible_token_share is not None and chat.infeasible_token_share > 0.95


def test_without_prompt_lengths_feasibility_is_unknown_not_invented() -> None:
    snapshot = build_snapshot(
        MODEL_GROUP, ready_status(), compiled(), metrics_by_group(RECORDED, LABELS), now=NOW.timestamp()
    )
    (chat,) = snapshot.feasibility
    assert chat.longest_feasible_prompt_tokens > 0
    assert chat.infeasible_request_share is None
    assert chat.feasible_request_fraction == 1.0


LOOKBACK = "prompt_tokens_lookback_buckets"


def test_a_window_that_finished_no_prompt_reads_the_lookback_instead_of_turning_unknown() -> None:
    """Long prefills can finish nothing for a whole window: the last ten minutes' prompt lengths
    (every one 100k tokens) keep the infeasible share known."""
    answer = [
        *RECORDED,
        *prompt_buckets("g0", []),
        *prompt_buckets("g1", []),
        *prompt_buckets("g0", [100_000] * 3, LOOKBACK),
        *prompt_buckets("g1", [100_000] * 2, LOOKBACK),
    ]
    metrics = metrics_by_group(answer, LABELS)
    lookback = metrics["g0"].prompt_tokens_lookback
    assert lookback is not None and lookback.total == 3
    snapshot = build_snapshot(MODEL_GROUP, ready_status(), compiled(), metrics, now=NOW.timestamp())
    (chat,) = snapshot.feasibility
    assert chat.infeasible_request_share == 1.0


def test_the_windows_own_prompt_lengths_win_over_the_lookback() -> None:
    """Traffic that turned short within the window is judged on the window: the long prompts of the
    lookback are history, and counting them would starve feasible demand."""
    answer = [
        *RECORDED,
        *prompt_buckets("g0", [256] * 10),
        *prompt_buckets("g0", [100_000] * 500, LOOKBACK),
    ]
    snapshot = build_snapshot(
        MODEL_GROUP, ready_status(), compiled(), metrics_by_group(answer, LABELS), now=NOW.timestamp()
    )
    assert snapshot.feasibility[0].infeasible_request_share == 0.0


def test_prefix_cache_hits_lengthen_the_feasible_threshold() -> None:
    cold = build_snapshot(
        MODEL_GROUP, ready_status(), compiled(), metrics_by_group(RECORDED, LABELS), now=NOW.timestamp()
    )
    warm_answer = [
        {**entry, "value": [entry["value"][0], "5000"]}
        if entry["metric"]["goodput_query"] == "prefix_hits"
        else entry
        for entry in RECORDED
    ]
    warm = build_snapshot(
        MODEL_GROUP, ready_status(), compiled(), metrics_by_group(warm_answer, LABELS), now=NOW.timestamp()
    )
    assert (
        warm.feasibility[0].longest_feasible_prompt_tokens
        > cold.feasibility[0].longest_feasible_prompt_tokens
    )


def test_infeasible_long_prompts_do_not_scale_the_recorded_groups_out() -> None:
    """50 requests waiting on g1, and every prompt the groups finished in the window was 100k tokens
    long: no number of groups meets the 1 s TTFT for them, so they ask for no group."""
    answer = [
        *(
            {**entry, "value": [entry["value"][0], "50"]}
            if entry["metric"] == {"goodput_query": "waiting", "group": "g1"}
            else entry
            for entry in RECORDED
        ),
        *prompt_buckets("g0", [100_000] * 90),
        *prompt_buckets("g1", [100_000] * 90),
    ]
    policy = compiled()
    snapshot = build_snapshot(
        MODEL_GROUP, ready_status(), policy, metrics_by_group(answer, LABELS), now=NOW.timestamp()
    )
    decision = decide(snapshot, policy.policy, DecisionState.initial(), NOW.timestamp())
    assert snapshot.feasibility[0].infeasible_request_share == 1.0
    assert decision.desired_groups <= 2
    counted = decide(
        dataclasses.replace(snapshot, feasibility=()), policy.policy, DecisionState.initial(), NOW.timestamp()
    )
    assert counted.desired_groups > 2  # the same waiting requests, counted as demand, would scale out


def test_during_a_rollout_surge_groups_are_not_capacity_on_its_way() -> None:
    """Two groups wanted, both of the old template and ready, one new group surging: the autoscaler
    sees two groups' capacity and nothing coming, as the new group replaces an old one."""
    old = (
        GroupStatus(name="g0", state="Ready", created_at=NOW, outdated=True),
        GroupStatus(name="g1", state="Ready", created_at=NOW, outdated=True),
    )
    status = ModelGroupStatus(groups=(*old, GroupStatus(name="g2", state="Placing", created_at=NOW)))
    observed = group_observations(MODEL_GROUP, status, {}, now=NOW.timestamp())
    assert [(group.name, group.state) for group in observed] == [
        ("g0", "Ready"),
        ("g1", "Ready"),
    ]


@pytest.fixture
def recording_prometheus() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """A Prometheus stand-in that answers an empty vector and records each request's headers."""
    seen: list[dict[str, str]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(dict(self.headers.items()))
            body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=2)


def test_queries_carry_the_bearer_token_as_it_is_now_and_the_extra_headers(
    recording_prometheus: tuple[str, list[dict[str, str]]], tmp_path: Path
) -> None:
    url, seen = recording_prometheus
    token = tmp_path / "token"
    token.write_text("first\n")
    connection = PrometheusConnection.from_settings(
        bearer_token_file=str(token), ca_file="", headers_json='{"X-Scope-OrgID": "ml-team"}'
    )
    source = PrometheusMetricsSource(url, LABELS, timeout_seconds=2.0, connection=connection)
    assert source.read("serving", "llama", Windows(60, 300)) == MetricsReading()
    token.write_text("rotated")
    source.read("serving", "llama", Windows(60, 300))
    source.close()
    assert [request["Authorization"] for request in seen] == ["Bearer first", "Bearer rotated"]
    assert all(request["X-Scope-OrgID"] == "ml-team" for request in seen)


def test_a_vanished_token_file_makes_metrics_unavailable_not_a_crash(
    recording_prometheus: tuple[str, list[dict[str, str]]], tmp_path: Path
) -> None:
    url, _ = recording_prometheus
    token = tmp_path / "token"
    token.write_text("t")
    connection = PrometheusConnection.from_settings(bearer_token_file=str(token), ca_file="", headers_json="")
    source = PrometheusMetricsSource(url, LABELS, timeout_seconds=2.0, connection=connection)
    token.unlink()
    with pytest.raises(MetricsUnavailableError, match="cannot read the bearer token"):
        source.read("serving", "llama", Windows(60, 300))


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"headers_json": "X-Scope-OrgID: ml"}, "GOODPUT_PROMETHEUS_HEADERS is not a JSON object"),
        (
            {"headers_json": '{"X-Scope-OrgID": 1}'},
            "GOODPUT_PROMETHEUS_HEADERS must be a JSON object of strings",
        ),
        (
            {"bearer_token_file": "/nonexistent/token"},
            "GOODPUT_PROMETHEUS_BEARER_TOKEN_FILE='/nonexistent/token'",
        ),
        ({"ca_file": "/nonexistent/ca.pem"}, "GOODPUT_PROMETHEUS_CA_FILE='/nonexistent/ca.pem'"),
    ],
    ids=["headers not JSON", "header value not a string", "missing token file", "missing CA file"],
)
def test_bad_connection_settings_name_the_setting(settings: dict[str, str], message: str) -> None:
    arguments = {"bearer_token_file": "", "ca_file": "", "headers_json": "", **settings}
    with pytest.raises(ValueError, match=re.escape(message)):
        PrometheusConnection.from_settings(**arguments)


def test_the_ca_bundle_verifies_prometheus(tmp_path: Path) -> None:
    bundle = tmp_path / "ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    with_ca = PrometheusConnection.from_settings(bearer_token_file="", ca_file=str(bundle), headers_json="")
    assert with_ca.session().verify == str(bundle)
    assert PrometheusConnection().session().verify is True
