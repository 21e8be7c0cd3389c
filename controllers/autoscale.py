"""The scaling decision: one pure function from a ModelGroup snapshot to a number of complete groups.

`decide(snapshot, policy, state, now)` runs, in order (design note §27, §33; DESIGN.md §6):

1. observe: count groups by state; pool the fresh metrics of ready groups (stale or missing ones
   are set aside, never guessed);
2. estimate: λ_w, Q_work, C for the current mix, predicted queue wait, queue budget, slack, KV
   demand, attainment and goodput (`goodput.estimators`);
3. propose, one count per signal: queueWork, slack, kvCache, goodput, scaleFromZero, warmFloor,
   minReplicas;
4. combine: proportional proposals inside the tolerance band count as no change (per signal, as
   the HPA does per metric), then the largest proposal wins and names the decision's signal;
5. knowledge: with stale or missing metrics the count never goes down (HoldScaleIn), or does not
   move at all (Freeze);
6. stabilisation, step policies and [min, max] bounds, with the HPA's `behavior` semantics;
7. guards on capacity: an unschedulable group holds scale-out; groups already placing, provisioning
   or warming are capacity on its way, so only a rising arrival rate adds more (decisions do not
   stack); scale-in happens only if the remaining groups keep the queue inside its budget and the
   KV caches inside their limit under p90 work estimates; the bounds still win;
8. mode: Frozen holds the count; Advisory computes and records but does not apply.

The operator and the simulator call the same function; it does no I/O and reads no clock.
"""

from __future__ import annotations

import math
from typing import TypeGuard, TypeVar

from goodput.controllers.autoscale_model import (
    COMING_STATES,
    Decision,
    DecisionState,
    Estimates,
    GroupCounts,
    GroupMetrics,
    GroupObservation,
    GroupState,
    Guard,
    Mode,
    ModelGroupSnapshot,
    Proposal,
    Recommendation,
    RequestQueue,
    ScaleEvent,
    ScalingPolicy,
    Signal,
    StaleMetricsAction,
)
from goodput.controllers.scaling_behavior import clamp, limit_rate, stabilize, tolerated_groups
from goodput.estimators.attainment import (
    GoodputReport,
    Histogram,
    fraction_within,
    goodput_from_histograms,
    histogram_quantile,
    merge_histograms,
)
from goodput.estimators.proposals import (
    arrival_demand_groups,
    ceil_groups,
    kv_demand_groups,
    queue_budget_demand_groups,
    work_demand_groups,
)
from goodput.estimators.queueing import (
    QueuedRequest,
    QueueWork,
    SlackSummary,
    TrafficMix,
    arrival_work_rate,
    predicted_queue_wait_seconds,
    queue_budget_seconds,
    queue_work_exact,
    queue_work_from_counts,
    slack_from_requests,
)

__all__ = [
    "Decision",
    "DecisionState",
    "GroupMetrics",
    "GroupObservation",
    "GroupState",
    "Guard",
    "Mode",
    "ModelGroupSnapshot",
    "Proposal",
    "QueuedRequest",
    "RequestQueue",
    "ScalingPolicy",
    "Signal",
    "decide",
]


_Timed = TypeVar("_Timed", Recommendation, ScaleEvent)


def _finite(metrics: GroupMetrics) -> bool:
    """Every number the signals add up is finite (a sum is NaN or infinite if any term is)."""
    return math.isfinite(
        metrics.age_seconds
        + metrics.waiting_requests
        + metrics.running_requests
        + metrics.kv_usage_fraction
        + metrics.prompt_tokens_per_second
        + metrics.generation_tokens_per_second
        + metrics.prefix_hit_fraction
    )


def _positive(value: float | None) -> TypeGuard[float]:
    return value is not None and 0 < value < math.inf


