"""The chart's endpoint picker: off by default; on, a Deployment serving the ext-proc gRPC port, its
Service, and RBAC to read the InferencePool, its ModelGroup and the leaders in the pool's namespace.

Rendered offline with the helm binary, as tests/test_chart.py does (which it reuses).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from test_chart import (
    CHART,
    NAMESPACE,
    Rendered,
    expand,
    grants,
    helm,  # noqa: F401 (a fixture, used by name)
    helm_template,
    render,
    values_file,
)

PICKER_VALUES = CHART / "ci" / "endpoint-picker-values.yaml"
PICKER = "goodput-endpoint-picker"


@pytest.fixture(scope="module")
def picker(helm: Path) -> Rendered:  # noqa: F811
    return render(helm, "-f", str(PICKER_VALUES))


def test_the_endpoint_picker_is_off_by_default(helm: Path) -> None:  # noqa: F811
    rendered = render(helm)
    assert not [obj for obj in rendered.objects if obj["metadata"]["name"] == PICKER]


def test_the_endpoint_picker_lints_clean_in_strict_mode(helm: Path) -> None:  # noqa: F811
    command = [str(helm), "lint", "--strict", str(CHART), "-f", str(PICKER_VALUES)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0 and "[WARNING]" not in result.stdout, result.stdout + result.stderr


def test_the_picker_serves_its_pool_on_the_grpc_port_its_service_exposes(picker: Rendered) -> None:
    deployment = picker.one("Deployment", PICKER)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["goodput"]
    assert container["args"] == [
        "gateway",
        "endpoint-picker",
        "--pool=llama-8b",
        "--namespace=inference",
        "--grpc-port=9002",
        "--metrics-port=9090",
    ]
    assert {port["name"]: port["containerPort"] for port in container["ports"]} == {
        "grpc": 9002,
        "metrics": 9090,
    }
    assert container["readinessProbe"]["tcpSocket"] == {"port": "grpc"}
    service = picker.one("Service", PICKER)
    grpc = next(port for port in service["spec"]["ports"] if port["name"] == "grpc")
    assert grpc == {
        "name": "grpc",
        "port": 9002,
        "targetPort": "grpc",
        "protocol": "TCP",
        "appProtocol": "kubernetes.io/h2c",
    }
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert all(pod_labels.get(key) == value for key, value in service["spec"]["selector"].items())
    operator_labels = picker.one("Deployment", "goodput")["spec"]["template"]["metadata"]["labels"]
    assert not all(operator_labels.get(key) == value for key, value in service["spec"]["selector"].items())


def test_the_picker_may_only_read_the_pool_its_modelgroup_and_pods_in_the_pools_namespace(
    picker: Rendered,
) -> None:
    role = picker.one("Role", PICKER)
    binding = picker.one("RoleBinding", PICKER)
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "inference"
    assert grants(role["rules"]) == (
        expand("inference.networking.k8s.io", ["inferencepools"], ["get", "list", "watch"])
        | expand("", ["pods"], ["list", "watch"])
        | expand("goodput.dev", ["modelgroups", "slopolicies"], ["get", "list", "watch"])
    )
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": PICKER, "namespace": NAMESPACE}]


def test_the_picker_pod_meets_the_restricted_pod_security_standard(picker: Rendered) -> None:
    pod = picker.one("Deployment", PICKER)["spec"]["template"]["spec"]
    context = pod["containers"][0]["securityContext"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert context["allowPrivilegeEscalation"] is False and context["readOnlyRootFilesystem"] is True


@pytest.mark.parametrize(
    ("case", "values", "named"),
    [
        ("no pool", {"endpointPicker": {"enabled": True}}, "endpointPicker.pool"),
        ("an unknown key", {"endpointPicker": {"enabled": True, "pool": "p", "replicas": 2}}, "replicas"),
        ("a pool name that is no name", {"endpointPicker": {"enabled": True, "pool": "Bad_Name"}}, "pool"),
    ],
)
def test_bad_picker_values_fail_the_render_naming_the_key(
    helm: Path,  # noqa: F811
    tmp_path: Path,
    case: str,
    values: dict[str, object],
    named: str,
) -> None:
    result = helm_template(helm, "-f", values_file(tmp_path, values))
    assert result.returncode != 0 and named in result.stderr, (case, result.stderr)


def test_the_picker_is_scraped_for_the_autoscaler_with_the_pools_namespace(helm: Path) -> None:  # noqa: F811
    scraped = render(helm, "-f", str(PICKER_VALUES), "--set", "prometheus.vllmPodMonitor.enabled=true")
    endpoint = scraped.one("PodMonitor", PICKER)["spec"]["podMetricsEndpoints"][0]
    assert endpoint["port"] == "metrics"
    assert {"action": "replace", "targetLabel": "namespace", "replacement": "inference"} in endpoint[
        "relabelings"
    ]
