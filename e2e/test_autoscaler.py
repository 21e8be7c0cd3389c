"""A platform team lets goodput's autoscaler size a ModelGroup against an SLOPolicy.

Everything on the production path is real: the API server (CRDs, scale subresource, EndpointSlices),
Prometheus scraping every leader pod at its pod IP, the operator (`goodput run`) reading Prometheus
and writing through the scale subresource, and the vLLM emulator (`goodput emulate`) serving each
leader's completions and `/metrics` at its pod IP. Load is real HTTP: an open-loop generator sends
streaming completions to the ready leaders of a Service, as users behind a gateway would.

The model: Llama 3.1 8B on one H100 per group, `maxNumSeqs: 2`, so one group serves about four
256-in/64-out requests a second; policies decide every 5 s on 8 s token rates.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from goodput.testbed.cluster import processes
from goodput.testbed.cluster.config import StatePaths, component_commands
from goodput.testbed.cluster.controlplane import LocalCluster, free_ports
from goodput.testbed.cluster.kube import probe
from goodput.testbed.cluster.testing import wait_for
from goodput.testbed.loadgen import (
    LoadGenerator,
    LoadSettings,
    PlannedRequest,
    TargetPolicy,
    TargetPool,
    ready_endpoints,
)

pytestmark = pytest.mark.e2e

API = "/apis/goodput.dev/v1alpha1"
POOL_LABEL = "e2e.goodput.dev/pool"
INTERVAL_SECONDS = 5
PROMPT_TOKENS, OUTPUT_TOKENS = 256, 64
BASE_RATE = 2.5  # requests per second: about 60 % of one group
BURST_RATE = 2 * BASE_RATE  # double the offered work: more than one group serves
# An idle group prefills about 25k tokens within the 1 s TTFT target (2,048-token chunks): these
# prompts cannot meet it on any number of groups, and each keeps a group busy for about 2 s.
LONG_PROMPT_TOKENS = 40_000


# --- manifests ---------------------------------------------------------------------------------------


def slo_policy(
    name: str,
    namespace: str,
    *,
    revision: str = "r1",
    mode: str = "Active",
    scale_down_window_seconds: int = 30,
    drain_target_seconds: float = 10.0,
) -> dict[str, Any]:
    return {
        "apiVersion": "goodput.dev/v1alpha1",
        "kind": "SLOPolicy",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "revision": revision,
            "classes": [{"name": "chat", "ttftSeconds": 1.0, "itlSeconds": 0.05}],
            "goodput": {"windowSeconds": 30},
            "autoscaling": {
                "mode": mode,
                "intervalSeconds": INTERVAL_SECONDS,
                "signals": {
                    "queueWork": {"drainTargetSeconds": drain_target_seconds},
                    "goodput": {"enabled": False},
                },
                "scaleUp": {"policies": [{"type": "Groups", "value": 2, "periodSeconds": 10}]},
                "scaleDown": {
                    "stabilizationWindowSeconds": scale_down_window_seconds,
                    "policies": [{"type": "Groups", "value": 1, "periodSeconds": 10}],
                },
                "metrics": {"maxAgeSeconds": 15},
            },
        },
    }


def model_group(
    name: str, namespace: str, *, replicas: int, policy: str, shadow: str | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "servedName": "llama"},
        "engine": {"image": "vllm/vllm-openai:v0.33.0", "shutdownTimeoutSeconds": 5},
        "parallelism": {"tensor": 1, "pipeline": 1, "gpusPerPod": 1},
        "placement": {
            "nodeSelector": [{"key": POOL_LABEL, "value": namespace}],
            "scheduleTimeoutSeconds": 60,
        },
        "replicas": replicas,
        "minReplicas": 1,
        "maxReplicas": 4,
        "policyRef": {"name": policy},
        "profile": {"gpu": "h100-80g", "maxNumSeqs": 2, "maxNumBatchedTokens": 2048},
        "readiness": {"warmup": {"maxTokens": 4, "timeoutSeconds": 10}},
        "drain": {"minLifetimeSeconds": 0, "maxSeconds": 20},
    }
    if shadow is not None:
        spec["shadowPolicyRef"] = {"name": shadow}
    return {
        "apiVersion": "goodput.dev/v1alpha1",
        "kind": "ModelGroup",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def leaders_service(name: str, namespace: str) -> dict[str, Any]:
    """What a gateway would route to: the leaders of the ready groups (the readiness gate keeps the
    others out of the EndpointSlices)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": f"{name}-leaders", "namespace": namespace},
        "spec": {
            "selector": {"goodput.dev/model-group": name, "goodput.dev/rank": "0"},
            "ports": [{"name": "http", "port": 8000, "targetPort": 8000}],
        },
    }