class _Observation:
    """Group counts and the pooled fresh metrics of ready groups, gathered in one pass."""

    __slots__ = (
        "aborted",
        "coming",
        "current",
        "draining",
        "failed",
        "finished",
        "fresh",
        "generation_rate",
        "itl",
        "kv_used_tokens",
        "missing",
        "mix",
        "prompt_rate",
        "queue",
        "queue_stale",
        "queue_time",
        "ready",
        "rejected",
        "running",
        "stale",
        "ttft",
        "unschedulable",
        "waiting",
    )

    def __init__(self, snapshot: ModelGroupSnapshot, policy: ScalingPolicy) -> None:
        profile = snapshot.profile
        max_age = policy.staleness.max_age_seconds
        kv_capacity = profile.kv_capacity_tokens
        self.current = snapshot.spec_replicas
        ready = coming = draining = failed = unschedulable = fresh = stale = missing = 0
        waiting = running = prompt_rate = generation_rate = kv_used = 0.0
        finished = aborted = rejected = 0.0
        mix_weight = mix_input = mix_output = hit_tokens = 0.0
        ttft: list[Histogram] = []
        itl: list[Histogram] = []
        queue_time: list[Histogram] = []
        for group in snapshot.groups:
            if group.unschedulable:
                unschedulable += 1
            state = group.state
            if state is not GroupState.READY:
                if state in COMING_STATES:
                    coming += 1
                elif state is GroupState.DRAINING:
                    draining += 1
                elif state is GroupState.FAILED:
                    failed += 1
                continue
            ready += 1
            metrics = group.metrics
            if metrics is None:
                missing += 1
                continue
            if not _finite(metrics):
                missing += 1  # NaN or infinite series (a 0/0 in a query) are not knowledge
                continue
            if metrics.age_seconds > max_age:
                stale += 1
                continue
            fresh += 1
            waiting += metrics.waiting_requests
            running += metrics.running_requests
            prompt_rate += metrics.prompt_tokens_per_second
            generation_rate += metrics.generation_tokens_per_second
            kv_used += metrics.kv_usage_fraction * kv_capacity
            hit_tokens += metrics.prompt_tokens_per_second * metrics.prefix_hit_fraction
            mean_input = metrics.mean_input_tokens
            if _positive(mean_input) and metrics.prompt_tokens_per_second > 0:
                requests_per_second = metrics.prompt_tokens_per_second / mean_input
                mean_output = metrics.mean_output_tokens
                mix_weight += requests_per_second
                mix_input += metrics.prompt_tokens_per_second
                mix_output += requests_per_second * (
                    mean_output if _positive(mean_output) else profile.reference_output_tokens
                )
            finished += metrics.finished_requests
            aborted += metrics.aborted_requests
            rejected += metrics.rejected_requests
            if metrics.ttft is not None:
                ttft.append(metrics.ttft)
            if metrics.itl is not None:
                itl.append(metrics.itl)
            if metrics.queue_time is not None:
                queue_time.append(metrics.queue_time)
        self.ready, self.coming, self.draining, self.failed = ready, coming, draining, failed
        self.unschedulable, self.fresh, self.stale, self.missing = unschedulable, fresh, stale, missing
        self.waiting, self.running = waiting, running
        self.prompt_rate, self.generation_rate, self.kv_used_tokens = prompt_rate, generation_rate, kv_used
        self.finished, self.aborted, self.rejected = finished, aborted, rejected
        self.ttft, self.itl, self.queue_time = ttft, itl, queue_time
        self.mix = TrafficMix(
            mean_input_tokens=mix_input / mix_weight if mix_weight > 0 else profile.reference_input_tokens,
            mean_output_tokens=mix_output / mix_weight if mix_weight > 0 else profile.reference_output_tokens,
            prefix_hit_fraction=hit_tokens / prompt_rate if prompt_rate > 0 else 0.0,
        )
        queue = snapshot.queue
        self.queue_stale = queue is not None and queue.age_seconds > max_age
        self.queue: RequestQueue | None = queue if queue is not None and not self.queue_stale else None

    @property
    def load_known(self) -> bool:
        return self.fresh > 0 or self.queue is not None

    @property
    def has_demand(self) -> bool:
        """Any work waiting, running or arriving: what wakes a pool at zero groups."""
        if self.queue is not None and self.queue.requests:
            return True
        return self.waiting > 0 or self.running > 0 or self.prompt_rate > 0 or self.generation_rate > 0

    def counts(self) -> GroupCounts:
        return GroupCounts(
            current=self.current,
            ready=self.ready,
            coming=self.coming,
            draining=self.draining,
            failed=self.failed,
            unschedulable=self.unschedulable,
            fresh_metrics=self.fresh,
            stale_metrics=self.stale,
            missing_metrics=self.missing,
        )


