"""A platform team compares goodput with what it runs today: the real KEDA and the real HPA.

KEDA (operator and external-metrics API server, built from its Go module) runs beside the local
control plane, registered as `external.metrics.k8s.io`; each story applies one of the two
ScaledObjects in `manifests/baselines/` unchanged but for the Prometheus address, the namespace, the
names and the bounds (`keda.render_baseline`), to a ModelGroup without a `policyRef`, and offers more
load than one group serves. KEDA creates a HorizontalPodAutoscaler; the kube-controller-manager's HPA
controller reads the external metric through the aggregation layer and scales the ModelGroup through
its scale subresource; the operator then builds the new group. The evidence is theirs: the HPA's
status and its SuccessfulRescale Event, the ScaledObject's conditions, the ModelGroup's ready groups.

The model: Llama 3.1 8B on one H100 per group, `maxNumSeqs: 2`: one group serves about four
256-in/64-out requests a second, so eight a second keep requests waiting and its GPU busy.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from goodput.testbed.cluster import keda
from goodput.testbed.cluster.controlplane import LocalCluster
from goodput.testbed.cluster.testing import wait_for
from goodput.testbed.operator_process import EmulatorProcess, LoadProcess, OperatorProcess

pytestmark = pytest.mark.e2e

POOL_LABEL = "e2e.goodput.dev/pool"
SERVED = "llama-8b"
PORT = 8000
MAX_GROUPS = 3
OVERLOAD_TRACE = (
    "synthetic:rate=8,duration=75,burst_multiplier=1,input_median=256,input_sigma=0.05,"
    "output_median=64,output_sigma=0.05"
)


@pytest.fixture(scope="module")
def keda_running(cluster: LocalCluster, goodput_crds: list[str]) -> Iterator[keda.KedaLayout]:
    layout = keda.start(cluster)
    try:
        yield layout
    finally:
        keda.stop(cluster)


@pytest.fixture
def gpu_node(cluster: LocalCluster, namespace: str) -> Iterator[str]:
    node = cluster.add_gpu_node(
        f"{namespace}-n0", zone=f"{namespace}-z0", clique=f"{namespace}-c0", labels={POOL_LABEL: namespace}
    )
    try:
        yield node.name
    finally:
        cluster.remove_node(node.name)


@pytest.fixture
def serving_stack(
    cluster: LocalCluster, namespace: str, tmp_path: Path, gpu_node: str, keda_running: keda.KedaLayout
) -> Iterator[OperatorProcess]:
    """The emulator, then the operator; the ModelGroup (no policyRef) and a Service over its leaders."""
    with (
        EmulatorProcess(cluster, namespace, tmp_path / "emulator.log"),
        OperatorProcess(cluster, namespace, tmp_path / "operator.log") as operator,
    ):
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(model_group(namespace)))
        wait_for(
            lambda: model_group_status(cluster, namespace).get("readyGroups") == 1,
            timeout_seconds=120,
            describe=lambda: f"one ready group\n{operator.log_tail(20)}",
        )
        yield operator


def model_group(namespace: str) -> list[dict[str, Any]]:
    body = {
        "apiVersion": "goodput.dev/v1alpha1",
        "kind": "ModelGroup",
        "metadata": {"name": SERVED},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "revision": "main", "servedName": SERVED},
            "engine": {"image": "vllm/vllm-openai:v0.33.0", "port": PORT, "shutdownTimeoutSeconds": 5},
            "parallelism": {"tensor": 1, "pipeline": 1, "gpusPerPod": 1},
            "placement": {"nodeSelector": [{"key": POOL_LABEL, "value": namespace}]},
            "replicas": 1,
            "minReplicas": 1,
            "maxReplicas": MAX_GROUPS,
            "profile": {"gpu": "h100-80g", "maxNumSeqs": 2, "maxNumBatchedTokens": 2048},
            "readiness": {"warmup": {"maxTokens": 4, "timeoutSeconds": 10}},
            "drain": {"maxSeconds": 20, "minLifetimeSeconds": 0},
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": SERVED},
        "spec": {
            "selector": {"goodput.dev/model-group": SERVED, "goodput.dev/rank": "0"},
            "ports": [{"name": "http", "port": PORT, "targetPort": PORT}],
        },
    }
    return [body, service]


def model_group_status(cluster: LocalCluster, namespace: str) -> dict[str, Any]:
    found = cluster.api.get(f"/apis/goodput.dev/v1alpha1/namespaces/{namespace}/modelgroups/{SERVED}") or {}
    return dict(found.get("status") or {})


def hpa(cluster: LocalCluster, namespace: str, scaled_object: str) -> dict[str, Any]:
    found = cluster.api.get(
        f"/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers/keda-hpa-{scaled_object}"
    )
    return dict(found or {})


def hpa_events(cluster: LocalCluster, namespace: str, scaled_object: str) -> list[dict[str, Any]]:
    answer = cluster.api.get(
        f"/api/v1/namespaces/{namespace}/events?fieldSelector=involvedObject.kind%3DHorizontalPodAutoscaler,"
        f"involvedObject.name%3Dkeda-hpa-{scaled_object}"
    )
    return list((answer or {}).get("items", []))


def conditions(obj: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in (obj.get("status") or {}).get("conditions", [])}


def scales_out_under_overload(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, scaler: str, tmp_path: Path
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Apply the ScaledObject, overload one group, and wait for the HPA to scale the ModelGroup out and
    the operator to make the new groups ready; returns the HPA and the load's report."""
    scaled_object = keda.render_baseline(
        scaler, namespace=namespace, model_group=SERVED, served_name=SERVED,
        prometheus_url=cluster.prometheus_url, min_groups=1, max_groups=MAX_GROUPS,
    )  # fmt: skip
    name = scaled_object["metadata"]["name"]
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(scaled_object))
    wait_for(
        lambda: conditions(hpa(cluster, namespace, name)).get("ScalingActive") == "True",
        timeout_seconds=90,
        describe=lambda: (
            f"KEDA's HPA reading its external metric: {json.dumps(hpa(cluster, namespace, name))}"
        ),
    )
    load = LoadProcess(cluster, f"{namespace}/{SERVED}", OVERLOAD_TRACE, tmp_path / "load.json", 75).start()

    def scaled_out() -> bool:
        status = hpa(cluster, namespace, name).get("status") or {}
        return (
            int(status.get("desiredReplicas") or 0) >= 2
            and model_group_status(cluster, namespace).get("readyGroups", 0) >= 2
        )

    wait_for(
        scaled_out,
        timeout_seconds=90,
        describe=lambda: (
            f"the HPA scaling the ModelGroup out: {json.dumps(hpa(cluster, namespace, name).get('status'))}\n"
            f"ModelGroup status: {json.dumps(model_group_status(cluster, namespace))[:1500]}\n"
            f"operator log:\n{operator.log_tail(15)}"
        ),
    )
    found = hpa(cluster, namespace, name)
    report = load.report()
    return found, report


