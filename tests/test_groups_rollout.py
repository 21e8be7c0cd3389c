"""Rolling updates of complete groups, as transitions of the group state machine."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

import pydantic
import pytest
from test_groups import NOW, TEMPLATE, group, idle, world
from test_groups_lifecycle import moves

from goodput.api.modelgroup import ModelGroupSpec, ModelGroupStatus
from goodput.api.reasons import ConditionType, EventReason, Reason
from goodput.controllers import naming
from goodput.controllers.groups.controller import plan_model_group
from goodput.controllers.groups.model import RolloutProgress, RolloutRules, parse_rollout
from goodput.controllers.groups.observation import PodView
from goodput.controllers.groups.status import model_group_status

HOUR_AGO = NOW - timedelta(hours=1)
RECENT = NOW - timedelta(seconds=200)


def old(name: str, stage: str = "ready", domain: str = "a", **changes: Any) -> list[PodView]:
    """A group whose pods are of an older pod template."""
    return group(name, stage, domain=domain, **{"revision": "0ld", "created": HOUR_AGO, **changes})


def new(name: str, stage: str = "ready", domain: str = "c", **changes: Any) -> list[PodView]:
    return group(name, stage, domain=domain, **{"created": HOUR_AGO, **changes})


@dataclass(frozen=True)
class RolloutCase:
    name: str
    groups: tuple[list[PodView], ...]
    desired: int
    moves: list[tuple[str, str | None, str, str]]
    rules: RolloutRules = field(default_factory=RolloutRules)
    extra: dict[str, Any] = field(default_factory=dict)


CASES = [
    RolloutCase(
        "surge: a new group first, no old group leaves yet",
        (old("g0"), old("g1", domain="b")),
        2,
        [("g2", None, "Created", "Placing")],
    ),
    RolloutCase(
        "a new group ready: one old group drains and the next new one starts",
        (old("g0"), old("g1", domain="b"), new("g2")),
        2,
        [("g0", "Ready", "Outdated", "Draining"), ("g3", None, "Created", "Placing")],
    ),
    RolloutCase(
        "the surge is in use while the new group warms: nothing more",
        (old("g0"), old("g1", domain="b"), new("g2", "healthy", created=RECENT)),
        2,
        [],
        extra={"warmups_in_flight": frozenset({"g2"})},
    ),
    RolloutCase(
        "maxUnavailable without surge: an old group drains first, its replacement starts",
        (old("g0"), old("g1", domain="b")),
        2,
        [("g0", "Ready", "Outdated", "Draining"), ("g2", None, "Created", "Placing")],
        rules=RolloutRules(max_surge=0, max_unavailable=1),
    ),
    RolloutCase(
        "an old group not serving yet is replaced at once",
        (old("g0"), old("g1", "bound", domain="b", created=RECENT)),
        2,
        # The surge allows one group beyond the two wanted: two new groups start.
        [
            ("g1", "Provisioning", "Outdated", "Deleted"),
            ("g2", None, "Created", "Placing"),
            ("g3", None, "Created", "Placing"),
        ],
    ),
    RolloutCase(
        "the last old group leaves once every new one is ready",
        (old("g0"), new("g1", domain="b"), new("g2")),
        2,
        [("g0", "Ready", "Outdated", "Draining")],
    ),
    RolloutCase(
        "a scale-in during a rollout removes old groups first and keeps the surge",
        (old("g0"), old("g1", domain="b"), old("g2", domain="c"), new("g3", domain="d")),
        1,
        [
            ("g2", "Ready", "ScaledIn", "Draining"),
            ("g1", "Ready", "ScaledIn", "Draining"),
            ("g0", "Ready", "Outdated", "Draining"),
        ],
        extra={"leader_readings": idle("g0", "g1", "g2", "g3")},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_rollout_transitions(case: RolloutCase) -> None:
    plan = plan_model_group(world(*case.groups, desired=case.desired, rollout=case.rules, **case.extra))
    assert moves(plan) == case.moves


def test_status_shows_the_revision_and_updated_and_outdated_groups() -> None:
    plan = plan_model_group(world(old("g0"), old("g1", domain="b"), new("g2"), desired=2, group_counter=3))
    assert plan.rollout is not None
    assert (plan.rollout.revision, plan.rollout.updated, plan.rollout.outdated) == (TEMPLATE.revision, 2, 1)
    status = model_group_status(
        ModelGroupStatus(), name="llama", generation=1, desired_groups=2, plan=plan, now=NOW
    )
    assert (status.revision, status.updated_groups, status.outdated_groups) == (TEMPLATE.revision, 2, 1)
    (progressing,) = [c for c in status.conditions if c.type == ConditionType.PROGRESSING]
    assert (progressing.status, progressing.reason) == ("True", Reason.ROLLING_OUT)


def test_a_rollout_whose_new_groups_fail_stops_and_the_old_groups_keep_serving() -> None:
    first_failure = RolloutProgress(TEMPLATE.revision, failed=1)
    plan = plan_model_group(
        world(
            old("g0"),
            old("g1", domain="b"),
            new("g2", restarts=1),
            desired=2,
            group_counter=3,
            rollout_progress=first_failure,
        )
    )
    assert [m[2] for m in moves(plan)] == ["Replaced"]  # no new group, no old group leaves
    assert parse_rollout(plan.annotations[naming.ANNOTATION_ROLLOUT]) == RolloutProgress(TEMPLATE.revision, 2)
    assert [e.reason for e in plan.events] == [EventReason.GROUP_FAILED, EventReason.ROLLOUT_STALLED]
    status = model_group_status(
        ModelGroupStatus(), name="llama", generation=1, desired_groups=2, plan=plan, now=NOW
    )
    (progressing,) = [c for c in status.conditions if c.type == ConditionType.PROGRESSING]
    assert (progressing.status, progressing.reason) == ("False", Reason.ROLLOUT_STALLED)
    assert "2 failed group(s)" in progressing.message
    # Later passes stay stopped and say it only once.
    again = plan_model_group(
        world(
            old("g0"),
            old("g1", domain="b"),
            desired=2,
            group_counter=3,
            rollout_progress=RolloutProgress(TEMPLATE.revision, 2),
        )
    )
    assert moves(again) == [] and again.events == ()


def test_a_new_template_starts_a_stopped_rollout_afresh() -> None:
    stale = RolloutProgress("another", failed=5)
    plan = plan_model_group(world(old("g0"), desired=1, group_counter=1, rollout_progress=stale))
    assert [m[2] for m in moves(plan)] == ["Created"]
    assert parse_rollout(plan.annotations[naming.ANNOTATION_ROLLOUT]) == RolloutProgress(TEMPLATE.revision, 0)


def test_an_old_group_drained_by_the_rollout_is_not_put_back_but_a_current_one_is() -> None:
    draining_old = [replace(p, draining_since=NOW - timedelta(seconds=5)) for p in old("g0")]
    draining_new = [replace(p, draining_since=NOW - timedelta(seconds=5)) for p in new("g2")]
    plan = plan_model_group(
        world(
            draining_old,
            draining_new,
            new("g1", domain="b"),
            desired=2,
            group_counter=3,
            leader_readings=idle("g0", "g2"),
        )
    )
    assert [m[:3] for m in moves(plan)] == [("g2", "Draining", "ScaledOut")]


def test_both_rollout_limits_zero_is_refused_naming_the_field() -> None:
    spec = {
        "model": {"name": "m"},
        "engine": {"image": "i"},
        "parallelism": {"gpusPerPod": 1},
        "maxReplicas": 2,
    }
    with pytest.raises(pydantic.ValidationError, match=r"rollout\.maxSurge"):
        ModelGroupSpec.model_validate({**spec, "rollout": {"maxSurge": 0, "maxUnavailable": 0}})
