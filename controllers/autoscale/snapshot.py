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
from goodput.estimators.attainment import Histogram
from goodput.estimators.capacity import CapacityProfile

# Reasons of ScalingLimited that mean "no further group can be placed now".
PLACEMENT_REASONS = frozenset(reason.value for reason in NoFitReason)
# Groups that never become (more) capacity: a draining group is leaving, a failed one is gone.
NOT_COMING = frozenset({"Draining", "Failed"})


def wanted_groups(replicas: int, min_replicas: int, max_replicas: int) -> int:
    """The complete groups a ModelGroup converges to.

    The API allows bounds moved past `replicas` (a user lowers `maxReplicas` below the current
    count); the count converges to the nearest bound rather than being refused.
    """
    return max(min_replicas, min(replicas, max_replicas))


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


@dataclass(frozen=True, slots=True)
class EngineFigures:
    """One ready group's engine series at one instant, as read and before any rule is applied: the
    latest gauges and their age, and the window's rates, sums, counts and histogram deltas.

    The operator reads them from Prometheus, the simulator from its scrape history; `engine_metrics`
    is the one place both become `GroupMetrics`, so a rule about them (a clamp) cannot exist in one
    world only.
    """

    age_seconds: float
    waiting_requests: float
    running_requests: float
    kv_usage_fraction: float
    prompt_tokens_per_second: float = 0.0
    generation_tokens_per_second: float = 0.0
    prompt_tokens_sum: float = 0.0
    prompt_tokens_count: float = 0.0
    prompts_started: float = 0.0
    prompt_tokens_started: float = 0.0
    generation_tokens_sum: float = 0.0
    generation_tokens_count: float = 0.0
    prefix_hits: float = 0.0
    prefix_queries: float = 0.0
    finished_requests: float = 0.0
    aborted_requests: float = 0.0
    rejected_requests: float = 0.0
    ttft: Histogram | None = None
    itl: Histogram | None = None
    queue_time: Histogram | None = None
    tpot: Histogram | None = None
    prompt_tokens: Histogram | None = None
    prompt_tokens_lookback: Histogram | None = None


def _per(numerator: float, denominator: float) -> float | None:
    """A mean over the window; None when nothing was counted."""
    return numerator / denominator if denominator > 0 else None


def engine_metrics(figures: EngineFigures) -> GroupMetrics:
    """One group's `GroupMetrics` from its figures.

    Counters and gauges are clamped to their meaningful range: Prometheus extrapolates `increase()`
    and `rate()` per series, so a window's figure can come out slightly negative, and a usage slightly
    above one; a decision must never read a negative queue or a hit rate above one.
    """
    return GroupMetrics(
        age_seconds=max(0.0, figures.age_seconds),
        waiting_requests=max(0.0, figures.waiting_requests),
        running_requests=max(0.0, figures.running_requests),
        kv_usage_fraction=min(1.0, max(0.0, figures.kv_usage_fraction)),
        prompt_tokens_per_second=max(0.0, figures.prompt_tokens_per_second),
        generation_tokens_per_second=max(0.0, figures.generation_tokens_per_second),
        mean_input_tokens=_mean_prompt_tokens(figures),
        mean_output_tokens=_per(figures.generation_tokens_sum, figures.generation_tokens_count),
        prefix_hit_fraction=min(1.0, max(0.0, _per(figures.prefix_hits, figures.prefix_queries) or 0.0)),
        ttft=figures.ttft,
        itl=figures.itl,
        queue_time=figures.queue_time,
        tpot=figures.tpot,
        prompt_tokens=figures.prompt_tokens,
        prompt_tokens_lookback=figures.prompt_tokens_lookback,
        finished_requests=max(0.0, figures.finished_requests),
        aborted_requests=max(0.0, figures.aborted_requests),
        rejected_requests=max(0.0, figures.rejected_requests),
        unfinished_prompts=max(0.0, figures.prompts_started - figures.prompt_tokens_count),
        unfinished_prompt_tokens=max(0.0, figures.prompt_tokens_started - figures.prompt_tokens_sum),
    )


def _mean_prompt_tokens(figures: EngineFigures) -> float | None:
    """The mean prompt of the requests the prompt rate counts: those whose first token fell in the
    window (vLLM counts a prompt's tokens then). The finished requests' mean stands in where the
    engine exported no first-token count; it lags a change of prompt lengths by a request's lifetime.
    """
    if figures.prompts_started > 0 and figures.prompt_tokens_started > 0:
        return figures.prompt_tokens_started / figures.prompts_started
    return _per(figures.prompt_tokens_sum, figures.prompt_tokens_count)


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


def expected_ready_seconds(declared_seconds: float | None, measured_seconds: Sequence[float]) -> float | None:
    """How long a group asked for now takes to become capacity: the ModelGroup's declared
    `profile.readyTimeSeconds`, else the median of its groups' measured ready times, else unknown."""
    if declared_seconds is not None and declared_seconds > 0:
        return float(declared_seconds)
    measured = sorted(seconds for seconds in measured_seconds if seconds >= 0)
    if not measured:
        return None
    middle = len(measured) // 2
    return measured[middle] if len(measured) % 2 else (measured[middle - 1] + measured[middle]) / 2


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
    group_ready_seconds: float | None = None,
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
        group_ready_seconds=group_ready_seconds,
    )
