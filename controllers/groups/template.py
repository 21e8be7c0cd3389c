"""From a ModelGroup object to what the group controller acts on, or to why it cannot act.

The API server's schema and CEL rules reject most bad specs. What they cannot see is checked here:
an image reference that no runtime could pull, environment variables the operator owns, a name too
long for the pods derived from it, and a group shape no node of the cluster could ever hold. A spec
that fails any of these is reported as `InvalidSpec` and nothing is created for it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from goodput.api import vllm_names
from goodput.api.modelgroup import (
    GPU_RESOURCE,
    ModelGroup,
    ModelGroupSpec,
    NodeAffinityTerm,
    PodOptions,
    Readiness,
)
from goodput.controllers import naming
from goodput.controllers.groups.agent_sidecar import agent_sidecar
from goodput.controllers.groups.model import ReadinessRules
from goodput.controllers.groups.placement import (
    GroupShape,
    NodeInventory,
    PlacementRules,
    domain_of,
    eligible,
    fits_empty_cluster,
)
from goodput.controllers.groups.pods import OPERATOR_ENV, GroupTemplate
from goodput.controllers.hardware import batch_limits
from goodput.controllers.validation import describe_validation_error

# An OCI image reference: [registry[:port]/]path[:tag][@digest], path components lower case.
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_REFERENCE = re.compile(
    r"^(?:(?P<registry>(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*"
    r"(?::[0-9]+)?)/)?"
    rf"(?P<path>{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
    r"(?:@(?P<digest>[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}))?$"
)


@dataclass(frozen=True, slots=True)
class ControllerTuning:
    """Operator-wide timings that are not part of the API."""

    warmup_retry_seconds: float = 5
    placement_backoff_seconds: float = 300


def parse_model_group(body: Mapping[str, Any]) -> ModelGroup | str:
    """The typed ModelGroup, or a one-line description of every field that does not parse."""
    try:
        return ModelGroup.model_validate(dict(body))
    except ValidationError as error:
        return describe_validation_error(error)


def group_template(model_group: ModelGroup, agent_image: str = "") -> GroupTemplate:
    """agent_image: the operator's health-agent image; empty: no agent is injected."""
    spec = model_group.spec
    meta = model_group.metadata
    limits = batch_limits(spec)
    return GroupTemplate(
        model_group=meta.name or "",
        namespace=meta.namespace or "",
        uid=meta.uid or "",
        model=spec.model.name,
        model_revision=spec.model.revision,
        served_name=spec.model.served_name,
        image=spec.engine.image,
        args=tuple(spec.engine.args) + lora_args(spec) + kv_offload_args(spec),
        # Plain values stay (name, value) pairs, as they always were in the revision hash.
        env=tuple(
            variable if variable.value_from is not None else (variable.name, variable.value or "")
            for variable in spec.engine.env
        )
        + lora_env(spec),
        requests=tuple(sorted((name, str(value)) for name, value in spec.engine.resources.requests.items())),
        limits=tuple(sorted((name, str(value)) for name, value in spec.engine.resources.limits.items())),
        port=spec.engine.port,
        startup_timeout_seconds=spec.engine.startup_timeout_seconds,
        shutdown_timeout_seconds=spec.engine.shutdown_timeout_seconds,
        tensor_parallel=spec.parallelism.tensor,
        pipeline_parallel=spec.parallelism.pipeline,
        gpus_per_pod=spec.parallelism.gpus_per_pod,
        topology_key=spec.placement.topology_key,
        placement_mode=spec.placement.mode,
        tolerations=tuple(spec.placement.tolerations),
        node_selector=tuple((term.key, term.value) for term in spec.placement.node_selector),
        max_num_seqs=limits[0] if limits else None,
        max_num_batched_tokens=limits[1] if limits else None,
        agent=agent_sidecar(spec, agent_image),
        readiness=None if spec.readiness == Readiness() else spec.readiness,
        volume_mounts=tuple(spec.engine.volume_mounts),
        shared_memory_size=None
        if spec.engine.shared_memory_size is None
        else str(spec.engine.shared_memory_size),
        security_context=spec.engine.security_context,
        pod=None if spec.pod == PodOptions() else spec.pod,
        node_affinity=spec.placement.node_affinity,
        gpu_resource_name=None
        if spec.engine.gpu_resource_name == GPU_RESOURCE
        else spec.engine.gpu_resource_name,
        gpu_device_class=spec.engine.gpu_device_class_name,
    )


def lora_args(spec: ModelGroupSpec) -> tuple[str, ...]:
    """vLLM's LoRA flags when the ModelGroup declares adapters: none otherwise, so a ModelGroup
    without adapters keeps its pods (and their revision) as they were. No adapter is named at start:
    the gateway loads each into the group a request for it is routed to."""
    if not spec.adapters:
        return ()
    limits = spec.adapter_limits
    args = [
        vllm_names.Lora.ENABLE_FLAG,
        vllm_names.Lora.MAX_LORAS_FLAG,
        str(limits.max_loaded_per_group),
        vllm_names.Lora.MAX_RANK_FLAG,
        str(limits.max_rank),
    ]
    if limits.max_cpu_loaded is not None:
        args += [vllm_names.Lora.MAX_CPU_LORAS_FLAG, str(limits.max_cpu_loaded)]
    return tuple(args)


