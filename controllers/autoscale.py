"""The scaling decision: one pure function from a ModelGroup snapshot to a number of complete groups.

`decide(snapshot, policy, state, now)` runs, in order (design note §27, §33; DESIGN.md §6):

1. observe: count groups by state; pool the fresh metrics of ready groups (stale or missing ones
   are set aside, never guessed);
2. estimate, of feasible demand only (a class's share past its feasible threshold is set aside: no
   number of groups meets its SLO): λ_w, Q_work, C for the current mix, predicted queue wait, queue
   budget, slack, KV demand, attainment and goodput (`goodput.estimators`); with a gateway in
   front (`snapshot.gateway`), its exact figures replace the engines' inference: queued and running
   work, slack, the prompts it holds, client-side TTFT/ITL, attainment against offered requests;
3. propose, one count per signal: queueWork, slack, kvCache, goodput, gatewayQueue or
   scaleFromZero (demand at zero groups), warmFloor, minReplicas; goodput adds a group only for
   load-driven SLO misses, one trial at a time, and stops after scale-outs that brought no
   improvement (GoodputAwaitingEvidence, GoodputNotImproving);
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

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, TypeGuard, TypeVar

from goodput.api.reasons import Guard, Signal
from goodput.controllers.autoscale_model import (
    COMING_STATES,
    Decision,
    DecisionState,
    Estimates,
    GatewayClassFigures,
    GatewayObservation,
    GoodputSignal,
    GoodputTrial,
    GroupCounts,
    GroupMetrics,
    GroupObservation,
    GroupState,
    KvCacheSignal,
    Mode,
    ModelGroupSnapshot,
    Proposal,
    QueueWorkSignal,
    Recommendation,
    RequestQueue,
    ScaleEvent,
    ScalingPolicy,
    SlackSignal,
    SloCheck,
    StaleMetricsAction,
)
from goodput.controllers.scaling_behavior import clamp, limit_rate, stabilize, tolerated_groups
from goodput.estimators.attainment import (
    GoodputReport,
    Histogram,
    bound_read_for,
    fraction_not_shown_beyond,
    fraction_within,
    goodput_from_histograms,
    histogram_quantile,
    merge_histograms,
    rose_beyond_noise,
)
from goodput.estimators.capacity import CapacityProfile
from goodput.estimators.proposals import (
    arrival_demand_groups,
    ceil_groups,
    kv_demand_groups,
    queue_budget_demand_groups,
    work_demand_groups,
    work_left_when_ready,
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


@dataclass(slots=True)
class _GroupStates:
    """How many groups are in each state, and how many ready ones have no usable metrics."""

    ready: int = 0
    coming: int = 0
    draining: int = 0
    failed: int = 0
    unschedulable: int = 0
    stale: int = 0
    missing: int = 0


def _classify_groups(
    groups: Sequence[GroupObservation], max_age_seconds: float
) -> tuple[_GroupStates, list[GroupMetrics]]:
    """The groups counted by state, and the fresh metrics of the ready ones (in snapshot order)."""
    states = _GroupStates()
    fresh: list[GroupMetrics] = []
    for group in groups:
        if group.unschedulable:
            states.unschedulable += 1
        state = group.state
        if state is not GroupState.READY:
            if state in COMING_STATES:
                states.coming += 1
            elif state is GroupState.DRAINING:
                states.draining += 1
            elif state is GroupState.FAILED:
                states.failed += 1
            continue
        states.ready += 1
        metrics = group.metrics
        if metrics is None or not _finite(metrics):
            states.missing += 1  # NaN or infinite series (a 0/0 in a query) are not knowledge
        elif metrics.age_seconds > max_age_seconds:
            states.stale += 1
        else:
            fresh.append(metrics)
    return states, fresh


@dataclass(slots=True)
class _Pool:
    """The sums over the fresh metrics of ready groups: counts, rates, KV use, the traffic mix's
    weights and the histograms to merge."""

    waiting: float = 0.0
    running: float = 0.0
    prompt_rate: float = 0.0
    generation_rate: float = 0.0
    kv_used: float = 0.0
    hit_tokens: float = 0.0
    mix_weight: float = 0.0
    mix_input: float = 0.0
    mix_output: float = 0.0
    finished: float = 0.0
    aborted: float = 0.0
    rejected: float = 0.0
    max_fresh_age: float = 0.0
    ttft: list[Histogram] = field(default_factory=list)
    itl: list[Histogram] = field(default_factory=list)
    queue_time: list[Histogram] = field(default_factory=list)
    tpot: list[Histogram] = field(default_factory=list)

    def add(self, metrics: GroupMetrics, profile: CapacityProfile) -> None:
        self.max_fresh_age = max(self.max_fresh_age, metrics.age_seconds)
        self.waiting += metrics.waiting_requests
        self.running += metrics.running_requests
        self.prompt_rate += metrics.prompt_tokens_per_second
        self.generation_rate += metrics.generation_tokens_per_second
        self.kv_used += metrics.kv_usage_fraction * profile.kv_capacity_tokens
        self.hit_tokens += metrics.prompt_tokens_per_second * metrics.prefix_hit_fraction
        self._add_mix(metrics, profile.reference_output_tokens)
        self.finished += metrics.finished_requests
        self.aborted += metrics.aborted_requests
        self.rejected += metrics.rejected_requests
        for pooled, histogram in (
            (self.ttft, metrics.ttft),
            (self.itl, metrics.itl),
            (self.queue_time, metrics.queue_time),
            (self.tpot, metrics.tpot),
        ):
            if histogram is not None:
                pooled.append(histogram)

    def _add_mix(self, metrics: GroupMetrics, reference_output_tokens: float) -> None:
        """The group's requests per second weigh its mean prompt and output lengths in the mix."""
        mean_input = metrics.mean_input_tokens
        if not (_positive(mean_input) and metrics.prompt_tokens_per_second > 0):
            return
        requests_per_second = metrics.prompt_tokens_per_second / mean_input
        mean_output = metrics.mean_output_tokens
        self.mix_weight += requests_per_second
        self.mix_input += metrics.prompt_tokens_per_second
        self.mix_output += requests_per_second * (
            mean_output if _positive(mean_output) else reference_output_tokens
        )

    def keep_feasible(self, request_fraction: float, token_fraction: float) -> None:
        """Scale the sums to the feasible share: request counts by requests, token sums by tokens."""
        self.waiting, self.running = self.waiting * request_fraction, self.running * request_fraction
        self.prompt_rate = self.prompt_rate * token_fraction
        self.generation_rate = self.generation_rate * request_fraction
        self.kv_used, self.hit_tokens = self.kv_used * token_fraction, self.hit_tokens * token_fraction
        self.mix_weight, self.mix_input = self.mix_weight * request_fraction, self.mix_input * token_fraction
        self.mix_output *= request_fraction

    def mix(self, profile: CapacityProfile) -> TrafficMix:
        """The traffic mix the pooled groups served; the profile's reference where they served none."""
        weight = self.mix_weight
        return TrafficMix(
            mean_input_tokens=max(1.0, self.mix_input / weight)
            if weight > 0
            else profile.reference_input_tokens,
            mean_output_tokens=self.mix_output / weight if weight > 0 else profile.reference_output_tokens,
            prefix_hit_fraction=self.hit_tokens / self.prompt_rate if self.prompt_rate > 0 else 0.0,
        )


