"""The chaos run on a live stage: a GPU pool, two ModelGroups, the operator (behind which a proxy
stands in front of Prometheus), the live emulator, streaming load; then five loops at once, each
bounded by the run's duration: operator kills, infrastructure faults, stimuli (scale, rollout), the
invariant checker (once a second) and the load. At the end: a settle check, the stream accounting
and the report.

`run_chaos(cluster, namespace, settings, out_dir)` is what `make chaos` (through `__main__`) and
`e2e/test_chaos.py` call; it returns the report as a dict and writes it to `out_dir/report.json`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from goodput.api.times import parse_rfc3339
from goodput.controllers import naming
from goodput.testbed.chaos import faults, manifests
from goodput.testbed.chaos.faults import FaultRecord, Stage
from goodput.testbed.chaos.invariants import (
    Accounting,
    CheckerState,
    DecisionView,
    DrainCount,
    LeaderSpan,
    ModelGroupView,
    Observation,
    PodView,
    StreamView,
    Violation,
    account_streams,
    attribute,
    check,
    drain_counts,
)
from goodput.testbed.chaos.promproxy import PrometheusProxy
from goodput.testbed.chaos.schedule import ChaosPlan, ChaosSettings, plan_run
from goodput.testbed.cluster.controlplane import LocalCluster
from goodput.testbed.loadgen import (
    LoadGenerator,
    LoadReport,
    LoadSettings,
    TargetPolicy,
    TargetPool,
    ready_endpoints,
)
from goodput.testbed.operator_process import EmulatorProcess, OperatorProcess

log = logging.getLogger(__name__)

API = "/apis/goodput.dev/v1alpha1"
CHECK_INTERVAL_SECONDS = 1.0
LOAD_TAIL_SECONDS = 40.0
"""Load stops this long before the end, so the last streams end inside the run."""
REQUEST_TIMEOUT_SECONDS = 60.0
SETTLE_SECONDS = 150.0
POOL_NODES = 3


# --- observing -----------------------------------------------------------------------------------


def _decision(record: dict[str, Any]) -> DecisionView | None:
    at = parse_rfc3339(record.get("time"))
    if at is None:
        return None
    return DecisionView(
        time=at.timestamp(),
        from_replicas=int(record.get("fromReplicas", 0)),
        to_replicas=int(record.get("toReplicas", 0)),
        reason=str(record.get("reason", "")),
        guards=tuple(record.get("guards") or ()),
        applied=record.get("mode") == "Active" and not record.get("shadow", False),
    )


def _pod_view(pod: dict[str, Any]) -> PodView:
    meta = pod["metadata"]
    return PodView(
        name=meta["name"],
        group=meta["labels"].get(naming.LABEL_GROUP, "?"),
        rank=int(meta["labels"].get(naming.LABEL_RANK, "-1")),
        deleting=bool(meta.get("deletionTimestamp")),
        draining=naming.ANNOTATION_DRAINING_SINCE in (meta.get("annotations") or {}),
        ip=(pod.get("status") or {}).get("podIP"),
    )


def _model_group_view(
    body: dict[str, Any], pods: list[dict[str, Any]], rescales: list[dict[str, Any]]
) -> ModelGroupView:
    spec, status = body["spec"], body.get("status") or {}
    parallelism = spec.get("parallelism") or {}
    per_group = max(
        1, parallelism.get("tensor", 1) * parallelism.get("pipeline", 1) // parallelism.get("gpusPerPod", 1)
    )
    records = [status["lastDecision"]] if status.get("lastDecision") else []
    decisions = tuple(d for d in (_decision(r) for r in [*records, *(status.get("decisions") or ())]) if d)
    name = body["metadata"]["name"]
    events = []
    for event in rescales:
        at = parse_rfc3339(event.get("lastTimestamp") or event.get("eventTime"))
        target = _rescale_target(event.get("message", ""))
        if event["involvedObject"]["name"] == name and at is not None and target is not None:
            events.append((at.timestamp(), target))
    return ModelGroupView(
        name=name,
        replicas=int(spec.get("replicas", 0)),
        pods_per_group=per_group,
        max_surge=int((spec.get("rollout") or {}).get("maxSurge", 1)),
        autoscaled=bool(spec.get("policyRef")),
        pods=tuple(
            _pod_view(p) for p in pods if p["metadata"]["labels"].get(naming.LABEL_MODEL_GROUP) == name
        ),
        group_states={g["name"]: g["state"] for g in status.get("groups") or ()},
        decisions=decisions,
        rescale_event_targets=tuple(events),
    )


def _rescale_target(message: str) -> int | None:
    """The new size in a SuccessfulRescale message ('New size: 3; reason: ...', HPA's wording)."""
    marker = "New size: "
    if marker not in message:
        return None
    words = message.split(marker, 1)[1].split()
    return int(words[0]) if words and words[0].isdigit() else None


def observe(stage: Stage) -> tuple[Observation, dict[str, dict[str, Any]], list[dict[str, Any]]] | None:
    """The ModelGroups and their pods at one instant, or None while the API server does not answer."""
    at = time.time()
    groups = stage.get(f"{API}/namespaces/{stage.namespace}/modelgroups")
    pods = stage.get(f"/api/v1/namespaces/{stage.namespace}/pods?labelSelector={naming.LABEL_MODEL_GROUP}")
    events = stage.get(
        f"/api/v1/namespaces/{stage.namespace}/events?fieldSelector=reason%3DSuccessfulRescale"
    )
    if groups is None or pods is None or events is None:
        return None
    bodies = {
        g["metadata"]["name"]: g for g in groups["items"] if g["metadata"]["name"] in stage.model_groups
    }
    views = tuple(_model_group_view(b, pods["items"], events["items"]) for b in bodies.values())
    return Observation(at, views), bodies, pods["items"]


@dataclass
class Checker:
    """The invariant loop's memory: checks made, violations, drains and leaders seen."""

    stage: Stage
    state: CheckerState = field(default_factory=CheckerState)
    checks: int = 0
    observations: int = 0
    missed: int = 0
    violations: list[Violation] = field(default_factory=list)
    drains: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    leaders: dict[tuple[str, str, str], list[float]] = field(default_factory=dict)
    last_status: dict[str, dict[str, Any]] = field(default_factory=dict)
    stopped: threading.Event = field(default_factory=threading.Event)

    def once(self) -> None:
        seen = observe(self.stage)
        if seen is None:
            self.missed += 1
            return
        observation, bodies, pods = seen
        result = check(observation, self.state, metrics_faults=tuple(self.stage.metrics_windows))
        self.state, self.checks, self.observations = (
            result.state,
            self.checks + result.checks,
            self.observations + 1,
        )
        for violation in result.violations:
            log.warning("VIOLATION %s %s: %s", violation.rule, violation.model_group, violation.evidence)
        self.violations.extend(result.violations)
        self._remember(observation.at, bodies, pods)

    def _remember(self, at: float, bodies: dict[str, dict[str, Any]], pods: list[dict[str, Any]]) -> None:
        for name, body in bodies.items():
            status = body.get("status") or {}
            self.last_status[name] = status
            for record in (status.get("drain") or {}).get("recent") or ():
                self.drains[(name, record["group"], record["startedAt"])] = record
        for pod in pods:
            labels, ip = pod["metadata"]["labels"], (pod.get("status") or {}).get("podIP")
            if labels.get(naming.LABEL_RANK) == "0" and ip:
                key = (ip, labels[naming.LABEL_MODEL_GROUP], labels[naming.LABEL_GROUP])
                span = self.leaders.setdefault(key, [at, at])
                span[1] = at

    def run(self, until: float) -> None:
        while not self.stopped.is_set() and time.monotonic() < until:
            started = time.monotonic()
            try:
                self.once()
            except Exception as error:  # one bad read must not end the checking
                log.exception("an invariant check failed to run: %r", error)
                self.missed += 1
            self.stopped.wait(max(0.0, CHECK_INTERVAL_SECONDS - (time.monotonic() - started)))

    def leader_spans(self) -> list[LeaderSpan]:
        return [LeaderSpan(ip, mg, group, span[0], span[1]) for (ip, mg, group), span in self.leaders.items()]

    def drain_counts(self) -> list[DrainCount]:
        return drain_counts(self.last_status, self.drains, manifests.DRAIN_MAX_SECONDS)


# --- acting --------------------------------------------------------------------------------------


def _patch_model_group(
    stage: Stage, name: str, patch: dict[str, Any], deadline_seconds: float = 20.0
) -> bool:
    """Retried while the API server restarts; whether it landed."""
    deadline = time.monotonic() + deadline_seconds
    while time.monotonic() < deadline:
        try:
            stage.cluster.api.patch(f"{API}/namespaces/{stage.namespace}/modelgroups/{name}", patch)
            return True
        except Exception as error:
            log.info("patching %s failed, retrying: %r", name, error)
            time.sleep(1)
    return False


def _sleep_until(start: float, offset_seconds: float, stopped: threading.Event) -> bool:
    """Wait until `offset_seconds` after `start` (monotonic); False if stopped first."""
    return not stopped.wait(max(0.0, start + offset_seconds - time.monotonic()))


def kill_loop(
    stage: Stage, plan: ChaosPlan, start: float, records: list[FaultRecord], stopped: threading.Event
) -> None:
    for position, kill in enumerate(plan.kills):
        if not _sleep_until(start, kill.at_seconds, stopped):
            return
        following = (
            plan.kills[position + 1].at_seconds if position + 1 < len(plan.kills) else kill.at_seconds + 10
        )
        wait_seconds = min(10.0, start + following - 1.0 - kill.hold_seconds - time.monotonic())
        record = FaultRecord(
            kill.kind.value, kill.at_seconds, moment=kill.moment.value if kill.moment else ""
        )
        faults.kill_operator(stage, kill, record, wait_seconds)
        records.append(record)
        log.info(
            "kill %d/%d aimed at %s landed on %s", position + 1, len(plan.kills), record.moment, record.landed
        )


def fault_loop(
    stage: Stage, plan: ChaosPlan, start: float, records: list[FaultRecord], stopped: threading.Event
) -> None:
    for fault in plan.faults:
        if not _sleep_until(start, fault.at_seconds, stopped):
            return
        record = FaultRecord(fault.kind.value, fault.at_seconds)
        try:
            faults.inject(stage, fault, record)
        except Exception as error:
            record.skipped = f"the injector failed: {error!r}"
            log.exception("fault %s failed", fault.kind)
        records.append(record)
        log.info("fault %s %s %s", fault.kind.value, record.target, record.skipped or record.detail)


def stimulus_loop(
    stage: Stage, plan: ChaosPlan, start: float, done: list[dict[str, Any]], stopped: threading.Event
) -> None:
    rollouts = 0
    for stimulus in plan.stimuli:
        if not _sleep_until(start, stimulus.at_seconds, stopped):
            return
        if stimulus.action == "scale":
            landed = _patch_model_group(stage, manifests.MANUAL, {"spec": {"replicas": stimulus.replicas}})
        else:
            rollouts += 1
            env = [{"name": "CHAOS_ROLLOUT", "value": str(rollouts)}]
            landed = _patch_model_group(stage, manifests.MANUAL, {"spec": {"engine": {"env": env}}})
        done.append(
            {
                "at": stimulus.at_seconds,
                "action": stimulus.action,
                "replicas": stimulus.replicas,
                "landed": landed,
            }
        )


@dataclass
class Load:
    """One ModelGroup's streaming load, in a thread of its own."""

    name: str
    generator: LoadGenerator
    thread: threading.Thread
    report: list[LoadReport] = field(default_factory=list)


def start_load(stage: Stage, name: str, plan: list[Any], seconds: float) -> Load:
    path = (
        f"/apis/discovery.k8s.io/v1/namespaces/{stage.namespace}/endpointslices"
        f"?labelSelector=kubernetes.io/service-name%3D{name}"
    )

    async def refresh() -> list[str]:
        answer = await asyncio.to_thread(stage.cluster.api.get, path)
        return ready_endpoints((answer or {}).get("items", []))

    settings = LoadSettings(
        duration_seconds=seconds,
        request_timeout_seconds=REQUEST_TIMEOUT_SECONDS,
        run_id=f"{stage.namespace}-{name}",
        refresh_targets=refresh,
        refresh_interval_seconds=1.0,
    )
    first = ready_endpoints((stage.get(path) or {}).get("items", []))
    generator = LoadGenerator(TargetPool(first, TargetPolicy()), settings)
    load = Load(name, generator, threading.Thread(daemon=True, name=f"load-{name}", target=lambda: None))
    load.thread = threading.Thread(
        daemon=True, name=f"load-{name}", target=lambda: load.report.append(asyncio.run(generator.run(plan)))
    )
    load.thread.start()
    return load


# --- the stage -----------------------------------------------------------------------------------


def operator_environment(proxy_url: str) -> dict[str, str]:
    """The operator reads Prometheus through the proxy, gives up on a query after 2 s, and rates
    over 8 s (the e2e stories' settings)."""
    return {
        "GOODPUT_PROMETHEUS_URL": proxy_url,
        "GOODPUT_PROMETHEUS_TIMEOUT_SECONDS": "2",
        "GOODPUT_PROMETHEUS_RATE_WINDOW_SECONDS": "8",
        "GOODPUT_AUTOSCALER_STATE_REFRESH_SECONDS": "10",
    }


@contextlib.contextmanager
def live_stage(cluster: LocalCluster, namespace: str, seed: int, out_dir: Path) -> Iterator[Stage]:
    """A GPU pool of the run's own, the emulator, the proxy and the operator, the two ModelGroups and
    their Services; on exit every fault is undone, the ModelGroups deleted while the operator runs,
    and everything started here stopped."""
    nodes = []
    proxy = PrometheusProxy(cluster.prometheus_url).start()
    emulator = EmulatorProcess(cluster, namespace, out_dir / "emulator.log", load_seconds=2.0)
    operator = OperatorProcess(
        cluster, namespace, out_dir / "operator.log", environment=operator_environment(proxy.url)
    )
    stage = Stage(
        cluster, namespace, (manifests.MANUAL, manifests.AUTOSCALED), (), operator, proxy, random.Random(seed)
    )
    try:
        for index in range(POOL_NODES):
            node = cluster.add_gpu_node(
                f"{namespace}-n{index}",
                zone=f"{namespace}-z{index % 2}",
                clique=f"{namespace}-c{index}",
                labels={manifests.POOL_LABEL: namespace},
            )
            nodes.append(node.name)
        stage.nodes = tuple(nodes)
        emulator.start()
        operator.start()
        documents = [
            manifests.slo_policy(namespace),
            manifests.manual_model_group(namespace),
            manifests.autoscaled_model_group(namespace),
            manifests.leaders_service(manifests.MANUAL, namespace),
            manifests.leaders_service(manifests.AUTOSCALED, namespace),
        ]
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(documents))
        yield stage
    finally:
        _tear_down(stage, emulator, proxy, nodes)


