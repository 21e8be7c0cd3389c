"""What the agent reads from a pod's GPUs, the interface that reads it, and the pure verdict.

A reading is a frozen value taken at one moment; `evaluate` turns it into a verdict without I/O, so
every rule is tested from a table of readings. Missing evidence (NVML not loadable, a device that
cannot be read) is a verdict of its own, never "healthy".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

from goodput.api.reasons import Reason

CRITICAL_XIDS: frozenset[int] = frozenset({48, 63, 64, 74, 79, 92, 94, 95, 119, 120})
"""XID codes after which the GPU must be reset (or the node drained) before it can be trusted.

Source: NVIDIA's Xid catalogue for Ampere and newer GPUs ("Analyzing Xid Errors with the Xid
Catalog", docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html), the codes whose immediate
resolution is a GPU reset, a node reboot or a drain: 48 double-bit ECC error, 63 and 64 row
remapping (new row marked / remapping failed, "reset gpu to activate"), 74 NVLink error, 79 GPU
fallen off the bus, 92 high single-bit ECC rate, 94 contained and 95 uncontained ECC error, 119 and
120 GSP RPC timeout / GSP error. Codes outside this set (e.g. 13, 31, 43: an application's own
fault) are the engine's business and do not fail the GPU.
"""


class Severity(Enum):
    HEALTHY = "Healthy"
    WARNING = "Warning"
    """Reported, not acted on (throttling)."""
    CRITICAL = "Critical"
    """The whole group is failed and replaced."""
    UNKNOWN = "Unknown"
    """No evidence could be read; never taken for healthy, never acted on as a fault."""


@dataclass(frozen=True, slots=True)
class NvLinkReading:
    link: int
    active: bool
    """`nvmlDeviceGetNvLinkState`: the link is up."""
    replay_errors: int = 0
    recovery_errors: int = 0
    crc_flit_errors: int = 0


@dataclass(frozen=True, slots=True)
class DeviceReading:
    """One GPU as NVML reported it; `error` is set when the device could not be read at all."""

    index: int
    product: str = ""
    xids: tuple[int, ...] = ()
    """Critical XID events seen since the agent started (nvmlEventTypeXidCriticalError)."""
    ecc_uncorrectable: int = 0
    """Volatile uncorrectable ECC errors (nvmlDeviceGetTotalEccErrors)."""
    remap_pending: bool = False
    remap_failed: bool = False
    nvlinks: tuple[NvLinkReading, ...] = ()
    throttle_reasons: tuple[str, ...] = ()
    """Names of the active clock-event reasons that slow the GPU (thermal, power), empty if none."""
    error: str | None = None


@dataclass(frozen=True, slots=True)
class GpuReading:
    """Every GPU the pod sees, or why NVML could not be read at all (`nvml_error`)."""

    devices: tuple[DeviceReading, ...] = ()
    nvml_error: str | None = None


@dataclass(frozen=True, slots=True)
class Allocation:
    """What the pod was given: its GPU count and, when known, the product name the node advertises
    (the `nvidia.com/gpu.product` label), which NVML's name must contain."""

    gpus: int
    product: str | None = None


@dataclass(frozen=True, slots=True)
class Finding:
    severity: Severity
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class GpuVerdict:
    """The worst finding decides the condition; every finding is kept for the message and log."""

    severity: Severity
    reason: str
    message: str
    findings: tuple[Finding, ...] = field(default=())


class GpuBackend(Protocol):
    """Reads the GPUs the pod sees. `read` never raises: a failure is carried in the reading."""

    def read(self) -> GpuReading: ...

    def close(self) -> None: ...


_RANK = {Severity.HEALTHY: 0, Severity.WARNING: 1, Severity.UNKNOWN: 2, Severity.CRITICAL: 3}


def evaluate(reading: GpuReading, allocation: Allocation) -> GpuVerdict:
    """The verdict on one reading: missing evidence first (no GPU of the pod's can be judged), then
    critical faults, then warnings."""
    unseen = unseen_allocation(reading, allocation)
    if unseen is not None:
        return _verdict((unseen,))
    findings = list(_allocation_findings(reading, allocation))
    for device in reading.devices:
        findings.extend(_device_findings(device))
    return _verdict(tuple(findings))


