"""The chart's network and pod hardening: who may reach whom, and what each container may do.

The NetworkPolicies are checked by what they allow, not by their text: `reachable` evaluates the
rendered policies with Kubernetes' semantics (a pod is isolated in a direction once a policy selects
it for that direction; a connection needs the source's egress and the destination's ingress), so a
test states a connection a platform team cares about and whether it must work. Rendered offline
with the helm binary, as tests/test_chart.py does (which it reuses).
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from test_chart import (
    ALL_FEATURES,
    CHART,
    NAMESPACE,
    Rendered,
    helm,  # noqa: F401 (a fixture, used by name)
    helm_template,
    render,
    values_file,
)

GATEWAY_VALUES = CHART / "ci" / "gateway-values.yaml"
# One `helm template` per distinct set of flags, shared by the table cases that read it.
render_once = functools.cache(render)
OPERATOR_LABELS = {
    "app.kubernetes.io/name": "goodput",
    "app.kubernetes.io/instance": "goodput",
    "app.kubernetes.io/component": "operator",
}
GATEWAY_LABELS = {**OPERATOR_LABELS, "app.kubernetes.io/component": "gateway"}


# --- a NetworkPolicy evaluator ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A pod (namespace and labels) or, with `ip`, an address outside every pod selector."""

    namespace: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    ip: str = ""


def selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector; the empty selector selects everything."""
    if any(labels.get(key) != value for key, value in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
        matched = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[operator]
        if not matched:
            return False
    return True


def peer_matches(peer: Mapping[str, Any], policy_namespace: str, endpoint: Endpoint) -> bool:
    if "ipBlock" in peer:
        block = peer["ipBlock"]
        return bool(endpoint.ip) and ipaddress.ip_address(endpoint.ip) in ipaddress.ip_network(block["cidr"])
    if endpoint.ip:
        return False
    if "namespaceSelector" in peer:
        namespace_labels = {"kubernetes.io/metadata.name": endpoint.namespace}
        if not selects(peer["namespaceSelector"], namespace_labels):
            return False
    elif endpoint.namespace != policy_namespace:
        return False
    return selects(peer.get("podSelector") or {}, endpoint.labels)


def rule_allows(
    rule: Mapping[str, Any],
    peers_key: str,
    policy_namespace: str,
    *,
    other: Endpoint,
    port: int,
    protocol: str,
) -> bool:
    peers = rule.get(peers_key)
    if peers and not any(peer_matches(peer, policy_namespace, other) for peer in peers):
        return False
    ports = rule.get("ports")
    return not ports or any(
        entry.get("port") == port and entry.get("protocol", "TCP") == protocol for entry in ports
    )


def direction_allows(
    policies: Sequence[Mapping[str, Any]],
    pod: Endpoint,
    direction: str,
    *,
    other: Endpoint,
    port: int,
    protocol: str = "TCP",
) -> bool:
    """Whether `pod`'s policies let it talk to (Egress) or be reached by (Ingress) `other`."""
    if pod.ip:
        return True  # not a pod: no NetworkPolicy applies to it
    key, peers_key = ("egress", "to") if direction == "Egress" else ("ingress", "from")
    isolating = [
        policy
        for policy in policies
        if policy["metadata"]["namespace"] == pod.namespace
        and direction in policy["spec"].get("policyTypes", ["Ingress"])
        and selects(policy["spec"]["podSelector"], pod.labels)
    ]
    if not isolating:
        return True
    return any(
        rule_allows(
            rule, peers_key, policy["metadata"]["namespace"], other=other, port=port, protocol=protocol
        )
        for policy in isolating
        for rule in policy["spec"].get(key) or []
    )


def reachable(
    rendered: Rendered, source: Endpoint, destination: Endpoint, port: int, protocol: str = "TCP"
) -> bool:
    policies = rendered.of_kind("NetworkPolicy")
    egress = direction_allows(policies, source, "Egress", other=destination, port=port, protocol=protocol)
    return egress and direction_allows(
        policies, destination, "Ingress", other=source, port=port, protocol=protocol
    )


def test_the_evaluator_isolates_only_selected_pods_and_needs_both_sides() -> None:
    deny_ingress = {
        "kind": "NetworkPolicy",
        "metadata": {"namespace": "a"},
        "spec": {"podSelector": {"matchLabels": {"app": "db"}}, "policyTypes": ["Ingress"], "ingress": []},
    }
    rendered = Rendered((deny_ingress,))
    client = Endpoint("a", {"app": "web"})

    assert not reachable(rendered, client, Endpoint("a", {"app": "db"}), 5432)
    assert reachable(rendered, client, Endpoint("a", {"app": "cache"}), 6379), "not selected: open"
    assert reachable(rendered, client, Endpoint("b", {"app": "db"}), 5432), "another namespace: open"


