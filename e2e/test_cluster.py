"""The local control plane behaves like a real GPU cluster where goodput relies on it.

Each test is a user story against the session cluster (real etcd, API server, scheduler, controller
manager; kwok playing the kubelet of fake 8-GPU nodes; Prometheus), except the last, which starts
and stops a second small cluster of its own.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
import textwrap
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from goodput.testbed.cluster import controlplane, netns, processes
from goodput.testbed.cluster.config import COMPONENTS
from goodput.testbed.cluster.controlplane import LocalCluster
from goodput.testbed.cluster.testing import port_accepts, serving_in_netns, wait_for
from goodput.testbed.cluster.topology import CLIQUE_LABEL, GPU_RESOURCE, ZONE_LABEL, Topology, fake_gpu_nodes

FAST = {"sim.goodput.dev/image-pull-seconds": "0", "sim.goodput.dev/weight-load-seconds": "0"}
GROUP_READY = "goodput.dev/group-ready"
NCCL_HEALTHY = "goodput.dev/NCCLHealthy"


# --- helpers -------------------------------------------------------------------------------------


def pod_manifest(
    name: str,
    *,
    gpus: int = 0,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    readiness_gates: tuple[str, ...] = (),
    scheduling_gates: tuple[str, ...] = (),
    node_affinity: dict[str, list[str]] | None = None,
    node_name_selector: str | None = None,
    owner: dict[str, Any] | None = None,
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "vllm", "image": "vllm/vllm-openai:v0.11.0"}
    if gpus:
        container["resources"] = {"limits": {GPU_RESOURCE: str(gpus)}}
    spec: dict[str, Any] = {"containers": [container], "terminationGracePeriodSeconds": 5}
    if readiness_gates:
        spec["readinessGates"] = [{"conditionType": gate} for gate in readiness_gates]
    if scheduling_gates:
        spec["schedulingGates"] = [{"name": gate} for gate in scheduling_gates]
    if node_affinity:
        terms = [{"key": key, "operator": "In", "values": values} for key, values in node_affinity.items()]
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": terms}]
                }
            }
        }
    if node_name_selector:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node_name_selector}
    metadata: dict[str, Any] = {"name": name, "labels": labels or {}, "annotations": annotations or {}}
    if owner:
        metadata["ownerReferences"] = [owner]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def apply(cluster: LocalCluster, namespace: str, *objects: dict[str, Any]) -> None:
    document = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(document))


def get_pod(cluster: LocalCluster, namespace: str, name: str) -> dict[str, Any] | None:
    pod: dict[str, Any] | None = cluster.api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    return pod


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    for item in (obj or {}).get("status", {}).get("conditions", []) or []:
        if item["type"] == kind:
            return dict(item)
    return {}


def wait_pod(
    cluster: LocalCluster, namespace: str, name: str, predicate: Any, what: str, *, timeout: float = 30
) -> dict[str, Any]:
    """Wait until `predicate(pod)` holds; the failure message shows the pod's last status."""
    last: list[dict[str, Any] | None] = [None]

    def check() -> dict[str, Any] | None:
        last[0] = get_pod(cluster, namespace, name)
        return last[0] if last[0] is not None and predicate(last[0]) else None

    pod: dict[str, Any] = wait_for(
        check,
        timeout_seconds=timeout,
        describe=lambda: (
            f"pod {namespace}/{name} {what}; status: {json.dumps((last[0] or {}).get('status'))}"
        ),
    )
    return pod


def is_ready(pod: dict[str, Any]) -> bool:
    return condition(pod, "Ready").get("status") == "True"


def set_pod_condition(
    cluster: LocalCluster, namespace: str, name: str, *, kind: str, status: str, reason: str
) -> None:
    """What a controller or in-pod agent does: write one condition through the pods/status subresource."""
    patch = {"status": {"conditions": [{"type": kind, "status": status, "reason": reason, "message": ""}]}}
    cluster.api.patch(f"/api/v1/namespaces/{namespace}/pods/{name}/status", patch, patch_type="strategic")


