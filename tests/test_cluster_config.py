"""What the local control plane runs: loopback-only command lines, kubeconfig, kwok stages, and the
Prometheus relabelling (evaluated here with Prometheus's rules)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from goodput.testbed.cluster.config import (
    COMPONENTS,
    ClusterLayout,
    Ports,
    StatePaths,
    component_commands,
    health_urls,
    render_audit_policy,
    render_kubeconfig,
    render_kwok_config,
    render_prometheus_config,
    stage_files,
    write_scrape_target,
)
from goodput.testbed.cluster.kube import KubeClient
from goodput.testbed.cluster.topology import PodNetwork

PORTS = Ports(
    etcd_client=20001,
    etcd_peer=20002,
    apiserver=20003,
    controller_manager=20004,
    scheduler=20005,
    kwok=20006,
    prometheus=20007,
)


@pytest.fixture
def layout(tmp_path: Path) -> ClusterLayout:
    return ClusterLayout(
        name="unit",
        bin_dir=tmp_path / "bin",
        paths=StatePaths(tmp_path / "state"),
        ports=PORTS,
        network=PodNetwork(205),
        scrape_interval_seconds=5.0,
    )


def flag_values(argv: list[str]) -> dict[str, str]:
    return dict(arg[2:].split("=", 1) for arg in argv[1:] if arg.startswith("--") and "=" in arg)


def test_every_component_runs_its_own_binary_from_the_bin_dir(layout: ClusterLayout) -> None:
    commands = component_commands(layout)
    assert list(commands) == list(COMPONENTS)
    for name, argv in commands.items():
        assert argv[0] == str(layout.bin_dir / name)


def test_every_listener_binds_loopback_on_its_assigned_port(layout: ClusterLayout) -> None:
    listeners = {
        "etcd": ["listen-client-urls", "listen-peer-urls"],
        "kube-apiserver": ["bind-address"],
        "kube-controller-manager": ["bind-address"],
        "kube-scheduler": ["bind-address"],
        "kwok": ["server-address"],
        "prometheus": ["web.listen-address"],
    }
    expected_ports = {
        "etcd": {PORTS.etcd_client, PORTS.etcd_peer},
        "kube-apiserver": {PORTS.apiserver},
        "kube-controller-manager": {PORTS.controller_manager},
        "kube-scheduler": {PORTS.scheduler},
        "kwok": {PORTS.kwok},
        "prometheus": {PORTS.prometheus},
    }
    for name, argv in component_commands(layout).items():
        flags = flag_values(argv)
        assert not any(re.search(r"(?<![\d.])0\.0\.0\.0|\[::\]", arg) for arg in argv), name
        for flag in listeners[name]:
            assert re.match(r"^(http://)?127\.0\.0\.1(:\d+)?$", flags[flag]), (name, flag, flags[flag])
        ports = {int(p) for p in re.findall(r"127\.0\.0\.1:(\d+)", " ".join(argv))}
        ports |= {int(flags[f]) for f in ("secure-port",) if f in flags}
        assert expected_ports[name] <= ports, name


def test_components_keep_every_file_inside_the_state_dir(layout: ClusterLayout) -> None:
    for name, argv in component_commands(layout).items():
        for flag, value in flag_values(argv).items():
            if flag.endswith(("dir", "file", "path", "kubeconfig", "config")):
                assert Path(value).is_relative_to(layout.paths.root), (name, flag, value)
        if name.startswith("kube-"):  # without --cert-dir they would write to /var/run/kubernetes
            assert "cert-dir" in flag_values(argv), name


def test_apiserver_needs_no_default_route_and_enforces_rbac(layout: ClusterLayout) -> None:
    flags = flag_values(component_commands(layout)["kube-apiserver"])
    assert flags["advertise-address"] == "127.0.0.1"
    assert flags["endpoint-reconciler-type"] == "none"
    assert flags["authorization-mode"] == "RBAC"
    assert flags["client-ca-file"] == str(layout.paths.cert("ca"))
    assert flags["etcd-servers"] == f"http://127.0.0.1:{PORTS.etcd_client}"
    assert flags["enable-priority-and-fairness"] == "false"


def test_the_apiserver_audits_every_write_but_the_node_leases(layout: ClusterLayout) -> None:
    flags = flag_values(component_commands(layout)["kube-apiserver"])
    assert flags["audit-policy-file"] == str(layout.paths.audit_policy)
    assert flags["audit-log-path"] == str(layout.paths.audit_log)
    rules = yaml.safe_load(render_audit_policy())["rules"]
    first = {rule["level"]: rule for rule in reversed(rules)}

    def level(verb: str, namespace: str, resource: tuple[str, str] = ("", "pods")) -> str:
        for rule in rules:
            kinds = [
                (kind["group"], name) for kind in rule.get("resources", []) for name in kind["resources"]
            ]
            if (
                namespace in rule.get("namespaces", [namespace])
                and verb in rule.get("verbs", [verb])
                and resource in (kinds or [resource])
            ):
                return str(rule["level"])
        raise AssertionError("no rule matched")

    assert first["Metadata"]["verbs"] == ["create", "update", "patch", "delete", "deletecollection"]
    assert level("update", "goodput-system") == "Metadata"
    assert level("get", "goodput-system") == "None"
    assert level("update", "kube-node-lease") == "None"
    # A ModelGroup's patch with its body: whether it changed the count, and with which decision.
    assert level("patch", "team-a", ("goodput.dev", "modelgroups")) == "Request"
    assert level("get", "team-a", ("goodput.dev", "modelgroups")) == "None"


def test_a_second_client_has_its_own_certificate_in_its_kubeconfig(layout: ClusterLayout) -> None:
    config = yaml.safe_load(render_kubeconfig(layout, user="operator-a"))
    user = config["users"][0]["user"]
    assert (user["client-certificate"], user["client-key"]) == (
        str(layout.paths.cert("operator-a")),
        str(layout.paths.key("operator-a")),
    )


def test_etcd_is_a_fast_throwaway_store(layout: ClusterLayout) -> None:
    flags = flag_values(component_commands(layout)["etcd"])
    assert flags["unsafe-no-fsync"] == "true"
    assert flags["data-dir"] == str(layout.paths.etcd_data)


def test_kwok_hands_out_pod_ips_from_the_routed_range(layout: ClusterLayout) -> None:
    flags = flag_values(component_commands(layout)["kwok"])
    assert flags["cidr"] == "10.205.254.0/24"
    assert flags["config"] == str(layout.paths.kwok_config)


def test_health_urls_cover_every_component_on_loopback(layout: ClusterLayout) -> None:
    urls = health_urls(layout)
    assert set(urls) == set(COMPONENTS)
    assert all(re.match(r"^https?://127\.0\.0\.1:\d+/", url) for url in urls.values())


def test_kubeconfig_names_the_admin_certificate_and_the_apiserver(layout: ClusterLayout) -> None:
    layout.paths.root.mkdir(parents=True)
    layout.paths.kubeconfig.write_text(render_kubeconfig(layout))

    client = KubeClient.from_kubeconfig(layout.paths.kubeconfig)

    assert client.server == f"https://127.0.0.1:{PORTS.apiserver}"
    assert client.ca_file == layout.paths.cert("ca")
    assert client.cert_file == layout.paths.cert("admin")
    assert client.key_file == layout.paths.key("admin")


# --- kwok stages ----------------------------------------------------------------------------------


def stages() -> list[dict[str, Any]]:
    return [yaml.safe_load(path.read_text()) for path in stage_files()]


def test_kwok_config_holds_every_shipped_stage_once() -> None:
    documents = [
        d for d in yaml.safe_load_all(render_kwok_config([p.read_text() for p in stage_files()])) if d
    ]
    names = [d["metadata"]["name"] for d in documents]
    assert len(names) == len(stage_files()) >= 12
    assert len(set(names)) == len(names)
    assert all(d["kind"] == "Stage" and d["apiVersion"] == "kwok.x-k8s.io/v1alpha1" for d in documents)
    assert {d["spec"]["resourceRef"]["kind"] for d in documents} == {"Pod", "Node"}


def test_every_status_change_is_a_strategic_merge_on_the_status_subresource() -> None:
    """Conditions merge by type, so conditions other writers set (gates, NCCL health) survive."""
    for stage in stages():
        for patch in stage["spec"].get("next", {}).get("patches", []):
            assert patch == patch | {"subresource": "status", "root": "status", "type": "strategic"}, stage


def test_only_the_readiness_aware_stages_can_mark_a_pod_ready() -> None:
    """Ready=True comes from the stage that checks the gates (containers ready) or that waits for them."""
    writers = {
        stage["metadata"]["name"]
        for stage in stages()
        for patch in stage["spec"].get("next", {}).get("patches", [])
        if re.search(r"- type: Ready\s+status: \"True\"", patch["template"])
    }
    assert writers == {"goodput-pod-containers-ready", "goodput-pod-readiness-gates-met"}


def test_no_stage_writes_a_readiness_gate_condition() -> None:
    for stage in stages():
        for patch in stage["spec"].get("next", {}).get("patches", []):
            assert "goodput.dev/group-ready" not in patch["template"]
            assert not re.search(r"type: \{\{ *\.conditionType", patch["template"]), stage["metadata"]["name"]


def test_pod_stages_other_than_delete_leave_terminating_pods_alone() -> None:
    for stage in stages():
        if stage["spec"]["resourceRef"]["kind"] != "Pod":
            continue
        keys = {e["jq"]["key"]: e["jq"]["operator"] for e in stage["spec"]["selector"]["matchExpressions"]}
        expected = "Exists" if stage["metadata"]["name"] == "goodput-pod-delete" else "DoesNotExist"
        assert keys.get(".metadata.deletionTimestamp") == expected, stage["metadata"]["name"]


# --- Prometheus -------------------------------------------------------------------------------------


def relabel(rules: list[dict[str, Any]], labels: dict[str, str]) -> dict[str, str] | None:
    """Prometheus's relabelling for the actions used here (replace, keep, drop); None when dropped."""
    labels = dict(labels)
    for rule in rules:
        source = rule.get("separator", ";").join(
            labels.get(name, "") for name in rule.get("source_labels", [])
        )
        match = re.fullmatch(rule.get("regex", "(.*)"), source)
        action = rule.get("action", "replace")
        if action == "keep" and not match:
            return None
        if action == "drop" and match:
            return None
        if action == "replace" and match:
            value = re.sub(r"\$(\d+)", r"\\g<\1>", rule.get("replacement", "$1"))
            value = match.expand(value)
            if value:
                labels[rule["target_label"]] = value
            else:
                labels.pop(rule["target_label"], None)
    return {
        k: v for k, v in labels.items() if not k.startswith("__") or k in ("__address__", "__metrics_path__")
    }


