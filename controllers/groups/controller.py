"""The group controller's one entry: a ModelGroup's world in, the plan the operator applies out.

`stages.decide` settles every transition of a tick in a fixed order; `actions.plan_actions` derives
the operator's writes from them. The operator and the simulator's fleet call this function alone.
"""

from __future__ import annotations

from dataclasses import replace

from goodput.controllers.groups.actions import plan_actions
from goodput.controllers.groups.model import Plan, World
from goodput.controllers.groups.stages import decide
from goodput.controllers.pools import in_pool


def plan_model_group(world: World) -> Plan:
    """The plan for `world`: deterministic, so a restarted operator resumes where the last stopped.

    A world is one pool's (its template's): the pods of the ModelGroup's other pools are not this
    plan's to count, drain or replace, though their GPUs stay taken in the inventory."""
    return plan_actions(decide(pool_world(world)))


def pool_world(world: World) -> World:
    """`world` with only the pods of its template's pool."""
    pods = in_pool(world.pods, world.template.pool)
    return world if len(pods) == len(world.pods) else replace(world, pods=pods)
