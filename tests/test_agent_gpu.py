"""GPU health: every reading maps to the verdict NVIDIA's guidance calls for, and missing evidence is
never taken for health."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from goodput.agent import report
from goodput.agent.emulated import EmulatedBackend, Faults, faults_from_json
from goodput.agent.gpu import (
    CRITICAL_XIDS,
    Allocation,
    DeviceReading,
    GpuReading,
    NvLinkReading,
    Severity,
    evaluate,
)
from goodput.api import labels
from goodput.api.reasons import Reason

H100 = "NVIDIA H100 80GB HBM3"


def healthy(index: int, **changes: object) -> DeviceReading:
    fields: dict[str, object] = {
        "index": index,
        "product": H100,
        "nvlinks": tuple(NvLinkReading(link, True) for link in range(4)),
    }
    fields.update(changes)
    return DeviceReading(**fields)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Case:
    name: str
    devices: tuple[DeviceReading, ...]
    severity: Severity
    reason: str
    words: tuple[str, ...]


CASES = [
    Case("all healthy", (healthy(0), healthy(1)), Severity.HEALTHY, Reason.GPU_HEALTHY, ("no GPU fault",)),
    Case(
        "XID 79 fallen off the bus",
        (healthy(0), healthy(1, xids=(79,))),
        Severity.CRITICAL,
        Reason.GPU_XID_CRITICAL,
        ("GPU 1", "XID 79"),
    ),
    Case(
        "an application XID is not a GPU fault",
        (healthy(0, xids=(13, 31)), healthy(1)),
        Severity.HEALTHY,
        Reason.GPU_HEALTHY,
        (),
    ),
    Case(
        "uncorrectable ECC",
        (healthy(0, ecc_uncorrectable=3), healthy(1)),
        Severity.CRITICAL,
        Reason.GPU_ECC_UNCORRECTABLE,
        ("GPU 0", "3 uncorrectable ECC"),
    ),
    Case(
        "pending row remap",
        (healthy(0), healthy(1, remap_pending=True)),
        Severity.CRITICAL,
        Reason.GPU_ROW_REMAP_PENDING,
        ("GPU 1", "row remap pending"),
    ),
    Case(
        "failed row remap",
        (healthy(0, remap_failed=True), healthy(1)),
        Severity.CRITICAL,
        Reason.GPU_ROW_REMAP_FAILED,
        ("GPU 0",),
    ),
    Case(
        "NVLink down",
        (healthy(0), healthy(1, nvlinks=(NvLinkReading(0, True), NvLinkReading(1, False)))),
        Severity.CRITICAL,
        Reason.NVLINK_DOWN,
        ("GPU 1", "NVLink 1 down"),
    ),
    Case(
        "thermal throttling is a warning",
        (healthy(0, throttle_reasons=("HwThermalSlowdown",)), healthy(1)),
        Severity.WARNING,
        Reason.GPU_THROTTLED,
        ("GPU 0", "HwThermalSlowdown"),
    ),
    Case(
        "a GPU disappeared",
        (healthy(0),),
        Severity.CRITICAL,
        Reason.GPU_ALLOCATION_MISMATCH,
        ("sees 1 GPU(s) but was allocated 2",),
    ),
    Case(
        "a GPU that no longer answers",
        (healthy(0), DeviceReading(1, error="NVMLError_GpuIsLost: GPU is lost")),
        Severity.CRITICAL,
        Reason.GPU_ALLOCATION_MISMATCH,
        ("GPU 1", "GpuIsLost"),
    ),
    Case(
        "the wrong product",
        (healthy(0), healthy(1, product="NVIDIA A100-SXM4-80GB")),
        Severity.CRITICAL,
        Reason.GPU_ALLOCATION_MISMATCH,
        ("GPU 1", "A100"),
    ),
    Case(
        "no GPU shown to the agent's container (the device plugin gives GPUs to the engine alone)",
        (),
        Severity.UNKNOWN,
        Reason.GPUS_NOT_VISIBLE,
        ("sees no GPU", "allocated 2", "ncclCheck: Skip"),
    ),
    Case(
        "the node's GPUs shown: a neighbour's XID is not this pod's fault",
        (healthy(0), healthy(1), healthy(2, xids=(79,)), healthy(3, product="NVIDIA A100-SXM4-80GB")),
        Severity.UNKNOWN,
        Reason.GPUS_NOT_ISOLATED,
        ("sees 4 GPUs but the pod was allocated 2", "cannot tell which are the pod's", "gpusPerPod: 4"),
    ),
    Case(
        "a critical fault outranks a warning on another GPU",
        (healthy(0, throttle_reasons=("SwPowerCap",)), healthy(1, ecc_uncorrectable=1)),
        Severity.CRITICAL,
        Reason.GPU_ECC_UNCORRECTABLE,
        ("GPU 1", "1 lesser finding"),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_each_reading_gets_its_verdict(case: Case) -> None:
    verdict = evaluate(GpuReading(devices=case.devices), Allocation(2, "H100"))

    assert (verdict.severity, verdict.reason) == (case.severity, case.reason)
    for word in case.words:
        assert word in verdict.message


def test_nvml_missing_is_unknown_never_healthy() -> None:
    verdict = evaluate(GpuReading(nvml_error="NVML Shared Library Not Found"), Allocation(1))
    condition = report.gpu_condition(verdict)

    assert verdict.severity is Severity.UNKNOWN
    assert (condition.status, condition.reason) == ("Unknown", Reason.NVML_UNAVAILABLE)
    assert condition.message == "NVML unavailable: NVML Shared Library Not Found"


@pytest.mark.parametrize(
    ("severity", "status"),
    [
        (Severity.HEALTHY, "True"),
        (Severity.WARNING, "True"),
        (Severity.CRITICAL, "False"),
        (Severity.UNKNOWN, "Unknown"),
    ],
)
def test_only_a_critical_verdict_makes_the_condition_false(severity: Severity, status: str) -> None:
    reading = {
        Severity.HEALTHY: GpuReading(devices=(healthy(0),)),
        Severity.WARNING: GpuReading(devices=(healthy(0, throttle_reasons=("SwPowerCap",)),)),
        Severity.CRITICAL: GpuReading(devices=(healthy(0, xids=(48,)),)),
        Severity.UNKNOWN: GpuReading(nvml_error="init failed"),
    }[severity]
    verdict = evaluate(reading, Allocation(1))
    condition = report.gpu_condition(verdict)

    assert verdict.severity is severity
    assert (condition.type, condition.status) == (labels.CONDITION_GPU_HEALTHY, status)


@given(
    gpus=st.integers(min_value=1, max_value=8),
    faulty=st.data(),
    xid=st.sampled_from(sorted(CRITICAL_XIDS)),
)
def test_any_critical_xid_on_any_gpu_is_critical_and_named(
    gpus: int, faulty: st.DataObject, xid: int
) -> None:
    index = faulty.draw(st.integers(min_value=0, max_value=gpus - 1))
    devices = tuple(healthy(i, xids=(xid,) if i == index else ()) for i in range(gpus))

    verdict = evaluate(GpuReading(devices=devices), Allocation(gpus))

    assert verdict.severity is Severity.CRITICAL
    assert f"GPU {index}: critical XID {xid}" in verdict.message


def test_the_emulated_backend_reports_injected_faults_until_cleared() -> None:
    backend = EmulatedBackend(gpus=4, nvlinks=2)
    allocation = Allocation(4, "H100")
    assert evaluate(backend.read(), allocation).severity is Severity.HEALTHY

    backend.inject(xids={2: (94,)}, dead_nvlinks={3: (1,)})
    verdict = evaluate(backend.read(), allocation)
    assert verdict.severity is Severity.CRITICAL
    assert "GPU 2: critical XID 94" in verdict.message
    assert "GPU 3: NVLink 1 down" in verdict.message

    backend.inject(missing=frozenset({0}))
    assert "sees 3 GPU(s)" in evaluate(backend.read(), allocation).message

    backend.clear()
    assert evaluate(backend.read(), allocation).severity is Severity.HEALTHY


def test_the_emulated_runtime_can_show_the_nodes_gpus_beside_the_pods() -> None:
    backend = EmulatedBackend(2)
    backend.set_faults(faults_from_json({"node_gpus_shown": 6}))

    verdict = evaluate(backend.read(), Allocation(2))
    assert len(backend.read().devices) == 8
    assert (verdict.severity, verdict.reason) == (Severity.UNKNOWN, Reason.GPUS_NOT_ISOLATED)


def test_faults_parse_from_json() -> None:
    faults = faults_from_json(
        {"xids": {"1": [79]}, "throttled": {"0": ["HwThermalSlowdown"]}, "missing": [3], "nvml_error": None}
    )

    assert faults == Faults(xids={1: (79,)}, throttled={0: ("HwThermalSlowdown",)}, missing=frozenset({3}))


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"xid": {"1": [79]}}, "unknown field(s) xid"),
        ({"xids": {"one": [79]}}, "xids: keys must be GPU indexes"),
        ({"xids": {"1": 79}}, "xids.1: expected a list of integers"),
        ({"ecc_uncorrectable": {"0": "many"}}, "ecc_uncorrectable"),
        ({"missing": "all"}, "missing: expected a list"),
        ({"node_gpus_shown": -1}, "node_gpus_shown: expected a count"),
        ({"node_gpus_shown": True}, "node_gpus_shown: expected a count"),
        ([], "faults: expected a JSON object"),
    ],
)
def test_bad_faults_are_refused_naming_the_field(data: object, field: str) -> None:
    with pytest.raises(ValueError, match=re.escape(field)):
        faults_from_json(data)


def test_the_nvml_backend_without_a_gpu_reports_nvml_unavailable() -> None:
    """This machine has no NVIDIA driver: the real backend must say so, not crash or report health."""
    from goodput.agent.nvml import NvmlBackend

    backend = NvmlBackend()
    try:
        reading = backend.read()
    finally:
        backend.close()

    if reading.nvml_error is None:
        pytest.skip("an NVIDIA driver is present here; the GPU script covers the real backend")
    assert evaluate(reading, Allocation(1)).reason == Reason.NVML_UNAVAILABLE


def test_the_metrics_carry_each_gpus_faults_and_the_worst_severity() -> None:
    from goodput.agent.metrics import AgentMetrics

    metrics = AgentMetrics()
    backend = EmulatedBackend(gpus=2, nvlinks=3)
    backend.inject(xids={1: (79, 48)}, dead_nvlinks={0: (2,)}, throttled={0: ("SwPowerCap",)})
    reading = backend.read()
    metrics.record_gpus(reading, evaluate(reading, Allocation(2)))

    def value(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, labels)

    assert value("goodput_agent_gpu_severity") == 3
    assert value("goodput_agent_gpus_visible") == 2
    assert value("goodput_agent_gpu_critical_xids", gpu="1") == 2
    assert value("goodput_agent_nvlinks_down", gpu="0") == 1
    assert value("goodput_agent_gpu_throttled", gpu="0") == 1
    assert value("goodput_agent_gpu_throttled", gpu="1") == 0