def _tear_down(stage: Stage, emulator: EmulatorProcess, proxy: PrometheusProxy, nodes: list[str]) -> None:
    with contextlib.suppress(Exception):
        faults.undo_all(stage)
    operator = stage.operator
    if operator.process is None or operator.process.poll() is not None:
        operator.start()
    operator.__exit__()
    emulator.stop()
    proxy.close()
    for node in nodes:
        with contextlib.suppress(Exception):
            stage.cluster.remove_node(node)


def _settled(stage: Stage) -> str:
    """Empty when every ModelGroup has as many Ready groups as it wants and nothing else; else why not."""
    why = []
    for name in stage.model_groups:
        body = stage.get(f"{API}/namespaces/{stage.namespace}/modelgroups/{name}")
        if body is None:
            return "the API server does not answer"
        status = body.get("status") or {}
        wanted = int(body["spec"]["replicas"])
        states = sorted(g["state"] for g in status.get("groups") or ())
        if states != ["Ready"] * wanted:
            why.append(f"{name}: {wanted} wanted, groups {states}")
    if not why:
        leftover = [
            p["metadata"]["name"]
            for p in stage.pods()
            if naming.ANNOTATION_DRAINING_SINCE in (p["metadata"].get("annotations") or {})
        ]
        if leftover:
            why.append(f"pods still marked draining: {leftover}")
    return "; ".join(why)


