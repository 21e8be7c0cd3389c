"""`goodput explain mg/NAME`: the recorded decisions as a reader sees them."""

from __future__ import annotations

import argparse
import dataclasses
from datetime import UTC, datetime
from typing import Any

import pytest
from test_autoscale_world import PERMISSIVE, group, load, ready_groups, world

from goodput.api.base import wire_dict
from goodput.api.modelgroup import ModelGroupStatus
from goodput.controllers.autoscale import decide
from goodput.controllers.autoscale.model import DecisionState, Mode
from goodput.controllers.autoscale.record import autoscaler_conditions, metrics_health, record_decisions
from goodput.operator import cmd_explain
from goodput.operator.cmd_explain import explain, parse_target, records

NOW = 1_800_000_000.0


def model_group_with_history() -> dict[str, Any]:
    scale_out = decide(world(*ready_groups(1, 1.5)), PERMISSIVE, DecisionState.initial(), NOW)
    held = decide(
        world(group(load(0.0, age=600.0), name="g0"), *ready_groups(2, 0.0)[1:]),
        PERMISSIVE,
        DecisionState.initial(),
        NOW + 15,
    )
    shadow = decide(
        world(*ready_groups(2, 2.5)),
        dataclasses.replace(PERMISSIVE, mode=Mode.ADVISORY, revision="next-2"),
        DecisionState.initial(),
        NOW + 15,
    )
    status = record_decisions(ModelGroupStatus(), active=scale_out, shadow=None)
    status = record_decisions(status, active=held, shadow=shadow)
    health = metrics_health(world(*ready_groups(2, 0.0)), 60.0)
    conditions = autoscaler_conditions(
        (), held, health, generation=2, now=datetime.fromtimestamp(held.time, UTC)
    )
    status = status.model_copy(update={"conditions": conditions, "ready_groups": 2})
    return {
        "metadata": {"name": "chat", "namespace": "serving"},
        "spec": {
            "replicas": 2,
            "minReplicas": 1,
            "maxReplicas": 50,
            "policyRef": {"name": "interactive"},
            "shadowPolicyRef": {"name": "interactive-next"},
        },
        "status": wire_dict(status),
    }


@pytest.mark.parametrize(
    ("target", "name"),
    [
        ("mg/chat", "chat"),
        ("modelgroup/chat", "chat"),
        ("modelgroups.goodput.dev/chat", "chat"),
        ("chat", "chat"),
    ],
    ids=["short name", "kind", "resource with group", "bare name"],
)
def test_targets(target: str, name: str) -> None:
    assert parse_target(target) == name


@pytest.mark.parametrize("target", ["deploy/chat", "mg/"], ids=["another kind", "no name"])
def test_targets_that_are_not_model_groups(target: str) -> None:
    with pytest.raises(ValueError, match="mg/NAME"):
        parse_target(target)


def test_the_table_lists_the_latest_decision_then_the_changes() -> None:
    text = explain(model_group_with_history())
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("TIME"))
    for column in cmd_explain.EXPLAIN_COLUMNS:
        assert column in lines[header]
    latest, change = lines[header + 1], lines[header + 2]
    assert latest.startswith("2027-01-15T08:00:15Z *")
    assert "2→2" in latest and "StaleMetricsHoldScaleIn" in latest and "test-1" in latest
    assert "1→2" in change and "queueWork" in change and "queueWork=2" in change and "minReplicas=1" in change


def test_the_account_names_policies_conditions_and_each_proposals_inputs() -> None:
    text = explain(model_group_with_history())
    assert text.startswith("ModelGroup serving/chat: policy interactive, shadow policy interactive-next")
    assert "spec.replicas 2 (min 1, max 50), ready 2" in text
    assert "ScalingActive=True SignalsComputed" in text
    assert "MetricsAvailable=True MetricsFresh" in text
    latest = "Latest decision at 2027-01-15T08:00:15Z: 2→2 (StaleMetricsHoldScaleIn; "
    assert latest + "policy revision test-1, Active)" in text
    assert "guards: StaleMetricsHoldScaleIn" in text
    shadow = text[text.index("Shadow policy interactive-next") :]
    assert "policy revision next-2, Advisory" in shadow
    assert "lambda_w=" in shadow  # the queueWork proposal's inputs


def test_a_model_group_without_decisions_says_so() -> None:
    text = explain({"metadata": {"name": "chat", "namespace": "serving"}, "spec": {"replicas": 1}})
    assert "policy (none)" in text and "no decision recorded yet" in text


def test_json_output_is_the_records_as_stored() -> None:
    body = model_group_with_history()
    stored = records(body)
    assert stored["lastDecision"] == body["status"]["lastDecision"]
    assert stored["decisions"] == body["status"]["decisions"]
    assert stored["shadowDecision"]["shadow"] is True


def test_a_bad_target_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(
        target="deploy/chat", namespace=None, kubeconfig=None, context=None, output="table"
    )
    assert cmd_explain.run(args) == 2
    assert "use mg/NAME" in capsys.readouterr().err


def test_a_line_per_class_on_its_feasible_demand() -> None:
    body = model_group_with_history()
    body["status"]["feasibility"] = [
        {
            "name": "interactive",
            "longestFeasiblePromptTokens": 24600,
            "infeasibleShare": 0.125,
            "attainmentOffered": 0.81,
            "attainmentAttainable": 0.97,
        },
        {
            "name": "realtime",
            "longestFeasiblePromptTokens": 0,
            "infeasibleShare": 1.0,
            "unmetField": "itlSeconds",
        },
        {"name": "batch", "longestFeasiblePromptTokens": 900000},
    ]
    body["status"]["conditions"].append(
        {
            "type": "SLOAttainable",
            "status": "False",
            "reason": "InfeasibleDemand",
            "message": "class interactive: ...",
        }
    )
    text = explain(body)
    assert "SLOAttainable=False InfeasibleDemand: class interactive: ..." in text
    assert (
        "feasibility interactive: prompts over 24600 tokens cannot meet the TTFT target (12.5% of prompts); "
        "attainment 0.81 of offered, 0.97 of attainable"
    ) in text
    assert "feasibility realtime: no request can meet itlSeconds" in text
    assert "feasibility batch: prompts over 900000 tokens cannot meet the TTFT target (share unknown)" in text
    assert records(body)["feasibility"] == body["status"]["feasibility"]