def unseen_allocation(reading: GpuReading, allocation: Allocation) -> Finding | None:
    """Why this container's GPUs cannot be taken for the pod's own, or None when they can.

    The agent requests no GPU (one cannot be requested twice in a pod), so what it sees is what the
    runtime shows a container that asked for none. Under the NVIDIA device plugin that is nothing
    (NVML absent or listing no device), or every GPU of the node where the toolkit honours the
    NVIDIA_VISIBLE_DEVICES=all that CUDA images (vLLM's among them) set: the pod's own GPUs exactly
    when the rank takes the whole node. Seeing more than the pod was given, the agent cannot tell
    which are the pod's: a neighbour's XID must not fail this group, and the NCCL check must not put
    a buffer on a neighbour's GPU. None of these is a fault of the pod's GPUs, so none is critical;
    the group waits, with the reason in its condition."""
    wanted = allocation.gpus
    if reading.nvml_error is not None:
        return Finding(Severity.UNKNOWN, Reason.NVML_UNAVAILABLE, f"NVML unavailable: {reading.nvml_error}")
    seen = len(reading.devices)
    if seen == 0:
        return Finding(
            Severity.UNKNOWN,
            Reason.GPUS_NOT_VISIBLE,
            f"this container sees no GPU; the pod was allocated {wanted}: the agent requests none of "
            "its own, and this node's runtime shows GPUs only to the container that requests them, so "
            "the agent cannot check this pod here (spec.readiness.ncclCheck: Skip runs without it)",
        )
    if seen > wanted:
        return Finding(
            Severity.UNKNOWN,
            Reason.GPUS_NOT_ISOLATED,
            f"this container sees {seen} GPUs but the pod was allocated {wanted}: it cannot tell which "
            "are the pod's (the runtime shows it the node's, as NVIDIA_VISIBLE_DEVICES=all in the "
            f"image asks), so it judges and touches none; a rank that takes a whole node "
            f"(spec.parallelism.gpusPerPod: {seen}) sees only its own",
        )
    return None


def _verdict(findings: tuple[Finding, ...]) -> GpuVerdict:
    if not findings:
        return GpuVerdict(Severity.HEALTHY, Reason.GPU_HEALTHY, "no GPU fault found")
    worst = max(findings, key=lambda finding: _RANK[finding.severity])
    same = [finding.message for finding in findings if finding.severity == worst.severity]
    more = len(findings) - len(same)
    message = "; ".join(same) + (f" (and {more} lesser finding(s))" if more else "")
    return GpuVerdict(worst.severity, worst.reason, message, findings)


def _allocation_findings(reading: GpuReading, allocation: Allocation) -> list[Finding]:
    findings = []
    seen = len(reading.devices)
    if seen != allocation.gpus:
        findings.append(
            Finding(
                Severity.CRITICAL,
                Reason.GPU_ALLOCATION_MISMATCH,
                f"the pod sees {seen} GPU(s) but was allocated {allocation.gpus}",
            )
        )
    if allocation.product:
        for device in reading.devices:
            if device.error is None and allocation.product.lower() not in device.product.lower():
                findings.append(
                    Finding(
                        Severity.CRITICAL,
                        Reason.GPU_ALLOCATION_MISMATCH,
                        f"GPU {device.index} is a {device.product!r}, allocated {allocation.product!r}",
                    )
                )
    return findings


def _device_findings(device: DeviceReading) -> list[Finding]:
    gpu = f"GPU {device.index}"
    if device.error is not None:
        return [
            Finding(
                Severity.CRITICAL, Reason.GPU_ALLOCATION_MISMATCH, f"{gpu} cannot be read: {device.error}"
            )
        ]
    findings = []
    critical_xids = sorted(set(device.xids) & CRITICAL_XIDS)
    if critical_xids:
        codes = ", ".join(str(code) for code in critical_xids)
        findings.append(Finding(Severity.CRITICAL, Reason.GPU_XID_CRITICAL, f"{gpu}: critical XID {codes}"))
    if device.ecc_uncorrectable > 0:
        findings.append(
            Finding(
                Severity.CRITICAL,
                Reason.GPU_ECC_UNCORRECTABLE,
                f"{gpu}: {device.ecc_uncorrectable} uncorrectable ECC error(s)",
            )
        )
    if device.remap_failed:
        findings.append(
            Finding(Severity.CRITICAL, Reason.GPU_ROW_REMAP_FAILED, f"{gpu}: row remapping failed")
        )
    if device.remap_pending:
        findings.append(
            Finding(
                Severity.CRITICAL, Reason.GPU_ROW_REMAP_PENDING, f"{gpu}: row remap pending, needs a reset"
            )
        )
    down = [link.link for link in device.nvlinks if not link.active]
    if down:
        links = ", ".join(str(link) for link in down)
        findings.append(Finding(Severity.CRITICAL, Reason.NVLINK_DOWN, f"{gpu}: NVLink {links} down"))
    if device.throttle_reasons:
        reasons = ", ".join(device.throttle_reasons)
        findings.append(
            Finding(Severity.WARNING, Reason.GPU_THROTTLED, f"{gpu}: clocks throttled ({reasons})")
        )
    return findings
