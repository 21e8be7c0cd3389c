"""The Helm chart, and the manifests rendered from it, checked offline with the helm binary.

What a platform team relies on: the chart lints strictly; it renders with the defaults and with every
optional feature on; its RBAC grants exactly what the operator uses; the pod meets the restricted Pod
Security Standard; its CRDs are the repository's; typos and wrong types in values are refused with
the key named; the kustomize base, the monitoring manifests and the Argo CD settings are renderings
of the chart, in sync; the alert rules read metrics that exist; the Argo CD health checks return
what their fixtures say. helm and kubectl (for kustomize) come from tools/build-binaries.sh, which
`make unit` runs first, so a missing one fails, never skips; Lua 5.1 (Argo CD's gopher-lua dialect)
and jq run in-process from their PyPI packages (lupa, jq).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import jq
import lupa.lua51
import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from goodput.controllers import naming
from goodput.operator.autoscaler_metrics import AutoscalerMetrics
from goodput.operator.metrics import OperatorMetrics
from goodput.operator.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "goodput"
RELEASE = "goodput"
NAMESPACE = "goodput-system"
ALL_FEATURES = CHART / "ci" / "all-features-values.yaml"
NAMESPACED = CHART / "ci" / "namespaced-values.yaml"
ARGOCD = ROOT / "manifests" / "argocd"


# --- tools -----------------------------------------------------------------------------------------


def _bin_dir() -> Path:
    override = os.environ.get("GOODPUT_BIN_DIR")
    if override:
        return Path(override)
    script = ROOT / "tools" / "build-binaries.sh"
    return Path(
        subprocess.run(
            [str(script), "--print-bin-dir"], check=True, capture_output=True, text=True
        ).stdout.strip()
    )


def _tool(path: Path | None, name: str, how: str) -> Path:
    if path is None or not os.access(path, os.X_OK):
        pytest.fail(f"{name} is required by the chart tests and was not found: {how}", pytrace=False)
    return path


@pytest.fixture(scope="module")
def helm() -> Path:
    return _tool(_bin_dir() / "helm", "helm", "build it with tools/build-binaries.sh")


@pytest.fixture(scope="module")
def kubectl() -> Path:
    return _tool(_bin_dir() / "kubectl", "kubectl", "build it with tools/build-binaries.sh")


def _which(name: str) -> Path | None:
    found = shutil.which(name)
    return Path(found) if found else None


@dataclass(frozen=True, slots=True)
class Rendered:
    """The objects of one `helm template` run."""

    objects: tuple[dict[str, Any], ...]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [obj for obj in self.objects if obj["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        found = [obj for obj in self.of_kind(kind) if name is None or obj["metadata"]["name"] == name]
        assert len(found) == 1, (
            f"expected one {kind} {name or ''}, found {[o['metadata']['name'] for o in found]}"
        )
        return found[0]

    @property
    def kinds(self) -> list[str]:
        return sorted(obj["kind"] for obj in self.objects)


def helm_template(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [str(helm), "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def render(helm: Path, *args: str) -> Rendered:
    result = helm_template(helm, *args)
    assert result.returncode == 0, f"helm template {' '.join(args)} failed:\n{result.stderr}"
    return Rendered(tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc))


def values_file(tmp_path: Path, values: Mapping[str, Any]) -> str:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(dict(values)))
    return str(path)


@pytest.fixture(scope="module")
def defaults(helm: Path) -> Rendered:
    return render(helm)


@pytest.fixture(scope="module")
def all_features(helm: Path) -> Rendered:
    return render(helm, "-f", str(ALL_FEATURES))


@pytest.fixture(scope="module")
def namespaced(helm: Path) -> Rendered:
    return render(helm, "-f", str(NAMESPACED))


def operator_container(rendered: Rendered) -> dict[str, Any]:
    containers = rendered.one("Deployment")["spec"]["template"]["spec"]["containers"]
    return next(container for container in containers if container["name"] == "operator")


def env_of(container: Mapping[str, Any]) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container.get("env", []) if "value" in item}


# --- lint and render -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values", [None, ALL_FEATURES, NAMESPACED], ids=["defaults", "all-features", "namespaced"]
)
def test_chart_lints_clean_in_strict_mode(helm: Path, values: Path | None) -> None:
    command = [str(helm), "lint", "--strict", str(CHART), *(["-f", str(values)] if values else [])]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout, result.stdout


def test_make_chart_packages_a_versioned_archive_that_renders_as_the_folder(
    helm: Path, tmp_path: Path
) -> None:
    command = ["make", "--no-print-directory", "-s", "chart-package", f"HELM={helm}", f"CHART_OUT={tmp_path}"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    package = tmp_path / f"goodput-{version}.tgz"

    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == str(package)
    with tarfile.open(package) as archive:
        names = set(archive.getnames())
        chart_file = archive.extractfile("goodput/Chart.yaml")
        assert chart_file is not None
        packaged = yaml.safe_load(chart_file.read())
    assert packaged["version"] == version
    assert {"goodput/values.yaml", "goodput/values.schema.json", "goodput/README.md"} <= names
    assert {name for name in names if name.startswith("goodput/crds/")}, "the peering CRDs travel with it"
    assert not {name for name in names if name.startswith("goodput/ci/")}, "test values stay out"
    from_package = subprocess.run(
        [str(helm), "template", RELEASE, str(package), "--namespace", NAMESPACE],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    assert from_package == helm_template(helm).stdout


def test_defaults_install_the_operator_cluster_wide_without_monitoring(defaults: Rendered) -> None:
    assert defaults.kinds == sorted(
        [
            "ServiceAccount",
            "CustomResourceDefinition",
            "CustomResourceDefinition",
            "ClusterRole",  # framework
            "ClusterRole",  # controller
            "ClusterRole",  # nodes
            "ClusterRole",  # edit (aggregated)
            "ClusterRole",  # view (aggregated)
            "ClusterRoleBinding",
            "ClusterRoleBinding",
            "ClusterRoleBinding",
            "Role",  # leader election
            "RoleBinding",
            "Service",
            "Deployment",
            "PodDisruptionBudget",
            "NetworkPolicy",
        ]
    )


def test_every_optional_feature_renders(all_features: Rendered) -> None:
    for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule", "PodDisruptionBudget"):
        assert all_features.of_kind(kind), f"{kind} missing with every feature on"
    pod = all_features.one("Deployment")["spec"]["template"]["spec"]
    container = operator_container(all_features)
    assert all_features.one("Deployment")["spec"]["replicas"] == 2
    assert container["image"] == "ghcr.io/goodput-dev/goodput@sha256:" + "0" * 64
    assert pod["imagePullSecrets"] == [{"name": "registry-credentials"}]
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["tolerations"][0]["key"] == "node-role.kubernetes.io/control-plane"
    assert "nodeAffinity" in pod["affinity"]
    assert {"name": "GOODPUT_KUBE_TIMEOUT_SECONDS", "value": "20"} in container["env"]
    assert all_features.one("Deployment")["spec"]["template"]["metadata"]["labels"]["example.com/tier"] == (
        "control-plane"
    )


def test_the_operator_reaches_an_authenticated_prometheus_through_settings(
    defaults: Rendered, all_features: Rendered
) -> None:
    default = Settings.from_sources({}, env_of(operator_container(defaults)))
    assert default.prometheus_url == "http://prometheus-operated.monitoring.svc:9090"
    assert (default.prometheus_bearer_token_file, default.prometheus_ca_file, default.prometheus_headers) == (
        "",
        "",
        "",
    )
    container = operator_container(all_features)
    # Two replicas: each derives its peering priority from its pod name.
    configured = Settings.from_sources({}, {**env_of(container), "POD_ID": "goodput-7d9f-x2"})
    assert configured.prometheus_url == "https://thanos-querier.openshift-monitoring.svc:9091"
    assert configured.prometheus_bearer_token_file == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert configured.prometheus_ca_file == "/etc/prometheus-ca/service-ca.crt"
    assert json.loads(configured.prometheus_headers) == {"X-Scope-OrgID": "ml-platform"}
    # The CA bundle's volume is mounted where caFile points.
    assert {"name": "prometheus-ca", "mountPath": "/etc/prometheus-ca", "readOnly": True} in container[
        "volumeMounts"
    ]
    pod = all_features.one("Deployment")["spec"]["template"]["spec"]
    assert {"name": "prometheus-ca", "configMap": {"name": "prometheus-ca"}} in pod["volumes"]


@pytest.mark.parametrize(
    ("repository", "registry", "expected"),
    [
        (
            "ghcr.io/goodput-dev/goodput",
            "mirror.example.com:5000",
            "mirror.example.com:5000/goodput-dev/goodput",
        ),
        ("goodput-dev/goodput", "mirror.example.com", "mirror.example.com/goodput-dev/goodput"),
        ("localhost/goodput", "mirror.example.com/", "mirror.example.com/goodput"),
        ("ghcr.io/goodput-dev/goodput", "", "ghcr.io/goodput-dev/goodput"),
    ],
    ids=["registry with port replaced", "no registry: prefixed", "localhost replaced", "no global registry"],
)
def test_a_parent_charts_global_registry_and_pull_secrets_apply(
    helm: Path, tmp_path: Path, repository: str, registry: str, expected: str
) -> None:
    values = {
        "image": {"repository": repository, "tag": "1.2.3"},
        "imagePullSecrets": ["own", "shared"],
        # A parent chart's other globals pass through the schema.
        "global": {"imageRegistry": registry, "imagePullSecrets": ["shared", "parent"], "storageClass": "x"},
    }
    rendered = render(helm, "-f", values_file(tmp_path, values))
    pod = rendered.one("Deployment")["spec"]["template"]["spec"]
    assert operator_container(rendered)["image"] == f"{expected}:1.2.3"
    assert pod["imagePullSecrets"] == [{"name": "own"}, {"name": "shared"}, {"name": "parent"}]


def test_the_chart_works_as_a_subchart(helm: Path, tmp_path: Path) -> None:
    parent = tmp_path / "platform"
    (parent / "charts").mkdir(parents=True)
    shutil.copytree(CHART, parent / "charts" / "goodput")
    (parent / "Chart.yaml").write_text(
        "apiVersion: v2\nname: platform\nversion: 1.0.0\n"
        "dependencies:\n  - name: goodput\n    version: 0.1.0\n"
    )
    (parent / "values.yaml").write_text(
        "global:\n  imageRegistry: mirror.example.com\n  storageClass: fast\n"
        "goodput:\n  watchNamespaces: [serving]\n"
    )
    command = [str(helm), "template", "platform", str(parent), "--namespace", NAMESPACE]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    objects = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    (deployment,) = [obj for obj in objects if obj["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "mirror.example.com/goodput-dev/goodput:0.1.0"


def test_every_object_carries_the_recommended_labels_and_namespaced_ones_the_release_namespace(
    all_features: Rendered, namespaced: Rendered
) -> None:
    cluster_scoped = {"CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "ClusterKopfPeering"}
    for rendered in (all_features, namespaced):
        for obj in rendered.objects:
            labels = obj["metadata"]["labels"]
            for key in ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version"):
                assert key in labels, f"{obj['kind']}/{obj['metadata']['name']} lacks {key}"
            assert labels["app.kubernetes.io/managed-by"] == "Helm"
            assert labels["helm.sh/chart"] == "goodput-0.1.0"
            if obj["kind"] in cluster_scoped:
                assert "namespace" not in obj["metadata"]
            elif obj["kind"] not in {"Role", "RoleBinding", "KopfPeering"} and not _is_agents(obj):
                assert obj["metadata"]["namespace"] == NAMESPACE


def _is_agents(obj: Mapping[str, Any]) -> bool:
    """The health agent's ServiceAccount lives where its pods run, beside the ModelGroups."""
    return obj["metadata"]["labels"].get("app.kubernetes.io/component") == "agent"