def _queue_view(
    observation: _Observation, snapshot: ModelGroupSnapshot
) -> tuple[QueueWork | None, float | None, float | None, int]:
    """Queued work, waiting and running requests, and the groups serving the queue.

    Exact queue contents, when fresh, replace the engine counts; a gateway's queue is served by every
    ready group, an engine's by its own group.
    """
    profile = snapshot.profile
    queue = observation.queue
    if queue is not None:
        running = float(sum(1 for request in queue.requests if request.running))
        work = queue_work_exact(profile.pricing, queue.requests, profile.work_error)
        return work, len(queue.requests) - running, running, observation.ready
    if observation.fresh > 0:
        work = queue_work_from_counts(
            profile.pricing,
            observation.waiting,
            observation.running,
            observation.mix,
            profile.output_tokens_p90_over_mean,
        )
        return work, observation.waiting, observation.running, observation.fresh
    return None, None, None, 0


def _request_slack(
    observation: _Observation,
    snapshot: ModelGroupSnapshot,
    policy: ScalingPolicy,
    capacity: float,
    now: float,
) -> SlackSummary | None:
    """Every waiting request's own slack, when exact queue contents are known."""
    queue = observation.queue
    if queue is None:
        return None
    slack = policy.signals.slack
    profile = snapshot.profile
    step_model = profile.step_model
    first_decode = profile.first_decode_seconds

    def service_seconds(request: QueuedRequest) -> float:
        return step_model.prefill_seconds(request.input_tokens, request.cached_tokens) + first_decode

    def ttft_target(class_name: str) -> float:
        return policy.targets_for(class_name).ttft_seconds

    return slack_from_requests(
        profile.pricing,
        queue.requests,
        now=now,
        serving_groups=observation.ready,
        capacity_per_group=capacity,
        ttft_target_seconds=ttft_target,
        service_seconds=service_seconds,
        min_slack_seconds=slack.min_slack_seconds if slack is not None else 0.0,
        low_slack_fraction=slack.low_slack_fraction if slack is not None else 0.0,
        margin_seconds=(slack.route_seconds + slack.margin_seconds) if slack is not None else 0.0,
    )


def _kv_demand(observation: _Observation, kv_capacity: int) -> tuple[float | None, float | None]:
    """KV tokens in use plus the prompts still waiting for a cache, and the free fraction in use."""
    queue = observation.queue
    if observation.fresh > 0:
        if queue is not None:
            waiting_prompt_tokens = float(sum(r.input_tokens for r in queue.requests if not r.running))
        else:
            waiting_prompt_tokens = observation.waiting * observation.mix.mean_input_tokens
        free = (
            1.0 - observation.kv_used_tokens / (observation.fresh * kv_capacity) if kv_capacity > 0 else None
        )
        return observation.kv_used_tokens + waiting_prompt_tokens, free
    if queue is not None:
        return float(
            sum(r.input_tokens + (r.generated_tokens if r.running else 0) for r in queue.requests)
        ), None
    return None, None


def _attainment(
    observation: _Observation, policy: ScalingPolicy, window_seconds: float
) -> tuple[float | None, float | None, float | None, GoodputReport | None]:
    """TTFT and ITL attainment of the primary class, measured queue time p90, and goodput."""
    if observation.fresh == 0:
        return None, None, None, None
    target = policy.primary_class
    ttft = fraction_within(merge_histograms(observation.ttft), target.ttft_seconds)
    itl = fraction_within(merge_histograms(observation.itl), target.itl_seconds)
    queue_time_p90 = histogram_quantile(merge_histograms(observation.queue_time), 0.9)
    goodput = goodput_from_histograms(
        window_seconds=window_seconds,
        ttft_within_target=ttft,
        itl_within_target=itl,
        finished_requests=observation.finished,
        aborted_requests=observation.aborted,
        rejected_requests=observation.rejected,
        generated_tokens=observation.generation_rate * window_seconds,
    )
    return ttft, itl, queue_time_p90, goodput


