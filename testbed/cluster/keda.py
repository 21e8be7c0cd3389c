"""KEDA on the local cluster: its operator, its external-metrics API server, registered as the
cluster's `external.metrics.k8s.io`, so ScaledObjects drive the real HorizontalPodAutoscaler of the
local kube-controller-manager.

Both programs are built from KEDA's Go module (tools/keda) and run on the host as the control plane
does: the operator and the adapter talk over loopback (gRPC with mutual TLS from the cluster's CA);
the API server's aggregator reaches the adapter at a pod-like address in the harness's network
namespace, relayed to the adapter's loopback port (`relay.py`). `start` is idempotent per cluster;
`stop` deregisters the API first, so discovery never lists an API nobody serves.
"""

from __future__ import annotations

import base64
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from goodput.testbed.cluster import pki, processes
from goodput.testbed.cluster.binaries import repository_root
from goodput.testbed.cluster.config import LOOPBACK
from goodput.testbed.cluster.controlplane import ClusterError, LocalCluster, free_ports, log_tail
from goodput.testbed.cluster.kube import ApiError, probe

NAMESPACE = "keda"
ADAPTER_SERVICE = "keda-metrics-apiserver"
OPERATOR_SERVICE = "keda-operator"
EXTERNAL_METRICS_APISERVICE = "v1beta1.external.metrics.k8s.io"
RELAY_PORT = 6443
# Started in this order, stopped in reverse; `controlplane.down` stops them before the control plane.
PROCESSES = ("keda-operator", "keda-adapter", "keda-relay")
CERT_NAME = "keda"
BASELINES_DIR = repository_root() / "manifests" / "baselines"
BASELINE_FILES = {"keda": "keda-num-requests-waiting.yaml", "hpa": "hpa-gpu-utilisation.yaml"}
"""The two configurations platform teams run, by the name the A/B run gives each."""
SAMPLE_MODEL_GROUP, SAMPLE_SERVED_NAME, SAMPLE_NAMESPACE = "llama-8b", "llama-8b", "serving"


@dataclass(frozen=True, slots=True)
class KedaPorts:
    operator_metrics: int
    operator_health: int
    operator_grpc: int
    adapter_https: int
    adapter_metrics: int


@dataclass(frozen=True, slots=True)
class KedaLayout:
    """Everything KEDA's command lines depend on."""

    bin_dir: Path
    kubeconfig: Path
    cert_dir: Path
    netns: str
    extension_server_address: str
    ports: KedaPorts

    @property
    def operator_health_url(self) -> str:
        return f"http://{LOOPBACK}:{self.ports.operator_health}/readyz"


def operator_command(layout: KedaLayout) -> list[str]:
    return [
        str(layout.bin_dir / "keda-operator"),
        f"--kubeconfig={layout.kubeconfig}",
        "--leader-elect=false",
        f"--metrics-bind-address={LOOPBACK}:{layout.ports.operator_metrics}",
        f"--health-probe-bind-address={LOOPBACK}:{layout.ports.operator_health}",
        f"--metrics-service-bind-address={LOOPBACK}:{layout.ports.operator_grpc}",
        f"--cert-dir={layout.cert_dir}",  # ca.crt, tls.crt, tls.key: the gRPC link's mutual TLS
        f"--ca-dir={layout.cert_dir}",
        "--enable-cert-rotation=false",
        "--enable-webhook-patching=false",
        "--enable-apiservice-patching=false",
        "--zap-log-level=info",
        "--zap-encoder=console",
    ]


