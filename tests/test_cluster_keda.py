"""KEDA on the local cluster: its command lines bind loopback only, and its registration sends the
external-metrics API to the relay's pod-like address with the cluster's CA."""

from __future__ import annotations

import base64
import ipaddress
from pathlib import Path
from typing import Any

import pytest

from goodput.testbed.cluster import keda
from goodput.testbed.cluster.topology import PodNetwork


@pytest.fixture
def layout(tmp_path: Path) -> keda.KedaLayout:
    return keda.KedaLayout(
        bin_dir=tmp_path / "bin",
        kubeconfig=tmp_path / "kubeconfig",
        cert_dir=tmp_path / "keda-certs",
        netns="goodput-unit",
        extension_server_address=PodNetwork(205).extension_server_address,
        ports=keda.KedaPorts(21001, 21002, 21003, 21004, 21005),
    )


def flags(argv: list[str]) -> dict[str, str]:
    return dict(arg.removeprefix("--").split("=", 1) for arg in argv[1:] if arg.startswith("--"))


def test_the_operator_and_the_adapter_listen_on_loopback_only(layout: keda.KedaLayout) -> None:
    operator, adapter = flags(keda.operator_command(layout)), flags(keda.adapter_command(layout))
    listeners = [
        operator["metrics-bind-address"], operator["health-probe-bind-address"],
        operator["metrics-service-bind-address"], f"{adapter['bind-address']}:{adapter['secure-port']}",
    ]  # fmt: skip
    assert all(address.startswith("127.0.0.1:") for address in listeners), listeners
    ports = {int(address.rsplit(":", 1)[1]) for address in listeners} | {int(adapter["port"])}
    assert ports == {21001, 21002, 21003, 21004, 21005}


def test_the_adapter_reaches_the_operator_over_mutual_tls_from_one_cert_dir(layout: keda.KedaLayout) -> None:
    operator, adapter = flags(keda.operator_command(layout)), flags(keda.adapter_command(layout))
    assert adapter["metrics-service-address"] == operator["metrics-service-bind-address"]
    assert adapter["metrics-service-grpc-authority"] == "keda-operator.keda.svc"
    assert operator["cert-dir"] == adapter["cert-dir"] == str(layout.cert_dir)
    assert adapter["tls-cert-file"] == str(layout.cert_dir / "tls.crt")
    # No certificate rotation and no patching of cluster objects: the harness owns the CA and the APIService.
    assert operator["enable-cert-rotation"] == "false"
    assert operator["enable-apiservice-patching"] == operator["enable-webhook-patching"] == "false"


def test_the_relay_listens_at_the_extension_address_and_forwards_to_the_adapter(
    layout: keda.KedaLayout,
) -> None:
    argv = keda.relay_command(layout)
    listen = f"{layout.extension_server_address}:6443"
    assert argv[1:] == ["-m", "goodput.testbed.cluster.relay", "goodput-unit", listen, "21004"]


def test_the_external_metrics_api_is_served_by_the_relay_with_the_clusters_ca(
    layout: keda.KedaLayout,
) -> None:
    objects = dict(keda.registration_objects(layout, b"CA PEM"))
    apiservice = objects["/apis/apiregistration.k8s.io/v1/apiservices"]
    assert apiservice["metadata"]["name"] == "v1beta1.external.metrics.k8s.io"
    assert apiservice["spec"]["service"] == {
        "name": "keda-metrics-apiserver",
        "namespace": "keda",
        "port": 443,
    }
    assert base64.b64decode(apiservice["spec"]["caBundle"]) == b"CA PEM"
    assert "insecureSkipTLSVerify" not in apiservice["spec"]
    service = objects["/api/v1/namespaces/keda/services"]
    assert "selector" not in service["spec"]  # its endpoints are the relay, written by the harness
    assert service["spec"]["ports"][0]["targetPort"] == 6443
    endpoints = objects["/api/v1/namespaces/keda/endpoints"]
    (subset,) = endpoints["subsets"]
    assert subset["addresses"] == [{"ip": layout.extension_server_address}]
    assert subset["ports"][0]["port"] == 6443
    assert ipaddress.ip_address(layout.extension_server_address) in ipaddress.ip_network(
        PodNetwork(205).pod_range
    )


