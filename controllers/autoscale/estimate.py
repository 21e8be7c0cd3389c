"""The replica calculator's half of a decision: from the observation to the estimates every signal
reads, of feasible demand only (a class's share past its feasible threshold is set aside).

λ_w, Q_work and C for the current mix, predicted queue wait, queue budget, slack, KV demand,
attainment and goodput (`goodput.estimators`); with a gateway in front its exact figures replace the
engines' inference. Kept apart from the loop (`decision`) as the HPA keeps `replica_calculator.go`
apart from `horizontal.go`."""

from __future__ import annotations

from typing import NamedTuple

from goodput.controllers.autoscale.arrival import (
    ArrivalReading,
    offered_work_rate,
    queue_growth_work_rate,
    remember_queue,
)
from goodput.controllers.autoscale.model import (
    Estimates,
    GatewayClassFigures,
    GatewayObservation,
    GoodputSignal,
    ModelGroupSnapshot,
    QueueReading,
    ScalingPolicy,
    SloCheck,
)
from goodput.controllers.autoscale.observe import ObservedGroups
from goodput.estimators.attainment import (
    GoodputReport,
    Histogram,
    bound_read_for,
    fraction_not_shown_beyond,
    fraction_within,
    goodput_from_histograms,
    histogram_quantile,
    merge_histograms,
)
from goodput.estimators.capacity import CapacityProfile
from goodput.estimators.proposals import (
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


def _observed(histogram: Histogram | None) -> float:
    return 0.0 if histogram is None else histogram.total


def _queue_view(
    observation: ObservedGroups, snapshot: ModelGroupSnapshot
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
    observation: ObservedGroups,
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
    observation: ObservedGroups, summary: SlackSummary | None, budget: float, predicted_wait: float | None
) -> float | None:
    """Exact queue contents' own slack first, then the gateway's, else the budget left to an arrival."""
    if summary is not None:
        return summary.earliest_slack_seconds
    gateway_slack = None if observation.gateway is None else observation.gateway.earliest_slack_seconds
    if gateway_slack is not None:
        return gateway_slack
    return None if predicted_wait is None else budget - predicted_wait


def _kv_demand(observation: ObservedGroups, kv_capacity: int) -> tuple[float | None, float | None]:
    """KV tokens in use plus the prompts still waiting for a cache, and the free fraction in use.
    KV that the gateway keeps for sessions waiting on a tool is in use too, though no engine counts it."""
    queue = observation.queue
    gateway = observation.gateway
    if observation.fresh > 0:
        if queue is not None:
            waiting_prompt_tokens = float(sum(r.input_tokens for r in queue.requests if not r.running))
        else:
            waiting_prompt_tokens = observation.waiting * observation.mix.mean_input_tokens
            if gateway is not None:  # the gateway holds prompts no engine has seen yet
                waiting_prompt_tokens += gateway.waiting_prompt_tokens
        used = observation.kv_used_tokens + (gateway.kept_session_kv_tokens if gateway is not None else 0.0)
        free = 1.0 - used / (observation.fresh * kv_capacity) if kv_capacity > 0 else None
        return used + waiting_prompt_tokens, free
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
    observation: ObservedGroups,
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
    observation: ObservedGroups, policy: ScalingPolicy, *, ttft: _Shown, tpot: _Shown, itl: _Shown
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
    observation: ObservedGroups, figures: GatewayClassFigures | None
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


def compute_estimates(
    observation: ObservedGroups,
    snapshot: ModelGroupSnapshot,
    policy: ScalingPolicy,
    now: float,
    queue_readings: tuple[QueueReading, ...] = (),
) -> tuple[Estimates, SlackSummary | None]:
    """Every figure the signals read; `queue_readings` are the earlier ticks' queued work, for the
    queue's growth (`controllers.autoscale.arrival`)."""
    profile = snapshot.profile
    mix = observation.mix
    capacity = profile.capacity_per_group(mix.mean_input_tokens, mix.mean_output_tokens)
    queue_work, waiting_requests, running_requests, serving_groups = _queue_view(observation, snapshot)
    budget = _queue_budget(profile, policy)
    # A queue longer than a request can afford to wait behind means the serving groups are saturated.
    saturated = queue_work is not None and queue_work.waiting_seconds > budget * serving_groups * capacity
    arrival = _arrival(
        observation,
        snapshot,
        queue_work,
        queue_readings,
        now=now,
        saturated_work_rate=serving_groups * capacity if saturated else 0.0,
    )
    ready_seconds = snapshot.group_ready_seconds
    predicted_wait, left_when_ready = _queue_outlook(
        queue_work, serving_groups, capacity, arrival.arrival_work_rate, ready_seconds
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
        arrival_work_rate=arrival.arrival_work_rate,
        served_work_rate=arrival.served_work_rate,
        offered_work_rate=arrival.offered_work_rate,
        queue_growth_work_rate=arrival.queue_growth_work_rate,
        queue_work_seconds=None if queue_work is None else queue_work.total_seconds,
        waiting_work_seconds=None if queue_work is None else queue_work.waiting_seconds,
        running_work_seconds=None if queue_work is None else queue_work.running_seconds,
        waiting_work_seconds_p90=None if queue_work is None else queue_work.waiting_seconds_p90,
        waiting_work_at_ready_seconds=left_when_ready,
        group_ready_seconds=ready_seconds,
        group_ready_source=snapshot.group_ready_source,
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


def _arrival(
    observation: ObservedGroups,
    snapshot: ModelGroupSnapshot,
    queue_work: QueueWork | None,
    queue_readings: tuple[QueueReading, ...],
    *,
    now: float,
    saturated_work_rate: float,
) -> ArrivalReading:
    """Served work from the fresh engines, offered work from a fresh gateway, and the queue's growth."""
    pricing, mix = snapshot.profile.pricing, observation.mix
    served = (
        arrival_work_rate(pricing, observation.prompt_rate, observation.generation_rate, mix)
        if observation.fresh > 0
        else None
    )
    waiting = None if queue_work is None else queue_work.waiting_seconds
    return ArrivalReading(
        served_work_rate=served,
        offered_work_rate=offered_work_rate(
            observation.gateway, pricing, mix, snapshot.metrics_window_seconds
        ),
        queue_growth_work_rate=queue_growth_work_rate(remember_queue(queue_readings, waiting, now), now),
        saturated_work_rate=saturated_work_rate,
    )


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


def worst_check(checks: tuple[SloCheck, ...]) -> SloCheck | None:
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
    worst = worst_check(attainment.checks)
    if worst is None or worst.shortfall <= 0:
        return None
    if running_per_group is not None and running_per_group >= slo_batch:
        return True
    if attainment.queue_within_budget is None:
        return False
    queue_misses = 1.0 - attainment.queue_within_budget
    return queue_misses > 0 and queue_misses >= min(1.0 - worst.required, worst.shortfall)