def annotate(
    cluster: LocalCluster, kind: str, name: str, namespace: str | None, **annotations: str | None
) -> None:
    path = f"/api/v1/namespaces/{namespace}/{kind}/{name}" if namespace else f"/api/v1/{kind}/{name}"
    cluster.api.patch(path, {"metadata": {"annotations": annotations}})


def parse_time(stamp: str) -> float:
    return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))


# --- the fleet -------------------------------------------------------------------------------------


def test_default_fleet_is_two_zones_of_two_nvlink_domains_of_two_8_gpu_nodes(cluster: LocalCluster) -> None:
    expected = fake_gpu_nodes(cluster.state.topology, cluster.network)
    assert cluster.state.topology == Topology()
    assert len(expected) == 8
    assert len({node.zone for node in expected}) == 2
    assert len({node.clique for node in expected}) == 4

    for want in expected:
        node = cluster.api.get(f"/api/v1/nodes/{want.name}")
        labels = node["metadata"]["labels"]
        assert labels.items() >= want.labels().items()
        assert labels[ZONE_LABEL] == want.zone
        assert labels[CLIQUE_LABEL] == want.clique
        assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
        assert node["status"]["allocatable"][GPU_RESOURCE] == "8"
        assert node["status"]["capacity"][GPU_RESOURCE] == "8"
        assert condition(node, "Ready")["status"] == "True"
        assert not node["spec"].get("taints")
        assert node["spec"]["podCIDR"] == want.pod_cidr
        assert {"type": "InternalIP", "address": want.address} in node["status"]["addresses"]


# --- scheduling ----------------------------------------------------------------------------------


def test_full_node_gpu_pod_binds_inside_its_nvlink_domain_and_a_9_gpu_pod_stays_pending(
    cluster: LocalCluster, namespace: str
) -> None:
    domains = controlplane.gpu_nodes_by_clique(cluster)
    clique = "zone-b.nvl1"
    apply(
        cluster,
        namespace,
        pod_manifest("rank0", gpus=8, annotations=FAST, node_affinity={CLIQUE_LABEL: [clique]}),
    )

    pod = wait_pod(cluster, namespace, "rank0", is_ready, "Ready")

    assert pod["spec"]["nodeName"] in domains[clique]
    node = cluster.api.get(f"/api/v1/nodes/{pod['spec']['nodeName']}")
    assert ipaddress.ip_address(pod["status"]["podIP"]) in ipaddress.ip_network(node["spec"]["podCIDR"])

    apply(cluster, namespace, pod_manifest("too-big", gpus=9, annotations=FAST))
    pending = wait_pod(
        cluster,
        namespace,
        "too-big",
        lambda p: condition(p, "PodScheduled").get("reason") == "Unschedulable",
        "unschedulable",
    )
    assert "nodeName" not in pending["spec"]
    assert pending["status"]["phase"] == "Pending"
    assert "Insufficient nvidia.com/gpu" in condition(pending, "PodScheduled")["message"]

    def failed_scheduling_event() -> list[dict[str, Any]]:
        events = cluster.api.request("GET", f"/api/v1/namespaces/{namespace}/events")["items"]
        return [
            e
            for e in events
            if e["involvedObject"]["name"] == "too-big"
            and e["reason"] == "FailedScheduling"
            and "Insufficient nvidia.com/gpu" in e["message"]
        ]

    wait_for(
        failed_scheduling_event, timeout_seconds=20, describe="a FailedScheduling event naming nvidia.com/gpu"
    )


def test_scheduling_gate_holds_a_pod_until_it_is_removed(cluster: LocalCluster, namespace: str) -> None:
    apply(
        cluster,
        namespace,
        pod_manifest("gated", gpus=1, annotations=FAST, scheduling_gates=("goodput.dev/gang",)),
    )

    held = wait_pod(
        cluster,
        namespace,
        "gated",
        lambda p: condition(p, "PodScheduled").get("reason") == "SchedulingGated",
        "gated",
    )
    assert "nodeName" not in held["spec"]

    cluster.kubectl(
        "patch",
        "-n",
        namespace,
        "pod",
        "gated",
        "--type=json",
        "-p",
        '[{"op":"remove","path":"/spec/schedulingGates"}]',
    )
    released = wait_pod(cluster, namespace, "gated", is_ready, "Ready after the gate is removed")
    assert released["spec"]["nodeName"].startswith("gpu-")


