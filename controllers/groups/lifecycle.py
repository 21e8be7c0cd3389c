"""A group's lifecycle as a state machine: every transition written once, named by its cause.

    (none) ──Created──▶ Placing ──Bound──▶ Provisioning ──Started──▶ Warming ──WarmedUp──▶ Ready
    Ready ──ScaledIn──▶ Draining ──Drained / DrainTimedOut──▶ Deleted
    Draining ──ScaledOut──▶ Ready                       (a scale-out puts a warm group back in service)
    Placing / Provisioning / Warming ──ScaledIn──▶ Deleted   (removed before it served anything)
    Ready ──Outdated──▶ Draining; Placing / Provisioning / Warming ──Outdated──▶ Deleted
                                                (a rollout replaces a group of an older template)
    any live state ──RankFailed──▶ Failed; Placing ──ScheduleTimedOut──▶ Failed;
    Placing ──NodesNotProvisioned──▶ Failed     (a group waiting for new nodes got none in time)
    Provisioning / Warming ──StartupTimedOut──▶ Failed; Failed ──Replaced──▶ Deleted

Bound, Started and the failures are observed in the group's pods (`assess`); the other transitions
are decisions of one tick (`stages`), each recorded in the plan as a `GroupTransition`. A decision
that names a transition the table does not hold is a bug and raises, so no stage can move a group
in a way the machine does not allow (for example, drain a group that is not serving).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from goodput.api.modelgroup import GroupState

# A group no longer exists: its pods are being deleted.
Phase = GroupState | Literal["Deleted"]


class GroupEvent(StrEnum):
    """What moves a group from one state to the next."""

    CREATED = "Created"
    BOUND = "Bound"
    STARTED = "Started"
    WARMED_UP = "WarmedUp"
    SCALED_IN = "ScaledIn"
    SCALED_OUT = "ScaledOut"
    OUTDATED = "Outdated"
    DRAINED = "Drained"
    DRAIN_TIMED_OUT = "DrainTimedOut"
    RANK_FAILED = "RankFailed"
    SCHEDULE_TIMED_OUT = "ScheduleTimedOut"
    NODES_NOT_PROVISIONED = "NodesNotProvisioned"
    STARTUP_TIMED_OUT = "StartupTimedOut"
    REPLACED = "Replaced"


# (state before, event) -> state after. None before: the group does not exist yet.
TRANSITIONS: dict[tuple[GroupState | None, GroupEvent], Phase] = {
    (None, GroupEvent.CREATED): "Placing",
    ("Placing", GroupEvent.BOUND): "Provisioning",
    ("Provisioning", GroupEvent.STARTED): "Warming",
    ("Warming", GroupEvent.WARMED_UP): "Ready",
    ("Ready", GroupEvent.SCALED_IN): "Draining",
    ("Draining", GroupEvent.SCALED_OUT): "Ready",
    ("Draining", GroupEvent.DRAINED): "Deleted",
    ("Draining", GroupEvent.DRAIN_TIMED_OUT): "Deleted",
    ("Placing", GroupEvent.SCALED_IN): "Deleted",
    ("Provisioning", GroupEvent.SCALED_IN): "Deleted",
    ("Warming", GroupEvent.SCALED_IN): "Deleted",
    ("Ready", GroupEvent.OUTDATED): "Draining",
    ("Placing", GroupEvent.OUTDATED): "Deleted",
    ("Provisioning", GroupEvent.OUTDATED): "Deleted",
    ("Warming", GroupEvent.OUTDATED): "Deleted",
    ("Placing", GroupEvent.SCHEDULE_TIMED_OUT): "Failed",
    ("Placing", GroupEvent.NODES_NOT_PROVISIONED): "Failed",
    ("Provisioning", GroupEvent.STARTUP_TIMED_OUT): "Failed",
    ("Warming", GroupEvent.STARTUP_TIMED_OUT): "Failed",
    **{
        (state, GroupEvent.RANK_FAILED): "Failed" for state in ("Placing", "Provisioning", "Warming", "Ready")
    },
    ("Draining", GroupEvent.RANK_FAILED): "Failed",
    ("Failed", GroupEvent.REPLACED): "Deleted",
}


class IllegalTransitionError(ValueError):
    """A decision asked for a transition the lifecycle does not have."""


def next_phase(state: GroupState | None, event: GroupEvent) -> Phase:
    """The state `event` moves a group in `state` to."""
    after = TRANSITIONS.get((state, event))
    if after is None:
        raise IllegalTransitionError(f"no transition {event} from {state or 'nothing'}")
    return after


@dataclass(frozen=True, slots=True)
class GroupTransition:
    """One group's move in one tick, and why (the message of its condition or Event)."""

    group: str
    before: GroupState | None
    event: GroupEvent
    after: Phase
    message: str = ""


def transition(
    group: str, before: GroupState | None, event: GroupEvent, message: str = ""
) -> GroupTransition:
    """The transition `event` causes, checked against the table."""
    return GroupTransition(group, before, event, next_phase(before, event), message)
