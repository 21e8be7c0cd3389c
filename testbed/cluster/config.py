"""What the local control plane runs: command lines, kubeconfig, kwok and Prometheus configuration.

Pure rendering from a `ClusterLayout` (paths, ports, network), so the exact flags can be read and
tested without starting anything. Every listener binds to loopback.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from goodput.testbed.cluster.topology import PodNetwork

LOOPBACK = "127.0.0.1"
SERVICE_CIDR = "10.0.0.0/24"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
# kwok renews each node's lease every quarter of its duration, as a kubelet does. A node whose lease
# is no longer renewed (a lost node) is marked Unknown, tainted unreachable and its pods not ready
# once the grace period passes; the short values keep that within about half a minute.
NODE_LEASE_SECONDS = 20
NODE_MONITOR_GRACE = "30s"
NODE_MONITOR_PERIOD = "2s"
DEFAULT_METRICS_PORT = 8000
METRICS_LABEL = "goodput.dev/metrics"
METRICS_PORT_LABEL = "goodput.dev/metrics-port"
# Pod label -> series label, the mapping a PodMonitor's relabelling would do.
SERIES_LABELS_FROM_POD_LABELS = {
    "goodput.dev/model-group": "model_group",
    "goodput.dev/group": "group",
    "goodput.dev/rank": "rank",
}
HEALTH_PATHS = "/healthz,/readyz,/livez,/metrics"
FRONT_PROXY_CLIENT = "front-proxy-client"

# Start order; stopped in reverse.
COMPONENTS = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "prometheus",
)


@dataclass(frozen=True, slots=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    kwok: int
    prometheus: int

    def all(self) -> dict[str, int]:
        return {item.name: getattr(self, item.name) for item in fields(self)}


@dataclass(frozen=True, slots=True)
class StatePaths:
    """Where one cluster keeps everything: PKI, etcd data, configs, logs, PID files."""

    root: Path

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd"

    @property
    def prometheus_data(self) -> Path:
        return self.root / "prometheus"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def pids(self) -> Path:
        return self.root / "pids"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def kwok_config(self) -> Path:
        return self.root / "kwok.yaml"

    @property
    def prometheus_config(self) -> Path:
        return self.root / "prometheus.yml"

    @property
    def audit_policy(self) -> Path:
        return self.root / "audit-policy.yaml"

    @property
    def audit_log(self) -> Path:
        """Every write to the API server (who, what, when, the answer's code), one JSON line each."""
        return self.logs / "audit.log"

    @property
    def state_file(self) -> Path:
        return self.root / "cluster.json"

    @property
    def scrape_targets(self) -> Path:
        """Static scrape targets of processes on the host (a gateway), one JSON file each."""
        return self.root / "scrape-targets"

    def log(self, component: str) -> Path:
        return self.logs / f"{component}.log"

    def cert(self, name: str) -> Path:
        return self.pki / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.pki / f"{name}.key"


@dataclass(frozen=True, slots=True)
class ClusterLayout:
    """Everything the command lines depend on."""

    name: str
    bin_dir: Path
    paths: StatePaths
    ports: Ports
    network: PodNetwork
    scrape_interval_seconds: float = 5.0

    @property
    def apiserver_url(self) -> str:
        return f"https://{LOOPBACK}:{self.ports.apiserver}"

    @property
    def prometheus_url(self) -> str:
        return f"http://{LOOPBACK}:{self.ports.prometheus}"

    @property
    def etcd_url(self) -> str:
        return f"http://{LOOPBACK}:{self.ports.etcd_client}"


def component_commands(layout: ClusterLayout) -> dict[str, list[str]]:
    """argv of every component, in start order."""
    builders = {
        "etcd": etcd_command,
        "kube-apiserver": apiserver_command,
        "kube-controller-manager": controller_manager_command,
        "kube-scheduler": scheduler_command,
        "kwok": kwok_command,
        "prometheus": prometheus_command,
    }
    return {name: builders[name](layout) for name in COMPONENTS}


def etcd_command(layout: ClusterLayout) -> list[str]:
    peer = f"http://{LOOPBACK}:{layout.ports.etcd_peer}"
    return [
        str(layout.bin_dir / "etcd"),
        f"--name={layout.name}",
        f"--data-dir={layout.paths.etcd_data}",
        f"--listen-client-urls={layout.etcd_url}",
        f"--advertise-client-urls={layout.etcd_url}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster={layout.name}={peer}",
        "--initial-cluster-state=new",
        # A throwaway test store: skip fsync (much faster on a busy disk), compact often, stay small.
        "--unsafe-no-fsync=true",
        "--auto-compaction-mode=periodic",
        "--auto-compaction-retention=5m",
        "--quota-backend-bytes=1073741824",
        "--log-level=warn",
    ]


def apiserver_command(layout: ClusterLayout) -> list[str]:
    paths = layout.paths
    return [
        str(layout.bin_dir / "kube-apiserver"),
        f"--etcd-servers={layout.etcd_url}",
        f"--bind-address={LOOPBACK}",
        f"--secure-port={layout.ports.apiserver}",
        # No default route is needed and the `kubernetes` Service gets no (loopback) endpoints.
        f"--advertise-address={LOOPBACK}",
        "--endpoint-reconciler-type=none",
        f"--cert-dir={paths.pki}",
        f"--tls-cert-file={paths.cert('apiserver')}",
        f"--tls-private-key-file={paths.key('apiserver')}",
        f"--client-ca-file={paths.cert('ca')}",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        f"--service-account-key-file={paths.pki / 'service-account.pub'}",
        f"--service-account-signing-key-file={paths.key('service-account')}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--authorization-mode=RBAC",
        # The aggregation layer, for extension API servers such as KEDA's external-metrics adapter.
        # It reaches them at their Service's endpoint (a pod IP in the harness's namespace), since
        # no kube-proxy routes ClusterIPs here.
        f"--requestheader-client-ca-file={paths.cert('ca')}",
        f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={paths.cert(FRONT_PROXY_CLIENT)}",
        f"--proxy-client-key-file={paths.key(FRONT_PROXY_CLIENT)}",
        "--enable-aggregator-routing=true",
        "--allow-privileged=true",
        # Two cores shared with tests: no request throttling, no profiling endpoints.
        "--enable-priority-and-fairness=false",
        "--max-requests-inflight=0",
        "--max-mutating-requests-inflight=0",
        "--profiling=false",
        "--event-ttl=30m",
        # Who wrote what, for the stories that must prove who acted (leader election).
        f"--audit-policy-file={paths.audit_policy}",
        f"--audit-log-path={paths.audit_log}",
        "--audit-log-maxsize=512",
        "--audit-log-maxbackup=1",
    ]


def controller_manager_command(layout: ClusterLayout) -> list[str]:
    paths = layout.paths
    return [
        str(layout.bin_dir / "kube-controller-manager"),
        f"--kubeconfig={paths.kubeconfig}",
        "--leader-elect=false",
        f"--bind-address={LOOPBACK}",
        f"--secure-port={layout.ports.controller_manager}",
        f"--cert-dir={paths.pki / 'kube-controller-manager'}",
        f"--authorization-always-allow-paths={HEALTH_PATHS}",
        f"--service-account-private-key-file={paths.key('service-account')}",
        f"--root-ca-file={paths.cert('ca')}",
        "--use-service-account-credentials=false",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        f"--node-monitor-period={NODE_MONITOR_PERIOD}",
        f"--node-monitor-grace-period={NODE_MONITOR_GRACE}",
        "--profiling=false",
    ]


def scheduler_command(layout: ClusterLayout) -> list[str]:
    paths = layout.paths
    return [
        str(layout.bin_dir / "kube-scheduler"),
        f"--kubeconfig={paths.kubeconfig}",
        "--leader-elect=false",
        f"--bind-address={LOOPBACK}",
        f"--secure-port={layout.ports.scheduler}",
        f"--cert-dir={paths.pki / 'kube-scheduler'}",
        f"--authorization-always-allow-paths={HEALTH_PATHS}",
        "--profiling=false",
    ]


def kwok_command(layout: ClusterLayout) -> list[str]:
    return [
        str(layout.bin_dir / "kwok"),
        f"--kubeconfig={layout.paths.kubeconfig}",
        f"--config={layout.paths.kwok_config}",
        # Every node of this cluster is fake, so kwok plays the kubelet of all of them.
        "--manage-all-nodes=true",
        f"--cidr={layout.network.fallback_pod_cidr}",
        f"--node-ip={layout.network.node_address(0)}",
        f"--server-address={LOOPBACK}:{layout.ports.kwok}",
        f"--node-lease-duration-seconds={NODE_LEASE_SECONDS}",
    ]


def prometheus_command(layout: ClusterLayout) -> list[str]:
    return [
        str(layout.bin_dir / "prometheus"),
        f"--config.file={layout.paths.prometheus_config}",
        f"--storage.tsdb.path={layout.paths.prometheus_data}",
        "--storage.tsdb.retention.time=6h",
        f"--web.listen-address={LOOPBACK}:{layout.ports.prometheus}",
        "--web.enable-lifecycle",
        "--log.level=warn",
    ]


def health_urls(layout: ClusterLayout) -> dict[str, str]:
    """The endpoint that says each component is ready (HTTPS ones use self-signed or our CA)."""
    return {
        "etcd": f"{layout.etcd_url}/health",
        "kube-apiserver": f"{layout.apiserver_url}/readyz",
        "kube-controller-manager": f"https://{LOOPBACK}:{layout.ports.controller_manager}/healthz",
        "kube-scheduler": f"https://{LOOPBACK}:{layout.ports.scheduler}/healthz",
        "kwok": f"http://{LOOPBACK}:{layout.ports.kwok}/healthz",
        "prometheus": f"{layout.prometheus_url}/-/ready",
    }


# Writes only, once each (when the answer is sent), at Metadata level (no bodies) but for the
# patches of ModelGroups, whose body says whether a write changed the count and with which decision;
# the node leases kwok renews for every fake node are left out, as they are noise a second.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "None", "namespaces": ["kube-node-lease"]},
        {
            "level": "Request",
            "verbs": ["patch", "update"],
            "resources": [{"group": "goodput.dev", "resources": ["modelgroups"]}],
        },
        {"level": "Metadata", "verbs": ["create", "update", "patch", "delete", "deletecollection"]},
        {"level": "None"},
    ],
}


