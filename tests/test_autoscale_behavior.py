"""The HPA-shaped pipeline stages: tolerance, stabilisation, step policies, bounds
(goodput.controllers.autoscale.behavior)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from goodput.api.reasons import Guard
from goodput.controllers.autoscale.behavior import clamp, limit_rate, stabilize, tolerated_groups
from goodput.controllers.autoscale.model import (
    Recommendation,
    ScaleEvent,
    ScalingPolicy,
    ScalingRules,
    SelectPolicy,
    StepPolicy,
    StepPolicyType,
)

NOW = 1000.0


def rules(
    *policies: StepPolicy,
    window: float = 0.0,
    tolerance: float = 0.1,
    select: SelectPolicy = SelectPolicy.MAX,
) -> ScalingRules:
    return ScalingRules(
        tolerance=tolerance,
        stabilization_window_seconds=window,
        policies=policies or (StepPolicy(StepPolicyType.PERCENT, 1000, 1.0),),
        select_policy=select,
    )


def groups(value: int, period: float = 60.0) -> StepPolicy:
    return StepPolicy(StepPolicyType.GROUPS, value, period)


def percent(value: int, period: float = 60.0) -> StepPolicy:
    return StepPolicy(StepPolicyType.PERCENT, value, period)


@pytest.mark.parametrize(
    ("demand", "current", "up_tolerance", "down_tolerance", "expected"),
    [
        (2.3, 0, 0.1, 0.1, 3),
        (10.5, 10, 0.1, 0.1, 10),
        (11.0, 10, 0.1, 0.1, 10),
        (11.2, 10, 0.1, 0.1, 12),
        (9.0, 10, 0.1, 0.1, 10),
        (7.0, 10, 0.1, 0.1, 7),
        (8.95, 10, 0.1, 0.1, 9),
        (7.0, 10, 0.1, 0.0, 7),
        (9.0 * 1.1, 9, 0.1, 0.1, 9),
        (3.5, 3, 0.2, 0.1, 3),
        (0.0, 4, 0.1, 0.1, 0),
    ],
    ids=[
        "from zero the band does not apply",
        "inside the band",
        "on the upper edge",
        "above the band",
        "on the lower edge",
        "below the band: the demand rounded up, as the HPA does",
        "just below the band: one group fewer",
        "no down tolerance: plain rounding up",
        "a scaled-in count is not carried back out by a rise the band absorbs",
        "per-direction tolerance",
        "no demand at all",
    ],
)
def test_tolerance_band(
    demand: float, current: int, up_tolerance: float, down_tolerance: float, expected: int
) -> None:
    assert (
        tolerated_groups(demand, current, rules(tolerance=up_tolerance), rules(tolerance=down_tolerance))
        == expected
    )


@dataclass(frozen=True)
class StabilizeCase:
    name: str
    current: int
    recommended: int
    history: tuple[Recommendation, ...]
    up_window: float
    down_window: float
    expected: int
    guard: Guard | None


STABILIZE_CASES = [
    StabilizeCase(
        "no windows: act on the recommendation", 5, 3, (Recommendation(NOW - 10, 9),), 0, 0, 3, None
    ),
    StabilizeCase(
        "scale-down takes the highest recommendation of its window",
        5,
        3,
        (Recommendation(NOW - 200, 5), Recommendation(NOW - 100, 4)),
        0,
        300,
        5,
        Guard.SCALE_DOWN_STABILIZED,
    ),
    StabilizeCase(
        "a partial recovery inside the window limits the scale-down",
        6,
        2,
        (Recommendation(NOW - 250, 3), Recommendation(NOW - 100, 4)),
        0,
        300,
        4,
        Guard.SCALE_DOWN_STABILIZED,
    ),
    StabilizeCase(
        "recommendations older than the window are forgotten",
        5,
        3,
        (Recommendation(NOW - 400, 8), Recommendation(NOW - 300, 7)),
        0,
        300,
        3,
        None,
    ),
    StabilizeCase(
        "scale-up takes the lowest recommendation of its window",
        3,
        8,
        (Recommendation(NOW - 30, 4), Recommendation(NOW - 10, 6)),
        60,
        0,
        4,
        Guard.SCALE_UP_STABILIZED,
    ),
    StabilizeCase(
        "scale-up window never pushes below the current count",
        5,
        8,
        (Recommendation(NOW - 30, 2),),
        60,
        0,
        5,
        Guard.SCALE_UP_STABILIZED,
    ),
    StabilizeCase(
        "both windows: a rise inside the up window is held at the current count",
        4,
        6,
        (Recommendation(NOW - 20, 4),),
        60,
        300,
        4,
        Guard.SCALE_UP_STABILIZED,
    ),
]


@pytest.mark.parametrize("case", STABILIZE_CASES, ids=[case.name for case in STABILIZE_CASES])
def test_stabilization_windows(case: StabilizeCase) -> None:
    result, guard = stabilize(
        case.current,
        case.recommended,
        case.history,
        scale_up=rules(window=case.up_window),
        scale_down=rules(window=case.down_window),
        now=NOW,
    )
    assert (result, guard) == (case.expected, case.guard)


@dataclass(frozen=True)
class RateCase:
    name: str
    current: int
    desired: int
    up: ScalingRules
    down: ScalingRules
    expected: int
    guard: Guard | None
    up_events: tuple[ScaleEvent, ...] = ()
    down_events: tuple[ScaleEvent, ...] = ()
    percent_floor_groups: int = 1
    """1: goodput's decision; 0: the HPA baselines (percent of zero is zero)."""


