"""From verdicts to the pod conditions the group controller reads (pure)."""

from __future__ import annotations

from goodput.agent.engine import EngineVerdict
from goodput.agent.gpu import GpuVerdict, Severity
from goodput.agent.nccl import NcclVerdict
from goodput.agent.publish import PodCondition
from goodput.api import labels
from goodput.api.conditions import ConditionStatus
from goodput.api.reasons import Reason

_GPU_STATUS: dict[Severity, ConditionStatus] = {
    Severity.HEALTHY: "True",
    Severity.WARNING: "True",  # reported in reason and message, not acted on
    Severity.CRITICAL: "False",
    Severity.UNKNOWN: "Unknown",  # missing evidence: neither healthy nor a fault
}


def gpu_condition(verdict: GpuVerdict) -> PodCondition:
    return PodCondition(
        labels.CONDITION_GPU_HEALTHY, _GPU_STATUS[verdict.severity], verdict.reason, verdict.message
    )


def nccl_condition(verdict: NcclVerdict) -> PodCondition:
    status: ConditionStatus = "True" if verdict.healthy else "False"
    if not verdict.ran:
        status = "Unknown"  # not run: neither healthy nor a failed group
    return PodCondition(labels.CONDITION_NCCL_HEALTHY, status, verdict.reason, verdict.message)


def engine_condition(verdict: EngineVerdict) -> PodCondition:
    status: ConditionStatus = "False" if verdict.hung else "True"
    if not verdict.hung and verdict.reason != Reason.ENGINE_PROGRESSING:
        status = "Unknown"  # no metrics yet: no evidence either way
    return PodCondition(labels.CONDITION_ENGINE_HEALTHY, status, verdict.reason, verdict.message)