# --- readiness -------------------------------------------------------------------------------------


def test_readiness_gate_decides_ready_and_endpoint_slice_readiness(
    cluster: LocalCluster, namespace: str
) -> None:
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "llama"},
        "spec": {"selector": {"app": "llama"}, "ports": [{"name": "http", "port": 8000, "targetPort": 8000}]},
    }
    pod = pod_manifest("leader", labels={"app": "llama"}, annotations=FAST, readiness_gates=(GROUP_READY,))
    apply(cluster, namespace, service, pod)

    # The health agent reports NCCL health while the model is still loading.
    wait_pod(cluster, namespace, "leader", lambda p: p["status"].get("phase") == "Running", "Running")
    set_pod_condition(
        cluster, namespace, "leader", kind=NCCL_HEALTHY, status="True", reason="AllReducePassed"
    )

    waiting = wait_pod(
        cluster,
        namespace,
        "leader",
        lambda p: condition(p, "ContainersReady").get("status") == "True",
        "containers ready",
    )
    assert condition(waiting, "Ready")["status"] == "False"
    assert condition(waiting, "Ready")["reason"] == "ReadinessGatesNotReady"
    pod_ip = waiting["status"]["podIP"]

    def endpoint_ready() -> bool | None:
        slices = cluster.api.request(
            "GET",
            f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices?labelSelector=kubernetes.io/service-name=llama",
        )["items"]
        for endpoint in (e for s in slices for e in s.get("endpoints") or []):
            if pod_ip in endpoint["addresses"]:
                return bool(endpoint["conditions"].get("ready"))
        return None

    assert wait_for(
        lambda: endpoint_ready() is False, timeout_seconds=20, describe="a not-ready endpoint for the pod"
    )

    set_pod_condition(cluster, namespace, "leader", kind=GROUP_READY, status="True", reason="GroupReady")
    ready = wait_pod(cluster, namespace, "leader", is_ready, "Ready once the gate is True")
    wait_for(endpoint_ready, timeout_seconds=20, describe="the pod's endpoint to become ready")
    # A condition written by another process survives every lifecycle step.
    assert condition(ready, NCCL_HEALTHY)["status"] == "True"
    assert condition(ready, NCCL_HEALTHY)["reason"] == "AllReducePassed"

    set_pod_condition(cluster, namespace, "leader", kind=GROUP_READY, status="False", reason="Draining")
    unready = wait_pod(
        cluster, namespace, "leader", lambda p: not is_ready(p), "not Ready once the gate is False"
    )
    assert condition(unready, "Ready")["reason"] == "ReadinessGatesNotReady"
    assert condition(unready, "ContainersReady")["status"] == "True"
    wait_for(
        lambda: endpoint_ready() is False, timeout_seconds=20, describe="the endpoint to leave the ready set"
    )


