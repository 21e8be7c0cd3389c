"""set_condition: lastTransitionTime moves only when a condition's status flips."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from goodput.api.conditions import Condition, ConditionStatus, find_condition, set_condition
from goodput.api.reasons import ConditionType, Reason

T0 = datetime(2026, 7, 16, 9, 0, 0, tzinfo=UTC)
NOW = T0 + timedelta(minutes=5)


def condition(
    type_: str,
    status: ConditionStatus,
    reason: str,
    *,
    at: datetime = T0,
    message: str = "",
    generation: int = 1,
) -> Condition:
    return Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        observed_generation=generation,
        last_transition_time=at,
    )


@dataclass(frozen=True)
class SetConditionCase:
    existing: tuple[Condition, ...]
    new: Condition
    expected: tuple[Condition, ...]


READY_FALSE = condition(ConditionType.READY, "False", Reason.GROUPS_NOT_READY, message="0 of 2 groups ready")
SCALING = condition(ConditionType.SCALING_ACTIVE, "True", Reason.SIGNALS_COMPUTED)

CASES = {
    "first visit appends with now": SetConditionCase(
        existing=(),
        new=condition(ConditionType.READY, "Unknown", Reason.GROUPS_NOT_READY, at=NOW - timedelta(days=1)),
        expected=(condition(ConditionType.READY, "Unknown", Reason.GROUPS_NOT_READY, at=NOW),),
    ),
    "status flip moves the transition time": SetConditionCase(
        existing=(READY_FALSE, SCALING),
        new=condition(
            ConditionType.READY, "True", Reason.GROUPS_READY, at=NOW, message="2 of 2 groups ready"
        ),
        expected=(
            condition(
                ConditionType.READY, "True", Reason.GROUPS_READY, at=NOW, message="2 of 2 groups ready"
            ),
            SCALING,
        ),
    ),
    "same status keeps the transition time but takes reason, message and generation": SetConditionCase(
        existing=(READY_FALSE, SCALING),
        new=condition(
            ConditionType.READY, "False", Reason.GROUP_FAILED, at=NOW, message="group a failed", generation=2
        ),
        expected=(
            condition(
                ConditionType.READY,
                "False",
                Reason.GROUP_FAILED,
                at=T0,
                message="group a failed",
                generation=2,
            ),
            SCALING,
        ),
    ),
    "other types and their order are untouched": SetConditionCase(
        existing=(SCALING, READY_FALSE),
        new=condition(ConditionType.METRICS_AVAILABLE, "False", Reason.METRICS_STALE, at=NOW),
        expected=(
            SCALING,
            READY_FALSE,
            condition(ConditionType.METRICS_AVAILABLE, "False", Reason.METRICS_STALE, at=NOW),
        ),
    ),
    "unknown to true is a transition": SetConditionCase(
        existing=(condition(ConditionType.READY, "Unknown", Reason.GROUPS_NOT_READY),),
        new=condition(ConditionType.READY, "True", Reason.GROUPS_READY, at=NOW),
        expected=(condition(ConditionType.READY, "True", Reason.GROUPS_READY, at=NOW),),
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_set_condition(case: SetConditionCase) -> None:
    assert set_condition(case.existing, case.new, NOW) == case.expected


def test_repeating_the_same_condition_changes_nothing_so_the_patch_can_be_skipped() -> None:
    once = set_condition((READY_FALSE, SCALING), READY_FALSE, NOW)

    assert once == (READY_FALSE, SCALING)
    assert set_condition(once, READY_FALSE, NOW + timedelta(hours=1)) == once


def test_now_is_stored_as_kubernetes_stores_it() -> None:
    now = datetime(2026, 7, 16, 9, 5, 0, 999_999, tzinfo=UTC)

    updated = set_condition((), READY_FALSE, now)

    assert updated[0].last_transition_time == datetime(2026, 7, 16, 9, 5, 0, tzinfo=UTC)


def test_find_condition() -> None:
    conditions = (READY_FALSE, SCALING)

    assert find_condition(conditions, ConditionType.SCALING_ACTIVE) == SCALING
    assert find_condition(conditions, ConditionType.DEGRADED) is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("type", "not a type!"),
        ("type", "x" * 317),
        ("reason", ""),
        ("reason", "has spaces"),
        ("reason", "Trailing,"),
        ("status", "true"),
        ("message", "m" * 32769),
        ("observed_generation", -1),
    ],
    ids=[
        "type-pattern",
        "type-length",
        "empty-reason",
        "reason-spaces",
        "reason-trailing-comma",
        "lowercase-status",
        "message-length",
        "negative-generation",
    ],
)
def test_condition_fields_follow_metav1_validation(field: str, value: object) -> None:
    fields: dict[str, object] = {
        "type": "Ready",
        "status": "True",
        "reason": "GroupsReady",
        "message": "",
        "observed_generation": 1,
        "last_transition_time": T0,
    }
    fields[field] = value

    with pytest.raises(ValidationError):
        Condition.model_validate(fields)


TYPES = [ConditionType.READY, ConditionType.PROGRESSING, ConditionType.DEGRADED]
STATUSES: list[ConditionStatus] = ["True", "False", "Unknown"]
updates = st.lists(
    st.tuples(
        st.sampled_from(TYPES),
        st.sampled_from(STATUSES),
        st.sampled_from([Reason.STABLE, Reason.GROUP_FAILED]),
    ),
    max_size=30,
)


@given(updates)
def test_transition_time_is_the_time_of_the_last_status_change(
    sequence: list[tuple[str, ConditionStatus, str]],
) -> None:
    conditions: tuple[Condition, ...] = ()
    last_change: dict[str, datetime] = {}
    last_status: dict[str, str] = {}
    for minute, (type_, status, reason) in enumerate(sequence):
        now = T0 + timedelta(minutes=minute)
        conditions = set_condition(conditions, condition(type_, status, reason, at=now), now)
        if last_status.get(type_) != status:
            last_change[type_] = now
            last_status[type_] = status

    assert [c.type for c in conditions] == list(dict.fromkeys(type_ for type_, _, _ in sequence))
    for current in conditions:
        assert current.status == last_status[current.type]
        assert current.last_transition_time == last_change[current.type]
