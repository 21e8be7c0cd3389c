"""What a ModelGroup's model and hardware mean to the service-time model: goodput's catalog lookups.

The API records what the user wrote (a GPU name or its datasheet figures, a model id, an optional
architecture or the checkpoint's config.json, measured figures); this module turns those into the
service-time model's `ModelShape` and `GpuSpec` and folds in the measured figures. It is the one
place that does, for the operator, the simulator and the test bed alike, so an unknown GPU means
the same thing to all of them: priced as on `REFERENCE_GPU` when the profile gives the measured KV
size and capacity, else not priced at all. A config.json that cannot be read is never guessed
around either: the reason, naming the field and what to set, is what the caller reports.

The model is taken, in this order, from `profile.modelShape`, `profile.modelConfig`,
`profile.modelConfigRef` (a ConfigMap: the operator reads it and passes its content in, since this
layer does no I/O) and goodput's catalogue by the model's name.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from goodput.api.modelgroup import (
    AcceleratorSpec,
    ModelConfigReference,
    ModelGroupSpec,
    ModelShapeSpec,
    Profile,
)
from goodput.estimators.accelerators import (
    PCIE_ALLREDUCE_LATENCY_SECONDS,
    PCIE_GEN4_X16_BYTES_PER_SECOND,
    datasheet_gpu,
)
from goodput.estimators.model_config import ModelConfigError, parse_model_config
from goodput.estimators.model_config import model_shape as config_shape
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

ReadConfig = Mapping[str, Any] | str | None
"""What the operator read from `profile.modelConfigRef`: the parsed config.json, why it could not be
read (naming the ConfigMap and the key), or None where nothing reads ConfigMaps (the simulator)."""


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


def engine_flag(args: Sequence[str], flag: str) -> str | None:
    """The value the engine's arguments give `--some-flag` (or `--some_flag`), in either the
    `--flag value` or the `--flag=value` form; the last one wins, as with argparse."""
    names = {flag, flag.replace("-", "_").replace("__", "--", 1)}
    value = None
    for index, argument in enumerate(args):
        name, equals, inline = argument.partition("=")
        if name in names:
            value = inline if equals else (args[index + 1] if index + 1 < len(args) else None)
    return value


def kv_cache_bytes(spec: ModelGroupSpec) -> int | None:
    """Bytes of a KV element by the engine's --kv-cache-dtype: 1 for FP8, None for the model's own."""
    dtype = engine_flag(spec.engine.args, "--kv-cache-dtype")
    return 1 if dtype is not None and dtype.lower().startswith("fp8") else None


def config_from_text(text: str, where: str) -> Mapping[str, Any] | str:
    """A config.json's text as its object, or why it is not one (naming `where` it was read from).

    One reading for the inline `profile.modelConfig` and a ConfigMap's key, so both say the same."""
    try:
        config = json.loads(text)
    except ValueError as error:
        return f"{where} is not JSON ({error}): give the checkpoint's config.json as it is"
    if not isinstance(config, dict):
        return f"{where} is not a JSON object: give the checkpoint's config.json as it is"
    return config


def resolve_model_shape(spec: ModelGroupSpec, referenced: ReadConfig = None) -> ModelShape | str:
    """The model's shape (see the module docstring for the order), or why it has none."""
    profile = spec.profile
    shape: ModelShape | str | None
    if profile is not None and profile.model_shape is not None:
        shape = shape_of(profile.model_shape, spec.model.name)
    elif profile is not None and profile.model_config_json is not None:
        inline = config_from_text(profile.model_config_json, "spec.profile.modelConfig")
        shape = inline if isinstance(inline, str) else _from_config(spec, inline, "spec.profile.modelConfig")
    elif profile is not None and profile.model_config_ref is not None:
        shape = _referenced_shape(spec, profile.model_config_ref, referenced)
    else:
        shape = MODELS.get(catalog_model_key(spec.model.name))
    if shape is None:
        return (
            f"spec.profile.modelConfig (the checkpoint's config.json) or spec.profile.modelShape is "
            f"required: {spec.model.name!r} is not in goodput's model catalog, so its tokens cannot be priced"
        )
    kv_bytes = kv_cache_bytes(spec)
    if isinstance(shape, ModelShape) and kv_bytes is not None:
        shape = dataclasses.replace(shape, kv_dtype_bytes=kv_bytes)
    return shape