def test_pod_becomes_ready_only_after_simulated_image_pull_and_weight_load(
    cluster: LocalCluster, namespace: str
) -> None:
    pull_seconds, load_seconds = 2, 3
    annotations = {
        "sim.goodput.dev/image-pull-seconds": str(pull_seconds),
        "sim.goodput.dev/weight-load-seconds": str(load_seconds),
    }
    apply(cluster, namespace, pod_manifest("slow", annotations=annotations))

    pulling = wait_pod(cluster, namespace, "slow", lambda p: p["status"].get("podIP"), "to get an IP")
    assert pulling["status"]["phase"] == "Pending"
    assert pulling["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "ContainerCreating"
    loading = wait_pod(cluster, namespace, "slow", lambda p: p["status"].get("phase") == "Running", "Running")
    assert condition(loading, "ContainersReady")["status"] == "False"
    assert not is_ready(loading)
    ready = wait_pod(cluster, namespace, "slow", is_ready, "Ready")

    # Kubernetes timestamps have one-second resolution: each phase lasts its delay, give or take a second.
    status = ready["status"]
    started = parse_time(status["containerStatuses"][0]["state"]["running"]["startedAt"])
    pull_took = started - parse_time(status["startTime"])
    load_took = parse_time(condition(ready, "ContainersReady")["lastTransitionTime"]) - started
    assert pull_seconds - 1 <= pull_took <= pull_seconds + 2
    assert load_seconds - 1 <= load_took <= load_seconds + 2


# --- failures ----------------------------------------------------------------------------------------


def test_injected_container_crash_makes_the_pod_unready_until_the_container_restarts(
    cluster: LocalCluster, namespace: str
) -> None:
    apply(cluster, namespace, pod_manifest("rank1", annotations=FAST))
    wait_pod(cluster, namespace, "rank1", is_ready, "Ready")

    annotate(cluster, "pods", "rank1", namespace, **{
        "sim.goodput.dev/fail": "container-crash",
        "sim.goodput.dev/exit-code": "137",
        "sim.goodput.dev/fail-reason": "OOMKilled",
    })  # fmt: skip
    crashed = wait_pod(cluster, namespace, "rank1", lambda p: not is_ready(p), "not Ready after the crash")
    container = crashed["status"]["containerStatuses"][0]
    assert crashed["status"]["phase"] == "Running"
    assert container["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert container["lastState"]["terminated"]["exitCode"] == 137
    assert container["lastState"]["terminated"]["reason"] == "OOMKilled"
    assert container["restartCount"] == 1

    annotate(cluster, "pods", "rank1", namespace, **{"sim.goodput.dev/fail": None})
    recovered = wait_pod(cluster, namespace, "rank1", is_ready, "Ready again after the restart")
    container = recovered["status"]["containerStatuses"][0]
    assert "running" in container["state"]
    assert container["restartCount"] == 1


def test_injected_pod_failure_is_terminal(cluster: LocalCluster, namespace: str) -> None:
    apply(cluster, namespace, pod_manifest("rank2", annotations=FAST))
    wait_pod(cluster, namespace, "rank2", is_ready, "Ready")

    annotate(cluster, "pods", "rank2", namespace, **{
        "sim.goodput.dev/fail": "pod-failure",
        "sim.goodput.dev/fail-reason": "XidError",
        "sim.goodput.dev/fail-message": "Xid 79: GPU has fallen off the bus",
    })  # fmt: skip
    failed = wait_pod(cluster, namespace, "rank2", lambda p: p["status"].get("phase") == "Failed", "Failed")

    assert failed["status"]["reason"] == "XidError"
    assert failed["status"]["message"] == "Xid 79: GPU has fallen off the bus"
    assert condition(failed, "Ready")["status"] == "False"
    assert failed["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 1


def node_taints(cluster: LocalCluster, name: str) -> set[tuple[str, str]]:
    node = cluster.api.get(f"/api/v1/nodes/{name}")
    return {(taint["key"], taint["effect"]) for taint in node["spec"].get("taints") or []}


def node_ready(cluster: LocalCluster, name: str) -> str:
    return str(condition(cluster.api.get(f"/api/v1/nodes/{name}"), "Ready").get("status"))


def test_node_reporting_a_failure_turns_not_ready_and_tainted_then_recovers(cluster: LocalCluster) -> None:
    node = cluster.add_gpu_node("gpu-spare-0", zone="zone-a", clique="zone-a.nvl-spare", gpus=8)
    try:
        assert cluster.api.get(f"/api/v1/nodes/{node.name}")["status"]["allocatable"][GPU_RESOURCE] == "8"
        annotate(cluster, "nodes", node.name, None, **{"sim.goodput.dev/node-failure": "GPUFallenOffBus"})

        wait_for(lambda: node_ready(cluster, node.name) == "False", timeout_seconds=20, describe="NotReady")
        failed = cluster.api.get(f"/api/v1/nodes/{node.name}")
        assert condition(failed, "Ready")["reason"] == "GPUFallenOffBus"
        # The real node lifecycle controller keeps new pods off it and starts the eviction clock.
        wanted = {
            ("node.kubernetes.io/not-ready", "NoSchedule"),
            ("node.kubernetes.io/not-ready", "NoExecute"),
        }
        wait_for(
            lambda: node_taints(cluster, node.name) >= wanted,
            timeout_seconds=30,
            describe=lambda: f"not-ready taints; now {node_taints(cluster, node.name)}",
        )

        annotate(cluster, "nodes", node.name, None, **{"sim.goodput.dev/node-failure": None})
        wait_for(lambda: node_ready(cluster, node.name) == "True", timeout_seconds=20, describe="recovery")
        wait_for(
            lambda: not node_taints(cluster, node.name),
            timeout_seconds=30,
            describe=lambda: f"the taints to go; now {node_taints(cluster, node.name)}",
        )
    finally:
        cluster.remove_node(node.name)


def test_lost_node_goes_unknown_and_its_pods_are_marked_not_ready(
    cluster: LocalCluster, namespace: str
) -> None:
    node = cluster.add_gpu_node("gpu-spare-1", zone="zone-b", clique="zone-b.nvl-spare", gpus=8)
    try:
        apply(
            cluster,
            namespace,
            pod_manifest("stranded", gpus=8, annotations=FAST, node_name_selector=node.name),
        )
        pod = wait_pod(cluster, namespace, "stranded", is_ready, "Ready on the spare node")
        assert ipaddress.ip_address(pod["status"]["podIP"]) in ipaddress.ip_network(node.pod_cidr)

        cluster.lose_node(node.name)

        # No kubelet renews the lease: after the grace period the controller manager takes over.
        wait_for(lambda: node_ready(cluster, node.name) == "Unknown", timeout_seconds=60, describe="Unknown")
        wait_for(
            lambda: ("node.kubernetes.io/unreachable", "NoExecute") in node_taints(cluster, node.name),
            timeout_seconds=30,
            describe=lambda: f"the unreachable taint; now {node_taints(cluster, node.name)}",
        )
        wait_pod(cluster, namespace, "stranded", lambda p: not is_ready(p), "marked not Ready", timeout=30)

        cluster.restore_node(node.name)
        wait_for(
            lambda: node_ready(cluster, node.name) == "True", timeout_seconds=30, describe="the node back"
        )
    finally:
        cluster.kubectl(
            "delete", "-n", namespace, "pod", "stranded", "--grace-period=0", "--force", check=False
        )
        cluster.remove_node(node.name)


def test_simulated_health_agent_reports_nccl_health_from_the_annotation(
    cluster: LocalCluster, namespace: str
) -> None:
    annotations = FAST | {"sim.goodput.dev/nccl-health": "healthy", "sim.goodput.dev/nccl-check-seconds": "0"}
    apply(cluster, namespace, pod_manifest("rank3", annotations=annotations))

    healthy = wait_pod(
        cluster,
        namespace,
        "rank3",
        lambda p: condition(p, NCCL_HEALTHY).get("status") == "True",
        "NCCL healthy",
    )
    assert condition(healthy, NCCL_HEALTHY)["reason"] == "AllReducePassed"

    annotate(cluster, "pods", "rank3", namespace, **{"sim.goodput.dev/nccl-health": "unhealthy"})
    unhealthy = wait_pod(
        cluster,
        namespace,
        "rank3",
        lambda p: condition(p, NCCL_HEALTHY).get("status") == "False",
        "NCCL unhealthy",
    )
    assert condition(unhealthy, NCCL_HEALTHY)["reason"] == "AllReduceFailed"
    assert is_ready(unhealthy)  # health is reported, not enforced: the operator decides what it means


# --- controllers and API machinery -----------------------------------------------------------------


def test_deleting_the_owner_garbage_collects_the_pods_it_owns(cluster: LocalCluster, namespace: str) -> None:
    apply(cluster, namespace, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "group-owner"}})
    owner = cluster.api.get(f"/api/v1/namespaces/{namespace}/configmaps/group-owner")
    reference = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "group-owner",
        "uid": owner["metadata"]["uid"],
    }
    apply(
        cluster,
        namespace,
        *(pod_manifest(f"member-{i}", annotations=FAST, owner=reference) for i in range(2)),
    )
    for i in range(2):
        wait_pod(
            cluster, namespace, f"member-{i}", lambda p: p["status"].get("phase") == "Running", "Running"
        )

    cluster.kubectl("delete", "-n", namespace, "configmap", "group-owner")

    wait_for(
        lambda: all(get_pod(cluster, namespace, f"member-{i}") is None for i in range(2)),
        timeout_seconds=40,
        describe="the owned pods to be garbage-collected",
    )


