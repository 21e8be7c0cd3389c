"""The counting rules both worlds apply before a decision: how many groups are wanted, which groups
are capacity on its way, and whether more can be placed at all.

The operator reads them from a ModelGroup's spec and status; the simulator from its fleet. Both
call these functions, so the autoscaler sees the same snapshot for the same situation offline and
deployed (DESIGN §6: a policy evaluated offline is the policy deployed).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from goodput.api.conditions import Condition, find_condition
from goodput.api.reasons import ConditionType
from goodput.controllers.autoscale_model import COMING_STATES, GroupObservation, GroupState
from goodput.controllers.placement import NoFitReason

# Reasons of ScalingLimited that mean "no further group can be placed now".
PLACEMENT_REASONS = frozenset(reason.value for reason in NoFitReason)
# Groups that never become (more) capacity: a draining group is leaving, a failed one is gone.
NOT_COMING = frozenset({GroupState.DRAINING, GroupState.FAILED})


def wanted_groups(replicas: int, min_replicas: int, max_replicas: int) -> int:
    """The complete groups a ModelGroup converges to.

    The API allows bounds moved past `replicas` (a user lowers `maxReplicas` below the current
    count); the count converges to the nearest bound rather than being refused.
    """
    return max(min_replicas, min(replicas, max_replicas))


def unplaceable(conditions: Sequence[Condition]) -> bool:
    """Whether the group controller reports that no further group can be placed: ScalingLimited is
    True with a placement reason (no GPUs, no topology domain, backed-off domains)."""
    limited = find_condition(conditions, ConditionType.SCALING_LIMITED)
    return limited is not None and limited.status == "True" and limited.reason in PLACEMENT_REASONS


def without_replacements(
    observations: Iterable[GroupObservation], outdated: frozenset[str]
) -> tuple[GroupObservation, ...]:
    """The groups as capacity: a rollout's new group on its way replaces an old ready group, which
    leaves once it is ready, so it is no capacity on its way. As many coming groups of the current
    template as there are ready old ones are left out (the newest first)."""
    observed = tuple(observations)
    old_ready = sum(1 for g in observed if g.name in outdated and g.state is GroupState.READY)
    coming = [g for g in observed if g.name not in outdated and g.state in COMING_STATES]
    replacing = {g.name for g in sorted(coming, key=lambda g: -g.created_at)[:old_ready]}
    return tuple(g for g in observed if g.name not in replacing)


def with_wanted_groups(
    observations: Iterable[GroupObservation], wanted: int, *, now: float, unschedulable: bool
) -> tuple[GroupObservation, ...]:
    """The groups observed, plus one Placing group for each group wanted but not created yet.

    A group the controller has not created yet is capacity on its way exactly like one that is
    placing: counting it keeps the autoscaler from asking twice for the same capacity. Such a group
    is unschedulable while the controller says nothing more can be placed.
    """
    observed = tuple(observations)
    live = sum(1 for group in observed if group.state not in NOT_COMING)
    missing = max(0, wanted - live)
    return observed + tuple(
        GroupObservation(
            name=f"wanted-{index}", state=GroupState.PLACING, created_at=now, unschedulable=unschedulable
        )
        for index in range(missing)
    )