def kv_offload_args(spec: ModelGroupSpec) -> tuple[str, ...]:
    """vLLM's KV offloading flags from `kvOffload`: none without it, so a ModelGroup that does not
    offload keeps its pods (and their revision) as they were."""
    offload = spec.kv_offload
    if offload is None:
        return ()
    return (
        vllm_names.KvOffloading.SIZE_FLAG,
        f"{offload.cpu_size_gib:.10g}",
        vllm_names.KvOffloading.BACKEND_FLAG,
        offload.backend,
    )


def lora_env(spec: ModelGroupSpec) -> tuple[tuple[str, str], ...]:
    """The variable that opens vLLM's runtime adapter API (`/v1/load_lora_adapter`), with adapters."""
    return ((vllm_names.Lora.RUNTIME_UPDATING_ENV, "True"),) if spec.adapters else ()


def placement_rules(spec: ModelGroupSpec) -> PlacementRules:
    placement = spec.placement
    return PlacementRules(
        topology_key=placement.topology_key,
        mode=placement.mode,
        spread_key=placement.spread_key or None,
        node_selector=tuple((term.key, term.value) for term in placement.node_selector),
        tolerations=tuple(placement.tolerations),
        gpu_resource=placement_resource(spec),
        required_node_terms=_required_node_terms(spec),
        provision_nodes=placement.node_provisioning.mode == "Pods",
    )


def placement_resource(spec: ModelGroupSpec) -> str:
    """What placement counts the pods' GPUs in: the device plugin's resource, or the DeviceClass's."""
    device_class = spec.engine.gpu_device_class_name
    return naming.device_class_resource(device_class) if device_class else spec.engine.gpu_resource_name


def _required_node_terms(spec: ModelGroupSpec) -> tuple[NodeAffinityTerm, ...]:
    affinity = spec.placement.node_affinity
    required = affinity.required_during_scheduling_ignored_during_execution if affinity else None
    return tuple(required.node_selector_terms) if required else ()


def readiness_rules(spec: ModelGroupSpec, tuning: ControllerTuning = ControllerTuning()) -> ReadinessRules:
    readiness = spec.readiness
    return ReadinessRules(
        model_revision=spec.model.revision,
        nccl_required=readiness.nccl_check == "Required",
        revision_check=readiness.revision_check,
        schedule_timeout_seconds=spec.placement.schedule_timeout_seconds,
        provisioning_timeout_seconds=spec.placement.node_provisioning.provisioning_timeout_seconds,
        startup_timeout_seconds=spec.engine.startup_timeout_seconds,
        warmup_retry_seconds=tuning.warmup_retry_seconds,
        warmup_prompt=readiness.warmup.prompt,
        warmup_max_tokens=readiness.warmup.max_tokens,
        warmup_timeout_seconds=readiness.warmup.timeout_seconds,
        drain_max_seconds=spec.drain.max_seconds,
        min_lifetime_seconds=spec.drain.min_lifetime_seconds,
        backoff_seconds=tuning.placement_backoff_seconds,
    )


def spec_problems(model_group: ModelGroup, nodes: Iterable[NodeInventory]) -> tuple[str, ...]:
    """What keeps the controller from acting on this spec; empty when it can act.

    nodes: the cluster's nodes. A group shape is impossible only if some node is eligible for the
    pods and still no domain could hold a group on an empty cluster; with no eligible node at all
    the nodes may simply not exist yet, which is a capacity limit, not a spec error.
    """
    spec = model_group.spec
    problems = []
    name = model_group.metadata.name or ""
    if len(name) > naming.max_model_group_name_length():
        problems.append(
            f"metadata.name: {name!r} is {len(name)} characters; pods are named <name>-g<N>-<rank> and "
            f"must fit 63, so use a name of at most {naming.max_model_group_name_length()} characters"
        )
    if not IMAGE_REFERENCE.match(spec.engine.image):
        problems.append(
            f"spec.engine.image: {spec.engine.image!r} is not a valid image reference "
            "([registry/]repository[:tag][@digest], repository in lower case)"
        )
    owned = sorted({variable.name for variable in spec.engine.env} & OPERATOR_ENV)
    if owned:
        problems.append(f"spec.engine.env: {', '.join(owned)} are set by goodput from each pod's identity")
    rules = placement_rules(spec)
    shape = GroupShape(spec.parallelism.pods_per_group, spec.parallelism.gpus_per_pod, rules.gpu_resource)
    candidates = [node for node in nodes if eligible(node, rules) and domain_of(node, rules) is not None]
    if spec.engine.gpu_device_class_name:
        # A node publishes a class's devices once its DRA driver runs: none yet is capacity to come.
        candidates = [node for node in candidates if node.allocatable(rules.gpu_resource) > 0]
    if candidates and not fits_empty_cluster(candidates, shape, rules):
        largest_node = max(node.allocatable(rules.gpu_resource) for node in candidates)
        where = (
            f"no {rules.topology_key} domain"
            if rules.mode == "Required"
            else f"not even the {len(candidates)} eligible node(s) together"
        )
        problems.append(
            f"spec.parallelism: a group of {shape.pods} pod(s) × {spec.parallelism.gpus_per_pod} GPUs "
            f"fits {where} even on an empty cluster "
            f"(largest node: {largest_node} GPUs); change gpusPerPod or the placement, or add larger nodes"
        )
    return tuple(problems)
