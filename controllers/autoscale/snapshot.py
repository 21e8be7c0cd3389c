"""The counting rules both worlds apply before a decision: how many groups are wanted, which groups
are capacity on its way, and whether more can be placed at all.

The operator reads them from a ModelGroup's spec and status; the simulator from its fleet. Both
call these functions, so the autoscaler sees the same snapshot for the same situation offline and
deployed (DESIGN §6: a policy evaluated offline is the policy deployed).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from goodput.api.conditions import Condition, find_condition
from goodput.api.modelgroup import COMING_STATES
from goodput.api.reasons import ConditionType, NoFitReason
from goodput.controllers.autoscale.feasible_demand import prompt_evidence, snapshot_feasibility
from goodput.controllers.autoscale.model import (
    GatewayObservation,
    GroupMetrics,
    GroupObservation,
    ModelGroupSnapshot,
    ScalingPolicy,
)
from goodput.controllers.autoscale.ready_time import ReadyTimeEstimate
from goodput.controllers.pools import wanted_groups
from goodput.estimators.attainment import Histogram
from goodput.estimators.capacity import CapacityProfile

# Reasons of ScalingLimited that mean "no further group can be placed now".
PLACEMENT_REASONS = frozenset(reason.value for reason in NoFitReason)
# Groups that never become (more) capacity: a draining group is leaving, a failed one is gone.
NOT_COMING = frozenset({"Draining", "Failed"})


def unplaceable(conditions: Sequence[Condition]) -> bool:
    """Whether the group controller reports that no further group can be placed: ScalingLimited is
    True with a placement reason (no GPUs, no topology domain, backed-off domains)."""
    limited = find_condition(conditions, ConditionType.SCALING_LIMITED)
    return limited is not None and limited.status == "True" and limited.reason in PLACEMENT_REASONS


def without_replacements(
    observations: Iterable[GroupObservation], outdated: frozenset[str]
) -> tuple[GroupObservation, ...]:
    """The groups as capacity: a rollout's new group on its way replaces an old ready group, which
    leaves once it is ready, so it is no capacity on its way. As many coming groups of the current
    template as there are ready old ones are left out (the newest first)."""
    observed = tuple(observations)
    old_ready = sum(1 for g in observed if g.name in outdated and g.state == "Ready")
    coming = [g for g in observed if g.name not in outdated and g.state in COMING_STATES]
    replacing = {g.name for g in sorted(coming, key=lambda g: -g.created_at)[:old_ready]}
    return tuple(g for g in observed if g.name not in replacing)


def with_wanted_groups(
    observations: Iterable[GroupObservation], wanted: int, *, now: float, unschedulable: bool
) -> tuple[GroupObservation, ...]:
    """The groups observed, plus one Placing group for each group wanted but not created yet.

    A group the controller has not created yet is capacity on its way exactly like one that is
    placing: counting it keeps the autoscaler from asking twice for the same capacity. Such a group
    is unschedulable while the controller says nothing more can be placed.
    """
    observed = tuple(observations)
    live = sum(1 for group in observed if group.state not in NOT_COMING)
    missing = max(0, wanted - live)
    return observed + tuple(
        GroupObservation(name=f"wanted-{index}", state="Placing", created_at=now, unschedulable=unschedulable)
        for index in range(missing)
    )


def clamped(metrics: GroupMetrics) -> GroupMetrics:
    """One group's metrics as a decision may read them, whichever world read them.

    Counters and gauges are clamped to their meaningful range: Prometheus extrapolates `increase()`
    and `rate()` per series, so a window's figure can come out slightly negative, and a usage slightly
    above one; a decision must never read a negative queue or a usage above one. The operator and
    the simulator both call this, so the rule cannot exist in one world only.
    """
    return replace(
        metrics,
        age_seconds=max(0.0, metrics.age_seconds),
        waiting_requests=max(0.0, metrics.waiting_requests),
        running_requests=max(0.0, metrics.running_requests),
        kv_usage_fraction=min(1.0, max(0.0, metrics.kv_usage_fraction)),
        prompt_tokens_per_second=max(0.0, metrics.prompt_tokens_per_second),
        generation_tokens_per_second=max(0.0, metrics.generation_tokens_per_second),
        prompt_tokens_sum=max(0.0, metrics.prompt_tokens_sum),
        prompt_tokens_count=max(0.0, metrics.prompt_tokens_count),
        prompts_started=max(0.0, metrics.prompts_started),
        prompt_tokens_started=max(0.0, metrics.prompt_tokens_started),
        generation_tokens_sum=max(0.0, metrics.generation_tokens_sum),
        generation_tokens_count=max(0.0, metrics.generation_tokens_count),
        prefix_hits=max(0.0, metrics.prefix_hits),
        prefix_queries=max(0.0, metrics.prefix_queries),
        finished_requests=max(0.0, metrics.finished_requests),
        aborted_requests=max(0.0, metrics.aborted_requests),
        rejected_requests=max(0.0, metrics.rejected_requests),
    )


def _common_bounds(histograms: Sequence[Histogram | None]) -> tuple[float, ...] | None:
    bounds = Counter(histogram.upper_bounds for histogram in histograms if histogram is not None)
    return bounds.most_common(1)[0][0] if bounds else None


def _kept(histogram: Histogram | None, bounds: tuple[float, ...] | None) -> Histogram | None:
    return histogram if histogram is not None and histogram.upper_bounds == bounds else None


def aligned(metrics: Mapping[str, GroupMetrics]) -> dict[str, GroupMetrics]:
    """Histograms with bounds unlike most groups' are dropped (they cannot be merged), so one engine
    with custom buckets costs only its own latency evidence, never the decision."""
    groups = list(metrics.values())
    ttft = _common_bounds([group.ttft for group in groups])
    itl = _common_bounds([group.itl for group in groups])
    queue_time = _common_bounds([group.queue_time for group in groups])
    tpot = _common_bounds([group.tpot for group in groups])
    prompt_tokens = _common_bounds(
        [histogram for group in groups for histogram in (group.prompt_tokens, group.prompt_tokens_lookback)]
    )
    return {
        name: replace(
            group,
            ttft=_kept(group.ttft, ttft),
            itl=_kept(group.itl, itl),
            queue_time=_kept(group.queue_time, queue_time),
            tpot=_kept(group.tpot, tpot),
            prompt_tokens=_kept(group.prompt_tokens, prompt_tokens),
            prompt_tokens_lookback=_kept(group.prompt_tokens_lookback, prompt_tokens),
        )
        for name, group in metrics.items()
    }


@dataclass(frozen=True, slots=True)
class ModelGroupCounts:
    """What a ModelGroup says about its count: the groups wanted (`spec.replicas`) within their
    bounds, the groups a rollout replaces, and whether another group can be placed at all."""

    spec_replicas: int
    min_replicas: int
    max_replicas: int
    outdated: frozenset[str] = frozenset()
    unschedulable: bool = False


def capacity_view(
    observations: Iterable[GroupObservation], counts: ModelGroupCounts, *, now: float
) -> tuple[GroupObservation, ...]:
    """The groups as the decision counts them: a rollout's replacements left out, the groups wanted
    but not created yet added as placing."""
    return with_wanted_groups(
        without_replacements(observations, counts.outdated),
        wanted_groups(counts.spec_replicas, counts.min_replicas, counts.max_replicas),
        now=now,
        unschedulable=counts.unschedulable,
    )


def model_group_snapshot(
    observations: Iterable[GroupObservation],
    counts: ModelGroupCounts,
    *,
    profile: CapacityProfile,
    policy: ScalingPolicy,
    name: str,
    metrics_window_seconds: float,
    now: float,
    gateway: GatewayObservation | None = None,
    ready_time: ReadyTimeEstimate | None = None,
) -> ModelGroupSnapshot:
    """The snapshot `decide` reads, from the groups observed (with their engine metrics) and the
    ModelGroup's counts: the same assembly, feasibility included, in the operator and the simulator."""
    groups = capacity_view(observations, counts, now=now)
    evidence = prompt_evidence(groups, policy.staleness.max_age_seconds)
    return ModelGroupSnapshot(
        spec_replicas=counts.spec_replicas,
        groups=groups,
        profile=profile,
        name=name,
        metrics_window_seconds=metrics_window_seconds,
        feasibility=snapshot_feasibility(profile, policy, evidence),
        gateway=gateway,
        group_ready_seconds=None if ready_time is None else ready_time.seconds,
        group_ready_source=None if ready_time is None else ready_time.source,
    )
