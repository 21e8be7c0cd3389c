"""The SLOPolicy controller's decisions: accept a policy revision or say why not, and list its groups.

The API server's schema and CEL rules check each field and each object on its own. What is left
are rules about how the control loop will use the numbers together: a scale-down stabilisation
window shorter than the decision interval holds a single recommendation (so it stabilises nothing),
and a goodput floor above every class's attainment target scales out while every SLO is met. A
policy that breaks one is not Accepted, and `observedRevision` stays at the last accepted
revision, so a pipeline gating on `Accepted` with `observedRevision == spec.revision` never
promotes it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from goodput.api.conditions import Condition, find_condition, set_condition
from goodput.api.reasons import ConditionType, EventReason, Reason
from goodput.api.slopolicy import SloPolicy, SloPolicySpec, SloPolicyStatus
from goodput.controllers.events import EventRecord
from goodput.controllers.validation import describe_validation_error


@dataclass(frozen=True, slots=True)
class PolicyReconcile:
    status: SloPolicyStatus
    events: tuple[EventRecord, ...]


def parse_slo_policy(body: Mapping[str, Any]) -> SloPolicy | str:
    """The typed SLOPolicy, or a one-line description of every field that does not parse."""
    try:
        return SloPolicy.model_validate(dict(body))
    except ValidationError as error:
        return describe_validation_error(error)


def policy_problems(spec: SloPolicySpec) -> tuple[str, ...]:
    """Cross-field rules of the control loop the API server does not check."""
    problems = []
    autoscaling = spec.autoscaling
    interval = autoscaling.interval_seconds
    window = autoscaling.scale_down.stabilization_window_seconds
    if 0 < window < interval:
        problems.append(
            f"spec.autoscaling.scaleDown.stabilizationWindowSeconds: {window}s is shorter than "
            f"autoscaling.intervalSeconds ({interval}s), so the window would hold a single recommendation; "
            f"set 0 or at least {interval}"
        )
    signal = autoscaling.signals.goodput
    highest_target = max(cls.attainment for cls in spec.classes)
    if signal.enabled and signal.attainment_floor > highest_target:
        problems.append(
            f"spec.autoscaling.signals.goodput.attainmentFloor: {signal.attainment_floor} is above every "
            f"class's attainment target (highest {highest_target}), so the goodput signal would scale out "
            "while every SLO is met"
        )
    return tuple(problems)


def reconcile_policy(
    previous: SloPolicyStatus,
    *,
    generation: int,
    policy: SloPolicy | str,
    bound_model_groups: Iterable[str],
    now: datetime,
) -> PolicyReconcile:
    """The SLOPolicy's status, and the Events of the transitions it makes.

    policy: the parsed object, or why it does not parse.
    """
    problems = (policy,) if isinstance(policy, str) else policy_problems(policy.spec)
    accepted_before = find_condition(previous.conditions, ConditionType.ACCEPTED)
    events: list[EventRecord] = []
    if isinstance(policy, str) or problems:
        message = "; ".join(problems)
        condition = Condition(
            type=ConditionType.ACCEPTED,
            status="False",
            observed_generation=generation,
            last_transition_time=now,
            reason=Reason.INVALID_SPEC,
            message=message,
        )
        revision = previous.observed_revision
        if accepted_before is None or accepted_before.status != "False" or accepted_before.message != message:
            events.append(EventRecord("Warning", EventReason.INVALID_SPEC, message))
    else:
        spec = policy.spec
        revision = spec.revision
        message = (
            f"revision {spec.revision} accepted: {len(spec.classes)} class(es), autoscaling "
            f"{spec.autoscaling.mode}"
        )
        condition = Condition(
            type=ConditionType.ACCEPTED,
            status="True",
            observed_generation=generation,
            last_transition_time=now,
            reason=Reason.ACCEPTED,
            message=message,
        )
        if (
            accepted_before is None
            or accepted_before.status != "True"
            or previous.observed_revision != revision
        ):
            events.append(EventRecord("Normal", EventReason.POLICY_ACCEPTED, message))
    status = previous.model_copy(
        update={
            "observed_generation": generation,
            "observed_revision": revision,
            "conditions": set_condition(previous.conditions, condition, now),
            "bound_model_groups": tuple(sorted(set(bound_model_groups))),
        }
    )
    return PolicyReconcile(status=status, events=tuple(events))
