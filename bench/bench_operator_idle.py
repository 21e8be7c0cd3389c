"""CPU, memory, API requests and Prometheus queries of the operator with many ModelGroups at rest.

    python bench/bench_operator_idle.py [--model-groups 100] [--namespaces N] [--interval 15]
        [--batch-seconds 0.5] [--settle 30] [--window 60] [--cluster STATE_DIR]

Starts a cluster with enough fake 8-GPU nodes for one single-GPU group per ModelGroup (unless given
one), the operator over every namespace with its production reconcile interval (3 s), a health
agent and fake leaders reporting idle engines; creates `--model-groups` ModelGroups round-robin over
`--namespaces` namespaces (default: one per ten ModelGroups), each bound to its namespace's
SLOPolicy (autoscaling every `--interval` seconds), and waits until every group is Ready. After
`--settle` seconds it measures over `--window` seconds: the operator's CPU and resident memory
(/proc), the Kubernetes requests it made and the Prometheus queries it sent (its own metrics), and
per interval the time from its start to its last decision (its log). `--batch-seconds 0` is the
operator before batching: one Prometheus query per ModelGroup per interval. Prints figures;
asserts nothing.

With `--cluster` the fleet is deleted at the end as a platform team would (`fleet.delete_fleet`);
a throwaway cluster is simply stopped.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

from goodput.testbed.cluster.controlplane import LocalCluster
from goodput.testbed.cluster.testing import wait_for
from goodput.testbed.cluster.topology import Topology
from goodput.testbed.fleet_bench import (
    API,
    Sample,
    apply_documents,
    delete_fleet,
    fleet_agent,
    fleet_documents,
    fleet_leaders,
    fleet_operator,
    interval_decisions,
    namespace_names,
    report_decisions,
    report_window,
    rss_mib,
)
from goodput.testbed.operator_process import local_cluster

ROOT = Path(__file__).resolve().parent.parent


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model-groups", type=int, default=100)
    parser.add_argument(
        "--namespaces", type=int, help="namespaces the ModelGroups spread over (default: one per 10)"
    )
    parser.add_argument(
        "--interval", type=int, default=15, help="the SLOPolicies' autoscaling interval, seconds"
    )
    parser.add_argument(
        "--batch-seconds", type=float, default=0.5, help="GOODPUT_PROMETHEUS_BATCH_SECONDS (0: none)"
    )
    parser.add_argument("--settle", type=float, default=30.0, help="seconds at rest before measuring")
    parser.add_argument("--window", type=float, default=60.0, help="seconds measured")
    parser.add_argument(
        "--cluster", type=Path, help="state dir of a running `goodput cluster up` (else a new one)"
    )
    return parser.parse_args()


def topology_for(groups: int) -> Topology:
    """Two zones of two NVLink domains, with 8-GPU nodes for `groups` single-GPU groups and a quarter
    more: a group the controller replaces (its warm-up timed out on a busy machine) needs a GPU for
    the new group before the old one is gone, and with none spare the ModelGroup never gets ready."""
    return Topology(zones=2, domains_per_zone=2, nodes_per_domain=max(4, math.ceil(groups * 1.25 / 8 / 4)))


def ready_model_groups(cluster: LocalCluster) -> int:
    listing = cluster.api.get(f"{API}/modelgroups")
    return sum(
        1 for item in (listing or {}).get("items", []) if (item.get("status") or {}).get("readyGroups") == 1
    )


def main() -> None:
    args = parse_args()
    count = args.model_groups
    namespaces = namespace_names("bench-idle", args.namespaces or max(1, math.ceil(count / 10)))
    with (
        local_cluster(args.cluster, topology_for(count)) as cluster,
        tempfile.TemporaryDirectory() as scratch,
    ):
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/modelgroups.goodput.dev")
        log_path = Path(scratch) / "operator.log"
        with (
            fleet_leaders(cluster, Path(scratch) / "load.json"),
            fleet_agent(cluster),
            fleet_operator(cluster, log_path, batch_seconds=args.batch_seconds) as operator,
        ):
            time.sleep(5)
            print(f"operator with no ModelGroup: RSS {rss_mib(operator.process.pid):.0f} MiB")
            started = time.monotonic()
            documents = fleet_documents(namespaces, count, interval_seconds=args.interval, max_replicas=2)
            apply_documents(cluster, documents)
            wait_for(
                lambda: ready_model_groups(cluster) == count,
                timeout_seconds=max(600.0, 1.5 * count),
                interval_seconds=5.0,
                describe=lambda: f"{count} ready ModelGroups, {ready_model_groups(cluster)} so far",
            )
            waited = time.monotonic() - started
            print(f"{count} ModelGroups in {len(namespaces)} namespaces ready {waited:.0f} s after apply")
            time.sleep(args.settle)
            since, before = time.time(), Sample.take(operator)
            time.sleep(args.window)
            after = Sample.take(operator)
            report_window(before, after, operator, args.interval)
            report_decisions(interval_decisions(log_path, args.interval, since), count)
            if args.cluster is not None:
                delete_fleet(cluster, namespaces, seconds_per_model_group=1.0, model_groups=count)
    print(
        "(this machine: 2 cores shared with the control plane, Prometheus, the fake leaders and other work)"
    )


if __name__ == "__main__":
    main()
