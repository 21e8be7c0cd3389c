"""`goodput doctor`'s checks, each from a table of what the API server and Prometheus answered.

The checks are pure (`goodput.operator.doctor`): a reading in, a verdict with what was found and
the fix out. What a platform team meets on its own cluster is a row here: a CRD missing, an
account denied, Prometheus refusing the token, a PodMonitor no Prometheus selects, a scrape that
drops the ModelGroup label, a GPU resource under another name. The reading of a live cluster is
told in e2e/test_doctor.py. The permissions doctor asks about are held to the chart's roles.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from test_chart import (
    grants,
    helm,  # noqa: F401 (a fixture, used by name)
    render,
)

from goodput.operator.cmd_doctor import ApiReader, access_review, doctor_settings, find_operator
from goodput.operator.doctor import (
    OPERATOR_PERMISSIONS,
    AccessAnswer,
    CheckResult,
    ClusterReading,
    GatewayInstall,
    LeaderSeries,
    OperatorInstall,
    Permission,
    PrometheusReading,
    Verdict,
    check_crds,
    check_gateways,
    check_gpus,
    check_model_group_series,
    check_prometheus,
    check_rbac,
    exit_code,
    label_selector_matches,
    monitor_finding,
    run_checks,
)
from goodput.operator.doctor import (
    render as render_results,
)
from goodput.operator.metrics_source import REQUIRED_QUANTITIES
from goodput.operator.promql import QUERY_LABEL, QueryQuantity, SeriesLabels

LABELS = SeriesLabels()
OPERATOR = OperatorInstall("goodput-system", "goodput", "goodput")
URL = "http://prometheus-operated.monitoring.svc:9090"


# --- readings ---------------------------------------------------------------------------------------------


def crd(name: str, *, established: bool = True, versions: tuple[str, ...] = ("v1alpha1",)) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"versions": [{"name": version, "served": True} for version in versions]},
        "status": {"conditions": [{"type": "Established", "status": "True" if established else "False"}]},
    }


CRDS = {name: crd(name) for name in ("modelgroups.goodput.dev", "slopolicies.goodput.dev")}


def model_group(
    name: str = "llama",
    namespace: str = "team-a",
    *,
    ready: tuple[str, ...] = ("g1",),
    engine: Mapping[str, Any] | None = None,
    gpus_per_pod: int = 1,
) -> dict[str, Any]:
    groups = [{"name": group, "state": "Ready", "pods": [f"{name}-{group}-0"]} for group in ready]
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"engine": dict(engine or {}), "parallelism": {"gpusPerPod": gpus_per_pod}},
        "status": {"groups": [*groups, {"name": "g9", "state": "Placing", "pods": [f"{name}-g9-0"]}]},
    }


def gauges(
    group: str, quantities: tuple[QueryQuantity, ...] = REQUIRED_QUANTITIES
) -> tuple[dict[str, Any], ...]:
    """A snapshot answer holding `quantities` for one group, as Prometheus returns them."""
    return tuple({"metric": {"group": group, QUERY_LABEL: q.value}, "value": [0, "1"]} for q in quantities)


def pod_row(pod: str, value: str = "1", **labels: str) -> dict[str, Any]:
    return {"metric": {"pod": pod, **labels}, "value": [0, value]}


def node(name: str, **allocatable: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"allocatable": {"cpu": "64", **allocatable}}}


def answered(**series: LeaderSeries) -> PrometheusReading:
    return PrometheusReading(
        URL, "no token", series={("team-a", key): value for key, value in series.items()}
    )


# --- CRDs and RBAC ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    name: str
    reading: Any
    verdict: Verdict
    says: str = ""
    fix_says: str = ""


CRD_CASES = [
    Case("both kinds established", ClusterReading(crds=CRDS), Verdict.OK, "v1alpha1"),
    Case(
        "the ModelGroup CRD missing",
        ClusterReading(crds={**CRDS, "modelgroups.goodput.dev": None}),
        Verdict.FAIL,
        "modelgroups.goodput.dev is missing",
        "crds.install",
    ),
    Case(
        "a CRD not established",
        ClusterReading(crds={**CRDS, "slopolicies.goodput.dev": crd("slopolicies", established=False)}),
        Verdict.FAIL,
        "not Established",
    ),
    Case(
        "an older version served",
        ClusterReading(crds={**CRDS, "slopolicies.goodput.dev": crd("slopolicies", versions=("v1alpha0",))}),
        Verdict.FAIL,
        "does not serve v1alpha1",
    ),
    Case(
        "CRDs this account may not read",
        ClusterReading(unreadable={"customresourcedefinitions": "403 Forbidden: no"}),
        Verdict.WARN,
        "403",
    ),
]

ALLOWED = tuple(AccessAnswer(p, "" if p.cluster_scoped else "team-a", True) for p in OPERATOR_PERMISSIONS)
SCALE = Permission("goodput.dev", "modelgroups", "patch", "scale")
RBAC_CASES = [
    Case(
        "every permission granted",
        ClusterReading(operator=OPERATOR, access=ALLOWED),
        Verdict.OK,
        "ServiceAccount goodput-system/goodput may do the 14 kinds of request the operator makes, in team-a",
    ),
    Case(
        "the scale subresource denied",
        ClusterReading(operator=OPERATOR, access=(*ALLOWED, AccessAnswer(SCALE, "team-b", False))),
        Verdict.FAIL,
        "patch modelgroups/scale.goodput.dev in team-b",
        "watchNamespaces",
    ),
    Case(
        "reviews this account may not create",
        ClusterReading(operator=OPERATOR, access=(AccessAnswer(SCALE, "team-a", None, "403 Forbidden"),)),
        Verdict.WARN,
        "403 Forbidden",
        "subjectaccessreviews",
    ),
    Case(
        "no operator installed",
        ClusterReading(),
        Verdict.WARN,
        "no goodput operator Deployment",
        "--operator",
    ),
    Case(
        "Deployments this account may not list",
        ClusterReading(unreadable={"deployments": "403 Forbidden: deployments is forbidden"}),
        Verdict.WARN,
        "cannot look for the operator's Deployment: 403",
        "--operator",
    ),
]


def assert_case(result: CheckResult, case: Case) -> None:
    assert result.verdict is case.verdict, result
    assert case.says in result.found, result
    assert case.fix_says in result.fix, result


@pytest.mark.parametrize("case", CRD_CASES, ids=[case.name for case in CRD_CASES])
def test_the_crd_check_names_what_is_missing(case: Case) -> None:
    assert_case(check_crds(case.reading), case)


@pytest.mark.parametrize("case", RBAC_CASES, ids=[case.name for case in RBAC_CASES])
def test_the_rbac_check_names_each_denied_request_and_where(case: Case) -> None:
    assert_case(check_rbac(case.reading), case)


def test_every_permission_doctor_asks_about_is_granted_by_the_charts_roles(helm: Path) -> None:  # noqa: F811
    rendered = render(helm)
    granted = {grant for role in rendered.of_kind("ClusterRole") for grant in grants(role["rules"])}

    for permission in OPERATOR_PERMISSIONS:
        resource = (
            f"{permission.resource}/{permission.subresource}"
            if permission.subresource
            else permission.resource
        )
        assert (permission.api_group, resource, permission.verb, "") in granted, permission.describe()


# --- Prometheus -------------------------------------------------------------------------------------------

PROMETHEUS_CASES = [
    Case("it answers", PrometheusReading(URL, "bearer token from /t"), Verdict.OK, "bearer token from /t"),
    Case(
        "nothing listens",
        PrometheusReading(URL, "no token", "Prometheus at x is unreachable: refused", "unreachable"),
        Verdict.FAIL,
        "unreachable",
        "port-forward",
    ),
    Case(
        "the token is refused",
        PrometheusReading(URL, "no token", "Prometheus at x failed: HTTP Status Code 401 (b'')", "answer"),
        Verdict.FAIL,
        "401",
        "bearerTokenFile",
    ),
    Case(
        "an unknown certificate authority",
        PrometheusReading(
            URL, "no token", "Prometheus at x failed: SSLError(CERTIFICATE_VERIFY_FAILED)", "answer"
        ),
        Verdict.FAIL,
        "SSLError",
        "caFile",
    ),
    Case(
        "the operator's token file is in its pod, not here",
        PrometheusReading(
            URL, "", "GOODPUT_PROMETHEUS_BEARER_TOKEN_FILE='/var/run/x' is not a readable file", "elsewhere"
        ),
        Verdict.WARN,
        "/var/run/x",
        "kubectl exec",
    ),
    Case(
        "too slow",
        PrometheusReading(URL, "no token", "Prometheus at x did not answer within 5s", "timeout"),
        Verdict.FAIL,
        "within 5s",
        "GOODPUT_PROMETHEUS_TIMEOUT_SECONDS",
    ),
]


@pytest.mark.parametrize("case", PROMETHEUS_CASES, ids=[case.name for case in PROMETHEUS_CASES])
def test_the_prometheus_check_tells_unreachable_from_refused_credentials(case: Case) -> None:
    assert_case(check_prometheus(case.reading), case)


# --- the vLLM series and their monitor --------------------------------------------------------------------

MONITOR_MISSING = CheckResult(
    "vllm-monitor", Verdict.WARN, "no PodMonitor", "--set prometheus.vllmPodMonitor.enabled=true"
)
MONITOR_OK = CheckResult("vllm-monitor", Verdict.OK, "selected")
LEADER = "llama-g1-0"


@dataclass(frozen=True)
class SeriesCase:
    name: str
    model_group: dict[str, Any]
    series: LeaderSeries | None
    verdict: Verdict
    says: str = ""
    fix_says: str = ""
    monitor: CheckResult = MONITOR_OK


SERIES_CASES = [
    SeriesCase(
        "every ready group has its gauges",
        model_group(),
        LeaderSeries(gauges("g1")),
        Verdict.OK,
        "1 Ready group",
    ),
    SeriesCase(
        "nothing scrapes the leader",
        model_group(),
        LeaderSeries(),
        Verdict.FAIL,
        f"nothing scrapes leader(s) {LEADER}",
        "prometheus.vllmPodMonitor.enabled=true",
        MONITOR_MISSING,
    ),
    SeriesCase(
        "nothing scrapes the leader, without the Prometheus Operator",
        model_group(),
        LeaderSeries(),
        Verdict.FAIL,
        "the vLLM PodMonitor (or the scrape job) is missing",
        "goodput.dev/metrics=true",
        CheckResult("vllm-monitor", Verdict.OK, "no PodMonitor kind"),
    ),
    SeriesCase(
        "the scrape fails",
        model_group(),
        LeaderSeries(targets=(pod_row(LEADER, "0"),)),
        Verdict.FAIL,
        "up=0",
        "port named http",
    ),
    SeriesCase(
        "the scrape reaches another exporter",
        model_group(),
        LeaderSeries(targets=(pod_row(LEADER),)),
        Verdict.FAIL,
        "holds no vllm:num_requests_running",
    ),
    SeriesCase(
        "the scrape drops the ModelGroup label",
        model_group(),
        LeaderSeries(labelled=(pod_row(LEADER, group="g1"),), targets=(pod_row(LEADER),)),
        Verdict.FAIL,
        "lack the labels the autoscaler selects by (model_group, group)",
        "GOODPUT_PROMETHEUS_LABEL_MODEL_GROUP",
    ),
    SeriesCase(
        "an engine without the KV-cache gauge",
        model_group(),
        LeaderSeries(
            gauges("g1", (QueryQuantity.WAITING, QueryQuantity.RUNNING, QueryQuantity.SAMPLE_AGE)),
            labelled=(pod_row(LEADER, model_group="llama", group="g1"),),
        ),
        Verdict.FAIL,
        f"{LEADER} lacks kv_usage",
        "vllm:kv_cache_usage_perc",
    ),
    SeriesCase(
        "one of two groups unseen",
        model_group(ready=("g1", "g2")),
        LeaderSeries(gauges("g1")),
        Verdict.FAIL,
        "group(s) g2",
    ),
    SeriesCase("no ready group yet", model_group(ready=()), LeaderSeries(), Verdict.WARN, "no Ready group"),
    SeriesCase(
        "a query that failed",
        model_group(),
        LeaderSeries(error="Prometheus at x failed"),
        Verdict.WARN,
        "failed",
    ),
]


@pytest.mark.parametrize("case", SERIES_CASES, ids=[case.name for case in SERIES_CASES])
def test_the_series_check_names_the_broken_link_between_a_leader_and_the_autoscaler(case: SeriesCase) -> None:
    result = check_model_group_series(case.model_group, case.series, LABELS, case.monitor)

    assert result.name == "vllm-series team-a/llama"
    assert_case(result, Case(case.name, None, case.verdict, case.says, case.fix_says))


def test_the_series_check_reads_the_users_label_names() -> None:
    custom = SeriesLabels(namespace="kubernetes_namespace", model_group="app", group="replica")
    snapshot = tuple(
        {**row, "metric": {"replica": "g1", QUERY_LABEL: row["metric"][QUERY_LABEL]}} for row in gauges("g1")
    )

    assert (
        check_model_group_series(model_group(), LeaderSeries(snapshot), custom, MONITOR_OK).verdict
        is Verdict.OK
    )
    assert check_model_group_series(
        model_group(), LeaderSeries(gauges("g1")), custom, MONITOR_OK
    ).verdict is (Verdict.FAIL)


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        ({}, {"a": "1"}, True),
        ({"matchLabels": {"release": "kps"}}, {"release": "kps", "x": "y"}, True),
        ({"matchLabels": {"release": "kps"}}, {}, False),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]}, {"a": "2"}, True),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {"a": "1"}, False),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {}, True),
        ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {}, False),
        ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {}, True),
    ],
)
def test_label_selectors_match_as_the_api_server_matches_them(
    selector: dict[str, Any], labels: dict[str, str], matches: bool
) -> None:
    assert label_selector_matches(selector, labels) is matches


def pod_monitor(
    namespace: str = "goodput-system", labels: Mapping[str, str] | None = None, **spec: Any
) -> dict[str, Any]:
    body_spec = {
        "selector": {"matchLabels": {"goodput.dev/metrics": "true"}},
        "namespaceSelector": {"any": True},
    }
    return {
        "metadata": {"namespace": namespace, "name": "goodput-vllm", "labels": dict(labels or {})},
        "spec": {**body_spec, **spec},
    }


def prometheus(namespace: str = "monitoring", **spec: Any) -> dict[str, Any]:
    return {"metadata": {"namespace": namespace, "name": "kps"}, "spec": spec}


KPS = prometheus(podMonitorSelector={"matchLabels": {"release": "kps"}}, podMonitorNamespaceSelector={})
MONITOR_CASES = [
    Case(
        "no Prometheus Operator",
        ClusterReading(model_groups=(model_group(),)),
        Verdict.OK,
        "no PodMonitor kind",
    ),
    Case(
        "PodMonitors this account may not read",
        ClusterReading(unreadable={"podmonitors": "403 Forbidden: podmonitors is forbidden"}),
        Verdict.WARN,
        "cannot read PodMonitors: 403",
    ),
    Case(
        "no PodMonitor for the leaders",
        ClusterReading(model_groups=(model_group(),), pod_monitors=(), prometheuses=(KPS,)),
        Verdict.WARN,
        "no PodMonitor selects the vLLM leaders",
        "--set prometheus.vllmPodMonitor.enabled=true --set prometheus.vllmPodMonitor.labels.release=kps",
    ),
    Case(
        "the chart's PodMonitor without the release label",
        ClusterReading(model_groups=(model_group(),), pod_monitors=(pod_monitor(),), prometheuses=(KPS,)),
        Verdict.WARN,
        "no Prometheus selects it",
        "--set prometheus.vllmPodMonitor.labels.release=kps",
    ),
    Case(
        "the release label set",
        ClusterReading(pod_monitors=(pod_monitor(labels={"release": "kps"}),), prometheuses=(KPS,)),
        Verdict.OK,
        "Prometheus monitoring/kps selects it",
    ),
    Case(
        "a Prometheus that looks for PodMonitors in its own namespace only",
        ClusterReading(
            pod_monitors=(pod_monitor(labels={"release": "kps"}),),
            prometheuses=(prometheus(podMonitorSelector={"matchLabels": {"release": "kps"}}),),
        ),
        Verdict.WARN,
        "no Prometheus selects it",
    ),
    Case(
        "a Prometheus without a PodMonitor selector",
        ClusterReading(
            pod_monitors=(pod_monitor(),), prometheuses=(prometheus(podMonitorNamespaceSelector={}),)
        ),
        Verdict.WARN,
        "no Prometheus selects it",
        "<your kube-prometheus-stack release>",
    ),
    Case(
        "a PodMonitor limited to other namespaces",
        ClusterReading(
            model_groups=(model_group(),),
            pod_monitors=(
                pod_monitor(labels={"release": "kps"}, namespaceSelector={"matchNames": ["team-b"]}),
            ),
            prometheuses=(KPS,),
        ),
        Verdict.WARN,
        "no PodMonitor selects the vLLM leaders",
    ),
]


@pytest.mark.parametrize("case", MONITOR_CASES, ids=[case.name for case in MONITOR_CASES])
def test_the_monitor_check_says_which_labels_a_prometheus_selects_by(case: Case) -> None:
    assert_case(monitor_finding(case.reading), case)


# --- GPUs -------------------------------------------------------------------------------------------------


def resource_slice(node_name: str, devices: int, driver: str = "gpu.nvidia.com") -> dict[str, Any]:
    return {
        "spec": {
            "nodeName": node_name,
            "driver": driver,
            "pool": {"name": node_name, "generation": 1},
            "devices": [{"name": f"gpu-{index}"} for index in range(devices)],
        }
    }


DRA = {"gpuDeviceClassName": "gpu.nvidia.com"}
GPU_CASES = [
    Case(
        "no ModelGroup and GPU nodes",
        ClusterReading(nodes=(node("a", **{"nvidia.com/gpu": "8"}),)),
        Verdict.OK,
        "up to 8",
    ),
    Case(
        "no ModelGroup and no NVIDIA GPU",
        ClusterReading(nodes=(node("a", **{"amd.com/gpu": "8"}),)),
        Verdict.WARN,
        "device resources on the nodes: amd.com/gpu",
    ),
    Case(
        "a node fits a pod",
        ClusterReading(
            model_groups=(model_group(gpus_per_pod=8),), nodes=(node("a", **{"nvidia.com/gpu": "8"}),)
        ),
        Verdict.OK,
        "a pod needs 8",
    ),
    Case(
        "no node holds a whole pod",
        ClusterReading(
            model_groups=(model_group(gpus_per_pod=8),), nodes=(node("a", **{"nvidia.com/gpu": "4"}),)
        ),
        Verdict.FAIL,
        "no node has more than 4",
        "gpusPerPod",
    ),
    Case(
        "the resource under another name",
        ClusterReading(model_groups=(model_group(),), nodes=(node("a", **{"amd.com/gpu": "8"}),)),
        Verdict.FAIL,
        "no node offers nvidia.com/gpu (device resources on the nodes: amd.com/gpu)",
        "gpuResourceName",
    ),
    Case(
        "the ModelGroup's own resource name",
        ClusterReading(
            model_groups=(model_group(engine={"gpuResourceName": "amd.com/gpu"}),),
            nodes=(node("a", **{"amd.com/gpu": "8"}),),
        ),
        Verdict.OK,
        "amd.com/gpu on 1 node(s)",
    ),
    Case(
        "a DeviceClass that does not exist",
        ClusterReading(model_groups=(model_group(engine=DRA),), device_classes={"gpu.nvidia.com": None}),
        Verdict.FAIL,
        "DeviceClass gpu.nvidia.com",
        "DRA driver",
    ),
    Case(
        "a DeviceClass with devices published",
        ClusterReading(
            model_groups=(model_group(engine=DRA, gpus_per_pod=2),),
            device_classes={"gpu.nvidia.com": {"metadata": {"name": "gpu.nvidia.com"}, "spec": {}}},
            resource_slices=(resource_slice("a", 4), resource_slice("b", 1)),
        ),
        Verdict.OK,
        "DeviceClass gpu.nvidia.com on 2 node(s), up to 4 per node",
    ),
    Case(
        "a DeviceClass without devices",
        ClusterReading(
            model_groups=(model_group(engine=DRA),),
            device_classes={"gpu.nvidia.com": {"metadata": {"name": "gpu.nvidia.com"}, "spec": {}}},
        ),
        Verdict.FAIL,
        "no node offers DeviceClass gpu.nvidia.com",
        "ResourceSlices",
    ),
]


@pytest.mark.parametrize("case", GPU_CASES, ids=[case.name for case in GPU_CASES])
def test_the_gpu_check_finds_a_node_for_one_pod_of_each_model_group(case: Case) -> None:
    results = check_gpus(case.reading)

    assert len(results) == 1
    assert_case(results[0], case)


# --- the gateway ------------------------------------------------------------------------------------------

GATEWAY = GatewayInstall("goodput-system", "goodput-gateway", "team-a", "llama", 1, 1)
GATEWAY_SERIES = ({"metric": {QUERY_LABEL: "gateway_sample_age"}, "value": [0, "2"]},)


@dataclass(frozen=True)
class GatewayCase:
    name: str
    gateway: GatewayInstall
    series: LeaderSeries
    verdict: Verdict
    says: str
    model_groups: tuple[dict[str, Any], ...] = field(default=(model_group(),))


GATEWAY_CASES = [
    GatewayCase(
        "answers and is scraped", GATEWAY, LeaderSeries(GATEWAY_SERIES), Verdict.OK, "sees its queue"
    ),
    GatewayCase(
        "no replica available",
        replace(GATEWAY, available_replicas=0),
        LeaderSeries(),
        Verdict.FAIL,
        "no replica",
    ),
    GatewayCase(
        "no ready endpoint",
        replace(GATEWAY, ready_endpoints=0),
        LeaderSeries(),
        Verdict.FAIL,
        "no ready endpoint",
    ),
    GatewayCase("its ModelGroup missing", GATEWAY, LeaderSeries(), Verdict.FAIL, "does not exist", ()),
    GatewayCase("not scraped", GATEWAY, LeaderSeries(gauges("g1")), Verdict.FAIL, "cannot see its queue"),
]


@pytest.mark.parametrize("case", GATEWAY_CASES, ids=[case.name for case in GATEWAY_CASES])
def test_the_gateway_check_follows_a_request_and_the_autoscalers_view_of_its_queue(case: GatewayCase) -> None:
    reading = ClusterReading(model_groups=case.model_groups, gateways=(case.gateway,))

    [result] = check_gateways(reading, answered(llama=case.series))

    assert_case(result, Case(case.name, None, case.verdict, case.says))


def test_without_a_gateway_the_check_passes_and_says_it_is_optional() -> None:
    [result] = check_gateways(ClusterReading(), answered())

    assert result.verdict is Verdict.OK and "optional" in result.found


# --- all of it --------------------------------------------------------------------------------------------

HEALTHY = ClusterReading(
    crds=CRDS,
    operator=OPERATOR,
    access=ALLOWED,
    model_groups=(model_group(),),
    nodes=(node("a", **{"nvidia.com/gpu": "8"}),),
)


def test_a_healthy_cluster_passes_every_check_and_exits_zero() -> None:
    results = run_checks(HEALTHY, answered(llama=LeaderSeries(gauges("g1"))), LABELS)

    assert [result.verdict for result in results] == [Verdict.OK] * len(results), render_results(results)
    assert [result.name for result in results] == [
        "crds", "rbac", "prometheus", "vllm-monitor",
        "vllm-series team-a/llama", "gpus team-a/llama", "gateway",
    ]  # fmt: skip
    assert exit_code(results) == 0


def test_an_unscraped_model_group_fails_the_run_and_names_the_monitor() -> None:
    results = run_checks(HEALTHY, answered(llama=LeaderSeries()), LABELS)
    text = render_results(results)

    assert exit_code(results) == 1
    assert "FAIL  vllm-series team-a/llama" in text
    assert "the vLLM PodMonitor (or the scrape job) is missing" in text
    assert text.splitlines()[-1] == "6 ok, 0 warn, 1 fail"


def test_a_prometheus_that_does_not_answer_leaves_the_series_unread_not_failed_twice() -> None:
    down = PrometheusReading(URL, "no token", "Prometheus at x is unreachable", "unreachable")
    results = {result.name: result for result in run_checks(HEALTHY, down, LABELS)}

    assert results["prometheus"].verdict is Verdict.FAIL
    assert results["vllm-series team-a/llama"].verdict is Verdict.WARN


def test_warnings_alone_do_not_fail_the_run() -> None:
    results = run_checks(ClusterReading(crds=CRDS), answered(), LABELS)

    assert {result.verdict for result in results} == {Verdict.OK, Verdict.WARN}
    assert exit_code(results) == 0


def test_each_problem_is_printed_with_its_fix_and_a_passing_check_without_one() -> None:
    text = render_results(
        [
            CheckResult("crds", Verdict.OK, "fine", "never shown"),
            CheckResult("gpus", Verdict.FAIL, "none", "add GPUs"),
        ]
    )

    assert text.splitlines() == [
        "OK    crds  fine",
        "FAIL  gpus  none",
        "            fix: add GPUs",
        "1 ok, 0 warn, 1 fail",
    ]


# --- the shell's choices ------------------------------------------------------------------------------


class FakeReader(ApiReader):
    """Answers GETs from a table of paths, as the API server would."""

    def __init__(self, answers: Mapping[str, Any]) -> None:
        super().__init__(kube=None)  # type: ignore[arg-type]
        self.answers = answers

    def get(self, what: str, path: str, query: Mapping[str, str] | None = None) -> Any:
        return self.answers.get(path)


def deployment(namespace: str, watched: str = "", **env: str) -> dict[str, Any]:
    variables = [{"name": "GOODPUT_NAMESPACES", "value": watched}] if watched else []
    variables += [{"name": name, "value": value} for name, value in env.items()]
    return {
        "metadata": {"namespace": namespace, "name": "goodput"},
        "spec": {"template": {"spec": {"serviceAccountName": "goodput", "containers": [
            {"name": "operator", "env": [*variables, {"name": "POD_ID", "valueFrom": {}}]}
        ]}}},
    }  # fmt: skip


DEPLOYMENTS = "/apis/apps/v1/deployments"


@pytest.mark.parametrize(
    ("installs", "asked", "chosen"),
    [
        ([deployment("a", "team-a"), deployment("b", "team-b")], ["team-b"], "b"),
        ([deployment("a", "team-a"), deployment("all")], ["team-c"], "all"),
        ([deployment("a", "team-a")], ["team-c"], "a"),
        ([deployment("all"), deployment("b", "team-b,team-c")], ["team-b", "team-c"], "b"),
    ],
    ids=["the one listing the namespace", "else the cluster-wide one", "else the only one", "all asked"],
)
def test_doctor_judges_the_operator_that_serves_the_namespaces_asked_about(
    installs: list[dict[str, Any]], asked: list[str], chosen: str
) -> None:
    found = find_operator(FakeReader({DEPLOYMENTS: {"items": installs}}), None, asked)

    assert found is not None and found.namespace == chosen


def test_no_operator_deployment_is_no_operator() -> None:
    assert find_operator(FakeReader({}), None, []) is None
    assert find_operator(FakeReader({}), "goodput-system/goodput", []) is None


def test_the_prometheus_settings_are_the_deployments_under_the_environment_under_the_flags() -> None:
    operator = find_operator(
        FakeReader({DEPLOYMENTS: {"items": [deployment(
            "a", GOODPUT_PROMETHEUS_URL="http://deployed:9090", GOODPUT_PROMETHEUS_CA_FILE="/ca.pem",
            GOODPUT_PROMETHEUS_TIMEOUT_SECONDS="7", GOODPUT_PRIORITY="auto",
        )]}}),
        None,
        [],
    )  # fmt: skip
    flags = argparse.Namespace(
        prometheus_url=None, prometheus_bearer_token_file=None, prometheus_ca_file=None
    )
    own = {"GOODPUT_PROMETHEUS_CA_FILE": "/mine.pem"}

    deployed = doctor_settings(flags, own, operator)
    flagged = doctor_settings(
        argparse.Namespace(**{**vars(flags), "prometheus_url": "http://here:1"}), own, operator
    )

    assert (deployed.prometheus_url, deployed.prometheus_ca_file) == ("http://deployed:9090", "/mine.pem")
    assert deployed.prometheus_timeout_seconds == 7.0
    assert flagged.prometheus_url == "http://here:1"


def test_each_review_asks_for_the_service_account_with_its_groups_and_the_subresource() -> None:
    body = access_review(SCALE, "team-a", "goodput-system/goodput")

    assert body["spec"]["user"] == "system:serviceaccount:goodput-system:goodput"
    assert "system:serviceaccounts:goodput-system" in body["spec"]["groups"]
    assert body["spec"]["resourceAttributes"] == {
        "group": "goodput.dev", "resource": "modelgroups", "verb": "patch",
        "subresource": "scale", "namespace": "team-a",
    }  # fmt: skip


def test_model_groups_this_account_may_not_list_are_named_not_taken_for_none() -> None:
    reading = ClusterReading(crds=CRDS, unreadable={"modelgroups": "403 Forbidden: modelgroups is forbidden"})
    results = {result.name: result for result in run_checks(reading, answered(), LABELS)}

    assert results["vllm-series"].verdict is Verdict.WARN
    assert "cannot list ModelGroups: 403" in results["vllm-series"].found
