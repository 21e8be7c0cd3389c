"""The real GPU backend: NVML through nvidia-ml-py (`pynvml`).

Every NVML call that fails becomes evidence in the reading: a library that cannot be loaded or
initialised is `nvml_error` ("NVML unavailable: ..."), a device that cannot be read is that device's
`error`. Features a GPU does not have (ECC on a consumer card, NVLink on a PCIe card, row remapping
before Ampere) are `NotSupported` and read as absent, not as a fault. Critical XID events arrive
through an NVML event set; they are drained without waiting on each read and kept for the life of
the agent, since a GPU that needed a reset stays suspect until the pod is replaced.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

from goodput.agent.gpu import DeviceReading, GpuReading, NvLinkReading

log = logging.getLogger(__name__)

T = TypeVar("T")

# nvmlClocksEventReason* bits that mean the clocks are held down by heat or power (not idle, not
# an application clock setting): the names reported in the verdict.
THROTTLE_BITS: tuple[tuple[int, str], ...] = (
    (0x4, "SwPowerCap"),
    (0x8, "HwSlowdown"),
    (0x20, "SwThermalSlowdown"),
    (0x40, "HwThermalSlowdown"),
    (0x80, "HwPowerBrakeSlowdown"),
)


def throttle_names(mask: int) -> tuple[str, ...]:
    return tuple(name for bit, name in THROTTLE_BITS if mask & bit)


class NvmlBackend:
    """Reads the GPUs visible to this container. Construct it once; `read` may be called often."""

    def __init__(self) -> None:
        import pynvml

        self._nvml: Any = pynvml
        self._init_error: str | None = None
        self._event_set: Any = None
        self._xids: dict[int, set[int]] = {}
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as error:
            self._init_error = f"{type(error).__name__}: {error}"
            log.warning("NVML unavailable: %s", self._init_error)
            return
        self._register_xid_events()

    def _register_xid_events(self) -> None:
        nvml = self._nvml
        try:
            self._event_set = nvml.nvmlEventSetCreate()
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                try:
                    nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, self._event_set)
                except nvml.NVMLError_NotSupported:
                    log.warning("GPU %d does not report XID events", index)
        except nvml.NVMLError as error:
            log.warning("cannot subscribe to XID events: %s", error)

    def read(self) -> GpuReading:
        nvml = self._nvml
        if self._init_error is not None:
            return GpuReading(nvml_error=self._init_error)
        self._drain_xid_events()
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as error:
            return GpuReading(nvml_error=f"nvmlDeviceGetCount: {type(error).__name__}: {error}")
        return GpuReading(devices=tuple(self._read_device(index) for index in range(count)))

    def _drain_xid_events(self) -> None:
        nvml = self._nvml
        if self._event_set is None:
            return
        for _ in range(1000):  # bounded: a storm of events must not stall the agent
            try:
                event = nvml.nvmlEventSetWait_v2(self._event_set, 0)
            except nvml.NVMLError_Timeout:
                return
            except nvml.NVMLError as error:
                log.warning("reading XID events failed: %s", error)
                return
            try:
                index = nvml.nvmlDeviceGetIndex(event.device)
            except nvml.NVMLError:
                index = -1
            self._xids.setdefault(index, set()).add(int(event.eventData))
            log.error("GPU %d raised XID %d", index, event.eventData)

    def _read_device(self, index: int) -> DeviceReading:
        """One GPU; a GPU that stops answering (fallen off the bus, lost) is a reading with `error`."""
        try:
            return self._read_device_or_raise(index)
        except self._nvml.NVMLError as error:
            return DeviceReading(index=index, error=f"{type(error).__name__}: {error}")

    def _read_device_or_raise(self, index: int) -> DeviceReading:
        nvml = self._nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        name = nvml.nvmlDeviceGetName(handle)
        product = name.decode() if isinstance(name, bytes) else str(name)
        ecc = self._optional(
            lambda: int(
                nvml.nvmlDeviceGetTotalEccErrors(
                    handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
                )
            ),
            0,
        )
        remap = self._optional(lambda: tuple(nvml.nvmlDeviceGetRemappedRows(handle)), (0, 0, 0, 0))
        mask = self._optional(lambda: int(_clock_event_reasons(nvml, handle)), 0)
        return DeviceReading(
            index=index,
            product=product,
            xids=tuple(sorted(self._xids.get(index, ()))),
            ecc_uncorrectable=ecc,
            remap_pending=bool(remap[2]),
            remap_failed=bool(remap[3]),
            nvlinks=self._read_nvlinks(handle),
            throttle_reasons=throttle_names(mask),
        )

    def _read_nvlinks(self, handle: Any) -> tuple[NvLinkReading, ...]:
        nvml = self._nvml
        links = []
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            try:
                active = nvml.nvmlDeviceGetNvLinkState(handle, link) == nvml.NVML_FEATURE_ENABLED
            except nvml.NVMLError:
                continue  # no such link on this GPU
            counters = [
                self._optional(partial(_error_counter, nvml, handle, link, kind), 0)
                for kind in (
                    nvml.NVML_NVLINK_ERROR_DL_REPLAY,
                    nvml.NVML_NVLINK_ERROR_DL_RECOVERY,
                    nvml.NVML_NVLINK_ERROR_DL_CRC_FLIT,
                )
            ]
            links.append(NvLinkReading(link, active, *counters))
        return tuple(links)

    def _optional(self, call: Callable[[], T], absent: T) -> T:
        """A feature the GPU lacks reads as `absent`; any other failure is raised to the caller."""
        try:
            return call()
        except self._nvml.NVMLError_NotSupported:
            return absent

    def close(self) -> None:
        nvml = self._nvml
        if self._init_error is not None:
            return
        try:
            if self._event_set is not None:
                nvml.nvmlEventSetFree(self._event_set)
            nvml.nvmlShutdown()
        except nvml.NVMLError as error:
            log.warning("NVML shutdown failed: %s", error)


def _clock_event_reasons(nvml: Any, handle: Any) -> int:
    """The clock-event reasons (drivers from 535 name them so; older ones call them throttle reasons)."""
    reader = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    if reader is None:
        reader = nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    return int(reader(handle))


def _error_counter(nvml: Any, handle: Any, link: int, kind: int) -> int:
    return int(nvml.nvmlDeviceGetNvLinkErrorCounter(handle, link, kind))
