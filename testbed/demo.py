"""`goodput demo`: the whole loop on one machine, and an account of what it did.

1. cluster: reuse the local cluster `--name` (default `demo`) if it runs, else start it (`goodput
   cluster up`: a real control plane, fake GPU nodes, Prometheus scraping the vLLM leaders);
2. install: goodput's Helm chart (CRDs, RBAC, the operator's ServiceAccount), watching the demo's
   namespace. Fake nodes run no containers, so the chart's operator Deployment is scaled to zero and
   the operator runs here as a process, with the chart's environment and a token of its
   ServiceAccount: exactly the permissions an installed operator has;
3. operator and emulator: `goodput run`, and `goodput emulate` serving vLLM's API and metrics at
   every leader pod's IP;
4. apply `manifests/demo/`: an SLOPolicy with short windows, an 8B TP1 ModelGroup bound to it and a
   Service over its ready leaders, and (with the gateway) a second model's ModelGroup from
   `manifests/demo/second-model/`; wait for the first group of each;
5. gateway and load: one `goodput gateway` in front of both ModelGroups (admission, tenant
   fairness, routing by model; Prometheus scrapes it, so the autoscaler reads its queue); a slice of
   a public trace (a seeded synthetic one if the file is absent) replayed open loop through it to the
   demo's ModelGroup by two tenants of the policy, one steady, one that makes the burst (the rate
   multiplier steps up, then down), and a steady trickle to the second model, while the
   ModelGroup's count, groups and decisions are sampled every second;
6. settle: wait (bounded) for the drains that follow the burst;
7. report: a timeline per interval and a summary, printed and written under `--out` as JSON and
   PNG plots; then tear down what the demo started, unless `--keep`.

Every wait is bounded; Ctrl-C or a failure still stops the processes and the cluster it started.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from prometheus_client.parser import text_string_to_metric_families

from goodput.api.modelgroup import ModelGroup
from goodput.api.slopolicy import SloPolicy
from goodput.simulator.workload import Workload, compress_time, load_trace, multiply_rate, truncate, window
from goodput.testbed.cluster import controlplane, keda
from goodput.testbed.cluster.binaries import BinariesUnavailableError, ensure_binaries, repository_root
from goodput.testbed.cluster.controlplane import free_ports
from goodput.testbed.cluster.kube import ApiError
from goodput.testbed.cluster.netns import NetnsError
from goodput.testbed.cluster.pki import PkiError
from goodput.testbed.cluster.processes import log_tail, stop_child
from goodput.testbed.demo_models import ModelProbe, OtherModel, read_other_models, render_other_models
from goodput.testbed.demo_report import (
    NOT_SENT,
    OK,
    DecisionRecord,
    GroupEvent,
    ModelGroupSample,
    RequestRecord,
    SloTargets,
    advice_changes,
    count_changes,
    decision_records,
    drain_records,
    fleet_sample,
    group_events,
    group_histories,
    merge_decisions,
    plot_timeline,
    render_summary,
    render_timeline,
    report_dict,
    summarize,
    timeline,
)
from goodput.testbed.loadgen import (
    LoadGenerator,
    LoadReport,
    LoadSettings,
    PlannedRequest,
    RequestResult,
    TargetPolicy,
    TargetPool,
    plan_requests,
    ready_endpoints,
    target_host,
)
from goodput.testbed.operator_process import GatewayProcess

DEFAULT_TRACE_NAME = "AzureLLMInferenceTrace_conv.csv"
SYNTHETIC_FALLBACK = "synthetic:rate=4,duration={duration:g},burst_multiplier=1"
"""The trace when the public one is absent: Poisson arrivals at about the Azure trace's rate (the
demo's phases make the burst), lognormal lengths around its medians."""
API = "/apis/goodput.dev/v1alpha1"
LABEL_GROUP = "goodput.dev/group"
SAMPLE_INTERVAL_SECONDS = 1.0
PROCESS_STOP_SECONDS = 20.0


SCALERS = ("goodput", "keda", "hpa")
BASELINE_READY_SECONDS = 90.0
"""How long KEDA and the HPA controller get to read a ScaledObject's metric (the HPA syncs every 15 s)."""


class DemoError(RuntimeError):
    """The demo cannot go on; the message says which phase failed and why."""


# ---------------------------------------------------------------------------------------- the scenario
@dataclass(frozen=True, slots=True)
class Phase:
    """A stretch of the replay at one rate multiplier of the trace."""

    name: str
    seconds: float
    rate_multiplier: float


def default_trace() -> Path:
    """The public trace shipped beside the repository (`../shared/traces/` in a clean clone)."""
    return repository_root().parent / "shared" / "traces" / DEFAULT_TRACE_NAME


def burst_phases(
    before_seconds: float, burst_seconds: float, after_seconds: float, base: float, burst: float
) -> tuple[Phase, ...]:
    """Steady load, a burst, and steady load again: the step up and down the demo scales to."""
    phases = (
        Phase("steady", before_seconds, base),
        Phase("burst", burst_seconds, burst),
        Phase("after", after_seconds, base),
    )
    for phase in phases:
        if phase.seconds < 0 or phase.rate_multiplier <= 0:
            raise ValueError(f"phase {phase.name}: seconds must be ≥ 0 and the rate multiplier positive")
    return tuple(phase for phase in phases if phase.seconds > 0)


def phased_workload(
    trace: Workload, phases: Sequence[Phase], seed: int, *, start_seconds: float = 0.0
) -> Workload:
    """The trace from `start_seconds` on, one window per phase, each thinned or replicated by its
    multiplier (`multiply_rate`, seeded per phase), so the trace's own second-level shape stays."""
    arrivals, inputs, outputs = [], [], []
    blocks: list[tuple[int, ...]] | None = None if trace.prefix_blocks is None else []
    phase_start = 0.0
    for index, phase in enumerate(phases):
        piece = window(trace, start_seconds + phase_start, phase.seconds)
        if len(piece):
            shaped = truncate(multiply_rate(piece, phase.rate_multiplier, seed + index), phase.seconds)
            arrivals.append(shaped.arrival_seconds + phase_start)
            inputs.append(shaped.input_tokens)
            outputs.append(shaped.output_tokens)
            if blocks is not None and shaped.prefix_blocks is not None:
                blocks.extend(shaped.prefix_blocks)
        phase_start += phase.seconds
    description = ", then ".join(
        f"{phase.name} {phase.seconds:g} s at x{phase.rate_multiplier:g}" for phase in phases
    )
    return Workload(
        name=f"{trace.name}-phased",
        arrival_seconds=np.concatenate(arrivals) if arrivals else np.zeros(0),
        input_tokens=np.concatenate(inputs) if inputs else np.zeros(0, dtype=np.int64),
        output_tokens=np.concatenate(outputs) if outputs else np.zeros(0, dtype=np.int64),
        prefix_blocks=None if blocks is None else tuple(blocks),
        prefix_block_tokens=trace.prefix_block_tokens,
        notes=(
            *trace.notes,
            f"from {start_seconds:g} s of the trace: {description} (each phase's window thinned or "
            f"replicated, seed {seed} + phase index)",
        ),
    )


