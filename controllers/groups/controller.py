"""The group controller's one entry: a ModelGroup's world in, the plan the operator applies out.

`stages.decide` settles every transition of a tick in a fixed order; `actions.plan_actions` derives
the operator's writes from them. The operator and the simulator's fleet call this function alone.
"""

from __future__ import annotations

from goodput.controllers.groups.actions import plan_actions
from goodput.controllers.groups.model import Plan, World
from goodput.controllers.groups.stages import decide


def plan_model_group(world: World) -> Plan:
    """The plan for `world`: deterministic, so a restarted operator resumes where the last stopped."""
    """Decide this tick's actions for one ModelGroup (see the module docstring)."""
    return plan_actions(decide(world))
