"""One controller, two worlds: a scripted scenario through the simulator and through the pure group
controller as the operator calls it yields the same decisions and group transitions.

The scenario: a burst (1 → 3 groups), a failure of a ready group, a scale-in to 1 and, while the
two groups drain, a new burst back to 3. The deployed controller replaces the failed group whole,
drains the cheapest groups, and puts the draining groups back in service instead of creating new
ones. The simulator must run exactly that lifecycle (not a copy of it): its transitions come from
`plan_model_group` applied to a simulated cluster. The operator side is the pure controller fed
the worlds the operator builds at each step and the plan applied as the operator applies it
(`test_groups.apply`), with the cluster's own moves (binding, engines starting) scripted.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import numpy as np
import pytest
from test_groups import NOW, RULES, apply, group, idle, world
from test_sim_simulation import ENGINE, Scripted

from goodput.api.modelgroup import ModelGroup
from goodput.controllers.groups.controller import plan_model_group
from goodput.controllers.groups.lifecycle import GroupTransition
from goodput.controllers.groups.model import Plan, WarmupOutcome, World
from goodput.simulator.fleet import FleetConfig
from goodput.simulator.group_world import GroupRules
from goodput.simulator.records import RequestExit
from goodput.simulator.simulation import SimulationConfig, SimulationResult, simulate
from goodput.simulator.workload import ClassRule, Workload, assign_classes

BURST_AT, FAILURE_AT, SCALE_IN_AT, NEW_BURST_AT = 10.0, 100.0, 200.0, 210.0

# The scenario's expected moves, in order: what the deployed controller decides.
EXPECTED = [
    ("Created", None, "Placing"),
    ("Created", None, "Placing"),
    ("WarmedUp", "Warming", "Ready"),
    ("WarmedUp", "Warming", "Ready"),
    ("Replaced", "Failed", "Deleted"),
    ("Created", None, "Placing"),
    ("WarmedUp", "Warming", "Ready"),
    ("ScaledIn", "Ready", "Draining"),
    ("ScaledIn", "Ready", "Draining"),
    ("ScaledOut", "Draining", "Ready"),
    ("ScaledOut", "Draining", "Ready"),
]


def kinds(transitions: list[GroupTransition]) -> list[tuple[str, str | None, str]]:
    return [(str(t.event), t.before, t.after) for t in transitions]


def model_group(
    drain_max_seconds: int = 600, min_lifetime_seconds: int = 0, gpus: dict[str, str] | None = None
) -> ModelGroup:
    """One-pod groups that may be drained at once (no minimum lifetime) and drain for long; `gpus`:
    where the GPUs come from (an engine's `gpuResourceName` or `gpuDeviceClassName`)."""
    return ModelGroup.model_validate(
        {
            "metadata": {"name": "llama-8b", "namespace": "serving"},
            "spec": {
                "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
                "engine": {"image": "vllm/vllm-openai:v0.33.0", **(gpus or {})},
                "parallelism": {"gpusPerPod": 1},
                "readiness": {"ncclCheck": "Skip", "revisionCheck": False},
                "maxReplicas": 4,
                "drain": {"minLifetimeSeconds": min_lifetime_seconds, "maxSeconds": drain_max_seconds},
            },
        }
    )


def steady_load(seconds: float) -> Workload:
    """Long requests at a steady rate, so a draining group still holds work when the new burst comes."""
    rng = np.random.default_rng(3)
    times = np.arange(0.0, seconds, 0.25)
    outputs = np.full(times.size, 4000)
    inputs = rng.integers(100, 400, times.size)
    return assign_classes(Workload("steady", times, inputs, outputs), ClassRule(("chat",), (1.0,)), 3)


def through_the_simulator(spec: ModelGroup | None = None) -> list[GroupTransition]:
    fleet = FleetConfig(
        engine=ENGINE,
        gpus_per_group=1,
        min_groups=1,
        max_groups=4,
        ready_time_median_seconds=30.0,
        ready_time_sigma=0.0,
        scheduled_failures_seconds=(FAILURE_AT,),
        itl_targets_seconds=(0.08,),
        group_rules=GroupRules.for_model_group(spec or model_group()),
    )
    script = [(0.0, 1), (BURST_AT, 3), (SCALE_IN_AT, 1), (NEW_BURST_AT, 3)]
    config = SimulationConfig(
        fleet=fleet, seed=7, initial_groups=1, control_start_seconds=5.0, tail_seconds=0.0
    )
    result = simulate(steady_load(240.0), config, Scripted(script, interval_seconds=5.0))
    return [step for at, step in result.group_transitions if at <= NEW_BURST_AT + 5.0]


def tick(w: World, *, at_seconds: float, **changes: object) -> tuple[World, Plan]:
    now = NOW + timedelta(seconds=at_seconds)
    current = replace(w, now=now, **changes)  # type: ignore[arg-type]
    plan = plan_model_group(current)
    return apply(current, plan), plan


def serving(w: World, names: list[str]) -> World:
    """The cluster's own moves for new groups: pods bound, engines up, health checks passed."""
    kept = [p for p in w.pods if p.group not in names]
    fresh = [
        p for name in names for p in group(name, "healthy", domain="abcd"[int(name[1:]) % 4], created=w.now)
    ]
    return replace(w, pods=(*kept, *fresh))


def through_the_operator() -> list[GroupTransition]:
    rules = replace(RULES, min_lifetime_seconds=0)
    w = world(group("g0", "ready", created=NOW - timedelta(hours=1)), desired=1, group_counter=1, rules=rules)
    moves: list[GroupTransition] = []
    w, plan = tick(w, at_seconds=BURST_AT, desired_groups=3)
    moves += plan.transitions
    w = serving(w, [c.group for c in plan.creations])
    warmed = {name: WarmupOutcome(True, w.now) for name in ("g1", "g2")}
    w, plan = tick(w, at_seconds=BURST_AT + 40, warmups=warmed)
    moves += plan.transitions
    broken = [replace(p, restarts=1) if p.group == "g1" else p for p in w.pods]
    w, plan = tick(replace(w, pods=tuple(broken)), at_seconds=FAILURE_AT)
    moves += plan.transitions
    w = serving(
        replace(w, pods=tuple(p for p in w.pods if not p.deleting)), [c.group for c in plan.creations]
    )
    w, plan = tick(w, at_seconds=FAILURE_AT + 40, warmups={"g3": WarmupOutcome(True, w.now)})
    moves += plan.transitions
    busy = idle("g0", "g2", "g3", at=NOW + timedelta(seconds=SCALE_IN_AT))
    w, plan = tick(w, at_seconds=SCALE_IN_AT, desired_groups=1, leader_readings=busy)
    moves += plan.transitions
    w, plan = tick(w, at_seconds=NEW_BURST_AT, desired_groups=3)
    moves += plan.transitions
    return moves


def test_the_simulator_runs_the_deployed_group_lifecycle() -> None:
    assert kinds(through_the_operator()) == EXPECTED
    assert kinds(through_the_simulator()) == EXPECTED


@pytest.mark.parametrize(
    "gpus",
    [{"gpuResourceName": "amd.com/gpu"}, {"gpuDeviceClassName": "gpu.nvidia.com"}],
    ids=["another device plugin's resource", "a DRA DeviceClass"],
)
def test_the_simulator_places_groups_in_the_model_groups_own_device_resource(gpus: dict[str, str]) -> None:
    assert kinds(through_the_simulator(model_group(gpus=gpus))) == EXPECTED


def test_a_draining_group_is_put_back_in_service_rather_than_a_new_one_created() -> None:
    moves = through_the_simulator()
    drained = [t.group for t in moves if str(t.event) == "ScaledIn"]
    restored = [t.group for t in moves if str(t.event) == "ScaledOut"]
    assert sorted(restored) == sorted(drained)
    created_after_scale_in = [
        t
        for t in moves[moves.index(next(t for t in moves if str(t.event) == "ScaledIn")) :]
        if t.before is None
    ]
    assert created_after_scale_in == []


def scale_in_once(group_rules: GroupRules, script: list[tuple[float, int]]) -> SimulationResult:
    fleet = FleetConfig(
        engine=ENGINE,
        gpus_per_group=1,
        min_groups=1,
        max_groups=4,
        ready_time_median_seconds=30.0,
        ready_time_sigma=0.0,
        itl_targets_seconds=(0.08,),
        group_rules=group_rules,
    )
    config = SimulationConfig(
        fleet=fleet, seed=7, initial_groups=2, control_start_seconds=5.0, tail_seconds=60.0
    )
    return simulate(steady_load(120.0), config, Scripted(script, interval_seconds=5.0))


def test_a_drain_past_its_time_limit_aborts_what_is_in_flight_in_the_simulator_too() -> None:
    result = scale_in_once(
        GroupRules.for_model_group(model_group(drain_max_seconds=10)), [(0.0, 2), (30.0, 1)]
    )
    (timed_out,) = [(at, t) for at, t in result.group_transitions if str(t.event) == "DrainTimedOut"]
    (started,) = [at for at, t in result.group_transitions if str(t.event) == "ScaledIn"]
    assert (
        10.0
        <= timed_out[0] - started
        <= 10.0 + FleetConfig(engine=ENGINE, gpus_per_group=1).reconcile_interval_seconds
    )
    assert (result.requests["outcome"] == RequestExit.FAILED).sum() > 0


def test_the_minimum_lifetime_holds_in_the_simulator() -> None:
    """A scale-in from 4 to 1 takes only the groups ready longer than the minimum lifetime: the
    initial groups count as old, the burst's (ready at about 45 s, 55 s before) are spared."""
    rules = GroupRules.for_model_group(model_group(min_lifetime_seconds=300))
    result = scale_in_once(rules, [(0.0, 2), (10.0, 4), (100.0, 1)])
    scaled_in = [t.group for _, t in result.group_transitions if str(t.event) == "ScaledIn"]
    created = [t.group for _, t in result.group_transitions if str(t.event) == "Created"]
    assert created == ["g2", "g3"]
    assert sorted(scaled_in) == ["g0", "g1"]
