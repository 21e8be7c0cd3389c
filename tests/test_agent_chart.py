"""The chart's share of the health agent: the operator learns the agent's image, and the agent's
ServiceAccount may read its pod and patch only pods and their status, in the namespaces listed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from goodput.controllers.groups import agent_sidecar
from goodput.operator.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "goodput"
ALL_FEATURES = CHART / "ci" / "all-features-values.yaml"


@pytest.fixture(scope="module")
def helm() -> Path:
    bin_dir = (
        os.environ.get("GOODPUT_BIN_DIR")
        or subprocess.run(
            [str(ROOT / "tools" / "build-binaries.sh"), "--print-bin-dir"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    path = Path(bin_dir) / "helm"
    if not path.exists():
        pytest.fail(
            "helm is required by the chart tests: build it with tools/build-binaries.sh", pytrace=False
        )
    return path


def template(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [str(helm), "template", "goodput", str(CHART), "--namespace", "goodput-system", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def objects(helm: Path, *args: str) -> list[dict[str, Any]]:
    result = template(helm, *args)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def agent_objects(rendered: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (obj["kind"], obj["metadata"]["namespace"]): obj
        for obj in rendered
        if obj["metadata"]["name"] == agent_sidecar.SERVICE_ACCOUNT
    }


def operator_env(rendered: list[dict[str, Any]]) -> dict[str, str]:
    deployment = next(obj for obj in rendered if obj["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {item["name"]: item["value"] for item in container["env"] if "value" in item}


def test_by_default_there_is_no_agent(helm: Path) -> None:
    rendered = objects(helm)

    assert agent_objects(rendered) == {}
    assert "GOODPUT_AGENT_IMAGE" not in operator_env(rendered)


def test_the_agent_gets_exactly_get_pods_and_patch_pods_and_status_in_each_namespace(helm: Path) -> None:
    rendered = objects(helm, "--set", "watchNamespaces={serving-a,serving-b}", "--set", "agent.enabled=true")
    found = agent_objects(rendered)

    assert set(found) == {
        (kind, namespace)
        for kind in ("ServiceAccount", "Role", "RoleBinding")
        for namespace in ("serving-a", "serving-b")
    }
    for namespace in ("serving-a", "serving-b"):
        grants = {
            (group, resource, verb)
            for rule in found[("Role", namespace)]["rules"]
            for group in rule["apiGroups"]
            for resource in rule["resources"]
            for verb in rule["verbs"]
        }
        assert grants == {("", "pods", "get"), ("", "pods", "patch"), ("", "pods/status", "patch")}
        binding = found[("RoleBinding", namespace)]
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": "goodput-agent",
        }
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "goodput-agent", "namespace": namespace}
        ]
        assert found[("ServiceAccount", namespace)]["automountServiceAccountToken"] is False


def test_the_operator_is_told_the_agents_image_through_a_setting_it_has(helm: Path) -> None:
    env = operator_env(objects(helm, "-f", str(ALL_FEATURES)))

    settings = Settings.from_sources({}, {**env, "POD_ID": "goodput-abc"})  # downward API in a pod

    assert settings.agent_image == "ghcr.io/goodput-dev/goodput-agent:0.1.0"


def test_a_cluster_wide_install_must_name_the_agents_namespaces(helm: Path) -> None:
    result = template(helm, "--set", "agent.enabled=true")

    assert result.returncode != 0
    assert "agent.enabled needs the namespaces that run ModelGroups" in result.stderr


def test_the_listed_agent_namespaces_win_over_the_watched_ones(helm: Path) -> None:
    rendered = objects(
        helm, "--set", "watchNamespaces={a,b}", "--set", "agent.enabled=true", "--set", "agent.namespaces={b}"
    )

    assert {namespace for _, namespace in agent_objects(rendered)} == {"b"}


def test_an_admission_policy_confines_each_agent_to_the_pod_its_token_is_bound_to(helm: Path) -> None:
    rendered = objects(helm, "--set", "watchNamespaces={serving-a,serving-b}", "--set", "agent.enabled=true")
    policy = next(obj for obj in rendered if obj["kind"] == "ValidatingAdmissionPolicy")
    binding = next(obj for obj in rendered if obj["kind"] == "ValidatingAdmissionPolicyBinding")

    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert {
        (resource, operation)
        for rule in policy["spec"]["matchConstraints"]["resourceRules"]
        for resource in rule["resources"]
        for operation in rule["operations"]
    } >= {("pods", "UPDATE"), ("pods/status", "UPDATE")}
    (condition,) = policy["spec"]["matchConditions"]
    assert condition["expression"] == (
        "request.userInfo.username in ['system:serviceaccount:serving-a:goodput-agent',"
        "'system:serviceaccount:serving-b:goodput-agent']"
    )
    (validation,) = policy["spec"]["validations"]
    assert (
        "request.userInfo.extra['authentication.kubernetes.io/pod-name'] == [request.name]"
        in (validation["expression"])
    )


def test_without_the_agent_there_is_no_admission_policy(helm: Path) -> None:
    kinds = {obj["kind"] for obj in objects(helm)}

    assert "ValidatingAdmissionPolicy" not in kinds and "ValidatingAdmissionPolicyBinding" not in kinds
