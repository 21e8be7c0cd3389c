"""What NVIDIA's DCGM exporter would publish for an emulated rank's GPUs: `DCGM_FI_DEV_GPU_UTIL`.

The GPU-utilisation autoscaler that platform teams run (an HPA through KEDA's Prometheus trigger on
the DCGM exporter) needs this series per GPU. DCGM reports, per GPU, the percentage of the last
sample period in which a kernel ran; under tensor parallelism every GPU of a rank computes each step,
so each reports the engine's busy share. Here the sample period is the time since the previous read
(at least `SAMPLE_SECONDS`, as the exporter's collection interval bounds it from below), from the
emulated engine's computed seconds. Labels follow the exporter's (`gpu`, `UUID`, `device`,
`modelName`); Prometheus's scrape adds the pod's namespace, pod and node, as the exporter's
pod mapping does.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
SAMPLE_SECONDS = 1.0


def gpu_uuid(rank_name: str, index: int) -> str:
    """A stable GPU-<uuid> per rank and index, shaped like NVML's."""
    digest = hashlib.sha256(f"{rank_name}/{index}".encode()).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


class GpuUtilisationCollector(Collector):
    """`DCGM_FI_DEV_GPU_UTIL` (0-100) for each of a rank's GPUs, from `busy() -> (now, busy seconds)`."""

    def __init__(
        self, busy: Callable[[], tuple[float, float]], *, gpus: int, product: str, rank_name: str
    ) -> None:
        self._busy = busy
        self._gpus = gpus
        self._product = product
        self._rank_name = rank_name
        self._lock = threading.Lock()
        self._previous = busy()
        self._utilisation_percent = 0.0

    def utilisation_percent(self) -> float:
        """The busy share since the previous sample, once a sample period has passed."""
        now, busy_seconds = self._busy()
        with self._lock:
            then, busy_then = self._previous
            if now - then >= SAMPLE_SECONDS:
                share = (busy_seconds - busy_then) / (now - then)
                self._utilisation_percent = round(100.0 * min(1.0, max(0.0, share)))
                self._previous = (now, busy_seconds)
            return self._utilisation_percent

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            GPU_UTIL, "GPU utilization (in %).", labels=["gpu", "UUID", "device", "modelName"]
        )
        value = self.utilisation_percent()
        for index in range(self._gpus):
            labels = [str(index), gpu_uuid(self._rank_name, index), f"nvidia{index}", self._product]
            family.add_metric(labels, value)
        yield family
