"""The operator's own overhead from `kubectl scale` to groups Ready, on the local cluster.

    python bench/bench_operator_scale.py [--runs 3] [--groups 4] [--cluster STATE_DIR]

A 70B-style ModelGroup (TP8 x PP2, two 8-GPU pods per group) is scaled from 0 to `--groups` and
back, `--runs` times. The fake nodes simulate the pod lifecycle with kwok's delays (pod start
0.1 s, image pull 1 s, weight load 1 s; status times have one-second resolution), a health agent
reports NCCL health within 0.3 s of a rank running, and a fake leader answers the warm-up at once.
So the wall time minus the simulated start-up is what the operator, the scheduler and the watch
round trips add. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from goodput.testbed.cluster.controlplane import LocalCluster
from goodput.testbed.cluster.testing import wait_for
from goodput.testbed.operator_process import OperatorProcess, fake_leaders, health_agent, local_cluster

NAMESPACE = "bench-scale"
# pod-create 0.1 s + image pull 1 s + weight load 1 s (cluster/stages defaults).
SIMULATED_START_SECONDS = 2.1
# The health agent polls every 0.3 s.
AGENT_POLL_SECONDS = 0.3


def model_group(groups: int) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "goodput.dev/v1alpha1",
            "kind": "ModelGroup",
            "metadata": {"name": "llama-70b", "namespace": NAMESPACE},
            "spec": {
                "model": {"name": "meta-llama/Llama-3.1-70B-Instruct"},
                "engine": {"image": "vllm/vllm-openai:v0.33.0"},
                "parallelism": {"tensor": 8, "pipeline": 2, "gpusPerPod": 8},
                "replicas": 0,
                "minReplicas": 0,
                "maxReplicas": groups,
                "drain": {"minLifetimeSeconds": 0, "maxSeconds": 30},
            },
        }
    )


def status(cluster: LocalCluster) -> dict[str, Any]:
    found = cluster.api.get(f"/apis/goodput.dev/v1alpha1/namespaces/{NAMESPACE}/modelgroups/llama-70b")
    return dict((found or {}).get("status") or {})


def pod_count(cluster: LocalCluster) -> int:
    listing = cluster.api.get(f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector=goodput.dev/model-group")
    return len((listing or {}).get("items", []))


@dataclass
class Runs:
    """What each run measured."""

    walls: list[float] = field(default_factory=list)
    reactions: list[float] = field(default_factory=list)
    phases: list[dict[str, float]] = field(default_factory=list)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--groups", type=int, default=4, help="groups to scale to (the default cluster holds 4)"
    )
    parser.add_argument(
        "--cluster", type=Path, help="state dir of a running `goodput cluster up` (else a new one)"
    )
    return parser.parse_args()


def one_run(cluster: LocalCluster, operator: OperatorProcess, groups: int, runs: Runs) -> None:
    """Scale 0 -> `groups`, time the first pod and all groups Ready, then back to 0."""
    started = time.monotonic()
    cluster.kubectl("scale", "mg", "llama-70b", "-n", NAMESPACE, f"--replicas={groups}")
    scaled = time.monotonic()
    wait_for(
        lambda: pod_count(cluster) > 0, timeout_seconds=30, interval_seconds=0.02, describe="the first pod"
    )
    runs.reactions.append(time.monotonic() - scaled)
    ready = wait_for(
        lambda: (s := status(cluster)).get("readyGroups") == groups and s,
        timeout_seconds=120,
        interval_seconds=0.05,
        describe=lambda: f"{groups} ready groups\n{operator.log_tail()}",
    )
    runs.walls.append(time.monotonic() - started)
    runs.phases += [g["readyTime"] for g in ready["groups"]]
    print(
        f"run {len(runs.walls)}: scale 0 -> {groups}: first pod after {runs.reactions[-1]:.2f} s, "
        f"all ready after {runs.walls[-1]:.2f} s"
    )
    cluster.kubectl("scale", "mg", "llama-70b", "-n", NAMESPACE, "--replicas=0")
    wait_for(lambda: pod_count(cluster) == 0, timeout_seconds=120, describe="scaled to zero")


def report(runs: Runs, count: int, groups: int) -> None:
    def median(key: str) -> float:
        return float(statistics.median(p[key] for p in runs.phases))

    wall = statistics.median(runs.walls)
    print(f"\n{count} runs, {groups} groups of 2 pods x 8 GPUs")
    print(
        f"wall, kubectl scale -> all groups Ready: median {wall:.2f} s "
        f"(min {min(runs.walls):.2f}, max {max(runs.walls):.2f})"
    )
    print(
        f"per group, median: placing {median('placingSeconds'):.1f} s, provisioning "
        f"{median('provisioningSeconds'):.1f} s, warming {median('warmingSeconds'):.1f} s, "
        f"total {median('totalSeconds'):.1f} s (status times, 1 s resolution)"
    )
    print(f"kubectl scale returned -> first pod created: median {statistics.median(runs.reactions):.2f} s")
    overhead = wall - SIMULATED_START_SECONDS - AGENT_POLL_SECONDS
    print(
        f"overhead beyond the simulated start-up ({SIMULATED_START_SECONDS} s) and the agent's poll "
        f"({AGENT_POLL_SECONDS} s): {overhead:.2f} s"
    )


def main() -> None:
    args = parse_args()
    runs = Runs()
    with local_cluster(args.cluster) as cluster, tempfile.TemporaryDirectory() as scratch:
        crds = Path(__file__).resolve().parent.parent / "crds"
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crds))
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/modelgroups.goodput.dev")
        cluster.kubectl("create", "namespace", NAMESPACE)
        operator = OperatorProcess(
            cluster, NAMESPACE, Path(scratch) / "operator.log", reconcile_interval_seconds=3.0
        )
        try:
            with (
                operator,
                fake_leaders(cluster, Path(scratch) / "completions.jsonl"),
                health_agent(cluster, NAMESPACE),
            ):
                cluster.kubectl("apply", "-f", "-", input=model_group(args.groups))
                wait_for(
                    lambda: status(cluster).get("observedGeneration") == 1,
                    timeout_seconds=30,
                    describe="the ModelGroup observed",
                )
                for _ in range(args.runs):
                    one_run(cluster, operator, args.groups, runs)
        finally:
            cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
    report(runs, args.runs, args.groups)


if __name__ == "__main__":
    main()