RATE_CASES = [
    RateCase("groups policy caps a scale-up", 3, 10, rules(groups(2)), rules(), 5, Guard.SCALE_UP_LIMIT),
    RateCase("percent policy doubles at most", 3, 10, rules(percent(100)), rules(), 6, Guard.SCALE_UP_LIMIT),
    RateCase(
        "Max picks the policy allowing more",
        1,
        10,
        rules(percent(100), groups(2)),
        rules(),
        3,
        Guard.SCALE_UP_LIMIT,
    ),
    RateCase(
        "Min picks the policy allowing less",
        1,
        10,
        rules(percent(100), groups(2), select=SelectPolicy.MIN),
        rules(),
        2,
        Guard.SCALE_UP_LIMIT,
    ),
    RateCase("within the limit nothing changes", 3, 4, rules(groups(2)), rules(), 4, None),
    RateCase(
        "additions inside the period use up the limit",
        5,
        8,
        rules(groups(2)),
        rules(),
        5,
        Guard.SCALE_UP_LIMIT,
        up_events=(ScaleEvent(NOW - 30, 2),),
    ),
    RateCase(
        "additions before the period do not count",
        5,
        8,
        rules(groups(2)),
        rules(),
        7,
        Guard.SCALE_UP_LIMIT,
        up_events=(ScaleEvent(NOW - 90, 2),),
    ),
    RateCase(
        "percent of zero still allows one group", 0, 5, rules(percent(100)), rules(), 1, Guard.SCALE_UP_LIMIT
    ),
    RateCase(
        "the HPA's percent of zero is zero",
        0,
        5,
        rules(percent(100)),
        rules(),
        0,
        Guard.SCALE_UP_LIMIT,
        percent_floor_groups=0,
    ),
    RateCase(
        "the HPA's groups policy still moves from a period start of zero",
        2,
        9,
        rules(percent(100, 15.0), groups(4, 15.0)),
        rules(),
        4,
        Guard.SCALE_UP_LIMIT,
        up_events=(ScaleEvent(NOW - 5, 2),),
        percent_floor_groups=0,
    ),
    RateCase(
        "scale-up disabled", 3, 5, rules(select=SelectPolicy.DISABLED), rules(), 3, Guard.SCALE_UP_LIMIT
    ),
    RateCase("groups policy caps a scale-down", 5, 1, rules(), rules(groups(1)), 4, Guard.SCALE_DOWN_LIMIT),
    RateCase("percent scale-down rounds down", 5, 1, rules(), rules(percent(50)), 2, Guard.SCALE_DOWN_LIMIT),
    RateCase(
        "Max picks the biggest scale-down",
        5,
        1,
        rules(),
        rules(groups(1), percent(50)),
        2,
        Guard.SCALE_DOWN_LIMIT,
    ),
    RateCase(
        "Min picks the smallest scale-down",
        5,
        1,
        rules(),
        rules(groups(1), percent(50), select=SelectPolicy.MIN),
        4,
        Guard.SCALE_DOWN_LIMIT,
    ),
    RateCase(
        "removals inside the period use up the limit",
        4,
        2,
        rules(),
        rules(groups(1)),
        4,
        Guard.SCALE_DOWN_LIMIT,
        down_events=(ScaleEvent(NOW - 30, 1),),
    ),
    RateCase(
        "a scale-up inside the period is counted from the period's start",
        5,
        1,
        rules(),
        rules(groups(1)),
        2,
        Guard.SCALE_DOWN_LIMIT,
        up_events=(ScaleEvent(NOW - 10, 2),),
    ),
    RateCase(
        "scale-down disabled", 5, 1, rules(), rules(select=SelectPolicy.DISABLED), 5, Guard.SCALE_DOWN_LIMIT
    ),
    RateCase("no change is never limited", 5, 5, rules(groups(1)), rules(groups(1)), 5, None),
]


@pytest.mark.parametrize("case", RATE_CASES, ids=[case.name for case in RATE_CASES])
def test_step_policies(case: RateCase) -> None:
    result = limit_rate(
        case.current,
        case.desired,
        up_events=case.up_events,
        down_events=case.down_events,
        scale_up=case.up,
        scale_down=case.down,
        now=NOW,
        percent_floor_groups=case.percent_floor_groups,
    )
    assert result == (case.expected, case.guard)


@pytest.mark.parametrize(
    ("desired", "expected"),
    [(0, (1, Guard.TOO_FEW_REPLICAS)), (4, (4, None)), (9, (6, Guard.TOO_MANY_REPLICAS))],
    ids=["below min", "inside", "above max"],
)
def test_bounds(desired: int, expected: tuple[int, Guard | None]) -> None:
    assert clamp(desired, 1, 6) == expected


@pytest.mark.parametrize(
    "build",
    [
        lambda: ScalingRules(tolerance=1.0),
        lambda: ScalingRules(stabilization_window_seconds=-1),
        lambda: ScalingRules(policies=()),
        lambda: ScalingRules(policies=(StepPolicy(StepPolicyType.GROUPS, 0, 60.0),)),
        lambda: ScalingPolicy(min_groups=3, max_groups=2),
        lambda: ScalingPolicy(classes=()),
    ],
    ids=[
        "tolerance of 1",
        "negative window",
        "no step policy",
        "zero-group step",
        "min above max",
        "no classes",
    ],
)
def test_invalid_behaviour_is_rejected(build: Callable[[], object]) -> None:
    with pytest.raises(ValueError):
        build()


def test_disabled_rules_need_no_policy() -> None:
    assert ScalingRules(policies=(), select_policy=SelectPolicy.DISABLED).policies == ()
