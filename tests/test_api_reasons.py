"""The vocabulary: every word is usable where it is meant to go, none is defined twice, and the
controllers' reasons are its words (decisions' reasons: tests/test_autoscale_properties.py)."""

from __future__ import annotations

import re
from enum import StrEnum

import pytest

from goodput.api import reasons
from goodput.api.conditions import CONDITION_REASON_PATTERN, CONDITION_TYPE_PATTERN
from goodput.api.reasons import (
    AdmissionReason,
    Attainability,
    ConditionType,
    EventReason,
    Guard,
    NoFitReason,
    Reason,
    RouteReason,
    Signal,
    vocabulary,
)
from goodput.api.slopolicy import Signals

NAMESPACES = [
    ConditionType,
    Reason,
    Signal,
    Guard,
    EventReason,
    NoFitReason,
    Attainability,
    AdmissionReason,
    RouteReason,
]


def test_every_namespace_of_the_module_is_checked() -> None:
    """A namespace added to api.reasons without a place in NAMESPACES would escape every test here."""
    defined = {
        value
        for name, value in vars(reasons).items()
        if isinstance(value, type) and value.__module__ == reasons.__name__ and not name.startswith("_")
    }

    assert defined == set(NAMESPACES)


@pytest.mark.parametrize("namespace", NAMESPACES, ids=lambda namespace: namespace.__name__)
def test_values_are_unique_within_a_namespace(namespace: type) -> None:
    values = list(vocabulary(namespace).values())

    assert values
    assert len(values) == len(set(values))


def test_condition_types_and_reasons_pass_the_api_servers_condition_validation() -> None:
    for value in vocabulary(ConditionType).values():
        assert re.fullmatch(CONDITION_TYPE_PATTERN, value), value
    for namespace in (Reason, EventReason, Guard, AdmissionReason, RouteReason):
        for value in vocabulary(namespace).values():
            assert re.fullmatch(CONDITION_REASON_PATTERN, value), value
            assert value[0].isupper(), f"{value} must be CamelCase"


def test_signal_names_match_the_policy_fields_that_configure_them() -> None:
    configured = {field.alias for field in Signals.model_fields.values()}

    assert configured <= set(vocabulary(Signal).values())


@pytest.mark.parametrize("carrier", [NoFitReason, Attainability], ids=lambda carrier: carrier.__name__)
def test_reasons_the_controllers_carry_are_words_of_the_vocabulary(carrier: type[StrEnum]) -> None:
    """The placement limit and the SLOAttainable verdict become condition reasons: a value made up
    in the controller instead of taken from api.reasons would be a second vocabulary."""
    assert {member.value for member in carrier} <= set(vocabulary(Reason).values())
