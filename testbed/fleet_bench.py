"""A fleet of ModelGroups across namespaces on the local cluster, for the operator's scale benchmarks.

Shared by `bench_operator_idle.py` (many ModelGroups at rest) and `bench_operator_fleet.py` (many
autoscaling under load):
- `fleet_documents`: namespaces, one SLOPolicy per namespace, ModelGroups spread over them;
- `fleet_leaders`: one HTTP server in the pod network answering, on every pod IP, the warm-up
  completion and a vLLM /metrics page whose waiting/running/KV gauges come from a JSON file the
  benchmark rewrites (the load the engines report; no requests are served);
- `FleetAgent`: the health agent's reports (NCCL healthy, revision loaded) for every namespace;
- `fleet_operator`: `goodput run` watching every namespace, reading the cluster's Prometheus;
- `Sample`: the operator's CPU time, RSS, Kubernetes requests and Prometheus queries at a moment;
- `interval_decisions`: per interval, the time from its start to its last decision and the
  ModelGroups decided in it, from the operator's log;
- `delete_fleet`: what a platform team does: delete the namespaces while the operator still runs
  (it removes its finalizers), wait as long as that takes, then strip what is left.
Every loop is bounded; every process is stopped on exit.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from goodput.api.reasons import Reason
from goodput.controllers import naming
from goodput.testbed.cluster.controlplane import LocalCluster, free_ports
from goodput.testbed.cluster.processes import stop_child
from goodput.testbed.cluster.testing import serving_in_netns, wait_for
from goodput.testbed.operator_process import FAKE_LEADER, LEADER_PORT

API = "/apis/goodput.dev/v1alpha1"


def namespace_names(prefix: str, count: int) -> list[str]:
    return [f"{prefix}-{index:03d}" for index in range(count)]


def fleet_documents(
    namespaces: list[str], model_groups: int, *, interval_seconds: int, max_replicas: int
) -> list[dict[str, Any]]:
    """Namespaces, an SLOPolicy named `chat` in each, and `model_groups` ModelGroups of one
    single-GPU group each, round-robin over the namespaces, bound to it."""
    documents: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}} for name in namespaces
    ]
    documents += [
        {
            "apiVersion": "goodput.dev/v1alpha1",
            "kind": "SLOPolicy",
            "metadata": {"name": "chat", "namespace": name},
            "spec": {
                "revision": "r1",
                "classes": [{"name": "chat", "ttftSeconds": 1.0, "itlSeconds": 0.05}],
                "goodput": {"windowSeconds": 30},
                "autoscaling": {
                    "intervalSeconds": interval_seconds,
                    "signals": {"queueWork": {"drainTargetSeconds": 10.0}, "goodput": {"enabled": False}},
                    "scaleDown": {"stabilizationWindowSeconds": 30},
                    "metrics": {"maxAgeSeconds": 20},
                },
            },
        }
        for name in namespaces
    ]
    documents += [
        {
            "apiVersion": "goodput.dev/v1alpha1",
            "kind": "ModelGroup",
            "metadata": {"name": f"llama-8b-{index:04d}", "namespace": namespaces[index % len(namespaces)]},
            "spec": {
                "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
                "engine": {"image": "vllm/vllm-openai:v0.33.0"},
                "parallelism": {"gpusPerPod": 1},
                "replicas": 1,
                "minReplicas": 1,
                "maxReplicas": max_replicas,
                "policyRef": {"name": "chat"},
                "profile": {"gpu": "h100-80g", "maxNumSeqs": 8, "maxNumBatchedTokens": 2048},
                "drain": {"minLifetimeSeconds": 0, "maxSeconds": 10},
            },
        }
        for index in range(model_groups)
    ]
    return documents


def apply_documents(cluster: LocalCluster, documents: list[dict[str, Any]], chunk: int = 200) -> None:
    for start in range(0, len(documents), chunk):
        part = yaml.safe_dump_all(documents[start : start + chunk])
        cluster.kubectl("apply", "-f", "-", input=part, timeout_seconds=300)


def set_load(path: Path, *, waiting: float, running: float, kv_usage: float) -> None:
    """The gauges every fake leader reports from now on (written whole, then renamed)."""
    scratch = path.with_suffix(".tmp")
    scratch.write_text(
        json.dumps(
            {
                "num_requests_waiting": waiting,
                "num_requests_running": running,
                "kv_cache_usage_perc": kv_usage,
            }
        )
    )
    scratch.replace(path)


@contextlib.contextmanager
def fleet_leaders(cluster: LocalCluster, load_path: Path) -> Iterator[None]:
    """Serve as every group leader for the duration of the block."""
    if not load_path.exists():
        set_load(load_path, waiting=0, running=0, kv_usage=0.0)
    probe_ip = cluster.network.node_pod_cidr(0).replace(".0/24", ".250")
    argv = [sys.executable, "-c", FAKE_LEADER, str(LEADER_PORT), "", str(load_path)]
    with serving_in_netns(cluster.netns, argv, address=(probe_ip, LEADER_PORT)):
        yield


@dataclass
class FleetAgent:
    """Reports every running rank of every namespace NCCL-healthy with revision `main` loaded."""

    cluster: LocalCluster
    poll_seconds: float = 3.0
    max_seconds: float = 3600.0
    stopped: threading.Event = field(default_factory=threading.Event)
    done: set[str] = field(default_factory=set)

    def run(self) -> None:
        deadline = time.monotonic() + self.max_seconds
        while not self.stopped.wait(self.poll_seconds) and time.monotonic() < deadline:
            with contextlib.suppress(Exception):  # the API server may be busy; next poll
                listing = self.cluster.api.get(f"/api/v1/pods?labelSelector={naming.LABEL_MODEL_GROUP}")
                for pod in (listing or {}).get("items", []):
                    if pod["metadata"]["uid"] not in self.done:
                        with contextlib.suppress(Exception):  # a pod may be deleted under us
                            self._report(pod)

    def _report(self, pod: dict[str, Any]) -> None:
        conditions = {c["type"]: c["status"] for c in pod.get("status", {}).get("conditions", [])}
        if pod["metadata"].get("deletionTimestamp") or conditions.get("ContainersReady") != "True":
            return
        metadata = pod["metadata"]
        path = f"/api/v1/namespaces/{metadata['namespace']}/pods/{metadata['name']}"
        if metadata.get("annotations", {}).get(naming.ANNOTATION_MODEL_REVISION) != "main":
            self.cluster.api.patch(
                path, {"metadata": {"annotations": {naming.ANNOTATION_MODEL_REVISION: "main"}}}
            )
        if conditions.get(naming.CONDITION_NCCL_HEALTHY) != "True":
            healthy = {
                "type": naming.CONDITION_NCCL_HEALTHY,
                "status": "True",
                "reason": Reason.ALL_REDUCE_PASSED,
                "message": "all-reduce across the group's ranks passed",
                "lastTransitionTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
            self.cluster.api.patch(
                f"{path}/status", {"status": {"conditions": [healthy]}}, patch_type="strategic"
            )
        self.done.add(metadata["uid"])


@contextlib.contextmanager
def fleet_agent(cluster: LocalCluster) -> Iterator[FleetAgent]:
    agent = FleetAgent(cluster)
    thread = threading.Thread(target=agent.run, daemon=True, name="fleet-health-agent")
    thread.start()
    try:
        yield agent
    finally:
        agent.stopped.set()
        thread.join(timeout=30)


@dataclass
class FleetOperator:
    process: subprocess.Popen[bytes]
    metrics_port: int
    log_path: Path


@contextlib.contextmanager
def fleet_operator(cluster: LocalCluster, log_path: Path, *, batch_seconds: float) -> Iterator[FleetOperator]:
    """`goodput run --standalone` over every namespace, with its production reconcile interval."""
    port = free_ports(1)[0]
    argv = [sys.executable, "-m", "goodput.operator.cli", "run", "--standalone", "--metrics-port", str(port)]
    argv += ["--liveness", "", "--log-format", "json", "--reconcile-interval", "3"]
    environment = {
        "KUBECONFIG": cluster.kubeconfig,
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "GOODPUT_PROMETHEUS_URL": cluster.prometheus_url,
        "GOODPUT_PROMETHEUS_RATE_WINDOW_SECONDS": "20",
        "GOODPUT_PROMETHEUS_BATCH_SECONDS": str(batch_seconds),
    }
    with log_path.open("ab") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=environment)
    try:
        yield FleetOperator(process, port, log_path)
    finally:
        stop_child(process, grace_seconds=30)


@contextlib.contextmanager
def profiled(operator: FleetOperator, output: Path | None, seconds: float) -> Iterator[None]:
    """With `output`, py-spy samples every thread of the operator for `seconds` (idle ones too, so a
    wait shows where it waits) into `output`, as collapsed stacks; without, nothing. py-spy is a
    measurement tool, installed by hand (`pip install py-spy`), never a dependency."""
    if output is None:
        yield
        return
    argv = ["py-spy", "record", "--pid", str(operator.process.pid), "--duration", str(max(1, int(seconds)))]
    argv += [
        "--rate",
        "20",
        "--idle",
        "--threads",
        "--nonblocking",
        "--format",
        "raw",
        "--output",
        str(output),
    ]
    with subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as spy:
        try:
            yield
        finally:
            with contextlib.suppress(subprocess.TimeoutExpired):
                spy.wait(timeout=30)
            if spy.poll() is None:
                spy.kill()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _metric_sum(page: str, name: str, match: str = "") -> float:
    pattern = rf"^{re.escape(name)}\{{([^}}]*)\}} (\S+)$"
    return sum(float(value) for labels, value in re.findall(pattern, page, re.M) if match in labels)


@dataclass(frozen=True)
class Sample:
    """The operator's counters at one moment."""

    at: float
    cpu_seconds: float
    kube_requests: float
    kube_conflicts: float
    """Of which answered 409 Conflict (a write on an out-of-date resourceVersion)."""
    fleet_queries: float
    model_group_queries: float
    tick_seconds: float
    """Seconds the autoscaler's ticks took, summed (`goodput_autoscaler_decision_duration_seconds`)."""
    ticks: float
    metrics_wait_seconds: float
    """Of which waiting for the metrics (the batched query and the wait for it)."""

    @classmethod
    def take(cls, operator: FleetOperator) -> Sample:
        with urllib.request.urlopen(f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=10) as reply:
            page = reply.read().decode()
        queries = "goodput_autoscaler_prometheus_queries_total"
        duration = "goodput_autoscaler_decision_duration_seconds"
        return cls(
            at=time.monotonic(),
            cpu_seconds=cpu_seconds(operator.process.pid),
            kube_requests=_metric_sum(page, "goodput_kube_requests_total"),
            kube_conflicts=_metric_sum(page, "goodput_kube_requests_total", 'code="409"'),
            fleet_queries=_metric_sum(page, queries, 'scope="fleet"'),
            model_group_queries=_metric_sum(page, queries, 'scope="model_group"'),
            tick_seconds=_metric_sum(page, f"{duration}_sum", 'stage="total"'),
            ticks=_metric_sum(page, f"{duration}_count", 'stage="total"'),
            metrics_wait_seconds=_metric_sum(page, f"{duration}_sum", 'stage="metrics"'),
        )


