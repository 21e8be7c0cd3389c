"""Running the operator against a local cluster, with stand-ins for the peers it talks to.

For end-to-end tests and benchmarks (as `kopf.testing` is for kopf operators):
- `OperatorProcess`: `goodput run` as a child process watching one namespace, killable and
  restartable, its log kept in a file.
- `fake_leaders`: a small HTTP server in the cluster's pod network namespace that answers, on every
  pod IP, what the operator asks a vLLM leader: the warm-up completion and an idle /metrics page.
  It logs each completion with the pod IP it was sent to.
- `HealthAgent`: what the in-pod health agent does on each running rank: report NCCL health (the
  `goodput.dev/NCCLHealthy` pod condition) and the model revision it loaded.
- `GatewayProcess`: `goodput gateway` for one ModelGroup on the host, scraped by the cluster's
  Prometheus as a static target.
- `EmulatorProcess`: `goodput emulate` for one namespace: every leader a live emulated vLLM at its
  pod IP (timed like the model on its GPU, draining on SIGTERM for its --shutdown-timeout), and
  the health agent's reports on every rank.
- `LoadProcess`: `goodput load` replaying a trace against a Service's ready endpoints in the
  background; `operator_metric` reads one of the operator's own metrics.
- `local_cluster`: a running cluster for a benchmark: the one in a given state directory, or a
  throwaway one started for the block.
Every loop here is bounded in time, and every process started here is stopped on exit.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from goodput.api import vllm_names
from goodput.api.base import API_VERSION
from goodput.api.reasons import Reason
from goodput.controllers import naming
from goodput.testbed.cluster import controlplane
from goodput.testbed.cluster.binaries import ensure_binaries
from goodput.testbed.cluster.config import StatePaths, write_scrape_target
from goodput.testbed.cluster.controlplane import LocalCluster, free_ports
from goodput.testbed.cluster.kube import ApiError
from goodput.testbed.cluster.processes import log_tail, stop_child
from goodput.testbed.cluster.testing import serving_in_netns
from goodput.testbed.cluster.topology import Topology

LEADER_PORT = 8000
# What a story's operator leaves behind it, and how long it has to clear their finalizers.
GOODPUT_PLURALS = ("modelgroups", "slopolicies")
FINALIZE_SECONDS = 90.0
# A group leader as the operator sees it: vLLM's /metrics (idle, or what a load file says) and
# completions; argv: port, a file to log each completion request to ("" for none), a JSON file of the
# metrics to report ("" for idle).
_FAKE_LEADER_SOURCE = r"""
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

port, log_path, load_path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
log = open(log_path, "a", buffering=1) if log_path else None
METRICS = __METRICS__

class Leader(BaseHTTPRequestHandler):
    def reply(self, body, kind="application/json"):
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        load = {}
        if load_path:
            try:
                load = json.load(open(load_path))
            except (OSError, ValueError):
                load = {}
        page = "".join(f"{name} {load.get(key, 0)}\n" for key, name in METRICS)
        self.reply(page if self.path == "/metrics" else "", "text/plain")

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if log is not None:
            seen = {"ip": self.connection.getsockname()[0], "path": self.path, "request": request}
            log.write(json.dumps(seen) + "\n")
        tokens = int(request.get("max_tokens", 1))
        self.reply(json.dumps({"object": "text_completion",
                               "choices": [{"index": 0, "text": " ok" * tokens, "finish_reason": "length"}],
                               "usage": {"prompt_tokens": 4, "completion_tokens": tokens}}))

    def log_message(self, *args):
        pass