# --- who may reach whom -------------------------------------------------------------------------------

OPERATOR = Endpoint(NAMESPACE, OPERATOR_LABELS)
GATEWAY = Endpoint(NAMESPACE, GATEWAY_LABELS)
PROMETHEUS = Endpoint("monitoring", {"app.kubernetes.io/name": "prometheus"})
DNS = Endpoint("kube-system", {"k8s-app": "kube-dns"})
API_SERVER = Endpoint(ip="10.0.0.1")
INTERNET = Endpoint(ip="203.0.113.7")


def leader(namespace: str, model_group: str = "llama-8b") -> Endpoint:
    return Endpoint(namespace, {"goodput.dev/model-group": model_group, "goodput.dev/rank": "0"})


@dataclass(frozen=True, slots=True)
class Connection:
    name: str
    source: Endpoint
    destination: Endpoint
    port: int
    allowed: bool
    protocol: str = "TCP"


OPERATOR_CONNECTIONS = [
    Connection("operator to the API server (kubeadm)", OPERATOR, API_SERVER, 6443, True),
    Connection("operator to the API server (managed)", OPERATOR, API_SERVER, 443, True),
    Connection("operator to DNS over UDP", OPERATOR, DNS, 53, True, "UDP"),
    Connection("operator to DNS over TCP", OPERATOR, DNS, 53, True),
    Connection("operator to Prometheus' query port", OPERATOR, PROMETHEUS, 9090, True),
    Connection("operator to a leader in any namespace", OPERATOR, leader("team-a"), 8000, True),
    Connection("Prometheus scrapes the operator's metrics", PROMETHEUS, OPERATOR, 8082, True),
    Connection("operator to the internet", OPERATOR, INTERNET, 80, False),
    Connection(
        "operator to a pod that is not an engine", OPERATOR, Endpoint("team-a", {"app": "db"}), 5432, False
    ),
    Connection("operator to another port of Prometheus", OPERATOR, PROMETHEUS, 9093, False),
    Connection("another namespace to the operator's metrics", Endpoint("team-a"), OPERATOR, 8082, False),
    Connection("Prometheus to the operator's other ports", PROMETHEUS, OPERATOR, 9999, False),
]


@pytest.mark.parametrize("case", OPERATOR_CONNECTIONS, ids=[case.name for case in OPERATOR_CONNECTIONS])
def test_the_operator_reaches_what_it_needs_and_nothing_else(helm: Path, case: Connection) -> None:  # noqa: F811
    rendered = render_once(helm)

    assert reachable(rendered, case.source, case.destination, case.port, case.protocol) is case.allowed


def test_a_namespaced_operator_reaches_leaders_only_in_its_namespaces(helm: Path) -> None:  # noqa: F811
    rendered = render(helm, "--set", "watchNamespaces={team-a}")

    assert reachable(rendered, OPERATOR, leader("team-a"), 8000)
    assert not reachable(rendered, OPERATOR, leader("team-b"), 8000)


# Where the common installs put Prometheus and its labels, and what the defaults must admit.
KUBE_PROMETHEUS_STACK = Endpoint(
    "kube-prometheus-stack",
    {
        "app.kubernetes.io/name": "prometheus",
        "app.kubernetes.io/instance": "kps-prometheus",
        "prometheus": "kps",
    },
)
COMMUNITY_CHART = Endpoint(
    "prometheus", {"app.kubernetes.io/name": "prometheus", "app.kubernetes.io/component": "server"}
)
DEFAULT_PEER_CONNECTIONS = [
    Connection(
        "kube-prometheus-stack in its own namespace scrapes the operator",
        KUBE_PROMETHEUS_STACK,
        OPERATOR,
        8082,
        True,
    ),
    Connection("the operator queries kube-prometheus-stack", OPERATOR, KUBE_PROMETHEUS_STACK, 9090, True),
    Connection(
        "the prometheus-community chart's server scrapes the operator", COMMUNITY_CHART, OPERATOR, 8082, True
    ),
    Connection("the operator queries the community chart's server", OPERATOR, COMMUNITY_CHART, 9090, True),
    Connection("CoreDNS as kubeadm, EKS and GKE label it", OPERATOR, DNS, 53, True, "UDP"),
    Connection(
        "a pod in the monitoring namespace that is not Prometheus",
        Endpoint("monitoring", {"app": "grafana"}),
        OPERATOR,
        8082,
        False,
    ),
    Connection(
        "the operator to a pod beside Prometheus",
        OPERATOR,
        Endpoint("monitoring", {"app": "grafana"}),
        9090,
        False,
    ),
]


