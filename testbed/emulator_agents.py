"""The real health agent beside every emulated rank: one `goodput.agent` process per running pod.

With `goodput emulate --agent-processes` the emulator publishes nothing on the agent's behalf.
Each running pod gets the agent process its sidecar would run, with the emulated GPU backend and the
TCP collective in place of NVML and NCCL: it joins its group's rendezvous, runs the all-reduce and
judges it, reads its GPUs every round, watches the leader's engine metrics, finds the revision the
engine loaded, and writes its pod's conditions and annotation through the API server itself. The
emulator only turns the pod's test annotations into what the agent reads:

- `sim.goodput.dev/gpu-faults` into the agent's faults file, which it re-reads every round;
- `sim.goodput.dev/fault` when the agent starts: `nccl-hang` a rank that joins and never sends,
  `nccl-slow` a rank that waits before each send (a link far below its expected bandwidth);
- the model and `--revision` into a Hugging Face cache snapshot with a ref, the evidence the agent
  looks for (the emulated engine loads no weights).

The agents run in the host's network namespace, next to the API server they write to, so each
group's rendezvous gets its own loopback port and each agent its own metrics port. The TCP
collective over loopback is far slower than NVLink, so the bandwidth the agents expect is set to
what loopback gives; a slow link then falls below the agent's floor as a degraded NVLink would.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from goodput.testbed.cluster.controlplane import free_port
from goodput.testbed.emulator import FAULT_NCCL_HANG, FAULT_NCCL_SLOW, EmulatedPod

log = logging.getLogger(__name__)

STOP_GRACE_SECONDS = 3.0
RESTART_BACKOFF_SECONDS = 5.0
DEFAULT_NCCL_TIMEOUT_SECONDS = 30.0
LOG_TAIL_BYTES = 2000


@dataclass(frozen=True, slots=True)
class AgentProcessSettings:
    kubeconfig: str
    """The agents' credentials (a real sidecar uses its projected token instead)."""
    root: Path
    """Where each pod's faults file, revision evidence and agent log live."""
    interval_seconds: float = 1.0
    nccl_timeout_seconds: float = DEFAULT_NCCL_TIMEOUT_SECONDS
    nccl_bytes: int = 2**20
    expected_busbw_gb_per_s: float = 0.1
    """What a healthy all-reduce of `nccl_bytes` over loopback reaches with room to spare; the
    agent fails a check below a quarter of it."""
    slow_link_delay_seconds: float = 0.2
    hang_bound_seconds: float = 30.0


@dataclass(frozen=True, slots=True)
class AgentPorts:
    rendezvous: int
    """The group's, shared by its ranks."""
    metrics: int


def revision_commit(model: str, revision: str) -> str:
    """The snapshot commit the emulated download resolved `revision` to (stable per model and name)."""
    return hashlib.sha1(f"{model}@{revision}".encode()).hexdigest()


def write_revision_evidence(cache: Path, model: str, revision: str) -> None:
    """A Hugging Face hub cache holding one snapshot of `model` and the ref `revision` naming it."""
    folder = cache / f"models--{model.replace('/', '--')}"
    commit = revision_commit(model, revision)
    (folder / "snapshots" / commit).mkdir(parents=True, exist_ok=True)
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / revision).write_text(commit)


def agent_command(
    pod: EmulatedPod, ports: AgentPorts, settings: AgentProcessSettings, folder: Path
) -> list[str]:
    """The agent's command line for this pod, as the operator's sidecar would start it, with the
    emulated backend, the TCP collective and the pod's NCCL fault."""
    command = [
        sys.executable, "-m", "goodput.agent",
        "--namespace", pod.namespace, "--pod-name", pod.name,
        "--rank", str(pod.rank), "--pods", str(pod.pods_per_group), "--gpus-per-pod", str(max(1, pod.gpus)),
        "--leader-address", "127.0.0.1", "--rendezvous-port", str(ports.rendezvous),
        "--metrics-port", str(ports.metrics),
        "--model", pod.vllm.model, "--model-revision", pod.vllm.revision, "--hf-cache", str(folder / "hf"),
        "--backend", "emulated", "--collective", "tcp", "--faults-file", str(folder / "faults.json"),
        "--interval-seconds", f"{settings.interval_seconds:g}",
        "--nccl-timeout-seconds", f"{settings.nccl_timeout_seconds:g}",
        "--nccl-bytes", str(settings.nccl_bytes),
        "--expected-busbw-gb-per-s", f"{settings.expected_busbw_gb_per_s:g}",
        "--hang-bound-seconds", f"{settings.hang_bound_seconds:g}",
    ]  # fmt: skip
    if pod.leader and pod.pod_ip:
        command += ["--engine-url", f"http://{pod.pod_ip}:{pod.vllm.port}"]
    if pod.fault == FAULT_NCCL_HANG:
        command.append("--nccl-hang")
    elif pod.fault == FAULT_NCCL_SLOW:
        command += ["--nccl-delay-seconds", f"{settings.slow_link_delay_seconds:g}"]
    return command