def _referenced_shape(
    spec: ModelGroupSpec, reference: ModelConfigReference, referenced: ReadConfig
) -> ModelShape | str:
    where = f"ConfigMap {reference.name!r} key {reference.key!r} (spec.profile.modelConfigRef)"
    if referenced is None:
        return f"{where} was not read here: put the config.json inline as spec.profile.modelConfig"
    if isinstance(referenced, str):
        return referenced
    return _from_config(spec, referenced, where)


def _from_config(spec: ModelGroupSpec, config: Mapping[str, Any], where: str) -> ModelShape | str:
    quantization = engine_flag(spec.engine.args, "--quantization")
    try:
        architecture = parse_model_config(config, quantization)
    except ModelConfigError as error:
        return f"{where}: {error}"
    return config_shape(architecture, spec.model.name)


def model_shape(spec: ModelGroupSpec) -> ModelShape | None:
    """The shape the spec itself gives (profile or catalog), or None; no ConfigMap is read."""
    shape = resolve_model_shape(spec)
    return shape if isinstance(shape, ModelShape) else None


def accelerator_gpu(name: str, described: AcceleratorSpec) -> GpuSpec:
    """A GPU from the figures a ModelGroup gives, with the assumed efficiencies (as the catalogue's
    datasheet-only entries have)."""
    link = described.interconnect_bytes_per_second or PCIE_GEN4_X16_BYTES_PER_SECOND
    return datasheet_gpu(
        name,
        bf16_flops=described.bf16_flops,
        fp8_flops=described.fp8_flops or 0.0,
        fp4_flops=described.fp4_flops or 0.0,
        memory_bytes=described.memory_bytes,
        bandwidth_bytes_per_second=described.memory_bandwidth_bytes_per_second,
        link_bytes_per_second=link,
        allreduce_latency_seconds=PCIE_ALLREDUCE_LATENCY_SECONDS,
        source=f"spec.profile.accelerator of the ModelGroup ({name})",
    )


def gpu_spec(profile: Profile | None) -> GpuSpec | None:
    """The service-time model's figures for the profile's accelerator (described, else the catalogue's
    `gpu`), or None when goodput does not know it."""
    if profile is None:
        return None
    if profile.accelerator is not None:
        return accelerator_gpu(profile.gpu, profile.accelerator)
    return GPUS.get(profile.gpu)


def batch_limits(spec: ModelGroupSpec) -> tuple[int, int] | None:
    """(max_num_seqs, max_num_batched_tokens) each group runs with, or None when unknown."""
    if spec.profile is None:
        return None
    gpu = gpu_spec(spec.profile)
    default_seqs, default_tokens = default_batch_limits(gpu) if gpu is not None else (None, None)
    seqs = spec.profile.max_num_seqs or default_seqs
    tokens = spec.profile.max_num_batched_tokens or default_tokens
    return None if seqs is None or tokens is None else (seqs, tokens)


def _unknown_gpu(profile: Profile) -> str | None:
    """Why an accelerator outside the catalogue cannot be priced, or None when the profile's measured
    figures let it be priced as the reference GPU."""
    missing = [
        name
        for name, value in (
            ("kvCapacityTokens", profile.kv_capacity_tokens),
            ("capacityWorkSecondsPerSecond", profile.capacity_work_seconds_per_second),
        )
        if value is None
    ]
    if not missing:
        return None
    return (
        f"spec.profile.gpu {profile.gpu!r} is not one goodput's service-time model knows "
        f"({', '.join(GPUS)}): describe it in spec.profile.accelerator, or set "
        + " and ".join(f"spec.profile.{name}" for name in missing)
        + " from a benchmark"
    )


def step_cost_model(spec: ModelGroupSpec, referenced: ReadConfig = None) -> StepCostModel | str:
    """The service-time model of one group, with the measured KV size when the profile gives one,
    or why there is none. `referenced`: what the operator read from `profile.modelConfigRef`."""
    profile = spec.profile
    if profile is None:
        return "spec.profile is required with a policy: the autoscaler prices work with it"
    shape = resolve_model_shape(spec, referenced)
    if isinstance(shape, str):
        return shape
    gpu = gpu_spec(profile)
    if gpu is None:
        problem = _unknown_gpu(profile)
        if problem is not None:
            return problem
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