def _estimate(
    observation: _Observation, snapshot: ModelGroupSnapshot, policy: ScalingPolicy, now: float
) -> tuple[Estimates, SlackSummary | None]:
    profile = snapshot.profile
    mix = observation.mix
    slack = policy.signals.slack
    capacity = profile.capacity_per_group(mix.mean_input_tokens, mix.mean_output_tokens)
    arrival = (
        arrival_work_rate(profile.pricing, observation.prompt_rate, observation.generation_rate, mix)
        if observation.fresh > 0
        else None
    )
    queue_work, waiting_requests, running_requests, serving_groups = _queue_view(observation, snapshot)
    budget = queue_budget_seconds(
        policy.primary_class.ttft_seconds,
        profile.prefill_seconds_p90,
        profile.first_decode_seconds,
        slack.route_seconds if slack is not None else 0.0,
        slack.margin_seconds if slack is not None else 0.0,
    )
    predicted_wait = (
        None
        if queue_work is None
        else predicted_queue_wait_seconds(queue_work.waiting_seconds, serving_groups, capacity)
    )
    slack_summary = _request_slack(observation, snapshot, policy, capacity, now)
    if slack_summary is not None:
        earliest_slack = slack_summary.earliest_slack_seconds
    else:
        earliest_slack = None if predicted_wait is None else budget - predicted_wait
    kv_demand, kv_free = _kv_demand(observation, profile.kv_capacity_tokens)
    ttft, itl, queue_time_p90, goodput = _attainment(observation, policy, snapshot.metrics_window_seconds)
    estimates = Estimates(
        mean_input_tokens=mix.mean_input_tokens,
        mean_output_tokens=mix.mean_output_tokens,
        capacity_per_group=capacity,
        waiting_requests=waiting_requests,
        running_requests=running_requests,
        arrival_work_rate=arrival,
        queue_work_seconds=None if queue_work is None else queue_work.total_seconds,
        waiting_work_seconds=None if queue_work is None else queue_work.waiting_seconds,
        running_work_seconds=None if queue_work is None else queue_work.running_seconds,
        waiting_work_seconds_p90=None if queue_work is None else queue_work.waiting_seconds_p90,
        predicted_queue_wait_seconds=predicted_wait,
        queue_budget_seconds=budget,
        earliest_slack_seconds=earliest_slack,
        low_slack_fraction=None if slack_summary is None else slack_summary.low_slack_fraction,
        kv_demand_tokens=kv_demand,
        kv_free_fraction=kv_free,
        ttft_attainment=ttft,
        itl_attainment=itl,
        queue_time_p90_seconds=queue_time_p90,
        goodput=goodput,
    )
    return estimates, slack_summary