def adapter_command(layout: KedaLayout) -> list[str]:
    return [
        str(layout.bin_dir / "keda-adapter"),
        f"--kubeconfig={layout.kubeconfig}",
        f"--lister-kubeconfig={layout.kubeconfig}",
        f"--authentication-kubeconfig={layout.kubeconfig}",
        f"--authorization-kubeconfig={layout.kubeconfig}",
        f"--bind-address={LOOPBACK}",
        f"--secure-port={layout.ports.adapter_https}",
        f"--cert-dir={layout.cert_dir}",
        f"--tls-cert-file={layout.cert_dir / 'tls.crt'}",
        f"--tls-private-key-file={layout.cert_dir / 'tls.key'}",
        f"--metrics-service-address={LOOPBACK}:{layout.ports.operator_grpc}",
        f"--metrics-service-grpc-authority={OPERATOR_SERVICE}.{NAMESPACE}.svc",
        f"--port={layout.ports.adapter_metrics}",
    ]


def relay_command(layout: KedaLayout) -> list[str]:
    return [
        sys.executable,
        "-m",
        "goodput.testbed.cluster.relay",
        layout.netns,
        f"{layout.extension_server_address}:{RELAY_PORT}",
        str(layout.ports.adapter_https),
    ]


def process_env() -> dict[str, str]:
    """KEDA reads its own namespace from the environment when not in a pod; it watches all of them."""
    return {**os.environ, "POD_NAMESPACE": NAMESPACE, "KEDA_CLUSTER_OBJECT_NAMESPACE": NAMESPACE,
            "WATCH_NAMESPACE": ""}  # fmt: skip


def registration_objects(layout: KedaLayout, ca_bundle: bytes) -> list[tuple[str, dict[str, Any]]]:
    """(collection path, object) to create: the namespace, the adapter's selector-less Service with its
    Endpoints at the relay, and the APIService that sends external metrics to it."""
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": ADAPTER_SERVICE, "namespace": NAMESPACE},
        "spec": {"ports": [{"name": "https", "port": 443, "targetPort": RELAY_PORT, "protocol": "TCP"}]},
    }
    endpoints = {
        "apiVersion": "v1",
        "kind": "Endpoints",
        "metadata": {"name": ADAPTER_SERVICE, "namespace": NAMESPACE},
        "subsets": [
            {
                "addresses": [{"ip": layout.extension_server_address}],
                "ports": [{"name": "https", "port": RELAY_PORT, "protocol": "TCP"}],
            }
        ],
    }
    apiservice = {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": EXTERNAL_METRICS_APISERVICE},
        "spec": {
            "group": "external.metrics.k8s.io",
            "version": "v1beta1",
            "service": {"name": ADAPTER_SERVICE, "namespace": NAMESPACE, "port": 443},
            "caBundle": base64.b64encode(ca_bundle).decode(),
            "groupPriorityMinimum": 100,
            "versionPriority": 100,
        },
    }
    return [
        ("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}),
        (f"/api/v1/namespaces/{NAMESPACE}/services", service),
        (f"/api/v1/namespaces/{NAMESPACE}/endpoints", endpoints),
        ("/apis/apiregistration.k8s.io/v1/apiservices", apiservice),
    ]


def render_baseline(
    scaler: str,
    *,
    namespace: str,
    model_group: str,
    served_name: str,
    prometheus_url: str,
    min_groups: int,
    max_groups: int,
    threshold: float | None = None,
    directory: Path | None = None,
) -> dict[str, Any]:
    """A ScaledObject of manifests/baselines as a platform team would apply it to its own ModelGroup:
    its Prometheus, namespace, names and bounds; the query's shape unchanged, and the threshold too
    unless one tuned for this traffic is given."""
    path = (directory or BASELINES_DIR) / BASELINE_FILES[scaler]
    scaled_object: dict[str, Any] = yaml.safe_load(path.read_text())
    meta, spec = scaled_object["metadata"], scaled_object["spec"]
    meta["name"] = model_group + meta["name"].removeprefix(SAMPLE_MODEL_GROUP)
    meta["namespace"] = namespace
    spec["scaleTargetRef"]["name"] = model_group
    spec["minReplicaCount"], spec["maxReplicaCount"] = min_groups, max_groups
    trigger = spec["triggers"][0]["metadata"]
    trigger["serverAddress"] = prometheus_url
    if threshold is not None:
        trigger["threshold"] = f"{threshold:g}"
    trigger["query"] = (
        trigger["query"]
        .replace(f'namespace="{SAMPLE_NAMESPACE}"', f'namespace="{namespace}"')
        .replace(f'model_name="{SAMPLE_SERVED_NAME}"', f'model_name="{served_name}"')
        .replace(f'pod=~"{SAMPLE_MODEL_GROUP}-', f'pod=~"{model_group}-')
    )
    return scaled_object


def layout_for(cluster: LocalCluster) -> KedaLayout:
    if cluster.netns is None:
        raise ClusterError("KEDA needs the cluster's network namespace (started without --no-netns)")
    return KedaLayout(
        bin_dir=cluster.bin_dir,
        kubeconfig=Path(cluster.kubeconfig),
        cert_dir=cluster.state_dir / "keda-certs",
        netns=cluster.netns,
        extension_server_address=cluster.network.extension_server_address,
        ports=KedaPorts(*free_ports(len(KedaPorts.__dataclass_fields__))),
    )


def start(cluster: LocalCluster, *, timeout_seconds: float = 120.0) -> KedaLayout:
    """Install KEDA's CRDs, start its operator and adapter, register the external-metrics API and wait
    until the API server reports it Available. Raises ClusterError with the failing part's log."""
    stop(cluster)  # a previous start of this cluster, if any: one KEDA per cluster
    layout = layout_for(cluster)
    _write_certificates(cluster, layout.cert_dir)
    cluster.kubectl("apply", "--server-side", "-f", str(cluster.bin_dir / "keda-crds"))
    cluster.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s", "-f", str(cluster.bin_dir / "keda-crds")
    )
    for path, obj in registration_objects(layout, (layout.cert_dir / "ca.crt").read_bytes()):
        try:
            cluster.api.create(path, obj)
        except ApiError as error:
            if error.status != 409:
                raise
    paths = cluster.layout.paths
    commands = {"keda-operator": operator_command(layout), "keda-adapter": adapter_command(layout),
                "keda-relay": relay_command(layout)}  # fmt: skip
    for name in PROCESSES:
        processes.spawn(name, commands[name], log_path=paths.log(name), pid_dir=paths.pids, env=process_env())
    deadline = time.monotonic() + timeout_seconds
    _wait(cluster, "keda-operator", deadline, lambda: probe(layout.operator_health_url))
    _wait(cluster, "keda-adapter", deadline, lambda: _apiservice_available(cluster))
    return layout


