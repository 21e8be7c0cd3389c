"""A live vLLM fleet emulator: every goodput leader pod in the cluster served at its own pod IP:port.

It watches the pods labelled `goodput.dev/model-group` and, for each one, does what the pod's
containers would do:
- Leader (rank 0): after the simulated load (`sim.goodput.dev/load-seconds`, counted from the
  container's start) a `VllmServer` listens on the pod IP and the `--port` of its `vllm serve`
  arguments, timed by the engine model for the ModelGroup's profile (`spec.profile`, the model's
  shape from the catalog, vLLM flags in the pod's arguments taking precedence).
- Every rank: what the in-pod health agent would publish (DESIGN §5, §9): the annotation
  `goodput.dev/model-revision` with the `--revision` it loaded, once loaded, and the pod condition
  `goodput.dev/NCCLHealthy` (through the pods/status subresource) `nccl-check-seconds` after that:
  the agent's own verdict (`goodput.agent.nccl.evaluate`) on an emulated all-reduce that measures
  the bandwidth the group's topology should give, or the pod's NCCL fault.
- Deletion: a pod with a deletionTimestamp gets SIGTERM after its preStop sleep: the server drains
  for the pod's `--shutdown-timeout` and aborts the rest (emulator_server). The server outlives
  the pod object if the fake kubelet removes the object earlier than vLLM would exit.
- Every rank: the health agent's GPU check (goodput.agent's emulated backend and its verdict), as
  the pod condition `goodput.dev/GPUHealthy`, once loaded; faults are injected through the
  annotation `sim.goodput.dev/gpu-faults` (the agent's JSON faults, e.g. `{"xids": {"0": [79]}}`).
- With `HealthAgents` (`goodput emulate --agent-processes`, `emulator_agents`), the real agent
  process runs beside every running pod instead and publishes all of the above itself.
- Faults (`sim.goodput.dev/fault`): `engine-death` (leader: /health 503, then the listener closes;
  removing the annotation restarts the engine, which loads again), `hang` (leader: health 200, no
  tokens until the annotation goes), `nccl-failure` (the rank's all-reduce errors), `nccl-hang` (it
  does not finish within the check's bound), `nccl-slow` (a link degraded far below expectation):
  each turns that rank's NCCLHealthy False with the agent's reason.

The decisions are pure (`parse_pod`, `plan_pod`, `serving_profile`); `FleetEmulator` applies them:
a pod watch and a 0.25 s reconcile tick on one event loop, sockets opened in the harness's network
namespace by `ListenerFactory`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import aiohttp
from pydantic import ValidationError

from goodput.agent import report as agent_report
from goodput.agent.emulated import EmulatedBackend, faults_from_json
from goodput.agent.gpu import Allocation
from goodput.agent.gpu import evaluate as evaluate_gpus
from goodput.agent.nccl import NCCL_CHECK_BYTES, CheckOutcome, RankMeasurement, expectation_for
from goodput.agent.nccl import evaluate as evaluate_nccl
from goodput.agent.publish import PodCondition
from goodput.api.modelgroup import ModelGroupSpec
from goodput.api.times import parse_rfc3339
from goodput.controllers import naming
from goodput.controllers.groups.observation import pod_accelerator, pod_gpus
from goodput.controllers.hardware import catalog_model_key, gpu_spec, model_shape
from goodput.estimators.service_time import (
    GPUS,
    H100_80G,
    LLAMA_3_1_8B,
    MODELS,
    GpuSpec,
    StepCostModel,
    default_batch_limits,
)
from goodput.simulator.engine import EngineConfig
from goodput.testbed.emulator_engine import (
    DEFAULT_LORA_LOAD_SECONDS,
    DEFAULT_MAX_MODEL_LEN,
    DEFAULT_STREAM_INTERVAL_SECONDS,
    ServingProfile,
)
from goodput.testbed.emulator_kube import MERGE_PATCH, STRATEGIC_MERGE_PATCH, KubeClient, KubeRequestError
from goodput.testbed.emulator_netns import ListenerFactory
from goodput.testbed.emulator_server import ServerIdentity, ServerState, VllmServer

log = logging.getLogger(__name__)

ANNOTATION_LOAD_SECONDS = "sim.goodput.dev/load-seconds"
ANNOTATION_NCCL_CHECK_SECONDS = "sim.goodput.dev/nccl-check-seconds"
ANNOTATION_FAULT = "sim.goodput.dev/fault"
ANNOTATION_GPU_FAULTS = "sim.goodput.dev/gpu-faults"
FAULT_ENGINE_DEATH = "engine-death"
FAULT_HANG = "hang"
FAULT_NCCL_FAILURE = "nccl-failure"
FAULT_NCCL_HANG = "nccl-hang"
FAULT_NCCL_SLOW = "nccl-slow"
FAULTS = (FAULT_ENGINE_DEATH, FAULT_HANG, FAULT_NCCL_FAILURE, FAULT_NCCL_HANG, FAULT_NCCL_SLOW)
EMULATED_CHECK_TIMEOUT_SECONDS = 120.0
"""The bound the emulated all-reduce is said to have hit under `nccl-hang` (the agent's default)."""
EMULATED_LINK_FRACTION = 0.85
"""Share of the expected bus bandwidth a healthy emulated all-reduce measures."""
DEGRADED_LINK_FRACTION = 0.05
"""Under `nccl-slow`: a link fallen back to TCP or PCIe, far below the agent's floor."""
EMULATED_LATENCY_SECONDS = 20e-6
DEFAULT_LOAD_SECONDS = 3.0
DEFAULT_NCCL_CHECK_SECONDS = 1.0
DEFAULT_PORT = 8000
CONTAINER_NAME = "vllm"
RECONCILE_INTERVAL_SECONDS = 0.25
WATCH_TIMEOUT_SECONDS = 60


# ---------------------------------------------------------------------------------------- pure core
@dataclass(frozen=True, slots=True)
class VllmArgs:
    """The `vllm serve` flags the emulator honours, read from a pod's command and arguments."""

    model: str = ""
    revision: str = "main"
    served_model_name: str | None = None
    port: int = DEFAULT_PORT
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    shutdown_timeout_seconds: float = 0.0
    """vLLM's default is 0: SIGTERM aborts everything at once."""
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    max_num_queued_reqs: int | None = None
    headless: bool = False
    enable_lora: bool = False
    max_loras: int | None = None

    @property
    def served_name(self) -> str:
        return self.served_model_name or self.model


_INT_FLAGS = {
    "--port": "port",
    "--tensor-parallel-size": "tensor_parallel",
    "-tp": "tensor_parallel",
    "--pipeline-parallel-size": "pipeline_parallel",
    "-pp": "pipeline_parallel",
    "--max-num-seqs": "max_num_seqs",
    "--max-num-batched-tokens": "max_num_batched_tokens",
    "--max-model-len": "max_model_len",
    "--max-num-queued-reqs": "max_num_queued_reqs",
    "--max-loras": "max_loras",
}
_TEXT_FLAGS = {"--model": "model", "--revision": "revision", "--served-model-name": "served_model_name"}
_BOOLEAN_FLAGS = {"--headless", "--enable-lora"}


def parse_vllm_args(command: Sequence[str], args: Sequence[str]) -> VllmArgs:
    """Read `vllm serve MODEL --flag value ...` (also `--flag=value`); unknown flags are skipped."""
    tokens = [*command, *args]
    if tokens[:2] == ["vllm", "serve"]:
        tokens = tokens[2:]
    values: dict[str, Any] = {}
    index = 0
    while index < len(tokens):
        token = tokens[index]
        flag, _, inline = token.partition("=")
        if not token.startswith("-"):
            values.setdefault("model", token)
            index += 1
            continue
        if flag in _BOOLEAN_FLAGS:
            values[flag.removeprefix("--").replace("-", "_")] = True
            index += 1
            continue
        value = inline if inline else (tokens[index + 1] if index + 1 < len(tokens) else "")
        index += 1 if inline else 2
        if flag in _INT_FLAGS:
            with contextlib.suppress(ValueError):
                values[_INT_FLAGS[flag]] = int(value)
        elif flag in _TEXT_FLAGS:
            values[_TEXT_FLAGS[flag]] = value
        elif flag == "--shutdown-timeout":
            with contextlib.suppress(ValueError):
                values["shutdown_timeout_seconds"] = float(value)
        elif not inline and value.startswith("-"):
            index -= 1  # an unknown boolean flag: the next token is a flag of its own
    return VllmArgs(**values)


@dataclass(frozen=True, slots=True)
class EmulatedPod:
    """What the emulator reads from one of goodput's vLLM pods."""

    namespace: str
    name: str
    uid: str
    model_group: str
    group: str
    rank: int
    vllm: VllmArgs
    pod_ip: str | None = None
    running: bool = False
    started_at: float | None = None
    """Unix time the vLLM container started (the load is counted from it)."""
    deleting: bool = False
    pre_stop_sleep_seconds: float = 0.0
    load_seconds: float = DEFAULT_LOAD_SECONDS
    nccl_check_seconds: float = DEFAULT_NCCL_CHECK_SECONDS
    fault: str | None = None
    nccl_status: str | None = None
    reported_revision: str | None = None
    gpus: int = 1
    gpu_faults: str | None = None
    """The `sim.goodput.dev/gpu-faults` annotation: the agent's emulated faults, as JSON."""
    gpu_condition: tuple[str, str] | None = None
    """(status, reason) of the pod's GPUHealthy condition as last seen."""

    @property
    def key(self) -> tuple[str, str]:
        return self.namespace, self.name

    @property
    def leader(self) -> bool:
        return self.rank == 0

    @property
    def world_size(self) -> int:
        """GPUs in the pod's group: vLLM's tensor × pipeline parallelism."""
        return max(1, self.vllm.tensor_parallel * self.vllm.pipeline_parallel)

    @property
    def pods_per_group(self) -> int:
        return max(1, -(-self.world_size // max(1, self.gpus)))


def parse_pod(
    manifest: Mapping[str, Any],
    *,
    default_load_seconds: float = DEFAULT_LOAD_SECONDS,
    default_nccl_check_seconds: float = DEFAULT_NCCL_CHECK_SECONDS,
) -> EmulatedPod | None:
    """The emulator's view of a pod; None for pods without goodput's group labels."""
    metadata = manifest.get("metadata") or {}
    labels = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    spec = manifest.get("spec") or {}
    status = manifest.get("status") or {}
    model_group = labels.get(naming.LABEL_MODEL_GROUP)
    group = labels.get(naming.LABEL_GROUP)
    rank_text = str(labels.get(naming.LABEL_RANK, ""))
    if not model_group or not group or not rank_text.isdigit():
        return None
    containers = spec.get("containers") or [{}]
    container = next((c for c in containers if c.get("name") == CONTAINER_NAME), containers[0])
    conditions = {c.get("type"): c for c in status.get("conditions") or () if isinstance(c, Mapping)}
    nccl = conditions.get(naming.CONDITION_NCCL_HEALTHY) or {}
    gpu = conditions.get(naming.CONDITION_GPU_HEALTHY)
    fault = str(annotations.get(ANNOTATION_FAULT) or "").strip() or None
    return EmulatedPod(
        namespace=str(metadata.get("namespace", "")),
        name=str(metadata.get("name", "")),
        uid=str(metadata.get("uid", "")),
        model_group=str(model_group),
        group=str(group),
        rank=int(rank_text),
        vllm=parse_vllm_args(list(container.get("command") or ()), list(container.get("args") or ())),
        pod_ip=status.get("podIP") or None,
        running=status.get("phase") == "Running",
        started_at=_container_started_at(status, str(container.get("name", ""))),
        deleting=bool(metadata.get("deletionTimestamp")),
        pre_stop_sleep_seconds=_pre_stop_sleep_seconds(container),
        load_seconds=_seconds(annotations.get(ANNOTATION_LOAD_SECONDS), default_load_seconds),
        nccl_check_seconds=_seconds(
            annotations.get(ANNOTATION_NCCL_CHECK_SECONDS), default_nccl_check_seconds
        ),
        fault=fault,
        nccl_status=nccl.get("status"),
        reported_revision=annotations.get(naming.ANNOTATION_MODEL_REVISION),
        gpus=pod_gpus(manifest, pod_accelerator(manifest) or naming.GPU_RESOURCE) or 1,
        gpu_faults=annotations.get(ANNOTATION_GPU_FAULTS),
        gpu_condition=(str(gpu.get("status")), str(gpu.get("reason"))) if gpu else None,
    )


def agent_nccl_condition(pod: EmulatedPod) -> PodCondition:
    """What the health agent in this pod publishes after its all-reduce: an emulated outcome (what
    the group's topology should give, or the pod's NCCL fault) judged by the agent's own rule."""
    world_size = pod.world_size
    expectation = expectation_for(pod.pods_per_group)
    first_rank = pod.rank * max(1, pod.gpus)
    if pod.fault == FAULT_NCCL_FAILURE:
        outcome = CheckOutcome(errors=(f"rank {first_rank}: NCCL error: unhandled system error (emulated)",))
    elif pod.fault == FAULT_NCCL_HANG:
        outcome = CheckOutcome(timed_out_ranks=(first_rank,), timeout_seconds=EMULATED_CHECK_TIMEOUT_SECONDS)
    else:
        fraction = DEGRADED_LINK_FRACTION if pod.fault == FAULT_NCCL_SLOW else EMULATED_LINK_FRACTION
        busbw_bytes_per_second = expectation.busbw_gb_per_s * fraction * 1e9
        moved_bytes = NCCL_CHECK_BYTES * 2 * (world_size - 1) / world_size
        seconds = moved_bytes / busbw_bytes_per_second if world_size > 1 else EMULATED_LATENCY_SECONDS
        measured = RankMeasurement(
            first_rank, EMULATED_LATENCY_SECONDS, seconds, NCCL_CHECK_BYTES, world_size
        )
        outcome = CheckOutcome(measurements=(measured,))
    return agent_report.nccl_condition(evaluate_nccl(outcome, expectation))


@dataclass(frozen=True, slots=True)
class PodPlan:
    """What should be true of one pod now. `wake_at` is the next time the plan changes by itself."""

    serve: bool = False
    """Leader: the listener should be open (loaded, running, not deleted, engine alive)."""
    engine_dead: bool = False
    hung: bool = False
    terminate: bool = False
    report_revision: str | None = None
    """Annotation value to write (None: nothing to write)."""
    report_nccl: PodCondition | None = None
    """Condition to write (None: nothing to write)."""
    report_gpu: PodCondition | None = None
    """GPUHealthy condition to write (None: nothing to write)."""
    wake_at: float | None = None


def plan_pod(
    pod: EmulatedPod, now: float, *, health_agent: bool = True, restarted_at: float | None = None
) -> PodPlan:
    """The pod's wanted state at unix time `now`.

    restarted_at: when the leader's engine was last restarted after a death (its load starts again).
    """
    if pod.deleting:
        return PodPlan(terminate=True)
    if not pod.running or pod.started_at is None:
        return PodPlan()
    load_started = max(pod.started_at, restarted_at or pod.started_at)
    loaded_at = load_started + pod.load_seconds
    loaded = now >= loaded_at
    engine_dead = pod.leader and pod.fault == FAULT_ENGINE_DEATH
    wakes: list[float] = []
    if not loaded:
        wakes.append(loaded_at)
    report_revision = None
    report_nccl = None
    report_gpu = None
    if health_agent and now >= pod.started_at + pod.load_seconds:
        if pod.vllm.revision and pod.reported_revision != pod.vllm.revision:
            report_revision = pod.vllm.revision
        gpu = agent_gpu_condition(pod)
        report_gpu = gpu if pod.gpu_condition != (gpu.status, gpu.reason) else None
        checked_at = pod.started_at + pod.load_seconds + pod.nccl_check_seconds
        if now >= checked_at:
            wanted = agent_nccl_condition(pod)
            if pod.nccl_status != wanted.status:
                report_nccl = wanted
        else:
            wakes.append(checked_at)
    elif health_agent:
        wakes.append(pod.started_at + pod.load_seconds)
    return PodPlan(
        serve=pod.leader and loaded and bool(pod.pod_ip) and not engine_dead,
        engine_dead=engine_dead,
        hung=pod.leader and pod.fault == FAULT_HANG,
        report_revision=report_revision,
        report_nccl=report_nccl,
        report_gpu=report_gpu,
        wake_at=min(wakes) if wakes else None,
    )


def agent_gpu_condition(pod: EmulatedPod) -> PodCondition:
    """What the health agent in this pod publishes about its GPUs: its emulated backend with the
    pod's injected faults, judged by the agent's own rule. Faults that do not parse are reported as
    missing evidence (Unknown), as the agent reports an unreadable NVML."""
    backend = EmulatedBackend(pod.gpus)
    if pod.gpu_faults:
        try:
            backend.set_faults(faults_from_json(json.loads(pod.gpu_faults)))
        except ValueError as error:
            backend.inject(nvml_error=f"emulated faults ({ANNOTATION_GPU_FAULTS}) unreadable: {error}")
    return agent_report.gpu_condition(evaluate_gpus(backend.read(), Allocation(pod.gpus)))


@dataclass(frozen=True, slots=True)
class ProfileDefaults:
    """What the emulator assumes when neither the ModelGroup nor the pod says."""

    gpu: GpuSpec = H100_80G
    stream_interval_seconds: float = DEFAULT_STREAM_INTERVAL_SECONDS
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    step_noise_sigma: float = 0.0
    seed: int = 0
    lora_load_seconds: float = DEFAULT_LORA_LOAD_SECONDS


def serving_profile(spec: ModelGroupSpec | None, vllm: VllmArgs, defaults: ProfileDefaults) -> ServingProfile:
    """The engine a leader runs: the ModelGroup's profile and shape, with the pod's vLLM flags on top."""
    shape = model_shape(spec) if spec is not None else None
    shape = shape or MODELS.get(catalog_model_key(vllm.model)) or LLAMA_3_1_8B
    profile = spec.profile if spec is not None else None
    gpu = gpu_spec(profile) or defaults.gpu
    cost = StepCostModel.from_hardware(shape, gpu, vllm.tensor_parallel, vllm.pipeline_parallel)
    default_seqs, default_tokens = default_batch_limits(gpu)
    seqs = vllm.max_num_seqs or (profile.max_num_seqs if profile is not None else None) or default_seqs
    tokens = (
        vllm.max_num_batched_tokens
        or (profile.max_num_batched_tokens if profile is not None else None)
        or default_tokens
    )
    kv_tokens = (profile.kv_capacity_tokens if profile is not None else None) or cost.kv_capacity_tokens
    engine = EngineConfig(
        cost=cost,
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
        kv_capacity_tokens=kv_tokens,
        step_noise_sigma=defaults.step_noise_sigma,
    )
    return ServingProfile(
        engine=engine,
        model_name=vllm.served_name,
        max_model_len=vllm.max_model_len or defaults.max_model_len,
        stream_interval_seconds=defaults.stream_interval_seconds,
        max_num_queued_requests=vllm.max_num_queued_reqs,
        seed=defaults.seed,
        max_loras=(vllm.max_loras or 1) if vllm.enable_lora else None,  # vLLM's default --max-loras is 1
        lora_load_seconds=defaults.lora_load_seconds,
    )


def gpu_by_name(name: str) -> GpuSpec:
    try:
        return GPUS[name]
    except KeyError:
        raise ValueError(f"unknown GPU {name!r}; known: {', '.join(sorted(GPUS))}") from None


def _seconds(text: object, default: float) -> float:
    try:
        value = float(str(text))
    except (TypeError, ValueError):
        return default
    return value if math.isfinite(value) and value >= 0 else default


def _parse_time(text: object) -> float | None:
    moment = parse_rfc3339(text)
    return None if moment is None else moment.timestamp()


def _container_started_at(status: Mapping[str, Any], container_name: str) -> float | None:
    statuses = status.get("containerStatuses") or []
    chosen = next((s for s in statuses if s.get("name") == container_name), statuses[0] if statuses else None)
    if chosen is not None:
        running = (chosen.get("state") or {}).get("running") or {}
        return _parse_time(running.get("startedAt"))
    return _parse_time(status.get("startTime")) if status.get("phase") == "Running" else None


_SLEEP = re.compile(r"(?:^|\s|;|&)sleep\s+(\d+(?:\.\d+)?)")


def _pre_stop_sleep_seconds(container: Mapping[str, Any]) -> float:
    """The preStop hook's sleep: a `sleep` action, or `sleep N` in an exec command."""
    pre_stop = (container.get("lifecycle") or {}).get("preStop") or {}
    if "sleep" in pre_stop:
        return _seconds((pre_stop.get("sleep") or {}).get("seconds"), 0.0)
    command = " ".join(str(part) for part in (pre_stop.get("exec") or {}).get("command") or ())
    match = _SLEEP.search(command)
    return float(match.group(1)) if match else 0.0


# ---------------------------------------------------------------------------------------- the shell
@dataclass(frozen=True, slots=True)
class EmulatorSettings:
    namespace: str | None = None
    """Watch one namespace only (None: all)."""
    health_agent: bool = True
    default_load_seconds: float = DEFAULT_LOAD_SECONDS
    default_nccl_check_seconds: float = DEFAULT_NCCL_CHECK_SECONDS
    profile: ProfileDefaults = field(default_factory=ProfileDefaults)


class HealthAgents(Protocol):
    """Real health agent processes beside the pods (`emulator_agents.AgentProcesses`): when given,
    they publish the agent's conditions and annotation, and the emulator publishes none."""

    def sync(self, pod: EmulatedPod) -> None: ...

    def stop(self, key: tuple[str, str]) -> None: ...

    def reap(self) -> None: ...

    def stop_all(self) -> None: ...


@dataclass(slots=True)
class _Leader:
    """The emulated vLLM process of one leader pod (mutable, shell-private)."""

    pod: EmulatedPod
    server: VllmServer
    restarted_at: float | None = None
    terminating: asyncio.Task[None] | None = None
    opening: bool = False
    listen_error: str = ""


class FleetEmulator:
    """Keeps one emulated vLLM server per leader pod and the health agent's reports up to date."""

    def __init__(
        self,
        kube: KubeClient,
        listeners: ListenerFactory,
        settings: EmulatorSettings,
        *,
        clock: Callable[[], float] | None = None,
        on_listen: Callable[[str, str, int], None] | None = None,
        agents: HealthAgents | None = None,
    ) -> None:
        self._kube = kube
        self._agents = agents
        self._listeners = listeners
        self._settings = settings
        self._clock = clock or (lambda: datetime.now(UTC).timestamp())
        self._on_listen = on_listen
        self._pods: dict[tuple[str, str], EmulatedPod] = {}
        self._leaders: dict[tuple[str, str], _Leader] = {}
        self._reported: dict[tuple[str, str], tuple[str | None, str | None, tuple[str, str] | None]] = {}
        self._retired: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Event()
        """Set by the watch when a pod changed: the reconcile loop runs at once instead of at its tick."""

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set, then SIGTERM every emulated server and wait for them.

        Only this loop reconciles (the watch just records pods and wakes it), so no two passes over
        one pod ever interleave at an `await`.
        """
        watcher = asyncio.create_task(self._watch(stop))
        try:
            while not stop.is_set():
                self._changed.clear()
                try:
                    wake_at = await self._reconcile_all()
                except (KubeRequestError, aiohttp.ClientError, TimeoutError) as error:
                    log.warning("reconcile pass failed: %r", error)
                    wake_at = None
                pause = RECONCILE_INTERVAL_SECONDS
                if wake_at is not None:  # a load or a health check ends sooner: be on time for it
                    pause = min(pause, max(0.005, wake_at - self._clock()))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), pause)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            await self.shutdown()

    async def shutdown(self) -> None:
        """SIGTERM to every emulated vLLM: each drains for its own --shutdown-timeout."""
        tasks = [
            leader.server.terminate(leader.pod.vllm.shutdown_timeout_seconds)
            for leader in self._leaders.values()
        ]
        tasks += list(self._retired)
        if tasks:
            longest = max(
                (leader.pod.vllm.shutdown_timeout_seconds for leader in self._leaders.values()), default=0
            )
            await asyncio.wait(tasks, timeout=longest + 10)
        self._leaders.clear()
        if self._agents is not None:
            self._agents.stop_all()

    # ------------------------------------------------------------------ watching
    def _pods_path(self) -> str:
        namespace = self._settings.namespace
        return f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"

    async def _list(self) -> str:
        listing = await self._kube.get(self._pods_path(), {"labelSelector": naming.LABEL_MODEL_GROUP})
        listing = listing or {}
        seen: set[tuple[str, str]] = set()
        for item in listing.get("items") or ():
            pod = self._parse(item)
            if pod is not None:
                self._pods[pod.key] = pod
                seen.add(pod.key)
        for key in set(self._pods) - seen:
            self._pod_gone(key)
        return str((listing.get("metadata") or {}).get("resourceVersion", ""))

    async def _watch(self, stop: asyncio.Event) -> None:
        version = ""
        while not stop.is_set():
            try:
                if not version:
                    version = await self._list()
                async for event in self._kube.watch(
                    self._pods_path(),
                    {"labelSelector": naming.LABEL_MODEL_GROUP},
                    version,
                    WATCH_TIMEOUT_SECONDS,
                ):
                    metadata = event.object.get("metadata") or {}
                    version = str(metadata.get("resourceVersion", version))
                    if event.kind == "BOOKMARK":
                        continue
                    key = (str(metadata.get("namespace", "")), str(metadata.get("name", "")))
                    if event.kind == "DELETED":
                        self._pod_gone(key)
                        continue
                    pod = self._parse(event.object)
                    if pod is not None:
                        self._pods[pod.key] = pod
                        self._changed.set()
            except KubeRequestError as error:
                if error.status == 410:
                    version = ""
                    continue
                log.warning("pod watch failed: %s", error)
                await asyncio.sleep(1.0)
            except aiohttp.ClientConnectorError as error:
                log.warning(
                    "cannot reach the API server (%s); inside a network namespace the host's loopback is "
                    "not reachable: run `goodput emulate` in the host namespace with --netns",
                    error,
                )
                await asyncio.sleep(1.0)
            except (aiohttp.ClientError, TimeoutError, ValueError) as error:
                log.warning("pod watch interrupted: %r", error)
                await asyncio.sleep(1.0)

    def _parse(self, manifest: Mapping[str, Any]) -> EmulatedPod | None:
        return parse_pod(
            manifest,
            default_load_seconds=self._settings.default_load_seconds,
            default_nccl_check_seconds=self._settings.default_nccl_check_seconds,
        )

    def _pod_gone(self, key: tuple[str, str]) -> None:
        self._changed.set()
        pod = self._pods.pop(key, None)
        self._reported.pop(key, None)
        if self._agents is not None:
            self._agents.stop(key)
        leader = self._leaders.pop(key, None)
        if leader is not None:
            timeout = pod.vllm.shutdown_timeout_seconds if pod is not None else 0.0
            self._retire(leader.server.terminate(timeout))

    def _retire(self, task: asyncio.Task[None]) -> None:
        self._retired.add(task)
        task.add_done_callback(self._retired.discard)

    # ------------------------------------------------------------------ reconciling
    async def _reconcile_all(self) -> float | None:
        """Reconcile every pod; return the earliest time a plan changes by itself (None: no such time)."""
        if self._agents is not None:
            self._agents.reap()
        wakes = [await self._reconcile(pod) for pod in list(self._pods.values())]
        return min((wake for wake in wakes if wake is not None), default=None)

    async def _reconcile(self, pod: EmulatedPod) -> float | None:
        now = self._clock()
        leader = self._leaders.get(pod.key)
        plan = plan_pod(
            pod,
            now,
            health_agent=self._settings.health_agent and self._agents is None,
            restarted_at=leader.restarted_at if leader is not None else None,
        )
        if self._agents is not None:
            self._agents.sync(pod)
        await self._report(pod, plan)
        if pod.leader:
            await self._reconcile_leader(pod, plan, now)
        return plan.wake_at

    async def _report(self, pod: EmulatedPod, plan: PodPlan) -> None:
        """Publish what the health agent would, once per change (the watch then shows it)."""
        written_revision, written_nccl, written_gpu = self._reported.get(pod.key, (None, None, None))
        # Once the watch shows what was written, forget it: a later change by anyone is reported again.
        if pod.reported_revision == written_revision:
            written_revision = None
        if pod.nccl_status == written_nccl:
            written_nccl = None
        if pod.gpu_condition == written_gpu:
            written_gpu = None
        base = f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}"
        try:
            if plan.report_revision is not None and plan.report_revision != written_revision:
                body = {"metadata": {"annotations": {naming.ANNOTATION_MODEL_REVISION: plan.report_revision}}}
                await self._kube.patch(base, body, MERGE_PATCH)
                written_revision = plan.report_revision
            if plan.report_nccl is not None and plan.report_nccl.status != written_nccl:
                report = plan.report_nccl
                condition = {
                    "type": naming.CONDITION_NCCL_HEALTHY,
                    "status": report.status,
                    "reason": report.reason,
                    "message": report.message,
                    "lastTransitionTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                }
                await self._kube.patch(
                    f"{base}/status", {"status": {"conditions": [condition]}}, STRATEGIC_MERGE_PATCH
                )
                written_nccl = report.status
            gpu = plan.report_gpu
            if gpu is not None and (gpu.status, gpu.reason) != written_gpu:
                condition = {
                    "type": gpu.type,
                    "status": gpu.status,
                    "reason": gpu.reason,
                    "message": gpu.message,
                    "lastTransitionTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                }
                await self._kube.patch(
                    f"{base}/status", {"status": {"conditions": [condition]}}, STRATEGIC_MERGE_PATCH
                )
                written_gpu = (gpu.status, gpu.reason)
        except KubeRequestError as error:
            if error.status != 404:
                log.warning("%s/%s: health report failed: %s", pod.namespace, pod.name, error)
        except (aiohttp.ClientError, TimeoutError) as error:
            log.warning("%s/%s: health report failed: %r", pod.namespace, pod.name, error)
        self._reported[pod.key] = (written_revision, written_nccl, written_gpu)

    async def _reconcile_leader(self, pod: EmulatedPod, plan: PodPlan, now: float) -> None:
        leader = self._leaders.get(pod.key)
        moved = leader is not None and (leader.pod.pod_ip, leader.pod.vllm.port) != (
            pod.pod_ip,
            pod.vllm.port,
        )
        if leader is not None and moved and leader.server.state is not ServerState.LOADING:
            self._retire(leader.server.terminate(0.0))  # a new address: a new process
            self._leaders.pop(pod.key)
            leader = None
        if plan.terminate:
            if leader is not None and leader.terminating is None:
                leader.terminating = asyncio.create_task(self._terminate_after_pre_stop(leader, pod))
            return
        if not pod.running or not pod.pod_ip:
            return
        if leader is None:
            server = await self._new_server(pod)
            leader = _Leader(pod=pod, server=server)
            self._leaders[pod.key] = leader
        leader.pod = pod
        server = leader.server
        if plan.engine_dead:
            if server.state in (ServerState.SERVING, ServerState.LOADING):
                log.info("%s/%s: fault engine-death", pod.namespace, pod.name)
                server.kill_engine()
            return
        if server.state in (ServerState.DEAD, ServerState.STOPPED):
            # the fault is gone: the container restarts and loads again
            log.info("%s/%s: engine restarts and loads for %.1f s", pod.namespace, pod.name, pod.load_seconds)
            leader.server = await self._new_server(pod)
            leader.restarted_at = now
            return
        if plan.serve and server.state is ServerState.LOADING and not leader.opening:
            leader.opening = True
            try:
                sock = await self._listeners.open(pod.pod_ip, pod.vllm.port)
                await server.listen(sock)
                if self._on_listen is not None:
                    self._on_listen(f"{pod.namespace}/{pod.name}", pod.pod_ip, pod.vllm.port)
            except OSError as error:
                if str(error) != leader.listen_error:  # retried every tick; said once per cause
                    log.warning(
                        "%s/%s: cannot listen on %s:%d: %s (is --netns the cluster's pod network namespace?)",
                        pod.namespace,
                        pod.name,
                        pod.pod_ip,
                        pod.vllm.port,
                        error,
                    )
                leader.listen_error = str(error)
            finally:
                leader.opening = False
        if server.state is ServerState.SERVING:
            if plan.hung:
                server.hang()
            else:
                server.resume()

    async def _terminate_after_pre_stop(self, leader: _Leader, pod: EmulatedPod) -> None:
        if pod.pre_stop_sleep_seconds > 0:
            await asyncio.sleep(pod.pre_stop_sleep_seconds)
        await leader.server.terminate(pod.vllm.shutdown_timeout_seconds)

    async def _new_server(self, pod: EmulatedPod) -> VllmServer:
        spec = await self._model_group(pod.namespace, pod.model_group)
        profile = serving_profile(spec, pod.vllm, self._settings.profile)
        identity = ServerIdentity(pod.vllm.model, pod.vllm.served_name, pod.vllm.revision)
        return VllmServer(profile, identity, name=f"{pod.namespace}/{pod.name}", gpus=pod.gpus)

    async def _model_group(self, namespace: str, name: str) -> ModelGroupSpec | None:
        """The ModelGroup's spec as it is now; None when absent or unreadable (pods made by hand)."""
        spec: ModelGroupSpec | None = None
        path = f"/apis/{naming.MODEL_GROUP_API_VERSION}/namespaces/{namespace}/modelgroups/{name}"
        try:
            manifest = await self._kube.get(path)
            if manifest is not None:
                spec = ModelGroupSpec.model_validate(manifest.get("spec") or {})
        except (KubeRequestError, ValidationError, aiohttp.ClientError, TimeoutError) as error:
            log.info(
                "ModelGroup %s/%s unavailable (%s); using the pod's flags and defaults",
                namespace,
                name,
                str(error).splitlines()[0],
            )
        return spec
