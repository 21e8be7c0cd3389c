"""The operator with many ModelGroups autoscaling at once: CPU, memory, API requests, Prometheus
queries, and whether every ModelGroup is decided within its interval.

    python bench/bench_operator_fleet.py [--model-groups 200] [--namespaces N] [--interval 15]
        [--batch-seconds 0.5] [--load-seconds 90] [--calm-seconds 90] [--cluster STATE_DIR]

Starts a cluster with enough fake 8-GPU nodes for every ModelGroup at `--max-replicas` single-GPU
groups, the operator over every namespace (reconcile interval 3 s), a health agent, and fake leaders
whose /metrics report the load the benchmark sets; creates `--model-groups` ModelGroups round-robin
over `--namespaces` namespaces (default: one per ten), each bound to its namespace's SLOPolicy, at
one group each, and waits until all are Ready. Then every engine reports a backlog (40 waiting, 2
running, KV 30 % used) for `--load-seconds`: every ModelGroup scales out at once; then an idle
engine for `--calm-seconds`: they scale back in through drains. For each phase it prints the
operator's CPU and RSS, its Kubernetes requests per second, its Prometheus queries per interval,
and per interval the time from its start to its last decision and how many ModelGroups were
decided in it. The load is what the engines report, not requests served: this measures the
operator, not the engines. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import math
import shutil
import tempfile
import time
from pathlib import Path

from goodput.testbed.cluster.controlplane import LocalCluster
from goodput.testbed.cluster.testing import wait_for
from goodput.testbed.cluster.topology import Topology
from goodput.testbed.fleet_bench import (
    API,
    FleetOperator,
    Sample,
    apply_documents,
    delete_fleet,
    fleet_agent,
    fleet_documents,
    fleet_leaders,
    fleet_operator,
    interval_decisions,
    namespace_names,
    profiled,
    report_decisions,
    report_window,
    set_load,
)
from goodput.testbed.operator_process import local_cluster

ROOT = Path(__file__).resolve().parent.parent


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model-groups", type=int, default=200)
    parser.add_argument(
        "--namespaces", type=int, help="namespaces the ModelGroups spread over (default: one per 10)"
    )
    parser.add_argument("--max-replicas", type=int, default=3)
    parser.add_argument(
        "--interval", type=int, default=15, help="the SLOPolicies' autoscaling interval, seconds"
    )
    parser.add_argument(
        "--batch-seconds", type=float, default=0.5, help="GOODPUT_PROMETHEUS_BATCH_SECONDS (0: none)"
    )
    parser.add_argument("--load-seconds", type=float, default=90.0)
    parser.add_argument("--calm-seconds", type=float, default=90.0)
    parser.add_argument(
        "--profile",
        type=Path,
        help="folder for py-spy's samples of the operator in each phase (py-spy on PATH)",
    )
    parser.add_argument(
        "--cluster", type=Path, help="state dir of a running `goodput cluster up` (else a new one)"
    )
    return parser.parse_args()


def model_group_counts(cluster: LocalCluster) -> tuple[int, int, int]:
    """Ready ModelGroups at one group, groups wanted, groups ready (over the whole fleet)."""
    items = (cluster.api.get(f"{API}/modelgroups") or {}).get("items", [])
    ready = [int((item.get("status") or {}).get("readyGroups") or 0) for item in items]
    wanted = sum(int(item["spec"]["replicas"]) for item in items)
    return sum(1 for count in ready if count >= 1), wanted, sum(ready)


def phase(
    cluster: LocalCluster, operator: FleetOperator, args: argparse.Namespace, name: str, seconds: float
) -> None:
    """Measure one phase of `seconds` and print its figures."""
    output = args.profile / f"{name.split(maxsplit=1)[0]}.txt" if args.profile is not None else None
    since, before = time.time(), Sample.take(operator)
    with profiled(operator, output, seconds):
        time.sleep(seconds)
    after = Sample.take(operator)
    _, wanted, ready = model_group_counts(cluster)
    print(f"\n{name}: at its end {wanted} groups wanted, {ready} ready")
    report_window(before, after, operator, args.interval)
    report_decisions(interval_decisions(operator.log_path, args.interval, since), args.model_groups)


def main() -> None:
    args = parse_args()
    count = args.model_groups
    namespaces = namespace_names("bench-fleet", args.namespaces or max(1, math.ceil(count / 10)))
    gpus = count * args.max_replicas
    topology = Topology(zones=2, domains_per_zone=2, nodes_per_domain=max(4, math.ceil(gpus / 8 / 4)))
    with local_cluster(args.cluster, topology) as cluster, tempfile.TemporaryDirectory() as scratch:
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/modelgroups.goodput.dev")
        load = Path(scratch) / "load.json"
        with (
            fleet_leaders(cluster, load),
            fleet_agent(cluster),
            fleet_operator(
                cluster, Path(scratch) / "operator.log", batch_seconds=args.batch_seconds
            ) as operator,
        ):
            started = time.monotonic()
            documents = fleet_documents(
                namespaces, count, interval_seconds=args.interval, max_replicas=args.max_replicas
            )
            apply_documents(cluster, documents)
            wait_for(
                lambda: model_group_counts(cluster)[0] == count,
                timeout_seconds=max(600.0, 1.5 * count),
                interval_seconds=5.0,
                describe=lambda: f"{count} ready ModelGroups, {model_group_counts(cluster)[0]} so far",
            )
            waited = time.monotonic() - started
            print(f"{count} ModelGroups in {len(namespaces)} namespaces ready {waited:.0f} s after apply")
            set_load(load, waiting=40, running=2, kv_usage=0.3)
            phase(
                cluster, operator, args, "under load (every engine: 40 waiting, 2 running)", args.load_seconds
            )
            set_load(load, waiting=0, running=0, kv_usage=0.0)
            phase(cluster, operator, args, "load gone (every engine idle)", args.calm_seconds)
            if args.profile is not None:
                shutil.copy(operator.log_path, args.profile / "operator.log")
            if args.cluster is not None:
                delete_fleet(cluster, namespaces, seconds_per_model_group=1.0, model_groups=count)
    print(
        "(this machine: 2 cores shared with the control plane, Prometheus, the fake leaders and other work)"
    )


if __name__ == "__main__":
    main()
