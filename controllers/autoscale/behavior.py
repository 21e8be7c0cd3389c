"""The HorizontalPodAutoscaler's `behavior` semantics, for complete groups instead of pods.

Each stage is a pure function of plain values, in the HPA's documented order:

1. tolerance: a proportional proposal within the band around the current count is no change; one
   outside it is the demand rounded up, in either direction;
2. stabilisation: scaling up acts on the lowest recommendation of its window, scaling down on the
   highest of its window (the current one included), so a dip shorter than the window never scales in;
3. step policies: per direction, each policy allows `value` groups (or percent of the count at the
   start of its period) per `periodSeconds`, counting the scale events inside the period;
   `selectPolicy` picks the policy allowing the most change (Max), the least (Min), or none (Disabled);
4. bounds: [min, max].

Each function returns the new count and the guard that changed it, or None. This is the one step
limiter of the project: goodput's decision (`controllers.autoscale`) and the simulator's HPA, KEDA
baselines (`simulator.baselines`) call the same functions; only the order of the stages and the
floor of a Percent policy at zero differ between them, and each caller says which it uses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from goodput.api.reasons import Guard
from goodput.controllers.autoscale.model import (
    Recommendation,
    ScaleEvent,
    ScalingRules,
    SelectPolicy,
    StepPolicyType,
)
from goodput.estimators.proposals import ceil_groups

# Tolerance comparisons allow this much floating-point error: a ratio of exactly 1.1 must be inside
# a 0.1 band even when it computes as 1.1000000000000001.
_TOLERANCE_SLACK = 1e-9


def tolerated_groups(
    demand_groups: float, current_groups: int, scale_up: ScalingRules, scale_down: ScalingRules
) -> int:
    """A proportional proposal after the tolerance band.

    Inside [1 - down tolerance, 1 + up tolerance] of the current count it is no change; outside, it
    is the demand rounded up, as the HPA computes it. The band decides whether to move, not how far:
    the headroom is already in the demand (the safety factor on the arrival rate), and a scaled-in
    count M = ceil(d) >= d is carried back out only by a rise beyond the upper band, so noise the
    band absorbs cannot make it flap. Noise that dips below the lower band is the scale-down
    stabilisation window's to filter (it takes the highest recommendation of the window). Adding
    the band's width to the scale-in target as well would keep s/(1 - tolerance) of headroom at
    steady state instead of s: a third of a group per group at s = 1.2.
    """
    if current_groups <= 0:
        return ceil_groups(demand_groups)
    ratio = demand_groups / current_groups
    if ratio > 1.0 + scale_up.tolerance + _TOLERANCE_SLACK:
        return ceil_groups(demand_groups)
    if ratio < 1.0 - scale_down.tolerance - _TOLERANCE_SLACK:
        return min(current_groups, ceil_groups(demand_groups))
    return current_groups


def stabilize(
    current_groups: int,
    recommended_groups: int,
    history: Sequence[Recommendation],
    *,
    scale_up: ScalingRules,
    scale_down: ScalingRules,
    now: float,
) -> tuple[int, Guard | None]:
    """Bound the move by the recommendations inside each direction's window.

    The count may rise only to the lowest recommendation of the scale-up window and fall only to the
    highest of the scale-down window; `recommended_groups` is this tick's and counts in both.
    """
    up_cutoff = now - scale_up.stabilization_window_seconds
    down_cutoff = now - scale_down.stabilization_window_seconds
    lowest_up = highest_down = recommended_groups
    for recommendation in history:
        if recommendation.at > up_cutoff and recommendation.groups < lowest_up:
            lowest_up = recommendation.groups
        if recommendation.at > down_cutoff and recommendation.groups > highest_down:
            highest_down = recommendation.groups
    stabilized = min(max(current_groups, lowest_up), highest_down)
    if stabilized < recommended_groups:
        return stabilized, Guard.SCALE_UP_STABILIZED
    if stabilized > recommended_groups:
        return stabilized, Guard.SCALE_DOWN_STABILIZED
    return stabilized, None


def _changed_in_period(events: Sequence[ScaleEvent], period_seconds: float, now: float) -> int:
    cutoff = now - period_seconds
    return sum(event.groups for event in events if event.at > cutoff)


def scale_up_limit(
    current_groups: int,
    up_events: Sequence[ScaleEvent],
    down_events: Sequence[ScaleEvent],
    rules: ScalingRules,
    now: float,
    *,
    percent_floor_groups: int,
) -> int:
    """The most groups the step policies allow now (never below the current count).

    As the HPA computes it, a Percent policy allows ceil(start x (1 + value/100)), so percent of
    zero is zero; `percent_floor_groups` is the least a Percent policy allows: 0 for the HPA, 1 for
    goodput, whose pool at zero could otherwise never start on Percent policies alone.
    """
    if rules.select_policy is SelectPolicy.DISABLED:
        return current_groups
    limits = []
    for policy in rules.policies:
        period_start = (
            current_groups
            - _changed_in_period(up_events, policy.period_seconds, now)
            + _changed_in_period(down_events, policy.period_seconds, now)
        )
        if policy.type is StepPolicyType.GROUPS:
            limits.append(period_start + policy.value)
        else:
            limits.append(max(percent_floor_groups, math.ceil(period_start * (1 + policy.value / 100))))
    limit = max(limits) if rules.select_policy is SelectPolicy.MAX else min(limits)
    return max(limit, current_groups)


def scale_down_limit(
    current_groups: int,
    up_events: Sequence[ScaleEvent],
    down_events: Sequence[ScaleEvent],
    rules: ScalingRules,
    now: float,
) -> int:
    """The fewest groups the step policies allow now (never above the current count).

    A Percent policy allows floor(start x (1 - value/100)), the HPA's truncation.
    """
    if rules.select_policy is SelectPolicy.DISABLED:
        return current_groups
    limits = []
    for policy in rules.policies:
        period_start = (
            current_groups
            - _changed_in_period(up_events, policy.period_seconds, now)
            + _changed_in_period(down_events, policy.period_seconds, now)
        )
        if policy.type is StepPolicyType.GROUPS:
            limits.append(period_start - policy.value)
        else:
            limits.append(math.floor(period_start * (1 - policy.value / 100)))
    # "Max" selects the policy allowing the biggest change: for scaling down, the lowest count.
    limit = min(limits) if rules.select_policy is SelectPolicy.MAX else max(limits)
    return min(max(limit, 0), current_groups)


def limit_rate(
    current_groups: int,
    desired_groups: int,
    *,
    up_events: Sequence[ScaleEvent],
    down_events: Sequence[ScaleEvent],
    scale_up: ScalingRules,
    scale_down: ScalingRules,
    now: float,
    percent_floor_groups: int,
) -> tuple[int, Guard | None]:
    """The desired count within the step policies of its direction (`scale_up_limit`,
    `scale_down_limit`); the HPA baselines of the simulator and goodput's decision both use it."""
    if desired_groups > current_groups:
        limit = scale_up_limit(
            current_groups, up_events, down_events, scale_up, now, percent_floor_groups=percent_floor_groups
        )
        if desired_groups > limit:
            return limit, Guard.SCALE_UP_LIMIT
    elif desired_groups < current_groups:
        limit = scale_down_limit(current_groups, up_events, down_events, scale_down, now)
        if desired_groups < limit:
            return limit, Guard.SCALE_DOWN_LIMIT
    return desired_groups, None


def clamp(desired_groups: int, min_groups: int, max_groups: int) -> tuple[int, Guard | None]:
    if desired_groups > max_groups:
        return max_groups, Guard.TOO_MANY_REPLICAS
    if desired_groups < min_groups:
        return min_groups, Guard.TOO_FEW_REPLICAS
    return desired_groups, None
