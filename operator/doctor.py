"""What `goodput doctor` checks, as pure functions over what it read.

On a platform team's own cluster the first sign that goodput cannot see its fleet is a ModelGroup
that never scales: a NetworkPolicy that keeps Prometheus out, a PodMonitor that no Prometheus
selects, a scrape that drops the labels the autoscaler selects by, a GPU resource no node
advertises. Each check here takes a frozen reading of the API server (`ClusterReading`) and of
Prometheus (`PrometheusReading`) and returns `CheckResult`s: a name, ok, warn or fail, what was
found, and what to do about it. The shell (`cmd_doctor`) does the reading; nothing here does I/O,
so every verdict is tested from a table of readings.

The series checked are the autoscaler's own: the snapshot query of `promql`, parsed by
`metrics_source`, so a ModelGroup that passes here is one the autoscaler can decide on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from goodput.api import vllm_names
from goodput.api.base import VERSION
from goodput.api.crd import MODEL_GROUP, SLO_POLICY
from goodput.controllers import naming
from goodput.controllers.groups.dynamic_resources import (
    class_devices,
    parse_device_class,
    parse_resource_slice,
)
from goodput.operator.metrics_source import (
    REQUIRED_QUANTITIES,
    GroupSeries,
    gateway_from_result,
    parse_query_result,
)
from goodput.operator.promql import POD_LABEL, RUNNING_METRIC, SeriesLabels

Series = tuple[Mapping[str, Any], ...]
"""The result of one instant query: each series' `metric` labels and `value`."""
ModelGroupKey = tuple[str, str]


class Verdict(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True, slots=True)
class CheckResult:
    name: str
    verdict: Verdict
    found: str
    fix: str = ""


@dataclass(frozen=True, slots=True)
class Permission:
    """One thing the operator's ServiceAccount must be allowed, as a SubjectAccessReview asks it."""

    api_group: str
    resource: str
    verb: str
    subresource: str = ""
    cluster_scoped: bool = False

    def describe(self) -> str:
        resource = f"{self.resource}/{self.subresource}" if self.subresource else self.resource
        return f"{self.verb} {resource}" + (f".{self.api_group}" if self.api_group else "")


# What the operator does in every namespace it serves, one request of each kind: a denial of any
# of them stops a reconcile or a decision (the chart's _rbac.tpl grants them; tests/test_doctor.py
# holds this table to the rendered roles).
OPERATOR_PERMISSIONS: tuple[Permission, ...] = (
    Permission("goodput.dev", "modelgroups", "watch"),
    Permission("goodput.dev", "modelgroups", "patch"),
    Permission("goodput.dev", "modelgroups", "patch", "status"),
    Permission("goodput.dev", "modelgroups", "patch", "scale"),
    Permission("goodput.dev", "slopolicies", "watch"),
    Permission("goodput.dev", "slopolicies", "patch", "status"),
    Permission("", "pods", "watch"),
    Permission("", "pods", "create"),
    Permission("", "pods", "delete"),
    Permission("", "pods", "patch", "status"),
    Permission("", "services", "create"),
    Permission("discovery.k8s.io", "endpointslices", "watch"),
    Permission("", "events", "create"),
    Permission("", "nodes", "watch", cluster_scoped=True),
)


@dataclass(frozen=True, slots=True)
class AccessAnswer:
    permission: Permission
    namespace: str
    """Where it was asked; empty: in every namespace (or cluster-scoped)."""
    allowed: bool | None
    """None: not answered (the account running doctor may not create SubjectAccessReviews)."""
    detail: str = ""


@dataclass(frozen=True, slots=True)
class OperatorInstall:
    """The operator's Deployment: where it runs, as whom, and its literal environment."""

    namespace: str
    name: str
    service_account: str
    environment: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class GatewayInstall:
    """A gateway Deployment of the chart, the ModelGroup it serves, and how much of it answers."""

    namespace: str
    name: str
    model_group_namespace: str
    model_group: str
    available_replicas: int
    ready_endpoints: int