# --- the stage: emulator, operator, GPU pool, load -----------------------------------------------


@dataclass
class Process:
    """A child process with its log in a file, stopped with SIGTERM (then SIGKILL)."""

    argv: list[str]
    log_path: Path
    environment: dict[str, str]
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, env=self.environment
            )

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)

    def log_tail(self, lines: int = 20) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def operator_process(cluster: LocalCluster, namespace: str, log_path: Path) -> Process:
    """`goodput run` for one namespace, reading the cluster's Prometheus."""
    environment = {
        **os.environ,
        "KUBECONFIG": cluster.kubeconfig,
        "GOODPUT_PROMETHEUS_URL": cluster.prometheus_url,
        "GOODPUT_PROMETHEUS_TIMEOUT_SECONDS": "2",
        "GOODPUT_PROMETHEUS_RATE_WINDOW_SECONDS": "8",
        "GOODPUT_AUTOSCALER_STATE_REFRESH_SECONDS": "10",
    }
    argv = [
        sys.executable,
        "-m",
        "goodput.operator.cli",
        "run",
        "--standalone",
        "--namespace",
        namespace,
        "--metrics-port",
        str(free_ports(1)[0]),
        "--liveness",
        "",
        "--log-format",
        "json",
        "--reconcile-interval",
        "1",
    ]
    return Process(argv, log_path, environment)


def emulator_process(cluster: LocalCluster, namespace: str, log_path: Path) -> Process:
    """`goodput emulate`: every leader of the namespace served at its pod IP once 'loaded'."""
    argv = [
        sys.executable,
        "-m",
        "goodput.operator.cli",
        "emulate",
        "--kubeconfig",
        cluster.kubeconfig,
        "--namespace",
        namespace,
        "--netns",
        cluster.netns,
        "--load-seconds",
        "2",
        "--nccl-check-seconds",
        "0.5",
        "--log-level",
        "WARNING",
    ]
    return Process(argv, log_path, {**os.environ, "KUBECONFIG": cluster.kubeconfig})


@dataclass
class Stage:
    cluster: LocalCluster
    namespace: str
    operator: Process
    emulator: Process

    # Reading the cluster.

    def model_group(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.cluster.api.get(f"{API}/namespaces/{self.namespace}/modelgroups/{name}")
        return found

    def status(self, name: str) -> dict[str, Any]:
        return dict(self.model_group(name).get("status") or {})

    def replicas(self, name: str) -> int:
        return int(self.model_group(name)["spec"]["replicas"])

    def condition(self, name: str, kind: str) -> dict[str, Any] | None:
        return next((c for c in self.status(name).get("conditions", []) if c["type"] == kind), None)

    def events(self, reason: str) -> list[dict[str, Any]]:
        answer = self.cluster.api.get(
            f"/api/v1/namespaces/{self.namespace}/events?fieldSelector=reason%3D{reason}"
        )
        return list((answer or {}).get("items", []))

    def decisions(self, name: str) -> list[dict[str, Any]]:
        """Every decision the operator logged for `name` (its §38 JSON lines), in order."""
        records = []
        for line in self.operator.log_path.read_text(errors="replace").splitlines():
            if '"policy_revision"' not in line:
                continue
            with contextlib.suppress(json.JSONDecodeError):
                record = json.loads(line)
                if record.get("model_group") == name and record.get("namespace") == self.namespace:
                    records.append(record)
        return records

    def describe(self, name: str) -> str:
        return f"status: {json.dumps(self.status(name))[:3000]}\noperator log:\n{self.operator.log_tail()}"

    # Writing.

    def apply(self, *documents: dict[str, Any]) -> None:
        self.cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(documents))

    def wait_ready_groups(self, name: str, count: int, timeout_seconds: float = 90) -> None:
        wait_for(
            lambda: self.status(name).get("readyGroups") == count,
            timeout_seconds=timeout_seconds,
            describe=lambda: f"{count} ready groups of {name}\n{self.describe(name)}",
        )