class _Observation:
    """Group counts and the pooled fresh metrics of ready groups, gathered in one pass."""

    __slots__ = (
        "aborted",
        "attainable_fraction",
        "coming",
        "current",
        "draining",
        "failed",
        "finished",
        "fresh",
        "gateway",
        "gateway_stale",
        "generation_rate",
        "itl",
        "kv_used_tokens",
        "max_fresh_age",
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
        "tpot",
        "ttft",
        "unschedulable",
        "waiting",
    )

    def __init__(self, snapshot: ModelGroupSnapshot, policy: ScalingPolicy) -> None:
        max_age = policy.staleness.max_age_seconds
        self.current = snapshot.spec_replicas
        states, fresh_metrics = _classify_groups(snapshot.groups, max_age)
        pool = _Pool()
        for metrics in fresh_metrics:
            pool.add(metrics, snapshot.profile)
        # Only feasible demand is scaled for: strip the primary class's infeasible share (engine
        # series carry no class) from the pooled counts and rates, by requests and by prompt tokens.
        request_fraction, token_fraction, self.attainable_fraction = _feasible_fractions(snapshot, policy)
        pool.keep_feasible(request_fraction, token_fraction)
        self.ready, self.coming, self.draining, self.failed = (
            states.ready,
            states.coming,
            states.draining,
            states.failed,
        )
        self.unschedulable, self.stale, self.missing = states.unschedulable, states.stale, states.missing
        self.fresh = len(fresh_metrics)
        self.waiting, self.running = pool.waiting, pool.running
        self.prompt_rate, self.generation_rate = pool.prompt_rate, pool.generation_rate
        self.kv_used_tokens = pool.kv_used
        self.finished, self.aborted, self.rejected = pool.finished, pool.aborted, pool.rejected
        self.ttft, self.itl, self.queue_time, self.tpot = pool.ttft, pool.itl, pool.queue_time, pool.tpot
        self.max_fresh_age = pool.max_fresh_age
        self.mix = pool.mix(snapshot.profile)
        queue = snapshot.queue
        self.queue_stale = queue is not None and queue.age_seconds > max_age
        self.queue: RequestQueue | None = (
            _feasible_queue(queue, snapshot, policy) if queue is not None and not self.queue_stale else None
        )
        gateway = snapshot.gateway
        self.gateway_stale = gateway is not None and gateway.age_seconds > max_age
        self.gateway: GatewayObservation | None = None if self.gateway_stale else gateway

    @property
    def load_known(self) -> bool:
        return self.fresh > 0 or self.queue is not None or self.gateway is not None

    @property
    def gateway_holds(self) -> float:
        """Requests the gateway holds or has in flight (0 without a fresh gateway)."""
        gateway = self.gateway
        return 0.0 if gateway is None else gateway.waiting_requests + gateway.running_requests

    @property
    def has_demand(self) -> bool:
        """Any work waiting, running or arriving: what wakes a pool at zero groups."""
        if self.queue is not None and self.queue.requests:
            return True
        if self.gateway_holds > 0:
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
            gateway_fresh=self.gateway is not None,
            gateway_stale=self.gateway_stale,
        )


