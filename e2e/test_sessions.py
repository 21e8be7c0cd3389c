"""Sessions and the degrade ladder (issue 42, items 1 and 3), against the live emulator behind the
real gateway.

- A session over its token budget is degraded (its child capped to what is left, and the answer says
  so), then refused with `session_budget_exhausted`; a session past its deadline has every child in
  flight cancelled together, and refuses the next with `session_expired`.
- During a cold start, the Fallback rung serves a non-critical class on the approved ModelGroup of
  the same family, and the answer says which served it; the critical class waits for its own group.

On the production path: `goodput gateway` runs on the host watching the ModelGroups, their SLOPolicy
and leader pods through the API server; the operator (`goodput run`) places the groups on emulated
GPU nodes and reports the fallback it checked on the SLOPolicy.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import test_autoscaler
from test_autoscaler import API, Stage, model_group
from test_gateway import NAME, POLICY, Answer, fixed_fleet, fixed_policy, labelled, post, serving_fleet

from goodput.testbed.cluster.testing import wait_for
from goodput.testbed.operator_process import GatewayProcess

pytestmark = pytest.mark.e2e

stage = test_autoscaler.stage

FAMILY = {"goodput.dev/model-family": "llama-3.1"}
SMALL, SMALL_MODEL = "small", "llama-small"


def session_classes() -> list[dict[str, Any]]:
    return [
        {"name": "chat", "ttftSeconds": 5.0, "itlSeconds": 0.5},
        {
            "name": "agent",
            "ttftSeconds": 5.0,
            "itlSeconds": 0.5,
            "sessionBudget": {"tokens": 40},
            "degrade": {"rungs": ["CapOutput", "Reject"], "capOutputTokens": 1},
        },
        {"name": "tools", "ttftSeconds": 5.0, "itlSeconds": 0.5, "sessionBudget": {"wallClockSeconds": 4}},
    ]


def test_a_session_over_budget_is_degraded_then_refused_and_its_deadline_cancels_every_child(
    stage: Stage, tmp_path: Path
) -> None:
    stage.apply(fixed_policy(stage.namespace, classes=session_classes()), fixed_fleet(stage.namespace, 1))
    with GatewayProcess(stage.cluster, stage.namespace, NAME, tmp_path / "gateway.log") as gateway:
        serving_fleet(stage, 1, gateway)
        agent = {"X-Goodput-Class": "agent", "X-Goodput-Tenant": "team-a"}
        root = post(gateway.url, {"model": "llama", "prompt": "Hello there", "max_tokens": 16}, **agent)
        assert root.status == 200, root
        session = root.headers["X-Goodput-Session"]
        assert root.headers["X-Goodput-Served-By"] == f"{NAME}/main"
        child = {**agent, "X-Goodput-Session": session}
        # Whatever the root used, 3 + 100 tokens do not fit the 40 of the budget: capped to what is left.
        capped = post(gateway.url, {"model": "llama", "prompt": "Hello there", "max_tokens": 100}, **child)
        assert capped.status == 200, capped
        assert capped.headers["X-Goodput-Degraded"] == "CapOutput"
        assert 0 < capped.body["usage"]["completion_tokens"] <= 37
        # A prompt of about 50 tokens alone is more than the whole budget.
        refused = post(gateway.url, {"model": "llama", "prompt": "x" * 200, "max_tokens": 4}, **child)
        assert refused.status == 429, refused
        assert refused.body["error"]["code"] == "session_budget_exhausted"

        tools = {"X-Goodput-Class": "tools", "X-Goodput-Session-Open": "agent-run-1"}
        opened = post(gateway.url, {"model": "llama", "prompt": "Plan", "max_tokens": 4}, **tools)
        assert opened.status == 200, opened
        answers: list[Answer] = []

        def branch() -> None:
            body = {"model": "llama", "prompt": "Summarise the tool's result", "max_tokens": 4000}
            answers.append(
                post(gateway.url, body, **{"X-Goodput-Class": "tools", "X-Goodput-Session": "agent-run-1"})
            )

        branches = [threading.Thread(target=branch, daemon=True) for _ in range(2)]  # maxNumSeqs 2: both run
        for thread in branches:
            thread.start()
        for thread in branches:
            thread.join(timeout=60)
        assert [a.status for a in answers] == [410, 410], answers
        assert {a.body["error"]["code"] for a in answers} == {"session_expired"}
        late = post(
            gateway.url,
            {"model": "llama", "prompt": "Hi", "max_tokens": 4},
            **{"X-Goodput-Class": "tools", "X-Goodput-Session": "agent-run-1"},
        )
        assert late.status == 410 and late.body["error"]["code"] == "session_expired"


def test_the_fallback_rung_serves_a_non_critical_class_during_a_cold_start_and_says_so(
    stage: Stage, tmp_path: Path
) -> None:
    classes = [
        {"name": "chat", "ttftSeconds": 5.0, "itlSeconds": 0.5},
        {
            "name": "background",
            "ttftSeconds": 5.0,
            "itlSeconds": 0.5,
            "degrade": {"rungs": ["Fallback", "Reject"], "fallbackModelGroup": SMALL},
        },
    ]
    small = labelled(fixed_fleet(stage.namespace, 1))
    small["metadata"]["name"] = SMALL
    small["metadata"]["labels"].update(FAMILY)
    small["spec"]["model"]["servedName"] = SMALL_MODEL
    stage.apply(fixed_policy(stage.namespace, classes=classes), small)
    stage.wait_ready_groups(SMALL, 1, timeout_seconds=120)
    log = tmp_path / "gateway.log"
    with GatewayProcess(stage.cluster, stage.namespace, "", log, selector="team=e2e") as gateway:
        gateway.wait_serving()
        primary = labelled(model_group(NAME, stage.namespace, replicas=1, policy=POLICY))
        primary["metadata"]["labels"].update(FAMILY)
        stage.apply(primary)
        answers: list[Answer] = []

        def background() -> bool:
            body = {"model": "llama", "prompt": "Hi", "max_tokens": 4}
            answers.append(post(gateway.url, body, **{"X-Goodput-Class": "background"}))
            return answers[-1].status != 404  # 404 until the gateway serves the new ModelGroup

        wait_for(
            background,
            timeout_seconds=30,
            interval_seconds=0.5,
            describe=lambda: f"the gateway serving {NAME}\n{gateway.log_tail()}",
        )
        assert stage.status(NAME).get("readyGroups", 0) == 0, "the primary must still be warming"
        served = answers[-1]
        assert served.status == 200, served
        assert served.headers["X-Goodput-Degraded"] == "Fallback"
        assert served.headers["X-Goodput-Served-By"] == f"{SMALL}/main"
        assert served.body["model"] == SMALL_MODEL
        # The policy's status says its fallback is valid (the operator reports it on its policy timer).
        wait_for(
            lambda: fallbacks_valid(stage) == ["True"],
            timeout_seconds=60,
            describe=lambda: f"FallbacksValid: {fallbacks_valid(stage)}",
        )
        # The critical class lists no rung: it is held for its own group, and served there.
        stage.wait_ready_groups(NAME, 1, timeout_seconds=120)
        critical = post(gateway.url, {"model": "llama", "prompt": "Hi", "max_tokens": 4})
        assert critical.status == 200, critical
        assert critical.headers["X-Goodput-Served-By"] == f"{NAME}/main"
        assert "X-Goodput-Degraded" not in critical.headers


def fallbacks_valid(stage: Stage) -> list[str]:
    """The statuses of the SLOPolicy's FallbacksValid conditions (one when the operator wrote it)."""
    policy = stage.cluster.api.get(f"{API}/namespaces/{stage.namespace}/slopolicies/{POLICY}")
    conditions = policy.get("status", {}).get("conditions", [])
    return [c["status"] for c in conditions if c["type"] == "FallbacksValid"]
