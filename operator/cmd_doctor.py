"""`goodput doctor`: does this cluster give goodput what it needs? One line per check, with a fix.

It reads the API server (the CRDs, the operator's Deployment and what its ServiceAccount may do,
the ModelGroups, the nodes' GPUs and DeviceClasses, PodMonitors and Prometheus resources, the
gateways) and Prometheus (the autoscaler's own snapshot query for each ModelGroup, and two probes
that say why a Ready group is missing from it), then hands both readings to the pure checks of
`doctor`. Prometheus is asked with the operator's configuration: its Deployment's GOODPUT_PROMETHEUS_*
values, under this process's own GOODPUT_* environment, under the flags. The exit code is 1 when a
check fails, so a pipeline can gate on it.

Run where the operator runs (`kubectl exec -n NS deploy/NAME -- goodput doctor`) it checks with the
operator's network, token and CA files; run from a workstation it needs a Prometheus URL it can
reach (`--prometheus-url` after `kubectl port-forward`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from goodput.api.base import GROUP, VERSION
from goodput.api.crd import MODEL_GROUP, SLO_POLICY
from goodput.operator.doctor import (
    OPERATOR_PERMISSIONS,
    AccessAnswer,
    ClusterReading,
    GatewayInstall,
    LeaderSeries,
    OperatorInstall,
    Permission,
    PrometheusReading,
    exit_code,
    ready_leaders,
    render,
    run_checks,
)
from goodput.operator.kube import KubeApi, KubeError
from goodput.operator.metrics_source import (
    MetricsUnavailableError,
    PrometheusConnection,
    PrometheusMetricsSource,
)
from goodput.operator.promql import (
    SeriesLabels,
    Windows,
    leader_series_query,
    leader_targets_query,
    snapshot_query,
)
from goodput.operator.settings import Settings

PART_OF = "app.kubernetes.io/part-of=goodput"
OPERATOR_SELECTOR = f"{PART_OF},app.kubernetes.io/component=operator"
GATEWAY_SELECTOR = f"{PART_OF},app.kubernetes.io/component=gateway"
# The windows of doctor's snapshot query: the gauges it checks are instant; the windows only shape
# the histogram sub-queries, which doctor does not judge.
HISTOGRAM_WINDOW_SECONDS = 300


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    parser.add_argument("--context", help="kubeconfig context (default: the current one)")
    parser.add_argument(
        "-n",
        "--namespace",
        dest="namespaces",
        action="append",
        help="a namespace whose ModelGroups to check (repeatable; default: the operator's, else all)",
    )
    parser.add_argument(
        "--operator", help="the operator's Deployment as NAMESPACE/NAME (default: found by its labels)"
    )
    parser.add_argument("--prometheus-url", help="Prometheus to ask (default: the operator's)")
    parser.add_argument("--prometheus-bearer-token-file", help="a file holding the bearer token to send")
    parser.add_argument("--prometheus-ca-file", help="a PEM bundle that verifies Prometheus' certificate")
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table")


# --- reading the API server --------------------------------------------------------------------------


class ApiReader:
    """GETs that record what this account may not read instead of stopping at it."""

    def __init__(self, kube: KubeApi) -> None:
        self.kube = kube
        self.unreadable: dict[str, str] = {}

    def get(self, what: str, path: str, query: Mapping[str, str] | None = None) -> Any:
        """The answer; None when the object or kind does not exist or may not be read."""
        try:
            return self.kube.request("GET", what, path, query=query)
        except KubeError as error:
            if error.status != 404:
                self.unreadable[what] = str(error)
            return None

    def items(self, what: str, path: str, selector: str = "") -> tuple[dict[str, Any], ...]:
        answer = self.get(what, path, {"labelSelector": selector} if selector else None)
        return tuple((answer or {}).get("items") or ())


def _literal_env(deployment: Mapping[str, Any]) -> dict[str, str]:
    containers = (((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers")
    operator = next((c for c in containers or () if c.get("name") == "operator"), (containers or [{}])[0])
    return {item["name"]: str(item["value"]) for item in operator.get("env") or () if "value" in item}


def _install(deployment: Mapping[str, Any]) -> OperatorInstall:
    metadata = deployment.get("metadata") or {}
    pod = ((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}
    return OperatorInstall(
        namespace=str(metadata.get("namespace")),
        name=str(metadata.get("name")),
        service_account=str(pod.get("serviceAccountName") or "default"),
        environment=_literal_env(deployment),
    )


def find_operator(reader: ApiReader, named: str | None, namespaces: Sequence[str]) -> OperatorInstall | None:
    """The Deployment named NS/NAME, else the chart's operator that serves `namespaces` (one that
    lists them all, else one that watches every namespace), else the first found."""
    if named:
        namespace, _, name = named.partition("/")
        found = reader.get("deployments", f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}")
        return _install(found) if found else None
    installs = [
        _install(d) for d in reader.items("deployments", "/apis/apps/v1/deployments", OPERATOR_SELECTOR)
    ]
    listing = [
        i for i in installs if _watched_namespaces(i) and set(namespaces) <= set(_watched_namespaces(i))
    ]
    everywhere = [i for i in installs if not _watched_namespaces(i)]
    return next(iter(listing + everywhere + installs), None)


def _argument(args: Sequence[str], flag: str) -> str:
    """`--flag=value` or `--flag value` in a container's args."""
    for index, arg in enumerate(args):
        if arg.startswith(f"{flag}="):
            return arg.split("=", 1)[1]
        if arg == flag and index + 1 < len(args):
            return args[index + 1]
    return ""


