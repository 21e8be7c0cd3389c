"""The shared ground of the drain stories (e2e/test_drain.py, e2e/test_drain_killed.py): the
ModelGroup, the trace, the fixtures (a GPU node of the test's own, the live emulator, the operator)
and what each story reads back (status, Events, endpoints, metrics)."""

from __future__ import annotations

import json
import random
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from goodput.operator.engine import parse_leader_metrics
from goodput.testbed.cluster.controlplane import LocalCluster
from goodput.testbed.cluster.testing import wait_for
from goodput.testbed.operator_process import (
    EmulatorProcess,
    OperatorProcess,
    operator_metric,
)

POOL_LABEL = "e2e.goodput.dev/pool"
SERVED = "llama"
PORT = 8000
LABEL_MODEL_GROUP = "goodput.dev/model-group"
MODEL_GROUP_PATH = "/apis/goodput.dev/v1alpha1/namespaces/{namespace}/modelgroups/" + SERVED
SETTLE_SECONDS = 5.0
"""The operator's default `drain_settle_seconds`."""


@dataclass(frozen=True)
class Request:
    at_seconds: float
    output_tokens: int
    input_tokens: int = 64


def write_trace(path: Path, requests: list[Request]) -> str:
    """A Mooncake-style JSONL trace: exactly these requests, no shared prefixes."""
    lines = [
        json.dumps(
            {
                "timestamp": round(r.at_seconds * 1000),
                "input_length": r.input_tokens,
                "output_length": r.output_tokens,
                "hash_ids": [],
            }
        )
        for r in sorted(requests, key=lambda r: r.at_seconds)
    ]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def steady(rate: float, seconds: float, tokens: tuple[int, int], seed: int) -> list[Request]:
    """Evenly spaced arrivals with a little jitter, output lengths uniform in `tokens`."""
    rng = random.Random(seed)
    count = int(rate * seconds)
    return [
        Request(at_seconds=(i + rng.uniform(0, 0.5)) / rate, output_tokens=rng.randint(*tokens))
        for i in range(count)
    ]


def model_group(namespace: str, replicas: int, *, max_seconds: int, shutdown_seconds: int = 30) -> str:
    body = {
        "apiVersion": "goodput.dev/v1alpha1",
        "kind": "ModelGroup",
        "metadata": {"name": SERVED, "namespace": namespace},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "revision": "main", "servedName": SERVED},
            "engine": {
                "image": "vllm/vllm-openai:v0.33.0",
                "port": PORT,
                "shutdownTimeoutSeconds": shutdown_seconds,
            },
            "parallelism": {"tensor": 1, "pipeline": 1, "gpusPerPod": 1},
            "placement": {"nodeSelector": [{"key": POOL_LABEL, "value": namespace}]},
            "replicas": replicas,
            "minReplicas": 1,
            "maxReplicas": 4,
            "profile": {"gpu": "h100-80g"},
            "readiness": {"warmup": {"maxTokens": 4, "timeoutSeconds": 10}},
            "drain": {"maxSeconds": max_seconds, "onTimeout": "Abort", "minLifetimeSeconds": 0},
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": SERVED, "namespace": namespace},
        "spec": {
            "selector": {LABEL_MODEL_GROUP: SERVED, "goodput.dev/rank": "0"},
            "ports": [{"name": "http", "port": PORT, "targetPort": PORT}],
        },
    }
    return yaml.safe_dump_all([body, service])


# Fixtures: a GPU node of the test's own, the emulator, the operator.


@pytest.fixture
def gpu_node(cluster: LocalCluster, namespace: str) -> Iterator[str]:
    node = cluster.add_gpu_node(
        f"{namespace}-n0", zone=f"{namespace}-z0", clique=f"{namespace}-c0", labels={POOL_LABEL: namespace}
    )
    try:
        yield node.name
    finally:
        cluster.remove_node(node.name)


@pytest.fixture
def emulator(cluster: LocalCluster, namespace: str, tmp_path: Path) -> Iterator[EmulatorProcess]:
    with EmulatorProcess(cluster, namespace, tmp_path / "emulator.log") as running:
        yield running


@pytest.fixture
def operator(
    cluster: LocalCluster,
    namespace: str,
    tmp_path: Path,
    *,
    goodput_crds: list[str],
    gpu_node: str,
    emulator: EmulatorProcess,
) -> Iterator[OperatorProcess]:
    """The operator, started after the CRDs, the GPU node and the emulator, and stopped before them."""
    with OperatorProcess(cluster, namespace, tmp_path / "operator.log") as running:
        yield running


# Reading the cluster.


def status(cluster: LocalCluster, namespace: str) -> dict[str, Any]:
    found = cluster.api.get(MODEL_GROUP_PATH.format(namespace=namespace)) or {}
    return dict(found.get("status") or {})


