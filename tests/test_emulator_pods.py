"""How the emulator reads goodput's pods and decides what each one should be doing (pure parts).

Pods come from the ModelGroup controller's own rendering of the sample manifests, so a change in how
the operator launches vLLM shows up here.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from goodput.api.modelgroup import ModelGroup
from goodput.api.reasons import Reason
from goodput.controllers import naming
from goodput.controllers.groups.pods import render_group
from goodput.controllers.groups.template import group_template
from goodput.estimators.service_time import A100_80G, H100_80G, LLAMA_3_1_8B, LLAMA_3_1_70B, StepCostModel
from goodput.testbed.emulator import (
    ANNOTATION_GPU_FAULTS,
    EmulatedPod,
    PodPlan,
    ProfileDefaults,
    VllmArgs,
    agent_nccl_condition,
    parse_pod,
    parse_vllm_args,
    plan_pod,
    serving_profile,
)

SAMPLES = Path(__file__).resolve().parents[1] / "manifests" / "samples"
STARTED = "2026-01-01T00:00:00Z"
STARTED_UNIX = 1767225600.0


def sample(name: str) -> ModelGroup:
    body = yaml.safe_load((SAMPLES / name).read_text())
    body["metadata"].update(namespace="serving", uid="uid-1")
    return ModelGroup.model_validate(body)


def running(pod: dict[str, Any], ip: str, **annotations: str) -> dict[str, Any]:
    """The pod as the fake kubelet reports it once its container runs."""
    pod = copy.deepcopy(pod)
    pod["metadata"].setdefault("annotations", {}).update(annotations)
    pod["status"] = {
        "phase": "Running",
        "podIP": ip,
        "containerStatuses": [{"name": "vllm", "state": {"running": {"startedAt": STARTED}}}],
    }
    return pod


def test_the_70b_samples_rendered_pods_read_as_the_vllm_processes_they_launch() -> None:
    model_group = sample("modelgroup-llama-70b-tp8-pp2.yaml")
    manifests = render_group(group_template(model_group), "g3", domain="clique-a")
    leader, follower = (
        parse_pod(running(pod, f"10.200.0.{rank + 5}")) for rank, pod in enumerate(manifests.pods)
    )
    assert leader is not None and follower is not None
    assert (leader.model_group, leader.group, leader.rank, follower.rank) == ("llama-70b", "g3", 0, 1)
    assert leader.leader and not follower.leader
    assert leader.pod_ip == "10.200.0.5" and leader.running and leader.started_at == STARTED_UNIX
    assert leader.vllm == VllmArgs(
        model="meta-llama/Llama-3.1-70B-Instruct",
        revision="main",
        port=8000,
        tensor_parallel=8,
        pipeline_parallel=2,
        shutdown_timeout_seconds=60.0,
        max_num_seqs=1024,
        max_num_batched_tokens=8192,
    )
    assert follower.vllm.headless and follower.vllm.tensor_parallel == 8


@pytest.mark.parametrize(
    ("command", "args", "expected"),
    [
        (["vllm", "serve"], ["m", "--port", "9000"], VllmArgs(model="m", port=9000)),
        ([], ["--model=m", "--port=9001", "-tp", "4"], VllmArgs(model="m", port=9001, tensor_parallel=4)),
        (
            ["vllm", "serve"],
            ["m", "--enable-chunked-prefill", "--served-model-name", "short"],
            VllmArgs(model="m", served_model_name="short"),
        ),
        (
            ["vllm", "serve"],
            ["m", "--dtype", "bfloat16", "--max-model-len", "8192"],
            VllmArgs(model="m", max_model_len=8192),
        ),
        (
            ["vllm", "serve"],
            ["m", "--shutdown-timeout", "45", "--max-num-queued-reqs", "64"],
            VllmArgs(model="m", shutdown_timeout_seconds=45.0, max_num_queued_reqs=64),
        ),
        (["vllm", "serve"], ["m", "--port", "not-a-number"], VllmArgs(model="m")),
    ],
    ids=[
        "positional-model",
        "equals-form",
        "unknown-boolean-flag",
        "unknown-flag-with-value",
        "drain-and-queue",
        "unparsable-value-ignored",
    ],
)
def test_vllm_flags_are_read_as_vllm_reads_them(
    command: list[str], args: list[str], expected: VllmArgs
) -> None:
    assert parse_vllm_args(command, args) == expected


def _pod_with(**changes: Any) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "metadata": {
            "namespace": "ns",
            "name": "mg-g0-0",
            "labels": {naming.LABEL_MODEL_GROUP: "mg", naming.LABEL_GROUP: "g0", naming.LABEL_RANK: "0"},
            "annotations": {},
        },
        "spec": {"containers": [{"name": "vllm", "command": ["vllm", "serve"], "args": ["m"]}]},
    }
    pod = running(pod, "10.200.0.9")
    for path, value in changes.items():
        target = pod
        *parents, leaf = path.split("__")
        for part in parents:
            target = target.setdefault(part, {})
        target[leaf] = value
    return pod


@pytest.mark.parametrize(
    ("manifest_changes", "check"),
    [
        ({"metadata__labels": {"app": "other"}}, lambda pod: pod is None),
        ({}, lambda pod: pod.load_seconds == 3.0 and pod.fault is None and pod.pre_stop_sleep_seconds == 0),
        (
            {"metadata__annotations": {"sim.goodput.dev/load-seconds": "12.5"}},
            lambda pod: pod.load_seconds == 12.5,
        ),
        (
            {"metadata__annotations": {"sim.goodput.dev/load-seconds": "-1"}},
            lambda pod: pod.load_seconds == 3.0,
        ),
        ({"metadata__annotations": {"sim.goodput.dev/fault": "hang"}}, lambda pod: pod.fault == "hang"),
        ({"metadata__deletionTimestamp": STARTED}, lambda pod: pod.deleting),
        (
            {
                "spec__containers": [
                    {
                        "name": "vllm",
                        "args": ["m"],
                        "lifecycle": {"preStop": {"exec": {"command": ["/bin/sh", "-c", "sleep 15"]}}},
                    }
                ]
            },
            lambda pod: pod.pre_stop_sleep_seconds == 15,
        ),
        (
            {
                "spec__containers": [
                    {"name": "vllm", "args": ["m"], "lifecycle": {"preStop": {"sleep": {"seconds": 7}}}}
                ]
            },
            lambda pod: pod.pre_stop_sleep_seconds == 7,
        ),
        (
            {"status__conditions": [{"type": naming.CONDITION_NCCL_HEALTHY, "status": "False"}]},
            lambda pod: pod.nccl_status == "False",
        ),
        ({"status__phase": "Pending", "status__containerStatuses": []}, lambda pod: not pod.running),
    ],
    ids=[
        "not-ours",
        "defaults",
        "load-seconds",
        "invalid-load-seconds-ignored",
        "fault",
        "deleting",
        "prestop-exec-sleep",
        "prestop-sleep-action",
        "nccl-condition",
        "pending",
    ],
)
def test_pod_manifests_parse_into_what_the_emulator_needs(
    manifest_changes: dict[str, Any], check: Any
) -> None:
    assert check(parse_pod(_pod_with(**manifest_changes)))


@dataclass(frozen=True)
class PlanCase:
    name: str
    pod: EmulatedPod
    now: float
    expected: PodPlan
    health_agent: bool = True
    restarted_at: float | None = None


LEADER = EmulatedPod(
    namespace="ns",
    name="mg-g0-0",
    uid="u",
    model_group="mg",
    group="g0",
    rank=0,
    vllm=VllmArgs(model="m", revision="abc123"),
    pod_ip="10.200.0.9",
    running=True,
    started_at=100.0,
    load_seconds=5.0,
    nccl_check_seconds=1.0,
    # The GPU check already published healthy: cases below are about what changes.
    gpu_condition=("True", "GpuHealthy"),
)
FOLLOWER = replace(LEADER, name="mg-g0-1", rank=1, pod_ip="10.200.0.10")
PLAN_CASES = [
    PlanCase("pending-pod-does-nothing", replace(LEADER, running=False, started_at=None), 200.0, PodPlan()),
    PlanCase("loading-refuses-and-wakes-at-the-end-of-the-load", LEADER, 104.0, PodPlan(wake_at=105.0)),
    PlanCase(
        "loaded-serves-and-reports-its-revision",
        LEADER,
        105.0,
        PodPlan(serve=True, report_revision="abc123", wake_at=106.0),
    ),
    PlanCase(
        "nccl-healthy-after-the-check",
        replace(LEADER, reported_revision="abc123"),
        106.0,
        PodPlan(serve=True, report_nccl=agent_nccl_condition(LEADER)),
    ),
    PlanCase(
        "nothing-left-to-report",
        replace(LEADER, reported_revision="abc123", nccl_status="True"),
        500.0,
        PodPlan(serve=True),
    ),
    PlanCase(
        "nccl-failure-fault-reports-false",
        replace(LEADER, reported_revision="abc123", nccl_status="True", fault="nccl-failure"),
        500.0,
        PodPlan(serve=True, report_nccl=agent_nccl_condition(replace(LEADER, fault="nccl-failure"))),
    ),
    PlanCase(
        "engine-death-stops-serving",
        replace(LEADER, reported_revision="abc123", nccl_status="True", fault="engine-death"),
        500.0,
        PodPlan(engine_dead=True),
    ),
    PlanCase(
        "hang-keeps-serving-hung",
        replace(LEADER, reported_revision="abc123", nccl_status="True", fault="hang"),
        500.0,
        PodPlan(serve=True, hung=True),
    ),
    PlanCase("deletion-terminates", replace(LEADER, deleting=True), 500.0, PodPlan(terminate=True)),
    PlanCase(
        "a-follower-reports-but-never-serves",
        FOLLOWER,
        106.0,
        PodPlan(report_revision="abc123", report_nccl=agent_nccl_condition(LEADER)),
    ),
    PlanCase(
        "a-follower-ignores-engine-death",
        replace(FOLLOWER, fault="engine-death"),
        106.0,
        PodPlan(report_revision="abc123", report_nccl=agent_nccl_condition(LEADER)),
    ),
    PlanCase(
        "without-the-health-agent-nothing-is-reported", LEADER, 106.0, PodPlan(serve=True), health_agent=False
    ),
    PlanCase(
        "a-restarted-engine-loads-again",
        replace(LEADER, reported_revision="abc123", nccl_status="True"),
        302.0,
        PodPlan(wake_at=305.0),
        restarted_at=300.0,
    ),
    PlanCase(
        "no-pod-ip-no-listener",
        replace(LEADER, pod_ip=None, reported_revision="abc123", nccl_status="True"),
        500.0,
        PodPlan(),
    ),
]


@pytest.mark.parametrize("case", PLAN_CASES, ids=[case.name for case in PLAN_CASES])
def test_each_pod_is_planned_as_its_vllm_and_health_agent_would_behave(case: PlanCase) -> None:
    plan = plan_pod(case.pod, case.now, health_agent=case.health_agent, restarted_at=case.restarted_at)
    assert plan == case.expected


TP8_PP2 = replace(LEADER, vllm=VllmArgs(model="m", tensor_parallel=8, pipeline_parallel=2), gpus=8)


@pytest.mark.parametrize(
    ("pod", "status", "reason", "words"),
    [
        pytest.param(LEADER, "True", Reason.ALL_REDUCE_PASSED, "one GPU: no peer", id="one-gpu-passes"),
        pytest.param(
            TP8_PP2, "True", Reason.ALL_REDUCE_PASSED, "over 16 GPU(s)", id="two-pods-cross-the-fabric"
        ),
        pytest.param(
            replace(TP8_PP2, rank=1, fault="nccl-failure"),
            "False",
            Reason.ALL_REDUCE_FAILED,
            "rank 8: NCCL error",
            id="failure-names-the-pods-first-global-rank",
        ),
        pytest.param(
            replace(TP8_PP2, fault="nccl-hang"),
            "False",
            Reason.ALL_REDUCE_TIMEOUT,
            "within 120s",
            id="hang-times-out",
        ),
        pytest.param(
            replace(TP8_PP2, fault="nccl-slow"),
            "False",
            Reason.ALL_REDUCE_SLOW,
            "below the 10 GB/s floor",
            id="slow-link",
        ),
        pytest.param(
            replace(LEADER, fault="nccl-slow"),
            "True",
            Reason.ALL_REDUCE_PASSED,
            "no link to measure",
            id="one-rank-has-no-link",
        ),
    ],
)
def test_the_emulated_all_reduce_is_judged_by_the_agents_own_rule(
    pod: EmulatedPod, status: str, reason: str, words: str
) -> None:
    condition = agent_nccl_condition(pod)
    assert (condition.type, condition.status, condition.reason) == (
        naming.CONDITION_NCCL_HEALTHY,
        status,
        reason,
    )
    assert words in condition.message


def test_a_slow_link_fault_on_the_plan_reports_the_agents_reason() -> None:
    pod = replace(TP8_PP2, reported_revision="main", nccl_status="True", fault="nccl-slow")
    plan = plan_pod(pod, 500.0)
    assert plan.report_nccl is not None and plan.report_nccl.reason == Reason.ALL_REDUCE_SLOW


LOADED = replace(LEADER, reported_revision="abc123", nccl_status="True", gpus=4)


@pytest.mark.parametrize(
    ("pod", "status", "reason", "words"),
    [
        (replace(LOADED, gpu_condition=None), "True", "GpuHealthy", "no GPU fault"),
        (
            replace(LOADED, gpu_faults='{"xids": {"2": [79]}}'),
            "False",
            "GpuXidCritical",
            "GPU 2: critical XID 79",
        ),
        (replace(LOADED, gpu_faults='{"missing": [3]}'), "False", "GpuAllocationMismatch", "sees 3 GPU(s)"),
        (
            replace(LOADED, gpu_faults='{"throttled": {"0": ["HwThermalSlowdown"]}}'),
            "True",
            "GpuThrottled",
            "GPU 0",
        ),
        (replace(LOADED, gpu_faults='{"xid": 79}'), "Unknown", "NvmlUnavailable", "unknown field(s) xid"),
        (replace(LOADED, gpu_faults="not json"), "Unknown", "NvmlUnavailable", "unreadable"),
    ],
    ids=["first-report", "critical-xid", "a-gpu-disappears", "throttling-warns", "bad-field", "bad-json"],
)
def test_each_rank_publishes_the_agents_gpu_verdict_on_its_injected_faults(
    pod: EmulatedPod, status: str, reason: str, words: str
) -> None:
    plan = plan_pod(pod, 500.0)

    assert plan.report_gpu is not None
    assert (plan.report_gpu.type, plan.report_gpu.status, plan.report_gpu.reason) == (
        naming.CONDITION_GPU_HEALTHY,
        status,
        reason,
    )
    assert words in plan.report_gpu.message


def test_a_gpu_verdict_already_published_is_not_written_again() -> None:
    faulty = replace(
        LOADED, gpu_faults='{"ecc_uncorrectable": {"1": 2}}', gpu_condition=("False", "GpuEccUncorrectable")
    )

    assert plan_pod(faulty, 500.0).report_gpu is None
    assert plan_pod(replace(faulty, gpu_faults=None), 500.0).report_gpu is not None  # the fault cleared


def test_the_gpu_faults_annotation_and_gpu_count_are_read_from_the_pod() -> None:
    manifest = {
        "metadata": {
            "name": "mg-g0-0",
            "namespace": "ns",
            "labels": {naming.LABEL_MODEL_GROUP: "mg", naming.LABEL_GROUP: "g0", naming.LABEL_RANK: "0"},
            "annotations": {ANNOTATION_GPU_FAULTS: '{"xids": {"0": [48]}}'},
        },
        "spec": {"containers": [{"name": "vllm", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]},
        "status": {
            "conditions": [{"type": naming.CONDITION_GPU_HEALTHY, "status": "True", "reason": "GpuHealthy"}]
        },
    }

    pod = parse_pod(manifest)

    assert pod is not None
    assert (pod.gpus, pod.gpu_faults, pod.gpu_condition) == (
        8,
        '{"xids": {"0": [48]}}',
        ("True", "GpuHealthy"),
    )


def test_the_samples_profile_and_flags_set_the_engine() -> None:
    model_group = sample("modelgroup-llama-70b-tp8-pp2.yaml")
    flags = VllmArgs(
        model="meta-llama/Llama-3.1-70B-Instruct",
        tensor_parallel=8,
        pipeline_parallel=2,
        max_num_seqs=512,
        max_model_len=32768,
    )
    serving = serving_profile(model_group.spec, flags, ProfileDefaults(gpu=A100_80G))
    assert serving.engine.kv_capacity_tokens == 2850000, "the measured profile wins over the estimate"
    assert serving.engine.max_num_seqs == 512, "the pod's flag wins over the profile"
    assert serving.engine.max_num_batched_tokens == 8192, "vLLM's H100 default (the profile's GPU wins)"
    assert serving.engine.cost == StepCostModel.from_hardware(LLAMA_3_1_70B, H100_80G, 8, 2)
    assert serving.effective_max_model_len == 32768
    assert serving.model_name == "meta-llama/Llama-3.1-70B-Instruct"


@pytest.mark.parametrize(
    ("model", "expected_shape"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", LLAMA_3_1_8B),
        ("meta-llama/Llama-3.1-70B", LLAMA_3_1_70B),
        ("someone/unknown-model", LLAMA_3_1_8B),
    ],
    ids=["catalog-8b", "catalog-70b", "unknown-falls-back-to-8b"],
)
def test_without_a_modelgroup_the_catalog_and_default_gpu_price_steps(
    model: str, expected_shape: Any
) -> None:
    serving = serving_profile(None, VllmArgs(model=model, tensor_parallel=8), ProfileDefaults(gpu=A100_80G))
    assert serving.engine.cost == StepCostModel.from_hardware(expected_shape, A100_80G, 8, 1)
    assert (serving.engine.max_num_seqs, serving.engine.max_num_batched_tokens) == (256, 2048)