@dataclass(frozen=True, slots=True)
class ClusterReading:
    """What the API server answered; an empty field is what was read as empty."""

    crds: Mapping[str, Mapping[str, Any] | None] = field(default_factory=dict)
    operator: OperatorInstall | None = None
    access: tuple[AccessAnswer, ...] = ()
    model_groups: tuple[Mapping[str, Any], ...] = ()
    nodes: tuple[Mapping[str, Any], ...] = ()
    device_classes: Mapping[str, Mapping[str, Any] | None] = field(default_factory=dict)
    resource_slices: tuple[Mapping[str, Any], ...] = ()
    pod_monitors: tuple[Mapping[str, Any], ...] | None = None
    """None: the cluster serves no PodMonitor kind (no Prometheus Operator)."""
    prometheuses: tuple[Mapping[str, Any], ...] = ()
    namespace_labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    gateways: tuple[GatewayInstall, ...] = ()
    unreadable: Mapping[str, str] = field(default_factory=dict)
    """What the account running doctor could not read, and the API server's answer."""


@dataclass(frozen=True, slots=True)
class LeaderSeries:
    """One ModelGroup's answers: the autoscaler's snapshot query, and the two probes that say why a
    ready group is missing from it (`promql.leader_series_query`, `promql.leader_targets_query`)."""

    snapshot: Series = ()
    labelled: Series = ()
    targets: Series = ()
    error: str = ""


@dataclass(frozen=True, slots=True)
class PrometheusReading:
    url: str
    auth: str
    """How the queries were sent: token, CA bundle, headers (never their values)."""
    error: str = ""
    """Empty: Prometheus answered."""
    error_kind: str = ""
    """'unreachable', 'timeout', 'answer', or 'elsewhere' (a setting names a file in the operator's
    pod that this machine does not have)."""
    series: Mapping[ModelGroupKey, LeaderSeries] = field(default_factory=dict)


# --- CRDs and RBAC ----------------------------------------------------------------------------------


def _condition_true(body: Mapping[str, Any], kind: str) -> bool:
    conditions = (body.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == kind and c.get("status") == "True" for c in conditions)


def check_crds(reading: ClusterReading) -> CheckResult:
    """Both kinds installed, Established and serving the version this goodput speaks."""
    if "customresourcedefinitions" in reading.unreadable:
        return CheckResult(
            "crds",
            Verdict.WARN,
            f"cannot read CRDs: {reading.unreadable['customresourcedefinitions']}",
            "run doctor as a user who may get customresourcedefinitions",
        )
    problems = []
    for resource in (MODEL_GROUP, SLO_POLICY):
        body = reading.crds.get(resource.crd_name)
        if body is None:
            problems.append(f"{resource.crd_name} is missing")
        elif not _condition_true(body, "Established"):
            problems.append(f"{resource.crd_name} is not Established")
        elif VERSION not in {
            v.get("name") for v in (body.get("spec") or {}).get("versions") or () if v.get("served")
        }:
            problems.append(f"{resource.crd_name} does not serve {VERSION}")
    if problems:
        return CheckResult(
            "crds",
            Verdict.FAIL,
            "; ".join(problems),
            "install them with the chart (crds.install=true, the default) or "
            "`kubectl apply --server-side -f crds/` from the same goodput release",
        )
    return CheckResult("crds", Verdict.OK, f"ModelGroup and SLOPolicy CRDs Established, serving {VERSION}")