def report_window(before: Sample, after: Sample, operator: FleetOperator, interval_seconds: float) -> None:
    """Print the operator's figures between two samples."""
    elapsed = after.at - before.at
    cpu = after.cpu_seconds - before.cpu_seconds
    intervals = elapsed / interval_seconds
    fleet = after.fleet_queries - before.fleet_queries
    alone = after.model_group_queries - before.model_group_queries
    print(f"over {elapsed:.0f} s ({intervals:.1f} intervals of {interval_seconds:g} s):")
    rss = rss_mib(operator.process.pid)
    print(f"  operator CPU {cpu / elapsed:.3f} cores ({cpu:.1f} CPU-s), RSS {rss:.0f} MiB")
    requests = (after.kube_requests - before.kube_requests) / elapsed
    conflicts = (after.kube_conflicts - before.kube_conflicts) / elapsed
    print(
        f"  Kubernetes API requests through the operator's client: {requests:.1f}/s ({conflicts:.1f}/s"
        " answered 409 Conflict; kopf's own watches and finalizer patches not counted)"
    )
    print(
        f"  Prometheus queries per interval: {(fleet + alone) / intervals:.1f} "
        f"({fleet / intervals:.1f} fleet, {alone / intervals:.1f} single-ModelGroup)"
    )
    ticks = after.ticks - before.ticks
    if ticks > 0:
        tick = (after.tick_seconds - before.tick_seconds) / ticks
        wait = (after.metrics_wait_seconds - before.metrics_wait_seconds) / ticks
        print(f"  autoscaler ticks: {ticks:.0f}, mean {tick:.2f} s each, {wait:.2f} s of it reading metrics")