def _feasible_fractions(
    snapshot: ModelGroupSnapshot, policy: ScalingPolicy
) -> tuple[float, float, float | None]:
    """The primary class's feasible share of requests and of prompt tokens (1 while unknown), and
    the attainable ceiling (None while unknown)."""
    entry = snapshot.feasibility_for(policy.primary_class.name)
    if entry is None:
        return 1.0, 1.0, None
    known = entry.longest_feasible_prompt_tokens == 0 or entry.infeasible_request_share is not None
    request_fraction = entry.feasible_request_fraction
    return request_fraction, entry.feasible_token_fraction, request_fraction if known else None


def _feasible_queue(queue: RequestQueue, snapshot: ModelGroupSnapshot, policy: ScalingPolicy) -> RequestQueue:
    """The queue without the requests no group can serve within their class's TTFT (each judged
    against its own class's threshold; a class without one keeps all its requests)."""
    if not snapshot.feasibility:
        return queue

    def feasible(request: QueuedRequest) -> bool:
        entry = snapshot.feasibility_for(policy.targets_for(request.class_name).name)
        return entry is None or entry.admits(request.input_tokens)

    kept = tuple(request for request in queue.requests if feasible(request))
    return queue if len(kept) == len(queue.requests) else RequestQueue(kept, queue.age_seconds)


def _queue_view(
    observation: _Observation, snapshot: ModelGroupSnapshot
) -> tuple[QueueWork | None, float | None, float | None, int]:
    """Queued work, waiting and running requests, and the groups serving the queue.

    Exact queue contents, when fresh, replace the engine counts; so do a gateway's exported figures
    (its queue and its requests in flight, which cover the engines' waiting and running ones). A
    gateway's queue is served by every ready group, an engine's by its own group.
    """
    profile = snapshot.profile
    queue = observation.queue
    if queue is not None:
        running = float(sum(1 for request in queue.requests if request.running))
        work = queue_work_exact(profile.pricing, queue.requests, profile.work_error)
        return work, len(queue.requests) - running, running, observation.ready
    gateway = observation.gateway
    if gateway is not None:
        work = _gateway_queue_work(gateway, snapshot, observation.mix)
        return work, gateway.waiting_requests, gateway.running_requests, observation.ready
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


def _gateway_queue_work(
    gateway: GatewayObservation, snapshot: ModelGroupSnapshot, mix: TrafficMix
) -> QueueWork:
    """Q_work from the gateway's exported work; the upper estimate applies the p90 error of the
    queue's mean shape (the gateway exports sums per class, not each request)."""
    waiting_requests = gateway.waiting_requests
    mean_input = (
        gateway.waiting_prompt_tokens / waiting_requests if waiting_requests > 0 else mix.mean_input_tokens
    )
    ratio = snapshot.profile.work_error.p90_ratio_for(round(mean_input), round(mix.mean_output_tokens))
    waiting, running = gateway.waiting_work_seconds, gateway.running_work_seconds
    return QueueWork(waiting, running, waiting * ratio, running * ratio)


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


def _earliest_slack(
    observation: _Observation, summary: SlackSummary | None, budget: float, predicted_wait: float | None
) -> float | None:
    """Exact queue contents' own slack first, then the gateway's, else the budget left to an arrival."""
    if summary is not None:
        return summary.earliest_slack_seconds
    gateway_slack = None if observation.gateway is None else observation.gateway.earliest_slack_seconds
    if gateway_slack is not None:
        return gateway_slack
    return None if predicted_wait is None else budget - predicted_wait


def _kv_demand(observation: _Observation, kv_capacity: int) -> tuple[float | None, float | None]:
    """KV tokens in use plus the prompts still waiting for a cache, and the free fraction in use."""
    queue = observation.queue
    gateway = observation.gateway
    if observation.fresh > 0:
        if queue is not None:
            waiting_prompt_tokens = float(sum(r.input_tokens for r in queue.requests if not r.running))
        else:
            waiting_prompt_tokens = observation.waiting * observation.mix.mean_input_tokens
            if gateway is not None:  # the gateway holds prompts no engine has seen yet
                waiting_prompt_tokens += gateway.waiting_prompt_tokens
        free = (
            1.0 - observation.kv_used_tokens / (observation.fresh * kv_capacity) if kv_capacity > 0 else None
        )
        return observation.kv_used_tokens + waiting_prompt_tokens, free
    if queue is not None:
        return float(
            sum(r.input_tokens + (r.generated_tokens if r.running else 0) for r in queue.requests)
        ), None
    if gateway is not None:
        return gateway.waiting_prompt_tokens, None
    return None, None