def assign_tenants(
    plan: Sequence[PlannedRequest], phases: Sequence[Phase], tenants: tuple[str, str], seed: int
) -> list[PlannedRequest]:
    """Two tenants share the first phase's rate evenly; every request a phase offers beyond it is the
    second tenant's. So in a burst the second tenant is the noisy one and the first keeps its rate,
    which is what the gateway's fairness must protect (seeded: the same plan gives the same split)."""
    steady, bursty = tenants
    base = phases[0].rate_multiplier
    draws = np.random.default_rng(seed).random(len(plan))
    assigned = []
    for planned, draw in zip(plan, draws, strict=True):
        phase = _phase_at(phases, planned.send_at_seconds)
        steady_share = 0.5 * min(1.0, base / phase.rate_multiplier)
        assigned.append(replace(planned, tenant=steady if draw < steady_share else bursty))
    return assigned


def _phase_at(phases: Sequence[Phase], offset_seconds: float) -> Phase:
    start = 0.0
    for phase in phases:
        if offset_seconds < start + phase.seconds:
            return phase
        start += phase.seconds
    return phases[-1]


GatewayCounts = dict[str, dict[str, int]]
"""Per tenant, the requests the gateway counted: `offered` and one count per admission outcome."""


def gateway_counts(gateway: GatewayProcess, model_group: str) -> GatewayCounts:
    """What the gateway itself counted for `model_group`, from its metrics: the client's figures are
    checked against it."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{gateway.metrics_port}/metrics", timeout=5) as reply:
            text = reply.read().decode()
    except OSError as error:
        raise DemoError(f"reading the gateway's metrics failed: {error}") from None
    return count_by_tenant(text, model_group)


def served_models(gateway: GatewayProcess) -> list[str]:
    """The model names the gateway serves (its `/v1/models`); every request names one."""
    try:
        with urllib.request.urlopen(gateway.url + "/v1/models", timeout=5) as reply:
            return [str(model["id"]) for model in json.loads(reply.read())["data"]]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise DemoError(f"the gateway's /v1/models could not be read: {error!r}") from None


def count_by_tenant(metrics_text: str, model_group: str | None = None) -> GatewayCounts:
    """Offered and per-outcome counts by tenant, of one ModelGroup's series (all, without one)."""
    counts: GatewayCounts = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            tenant = sample.labels.get("tenant")
            if tenant is None or (
                model_group is not None and sample.labels.get("model_group") != model_group
            ):
                continue
            if sample.name == "goodput_gateway_requests_offered_total":
                key = "offered"
            elif sample.name == "goodput_gateway_requests_total":
                key = sample.labels.get("outcome", "")
            else:
                continue
            mine = counts.setdefault(tenant, {})
            mine[key] = mine.get(key, 0) + int(sample.value)
    return dict(sorted(counts.items()))


def render_gateway_counts(counts: GatewayCounts) -> str:
    lines = ["the gateway counted (its own metrics), per tenant:"]
    for tenant, mine in counts.items():
        outcomes = ", ".join(f"{name} {count}" for name, count in sorted(mine.items()) if name != "offered")
        lines.append(f"  {tenant}: offered {mine.get('offered', 0)}; {outcomes or 'no outcome yet'}")
    return "\n".join(lines)


def request_records(plan: Sequence[PlannedRequest], results: Sequence[RequestResult]) -> list[RequestRecord]:
    """One record per planned request: what the client saw, or `not_sent`."""
    by_index = {result.index: result for result in results}
    records = []
    for planned in plan:
        result = by_index.get(planned.index)
        if result is None:
            records.append(RequestRecord(planned.send_at_seconds, NOT_SENT, tenant=planned.tenant))
            continue
        tpot = None
        if (
            result.outcome == OK
            and result.e2e_seconds is not None
            and result.ttft_seconds is not None
            and result.completion_tokens > 1
        ):
            tpot = (result.e2e_seconds - result.ttft_seconds) / (result.completion_tokens - 1)
        records.append(
            RequestRecord(
                offset_seconds=planned.send_at_seconds,
                outcome=result.outcome,
                ttft_seconds=result.ttft_seconds,
                tpot_seconds=tpot,
                e2e_seconds=result.e2e_seconds,
                target_host=target_host(result.target),
                tenant=planned.tenant,
                group=result.group,
            )
        )
    return records


