"""The chaos run's injectors: each planned fault done to the live stage, and undone after its hold.

Every wait here is bounded. A fault whose target does not show up in time (no group warming for a
rank crash during warm-up) is recorded as skipped with the reason, never silently dropped. Groups a
fault can end streams on are marked (`FaultMark`) so the stream accounting can tell them apart.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from goodput.controllers import naming
from goodput.testbed.chaos.invariants import FaultMark, Window
from goodput.testbed.chaos.promproxy import MISSING_SERIES, PASS, SLOW, PrometheusProxy
from goodput.testbed.chaos.schedule import FaultKind, Moment, PlannedFault
from goodput.testbed.cluster import processes
from goodput.testbed.cluster.config import StatePaths, component_commands, health_urls
from goodput.testbed.cluster.controlplane import LocalCluster
from goodput.testbed.cluster.kube import probe
from goodput.testbed.cluster.topology import NODE_LOST_ANNOTATION
from goodput.testbed.operator_process import OperatorProcess

log = logging.getLogger(__name__)

API = "/apis/goodput.dev/v1alpha1"
ANNOTATION_FAIL = "sim.goodput.dev/fail"
ANNOTATION_EXIT_CODE = "sim.goodput.dev/exit-code"
ANNOTATION_FAULT = "sim.goodput.dev/fault"
TARGET_WAIT_SECONDS = 30.0
COMPONENT_READY_SECONDS = 60.0
POLL_SECONDS = 0.3


@dataclass
class FaultRecord:
    kind: str
    planned_at: float
    started_at: float = 0.0
    ended_at: float = 0.0
    target: str = ""
    moment: str = ""
    landed: tuple[str, ...] = ()
    """For a kill: the moments under way when it landed."""
    skipped: str = ""
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Stage:
    """What the injectors act on."""

    cluster: LocalCluster
    namespace: str
    model_groups: tuple[str, ...]
    nodes: tuple[str, ...]
    operator: OperatorProcess
    proxy: PrometheusProxy
    rng: random.Random
    marks: list[FaultMark] = field(default_factory=list)
    metrics_windows: list[Window] = field(default_factory=list)

    def get(self, path: str) -> Any:
        """An API read that returns None while the API server is unavailable (it may be restarting)."""
        try:
            return self.cluster.api.get(path)
        except Exception as error:
            log.debug("GET %s failed: %r", path, error)
            return None

    def status_groups(self) -> list[tuple[str, dict[str, Any]]]:
        found: list[tuple[str, dict[str, Any]]] = []
        for name in self.model_groups:
            body = self.get(f"{API}/namespaces/{self.namespace}/modelgroups/{name}") or {}
            found.extend((name, group) for group in (body.get("status") or {}).get("groups") or ())
        return found

    def pods(self) -> list[dict[str, Any]]:
        listing = self.get(
            f"/api/v1/namespaces/{self.namespace}/pods?labelSelector={naming.LABEL_MODEL_GROUP}"
        )
        return [p for p in (listing or {}).get("items", []) if not p["metadata"].get("deletionTimestamp")]

    def annotate_pod(self, name: str, annotations: dict[str, str | None]) -> bool:
        try:
            self.cluster.api.patch(
                f"/api/v1/namespaces/{self.namespace}/pods/{name}", {"metadata": {"annotations": annotations}}
            )
            return True
        except Exception as error:
            log.info("annotating pod %s failed: %r", name, error)
            return False


def moments_under_way(stage: Stage) -> set[Moment]:
    """The moments the operator is in the middle of, from the API server (status and pods)."""
    now: set[Moment] = set()
    for _, group in stage.status_groups():
        state = group.get("state")
        if state in ("Placing", "Provisioning"):
            now.add(Moment.SCALE_OUT)
        elif state == "Warming":
            now.add(Moment.READINESS)
        elif state == "Draining":
            now.add(Moment.DRAIN)
        if group.get("outdated"):
            now.add(Moment.ROLLOUT)
    if any(
        naming.ANNOTATION_DRAINING_SINCE in (p["metadata"].get("annotations") or {}) for p in stage.pods()
    ):
        now.add(Moment.DRAIN)
    return now


def kill_operator(stage: Stage, fault: PlannedFault, record: FaultRecord, wait_seconds: float) -> None:
    """SIGKILL the operator once `fault.moment` is under way (or after `wait_seconds` regardless), then
    start it again after the hold."""
    deadline = time.monotonic() + max(0.0, wait_seconds)
    landed: set[Moment] = set()
    while True:
        landed = moments_under_way(stage)
        if fault.moment is Moment.ANY or fault.moment in landed or time.monotonic() >= deadline:
            break
        time.sleep(POLL_SECONDS)
    record.started_at = time.time()
    process = stage.operator.process
    exit_code = process.poll() if process is not None else None
    if exit_code is not None:
        record.detail = f"the operator had already exited by itself (code {exit_code})"
    stage.operator.stop(kill=True)
    record.landed = tuple(sorted(m.value for m in landed)) or ("idle",)
    time.sleep(fault.hold_seconds)
    stage.operator.start()
    record.ended_at = time.time()


def restart_component(stage: Stage, name: str, down_seconds: float, record: FaultRecord) -> None:
    """Stop a control-plane process (SIGTERM, as a restart does), leave it down, start it again on
    the same ports and data, and wait until it answers its health check."""
    cluster = stage.cluster
    paths = StatePaths(cluster.state_dir)
    record.started_at = time.time()
    found = processes.read_records(paths.pids).get(name)
    if found is None or not processes.stop(found, grace_seconds=15):
        record.skipped = f"{name} was not running"
        record.ended_at = time.time()
        return
    time.sleep(down_seconds)
    argv = component_commands(cluster.state.layout)[name]
    processes.spawn(name, argv, log_path=paths.log(name), pid_dir=paths.pids, cwd=paths.root)
    url = health_urls(cluster.state.layout)[name]
    ca_file = paths.cert("ca") if name == "kube-apiserver" else None
    deadline = time.monotonic() + COMPONENT_READY_SECONDS
    healthy = False
    while time.monotonic() < deadline and not healthy:
        healthy = probe(url, ca_file=ca_file)[0]
        if not healthy:
            time.sleep(0.2)
    record.ended_at = time.time()
    record.detail = (
        f"down {down_seconds:.1f} s, healthy again after {record.ended_at - record.started_at:.1f} s"
    )
    if not healthy:
        record.detail += f"; NOT healthy within {COMPONENT_READY_SECONDS:g} s"


def prometheus_fault(stage: Stage, fault: PlannedFault, record: FaultRecord) -> None:
    """Prometheus stopped (the real process), or the proxy in front of it slow or missing series."""
    record.started_at = time.time()
    if fault.kind is FaultKind.PROMETHEUS_STOP:
        restart_component(stage, "prometheus", fault.hold_seconds, record)
        label = "stopped"
    else:
        mode = SLOW if fault.kind is FaultKind.PROMETHEUS_SLOW else MISSING_SERIES
        stage.proxy.set_mode(mode, fault.slow_answer_seconds)
        time.sleep(fault.hold_seconds)
        stage.proxy.set_mode(PASS)
        record.ended_at = time.time()
        label = f"slow ({fault.slow_answer_seconds:.1f} s per answer)" if mode == SLOW else "missing series"
        record.detail = label
    stage.metrics_windows.append(Window(record.started_at, record.ended_at, label))


def _groups_on(stage: Stage, predicate: Callable[[dict[str, Any]], bool]) -> list[tuple[str, str]]:
    return sorted(
        {(mg, group["name"]) for mg, group in stage.status_groups() if predicate(group)},
    )


def _pods_of(stage: Stage, model_group: str, group: str) -> list[dict[str, Any]]:
    return [
        p
        for p in stage.pods()
        if p["metadata"]["labels"].get(naming.LABEL_MODEL_GROUP) == model_group
        and p["metadata"]["labels"].get(naming.LABEL_GROUP) == group
    ]


def _wait_for_group(stage: Stage, states: tuple[str, ...]) -> tuple[str, str] | None:
    deadline = time.monotonic() + TARGET_WAIT_SECONDS
    while time.monotonic() < deadline:
        found = _groups_on(stage, lambda g: g.get("state") in states)
        if found:
            return stage.rng.choice(found)
        time.sleep(POLL_SECONDS)
    return None


def crash_rank(stage: Stage, fault: PlannedFault, record: FaultRecord) -> None:
    """A rank's container crashes (kwok's container-crash stage: CrashLoopBackOff, not Ready) while
    its group warms up or serves; the annotation is taken off after the hold if the pod remains."""
    states = ("Provisioning", "Warming") if fault.kind is FaultKind.RANK_CRASH_WARMING else ("Ready",)
    found = _wait_for_group(stage, states)
    pods = _pods_of(stage, *found) if found else []
    if not found or not pods:
        record.skipped = f"no group {' or '.join(states)} within {TARGET_WAIT_SECONDS:g} s"
        return
    pod = stage.rng.choice(pods)
    name = pod["metadata"]["name"]
    record.started_at = time.time()
    if not stage.annotate_pod(name, {ANNOTATION_FAIL: "container-crash", ANNOTATION_EXIT_CODE: "1"}):
        record.skipped = f"{name} gone before the crash"
        return
    record.target = f"{found[0]}/{name}"
    stage.marks.append(FaultMark(found[0], found[1], record.started_at, fault.kind.value))
    time.sleep(fault.hold_seconds)
    stage.annotate_pod(name, {ANNOTATION_FAIL: None, ANNOTATION_EXIT_CODE: None})
    record.ended_at = time.time()


def hang_engine(stage: Stage, fault: PlannedFault, record: FaultRecord) -> None:
    """A serving group's engine stops producing tokens without dying (health still 200)."""
    found = _wait_for_group(stage, ("Ready",))
    leader = next(
        (
            p
            for p in (_pods_of(stage, *found) if found else [])
            if p["metadata"]["labels"].get(naming.LABEL_RANK) == "0"
        ),
        None,
    )
    if found is None or leader is None:
        record.skipped = f"no Ready group within {TARGET_WAIT_SECONDS:g} s"
        return
    name = leader["metadata"]["name"]
    record.started_at = time.time()
    if not stage.annotate_pod(name, {ANNOTATION_FAULT: "hang"}):
        record.skipped = f"{name} gone before the hang"
        return
    record.target = f"{found[0]}/{name}"
    stage.marks.append(FaultMark(found[0], found[1], record.started_at, fault.kind.value))
    time.sleep(fault.hold_seconds)
    stage.annotate_pod(name, {ANNOTATION_FAULT: None})
    record.ended_at = time.time()