class _Attainment(NamedTuple):
    """What the engine histograms say about the SLO of the primary class over the window."""

    ttft: float | None
    itl: float | None
    tpot: float | None
    itl_tail_seconds: float | None
    queue_time_p90_seconds: float | None
    queue_within_budget: float | None
    goodput: GoodputReport | None
    checks: tuple[SloCheck, ...]


def _attainment(
    observation: _Observation,
    policy: ScalingPolicy,
    window_seconds: float,
    queue_budget_seconds: float,
) -> _Attainment:
    """TTFT, TPOT and token-gap attainment of the primary class, its queue times, and goodput.

    Engine histograms carry no class, so they are read against the primary class's targets. With a
    gateway, its per-class TTFT and ITL histograms (as clients see them, gateway queue included)
    replace the engines', and goodput is its count of attaining requests against offered ones.
    """
    target = policy.primary_class
    figures = None if observation.gateway is None else observation.gateway.figures_for(target.name)
    if observation.fresh == 0 and figures is None:
        return _Attainment(None, None, None, None, None, None, None, ())
    ttft_histogram, itl_histogram = _latency_histograms(observation, figures)
    tpot_histogram = merge_histograms(observation.tpot)
    queue_histogram = merge_histograms(observation.queue_time)
    ttft = fraction_within(ttft_histogram, target.ttft_seconds)
    itl = fraction_within(itl_histogram, target.itl_seconds)
    tpot = fraction_within(tpot_histogram, target.itl_seconds)
    attainable = observation.attainable_fraction
    # A wait beyond the queue budget leaves too little of the TTFT target for prefill and the first
    # step; with no budget at all, no number of groups gets a request its first token in time.
    queue_within = (
        fraction_within(queue_histogram, queue_budget_seconds) if queue_budget_seconds > 0 else None
    )
    goodput = goodput_from_histograms(
        window_seconds=window_seconds,
        ttft_within_target=ttft,
        itl_within_target=itl,
        finished_requests=observation.finished,
        aborted_requests=observation.aborted,
        rejected_requests=observation.rejected,
        generated_tokens=observation.generation_rate * window_seconds,
        feasible_share=attainable,
    )
    if figures is not None:
        goodput = _gateway_goodput(figures, window_seconds, goodput.token_goodput_per_second)
    checks = _judged_checks(
        observation,
        policy,
        ttft=_shown(ttft_histogram, target.ttft_seconds),
        tpot=_shown(tpot_histogram, target.itl_seconds),
        itl=_shown(itl_histogram, target.itl_seconds),
    )
    return _Attainment(
        ttft=ttft,
        itl=itl,
        tpot=tpot,
        itl_tail_seconds=histogram_quantile(itl_histogram, target.percentile),
        queue_time_p90_seconds=histogram_quantile(queue_histogram, 0.9),
        queue_within_budget=queue_within,
        goodput=goodput,
        checks=checks,
    )


class _Shown(NamedTuple):
    """A histogram's share within a target as the checks that may ask for a group read it."""

    share: float | None
    observations: float
    read_at_seconds: float | None


def _shown(histogram: Histogram | None, target_seconds: float) -> _Shown:
    """Only the misses the histogram shows count (a target inside a bucket leaves that bucket's
    observations unjudged); the shares reported stay interpolated."""
    return _Shown(
        fraction_not_shown_beyond(histogram, target_seconds),
        _observed(histogram),
        bound_read_for(histogram, target_seconds),
    )


def _judged_checks(
    observation: _Observation, policy: ScalingPolicy, *, ttft: _Shown, tpot: _Shown, itl: _Shown
) -> tuple[SloCheck, ...]:
    """The goodput signal's SLO checks, the TTFT share judged against the attainable ceiling: of the
    requests that could meet the target on an idle group, how many did. Every check's observations
    are counted on the attainable share too, so infeasible requests never bring a check over its
    minimum (a window of ten finished requests, half of them infeasible, rests on five). With
    nothing attainable, no check asks for groups."""
    signal = policy.signals.goodput
    attainable = observation.attainable_fraction
    if signal is None or (attainable is not None and attainable <= 0):
        return ()
    counted = 1.0 if attainable is None else attainable
    if attainable is not None and ttft.share is not None:
        ttft = ttft._replace(share=min(1.0, ttft.share / attainable))
    return _slo_checks(
        signal,
        policy.primary_class.percentile,
        ttft=ttft._replace(observations=ttft.observations * counted),
        tpot=tpot._replace(observations=tpot.observations * counted),
        itl=itl,
        finished_requests=observation.finished * counted,
    )


def _latency_histograms(
    observation: _Observation, figures: GatewayClassFigures | None
) -> tuple[Histogram | None, Histogram | None]:
    """TTFT and ITL: the gateway's (as clients see them) where it has them, else the engines'."""
    ttft, itl = merge_histograms(observation.ttft), merge_histograms(observation.itl)
    if figures is None:
        return ttft, itl
    return figures.ttft or ttft, figures.itl or itl