def find_gateways(reader: ApiReader) -> tuple[GatewayInstall, ...]:
    gateways = []
    for deployment in reader.items("deployments", "/apis/apps/v1/deployments", GATEWAY_SELECTOR):
        metadata = deployment["metadata"]
        namespace, name = metadata["namespace"], metadata["name"]
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        args = [*container.get("command", ()), *container.get("args", ())]
        slices = reader.items(
            "endpointslices",
            f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices",
            f"kubernetes.io/service-name={name}",
        )
        ready = sum(
            1
            for item in slices
            for endpoint in item.get("endpoints") or ()
            if (endpoint.get("conditions") or {}).get("ready") is not False
        )
        gateways.append(
            GatewayInstall(
                namespace=namespace,
                name=name,
                model_group_namespace=_argument(args, "--namespace") or namespace,
                model_group=_argument(args, "--model-group"),
                available_replicas=int((deployment.get("status") or {}).get("availableReplicas") or 0),
                ready_endpoints=ready,
            )
        )
    return tuple(gateways)


def access_review(permission: Permission, namespace: str, account: str) -> dict[str, Any]:
    """A SubjectAccessReview of one permission for a ServiceAccount (NS/NAME), with the groups the
    API server gives every ServiceAccount token (RBAC bindings to them count)."""
    home, name = account.split("/", 1)
    attributes = {"group": permission.api_group, "resource": permission.resource, "verb": permission.verb}
    if permission.subresource:
        attributes["subresource"] = permission.subresource
    if namespace:
        attributes["namespace"] = namespace
    groups = ["system:serviceaccounts", f"system:serviceaccounts:{home}", "system:authenticated"]
    return {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": f"system:serviceaccount:{home}:{name}",
            "groups": groups,
            "resourceAttributes": attributes,
        },
    }


def review_access(kube: KubeApi, account: str, namespaces: Sequence[str]) -> tuple[AccessAnswer, ...]:
    """Every operator permission for `account` in each namespace (cluster-scoped ones once); one
    unanswered review ends the asking (this account may not create them)."""
    answers = []
    for permission in OPERATOR_PERMISSIONS:
        for where in [""] if permission.cluster_scoped else list(namespaces) or [""]:
            try:
                review = kube.request(
                    "POST",
                    "subjectaccessreviews",
                    "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                    access_review(permission, where, account),
                )
            except KubeError as error:
                return (AccessAnswer(permission, where, None, str(error)),)
            status = review.get("status") or {}
            answers.append(
                AccessAnswer(permission, where, bool(status.get("allowed")), status.get("reason", ""))
            )
    return tuple(answers)