ThreadingHTTPServer(("0.0.0.0", port), Leader).serve_forever()
"""
# The load file's keys, and the series each sets (vLLM's names, spelled once in the product).
_FAKE_LEADER_METRICS = (
    ("num_requests_waiting", vllm_names.NUM_REQUESTS_WAITING),
    ("num_requests_running", vllm_names.NUM_REQUESTS_RUNNING),
    ("kv_cache_usage_perc", vllm_names.KV_CACHE_USAGE_PERC),
)
FAKE_LEADER = _FAKE_LEADER_SOURCE.replace("__METRICS__", repr(_FAKE_LEADER_METRICS))


@dataclass
class OperatorProcess:
    """`goodput run --standalone` watching one namespace, as a separate process.

    As a context manager it starts the operator and, on exit, deletes the namespace's ModelGroups and
    SLOPolicies while the operator still runs: kopf puts a finalizer on objects with daemons or
    timers and only a running operator removes it, so this lets the namespace be deleted afterwards.
    """

    cluster: LocalCluster
    namespace: str
    log_path: Path
    reconcile_interval_seconds: float = 1.0
    process: subprocess.Popen[bytes] | None = None
    metrics_port: int = 0
    environment: dict[str, str] = field(default_factory=dict)
    """Extra environment of the operator (`GOODPUT_<SETTING>` variables), over the defaults."""
    starts: int = 0
    kill_at: str | None = None
    """A crash point of `crash_points`: the next start's operator SIGKILLs itself right after it."""

    def start(self) -> None:
        self.metrics_port = free_ports(1)[0]
        self.starts += 1
        entry = (
            ["goodput.testbed.crash_points", "--kill-at", self.kill_at]
            if self.kill_at
            else ["goodput.operator.cli"]
        )
        argv = [
            sys.executable,
            "-m",
            *entry,
            "run",
            "--standalone",
            "--namespace",
            self.namespace,
            "--metrics-port",
            str(self.metrics_port),
            "--liveness",
            "",
            "--log-format",
            "json",
            "--reconcile-interval",
            str(self.reconcile_interval_seconds),
        ]
        environment = {
            "KUBECONFIG": self.cluster.kubeconfig,
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            **self.environment,
        }
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=environment)

    def stop(self, *, kill: bool = False) -> None:
        """SIGTERM (kopf shuts down cleanly), or SIGKILL to crash it mid-work."""
        stop_child(self.process, grace_seconds=20, kill=kill)

    def log_tail(self, lines: int = 15) -> str:
        return log_tail(self.log_path, lines)

    def __enter__(self) -> OperatorProcess:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        try:
            if self.process is not None and self.process.poll() is None:
                self._delete_goodput_objects()
        finally:
            self.stop()

    def _delete_goodput_objects(self) -> None:
        """The namespace's ModelGroups and SLOPolicies deleted while the operator still runs to clear
        their finalizers: one delete-collection request per kind (a story that made a thousand
        ModelGroups is not a thousand requests), then up to FINALIZE_SECONDS for them to go. Objects
        still there after that, or when the API server is too slow to answer, stay to the namespace's
        deletion: the story's verdict is already in, and a slow clean-up must not become its error."""
        base = f"/apis/{API_VERSION}/namespaces/{self.namespace}"
        # Deleting hundreds of objects in one request can outlast the client's usual 10 s.
        api = replace(self.cluster.api, timeout_seconds=FINALIZE_SECONDS)
        deadline = time.monotonic() + FINALIZE_SECONDS
        try:
            for plural in GOODPUT_PLURALS:
                api.delete(f"{base}/{plural}")
            while time.monotonic() < deadline and self.process is not None and self.process.poll() is None:
                left = [(api.get(f"{base}/{kind}") or {}).get("items") for kind in GOODPUT_PLURALS]
                if not any(left):
                    return
                time.sleep(0.5)
        except (OSError, ApiError) as error:  # a timeout is an OSError; a 504 an ApiError
            print(f"clean-up of {self.namespace} left to its namespace deletion: {error}", file=sys.stderr)