@dataclass(frozen=True, slots=True)
class RefusedCombination:
    name: str
    values: dict[str, Any]
    message: str


REFUSED_COMBINATIONS = [
    RefusedCombination(
        "both operator monitors",
        {"prometheus": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}}},
        "enable one of them, not both",
    ),
    RefusedCombination(
        "replicas without leader election",
        {"replicaCount": 2, "leaderElection": {"enabled": False}},
        "replicaCount > 1 needs leaderElection.enabled",
    ),
    RefusedCombination(
        "leader election and kopf peering at once",
        {"peering": {"enabled": True}},
        "enable one of them, not both",
    ),
    RefusedCombination(
        "a lease no longer than the renew deadline",
        {"leaderElection": {"leaseDurationSeconds": 10, "renewDeadlineSeconds": 10}},
        "leaseDurationSeconds must exceed leaderElection.renewDeadlineSeconds",
    ),
    RefusedCombination(
        "a namespace watched twice", {"watchNamespaces": ["a", "b", "a"]}, "lists a namespace more than once"
    ),
    RefusedCombination(
        "an existing service account without a name",
        {"serviceAccount": {"create": False}},
        "serviceAccount.name is required",
    ),
]


@pytest.mark.parametrize("case", REFUSED_COMBINATIONS, ids=[case.name for case in REFUSED_COMBINATIONS])
def test_value_combinations_that_cannot_work_fail_the_render(
    helm: Path, tmp_path: Path, case: RefusedCombination
) -> None:
    result = helm_template(helm, "-f", values_file(tmp_path, case.values))

    assert result.returncode != 0
    assert case.message in result.stderr


