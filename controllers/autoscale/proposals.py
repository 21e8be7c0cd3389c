"""One proposed count per signal, and how they combine.

queueWork, slack, kvCache, goodput, gatewayQueue or scaleFromZero, warmFloor, minReplicas; goodput
adds a group only for load-driven SLO misses, one trial at a time; forecast and schedule ask for
groups ahead of the load (`ahead_proposals`). Proportional proposals inside the tolerance band
count as no change, then the largest proposal wins and names the signal."""

from __future__ import annotations

import dataclasses

from goodput.api.reasons import Guard, Signal
from goodput.controllers.autoscale.behavior import tolerated_groups
from goodput.controllers.autoscale.estimate import worst_check
from goodput.controllers.autoscale.forecast import WorkForecast, forecast_work
from goodput.controllers.autoscale.model import (
    Estimates,
    GoodputSignal,
    GoodputTrial,
    KvCacheSignal,
    ModelGroupSnapshot,
    Proposal,
    QueueWorkSignal,
    ScalingPolicy,
    SlackSignal,
)
from goodput.controllers.autoscale.observe import ObservedGroups
from goodput.controllers.autoscale.schedule import scheduled_floor
from goodput.estimators.attainment import (
    rose_beyond_noise,
)
from goodput.estimators.proposals import (
    ceil_groups,
    kv_demand_groups,
    queue_budget_demand_groups,
    work_demand_groups,
)
from goodput.estimators.queueing import (
    SlackSummary,
)


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


def propose(
    observation: ObservedGroups,
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


def ahead_proposals(
    snapshot: ModelGroupSnapshot, estimates: Estimates, policy: ScalingPolicy, now: float
) -> list[Proposal]:
    """Floors set ahead of the load: the forecast's work one ready time ahead with its measured
    margin, over the capacity per group; the open `replicaSchedule` window's `minReplicas`.

    Both are floors only: the largest proposal wins, so they never hold back a reactive scale-out,
    and each is read at `now` (a window past, a forecast fallen) so neither holds a group the load
    does not need once its time is past. Exact counts: no tolerance band.
    """
    proposals = []
    forecast = forecast_work(snapshot.forecaster, now) if snapshot.forecaster is not None else None
    capacity = estimates.capacity_per_group
    if isinstance(forecast, WorkForecast) and 0 < capacity < float("inf"):
        groups = ceil_groups(forecast.upper_work_rate / capacity)
        detail = f"{forecast.detail()} C={capacity:.3g}/s"
        proposals.append(Proposal(Signal.FORECAST, groups, forecast.upper_work_rate, detail))
    floor = scheduled_floor(snapshot.replica_schedule, now)
    if floor is not None:
        detail = f"window {floor.name} ({floor.window}) minReplicas={floor.min_groups}"
        if floor.min_groups > policy.max_groups:
            detail += f" above maxReplicas={policy.max_groups}: clamped"
        proposals.append(Proposal(Signal.SCHEDULE, floor.min_groups, float(floor.min_groups), detail))
    return proposals


def _add_from_zero(proposals: list[Proposal], observation: ObservedGroups) -> None:
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
    worst = worst_check(estimates.slo_checks)
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


def judge_trial(
    trial: GoodputTrial | None,
    observation: ObservedGroups,
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
    worst = worst_check(estimates.slo_checks)
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


def next_trial(
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
    worst = worst_check(estimates.slo_checks)
    if not (applies and signal is Signal.GOODPUT and desired > current and worst is not None):
        return trial
    # The baseline is the share and what it rests on; where it was read is the record's to say.
    baseline = dataclasses.replace(worst, read_at_seconds=None)
    return GoodputTrial(
        groups=desired, baseline=baseline, acted_at=now, fruitless=trial.fruitless if trial is not None else 0
    )


def _figure(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.4g}"


def _seconds(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.4g}s"


def combine(proposals: list[Proposal], current: int, policy: ScalingPolicy) -> tuple[int, Signal, bool]:
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