@pytest.fixture
def stage(cluster: LocalCluster, goodput_crds: list[str], namespace: str, tmp_path: Path) -> Iterator[Stage]:
    node = cluster.add_gpu_node(
        f"{namespace}-h100", zone=f"{namespace}-z", clique=f"{namespace}-c", labels={POOL_LABEL: namespace}
    )
    emulator = emulator_process(cluster, namespace, tmp_path / "emulator.log")
    operator = operator_process(cluster, namespace, tmp_path / "operator.log")
    emulator.start()
    operator.start()
    try:
        yield Stage(cluster, namespace, operator, emulator)
    finally:
        operator.stop()
        emulator.stop()
        cluster.remove_node(node.name)


@dataclass
class Timeline:
    """spec.replicas and ready groups of one ModelGroup, sampled twice a second in the background."""

    stage: Stage
    name: str
    samples: list[tuple[float, int, int]] = field(default_factory=list)
    stopped: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        deadline = time.monotonic() + 900
        while not self.stopped.wait(0.5) and time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                found = self.stage.model_group(self.name)
                ready = int((found.get("status") or {}).get("readyGroups") or 0)
                self.samples.append((time.time(), int(found["spec"]["replicas"]), ready))

    def replicas_since(self, since: float) -> list[int]:
        return [replicas for at, replicas, _ in self.samples if at >= since]


@contextlib.contextmanager
def timeline(stage: Stage, name: str) -> Iterator[Timeline]:
    recorder = Timeline(stage, name)
    thread = threading.Thread(target=recorder.run, daemon=True, name=f"timeline-{name}")
    thread.start()
    try:
        yield recorder
    finally:
        recorder.stopped.set()
        thread.join(timeout=5)


def uniform_plan(
    phases: list[tuple[float, float]], prompt_tokens: int = PROMPT_TOKENS
) -> list[PlannedRequest]:
    """Requests at a steady rate per phase: (requests per second, seconds), one phase after another."""
    plan: list[PlannedRequest] = []
    start = 0.0
    for rate, seconds in phases:
        count = int(rate * seconds)
        plan.extend(
            PlannedRequest(len(plan) + index, start + index / rate, prompt_tokens, OUTPUT_TOKENS)
            for index in range(count)
        )
        start += seconds
    return plan


@contextlib.contextmanager
def load(
    stage: Stage, name: str, phases: list[tuple[float, float]], prompt_tokens: int = PROMPT_TOKENS
) -> Iterator[float]:
    """Offer `phases` of load to the ModelGroup's ready leaders in the background; yields the start
    time (wall clock). The block waits for the load to end."""
    service = leaders_service(name, stage.namespace)
    stage.apply(service)
    slices_path = (
        f"/apis/discovery.k8s.io/v1/namespaces/{stage.namespace}/endpointslices"
        f"?labelSelector=kubernetes.io/service-name%3D{service['metadata']['name']}"
    )

    def endpoints() -> list[str]:
        return ready_endpoints((stage.cluster.api.get(slices_path) or {}).get("items", []))

    async def refresh() -> list[str]:
        return await asyncio.to_thread(endpoints)

    first = wait_for(endpoints, timeout_seconds=60, describe="a ready leader behind the Service")
    duration = sum(seconds for _, seconds in phases)
    settings = LoadSettings(
        duration_seconds=duration,
        request_timeout_seconds=30,
        run_id=stage.namespace,
        refresh_targets=refresh,
        refresh_interval_seconds=1.0,
    )
    generator = LoadGenerator(TargetPool(first, TargetPolicy()), settings)
    plan = uniform_plan(phases, prompt_tokens)
    thread = threading.Thread(
        target=lambda: asyncio.run(generator.run(plan)), daemon=True, name=f"load-{name}"
    )
    started = time.time()
    thread.start()
    try:
        yield started
    finally:
        thread.join(timeout=duration + 40)


