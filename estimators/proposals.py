"""How many complete groups each signal asks for (§26, §27): pure arithmetic, no policy logic.

Proportional signals return a fractional group demand; the decision pipeline applies its tolerance
band to that fraction (as the HorizontalPodAutoscaler does to its usage ratio) before rounding up.
"""

from __future__ import annotations

import math

# Demands within this of an integer are that integer: 3.0000000001 groups must not become 4.
_ROUNDING_SLACK = 1e-9


def ceil_groups(demand_groups: float) -> int:
    """Whole groups that cover a fractional demand."""
    if demand_groups <= 0:
        return 0
    return math.ceil(demand_groups - _ROUNDING_SLACK)


def work_demand_groups(
    arrival_work_rate: float,
    backlog_work_seconds: float,
    capacity_per_group: float,
    drain_target_seconds: float,
    safety_factor: float,
) -> float:
    """(s·λ_w + Q/T_d) / C: serve arrivals with headroom and drain the backlog within T_d (§26)."""
    _require_positive(capacity_per_group, drain_target_seconds)
    return (
        safety_factor * arrival_work_rate + backlog_work_seconds / drain_target_seconds
    ) / capacity_per_group


def work_left_when_ready(
    waiting_work_seconds: float,
    serving_groups: int,
    capacity_per_group: float,
    arrival_work_rate: float | None,
    ready_seconds: float | None,
) -> float:
    """The waiting work still waiting when a group asked for now becomes capacity.

    Until then the serving groups drain the backlog at their spare rate (their capacity above the
    arrival rate); what they drain sooner is demand no new group can serve, so only the rest may ask
    for groups. An arrival rate beyond their capacity adds its excess until then: in a burst, the
    backlog a new group meets is the one that built up while it started. Unknown ready time or
    arrival rate: all of the waiting work, as if capacity came at once.
    """
    if ready_seconds is None or ready_seconds <= 0 or arrival_work_rate is None:
        return waiting_work_seconds
    net_rate = arrival_work_rate - serving_groups * capacity_per_group
    return max(0.0, waiting_work_seconds + net_rate * ready_seconds)


def arrival_demand_groups(arrival_work_rate: float, capacity_per_group: float, safety_factor: float) -> float:
    """s·λ_w / C: the groups the arrival rate alone needs, whatever the backlog."""
    _require_positive(capacity_per_group)
    return safety_factor * arrival_work_rate / capacity_per_group


def queue_budget_demand_groups(
    waiting_work_seconds: float, capacity_per_group: float, affordable_wait_seconds: float
) -> float | None:
    """Groups whose pooled capacity serves the queued work within the wait a request can afford.

    None when the affordable wait is not positive: the service time alone already misses the TTFT
    target, and more groups cannot change that.
    """
    _require_positive(capacity_per_group)
    if affordable_wait_seconds <= 0:
        return None
    return waiting_work_seconds / (capacity_per_group * affordable_wait_seconds)


def kv_demand_groups(kv_demand_tokens: float, kv_capacity_tokens: int, min_free_fraction: float) -> float:
    """Groups whose KV caches hold the demand while keeping `min_free_fraction` of each free."""
    usable_tokens = kv_capacity_tokens * (1.0 - min_free_fraction)
    _require_positive(usable_tokens)
    return kv_demand_tokens / usable_tokens


def _require_positive(*values: float) -> None:
    if any(not value > 0 for value in values):
        raise ValueError("capacities, targets and usable KV must be positive")
