"""The counting rules the operator and the simulator apply before a decision."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from goodput.api.conditions import Condition
from goodput.api.reasons import ConditionType, Reason
from goodput.controllers.autoscale_model import GroupObservation, GroupState
from goodput.controllers.snapshot import unplaceable, wanted_groups, with_wanted_groups, without_replacements

AT = datetime(2026, 3, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("replicas", "low", "high", "wanted"),
    [(3, 1, 8, 3), (0, 1, 8, 1), (12, 1, 8, 8), (5, 0, 4, 4), (0, 0, 4, 0)],
    ids=["within", "below the minimum", "above the maximum", "maximum lowered past replicas", "zero allowed"],
)
def test_replicas_converge_to_the_nearest_bound(replicas: int, low: int, high: int, wanted: int) -> None:
    assert wanted_groups(replicas, low, high) == wanted


def limited(status: str, reason: str) -> Condition:
    return Condition(
        type=ConditionType.SCALING_LIMITED, status=status, reason=reason, message="", last_transition_time=AT
    )  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("conditions", "expected"),
    [
        ((), False),
        ((limited("True", Reason.INSUFFICIENT_GPUS),), True),
        ((limited("True", Reason.DOMAINS_BACKED_OFF),), True),
        ((limited("False", Reason.INSUFFICIENT_GPUS),), False),
        ((limited("True", "AtMaxReplicas"),), False),
    ],
    ids=["no condition", "no GPUs", "domains backed off", "limit lifted", "a limit that is not placement"],
)
def test_unschedulable_only_while_a_placement_reason_limits_scaling(
    conditions: tuple[Condition, ...], expected: bool
) -> None:
    assert unplaceable(conditions) is expected


states = st.sampled_from(list(GroupState))


@given(
    observed=st.lists(states, max_size=8),
    wanted=st.integers(min_value=0, max_value=10),
    blocked=st.booleans(),
)
def test_groups_wanted_but_not_created_are_placing_capacity(
    observed: list[GroupState], wanted: int, blocked: bool
) -> None:
    groups = [GroupObservation(f"g{i}", state, 0.0) for i, state in enumerate(observed)]
    live = sum(1 for state in observed if state not in (GroupState.DRAINING, GroupState.FAILED))
    result = with_wanted_groups(groups, wanted, now=42.0, unschedulable=blocked)
    assert result[: len(groups)] == tuple(groups)
    added = result[len(groups) :]
    assert len(added) == max(0, wanted - live)
    assert all(
        g.state is GroupState.PLACING and g.unschedulable is blocked and g.created_at == 42.0 for g in added
    )


def obs(name: str, state: GroupState, created_at: float = 0.0) -> GroupObservation:
    return GroupObservation(name, state, created_at)


@pytest.mark.parametrize(
    ("groups", "outdated", "kept"),
    [
        ((obs("g0", GroupState.READY), obs("g1", GroupState.PLACING)), set(), ["g0", "g1"]),
        (
            (obs("g0", GroupState.READY), obs("g1", GroupState.READY), obs("g2", GroupState.WARMING)),
            {"g0", "g1"},
            ["g0", "g1"],
        ),
        (
            (obs("g0", GroupState.READY), obs("g2", GroupState.READY), obs("g3", GroupState.PLACING, 5.0)),
            {"g0"},
            ["g0", "g2"],
        ),
        (
            (obs("g0", GroupState.DRAINING), obs("g2", GroupState.READY), obs("g3", GroupState.PLACING)),
            {"g0"},
            ["g0", "g2", "g3"],
        ),
        (
            (
                obs("g0", GroupState.READY),
                obs("g2", GroupState.PLACING, 1.0),
                obs("g3", GroupState.PLACING, 2.0),
            ),
            {"g0"},
            ["g0", "g2"],
        ),
    ],
    ids=[
        "no rollout: a coming group is capacity on its way",
        "surge group replacing an old ready group is not",
        "with a new group ready, the next replacement is not extra either",
        "an old group already draining is replaced by nothing coming",
        "only as many as old ready groups, the newest left out",
    ],
)
def test_a_rollouts_new_groups_are_not_counted_as_extra_capacity(
    groups: tuple[GroupObservation, ...], outdated: set[str], kept: list[str]
) -> None:
    assert [g.name for g in without_replacements(groups, frozenset(outdated))] == kept
