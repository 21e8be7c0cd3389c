"""The chart's gateway: off by default; on, a Deployment, Service and read-only RBAC for one ModelGroup.

Rendered offline with the helm binary, as tests/test_chart.py does (which it reuses).
"""

from __future__ import annotations

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

GATEWAY_VALUES = CHART / "ci" / "gateway-values.yaml"
GATEWAY = "goodput-gateway"


@pytest.fixture(scope="module")
def gateway(helm: Path) -> Rendered:  # noqa: F811
    return render(helm, "-f", str(GATEWAY_VALUES))


def components(rendered: Rendered) -> set[str]:
    return {
        obj["metadata"].get("labels", {}).get("app.kubernetes.io/component", "") for obj in rendered.objects
    }


def test_the_gateway_is_off_by_default(helm: Path) -> None:  # noqa: F811
    assert "gateway" not in components(render(helm))


def test_the_gateway_lints_clean_in_strict_mode(helm: Path) -> None:  # noqa: F811
    import subprocess

    command = [str(helm), "lint", "--strict", str(CHART), "-f", str(GATEWAY_VALUES)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0 and "[WARNING]" not in result.stdout, result.stdout + result.stderr


def test_the_gateway_serves_its_model_group(gateway: Rendered) -> None:
    deployment = gateway.one("Deployment", GATEWAY)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["goodput"]
    assert container["args"][:3] == ["gateway", "--model-group=llama-8b", "--namespace=inference"]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"http": 8080, "metrics": 9090}
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == GATEWAY


def test_the_service_selects_gateway_pods_only(gateway: Rendered) -> None:
    service = gateway.one("Service", GATEWAY)
    pod_labels = gateway.one("Deployment", GATEWAY)["spec"]["template"]["metadata"]["labels"]
    operator_labels = gateway.one("Deployment", "goodput")["spec"]["template"]["metadata"]["labels"]
    selector = service["spec"]["selector"]
    assert service["spec"]["type"] == "LoadBalancer"
    assert all(pod_labels.get(key) == value for key, value in selector.items())
    assert not all(operator_labels.get(key) == value for key, value in selector.items())
    operator_service = gateway.one("Service", "goodput-metrics")["spec"]["selector"]
    assert not all(pod_labels.get(key) == value for key, value in operator_service.items())


def test_the_gateway_may_only_read_in_the_model_groups_namespace(gateway: Rendered) -> None:
    role = gateway.one("Role", GATEWAY)
    binding = gateway.one("RoleBinding", GATEWAY)
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "inference"
    assert grants(role["rules"]) == expand("", ["pods"], ["list", "watch"]) | expand(
        "goodput.dev", ["modelgroups", "slopolicies"], ["get", "list", "watch"]
    )
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": GATEWAY, "namespace": NAMESPACE}]
    cluster_bound = [b["subjects"] for b in gateway.of_kind("ClusterRoleBinding")]
    assert all(subject["name"] != GATEWAY for subjects in cluster_bound for subject in subjects)


def test_the_gateway_pod_meets_the_restricted_pod_security_standard(gateway: Rendered) -> None:
    pod = gateway.one("Deployment", GATEWAY)["spec"]["template"]["spec"]
    context = pod["containers"][0]["securityContext"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert context["allowPrivilegeEscalation"] is False and context["readOnlyRootFilesystem"] is True
    assert context["capabilities"] == {"drop": ["ALL"]}


def gateway_args(rendered: Rendered) -> list[str]:
    return rendered.one("Deployment", GATEWAY)["spec"]["template"]["spec"]["containers"][0]["args"]


def test_a_gateway_by_selector_serves_what_the_selector_picks_and_may_reach_their_engines(
    helm: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    values = {"gateway": {"enabled": True, "modelGroupSelector": "team=search", "namespace": "inference"}}
    rendered = render(helm, "-f", values_file(tmp_path, values), "--set", "networkPolicy.enabled=true")
    assert gateway_args(rendered)[:3] == ["gateway", "--selector=team=search", "--namespace=inference"]
    policy = rendered.one("NetworkPolicy", GATEWAY)
    engines = [
        peer["podSelector"]
        for rule in policy["spec"]["egress"]
        for peer in rule.get("to", ())
        if "podSelector" in peer
    ]
    assert engines[-1:] == [{"matchExpressions": [{"key": "goodput.dev/model-group", "operator": "Exists"}]}]


def test_a_gateway_with_neither_serves_every_model_group_of_its_namespace(
    helm: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    rendered = render(helm, "-f", values_file(tmp_path, {"gateway": {"enabled": True}}))
    assert gateway_args(rendered)[:2] == ["gateway", f"--namespace={NAMESPACE}"]


def test_a_model_group_and_a_selector_together_fail_the_render(
    helm: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    values = {"gateway": {"enabled": True, "modelGroup": "m", "modelGroupSelector": "team=search"}}
    result = helm_template(helm, "-f", values_file(tmp_path, values))
    assert result.returncode != 0
    assert "gateway.modelGroup and gateway.modelGroupSelector" in result.stderr


def test_the_schema_refuses_an_unknown_gateway_key(helm: Path, tmp_path: Path) -> None:  # noqa: F811
    values = {"gateway": {"enabled": True, "modelGroup": "m", "replicas": 2}}
    result = helm_template(helm, "-f", values_file(tmp_path, values))
    assert result.returncode != 0 and "replicas" in result.stderr


def test_the_gateway_is_scraped_with_the_engines_for_the_autoscaler(helm: Path) -> None:  # noqa: F811
    scraped = render(helm, "-f", str(GATEWAY_VALUES), "--set", "prometheus.vllmPodMonitor.enabled=true")
    monitor = scraped.one("PodMonitor", GATEWAY)
    pod_labels = scraped.one("Deployment", GATEWAY)["spec"]["template"]["metadata"]["labels"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert all(pod_labels.get(key) == value for key, value in selector.items())
    endpoint = monitor["spec"]["podMetricsEndpoints"][0]
    assert endpoint["port"] == "metrics"
    # The operator's query selects the ModelGroup's namespace, wherever the gateway runs.
    assert {"action": "replace", "targetLabel": "namespace", "replacement": "inference"} in endpoint[
        "relabelings"
    ]
    unscraped = render(helm, "-f", str(GATEWAY_VALUES))
    assert not [m for m in unscraped.of_kind("PodMonitor") if m["metadata"]["name"] == GATEWAY]