@dataclass(frozen=True)
class IntervalDecisions:
    """One interval (wall clock) of the operator's log: when its last decision came, and how many
    ModelGroups were decided in it."""

    start: float
    last_decision_seconds: float
    model_groups: int


def interval_decisions(log_path: Path, interval_seconds: float, since: float) -> list[IntervalDecisions]:
    """Per interval boundary after `since`, from the operator's JSON decision lines (each line's own
    timestamp): seconds from the boundary to the last decision before the next one, and the distinct
    ModelGroups decided. The first and last interval are partial and left out."""
    last: dict[int, float] = {}
    decided: dict[int, set[tuple[str, str]]] = {}
    for line in log_path.read_text(errors="replace").splitlines():
        if '"policy_revision"' not in line or '"shadow": true' in line:
            continue
        with contextlib.suppress(ValueError, KeyError, TypeError):
            record = json.loads(line)
            logged = datetime.fromisoformat(str(record["timestamp"])).timestamp()
            if logged < since:
                continue
            boundary = math.floor(logged / interval_seconds)
            last[boundary] = max(last.get(boundary, 0.0), logged - boundary * interval_seconds)
            decided.setdefault(boundary, set()).add((str(record["namespace"]), str(record["model_group"])))
    boundaries = sorted(last)[1:-1]
    return [IntervalDecisions(b * interval_seconds, last[b], len(decided[b])) for b in boundaries]