@dataclass
class GatewayProcess:
    """`goodput gateway` on the host, as a separate process, for one ModelGroup (`model_group`), the
    ModelGroups a label selector picks (`model_group` empty, `selector`), or every ModelGroup of the
    namespace (both empty): it watches them, their SLOPolicies and the leader pods through the API
    server and routes to the leaders' pod IPs (routed into the cluster's network namespace); the
    cluster's Prometheus scrapes its metrics as a static target labelled with the namespace, as a
    PodMonitor would label its pod."""

    cluster: LocalCluster
    namespace: str
    model_group: str
    log_path: Path
    selector: str = ""
    process: subprocess.Popen[bytes] | None = None
    port: int = 0
    metrics_port: int = 0
    target: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.port, self.metrics_port = free_ports(2)
        argv = [
            sys.executable,
            "-m",
            "goodput.operator.cli",
            "gateway",
            *(["--model-group", self.model_group] if self.model_group else []),
            *(["--selector", self.selector] if self.selector and not self.model_group else []),
            "--namespace",
            self.namespace,
            "--listen-host",
            "127.0.0.1",
            "--listen-port",
            str(self.port),
            "--metrics-port",
            str(self.metrics_port),
        ]
        environment = {"KUBECONFIG": self.cluster.kubeconfig, "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=environment)
        self.target = write_scrape_target(
            StatePaths(self.cluster.state_dir),
            f"gateway-{self.namespace}-{self.model_group or 'selected'}",
            f"127.0.0.1:{self.metrics_port}",
            {"namespace": self.namespace},
        )

    def wait_serving(self, timeout_seconds: float = 60.0) -> None:
        """Until /healthz answers (the API server's first answer about the ModelGroups was read)."""
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"the gateway exited:\n{self.log_tail()}")
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(self.url + "/healthz", timeout=2) as answer,
            ):
                if answer.status == 200:
                    return
            time.sleep(0.3)
        raise TimeoutError(f"the gateway did not serve within {timeout_seconds:g}s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.target is not None:
            self.target.unlink(missing_ok=True)
        stop_child(self.process, grace_seconds=20)

    def log_tail(self, lines: int = 20) -> str:
        return log_tail(self.log_path, lines)

    def __enter__(self) -> GatewayProcess:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


@dataclass(frozen=True)
class FakeLeaders:
    """The completions the fake leaders answered, in order."""

    log_path: Path

    def completions(self) -> list[dict[str, Any]]:
        if not self.log_path.exists():
            return []
        return [json.loads(line) for line in self.log_path.read_text().splitlines() if line]


@contextlib.contextmanager
def fake_leaders(cluster: LocalCluster, log_path: Path, port: int = LEADER_PORT) -> Iterator[FakeLeaders]:
    """Serve as every group leader on `port`, for the duration of the block."""
    probe_ip = cluster.network.node_pod_cidr(0).replace(".0/24", ".250")
    argv = [sys.executable, "-c", FAKE_LEADER, str(port), str(log_path), ""]
    with serving_in_netns(cluster.netns, argv, address=(probe_ip, port)):
        yield FakeLeaders(log_path)


@dataclass
class HealthAgent:
    """Reports every running rank of `namespace` NCCL-healthy with `revision` loaded, until stopped."""

    cluster: LocalCluster
    namespace: str
    revision: str = "main"
    max_seconds: float = 900.0
    stopped: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        deadline = time.monotonic() + self.max_seconds
        selector = naming.LABEL_MODEL_GROUP
        while not self.stopped.wait(0.3) and time.monotonic() < deadline:
            listing = self.cluster.api.get(
                f"/api/v1/namespaces/{self.namespace}/pods?labelSelector={selector}"
            )
            for pod in (listing or {}).get("items", []):
                with contextlib.suppress(Exception):  # a pod may be deleted under us
                    self._report(pod)

    def _report(self, pod: dict[str, Any]) -> None:
        conditions = {c["type"]: c["status"] for c in pod.get("status", {}).get("conditions", [])}
        if pod["metadata"].get("deletionTimestamp") or conditions.get("ContainersReady") != "True":
            return
        path = f"/api/v1/namespaces/{self.namespace}/pods/{pod['metadata']['name']}"
        if pod["metadata"].get("annotations", {}).get(naming.ANNOTATION_MODEL_REVISION) != self.revision:
            self.cluster.api.patch(
                path, {"metadata": {"annotations": {naming.ANNOTATION_MODEL_REVISION: self.revision}}}
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


@contextlib.contextmanager
def health_agent(cluster: LocalCluster, namespace: str, revision: str = "main") -> Iterator[HealthAgent]:
    agent = HealthAgent(cluster, namespace, revision)
    thread = threading.Thread(target=agent.run, daemon=True, name=f"health-agent-{namespace}")
    thread.start()
    try:
        yield agent
    finally:
        agent.stopped.set()
        thread.join(timeout=10)


@dataclass
class EmulatorProcess:
    """`goodput emulate` watching one namespace, as a separate process (stopped by SIGTERM on exit)."""

    cluster: LocalCluster
    namespace: str
    log_path: Path
    load_seconds: float = 1.0
    nccl_check_seconds: float = 0.5
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [
            sys.executable,
            "-m",
            "goodput.testbed.cli_emulate",
            "--kubeconfig",
            self.cluster.kubeconfig,
            "--netns",
            self.cluster.netns,
            "--namespace",
            self.namespace,
            "--load-seconds",
            str(self.load_seconds),
            "--nccl-check-seconds",
            str(self.nccl_check_seconds),
            "--log-level",
            "INFO",
        ]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)

    def stop(self) -> int | None:
        return stop_child(self.process, grace_seconds=45)

    def log_tail(self, lines: int = 15) -> str:
        return log_tail(self.log_path, lines)

    def __enter__(self) -> EmulatorProcess:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


@dataclass
class LoadProcess:
    """`goodput load` replaying `trace` against the ready endpoints of Service `service`, in the
    background; `report()` waits for it (bounded) and returns its JSON report."""

    cluster: LocalCluster
    service: str
    trace: str
    out_path: Path
    duration_seconds: float
    request_timeout_seconds: float = 120.0
    process: subprocess.Popen[str] | None = None

    def start(self) -> LoadProcess:
        argv = [
            sys.executable,
            "-m",
            "goodput.testbed.cli_load",
            "--trace",
            self.trace,
            "--service",
            self.service,
            "--kubeconfig",
            self.cluster.kubeconfig,
            "--duration-seconds",
            str(self.duration_seconds),
            "--request-timeout-seconds",
            str(self.request_timeout_seconds),
            "--out",
            str(self.out_path),
        ]
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        return self

    def report(self) -> dict[str, Any]:
        if self.process is None:
            raise RuntimeError("the load was not started")
        budget = self.duration_seconds + self.request_timeout_seconds + 30
        try:
            output, _ = self.process.communicate(timeout=budget)
        except subprocess.TimeoutExpired:
            self.process.kill()
            output, _ = self.process.communicate(timeout=10)
        if self.process.returncode != 0 or not self.out_path.exists():
            raise RuntimeError(f"goodput load failed ({self.process.returncode}):\n{output}")
        report: dict[str, Any] = json.loads(self.out_path.read_text())
        return report

    def stop(self) -> None:
        stop_child(self.process, grace_seconds=10, kill=True)


def operator_metric(port: int, name: str, labels: dict[str, str]) -> float | None:
    """One sample of the operator's own metrics (`name` with at least `labels`), or None."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                return float(sample.value)
    return None


@contextlib.contextmanager
def local_cluster(state_dir: Path | None = None, topology: Topology | None = None) -> Iterator[LocalCluster]:
    """The cluster running in `state_dir` (left running), or a throwaway one (stopped at the end)."""
    if state_dir is not None:
        yield controlplane.load(state_dir)
        return
    with tempfile.TemporaryDirectory(prefix="goodput-bench-") as scratch:
        spec = controlplane.ClusterSpec(
            name=f"bench{os.getpid() % 100_000}",
            state_dir=Path(scratch) / "cluster",
            topology=topology or Topology(),
        )
        cluster = controlplane.up(spec, bin_dir=ensure_binaries())
        try:
            yield cluster
        finally:
            controlplane.down(spec.state_dir)