def _model_groups(reader: ApiReader, namespaces: Sequence[str]) -> tuple[dict[str, Any], ...]:
    base = f"/apis/{GROUP}/{VERSION}"
    if not namespaces:
        return reader.items("modelgroups", f"{base}/modelgroups")
    return tuple(
        item
        for namespace in namespaces
        for item in reader.items("modelgroups", f"{base}/namespaces/{namespace}/modelgroups")
    )


def _monitoring(
    reader: ApiReader,
) -> tuple[tuple[dict[str, Any], ...] | None, tuple[dict[str, Any], ...], dict[str, dict[str, str]]]:
    """The PodMonitors (None without the kind), the Prometheus resources, and their namespaces' labels."""
    monitors_answer = reader.get("podmonitors", "/apis/monitoring.coreos.com/v1/podmonitors")
    if monitors_answer is None:
        return None, (), {}
    monitors = tuple(monitors_answer.get("items") or ())
    prometheuses = reader.items("prometheuses", "/apis/monitoring.coreos.com/v1/prometheuses")
    labels = {}
    for namespace in sorted({str(m["metadata"]["namespace"]) for m in monitors}):
        found = reader.get("namespaces", f"/api/v1/namespaces/{namespace}") or {}
        labels[namespace] = dict((found.get("metadata") or {}).get("labels") or {})
    return monitors, prometheuses, labels


def read_cluster(kube: KubeApi, namespaces: Sequence[str], operator_name: str | None) -> ClusterReading:
    """Everything the checks judge from the API server, read once."""
    reader = ApiReader(kube)
    crds = {
        resource.crd_name: reader.get(
            "customresourcedefinitions",
            f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{resource.crd_name}",
        )
        for resource in (MODEL_GROUP, SLO_POLICY)
    }
    operator = find_operator(reader, operator_name, namespaces)
    watched = list(namespaces) or _watched_namespaces(operator)
    model_groups = _model_groups(reader, watched)
    scope = watched or sorted({str(mg["metadata"]["namespace"]) for mg in model_groups})
    access = (
        review_access(kube, f"{operator.namespace}/{operator.service_account}", scope) if operator else ()
    )
    classes = {
        str(name): reader.get("deviceclasses", f"/apis/resource.k8s.io/v1/deviceclasses/{name}")
        for mg in model_groups
        if (name := ((mg.get("spec") or {}).get("engine") or {}).get("gpuDeviceClassName"))
    }
    slices = reader.items("resourceslices", "/apis/resource.k8s.io/v1/resourceslices") if classes else ()
    monitors, prometheuses, namespace_labels = _monitoring(reader)
    return ClusterReading(
        crds=crds,
        operator=operator,
        access=access,
        model_groups=model_groups,
        nodes=reader.items("nodes", "/api/v1/nodes"),
        device_classes=classes,
        resource_slices=slices,
        pod_monitors=monitors,
        prometheuses=prometheuses,
        namespace_labels=namespace_labels,
        gateways=find_gateways(reader),
        unreadable=dict(reader.unreadable),
    )


def _watched_namespaces(operator: OperatorInstall | None) -> list[str]:
    raw = (operator.environment if operator else {}).get("GOODPUT_NAMESPACES", "")
    return [part.strip() for part in raw.split(",") if part.strip()]


# --- reading Prometheus ----------------------------------------------------------------------------------


def doctor_settings(
    args: argparse.Namespace, environ: Mapping[str, str], operator: OperatorInstall | None
) -> Settings:
    """The operator's Prometheus settings: its Deployment's values, under this process's GOODPUT_*
    environment, under the flags."""
    deployed = {
        k: v
        for k, v in (operator.environment if operator else {}).items()
        if k.startswith("GOODPUT_PROMETHEUS_")
    }
    own = {k: v for k, v in environ.items() if k.startswith("GOODPUT_PROMETHEUS_")}
    flags = {
        "prometheus_url": args.prometheus_url,
        "prometheus_bearer_token_file": args.prometheus_bearer_token_file,
        "prometheus_ca_file": args.prometheus_ca_file,
    }
    return Settings.from_sources(flags, {**deployed, **own})


