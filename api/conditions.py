"""metav1.Condition and the pure update rule that keeps `lastTransitionTime` honest.

The controllers compute the whole condition list with `set_condition` as a value, compare it with
the one read, and only on a change apply the condition types they own (server-side apply merges
the list by `type`, keeping the other controllers' conditions).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Literal

from pydantic import Field

from goodput.api.base import StatusModel, Timestamp, to_kubernetes_time

# The validation that Kubernetes generates for metav1.Condition.
CONDITION_TYPE_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
CONDITION_REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"

ConditionStatus = Literal["True", "False", "Unknown"]


class Condition(StatusModel):
    """One aspect of the object's current state, in the shape of metav1.Condition."""

    type: str = Field(max_length=316, pattern=CONDITION_TYPE_PATTERN)
    """Type of condition in CamelCase, for example 'Ready' or 'ScalingLimited'."""
    status: ConditionStatus
    """Status of the condition: 'True', 'False' or 'Unknown'."""
    observed_generation: int | None = Field(default=None, ge=0, json_schema_extra={"format": "int64"})
    """The `metadata.generation` the condition was computed from; older than the current generation
    means the condition is out of date."""
    last_transition_time: Timestamp
    """When the condition last changed from one status to another."""
    reason: str = Field(min_length=1, max_length=1024, pattern=CONDITION_REASON_PATTERN)
    """Programmatic identifier of the cause of the last transition, in CamelCase."""
    message: str = Field(max_length=32768)
    """Human-readable details of the transition; may be empty."""


def find_condition(conditions: Sequence[Condition], condition_type: str) -> Condition | None:
    """The condition of that type, or None when it was never published."""
    return next((condition for condition in conditions if condition.type == condition_type), None)


def set_condition(conditions: Sequence[Condition], new: Condition, now: datetime) -> tuple[Condition, ...]:
    """The condition list with `new` in place of the condition of its type (appended if absent).

    `lastTransitionTime` moves to `now` only when the status flips (or the type is new); a changed
    reason, message or observedGeneration is recorded without resetting it, so the field keeps
    saying how long the condition has held. Order is preserved, so an unchanged input gives an
    equal output and the caller can skip the patch.
    """
    for index, old in enumerate(conditions):
        if old.type == new.type:
            transition = old.last_transition_time if old.status == new.status else to_kubernetes_time(now)
            updated = new.model_copy(update={"last_transition_time": transition})
            return (*conditions[:index], updated, *conditions[index + 1 :])
    return (*conditions, new.model_copy(update={"last_transition_time": to_kubernetes_time(now)}))