def check_rbac(reading: ClusterReading) -> CheckResult:
    """The operator's ServiceAccount may do what the operator does, where its ModelGroups are."""
    operator = reading.operator
    if operator is None and "deployments" in reading.unreadable:
        return CheckResult(
            "rbac",
            Verdict.WARN,
            f"cannot look for the operator's Deployment: {reading.unreadable['deployments']}",
            "run doctor as a user who may list deployments, or name it with --operator NAMESPACE/NAME",
        )
    if operator is None:
        return CheckResult(
            "rbac",
            Verdict.WARN,
            "no goodput operator Deployment found (labels app.kubernetes.io/part-of=goodput, "
            "app.kubernetes.io/component=operator): its permissions were not checked",
            "install the chart, or name the operator's Deployment with --operator NAMESPACE/NAME",
        )
    account = f"ServiceAccount {operator.namespace}/{operator.service_account}"
    denied = [answer for answer in reading.access if answer.allowed is False]
    unknown = [answer for answer in reading.access if answer.allowed is None]
    if denied:
        listed = "; ".join(f"{a.permission.describe()} in {a.namespace or 'every namespace'}" for a in denied)
        return CheckResult(
            "rbac",
            Verdict.FAIL,
            f"{account} may not: {listed}",
            "`helm upgrade` the release with rbac.create=true, and with every namespace that runs "
            "ModelGroups in watchNamespaces (or watchNamespaces empty for all)",
        )
    if unknown or not reading.access:
        detail = unknown[0].detail if unknown else "nothing was asked"
        return CheckResult(
            "rbac",
            Verdict.WARN,
            f"could not ask the API server what {account} may do: {detail}",
            "run doctor as a user who may create subjectaccessreviews (e.g. cluster-admin)",
        )
    scoped = {a.namespace for a in reading.access if not a.permission.cluster_scoped}
    namespaces = sorted(namespace or "every namespace" for namespace in scoped)
    return CheckResult(
        "rbac",
        Verdict.OK,
        f"{account} may do the {len(OPERATOR_PERMISSIONS)} kinds of request the operator makes, "
        f"in {', '.join(namespaces)}",
    )


# --- Prometheus ---------------------------------------------------------------------------------------


def _prometheus_fix(reading: PrometheusReading) -> str:
    text = reading.error.lower()
    if reading.error_kind == "elsewhere":
        return (
            "check from inside the operator's pod, with its files and its network: "
            "`kubectl exec -n NAMESPACE deploy/NAME -- goodput doctor`"
        )
    if "401" in text or "403" in text:
        return (
            "Prometheus refuses the configured credentials: set prometheus.bearerTokenFile (or "
            "GOODPUT_PROMETHEUS_BEARER_TOKEN_FILE) to a token it accepts, and prometheus.headers for a "
            "tenant (X-Scope-OrgID)"
        )
    if "ssl" in text or "certificate" in text:
        return (
            "point prometheus.caFile (GOODPUT_PROMETHEUS_CA_FILE) at the CA bundle that signed "
            "Prometheus' certificate"
        )
    if reading.error_kind == "timeout":
        return "Prometheus is overloaded or filtered: check it, or raise GOODPUT_PROMETHEUS_TIMEOUT_SECONDS"
    return (
        "check prometheus.url (GOODPUT_PROMETHEUS_URL) and that networkPolicy.prometheus admits it; from "
        "outside the cluster pass --prometheus-url after `kubectl port-forward`, or run doctor in the "
        "operator's pod (`kubectl exec -n NAMESPACE deploy/NAME -- goodput doctor`)"
    )


def check_prometheus(reading: PrometheusReading) -> CheckResult:
    """Prometheus answers a query sent the way the autoscaler sends its own."""
    if reading.error:
        verdict = Verdict.WARN if reading.error_kind == "elsewhere" else Verdict.FAIL
        return CheckResult("prometheus", verdict, reading.error, _prometheus_fix(reading))
    return CheckResult("prometheus", Verdict.OK, f"{reading.url} answered ({reading.auth})")


# --- the vLLM series and their monitor ------------------------------------------------------------------


