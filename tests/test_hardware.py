"""Catalog lookups of a ModelGroup's model and hardware (goodput.controllers.hardware)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from test_api_models import minimal_model_group_spec

from goodput.api.modelgroup import ModelGroupSpec
from goodput.controllers.hardware import (
    REFERENCE_GPU,
    batch_limits,
    catalog_model_key,
    gpu_spec,
    step_cost_model,
)
from goodput.estimators.service_time import H100_80G, LLAMA_3_1_8B, LLAMA_3_1_70B, StepCostModel


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
