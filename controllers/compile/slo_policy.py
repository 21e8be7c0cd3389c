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
from goodput.controllers.requests.degrade import fallback_findings
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
    model_group_families: Mapping[str, str | None] | None = None,
) -> PolicyReconcile:
    """The SLOPolicy's status, and the Events of the transitions it makes.

    policy: the parsed object, or why it does not parse. model_group_families: the namespace's
    ModelGroups and their `goodput.dev/model-family` labels, to check the fallbacks the classes'
    degrade ladders name (FallbacksValid); None leaves that condition as it is.
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
    bound = tuple(sorted(set(bound_model_groups)))
    conditions = set_condition(previous.conditions, condition, now)
    if model_group_families is not None and not isinstance(policy, str):
        conditions = fallbacks_condition(
            conditions, policy.spec, bound, model_group_families, generation, now
        )
    status = previous.model_copy(
        update={
            "observed_generation": generation,
            "observed_revision": revision,
            "conditions": conditions,
            "bound_model_groups": bound,
        }
    )
    return PolicyReconcile(status=status, events=tuple(events))


def fallbacks_condition(  # noqa: PLR0917 (the condition's whole input)
    conditions: tuple[Condition, ...],
    spec: SloPolicySpec,
    bound: tuple[str, ...],
    families: Mapping[str, str | None],
    generation: int,
    now: datetime,
) -> tuple[Condition, ...]:
    """FallbacksValid: the fallbacks the classes name are checked, never acted on here; the gateway
    passes over one that is missing or of another family. Absent when no class names a fallback."""
    findings = fallback_findings(spec, bound, families)
    if findings is None:
        return tuple(c for c in conditions if c.type != ConditionType.FALLBACKS_VALID)
    if findings:
        status, reason = "False", findings[0].problem.value
        message = "; ".join(finding.message for finding in findings)
    else:
        status, reason = "True", Reason.FALLBACKS_APPROVED
        message = f"every fallback is served in the family of the {len(bound)} bound ModelGroup(s)"
    condition = Condition(
        type=ConditionType.FALLBACKS_VALID,
        status=status,
        observed_generation=generation,
        last_transition_time=now,
        reason=reason,
        message=message[:32768],
    )
    return set_condition(conditions, condition, now)
