"""The group lifecycle as a state machine: the table, and every plan's moves checked against it."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_groups import NOW, RULES, STAGES, TEMPLATE, apply, group, idle, world

from goodput.api.modelgroup import ACTIVE_STATES
from goodput.controllers.groups.controller import plan_model_group
from goodput.controllers.groups.drain import LeaderSample
from goodput.controllers.groups.lifecycle import TRANSITIONS, GroupEvent, IllegalTransitionError, next_phase
from goodput.controllers.groups.model import Plan, WarmupOutcome, World

LEGAL = [
    (None, GroupEvent.CREATED, "Placing"),
    ("Placing", GroupEvent.BOUND, "Provisioning"),
    ("Provisioning", GroupEvent.STARTED, "Warming"),
    ("Warming", GroupEvent.WARMED_UP, "Ready"),
    ("Ready", GroupEvent.SCALED_IN, "Draining"),
    ("Draining", GroupEvent.SCALED_OUT, "Ready"),
    ("Draining", GroupEvent.DRAINED, "Deleted"),
    ("Draining", GroupEvent.DRAIN_TIMED_OUT, "Deleted"),
    ("Placing", GroupEvent.SCALED_IN, "Deleted"),
    ("Warming", GroupEvent.SCALED_IN, "Deleted"),
    ("Placing", GroupEvent.SCHEDULE_TIMED_OUT, "Failed"),
    ("Warming", GroupEvent.STARTUP_TIMED_OUT, "Failed"),
    ("Ready", GroupEvent.RANK_FAILED, "Failed"),
    ("Draining", GroupEvent.RANK_FAILED, "Failed"),
    ("Failed", GroupEvent.REPLACED, "Deleted"),
]


@pytest.mark.parametrize(("before", "event", "after"), LEGAL, ids=str)
def test_each_named_transition_leads_where_the_lifecycle_says(
    before: str | None, event: GroupEvent, after: str
) -> None:
    assert next_phase(before, event) == after  # type: ignore[arg-type]


ILLEGAL = [
    ("Warming", GroupEvent.SCALED_OUT, "only a draining group goes back in service"),
    ("Provisioning", GroupEvent.WARMED_UP, "a group is warmed up only once every rank runs"),
    ("Placing", GroupEvent.DRAINED, "only a draining group drains"),
    ("Warming", GroupEvent.SCHEDULE_TIMED_OUT, "a bound group cannot time out placing"),
    ("Ready", GroupEvent.REPLACED, "only a failed group is replaced"),
    (None, GroupEvent.SCALED_IN, "nothing that does not exist is removed"),
    ("Failed", GroupEvent.SCALED_OUT, "a failed group never serves again"),
]


@pytest.mark.parametrize(("before", "event", "why"), ILLEGAL, ids=[case[2] for case in ILLEGAL])
def test_transitions_the_lifecycle_does_not_have_are_refused(
    before: str | None, event: GroupEvent, why: str
) -> None:
    with pytest.raises(IllegalTransitionError, match=str(event)):
        next_phase(before, event)  # type: ignore[arg-type]


def test_every_event_is_used_and_deleted_is_terminal() -> None:
    assert {event for _, event in TRANSITIONS} == set(GroupEvent)
    assert all(before != "Deleted" for before, _ in TRANSITIONS)


def moves(plan: Plan) -> list[tuple[str, str | None, str, str]]:
    return [(t.group, t.before, str(t.event), t.after) for t in plan.transitions]


def test_a_burst_then_a_failure_then_scale_in_during_a_new_burst() -> None:
    """Named transitions of the scenario the simulator replays too, one tick at a time."""
    young = replace(RULES, min_lifetime_seconds=0)
    burst = plan_model_group(world(group("g0", "ready"), desired=3, group_counter=1, rules=young))
    assert moves(burst) == [("g1", None, "Created", "Placing"), ("g2", None, "Created", "Placing")]
    failed = plan_model_group(
        world(group("g0", "ready", restarts=1), group("g1", "ready", domain="b"), desired=2)
    )
    assert moves(failed)[0][1:] == ("Failed", "Replaced", "Deleted")
    assert moves(failed)[1][2:] == ("Created", "Placing")
    scale_in = plan_model_group(scale_in_world(young))
    assert [m[2:] for m in moves(scale_in)] == [("ScaledIn", "Draining")]
    drained = moves(scale_in)[0][0]
    # A new burst while that group drains: it goes back in service before anything is created.
    during_drain = replace(apply(scale_in_world(young), scale_in), desired_groups=3)
    new_burst = plan_model_group(during_drain)
    assert moves(new_burst)[0] == (drained, "Draining", "ScaledOut", "Ready")
    assert [m[2] for m in moves(new_burst)[1:]] == ["Created"]


def scale_in_world(rules: object) -> World:
    return world(
        group("g0", "ready", created=NOW - timedelta(hours=1)),
        group("g1", "ready", domain="b", created=NOW - timedelta(hours=1)),
        desired=1,
        leader_readings=idle("g0", "g1"),
        rules=rules,
    )


def test_a_group_ready_and_chosen_in_one_tick_moves_twice_and_is_never_marked_ready() -> None:
    plan = plan_model_group(
        world(
            group("g0", "ready", created=NOW - timedelta(hours=1)),
            group("g1", "healthy", domain="c"),
            desired=1,
            rules=replace(RULES, min_lifetime_seconds=0),
            warmups={"g1": WarmupOutcome(True, NOW)},
            leader_readings={"g0": LeaderSample(NOW, 5, 0), "g1": LeaderSample(NOW, 0, 0)},
        )
    )
    assert moves(plan) == [
        ("g1", "Warming", "WarmedUp", "Ready"),
        ("g1", "Ready", "ScaledIn", "Draining"),
    ]
    assert plan.ready == () and "GroupReady" not in [e.reason for e in plan.events]


@settings(max_examples=150, deadline=None)
@given(
    stages=st.lists(st.sampled_from(STAGES), max_size=5),
    desired=st.integers(min_value=0, max_value=6),
    restarted=st.sets(st.integers(min_value=0, max_value=4)),
    warmed=st.sets(st.integers(min_value=0, max_value=4)),
    outdated=st.sets(st.integers(min_value=0, max_value=4)),
)
def test_every_plan_moves_groups_only_along_the_lifecycle(
    stages: list[str], desired: int, restarted: set[int], warmed: set[int], outdated: set[int]
) -> None:
    """Per group, the plan's moves chain from its observed state to its final state, each legal;
    and the active groups after the plan never exceed what is wanted unless young groups stay."""
    groups = [
        group(
            f"g{i}",
            stage,
            domain="abcd"[i % 4],
            created=NOW - timedelta(hours=1),
            restarts=int(i in restarted),
            revision="0ld" if i in outdated else TEMPLATE.revision,
        )
        for i, stage in enumerate(stages)
    ]
    w = world(
        *groups,
        desired=desired,
        group_counter=len(stages),
        warmups={f"g{i}": WarmupOutcome(True, NOW) for i in warmed},
        leader_readings=idle(*(f"g{i}" for i in range(len(stages)))),
    )
    plan = plan_model_group(w)
    current: dict[str, str | None] = {}
    for step in plan.transitions:
        assert step.before == current.get(step.group, step.before)
        assert next_phase(step.before, step.event) == step.after  # type: ignore[arg-type]
        current[step.group] = step.after
    final = {a.name: a.state for a in plan.groups}
    for name, step in {t.group: t for t in plan.transitions}.items():
        if step.event is GroupEvent.REPLACED:
            assert final[name] == "Failed"  # reported until its pods are gone
        elif step.after == "Deleted":
            assert name not in final
        else:
            assert final[name] == step.after
    active = [a for a in plan.groups if a.state in ACTIVE_STATES]
    if plan.placement_limit is None:
        assert len(active) >= desired
    # Beyond what is wanted (and a rollout's surge), only groups that became ready this instant stay.
    surge = w.rollout.max_surge if any(a.outdated for a in active) else 0
    assert len([a for a in active if not (a.state == "Ready" and a.ready_at == NOW)]) <= desired + surge
