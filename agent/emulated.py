"""An emulated GPU backend with injectable faults, for tests and the live emulator's pods.

It answers as NVML would for `gpus` healthy devices of one product; faults are set (and cleared) on
it while the agent runs, the way a real GPU would start failing under a running agent.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace

from goodput.agent.gpu import DeviceReading, GpuReading, NvLinkReading


@dataclass(frozen=True, slots=True)
class Faults:
    """What is wrong with the emulated GPUs, by GPU index."""

    xids: dict[int, tuple[int, ...]] = field(default_factory=dict)
    ecc_uncorrectable: dict[int, int] = field(default_factory=dict)
    remap_pending: frozenset[int] = frozenset()
    dead_nvlinks: dict[int, tuple[int, ...]] = field(default_factory=dict)
    throttled: dict[int, tuple[str, ...]] = field(default_factory=dict)
    missing: frozenset[int] = frozenset()
    """GPUs that disappeared: not listed at all (NVML's count drops)."""
    lost: frozenset[int] = frozenset()
    """GPUs still listed that no longer answer (NVML's GPU_IS_LOST)."""
    nvml_error: str | None = None
    """NVML itself cannot be loaded or read."""
    node_gpus_shown: int = 0
    """Not a fault of the GPUs: the runtime shows the container this many more GPUs of the node than
    the pod was given (the NVIDIA toolkit honouring NVIDIA_VISIBLE_DEVICES=all in a container that
    requested none)."""


class EmulatedBackend:
    def __init__(self, gpus: int, product: str = "NVIDIA H100 80GB HBM3", nvlinks: int = 18) -> None:
        self._gpus = gpus
        self._product = product
        self._nvlinks = nvlinks
        self._faults = Faults()
        self._lock = threading.Lock()

    def set_faults(self, faults: Faults) -> None:
        with self._lock:
            self._faults = faults

    def inject(self, **faults: object) -> None:
        """Adds faults, e.g. `inject(xids={1: (79,)})`; fields not named keep their value."""
        with self._lock:
            self._faults = replace(self._faults, **faults)  # type: ignore[arg-type]

    def clear(self) -> None:
        with self._lock:
            self._faults = Faults()

    def read(self) -> GpuReading:
        with self._lock:
            faults = self._faults
        if faults.nvml_error is not None:
            return GpuReading(nvml_error=faults.nvml_error)
        shown = range(self._gpus + faults.node_gpus_shown)
        return GpuReading(
            devices=tuple(self._device(index, faults) for index in shown if index not in faults.missing)
        )

    def _device(self, index: int, faults: Faults) -> DeviceReading:
        if index in faults.lost:
            return DeviceReading(index=index, error="NVMLError_GpuIsLost: GPU is lost")
        dead = set(faults.dead_nvlinks.get(index, ()))
        return DeviceReading(
            index=index,
            product=self._product,
            xids=faults.xids.get(index, ()),
            ecc_uncorrectable=faults.ecc_uncorrectable.get(index, 0),
            remap_pending=index in faults.remap_pending,
            nvlinks=tuple(NvLinkReading(link, link not in dead) for link in range(self._nvlinks)),
            throttle_reasons=faults.throttled.get(index, ()),
        )

    def close(self) -> None:
        return None


def _gpu_map(raw: object, field_name: str) -> dict[int, object]:
    if not isinstance(raw, dict):
        raise ValueError(f"{field_name}: expected an object keyed by GPU index")
    try:
        return {int(key): value for key, value in raw.items()}
    except ValueError as error:
        raise ValueError(f"{field_name}: keys must be GPU indexes ({error})") from error


def _int_tuple(value: object, field_name: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(item, int) for item in value):
        raise ValueError(f"{field_name}: expected a list of integers")
    return tuple(value)


def faults_from_json(data: object) -> Faults:
    """Faults from a JSON object (the live emulator writes one per pod), e.g.
    `{"xids": {"1": [79]}, "throttled": {"0": ["HwThermalSlowdown"]}, "missing": [3]}`.
    Raises ValueError naming the field that does not parse."""
    if not isinstance(data, dict):
        raise ValueError("faults: expected a JSON object")
    known = set(Faults.__dataclass_fields__)
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"faults: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    fields: dict[str, object] = {}
    for name in ("xids", "dead_nvlinks"):
        if name in data:
            fields[name] = {
                gpu: _int_tuple(v, f"{name}.{gpu}") for gpu, v in _gpu_map(data[name], name).items()
            }
    if "ecc_uncorrectable" in data:
        ecc = _gpu_map(data["ecc_uncorrectable"], "ecc_uncorrectable")
        if not all(isinstance(v, int) for v in ecc.values()):
            raise ValueError("ecc_uncorrectable: expected integer counts")
        fields["ecc_uncorrectable"] = ecc
    if "throttled" in data:
        throttled = _gpu_map(data["throttled"], "throttled")
        if not all(isinstance(v, list) and all(isinstance(x, str) for x in v) for v in throttled.values()):
            raise ValueError("throttled: expected lists of reason names")
        fields["throttled"] = {gpu: tuple(v) for gpu, v in throttled.items()}  # type: ignore[arg-type]
    for name in ("remap_pending", "missing", "lost"):
        if name in data:
            fields[name] = frozenset(_int_tuple(data[name], name))
    if "node_gpus_shown" in data:
        shown = data["node_gpus_shown"]
        if not isinstance(shown, int) or isinstance(shown, bool) or shown < 0:
            raise ValueError("node_gpus_shown: expected a count of GPUs, 0 or more")
        fields["node_gpus_shown"] = shown
    if "nvml_error" in data:
        if not isinstance(data["nvml_error"], str | None):
            raise ValueError("nvml_error: expected a string or null")
        fields["nvml_error"] = data["nvml_error"]
    return Faults(**fields)  # type: ignore[arg-type]
