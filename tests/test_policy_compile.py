"""Compiling a ModelGroup and its SLOPolicy into the decision's policy and capacity profile.

The samples in manifests/samples/ are the inputs: what a user writes is what the decision obeys.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from goodput.api.modelgroup import ModelGroup
from goodput.api.slopolicy import SloPolicy, SloPolicySpec
from goodput.controllers.autoscale.model import (
    Mode,
    ScalingPolicy,
    ScalingRules,
    SelectPolicy,
    SloTargets,
    StaleMetricsAction,
    StepPolicy,
    StepPolicyType,
)
from goodput.controllers.compile.request_path import RequestPathPolicy, compile_request_path
from goodput.controllers.compile.scaling import (
    CompiledPolicy,
    GroupBounds,
    ReferenceMix,
    bounded_scaling_policy,
    capacity_profile,
    compile_policy,
    profile_key,
    scaling_policy,
    scaling_rules,
)
from goodput.controllers.hardware import step_cost_model
from goodput.estimators.service_time import H100_80G, LLAMA_3_1_8B, StepCostModel

SAMPLES = Path(__file__).resolve().parent.parent / "manifests" / "samples"


def sample(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((SAMPLES / name).read_text())
    return loaded


MODEL_GROUP = sample("modelgroup-llama-8b-tp1.yaml")
INTERACTIVE = sample("slopolicy-interactive.yaml")
MOE_SAMPLE = sample("modelgroup-qwen3-moe-l40s.yaml")


def model_group(**spec: Any) -> ModelGroup:
    body = copy.deepcopy(MODEL_GROUP)
    body["metadata"]["namespace"] = "serving"
    body["spec"].update(spec)
    return ModelGroup.model_validate(body)


def slo_policy(**autoscaling: Any) -> SloPolicy:
    body = copy.deepcopy(INTERACTIVE)
    body["spec"]["autoscaling"].update(autoscaling)
    return SloPolicy.model_validate(body)


def test_the_interactive_sample_compiles_to_what_it_says() -> None:
    """Every number the decision obeys is the one the samples state."""
    compiled = compile_policy(model_group(), slo_policy())
    assert isinstance(compiled, CompiledPolicy)
    policy = compiled.policy
    group, slo = MODEL_GROUP["spec"], INTERACTIVE["spec"]
    autoscaling, signals = slo["autoscaling"], slo["autoscaling"]["signals"]
    assert (policy.min_groups, policy.max_groups, policy.warm_groups) == (
        group["minReplicas"],
        group["maxReplicas"],
        group["warmReplicas"],
    )
    assert (policy.revision, policy.mode, policy.interval_seconds) == (
        slo["revision"],
        Mode(autoscaling["mode"]),
        autoscaling["intervalSeconds"],
    )
    assert [(c.name, c.ttft_seconds, c.itl_seconds, c.attainment) for c in policy.classes] == [
        (c["name"], c["ttftSeconds"], c["itlSeconds"], c["attainment"]) for c in slo["classes"]
    ]
    assert [c.percentile for c in policy.classes] == [c.get("percentile", 0.99) for c in slo["classes"]]
    queue_work, slack = policy.signals.queue_work, policy.signals.slack
    kv, goodput = policy.signals.kv_cache, policy.signals.goodput
    assert queue_work is not None and slack is not None and kv is not None and goodput is not None
    assert (queue_work.drain_target_seconds, queue_work.safety_factor) == (
        signals["queueWork"]["drainTargetSeconds"],
        signals["queueWork"]["safetyFactor"],
    )
    assert (slack.min_slack_seconds, slack.low_slack_fraction) == (
        signals["slack"]["minSlackSeconds"],
        signals["slack"]["lowSlackFraction"],
    )
    assert kv.min_free_fraction == signals["kvCache"]["minFreeFraction"]
    assert goodput.attainment_floor == signals["goodput"]["attainmentFloor"]
    for compiled_rules, written in (
        (policy.scale_up, autoscaling["scaleUp"]),
        (policy.scale_down, autoscaling["scaleDown"]),
    ):
        assert compiled_rules == ScalingRules(
            tolerance=written.get("tolerance", 0.1),
            stabilization_window_seconds=float(written["stabilizationWindowSeconds"]),
            policies=tuple(
                StepPolicy(StepPolicyType(step["type"]), step["value"], float(step["periodSeconds"]))
                for step in written["policies"]
            ),
            select_policy=SelectPolicy(written.get("selectPolicy", "Max")),
        )
    assert (policy.staleness.max_age_seconds, policy.staleness.action) == (
        autoscaling["metrics"]["maxAgeSeconds"],
        StaleMetricsAction(autoscaling["metrics"]["onStale"]),
    )
    assert (compiled.policy_name, compiled.metrics_window_seconds) == (
        "interactive",
        slo["goodput"]["windowSeconds"],
    )


@pytest.mark.parametrize(
    ("signal", "field"),
    [("queueWork", "queue_work"), ("slack", "slack"), ("kvCache", "kv_cache"), ("goodput", "goodput")],
    ids=["queue work", "slack", "kv cache", "goodput"],
)
def test_a_disabled_signal_proposes_nothing(signal: str, field: str) -> None:
    body = copy.deepcopy(INTERACTIVE)
    body["spec"]["autoscaling"]["signals"][signal]["enabled"] = False
    policy = scaling_policy(model_group().spec, SloPolicy.model_validate(body).spec)
    assert getattr(policy.signals, field) is None
    others = {"queue_work", "slack", "kv_cache", "goodput"} - {field}
    assert all(getattr(policy.signals, other) is not None for other in others)


@dataclass(frozen=True)
class ModeCase:
    name: str
    mode: str
    shadow: bool
    expected: Mode


MODE_CASES = [
    ModeCase("an active policy acts", "Active", False, Mode.ACTIVE),
    ModeCase("an active policy in the shadow slot only advises", "Active", True, Mode.ADVISORY),
    ModeCase("an advisory policy advises", "Advisory", False, Mode.ADVISORY),
    ModeCase("a frozen policy stays frozen", "Frozen", False, Mode.FROZEN),
    ModeCase("a frozen shadow policy stays frozen", "Frozen", True, Mode.FROZEN),
]


@pytest.mark.parametrize("case", MODE_CASES, ids=[case.name for case in MODE_CASES])
def test_modes(case: ModeCase) -> None:
    policy = scaling_policy(model_group().spec, slo_policy(mode=case.mode).spec, shadow=case.shadow)
    assert policy.mode is case.expected


def test_empty_step_policies_mean_no_step_limit_and_disabled_stays_disabled() -> None:
    unlimited = scaling_rules(
        SloPolicy.model_validate(INTERACTIVE).spec.autoscaling.scale_up.model_copy(update={"policies": ()}),
        max_groups=8,
    )
    assert unlimited.policies == (StepPolicy(StepPolicyType.GROUPS, 8, 1.0),)
    disabled = scaling_rules(
        SloPolicy.model_validate(INTERACTIVE).spec.autoscaling.scale_down.model_copy(
            update={"policies": (), "select_policy": "Disabled"}
        ),
        max_groups=8,
    )
    assert (disabled.policies, disabled.select_policy) == ((), SelectPolicy.DISABLED)


def test_the_profile_is_the_service_time_model_at_the_primary_class() -> None:
    group = model_group()
    profile = capacity_profile(group.spec, slo_policy().spec)
    assert not isinstance(profile, str)
    assert profile.step_model == StepCostModel.from_hardware(LLAMA_3_1_8B, H100_80G)
    primary = INTERACTIVE["spec"]["classes"][0]
    assert (profile.itl_target_seconds, profile.ttft_target_seconds) == (
        primary["itlSeconds"],
        primary["ttftSeconds"],
    )
    written = MODEL_GROUP["spec"]["profile"]
    assert (profile.max_num_seqs, profile.max_num_batched_tokens) == (
        written["maxNumSeqs"],
        written["maxNumBatchedTokens"],
    )


def test_measured_kv_size_and_capacity_replace_the_model() -> None:
    profile_spec = {
        **MODEL_GROUP["spec"]["profile"],
        "kvCapacityTokens": 123456,
        "capacityWorkSecondsPerSecond": 0.5,
    }
    profile = capacity_profile(
        model_group(profile=profile_spec).spec, slo_policy().spec, ReferenceMix(1000, 200)
    )
    assert not isinstance(profile, str)
    assert profile.kv_capacity_tokens == 123456
    assert (profile.reference_input_tokens, profile.reference_output_tokens) == (1000, 200)
    assert profile.reference.work_per_second == pytest.approx(0.5)


def test_an_unknown_gpu_is_priced_on_the_reference_gpu_once_measured() -> None:
    measured = {
        "gpu": "gaudi3",
        "kvCapacityTokens": 900000,
        "capacityWorkSecondsPerSecond": 0.7,
        "maxNumSeqs": 512,
        "maxNumBatchedTokens": 16384,
    }
    profile = capacity_profile(model_group(profile=measured).spec, slo_policy().spec)
    assert not isinstance(profile, str)
    assert profile.kv_capacity_tokens == 900000
    assert profile.reference.work_per_second == pytest.approx(0.7)


@dataclass(frozen=True)
class ProblemCase:
    name: str
    profile: dict[str, Any]
    model: dict[str, Any] | None
    mentions: tuple[str, ...]


PROBLEMS = [
    ProblemCase(
        "an unknown gpu without measurements",
        {"gpu": "gaudi3"},
        None,
        ("spec.profile.kvCapacityTokens", "spec.profile.capacityWorkSecondsPerSecond"),
    ),
    ProblemCase(
        "an unknown gpu with half the measurements",
        {"gpu": "gaudi3", "kvCapacityTokens": 1000},
        None,
        ("spec.profile.capacityWorkSecondsPerSecond",),
    ),
    ProblemCase(
        "a model outside the catalog without a shape",
        {"gpu": "h100-80g"},
        {"name": "acme/secret-model"},
        ("spec.profile.modelShape",),
    ),
    ProblemCase(
        "a model too large for its GPUs",
        {"gpu": "h100-80g"},
        {"name": "meta-llama/Llama-3.1-70B-Instruct"},
        ("no KV cache",),
    ),
]


@pytest.mark.parametrize("case", PROBLEMS, ids=[case.name for case in PROBLEMS])
def test_what_cannot_be_priced_is_reported_not_guessed(case: ProblemCase) -> None:
    changes: dict[str, Any] = {"profile": case.profile}
    if case.model is not None:
        changes["model"] = case.model
    group = model_group(**changes)
    problem = compile_policy(group, slo_policy())
    assert isinstance(problem, str)
    assert all(text in problem for text in case.mentions), problem
    assert isinstance(step_cost_model(group.spec), str) or isinstance(
        capacity_profile(group.spec, slo_policy().spec), str
    )


def test_a_policy_the_slopolicy_controller_would_not_accept_is_not_compiled() -> None:
    # A scale-down window shorter than the interval holds a single recommendation.
    policy = slo_policy(scaleDown={"stabilizationWindowSeconds": 5}, intervalSeconds=15)
    problem = compile_policy(model_group(), policy)
    assert isinstance(problem, str) and "stabilizationWindowSeconds" in problem


def test_the_profile_key_follows_what_the_profile_reads_only() -> None:
    group, policy = model_group(), slo_policy()
    key = profile_key(group.spec, policy.spec)
    assert profile_key(model_group(replicas=5).spec, policy.spec) == key
    assert profile_key(group.spec, slo_policy(intervalSeconds=30).spec) == key
    assert profile_key(model_group(profile={"gpu": "a100-80g"}).spec, policy.spec) != key
    tighter = copy.deepcopy(INTERACTIVE)
    tighter["spec"]["classes"][0]["itlSeconds"] = 0.05
    assert profile_key(group.spec, SloPolicy.model_validate(tighter).spec) != key
    fp8_kv = copy.deepcopy(MODEL_GROUP["spec"]["engine"])
    fp8_kv["args"].append("--kv-cache-dtype=fp8")
    assert profile_key(model_group(engine=fp8_kv).spec, policy.spec) != key


def test_an_edited_configmap_rebuilds_the_profile_that_reads_it() -> None:
    group = model_group(profile={"gpu": "h100-80g", "modelConfigRef": {"name": "qwen3"}})
    config = json.loads(MOE_SAMPLE["spec"]["profile"]["modelConfig"])
    key = profile_key(group.spec, slo_policy().spec, referenced=config)
    assert profile_key(group.spec, slo_policy().spec, referenced={**config, "num_experts_per_tok": 4}) != key
    assert profile_key(group.spec, slo_policy().spec, referenced="ConfigMap 'qwen3' does not exist") != key


def test_the_moe_sample_is_priced_from_its_config_on_its_accelerator() -> None:
    group = ModelGroup.model_validate(
        {**MOE_SAMPLE, "metadata": {"name": "qwen3-moe", "namespace": "serving"}}
    )
    profile = capacity_profile(group.spec, slo_policy().spec)
    assert not isinstance(profile, str)
    assert profile.step_model.expert_read_seconds > 0
    assert profile.step_model.kv_bytes_per_token == 48 * 4 * 128 * 2  # K and V in FP8
    assert (profile.max_num_seqs, profile.max_num_batched_tokens) == (256, 2048)  # vLLM's L40S defaults


def test_a_prebuilt_profile_is_used_as_given() -> None:
    group, policy = model_group(), slo_policy()
    profile = capacity_profile(group.spec, policy.spec)
    assert not isinstance(profile, str)
    compiled = compile_policy(group, policy, profile=profile)
    assert isinstance(compiled, CompiledPolicy) and compiled.profile is profile


def test_goodputs_defaults_are_written_once_in_the_api() -> None:
    """A policy that says nothing compiles to the decision's own defaults: both read api/slopolicy.py."""
    spec = SloPolicySpec.model_validate(
        {"revision": "r1", "classes": [{"name": "chat", "ttftSeconds": 1.0, "itlSeconds": 0.08}]}
    )

    compiled = bounded_scaling_policy(GroupBounds(1, 16, 0), spec)

    assert compiled == ScalingPolicy(min_groups=1, max_groups=16, revision="r1", classes=compiled.classes)
    assert compiled.classes == (SloTargets("chat", 1.0, 0.08),)


@pytest.mark.parametrize(
    ("kv_offload", "cpu_bytes"),
    [
        pytest.param(None, None, id="no CPU tier: the gateway never offloads"),
        pytest.param({"cpuSizeGib": 64}, 64 * 2**30, id="a 64 GiB CPU tier"),
    ],
)
def test_kv_offload_reaches_the_request_paths_tool_wait_policy(
    kv_offload: dict[str, Any] | None, cpu_bytes: int | None
) -> None:
    group = model_group(**({"kvOffload": kv_offload} if kv_offload else {}))
    compiled = compile_request_path(group, slo_policy())
    assert isinstance(compiled, RequestPathPolicy), compiled
    assert compiled.tool_waits.offload_cpu_bytes == cpu_bytes
    assert compiled.tool_waits.offload_enabled is (cpu_bytes is not None)