@contextlib.contextmanager
def prometheus_stopped(cluster: LocalCluster) -> Iterator[None]:
    """Stop the cluster's Prometheus for the block, then start it again on the same port and data."""
    paths = StatePaths(cluster.state_dir)
    record = processes.read_records(paths.pids)["prometheus"]
    assert processes.stop(record), "Prometheus was not running"
    try:
        yield
    finally:
        argv = component_commands(cluster.state.layout)["prometheus"]
        processes.spawn(
            "prometheus", argv, log_path=paths.log("prometheus"), pid_dir=paths.pids, cwd=paths.root
        )
        wait_for(
            lambda: probe(f"{cluster.prometheus_url}/-/ready")[0],
            timeout_seconds=30,
            describe="Prometheus ready again",
        )


def first_at(records: list[dict[str, Any]], matches: Callable[[dict[str, Any]], bool]) -> float | None:
    return next((float(record["time"]) for record in records if matches(record)), None)


# --- the stories ---------------------------------------------------------------------------------


def test_a_burst_that_doubles_the_work_scales_out_within_two_intervals_and_names_its_signal(
    stage: Stage,
) -> None:
    stage.apply(
        slo_policy("chat", stage.namespace), model_group("llama", stage.namespace, replicas=1, policy="chat")
    )
    stage.wait_ready_groups("llama", 1)
    with load(stage, "llama", [(BASE_RATE, 20), (BURST_RATE, 70)]) as started:
        burst_at = started + 20
        wait_for(
            lambda: stage.replicas("llama") > 1,
            timeout_seconds=80,
            describe=lambda: f"a scale-out after the burst\n{stage.describe('llama')}",
        )
        stage.wait_ready_groups("llama", stage.replicas("llama"), timeout_seconds=60)

    records = stage.decisions("llama")
    before_burst = [r for r in records if float(r["time"]) < burst_at]
    assert before_burst and all(r["result"]["desired_groups"] == 1 for r in before_burst), before_burst[-3:]
    negative_slack = first_at(
        records,
        lambda r: (
            float(r["time"]) >= burst_at
            and (
                r["estimates"]["earliest_slack_seconds"] is None
                or r["estimates"]["earliest_slack_seconds"] < 0
            )
        ),
    )
    scaled_out = first_at(records, lambda r: r["result"]["desired_groups"] > r["result"]["current_groups"])
    assert negative_slack is not None and scaled_out is not None, records[-5:]
    assert scaled_out - negative_slack <= 2 * INTERVAL_SECONDS + 0.5

    # The record says which signal asked for the groups, with its inputs, and under which revision.
    decision = next(
        entry for entry in stage.status("llama")["decisions"] if entry["toReplicas"] > entry["fromReplicas"]
    )
    assert decision["signal"] in ("slack", "queueWork")
    winner = next(p for p in decision["proposals"] if p["signal"] == decision["signal"])
    assert winner["detail"], winner
    if winner["replicas"] != decision["toReplicas"]:
        # A step or bound cut the winner down, and the record names the guard that did.
        assert winner["replicas"] > decision["toReplicas"], decision
        assert {"ScaleUpLimit", "TooManyReplicas"} & set(decision.get("guards", ())), decision
    assert (decision["policyRevision"], decision["mode"]) == ("r1", "Active")
    rescales = [e for e in stage.events("SuccessfulRescale") if e["involvedObject"]["name"] == "llama"]
    assert any(decision["signal"] in event["message"] for event in rescales), rescales
    active = stage.condition("llama", "ScalingActive")
    assert active is not None and (active["status"], active["reason"]) == ("True", "SignalsComputed")

    # `goodput explain` tells the same story to a person.
    explained = subprocess.run(
        [sys.executable, "-m", "goodput.operator.cli", "explain", "mg/llama", "-n", stage.namespace],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "KUBECONFIG": stage.cluster.kubeconfig},
        check=False,
    )
    assert explained.returncode == 0, explained.stderr
    change = f"{decision['fromReplicas']}→{decision['toReplicas']}"
    row = next((line for line in explained.stdout.splitlines() if change in line), None)
    assert row is not None, f"no {change} row in:\n{explained.stdout}"
    assert decision["signal"] in row and "r1" in row