# ---------------------------------------------------------------------------------------- the shell
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("out/demo"), help="where the report goes")
    parser.add_argument(
        "--trace",
        default=None,
        help=f"Azure CSV, Mooncake JSONL or synthetic:... (default: ../shared/traces/{DEFAULT_TRACE_NAME}; "
        "a seeded synthetic trace if that is absent)",
    )
    cluster = parser.add_argument_group("cluster")
    cluster.add_argument("--name", default="demo", help="local cluster to reuse or start (default demo)")
    cluster.add_argument(
        "--cluster-state-dir",
        type=Path,
        default=None,
        help="use the running cluster in this state directory (it is never stopped)",
    )
    cluster.add_argument("--keep", action="store_true", help="leave the cluster and the demo's objects")
    cluster.add_argument("--namespace", default="goodput-demo", help="namespace of the demo's objects")
    cluster.add_argument(
        "--chart",
        type=Path,
        default=repository_root() / "charts" / "goodput",
        help="the Helm chart to install",
    )
    cluster.add_argument("--release", default="goodput", help="Helm release name")
    cluster.add_argument("--release-namespace", default="goodput-system", help="Helm release namespace")
    cluster.add_argument(
        "--manifests",
        type=Path,
        default=repository_root() / "manifests" / "demo",
        help="the SLOPolicy, ModelGroup and Service to apply",
    )
    scaling = parser.add_argument_group("scaling")
    scaling.add_argument(
        "--scaler",
        choices=SCALERS,
        default="goodput",
        help="who sets spec.replicas: goodput's autoscaler (default), or the real KEDA on vLLM's waiting "
        "requests (keda) or the real HPA on DCGM GPU utilisation through KEDA (hpa), each with its "
        "ScaledObject from manifests/baselines and goodput's policy in Advisory mode",
    )
    scaling.add_argument(
        "--baselines",
        type=Path,
        default=None,
        help="where the keda and hpa ScaledObjects come from (default manifests/baselines)",
    )
    scaling.add_argument(
        "--scaler-threshold",
        type=float,
        default=None,
        help="the ScaledObject's threshold (waiting requests per group for keda, GPU utilisation in "
        "percent for hpa; default: the one in manifests/baselines)",
    )
    scaling.add_argument(
        "--no-gateway",
        action="store_true",
        help="send the load straight to the Service's ready leaders, as a router following its "
        "EndpointSlices would (the A/B run does, so no policy gets goodput's admission control)",
    )
    load = parser.add_argument_group("load")
    load.add_argument("--before-seconds", type=float, default=60.0, help="steady load before the burst")
    load.add_argument("--burst-seconds", type=float, default=75.0)
    load.add_argument("--after-seconds", type=float, default=105.0, help="steady load after the burst")
    load.add_argument(
        "--rate-multiplier", type=float, default=0.3, help="trace rate outside the burst (default 0.3)"
    )
    load.add_argument("--burst-rate-multiplier", type=float, default=1.0, help="trace rate in the burst")
    load.add_argument(
        "--trace-start-seconds",
        type=float,
        default=840.0,
        help="where in the trace to start (default 840: minutes 14-18 of the Azure trace, a steady ~4.7/s)",
    )
    load.add_argument("--time-compression", type=float, default=1.0, help="replay the trace this much faster")
    load.add_argument("--max-requests", type=int, default=5000)
    load.add_argument("--max-output-tokens", type=int, default=None, help="cap each request's output")
    load.add_argument("--request-timeout-seconds", type=float, default=30.0)
    load.add_argument("--seed", type=int, default=0)
    timing = parser.add_argument_group("timing")
    timing.add_argument("--interval-seconds", type=float, default=10.0, help="timeline interval")
    timing.add_argument(
        "--engine-load-seconds", type=float, default=8.0, help="emulated vLLM start-up (weights, compile)"
    )
    timing.add_argument("--ready-timeout-seconds", type=float, default=180.0)
    timing.add_argument(
        "--settle-seconds", type=float, default=90.0, help="longest wait for the drains after the load"
    )


RUN_ERRORS = (
    DemoError,
    controlplane.ClusterError,
    BinariesUnavailableError,
    NetnsError,
    PkiError,
    ApiError,
    ValueError,
    OSError,
    subprocess.SubprocessError,
)
"""What ends a run with a message rather than a traceback."""
INTERRUPTED = 130


def run(args: argparse.Namespace) -> int:
    code, _ = run_reporting(args)
    return code


def run_reporting(args: argparse.Namespace) -> tuple[int, str | None]:
    """One run: its exit code and, when it failed, why (the A/B run reports it beside the others)."""
    say = Progress()
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with contextlib.ExitStack() as cleanup:
            return Demo(args, cleanup, say).run(), None
    except KeyboardInterrupt:
        say("interrupted: everything the demo started is stopped")
        return INTERRUPTED, "interrupted"
    except RUN_ERRORS as error:
        say(f"failed: {error}")
        return 1, str(error)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


class Progress:
    """One line per step, prefixed with the seconds since the demo started."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    def __call__(self, message: str) -> None:
        print(f"[{time.monotonic() - self.started:6.1f} s] {message}", file=sys.stderr, flush=True)


@dataclass
class ChildProcess:
    """A process the demo started, its output in a log file; in its own session, so Ctrl-C reaches
    only the demo, which stops it in order."""

    name: str
    argv: list[str]
    log_path: Path
    environment: dict[str, str]
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.environment,
                start_new_session=True,
            )

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        stop_child(self.process, grace_seconds=PROCESS_STOP_SECONDS)

    def log_tail(self, lines: int = 15) -> str:
        return log_tail(self.log_path, lines)


def _wait_until(
    predicate: Callable[[], Any], *, timeout_seconds: float, what: Callable[[], str] | str, every: float = 0.5
) -> Any:
    deadline = time.monotonic() + timeout_seconds
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise DemoError(
                f"timed out after {timeout_seconds:g} s waiting for {what() if callable(what) else what}"
            )
        time.sleep(every)


@dataclass
class Sampler:
    """Reads the ModelGroup every second in the background, until stopped or its time limit."""

    read: Callable[[float], tuple[ModelGroupSample, list[DecisionRecord]]]
    started: float
    limit_seconds: float
    samples: list[ModelGroupSample] = field(default_factory=list)
    decisions: list[DecisionRecord] = field(default_factory=list)
    failed_reads: int = 0
    stopped: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._loop, name="demo-sampler", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        deadline = time.monotonic() + self.limit_seconds
        while time.monotonic() < deadline:
            try:
                sample, decisions = self.read(time.monotonic() - self.started)
            except (ApiError, OSError, ValueError, KeyError):
                self.failed_reads += 1
            else:
                with self.lock:
                    self.samples.append(sample)
                    self.decisions.extend(decisions)
            if self.stopped.wait(SAMPLE_INTERVAL_SECONDS):
                return

    def latest(self) -> ModelGroupSample | None:
        with self.lock:
            return self.samples[-1] if self.samples else None

    def stop(self) -> None:
        self.stopped.set()
        if self.thread is not None:
            self.thread.join(timeout=15)


@dataclass
class LoadRun:
    """The load generator on its own event loop in a background thread (a daemon: an interrupted
    demo does not wait for in-flight requests)."""

    generator: LoadGenerator
    plan: list[PlannedRequest]
    notes: tuple[str, ...]
    report: LoadReport | None = None
    error: BaseException | None = None
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._main, name="demo-load", daemon=True)
        self.thread.start()

    def _main(self) -> None:
        try:
            self.report = asyncio.run(self.generator.run(self.plan, notes=self.notes))
        except Exception as error:  # reported by the demo's main thread
            self.error = error

    def finished(self) -> bool:
        return self.thread is not None and not self.thread.is_alive()


@dataclass(frozen=True, slots=True)
class DemoObjects:
    """What `--manifests` holds, read before anything is applied."""

    files: tuple[Path, ...]
    model_group: str
    service: str
    policy: str
    gpus_per_group: int
    min_groups: int
    max_groups: int
    served_name: str
    targets: SloTargets
    model_name: str
    tenants: tuple[str, str]
    """The steady tenant and the one whose traffic bursts: the policy's first two fairness tenants."""