WIDGET_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.e2e.goodput.dev"},
    "spec": {
        "group": "e2e.goodput.dev",
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["minReplicas", "maxReplicas"],
                                "properties": {
                                    "minReplicas": {"type": "integer", "minimum": 0},
                                    "maxReplicas": {"type": "integer", "minimum": 0},
                                },
                                "x-kubernetes-validations": [
                                    {
                                        "rule": "self.minReplicas <= self.maxReplicas",
                                        "message": "minReplicas must not exceed maxReplicas",
                                        "fieldPath": ".minReplicas",
                                    }
                                ],
                            }
                        },
                    }
                },
            }
        ],
    },
}


def test_crd_cel_rule_rejects_a_bad_object_with_the_rules_message(
    cluster: LocalCluster, namespace: str
) -> None:
    cluster.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(WIDGET_CRD))
    try:
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=30s", "crd/widgets.e2e.goodput.dev")

        def widget(name: str, low: int, high: int) -> str:
            return json.dumps({
                "apiVersion": "e2e.goodput.dev/v1",
                "kind": "Widget",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"minReplicas": low, "maxReplicas": high},
            })  # fmt: skip

        cluster.kubectl("create", "-f", "-", input=widget("good", 1, 3))
        rejected = cluster.kubectl("create", "-f", "-", input=widget("bad", 4, 2), check=False)

        assert rejected.returncode != 0
        assert "spec.minReplicas: Invalid value" in rejected.stderr
        assert "minReplicas must not exceed maxReplicas" in rejected.stderr
        assert cluster.kubectl("get", "-n", namespace, "widgets", "bad", check=False).returncode != 0
    finally:
        cluster.kubectl("delete", "crd", "widgets.e2e.goodput.dev", "--wait=false", check=False)


