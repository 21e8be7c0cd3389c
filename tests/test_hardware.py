"""Catalog lookups of a ModelGroup's model and hardware (goodput.controllers.hardware)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from test_api_models import minimal_model_group_spec

from goodput.api.modelgroup import ModelGroupSpec
from goodput.controllers.hardware import (
    REFERENCE_GPU,
    batch_limits,
    catalog_model_key,
    engine_flag,
    gpu_spec,
    model_shape,
    resolve_model_shape,
    step_cost_model,
)
from goodput.estimators.model_config import model_shape as config_shape
from goodput.estimators.model_config import parse_model_config
from goodput.estimators.service_time import (
    GPUS,
    H100_80G,
    LLAMA_3_1_8B,
    LLAMA_3_1_70B,
    ModelShape,
    StepCostModel,
)
from goodput.simulator.published import QWEN3_30B_A3B


@pytest.mark.parametrize(
    ("model_name", "key"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"),
        ("meta-llama/Llama-3.1-70B", "llama-3.1-70b"),
        ("/models/llama-3.1-70b-instruct/", "llama-3.1-70b"),
        ("mistralai/Mistral-7B-v0.3", "mistral-7b-v0.3"),
    ],
    ids=["hub-instruct", "hub-base", "local-path", "unknown-model"],
)
def test_catalog_key_ignores_organisation_case_and_instruct_suffix(model_name: str, key: str) -> None:
    assert catalog_model_key(model_name) == key


def test_profile_resolves_the_service_time_model_for_the_groups_parallelism() -> None:
    spec = ModelGroupSpec.model_validate(
        minimal_model_group_spec(
            model={"name": "meta-llama/Llama-3.1-70B-Instruct"},
            parallelism={"tensor": 8, "pipeline": 2, "gpusPerPod": 8},
            profile={"gpu": "h100-80g"},
        )
    )

    expected = StepCostModel.from_hardware(LLAMA_3_1_70B, H100_80G, 8, 2)
    assert step_cost_model(spec) == expected
    assert batch_limits(spec) == (1024, 8192)


def test_measured_profile_figures_override_the_estimates() -> None:
    shape = {"parameters": 7.2e9, "layers": 32, "hiddenSize": 4096, "kvHeads": 8, "headDim": 128}
    spec = ModelGroupSpec.model_validate(
        minimal_model_group_spec(
            model={"name": "mistralai/Mistral-7B-v0.3"},
            profile={"gpu": "a100-80g", "modelShape": shape, "kvCapacityTokens": 123_456, "maxNumSeqs": 64},
        )
    )

    cost = step_cost_model(spec)
    assert isinstance(cost, StepCostModel)
    assert cost.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2
    assert cost.kv_capacity_tokens == 123_456
    assert batch_limits(spec) == (64, 2048)


@pytest.mark.parametrize(
    ("model", "profile", "named"),
    [
        ("meta-llama/Llama-3.1-8B", None, "spec.profile"),
        ("meta-llama/Llama-3.1-8B", {"gpu": "gaudi3"}, "spec.profile.kvCapacityTokens"),
        ("mistralai/Mistral-7B-v0.3", {"gpu": "h100-80g"}, "spec.profile.modelShape"),
    ],
    ids=["no-profile", "unknown-gpu", "unknown-model-shape"],
)
def test_unknown_hardware_or_model_gives_the_missing_field_rather_than_a_wrong_estimate(
    model: str, profile: dict[str, Any] | None, named: str
) -> None:
    overrides: dict[str, Any] = {"model": {"name": model}}
    if profile is not None:
        overrides["profile"] = profile
    spec = ModelGroupSpec.model_validate(minimal_model_group_spec(**overrides))

    problem = step_cost_model(spec)
    assert isinstance(problem, str) and named in problem


def test_an_unknown_gpu_with_measured_figures_is_priced_as_the_reference_gpu() -> None:
    spec = ModelGroupSpec.model_validate(
        minimal_model_group_spec(
            profile={"gpu": "gaudi3", "kvCapacityTokens": 500_000, "capacityWorkSecondsPerSecond": 3.0}
        )
    )

    cost = step_cost_model(spec)
    assert isinstance(cost, StepCostModel)
    assert cost == dataclasses.replace(
        StepCostModel.from_hardware(LLAMA_3_1_8B, REFERENCE_GPU), kv_capacity_tokens=500_000
    )
    assert gpu_spec(spec.profile) is None
    assert batch_limits(spec) is None  # vLLM's defaults are not known for that GPU either


# --- a model described by its config.json, an accelerator by its datasheet -------------------------

QWEN3_MOE_FP8 = {**QWEN3_30B_A3B, "quantization_config": {"quant_method": "fp8"}}


def _spec(
    profile: dict[str, Any], args: tuple[str, ...] = (), model: str = "Qwen/Qwen3-30B-A3B-FP8"
) -> ModelGroupSpec:
    """profile: its `modelConfig` may be given as an object; it is written as the text a user pastes."""
    if isinstance(profile.get("modelConfig"), dict):
        profile = {**profile, "modelConfig": json.dumps(profile["modelConfig"])}
    return ModelGroupSpec.model_validate(
        minimal_model_group_spec(
            model={"name": model},
            engine={"image": "vllm/vllm-openai:v0.33.0", "args": list(args)},
            profile=profile,
        )
    )


def test_a_config_json_given_inline_prices_the_model_on_a_catalogue_accelerator() -> None:
    spec = _spec({"gpu": "l40s", "modelConfig": QWEN3_MOE_FP8}, args=("--kv-cache-dtype=fp8",))

    shape = resolve_model_shape(spec)
    assert isinstance(shape, ModelShape)
    expected = config_shape(parse_model_config(QWEN3_MOE_FP8), spec.model.name, kv_cache_bytes=1)
    assert step_cost_model(spec) == StepCostModel.from_hardware(expected, GPUS["l40s"])
    assert (shape.experts, shape.gemm_precision, shape.kv_element_bytes) == (128, "fp8", 1)
    assert batch_limits(spec) == (256, 2048)


def test_the_engines_kv_cache_dtype_and_quantisation_flags_reach_the_model() -> None:
    bf16 = {key: value for key, value in QWEN3_MOE_FP8.items() if key != "quantization_config"}
    quantised_at_load = resolve_model_shape(
        _spec({"gpu": "h100-80g", "modelConfig": bf16}, ("--quantization", "fp8"))
    )
    assert isinstance(quantised_at_load, ModelShape) and quantised_at_load.gemm_precision == "fp8"
    catalogue = resolve_model_shape(
        _spec({"gpu": "h100-80g"}, ("--kv-cache-dtype", "fp8_e4m3"), model="meta-llama/Llama-3.1-8B-Instruct")
    )
    assert (
        isinstance(catalogue, ModelShape)
        and catalogue.kv_bytes_per_token == LLAMA_3_1_8B.kv_bytes_per_token // 2
    )


@pytest.mark.parametrize(
    ("args", "value"),
    [
        (("--kv-cache-dtype", "fp8"), "fp8"),
        (("--kv-cache-dtype=fp8_e5m2",), "fp8_e5m2"),
        (("--kv_cache_dtype", "auto"), "auto"),
        (("--kv-cache-dtype=fp8", "--kv-cache-dtype", "auto"), "auto"),
        (("--kv-cache-dtype",), None),
        (("--max-model-len", "4096"), None),
    ],
)
def test_engine_flags_are_read_in_either_form_the_last_one_winning(
    args: tuple[str, ...], value: str | None
) -> None:
    assert engine_flag(args, "--kv-cache-dtype") == value


def test_a_described_accelerator_is_priced_from_its_figures() -> None:
    described = {
        "bf16Flops": 500e12,
        "fp8Flops": 1000e12,
        "memoryBandwidthBytesPerSecond": 2e12,
        "memoryBytes": 96e9,
        "interconnectBytesPerSecond": 400e9,
    }
    spec = _spec({"gpu": "acme-x1", "accelerator": described, "modelConfig": QWEN3_MOE_FP8})

    gpu = gpu_spec(spec.profile)
    assert gpu is not None and (gpu.name, gpu.gemm_flops("fp8"), gpu.memory_bytes) == (
        "acme-x1",
        1000e12,
        96e9,
    )
    cost = step_cost_model(spec)
    assert isinstance(cost, StepCostModel)
    assert cost.compute_seconds_per_token == pytest.approx(
        2 * parse_model_config(QWEN3_MOE_FP8).active_parameters / (1000e12 * gpu.compute_efficiency)
    )
    assert batch_limits(spec) == (1024, 8192)  # 96 GB is past vLLM's 70 GiB line


@pytest.mark.parametrize(
    ("profile", "referenced", "mentions"),
    [
        (
            {"gpu": "h100-80g", "modelConfig": {**QWEN3_MOE_FP8, "num_hidden_layers": None}},
            None,
            ("spec.profile.modelConfig", "`num_hidden_layers`", "spec.profile.modelShape"),
        ),
        (
            {"gpu": "h100-80g", "modelConfig": {**QWEN3_MOE_FP8, "model_type": "gpt_oss"}},
            None,
            ("spec.profile.modelConfig", "'gpt_oss'"),
        ),
        (
            {"gpu": "h100-80g", "modelConfigRef": {"name": "qwen3"}},
            None,
            ("ConfigMap 'qwen3'", "not read here", "spec.profile.modelConfig"),
        ),
        (
            {"gpu": "h100-80g", "modelConfigRef": {"name": "qwen3"}},
            "ConfigMap 'qwen3' in namespace 'team' (spec.profile.modelConfigRef) does not exist: create it",
            ("does not exist", "create it"),
        ),
        (
            {"gpu": "h100-80g", "modelConfigRef": {"name": "qwen3", "key": "qwen.json"}},
            {"model_type": "llama"},
            ("ConfigMap 'qwen3' key 'qwen.json'", "`num_hidden_layers`"),
        ),
        ({"gpu": "gaudi3", "modelConfig": QWEN3_MOE_FP8}, None, ("spec.profile.accelerator", "mi300x")),
    ],
    ids=[
        "field-missing",
        "unknown-architecture",
        "configmap-not-read",
        "configmap-missing",
        "configmap-bad",
        "gpu",
    ],
)
def test_an_unusable_config_or_accelerator_is_named_and_never_priced(
    profile: dict[str, Any], referenced: Any, mentions: tuple[str, ...]
) -> None:
    problem = step_cost_model(_spec(profile), referenced)
    assert isinstance(problem, str)
    assert all(text in problem for text in mentions), problem


def test_a_config_read_from_a_configmap_prices_as_the_same_config_inline() -> None:
    inline = step_cost_model(_spec({"gpu": "mi300x", "modelConfig": QWEN3_MOE_FP8}))
    referenced = step_cost_model(_spec({"gpu": "mi300x", "modelConfigRef": {"name": "qwen3"}}), QWEN3_MOE_FP8)
    assert isinstance(inline, StepCostModel) and inline == referenced
    assert model_shape(_spec({"gpu": "mi300x", "modelConfigRef": {"name": "qwen3"}})) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("{not json", "spec.profile.modelConfig is not JSON", id="not JSON"),
        pytest.param("[1, 2]", "spec.profile.modelConfig is not a JSON object", id="not an object"),
    ],
)
def test_an_inline_config_json_that_is_not_a_json_object_is_named_and_not_priced(
    text: str, expected: str
) -> None:
    spec = _spec({"gpu": "l40s", "modelConfig": text})

    reason = step_cost_model(spec)

    assert isinstance(reason, str)
    assert reason.startswith(expected)
    assert "config.json" in reason