def test_keda_on_waiting_requests_scales_the_model_group_through_the_hpa(
    cluster: LocalCluster, namespace: str, serving_stack: OperatorProcess, tmp_path: Path
) -> None:
    found, report = scales_out_under_overload(cluster, namespace, serving_stack, "keda", tmp_path)
    assert found["spec"]["scaleTargetRef"] == {
        "apiVersion": "goodput.dev/v1alpha1", "kind": "ModelGroup", "name": SERVED
    }  # fmt: skip
    metric = found["spec"]["metrics"][0]
    assert metric["type"] == "External" and metric["external"]["target"]["type"] == "AverageValue"
    rescales = [
        e for e in hpa_events(cluster, namespace, "llama-8b-waiting") if e["reason"] == "SuccessfulRescale"
    ]
    assert rescales, "no SuccessfulRescale Event on KEDA's HPA"
    assert "external metric" in rescales[0]["message"] and "above target" in rescales[0]["message"], rescales
    scaled_object = cluster.api.get(
        f"/apis/keda.sh/v1alpha1/namespaces/{namespace}/scaledobjects/llama-8b-waiting"
    )
    assert conditions(scaled_object)["Ready"] == "True", scaled_object["status"]
    assert report["outcomes"]["ok"] > 0, report


def test_hpa_on_dcgm_gpu_utilisation_scales_the_model_group_through_keda(
    cluster: LocalCluster, namespace: str, serving_stack: OperatorProcess, tmp_path: Path
) -> None:
    found, report = scales_out_under_overload(cluster, namespace, serving_stack, "hpa", tmp_path)
    assert found["spec"]["metrics"][0]["external"]["target"]["averageValue"] == "60"
    rescales = [
        e
        for e in hpa_events(cluster, namespace, "llama-8b-gpu-utilisation")
        if e["reason"] == "SuccessfulRescale"
    ]
    assert rescales, "no SuccessfulRescale Event on KEDA's HPA"
    # The reason the HPA gives: GPU utilisation (summed over groups) above one group's 60 % target.
    assert "external metric" in rescales[0]["message"] and "above target" in rescales[0]["message"], rescales
    assert report["outcomes"]["ok"] > 0, report


