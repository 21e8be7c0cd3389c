"""The agent process: `python -m goodput.agent` or `goodput-agent`.

Configured from the environment the operator renders (downward API: pod name, namespace; the
group's shape; the leader's address), with flags for what a person may want to change. The first
NCCL check runs at start; its completion is marked by a file the sidecar's startup probe waits for,
so the engine container starts after the check's processes (and their GPU memory) are gone. Then,
every `interval`, a round: GPUs, engine progress (leader only: followers serve no metrics), revision,
publish what changed; a new value of the re-check annotation re-runs the NCCL check. Nothing here
raises out of a round: a failing source is evidence in a condition and a log line.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import threading
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from prometheus_client import start_http_server

from goodput.agent import engine, gpu, nccl, report, revision
from goodput.agent.emulated import EmulatedBackend, faults_from_json
from goodput.agent.metrics import AgentMetrics
from goodput.agent.publish import KubernetesPodApi, PodApi, PodCondition, Publisher
from goodput.api import labels

log = logging.getLogger("goodput.agent")

DEFAULT_RENDEZVOUS_PORT = 29510
DEFAULT_METRICS_PORT = 9410
HTTP_TIMEOUT_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class AgentConfig:
    namespace: str
    pod_name: str
    rank: int
    pods: int
    gpus_per_pod: int
    leader_address: str
    model_revision: str
    rendezvous_port: int = DEFAULT_RENDEZVOUS_PORT
    engine_url: str | None = None
    """Base URL of the engine's HTTP server (the leader's), for /metrics and /v1/models."""
    backend: Literal["nvml", "emulated"] = "nvml"
    collective: Literal["vllm", "tcp"] = "vllm"
    faults_file: Path | None = None
    gpu_product: str | None = None
    interval_seconds: float = 10.0
    nccl_timeout_seconds: float = 180.0
    nccl_bytes: int = nccl.NCCL_CHECK_BYTES
    expected_busbw_gb_per_s: float | None = None
    hang_bound_seconds: float = engine.HANG_BOUND_SECONDS
    metrics_port: int = DEFAULT_METRICS_PORT
    checked_file: Path | None = None
    hf_cache: Path | None = None
    model: str = ""
    nccl_delay_seconds: float = 0.0
    nccl_hang: bool = False


@dataclass
class AgentState:
    samples: list[engine.EngineSample] = field(default_factory=list)
    nccl: PodCondition | None = None
    handled_request: str | None = None
    revision: str | None = None


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        backend: gpu.GpuBackend,
        api: PodApi,
        metrics: AgentMetrics,
        stopped: threading.Event,
    ) -> None:
        self.config = config
        self.backend = backend
        self.metrics = metrics
        self.stopped = stopped
        self.publisher = Publisher(api, stopped=stopped)
        self.state = AgentState()

    def run(self) -> None:
        pod = self.publisher.read_pod()
        self.state.handled_request = _request_value(pod)
        self.check_nccl()
        if self.config.checked_file is not None:
            self.config.checked_file.parent.mkdir(parents=True, exist_ok=True)
            self.config.checked_file.write_text(self.state.nccl.reason if self.state.nccl else "")
        while not self.stopped.is_set():
            try:
                self.round()
            except Exception:  # a source failing in a way not foreseen: log it, keep the agent up
                log.exception("agent round failed; retrying in %gs", self.config.interval_seconds)
            self.stopped.wait(self.config.interval_seconds)

    def check_nccl(self) -> None:
        c = self.config
        unseen = gpu.unseen_allocation(self._read_gpus(), self._allocation())
        if unseen is not None:
            self._record_nccl(nccl.not_run(unseen.message))
            return
        specs = nccl.local_ranks(
            kind=c.collective,
            leader_host=c.leader_address,
            port=c.rendezvous_port,
            pod_rank=c.rank,
            pods=c.pods,
            gpus_per_pod=c.gpus_per_pod,
            rendezvous_timeout_seconds=c.nccl_timeout_seconds,
        )
        specs = tuple(replace(spec, delay_seconds=c.nccl_delay_seconds, hang=c.nccl_hang) for spec in specs)
        expectation = nccl.expectation_for(c.pods)
        if c.expected_busbw_gb_per_s is not None:
            expectation = nccl.NcclExpectation(c.expected_busbw_gb_per_s, f"{expectation.path} (configured)")
        log.info(
            "NCCL check: %d local rank(s) of %d, leader %s:%d",
            len(specs),
            c.pods * c.gpus_per_pod,
            c.leader_address,
            c.rendezvous_port,
        )
        outcome = nccl.run_check(specs, c.nccl_timeout_seconds, size_bytes=c.nccl_bytes)
        self._record_nccl(nccl.evaluate(outcome, expectation))

    def _record_nccl(self, verdict: nccl.NcclVerdict) -> None:
        level = logging.INFO if verdict.healthy else logging.ERROR if verdict.ran else logging.WARNING
        log.log(
            level,
            "NCCL check: %s: %s",
            verdict.reason,
            verdict.message,
        )
        self.metrics.record_nccl(verdict)
        self.state.nccl = report.nccl_condition(verdict)

    def round(self) -> None:
        conditions = [self._gpu_condition()]
        if self.state.nccl is not None:
            conditions.append(self.state.nccl)
        if self.config.rank == 0 and self.config.engine_url:
            conditions.append(self._engine_condition())
        revision_value = self._revision()
        annotations = {labels.ANNOTATION_MODEL_REVISION: revision_value} if revision_value else {}
        pod = self.publisher.publish(conditions, annotations, datetime.now(UTC))
        requested = _request_value(pod)
        if requested is not None and requested != self.state.handled_request:
            log.info("NCCL re-check requested (%s=%s)", labels.ANNOTATION_NCCL_CHECK_REQUEST, requested)
            self.state.handled_request = requested
            self.check_nccl()
            self.publisher.publish([self.state.nccl] if self.state.nccl else [], {}, datetime.now(UTC))

    def _allocation(self) -> gpu.Allocation:
        return gpu.Allocation(self.config.gpus_per_pod, self.config.gpu_product)

    def _read_gpus(self) -> gpu.GpuReading:
        if isinstance(self.backend, EmulatedBackend) and self.config.faults_file is not None:
            self._reload_faults(self.backend, self.config.faults_file)
        return self.backend.read()

    def _gpu_condition(self) -> PodCondition:
        reading = self._read_gpus()
        verdict = gpu.evaluate(reading, self._allocation())
        self.metrics.record_gpus(reading, verdict)
        if verdict.severity is not gpu.Severity.HEALTHY:
            log.warning("GPUs: %s: %s", verdict.reason, verdict.message)
        return report.gpu_condition(verdict)

    def _reload_faults(self, backend: EmulatedBackend, path: Path) -> None:
        try:
            text = path.read_text() if path.exists() else "{}"
            backend.set_faults(faults_from_json(json.loads(text or "{}")))
        except (OSError, ValueError) as error:
            log.error("emulated faults file %s: %s", path, error)

    def _engine_condition(self) -> PodCondition:
        now = time.monotonic()
        try:
            text = _http_get(f"{self.config.engine_url}/metrics")
            self.state.samples.append(engine.parse_sample(text, now))
        except (OSError, ValueError) as error:
            log.warning("engine metrics: %s", error)
        self.state.samples = engine.keep_window(self.state.samples, now, self.config.hang_bound_seconds)
        verdict = engine.judge(self.state.samples, self.config.hang_bound_seconds)
        self.metrics.record_engine(verdict)
        return report.engine_condition(verdict)

    def _revision(self) -> str | None:
        paths: list[str] = []
        if self.config.engine_url:
            try:
                paths += revision.served_roots(json.loads(_http_get(f"{self.config.engine_url}/v1/models")))
            except (OSError, ValueError) as error:
                log.debug("served model metadata: %s", error)
        refs: dict[str, str] = {}
        if self.config.hf_cache is not None and self.config.model:
            paths_from_cache, refs = _cache_evidence(
                self.config.hf_cache, self.config.model, self.config.model_revision
            )
            paths += paths_from_cache
        found = revision.loaded_revision(tuple(paths), self.config.model_revision, refs)
        if found != self.state.revision:
            log.info("loaded model revision: %s", found or "no evidence yet")
            self.state.revision = found
        return found


def _request_value(pod: Mapping[str, Any] | None) -> str | None:
    if pod is None:
        return None
    return ((pod.get("metadata") or {}).get("annotations") or {}).get(labels.ANNOTATION_NCCL_CHECK_REQUEST)


def _http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_SECONDS) as response:
        body: bytes = response.read()
    return body.decode()


def _cache_evidence(cache: Path, model: str, wanted: str) -> tuple[list[str], dict[str, str]]:
    """Snapshot paths and refs of one model in a Hugging Face hub cache (`models--org--name`)."""
    folder = cache / f"models--{model.replace('/', '--')}"
    refs: dict[str, str] = {}
    if (folder / "refs").is_dir():
        for ref in (folder / "refs").iterdir():
            if ref.is_file():
                refs[ref.name] = ref.read_text().strip()
    commit = refs.get(wanted, wanted)
    snapshot = folder / "snapshots" / commit
    return ([f"{snapshot}/"] if snapshot.is_dir() else []), refs


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name) or default


def parse_args(argv: Sequence[str] | None = None) -> AgentConfig:
    """Flags, each defaulting to the environment variable the operator renders; a missing or
    malformed value exits with the flag and the variable named."""
    p = _parser()
    args = p.parse_args(argv)
    _check_required(p, args)
    return AgentConfig(**vars(args))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="goodput-agent", description=__doc__.splitlines()[0])
    p.add_argument("--namespace", default=_env("GOODPUT_POD_NAMESPACE"), help="env GOODPUT_POD_NAMESPACE")
    p.add_argument("--pod-name", default=_env("GOODPUT_POD_NAME"), help="env GOODPUT_POD_NAME")
    p.add_argument("--rank", type=int, default=_env("GOODPUT_RANK"), help="env GOODPUT_RANK")
    p.add_argument("--pods", type=int, default=_env("GOODPUT_GROUP_SIZE"), help="env GOODPUT_GROUP_SIZE")
    p.add_argument(
        "--gpus-per-pod", type=int, default=_env("GOODPUT_GPUS_PER_POD"), help="env GOODPUT_GPUS_PER_POD"
    )
    p.add_argument(
        "--leader-address", default=_env("GOODPUT_LEADER_ADDRESS"), help="env GOODPUT_LEADER_ADDRESS"
    )
    p.add_argument("--model", default=_env("GOODPUT_MODEL", ""), help="env GOODPUT_MODEL")
    p.add_argument(
        "--model-revision", default=_env("GOODPUT_MODEL_REVISION"), help="env GOODPUT_MODEL_REVISION"
    )
    p.add_argument("--engine-url", default=_env("GOODPUT_ENGINE_URL"), help="env GOODPUT_ENGINE_URL")
    p.add_argument(
        "--rendezvous-port",
        type=int,
        default=_env("GOODPUT_AGENT_RENDEZVOUS_PORT", str(DEFAULT_RENDEZVOUS_PORT)),
    )
    p.add_argument(
        "--metrics-port", type=int, default=_env("GOODPUT_AGENT_METRICS_PORT", str(DEFAULT_METRICS_PORT))
    )
    p.add_argument("--backend", choices=("nvml", "emulated"), default=_env("GOODPUT_AGENT_BACKEND", "nvml"))
    p.add_argument("--collective", choices=("vllm", "tcp"), default=_env("GOODPUT_AGENT_COLLECTIVE", "vllm"))
    p.add_argument("--faults-file", type=Path, default=_env("GOODPUT_AGENT_FAULTS_FILE"))
    p.add_argument(
        "--gpu-product", default=_env("GOODPUT_GPU_PRODUCT"), help="the node's nvidia.com/gpu.product"
    )
    p.add_argument("--interval-seconds", type=float, default=10.0)
    p.add_argument("--nccl-timeout-seconds", type=float, default=180.0)
    p.add_argument("--nccl-bytes", type=int, default=nccl.NCCL_CHECK_BYTES)
    p.add_argument("--expected-busbw-gb-per-s", type=float, default=None)
    p.add_argument("--hang-bound-seconds", type=float, default=engine.HANG_BOUND_SECONDS)
    p.add_argument("--checked-file", type=Path, default=_env("GOODPUT_AGENT_CHECKED_FILE"))
    p.add_argument("--hf-cache", type=Path, default=_env("HF_HUB_CACHE"))
    p.add_argument("--nccl-delay-seconds", type=float, default=0.0, help="emulated collective: a slow link")
    p.add_argument("--nccl-hang", action="store_true", help="emulated collective: a hung rank")
    return p


def _check_required(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The identity the operator renders must be there and whole: exits naming the flag and variable."""
    required = {
        "namespace": "GOODPUT_POD_NAMESPACE",
        "pod_name": "GOODPUT_POD_NAME",
        "rank": "GOODPUT_RANK",
        "pods": "GOODPUT_GROUP_SIZE",
        "gpus_per_pod": "GOODPUT_GPUS_PER_POD",
        "leader_address": "GOODPUT_LEADER_ADDRESS",
        "model_revision": "GOODPUT_MODEL_REVISION",
    }
    for name, variable in required.items():
        if getattr(args, name) is None:
            p.error(f"--{name.replace('_', '-')} (or ${variable}) is required")
    for name in ("rank", "pods", "gpus_per_pod"):
        try:
            setattr(args, name, int(getattr(args, name)))
        except ValueError:
            p.error(f"--{name.replace('_', '-')}: {getattr(args, name)!r} is not an integer")
    if args.pods < 1 or args.gpus_per_pod < 1 or not 0 <= args.rank < args.pods:
        p.error(f"--rank {args.rank} must lie in [0, --pods {args.pods}) and --gpus-per-pod must be positive")


def make_backend(config: AgentConfig) -> gpu.GpuBackend:
    if config.backend == "emulated":
        return EmulatedBackend(config.gpus_per_pod, product=config.gpu_product or "NVIDIA H100 80GB HBM3")
    from goodput.agent.nvml import NvmlBackend

    return NvmlBackend()


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    config = parse_args(argv)
    stopped = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopped.set())
    metrics = AgentMetrics()
    start_http_server(config.metrics_port, registry=metrics.registry)
    backend = make_backend(config)
    try:
        agent = Agent(config, backend, KubernetesPodApi(config.namespace, config.pod_name), metrics, stopped)
        agent.run()
    finally:
        backend.close()