def _proposals(
    observation: _Observation,
    estimates: Estimates,
    slack_summary: SlackSummary | None,
    snapshot: ModelGroupSnapshot,
    policy: ScalingPolicy,
) -> list[Proposal]:
    """One proposal per signal that has something to say; unknown signals stay silent."""
    signals = policy.signals
    capacity = estimates.capacity_per_group
    proposals: list[Proposal] = []

    queue_work = signals.queue_work
    waiting_work = estimates.waiting_work_seconds
    if queue_work is not None and waiting_work is not None:
        arrival = estimates.arrival_work_rate or 0.0
        demand = work_demand_groups(
            arrival, waiting_work, capacity, queue_work.drain_target_seconds, queue_work.safety_factor
        )
        proposals.append(
            Proposal(
                Signal.QUEUE_WORK,
                ceil_groups(demand),
                demand,
                f"lambda_w={arrival:.4g}/s Q_wait={waiting_work:.4g}s C={capacity:.3g}/s "
                f"T_d={queue_work.drain_target_seconds:g}s s={queue_work.safety_factor:g}",
                demand,
            )
        )

    slack = signals.slack
    if slack is not None and waiting_work is not None:
        # A request arriving now waits behind all queued work; with exact queue contents, every
        # queued request's own deadline counts too. Either may ask for the groups.
        arrival_wait = estimates.predicted_queue_wait_seconds or 0.0
        arrival_slack = estimates.queue_budget_seconds - arrival_wait
        affordable = estimates.queue_budget_seconds - slack.min_slack_seconds
        demands = [queue_budget_demand_groups(waiting_work, capacity, affordable)]
        at_risk = arrival_slack < slack.min_slack_seconds
        if slack_summary is not None and slack_summary.waiting_requests > 0:
            demands.append(slack_summary.demand_groups)
            at_risk = at_risk or (slack_summary.low_slack_fraction or 0.0) > slack.low_slack_fraction
        known = [demand for demand in demands if demand is not None]
        if known:
            demand = max(known)
            detail = (
                f"earliest_slack={_seconds(estimates.earliest_slack_seconds)} "
                f"arrival_slack={_seconds(arrival_slack)} B_queue={estimates.queue_budget_seconds:.4g}s"
            )
            if estimates.low_slack_fraction is not None:
                detail += f" low_slack={estimates.low_slack_fraction:.3g}"
            proposals.append(
                Proposal(
                    Signal.SLACK,
                    ceil_groups(demand),
                    estimates.earliest_slack_seconds,
                    detail,
                    _unless_urgent(demand, at_risk, observation.current),
                )
            )

    kv = signals.kv_cache
    kv_demand = estimates.kv_demand_tokens
    kv_capacity = snapshot.profile.kv_capacity_tokens
    if kv is not None and kv_demand is not None and kv_capacity > 0:
        demand = kv_demand_groups(kv_demand, kv_capacity, kv.min_free_fraction)
        proposals.append(
            Proposal(
                Signal.KV_CACHE,
                ceil_groups(demand),
                estimates.kv_free_fraction,
                f"kv_demand={kv_demand:.4g} tokens capacity={kv_capacity}/group "
                f"min_free={kv.min_free_fraction:g}",
                demand,
            )
        )

    goodput = signals.goodput
    if goodput is not None:
        attainment = _measured_attainment(observation, estimates, goodput.min_observations)
        if attainment is not None and attainment < goodput.attainment_floor:
            proposals.append(
                Proposal(
                    Signal.GOODPUT,
                    observation.current + 1,
                    attainment,
                    f"attainment={attainment:.4g} < floor={goodput.attainment_floor:g}",
                )
            )

    if observation.current == 0 and observation.has_demand:
        proposals.append(
            Proposal(Signal.SCALE_FROM_ZERO, 1, None, "work is waiting or arriving at zero groups")
        )
    if policy.warm_groups > 0:
        proposals.append(
            Proposal(Signal.WARM_FLOOR, policy.warm_groups, float(policy.warm_groups), "warm floor")
        )
    proposals.append(Proposal(Signal.MIN_REPLICAS, policy.min_groups, float(policy.min_groups), "minimum"))
    return proposals


def _unless_urgent(demand_groups: float, at_risk: bool, current: int) -> float | None:
    """Requests already below their minimum slack will miss their deadline: a slack proposal that
    asks for more groups then skips the tolerance band (None) and acts within the tick."""
    if at_risk and ceil_groups(demand_groups) > current:
        return None
    return demand_groups


def _measured_attainment(
    observation: _Observation, estimates: Estimates, min_observations: int
) -> float | None:
    """The worse of TTFT and ITL attainment, each only when enough observations back it."""
    measured = []
    if estimates.ttft_attainment is not None and _observed(observation.ttft) >= min_observations:
        measured.append(estimates.ttft_attainment)
    if estimates.itl_attainment is not None and _observed(observation.itl) >= min_observations:
        measured.append(estimates.itl_attainment)
    return min(measured) if measured else None