def stop(cluster: LocalCluster) -> list[str]:
    """Deregister the external-metrics API, then stop KEDA's processes; returns those that were running."""
    try:
        cluster.api.delete(f"/apis/apiregistration.k8s.io/v1/apiservices/{EXTERNAL_METRICS_APISERVICE}")
    except ApiError as error:
        if error.status != 404:
            raise
    return stop_processes(cluster.layout.paths.pids)


def stop_processes(pid_dir: Path) -> list[str]:
    records = processes.read_records(pid_dir)
    return [name for name in reversed(PROCESSES) if name in records and processes.stop(records[name])]


def _write_certificates(cluster: LocalCluster, cert_dir: Path) -> None:
    """One pair for both ends of the operator-adapter link and the adapter's HTTPS, in the file names
    KEDA reads from its cert dir."""
    pki_dir = cluster.layout.paths.pki
    names = [f"{service}.{NAMESPACE}.svc" for service in (ADAPTER_SERVICE, OPERATOR_SERVICE)]
    pki.issue_service_certificate(pki_dir, CERT_NAME, names)
    cert_dir.mkdir(exist_ok=True)
    (cert_dir / "ca.crt").write_bytes((pki_dir / "ca.crt").read_bytes())
    (cert_dir / "tls.crt").write_bytes((pki_dir / f"{CERT_NAME}.crt").read_bytes())
    (cert_dir / "tls.key").write_bytes((pki_dir / f"{CERT_NAME}.key").read_bytes())
    (cert_dir / "tls.key").chmod(0o600)