def _gateway_goodput(
    figures: GatewayClassFigures, window_seconds: float, token_goodput_per_second: float | None
) -> GoodputReport:
    """The §5 report from the gateway's exact counts: attaining requests over offered ones (every
    request that reached admission, refused or not), over admitted ones, and over the feasible ones
    (offered less those whose zero-load floor already misses the class)."""
    attaining = figures.attaining_requests
    offered, admitted = figures.offered_requests, figures.admitted_requests
    feasible = max(0.0, offered - figures.infeasible_requests)
    window = max(window_seconds, 1e-9)

    def share(denominator: float) -> float | None:
        return min(1.0, attaining / denominator) if denominator > 0 else None

    return GoodputReport(
        window_seconds=window_seconds,
        offered_requests=offered,
        admitted_requests=admitted,
        rejected_requests=figures.rejected_requests,
        attaining_requests=attaining,
        attainment_admitted=share(admitted),
        attainment_offered=share(offered),
        request_goodput_per_second=attaining / window,
        token_goodput_per_second=token_goodput_per_second,
        feasible_requests=feasible,
        attainment_attainable=share(feasible),
    )


def _slo_checks(
    signal: GoodputSignal,
    percentile: float,
    *,
    ttft: _Shown,
    tpot: _Shown,
    itl: _Shown,
    finished_requests: float,
) -> tuple[SloCheck, ...]:
    """The SLO conditions the window measured with enough observations, each against its own bar.

    Per request: the share within the TTFT target must reach the attainment floor and the class
    percentile (it is both a per-request and a percentile condition); the share whose TPOT is
    within the ITL target must reach the floor. Per token gap: the share within the ITL target must
    reach the class percentile. Gaps come in correlated runs (every sequence of a slow step has a
    slow gap), so their share rests on about as many observations as requests finished, not gaps.
    """
    floor = signal.attainment_floor
    enough = signal.min_observations
    checks = []
    if ttft.share is not None and ttft.observations >= enough:
        checks.append(
            SloCheck("ttft", ttft.share, max(floor, percentile), ttft.observations, ttft.read_at_seconds)
        )
    if tpot.share is not None and tpot.observations >= enough:
        checks.append(SloCheck("tpot", tpot.share, floor, tpot.observations, tpot.read_at_seconds))
    requests = finished_requests or ttft.observations
    if itl.share is not None and requests >= enough:
        checks.append(SloCheck("itl_tail", itl.share, percentile, requests, itl.read_at_seconds))
    return tuple(checks)


def _queue_budget(profile: CapacityProfile, policy: ScalingPolicy) -> float:
    """B_queue (§8): what the primary class's TTFT target leaves for waiting."""
    slack = policy.signals.slack
    return queue_budget_seconds(
        policy.primary_class.ttft_seconds,
        profile.prefill_seconds_p90,
        profile.first_decode_seconds,
        slack.route_seconds if slack is not None else 0.0,
        slack.margin_seconds if slack is not None else 0.0,
    )


def _estimate(
    observation: _Observation, snapshot: ModelGroupSnapshot, policy: ScalingPolicy, now: float
) -> tuple[Estimates, SlackSummary | None]:
    profile = snapshot.profile
    mix = observation.mix
    capacity = profile.capacity_per_group(mix.mean_input_tokens, mix.mean_output_tokens)
    arrival = (
        arrival_work_rate(profile.pricing, observation.prompt_rate, observation.generation_rate, mix)
        if observation.fresh > 0
        else None
    )
    queue_work, waiting_requests, running_requests, serving_groups = _queue_view(observation, snapshot)
    budget = _queue_budget(profile, policy)
    ready_seconds = snapshot.group_ready_seconds
    predicted_wait, left_when_ready = _queue_outlook(
        queue_work, serving_groups, capacity, arrival, ready_seconds
    )
    slack_summary = _request_slack(observation, snapshot, policy, capacity, now)
    earliest_slack = _earliest_slack(observation, slack_summary, budget, predicted_wait)
    kv_demand, kv_free = _kv_demand(observation, profile.kv_capacity_tokens)
    attainment = _attainment(observation, policy, snapshot.metrics_window_seconds, budget)
    running_per_group = observation.running / observation.fresh if observation.fresh > 0 else None
    slo_batch = profile.slo_batch_per_group(mix.mean_input_tokens, mix.mean_output_tokens)
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
        waiting_work_at_ready_seconds=left_when_ready,
        group_ready_seconds=ready_seconds,
        predicted_queue_wait_seconds=predicted_wait,
        queue_budget_seconds=budget,
        earliest_slack_seconds=earliest_slack,
        low_slack_fraction=None if slack_summary is None else slack_summary.low_slack_fraction,
        kv_demand_tokens=kv_demand,
        kv_free_fraction=kv_free,
        ttft_attainment=attainment.ttft,
        itl_attainment=attainment.itl,
        queue_time_p90_seconds=attainment.queue_time_p90_seconds,
        goodput=attainment.goodput,
        tpot_attainment=attainment.tpot,
        itl_tail_seconds=attainment.itl_tail_seconds,
        queue_within_budget=attainment.queue_within_budget,
        running_per_group=running_per_group,
        slo_batch_per_group=slo_batch,
        slo_checks=attainment.checks,
        load_driven=_load_driven(attainment, running_per_group, slo_batch),
        feasibility=snapshot.feasibility,
    )
    return estimates, slack_summary


