"""CPU and memory of the operator with many ModelGroups at rest, and the API writes it makes then.

    python bench/bench_operator_idle.py [--model-groups 100] [--settle 20] [--window 60] [--cluster STATE_DIR]

Starts a cluster with 16 fake 8-GPU nodes (unless given one), the operator with its production
reconcile interval (3 s), a health agent and fake leaders; creates `--model-groups` ModelGroups of
one single-GPU group each and waits until every group is Ready. After `--settle` seconds it reads
the operator's CPU time and resident memory from /proc over `--window` seconds, and the Kubernetes
writes it made in that window from its own metrics. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

from goodput.testbed.cluster.controlplane import LocalCluster
from goodput.testbed.cluster.testing import wait_for
from goodput.testbed.cluster.topology import Topology
from goodput.testbed.operator_process import OperatorProcess, fake_leaders, health_agent, local_cluster

NAMESPACE = "bench-idle"
TOPOLOGY = Topology(zones=2, domains_per_zone=2, nodes_per_domain=4)


def model_groups(count: int) -> str:
    return yaml.safe_dump_all(
        {
            "apiVersion": "goodput.dev/v1alpha1",
            "kind": "ModelGroup",
            "metadata": {"name": f"llama-8b-{index:03d}", "namespace": NAMESPACE},
            "spec": {
                "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
                "engine": {"image": "vllm/vllm-openai:v0.33.0"},
                "parallelism": {"gpusPerPod": 1},
                "replicas": 1,
                "maxReplicas": 2,
            },
        }
        for index in range(count)
    )


def ready_model_groups(cluster: LocalCluster) -> int:
    listing = cluster.api.get(f"/apis/goodput.dev/v1alpha1/namespaces/{NAMESPACE}/modelgroups")
    return sum(
        1 for item in (listing or {}).get("items", []) if (item.get("status") or {}).get("readyGroups") == 1
    )


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def kube_writes(metrics_port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as reply:
        page = reply.read().decode()
    return sum(
        float(value) for value in re.findall(r"^goodput_kube_requests_total\{[^}]*\} (\S+)$", page, re.M)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-groups", type=int, default=100)
    parser.add_argument("--settle", type=float, default=20.0, help="seconds at rest before measuring")
    parser.add_argument("--window", type=float, default=60.0, help="seconds measured")
    parser.add_argument(
        "--cluster", type=Path, help="state dir of a running `goodput cluster up` (else a new one)"
    )
    args = parser.parse_args()

    with local_cluster(args.cluster, TOPOLOGY) as cluster, tempfile.TemporaryDirectory() as scratch:
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
                assert operator.process is not None
                pid = operator.process.pid
                time.sleep(5)
                print(f"operator with no ModelGroup: RSS {rss_mib(pid):.0f} MiB")
                started = time.monotonic()
                cluster.kubectl(
                    "apply", "-f", "-", input=model_groups(args.model_groups), timeout_seconds=120
                )
                wait_for(
                    lambda: ready_model_groups(cluster) == args.model_groups,
                    timeout_seconds=600,
                    interval_seconds=1.0,
                    describe=lambda: (
                        f"{args.model_groups} ready ModelGroups, {ready_model_groups(cluster)} so far"
                    ),
                )
                waited = time.monotonic() - started
                print(f"{args.model_groups} ModelGroups ready {waited:.1f} s after kubectl apply")
                time.sleep(args.settle)
                cpu_before, writes_before, clock_before = (
                    cpu_seconds(pid),
                    kube_writes(operator.metrics_port),
                    time.monotonic(),
                )
                time.sleep(args.window)
                cpu = cpu_seconds(pid) - cpu_before
                writes = kube_writes(operator.metrics_port) - writes_before
                elapsed = time.monotonic() - clock_before
                print(
                    f"at rest over {elapsed:.0f} s: CPU {100 * cpu / elapsed:.1f} % of one core "
                    f"({cpu:.2f} CPU-s), RSS {rss_mib(pid):.0f} MiB, Kubernetes writes {writes:.0f}"
                )
        finally:
            cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


if __name__ == "__main__":
    main()