def misconfigured(cluster: LocalCluster, namespace: str, scaler: str, **trigger: str) -> dict[str, Any]:
    scaled_object = keda.render_baseline(
        scaler, namespace=namespace, model_group=SERVED, served_name=SERVED,
        prometheus_url=cluster.prometheus_url, min_groups=1, max_groups=MAX_GROUPS,
    )  # fmt: skip
    scaled_object["spec"]["triggers"][0]["metadata"].update(trigger)
    return scaled_object


def reported_problem(cluster: LocalCluster, namespace: str, name: str, expected: str) -> str:
    """What `keda.scaling_problem` says once it names `expected` (bounded: 90 s)."""
    seen: list[str | None] = [None]

    def named() -> bool:
        seen[0] = keda.scaling_problem(cluster, namespace, name)
        return seen[0] is not None and expected in seen[0]

    wait_for(
        named, timeout_seconds=90, describe=lambda: f"KEDA or the HPA saying why ({expected}): {seen[0]!r}"
    )
    return str(seen[0])


def test_a_scaled_object_that_cannot_scale_is_named_with_keda_and_the_hpas_reason(
    cluster: LocalCluster, namespace: str, serving_stack: OperatorProcess
) -> None:
    """A query that returns nothing and a target of zero: what KEDA and the HPA say, as the A/B run
    reports it."""
    for trigger, expected in (
        ({"query": 'sum(vllm:no_such_metric{namespace="nowhere"})'}, "the result is empty"),
        ({"threshold": "0"}, "must be positive"),
    ):
        scaled_object = misconfigured(cluster, namespace, "keda", **trigger)
        name = scaled_object["metadata"]["name"]
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(scaled_object))
        problem = reported_problem(cluster, namespace, name, expected)
        assert problem.startswith(f"ScaledObject {name} is not Ready: "), problem
        assert "ScaledObjectDeleted" not in problem, problem  # the first one's Events are not the second's
        assert model_group_status(cluster, namespace).get("desiredGroups") == 1
        cluster.kubectl("delete", "scaledobject", name, "-n", namespace, "--wait=true")


def test_a_demo_run_whose_scaled_object_cannot_scale_fails_naming_the_scaler_and_the_reason(
    cluster: LocalCluster, goodput_crds: list[str], keda_running: keda.KedaLayout, tmp_path: Path
) -> None:
    """What `goodput ab` reports for a misconfigured baseline (and then goes on with the others)."""
    baselines = tmp_path / "baselines"
    baselines.mkdir()
    broken = yaml.safe_load((keda.BASELINES_DIR / keda.BASELINE_FILES["keda"]).read_text())
    broken["spec"]["triggers"][0]["metadata"]["query"] = "sum(vllm:no_such_metric)"
    (baselines / keda.BASELINE_FILES["keda"]).write_text(yaml.safe_dump(broken))
    suffix = secrets.token_hex(3)
    argv = [
        sys.executable, "-m", "goodput.operator.cli", "demo", "--cluster-state-dir", str(cluster.state_dir),
        "--out", str(tmp_path / "out"), "--namespace", f"e2e-kb-{suffix}", "--release", f"gp-kb-{suffix}",
        "--release-namespace", f"e2e-kb-{suffix}-op", "--scaler", "keda", "--baselines", str(baselines),
        "--no-gateway", "--before-seconds", "10", "--burst-seconds", "10", "--after-seconds", "10",
        "--engine-load-seconds", "3",
    ]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, timeout=400, check=False)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    failure = next(line for line in result.stderr.splitlines() if "failed:" in line)
    assert "keda: ScaledObject llama-8b-waiting is not Ready" in failure, failure
    assert "the result is empty" in failure, failure
    assert "load: started" not in result.stderr  # nothing was replayed against a scaler that cannot scale
