"""Handing the status an older operator wrote as `goodput` to the new field managers
(`ownership.upgrade_patch`, after client-go's csaupgrade)."""

from __future__ import annotations

import json
from typing import Any

import jsonpatch
import pytest
from hypothesis import given
from hypothesis import strategies as st

from goodput.controllers.ownership import (
    AUTOSCALER_STATUS,
    GROUP_STATUS,
    POLICY_STATUS,
    STATUS_OWNERS,
    StatusOwner,
    status_owner,
    upgrade_patch,
)


def condition(kind: str) -> tuple[str, dict[str, Any]]:
    fields = {
        ".": {},
        "f:type": {},
        "f:status": {},
        "f:reason": {},
        "f:message": {},
        "f:lastTransitionTime": {},
    }
    return f"k:{json.dumps({'type': kind}, separators=(',', ':'))}", fields


def status_fields(*names: str, conditions: tuple[str, ...] = ()) -> dict[str, Any]:
    status: dict[str, Any] = {".": {}, **{f"f:{name}": {} for name in names}}
    if conditions:
        status["f:conditions"] = {".": {}, **dict(condition(kind) for kind in conditions)}
    return {"f:status": status}


def entry(
    manager: str, operation: str, fields: dict[str, Any], subresource: str | None = "status"
) -> dict[str, Any]:
    written: dict[str, Any] = {
        "manager": manager,
        "operation": operation,
        "apiVersion": "goodput.dev/v1alpha1",
        "time": "2026-01-01T00:00:00Z",
        "fieldsType": "FieldsV1",
        "fieldsV1": fields,
    }
    if subresource is not None:
        written["subresource"] = subresource
    return written


LEGACY = entry(
    "goodput",
    "Update",
    status_fields(
        "replicas",
        "groups",
        "lastDecision",
        "autoscalerAnnotation",
        conditions=("Ready", "ScalingActive", "Stalled"),
    ),
)
SPEC_WRITE = entry("goodput", "Update", {"f:spec": {"f:replicas": {}}}, subresource=None)
KUBECTL = entry("kubectl-client-side-apply", "Update", {"f:spec": {".": {}, "f:model": {}}}, subresource=None)


def upgraded(managed: list[dict[str, Any]], owner: StatusOwner) -> list[dict[str, Any]]:
    """The managedFields after the patch, as the API server would store them."""
    metadata = {"resourceVersion": "41", "managedFields": managed}
    patch = upgrade_patch(metadata, owner)
    result: dict[str, Any] = jsonpatch.apply_patch({"metadata": metadata}, patch)
    return list(result["metadata"]["managedFields"])


def of(managed: list[dict[str, Any]], manager: str, operation: str) -> dict[str, Any] | None:
    return next(
        (
            e
            for e in managed
            if e["manager"] == manager and e["operation"] == operation and e.get("subresource")
        ),
        None,
    )


def status_of(found: dict[str, Any] | None) -> set[str]:
    """An entry's status members: top-level fields by name, conditions as `condition:<type>`."""
    if found is None:
        return set()
    status = found["fieldsV1"].get("f:status", {})
    names = {key[2:] for key in status if key.startswith("f:") and key != "f:conditions"}
    conditions = {
        "condition:" + json.loads(key[2:])["type"]
        for key in status.get("f:conditions", {})
        if key.startswith("k:")
    }
    return names | conditions


def test_the_group_controller_takes_its_own_fields_and_those_no_one_owns_now() -> None:
    managed = upgraded([KUBECTL, SPEC_WRITE, LEGACY], GROUP_STATUS)
    assert status_of(of(managed, "goodput-groups", "Apply")) == {
        "replicas",
        "groups",
        "autoscalerAnnotation",
        "condition:Ready",
        "condition:Stalled",
    }
    assert status_of(of(managed, "goodput", "Update")) == {"lastDecision", "condition:ScalingActive"}


def test_once_both_controllers_upgraded_the_legacy_status_entry_is_gone_and_other_entries_stay() -> None:
    managed = upgraded(upgraded([KUBECTL, SPEC_WRITE, LEGACY], GROUP_STATUS), AUTOSCALER_STATUS)
    assert of(managed, "goodput", "Update") is None
    assert status_of(of(managed, "goodput-autoscaler", "Apply")) == {
        "lastDecision",
        "condition:ScalingActive",
    }
    assert KUBECTL in managed and SPEC_WRITE in managed