def label_selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector against labels; the empty selector matches everything."""
    if any(labels.get(key) != value for key, value in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or ():
        key, values = expression.get("key", ""), expression.get("values") or ()
        present = key in labels
        matched = {
            "In": present and labels[key] in values,
            "NotIn": not present or labels[key] not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }.get(str(expression.get("operator")), False)
        if not matched:
            return False
    return True


def leader_labels(model_group: str) -> dict[str, str]:
    """The labels the operator gives a group leader (`controllers.groups.pods`), as a monitor sees them."""
    return {
        naming.LABEL_METRICS: "true",
        naming.LABEL_MODEL_GROUP: model_group,
        naming.LABEL_GROUP: "g1",
        naming.LABEL_RANK: "0",
        naming.LABEL_MANAGED_BY: naming.MANAGED_BY,
    }


def _meta(body: Mapping[str, Any]) -> tuple[str, str]:
    metadata = body.get("metadata") or {}
    return str(metadata.get("namespace") or ""), str(metadata.get("name") or "")


def _monitor_covers(monitor: Mapping[str, Any], namespace: str, model_group: str) -> bool:
    """Whether a PodMonitor scrapes the leaders of `model_group` in `namespace`."""
    spec = monitor.get("spec") or {}
    if not label_selector_matches(spec.get("selector") or {}, leader_labels(model_group)):
        return False
    namespaces = spec.get("namespaceSelector") or {}
    if namespaces.get("any"):
        return True
    names = namespaces.get("matchNames")
    return namespace in names if names else namespace == _meta(monitor)[0]


def prometheus_selects(
    prometheus: Mapping[str, Any],
    monitor: Mapping[str, Any],
    namespace_labels: Mapping[str, Mapping[str, str]],
) -> bool:
    """The Prometheus Operator's rule: a null podMonitorSelector selects no PodMonitor; a null
    podMonitorNamespaceSelector looks in the Prometheus' own namespace only."""
    spec = prometheus.get("spec") or {}
    selector = spec.get("podMonitorSelector")
    monitor_namespace = _meta(monitor)[0]
    monitor_labels = (monitor.get("metadata") or {}).get("labels") or {}
    if selector is None or not label_selector_matches(selector, monitor_labels):
        return False
    namespace_selector = spec.get("podMonitorNamespaceSelector")
    if namespace_selector is None:
        return monitor_namespace == _meta(prometheus)[0]
    labels = namespace_labels.get(monitor_namespace) or {"kubernetes.io/metadata.name": monitor_namespace}
    return label_selector_matches(namespace_selector, labels)


def _release_labels_hint(prometheuses: Sequence[Mapping[str, Any]]) -> str:
    """The `--set` flags that give the chart's PodMonitor the labels a Prometheus selects by."""
    for prometheus in prometheuses:
        wanted = ((prometheus.get("spec") or {}).get("podMonitorSelector") or {}).get("matchLabels") or {}
        if wanted:
            return " ".join(
                f"--set prometheus.vllmPodMonitor.labels.{k}={v}" for k, v in sorted(wanted.items())
            )
    return "--set prometheus.vllmPodMonitor.labels.release=<your kube-prometheus-stack release>"


def _model_group_keys(reading: ClusterReading) -> list[ModelGroupKey]:
    return [_meta(model_group) for model_group in reading.model_groups]


def monitor_finding(reading: ClusterReading) -> CheckResult:
    """Whether a PodMonitor scrapes the leaders of every ModelGroup and a Prometheus selects it."""
    name = "vllm-monitor"
    if "podmonitors" in reading.unreadable:
        return CheckResult(
            name,
            Verdict.WARN,
            f"cannot read PodMonitors: {reading.unreadable['podmonitors']}",
            "run doctor as a user who may list podmonitors and prometheuses (monitoring.coreos.com)",
        )
    if reading.pod_monitors is None:
        return CheckResult(
            name,
            Verdict.OK,
            "no PodMonitor kind here (no Prometheus Operator): the leaders' scrape is Prometheus' own "
            "configuration; the vllm-series checks show whether it works",
        )
    enable = (
        "`helm upgrade` the release with --set prometheus.vllmPodMonitor.enabled=true "
        + _release_labels_hint(reading.prometheuses)
    )
    keys = _model_group_keys(reading) or [("", "")]
    covering = [m for m in reading.pod_monitors if all(_monitor_covers(m, ns, mg) for ns, mg in keys if mg)]
    if not covering:
        return CheckResult(
            name,
            Verdict.WARN,
            f"no PodMonitor selects the vLLM leaders (pods labelled {naming.LABEL_METRICS}=true) "
            "of every ModelGroup: nothing the Prometheus Operator runs scrapes them",
            enable,
        )
    for monitor in covering:
        selected_by = [
            p for p in reading.prometheuses if prometheus_selects(p, monitor, reading.namespace_labels)
        ]
        if selected_by:
            return CheckResult(
                name,
                Verdict.OK,
                f"PodMonitor {'/'.join(_meta(monitor))} scrapes the leaders; "
                f"Prometheus {'/'.join(_meta(selected_by[0]))} selects it",
            )
    monitor_name = "/".join(_meta(covering[0]))
    return CheckResult(
        name,
        Verdict.WARN,
        f"PodMonitor {monitor_name} selects the leaders, but no Prometheus selects it "
        "(its labels do not match any podMonitorSelector, or its namespace any podMonitorNamespaceSelector)",
        "`helm upgrade` the release with " + _release_labels_hint(reading.prometheuses),
    )


