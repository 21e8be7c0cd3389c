"""From ModelGroup and SLOPolicy manifests to what the simulator needs.

The manifests are parsed with the API models (`goodput.api`), exactly as the operator parses them,
so a sample that the API server would reject is rejected here too. Without manifests the simulator
uses the defaults below (Llama-3.1-8B on one H100, one interactive class), and says so in the report.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from goodput.api.modelgroup import ModelGroup
from goodput.api.slopolicy import SloPolicy
from goodput.controllers.hardware import batch_limits, gpu_spec, resolve_model_shape, step_cost_model
from goodput.estimators.service_time import GPUS, H100_80G, LLAMA_3_1_8B, default_batch_limits
from goodput.simulator.engine import EngineConfig
from goodput.simulator.fleet import FleetConfig
from goodput.simulator.group_world import GroupRules
from goodput.simulator.report import ClassTargets

DEFAULT_READY_TIME_SECONDS = 120.0
DEFAULT_MAX_GROUPS = 16
DEFAULT_CLASSES = (
    ClassTargets(
        "interactive", ttft_seconds=1.0, itl_seconds=0.08, e2e_seconds=None, attainment=0.99, percentile=0.99
    ),
)


@dataclass(frozen=True, slots=True)
class SimulationSetup:
    """The served model, its hardware, the fleet bounds and the SLO, for one simulated ModelGroup."""

    engine: EngineConfig
    model_name: str
    gpu_name: str
    tensor_parallel: int
    pipeline_parallel: int
    min_groups: int
    max_groups: int
    warm_groups: int
    ready_time_seconds: float
    classes: tuple[ClassTargets, ...]
    model_group: ModelGroup | None
    slo_policy: SloPolicy | None
    measured_capacity_work_seconds_per_second: float | None
    sources: tuple[str, ...]

    @property
    def gpus_per_group(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel

    def fleet(self) -> FleetConfig:
        """The simulated fleet of this ModelGroup: its engine, bounds, ready time and ITL targets, and
        its group controller's rules (minimum lifetime, drain, template) compiled from the ModelGroup
        as the operator compiles them. A run sets its own fields (router, failures, prefix blocks)
        with `dataclasses.replace`."""
        rules = GroupRules.for_model_group(self.model_group) if self.model_group is not None else None
        return FleetConfig(
            engine=self.engine,
            gpus_per_group=self.gpus_per_group,
            min_groups=self.min_groups,
            max_groups=self.max_groups,
            ready_time_median_seconds=self.ready_time_seconds,
            itl_targets_seconds=tuple(c.itl_seconds for c in self.classes),
            group_rules=rules,
        )

    def describe(self) -> dict[str, Any]:
        return {
            "model": self.model_name,
            "gpu": self.gpu_name,
            "tensor_parallel": self.tensor_parallel,
            "pipeline_parallel": self.pipeline_parallel,
            "gpus_per_group": self.gpus_per_group,
            "max_num_seqs": self.engine.max_num_seqs,
            "max_num_batched_tokens": self.engine.max_num_batched_tokens,
            "kv_capacity_tokens": self.engine.kv_capacity_tokens,
            "min_groups": self.min_groups,
            "max_groups": self.max_groups,
            "warm_groups": self.warm_groups,
            "ready_time_median_seconds": self.ready_time_seconds,
            "step_noise_sigma": self.engine.step_noise_sigma,
            "policy_revision": self.slo_policy.spec.revision if self.slo_policy is not None else None,
            "sources": list(self.sources),
        }


def _read_yaml(path: Path) -> dict[str, Any]:
    document = yaml.safe_load(path.read_text())
    if not isinstance(document, dict):
        raise ValueError(f"{path}: expected one YAML object")
    return document


def load_model_group(path: Path) -> ModelGroup:
    return ModelGroup.model_validate(_read_yaml(path))


def load_slo_policy(path: Path) -> SloPolicy:
    return SloPolicy.model_validate(_read_yaml(path))


def class_targets(policy: SloPolicy) -> tuple[ClassTargets, ...]:
    return tuple(
        ClassTargets(
            name=c.name,
            ttft_seconds=c.ttft_seconds,
            itl_seconds=c.itl_seconds,
            e2e_seconds=c.e2e_seconds,
            attainment=c.attainment,
            percentile=c.percentile,
        )
        for c in policy.spec.classes
    )


@dataclass(frozen=True, slots=True)
class _FleetShape:
    """What a ModelGroup (or the default one) says about the simulated fleet."""

    engine: EngineConfig
    tensor: int
    pipeline: int
    min_groups: int
    max_groups: int
    warm_groups: int
    profile_ready_seconds: float | None
    measured_capacity: float | None
    model_name: str
    gpu_name: str
    source: str


def _model_group_fleet(model_group: ModelGroup, path: Path, step_noise_sigma: float) -> _FleetShape:
    """The engine a ModelGroup's model, GPU and parallelism price, and its bounds and profile."""
    spec = model_group.spec
    profile = spec.profile
    shape = resolve_model_shape(spec)
    if isinstance(shape, str):
        raise ValueError(f"{path}: the simulator cannot price its steps: {shape}")
    gpu = gpu_spec(profile)
    if gpu is None:
        raise ValueError(
            f"{path}: the simulator needs profile.gpu from goodput's catalogue ({', '.join(GPUS)}) or "
            "profile.accelerator to price steps"
        )
    # The operator's step model of the group (its measured KV size included), so both worlds price
    # the same steps.
    cost = step_cost_model(spec)
    if isinstance(cost, str):
        raise ValueError(f"{path}: the simulator cannot price its steps: {cost}")
    tensor, pipeline = spec.parallelism.tensor, spec.parallelism.pipeline
    seqs, tokens = batch_limits(spec) or default_batch_limits(gpu)
    kv_tokens = cost.kv_capacity_tokens
    engine = EngineConfig(
        cost=cost,
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
        kv_capacity_tokens=kv_tokens,
        step_noise_sigma=step_noise_sigma,
    )
    return _FleetShape(
        engine=engine,
        tensor=tensor,
        pipeline=pipeline,
        min_groups=spec.min_replicas,
        max_groups=spec.max_replicas,
        warm_groups=spec.warm_replicas,
        profile_ready_seconds=profile.ready_time_seconds if profile is not None else None,
        measured_capacity=profile.capacity_work_seconds_per_second if profile is not None else None,
        model_name=spec.model.name,
        gpu_name=gpu.name,
        source=f"ModelGroup {path}",
    )


