"""What may hold a proposed count: stale or missing metrics (HoldScaleIn, Freeze), capacity already
on its way or unplaceable, and a scale-in the remaining groups could not carry under p90 work."""

from __future__ import annotations

import math

from goodput.api.reasons import Guard
from goodput.controllers.autoscale.model import (
    Estimates,
    ModelGroupSnapshot,
    QueueWorkSignal,
    ScalingPolicy,
    StaleMetricsAction,
)
from goodput.controllers.autoscale.observe import ObservedGroups
from goodput.estimators.proposals import (
    arrival_demand_groups,
    ceil_groups,
    kv_demand_groups,
    queue_budget_demand_groups,
    work_demand_groups,
)


def _scale_in_floor(estimates: Estimates, snapshot: ModelGroupSnapshot, policy: ScalingPolicy) -> int:
    """The fewest groups that keep today's load inside the SLO and KV limits, with p90 work.

    Checked before any scale-in: the arrival rate with its safety factor, the queued work within the
    affordable wait, the KV demand within the usable cache.
    """
    signals = policy.signals
    capacity = estimates.capacity_per_group
    safety = signals.queue_work.safety_factor if signals.queue_work is not None else 1.0
    min_slack = signals.slack.min_slack_seconds if signals.slack is not None else 0.0
    min_free = signals.kv_cache.min_free_fraction if signals.kv_cache is not None else 0.0
    arrival = estimates.arrival_work_rate or 0.0
    waiting_p90 = estimates.waiting_work_seconds_p90 or 0.0
    demand = arrival_demand_groups(arrival, capacity, safety)
    if waiting_p90 > 0:
        budget_demand = queue_budget_demand_groups(
            waiting_p90, capacity, estimates.queue_budget_seconds - min_slack
        )
        if budget_demand is None:
            # No wait is affordable: the service time alone misses the TTFT target, at any count.
            # More groups cannot fix that, so it never holds a scale-in; the queued work must still
            # drain within the queue-work signal's target.
            drain_seconds = (signals.queue_work or QueueWorkSignal()).drain_target_seconds
            budget_demand = work_demand_groups(arrival, waiting_p90, capacity, drain_seconds, safety)
        demand = max(demand, budget_demand)
    kv_capacity = snapshot.profile.kv_capacity_tokens
    if estimates.kv_demand_tokens and kv_capacity > 0:
        demand = max(demand, kv_demand_groups(estimates.kv_demand_tokens, kv_capacity, min_free))
    if math.isinf(demand):
        return snapshot.spec_replicas
    floor = ceil_groups(demand)
    busy = arrival > 0 or waiting_p90 > 0 or (estimates.running_requests or 0.0) > 0
    return max(floor, 1) if busy else floor


def knowledge_guard(
    desired: int, current: int, observation: ObservedGroups, policy: ScalingPolicy
) -> tuple[int, Guard | None]:
    """What is not known never lowers the count (HoldScaleIn), or never moves it (Freeze)."""
    partial = observation.stale > 0 or observation.queue_stale or observation.gateway_stale
    blind = observation.missing > 0 or (not observation.load_known and current > 0)
    if not (partial or blind):
        return desired, None
    if policy.staleness.action is StaleMetricsAction.FREEZE:
        return (current, Guard.STALE_METRICS_FREEZE) if desired != current else (desired, None)
    if desired < current:
        return current, Guard.STALE_METRICS_HOLD_SCALE_IN if partial else Guard.MISSING_METRICS_HOLD_SCALE_IN
    return desired, None


def capacity_guard(
    desired: int,
    current: int,
    *,
    observation: ObservedGroups,
    estimates: Estimates,
    snapshot: ModelGroupSnapshot,
    policy: ScalingPolicy,
    ahead_groups: int = 0,
) -> tuple[int, Guard | None]:
    """Guards that only ever move the count back toward the current one.

    An unschedulable group holds scale-out: more groups would not place either. Groups on their way
    are capacity: the backlog they will absorb adds nothing, only an arrival rate beyond them does,
    or a floor asked for ahead of the load (`ahead_groups`: forecast, schedule), which is sized for
    the load to come, not today's.
    A scale-in must leave enough groups for today's load under p90 work estimates.
    """
    if desired > current and observation.unschedulable > 0:
        return current, Guard.UNSCHEDULABLE
    if desired > current and observation.coming > 0:
        queue_work = policy.signals.queue_work
        safety = queue_work.safety_factor if queue_work is not None else 1.0
        arrival = estimates.arrival_work_rate or 0.0
        allowed = max(
            current,
            ceil_groups(arrival_demand_groups(arrival, estimates.capacity_per_group, safety)),
            ahead_groups,
        )
        if desired > allowed:
            return allowed, Guard.CAPACITY_COMING
    if desired < current:
        floor = _scale_in_floor(estimates, snapshot, policy)
        if desired < floor:
            return min(current, floor), Guard.SCALE_IN_UNSAFE
    return desired, None