def ready_leaders(model_group: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(group, leader pod) of each Ready group in the ModelGroup's status."""
    name = _meta(model_group)[1]
    groups = (model_group.get("status") or {}).get("groups") or ()
    return [
        (str(g["name"]), str((g.get("pods") or [naming.pod_name(name, str(g["name"]), 0)])[0]))
        for g in groups
        if g.get("state") == "Ready" and g.get("name")
    ]


def _missing_quantities(
    snapshot: Series, labels: SeriesLabels, groups: Sequence[str]
) -> dict[str, list[str]]:
    """Per ready group, the gauges the autoscaler needs that the snapshot lacks."""
    parsed = parse_query_result(snapshot, labels)
    missing = {}
    for group in groups:
        values = parsed.get(group, GroupSeries()).values
        absent = [quantity.value for quantity in REQUIRED_QUANTITIES if quantity not in values]
        if absent:
            missing[group] = absent
    return missing


def _by_pod(series: Series) -> dict[str, Mapping[str, Any]]:
    return {
        str((s.get("metric") or {}).get(POD_LABEL)): s
        for s in series
        if (s.get("metric") or {}).get(POD_LABEL)
    }


def _scraped(target: Mapping[str, Any]) -> bool:
    value = target.get("value") or (None, "0")
    return str(value[-1]) == "1"


def _diagnose(
    key: ModelGroupKey,
    blind: Mapping[str, list[str]],
    leaders: Mapping[str, str],
    series: LeaderSeries,
    labels: SeriesLabels,
) -> tuple[list[str], list[str]]:
    """Why each blind group's leader is missing from the snapshot: the findings and their fixes."""
    labelled, targets = _by_pod(series.labelled), _by_pod(series.targets)
    found: dict[str, list[str]] = {}
    for group, missing in blind.items():
        pod = leaders[group]
        metric = (labelled.get(pod) or {}).get("metric") or {}
        if metric:
            if metric.get(labels.model_group) != key[1] or metric.get(labels.group) != group:
                found.setdefault("labels", []).append(pod)
            else:
                found.setdefault("incomplete", []).append(f"{pod} lacks {', '.join(missing)}")
        elif pod in targets and not _scraped(targets[pod]):
            found.setdefault("down", []).append(pod)
        elif pod in targets:
            found.setdefault("no-vllm", []).append(pod)
        else:
            found.setdefault("unscraped", []).append(pod)
    texts = {
        "unscraped": (
            "nothing scrapes leader(s) {}: Prometheus has no target for them; the vLLM PodMonitor (or "
            "the scrape job) is missing, or no Prometheus selects it",
            "",
        ),
        "down": (
            "the scrape of {} fails (up=0)",
            "the leader must serve /metrics on its container port named http; Prometheus' targets page "
            "gives the scrape error",
        ),
        "no-vllm": (
            f"Prometheus scrapes {{}} but holds no {RUNNING_METRIC} from them",
            "the scraped port is not vLLM's: scrape the container port named http at /metrics",
        ),
        "labels": (
            f"the vLLM series of {{}} lack the labels the autoscaler selects by ({labels.model_group}, "
            f"{labels.group})",
            f"copy pod labels {naming.LABEL_MODEL_GROUP} and {naming.LABEL_GROUP} to "
            f"{labels.model_group} and {labels.group} in the scrape (the chart's "
            "prometheus.vllmPodMonitor relabelings), or name the labels your scrape uses in "
            "GOODPUT_PROMETHEUS_LABEL_MODEL_GROUP and _GROUP",
        ),
        "incomplete": (
            "gauges missing: {}",
            f"goodput reads vLLM 0.33's metric names ({vllm_names.KV_CACHE_USAGE_PERC}, "
            f"{vllm_names.NUM_REQUESTS_WAITING}, {vllm_names.NUM_REQUESTS_RUNNING}): "
            "run a vLLM that exports them",
        ),
    }
    findings = [texts[kind][0].format(", ".join(items)) for kind, items in found.items()]
    fixes = [texts[kind][1] for kind in found if texts[kind][1]]
    return findings, fixes


def check_model_group_series(
    model_group: Mapping[str, Any],
    series: LeaderSeries | None,
    labels: SeriesLabels,
    monitor: CheckResult,
) -> CheckResult:
    """Every Ready group of the ModelGroup has the engine gauges the autoscaler's snapshot needs,
    under the labels it selects by; if not, which link is broken (target, scrape, labels)."""
    key = _meta(model_group)
    name = f"vllm-series {key[0]}/{key[1]}"
    leaders = dict(ready_leaders(model_group))
    if not leaders:
        return CheckResult(
            name,
            Verdict.WARN,
            "no Ready group yet: there is no engine whose series could be read",
            "check again once `kubectl get mg` shows a Ready group",
        )
    if series is None or series.error:
        reason = series.error if series is not None else "Prometheus did not answer"
        return CheckResult(name, Verdict.WARN, f"not read: {reason}", "see the prometheus check")
    blind = _missing_quantities(series.snapshot, labels, sorted(leaders))
    if not blind:
        gauges = ", ".join(quantity.value for quantity in REQUIRED_QUANTITIES)
        return CheckResult(
            name,
            Verdict.OK,
            f"{len(leaders)} Ready group(s), each with the gauges every decision reads ({gauges}) under "
            f"{labels.namespace}/{labels.model_group}/{labels.group}",
        )
    findings, fixes = _diagnose(key, blind, leaders, series, labels)
    if any(finding.startswith("nothing scrapes") for finding in findings):
        fixes.insert(0, monitor.fix or _OWN_SCRAPE_FIX)
    blind_groups = ", ".join(sorted(blind))
    return CheckResult(
        name,
        Verdict.FAIL,
        f"the autoscaler reads nothing of group(s) {blind_groups} (it holds the count): "
        + "; ".join(findings),
        "; ".join(fixes),
    )


_OWN_SCRAPE_FIX = (
    f"scrape pods labelled {naming.LABEL_METRICS}=true at their port named http and copy their labels "
    f"{naming.LABEL_MODEL_GROUP}, {naming.LABEL_GROUP} and {naming.LABEL_RANK} to model_group, group and "
    "rank (what the chart's prometheus.vllmPodMonitor does with the Prometheus Operator)"
)


# --- GPUs ---------------------------------------------------------------------------------------------


def _quantity(value: object) -> int:
    """A device count from a node's allocatable ("8"); anything else counts as none."""
    try:
        return int(str(value))
    except ValueError:
        return 0


def _extended_resources(nodes: Sequence[Mapping[str, Any]]) -> list[str]:
    """The device-plugin resources (domain/name) the nodes advertise, for a fix that names them."""
    names = {
        resource
        for node in nodes
        for resource, value in ((node.get("status") or {}).get("allocatable") or {}).items()
        if "/" in resource
        and not resource.startswith(("hugepages-", "kubernetes.io/"))
        and _quantity(value) > 0
    }
    return sorted(names)


def _most_devices(reading: ClusterReading, resource: str, device_class: str | None) -> tuple[int, int, str]:
    """(the most devices on one node, the nodes with any, a note of what could not be counted)."""
    if device_class is None:
        counts = [
            _quantity(((node.get("status") or {}).get("allocatable") or {}).get(resource, 0))
            for node in reading.nodes
        ]
        return max(counts, default=0), sum(count > 0 for count in counts), ""
    body = reading.device_classes.get(device_class)
    slices = [view for view in map(parse_resource_slice, reading.resource_slices) if view is not None]
    devices = class_devices(parse_device_class(body) if body else None, slices, ())
    note = (
        f"; {devices.unreadable_devices} device(s) could not be judged by its selectors here"
        if devices.unreadable_devices
        else ""
    )
    totals = devices.total_by_node.values()
    return max(totals, default=0), sum(total > 0 for total in totals), note


def _gpu_need(model_group: Mapping[str, Any]) -> tuple[str, str | None, int]:
    spec = model_group.get("spec") or {}
    engine = spec.get("engine") or {}
    per_pod = int((spec.get("parallelism") or {}).get("gpusPerPod") or 1)
    return (
        str(engine.get("gpuResourceName") or naming.GPU_RESOURCE),
        engine.get("gpuDeviceClassName"),
        per_pod,
    )


def check_gpus(reading: ClusterReading) -> list[CheckResult]:
    """Some node offers each ModelGroup's GPUs (its extended resource, or its DeviceClass's devices)
    in the number one of its pods asks for; with no ModelGroup, whether any node offers nvidia.com/gpu."""
    if not reading.model_groups:
        most, nodes, _ = _most_devices(reading, naming.GPU_RESOURCE, None)
        if nodes:
            return [
                CheckResult(
                    "gpus", Verdict.OK, f"{naming.GPU_RESOURCE} on {nodes} node(s), up to {most} per node"
                )
            ]
        others = ", ".join(_extended_resources(reading.nodes)) or "none"
        return [
            CheckResult(
                "gpus",
                Verdict.WARN,
                f"no node advertises {naming.GPU_RESOURCE} (device resources on the nodes: {others})",
                "install the GPU device plugin (NVIDIA's GPU Operator), or give ModelGroups "
                "spec.engine.gpuResourceName or gpuDeviceClassName for the devices the nodes have",
            )
        ]
    results = []
    for key, need in sorted({_meta(mg): _gpu_need(mg) for mg in reading.model_groups}.items()):
        results.append(_gpu_result(reading, key, *need))
    return results


def _gpu_result(
    reading: ClusterReading, key: ModelGroupKey, resource: str, device_class: str | None, per_pod: int
) -> CheckResult:
    name = f"gpus {key[0]}/{key[1]}"
    what = f"DeviceClass {device_class}" if device_class else resource
    if device_class and reading.device_classes.get(device_class) is None:
        return CheckResult(
            name,
            Verdict.FAIL,
            f"DeviceClass {device_class} (spec.engine.gpuDeviceClassName) does not exist",
            "install the DRA driver that provides it (NVIDIA's creates gpu.nvidia.com), or fix the name",
        )
    most, nodes, note = _most_devices(reading, resource, device_class)
    if most >= per_pod:
        return CheckResult(
            name, Verdict.OK, f"{what} on {nodes} node(s), up to {most} per node; a pod needs {per_pod}{note}"
        )
    if nodes:
        return CheckResult(
            name,
            Verdict.FAIL,
            f"a pod needs {per_pod} of {what}, and no node has more than {most}{note}",
            "lower spec.parallelism.gpusPerPod (more pods per group), or add nodes with more GPUs",
        )
    others = ", ".join(_extended_resources(reading.nodes)) or "none"
    fix = (
        "the DRA driver publishes no device this DeviceClass selects: check its ResourceSlices"
        if device_class
        else "install the GPU device plugin (NVIDIA's GPU Operator), or set spec.engine.gpuResourceName "
        "to a resource the nodes advertise"
    )
    return CheckResult(
        name, Verdict.FAIL, f"no node offers {what} (device resources on the nodes: {others}){note}", fix
    )


# --- the gateway -----------------------------------------------------------------------------------------


def check_gateways(reading: ClusterReading, prometheus: PrometheusReading) -> list[CheckResult]:
    """Each gateway Deployment answers behind its Service, serves a ModelGroup that exists, and the
    autoscaler sees its queue in Prometheus (the gateway's series in the snapshot query)."""
    if not reading.gateways:
        return [
            CheckResult(
                "gateway",
                Verdict.OK,
                "no goodput gateway installed (optional; without one a ModelGroup at zero groups "
                "stays there)",
            )
        ]
    keys = set(_model_group_keys(reading))
    return [_gateway_result(gateway, keys, prometheus) for gateway in reading.gateways]


def _gateway_result(
    gateway: GatewayInstall, keys: set[ModelGroupKey], prometheus: PrometheusReading
) -> CheckResult:
    name = f"gateway {gateway.namespace}/{gateway.name}"
    key = (gateway.model_group_namespace, gateway.model_group)
    describe = f"`kubectl -n {gateway.namespace} describe deployment {gateway.name}` and its pods' logs"
    if gateway.available_replicas < 1:
        return CheckResult(name, Verdict.FAIL, "no replica of the gateway is available", describe)
    if gateway.ready_endpoints < 1:
        return CheckResult(name, Verdict.FAIL, f"Service {gateway.name} has no ready endpoint", describe)
    if key not in keys:
        return CheckResult(
            name,
            Verdict.FAIL,
            f"it serves ModelGroup {key[0]}/{key[1]}, which does not exist",
            "set gateway.modelGroup and gateway.namespace to a ModelGroup that exists",
        )
    series = prometheus.series.get(key)
    if prometheus.error or series is None or series.error:
        return CheckResult(name, Verdict.WARN, "its series were not read: see the prometheus check")
    if gateway_from_result(series.snapshot) is None:
        return CheckResult(
            name,
            Verdict.FAIL,
            f"it answers, but Prometheus holds none of its series for {key[0]}/{key[1]}: the autoscaler "
            "cannot see its queue (and cannot wake a ModelGroup at zero)",
            "the chart scrapes the gateway with a PodMonitor when prometheus.vllmPodMonitor.enabled: "
            "enable it with the labels your Prometheus selects",
        )
    return CheckResult(
        name,
        Verdict.OK,
        f"{gateway.available_replicas} replica(s), {gateway.ready_endpoints} ready endpoint(s); "
        f"the autoscaler sees its queue for {key[0]}/{key[1]}",
    )


# --- all of it ------------------------------------------------------------------------------------------


def run_checks(
    cluster: ClusterReading, prometheus: PrometheusReading, labels: SeriesLabels
) -> list[CheckResult]:
    """Every check, in the order a platform team fixes things: the API, access, Prometheus, the
    scrape of each ModelGroup, its GPUs, the gateway."""
    monitor = monitor_finding(cluster)
    results = [check_crds(cluster), check_rbac(cluster), check_prometheus(prometheus), monitor]
    for model_group in cluster.model_groups:
        series = None if prometheus.error else prometheus.series.get(_meta(model_group))
        results.append(check_model_group_series(model_group, series, labels, monitor))
    results += check_gpus(cluster)
    results += check_gateways(cluster, prometheus)
    if not cluster.model_groups:
        unreadable = cluster.unreadable.get("modelgroups")
        results.append(
            CheckResult(
                "vllm-series",
                Verdict.WARN,
                f"cannot list ModelGroups: {unreadable}"
                if unreadable
                else "no ModelGroup in the namespaces checked: no series to check",
                "name the namespaces that run ModelGroups with -n"
                if unreadable
                else "run doctor again once a ModelGroup has a Ready group",
            )
        )
    return results


def exit_code(results: Sequence[CheckResult]) -> int:
    """1 when any check failed: a script or a CI job stops on it; warnings do not."""
    return 1 if any(result.verdict is Verdict.FAIL for result in results) else 0


def render(results: Sequence[CheckResult]) -> str:
    """One line per check (verdict, name, what was found), its fix indented below it, then the tally."""
    width = max((len(result.name) for result in results), default=0)
    lines = []
    for result in results:
        lines.append(f"{result.verdict.value.upper():<4}  {result.name:<{width}}  {result.found}")
        if result.fix and result.verdict is not Verdict.OK:
            lines.append(f"{'':<4}  {'':<{width}}  fix: {result.fix}")
    tally = {verdict: sum(r.verdict is verdict for r in results) for verdict in Verdict}
    lines.append(", ".join(f"{count} {verdict.value}" for verdict, count in tally.items()))
    return "\n".join(lines)