def test_after_a_burst_the_count_comes_down_only_after_the_window_and_then_holds(stage: Stage) -> None:
    window = 30
    stage.apply(
        slo_policy("chat", stage.namespace, scale_down_window_seconds=window),
        model_group("llama", stage.namespace, replicas=3, policy="chat"),
    )
    with timeline(stage, "llama") as seen, load(stage, "llama", [(BASE_RATE, 150)]):
        first = wait_for(
            lambda: stage.decisions("llama"), timeout_seconds=30, describe=lambda: stage.describe("llama")
        )[0]
        wait_for(
            lambda: stage.replicas("llama") == 1,
            timeout_seconds=window + 70,
            describe=lambda: f"scale-in to one group\n{stage.describe('llama')}",
        )
        down_at = wait_for(
            lambda: first_at(stage.decisions("llama"), lambda r: r["result"]["desired_groups"] < 3),
            timeout_seconds=5,
        )
        settled = time.time()
        time.sleep(window + 5)  # steady load for longer than the window: nothing moves
        assert stage.replicas("llama") == 1

    # The first decision seeded the window with the count it found, so nothing came down before it.
    assert down_at - float(first["time"]) >= window - 1
    steps = seen.replicas_since(0)
    assert steps == sorted(steps, reverse=True), "the count went back up: it flapped"
    assert set(seen.replicas_since(settled)) == {1}
    held = stage.status("llama")["lastDecision"]
    assert (held["fromReplicas"], held["toReplicas"]) == (1, 1)


def test_without_prometheus_nothing_scales_in_and_scaling_resumes_when_it_returns(stage: Stage) -> None:
    window = 20
    stage.apply(
        slo_policy("chat", stage.namespace, scale_down_window_seconds=window),
        model_group("llama", stage.namespace, replicas=2, policy="chat"),
    )
    stage.wait_ready_groups("llama", 2)
    wait_for(lambda: stage.decisions("llama"), timeout_seconds=30, describe=lambda: stage.describe("llama"))
    with timeline(stage, "llama") as seen:
        with prometheus_stopped(stage.cluster):
            unavailable = wait_for(
                lambda: (c := stage.condition("llama", "MetricsAvailable")) and c["status"] == "False" and c,
                timeout_seconds=3 * INTERVAL_SECONDS,
                describe=lambda: stage.describe("llama"),
            )
            assert unavailable["reason"] == "MetricsQueryFailed"
            # Idle groups would be scaled in after the window; blind, they are not.
            time.sleep(window + 2 * INTERVAL_SECONDS)
            assert set(seen.replicas_since(0)) == {2}
            active = stage.condition("llama", "ScalingActive")
            assert active is not None and (active["status"], active["reason"]) == (
                "False",
                "MetricsQueryFailed",
            )
            assert stage.events("MetricsQueryFailed"), "no Event said the metrics were lost"
        back = time.time()
        wait_for(
            lambda: (c := stage.condition("llama", "MetricsAvailable")) and c["status"] == "True",
            timeout_seconds=30 + 2 * INTERVAL_SECONDS,
            describe=lambda: stage.describe("llama"),
        )
        wait_for(
            lambda: stage.replicas("llama") == 1,
            timeout_seconds=window + 40,
            describe=lambda: f"scale-in once Prometheus is back\n{stage.describe('llama')}",
        )
    # A blind spot restarts the scale-down window: no scale-in until one full window after it.
    scaled_in = wait_for(
        lambda: first_at(stage.decisions("llama"), lambda r: r["result"]["desired_groups"] < 2),
        timeout_seconds=5,
        describe="the scale-in decision in the operator's log",
    )
    assert scaled_in - back >= window - 1