def hpa_name(scaled_object: str) -> str:
    """The HorizontalPodAutoscaler KEDA creates for a ScaledObject (unless the ScaledObject names one in
    `advanced.horizontalPodAutoscalerConfig.name`)."""
    return f"keda-hpa-{scaled_object}"


def scaling_problem_of(
    scaled_object: dict[str, Any] | None, hpa: dict[str, Any] | None, warning: dict[str, Any] | None = None
) -> str | None:
    """Why a ScaledObject does not scale its target yet, in KEDA's and the HPA's own words (with KEDA's
    latest Warning Event on it, which names the scaler's error); None once KEDA has it Ready and the
    HPA computes a replica count from its metric."""
    if scaled_object is None:
        return "the ScaledObject is gone"
    name = scaled_object["metadata"]["name"]
    ready = _condition(scaled_object, "Ready")
    if ready is not None and ready.get("status") == "False":
        detail = f" ({warning.get('reason')}: {warning.get('message')})" if warning else ""
        return f"ScaledObject {name} is not Ready: {ready.get('reason')}: {ready.get('message')}{detail}"
    if hpa is None:
        return f"KEDA has made no HorizontalPodAutoscaler for ScaledObject {name} yet"
    active = _condition(hpa, "ScalingActive")
    if active is None:
        return f"HPA {hpa['metadata']['name']} has not computed a replica count yet"
    if active.get("status") != "True":
        return f"HPA {hpa['metadata']['name']} cannot scale: {active.get('reason')}: {active.get('message')}"
    return None


def scaling_problem(cluster: LocalCluster, namespace: str, scaled_object: str) -> str | None:
    found = cluster.api.get(f"/apis/keda.sh/v1alpha1/namespaces/{namespace}/scaledobjects/{scaled_object}")
    hpa = cluster.api.get(
        f"/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers/{hpa_name(scaled_object)}"
    )
    if found is None:
        return scaling_problem_of(None, hpa)
    # This ScaledObject's own Events (by uid: an earlier one of the same name left its own).
    uid = found["metadata"]["uid"]
    events = cluster.api.get(
        f"/api/v1/namespaces/{namespace}/events?fieldSelector=involvedObject.uid%3D{uid},type%3DWarning"
    )
    warnings = sorted((events or {}).get("items", []), key=lambda e: e.get("lastTimestamp") or "")
    return scaling_problem_of(found, hpa, warnings[-1] if warnings else None)


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == kind), None)


def serving(cluster: LocalCluster) -> bool:
    """Whether the cluster's API server reports the external-metrics API Available."""
    return _apiservice_available(cluster)[0]


def _apiservice_available(cluster: LocalCluster) -> tuple[bool, str]:
    try:
        apiservice = cluster.api.get(
            f"/apis/apiregistration.k8s.io/v1/apiservices/{EXTERNAL_METRICS_APISERVICE}"
        )
    except ApiError as error:
        return False, str(error)
    if apiservice is None:
        return False, f"APIService {EXTERNAL_METRICS_APISERVICE} is not registered"
    for condition in apiservice.get("status", {}).get("conditions", []):
        if condition.get("type") == "Available":
            return condition.get("status") == "True", f"{condition.get('reason')}: {condition.get('message')}"
    return False, "no Available condition yet"


def _wait(cluster: LocalCluster, name: str, deadline: float, check: Any) -> None:
    paths = cluster.layout.paths
    detail = "no answer yet"
    while time.monotonic() < deadline:
        for process in PROCESSES:
            record = processes.read_records(paths.pids).get(process)
            if record is None or not processes.is_running(record):
                raise ClusterError(
                    f"{process} exited during start-up; last lines of its log:\n{log_tail(paths, process)}"
                )
        ready, detail = check()
        if ready:
            return
        time.sleep(0.5)
    raise ClusterError(
        f"{name} not ready in time ({detail}); last lines of its log:\n{log_tail(paths, name)}"
    )