@dataclass(slots=True)
class _Running:
    pod_uid: str
    group: tuple[str, str, str]
    metrics_port: int
    process: subprocess.Popen[bytes]
    folder: Path
    started_at: float
    faults: str | None = None


class AgentProcesses:
    """Starts, feeds and stops the agent processes; called from the emulator's reconcile loop, so
    nothing here blocks: a stopped agent gets SIGTERM now and SIGKILL at a later pass (`reap`)."""

    def __init__(self, settings: AgentProcessSettings) -> None:
        self._settings = settings
        self._running: dict[tuple[str, str], _Running] = {}
        self._group_ports: dict[tuple[str, str, str], int] = {}
        self._stopping: list[tuple[subprocess.Popen[bytes], float]] = []

    def sync(self, pod: EmulatedPod) -> None:
        """The pod's agent runs while the pod runs (restarted, like a sidecar, if it exits)."""
        running = self._running.get(pod.key)
        if running is not None and running.pod_uid != pod.uid:
            self.stop(pod.key)  # a new pod under the same name
            running = None
        if pod.deleting or not pod.running or pod.started_at is None:
            if running is not None:
                self.stop(pod.key)
            return
        if running is not None and running.process.poll() is not None:
            if time.monotonic() - running.started_at < RESTART_BACKOFF_SECONDS:
                return
            log.warning("%s/%s: agent exited with %s; restarting it:\n%s", *pod.key,
                        running.process.returncode, _tail(running.folder / "agent.log"))  # fmt: skip
            running = None
        if running is None:
            running = self._start(pod)
        self._write_faults(running, pod.gpu_faults)

    def _start(self, pod: EmulatedPod) -> _Running:
        folder = self._settings.root / pod.namespace / f"{pod.name}-{pod.uid[:8]}"
        folder.mkdir(parents=True, exist_ok=True)
        write_revision_evidence(folder / "hf", pod.vllm.model, pod.vllm.revision)
        # The pod's faults are there before the agent's first read: a pod created with them (its
        # template's annotation) is checked with them, as a GPU is as it is when its pod starts.
        (folder / "faults.json").write_text(pod.gpu_faults or "{}")
        group = (pod.namespace, pod.model_group, pod.group)
        if group not in self._group_ports:
            self._group_ports[group] = self._unused_port()
        ports = AgentPorts(self._group_ports[group], self._unused_port())
        environment = {**os.environ, "KUBECONFIG": self._settings.kubeconfig}
        with (folder / "agent.log").open("ab") as output:
            process = subprocess.Popen(
                agent_command(pod, ports, self._settings, folder),
                stdout=output, stderr=subprocess.STDOUT, env=environment, start_new_session=True,
            )  # fmt: skip
        log.info("%s/%s: health agent started (pid %d, rendezvous 127.0.0.1:%d)", *pod.key, process.pid,
                 ports.rendezvous)  # fmt: skip
        running = _Running(pod.uid, group, ports.metrics, process, folder, time.monotonic(), pod.gpu_faults)
        self._running[pod.key] = running
        return running

    def _unused_port(self) -> int:
        """A free loopback port that no agent has been given: a port handed out is bound only once
        its agent has started, so the kernel may offer it again meanwhile."""
        taken = set(self._group_ports.values()) | {r.metrics_port for r in self._running.values()}
        return next(port for port in iter(free_port, None) if port not in taken)

    def _write_faults(self, running: _Running, faults: str | None) -> None:
        if faults == running.faults:
            return
        path = running.folder / "faults.json"
        staging = path.with_suffix(".tmp")
        staging.write_text(faults or "{}")
        staging.replace(path)  # the agent never reads half a file
        running.faults = faults

    def stop(self, key: tuple[str, str]) -> None:
        """SIGTERM to the agent and its rank processes (their own process group); `reap` sends
        SIGKILL after a grace, since a hung check cannot be interrupted from inside."""
        running = self._running.pop(key, None)
        if running is None:
            return
        if all(other.group != running.group for other in self._running.values()):
            self._group_ports.pop(running.group, None)
        _signal_group(running.process, signal.SIGTERM)
        self._stopping.append((running.process, time.monotonic() + STOP_GRACE_SECONDS))

    def reap(self) -> None:
        """Collects stopped agents; kills those past their grace."""
        still = []
        for process, deadline in self._stopping:
            if process.poll() is not None:
                continue
            if time.monotonic() >= deadline:
                _signal_group(process, signal.SIGKILL)
            still.append((process, deadline))
        self._stopping = still

    def stop_all(self) -> None:
        """At the emulator's exit: every agent stopped and waited for (bounded by the grace)."""
        for key in list(self._running):
            self.stop(key)
        for process, deadline in self._stopping:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(process, signal.SIGKILL)
                process.wait()
        self._stopping = []


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)


def _tail(path: Path) -> str:
    try:
        with path.open("rb") as file:
            file.seek(max(0, path.stat().st_size - LOG_TAIL_BYTES))
            return file.read().decode(errors="replace")
    except OSError as error:
        return f"(no log: {error})"