def test_advisory_and_shadow_policies_record_decisions_without_changing_replicas(stage: Stage) -> None:
    stage.apply(
        slo_policy("advice", stage.namespace, mode="Advisory", revision="advice-1"),
        slo_policy("next", stage.namespace, revision="next-1"),
        model_group("llama", stage.namespace, replicas=1, policy="advice", shadow="next"),
    )
    stage.wait_ready_groups("llama", 1)
    with timeline(stage, "llama") as seen, load(stage, "llama", [(BURST_RATE, 45)]):
        wait_for(
            lambda: any(entry["toReplicas"] > 1 for entry in stage.status("llama").get("decisions", [])),
            timeout_seconds=45,
            describe=lambda: f"an advisory scale-out recorded\n{stage.describe('llama')}",
        )
        wait_for(
            lambda: (stage.status("llama").get("shadowDecision") or {}).get("toReplicas", 0) > 1,
            timeout_seconds=30,
            describe=lambda: f"a shadow scale-out recorded\n{stage.describe('llama')}",
        )
    status = stage.status("llama")
    advisory = next(entry for entry in status["decisions"] if entry["toReplicas"] > 1)
    assert (advisory["mode"], advisory["policyRevision"], advisory.get("shadow", False)) == (
        "Advisory",
        "advice-1",
        False,
    )
    shadow = status["shadowDecision"]
    assert (shadow["shadow"], shadow["policyRevision"], shadow["mode"]) == (True, "next-1", "Advisory")
    assert set(seen.replicas_since(0)) == {1}
    assert stage.replicas("llama") == 1
    messages = [e["message"] for e in stage.events("AdvisoryRescale")]
    assert any("shadow SLOPolicy next" in m for m in messages) and any(
        "SLOPolicy advice" in m for m in messages
    )
    assert not stage.events("SuccessfulRescale")


def test_a_policy_revision_bump_is_named_by_the_next_decision(stage: Stage) -> None:
    stage.apply(
        slo_policy("chat", stage.namespace), model_group("llama", stage.namespace, replicas=1, policy="chat")
    )
    stage.wait_ready_groups("llama", 1)
    wait_for(
        lambda: (stage.status("llama").get("lastDecision") or {}).get("policyRevision") == "r1",
        timeout_seconds=30,
        describe=lambda: stage.describe("llama"),
    )
    stage.apply(slo_policy("chat", stage.namespace, revision="r2", drain_target_seconds=5))
    bumped = time.time()
    first = wait_for(
        lambda: next((r for r in stage.decisions("llama") if r["policy_revision"] == "r2"), None),
        timeout_seconds=2 * INTERVAL_SECONDS + 5,
        describe=lambda: stage.describe("llama"),
    )
    # The next decision names it (ticks are an interval apart), with the new revision's parameters.
    assert float(first["time"]) <= bumped + INTERVAL_SECONDS + 1.0
    queue_work = next(p for p in first["proposals"] if p["signal"] == "queueWork")
    assert "T_d=5s" in queue_work["detail"]
    # Every decision made once the watch delivered the change (a second) names the new revision.
    later = wait_for(
        lambda: [r for r in stage.decisions("llama") if float(r["time"]) > bumped + 1.0],
        timeout_seconds=2 * INTERVAL_SECONDS,
        describe="a decision after the bump",
    )
    assert {r["policy_revision"] for r in later} == {"r2"}
    assert stage.status("llama")["lastDecision"]["policyRevision"] == "r2"