@pytest.mark.parametrize(
    "case", DEFAULT_PEER_CONNECTIONS, ids=[case.name for case in DEFAULT_PEER_CONNECTIONS]
)
def test_the_default_peers_fit_the_common_prometheus_and_dns_installs(helm: Path, case: Connection) -> None:  # noqa: F811
    rendered = render_once(helm)

    assert reachable(rendered, case.source, case.destination, case.port, case.protocol) is case.allowed


def test_naming_the_prometheus_namespace_admits_only_its_pods(helm: Path) -> None:  # noqa: F811
    rendered = render(helm, "--set", "networkPolicy.prometheus.namespace=monitoring")

    assert reachable(rendered, PROMETHEUS, OPERATOR, 8082)
    assert reachable(rendered, OPERATOR, PROMETHEUS, 9090)
    assert not reachable(rendered, KUBE_PROMETHEUS_STACK, OPERATOR, 8082)
    assert not reachable(rendered, OPERATOR, KUBE_PROMETHEUS_STACK, 9090)


@dataclass(frozen=True, slots=True)
class PrometheusPort:
    name: str
    url: str
    override: int
    port: int


PROMETHEUS_PORTS = [
    PrometheusPort("the url's port", "http://prometheus-operated.monitoring.svc:9090", 0, 9090),
    PrometheusPort(
        "Thanos querier over TLS", "https://thanos-querier.openshift-monitoring.svc:9091", 0, 9091
    ),
    PrometheusPort("https without a port", "https://prometheus.monitoring.svc", 0, 443),
    PrometheusPort("http without a port", "http://prometheus.monitoring.svc/prefix", 0, 80),
    PrometheusPort(
        "the value wins over the url", "http://prometheus-operated.monitoring.svc:9090", 9095, 9095
    ),
]


@pytest.mark.parametrize("case", PROMETHEUS_PORTS, ids=[case.name for case in PROMETHEUS_PORTS])
def test_the_prometheus_egress_port_follows_the_url_unless_set(helm: Path, case: PrometheusPort) -> None:  # noqa: F811
    rendered = render(
        helm, "--set", f"prometheus.url={case.url}", "--set", f"networkPolicy.prometheus.port={case.override}"
    )

    assert reachable(rendered, OPERATOR, PROMETHEUS, case.port)
    assert not reachable(rendered, OPERATOR, PROMETHEUS, case.port + 1)


def test_named_namespaces_and_addresses_narrow_the_policies(helm: Path, tmp_path: Path) -> None:  # noqa: F811
    values = {
        "networkPolicy": {
            "apiServer": {"cidrs": ["10.0.0.0/30"], "ports": [6443]},
            "dns": {
                "namespace": "openshift-dns",
                "podLabels": {"dns.operator.openshift.io/daemonset-dns": "default"},
            },
            "prometheus": {
                "namespace": "openshift-monitoring",
                "podLabels": {"app": "thanos-query"},
                "port": 0,
            },
        },
        "prometheus": {"url": "https://thanos-querier.openshift-monitoring.svc:9091"},
    }
    rendered = render(helm, "-f", values_file(tmp_path, values))
    thanos = Endpoint("openshift-monitoring", {"app": "thanos-query"})
    openshift_dns = Endpoint("openshift-dns", {"dns.operator.openshift.io/daemonset-dns": "default"})

    assert reachable(rendered, OPERATOR, API_SERVER, 6443)
    assert not reachable(rendered, OPERATOR, Endpoint(ip="10.0.0.9"), 6443), "outside the CIDR"
    assert not reachable(rendered, OPERATOR, API_SERVER, 443), "not a named port"
    assert reachable(rendered, OPERATOR, openshift_dns, 53, "UDP")
    assert not reachable(rendered, OPERATOR, DNS, 53, "UDP")
    assert reachable(rendered, OPERATOR, thanos, 9091)
    assert not reachable(rendered, OPERATOR, Endpoint("openshift-monitoring", {"app": "other"}), 9091)
    assert reachable(rendered, thanos, OPERATOR, 8082)
    assert not reachable(rendered, PROMETHEUS, OPERATOR, 8082), "the monitoring namespace was renamed"