def events(cluster: LocalCluster, namespace: str, reason: str) -> list[dict[str, Any]]:
    answer = cluster.api.get(f"/api/v1/namespaces/{namespace}/events?fieldSelector=reason%3D{reason}")
    return sorted(answer["items"] if answer else [], key=lambda e: e.get("lastTimestamp") or "")


def live_pods(cluster: LocalCluster, namespace: str) -> dict[str, dict[str, Any]]:
    answer = cluster.api.get(f"/api/v1/namespaces/{namespace}/pods?labelSelector={LABEL_MODEL_GROUP}")
    return {
        pod["metadata"]["name"]: pod
        for pod in (answer["items"] if answer else [])
        if not pod["metadata"].get("deletionTimestamp")
    }


def groups(cluster: LocalCluster, namespace: str) -> set[str]:
    return {pod["metadata"]["labels"]["goodput.dev/group"] for pod in live_pods(cluster, namespace).values()}


def ready_endpoints(cluster: LocalCluster, namespace: str) -> set[str]:
    answer = cluster.api.get(
        f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"
        f"?labelSelector=kubernetes.io/service-name%3D{SERVED}"
    )
    return {
        endpoint["targetRef"]["name"]
        for item in (answer["items"] if answer else [])
        for endpoint in item.get("endpoints") or ()
        if (endpoint.get("conditions") or {}).get("ready")
    }


def running_on(address: str) -> int:
    """Requests the engine at `address` is generating for now (its own /metrics page)."""
    with urllib.request.urlopen(f"http://{address}:{PORT}/metrics", timeout=5) as answer:
        sample = parse_leader_metrics(answer.read().decode(), datetime.now(UTC))
    return sample.running if sample is not None else 0


def every_leader_generating(leaders: dict[str, str]) -> None:
    """Wait until the load reaches every leader: whichever group is then drained has work in flight
    (the load generator's own start-up can take seconds on a loaded machine)."""
    wait_for(
        lambda: all(running_on(address) >= 1 for address in leaders.values()),
        timeout_seconds=30,
        describe=f"every leader ({', '.join(sorted(leaders))}) generating",
    )


def describe(cluster: LocalCluster, namespace: str, operator: OperatorProcess) -> str:
    return f"status {json.dumps(status(cluster, namespace))}\noperator log:\n{operator.log_tail(25)}"


def serving(cluster: LocalCluster, namespace: str, operator: OperatorProcess, count: int) -> dict[str, str]:
    """Wait for `count` ready groups, each leader in the Service's ready endpoints; their leader IPs."""
    wait_for(
        lambda: (
            status(cluster, namespace).get("readyGroups") == count
            and len(ready_endpoints(cluster, namespace)) == count
        ),
        timeout_seconds=120,
        describe=lambda: f"{count} ready groups serving\n{describe(cluster, namespace, operator)}",
    )
    return {
        pod["metadata"]["labels"]["goodput.dev/group"]: pod["status"]["podIP"]
        for pod in live_pods(cluster, namespace).values()
    }


def scale(cluster: LocalCluster, namespace: str, replicas: int) -> None:
    cluster.api.patch(MODEL_GROUP_PATH.format(namespace=namespace), {"spec": {"replicas": replicas}})


def draining_group(cluster: LocalCluster, namespace: str) -> str:
    def found() -> str:
        draining = [
            g["name"] for g in status(cluster, namespace).get("groups", []) if g["state"] == "Draining"
        ]
        return draining[0] if draining else ""

    return str(wait_for(found, timeout_seconds=30, describe="a draining group"))


def drain_metric(operator: OperatorProcess, name: str, **labels: str) -> float:
    value = operator_metric(
        operator.metrics_port, name, {"namespace": operator.namespace, "model_group": SERVED, **labels}
    )
    return 0.0 if value is None else value


def assert_no_request_lost(report: dict[str, Any]) -> None:
    failed = {outcome: n for outcome, n in report["outcomes"].items() if outcome != "ok" and n}
    assert not failed, f"the load generator saw failures: {failed}"
    assert report["outcomes"]["ok"] == report["sent"] == report["planned"], report
    assert report["not_sent"] == {"concurrency_limit": 0, "deadline": 0, "no_target": 0}, report


def show(title: str, drain: dict[str, Any], report: dict[str, Any]) -> None:
    """The figures of a story, for the record (pytest -s)."""
    print(f"\n[{title}] drains: {json.dumps(drain)}")
    print(f"[{title}] load: sent {report['sent']}, outcomes {report['outcomes']}")
    print(f"[{title}] requests per leader: {report['by_target']}")