def _observed(histograms: list[Histogram]) -> float:
    return sum(histogram.total for histogram in histograms)


def _seconds(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.4g}s"


def _combine(proposals: list[Proposal], current: int, policy: ScalingPolicy) -> tuple[int, Signal, bool]:
    """The largest proposal after the tolerance band: (groups, winning signal, whether the band
    changed the result)."""
    best_groups = -1
    best_signal = Signal.MIN_REPLICAS
    raw_best = -1
    for proposal in proposals:
        groups = proposal.groups
        raw_best = max(raw_best, groups)
        if proposal.demand_groups is not None:
            groups = tolerated_groups(proposal.demand_groups, current, policy.scale_up, policy.scale_down)
        if groups > best_groups:
            best_groups, best_signal = groups, proposal.signal
    return best_groups, best_signal, raw_best != best_groups


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
        demand = max(demand, math.inf if budget_demand is None else budget_demand)
    kv_capacity = snapshot.profile.kv_capacity_tokens
    if estimates.kv_demand_tokens and kv_capacity > 0:
        demand = max(demand, kv_demand_groups(estimates.kv_demand_tokens, kv_capacity, min_free))
    if math.isinf(demand):
        return snapshot.spec_replicas
    floor = ceil_groups(demand)
    busy = arrival > 0 or waiting_p90 > 0 or (estimates.running_requests or 0.0) > 0
    return max(floor, 1) if busy else floor


def _recent(items: tuple[_Timed, ...], keep_seconds: float, now: float) -> tuple[_Timed, ...]:
    cutoff = now - keep_seconds
    return tuple(item for item in items if item.at > cutoff)


class _Trail:
    """The count on its way through the pipeline, and every stage that moved or held it."""

    __slots__ = ("desired", "guards", "reason")

    def __init__(self, desired: int, reason: str) -> None:
        self.desired = desired
        self.reason = reason
        self.guards: list[Guard] = []

    def note(self, guard: Guard) -> None:
        if guard not in self.guards:
            self.guards.append(guard)
        self.reason = guard

    def apply(self, stage: tuple[int, Guard | None]) -> None:
        self.desired, guard = stage
        if guard is not None:
            self.note(guard)


def _knowledge_guard(
    desired: int, current: int, observation: _Observation, policy: ScalingPolicy
) -> tuple[int, Guard | None]:
    """What is not known never lowers the count (HoldScaleIn), or never moves it (Freeze)."""
    partial = observation.stale > 0 or observation.queue_stale
    blind = observation.missing > 0 or (not observation.load_known and current > 0)
    if not (partial or blind):
        return desired, None
    if policy.staleness.action is StaleMetricsAction.FREEZE:
        return (current, Guard.STALE_METRICS_FREEZE) if desired != current else (desired, None)
    if desired < current:
        return current, Guard.STALE_METRICS_HOLD_SCALE_IN if partial else Guard.MISSING_METRICS_HOLD_SCALE_IN
    return desired, None


def _capacity_guard(
    desired: int,
    current: int,
    *,
    observation: _Observation,
    estimates: Estimates,
    snapshot: ModelGroupSnapshot,
    policy: ScalingPolicy,
) -> tuple[int, Guard | None]:
    """Guards that only ever move the count back toward the current one.

    An unschedulable group holds scale-out: more groups would not place either. Groups on their way
    are capacity: the backlog they will absorb adds nothing, only an arrival rate beyond them does.
    A scale-in must leave enough groups for today's load under p90 work estimates.
    """
    if desired > current and observation.unschedulable > 0:
        return current, Guard.UNSCHEDULABLE
    if desired > current and observation.coming > 0:
        queue_work = policy.signals.queue_work
        safety = queue_work.safety_factor if queue_work is not None else 1.0
        arrival = estimates.arrival_work_rate or 0.0
        allowed = max(
            current, ceil_groups(arrival_demand_groups(arrival, estimates.capacity_per_group, safety))
        )
        if desired > allowed:
            return allowed, Guard.CAPACITY_COMING
    if desired < current:
        floor = _scale_in_floor(estimates, snapshot, policy)
        if desired < floor:
            return min(current, floor), Guard.SCALE_IN_UNSAFE
    return desired, None


