"""On a plain HGX H100 cluster the samples serve as shipped: no clique label, no health agent.

GPU Feature Discovery sets `nvidia.com/gpu.clique` only on multi-node NVLink systems; an ordinary
HGX H100 node carries its product and GPU count but no clique, and runs no goodput health agent.
Fake nodes labelled like that, the sample SLOPolicies and ModelGroups as shipped (with only a node
selector added, to keep them on this test's nodes), and every group becomes Ready: placement treats
each node as its own domain, and readiness waits for nothing but running ranks and a warm-up.

The same cluster with placement mode `Required` cannot hold a group, and says which label is
missing on which nodes instead of waiting in silence.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from goodput.testbed.cluster.controlplane import LocalCluster
from goodput.testbed.cluster.testing import wait_for
from goodput.testbed.operator_process import FakeLeaders, OperatorProcess

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "manifests" / "samples"
POOL_LABEL = "e2e.goodput.dev/pool"
CLIQUE = "nvidia.com/gpu.clique"
H100 = "NVIDIA-H100-80GB-HBM3"


@contextlib.contextmanager
def hgx_nodes(cluster: LocalCluster, namespace: str, count: int) -> Iterator[list[str]]:
    """8×H100 nodes as GPU Feature Discovery labels an HGX system: product and count, no clique."""
    names: list[str] = []
    try:
        for index in range(count):
            node = cluster.add_gpu_node(
                f"{namespace}-hgx-{index}",
                zone=f"{namespace}-z0",
                clique="unused",
                gpu_product=H100,
                labels={POOL_LABEL: namespace},
            )
            names.append(node.name)
            # The harness labels every node with a clique; a plain HGX node has none.
            cluster.kubectl("label", "node", node.name, f"{CLIQUE}-")
        yield names
    finally:
        for name in names:
            cluster.remove_node(name)


def sample(name: str, namespace: str, **placement: Any) -> str:
    """A sample as shipped, in this test's namespace and on this test's nodes."""
    document = yaml.safe_load((SAMPLES / name).read_text())
    document["metadata"]["namespace"] = namespace
    if document["kind"] == "ModelGroup":
        spec = document["spec"]
        spec.setdefault("placement", {})
        spec["placement"]["nodeSelector"] = [
            *spec["placement"].get("nodeSelector", []),
            {"key": POOL_LABEL, "value": namespace},
        ]
        spec["placement"].update(placement)
    return yaml.safe_dump(document)


def model_group(cluster: LocalCluster, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = cluster.api.get(
        f"/apis/goodput.dev/v1alpha1/namespaces/{namespace}/modelgroups/{name}"
    )
    return found


def condition(body: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in body.get("status", {}).get("conditions", []) if c["type"] == kind), None)


def test_the_samples_serve_on_plain_hgx_nodes_without_the_health_agent(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, leaders: FakeLeaders
) -> None:
    with hgx_nodes(cluster, namespace, count=3) as nodes:
        for name in nodes:
            assert CLIQUE not in cluster.api.get(f"/api/v1/nodes/{name}")["metadata"]["labels"]
        for name in ("slopolicy-interactive.yaml", "slopolicy-batch.yaml"):
            cluster.kubectl("apply", "-f", "-", input=sample(name, namespace))
        cluster.kubectl("apply", "-f", "-", input=sample("modelgroup-llama-8b-tp1.yaml", namespace))
        cluster.kubectl("apply", "-f", "-", input=sample("modelgroup-llama-70b-tp8-pp2.yaml", namespace))

        def ready() -> bool:
            small = model_group(cluster, namespace, "llama-8b").get("status", {})
            large = model_group(cluster, namespace, "llama-70b").get("status", {})
            return bool(small.get("readyGroups") == 2 and large.get("readyGroups") == 1)

        wait_for(
            ready,
            timeout_seconds=120,
            describe=lambda: (
                f"2 ready 8B groups and 1 ready 70B group; "
                f"8B {model_group(cluster, namespace, 'llama-8b').get('status')}\n"
                f"70B {model_group(cluster, namespace, 'llama-70b').get('status')}\n{operator.log_tail()}"
            ),
        )
        pods = cluster.api.get(f"/api/v1/namespaces/{namespace}/pods?labelSelector=goodput.dev/model-group")
        for pod in pods["items"]:
            # Each group went to a node of its own choosing: the domain is the node.
            assert pod["metadata"]["annotations"]["goodput.dev/topology-domain"].startswith("node/")
        large = [
            p for p in pods["items"] if p["metadata"]["labels"]["goodput.dev/model-group"] == "llama-70b"
        ]
        assert len({pod["spec"]["nodeName"] for pod in large}) == 2, "16 GPUs span two 8-GPU nodes"
        for name in ("llama-8b", "llama-70b"):
            limited = condition(model_group(cluster, namespace, name), "ScalingLimited")
            assert limited is None or limited["status"] == "False", limited


def test_required_placement_names_the_missing_label_and_the_nodes(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess
) -> None:
    with hgx_nodes(cluster, namespace, count=2) as nodes:
        cluster.kubectl("apply", "-f", "-", input=sample("slopolicy-batch.yaml", namespace))
        cluster.kubectl("apply", "-f", "-", input=sample("slopolicy-interactive.yaml", namespace))
        manifest = sample("modelgroup-llama-70b-tp8-pp2.yaml", namespace, mode="Required")
        cluster.kubectl("apply", "-f", "-", input=manifest)

        def limited() -> dict[str, Any] | None:
            found = condition(model_group(cluster, namespace, "llama-70b"), "ScalingLimited")
            return found if found is not None and found["status"] == "True" else None

        found = wait_for(
            limited, timeout_seconds=60, describe=lambda: f"ScalingLimited\n{operator.log_tail()}"
        )
        assert found["reason"] == "TopologyLabelMissing"
        assert CLIQUE in found["message"]
        assert all(node in found["message"] for node in nodes)
        pods = cluster.api.get(f"/api/v1/namespaces/{namespace}/pods?labelSelector=goodput.dev/model-group")
        assert pods["items"] == [], "no pod holds GPUs for a group that cannot be placed"
