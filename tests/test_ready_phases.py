"""A group's ready time by phase, from pods as the API server sends them: named cases, then the
invariants (durations non-negative, phases in order, the known phases add up to the ready time)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from goodput.controllers import naming
from goodput.controllers.groups.observation import PodView, parse_pod
from goodput.controllers.groups.ready_phases import (
    STALL_FLOOR_SECONDS,
    PhaseStall,
    ReadyMilestones,
    ReadyPhase,
    breakdown,
    milestones_of,
    nearest_rank,
    stall_bounds,
    stalled,
)

CREATED = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def at(seconds: float) -> str:
    return (CREATED + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def rank(
    number: int,
    *,
    scheduled: float | None = None,
    started: float | None = None,
    loaded: float | None = None,
    nccl: float | None = None,
) -> PodView:
    """One rank as the kubelet and the health agent record it, `seconds` after the group's creation."""
    conditions: list[dict[str, Any]] = []
    if scheduled is not None:
        conditions.append({"type": "PodScheduled", "status": "True", "lastTransitionTime": at(scheduled)})
    if loaded is not None:
        conditions.append({"type": "ContainersReady", "status": "True", "lastTransitionTime": at(loaded)})
    else:
        conditions.append({"type": "ContainersReady", "status": "False", "lastTransitionTime": at(0)})
    if nccl is not None:
        conditions.append(
            {"type": naming.CONDITION_NCCL_HEALTHY, "status": "True", "lastTransitionTime": at(nccl)}
        )
    engine: dict[str, Any] = {"name": "vllm", "restartCount": 0}
    if started is not None:
        engine["state"] = {"running": {"startedAt": at(started)}}
    else:
        engine["state"] = {"waiting": {"reason": "ContainerCreating"}}
    pod = {
        "metadata": {
            "name": f"llama-g0-{number}",
            "creationTimestamp": at(0),
            "labels": {
                naming.LABEL_MODEL_GROUP: "llama",
                naming.LABEL_GROUP: "g0",
                naming.LABEL_RANK: str(number),
                naming.LABEL_REVISION: "abc",
            },
        },
        "spec": {"nodeName": "node-1" if scheduled is not None else None, "containers": [{"name": "vllm"}]},
        "status": {
            "phase": "Running" if started is not None else "Pending",
            "conditions": conditions,
            "containerStatuses": [{"name": "agent", "state": {"running": {"startedAt": at(1)}}}, engine],
        },
    }
    view = parse_pod(pod)
    assert view is not None
    return view


def seconds_after(seconds: float) -> datetime:
    return CREATED + timedelta(seconds=seconds)


@dataclass(frozen=True)
class PhaseCase:
    name: str
    ranks: list[PodView]
    ready_after: float | None
    nccl: bool
    now: float
    expected: dict[str, float | None]
    """Seconds by phase; None: unknown."""
    current: tuple[str, float] | None
    """The phase in progress and its age."""


