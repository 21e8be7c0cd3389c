"""From `spec.replicas` raised past the existing nodes to every new group Ready, with Karpenter.

    python bench/bench_nodes_on_demand.py [--groups 2] [--runs 2] [--cluster STATE_DIR]

Starts a cluster with one 2-node NVLink domain (unless given one), Karpenter with its KWOK cloud
provider and a NodePool of 8-GPU nodes, the operator, and stand-ins for the vLLM leaders. A ModelGroup
of TP8 × PP2 groups (two 8-GPU pods each, `placement.nodeProvisioning.mode: Pods`) serves one group on
the existing nodes. Each run raises `spec.replicas` by `--groups`, and polls (every 0.1 s) the
NodeClaims, the nodes and the ModelGroup's status until every group is Ready, then scales back in
and waits until Karpenter has removed the nodes left empty. Prints per run:

- total: `kubectl scale` returned -> every new group Ready;
- node provisioning: the first NodeClaim seen -> the last new node seen Ready (Karpenter's batching
  and launch, and kwok's stand-in kubelet: what a cloud's instance start-up replaces);
- goodput's part: the rest, before the first NodeClaim (the operator creating the pending pods, the
  scheduler marking them unschedulable) and after the last node Ready (binding, start, warm-up);
  the goal is at most 15 s;
- nodes left holding a partial group or nothing, after the groups are Ready and after scale-in.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from goodput.testbed.cluster import karpenter
from goodput.testbed.cluster.controlplane import LocalCluster
from goodput.testbed.cluster.testing import wait_for
from goodput.testbed.cluster.topology import Topology
from goodput.testbed.operator_process import OperatorProcess, fake_leaders, local_cluster

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "e2e"))  # the e2e story's ModelGroup is shared, not duplicated

from test_nodes_on_demand import model_group as e2e_model_group  # noqa: E402

NAMESPACE = "bench-nodes-on-demand"
NAME = "llama"
POOL = "bench-gpu"
POOL_LABEL = "bench.goodput.dev/pool"
LABEL_GROUP = "goodput.dev/group"
POLL_SECONDS = 0.1
GOAL_SECONDS = 15.0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--groups", type=int, default=2, help="new groups per run (2 nodes each)")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--cluster", type=Path, default=None, help="state dir of a running local cluster")
    return parser.parse_args()


def model_group(replicas: int) -> str:
    """The e2e story's ModelGroup (two 8-GPU pods a group, nodes asked for when none fit), in the
    bench's namespace and pool, with room for the bench's largest scale-out."""
    return e2e_model_group(
        NAME, NAMESPACE, replicas=replicas, timeout_seconds=300, pool_label=POOL_LABEL, max_replicas=16
    )


@dataclass(frozen=True, slots=True)
class RunFigures:
    total_seconds: float
    first_claim_seconds: float
    last_node_ready_seconds: float
    nodes_launched: int
    wrong_when_ready: list[str]
    wrong_after_scale_in: list[str]
    scale_in_seconds: float

    @property
    def provisioning_seconds(self) -> float:
        return self.last_node_ready_seconds - self.first_claim_seconds

    @property
    def goodput_seconds(self) -> float:
        return self.total_seconds - self.provisioning_seconds


def ready_groups(cluster: LocalCluster) -> int:
    found = cluster.api.get(f"/apis/goodput.dev/v1alpha1/namespaces/{NAMESPACE}/modelgroups/{NAME}") or {}
    return int((found.get("status") or {}).get("readyGroups") or 0)


def claims(cluster: LocalCluster) -> list[dict[str, Any]]:
    answer = cluster.api.get(
        f"/apis/karpenter.sh/v1/nodeclaims?labelSelector={karpenter.NODEPOOL_LABEL}%3D{POOL}"
    )
    return list((answer or {}).get("items", []))


def node_ready(node: dict[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def live_pods(cluster: LocalCluster) -> list[dict[str, Any]]:
    """The ModelGroup's pods, terminating ones included until they are gone."""
    pods = cluster.api.get(f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector=goodput.dev/model-group") or {}
    return list(pods.get("items", []))


def wrong_nodes(cluster: LocalCluster) -> list[str]:
    live = [p for p in live_pods(cluster) if not p["metadata"].get("deletionTimestamp")]
    launched = {n["metadata"]["name"] for n in karpenter.nodes_of_pool(cluster, POOL)}
    return karpenter.nodes_left_wrong(live, launched, LABEL_GROUP)


def one_run(cluster: LocalCluster, base: int, groups: int) -> RunFigures:
    target = base + groups
    before = {n["metadata"]["name"] for n in karpenter.nodes_of_pool(cluster, POOL)}
    claims_before = {c["metadata"]["name"] for c in claims(cluster)}
    cluster.kubectl("scale", "mg", NAME, "-n", NAMESPACE, f"--replicas={target}")
    started = time.monotonic()
    first_claim: float | None = None
    ready_seen: dict[str, float] = {}
    deadline = started + 300
    while ready_groups(cluster) < target:
        if time.monotonic() > deadline:
            raise SystemExit(f"groups not ready in 300 s: {ready_groups(cluster)}/{target}")
        now = time.monotonic() - started
        if first_claim is None and {c["metadata"]["name"] for c in claims(cluster)} - claims_before:
            first_claim = now
        for node in karpenter.nodes_of_pool(cluster, POOL):
            if node_ready(node) and node["metadata"]["name"] not in before:
                ready_seen.setdefault(node["metadata"]["name"], now)
        time.sleep(POLL_SECONDS)
    total = time.monotonic() - started
    wrong_when_ready = wrong_nodes(cluster)
    launched = len({n["metadata"]["name"] for n in karpenter.nodes_of_pool(cluster, POOL)} - before)
    cluster.kubectl("scale", "mg", NAME, "-n", NAMESPACE, f"--replicas={base}")
    scale_in_started = time.monotonic()
    # Settled: the drained groups' pods gone, and Karpenter has removed every node they left empty.
    wait_for(
        lambda: (
            ready_groups(cluster) == base
            and len(live_pods(cluster)) == 2 * base
            and not wrong_nodes(cluster)
            and not claims_being_deleted(cluster)
        ),
        timeout_seconds=300,
        interval_seconds=0.5,
        describe=lambda: f"scale-in settled; nodes left wrong: {wrong_nodes(cluster)}",
    )
    return RunFigures(
        total_seconds=total,
        first_claim_seconds=first_claim if first_claim is not None else total,
        last_node_ready_seconds=max(ready_seen.values(), default=total),
        nodes_launched=launched,
        wrong_when_ready=wrong_when_ready,
        wrong_after_scale_in=wrong_nodes(cluster),
        scale_in_seconds=time.monotonic() - scale_in_started,
    )


def claims_being_deleted(cluster: LocalCluster) -> bool:
    return any(claim["metadata"].get("deletionTimestamp") for claim in claims(cluster))


def report(runs: list[RunFigures], groups: int) -> None:
    for i, run in enumerate(runs):
        if run.nodes_launched == 0:
            print(f"run {i + 1}: no node launched (the groups fitted nodes left from before); not counted")
            continue
        print(
            f"run {i + 1}: {groups} new group(s) on {run.nodes_launched} new node(s): "
            f"total {run.total_seconds:.1f} s "
            f"= node provisioning {run.provisioning_seconds:.1f} s (first NodeClaim at "
            f"{run.first_claim_seconds:.1f} s, last node Ready at {run.last_node_ready_seconds:.1f} s) "
            f"+ goodput {run.goodput_seconds:.1f} s; scale-in settled in {run.scale_in_seconds:.1f} s; "
            f"nodes with a partial group or none: {run.wrong_when_ready or 'none'} when ready, "
            f"{run.wrong_after_scale_in or 'none'} after scale-in"
        )
    rest = [run.goodput_seconds for run in runs if run.nodes_launched] or [float("nan")]
    left = sum(len(r.wrong_when_ready) + len(r.wrong_after_scale_in) for r in runs)
    verdict = "met" if max(rest) <= GOAL_SECONDS else "NOT met"
    print(
        f"goodput's part beyond node provisioning: median {statistics.median(rest):.1f} s, "
        f"max {max(rest):.1f} s (goal <= {GOAL_SECONDS:g} s: {verdict}); "
        f"nodes left with a partial group or none: {left}"
    )


def main() -> None:
    args = parse_args()
    runs: list[RunFigures] = []
    topology = Topology(zones=1, domains_per_zone=1, nodes_per_domain=1)
    with local_cluster(args.cluster, topology) as cluster, tempfile.TemporaryDirectory() as scratch:
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/modelgroups.goodput.dev")
        cluster.kubectl("create", "namespace", NAMESPACE)
        existing = [
            cluster.add_gpu_node(
                f"bench-n{i}", zone="zone-a", clique="bench-c0", labels={POOL_LABEL: NAMESPACE}
            ).name
            for i in range(2)
        ]
        karpenter.start(cluster)
        pool = karpenter.node_pool(POOL, labels={POOL_LABEL: NAMESPACE}, clique="bench-karpenter")
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(pool))
        operator = OperatorProcess(cluster, NAMESPACE, Path(scratch) / "operator.log")
        try:
            with operator, fake_leaders(cluster, Path(scratch) / "completions.jsonl"):
                cluster.kubectl("apply", "-f", "-", input=model_group(1))
                wait_for(
                    lambda: ready_groups(cluster) == 1, timeout_seconds=120, describe="the first group Ready"
                )
                for _ in range(args.runs):
                    runs.append(one_run(cluster, 1, args.groups))
        finally:
            cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
            karpenter.delete_pool(cluster, POOL)
            karpenter.stop(cluster)
            for name in existing:
                cluster.remove_node(name)
    report(runs, args.groups)


if __name__ == "__main__":
    main()