# --- RBAC ------------------------------------------------------------------------------------------

Grant = tuple[str, str, str, str]  # (apiGroup, resource, verb, resourceName or "")


def grants(rules: Sequence[Mapping[str, Any]]) -> set[Grant]:
    """Each rule expanded to single (group, resource, verb, name) grants, so sets compare exactly."""
    return {
        (group, resource, verb, name)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
        for name in (rule.get("resourceNames") or [""])
    }


def expand(group: str, resources: Sequence[str], verbs: Sequence[str], name: str = "") -> set[Grant]:
    return {(group, resource, verb, name) for resource in resources for verb in verbs}


def framework_grants(peering: str | None = None) -> set[Grant]:
    """Events; with kopf peering instead of leader election, its peering object too."""
    events = expand("", ["events"], ["create"])
    if peering is None:
        return events
    return (
        events
        | expand("kopf.dev", [peering], ["list", "watch"])
        | expand("kopf.dev", [peering], ["get", "patch"], name="goodput")
    )


# The Lease, in the release's namespace only: created once, then read and renewed by name.
LEADER_ELECTION_GRANTS = expand("coordination.k8s.io", ["leases"], ["create"]) | expand(
    "coordination.k8s.io", ["leases"], ["get", "update"], name="goodput"
)


CONTROLLER_GRANTS = (
    expand("goodput.dev", ["modelgroups", "slopolicies"], ["get", "list", "watch", "patch"])
    | expand("goodput.dev", ["modelgroups/status", "slopolicies/status"], ["patch"])
    | expand("goodput.dev", ["modelgroups/scale"], ["get", "patch", "update"])
    | expand("goodput.dev", ["modelgroups/finalizers"], ["update"])
    | expand("", ["pods"], ["list", "watch", "create", "patch", "delete"])
    | expand("", ["pods/status"], ["patch"])
    | expand("", ["services"], ["create", "delete"])
    | expand("discovery.k8s.io", ["endpointslices"], ["get", "list", "watch"])
    | expand("resource.k8s.io", ["resourceclaimtemplates"], ["create"])
    | expand("resource.k8s.io", ["resourceclaims"], ["list", "watch"])
    | expand("", ["configmaps"], ["get"])
)
NODE_GRANTS = expand("", ["nodes"], ["get", "list", "watch"]) | expand(
    "resource.k8s.io", ["resourceslices", "deviceclasses"], ["get", "list", "watch"]
)


def test_cluster_wide_rbac_grants_exactly_what_the_operator_uses(defaults: Rendered) -> None:
    roles = {role["metadata"]["name"]: grants(role["rules"]) for role in defaults.of_kind("ClusterRole")}

    assert roles["goodput-framework"] == framework_grants()
    assert roles["goodput-controller"] == CONTROLLER_GRANTS
    assert roles["goodput-nodes"] == NODE_GRANTS
    lease_role = defaults.one("Role", "goodput-leader-election")
    assert lease_role["metadata"]["namespace"] == NAMESPACE
    assert grants(lease_role["rules"]) == LEADER_ELECTION_GRANTS


def test_namespaced_rbac_grants_per_namespace_and_reads_only_nodes_cluster_wide(namespaced: Rendered) -> None:
    roles = {
        (r["metadata"]["namespace"], r["metadata"]["name"]): grants(r["rules"])
        for r in namespaced.of_kind("Role")
    }
    cluster_roles = {r["metadata"]["name"]: grants(r["rules"]) for r in namespaced.of_kind("ClusterRole")}

    assert roles == {
        ("serving-a", "goodput-framework"): framework_grants(),
        ("serving-a", "goodput-controller"): CONTROLLER_GRANTS,
        ("serving-b", "goodput-framework"): framework_grants(),
        ("serving-b", "goodput-controller"): CONTROLLER_GRANTS,
        (NAMESPACE, "goodput-leader-election"): LEADER_ELECTION_GRANTS,
    }
    assert set(cluster_roles) == {"goodput-nodes", "goodput-edit", "goodput-view"}
    assert cluster_roles["goodput-nodes"] == NODE_GRANTS
    assert [b["metadata"]["name"] for b in namespaced.of_kind("ClusterRoleBinding")] == ["goodput-nodes"]
    assert not namespaced.of_kind("KopfPeering")


def test_every_binding_binds_the_operator_service_account_to_its_own_role(
    defaults: Rendered, namespaced: Rendered
) -> None:
    for rendered in (defaults, namespaced):
        roles = {(r["kind"], r["metadata"].get("namespace"), r["metadata"]["name"]) for r in rendered.objects}
        for binding in rendered.of_kind("ClusterRoleBinding") + rendered.of_kind("RoleBinding"):
            assert binding["subjects"] == [
                {"kind": "ServiceAccount", "name": "goodput", "namespace": NAMESPACE}
            ]
            ref = binding["roleRef"]
            namespace = binding["metadata"].get("namespace") if ref["kind"] == "Role" else None
            assert (ref["kind"], namespace, ref["name"]) in roles, (
                f"{binding['metadata']['name']} binds a missing role"
            )


def test_no_role_uses_a_wildcard(all_features: Rendered, namespaced: Rendered) -> None:
    for rendered in (all_features, namespaced):
        for role in rendered.of_kind("ClusterRole") + rendered.of_kind("Role"):
            for grant in grants(role["rules"]):
                assert "*" not in grant, f"{role['metadata']['name']} grants {grant}"