def _queue_outlook(
    queue_work: QueueWork | None,
    serving_groups: int,
    capacity: float,
    arrival: float | None,
    ready_seconds: float | None,
) -> tuple[float | None, float | None]:
    """A new arrival's wait behind the queued work, and the part of that work still waiting when a
    group asked for now is ready (None, None without a queue view)."""
    if queue_work is None:
        return None, None
    waiting = queue_work.waiting_seconds
    return (
        predicted_queue_wait_seconds(waiting, serving_groups, capacity),
        work_left_when_ready(waiting, serving_groups, capacity, arrival, ready_seconds),
    )


def _worst(checks: tuple[SloCheck, ...]) -> SloCheck | None:
    """The SLO condition furthest below its bar."""
    return max(checks, key=lambda check: check.shortfall, default=None)


def _load_driven(attainment: _Attainment, running_per_group: float | None, slo_batch: float) -> bool | None:
    """Whether the SLO misses come from load, so that more groups would remove them.

    Two causes are load: requests waiting in the engine queue beyond the queue budget, when they
    alone break the bar or account for the shortfall; and groups running more sequences than the ITL
    budget allows (longer steps for every token and every prefill chunk). What remains, such as the
    stall a long prefill chunk puts into every decode of its step, is there at any count. None when
    nothing is missed (or nothing measured).
    """
    worst = _worst(attainment.checks)
    if worst is None or worst.shortfall <= 0:
        return None
    if running_per_group is not None and running_per_group >= slo_batch:
        return True
    if attainment.queue_within_budget is None:
        return False
    queue_misses = 1.0 - attainment.queue_within_budget
    return queue_misses > 0 and queue_misses >= min(1.0 - worst.required, worst.shortfall)


def _queue_work_proposal(signal: QueueWorkSignal | None, estimates: Estimates) -> Proposal | None:
    """§26: the groups that serve the arrival work rate and drain in T_d the waiting work a new
    group can still serve (what waits when it is ready)."""
    waiting_work = estimates.waiting_work_seconds
    if signal is None or waiting_work is None:
        return None
    capacity = estimates.capacity_per_group
    arrival = estimates.arrival_work_rate or 0.0
    backlog = _backlog_to_serve(estimates)
    demand = work_demand_groups(arrival, backlog, capacity, signal.drain_target_seconds, signal.safety_factor)
    return Proposal(
        Signal.QUEUE_WORK,
        ceil_groups(demand),
        demand,
        f"lambda_w={arrival:.4g}/s Q_wait={waiting_work:.4g}s C={capacity:.3g}/s "
        f"T_d={signal.drain_target_seconds:g}s s={signal.safety_factor:g}{_at_ready(estimates)}",
        demand,
    )


def _backlog_to_serve(estimates: Estimates) -> float:
    """The waiting work new groups can serve: what still waits when one is ready, when known."""
    left = estimates.waiting_work_at_ready_seconds
    return left if left is not None else estimates.waiting_work_seconds or 0.0


def _at_ready(estimates: Estimates) -> str:
    ready = estimates.group_ready_seconds
    left = estimates.waiting_work_at_ready_seconds
    return "" if ready is None or left is None else f" Q_at_ready={left:.4g}s R={ready:g}s"


def _slack_proposal(
    signal: SlackSignal | None, estimates: Estimates, slack_summary: SlackSummary | None, current: int
) -> Proposal | None:
    """§9: the groups that keep the queue wait within the budget less the minimum slack.

    A request arriving now waits behind all queued work; with exact queue contents, every queued
    request's own deadline counts too. Either may ask for the groups.
    """
    waiting_work = estimates.waiting_work_seconds
    if signal is None or waiting_work is None:
        return None
    arrival_slack = estimates.queue_budget_seconds - (estimates.predicted_queue_wait_seconds or 0.0)
    affordable = estimates.queue_budget_seconds - signal.min_slack_seconds
    demands = [
        queue_budget_demand_groups(_backlog_to_serve(estimates), estimates.capacity_per_group, affordable)
    ]
    at_risk = arrival_slack < signal.min_slack_seconds
    if slack_summary is not None and slack_summary.waiting_requests > 0:
        demands.append(slack_summary.demand_groups)
        at_risk = at_risk or (slack_summary.low_slack_fraction or 0.0) > signal.low_slack_fraction
    known = [demand for demand in demands if demand is not None]
    if not known:
        return None
    demand = max(known)
    detail = (
        f"earliest_slack={_seconds(estimates.earliest_slack_seconds)} "
        f"arrival_slack={_seconds(arrival_slack)} B_queue={estimates.queue_budget_seconds:.4g}s"
        f"{_at_ready(estimates)}"
    )
    if estimates.low_slack_fraction is not None:
        detail += f" low_slack={estimates.low_slack_fraction:.3g}"
    return Proposal(
        Signal.SLACK,
        ceil_groups(demand),
        estimates.earliest_slack_seconds,
        detail,
        _unless_urgent(demand, at_risk, current),
    )


