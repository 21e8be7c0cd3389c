"""A pool scaled to zero wakes on the first request that reaches its gateway, and serves it.

On the production path: the gateway (`goodput gateway`) runs on the host as a process, watching the
ModelGroup, its SLOPolicy and the leader pods through the API server and routing to the leaders'
pod IPs; the cluster's Prometheus scrapes it as a static target; the operator (`goodput run`) reads
the gateway's queue from Prometheus and scales through the scale subresource; the vLLM emulator
serves the new group's leader at its pod IP once it is loaded.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from test_autoscaler import POOL_LABEL, Stage, emulator_process, model_group, operator_process, slo_policy

from goodput.testbed.cluster.controlplane import LocalCluster
from goodput.testbed.cluster.testing import wait_for
from goodput.testbed.operator_process import GatewayProcess

pytestmark = pytest.mark.e2e

NAME = "chat"
POLICY = "interactive"
HOLD_SECONDS = 150  # longer than placing, loading and warming one group, and the decisions before


@pytest.fixture
def stage(cluster: LocalCluster, goodput_crds: list[str], namespace: str, tmp_path: Path) -> Iterator[Stage]:
    node = cluster.add_gpu_node(
        f"{namespace}-h100", zone=f"{namespace}-z", clique=f"{namespace}-c", labels={POOL_LABEL: namespace}
    )
    emulator = emulator_process(cluster, namespace, tmp_path / "emulator.log")
    operator = operator_process(cluster, namespace, tmp_path / "operator.log")
    emulator.start()
    operator.start()
    try:
        yield Stage(cluster, namespace, operator, emulator)
    finally:
        operator.stop()
        emulator.stop()
        cluster.remove_node(node.name)


def held_policy(namespace: str) -> dict[str, Any]:
    policy = slo_policy(POLICY, namespace)
    policy["spec"]["admission"] = {"maxDeferSeconds": HOLD_SECONDS}
    return policy


def pool_at_zero(namespace: str) -> dict[str, Any]:
    group = model_group(NAME, namespace, replicas=0, policy=POLICY)
    group["spec"]["minReplicas"] = 0
    return group


@dataclass
class Answer:
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: dict[str, Any] = field(default_factory=dict)


def complete(url: str, timeout_seconds: float, **headers: str) -> Answer:
    body = json.dumps({"model": "llama", "prompt": "Hello there", "max_tokens": 4}).encode()
    request = urllib.request.Request(
        url + "/v1/completions", body, {"Content-Type": "application/json", **headers}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_seconds) as response:
            return Answer(response.status, dict(response.headers), json.loads(response.read()))
    except urllib.error.HTTPError as error:
        return Answer(error.code, dict(error.headers), json.loads(error.read() or b"{}"))


def test_a_pool_at_zero_wakes_on_the_gateways_queue_and_serves_the_held_request(
    stage: Stage, tmp_path: Path
) -> None:
    stage.apply(held_policy(stage.namespace), pool_at_zero(stage.namespace))
    with GatewayProcess(stage.cluster, stage.namespace, NAME, tmp_path / "gateway.log") as gateway:
        gateway.wait_serving()
        assert stage.replicas(NAME) == 0

        answer = Answer()

        def send() -> None:
            answer.__dict__.update(complete(gateway.url, HOLD_SECONDS + 20).__dict__)

        sender = threading.Thread(target=send, daemon=True, name="held-request")
        sender.start()

        def describe() -> str:
            return f"{stage.describe(NAME)}\ngateway log:\n{gateway.log_tail()}"

        wait_for(lambda: stage.replicas(NAME) == 1, timeout_seconds=90, describe=describe)
        stage.wait_ready_groups(NAME, 1, timeout_seconds=120)
        sender.join(timeout=HOLD_SECONDS + 30)
        assert answer.status == 200, f"{answer}\n{describe()}"
        # It was held for want of a ready group, then routed to the group that woke for it.
        assert answer.headers.get("X-Goodput-Reason") == "NoReadyGroup"
        ready = [g["name"] for g in stage.status(NAME).get("groups", []) if g["state"] == "Ready"]
        assert answer.headers.get("X-Goodput-Group") in ready
        assert answer.body["choices"]

        woke = [d for d in stage.decisions(NAME) if d["result"]["desired_groups"] == 1]
        assert woke, describe()
        assert woke[0]["reason"] == "gatewayQueue" and woke[0]["result"]["current_groups"] == 0
        assert woke[0]["inputs"]["gateway"] == "fresh"

        # A policy change applies without a restart: a new class is served, not refused as unknown.
        assert complete(gateway.url, 30, **{"X-Goodput-Class": "batch"}).status == 400
        changed = held_policy(stage.namespace)
        changed["spec"]["revision"] = "r2"
        changed["spec"]["classes"].append({"name": "batch", "ttftSeconds": 30.0, "itlSeconds": 0.5})
        stage.apply(changed)
        wait_for(
            lambda: complete(gateway.url, 30, **{"X-Goodput-Class": "batch"}).status == 200,
            timeout_seconds=30,
            interval_seconds=1.0,
            describe=describe,
        )