def test_with_leader_election_the_operator_competes_for_a_lease_in_its_own_namespace(
    defaults: Rendered,
) -> None:
    container = operator_container(defaults)
    env = env_of(container)
    assert (env["GOODPUT_LEADER_ELECTION"], env["GOODPUT_LEADER_ELECTION_NAME"]) == ("true", "goodput")
    assert (env["GOODPUT_LEASE_DURATION_SECONDS"], env["GOODPUT_RENEW_DEADLINE_SECONDS"]) == ("15", "10")
    assert env["GOODPUT_RETRY_PERIOD_SECONDS"] == "2"
    namespace = next(i for i in container["env"] if i["name"] == "GOODPUT_LEADER_ELECTION_NAMESPACE")
    assert namespace["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    # The Lease replaces kopf's peering: no peering object, no access to one.
    assert env["GOODPUT_STANDALONE"] == "true" and "GOODPUT_PEERING_NAME" not in env
    assert not defaults.of_kind("ClusterKopfPeering")
    budget = defaults.one("PodDisruptionBudget")
    assert budget["spec"]["minAvailable"] == 1


def test_one_replica_needs_no_disruption_budget_and_never_overlaps(helm: Path) -> None:
    rendered = render(helm, "--set", "replicaCount=1")
    assert not rendered.of_kind("PodDisruptionBudget"), "it would block every node drain"
    assert rendered.one("Deployment")["spec"]["strategy"]["type"] == "Recreate"


def test_kopf_peering_instead_of_leader_election_gets_peering_access_and_no_lease(helm: Path) -> None:
    rendered = render(helm, "--set", "peering.enabled=true", "--set", "leaderElection.enabled=false")

    framework = rendered.one("ClusterRole", "goodput-framework")
    assert grants(framework["rules"]) == framework_grants("clusterkopfpeerings")
    assert rendered.of_kind("ClusterKopfPeering")
    assert not rendered.of_kind("Role")
    env = env_of(operator_container(rendered))
    assert (env["GOODPUT_STANDALONE"], env["GOODPUT_PRIORITY"]) == ("false", "auto")
    assert "GOODPUT_LEADER_ELECTION" not in env


def test_rbac_and_service_account_can_be_left_to_the_platform(helm: Path) -> None:
    rendered = render(
        helm,
        "--set",
        "rbac.create=false",
        "--set",
        "serviceAccount.create=false",
        "--set",
        "serviceAccount.name=ops",
    )

    for kind in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount"):
        assert not rendered.of_kind(kind)
    assert rendered.one("Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "ops"


def test_default_roles_are_extended_so_namespace_users_can_manage_goodput_objects(defaults: Rendered) -> None:
    edit = defaults.one("ClusterRole", "goodput-edit")
    view = defaults.one("ClusterRole", "goodput-view")

    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert ("goodput.dev", "modelgroups", "create", "") in grants(edit["rules"])
    assert {verb for (_, _, verb, _) in grants(view["rules"])} == {"get", "list", "watch"}
    assert not any(resource.endswith("/status") for (_, resource, _, _) in grants(edit["rules"])), (
        "status is the operator's to write"
    )


# --- the pod ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("values", [None, ALL_FEATURES], ids=["defaults", "all-features"])
def test_the_operator_pod_meets_the_restricted_pod_security_standard(helm: Path, values: Path | None) -> None:
    rendered = render(helm, *(["-f", str(values)] if values else []))
    pod = rendered.one("Deployment")["spec"]["template"]["spec"]
    container = operator_container(rendered)
    context = container["securityContext"]

    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["readOnlyRootFilesystem"] is True
    assert context.get("privileged") is not True
    for forbidden in ("hostNetwork", "hostPID", "hostIPC"):
        assert not pod.get(forbidden)
    assert all("hostPath" not in volume for volume in pod["volumes"])
    writable = {mount["mountPath"] for mount in container["volumeMounts"] if not mount.get("readOnly")}
    assert writable == {"/tmp"}, "the only writable path"


def test_liveness_probe_and_metrics_ports_are_the_ones_the_operator_serves(defaults: Rendered) -> None:
    container = operator_container(defaults)
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    env = env_of(container)
    service = defaults.one("Service")

    probe = container["livenessProbe"]
    assert probe["httpGet"] == {"path": "/healthz", "port": "healthz"}
    assert env["GOODPUT_LIVENESS_ENDPOINT"] == f"http://0.0.0.0:{ports['healthz']}/healthz"
    assert (probe["initialDelaySeconds"], probe["periodSeconds"], probe["timeoutSeconds"]) == (10, 10, 15)
    assert probe["failureThreshold"] == 8
    assert "readinessProbe" not in container, "an operator serves no traffic"
    assert env["GOODPUT_METRICS_ADDRESS"] == "0.0.0.0"
    assert int(env["GOODPUT_METRICS_PORT"]) == ports["metrics"]
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": ports["metrics"], "targetPort": "metrics", "protocol": "TCP"}
    ]
    assert (
        service["spec"]["selector"].items()
        <= defaults.one("Deployment")["spec"]["template"]["metadata"]["labels"].items()
    )
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]


def test_the_deployment_configures_goodput_run_through_settings_it_has(
    defaults: Rendered, namespaced: Rendered
) -> None:
    """Every GOODPUT_* variable is a field of the operator's Settings, and parses to what was meant."""
    fields = {f"GOODPUT_{name.upper()}" for name in Settings.__dataclass_fields__}
    for rendered in (defaults, namespaced):
        env = env_of(operator_container(rendered))
        unknown = {name for name in env if name.startswith("GOODPUT_")} - fields
        assert not unknown, f"the operator has no setting for {unknown}"

    cluster_wide = Settings.from_sources({}, env_of(operator_container(defaults)))
    assert cluster_wide.namespaces == ()
    assert (cluster_wide.standalone, cluster_wide.leader_election) == (True, True)
    assert cluster_wide.election_timing().takeover_bound_seconds == pytest.approx(19.8)
    assert cluster_wide.log_format == "json"
    assert cluster_wide.liveness_endpoint == "http://0.0.0.0:8080/healthz"
    assert (cluster_wide.metrics_address, cluster_wide.metrics_port) == ("0.0.0.0", 8082)
    assert Settings.from_sources({}, env_of(operator_container(namespaced))).namespaces == (
        "serving-a",
        "serving-b",
    )
    assert operator_container(defaults)["command"] == ["goodput"]
    assert operator_container(defaults)["args"] == ["run"]


@pytest.mark.parametrize(
    ("replicas", "strategy"),
    [(1, "Recreate"), (3, "RollingUpdate")],
    ids=["one replica never overlaps", "replicas replaced one at a time"],
)
def test_replicas_and_their_update_strategy(helm: Path, replicas: int, strategy: str) -> None:
    rendered = render(helm, "--set", f"replicaCount={replicas}")
    deployment = rendered.one("Deployment")

    assert deployment["spec"]["replicas"] == replicas
    assert deployment["spec"]["strategy"]["type"] == strategy
    identity = next(item for item in operator_container(rendered)["env"] if item["name"] == "POD_ID")
    assert identity["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}, "its name in the Lease"
    spread = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert spread == [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": deployment["spec"]["selector"]["matchLabels"]},
        }
    ]


# --- CRDs ------------------------------------------------------------------------------------------