def lose_node(stage: Stage, fault: PlannedFault, record: FaultRecord) -> None:
    """A node of the pool goes silent (its lease expires, the node goes Unknown, its pods not ready);
    the one holding most group pods is chosen, and it comes back after the hold."""
    by_node: dict[str, set[tuple[str, str]]] = {node: set() for node in stage.nodes}
    for pod in stage.pods():
        node = pod["spec"].get("nodeName")
        if node in by_node:
            labels = pod["metadata"]["labels"]
            by_node[node].add((labels[naming.LABEL_MODEL_GROUP], labels[naming.LABEL_GROUP]))
    node = max(stage.nodes, key=lambda n: (len(by_node[n]), stage.rng.random()))
    record.started_at = time.time()
    try:
        stage.cluster.lose_node(node)
    except Exception as error:
        record.skipped = f"losing {node} failed: {error!r}"
        return
    record.target = node
    record.detail = f"groups on it: {sorted(f'{mg}/{g}' for mg, g in by_node[node])}"
    for model_group, group in by_node[node]:
        stage.marks.append(FaultMark(model_group, group, record.started_at, fault.kind.value))
    time.sleep(fault.hold_seconds)
    deadline = time.monotonic() + COMPONENT_READY_SECONDS
    while time.monotonic() < deadline:
        try:
            stage.cluster.restore_node(node)
            break
        except Exception as error:  # the API server may be restarting
            log.info("restoring %s failed, retrying: %r", node, error)
            time.sleep(1)
    record.ended_at = time.time()


