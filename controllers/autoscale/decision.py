"""The scaling decision: one pure function from a ModelGroup snapshot to a number of complete groups.

`decide(snapshot, policy, state, now)` runs, in order (design note §27, §33; DESIGN.md §6):

1. observe: count groups by state; pool the fresh metrics of ready groups (stale or missing ones
   are set aside, never guessed);
2. estimate, of feasible demand only (a class's share past its feasible threshold is set aside: no
   number of groups meets its SLO): λ_w (the larger of served and offered work, plus the queue's
   growth since recent ticks: `arrival`), Q_work, C for the current mix, predicted queue wait, queue
   budget, slack, KV demand, attainment and goodput (`goodput.estimators`); with a gateway in
   front (`snapshot.gateway`), its exact figures replace the engines' inference: queued and running
   work, slack, the prompts it holds, client-side TTFT/ITL, attainment against offered requests;
3. propose, one count per signal: queueWork, slack, kvCache, goodput, gatewayQueue or
   scaleFromZero (demand at zero groups), warmFloor, minReplicas; goodput adds a group only for
   load-driven SLO misses, one trial at a time, and stops after scale-outs that brought no
   improvement (GoodputAwaitingEvidence, GoodputNotImproving); forecast (the history's work one
   ready time ahead, with its measured margin) and schedule (an open `replicaSchedule` window) are
   floors asked for ahead of the load;
4. combine: proportional proposals inside the tolerance band count as no change (per signal, as
   the HPA does per metric), then the largest proposal wins and names the decision's signal;
5. knowledge: with stale or missing metrics the count never goes down (HoldScaleIn), or does not
   move at all (Freeze);
6. stabilisation, step policies and [min, max] bounds, with the HPA's `behavior` semantics;
7. guards on capacity: an unschedulable group holds scale-out; groups already placing, provisioning
   or warming are capacity on its way, so only an arrival rate beyond them, or a forecast or
   scheduled floor above them, adds more (decisions stack while the offered work says the first
   step was short); scale-in happens only if the
   remaining groups keep the queue inside its budget and the KV caches inside their limit under
   p90 work estimates; the bounds still win;
8. mode: Frozen holds the count; Advisory computes and records but does not apply.

The operator and the simulator call the same function; it does no I/O and reads no clock.
"""

from __future__ import annotations

from typing import TypeVar

from goodput.api.reasons import Guard
from goodput.controllers.autoscale.arrival import remember_queue
from goodput.controllers.autoscale.behavior import clamp, limit_rate, stabilize
from goodput.controllers.autoscale.estimate import compute_estimates
from goodput.controllers.autoscale.guards import capacity_guard, knowledge_guard
from goodput.controllers.autoscale.model import (
    Decision,
    DecisionState,
    GoodputTrial,
    Mode,
    ModelGroupSnapshot,
    Recommendation,
    ScaleEvent,
    ScalingPolicy,
)
from goodput.controllers.autoscale.observe import ObservedGroups
from goodput.controllers.autoscale.proposals import ahead_proposals, combine, judge_trial, next_trial, propose

_Timed = TypeVar("_Timed", Recommendation, ScaleEvent)


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
    waiting_work_seconds: float | None,
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
        queue_readings=remember_queue(state.queue_readings, waiting_work_seconds, now),
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
    observation = ObservedGroups(snapshot, policy)
    estimates, slack_summary = compute_estimates(observation, snapshot, policy, now, state.queue_readings)
    trial = judge_trial(state.goodput_trial, observation, estimates, snapshot.metrics_window_seconds, now)
    proposals, goodput_held = propose(observation, estimates, slack_summary, snapshot, policy, trial=trial)
    ahead = ahead_proposals(snapshot, estimates, policy, now)
    proposals.extend(ahead)
    current = observation.current
    desired, signal, banded = combine(proposals, current, policy)
    trail = _Trail(desired, str(signal))
    if banded:
        trail.note(Guard.TOLERANCE)
    if goodput_held is not None and current + 1 > desired:
        trail.note(goodput_held)  # the goodput signal's group would have been the largest proposal
    trail.apply(knowledge_guard(trail.desired, current, observation, policy))

    history, recommendation = _apply_behaviour(trail, current, state, policy, now)
    trail.apply(
        capacity_guard(
            trail.desired,
            current,
            observation=observation,
            estimates=estimates,
            snapshot=snapshot,
            policy=policy,
            ahead_groups=max((proposal.groups for proposal in ahead), default=0),
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
            goodput_trial=next_trial(
                trial, estimates, signal, current=current, desired=trail.desired, applies=applies, now=now
            ),
            waiting_work_seconds=estimates.waiting_work_seconds,
        ),
        policy_revision=policy.revision,
        mode=policy.mode,
        applies=applies,
        time=now,
        model_group=snapshot.name,
        slo=policy.primary_class,
        capacity=snapshot.capacity,
    )