def report_decisions(intervals: list[IntervalDecisions], model_groups: int) -> None:
    if not intervals:
        print("  no whole interval with decisions in the window")
        return
    lags = [entry.last_decision_seconds for entry in intervals]
    counts = [entry.model_groups for entry in intervals]
    print(
        f"  interval start -> its last decision: median {statistics.median(lags):.2f} s, "
        f"max {max(lags):.2f} s; "
        f"ModelGroups decided per interval: min {min(counts)}, median {statistics.median(counts):.0f} "
        f"of {model_groups} ({len(intervals)} whole intervals)"
    )


def delete_fleet(
    cluster: LocalCluster, namespaces: list[str], *, seconds_per_model_group: float, model_groups: int
) -> None:
    """Delete the namespaces while the operator runs (it removes its finalizers as the ModelGroups
    go), waiting as long as that takes at fleet size; whatever is left after that has its
    finalizers stripped, so the namespaces go even if the operator could not finish."""
    cluster.kubectl("delete", "namespace", *namespaces, "--wait=false", check=False, timeout_seconds=300)
    bound = max(120.0, seconds_per_model_group * model_groups)

    def remaining() -> int:
        listing = cluster.api.get(f"{API}/modelgroups")
        return len((listing or {}).get("items", []))

    started = time.monotonic()
    with contextlib.suppress(AssertionError, TimeoutError):
        wait_for(lambda: remaining() == 0, timeout_seconds=bound, interval_seconds=5.0)
    left = remaining()
    took = time.monotonic() - started
    print(
        f"clean-up: {model_groups - left} of {model_groups} ModelGroups deleted by the operator, {took:.0f} s"
    )
    if left:
        listing = cluster.api.get(f"{API}/modelgroups") or {}
        for item in listing.get("items", []):
            metadata = item["metadata"]
            with contextlib.suppress(Exception):
                cluster.api.patch(
                    f"{API}/namespaces/{metadata['namespace']}/modelgroups/{metadata['name']}",
                    {"metadata": {"finalizers": None}},
                    patch_type="merge",
                )
        print(f"clean-up: finalizers stripped from the {left} left")