def discovered_pod(
    labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None
) -> dict[str, str]:
    meta = {
        "__address__": "10.205.3.7",
        "__metrics_path__": "/metrics",
        "__meta_kubernetes_namespace": "serving",
        "__meta_kubernetes_pod_name": "llama-g0-r1",
        "__meta_kubernetes_pod_ip": "10.205.3.7",
        "__meta_kubernetes_pod_node_name": "gpu-a0-1",
        "__meta_kubernetes_pod_phase": "Running",
    }
    for key, value in (labels or {}).items():
        meta["__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)] = value
    for key, value in (annotations or {}).items():
        meta["__meta_kubernetes_pod_annotation_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)] = value
    return meta


GROUP_LABELS = {"goodput.dev/model-group": "llama", "goodput.dev/group": "llama-g0", "goodput.dev/rank": "1"}
SCRAPE_CASES = {
    "opted in by label, default port": (
        discovered_pod({"goodput.dev/metrics": "true", **GROUP_LABELS}),
        "10.205.3.7:8000",
    ),
    "port from label": (
        discovered_pod({"goodput.dev/metrics": "true", "goodput.dev/metrics-port": "9400"}),
        "10.205.3.7:9400",
    ),
    "opted in by annotation with its port": (
        discovered_pod(annotations={"prometheus.io/scrape": "true", "prometheus.io/port": "8080"}),
        "10.205.3.7:8080",
    ),
    "label port beats annotation port": (
        discovered_pod(
            {"goodput.dev/metrics": "true", "goodput.dev/metrics-port": "9400"},
            {"prometheus.io/port": "8080"},
        ),
        "10.205.3.7:9400",
    ),
    "not opted in": (discovered_pod(GROUP_LABELS), None),
    "opt-in label not true": (discovered_pod({"goodput.dev/metrics": "false"}), None),
    "failed pod": (
        discovered_pod({"goodput.dev/metrics": "true"}) | {"__meta_kubernetes_pod_phase": "Failed"},
        None,
    ),
}


@pytest.mark.parametrize(("meta", "address"), SCRAPE_CASES.values(), ids=SCRAPE_CASES.keys())
def test_prometheus_scrapes_opted_in_pods_at_pod_ip_and_port(
    layout: ClusterLayout, meta: dict[str, str], address: str | None
) -> None:
    job = yaml.safe_load(render_prometheus_config(layout))["scrape_configs"][0]
    target = relabel(job["relabel_configs"], meta)
    assert (target or {}).get("__address__") == address


def test_prometheus_maps_pod_labels_to_series_labels(layout: ClusterLayout) -> None:
    job = yaml.safe_load(render_prometheus_config(layout))["scrape_configs"][0]
    target = relabel(job["relabel_configs"], discovered_pod({"goodput.dev/metrics": "true", **GROUP_LABELS}))
    assert target is not None
    assert {k: v for k, v in target.items() if not k.startswith("__")} == {
        "namespace": "serving",
        "pod": "llama-g0-r1",
        "node": "gpu-a0-1",
        "model_group": "llama",
        "group": "llama-g0",
        "rank": "1",
    }


def test_prometheus_discovers_pods_through_the_admin_kubeconfig(layout: ClusterLayout) -> None:
    config = yaml.safe_load(render_prometheus_config(layout))
    job = config["scrape_configs"][0]
    assert job["kubernetes_sd_configs"] == [{"role": "pod", "kubeconfig_file": str(layout.paths.kubeconfig)}]
    assert config["global"]["scrape_interval"] == "5s"


@pytest.mark.parametrize(
    ("seconds", "interval", "timeout"),
    [(5.0, "5s", "4s"), (2.0, "2s", "1600ms"), (0.5, "500ms", "500ms")],
    ids=["default", "fast", "sub-second"],
)
def test_scrape_interval_and_timeout(
    layout: ClusterLayout, seconds: float, interval: str, timeout: str
) -> None:
    fast = ClusterLayout(layout.name, layout.bin_dir, layout.paths, layout.ports, layout.network, seconds)
    settings = yaml.safe_load(render_prometheus_config(fast))["global"]
    assert (settings["scrape_interval"], settings["scrape_timeout"]) == (interval, timeout)


def test_host_processes_are_scraped_from_the_files_they_write(layout: ClusterLayout, tmp_path: Path) -> None:
    job = yaml.safe_load(render_prometheus_config(layout))["scrape_configs"][1]
    folder = layout.paths.scrape_targets
    assert job["file_sd_configs"] == [{"files": [str(folder / "*.json")], "refresh_interval": "5s"}]
    paths = StatePaths(tmp_path)
    written = write_scrape_target(paths, "gateway-chat", "127.0.0.1:9100", {"namespace": "ml"})
    assert written.parent == paths.scrape_targets and written.suffix == ".json"
    assert json.loads(written.read_text()) == [{"targets": ["127.0.0.1:9100"], "labels": {"namespace": "ml"}}]
    assert list(paths.scrape_targets.iterdir()) == [written]  # no partial file left for Prometheus


def test_the_aggregator_vouches_for_users_only_with_its_own_client_certificate(layout: ClusterLayout) -> None:
    """Extension API servers (KEDA's metrics adapter) trust the user headers of a client presenting the
    front-proxy certificate; the API server reaches them at their endpoint, as there is no kube-proxy."""
    argv = component_commands(layout)["kube-apiserver"]
    flags = dict(arg.removeprefix("--").split("=", 1) for arg in argv[1:])
    assert flags["requestheader-allowed-names"] == "front-proxy-client"
    assert flags["proxy-client-cert-file"] == str(layout.paths.cert("front-proxy-client"))
    assert flags["proxy-client-key-file"] == str(layout.paths.key("front-proxy-client"))
    assert flags["requestheader-client-ca-file"] == str(layout.paths.cert("ca"))
    assert flags["requestheader-username-headers"] == "X-Remote-User"
    assert flags["enable-aggregator-routing"] == "true"
