"""The agent's Prometheus metrics, on a registry of its own, served on the agent's port.

Declared in the product's one style (see `goodput.controllers.metric_buckets`, which the agent may not
import): one class, a registry passed in, one `_declare_<concern>` method per concern."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge

from goodput.agent.engine import EngineVerdict
from goodput.agent.gpu import GpuReading, GpuVerdict, Severity
from goodput.agent.nccl import NcclVerdict

SEVERITY_LEVEL = {Severity.HEALTHY: 0, Severity.WARNING: 1, Severity.UNKNOWN: 2, Severity.CRITICAL: 3}


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._declare_gpus(self.registry)
        self._declare_nccl(self.registry)
        self._declare_engine(self.registry)

    def _declare_gpus(self, r: CollectorRegistry) -> None:
        self.gpu_severity = Gauge(
            "goodput_agent_gpu_severity",
            "Worst GPU finding: 0 healthy, 1 warning, 2 unknown, 3 critical.",
            registry=r,
        )
        self.gpus_visible = Gauge(
            "goodput_agent_gpus_visible", "GPUs NVML lists in this container.", registry=r
        )
        self.ecc_uncorrectable = Gauge(
            "goodput_agent_gpu_ecc_uncorrectable_errors",
            "Volatile uncorrectable ECC errors.",
            ["gpu"],
            registry=r,
        )
        self.critical_xids = Gauge(
            "goodput_agent_gpu_critical_xids",
            "Distinct critical XID codes seen since start.",
            ["gpu"],
            registry=r,
        )
        self.throttled = Gauge(
            "goodput_agent_gpu_throttled",
            "1 while thermal or power limits hold the clocks down.",
            ["gpu"],
            registry=r,
        )
        self.nvlinks_down = Gauge("goodput_agent_nvlinks_down", "NVLinks not active.", ["gpu"], registry=r)
        self.nvlink_errors = Gauge(
            "goodput_agent_nvlink_errors",
            "NVLink error counters, summed over links.",
            ["gpu", "kind"],
            registry=r,
        )

    def _declare_nccl(self, r: CollectorRegistry) -> None:
        self.nccl_passed = Gauge(
            "goodput_agent_nccl_check_passed", "1 if the last NCCL check passed.", registry=r
        )
        self.nccl_latency = Gauge(
            "goodput_agent_nccl_latency_seconds", "Tiny all-reduce latency, last check.", registry=r
        )
        self.nccl_busbw = Gauge(
            "goodput_agent_nccl_bus_bandwidth_gb_per_second",
            "All-reduce bus bandwidth, last check.",
            registry=r,
        )

    def _declare_engine(self, r: CollectorRegistry) -> None:
        self.engine_hung = Gauge(
            "goodput_agent_engine_hung", "1 while the engine holds requests without progress.", registry=r
        )

    def record_gpus(self, reading: GpuReading, verdict: GpuVerdict) -> None:
        self.gpu_severity.set(SEVERITY_LEVEL[verdict.severity])
        self.gpus_visible.set(len(reading.devices))
        for device in reading.devices:
            gpu = str(device.index)
            self.ecc_uncorrectable.labels(gpu).set(device.ecc_uncorrectable)
            self.critical_xids.labels(gpu).set(len(device.xids))
            self.throttled.labels(gpu).set(1 if device.throttle_reasons else 0)
            self.nvlinks_down.labels(gpu).set(sum(1 for link in device.nvlinks if not link.active))
            for kind in ("replay_errors", "recovery_errors", "crc_flit_errors"):
                self.nvlink_errors.labels(gpu, kind).set(sum(getattr(link, kind) for link in device.nvlinks))

    def record_nccl(self, verdict: NcclVerdict) -> None:
        self.nccl_passed.set(1 if verdict.healthy else 0)
        if verdict.latency_seconds is not None:
            self.nccl_latency.set(verdict.latency_seconds)
        if verdict.busbw_gb_per_s is not None:
            self.nccl_busbw.set(verdict.busbw_gb_per_s)

    def record_engine(self, verdict: EngineVerdict) -> None:
        self.engine_hung.set(1 if verdict.hung else 0)
