"""The vocabulary: every word is usable where it is meant to go, and none is defined twice."""

from __future__ import annotations

import re

import pytest

from goodput.api.conditions import CONDITION_REASON_PATTERN, CONDITION_TYPE_PATTERN
from goodput.api.reasons import ConditionType, EventReason, Guard, Reason, Signal, vocabulary
from goodput.api.slopolicy import Signals

NAMESPACES = [ConditionType, Reason, Signal, Guard, EventReason]


@pytest.mark.parametrize("namespace", NAMESPACES, ids=lambda namespace: namespace.__name__)
def test_values_are_unique_within_a_namespace(namespace: type) -> None:
    values = list(vocabulary(namespace).values())

    assert values
    assert len(values) == len(set(values))


def test_condition_types_and_reasons_pass_the_api_servers_condition_validation() -> None:
    for value in vocabulary(ConditionType).values():
        assert re.fullmatch(CONDITION_TYPE_PATTERN, value), value
    for namespace in (Reason, EventReason, Guard):
        for value in vocabulary(namespace).values():
            assert re.fullmatch(CONDITION_REASON_PATTERN, value), value
            assert value[0].isupper(), f"{value} must be CamelCase"


def test_signal_names_match_the_policy_fields_that_configure_them() -> None:
    configured = {field.alias for field in Signals.model_fields.values()}

    assert configured <= set(vocabulary(Signal).values())


def test_the_design_conditions_are_all_defined() -> None:
    assert set(vocabulary(ConditionType).values()) >= {
        "Ready",
        "Progressing",
        "Degraded",
        "ScalingActive",
        "ScalingLimited",
        "MetricsAvailable",
        "Accepted",
    }