GATEWAY_CONNECTIONS = [
    Connection("any client to the gateway's port", Endpoint("apps", {"app": "chat"}), GATEWAY, 8080, True),
    Connection("Prometheus scrapes the gateway", PROMETHEUS, GATEWAY, 9090, True),
    Connection("a client to the gateway's metrics", Endpoint("apps"), GATEWAY, 9090, False),
    Connection("gateway to its ModelGroup's leader", GATEWAY, leader("inference"), 8000, True),
    Connection("gateway to the API server", GATEWAY, API_SERVER, 6443, True),
    Connection("gateway to DNS", GATEWAY, DNS, 53, True, "UDP"),
    Connection("gateway to another ModelGroup's leader", GATEWAY, leader("inference", "other"), 8000, False),
    Connection("gateway to the same ModelGroup name elsewhere", GATEWAY, leader("team-b"), 8000, False),
    Connection("gateway to the internet over http", GATEWAY, INTERNET, 80, False),
]


@pytest.mark.parametrize("case", GATEWAY_CONNECTIONS, ids=[case.name for case in GATEWAY_CONNECTIONS])
def test_the_gateway_is_reached_on_its_port_and_reaches_only_its_leaders(
    helm: Path,  # noqa: F811
    case: Connection,
) -> None:
    rendered = render_once(helm, "-f", str(GATEWAY_VALUES))

    assert reachable(rendered, case.source, case.destination, case.port, case.protocol) is case.allowed


def test_the_gateways_clients_can_be_limited_to_named_namespaces(helm: Path) -> None:  # noqa: F811
    rendered = render(
        helm, "-f", str(GATEWAY_VALUES), "--set", "networkPolicy.gateway.ingressNamespaces={ingress}"
    )

    assert reachable(rendered, Endpoint("ingress", {"app": "nginx"}), GATEWAY, 8080)
    assert not reachable(rendered, Endpoint("apps", {"app": "chat"}), GATEWAY, 8080)


def test_there_is_no_gateway_policy_without_a_gateway(helm: Path) -> None:  # noqa: F811
    names = [policy["metadata"]["name"] for policy in render(helm).of_kind("NetworkPolicy")]

    assert names == ["goodput"]


ENGINE_VALUES = ["-f", str(GATEWAY_VALUES), "--set", "networkPolicy.engines.enabled=true"]
ENGINE_VALUES += ["--set", "networkPolicy.engines.namespaces={inference}"]
ENGINE_CONNECTIONS = [
    Connection(
        "another rank of the namespace", leader("inference", "llama-8b"), leader("inference"), 29500, True
    ),
    Connection("the operator's warm-up", OPERATOR, leader("inference"), 8000, True),
    Connection("the gateway's requests", GATEWAY, leader("inference"), 8000, True),
    Connection("Prometheus scrapes a leader", PROMETHEUS, leader("inference"), 8000, True),
    Connection(
        "a pod of the namespace that is not an engine",
        Endpoint("inference", {"app": "x"}),
        leader("inference"),
        8000,
        False,
    ),
    Connection(
        "a pod of another namespace", Endpoint("apps", {"app": "chat"}), leader("inference"), 8000, False
    ),
    Connection("an engine of another namespace", leader("team-b"), leader("inference"), 8000, False),
]


@pytest.mark.parametrize("case", ENGINE_CONNECTIONS, ids=[case.name for case in ENGINE_CONNECTIONS])
def test_engines_are_reached_only_by_their_ranks_the_operator_the_gateway_and_prometheus(
    helm: Path,  # noqa: F811
    case: Connection,
) -> None:
    rendered = render_once(helm, *ENGINE_VALUES)
    policies = rendered.of_kind("NetworkPolicy")

    assert (
        direction_allows(policies, case.destination, "Ingress", other=case.source, port=case.port)
        is case.allowed
    )


def test_engine_policies_are_off_by_default_and_leave_egress_open(helm: Path) -> None:  # noqa: F811
    assert not [
        p
        for p in render(helm, "-f", str(ALL_FEATURES)).of_kind("NetworkPolicy")
        if p["metadata"]["namespace"] != NAMESPACE
    ]
    rendered = render(helm, *ENGINE_VALUES)

    assert reachable(rendered, leader("inference"), INTERNET, 443), "engines download models"


