"""The chaos run's plan: reproducible from its seed, bounded to the chaos window, dense enough in
operator kills, covering every fault kind, one infrastructure fault at a time."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from goodput.testbed.chaos.schedule import (
    HOLD_SECONDS,
    INFRASTRUCTURE_FAULTS,
    MOMENTS,
    ChaosSettings,
    FaultKind,
    plan_run,
)


def test_the_same_seed_gives_the_same_plan_and_another_seed_another() -> None:
    first = plan_run(ChaosSettings(duration_seconds=600, seed=7))
    assert plan_run(ChaosSettings(duration_seconds=600, seed=7)) == first
    assert plan_run(ChaosSettings(duration_seconds=600, seed=8)) != first


@dataclass(frozen=True)
class Case:
    name: str
    duration_seconds: float
    min_kills: int
    every_kind: bool


CASES = [
    Case("make chaos default: 15 minutes", 900, 50, True),
    Case("ten minutes", 600, 35, True),
    Case("the e2e story: under 4 minutes", 200, 6, False),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_kills_and_kinds_per_run_length(case: Case) -> None:
    plan = plan_run(ChaosSettings(duration_seconds=case.duration_seconds, seed=1))
    assert len(plan.kills) >= case.min_kills
    kinds = {fault.kind for fault in plan.faults}
    if case.every_kind:
        assert kinds == set(INFRASTRUCTURE_FAULTS)
    else:  # a short run's first round holds no kind twice
        assert len(kinds) == len(plan.faults) >= 2


def test_kills_aim_at_every_moment_evenly() -> None:
    plan = plan_run(ChaosSettings(duration_seconds=900, seed=3))
    aimed = [kill.moment for kill in plan.kills]
    counts = [aimed.count(moment) for moment in MOMENTS]
    assert min(counts) >= max(counts) - 1, dict(zip(MOMENTS, counts, strict=True))


def test_too_short_a_run_is_refused_naming_the_fields() -> None:
    with pytest.raises(ValueError, match="warmup_seconds"):
        ChaosSettings(duration_seconds=100, seed=0)
    with pytest.raises(ValueError, match="manual_replicas"):
        ChaosSettings(duration_seconds=600, seed=0, manual_replicas=(3, 3))


@settings(max_examples=60, deadline=None)
@given(duration=st.floats(min_value=120, max_value=1800), seed=st.integers(0, 2**32))
@example(duration=1133.619140625, seed=2537953)  # a kill's rounded moment once fell on the end
def test_plans_stay_in_the_chaos_window_and_never_overlap_infrastructure_faults(
    duration: float, seed: int
) -> None:
    config = ChaosSettings(duration_seconds=duration, seed=seed)
    plan = plan_run(config)
    end = config.chaos_ends_at_seconds
    for fault in plan.faults:
        low, high = HOLD_SECONDS[fault.kind]
        assert low <= fault.hold_seconds <= high
        assert config.warmup_seconds <= fault.at_seconds
        assert fault.at_seconds + fault.hold_seconds <= end + 0.01
        if fault.kind is FaultKind.PROMETHEUS_SLOW:
            assert fault.slow_answer_seconds >= 3.0
    for earlier, later in itertools.pairwise(plan.faults):
        assert later.at_seconds >= earlier.at_seconds + earlier.hold_seconds
    for earlier, later in itertools.pairwise(plan.kills):
        assert later.at_seconds >= earlier.at_seconds + earlier.hold_seconds
    assert all(config.warmup_seconds <= k.at_seconds < end and k.moment is not None for k in plan.kills)
    low, high = config.manual_replicas
    scales = [s for s in plan.stimuli if s.action == "scale"]
    assert all(low <= s.replicas <= high for s in scales)
    assert all(a.replicas != b.replicas for a, b in itertools.pairwise(scales))
    assert all(s.at_seconds < end for s in plan.stimuli)
    assert [s.at_seconds for s in plan.stimuli] == sorted(s.at_seconds for s in plan.stimuli)