# --- metrics -------------------------------------------------------------------------------------------

METRICS_SERVER = textwrap.dedent(
    """
    import http.server, sys
    BODY = b'# TYPE goodput_e2e_probe_value gauge\\ngoodput_e2e_probe_value{source="test"} 42\\n'
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(BODY if self.path == "/metrics" else b"")
        def log_message(self, *args):
            pass
    http.server.HTTPServer((sys.argv[1], int(sys.argv[2])), Handler).serve_forever()
    """
)


def prometheus_query(cluster: LocalCluster, query: str) -> list[dict[str, Any]]:
    url = f"{cluster.prometheus_url}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
    with urllib.request.urlopen(url, timeout=5) as reply:
        result: list[dict[str, Any]] = json.load(reply)["data"]["result"]
    return result


def test_prometheus_discovers_the_pod_and_scrapes_a_server_on_its_ip(
    cluster: LocalCluster, namespace: str
) -> None:
    labels = {
        "goodput.dev/metrics": "true",
        "goodput.dev/metrics-port": "9400",
        "goodput.dev/model-group": "llama-70b",
        "goodput.dev/group": "llama-70b-g0",
        "goodput.dev/rank": "0",
    }
    apply(cluster, namespace, pod_manifest("scraped", labels=labels, annotations=FAST))
    pod_ip = wait_pod(cluster, namespace, "scraped", is_ready, "Ready")["status"]["podIP"]
    selector = f'{{namespace="{namespace}",pod="scraped"}}'
    expected_labels = {
        "namespace": namespace,
        "pod": "scraped",
        "model_group": "llama-70b",
        "group": "llama-70b-g0",
        "rank": "0",
        "instance": f"{pod_ip}:9400",
    }

    argv = [sys.executable, "-c", METRICS_SERVER, pod_ip, "9400"]
    with serving_in_netns(cluster.netns, argv, address=(pod_ip, 9400)):
        up = wait_for(
            lambda: [s for s in prometheus_query(cluster, f"up{selector}") if s["value"][1] == "1"],
            timeout_seconds=40,
            describe=lambda: f"up{selector} == 1; now {prometheus_query(cluster, f'up{selector}')}",
        )
        custom = wait_for(
            lambda: prometheus_query(cluster, f"goodput_e2e_probe_value{selector}"),
            timeout_seconds=20,
            describe="the custom metric",
        )

    assert len(up) == 1
    assert up[0]["metric"].items() >= expected_labels.items()
    assert custom[0]["value"][1] == "42"
    assert custom[0]["metric"].items() >= (expected_labels | {"source": "test"}).items()