def test_an_existing_apply_entry_gains_the_legacy_fields_and_keeps_its_own() -> None:
    applied = entry("goodput-groups", "Apply", status_fields("readyGroups", conditions=("Progressing",)))
    managed = upgraded([applied, LEGACY], GROUP_STATUS)
    assert [e["manager"] for e in managed].count("goodput-groups") == 1
    assert {"readyGroups", "condition:Progressing", "condition:Ready"} <= status_of(
        of(managed, "goodput-groups", "Apply")
    )


@pytest.mark.parametrize(
    ("name", "managed"),
    [
        ("no managed fields", []),
        ("only the new managers", [entry("goodput-groups", "Apply", status_fields("replicas"))]),
        ("legacy spec writes only", [SPEC_WRITE]),
        ("another client's status update", [entry("kubectl-edit", "Update", status_fields("replicas"))]),
        ("legacy fields another owner owns", [entry("goodput", "Update", status_fields("lastDecision"))]),
    ],
)
def test_nothing_to_hand_over_is_no_patch(name: str, managed: list[dict[str, Any]]) -> None:
    assert upgrade_patch({"resourceVersion": "7", "managedFields": managed}, GROUP_STATUS) == [], name


def test_the_patch_applies_only_to_the_resource_version_it_was_computed_from() -> None:
    patch = upgrade_patch({"resourceVersion": "41", "managedFields": [LEGACY]}, GROUP_STATUS)
    assert patch[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "41"}
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        jsonpatch.apply_patch({"metadata": {"resourceVersion": "42", "managedFields": [LEGACY]}}, patch)


def test_each_field_manager_names_its_owner() -> None:
    assert [status_owner(owner.field_manager) for owner in STATUS_OWNERS] == list(STATUS_OWNERS)
    assert status_owner("goodput") is None


FIELD_NAMES = [*sorted(GROUP_STATUS.fields | AUTOSCALER_STATUS.fields), "oldField"]
CONDITION_TYPES = [*sorted(GROUP_STATUS.condition_types | AUTOSCALER_STATUS.condition_types), "Stalled"]


@given(
    names=st.sets(st.sampled_from(FIELD_NAMES)),
    kinds=st.sets(st.sampled_from(CONDITION_TYPES)),
    first=st.sampled_from([GROUP_STATUS, AUTOSCALER_STATUS]),
)
def test_every_legacy_status_member_ends_with_exactly_one_model_group_owner(
    names: set[str], kinds: set[str], first: StatusOwner
) -> None:
    """Whatever the legacy manager wrote and whichever controller upgrades first, afterwards each
    member belongs to one new manager (its owner's, or the first one's if no one owns it) and the
    legacy status entry is gone."""
    legacy = entry("goodput", "Update", status_fields(*sorted(names), conditions=tuple(sorted(kinds))))
    second = AUTOSCALER_STATUS if first is GROUP_STATUS else GROUP_STATUS
    managed = upgraded([legacy], first) if names or kinds else [legacy]
    managed = upgraded(managed, second) if upgrade_patch({"managedFields": managed}, second) else managed
    if names or kinds:
        assert of(managed, "goodput", "Update") is None
    groups = status_of(of(managed, GROUP_STATUS.field_manager, "Apply"))
    autoscaler = status_of(of(managed, AUTOSCALER_STATUS.field_manager, "Apply"))
    assert not groups & autoscaler
    assert groups | autoscaler == names | {f"condition:{kind}" for kind in kinds}
    for owner, members in ((GROUP_STATUS, groups), (AUTOSCALER_STATUS, autoscaler)):
        for member in members:
            assert owns(owner, member) or (owner is first and not owns(second, member)), (owner, member)


def owns(owner: StatusOwner, member: str) -> bool:
    if member.startswith("condition:"):
        return owner.owns(member.removeprefix("condition:"))
    return member in owner.fields


def test_an_slo_policys_status_goes_to_the_policy_controller_whole() -> None:
    legacy = entry("goodput", "Update", status_fields("observedRevision", conditions=("Accepted", "Stalled")))
    managed = upgraded([legacy], POLICY_STATUS)
    assert of(managed, "goodput", "Update") is None
    assert status_of(of(managed, "goodput-policies", "Apply")) == {
        "observedRevision",
        "condition:Accepted",
        "condition:Stalled",
    }