CASES = [
    PhaseCase(
        "a TP16 group ready: the slowest rank ends each phase",
        [
            rank(0, scheduled=4, started=40, loaded=160, nccl=170),
            rank(1, scheduled=6, started=95, loaded=150, nccl=172),
        ],
        185,
        True,
        200,
        {"Scheduling": 6, "ContainerStart": 89, "WeightLoad": 65, "RankFormation": 12, "WarmUp": 13},
        None,
    ),
    PhaseCase(
        "without the NCCL check rank formation is part of the warm-up",
        [rank(0, scheduled=2, started=10, loaded=70, nccl=80)],
        90,
        False,
        90,
        {"Scheduling": 2, "ContainerStart": 8, "WeightLoad": 60, "WarmUp": 20},
        None,
    ),
    PhaseCase(
        "loading weights: the later phases are unknown, not 0",
        [rank(0, scheduled=3, started=20), rank(1, scheduled=3, started=25, loaded=100)],
        None,
        True,
        300,
        {"Scheduling": 3, "ContainerStart": 22, "WeightLoad": None, "RankFormation": None, "WarmUp": None},
        ("WeightLoad", 275),
    ),
    PhaseCase(
        "one rank not bound yet: scheduling is in progress",
        [rank(0, scheduled=3), rank(1)],
        None,
        True,
        30,
        {
            "Scheduling": None,
            "ContainerStart": None,
            "WeightLoad": None,
            "RankFormation": None,
            "WarmUp": None,
        },
        ("Scheduling", 30),
    ),
    PhaseCase(
        "an NCCL condition re-written after the group became ready ends rank formation at ready",
        [rank(0, scheduled=1, started=5, loaded=50, nccl=900)],
        60,
        True,
        1000,
        {"Scheduling": 1, "ContainerStart": 4, "WeightLoad": 45, "RankFormation": 10, "WarmUp": 0},
        None,
    ),
    PhaseCase(
        "an engine start time the pod no longer shows: its time counts in the weight load",
        [rank(0, scheduled=5, loaded=70, nccl=75)],
        80,
        True,
        80,
        {"Scheduling": 5, "ContainerStart": None, "WeightLoad": 65, "RankFormation": 5, "WarmUp": 5},
        None,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_phases_from_recorded_pod_facts(case: PhaseCase) -> None:
    ready_at = None if case.ready_after is None else seconds_after(case.ready_after)
    milestones = milestones_of(case.ranks, CREATED, ready_at, ranks_checked=case.nccl)
    result = breakdown(milestones, seconds_after(case.now))
    assert {p.phase.value: p.seconds for p in result.phases} == case.expected
    assert result.total_seconds == case.ready_after
    current = None if result.current is None else (result.current.value, result.current_seconds)
    assert current == case.current


def test_a_phase_past_its_bound_is_stalled_and_named() -> None:
    loading = breakdown(
        milestones_of([rank(0, scheduled=1, started=10)], CREATED, None, ranks_checked=True),
        seconds_after(710),
    )
    bounds = stall_bounds([], fixed_seconds=600)
    assert stalled(loading, bounds) == PhaseStall(ReadyPhase.WEIGHT_LOAD, 700, 600, measured=False)
    assert stalled(loading, stall_bounds([], fixed_seconds=800)) is None


def test_the_stall_bound_is_measured_from_enough_recent_groups() -> None:
    recent = [{ReadyPhase.WEIGHT_LOAD: seconds} for seconds in (100.0, 110.0, 120.0, 130.0, 200.0)]
    bounds = stall_bounds(recent, fixed_seconds=1800)
    assert bounds[ReadyPhase.WEIGHT_LOAD] == (600.0, True), "3 x the p90 of the recent weight loads"
    assert bounds[ReadyPhase.SCHEDULING] == (1800, False), "no recent scheduling times: the fixed bound"
    quick = stall_bounds([{ReadyPhase.WARM_UP: 2.0}] * 5, fixed_seconds=1800)
    assert quick[ReadyPhase.WARM_UP] == (STALL_FLOOR_SECONDS, True), "a bound of 6 s would cry wolf"
    few = stall_bounds(recent[:4], fixed_seconds=1800)
    assert few[ReadyPhase.WEIGHT_LOAD] == (1800, False)


def test_a_ready_group_is_never_stalled() -> None:
    ready = breakdown(
        milestones_of(
            [rank(0, scheduled=1, started=2, loaded=3)], CREATED, seconds_after(5000), ranks_checked=False
        ),
        seconds_after(9000),
    )
    assert stalled(ready, stall_bounds([], fixed_seconds=1)) is None


@pytest.mark.parametrize(
    ("values", "quantile", "expected"),
    [([], 0.9, None), ([3.0], 0.5, 3.0), ([1.0, 2.0, 3.0, 4.0], 0.5, 2.0), ([5.0, 1.0, 9.0], 0.9, 9.0)],
)
def test_nearest_rank_is_a_value_that_occurred(
    values: list[float], quantile: float, expected: float | None
) -> None:
    assert nearest_rank(values, quantile) == expected


offsets = st.one_of(st.none(), st.integers(min_value=-100, max_value=5000))


@given(
    ends=st.lists(offsets, min_size=4, max_size=4),
    ready=offsets,
    now=st.integers(min_value=0, max_value=10000),
)
def test_phases_are_ordered_non_negative_and_add_up_to_the_ready_time(
    ends: list[int | None], ready: int | None, now: int
) -> None:
    phases = (
        ReadyPhase.SCHEDULING,
        ReadyPhase.CONTAINER_START,
        ReadyPhase.WEIGHT_LOAD,
        ReadyPhase.RANK_FORMATION,
    )
    milestones = ReadyMilestones(
        CREATED,
        (
            *(
                (phase, None if end is None else seconds_after(end))
                for phase, end in zip(phases, ends, strict=True)
            ),
            (ReadyPhase.WARM_UP, None if ready is None else seconds_after(ready)),
        ),
    )
    result = breakdown(milestones, seconds_after(now))
    assert [p.phase for p in result.phases] == [*phases, ReadyPhase.WARM_UP]
    assert all(p.seconds is None or p.seconds >= 0 for p in result.phases)
    known = sum(p.seconds for p in result.phases if p.seconds is not None)
    if ready is None:
        assert result.total_seconds is None
        assert result.current is not None, "a group not ready is in some phase"
    else:
        assert result.total_seconds == pytest.approx(known)
        assert result.total_seconds == max(0, ready)
        assert result.current is None