def render_audit_policy() -> str:
    return yaml.safe_dump(AUDIT_POLICY, sort_keys=False)


def render_kubeconfig(layout: ClusterLayout, user: str = "admin") -> str:
    """Kubeconfig of the client certificate `user` (default: the admin, in group system:masters),
    with absolute paths."""
    paths = layout.paths
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": layout.name,
                "cluster": {"server": layout.apiserver_url, "certificate-authority": str(paths.cert("ca"))},
            }
        ],
        "users": [
            {
                "name": f"{layout.name}-{user}",
                "user": {
                    "client-certificate": str(paths.cert(user)),
                    "client-key": str(paths.key(user)),
                },
            }
        ],
        "contexts": [
            {
                "name": layout.name,
                "context": {"cluster": layout.name, "user": f"{layout.name}-{user}", "namespace": "default"},
            }
        ],
        "current-context": layout.name,
    }
    return yaml.safe_dump(config, sort_keys=False)


def stage_files() -> list[Path]:
    """The project's kwok Stage files shipped beside this module (pod lifecycle, failures, nodes)."""
    folder = resources.files("goodput.testbed.cluster") / "stages"
    return sorted(Path(str(entry)) for entry in folder.iterdir() if entry.name.endswith(".yaml"))


def render_kwok_config(stage_texts: list[str]) -> str:
    """kwok's configuration file: every Stage document (standalone kwok has no built-in stages).

    No KwokConfiguration document: with one, kwok v0.8.0 skips its option defaults (node lease
    parallelism 0 is refused), so options are passed as flags instead.
    """
    return "\n---\n".join(text.strip() for text in stage_texts) + "\n"


