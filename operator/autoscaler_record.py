"""A tick's plan and decisions, and how they become the autoscaler's part of the status: the record
applied, when the same decision is written again, and the Events of its transitions. Values and pure
functions of them; the loop (`autoscaler`) does the I/O."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from goodput.api.modelgroup import ModelGroupStatus
from goodput.api.reasons import ConditionType
from goodput.controllers.autoscale.feasible_demand import AttainabilityVerdict
from goodput.controllers.autoscale.model import Decision, LearntCapacity
from goodput.controllers.autoscale.record import (
    FailureReason,
    ForecastHealth,
    MetricsHealth,
    attainability_conditions,
    attainability_event,
    autoscaler_conditions,
    capacity_status,
    decision_events,
    failure_conditions,
    failure_event,
    feasibility_status,
    forecasting_conditions,
    record_decisions,
)
from goodput.controllers.compile.scaling import (
    CompiledPolicy,
)
from goodput.controllers.events import EventRecord
from goodput.controllers.ownership import AUTOSCALER_STATUS


@dataclass(frozen=True, slots=True)
class Unusable:
    """A bound policy the autoscaler cannot use, and why."""

    reason: FailureReason
    message: str


@dataclass(frozen=True, slots=True)
class TickPlan:
    """Which policies decide this tick (None: it does not) and the interval of the next one."""

    interval_seconds: float
    active: CompiledPolicy | None = None
    shadow: CompiledPolicy | None = None
    stopped: Unusable | None = None
    """Why the active policy does not decide: it cannot be used, or it is Frozen."""
    shadow_bound: bool = False
    """The ModelGroup names a shadow policy (else its status keeps no shadow decision)."""

    @property
    def deciding(self) -> list[CompiledPolicy]:
        return [policy for policy in (self.active, self.shadow) if policy is not None]


@dataclass(frozen=True, slots=True)
class Decided:
    """One tick's decisions, with what the active one's conditions are computed from."""

    active: Decision | None = None
    shadow: Decision | None = None
    health: MetricsHealth | None = None
    verdict: AttainabilityVerdict | None = None
    capacity: LearntCapacity | None = None
    """The capacity the active decision used (`status.capacity`)."""
    forecast: ForecastHealth | None = None
    """Whether `spec.forecast`'s history gave a forecast (the Forecasting condition); None: not asked
    for, or not read yet."""
    forecast_asked: bool = False
    """The ModelGroup sets `spec.forecast`: without it, a Forecasting condition left from before goes."""


def with_own_status(watched: Mapping[str, Any], written: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """The watched status with the autoscaler's part as it last applied it (`written`, wire form),
    and whether the watch shows that part already (then the watched status is returned as it is).

    The watch may deliver the object a moment after the apply landed; deciding on the older copy
    would record the decision history from before the last decision. Only the autoscaler's own
    fields and conditions are taken from `written`: the group controller's are the watched ones."""
    if AUTOSCALER_STATUS.owned(watched) == dict(written):
        return dict(watched), True
    status = {
        key: value
        for key, value in watched.items()
        if key not in AUTOSCALER_STATUS.fields and key != "conditions"
    }
    status.update({key: value for key, value in written.items() if key != "conditions"})
    conditions = [
        c for c in watched.get("conditions") or () if not AUTOSCALER_STATUS.owns(str(c.get("type")))
    ]
    conditions += list(written.get("conditions") or ())
    if conditions:
        status["conditions"] = conditions
    return status, False


def repeats_recent_decision(
    previous: ModelGroupStatus, new: ModelGroupStatus, *, now: float, refresh_seconds: float
) -> bool:
    """Whether `new` differs from `previous` only in the time of the same decisions, recorded less
    than `refresh_seconds` ago: such a write would say only "decided again, the same", and at fleet
    size one per ModelGroup per interval is most of the operator's API traffic at rest. The record
    (and the decision state beside it, `persist_due`) is refreshed at least every `refresh_seconds`."""
    stamps: list[float] = []
    same_times: dict[str, Any] = {}
    for name in ("last_decision", "shadow_decision"):
        old, fresh = getattr(previous, name), getattr(new, name)
        if old is not None and fresh is not None:
            same_times[name] = fresh.model_copy(update={"time": old.time})
            stamps.append(old.time.timestamp())
    old_capacity, new_capacity = previous.capacity, new.capacity
    if old_capacity is not None and new_capacity is not None and old_capacity.evidence_window is not None:
        # More evidence at the same value is not news: the window's end and the confidence move on
        # every tick while learning, and are refreshed with the record.
        window = new_capacity.evidence_window
        same_times["capacity"] = new_capacity.model_copy(
            update={
                "confidence": old_capacity.confidence,
                "evidence_window": None
                if window is None
                else window.model_copy(update={"end": old_capacity.evidence_window.end}),
            }
        )
    if not stamps or new.model_copy(update=same_times) != previous:
        return False
    return all(now - stamp < refresh_seconds for stamp in stamps)


def staggered_refresh_seconds(namespace: str, name: str, refresh_seconds: float) -> float:
    """How often one ModelGroup's unchanged record and state are rewritten: between half and all of
    `refresh_seconds`, fixed per ModelGroup. ModelGroups created together would otherwise all come
    due in the same interval and queue a thousand writes behind one another."""
    digest = hashlib.blake2b(f"{namespace}/{name}".encode(), digest_size=8).digest()
    spread = int.from_bytes(digest) / 2**64
    return refresh_seconds * (0.5 + 0.5 * spread)


def recorded_status(
    previous: ModelGroupStatus,
    *,
    decided: Decided,
    stopped: Unusable | None,
    generation: int,
    when: datetime,
) -> ModelGroupStatus:
    """The autoscaler's part of the status after this tick: the decisions, and the conditions of the
    active one (or of why there was none)."""
    new = record_decisions(previous, active=decided.active, shadow=decided.shadow)
    if decided.active is not None and decided.health is not None:
        conditions = autoscaler_conditions(
            new.conditions, decided.active, decided.health, generation=generation, now=when
        )
        if decided.verdict is not None:
            conditions = attainability_conditions(
                conditions, decided.verdict, generation=generation, now=when
            )
            new = new.model_copy(update={"feasibility": feasibility_status(decided.active)})
        if decided.capacity is not None:
            new = new.model_copy(update={"capacity": capacity_status(decided.capacity)})
        if decided.forecast is not None:
            conditions = forecasting_conditions(conditions, decided.forecast, generation=generation, now=when)
        elif not decided.forecast_asked:
            conditions = tuple(c for c in conditions if c.type != ConditionType.FORECASTING)
    elif stopped is not None:
        conditions = failure_conditions(
            new.conditions, reason=stopped.reason, message=stopped.message, generation=generation, now=when
        )
    else:
        return new
    return new.model_copy(update={"conditions": conditions})


def tick_events(status: ModelGroupStatus, plan: TickPlan, decided: Decided) -> list[EventRecord]:
    """Events on transitions: a changed decision, attainability, or why the active policy stopped."""
    events: list[EventRecord] = []
    if decided.active is not None and plan.active is not None:
        events += decision_events(status.last_decision, decided.active, policy_name=plan.active.policy_name)
        if decided.verdict is not None and (event := attainability_event(status.conditions, decided.verdict)):
            events.append(event)
    elif plan.stopped is not None and (
        event := failure_event(status.conditions, plan.stopped.reason, plan.stopped.message)
    ):
        events.append(event)
    if decided.shadow is not None and plan.shadow is not None:
        events += decision_events(
            status.shadow_decision, decided.shadow, policy_name=plan.shadow.policy_name, shadow=True
        )
    return events
