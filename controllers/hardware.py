"""What a ModelGroup's model and hardware mean to the service-time model: goodput's catalog lookups.

The API records what the user wrote (a GPU name, a model id, an optional architecture, measured
figures); this module looks those up in the service-time model's catalog (`estimators.service_time`)
and folds in the measured figures. It is the one place that does, for the operator, the simulator
and the test bed alike, so an unknown GPU means the same thing to all of them: priced as on
`REFERENCE_GPU` when the profile gives the measured KV size and capacity, else not priced at all.
"""

from __future__ import annotations

import dataclasses

from goodput.api.modelgroup import ModelGroupSpec, ModelShapeSpec, Profile
from goodput.estimators.service_time import (
    GPUS,
    H100_80G,
    MODELS,
    GpuSpec,
    ModelShape,
    StepCostModel,
    default_batch_limits,
)

# Pricing reference for accelerators the service-time model does not know: work is then priced as on
# this GPU, and the measured capacity (in those work-seconds) and KV size replace the model's.
REFERENCE_GPU = H100_80G


def catalog_model_key(model_name: str) -> str:
    """Catalog key of a model id: 'meta-llama/Llama-3.1-8B-Instruct' -> 'llama-3.1-8b'."""
    base = model_name.rstrip("/").rsplit("/", 1)[-1].lower()
    return base.removesuffix("-instruct")


def shape_of(shape: ModelShapeSpec, name: str) -> ModelShape:
    return ModelShape(
        name,
        shape.parameters,
        shape.layers,
        shape.hidden_size,
        shape.kv_heads,
        shape.head_dim,
        shape.dtype_bytes,
    )


def model_shape(spec: ModelGroupSpec) -> ModelShape | None:
    """The profile's shape, else the catalog's shape for `model.name`, else None."""
    if spec.profile is not None and spec.profile.model_shape is not None:
        return shape_of(spec.profile.model_shape, spec.model.name)
    return MODELS.get(catalog_model_key(spec.model.name))


def gpu_spec(profile: Profile | None) -> GpuSpec | None:
    """The service-time model's figures for the profile's `gpu`, or None when goodput does not know it."""
    return None if profile is None else GPUS.get(profile.gpu)


def batch_limits(spec: ModelGroupSpec) -> tuple[int, int] | None:
    """(max_num_seqs, max_num_batched_tokens) each group runs with, or None when unknown."""
    if spec.profile is None:
        return None
    gpu = gpu_spec(spec.profile)
    default_seqs, default_tokens = default_batch_limits(gpu) if gpu is not None else (None, None)
    seqs = spec.profile.max_num_seqs or default_seqs
    tokens = spec.profile.max_num_batched_tokens or default_tokens
    return None if seqs is None or tokens is None else (seqs, tokens)


def step_cost_model(spec: ModelGroupSpec) -> StepCostModel | str:
    """The service-time model of one group, with the measured KV size when the profile gives one,
    or why there is none."""
    profile = spec.profile
    if profile is None:
        return "spec.profile is required with a policy: the autoscaler prices work with it"
    shape = model_shape(spec)
    if shape is None:
        return (
            f"spec.profile.modelShape is required: {spec.model.name!r} is not in goodput's model catalog, "
            "so its tokens cannot be priced"
        )
    gpu = gpu_spec(profile)
    if gpu is None:
        missing = [
            name
            for name, value in (
                ("kvCapacityTokens", profile.kv_capacity_tokens),
                ("capacityWorkSecondsPerSecond", profile.capacity_work_seconds_per_second),
            )
            if value is None
        ]
        if missing:
            return (
                f"spec.profile.gpu {profile.gpu!r} is not one goodput's service-time model knows: set "
                + " and ".join(f"spec.profile.{name}" for name in missing)
                + " from a benchmark"
            )
        gpu = REFERENCE_GPU
    model = StepCostModel.from_hardware(shape, gpu, spec.parallelism.tensor, spec.parallelism.pipeline)
    if profile.kv_capacity_tokens is not None:
        model = dataclasses.replace(model, kv_capacity_tokens=profile.kv_capacity_tokens)
    if model.kv_capacity_tokens <= 0:
        return (
            f"the weights of {spec.model.name!r} leave no KV cache on {spec.parallelism.gpus_per_group} "
            f"{profile.gpu} GPU(s): raise parallelism or set spec.profile.kvCapacityTokens"
        )
    return model
