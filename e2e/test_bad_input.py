"""Bad input at volume: a thousand random ModelGroups and SLOPolicies against the real API server.

A platform team's GitOps pipeline will sooner or later apply something odd: a typo, a number past an
edge, a value of the wrong type, or worse. Each of a thousand seeded candidates (valid, nearly valid,
hostile: see goodput.testbed.hostile_specs) is applied as kubectl would with strict field validation.
It is either rejected with a message that names a field, or accepted and then reported by the
operator (Ready or Progressing, or InvalidSpec for a spec it cannot act on). Meanwhile a serving
ModelGroup keeps its groups, the operator never crashes, and nothing is placed for a spec the
operator could not read. Then the operator's own annotations and status are corrupted by hand: it
recovers without deleting the serving group.
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from goodput.controllers import naming
from goodput.testbed.cluster.controlplane import LocalCluster
from goodput.testbed.cluster.kube import ApiError
from goodput.testbed.cluster.testing import wait_for
from goodput.testbed.hostile_specs import VALID, Candidate, candidates
from goodput.testbed.operator_process import OperatorProcess, fake_leaders, health_agent

pytestmark = pytest.mark.e2e

SAMPLES = Path(__file__).resolve().parent.parent / "manifests" / "samples"
POOL_LABEL = "e2e.goodput.dev/pool"
CANDIDATES = int(os.environ.get("GOODPUT_BAD_INPUT_COUNT", "1000"))
SEED = int(os.environ.get("GOODPUT_BAD_INPUT_SEED", "20261203"))
NAMES_A_FIELD = re.compile(r"\b(spec|metadata)\b[.\[:]|\bspec\.\w+|\.spec\b|unknown field")
PLURALS = {"ModelGroup": "modelgroups", "SLOPolicy": "slopolicies"}


def sample(name: str) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((SAMPLES / name).read_text())
    return document


def collection(namespace: str, kind: str) -> str:
    return f"/apis/goodput.dev/v1alpha1/namespaces/{namespace}/{PLURALS[kind]}"


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == kind), None)


def reported(obj: dict[str, Any]) -> bool:
    """Whether the operator has said something about this generation of the object."""
    generation = obj["metadata"].get("generation")
    kinds = ("Accepted",) if obj["kind"] == "SLOPolicy" else ("Ready", "Progressing")
    for kind in kinds:
        found = condition(obj, kind)
        if found is not None and found.get("observedGeneration") == generation:
            return True
    return False


@pytest.fixture
def serving(cluster: LocalCluster, goodput_crds: list[str], namespace: str, tmp_path: Path) -> Iterator[str]:
    """A ready one-GPU ModelGroup on two fake nodes of this test's own, with the operator running."""
    nodes = [
        cluster.add_gpu_node(
            f"{namespace}-n{index}",
            zone=f"{namespace}-z",
            clique=f"{namespace}-c",
            labels={POOL_LABEL: namespace},
        ).name
        for index in range(2)
    ]
    sentinel = sample("modelgroup-llama-8b-tp1.yaml")
    sentinel["metadata"] = {"name": "serving", "namespace": namespace}
    spec = sentinel["spec"]
    spec.pop("policyRef")
    spec.update(replicas=1, minReplicas=1, maxReplicas=1, warmReplicas=0)
    spec["placement"]["nodeSelector"] = [{"key": POOL_LABEL, "value": namespace}]
    spec["readiness"]["ncclCheck"] = "Skip"
    try:
        with (
            fake_leaders(cluster, tmp_path / "completions.jsonl"),
            health_agent(cluster, namespace, revision=spec["model"]["revision"]),
            OperatorProcess(cluster, namespace, tmp_path / "operator.log") as operator,
        ):
            cluster.api.create(collection(namespace, "ModelGroup"), sentinel)
            wait_for(
                lambda: (
                    (
                        ready := condition(
                            cluster.api.get(f"{collection(namespace, 'ModelGroup')}/serving"), "Ready"
                        )
                    )
                    is not None
                    and ready["status"] == "True"
                ),
                timeout_seconds=120,
                describe="the serving ModelGroup Ready",
            )
            yield namespace
            assert operator.process is not None and operator.process.poll() is None, "the operator exited"
            assert "Traceback" not in (tmp_path / "operator.log").read_text(), (
                "the operator logged a traceback"
            )
    finally:
        for node in nodes:
            cluster.remove_node(node)


def serving_pods(cluster: LocalCluster, namespace: str) -> dict[str, str]:
    """Pod name -> uid of the serving ModelGroup's live pods."""
    listing = cluster.api.get(
        f"/api/v1/namespaces/{namespace}/pods?labelSelector={naming.LABEL_MODEL_GROUP}=serving"
    )
    return {
        pod["metadata"]["name"]: pod["metadata"]["uid"]
        for pod in listing["items"]
        if not pod["metadata"].get("deletionTimestamp")
    }


