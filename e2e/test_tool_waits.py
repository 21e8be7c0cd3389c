"""KV across tool waits (agentic and RAG traffic, item 2), against the live emulator behind the real
gateway.

A team runs an agent whose sessions alternate between a generation and a tool call. Its ModelGroup
enables the engines' CPU offload tier (`spec.kvOffload`): the engines start with vLLM's offloading
flags. The gateway learns the tool's waits from the sessions' gaps; until it has seen enough it
lets a waiting session's KV go, then, on an idle fleet where holding KV costs no one anything, it
keeps it, counts what kept sessions hold, and frees it when the session's next request comes.

On the production path: `goodput gateway` runs on the host watching the ModelGroup, its SLOPolicy
and leader pods through the API server; the operator (`goodput run`) renders the engines' pods.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import test_autoscaler
from test_autoscaler import Stage
from test_gateway import NAME, fixed_fleet, fixed_policy, gateway_metric, post, serving_fleet

from goodput.testbed.operator_process import GatewayProcess

pytestmark = pytest.mark.e2e

stage = test_autoscaler.stage

AGENT = {"name": "agent", "ttftSeconds": 5.0, "itlSeconds": 0.5, "sessionBudget": {"branches": 20}}
# The gateway trusts its learnt waits once it has seen this many (ToolWaitPolicy.min_observations).
LEARNT_AFTER = 8


def offloading_fleet(namespace: str) -> dict[str, Any]:
    fleet = fixed_fleet(namespace, 2)
    fleet["spec"]["kvOffload"] = {"cpuSizeGib": 16, "backend": "native"}
    return fleet


def engine_args(stage: Stage) -> list[list[str]]:
    pods = stage.cluster.api.get(f"/api/v1/namespaces/{stage.namespace}/pods")["items"]
    return [
        container["args"]
        for pod in pods
        if pod["metadata"].get("labels", {}).get("goodput.dev/model-group") == NAME
        for container in pod["spec"]["containers"]
        if "--kv-offloading-size" in container.get("args", [])
    ]


def test_a_session_waiting_on_a_tool_is_let_go_until_its_waits_are_learnt_then_kept(
    stage: Stage, tmp_path: Path
) -> None:
    stage.apply(fixed_policy(stage.namespace, classes=[AGENT]), offloading_fleet(stage.namespace))
    with GatewayProcess(stage.cluster, stage.namespace, NAME, tmp_path / "gateway.log") as gateway:
        serving_fleet(stage, 2, gateway)
        offloading = engine_args(stage)
        assert len(offloading) == 2, "every engine starts with the CPU offload tier"
        for args in offloading:
            at = args.index("--kv-offloading-size")
            assert args[at : at + 4] == ["--kv-offloading-size", "16", "--kv-offloading-backend", "native"]

        agent = {"X-Goodput-Class": "agent", "X-Goodput-Tenant": "team-a"}
        body = {"model": "llama", "prompt": "Plan the next tool call", "max_tokens": 8}
        actions = "goodput_gateway_tool_wait_actions_total"
        # Each session's next request teaches the gateway one wait; a wait weighs a little less as
        # it ages, so the waits count as learnt from the one after LEARNT_AFTER on.
        for run in range(LEARNT_AFTER + 3):
            kept_before = gateway_metric(gateway, actions, action="keep")
            let_go_before = gateway_metric(gateway, actions, action="recompute")
            root = post(gateway.url, body, **agent, **{"X-Goodput-Session-Open": f"run-{run}"})
            assert root.status == 200, root
            # The root's answer ended: the session waits on its tool.
            if run == 0:  # no wait seen yet: let go
                assert gateway_metric(gateway, actions, action="recompute") == let_go_before + 1
            if run > LEARNT_AFTER:  # the waits are learnt and the fleet idle: kept on its group
                assert gateway_metric(gateway, actions, action="keep") == kept_before + 1, gateway.log_tail()
            child = post(gateway.url, body, **agent, **{"X-Goodput-Session": f"run-{run}"})
            assert child.status == 200, child
            if run > LEARNT_AFTER:
                assert child.headers["X-Goodput-Group"] == root.headers["X-Goodput-Group"]

        assert gateway_metric(gateway, actions, action="offload") == 0, "an idle fleet never offloads"
