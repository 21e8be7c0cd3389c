"""Who writes which part of a status: one field manager per controller, each owning its fields.

The operator writes status with server-side apply. Each controller applies, under its own field
manager, only the status fields and condition types it owns; the API server merges the
conditions by `type` (the CRD declares them a list-map), records the owner of every field in
`metadata.managedFields`, and removes a field only when the manager that applied it leaves it out.
So no controller can erase another's condition, and none needs a resourceVersion precondition or a
reason string to tell its conditions from the others'.

A field or condition type has exactly one owner: a type both controllers applied would change hands
at every write, and one that stopped applying it could leave half a condition behind.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from goodput.api.base import GROUP, VERSION, wire_dict
from goodput.api.reasons import ConditionType


@dataclass(frozen=True, slots=True)
class StatusOwner:
    """A controller's share of a kind's status, and the field manager it applies it as."""

    field_manager: str
    kind: str
    fields: frozenset[str]
    """Top-level `status` fields (wire names), conditions apart."""
    condition_types: frozenset[str]

    def owns(self, condition_type: str) -> bool:
        return condition_type in self.condition_types

    def owned(self, status: Mapping[str, Any]) -> dict[str, Any]:
        """The part of a wire-form status this controller owns (its conditions in their order)."""
        owned = {key: value for key, value in status.items() if key in self.fields}
        conditions = [c for c in status.get("conditions") or () if self.owns(str(c.get("type")))]
        if conditions:
            owned["conditions"] = conditions
        return owned

    def apply_body(self, namespace: str, name: str, status: BaseModel) -> dict[str, Any]:
        """The server-side apply body of `status`: identity, and only what this controller owns.

        Everything owned is always sent, so leaving a field out (None) removes it."""
        return {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": self.kind,
            "metadata": {"name": name, "namespace": namespace},
            "status": self.owned(wire_dict(status)),
        }


GROUP_STATUS = StatusOwner(
    field_manager="goodput-groups",
    kind="ModelGroup",
    fields=frozenset(
        {
            "observedGeneration",
            "replicas",
            "labelSelector",
            "desiredGroups",
            "placingGroups",
            "provisioningGroups",
            "warmingGroups",
            "readyGroups",
            "drainingGroups",
            "failedGroups",
            "revision",
            "updatedGroups",
            "outdatedGroups",
            "groups",
            "drain",
        }
    ),
    condition_types=frozenset(
        {
            ConditionType.READY,
            ConditionType.PROGRESSING,
            ConditionType.DEGRADED,
            ConditionType.SCALING_LIMITED,
        }
    ),
)
"""The group controller: counts, groups, rollout, drains; Ready, Progressing, Degraded, and
ScalingLimited (no further group can be placed)."""

AUTOSCALER_STATUS = StatusOwner(
    field_manager="goodput-autoscaler",
    kind="ModelGroup",
    fields=frozenset({"lastDecision", "decisions", "shadowDecision", "feasibility", "autoscalerState"}),
    condition_types=frozenset(
        {
            ConditionType.SCALING_ACTIVE,
            ConditionType.METRICS_AVAILABLE,
            ConditionType.DECISION_LIMITED,
            ConditionType.SLO_ATTAINABLE,
        }
    ),
)
"""The autoscaler: decisions, feasibility and its decision state; ScalingActive, MetricsAvailable,
DecisionLimited and SLOAttainable."""

POLICY_STATUS = StatusOwner(
    field_manager="goodput-policies",
    kind="SLOPolicy",
    fields=frozenset({"observedGeneration", "observedRevision", "boundModelGroups"}),
    condition_types=frozenset({ConditionType.ACCEPTED}),
)
"""The SLOPolicy controller: what it read, the ModelGroups bound, and Accepted."""