def read_manifests(directory: Path) -> DemoObjects:
    """The demo's ModelGroup, its SLOPolicy and the Service over its leaders, validated by the API
    models (a mistake is reported before a cluster is started)."""
    files = tuple(sorted(directory.glob("*.yaml")))
    documents = [doc for path in files for doc in yaml.safe_load_all(path.read_text()) if doc]
    kinds: dict[str, list[dict[str, Any]]] = {}
    for doc in documents:
        kinds.setdefault(str(doc.get("kind")), []).append(doc)
    if [len(kinds.get(kind, [])) for kind in ("ModelGroup", "SLOPolicy", "Service")] != [1, 1, 1]:
        raise DemoError(f"{directory} must hold one ModelGroup, one SLOPolicy and one Service")
    model_group = ModelGroup.model_validate(kinds["ModelGroup"][0])
    policy = SloPolicy.model_validate(kinds["SLOPolicy"][0])
    if model_group.spec.policy_ref is None or model_group.spec.policy_ref.name != policy.metadata.name:
        raise DemoError(
            f"the ModelGroup in {directory} must be bound to its SLOPolicy {policy.metadata.name}"
        )
    chat = policy.spec.classes[0]
    spec = model_group.spec
    tenants = tuple(tenant.name for tenant in policy.spec.fairness.tenants)
    if len(tenants) < 2:
        raise DemoError(
            f"the SLOPolicy in {directory} must name two tenants in spec.fairness.tenants: the demo's "
            "load comes from a steady tenant and one that bursts"
        )
    return DemoObjects(
        files=files,
        model_group=str(model_group.metadata.name),
        service=str(kinds["Service"][0]["metadata"]["name"]),
        policy=str(policy.metadata.name),
        gpus_per_group=spec.parallelism.tensor * spec.parallelism.pipeline,
        min_groups=spec.min_replicas,
        max_groups=spec.max_replicas,
        served_name=spec.model.served_name or spec.model.name,
        targets=SloTargets(chat.name, chat.ttft_seconds, chat.itl_seconds, chat.e2e_seconds, chat.attainment),
        model_name=spec.model.name,
        tenants=(tenants[0], tenants[1]),
    )