def _auth(settings: Settings) -> str:
    parts = [
        f"bearer token from {settings.prometheus_bearer_token_file}"
        if settings.prometheus_bearer_token_file
        else "no token"
    ]
    if settings.prometheus_ca_file:
        parts.append(f"CA {settings.prometheus_ca_file}")
    if settings.prometheus_headers.strip():
        parts.append(f"headers {', '.join(sorted(json.loads(settings.prometheus_headers)))}")
    return ", ".join(parts)


def _leader_series(
    source: PrometheusMetricsSource, model_group: Mapping[str, Any], windows: Windows
) -> LeaderSeries:
    metadata = model_group["metadata"]
    namespace, name = str(metadata["namespace"]), str(metadata["name"])
    pods = tuple(pod for _, pod in ready_leaders(model_group))
    try:
        snapshot = tuple(source.query(snapshot_query(source.labels, namespace, name, windows)))
        if not pods:
            return LeaderSeries(snapshot)
        labelled = tuple(source.query(leader_series_query(source.labels, namespace, pods)))
        targets = tuple(source.query(leader_targets_query(source.labels, namespace, pods)))
    except MetricsUnavailableError as error:
        return LeaderSeries(error=str(error))
    return LeaderSeries(snapshot, labelled, targets)


def read_prometheus(settings: Settings, model_groups: Sequence[Mapping[str, Any]]) -> PrometheusReading:
    """A first query that says whether Prometheus answers, then each ModelGroup's series."""
    url = settings.prometheus_url
    try:
        connection = PrometheusConnection.from_settings(
            bearer_token_file=settings.prometheus_bearer_token_file,
            ca_file=settings.prometheus_ca_file,
            headers_json=settings.prometheus_headers,
        )
    except ValueError as error:
        return PrometheusReading(url, "", f"{error} on this machine", "elsewhere")
    labels = SeriesLabels(
        settings.prometheus_label_namespace,
        settings.prometheus_label_model_group,
        settings.prometheus_label_group,
    )
    source = PrometheusMetricsSource(
        url, labels, timeout_seconds=settings.prometheus_timeout_seconds, connection=connection
    )
    try:
        source.query("vector(1)")
    except MetricsUnavailableError as error:
        source.close()
        return PrometheusReading(url, _auth(settings), str(error), error.kind)
    windows = Windows(max(1, round(settings.prometheus_rate_window_seconds)), HISTOGRAM_WINDOW_SECONDS)
    try:
        series = {
            (str(mg["metadata"]["namespace"]), str(mg["metadata"]["name"])): _leader_series(
                source, mg, windows
            )
            for mg in model_groups
        }
    finally:
        source.close()
    return PrometheusReading(url, _auth(settings), series=series)


def run(args: argparse.Namespace) -> int:
    try:
        kube, _ = KubeApi.from_kubeconfig(args.kubeconfig, args.context)
    except Exception as error:  # a missing or broken kubeconfig: say so, not a traceback
        print(f"goodput doctor: {error}", file=sys.stderr)
        return 2
    # In the operator's pod its own GOODPUT_NAMESPACES say where its ModelGroups are.
    watched = Settings.from_sources({}, {k: v for k, v in os.environ.items() if k == "GOODPUT_NAMESPACES"})
    cluster = read_cluster(kube, args.namespaces or list(watched.namespaces), args.operator)
    try:
        settings = doctor_settings(args, os.environ, cluster.operator)
    except ValueError as error:
        print(f"goodput doctor: {error}", file=sys.stderr)
        return 2
    prometheus = read_prometheus(settings, cluster.model_groups)
    labels = SeriesLabels(
        settings.prometheus_label_namespace,
        settings.prometheus_label_model_group,
        settings.prometheus_label_group,
    )
    results = run_checks(cluster, prometheus, labels)
    if args.output == "json":
        print(json.dumps([asdict(result) for result in results], indent=2))
    else:
        print(render(results))
    return exit_code(results)