def test_long_prompts_past_the_feasible_threshold_do_not_scale_out_and_the_condition_says_why(
    stage: Stage,
) -> None:
    stage.apply(
        slo_policy("chat", stage.namespace), model_group("llama", stage.namespace, replicas=1, policy="chat")
    )
    stage.wait_ready_groups("llama", 1)
    # A trickle first, so the window's prompt histogram holds them; then ten times the rate: counted
    # as demand, their prefill alone would ask for two or three groups.
    phases = [(0.1, 30.0), (1.0, 45.0)]
    with timeline(stage, "llama") as seen, load(stage, "llama", phases, prompt_tokens=LONG_PROMPT_TOKENS):
        unattainable: dict[str, Any] = wait_for(
            lambda: ((c := stage.condition("llama", "SLOAttainable")) and c["status"] == "False" and c) or {},
            timeout_seconds=70,
            describe=lambda: f"SLOAttainable=False\n{stage.describe('llama')}",
        )
        # The share climbs as long prompts replace the warm-up's in the window.
        (chat,) = wait_for(
            lambda: [
                c for c in stage.status("llama").get("feasibility") or () if c.get("infeasibleShare", 0) > 0.9
            ],
            timeout_seconds=60,
            describe=lambda: f"an infeasible share over 0.9\n{stage.describe('llama')}",
        )
    assert unattainable["reason"] == "InfeasibleDemand"
    threshold = chat["longestFeasiblePromptTokens"]
    assert 10_000 < threshold < LONG_PROMPT_TOKENS
    assert f"longer than {threshold} tokens" in unattainable["message"]
    assert "tensor parallelism of about" in unattainable["message"]
    records = stage.decisions("llama")
    # No decision scaled out, not even before the first long prompt finished: vLLM observes a
    # prompt's length at its request's finish, but counts its tokens at its first token, and the
    # tokens no finished prompt explains are judged as the prompts still decoding.
    scale_outs = [r for r in records if r["result"]["desired_groups"] > r["result"]["current_groups"]]
    assert scale_outs == [], f"infeasible prompts scaled the group out: {scale_outs[:2]}"
    assert set(seen.replicas_since(0.0)) == {1}, seen.replicas_since(0.0)
    assert any(
        (r["estimates"]["feasibility"] or [{}])[0].get("infeasible_request_share") == 1.0 for r in records
    ), records[-3:]
    announced = [e for e in stage.events("SLOUnattainable") if e["involvedObject"]["name"] == "llama"]
    assert len(announced) == 1, announced
    explained = subprocess.run(
        [sys.executable, "-m", "goodput.operator.cli", "explain", "mg/llama", "-n", stage.namespace],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "KUBECONFIG": stage.cluster.kubeconfig},
        check=False,
    )
    assert explained.returncode == 0, explained.stderr
    assert (
        f"feasibility chat: prompts over {threshold} tokens cannot meet the TTFT target" in explained.stdout
    )
    assert "SLOAttainable=False InfeasibleDemand" in explained.stdout


def condition_owners(found: dict[str, Any]) -> dict[str, set[str]]:
    """Who owns each status condition, as `metadata.managedFields` records it (server-side apply)."""
    owners: dict[str, set[str]] = {}
    for entry in found["metadata"].get("managedFields") or ():
        conditions = ((entry.get("fieldsV1") or {}).get("f:status") or {}).get("f:conditions") or {}
        for key in conditions:
            if key.startswith("k:"):
                owners.setdefault(json.loads(key[2:])["type"], set()).add(
                    f"{entry['manager']}/{entry['operation']}"
                )
    return owners


def test_each_controller_owns_its_conditions_and_the_users_annotations_stay_the_users(stage: Stage) -> None:
    stage.apply(
        slo_policy("chat", stage.namespace), model_group("llama", stage.namespace, replicas=1, policy="chat")
    )
    stage.wait_ready_groups("llama", 1)
    stage.cluster.kubectl("-n", stage.namespace, "annotate", "modelgroup", "llama", "team=serving")
    # Many decisions, each written by the autoscaler while the group controller keeps writing too.
    wait_for(
        lambda: len(stage.decisions("llama")) >= 8,
        timeout_seconds=90,
        describe=lambda: f"eight decisions\n{stage.describe('llama')}",
    )
    found = stage.model_group("llama")
    annotations = found["metadata"].get("annotations") or {}
    assert annotations.get("team") == "serving", "the user's annotation was kept"
    assert "goodput.dev/autoscaler-state" not in annotations, "the autoscaler keeps its memory in status"
    assert found["status"].get("autoscalerState"), "its memory is in its own status field"

    groups, autoscaler = {"goodput-groups/Apply"}, {"goodput-autoscaler/Apply"}
    assert condition_owners(found) == {
        "Ready": groups,
        "Progressing": groups,
        "Degraded": groups,
        "ScalingLimited": groups,
        "ScalingActive": autoscaler,
        "MetricsAvailable": autoscaler,
        "DecisionLimited": autoscaler,
        "SLOAttainable": autoscaler,
    }
    conditions = {c["type"]: c for c in found["status"]["conditions"]}
    assert conditions["Ready"]["status"] == "True" and conditions["ScalingActive"]["status"] == "True"
    assert found["status"]["readyGroups"] == 1 and found["status"]["lastDecision"]["toReplicas"] == 1