def render_prometheus_config(layout: ClusterLayout) -> str:
    """Scrape config equivalent to a PodMonitor: pods opted in by label `goodput.dev/metrics: "true"`
    (or annotation `prometheus.io/scrape: "true"`), `<podIP>:<port>/metrics` with the port from label
    `goodput.dev/metrics-port`, else annotation `prometheus.io/port`, else 8000."""
    interval = _prometheus_duration(layout.scrape_interval_seconds)
    timeout = _prometheus_duration(max(0.5, layout.scrape_interval_seconds * 0.8))
    metrics_label = _meta_pod_label(METRICS_LABEL)
    relabel: list[dict[str, Any]] = [
        {
            "source_labels": [metrics_label, "__meta_kubernetes_pod_annotation_prometheus_io_scrape"],
            "separator": ";",
            "regex": "true;.*|.*;true",
            "action": "keep",
        },
        # Finished pods keep their IP in status; their address may already belong to another pod.
        {"source_labels": ["__meta_kubernetes_pod_phase"], "regex": "Succeeded|Failed", "action": "drop"},
        {"target_label": "__tmp_port", "replacement": str(DEFAULT_METRICS_PORT)},
        {
            "source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_port"],
            "regex": "([0-9]+)",
            "target_label": "__tmp_port",
        },
        {
            "source_labels": [_meta_pod_label(METRICS_PORT_LABEL)],
            "regex": "([0-9]+)",
            "target_label": "__tmp_port",
        },
        {
            "source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_path"],
            "regex": "(/.+)",
            "target_label": "__metrics_path__",
        },
        # One target per pod, whatever ports its containers declare: identical targets collapse.
        {
            "source_labels": ["__meta_kubernetes_pod_ip", "__tmp_port"],
            "separator": ":",
            "regex": "(.+):([0-9]+)",
            "replacement": "$1:$2",
            "target_label": "__address__",
        },
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"},
    ]
    relabel.extend(
        {"source_labels": [_meta_pod_label(pod_label)], "target_label": series_label}
        for pod_label, series_label in SERIES_LABELS_FROM_POD_LABELS.items()
    )
    config = {
        "global": {"scrape_interval": interval, "scrape_timeout": timeout, "evaluation_interval": interval},
        "scrape_configs": [
            {
                "job_name": "goodput-pods",
                "honor_labels": False,
                "metrics_path": "/metrics",
                # Prometheus 3 refuses a scrape without a known Content-Type; plain test servers send none.
                "fallback_scrape_protocol": "PrometheusText0.0.4",
                "kubernetes_sd_configs": [{"role": "pod", "kubeconfig_file": str(layout.paths.kubeconfig)}],
                "relabel_configs": relabel,
            },
            _host_processes_job(layout, interval),
        ],
    }
    return yaml.safe_dump(config, sort_keys=False)