def wait_settled(stage: Stage, timeout_seconds: float) -> tuple[bool, float, str]:
    """(settled, seconds it took, the last reason it was not)."""
    started = time.monotonic()
    reason = "not checked"
    while time.monotonic() - started < timeout_seconds:
        reason = _settled(stage)
        if not reason:
            return True, time.monotonic() - started, ""
        time.sleep(2)
    return False, time.monotonic() - started, reason


# --- the run -------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What the loops left behind, for the report."""

    plan: ChaosPlan
    kills: list[FaultRecord] = field(default_factory=list)
    faults: list[FaultRecord] = field(default_factory=list)
    stimuli: list[dict[str, Any]] = field(default_factory=list)
    loads: list[Load] = field(default_factory=list)
    settled: tuple[bool, float, str] = (False, 0.0, "not reached")
    started_wall: float = 0.0
    wall_offset: float = 0.0
    """time.time() - time.monotonic(): the load generator's loop times to unix seconds."""


def wait_serving(stage: Stage, timeout_seconds: float = 180.0) -> None:
    settled, _, reason = wait_settled(stage, timeout_seconds)
    if not settled:
        raise RuntimeError(
            f"the stage did not come up within {timeout_seconds:g} s: {reason}\n{stage.operator.log_tail(25)}"
        )