def _next_state(
    state: DecisionState,
    *,
    history: tuple[Recommendation, ...],
    recommendation: int,
    current: int,
    desired: int,
    applies: bool,
    policy: ScalingPolicy,
    now: float,
) -> DecisionState:
    """Remember this tick's recommendation and, if applied, its change; forget what no window needs."""
    up_rules, down_rules = policy.scale_up, policy.scale_down
    keep_recommendations = max(up_rules.stabilization_window_seconds, down_rules.stabilization_window_seconds)
    keep_events = max(
        (step.period_seconds for step in (*up_rules.policies, *down_rules.policies)), default=0.0
    )
    up_events = _recent(state.scale_up_events, keep_events, now)
    down_events = _recent(state.scale_down_events, keep_events, now)
    if applies and desired > current:
        up_events = (*up_events, ScaleEvent(now, desired - current))
    elif applies and desired < current:
        down_events = (*down_events, ScaleEvent(now, current - desired))
    return DecisionState(
        recommendations=(*_recent(history, keep_recommendations, now), Recommendation(now, recommendation)),
        scale_up_events=up_events,
        scale_down_events=down_events,
        started=True,
    )


def decide(snapshot: ModelGroupSnapshot, policy: ScalingPolicy, state: DecisionState, now: float) -> Decision:
    """Decide how many complete groups `snapshot`'s ModelGroup should run; see the module docstring."""
    observation = _Observation(snapshot, policy)
    estimates, slack_summary = _estimate(observation, snapshot, policy, now)
    proposals = _proposals(observation, estimates, slack_summary, snapshot, policy)
    current = observation.current
    up_rules, down_rules = policy.scale_up, policy.scale_down

    desired, signal, banded = _combine(proposals, current, policy)
    trail = _Trail(desired, str(signal))
    if banded:
        trail.note(Guard.TOLERANCE)
    trail.apply(_knowledge_guard(trail.desired, current, observation, policy))

    # The HPA seeds its history with the current count on first sight, so that a restart never
    # scales in before a full scale-down window has passed.
    history = state.recommendations
    if not state.started and down_rules.stabilization_window_seconds > 0:
        history = (Recommendation(now, current),)
    recommendation = trail.desired
    trail.apply(
        stabilize(current, recommendation, history, scale_up=up_rules, scale_down=down_rules, now=now)
    )
    trail.apply(
        limit_rate(
            current,
            trail.desired,
            up_events=state.scale_up_events,
            down_events=state.scale_down_events,
            scale_up=up_rules,
            scale_down=down_rules,
            now=now,
        )
    )
    trail.apply(clamp(trail.desired, policy.min_groups, policy.max_groups))
    trail.apply(
        _capacity_guard(
            trail.desired,
            current,
            observation=observation,
            estimates=estimates,
            snapshot=snapshot,
            policy=policy,
        )
    )
    trail.apply(clamp(trail.desired, policy.min_groups, policy.max_groups))
    if policy.mode is Mode.FROZEN:
        trail.apply((current, Guard.FROZEN))
    applies = policy.mode is Mode.ACTIVE

    return Decision(
        desired_groups=trail.desired,
        current_groups=current,
        reason=str(trail.reason),
        signal=signal,
        proposals=tuple(proposals),
        guards=tuple(trail.guards),
        estimates=estimates,
        counts=observation.counts(),
        next_state=_next_state(
            state,
            history=history,
            recommendation=recommendation,
            current=current,
            desired=trail.desired,
            applies=applies,
            policy=policy,
            now=now,
        ),
        policy_revision=policy.revision,
        mode=policy.mode,
        applies=applies,
        time=now,
        model_group=snapshot.name,
        slo=policy.primary_class,
    )
