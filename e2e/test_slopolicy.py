"""A pipeline promotes SLOPolicy revisions and gates on what the operator reports back."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from goodput.testbed.cluster.controlplane import LocalCluster
from goodput.testbed.cluster.testing import wait_for
from goodput.testbed.operator_process import OperatorProcess

pytestmark = pytest.mark.e2e


def policy(namespace: str, revision: str, **autoscaling: Any) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "goodput.dev/v1alpha1",
            "kind": "SLOPolicy",
            "metadata": {"name": "interactive", "namespace": namespace},
            "spec": {
                "revision": revision,
                "classes": [{"name": "chat", "ttftSeconds": 1.0, "itlSeconds": 0.08, "attainment": 0.99}],
                "autoscaling": {"intervalSeconds": 15, **autoscaling},
            },
        }
    )


def bound_model_group(namespace: str, name: str) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "goodput.dev/v1alpha1",
            "kind": "ModelGroup",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
                "engine": {"image": "vllm/vllm-openai:v0.33.0"},
                "parallelism": {"gpusPerPod": 1},
                # Placed nowhere: this story is about the policy, not the groups.
                "placement": {"nodeSelector": [{"key": "e2e.goodput.dev/pool", "value": "none"}]},
                "maxReplicas": 2,
                "policyRef": {"name": "interactive"},
                "profile": {"gpu": "h100-80g"},
            },
        }
    )


def policy_status(cluster: LocalCluster, namespace: str) -> dict[str, Any]:
    found = cluster.api.get(f"/apis/goodput.dev/v1alpha1/namespaces/{namespace}/slopolicies/interactive")
    return dict((found or {}).get("status") or {})


def accepted(status: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions", []) if c["type"] == "Accepted"), None)


def test_a_promoted_revision_is_accepted_recorded_and_bound(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess
) -> None:
    cluster.kubectl("apply", "-f", "-", input=policy(namespace, "r1"))
    for name in ("llama-8b", "llama-8b-canary"):
        cluster.kubectl("apply", "-f", "-", input=bound_model_group(namespace, name))

    def promoted() -> dict[str, Any]:
        status = policy_status(cluster, namespace)
        condition = accepted(status)
        done = (
            condition is not None
            and condition["status"] == "True"
            and len(status.get("boundModelGroups", [])) == 2
        )
        return status if done else {}

    status = wait_for(
        promoted,
        timeout_seconds=30,
        describe=lambda: (
            f"r1 accepted, 2 groups bound: {policy_status(cluster, namespace)}\n{operator.log_tail()}"
        ),
    )
    assert (status["observedRevision"], status["observedGeneration"]) == ("r1", 1)
    assert status["boundModelGroups"] == ["llama-8b", "llama-8b-canary"]

    # A revision whose scale-down window is shorter than the decision interval stabilises nothing.
    cluster.kubectl(
        "apply", "-f", "-", input=policy(namespace, "r2", scaleDown={"stabilizationWindowSeconds": 5})
    )

    def rejected() -> dict[str, Any]:
        status = policy_status(cluster, namespace)
        condition = accepted(status)
        return status if condition is not None and condition["status"] == "False" else {}

    status = wait_for(
        rejected, timeout_seconds=30, describe=lambda: f"r2 rejected: {policy_status(cluster, namespace)}"
    )
    condition = accepted(status)
    assert condition is not None and condition["reason"] == "InvalidSpec"
    assert "stabilizationWindowSeconds" in condition["message"]
    # A pipeline gating on observedRevision == spec.revision does not promote r2.
    assert (status["observedRevision"], status["observedGeneration"]) == ("r1", 2)

    cluster.kubectl("delete", "mg", "llama-8b-canary", "-n", namespace)
    wait_for(
        lambda: policy_status(cluster, namespace).get("boundModelGroups") == ["llama-8b"],
        timeout_seconds=30,
        describe=lambda: f"the canary unbound: {policy_status(cluster, namespace)}",
    )
