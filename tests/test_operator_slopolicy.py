"""The SLOPolicy controller: accept a revision or say why not, record it, list the bound groups."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from goodput.api.conditions import find_condition
from goodput.api.reasons import ConditionType, EventReason, Reason
from goodput.api.slopolicy import SloPolicyStatus
from goodput.controllers.compile.slo_policy import parse_slo_policy, policy_problems, reconcile_policy
from goodput.controllers.ownership import POLICY_STATUS

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
POLICY: dict[str, Any] = {
    "apiVersion": "goodput.dev/v1alpha1",
    "kind": "SLOPolicy",
    "metadata": {"name": "interactive", "namespace": "serving", "generation": 1},
    "spec": {
        "revision": "r1",
        "classes": [{"name": "chat", "ttftSeconds": 1.0, "itlSeconds": 0.08, "attainment": 0.99}],
        "autoscaling": {"intervalSeconds": 15},
    },
}


def policy(**autoscaling: Any) -> dict[str, Any]:
    changed = copy.deepcopy(POLICY)
    changed["spec"]["autoscaling"].update(autoscaling)
    return changed


def parsed(raw: dict[str, Any]) -> Any:
    result = parse_slo_policy(raw)
    assert not isinstance(result, str), result
    return result


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (
            policy(scaleDown={"stabilizationWindowSeconds": 10}),
            "spec.autoscaling.scaleDown.stabilizationWindowSeconds: 10s is shorter than",
        ),
        (
            policy(signals={"goodput": {"attainmentFloor": 0.995}}),
            "spec.autoscaling.signals.goodput.attainmentFloor: 0.995 is above every class's",
        ),
    ],
    ids=["stabilisation window shorter than the interval", "goodput floor above every target"],
)
def test_cross_field_problems(raw: dict[str, Any], problem: str) -> None:
    problems = policy_problems(parsed(raw).spec)
    assert len(problems) == 1 and problems[0].startswith(problem)


@pytest.mark.parametrize(
    "raw",
    [
        POLICY,
        policy(scaleDown={"stabilizationWindowSeconds": 0}),
        policy(signals={"goodput": {"enabled": False, "attainmentFloor": 0.995}}),
    ],
    ids=["defaults", "no stabilisation at all", "floor of a disabled signal"],
)
def test_sound_policies_have_no_problems(raw: dict[str, Any]) -> None:
    assert policy_problems(parsed(raw).spec) == ()


def test_an_accepted_policy_records_its_revision_and_bound_groups() -> None:
    result = reconcile_policy(
        SloPolicyStatus(),
        generation=1,
        policy=parsed(POLICY),
        bound_model_groups=["llama-70b", "llama-8b", "llama-70b"],
        now=NOW,
    )
    accepted = find_condition(result.status.conditions, ConditionType.ACCEPTED)
    assert accepted is not None and (accepted.status, accepted.reason) == ("True", Reason.ACCEPTED)
    assert (result.status.observed_generation, result.status.observed_revision) == (1, "r1")
    assert result.status.bound_model_groups == ("llama-70b", "llama-8b")
    assert [e.reason for e in result.events] == [EventReason.POLICY_ACCEPTED]


def test_events_only_on_transitions() -> None:
    first = reconcile_policy(
        SloPolicyStatus(), generation=1, policy=parsed(POLICY), bound_model_groups=[], now=NOW
    )
    again = reconcile_policy(
        first.status,
        generation=1,
        policy=parsed(POLICY),
        bound_model_groups=[],
        now=NOW + timedelta(seconds=5),
    )
    assert again.events == ()
    assert again.status == first.status


def test_a_rejected_revision_keeps_the_last_accepted_one() -> None:
    accepted = reconcile_policy(
        SloPolicyStatus(), generation=1, policy=parsed(POLICY), bound_model_groups=[], now=NOW
    ).status
    bad = policy(scaleDown={"stabilizationWindowSeconds": 5})
    bad["spec"]["revision"] = "r2"
    result = reconcile_policy(accepted, generation=2, policy=parsed(bad), bound_model_groups=[], now=NOW)
    condition = find_condition(result.status.conditions, ConditionType.ACCEPTED)
    assert condition is not None and (condition.status, condition.reason) == ("False", Reason.INVALID_SPEC)
    assert (result.status.observed_generation, result.status.observed_revision) == (2, "r1")
    assert [e.reason for e in result.events] == [EventReason.INVALID_SPEC]


def test_an_unreadable_policy_is_rejected_with_the_field() -> None:
    raw = copy.deepcopy(POLICY)
    raw["spec"]["classes"][0]["e2eSeconds"] = 0.5
    result = reconcile_policy(
        SloPolicyStatus(), generation=1, policy=parse_slo_policy(raw), bound_model_groups=[], now=NOW
    )
    condition = find_condition(result.status.conditions, ConditionType.ACCEPTED)
    assert condition is not None and condition.status == "False"
    assert "e2eSeconds" in condition.message
    assert result.status.observed_revision is None


def test_the_policy_controller_applies_its_status_whole_as_its_own_field_manager() -> None:
    result = reconcile_policy(
        SloPolicyStatus(), generation=2, policy=parsed(POLICY), bound_model_groups=["llama"], now=NOW
    )
    body = POLICY_STATUS.apply_body("serving", "interactive", result.status)
    assert (POLICY_STATUS.field_manager, body["kind"], body["metadata"]) == (
        "goodput-policies",
        "SLOPolicy",
        {"name": "interactive", "namespace": "serving"},
    )
    assert body["status"]["observedGeneration"] == 2 and body["status"]["boundModelGroups"] == ["llama"]
    assert [(c["type"], c["status"]) for c in body["status"]["conditions"]] == [("Accepted", "True")]


def with_fallback(fallback: str) -> dict[str, Any]:
    raw = copy.deepcopy(POLICY)
    raw["spec"]["classes"][0]["degrade"] = {"rungs": ["Fallback", "Reject"], "fallbackModelGroup": fallback}
    return raw


FAMILIES = {"llama-70b": "llama-3.1", "llama-8b": "llama-3.1", "qwen-7b": "qwen-2.5", "bare": None}


@pytest.mark.parametrize(
    ("fallback", "status", "reason"),
    [
        ("llama-8b", "True", Reason.FALLBACKS_APPROVED),
        ("missing", "False", Reason.FALLBACK_MODEL_GROUP_NOT_FOUND),
        ("qwen-7b", "False", Reason.FALLBACK_OTHER_FAMILY),
        ("bare", "False", Reason.FALLBACK_FAMILY_UNKNOWN),
    ],
    ids=["same family", "missing", "other family", "no family label"],
)
def test_a_fallback_is_reported_on_the_policy_not_acted_on(fallback: str, status: str, reason: str) -> None:
    result = reconcile_policy(
        SloPolicyStatus(),
        generation=1,
        policy=parsed(with_fallback(fallback)),
        bound_model_groups=["llama-70b"],
        now=NOW,
        model_group_families=FAMILIES,
    )
    condition = find_condition(result.status.conditions, ConditionType.FALLBACKS_VALID)
    assert condition is not None and (condition.status, condition.reason) == (status, reason)
    if status == "False":
        assert fallback in condition.message and "llama-70b" in condition.message
    accepted = find_condition(result.status.conditions, ConditionType.ACCEPTED)
    assert accepted is not None and accepted.status == "True"  # the rest of the policy is in force


def test_the_fallback_condition_goes_when_no_class_names_a_fallback() -> None:
    first = reconcile_policy(
        SloPolicyStatus(),
        generation=1,
        policy=parsed(with_fallback("missing")),
        bound_model_groups=["llama-70b"],
        now=NOW,
        model_group_families=FAMILIES,
    )
    assert find_condition(first.status.conditions, ConditionType.FALLBACKS_VALID) is not None
    again = reconcile_policy(
        first.status,
        generation=2,
        policy=parsed(POLICY),
        bound_model_groups=["llama-70b"],
        now=NOW,
        model_group_families=FAMILIES,
    )
    assert find_condition(again.status.conditions, ConditionType.FALLBACKS_VALID) is None