def run_loops(stage: Stage, outcome: Outcome, checker: Checker) -> None:
    plan = outcome.plan
    seconds = plan.settings.duration_seconds
    start = time.monotonic()
    outcome.started_wall = time.time()
    outcome.wall_offset = time.time() - time.monotonic()
    load_seconds = seconds - LOAD_TAIL_SECONDS
    outcome.loads = [
        start_load(
            stage, manifests.MANUAL, manifests.manual_load(plan.settings.seed, load_seconds), load_seconds
        ),
        start_load(
            stage,
            manifests.AUTOSCALED,
            manifests.autoscaled_load(plan.settings.seed, load_seconds),
            load_seconds,
        ),
    ]
    stopped = threading.Event()
    loops = [
        threading.Thread(target=kill_loop, args=(stage, plan, start, outcome.kills, stopped), daemon=True),
        threading.Thread(target=fault_loop, args=(stage, plan, start, outcome.faults, stopped), daemon=True),
        threading.Thread(
            target=stimulus_loop, args=(stage, plan, start, outcome.stimuli, stopped), daemon=True
        ),
    ]
    watcher = threading.Thread(target=checker.run, args=(start + seconds + SETTLE_SECONDS + 60,), daemon=True)
    for thread in (*loops, watcher):
        thread.start()
    try:
        for thread in loops:
            thread.join(timeout=max(1.0, start + seconds + 120 - time.monotonic()))
        for load in outcome.loads:
            load.thread.join(
                timeout=max(1.0, start + seconds + REQUEST_TIMEOUT_SECONDS + 30 - time.monotonic())
            )
        outcome.settled = wait_settled(stage, SETTLE_SECONDS)
    finally:
        stopped.set()
        checker.stopped.set()
        watcher.join(timeout=10)
    checker.once()  # the final state, checked too