def _host_processes_job(layout: ClusterLayout, interval: str) -> dict[str, Any]:
    """Processes that run on the host, not in a pod (a gateway in front of a ModelGroup): each
    writes its address and labels (its namespace) to a file in one folder (`write_scrape_target`);
    Prometheus picks files up as they appear."""
    return {
        "job_name": "goodput-host-processes",
        "honor_labels": False,
        "metrics_path": "/metrics",
        "fallback_scrape_protocol": "PrometheusText0.0.4",
        "file_sd_configs": [
            {"files": [str(layout.paths.scrape_targets / "*.json")], "refresh_interval": interval}
        ],
    }


def write_scrape_target(paths: StatePaths, name: str, address: str, labels: dict[str, str]) -> Path:
    """Have the cluster's Prometheus scrape `address` (host:port) with `labels` on every series;
    written whole then renamed, so Prometheus never reads half a file. Delete the file to stop."""
    paths.scrape_targets.mkdir(parents=True, exist_ok=True)
    target = paths.scrape_targets / f"{name}.json"
    partial = target.with_suffix(".partial")
    partial.write_text(json.dumps([{"targets": [address], "labels": labels}]))
    partial.replace(target)
    return target


def _meta_pod_label(label: str) -> str:
    """Prometheus's meta label for a pod label: every character outside [a-zA-Z0-9_] becomes `_`."""
    return "__meta_kubernetes_pod_label_" + "".join(c if c.isalnum() or c == "_" else "_" for c in label)


def _prometheus_duration(seconds: float) -> str:
    milliseconds = round(seconds * 1000)
    if milliseconds <= 0:
        raise ValueError(f"duration must be positive, got {seconds} s")
    return f"{milliseconds // 1000}s" if milliseconds % 1000 == 0 else f"{milliseconds}ms"