def _without_chart_metadata(crd: Mapping[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(json.dumps(crd))
    result["metadata"].pop("labels", None)
    result["metadata"].pop("annotations", None)
    return result


def test_the_chart_installs_exactly_the_repository_crds_and_keeps_them_on_uninstall(
    defaults: Rendered,
) -> None:
    repository = {
        doc["metadata"]["name"]: doc
        for path in sorted((ROOT / "crds").glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    }
    chart = {crd["metadata"]["name"]: crd for crd in defaults.of_kind("CustomResourceDefinition")}

    assert set(chart) == set(repository) == {"modelgroups.goodput.dev", "slopolicies.goodput.dev"}
    for name, crd in chart.items():
        assert _without_chart_metadata(crd) == repository[name], f"{name} differs from crds/"
        assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    for path in (ROOT / "crds").glob("*.yaml"):
        copy = CHART / "files" / "crds" / path.name
        assert copy.is_file() and copy.read_text() == path.read_text(), (
            f"{copy} is stale: run manifests/render.py"
        )


@pytest.mark.parametrize(
    ("flags", "names", "kept"),
    [
        (["--set", "crds.install=false"], set(), False),
        (["--set", "crds.keep=false"], {"modelgroups.goodput.dev", "slopolicies.goodput.dev"}, False),
    ],
    ids=["applied separately", "deleted on uninstall"],
)
def test_crd_installation_is_the_platform_teams_choice(
    helm: Path, flags: list[str], names: set[str], kept: bool
) -> None:
    crds = render(helm, *flags).of_kind("CustomResourceDefinition")

    assert {crd["metadata"]["name"] for crd in crds} == names
    assert all(("helm.sh/resource-policy" in crd["metadata"].get("annotations", {})) == kept for crd in crds)


def test_the_peering_crds_are_the_ones_kopf_looks_for(helm: Path) -> None:
    from kopf._cogs.structs import references

    crds = [
        crd
        for crd in render(helm, "--include-crds").of_kind("CustomResourceDefinition")
        if "kopf" in crd["metadata"]["name"]
    ]
    served = {
        (crd["spec"]["group"], version["name"], crd["spec"]["names"]["plural"], crd["spec"]["scope"])
        for crd in crds
        for version in crd["spec"]["versions"]
    }

    cluster, namespaced = references.CLUSTER_PEERINGS_K, references.NAMESPACED_PEERINGS_K
    assert served == {
        (cluster.group, cluster.version, cluster.any_name, "Cluster"),
        (namespaced.group, namespaced.version, namespaced.any_name, "Namespaced"),
    }


# --- values schema ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BadValues:
    name: str
    values: dict[str, Any]
    named: str  # what the error message must name


BAD_VALUES = [
    BadValues("misspelt top-level key", {"replicaCont": 2}, "'replicaCont' not allowed"),
    BadValues("misspelt nested key", {"image": {"tagg": "1.0"}}, "at '/image': additional properties 'tagg'"),
    BadValues(
        "misspelt deep key",
        {"prometheus": {"rules": {"attainmentTarge": 0.9}}},
        "at '/prometheus/rules': additional properties 'attainmentTarge'",
    ),
    BadValues(
        "unknown security context field",
        {"containerSecurityContext": {"readOnlyRootFS": True}},
        "'readOnlyRootFS' not allowed",
    ),
    BadValues("replicas as a word", {"replicaCount": "two"}, "at '/replicaCount': got string, want integer"),
    BadValues("no replicas", {"replicaCount": 0}, "at '/replicaCount'"),
    BadValues(
        "one namespace as a string",
        {"watchNamespaces": "serving"},
        "at '/watchNamespaces': got string, want array",
    ),
    BadValues(
        "boolean as a word",
        {"peering": {"enabled": "yes"}},
        "at '/peering/enabled': got string, want boolean",
    ),
    BadValues("a label that is not a string", {"podLabels": {"tier": 1}}, "at '/podLabels/tier'"),
    BadValues(
        "a latency off the histogram buckets",
        {"prometheus": {"rules": {"ttftSeconds": 2}}},
        "at '/prometheus/rules/ttftSeconds'",
    ),
    BadValues(
        "attainment as a percentage",
        {"prometheus": {"rules": {"attainmentTarget": 99}}},
        "at '/prometheus/rules/attainmentTarget'",
    ),
    BadValues(
        "a scrape interval without unit",
        {"prometheus": {"serviceMonitor": {"interval": "30"}}},
        "at '/prometheus/serviceMonitor/interval'",
    ),
    BadValues("an unknown log format", {"logging": {"format": "yaml"}}, "at '/logging/format'"),
]


@pytest.mark.parametrize("case", BAD_VALUES, ids=[case.name for case in BAD_VALUES])
def test_the_schema_refuses_bad_values_naming_the_key(helm: Path, tmp_path: Path, case: BadValues) -> None:
    result = helm_template(helm, "-f", values_file(tmp_path, case.values))

    assert result.returncode != 0, f"{case.values} was accepted"
    assert case.named in result.stderr


def _schema_objects(node: Any, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        if node.get("type") == "object":
            yield path, node
        for key, value in node.items():
            yield from _schema_objects(value, f"{path}/{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _schema_objects(value, f"{path}/{index}")


# Sub-objects handed to Kubernetes as they are (the API server validates them): affinity terms,
# env valueFrom, SELinux and AppArmor options. Everything else is closed.
PASSTHROUGH_DEFINITION = "/$defs/kubernetesObject"
# `global` is shared by a parent chart with all its subcharts: its other keys must pass.
PARENTS_GLOBALS = "/properties/global"
MAPS = {"/$defs/stringMap", "/$defs/quantityMap"}


def test_every_object_in_the_schema_is_closed_or_a_typed_map() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())

    for path, node in _schema_objects(schema, ""):
        if path in (PASSTHROUGH_DEFINITION, PARENTS_GLOBALS):
            continue
        additional = node.get("additionalProperties")
        if path in MAPS:
            assert isinstance(additional, dict) and "type" in additional, f"{path} must type its values"
        else:
            assert additional is False, f"{path} accepts unknown keys"


def undocumented_values(text: str) -> list[str]:
    """Keys of a values file without a comment that starts with their dotted path.

    A section (a key whose value is a mapping) may go without one when each of its keys has its own;
    a documented key's sub-keys (a security context passed to Kubernetes) need none.
    """
    lines = text.splitlines()
    missing: list[str] = []
    parents: list[tuple[int, str, bool]] = []  # (indent, path, documented)
    for number, line in enumerate(lines):
        match = re.match(r"^( *)([A-Za-z][A-Za-z0-9]*):", line)
        if not match:
            continue
        indent = len(match.group(1))
        while parents and parents[-1][0] >= indent:
            parents.pop()
        if parents and parents[-1][2]:
            continue  # inside a documented key: its body is described there
        path = f"{parents[-1][1]}.{match.group(2)}" if parents else match.group(2)
        comments = []
        above = number - 1
        while above >= 0 and lines[above].strip().startswith("#"):
            comments.insert(0, lines[above].strip())
            above -= 1
        documented = bool(comments) and comments[0].startswith(f"# {path} ")
        is_section = (
            line.rstrip().endswith(":")
            and number + 1 < len(lines)
            and not lines[number + 1].lstrip().startswith("-")
        )
        if not documented and not is_section:
            missing.append(path)
        parents.append((indent, path, documented))
    return missing


def test_every_value_is_documented_by_a_comment_naming_it() -> None:
    assert undocumented_values((CHART / "values.yaml").read_text()) == []


def test_the_documentation_check_finds_an_undocumented_value() -> None:
    text = "# a.b is documented.\na:\n  # a.b is documented.\n  b: 1\n  c: 2\n# d is a section\nd:\n  e: 3\n"

    assert undocumented_values(text) == ["a.c"]


# --- renderings of the chart: kustomize base, monitoring, Argo CD settings ----------------------------


def load_render_tool() -> ModuleType:
    """manifests/render.py, the script that writes the renderings, imported to compare its outputs."""
    name = "goodput_manifests_render"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "manifests" / "render.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def test_every_rendered_manifest_is_in_sync_with_the_chart(
    helm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HELM", str(helm))
    tool = load_render_tool()
    outputs = tool.all_outputs(helm)

    stale = [str(path.relative_to(ROOT)) for path in tool.stale(outputs)]
    extra = [str(path.relative_to(ROOT)) for path in tool.orphans(outputs)]
    assert not stale and not extra, f"stale {stale}, not from the chart {extra}: run manifests/render.py"


def _identity(obj: Mapping[str, Any]) -> tuple[str, str, str]:
    return obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


def kustomize(kubectl: Path, directory: Path) -> list[dict[str, Any]]:
    result = subprocess.run(
        [str(kubectl), "kustomize", str(directory)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    return sorted((doc for doc in yaml.safe_load_all(result.stdout) if doc), key=_identity)


def test_the_kustomize_base_builds_to_the_charts_default_install(helm: Path, kubectl: Path) -> None:
    tool = load_render_tool()
    chart = render(helm, "--include-crds")
    expected = sorted(
        [tool.namespace_object(), *(tool.as_kustomize(obj) for obj in chart.objects)], key=_identity
    )

    built = kustomize(kubectl, ROOT / "manifests" / "base")

    assert [_identity(obj) for obj in built] == [_identity(obj) for obj in expected]
    assert built == expected
    # The peering CRDs come from the chart's crds/ directory, which Helm never templates or labels.
    labels = [
        obj["metadata"]["labels"]
        for obj in built
        if "labels" in obj["metadata"] and obj["kind"] != "Namespace"
    ]
    assert all(
        label["app.kubernetes.io/managed-by"] == "kustomize" and "helm.sh/chart" not in label
        for label in labels
    )
    namespace = next(obj for obj in built if obj["kind"] == "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_the_observability_manifests_are_the_charts_monitoring_objects(helm: Path, kubectl: Path) -> None:
    tool = load_render_tool()
    flags = [flag for value in tool.OBSERVABILITY_VALUES for flag in ("--set", value)]
    chart = render(helm, *flags)
    expected = sorted(
        (
            tool.as_kustomize(obj)
            for obj in chart.objects
            if obj["kind"] in {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
        ),
        key=_identity,
    )

    assert kustomize(kubectl, ROOT / "manifests" / "observability") == expected
    plain = yaml.safe_load((ROOT / "manifests" / "observability" / "prometheus-rules.yaml").read_text())
    assert plain == chart.one("PrometheusRule")["spec"]


# --- monitoring objects and alert rules ----------------------------------------------------------------


def _prometheus_label(pod_label: str) -> str:
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", pod_label)


def test_the_vllm_pod_monitor_scrapes_leaders_with_the_labels_the_autoscaler_queries(
    all_features: Rendered, namespaced: Rendered
) -> None:
    monitor = all_features.one("PodMonitor", "goodput-vllm")
    endpoint = monitor["spec"]["podMetricsEndpoints"][0]

    assert monitor["spec"]["selector"] == {"matchLabels": {naming.LABEL_METRICS: "true"}}
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    assert (endpoint["port"], endpoint["path"]) == ("http", "/metrics")
    assert {(r["sourceLabels"][0], r["targetLabel"]) for r in endpoint["relabelings"]} == {
        (_prometheus_label(naming.LABEL_MODEL_GROUP), "model_group"),
        (_prometheus_label(naming.LABEL_GROUP), "group"),
        (_prometheus_label(naming.LABEL_RANK), "rank"),
    }
    limited = namespaced.one("PodMonitor", "goodput-vllm")
    assert limited["spec"]["namespaceSelector"] == {"matchNames": ["serving-a", "serving-b"]}


def test_the_operator_monitors_select_the_operator_and_name_its_job(
    all_features: Rendered, namespaced: Rendered
) -> None:
    service = all_features.one("Service")
    service_monitor = all_features.one("ServiceMonitor")
    pod_monitor = namespaced.one("PodMonitor", "goodput")
    pod_labels = namespaced.one("Deployment")["spec"]["template"]["metadata"]["labels"]

    assert service_monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert pod_monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    for endpoint in (service_monitor["spec"]["endpoints"][0], pod_monitor["spec"]["podMetricsEndpoints"][0]):
        assert endpoint["port"] == "metrics"
        assert endpoint["honorLabels"] is True, "the operator's namespace label names a ModelGroup"
        assert {"action": "replace", "targetLabel": "job", "replacement": "goodput"} in endpoint[
            "relabelings"
        ]


# vLLM 0.33 metric names the rules read, written from the reference contract (vllm-contract.md
# §1.2), with the series a classic histogram exposes.
VLLM_HISTOGRAMS = {"vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds"}
VLLM_SERIES = {
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:num_preemptions_total",
    "vllm:generation_tokens_total",
    *(f"{name}{suffix}" for name in VLLM_HISTOGRAMS for suffix in ("_bucket", "_count", "_sum")),
}


def operator_series() -> set[str]:
    """Every series name the operator's metrics registry exposes."""
    metrics = OperatorMetrics()
    metrics.reconciles.labels("modelgroup", "success").inc()
    metrics.reconcile_errors.labels("modelgroup", "internal").inc()
    metrics.reconcile_duration.labels("modelgroup").observe(0.1)
    metrics.set_group_counts("ns", "mg", 1, {"Ready": 1})
    metrics.group_ready_seconds.labels("warmup").observe(1)
    metrics.group_failures.labels("GroupFailed").inc()
    metrics.placement_limited.labels("InsufficientCapacity").inc()
    metrics.warmups.labels("ok").inc()
    metrics.kube_request("PATCH", "pods", 200)
    from prometheus_client import generate_latest

    text = generate_latest(metrics.registry).decode()
    return {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}


def _selected_metrics(expr: str) -> set[str]:
    without_strings = re.sub(r'"[^"]*"', '""', expr)
    return set(re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{", without_strings))


def _recorded_names(expr: str) -> set[str]:
    without_strings = re.sub(r'"[^"]*"', '""', expr)
    return set(re.findall(r"\b([a-z_]+:[a-z0-9_]+:[a-z0-9_]+)\b", without_strings))


def rule_groups(rendered: Rendered) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = rendered.one("PrometheusRule")["spec"]["groups"]
    return groups


def test_alert_rules_read_only_metrics_that_exist(all_features: Rendered) -> None:
    groups = rule_groups(all_features)
    recorded = {rule["record"] for group in groups for rule in group["rules"] if "record" in rule}
    known = operator_series() | VLLM_SERIES | {"up"}

    for group in groups:
        for rule in group["rules"]:
            name = rule.get("alert") or rule["record"]
            unknown = _selected_metrics(rule["expr"]) - known
            assert not unknown, f"{name} reads metrics nobody exposes: {unknown}"
            assert _recorded_names(rule["expr"]) <= recorded, f"{name} reads an unrecorded series"


# The design note's "alerts are tied to actions" (§40): each row's signal, and the alert that carries it.
DESIGN_NOTE_ALERTS = {
    "TTFT up, ITL normal: queue or prefill short": "GoodputTTFTAttainmentLow",
    "ITL up, TTFT normal: decode batch, KV or collectives": "GoodputITLAttainmentLow",
    "rejects rise, ready does not: provisioning or weight load fails": "GoodputGroupsStuckStarting",
    "KV pressure: long outputs or tool waits": "GoodputKVCachePressure",
    "low utilisation, queue rising: rank or network bottleneck": "GoodputGroupStalled",
    "attainment low and scaling limited: add GPUs or quota": "GoodputAttainmentLowScalingLimited",
    "metrics stale: check Prometheus": "GoodputVLLMMetricsMissing",
    "groups failing readiness: check NCCL and health": "GoodputGroupsFailing",
    "drain timeouts": "GoodputDrainStuck",
}


def test_every_alert_carries_a_severity_and_a_runbook_description(all_features: Rendered) -> None:
    alerts = [rule for group in rule_groups(all_features) for rule in group["rules"] if "alert" in rule]
    names = {alert["alert"] for alert in alerts}

    assert set(DESIGN_NOTE_ALERTS.values()) <= names
    assert len(names) == len(alerts), "alert names are unique"
    descriptions = [alert["annotations"]["description"] for alert in alerts]
    assert len(set(descriptions)) == len(descriptions)
    for alert in alerts:
        assert alert["labels"]["severity"] in {"warning", "critical"}
        assert alert["labels"]["team"] == "ml-platform", "additionalAlertLabels reach every alert"
        assert alert["annotations"]["summary"]
        assert len(alert["annotations"]["description"]) > 200, f"{alert['alert']} says too little to act on"


def test_every_alert_links_its_section_of_the_runbooks(all_features: Rendered) -> None:
    runbooks = (ROOT / "docs" / "runbooks.md").read_text()
    anchors = {heading.strip().lower() for heading in re.findall(r"^## (.+)$", runbooks, re.MULTILINE)}
    base = "https://github.com/goodput-dev/goodput/blob/main/docs/runbooks.md"
    for group in rule_groups(all_features):
        for rule in group["rules"]:
            if "alert" in rule:
                assert rule["annotations"]["runbook_url"] == f"{base}#{rule['alert'].lower()}"
                assert rule["alert"].lower() in anchors, f"docs/runbooks.md has no section {rule['alert']}"


def test_every_series_names_the_model_group_with_one_label() -> None:
    """The operator's, the autoscaler's and vLLM's series (as the PodMonitor relabels them) all say
    `model_group`, so dashboards and alerts join them without label_replace."""
    registry = CollectorRegistry()
    metrics = OperatorMetrics(registry)
    AutoscalerMetrics(registry)
    label_names = {
        label for family in registry.collect() for sample in family.samples for label in sample.labels
    }
    label_names |= {
        label
        for collector in list(registry._collector_to_names)  # private: the label names of series never set
        for label in getattr(collector, "_labelnames", ())
    }
    assert "model_group" in label_names
    assert not label_names & {"modelgroup", "model_group_name", "mg", "modelGroup"}
    del metrics


def dashboard(rendered: Rendered) -> dict[str, Any]:
    config_map = rendered.one("ConfigMap", "goodput-dashboard")
    parsed: dict[str, Any] = json.loads(config_map["data"]["goodput.json"])
    return parsed


def test_the_dashboard_shows_what_an_operator_of_goodput_watches(
    all_features: Rendered, defaults: Rendered
) -> None:
    assert not [c for c in defaults.of_kind("ConfigMap") if c["metadata"]["name"].endswith("dashboard")]
    config_map = all_features.one("ConfigMap", "goodput-dashboard")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "goodput"}
    panels = [panel for panel in dashboard(all_features)["panels"] if panel["type"] != "row"]
    titles = " | ".join(panel["title"] for panel in panels)
    for topic in (
        "Groups by state",
        "Decisions by reason",
        "proposed by each signal",
        "TTFT",
        "ITL",
        "Attainment",
        "Drains",
        "GPU-hours",
        "Ready time by phase",
    ):
        assert topic in titles, f"no panel about {topic}: {titles}"
    registry = CollectorRegistry()
    OperatorMetrics(registry)
    AutoscalerMetrics(registry)
    known = {
        name
        for collector in list(registry._collector_to_names)
        for name in registry._collector_to_names[collector]
    } | VLLM_SERIES
    for panel in panels:
        for target in panel["targets"]:
            unknown = _selected_metrics(target["expr"]) - known
            assert not unknown, f"{panel['title']} reads metrics nobody exposes: {unknown}"
            assert not re.search(r"__[A-Z_]+__", target["expr"]), f"unfilled placeholder in {target['expr']}"


def test_the_dashboard_draws_the_slo_of_the_alerts(all_features: Rendered) -> None:
    exprs = [t["expr"] for p in dashboard(all_features)["panels"] for t in p.get("targets", [])]
    assert "vector(2.5)" in exprs and "vector(0.1)" in exprs and "vector(0.99)" in exprs
    assert any('le="2.5"' in expr for expr in exprs) and any('le="0.1"' in expr for expr in exprs)


def test_the_operator_down_alert_needs_a_scrape_of_the_operator(helm: Path) -> None:
    def alerts(*flags: str) -> set[str]:
        rendered = render(helm, "--set", "prometheus.rules.enabled=true", *flags)
        return {
            rule["alert"] for group in rule_groups(rendered) for rule in group["rules"] if "alert" in rule
        }

    assert "GoodputOperatorDown" not in alerts(), "no monitor: the alert would fire forever"
    assert "GoodputOperatorDown" in alerts("--set", "prometheus.podMonitor.enabled=true")
    assert "GoodputOperatorDown" in alerts("--set", "prometheus.rules.operatorJob=kubernetes-pods")


@pytest.mark.parametrize(
    ("ttft", "itl", "ttft_bound", "itl_bound"),
    [("2.5", "0.1", "2.5", "0.1"), ("1", "1", "1.0", "1.0"), ("2560", "0.025", "2560.0", "0.025")],
    ids=["fractions", "whole seconds get a decimal point", "large and small bounds"],
)
def test_latency_thresholds_match_the_le_label_prometheus_stores(
    helm: Path, ttft: str, itl: str, ttft_bound: str, itl_bound: str
) -> None:
    rendered = render(
        helm,
        "--set", "prometheus.rules.enabled=true",
        "--set", f"prometheus.rules.ttftSeconds={ttft}",
        "--set", f"prometheus.rules.itlSeconds={itl}",
    )  # fmt: skip
    records = {
        rule["record"]: rule["expr"]
        for group in rule_groups(rendered)
        for rule in group["rules"]
        if "record" in rule
    }

    assert f'le="{ttft_bound}"' in records["namespace_model_group:vllm_ttft_attainment:ratio_rate10m"]
    assert f'le="{itl_bound}"' in records["namespace_model_group:vllm_itl_attainment:ratio_rate10m"]


# --- Argo CD -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HealthCase:
    kind: str
    input_path: Path
    status: str
    message: str


def health_cases() -> list[HealthCase]:
    cases = []
    for kind in ("ModelGroup", "SLOPolicy"):
        directory = ARGOCD / "resource_customizations" / "goodput.dev" / kind
        for test in yaml.safe_load((directory / "health_test.yaml").read_text())["tests"]:
            expected = test["healthStatus"]
            cases.append(
                HealthCase(kind, directory / test["inputPath"], expected["status"], expected["message"])
            )
    return cases


HEALTH_CASES = health_cases()


@pytest.mark.parametrize("case", HEALTH_CASES, ids=[f"{c.kind}-{c.input_path.stem}" for c in HEALTH_CASES])
def test_argocd_health_check_reports_what_its_fixture_expects(case: HealthCase) -> None:
    # Argo CD runs health scripts in gopher-lua, a Lua 5.1: run them in a Lua 5.1 too, with `obj`
    # set to the resource as Argo CD hands it over (a table built from the object's JSON).
    lua = lupa.lua51.LuaRuntime(unpack_returned_tuples=True)
    script = ARGOCD / "resource_customizations" / "goodput.dev" / case.kind / "health.lua"
    lua.globals().obj = lua.table_from(yaml.safe_load(case.input_path.read_text()), recursive=True)

    health = lua.execute(script.read_text())

    assert (health.status, health.message) == (case.status, case.message)


def test_every_argocd_health_status_is_covered_by_a_fixture() -> None:
    for kind in ("ModelGroup", "SLOPolicy"):
        statuses = {case.status for case in HEALTH_CASES if case.kind == kind}
        assert statuses == {"Healthy", "Progressing", "Degraded"}, kind


@pytest.mark.parametrize(
    ("spec", "ignored"),
    [
        ({"replicas": 3, "minReplicas": 1, "maxReplicas": 8, "policyRef": {"name": "interactive"}}, True),
        ({"replicas": 3, "minReplicas": 1, "maxReplicas": 8}, False),
    ],
    ids=["autoscaled: replicas belong to goodput", "no policy: replicas belong to git"],
)
def test_argocd_ignores_replicas_only_where_the_autoscaler_owns_them(
    spec: dict[str, Any], ignored: bool
) -> None:
    model_group = {
        "apiVersion": "goodput.dev/v1alpha1",
        "kind": "ModelGroup",
        "metadata": {"name": "m"},
        "spec": spec,
    }
    config_map = yaml.safe_load((ARGOCD / "argocd-cm.yaml").read_text())
    paths = yaml.safe_load(
        config_map["data"]["resource.customizations.ignoreDifferences.goodput.dev_ModelGroup"]
    )

    for path in paths["jqPathExpressions"]:
        # Argo CD removes each path from both sides of the diff with jq's del().
        kept = jq.compile(f"del({path})").input_value(model_group).first()
        expected = {key: value for key, value in spec.items() if not (ignored and key == "replicas")}
        assert kept["spec"] == expected
        assert kept["metadata"] == model_group["metadata"]


def test_argocd_config_map_carries_both_health_checks() -> None:
    data = yaml.safe_load((ARGOCD / "argocd-cm.yaml").read_text())["data"]
    for kind in ("ModelGroup", "SLOPolicy"):
        script = ARGOCD / "resource_customizations" / "goodput.dev" / kind / "health.lua"
        assert data[f"resource.customizations.health.goodput.dev_{kind}"] == script.read_text()


def test_the_example_applications_keep_argocd_off_autoscaled_replicas() -> None:
    paths = yaml.safe_load((ARGOCD / "ignore-differences.yaml").read_text())["jqPathExpressions"]
    models = yaml.safe_load((ARGOCD / "application-models.yaml").read_text())
    operator = yaml.safe_load((ARGOCD / "application-goodput.yaml").read_text())

    assert models["spec"]["ignoreDifferences"] == [
        {"group": "goodput.dev", "kind": "ModelGroup", "jqPathExpressions": paths}
    ]
    assert "RespectIgnoreDifferences=true" in models["spec"]["syncPolicy"]["syncOptions"]
    assert operator["spec"]["source"]["path"] == str(CHART.relative_to(ROOT))
    assert int(operator["metadata"]["annotations"]["argocd.argoproj.io/sync-wave"]) < 0, (
        "the operator syncs first"
    )
    chart_values = yaml.safe_load((CHART / "values.yaml").read_text())

    def known(values: Mapping[str, Any], defaults: Mapping[str, Any], path: str) -> None:
        for key, value in values.items():
            assert key in defaults, f"{path}.{key} is not a chart value"
            if isinstance(value, dict):
                known(value, defaults[key], f"{path}.{key}")

    known(operator["spec"]["source"]["helm"]["valuesObject"], chart_values, "valuesObject")