def inject(stage: Stage, fault: PlannedFault, record: FaultRecord) -> None:
    """One infrastructure fault, done and undone."""
    if fault.kind is FaultKind.APISERVER_RESTART:
        restart_component(stage, "kube-apiserver", fault.hold_seconds, record)
    elif fault.kind is FaultKind.ETCD_RESTART:
        restart_component(stage, "etcd", fault.hold_seconds, record)
    elif fault.kind in (
        FaultKind.PROMETHEUS_STOP,
        FaultKind.PROMETHEUS_SLOW,
        FaultKind.PROMETHEUS_MISSING_SERIES,
    ):
        prometheus_fault(stage, fault, record)
    elif fault.kind is FaultKind.NODE_LOST:
        lose_node(stage, fault, record)
    elif fault.kind in (FaultKind.RANK_CRASH_WARMING, FaultKind.RANK_CRASH_SERVING):
        crash_rank(stage, fault, record)
    elif fault.kind is FaultKind.ENGINE_HANG:
        hang_engine(stage, fault, record)
    else:
        raise ValueError(f"not an infrastructure fault: {fault.kind}")


def undo_all(stage: Stage) -> None:
    """Best effort at the end: the proxy passing, every node back, no fault annotation left."""
    stage.proxy.set_mode(PASS)
    for node in stage.nodes:
        annotations = ((stage.get(f"/api/v1/nodes/{node}") or {}).get("metadata") or {}).get(
            "annotations"
        ) or {}
        if NODE_LOST_ANNOTATION in annotations:
            with contextlib.suppress(Exception):
                stage.cluster.restore_node(node)
    for pod in stage.pods():
        annotations = pod["metadata"].get("annotations") or {}
        if ANNOTATION_FAIL in annotations or ANNOTATION_FAULT in annotations:
            stage.annotate_pod(pod["metadata"]["name"], {ANNOTATION_FAIL: None, ANNOTATION_FAULT: None})
