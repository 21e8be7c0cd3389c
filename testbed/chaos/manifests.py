"""What the chaos run serves: two ModelGroups on a GPU pool of the run's own, under streaming load.

- `chat`: sized by hand (no policy), two pods per group (TP=2 on one GPU each), scaled between
  1 and 4 groups by the run and rolled out every few minutes; its drains give up after 20 s, so the
  longest streams (about 30 s) are aborted by a timed-out drain now and then and must be counted.
- `auto`: one pod per group, sized by the autoscaler against an SLOPolicy (5 s interval, 8 s rate
  window) under load that alternates between low and high, so it scales out and in by itself.
"""

from __future__ import annotations

import random
from typing import Any

from goodput.testbed.loadgen import PlannedRequest

MANUAL = "chat"
AUTOSCALED = "auto"
POLICY = "chaos"
POOL_LABEL = "chaos.goodput.dev/pool"
PORT = 8000
DRAIN_MAX_SECONDS = 20


def slo_policy(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "goodput.dev/v1alpha1",
        "kind": "SLOPolicy",
        "metadata": {"name": POLICY, "namespace": namespace},
        "spec": {
            "revision": "r1",
            "classes": [{"name": "chat", "ttftSeconds": 1.0, "itlSeconds": 0.05}],
            "goodput": {"windowSeconds": 30},
            "autoscaling": {
                "mode": "Active",
                "intervalSeconds": 5,
                "signals": {"queueWork": {"drainTargetSeconds": 10.0}, "goodput": {"enabled": False}},
                "scaleUp": {"policies": [{"type": "Groups", "value": 2, "periodSeconds": 10}]},
                "scaleDown": {
                    "stabilizationWindowSeconds": 30,
                    "policies": [{"type": "Groups", "value": 1, "periodSeconds": 10}],
                },
                "metrics": {"maxAgeSeconds": 15},
            },
        },
    }


def _model_group(name: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "revision": "main", "servedName": name},
        "engine": {"image": "vllm/vllm-openai:v0.33.0", "port": PORT, "shutdownTimeoutSeconds": 0},
        "placement": {
            "nodeSelector": [{"key": POOL_LABEL, "value": namespace}],
            "scheduleTimeoutSeconds": 60,
        },
        "minReplicas": 1,
        "maxReplicas": 4,
        "readiness": {"warmup": {"maxTokens": 4, "timeoutSeconds": 10}},
        "drain": {"maxSeconds": DRAIN_MAX_SECONDS, "onTimeout": "Abort", "minLifetimeSeconds": 0},
    }
    return {
        "apiVersion": "goodput.dev/v1alpha1",
        "kind": "ModelGroup",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {**base, **spec},
    }


def manual_model_group(namespace: str, replicas: int = 2) -> dict[str, Any]:
    return _model_group(
        MANUAL,
        namespace,
        {
            "parallelism": {"tensor": 2, "pipeline": 1, "gpusPerPod": 1},
            "replicas": replicas,
            "profile": {"gpu": "h100-80g"},
        },
    )


def autoscaled_model_group(namespace: str) -> dict[str, Any]:
    return _model_group(
        AUTOSCALED,
        namespace,
        {
            "parallelism": {"tensor": 1, "pipeline": 1, "gpusPerPod": 1},
            "replicas": 1,
            "policyRef": {"name": POLICY},
            "profile": {"gpu": "h100-80g", "maxNumSeqs": 2, "maxNumBatchedTokens": 2048},
        },
    )


def leaders_service(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "selector": {"goodput.dev/model-group": name, "goodput.dev/rank": "0"},
            "ports": [{"name": "http", "port": PORT, "targetPort": PORT}],
        },
    }


def manual_load(seed: int, duration_seconds: float, rate_per_second: float = 1.5) -> list[PlannedRequest]:
    """Steady streams of 2 to 5 s, one in ten about 30 s long (longer than a drain waits)."""
    rng = random.Random(f"{seed}/load/{MANUAL}")
    plan = []
    for index in range(int(duration_seconds * rate_per_second)):
        long = rng.random() < 0.1
        tokens = rng.randint(3500, 4000) if long else rng.randint(250, 700)
        plan.append(PlannedRequest(index, (index + rng.uniform(0, 0.5)) / rate_per_second, 64, tokens))
    return plan


def autoscaled_load(seed: int, duration_seconds: float) -> list[PlannedRequest]:
    """Phases of 40 to 70 s alternating between about half a group's work and about two groups'."""
    rng = random.Random(f"{seed}/load/{AUTOSCALED}")
    plan: list[PlannedRequest] = []
    start, high = 0.0, False
    while start < duration_seconds:
        seconds = min(rng.uniform(40, 70), duration_seconds - start)
        rate = 7.0 if high else 2.0
        count = int(rate * seconds)
        plan.extend(PlannedRequest(len(plan) + i, start + i / rate, 256, 64) for i in range(count))
        start += seconds
        high = not high
    return plan