# --- a second cluster: up and down leave nothing behind ------------------------------------------


def listening_sockets(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN state that process `pid` holds."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = fd.readlink().as_posix()
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    sockets = []
    for table, family in (("tcp", 4), ("tcp6", 6)):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # 0A = LISTEN
                address_hex, port_hex = local.split(":")
                raw = bytes.fromhex(address_hex)
                if family == 4:
                    address = str(ipaddress.IPv4Address(raw[::-1]))
                else:
                    address = str(
                        ipaddress.IPv6Address(b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4)))
                    )
                sockets.append((address, int(port_hex, 16)))
    return sockets


@pytest.fixture
def second_cluster_dir(tmp_path: Path) -> Iterator[Path]:
    state_dir = tmp_path / "second"
    yield state_dir
    if state_dir.exists():  # the test failed half-way: do not leave a cluster running
        controlplane.down(state_dir, keep_logs=True)


def goodput(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "goodput.operator.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_cluster_down_leaves_no_process_port_or_network_namespace(
    cluster: LocalCluster, second_cluster_dir: Path
) -> None:
    name = f"e2edown{time.time_ns() % 10_000}"
    where = ["--name", name, "--state-dir", str(second_cluster_dir)]
    started = goodput("cluster", "up", *where, "--topology", "zones=1,domains=1,nodes=1,gpus=8")
    assert started.returncode == 0, started.stderr
    second = controlplane.load(second_cluster_dir)
    records = processes.read_records(second_cluster_dir / "pids")
    assert sorted(records) == sorted(COMPONENTS)
    assert all(processes.is_running(record) for record in records.values())
    ports = second.state.ports.all()
    plan = netns.NetnsPlan(second.netns, second.network)
    assert netns.exists(plan.name)
    assert second.node_names() == ["gpu-a0-0"]
    # Every listener of every component is on loopback.
    for record in records.values():
        sockets = listening_sockets(record.pid)
        assert sockets, f"{record.name} listens nowhere"
        assert {address for address, _ in sockets} <= {"127.0.0.1"}, (record.name, sockets)
    status = goodput("cluster", "status", *where)
    assert status.returncode == 0, status.stdout + status.stderr

    stopped = goodput("cluster", "down", *where)

    assert stopped.returncode == 0, stopped.stderr
    # It returned once every process it stopped had exited whole (every thread), and says so.
    assert all(processes.has_exited(record.pid, record.start_ticks) for record in records.values())
    assert "every process stopped has exited" in stopped.stdout, stopped.stdout
    assert not any(processes.is_running(record) for record in records.values())
    assert not any(
        Path(f"/proc/{record.pid}").exists() and processes.executable_of(record.pid) == record.executable
        for record in records.values()
    )
    assert not [port for port in ports.values() if port_accepts("127.0.0.1", port)]
    assert not netns.exists(plan.name)
    assert (
        plan.name
        not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    )
    assert not Path(f"/sys/class/net/{plan.host_veth}").exists()
    routes = subprocess.run(
        ["ip", "-4", "route", "show", plan.network.pod_range], capture_output=True, text=True, check=True
    )
    assert routes.stdout.strip() == ""
    assert not second_cluster_dir.exists()
    # The session cluster is untouched.
    assert all(status.healthy for status in cluster.status())