def test_keda_knows_its_namespace_without_a_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/usr/bin")
    env = keda.process_env()
    assert env["POD_NAMESPACE"] == env["KEDA_CLUSTER_OBJECT_NAMESPACE"] == "keda"
    assert env["WATCH_NAMESPACE"] == "" and env["PATH"] == "/usr/bin"


@pytest.mark.parametrize(
    ("scaler", "query", "threshold"),
    [
        ("keda", 'sum(vllm:num_requests_waiting{namespace="ab-keda", model_name="chat-8b"})', "0.5"),
        ("hpa", 'sum(DCGM_FI_DEV_GPU_UTIL{namespace="ab-keda", pod=~"mg-a-g[0-9]+-[0-9]+"}) / 1', "60"),
    ],
)
def test_a_baseline_is_applied_to_another_model_group_with_its_query_and_threshold_kept(
    scaler: str, query: str, threshold: str
) -> None:
    rendered = keda.render_baseline(
        scaler, namespace="ab-keda", model_group="mg-a", served_name="chat-8b",
        prometheus_url="http://127.0.0.1:9", min_groups=2, max_groups=5,
    )  # fmt: skip
    assert rendered["metadata"]["name"].startswith("mg-a-")
    assert rendered["metadata"]["namespace"] == "ab-keda"
    spec = rendered["spec"]
    assert spec["scaleTargetRef"] == {
        "apiVersion": "goodput.dev/v1alpha1",
        "kind": "ModelGroup",
        "name": "mg-a",
    }
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (2, 5)
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    assert trigger["metadata"]["query"] == query
    assert trigger["metadata"]["threshold"] == threshold
    assert trigger["metadata"]["serverAddress"] == "http://127.0.0.1:9"


def test_a_threshold_tuned_for_the_traffic_replaces_the_manifests() -> None:
    rendered = keda.render_baseline(
        "hpa", namespace="n", model_group="m", served_name="s", prometheus_url="http://p",
        min_groups=1, max_groups=4, threshold=80.0,
    )  # fmt: skip
    assert rendered["spec"]["triggers"][0]["metadata"]["threshold"] == "80"


def named(name: str, *conditions: tuple[str, str, str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "status": {
            "conditions": [{"type": t, "status": s, "reason": r, "message": m} for t, s, r, m in conditions]
        },
    }


PROBLEM_CASES = [
    pytest.param(None, None, "the ScaledObject is gone", None, id="deleted"),
    pytest.param(
        named("so", ("Ready", "False", "ScaledObjectCheckFailed", "threshold must be > 0")), None,
        "ScaledObject so is not Ready: ScaledObjectCheckFailed: threshold must be > 0", None,
        id="refused by KEDA",
    ),
    pytest.param(
        named("so"), None, "KEDA has made no HorizontalPodAutoscaler for ScaledObject so yet", None,
        id="no HPA",
    ),
    pytest.param(
        named("so"), named("keda-hpa-so"), "HPA keda-hpa-so has not computed a replica count yet", None,
        id="HPA not synced",
    ),
    pytest.param(
        named("so", ("Ready", "True", "ScaledObjectReady", "")),
        named("keda-hpa-so", ("ScalingActive", "False", "FailedGetExternalMetric", "no data")),
        "HPA keda-hpa-so cannot scale: FailedGetExternalMetric: no data", None, id="metric unreadable",
    ),
    pytest.param(
        named("so", ("Ready", "True", "ScaledObjectReady", "")),
        named("keda-hpa-so", ("ScalingActive", "True", "ValidMetricFound", "")), None, None, id="scaling",
    ),
    pytest.param(
        named("so", ("Ready", "False", "TriggerError", "Triggers defined in ScaledObject are not working")),
        None,
        "ScaledObject so is not Ready: TriggerError: Triggers defined in ScaledObject are not working "
        "(KEDAScalerFailed: the result is empty)",
        {"reason": "KEDAScalerFailed", "message": "the result is empty"},
        id="the scaler's own error from its Event",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("scaled_object", "hpa", "problem", "warning"), PROBLEM_CASES)
def test_why_a_scaled_object_does_not_scale_is_said_in_keda_and_the_hpas_words(
    scaled_object: dict[str, Any] | None,
    hpa: dict[str, Any] | None,
    problem: str | None,
    warning: dict[str, Any] | None,
) -> None:
    assert keda.scaling_problem_of(scaled_object, hpa, warning) == problem