def test_engine_policies_go_to_the_agents_namespaces_and_admit_named_clients(helm: Path) -> None:  # noqa: F811
    rendered = render(
        helm, "--set", "agent.enabled=true", "--set", "agent.namespaces={serving-a,serving-b}",
        "--set", "networkPolicy.engines.enabled=true",
        "--set", "networkPolicy.engines.clientNamespaces={batch}",
    )  # fmt: skip
    engines = [p for p in rendered.of_kind("NetworkPolicy") if p["metadata"]["namespace"] != NAMESPACE]

    assert sorted(p["metadata"]["namespace"] for p in engines) == ["serving-a", "serving-b"]
    assert direction_allows(engines, leader("serving-b"), "Ingress", other=Endpoint("batch"), port=8000)
    assert not direction_allows(engines, leader("serving-b"), "Ingress", other=GATEWAY, port=8000), (
        "no gateway"
    )


def test_engine_policies_without_a_namespace_fail_the_render_naming_the_value(helm: Path) -> None:  # noqa: F811
    result = helm_template(helm, "--set", "networkPolicy.engines.enabled=true")

    assert result.returncode != 0
    assert "networkPolicy.engines.enabled needs the namespaces" in result.stderr


def test_network_policies_can_be_turned_off(helm: Path) -> None:  # noqa: F811
    rendered = render(helm, *ENGINE_VALUES, "--set", "networkPolicy.enabled=false")

    assert not rendered.of_kind("NetworkPolicy")


BAD_VALUES = {
    "cidr without prefix": ({"apiServer": {"cidrs": ["10.0.0.1"], "ports": [443]}}, "cidrs/0"),
    "namespace in capitals": (
        {"prometheus": {"namespace": "Monitoring", "podLabels": {}, "port": 0}},
        "namespace",
    ),
    "namespace with underscore": (
        {"engines": {"enabled": False, "namespaces": [], "clientNamespaces": ["not_a_namespace"]}},
        "clientNamespaces/0",
    ),
    "port out of range": (
        {"prometheus": {"namespace": "monitoring", "podLabels": {}, "port": 70000}},
        "port",
    ),
    "a misspelt key": ({"engine": {"enabled": True}}, "engine"),
}


@pytest.mark.parametrize(("values", "named"), BAD_VALUES.values(), ids=BAD_VALUES.keys())
def test_bad_network_policy_values_are_refused_naming_the_key(
    helm: Path,  # noqa: F811
    tmp_path: Path,
    values: dict[str, Any],
    named: str,
) -> None:
    result = helm_template(helm, "-f", values_file(tmp_path, {"networkPolicy": values}))

    assert result.returncode != 0
    assert "networkPolicy" in result.stderr and named in result.stderr, result.stderr


# --- every container of ours ------------------------------------------------------------------------------


def workloads(rendered: Rendered) -> list[dict[str, Any]]:
    return [
        obj for obj in rendered.objects if obj["kind"] in {"Deployment", "StatefulSet", "DaemonSet", "Job"}
    ]


@pytest.mark.parametrize(
    "values", [None, ALL_FEATURES, GATEWAY_VALUES], ids=["defaults", "all-features", "gateway"]
)
def test_every_container_of_ours_runs_non_root_read_only_and_without_privileges(
    helm: Path,  # noqa: F811
    values: Path | None,
) -> None:
    rendered = render(helm, *(["-f", str(values)] if values else []))
    checked = []
    for workload in workloads(rendered):
        pod = workload["spec"]["template"]["spec"]
        pod_context = pod.get("securityContext") or {}
        scratch = {volume["name"] for volume in pod.get("volumes", []) if "emptyDir" in volume}
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            context = container.get("securityContext") or {}
            where = f"{workload['metadata']['name']}/{container['name']}"
            assert context.get("runAsNonRoot", pod_context.get("runAsNonRoot")) is True, where
            assert (context.get("runAsUser", pod_context.get("runAsUser")) or 0) > 0, where
            assert context.get("readOnlyRootFilesystem") is True, where
            assert context.get("allowPrivilegeEscalation") is False, where
            assert context.get("capabilities") == {"drop": ["ALL"]}, where
            assert not context.get("privileged"), where
            seccomp = context.get("seccompProfile", pod_context.get("seccompProfile"))
            assert seccomp == {"type": "RuntimeDefault"}, where
            writable = [m for m in container.get("volumeMounts", []) if not m.get("readOnly")]
            assert [(m["mountPath"], m["name"] in scratch) for m in writable] == [("/tmp", True)], (
                f"{where} writes only to an emptyDir at /tmp"
            )
            checked.append(container["name"])
    expected = {"operator", "gateway"} if values == GATEWAY_VALUES else {"operator"}
    assert set(checked) == expected
