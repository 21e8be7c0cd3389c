"""Who writes which part of a status: one field manager per controller, each owning its fields.

The operator writes status with server-side apply. Each controller applies, under its own field
manager, only the status fields and condition types it owns; the API server merges the
conditions by `type` (the CRD declares them a list-map), records the owner of every field in
`metadata.managedFields`, and removes a field only when the manager that applied it leaves it out.
So no controller can erase another's condition, and none needs a resourceVersion precondition or a
reason string to tell its conditions from the others'.

A field or condition type has exactly one owner: a type both controllers applied would change hands
at every write, and one that stopped applying it could leave half a condition behind.

Objects written by an older operator carry a `managedFields` entry of the manager `goodput`
(operation Update, subresource status) that co-owns what it wrote. While it does, a field or
condition the new managers stop applying is never removed. `upgrade_patch` does what client-go's
`csaupgrade.UpgradeManagedFields` does: it moves the legacy entry's status fields into the applying
manager's Apply entry, once, so that manager's next apply decides what stays.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
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
            "pools",
            "revision",
            "updatedGroups",
            "outdatedGroups",
            "groups",
            "drain",
            "readyTime",
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
    fields=frozenset(
        {"lastDecision", "decisions", "shadowDecision", "feasibility", "capacity", "autoscalerState"}
    ),
    condition_types=frozenset(
        {
            ConditionType.SCALING_ACTIVE,
            ConditionType.METRICS_AVAILABLE,
            ConditionType.DECISION_LIMITED,
            ConditionType.SLO_ATTAINABLE,
            ConditionType.FORECASTING,
        }
    ),
)
"""The autoscaler: decisions, feasibility and its decision state; ScalingActive, MetricsAvailable,
DecisionLimited and SLOAttainable."""

POLICY_STATUS = StatusOwner(
    field_manager="goodput-policies",
    kind="SLOPolicy",
    fields=frozenset({"observedGeneration", "observedRevision", "boundModelGroups"}),
    condition_types=frozenset({ConditionType.ACCEPTED, ConditionType.FALLBACKS_VALID}),
)
"""The SLOPolicy controller: what it read, the ModelGroups bound, Accepted and FallbacksValid."""

STATUS_OWNERS = (GROUP_STATUS, AUTOSCALER_STATUS, POLICY_STATUS)
LEGACY_FIELD_MANAGERS = frozenset({"goodput"})
"""The field manager older operators wrote every status under (JSON merge patches: Update)."""

Fields = dict[str, Any]
"""A FieldsV1 set: `f:<field>` and `k:<list-map key>` members, each a set; `.` the member itself."""


def status_owner(field_manager: str) -> StatusOwner | None:
    """The status owner that applies as `field_manager`, if any."""
    return next((owner for owner in STATUS_OWNERS if owner.field_manager == field_manager), None)


def upgrade_patch(
    metadata: Mapping[str, Any],
    owner: StatusOwner,
    *,
    legacy_managers: frozenset[str] = LEGACY_FIELD_MANAGERS,
) -> list[dict[str, Any]]:
    """The JSON patch (RFC 6902) that hands `owner` its status fields from the legacy managers'
    Update entries of an object's `metadata`; [] when there is nothing to hand over.

    `owner` takes the fields and condition types it owns and those no other owner of its kind owns
    (written by an older operator, owned by no one now): its next apply, which leaves them out,
    removes them. Fields another owner of the kind owns stay in the legacy entry until that owner
    upgrades them. A legacy entry left without status fields is dropped. The patch first tests the
    resourceVersion read, so it applies only to the managedFields it was computed from.
    """
    others = [other for other in STATUS_OWNERS if other.kind == owner.kind and other != owner]
    entries: list[dict[str, Any]] = []
    taken: Fields = {}
    for entry in metadata.get("managedFields") or ():
        if not _legacy_status_entry(entry, legacy_managers):
            entries.append(dict(entry))
            continue
        mine, kept = _split_status(entry.get("fieldsV1") or {}, owner, others)
        taken = _union(taken, mine)
        if kept:
            entries.append({**entry, "fieldsV1": kept})
    if not taken:
        return []
    return [
        {"op": "test", "path": "/metadata/resourceVersion", "value": metadata.get("resourceVersion")},
        {"op": "replace", "path": "/metadata/managedFields", "value": _with_applied(entries, owner, taken)},
    ]


def _legacy_status_entry(entry: Mapping[str, Any], legacy_managers: frozenset[str]) -> bool:
    return (
        entry.get("manager") in legacy_managers
        and entry.get("operation") == "Update"
        and entry.get("subresource") == "status"
        and entry.get("fieldsType") == "FieldsV1"
    )


def _split_status(
    fields: Mapping[str, Any], owner: StatusOwner, others: Sequence[StatusOwner]
) -> tuple[Fields, Fields]:
    """`fields` split into what `owner` takes and what stays with the legacy manager."""
    status = fields.get("f:status") or {}
    mine: Fields = {}
    kept: Fields = {key: value for key, value in fields.items() if key != "f:status"}
    kept_status: Fields = {}
    for key, value in status.items():
        if key == ".":
            continue
        if key == "f:conditions":
            taken_conditions, kept_conditions = _split_conditions(value, owner, others)
            if taken_conditions:
                mine["f:conditions"] = taken_conditions
            if kept_conditions:
                kept_status["f:conditions"] = kept_conditions
        elif _takes(owner, others, key.removeprefix("f:"), lambda o, name: name in o.fields):
            mine[key] = value
        else:
            kept_status[key] = value
    if kept_status:
        kept["f:status"] = {".": {}, **kept_status}
    return ({"f:status": {".": {}, **mine}} if mine else {}), kept


def _split_conditions(
    conditions: Mapping[str, Any], owner: StatusOwner, others: Sequence[StatusOwner]
) -> tuple[Fields, Fields]:
    """The conditions list-map (members `k:{"type":...}`) split by condition type."""
    mine: Fields = {}
    kept: Fields = {}
    for key, value in conditions.items():
        if key == ".":
            continue
        kind = _condition_type(key)
        if kind is not None and _takes(owner, others, kind, lambda o, name: o.owns(name)):
            mine[key] = value
        else:
            kept[key] = value
    return ({".": {}, **mine} if mine else {}), ({".": {}, **kept} if kept else {})


def _takes(
    owner: StatusOwner, others: Sequence[StatusOwner], name: str, owns: Callable[[StatusOwner, str], bool]
) -> bool:
    """Whether `owner` takes a field: it owns it, or no other owner of its kind does."""
    return owns(owner, name) or not any(owns(other, name) for other in others)


def _condition_type(key: str) -> str | None:
    """The type of a `k:{"type":"Ready"}` member; None for anything else."""
    if not key.startswith("k:"):
        return None
    try:
        value = json.loads(key[2:])
    except ValueError:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    return kind if isinstance(kind, str) else None


def _union(left: Mapping[str, Any], right: Mapping[str, Any]) -> Fields:
    merged: Fields = dict(left)
    for key, value in right.items():
        merged[key] = _union(merged.get(key) or {}, value) if key in merged else value
    return merged


def _with_applied(entries: list[dict[str, Any]], owner: StatusOwner, taken: Fields) -> list[dict[str, Any]]:
    """`entries` with `taken` added to the owner's Apply entry of status, created if it has none."""
    for index, entry in enumerate(entries):
        if (
            entry.get("manager") == owner.field_manager
            and entry.get("operation") == "Apply"
            and entry.get("subresource") == "status"
        ):
            entries[index] = {**entry, "fieldsV1": _union(entry.get("fieldsV1") or {}, taken)}
            return entries
    applied = {
        "manager": owner.field_manager,
        "operation": "Apply",
        "apiVersion": f"{GROUP}/{VERSION}",
        "fieldsType": "FieldsV1",
        "fieldsV1": taken,
        "subresource": "status",
    }
    return [*entries, applied]
