"""Upgrading from an operator that wrote status as `goodput` (JSON merge patches) to one that applies
it per controller (server-side apply), against the real API server.

The story: an older operator left a condition that no controller writes any more. The API server
keeps a field while any manager owns it, so as long as the old `goodput` entry co-owns the status the
new group controller's applies cannot remove it. The operator's first apply to an object hands the
old entry's fields to the applying manager (`KubeApi.upgrade_status_manager`), and that apply
removes the stale condition.

Fixtures come from e2e/conftest.py: `cluster`, `goodput_crds` and `namespace`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import config

from goodput.controllers.ownership import GROUP_STATUS
from goodput.operator.kube import APPLY_PATCH, MERGE_PATCH, KubeApi

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("goodput_crds")]

LLAMA_8B = Path(__file__).resolve().parent.parent / "manifests" / "samples" / "modelgroup-llama-8b-tp1.yaml"
WRITTEN_AT = "2026-01-01T00:00:00Z"


def condition(kind: str, reason: str) -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True",
        "reason": reason,
        "message": f"{kind} as an older operator wrote it",
        "lastTransitionTime": WRITTEN_AT,
    }


def path(namespace: str, name: str) -> str:
    return f"/apis/goodput.dev/v1alpha1/namespaces/{namespace}/modelgroups/{name}"


def created_by_an_older_operator(kube: KubeApi, namespace: str, name: str) -> None:
    """A ModelGroup whose status the older operator wrote with a merge patch as `goodput`, with a
    condition type no controller writes any more."""
    manifest = yaml.safe_load(LLAMA_8B.read_text())
    manifest["metadata"] = {"name": name, "namespace": namespace}
    kube.request(
        "POST", "modelgroups", f"/apis/goodput.dev/v1alpha1/namespaces/{namespace}/modelgroups", manifest
    )
    legacy = {
        "status": {"replicas": 0, "conditions": [condition("Ready", "NoGroups"), condition("Stalled", "Old")]}
    }
    kube.request(
        "PATCH",
        "modelgroups/status",
        path(namespace, name) + "/status",
        legacy,
        content_type=MERGE_PATCH,
        query={"fieldManager": "goodput"},
    )


def applied_status(namespace: str, name: str) -> dict[str, Any]:
    """What the new group controller applies: its fields, Ready, and no Stalled condition."""
    return {
        "apiVersion": "goodput.dev/v1alpha1",
        "kind": "ModelGroup",
        "metadata": {"name": name, "namespace": namespace},
        "status": {"replicas": 0, "conditions": [condition("Ready", "NoGroups")]},
    }


def read(kube: KubeApi, namespace: str, name: str) -> tuple[set[str], list[tuple[str, str, str | None]]]:
    current = kube.request("GET", "modelgroups", path(namespace, name))
    types = {c["type"] for c in current.get("status", {}).get("conditions", [])}
    managers = [
        (e["manager"], e["operation"], e.get("subresource"))
        for e in current["metadata"].get("managedFields", [])
    ]
    return types, managers


def test_a_condition_the_older_operator_left_is_removed_by_the_first_apply_after_the_upgrade(
    cluster: Any, namespace: str
) -> None:
    # The operator's own client, on the cluster's kubeconfig (the kubernetes package reads
    # $KUBECONFIG when it is imported, before the cluster fixture sets it).
    kube = KubeApi(config.new_client_from_config(config_file=cluster.kubeconfig))  # type: ignore[no-untyped-call]
    for name in ("without-upgrade", "upgraded"):
        created_by_an_older_operator(kube, namespace, name)

    # Applying without the upgrade: the old entry still owns Stalled, so it stays.
    kube.request(
        "PATCH",
        "modelgroups/status",
        path(namespace, "without-upgrade") + "/status",
        json.dumps(applied_status(namespace, "without-upgrade")),
        content_type=APPLY_PATCH,
        query={"fieldManager": GROUP_STATUS.field_manager, "force": "true"},
    )
    stale, managers = read(kube, namespace, "without-upgrade")
    assert "Stalled" in stale
    assert ("goodput", "Update", "status") in managers

    # The operator's apply upgrades the object first: the old entry is gone, and so is Stalled.
    body = applied_status(namespace, "upgraded")
    kube.apply_custom_status(
        "modelgroups", namespace, "upgraded", body, field_manager=GROUP_STATUS.field_manager
    )
    types, managers = read(kube, namespace, "upgraded")
    assert types == {"Ready"}
    assert ("goodput", "Update", "status") not in managers
    assert (GROUP_STATUS.field_manager, "Apply", "status") in managers

    # Later applies own what they send: dropping Ready now removes it too.
    body["status"]["conditions"] = []
    kube.apply_custom_status(
        "modelgroups", namespace, "upgraded", body, field_manager=GROUP_STATUS.field_manager
    )
    assert read(kube, namespace, "upgraded")[0] == set()