def _kv_proposal(signal: KvCacheSignal | None, estimates: Estimates, kv_capacity: int) -> Proposal | None:
    """The groups whose KV cache holds the demand with the minimum free fraction left."""
    kv_demand = estimates.kv_demand_tokens
    if signal is None or kv_demand is None or kv_capacity <= 0:
        return None
    demand = kv_demand_groups(kv_demand, kv_capacity, signal.min_free_fraction)
    return Proposal(
        Signal.KV_CACHE,
        ceil_groups(demand),
        estimates.kv_free_fraction,
        f"kv_demand={kv_demand:.4g} tokens capacity={kv_capacity}/group "
        f"min_free={signal.min_free_fraction:g}",
        demand,
    )


def _proposals(
    observation: _Observation,
    estimates: Estimates,
    slack_summary: SlackSummary | None,
    snapshot: ModelGroupSnapshot,
    policy: ScalingPolicy,
    *,
    trial: GoodputTrial | None,
) -> tuple[list[Proposal], Guard | None]:
    """One proposal per signal that has something to say; unknown signals stay silent.

    Also returns the guard that held the goodput signal back, if its trial did.
    """
    signals = policy.signals
    proposals = [
        proposal
        for proposal in (
            _queue_work_proposal(signals.queue_work, estimates),
            _slack_proposal(signals.slack, estimates, slack_summary, observation.current),
            _kv_proposal(signals.kv_cache, estimates, snapshot.profile.kv_capacity_tokens),
        )
        if proposal is not None
    ]

    goodput = signals.goodput
    held: Guard | None = None
    if goodput is not None:
        proposal, held = _goodput_proposal(estimates, observation.current, trial, goodput)
        if proposal is not None:
            proposals.append(proposal)

    _add_from_zero(proposals, observation)
    if policy.warm_groups > 0:
        proposals.append(
            Proposal(Signal.WARM_FLOOR, policy.warm_groups, float(policy.warm_groups), "warm floor")
        )
    proposals.append(Proposal(Signal.MIN_REPLICAS, policy.min_groups, float(policy.min_groups), "minimum"))
    return proposals, held


def _add_from_zero(proposals: list[Proposal], observation: _Observation) -> None:
    """One group when something reports demand at zero groups: the gateway's held requests (its
    queue is the only place a request for a pool at zero waits), else engines still reporting.

    The gateway's proposal goes first, so a pool it wakes is named for it even when a queue signal
    asks for the same one group."""
    if observation.current != 0:
        return
    held = observation.gateway_holds
    if held > 0:
        detail = f"{held:.0f} request(s) held in the gateway's queue at zero groups"
        proposals.insert(0, Proposal(Signal.GATEWAY_QUEUE, 1, held, detail))
    elif observation.has_demand:
        proposals.append(
            Proposal(Signal.SCALE_FROM_ZERO, 1, None, "work is waiting or arriving at zero groups")
        )


def _unless_urgent(demand_groups: float, at_risk: bool, current: int) -> float | None:
    """Requests already below their minimum slack will miss their deadline: a slack proposal that
    asks for more groups then skips the tolerance band (None) and acts within the tick."""
    if at_risk and ceil_groups(demand_groups) > current:
        return None
    return demand_groups


def _goodput_proposal(
    estimates: Estimates, current: int, trial: GoodputTrial | None, signal: GoodputSignal
) -> tuple[Proposal | None, Guard | None]:
    """One more group for load-driven SLO misses, with each scale-out a trial.

    While a trial waits for its evidence the signal holds the trial's count (no other signal may
    undo the experiment) and asks for nothing more (GoodputAwaitingEvidence). Once judged, it may
    try one more group only from the trial's own count and only while fewer than
    `max_fruitless_steps` trials in a row were fruitless; otherwise it asks for nothing
    (GoodputNotImproving), also at lower counts other signals scale in to, so that it cannot climb
    back up to a count that has already shown no improvement.
    """
    worst = _worst(estimates.slo_checks)
    wants_more = worst is not None and worst.shortfall > 0 and bool(estimates.load_driven)
    if trial is not None and not trial.judged:
        hold = Proposal(
            Signal.GOODPUT,
            trial.groups,
            None if worst is None else worst.within,
            f"holding {trial.groups} groups until the last goodput scale-out has served a full window",
        )
        return hold, Guard.GOODPUT_AWAITING_EVIDENCE if wants_more else None
    if not wants_more or worst is None:
        return None, None
    if trial is not None and (current < trial.groups or trial.fruitless >= signal.max_fruitless_steps):
        return None, Guard.GOODPUT_NOT_IMPROVING
    read_at = (
        ""
        if worst.read_at_seconds is None
        else f" (misses counted past {worst.read_at_seconds:g}s, its bucket)"
    )
    detail = (
        f"{worst.name} within target{read_at} {worst.within:.4g} < {worst.required:g} over "
        f"{worst.observations:.0f} observations; load-driven: queue within budget "
        f"{_figure(estimates.queue_within_budget)}, running/group {_figure(estimates.running_per_group)} "
        f"vs SLO batch {_figure(estimates.slo_batch_per_group)}"
    )
    return Proposal(Signal.GOODPUT, current + 1, worst.within, detail), None


