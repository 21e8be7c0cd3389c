"""Ready time by phase in the group controller: a group that becomes ready is recorded once with its
phases in `status.readyTime`, a phase that never completes is a Warning naming it and a stalled
entry in status, and the per-phase histogram sees each known phase once."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from test_groups import NOW, RULES, group, world

from goodput.api.modelgroup import ModelGroupStatus
from goodput.api.reasons import EventReason
from goodput.controllers.groups.controller import plan_model_group
from goodput.controllers.groups.model import Plan, WarmupOutcome, World
from goodput.controllers.groups.ready_phases import ReadyPhase
from goodput.controllers.groups.status import model_group_status, recent_ready_phases
from goodput.operator.metrics import OperatorMetrics


def status_after(plan: Plan, previous: ModelGroupStatus | None = None) -> ModelGroupStatus:
    return model_group_status(
        previous or ModelGroupStatus(), name="llama-70b", generation=1, desired_groups=1, plan=plan, now=NOW
    )


def becoming_ready(name: str = "g0", created_seconds_ago: float = 200) -> World:
    """A group whose checks passed and whose warm-up succeeded now: this pass makes it Ready.
    Its ranks were bound 2 s, started their engines 30 s, answered /health 60 s and formed their
    ranks 70 s after creation (the test helper's stages)."""
    created = NOW - timedelta(seconds=created_seconds_ago)
    ranks = group(name, "healthy", created=created, engine_started_at=created + timedelta(seconds=30))
    return world(ranks, desired=1, warmups={name: WarmupOutcome(True, NOW)})


def test_a_group_that_becomes_ready_is_recorded_with_its_phases() -> None:
    plan = plan_model_group(becoming_ready())
    status = status_after(plan)
    (g0,) = status.groups
    assert g0.state == "Ready"
    assert g0.ready_time is not None
    assert [(p.phase, p.seconds) for p in g0.ready_time.phases] == [
        ("Scheduling", 2.0),
        ("ContainerStart", 28.0),
        ("WeightLoad", 30.0),
        ("RankFormation", 10.0),
        ("WarmUp", 130.0),
    ]
    (announced,) = [e for e in plan.events if e.reason == EventReason.GROUP_READY]
    assert "Scheduling 2.0s, ContainerStart 28.0s, WeightLoad 30.0s, RankFormation 10.0s" in announced.message
    summary = status.ready_time
    assert summary is not None
    assert (summary.samples, summary.p50_seconds, summary.p90_seconds) == (1, 200.0, 200.0)
    weights = next(p for p in summary.by_phase if p.phase == "WeightLoad")
    assert (weights.samples, weights.p50_seconds) == (1, 30.0)
    assert summary.stalled == ()


def test_a_ready_group_is_recorded_once_across_passes() -> None:
    first = status_after(plan_model_group(becoming_ready()))
    # The next pass (or a restarted operator) sees the group Ready from its pods' gate.
    ready_pods = group("g0", "ready", created=NOW - timedelta(seconds=200))
    later = replace(world(ready_pods, desired=1), now=NOW + timedelta(seconds=30))
    again = status_after(plan_model_group(later), previous=first)
    assert first.ready_time is not None
    assert again.ready_time is not None
    assert again.ready_time.samples == 1
    assert again.ready_time.recent == first.ready_time.recent


def test_a_model_group_no_group_of_which_was_ever_ready_shows_no_ready_time() -> None:
    plan = plan_model_group(world(group("g0", "running"), desired=1))
    status = status_after(plan)
    assert status.ready_time is None, "unknown, not a ready time of 0"
    assert status.groups[0].ready_time is None


def loading_weights(seconds: float, **changes: object) -> World:
    """A group whose engines started `seconds` ago and do not answer /health yet."""
    created = NOW - timedelta(seconds=seconds + 40)
    ranks = group("g0", "bound", created=created, engine_started_at=created + timedelta(seconds=40))
    return world(ranks, desired=1, **changes)


def test_a_phase_past_its_bound_is_a_warning_naming_it_once() -> None:
    # No recent groups: the bound is half the start-up timeout (1800 s / 2).
    quiet = plan_model_group(loading_weights(800))
    assert quiet.stalls == {}
    assert EventReason.READY_PHASE_STALLED not in [e.reason for e in quiet.events]

    plan = plan_model_group(loading_weights(1000))
    (warning,) = [e for e in plan.events if e.reason == EventReason.READY_PHASE_STALLED]
    assert warning.type == "Warning"
    assert "stalled in WeightLoad: 1000s, past its bound of 900s" in warning.message
    assert plan.stalls_reported == ("g0/WeightLoad",)
    status = status_after(plan)
    assert status.ready_time is not None
    (stall,) = status.ready_time.stalled
    assert (stall.group, stall.phase, stall.seconds, stall.bound_seconds) == (
        "g0",
        "WeightLoad",
        1000.0,
        900.0,
    )

    reported = plan_model_group(loading_weights(1100, stalls_reported=frozenset({"g0/WeightLoad"})))
    assert EventReason.READY_PHASE_STALLED not in [e.reason for e in reported.events]
    assert "g0" in reported.stalls, "still stalled in status, only not announced again"


def test_the_bound_comes_from_the_recent_groups_once_there_are_enough() -> None:
    recent = tuple({ReadyPhase.WEIGHT_LOAD: 100.0} for _ in range(5))
    plan = plan_model_group(loading_weights(400, recent_ready_phases=recent))
    assert plan.stalls["g0"].phase is ReadyPhase.WEIGHT_LOAD
    assert plan.stalls["g0"].bound_seconds == 300.0
    assert plan.stalls["g0"].measured


def test_the_recent_phases_read_back_from_status_feed_the_bounds() -> None:
    status = status_after(plan_model_group(becoming_ready()))
    (sample,) = recent_ready_phases(status.ready_time)
    assert sample[ReadyPhase.WEIGHT_LOAD] == 30.0
    assert set(sample) == set(ReadyPhase)


def test_the_phase_histogram_sees_each_known_phase_once() -> None:
    plan = plan_model_group(becoming_ready())
    metrics = OperatorMetrics()
    metrics.ready_phases("serving", "llama-70b", plan.ready_breakdowns["g0"])

    def observed(phase: str, series: str = "sum") -> float | None:
        return metrics.registry.get_sample_value(
            f"goodput_group_ready_phase_seconds_{series}",
            {"namespace": "serving", "model_group": "llama-70b", "phase": phase},
        )

    assert (observed("WeightLoad"), observed("WeightLoad", "count")) == (30.0, 1.0)
    unknown_start = replace(
        plan.ready_breakdowns["g0"],
        phases=tuple(
            replace(p, seconds=None) if p.phase is ReadyPhase.CONTAINER_START else p
            for p in plan.ready_breakdowns["g0"].phases
        ),
    )
    metrics.ready_phases("serving", "llama-70b", unknown_start)
    assert observed("ContainerStart", "count") == 1.0, "an unknown phase is not observed as 0"
    metrics.forget_model_group("serving", "llama-70b")
    assert observed("WeightLoad") is None


def test_a_simulated_groups_loading_time_is_its_weight_load() -> None:
    """The simulator's group world binds a group's pods after placement, starts their engines at once
    and marks them ready after the loading time: its phases read as the operator reads them."""
    from goodput.controllers.groups.ready_phases import breakdown, milestones_of
    from goodput.simulator.group_world import bound, instant, started

    ranks = [
        started(bound(pod, instant(5.0)), instant(125.0), RULES)
        for pod in group("g0", "released", created=instant(0.0))
    ]
    phases = breakdown(milestones_of(ranks, instant(0.0), instant(126.0), ranks_checked=True), instant(130.0))
    assert [(p.phase.value, p.seconds) for p in phases.phases] == [
        ("Scheduling", 5.0),
        ("ContainerStart", 0.0),
        ("WeightLoad", 120.0),
        ("RankFormation", 0.0),
        ("WarmUp", 1.0),
    ]
