"""How a scaling decision is recorded: status entries, conditions, Events, and state that outlives a restart.

Every function here is pure; the operator writes what they return.

- `decision_entry`: a `Decision` as a `status.lastDecision` / `status.decisions[]` entry (time,
  from, to, reason, winning signal, every proposal, guards, policy revision, mode, shadow flag).
- `record_decisions`: the status with the latest active and shadow decisions, and the bounded
  history (newest first) of the decisions that changed the count or would have (Advisory), each
  outcome once: a count held for an hour is one entry, not 240.
- `decision_events`: Events on transitions only: the count changed (SuccessfulRescale), an
  Advisory or shadow policy would change it (AdvisoryRescale), or a guard started holding.
- `rescale_note` / `unrecorded_rescale` / `record_rescale`: the applied decision the scale write
  carries as an annotation, and the record an operator that came after writes from it when the one
  that scaled stopped before its status write.
- `autoscaler_conditions` / `failure_conditions`: ScalingActive, MetricsAvailable and
  DecisionLimited (ScalingLimited, about placement, is the group controller's).
- `feasibility_status` / `attainability_conditions` / `attainability_event`: `status.feasibility`,
  the SLOAttainable condition, and an Event when it turns False or back.
- `encode_states` / `decode_states`: the `DecisionState` of the active and shadow policies as one
  compact `status.autoscalerState`, so stabilisation windows, step limits and the goodput
  signal's trial survive an operator restart.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from goodput.api.conditions import Condition, ConditionStatus, find_condition, set_condition
from goodput.api.labels import SERVING_POOL
from goodput.api.modelgroup import (
    CapacityStatus,
    ClassFeasibilityStatus,
    DecisionCapacity,
    DecisionReadyTime,
    EvidenceWindow,
    ModelGroupStatus,
    Proposal,
    ScalingDecision,
)
from goodput.api.reasons import ConditionType, EventReason, Guard, Reason
from goodput.controllers.autoscale.feasible_demand import AttainabilityVerdict
from goodput.controllers.autoscale.forecast import ForecastUnavailable, WorkForecaster
from goodput.controllers.autoscale.model import (
    Decision,
    DecisionState,
    Estimates,
    GoodputTrial,
    LearntCapacity,
    Mode,
    ModelGroupSnapshot,
    Recommendation,
    ScaleEvent,
    SloCheck,
)
from goodput.controllers.events import EventRecord

HISTORY_LIMIT = 10
"""Entries kept in `status.decisions` (the API's maximum)."""
_MAX_PROPOSALS = 16
_MAX_GUARDS = 16
_MAX_DETAIL = 1024
_MAX_REASON = 128

# Guards that cut the count against the signals (the HPA's ScalingLimited reasons).
LIMITING_GUARDS = (
    Guard.TOO_MANY_REPLICAS,
    Guard.TOO_FEW_REPLICAS,
    Guard.SCALE_UP_LIMIT,
    Guard.SCALE_DOWN_LIMIT,
)
# Guards worth an Event when they start holding: every one but the tolerance band, which absorbs noise.
_QUIET_GUARDS = frozenset({Guard.TOLERANCE})
_WARNING_GUARDS = frozenset(
    {
        Guard.STALE_METRICS_HOLD_SCALE_IN,
        Guard.MISSING_METRICS_HOLD_SCALE_IN,
        Guard.STALE_METRICS_FREEZE,
        Guard.UNSCHEDULABLE,
    }
)


# --- Status entries ---------------------------------------------------------------------------------


def decision_entry(decision: Decision, *, shadow: bool = False, pool: str = SERVING_POOL) -> ScalingDecision:
    """One decision as the API records it, with the pool it scaled."""
    return ScalingDecision(
        time=datetime.fromtimestamp(decision.time, UTC),
        from_replicas=decision.current_groups,
        to_replicas=decision.desired_groups,
        reason=decision.reason[:_MAX_REASON],
        signal=str(decision.signal),
        proposals=tuple(
            Proposal(
                signal=str(proposal.signal), replicas=proposal.groups, detail=proposal.detail[:_MAX_DETAIL]
            )
            for proposal in decision.proposals[:_MAX_PROPOSALS]
        ),
        guards=tuple(str(guard) for guard in decision.guards[:_MAX_GUARDS]),
        policy_revision=decision.policy_revision[:_MAX_REASON],
        mode=decision.mode.value,
        shadow=shadow,
        capacity=decision_capacity(decision.capacity),
        ready_time=decision_ready_time(decision.estimates),
        pool=pool,
    )


def decision_ready_time(estimates: Estimates) -> DecisionReadyTime | None:
    """The ready time a decision looked ahead by, as its record carries it (None: unknown)."""
    seconds, source = estimates.group_ready_seconds, estimates.group_ready_source
    if seconds is None or source is None or not (0 <= seconds < math.inf):
        return None
    return DecisionReadyTime(source=source, seconds=round(seconds, 1))


def decision_capacity(capacity: LearntCapacity | None) -> DecisionCapacity | None:
    """The capacity a decision used, as its record carries it (None: the decision did not say, or
    the figure is not a positive finite number and is not shown)."""
    if capacity is None or not (0 < capacity.work_seconds_per_second < math.inf):
        return None
    return DecisionCapacity(
        source=capacity.source.value,
        work_seconds_per_second=float(f"{capacity.work_seconds_per_second:.6g}"),
        confidence=round(min(1.0, max(0.0, capacity.confidence)), 3),
    )


def capacity_status(capacity: LearntCapacity | None) -> CapacityStatus | None:
    """`status.capacity`: the capacity in use, its source and confidence, the window of its evidence
    and why. None (the field stays absent, unknown) when there is none to show."""
    entry = decision_capacity(capacity)
    if entry is None or capacity is None:
        return None
    start, end = capacity.evidence_start, capacity.evidence_end
    window = (
        EvidenceWindow(start=datetime.fromtimestamp(start, UTC), end=datetime.fromtimestamp(end, UTC))
        if start is not None and end is not None
        else None
    )
    return CapacityStatus(**entry.model_dump(), evidence_window=window, reason=capacity.reason[:256])


def _outcome(entry: ScalingDecision) -> tuple[object, ...]:
    """What makes two entries the same outcome (time aside)."""
    pool = entry.pool or SERVING_POOL  # an older operator's record is of the serving pool
    return (entry.from_replicas, entry.to_replicas, entry.reason, entry.policy_revision, entry.mode, pool)


def record_decisions(
    previous: ModelGroupStatus,
    *,
    active: Decision | None,
    shadow: Decision | None,
    limit: int = HISTORY_LIMIT,
    pool: str = SERVING_POOL,
) -> ModelGroupStatus:
    """The status with the latest decisions of `pool`; the rest of the status is left as it was.

    History keeps, newest first, each decision whose count differs from the one it started from
    (applied, or proposed by an Advisory policy), unless it repeats the newest entry's outcome.
    """
    update: dict[str, Any] = {}
    if active is not None:
        entry = decision_entry(active, pool=pool)
        update["last_decision"] = entry
        history = previous.decisions
        if entry.to_replicas != entry.from_replicas and (
            not history or _outcome(history[0]) != _outcome(entry)
        ):
            history = (entry, *history)[:limit]
        update["decisions"] = history
    if shadow is not None:
        update["shadow_decision"] = decision_entry(shadow, shadow=True, pool=pool)
    return previous.model_copy(update=update)


# --- Events -----------------------------------------------------------------------------------------


def _proposals_text(decision: Decision) -> str:
    return ", ".join(f"{proposal.signal}={proposal.groups}" for proposal in decision.proposals)


def _outcome_text(decision: Decision) -> str:
    """The reason and signal, without the inputs: a condition message that changes only when the
    outcome does (the inputs are in `lastDecision`)."""
    if decision.reason == str(decision.signal):
        return f"signal {decision.signal}"
    return f"{decision.reason}, signal {decision.signal}"


def _at_zero_text(decision: Decision) -> str:
    """At zero groups no engine runs, so only a gateway can see a request arrive: without one the
    pool stays at zero until something else raises the count (DESIGN §9)."""
    counts = decision.counts
    if decision.desired_groups != 0 or counts.current != 0 or counts.gateway_fresh:
        return ""
    if counts.gateway_stale:
        return "; at zero groups: the gateway's figures are stale, so no demand is seen"
    return (
        "; at zero groups with no gateway in front: no demand is seen, so the pool stays at zero "
        "until a gateway's queue or the replicas raise it"
    )


def _because(decision: Decision) -> str:
    winner = next((p for p in decision.proposals if p.signal == decision.signal), None)
    text = f"{decision.signal} proposed {winner.groups if winner else decision.desired_groups}"
    if winner is not None and winner.detail:
        text += f" ({winner.detail})"
    if decision.reason != str(decision.signal):
        text = f"{decision.reason}; {text}"
    return text


def decision_events(
    previous: ScalingDecision | None, decision: Decision, *, policy_name: str, shadow: bool = False
) -> tuple[EventRecord, ...]:
    """The Events of one decision, given the previous decision of the same policy (None at first).

    A change applied is always announced. A change an Advisory or shadow policy would make is
    announced when it differs from the previous one. A guard is announced when it starts holding.
    """
    policy = f"{'shadow ' if shadow else ''}SLOPolicy {policy_name} revision {decision.policy_revision}"
    events: list[EventRecord] = []
    current, desired = decision.current_groups, decision.desired_groups
    if decision.changes:
        events.append(
            EventRecord(
                "Normal",
                EventReason.SUCCESSFUL_RESCALE,
                f"New size: {desired} (from {current}); reason: {_because(decision)}; {policy}",
            )
        )
    elif desired != current and (
        previous is None
        or (previous.from_replicas, previous.to_replicas, previous.policy_revision)
        != (current, desired, decision.policy_revision)
    ):
        events.append(
            EventRecord(
                "Normal",
                EventReason.ADVISORY_RESCALE,
                f"Would scale from {current} to {desired} ({decision.mode.value}); "
                f"reason: {_because(decision)}; {policy}",
            )
        )
    if shadow:
        return tuple(events)
    held_before = set(previous.guards) if previous is not None else set()
    for guard in decision.guards:
        if guard in _QUIET_GUARDS or str(guard) in held_before:
            continue
        events.append(
            EventRecord(
                "Warning" if guard in _WARNING_GUARDS else "Normal",
                str(guard),
                f"{_guard_text(guard, decision)}; proposals: {_proposals_text(decision)}; {policy}",
            )
        )
    return tuple(events)


def _guard_text(guard: Guard, decision: Decision) -> str:
    counts = decision.counts
    held = f"holding at {decision.desired_groups} group(s)"
    limited = f"limited to {decision.desired_groups}"
    texts = {
        Guard.STALE_METRICS_HOLD_SCALE_IN: f"{held}: metrics of {counts.stale_metrics} ready group(s) "
        "are stale, so the count does not go down",
        Guard.MISSING_METRICS_HOLD_SCALE_IN: f"{held}: metrics of {counts.missing_metrics} ready group(s) "
        "are missing, so the count does not go down",
        Guard.STALE_METRICS_FREEZE: f"{held}: metrics are stale and the policy freezes the count",
        Guard.UNSCHEDULABLE: f"{held}: {counts.unschedulable} group(s) cannot be placed, "
        "so more would not either",
        Guard.CAPACITY_COMING: f"{limited}: {counts.coming} group(s) on their way are counted as capacity",
        Guard.SCALE_IN_UNSAFE: f"{held}: fewer groups would break the queue budget or the KV limit",
        Guard.SCALE_DOWN_STABILIZED: f"{held}: a higher recommendation is inside the scale-down window",
        Guard.SCALE_UP_STABILIZED: f"{held}: a lower recommendation is inside the scale-up window",
        Guard.SCALE_UP_LIMIT: f"{limited} by the scale-up step policy",
        Guard.SCALE_DOWN_LIMIT: f"{limited} by the scale-down step policy",
        Guard.TOO_MANY_REPLICAS: f"{limited} by maxReplicas",
        Guard.TOO_FEW_REPLICAS: f"raised to minReplicas ({decision.desired_groups})",
        Guard.FROZEN: f"{held}: the policy is Frozen",
    }
    return texts.get(guard, f"{guard}: {held}")


def failed_rescale_event(decision: Decision, error: str) -> EventRecord:
    return EventRecord(
        "Warning",
        EventReason.FAILED_RESCALE,
        f"New size: {decision.desired_groups} (from {decision.current_groups}) could not be written: {error}",
    )


# --- The record the scale write carries -------------------------------------------------------------


def rescale_note(decision: Decision, *, pool: str = SERVING_POOL) -> str:
    """An applied decision as the scale write's annotation (`ANNOTATION_LAST_RESCALE`): its status
    entry without the proposals' inputs, which are long and belong in the status alone."""
    entry = decision_entry(decision, pool=pool)
    lean = tuple(proposal.model_copy(update={"detail": ""}) for proposal in entry.proposals)
    wire = entry.model_copy(update={"proposals": lean}).model_dump(
        mode="json", by_alias=True, exclude_defaults=True
    )
    return json.dumps(wire, separators=(",", ":"))


def unrecorded_rescale(note: str | None, status: ModelGroupStatus) -> ScalingDecision | None:
    """The rescale `note` records when the status does not: the operator stopped (or its status write
    failed) between the scale write and the status write. None when there is no note, it cannot be
    read, or the status already holds that decision or a later one.

    Every tick records its decision as `lastDecision`, and the next tick reads this first, so a
    `lastDecision` or newest history entry as new as the note's means it was recorded."""
    if not note:
        return None
    try:
        entry = ScalingDecision.model_validate_json(note)
    except ValueError:
        return None
    newest = [d.time for d in (status.last_decision, *status.decisions[:1]) if d is not None]
    if any(time >= entry.time for time in newest):
        return None
    return entry


def record_rescale(
    previous: ModelGroupStatus, entry: ScalingDecision, *, limit: int = HISTORY_LIMIT
) -> ModelGroupStatus:
    """The status with a rescale recovered from its note: the last decision, and the newest history
    entry unless it repeats that one's outcome."""
    history = previous.decisions
    if not history or _outcome(history[0]) != _outcome(entry):
        history = (entry, *history)[:limit]
    return previous.model_copy(update={"last_decision": entry, "decisions": history})


def rescale_recorded_event(entry: ScalingDecision) -> EventRecord:
    """The SuccessfulRescale of a rescale whose record is written by the operator that came after."""
    return EventRecord(
        "Normal",
        EventReason.SUCCESSFUL_RESCALE,
        f"New size: {entry.to_replicas} (from {entry.from_replicas}); reason: {entry.reason}, signal "
        f"{entry.signal}; SLOPolicy revision {entry.policy_revision}; applied at "
        f"{entry.time.isoformat()} and recorded after an operator restart",
    )


# --- Conditions -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MetricsHealth:
    """Whether the metrics behind the signals are present and fresh, for MetricsAvailable."""

    status: ConditionStatus
    reason: str
    message: str


def metrics_health(snapshot: ModelGroupSnapshot, max_age_seconds: float) -> MetricsHealth:
    """Ready groups whose metrics are missing or older than `max_age_seconds`, by name."""
    ready = [group for group in snapshot.groups if group.state == "Ready"]
    missing = [group.name for group in ready if group.metrics is None]
    stale = [
        f"{group.name} ({group.metrics.age_seconds:.0f}s)"
        for group in ready
        if group.metrics is not None and group.metrics.age_seconds > max_age_seconds
    ]
    if missing:
        return MetricsHealth(
            "False",
            Reason.METRICS_MISSING,
            f"no metrics for {len(missing)} of {len(ready)} ready group(s): {', '.join(missing)}",
        )
    if stale:
        return MetricsHealth(
            "False",
            Reason.METRICS_STALE,
            f"metrics older than {max_age_seconds:g}s for {len(stale)} of {len(ready)} ready group(s): "
            + ", ".join(stale),
        )
    if not ready:
        return MetricsHealth("True", Reason.METRICS_FRESH, "no ready group to measure")
    return MetricsHealth(
        "True",
        Reason.METRICS_FRESH,
        f"metrics of all {len(ready)} ready group(s) within {max_age_seconds:g}s",
    )


def _put(
    conditions: tuple[Condition, ...],
    kind: str,
    outcome: tuple[ConditionStatus, str, str],
    *,
    generation: int,
    now: datetime,
) -> tuple[Condition, ...]:
    """`conditions` with condition `kind` set to (status, reason, message)."""
    status, reason, message = outcome
    new = Condition(
        type=kind,
        status=status,
        observed_generation=generation,
        last_transition_time=now,
        reason=reason,
        message=message[:32768],
    )
    return set_condition(conditions, new, now)


def autoscaler_conditions(
    conditions: Sequence[Condition],
    decision: Decision,
    health: MetricsHealth,
    *,
    generation: int,
    now: datetime,
) -> tuple[Condition, ...]:
    """ScalingActive, MetricsAvailable and DecisionLimited after a decision of the active policy."""
    result = tuple(conditions)
    revision = f"revision {decision.policy_revision}"
    if decision.mode is Mode.FROZEN:
        active: tuple[ConditionStatus, str, str] = (
            "False",
            Reason.MODE_FROZEN,
            f"the policy is Frozen ({revision})",
        )
    elif decision.mode is Mode.ADVISORY:
        active = (
            "True",
            Reason.MODE_ADVISORY,
            f"Advisory, not applied: {decision.desired_groups} group(s) recommended "
            f"({_outcome_text(decision)}; {revision}){_at_zero_text(decision)}",
        )
    else:
        active = (
            "True",
            Reason.SIGNALS_COMPUTED,
            f"{decision.desired_groups} group(s) desired ({_outcome_text(decision)}; {revision})"
            f"{_at_zero_text(decision)}",
        )
    result = _put(result, ConditionType.SCALING_ACTIVE, active, generation=generation, now=now)
    metrics = (health.status, health.reason, health.message)
    result = _put(result, ConditionType.METRICS_AVAILABLE, metrics, generation=generation, now=now)
    guard = next((guard for guard in decision.guards if guard in LIMITING_GUARDS), None)
    if guard is not None:
        outcome: tuple[ConditionStatus, str, str] = (
            "True",
            str(guard),
            f"{_guard_text(guard, decision)}; proposals: {_proposals_text(decision)}",
        )
    else:
        outcome = (
            "False",
            Reason.DESIRED_WITHIN_RANGE,
            f"the desired count {decision.desired_groups} is within bounds and step limits",
        )
    return _put(result, ConditionType.DECISION_LIMITED, outcome, generation=generation, now=now)


FailureReason = Literal[
    "MetricsQueryFailed", "PolicyNotFound", "PolicyNotAccepted", "InvalidSpec", "ModeFrozen", "NoPolicy"
]
"""Why no decision was made; each is a `Reason` of the API vocabulary."""


def failure_conditions(
    conditions: Sequence[Condition],
    *,
    reason: FailureReason,
    message: str,
    generation: int,
    now: datetime,
) -> tuple[Condition, ...]:
    """ScalingActive False (and MetricsAvailable False when the metrics could not be read): no
    decision was made, so the count is left as it is."""
    outcome: tuple[ConditionStatus, str, str] = ("False", reason, message)
    result = _put(tuple(conditions), ConditionType.SCALING_ACTIVE, outcome, generation=generation, now=now)
    if reason == Reason.METRICS_QUERY_FAILED:
        result = _put(result, ConditionType.METRICS_AVAILABLE, outcome, generation=generation, now=now)
    return result


def failure_event(previous: Sequence[Condition], reason: str, message: str) -> EventRecord | None:
    """A Warning when ScalingActive turns False for this reason (transitions only)."""
    active = find_condition(previous, ConditionType.SCALING_ACTIVE)
    if active is not None and active.status == "False" and active.reason == reason:
        return None
    return EventRecord("Warning", reason, message)


# --- Forecasting --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ForecastHealth:
    """Whether the offered work's history gives a forecast, for the Forecasting condition."""

    status: ConditionStatus
    reason: str
    message: str


def forecast_health(fitted: WorkForecaster | ForecastUnavailable) -> ForecastHealth:
    """The Forecasting condition of a fit: True with the figures it rests on, else False with the
    named outcome (the decision then only reacts)."""
    if isinstance(fitted, ForecastUnavailable):
        return ForecastHealth(
            "False", str(fitted.outcome), f"{fitted.message}; scaling reacts to the load only"
        )
    return ForecastHealth(
        "True",
        Reason.FORECAST_READY,
        f"{fitted.history_seconds / 3600:.3g}h of offered work; forecast {fitted.horizon_seconds:g}s ahead "
        f"with a margin of {fitted.margin_fraction:.3g} (p{fitted.error_quantile * 100:g} of "
        f"{fitted.errors_measured} past errors)",
    )


def forecasting_conditions(
    conditions: Sequence[Condition], health: ForecastHealth, *, generation: int, now: datetime
) -> tuple[Condition, ...]:
    """`conditions` with Forecasting set to `health`."""
    outcome = (health.status, health.reason, health.message)
    return _put(tuple(conditions), ConditionType.FORECASTING, outcome, generation=generation, now=now)


# --- Decision state across restarts -----------------------------------------------------------------

STATE_FORMAT = 1


def _ceil_seconds(at: float) -> int:
    """Times round up to whole seconds: an entry may then outlive its window by under a second,
    never leave it early."""
    return math.ceil(at)


def _compact(recommendations: Iterable[Recommendation]) -> list[list[int]]:
    """Runs of equal recommendations kept by their latest member: exact for the windows' suffix
    minimum and maximum, which is all stabilisation reads."""
    runs: list[list[int]] = []
    for recommendation in recommendations:
        at = _ceil_seconds(recommendation.at)
        if runs and runs[-1][1] == recommendation.groups:
            runs[-1][0] = at
        else:
            runs.append([at, recommendation.groups])
    return runs


def _trial_to_wire(trial: GoodputTrial) -> dict[str, Any]:
    baseline = trial.baseline
    return {
        "n": trial.groups,
        "b": [baseline.name, baseline.within, baseline.required, baseline.observations],
        "a": trial.acted_at,
        "s": trial.settled_at,
        "j": trial.judged,
        "f": trial.fruitless,
    }


def _trial_from_wire(data: Mapping[str, Any]) -> GoodputTrial:
    name, within, required, observations = data["b"]
    settled = data.get("s")
    return GoodputTrial(
        groups=int(data["n"]),
        baseline=SloCheck(str(name), float(within), float(required), float(observations)),
        acted_at=float(data["a"]),
        settled_at=None if settled is None else float(settled),
        judged=bool(data.get("j", False)),
        fruitless=int(data.get("f", 0)),
    )


def state_to_wire(state: DecisionState) -> dict[str, Any]:
    wire: dict[str, Any] = {
        "r": _compact(state.recommendations),
        "u": [[_ceil_seconds(event.at), event.groups] for event in state.scale_up_events],
        "d": [[_ceil_seconds(event.at), event.groups] for event in state.scale_down_events],
    }
    if state.goodput_trial is not None:
        wire["g"] = _trial_to_wire(state.goodput_trial)
    return wire


def state_from_wire(
    data: Mapping[str, Any], *, written_at: float, now: float, refresh_seconds: float
) -> DecisionState:
    """The state as written, its newest recommendation carried to when it may last have held.

    The newest run was still going when the state was written, and the state is rewritten at least
    every `refresh_seconds` while it goes on; so it held until `written_at + refresh_seconds` at
    most, and assuming it held that long keeps the restored windows conservative.
    """
    recommendations = [Recommendation(float(at), int(groups)) for at, groups in data.get("r", [])]
    if recommendations:
        last = recommendations[-1]
        recommendations[-1] = Recommendation(
            max(last.at, min(now, written_at + refresh_seconds)), last.groups
        )
    trial = data.get("g")
    return DecisionState(
        recommendations=tuple(recommendations),
        scale_up_events=tuple(ScaleEvent(float(at), int(groups)) for at, groups in data.get("u", [])),
        scale_down_events=tuple(ScaleEvent(float(at), int(groups)) for at, groups in data.get("d", [])),
        started=bool(recommendations),
        goodput_trial=_trial_from_wire(trial) if isinstance(trial, Mapping) else None,
    )


@dataclass(frozen=True, slots=True)
class PersistedStates:
    """The decision states of a ModelGroup's active and shadow policies, and when they were written."""

    active: DecisionState
    shadow: DecisionState
    written_at: float | None = None


def encode_states(active: DecisionState, shadow: DecisionState | None, *, now: float) -> str:
    document: dict[str, Any] = {"v": STATE_FORMAT, "w": _ceil_seconds(now), "a": state_to_wire(active)}
    if shadow is not None and shadow.started:
        document["s"] = state_to_wire(shadow)
    return json.dumps(document, separators=(",", ":"))


def decode_states(text: str | None, *, now: float, refresh_seconds: float) -> PersistedStates:
    """The states `status.autoscalerState` (or an older operator's annotation) holds; fresh states
    when it is absent, unreadable or of another format."""
    fresh = PersistedStates(DecisionState.initial(), DecisionState.initial())
    if not text:
        return fresh
    try:
        document = json.loads(text)
        if not isinstance(document, dict) or document.get("v") != STATE_FORMAT:
            return fresh
        written_at = float(document["w"])
        states = [
            state_from_wire(document[key], written_at=written_at, now=now, refresh_seconds=refresh_seconds)
            if isinstance(document.get(key), dict)
            else DecisionState.initial()
            for key in ("a", "s")
        ]
    except (ValueError, TypeError, KeyError, IndexError):
        return fresh
    return PersistedStates(states[0], states[1], written_at)


def _shape(text: str) -> object:
    """An encoding without its write time and the newest recommendation's time: what changes only
    when the windows' content does."""
    document = json.loads(text)
    document.pop("w", None)
    for key in ("a", "s"):
        runs = document.get(key, {}).get("r")
        if runs:
            runs[-1] = [None, runs[-1][1]]
    return document


def persist_due(
    previous: str | None, current: str, *, written_at: float | None, now: float, refresh_seconds: float
) -> bool:
    """Write the state when its content changed, else at least every `refresh_seconds` while the
    newest recommendation holds (which `state_from_wire` relies on)."""
    if previous is None or written_at is None:
        return True
    try:
        if _shape(previous) != _shape(current):
            return True
    except (ValueError, TypeError, AttributeError):
        return True
    return now - written_at >= refresh_seconds


# --- Feasibility (status.feasibility, SLOAttainable) --------------------------------------------------


def feasibility_status(decision: Decision) -> tuple[ClassFeasibilityStatus, ...]:
    """`status.feasibility`: each class's threshold and infeasible share as the decision saw them,
    with the primary class's attainment against offered requests and against the attainable ceiling."""
    goodput = decision.estimates.goodput
    entries = []
    for entry in decision.estimates.feasibility:
        primary = entry.class_name == decision.slo.name and goodput is not None
        share = entry.infeasible_request_share
        entries.append(
            ClassFeasibilityStatus(
                name=entry.class_name,
                longest_feasible_prompt_tokens=entry.longest_feasible_prompt_tokens,
                infeasible_share=None if share is None else _share(share),
                unmet_field=entry.unmet_field,
                attainment_offered=_share(goodput.attainment_offered) if primary and goodput else None,
                attainment_attainable=_share(goodput.attainment_attainable) if primary and goodput else None,
            )
        )
    return tuple(entries)


def _share(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(min(1.0, max(0.0, value)), 6)


def attainability_conditions(
    conditions: Sequence[Condition], verdict: AttainabilityVerdict, *, generation: int, now: datetime
) -> tuple[Condition, ...]:
    """`conditions` with SLOAttainable set to the verdict."""
    status: ConditionStatus = (
        "True" if verdict.status == "True" else "False" if verdict.status == "False" else "Unknown"
    )
    outcome = (status, str(verdict.reason), verdict.message)
    return _put(tuple(conditions), ConditionType.SLO_ATTAINABLE, outcome, generation=generation, now=now)


def attainability_event(previous: Sequence[Condition], verdict: AttainabilityVerdict) -> EventRecord | None:
    """A Warning when SLOAttainable turns False or changes its reason while False; a Normal Event when
    it stops being False. Nothing while it holds (its message moves with the shares every tick)."""
    before = find_condition(previous, ConditionType.SLO_ATTAINABLE)
    was_false = before is not None and before.status == "False"
    if verdict.status == "False":
        if was_false and before is not None and before.reason == str(verdict.reason):
            return None
        return EventRecord("Warning", EventReason.SLO_UNATTAINABLE, verdict.message)
    if was_false:
        return EventRecord("Normal", EventReason.SLO_ATTAINABLE, verdict.message)
    return None