def apply(cluster: LocalCluster, namespace: str, candidate: Candidate) -> str | None:
    """Create the candidate as kubectl would (strict field validation); the API's refusal, if any."""
    try:
        cluster.api.create(f"{collection(namespace, candidate.kind)}?fieldValidation=Strict", candidate.body)
    except ApiError as error:
        return str(error)
    return None


def test_a_thousand_random_specs_are_each_refused_with_a_field_or_reported(
    cluster: LocalCluster, serving: str
) -> None:
    namespace = serving
    cluster.api.create(collection(namespace, "SLOPolicy"), sample("slopolicy-interactive.yaml"))
    pods_before = serving_pods(cluster, namespace)
    made = candidates(
        seed=SEED,
        count=CANDIDATES,
        model_group=sample("modelgroup-llama-8b-tp1.yaml"),
        slo_policy=sample("slopolicy-interactive.yaml"),
        empty_pool={POOL_LABEL: f"{namespace}-no-nodes"},
    )

    refusals = {candidate.name: apply(cluster, namespace, candidate) for candidate in made}

    unnamed = [
        f"{c.name} ({c.mutation}): {refusals[c.name]}"
        for c in made
        if refusals[c.name] is not None and not NAMES_A_FIELD.search(refusals[c.name] or "")
    ]
    assert not unnamed, f"{len(unnamed)} refusals name no field, e.g. {unnamed[:3]}"
    wrongly_refused = [
        f"{c.name}: {refusals[c.name]}" for c in made if c.category == VALID and refusals[c.name]
    ]
    assert not wrongly_refused, wrongly_refused[:3]

    accepted = {c.name: c for c in made if refusals[c.name] is None}

    def unreported() -> list[str]:
        left = []
        for kind in PLURALS:
            for obj in cluster.api.get(collection(namespace, kind))["items"]:
                if obj["metadata"]["name"] in accepted and not reported(obj):
                    left.append(obj["metadata"]["name"])
        return left

    deadline = time.monotonic() + 600
    while (left := unreported()) and time.monotonic() < deadline:
        assert serving_pods(cluster, namespace) == pods_before, "a serving group was touched"
        time.sleep(3)
    assert not left, f"{len(left)} accepted objects never reported by the operator, e.g. {left[:5]}"

    outcomes = Counter("refused" if refusals[c.name] else f"accepted {c.category}" for c in made)
    print(f"\n{CANDIDATES} candidates (seed {SEED}): {dict(outcomes)}")
    assert serving_pods(cluster, namespace) == pods_before
    invalid = [
        obj["metadata"]["name"]
        for obj in cluster.api.get(collection(namespace, "ModelGroup"))["items"]
        if (condition(obj, "Ready") or {}).get("reason") == "InvalidSpec"
    ]
    listing = cluster.api.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
    placed_for_invalid = [
        pod["metadata"]["name"]
        for pod in listing
        if pod["metadata"].get("labels", {}).get(naming.LABEL_MODEL_GROUP) in set(invalid)
    ]
    assert not placed_for_invalid, (
        f"pods created for specs the operator cannot read: {placed_for_invalid[:5]}"
    )


def test_corrupted_annotations_and_status_are_repaired_without_touching_the_serving_group(
    cluster: LocalCluster, serving: str
) -> None:
    namespace = serving
    path = f"{collection(namespace, 'ModelGroup')}/serving"
    pods_before = serving_pods(cluster, namespace)
    garbage = {
        naming.ANNOTATION_GROUP_COUNTER: "not-a-number",
        naming.ANNOTATION_PLACEMENT_BACKOFF: "{broken json",
    }
    cluster.api.patch(path, {"metadata": {"annotations": garbage}})
    for pod in pods_before:
        cluster.api.patch(
            f"/api/v1/namespaces/{namespace}/pods/{pod}",
            {
                "metadata": {
                    "annotations": {
                        naming.ANNOTATION_DRAIN_PROGRESS: "][",
                        naming.ANNOTATION_TOPOLOGY_DOMAIN: "",
                    }
                }
            },
        )
    cluster.api.patch(
        f"{path}/status",
        {"status": {"replicas": 7, "groups": [], "conditions": [], "observedGeneration": 999}},
    )

    def repaired() -> bool:
        obj = cluster.api.get(path)
        ready = condition(obj, "Ready")
        return bool(
            ready
            and ready["status"] == "True"
            and obj["status"].get("observedGeneration") == obj["metadata"]["generation"]
            and obj["status"].get("replicas") == 1
        )

    wait_for(repaired, timeout_seconds=120, describe="the serving ModelGroup's status rewritten Ready")
    time.sleep(5)  # a few more passes of the operator over the corrupted annotations
    assert serving_pods(cluster, namespace) == pods_before
    assert repaired()