def _judge_trial(
    trial: GoodputTrial | None,
    observation: _Observation,
    estimates: Estimates,
    window_seconds: float,
    now: float,
) -> GoodputTrial | None:
    """The goodput trial after this tick's evidence.

    A trial waiting for evidence holds only at the count it scaled out to (a count moved by
    anything else confounds it). It settles when all its groups are ready, and is judged on the
    first metrics window that starts after that: it is dropped when the SLO is met or the worst
    check of the time rose beyond its sampling error (the signal may try again), and counted as
    fruitless otherwise. A judged trial is kept while the SLO is still missed and the count has not
    risen above it: what it showed holds for its count and every lower one.
    """
    if trial is None:
        return None
    current = observation.current
    worst = _worst(estimates.slo_checks)
    if trial.judged:
        if current > trial.groups or (worst is not None and worst.shortfall <= 0):
            return None
        return trial
    if current != trial.groups or observation.unschedulable > 0:
        return None  # confounded, or a group that cannot be placed: the trial cannot run
    settled_at = trial.settled_at
    if settled_at is None and observation.ready >= trial.groups and observation.coming == 0:
        settled_at = now
    window_start = now - observation.max_fresh_age - window_seconds
    if settled_at is None or window_start < settled_at or worst is None:
        return trial if settled_at == trial.settled_at else dataclasses.replace(trial, settled_at=settled_at)
    if worst.shortfall <= 0:
        return None
    before = trial.baseline
    after = next((check for check in estimates.slo_checks if check.name == before.name), worst)
    if rose_beyond_noise(before.within, before.observations, after.within, after.observations):
        return None
    return dataclasses.replace(trial, settled_at=settled_at, judged=True, fruitless=trial.fruitless + 1)


def _next_trial(
    trial: GoodputTrial | None,
    estimates: Estimates,
    signal: Signal,
    *,
    current: int,
    desired: int,
    applies: bool,
    now: float,
) -> GoodputTrial | None:
    """A goodput scale-out that is applied starts a trial; earlier fruitless ones are carried."""
    worst = _worst(estimates.slo_checks)
    if not (applies and signal is Signal.GOODPUT and desired > current and worst is not None):
        return trial
    # The baseline is the share and what it rests on; where it was read is the record's to say.
    baseline = dataclasses.replace(worst, read_at_seconds=None)
    return GoodputTrial(
        groups=desired, baseline=baseline, acted_at=now, fruitless=trial.fruitless if trial is not None else 0
    )


def _observed(histogram: Histogram | None) -> float:
    return 0.0 if histogram is None else histogram.total


def _figure(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.4g}"


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
    partial = observation.stale > 0 or observation.queue_stale or observation.gateway_stale
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
    goodput_trial: GoodputTrial | None,
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
        goodput_trial=goodput_trial,
    )


def _apply_behaviour(
    trail: _Trail, current: int, state: DecisionState, policy: ScalingPolicy, now: float
) -> tuple[tuple[Recommendation, ...], int]:
    """Stabilisation, step limits and the bounds, in HPA's order, noted on `trail`; returns the
    recommendation history the stabilisation read and the recommendation it was given."""
    up_rules, down_rules = policy.scale_up, policy.scale_down
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
            # a pool at zero groups must be able to start on Percent policies alone
            percent_floor_groups=1,
        )
    )
    trail.apply(clamp(trail.desired, policy.min_groups, policy.max_groups))
    return history, recommendation


def decide(snapshot: ModelGroupSnapshot, policy: ScalingPolicy, state: DecisionState, now: float) -> Decision:
    """Decide how many complete groups `snapshot`'s ModelGroup should run; see the module docstring."""
    observation = _Observation(snapshot, policy)
    estimates, slack_summary = _estimate(observation, snapshot, policy, now)
    trial = _judge_trial(state.goodput_trial, observation, estimates, snapshot.metrics_window_seconds, now)
    proposals, goodput_held = _proposals(observation, estimates, slack_summary, snapshot, policy, trial=trial)
    current = observation.current
    desired, signal, banded = _combine(proposals, current, policy)
    trail = _Trail(desired, str(signal))
    if banded:
        trail.note(Guard.TOLERANCE)
    if goodput_held is not None and current + 1 > desired:
        trail.note(goodput_held)  # the goodput signal's group would have been the largest proposal
    trail.apply(_knowledge_guard(trail.desired, current, observation, policy))

    history, recommendation = _apply_behaviour(trail, current, state, policy, now)
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
            goodput_trial=_next_trial(
                trial, estimates, signal, current=current, desired=trail.desired, applies=applies, now=now
            ),
        ),
        policy_revision=policy.revision,
        mode=policy.mode,
        applies=applies,
        time=now,
        model_group=snapshot.name,
        slo=policy.primary_class,
    )