class Demo:
    """One run of the demo, a method per phase; whatever must be undone is registered on `cleanup`
    the moment it exists, so an interrupt or a failure at any point undoes exactly that."""

    def __init__(self, args: argparse.Namespace, cleanup: contextlib.ExitStack, say: Progress) -> None:
        self.args = args
        self.cleanup = cleanup
        self.say = say
        self.out: Path = args.out
        self.namespace: str = args.namespace
        self.objects = read_manifests(args.manifests)
        # The other models ride with the gateway: without one, nothing would route a request to them.
        self.other_models: tuple[OtherModel, ...] = (
            () if args.no_gateway else read_other_models(args.manifests)
        )
        self.probe: ModelProbe | None = None
        self.owns_cluster = False
        self.applied_at: datetime | None = None

    # -- phases ------------------------------------------------------------------------------------

    def run(self) -> int:
        args = self.args
        phases = burst_phases(
            args.before_seconds, args.burst_seconds, args.after_seconds, args.rate_multiplier,
            args.burst_rate_multiplier,
        )  # fmt: skip
        workload, plan = self.plan(phases)
        self.out.mkdir(parents=True, exist_ok=True)
        cluster = self.start_cluster()
        self.install(cluster)
        operator = self.start_operator(cluster)
        self.start_emulator(cluster)
        self.apply(cluster, operator)
        gateway = None if args.no_gateway else self.start_gateway(cluster)
        duration = sum(phase.seconds for phase in phases)
        sampler, load, started_wall = self.replay(cluster, gateway, workload, plan, duration)
        report = load.report
        if report is None:
            raise DemoError(f"the load generator failed: {load.error!r}")
        end_seconds = self.settle(sampler)
        sampler.stop()
        self.write_report(
            cluster, sampler=sampler, load=load, report=report, phases=phases, workload=workload,
            end_seconds=end_seconds, started_wall=started_wall,
            gateway=gateway_counts(gateway, self.objects.model_group) if gateway is not None else {},
        )  # fmt: skip
        return 0

    def plan(self, phases: Sequence[Phase]) -> tuple[Workload, list[PlannedRequest]]:
        args = self.args
        total = sum(phase.seconds for phase in phases)
        source = args.trace or str(default_trace())
        if not source.startswith("synthetic") and not Path(source).is_file():
            fallback = SYNTHETIC_FALLBACK.format(
                duration=(args.trace_start_seconds + total) * args.time_compression
            )
            self.say(
                f"trace {source} not found: using a seeded synthetic trace ({fallback}, seed {args.seed})"
            )
            source = fallback
        trace = compress_time(load_trace(source, seed=args.seed), args.time_compression)
        workload = phased_workload(trace, phases, args.seed, start_seconds=args.trace_start_seconds)
        if args.max_output_tokens is not None:
            workload = replace(
                workload,
                notes=(*workload.notes, f"output capped at {args.max_output_tokens} tokens per request"),
            )
        plan = plan_requests(
            workload,
            max_requests=args.max_requests,
            duration_seconds=total,
            max_output_tokens=args.max_output_tokens,
        )
        if not plan:
            raise DemoError(f"the trace {source} offers no request in the first {total:g} s")
        plan = assign_tenants(plan, phases, self.objects.tenants, args.seed)
        shape = ", ".join(f"{p.name} {p.seconds:g} s x{p.rate_multiplier:g}" for p in phases)
        origin = source if source.startswith("synthetic") else Path(source).name
        steady, bursty = self.objects.tenants
        self.say(
            f"load: {len(plan)} requests over {total:g} s from {origin} ({shape}); tenant {steady} "
            f"keeps half the steady rate, {bursty} sends the rest and the whole burst"
        )
        return workload, plan

    def start_cluster(self) -> controlplane.LocalCluster:
        args = self.args
        if args.cluster_state_dir is not None:
            cluster = controlplane.load(args.cluster_state_dir)
            self.require_healthy(cluster)
            self.say(f"cluster: using {cluster.name} in {cluster.state_dir}")
            return cluster
        state_dir = controlplane.default_state_dir(args.name)
        with contextlib.suppress(controlplane.ClusterError, ValueError, KeyError, OSError):
            cluster = controlplane.load(state_dir)
            if all(status.healthy for status in cluster.status()):
                self.say(f"cluster: reusing {cluster.name}, running in {state_dir}")
                return cluster
        self.say(f"cluster: starting {args.name} (the binaries are built on first use, with progress)")
        bin_dir = ensure_binaries()
        if os.geteuid() != 0:
            raise DemoError("starting the cluster needs root (it routes pod IPs into a network namespace)")
        steps: list[str] = []
        spec = controlplane.ClusterSpec(name=args.name, state_dir=state_dir, scrape_interval_seconds=2.0)
        cluster = controlplane.up(spec, bin_dir=bin_dir, progress=steps.append)
        self.owns_cluster = True
        if not args.keep:
            self.cleanup.callback(self.stop_cluster, state_dir)
        self.say(f"cluster: {steps[-1].removeprefix(f'cluster {args.name}: ') if steps else 'up'}")
        return cluster

    def require_healthy(self, cluster: controlplane.LocalCluster) -> None:
        unhealthy = [status.name for status in cluster.status() if not status.healthy]
        if unhealthy:
            raise DemoError(f"cluster {cluster.name} is not healthy: {', '.join(unhealthy)}")
        if cluster.state.netns is None:
            raise DemoError(f"cluster {cluster.name} has no pod network namespace: pods are unreachable")

    def stop_cluster(self, state_dir: Path) -> None:
        self.say(f"teardown: stopping cluster {self.args.name}")
        controlplane.down(state_dir)

    def helm(self, cluster: controlplane.LocalCluster, *args: str) -> str:
        helm = cluster.bin_dir / "helm"
        if not os.access(helm, os.X_OK):
            raise DemoError(f"{helm} is missing: build it with tools/build-binaries.sh")
        command = [str(helm), "--kubeconfig", cluster.kubeconfig, *args]
        result = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
        if result.returncode != 0:
            raise DemoError(f"helm {args[0]} failed: {result.stderr.strip() or result.stdout.strip()}")
        return result.stdout

    def install(self, cluster: controlplane.LocalCluster) -> None:
        args = self.args
        if cluster.api.get(f"/api/v1/namespaces/{self.namespace}") is None:
            cluster.kubectl("create", "namespace", self.namespace)
        _wait_until(
            lambda: cluster.api.get(f"/api/v1/namespaces/{self.namespace}/serviceaccounts/default"),
            timeout_seconds=30,
            what=f"the default ServiceAccount of {self.namespace}",
        )
        release_namespace_existed = (
            cluster.api.get(f"/api/v1/namespaces/{args.release_namespace}") is not None
        )
        extra_env = [
            {"name": "GOODPUT_PROMETHEUS_URL", "value": cluster.prometheus_url},
            {"name": "GOODPUT_PROMETHEUS_TIMEOUT_SECONDS", "value": "2"},
            {"name": "GOODPUT_PROMETHEUS_RATE_WINDOW_SECONDS", "value": "10"},
            {"name": "GOODPUT_AUTOSCALER_STATE_REFRESH_SECONDS", "value": "10"},
        ]
        self.helm(
            cluster, "upgrade", "--install", args.release, str(args.chart),
            "--namespace", args.release_namespace, "--create-namespace", "--take-ownership",
            "--set", f"watchNamespaces[0]={self.namespace}",
            "--set", "controller.reconcileIntervalSeconds=1",
            "--set-json", f"extraEnv={json.dumps(extra_env)}",
        )  # fmt: skip
        if not self.owns_cluster and not args.keep:
            self.cleanup.callback(
                self.uninstall, cluster, delete_release_namespace=not release_namespace_existed
            )
        # Fake nodes run no containers: the operator runs here instead, as the chart configured it.
        cluster.kubectl("scale", "deployment", self.fullname, "-n", args.release_namespace, "--replicas=0")
        self.say(
            f"install: Helm release {args.release} in {args.release_namespace} (CRDs, RBAC, ServiceAccount "
            f"{self.fullname}), watching {self.namespace}"
        )

    @property
    def fullname(self) -> str:
        release: str = self.args.release
        return release if "goodput" in release else f"{release}-goodput"

    def uninstall(self, cluster: controlplane.LocalCluster, *, delete_release_namespace: bool) -> None:
        namespaces = [self.namespace, *([self.args.release_namespace] if delete_release_namespace else [])]
        self.say(f"teardown: uninstalling {self.args.release}, deleting namespace {', '.join(namespaces)}")
        with contextlib.suppress(DemoError, subprocess.SubprocessError):
            self.helm(cluster, "uninstall", self.args.release, "--namespace", self.args.release_namespace)
        cluster.kubectl("delete", "namespace", *namespaces, "--wait=false", check=False)

    def start_operator(self, cluster: controlplane.LocalCluster) -> ChildProcess:
        args = self.args
        deployment = json.loads(
            cluster.kubectl(
                "get", "deployment", self.fullname, "-n", args.release_namespace, "-o", "json"
            ).stdout
        )
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        env = {item["name"]: item["value"] for item in container.get("env", []) if "value" in item}
        liveness_port, metrics_port = free_ports(2)
        env |= {
            # On loopback, not on every address as in the pod.
            "GOODPUT_LIVENESS_ENDPOINT": f"http://127.0.0.1:{liveness_port}/healthz",
            "GOODPUT_METRICS_ADDRESS": "127.0.0.1",
            "GOODPUT_METRICS_PORT": str(metrics_port),
            "POD_ID": f"{self.fullname}-local",
            # What the Deployment takes from the downward API: the Lease lives in its namespace.
            "GOODPUT_LEADER_ELECTION_NAMESPACE": args.release_namespace,
        }
        secrets_dir = Path(tempfile.mkdtemp(prefix="goodput-demo-"))
        self.cleanup.callback(shutil.rmtree, secrets_dir, True)
        kubeconfig = self.service_account_kubeconfig(cluster, secrets_dir / "kubeconfig")
        environment = {k: v for k, v in os.environ.items() if not k.startswith("GOODPUT_")}
        environment |= {**env, "KUBECONFIG": str(kubeconfig)}
        operator = ChildProcess(
            "operator",
            [sys.executable, "-m", "goodput.operator.cli", *container["command"][1:], *container["args"]],
            self.out / "logs" / "operator.log",
            environment,
        )
        operator.start()
        self.cleanup.callback(self.stop_process, operator)
        self.say(
            f"operator: `goodput run` as ServiceAccount {args.release_namespace}/{self.fullname} "
            f"(pid {operator.process.pid if operator.process else '?'}, log {operator.log_path})"
        )
        return operator

    def service_account_kubeconfig(self, cluster: controlplane.LocalCluster, path: Path) -> Path:
        token = cluster.kubectl(
            "create", "token", self.fullname, "-n", self.args.release_namespace, "--duration=2h"
        ).stdout.strip()
        admin = yaml.safe_load(Path(cluster.kubeconfig).read_text())
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "demo", "cluster": admin["clusters"][0]["cluster"]}],
                    "users": [{"name": self.fullname, "user": {"token": token}}],
                    "contexts": [{"name": "operator", "context": {"cluster": "demo", "user": self.fullname}}],
                    "current-context": "operator",
                }
            )
        )
        path.chmod(0o600)
        return path

    def stop_process(self, process: ChildProcess) -> None:
        if process.running():
            self.say(f"teardown: stopping the {process.name}")
        process.stop()

    def start_emulator(self, cluster: controlplane.LocalCluster) -> ChildProcess:
        emulator = ChildProcess(
            "emulator",
            [
                sys.executable, "-m", "goodput.operator.cli", "emulate", "--kubeconfig", cluster.kubeconfig,
                "--namespace", self.namespace, "--netns", cluster.netns,
                "--load-seconds", f"{self.args.engine_load_seconds:g}", "--log-level", "WARNING",
            ],
            self.out / "logs" / "emulator.log",
            {**os.environ, "KUBECONFIG": cluster.kubeconfig},
        )  # fmt: skip
        emulator.start()
        self.cleanup.callback(self.stop_process, emulator)
        self.say(
            f"emulator: vLLM API and metrics at each leader's pod IP in netns {cluster.netns} "
            f"(engine start-up {self.args.engine_load_seconds:g} s)"
        )
        return emulator

    def apply(self, cluster: controlplane.LocalCluster, operator: ChildProcess) -> None:
        paths = (*self.objects.files, *sorted({model.path for model in self.other_models}))
        files = [arg for path in paths for arg in ("-f", str(path))]
        # Objects left by an earlier demo (--keep) start afresh; the operator removes its finalizers.
        cluster.kubectl(
            "delete", "-n", self.namespace, *files, "--ignore-not-found", "--wait=true", "--timeout=90s",
            timeout_seconds=120,
        )  # fmt: skip
        self.applied_at = datetime.now(UTC)
        cluster.kubectl("apply", "-n", self.namespace, "-f", "-", input=yaml.safe_dump_all(self.documents()))
        if not self.owns_cluster and not self.args.keep:
            self.cleanup.callback(self.delete_objects, cluster, files)
        others = "".join(f", ModelGroup {model.model_group}" for model in self.other_models)
        self.say(
            f"apply: SLOPolicy {self.objects.policy}, ModelGroup {self.objects.model_group}, "
            f"Service {self.objects.service}{others} in {self.namespace}"
        )
        if self.args.scaler != "goodput":
            self.apply_baseline(cluster)

        def first_group_ready() -> bool:
            if not operator.running():
                raise DemoError(f"the operator exited; its log ends:\n{operator.log_tail()}")
            model_group = self.model_group(cluster)
            status = (model_group or {}).get("status") or {}
            others_ready = all(
                self.ready_groups(cluster, model.model_group) >= 1 for model in self.other_models
            )
            return bool(status.get("readyGroups", 0) >= 1 and self.endpoints(cluster) and others_ready)

        _wait_until(
            first_group_ready,
            timeout_seconds=self.args.ready_timeout_seconds,
            what=lambda: (
                f"the first ready group of {self.objects.model_group}; operator log:\n{operator.log_tail()}"
            ),
        )
        self.say(f"ready: {self.objects.model_group} serves through Service {self.objects.service}")
        for model in self.other_models:
            self.say(f"ready: {model.model_group} serves {model.served_name}")

    def ready_groups(self, cluster: controlplane.LocalCluster, name: str) -> int:
        found = cluster.api.get(f"{API}/namespaces/{self.namespace}/modelgroups/{name}") or {}
        return int((found.get("status") or {}).get("readyGroups") or 0)

    def documents(self) -> list[dict[str, Any]]:
        """The manifests as applied: with another scaler, goodput's policy only advises (its decisions
        are recorded, `spec.replicas` is left to the HPA)."""
        paths = (*self.objects.files, *sorted({model.path for model in self.other_models}))
        documents = [doc for path in paths for doc in yaml.safe_load_all(path.read_text()) if doc]
        if self.args.scaler != "goodput":
            for doc in documents:
                if doc.get("kind") == "SLOPolicy":
                    doc["spec"].setdefault("autoscaling", {})["mode"] = "Advisory"
        return documents

    def apply_baseline(self, cluster: controlplane.LocalCluster) -> None:
        """KEDA (started on the cluster unless it already serves external metrics) and the scaler's
        ScaledObject from manifests/baselines."""
        if not keda.serving(cluster):
            self.say("keda: starting KEDA's operator and metrics API server")
            keda.start(cluster)
            self.cleanup.callback(keda.stop, cluster)
        objects = self.objects
        scaled_object = keda.render_baseline(
            self.args.scaler, namespace=self.namespace, model_group=objects.model_group,
            served_name=objects.served_name, prometheus_url=cluster.prometheus_url,
            min_groups=objects.min_groups, max_groups=objects.max_groups,
            threshold=self.args.scaler_threshold, directory=self.args.baselines,
        )  # fmt: skip
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(scaled_object))
        name = scaled_object["metadata"]["name"]
        if not self.args.keep:
            self.cleanup.callback(
                cluster.kubectl, "delete", "scaledobject", name, "-n", self.namespace, "--ignore-not-found",
                check=False,
            )  # fmt: skip
        trigger = scaled_object["spec"]["triggers"][0]["metadata"]
        self.say(
            f"keda: ScaledObject {name} sizes {objects.model_group} on {trigger['query']} "
            f"(threshold {trigger['threshold']})"
        )
        # A ScaledObject KEDA refuses, or whose metric the HPA cannot read, would scale nothing: say so
        # now, with KEDA's or the HPA's own words, rather than report a run that never scaled.
        problem: str | None = "KEDA has not answered yet"

        def scaling() -> bool:
            nonlocal problem
            problem = keda.scaling_problem(cluster, self.namespace, name)
            return problem is None

        with contextlib.suppress(DemoError):
            _wait_until(scaling, timeout_seconds=BASELINE_READY_SECONDS, what="KEDA's HPA reading its metric")
        if problem is not None:
            raise DemoError(f"{self.args.scaler}: {problem}")
        self.say(f"keda: the HPA reads its metric ({keda.hpa_name(name)})")

    def start_gateway(self, cluster: controlplane.LocalCluster) -> GatewayProcess:
        """One `goodput gateway` for every ModelGroup of the demo's namespace, here as a process (as the
        operator is); the cluster's Prometheus scrapes it, so the autoscaler reads the gateway's queue
        and outcomes."""
        gateway = GatewayProcess(cluster, self.namespace, "", self.out / "logs" / "gateway.log")
        gateway.log_path.parent.mkdir(parents=True, exist_ok=True)
        gateway.start()
        self.cleanup.callback(gateway.stop)
        try:
            gateway.wait_serving()
        except (RuntimeError, TimeoutError) as error:
            raise DemoError(f"the gateway did not start: {error}") from None
        wanted = [self.objects.served_name, *(model.served_name for model in self.other_models)]

        def serving_all() -> bool:
            return set(wanted) <= set(served_models(gateway))

        _wait_until(serving_all, timeout_seconds=30, what=lambda: f"the gateway serving {', '.join(wanted)}")
        self.say(
            f"gateway: admission, tenant fairness and routing by model at {gateway.url} in front of "
            f"{', '.join(wanted)} (log {gateway.log_path})"
        )
        return gateway

    def delete_objects(self, cluster: controlplane.LocalCluster, files: list[str]) -> None:
        self.say("teardown: deleting the demo's objects")
        cluster.kubectl(
            "delete", "-n", self.namespace, *files, "--ignore-not-found", "--wait=true", "--timeout=60s",
            check=False, timeout_seconds=90,
        )  # fmt: skip

    def model_group(self, cluster: controlplane.LocalCluster) -> dict[str, Any] | None:
        found: dict[str, Any] | None = cluster.api.get(
            f"{API}/namespaces/{self.namespace}/modelgroups/{self.objects.model_group}"
        )
        return found

    def endpoints(self, cluster: controlplane.LocalCluster) -> list[str]:
        listing = cluster.api.get(
            f"/apis/discovery.k8s.io/v1/namespaces/{self.namespace}/endpointslices"
            f"?labelSelector=kubernetes.io/service-name%3D{self.objects.service}"
        )
        return ready_endpoints((listing or {}).get("items") or ())

    def observe(
        self, cluster: controlplane.LocalCluster, started_wall: datetime, offset: float
    ) -> tuple[ModelGroupSample, list[DecisionRecord]]:
        model_group = self.model_group(cluster)
        if model_group is None:
            raise KeyError(self.objects.model_group)
        pods = cluster.api.get(
            f"/api/v1/namespaces/{self.namespace}/pods?labelSelector="
            f"goodput.dev/model-group%3D{self.objects.model_group},goodput.dev/rank%3D0"
        )
        leaders = {
            pod["metadata"]["labels"][LABEL_GROUP]: pod["status"]["podIP"]
            for pod in (pods or {}).get("items", [])
            if (pod.get("status") or {}).get("podIP") and LABEL_GROUP in pod["metadata"].get("labels", {})
        }
        return fleet_sample(model_group, leaders, offset), decision_records(model_group, started_wall)

    def replay(
        self,
        cluster: controlplane.LocalCluster,
        gateway: GatewayProcess | None,
        workload: Workload,
        plan: list[PlannedRequest],
        duration: float,
    ) -> tuple[Sampler, LoadRun, datetime]:
        """Send the plan through the gateway (or to the Service's ready leaders) while sampling the
        ModelGroup; returns when the load generator is done (bounded: its duration plus one request
        timeout)."""
        args = self.args
        if gateway is not None:
            settings = LoadSettings(
                model=self.objects.served_name,
                duration_seconds=duration,
                request_timeout_seconds=args.request_timeout_seconds,
                run_id=f"demo{args.seed}",
            )
            targets = [gateway.url]
        else:

            async def refresh() -> list[str]:
                return await asyncio.to_thread(self.endpoints, cluster)

            settings = LoadSettings(
                model=self.objects.served_name,
                duration_seconds=duration,
                request_timeout_seconds=args.request_timeout_seconds,
                run_id=f"demo{args.seed}",
                refresh_targets=refresh,
                refresh_interval_seconds=1.0,
            )
            targets = self.endpoints(cluster)
        generator = LoadGenerator(TargetPool(targets, TargetPolicy()), settings)
        started_wall = datetime.now(UTC)
        started = time.monotonic()
        limit = duration + args.request_timeout_seconds + args.settle_seconds + 120
        sampler = Sampler(lambda offset: self.observe(cluster, started_wall, offset), started, limit)
        load = LoadRun(generator, plan, workload.notes)
        sampler.start()
        self.cleanup.callback(sampler.stop)
        load.start()
        if gateway is not None and self.other_models:
            self.probe = ModelProbe(gateway.url, self.other_models, tenant=self.objects.tenants[0])
            self.probe.start()
            self.cleanup.callback(self.probe.stop)
        self.say(f"load: started; a line every {args.interval_seconds:g} s")
        next_line = started + args.interval_seconds
        deadline = started + duration + args.request_timeout_seconds + 30
        while not load.finished():
            if time.monotonic() > deadline:
                raise DemoError("the load generator did not finish in time")
            time.sleep(0.2)
            if time.monotonic() >= next_line:
                next_line += args.interval_seconds
                self.say(f"load: {self.describe(sampler.latest(), time.monotonic() - started)}")
        if self.probe is not None:
            self.probe.stop()
        return sampler, load, started_wall

    def describe(self, sample: ModelGroupSample | None, offset: float) -> str:
        if sample is None:
            return f"t={offset:.0f} s, no sample of the ModelGroup yet"
        return (
            f"t={offset:.0f} s desired {sample.desired_groups}, ready {sample.ready_groups}, "
            f"coming {sample.coming_groups}, draining {sample.draining_groups}"
        )

    def settle(self, sampler: Sampler) -> float:
        """Wait until the count is back at the minimum with nothing draining (bounded); the end of the
        observed run, in seconds since the load started."""
        minimum = self.objects.min_groups

        def settled() -> bool:
            latest = sampler.latest()
            return latest is not None and (
                latest.desired_groups == minimum
                and latest.ready_groups == minimum
                and latest.draining_groups == 0
                and latest.coming_groups == 0
            )

        self.say(f"settle: waiting up to {self.args.settle_seconds:g} s for the drains after the burst")
        with contextlib.suppress(DemoError):
            _wait_until(settled, timeout_seconds=self.args.settle_seconds, what="the count to settle")
        end = time.monotonic() - sampler.started
        self.say(f"settle: {self.describe(sampler.latest(), end)}")
        return end

    def write_report(
        self,
        cluster: controlplane.LocalCluster,
        *,
        sampler: Sampler,
        load: LoadRun,
        report: LoadReport,
        phases: Sequence[Phase],
        workload: Workload,
        end_seconds: float,
        started_wall: datetime,
        gateway: GatewayCounts,
    ) -> None:
        objects = self.objects
        requests = request_records(load.plan, load.generator.results)
        samples = sorted(sampler.samples, key=lambda sample: sample.offset_seconds)
        decisions = merge_decisions(sampler.decisions)
        advice: tuple[DecisionRecord, ...] = ()
        if self.args.scaler != "goodput":  # the HPA set the count; goodput's records are advice
            advice, decisions = advice_changes(decisions), count_changes(samples, self.args.scaler)
        histories = group_histories(samples)
        drains = drain_records(self.group_events(cluster, started_wall), histories, requests)
        rows = timeline(
            requests, samples, decisions, objects.targets,
            interval_seconds=self.args.interval_seconds, end_seconds=end_seconds,
        )  # fmt: skip
        summary = summarize(
            requests, samples, decisions, objects.targets, drains=drains, histories=histories,
            gpus_per_group=objects.gpus_per_group, end_seconds=end_seconds, advice=advice,
        )  # fmt: skip
        plots = plot_timeline(
            rows, samples, decisions, objects.targets, title=objects.model_group, out_dir=self.out
        )
        scenario = self.scenario(cluster, phases, workload, started_wall)
        scenario |= {"sampler_failed_reads": sampler.failed_reads, "plots": [path.name for path in plots]}
        scenario["gateway"] = gateway
        others = self.probe.report() if self.probe is not None else {}
        scenario["other_models"] = others
        document = report_dict(
            scenario=scenario, rows=rows, summary=summary, decisions=decisions, histories=histories,
            samples=samples, load=report.as_dict(),
        )  # fmt: skip
        (self.out / "demo.json").write_text(json.dumps(document, indent=2) + "\n")
        screen = "\n\n".join(
            [
                render_timeline(rows, objects.targets),
                render_summary(summary, objects.targets, title=self.title(phases)),
                render_gateway_counts(gateway),
                *([render_other_models(self.other_models, others)] if self.other_models else []),
                self.look_further(cluster, plots),
            ]
        )
        (self.out / "summary.txt").write_text(screen + "\n")
        print(screen, flush=True)

    def group_events(
        self, cluster: controlplane.LocalCluster, started_wall: datetime
    ) -> tuple[GroupEvent, ...]:
        events = (
            cluster.api.get(
                f"/api/v1/namespaces/{self.namespace}/events?fieldSelector="
                f"involvedObject.name%3D{self.objects.model_group}"
            )
            or {}
        ).get("items", [])
        return group_events(events, started_wall, since=self.applied_at)

    def title(self, phases: Sequence[Phase]) -> str:
        objects = self.objects
        title = (
            f"goodput demo: {objects.model_group} ({objects.model_name}, {objects.gpus_per_group} GPU/group)"
        )
        burst = next((phase for phase in phases if phase.name == "burst"), None)
        if burst is not None:
            title += (
                f", burst x{burst.rate_multiplier / phases[0].rate_multiplier:.1f} for {burst.seconds:g} s"
            )
        return title

    def scenario(
        self,
        cluster: controlplane.LocalCluster,
        phases: Sequence[Phase],
        workload: Workload,
        started_wall: datetime,
    ) -> dict[str, Any]:
        objects = self.objects
        return {
            "cluster": cluster.name,
            "namespace": self.namespace,
            "model_group": objects.model_group,
            "policy": objects.policy,
            "targets": {
                "class": objects.targets.class_name,
                "ttft_seconds": objects.targets.ttft_seconds,
                "itl_seconds": objects.targets.itl_seconds,
                "attainment": objects.targets.attainment,
            },
            "tenants": list(objects.tenants),
            "phases": [
                {"name": p.name, "seconds": p.seconds, "rate_multiplier": p.rate_multiplier} for p in phases
            ],
            "interval_seconds": self.args.interval_seconds,
            "workload_notes": list(workload.notes),
            "started_at": started_wall.isoformat(),
        }

    def look_further(self, cluster: controlplane.LocalCluster, plots: Sequence[Path]) -> str:
        files = ", ".join(str(path) for path in (*plots, self.out / "demo.json", self.out / "logs"))
        lines = [f"written: {files}"]
        if self.args.keep:
            lines.append(
                "look further (the cluster and the demo's objects stay; the operator and emulator stop):"
            )
        elif self.owns_cluster:
            lines.append("the demo stops its cluster now; run it with --keep to look further afterwards:")
        else:
            lines.append("the demo removes its objects now; run it with --keep to look further afterwards:")
        env = f"goodput cluster env --name {cluster.name}"
        if self.args.cluster_state_dir is not None:
            env += f" --state-dir {shlex.quote(str(cluster.state_dir))}"
        lines += [
            f'  eval "$({env})"',
            f"  kubectl get mg -n {self.namespace}",
            f"  goodput explain mg/{self.objects.model_group} -n {self.namespace}",
            f"  kubectl describe mg {self.objects.model_group} -n {self.namespace}   # conditions and Events",
        ]
        if self.args.keep and self.owns_cluster:
            lines.append(f"  goodput cluster down --name {cluster.name}   # when done")
        return "\n".join(lines)
