"""The ModelGroup controller's decisions: group lifecycle, replacement and scale, as one pure plan.

A group moves Placing → Provisioning → Warming → Ready (→ Draining), and any rank's failure makes
the whole group Failed: it leaves the ready count at once and is deleted whole, and the shortfall is
made up by a new, complete group (design note §30, §34). Every tick the operator builds a `World`
(the ModelGroup's pods, the cluster's GPU inventory, warm-up results, `now`), calls
`plan_model_group`, and applies the returned `Plan`. The plan is deterministic: the same world gives
the same plan, so a restarted operator picks up exactly where the last one stopped.

- `model`: the value types (world, assessment, actions, plan).
- `lifecycle`: the per-group state machine; every transition written once, named by its cause.
- `assess`: a group's state from its pods (the observed transitions).
- `stages`: the decisions of a tick, in a fixed order: failures, readiness, drains, scale, rollout.
- `actions`: the operator's actions each decided transition calls for.
"""

from __future__ import annotations

from goodput.controllers.groups.actions import plan_actions
from goodput.controllers.groups.assess import assess_group
from goodput.controllers.groups.lifecycle import (
    ACTIVE_STATES,
    TRANSITIONS,
    GroupEvent,
    GroupState,
    GroupTransition,
    IllegalTransitionError,
    Phase,
    next_phase,
)
from goodput.controllers.groups.model import (
    APPLY_ORDER,
    Assessment,
    Backoff,
    DrainEnded,
    DrainMark,
    DrainOutcomeMark,
    DrainProgressMark,
    DrainStart,
    EventRecord,
    GateChange,
    GateRelease,
    GroupCreation,
    GroupDeletion,
    LeaderProbe,
    Plan,
    ReadinessRules,
    ReadyTimes,
    RolloutProgress,
    RolloutRules,
    RolloutStatus,
    WarmupOutcome,
    WarmupRequest,
    World,
    encode_backoffs,
    encode_rollout,
    parse_backoffs,
    parse_rollout,
)
from goodput.controllers.groups.stages import decide


def plan_model_group(world: World) -> Plan:
    """Decide this tick's actions for one ModelGroup (see the module docstring)."""
    return plan_actions(decide(world))


__all__ = [
    "ACTIVE_STATES",
    "APPLY_ORDER",
    "TRANSITIONS",
    "Assessment",
    "Backoff",
    "DrainEnded",
    "DrainMark",
    "DrainOutcomeMark",
    "DrainProgressMark",
    "DrainStart",
    "EventRecord",
    "GateChange",
    "GateRelease",
    "GroupCreation",
    "GroupDeletion",
    "GroupEvent",
    "GroupState",
    "GroupTransition",
    "IllegalTransitionError",
    "LeaderProbe",
    "Phase",
    "Plan",
    "ReadinessRules",
    "ReadyTimes",
    "RolloutProgress",
    "RolloutRules",
    "RolloutStatus",
    "WarmupOutcome",
    "WarmupRequest",
    "World",
    "assess_group",
    "decide",
    "encode_backoffs",
    "encode_rollout",
    "next_phase",
    "parse_backoffs",
    "parse_rollout",
    "plan_model_group",
]