def _default_fleet(step_noise_sigma: float) -> _FleetShape:
    return _FleetShape(
        engine=EngineConfig.for_hardware(LLAMA_3_1_8B, H100_80G, step_noise_sigma=step_noise_sigma),
        tensor=1,
        pipeline=1,
        min_groups=1,
        max_groups=DEFAULT_MAX_GROUPS,
        warm_groups=0,
        profile_ready_seconds=None,
        measured_capacity=None,
        model_name=LLAMA_3_1_8B.name,
        gpu_name=H100_80G.name,
        source="default ModelGroup: Llama-3.1-8B, one H100 per group, 1..16 groups",
    )


def build_setup(
    model_group_path: Path | None,
    policy_path: Path | None,
    *,
    ready_time_seconds: float | None = None,
    step_noise_sigma: float = 0.0,
    max_groups: int | None = None,
) -> SimulationSetup:
    """Read the manifests (either may be absent) and fold them into a `SimulationSetup`.

    ready_time_seconds: the median group ready time; overrides the profile's `readyTimeSeconds`.
    max_groups: overrides `maxReplicas` (a what-if with a larger GPU budget).
    """
    sources: list[str] = []
    model_group = load_model_group(model_group_path) if model_group_path is not None else None
    slo_policy = load_slo_policy(policy_path) if policy_path is not None else None
    fleet = (
        _model_group_fleet(model_group, model_group_path, step_noise_sigma)
        if model_group is not None and model_group_path is not None
        else _default_fleet(step_noise_sigma)
    )
    sources.append(fleet.source)
    if slo_policy is not None:
        classes = class_targets(slo_policy)
        sources.append(f"SLOPolicy {policy_path}")
    else:
        classes = DEFAULT_CLASSES
        sources.append("default SLO: one interactive class, TTFT 1 s, ITL 80 ms at p99, attainment 0.99")
    ready = (
        ready_time_seconds
        if ready_time_seconds is not None
        else (
            float(fleet.profile_ready_seconds)
            if fleet.profile_ready_seconds is not None
            else DEFAULT_READY_TIME_SECONDS
        )
    )
    return SimulationSetup(
        engine=fleet.engine,
        model_name=fleet.model_name,
        gpu_name=fleet.gpu_name,
        tensor_parallel=fleet.tensor,
        pipeline_parallel=fleet.pipeline,
        min_groups=fleet.min_groups,
        max_groups=max_groups if max_groups is not None else fleet.max_groups,
        warm_groups=fleet.warm_groups,
        ready_time_seconds=ready,
        classes=classes,
        model_group=model_group,
        slo_policy=slo_policy,
        measured_capacity_work_seconds_per_second=fleet.measured_capacity,
        sources=tuple(sources),
    )