def streams_of(outcome: Outcome) -> list[StreamView]:
    streams = []
    for load in outcome.loads:
        for result in load.generator.results:
            sent = result.sent_at + outcome.wall_offset
            ended = sent + (result.e2e_seconds if result.e2e_seconds is not None else REQUEST_TIMEOUT_SECONDS)
            host = result.target.split("//", 1)[-1].rsplit(":", 1)[0]
            streams.append(StreamView(host, sent, ended, result.outcome))
    return streams


def run_chaos(
    cluster: LocalCluster, namespace: str, settings: ChaosSettings, out_dir: Path
) -> dict[str, Any]:
    """The whole run against `cluster` in `namespace` (created by the caller, with the CRDs applied);
    the report, also written to `out_dir/report.json`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    plan = plan_run(settings)
    (out_dir / "plan.json").write_text(json.dumps(_plan_dict(plan), indent=1))
    outcome = Outcome(plan)
    with live_stage(cluster, namespace, settings.seed, out_dir) as stage:
        wait_serving(stage)
        checker = Checker(stage)
        run_loops(stage, outcome, checker)
        streams, spans, counts = streams_of(outcome), checker.leader_spans(), checker.drain_counts()
        accounting, stream_violations = account_streams(streams, spans, stage.marks, counts)
        report = build_report(stage, outcome, checker, accounting, stream_violations)
        report["failed_streams"] = failed_streams(streams, spans, stage, counts, outcome.started_wall)
    (out_dir / "report.json").write_text(json.dumps(report, indent=1, default=str))
    return report


def failed_streams(
    streams: list[StreamView], spans: list[LeaderSpan], stage: Stage, counts: list[DrainCount], start: float
) -> list[dict[str, Any]]:
    """Every stream that did not end well: where it went, when, and what the accounting blamed."""
    rows = []
    for stream in streams:
        owner, cause = attribute(stream, tuple(spans), tuple(stage.marks), tuple(counts))
        if cause == "ok":
            continue
        rows.append(
            {
                "group": f"{owner.model_group}/{owner.group}" if owner else f"? ({stream.target_ip})",
                "outcome": stream.outcome,
                "sent_at_seconds": round(stream.sent_at - start, 1),
                "ended_at_seconds": round(stream.ended_at - start, 1),
                "cause": cause,
            }
        )
    return rows


def _plan_dict(plan: ChaosPlan) -> dict[str, Any]:
    return {
        "seed": plan.settings.seed,
        "duration_seconds": plan.settings.duration_seconds,
        "counts": plan.count_by_kind(),
        "kills": [(k.at_seconds, k.moment.value if k.moment else "", k.hold_seconds) for k in plan.kills],
        "faults": [(f.at_seconds, f.kind.value, f.hold_seconds) for f in plan.faults],
        "stimuli": [(s.at_seconds, s.action, s.replicas) for s in plan.stimuli],
    }


def _by(values: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return dict(sorted(counts.items()))


def _load_summary(outcome: Outcome) -> dict[str, Any]:
    keep = ("planned", "sent", "outcomes", "not_sent")
    return {
        load.name: (
            {k: v for k, v in load.report[0].as_dict().items() if k in keep}
            if load.report
            else "the load did not finish"
        )
        for load in outcome.loads
    }


def _violation_rows(violations: list[Violation], start: float) -> list[dict[str, Any]]:
    return [
        {
            "rule": v.rule,
            "model_group": v.model_group,
            "at_seconds": round(v.at - start, 1) if v.at else None,
            "evidence": v.evidence,
        }
        for v in violations
    ]


def build_report(
    stage: Stage,
    outcome: Outcome,
    checker: Checker,
    accounting: tuple[Accounting, ...],
    stream_violations: tuple[Violation, ...],
) -> dict[str, Any]:
    records = [*outcome.kills, *outcome.faults]
    violations = [*checker.violations, *stream_violations]
    log_text = stage.operator.log_path.read_text(errors="replace") if stage.operator.log_path.exists() else ""
    settled, settle_seconds, settle_reason = outcome.settled
    return {
        "seed": outcome.plan.settings.seed,
        "duration_seconds": outcome.plan.settings.duration_seconds,
        "faults_planned": outcome.plan.count_by_kind(),
        "faults_injected": _by([r.kind for r in records if not r.skipped]),
        "faults_skipped": [
            {"kind": r.kind, "at": r.planned_at, "why": r.skipped} for r in records if r.skipped
        ],
        "kills_aimed_at": _by([r.moment for r in outcome.kills]),
        "kills_landed_during": _by([m for r in outcome.kills for m in r.landed]),
        "operator_starts": stage.operator.starts,
        "operator_tracebacks": sum("Traceback" in line for line in log_text.splitlines()),
        "operator_exits_unasked": sum("already exited" in r.detail for r in outcome.kills),
        "fault_log": [r.as_dict() for r in outcome.faults],
        "stimuli": _by([f"{s['action']}{'' if s['landed'] else ' (not landed)'}" for s in outcome.stimuli]),
        "invariant_checks": checker.checks,
        "observations": checker.observations,
        "observations_missed": checker.missed,
        "violations": _violation_rows(violations, outcome.started_wall),
        "streams": [asdict(a) for a in accounting],
        "requests_lost": sum(a.lost for a in accounting),
        "load": _load_summary(outcome),
        "drains": {
            name: (status.get("drain") or {})
            | {"recent": len((status.get("drain") or {}).get("recent") or ())}
            for name, status in checker.last_status.items()
        },
        "drain_records_seen": len(checker.drains),
        "prometheus_proxy_answers": dict(stage.proxy.answered),
        "settled": {"ok": settled, "seconds": round(settle_seconds, 1), "why_not": settle_reason},
        "passed": not violations and settled,
    }
