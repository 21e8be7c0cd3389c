"""Rendering of a replica group's pods and Service: the vLLM launch contract as Kubernetes manifests.

A group of tensor × pipeline GPUs runs as `podsPerGroup` pods. One pod: `vllm serve` with the
parallel sizes. Several pods: vLLM's native multi-node launch, where rank 0 (the leader) serves HTTP
and the others run `--headless` workers that meet the leader at `--master-addr`, a headless Service
per group that resolves to the leader. Only the leader is probed (followers have no HTTP server).

Every pod is born with the gang scheduling gate (no rank may hold GPUs before the whole group
exists), the group-ready readiness gate (the group serves only when every rank is healthy and warm),
node affinity to the topology domain chosen for the group, and a controller reference to its
ModelGroup so that deleting the ModelGroup deletes the group.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

from goodput.api.base import wire_dict
from goodput.api.modelgroup import (
    SHM_BYTES_PER_GPU,
    SHM_PATH,
    SHM_VOLUME,
    EnvVar,
    NodeAffinity,
    PodOptions,
    Readiness,
    SecurityContext,
    Toleration,
    VolumeMount,
)
from goodput.controllers import naming
from goodput.controllers.groups.agent_sidecar import AgentRank, AgentSidecar, add_agent

# torch.distributed rendezvous port of vLLM's multi-node launch (vLLM's default).
MASTER_PORT = 29501
# Interface of the pod network inside a pod; NCCL and Gloo would otherwise guess among several.
POD_INTERFACE = "eth0"
# Time vLLM needs after its --shutdown-timeout drain to stop workers and exit.
SHUTDOWN_MARGIN_SECONDS = 15
ENGINE_STARTUP_PROBE_PERIOD_SECONDS = 10
ENGINE_CONTAINER_NAME = "vllm"
# Environment variables the operator sets from the pod's identity; a spec may not override them.
OPERATOR_ENV = frozenset(
    {"VLLM_HOST_IP", "GOODPUT_MODEL_GROUP", "GOODPUT_GROUP", "GOODPUT_RANK", "GOODPUT_GROUP_SIZE"}
)

PlacementMode = Literal["Required", "Preferred"]

# Fields added to GroupTemplate after the first release shape the revision only when set, so an
# operator upgrade does not make every running group outdated.
# Fields that shape a pod only when set: templates that leave them unset keep the revision they had
# before the field existed, so an operator upgrade does not mark running groups outdated.
_REVISION_WHEN_SET = frozenset(
    {
        "volume_mounts",
        "shared_memory_size",
        "security_context",
        "pod",
        "node_affinity",
        "gpu_resource_name",
        "gpu_device_class",
        "agent",
        "readiness",
    }
)

# Fields that say which object a pod is, not how it is made: a change of them outdates no group.
_NOT_SHAPING = frozenset({"uid", "pool"})


@dataclass(frozen=True, slots=True)
class GroupTemplate:
    """Everything about a ModelGroup that shapes its pods, already validated.

    requests and limits are (resource, quantity) pairs without the GPU resource, which comes from
    gpus_per_pod. node_selector is (label key, value) pairs. env holds (name, value) pairs for plain
    values and the spec's EnvVar for a `valueFrom`, in the spec's order ($(NAME) refers backwards).
    """

    model_group: str
    namespace: str
    uid: str
    model: str
    model_revision: str
    served_name: str | None
    image: str
    args: tuple[str, ...]
    env: tuple[tuple[str, str] | EnvVar, ...]
    requests: tuple[tuple[str, str], ...]
    limits: tuple[tuple[str, str], ...]
    port: int
    startup_timeout_seconds: int
    shutdown_timeout_seconds: int
    tensor_parallel: int
    pipeline_parallel: int
    gpus_per_pod: int
    topology_key: str
    placement_mode: PlacementMode
    tolerations: tuple[Toleration, ...] = ()
    node_selector: tuple[tuple[str, str], ...] = ()
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    agent: AgentSidecar | None = None
    """The health agent injected into every rank; None: not injected (no NCCL check required, or
    the operator has no agent image)."""
    volume_mounts: tuple[VolumeMount, ...] = ()
    shared_memory_size: str | None = None
    security_context: SecurityContext | None = None
    pod: PodOptions | None = None
    node_affinity: NodeAffinity | None = None
    gpu_resource_name: str | None = None
    gpu_device_class: str | None = None
    """The DeviceClass every pod's ResourceClaim asks gpus_per_pod devices of (dynamic resource
    allocation); None: the pods request gpu_resource from a device plugin."""
    readiness: Readiness | None = None
    """The readiness checks a group passed, when not the defaults: a group proved ready under other
    checks is outdated, so a change of them rolls the groups like a change of the pod."""
    pool: str = naming.SERVING_POOL
    """The pool the groups made from this template belong to (`controllers.pools`): part of a
    group's identity, not of its shape, so it is left out of the revision."""

    @property
    def gpu_resource(self) -> str:
        """What placement counts every pod's gpus_per_pod devices in: the device-plugin resource
        (None above: nvidia.com/gpu), or the DeviceClass's name for it."""
        if self.gpu_device_class is not None:
            return naming.device_class_resource(self.gpu_device_class)
        return self.gpu_resource_name or naming.GPU_RESOURCE

    @property
    def claim_template_name(self) -> str | None:
        """The ResourceClaimTemplate of the pods' GPUs; None without dynamic resource allocation."""
        if self.gpu_device_class is None:
            return None
        return naming.claim_template_name(self.model_group, self.gpu_device_class, self.gpus_per_pod)

    @property
    def shm_size(self) -> str:
        """Size of the memory-backed /dev/shm: the spec's, else 2Gi per GPU of the pod."""
        if self.shared_memory_size is not None:
            return self.shared_memory_size
        return f"{SHM_BYTES_PER_GPU * self.gpus_per_pod // 1024**3}Gi"

    @property
    def pods_per_group(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel // self.gpus_per_pod

    @property
    def gpus_per_group(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel

    @property
    def revision(self) -> str:
        """A short hash of every field that shapes a pod: pods of an older revision are outdated."""
        shaping = {
            name: getattr(self, name)
            for name in self.__slots__
            if name not in _NOT_SHAPING
            and not (name in _REVISION_WHEN_SET and getattr(self, name) in ((), None))
        }
        canonical = json.dumps(shaping, sort_keys=True, default=_canonical)
        return hashlib.sha256(canonical.encode()).hexdigest()[:10]


def _canonical(value: object) -> object:
    """JSON form of a template value for the revision hash (tolerations kept as they always were)."""
    if isinstance(value, BaseModel) and not isinstance(value, Toleration | EnvVar):
        return wire_dict(value)
    return str(value)


@dataclass(frozen=True, slots=True)
class GroupManifests:
    """What one group consists of: a Service (multi-pod groups only) and its pods, rank order, and
    the ResourceClaimTemplate the pods' claims come from (dynamic resource allocation only; shared by
    every group of the ModelGroup, created when missing)."""

    service: dict[str, Any] | None
    pods: tuple[dict[str, Any], ...]
    claim_template: dict[str, Any] | None = None


def vllm_args(template: GroupTemplate, rank: int, leader_address: str | None) -> list[str]:
    """The `vllm serve` arguments of one rank (without the `vllm serve` command itself).

    leader_address: where followers reach rank 0; None for a single-pod group.
    """
    args = [
        template.model,
        "--revision",
        template.model_revision,
        "--tensor-parallel-size",
        str(template.tensor_parallel),
        "--pipeline-parallel-size",
        str(template.pipeline_parallel),
        "--shutdown-timeout",
        str(template.shutdown_timeout_seconds),
    ]
    if template.max_num_seqs is not None:
        args += ["--max-num-seqs", str(template.max_num_seqs)]
    if template.max_num_batched_tokens is not None:
        args += ["--max-num-batched-tokens", str(template.max_num_batched_tokens)]
    if template.pods_per_group > 1:
        if leader_address is None:
            raise ValueError("a multi-pod group needs the leader's address")
        args += [
            "--nnodes",
            str(template.pods_per_group),
            "--node-rank",
            str(rank),
            "--master-addr",
            leader_address,
            "--master-port",
            str(MASTER_PORT),
        ]
    if rank == 0:
        args += ["--port", str(template.port)]
        if template.served_name:
            args += ["--served-model-name", template.served_name]
    else:
        args.append("--headless")
    return args + list(template.args)


def render_group(
    template: GroupTemplate, group: str, domain: str, replaces: str | None = None
) -> GroupManifests:
    """The manifests of one whole group placed in the topology domain `domain`."""
    service = None
    leader_address = None
    if template.pods_per_group > 1:
        service = _render_service(template, group)
        leader_address = f"{service['metadata']['name']}.{template.namespace}.svc"
    pods = tuple(
        _render_pod(template, group, rank, domain=domain, leader_address=leader_address, replaces=replaces)
        for rank in range(template.pods_per_group)
    )
    return GroupManifests(service=service, pods=pods, claim_template=render_claim_template(template))


def render_claim_template(template: GroupTemplate) -> dict[str, Any] | None:
    """The ResourceClaimTemplate each pod's claim is made from: gpus_per_pod devices of the class.
    Owned by the ModelGroup, so it goes with it."""
    name = template.claim_template_name
    if name is None:
        return None
    request = {
        "deviceClassName": template.gpu_device_class,
        "allocationMode": "ExactCount",
        "count": template.gpus_per_pod,
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": name,
            "namespace": template.namespace,
            "labels": {
                naming.LABEL_MODEL_GROUP: template.model_group,
                naming.LABEL_MANAGED_BY: naming.MANAGED_BY,
            },
            "ownerReferences": [owner_reference(template)],
        },
        "spec": {"spec": {"devices": {"requests": [{"name": naming.POD_CLAIM_NAME, "exactly": request}]}}},
    }


def owner_reference(template: GroupTemplate) -> dict[str, Any]:
    return {
        "apiVersion": naming.MODEL_GROUP_API_VERSION,
        "kind": naming.MODEL_GROUP_KIND,
        "name": template.model_group,
        "uid": template.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def group_labels(template: GroupTemplate, group: str) -> dict[str, str]:
    return {
        naming.LABEL_MODEL_GROUP: template.model_group,
        naming.LABEL_GROUP: group,
        naming.LABEL_POOL: template.pool,
        naming.LABEL_REVISION: template.revision,
        naming.LABEL_MANAGED_BY: naming.MANAGED_BY,
    }


def _render_service(template: GroupTemplate, group: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": naming.service_name(template.model_group, group),
            "namespace": template.namespace,
            "labels": group_labels(template, group),
            "ownerReferences": [owner_reference(template)],
        },
        "spec": {
            "clusterIP": "None",
            # Followers must resolve the leader while the group is still starting, i.e. not Ready.
            "publishNotReadyAddresses": True,
            "selector": {
                naming.LABEL_MODEL_GROUP: template.model_group,
                naming.LABEL_GROUP: group,
                naming.LABEL_RANK: "0",
            },
            "ports": [
                {"name": "http", "port": template.port, "targetPort": template.port, "protocol": "TCP"},
                {"name": "rendezvous", "port": MASTER_PORT, "targetPort": MASTER_PORT, "protocol": "TCP"},
            ],
        },
    }


def _render_pod(
    template: GroupTemplate,
    group: str,
    rank: int,
    *,
    domain: str,
    leader_address: str | None,
    replaces: str | None,
) -> dict[str, Any]:
    leader = rank == 0
    options = template.pod or PodOptions()
    # The spec's labels and annotations first: goodput's own keys always win.
    labels = {**options.labels, **group_labels(template, group), naming.LABEL_RANK: str(rank)}
    annotations = {
        **options.annotations,
        naming.ANNOTATION_TOPOLOGY_KEY: template.topology_key,
        naming.ANNOTATION_TOPOLOGY_DOMAIN: domain,
    }
    if leader:
        labels[naming.LABEL_METRICS] = "true"
        annotations["prometheus.io/port"] = str(template.port)
        annotations["prometheus.io/path"] = "/metrics"
    if replaces:
        annotations[naming.ANNOTATION_REPLACES] = replaces
    if template.gpu_device_class is not None:
        annotations[naming.ANNOTATION_DEVICE_CLASS] = template.gpu_device_class
        annotations[naming.ANNOTATION_DEVICE_COUNT] = str(template.gpus_per_pod)
    spec: dict[str, Any] = {
        "schedulingGates": [{"name": naming.SCHEDULING_GATE}],
        "readinessGates": [{"conditionType": naming.CONDITION_GROUP_READY}],
        "affinity": _affinity(template, group, domain),
        "containers": [_render_container(template, group, rank, leader_address)],
        "volumes": [
            {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": template.shm_size}},
            *(_pod_dict(volume) for volume in options.volumes),
        ],
        # vLLM drains for --shutdown-timeout after SIGTERM, then stops its workers.
        "terminationGracePeriodSeconds": template.shutdown_timeout_seconds + SHUTDOWN_MARGIN_SECONDS,
        "restartPolicy": "Always",
        "enableServiceLinks": False,
        "automountServiceAccountToken": options.automount_service_account_token,
    }
    spec.update(_pod_options(options))
    if template.claim_template_name is not None:
        spec["resourceClaims"] = [
            {"name": naming.POD_CLAIM_NAME, "resourceClaimTemplateName": template.claim_template_name}
        ]
    spec = add_agent(spec, template.agent, _agent_rank(template, rank, leader_address))
    if template.node_selector:
        spec["nodeSelector"] = dict(template.node_selector)
    if template.tolerations:
        spec["tolerations"] = [wire_dict(toleration) for toleration in template.tolerations]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": naming.pod_name(template.model_group, group, rank),
            "namespace": template.namespace,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [owner_reference(template)],
        },
        "spec": spec,
    }


def _agent_rank(template: GroupTemplate, rank: int, leader_address: str | None) -> AgentRank:
    return AgentRank(
        rank=rank,
        pods_per_group=template.pods_per_group,
        gpus_per_pod=template.gpus_per_pod,
        model=template.model,
        model_revision=template.model_revision,
        engine_port=template.port,
        leader_address=leader_address,
        device_claim=naming.POD_CLAIM_NAME if template.gpu_device_class is not None else None,
    )


def _pod_dict(model: BaseModel) -> dict[str, Any]:
    """A spec model in Pod-spec form: what the spec leaves unset (None, empty lists) is left out."""
    return model.model_dump(mode="json", by_alias=True, exclude_none=True, exclude_defaults=True)


def _pod_options(options: PodOptions) -> dict[str, Any]:
    """The pod-level fields a platform team sets, as the Pod spec names them; unset ones left out."""
    rendered: dict[str, Any] = {}
    if options.security_context is not None:
        rendered["securityContext"] = _pod_dict(options.security_context)
    if options.runtime_class_name:
        rendered["runtimeClassName"] = options.runtime_class_name
    if options.image_pull_secrets:
        rendered["imagePullSecrets"] = [_pod_dict(secret) for secret in options.image_pull_secrets]
    if options.service_account_name:
        rendered["serviceAccountName"] = options.service_account_name
    if options.priority_class_name:
        rendered["priorityClassName"] = options.priority_class_name
    return rendered


def _affinity(template: GroupTemplate, group: str, domain: str) -> dict[str, Any]:
    """Where the group's pods may run: the domain placement chose, or, for a group that waits for new
    nodes (`naming.NEW_NODES_DOMAIN`), whichever one domain its first pod lands in."""
    if domain != naming.NEW_NODES_DOMAIN:
        return {"nodeAffinity": _domain_affinity(template, domain)}
    return new_nodes_affinity(template, group)


def new_nodes_affinity(template: GroupTemplate, group: str) -> dict[str, Any]:
    """Affinity of a group's pods that a node autoscaler is to make room for: the spec's own node
    affinity, and a pod affinity to the group's other pods on the topology key, which keeps the whole
    group in one domain (Karpenter and the cluster-autoscaler both simulate it when they choose what
    to create). Required mode: the affinity is required and the new nodes must carry the topology
    label; Preferred mode: the domain is the strongest preference, as for existing nodes."""
    user = template.node_affinity or NodeAffinity()
    required = user.required_during_scheduling_ignored_during_execution
    user_terms = [_pod_dict(term) for term in required.node_selector_terms] if required else []
    preferred = [_pod_dict(item) for item in user.preferred_during_scheduling_ignored_during_execution]
    node_affinity: dict[str, Any] = {}
    required_key, preferred_key = (
        "requiredDuringSchedulingIgnoredDuringExecution",
        "preferredDuringSchedulingIgnoredDuringExecution",
    )
    same_group = {
        "labelSelector": {
            "matchLabels": {naming.LABEL_MODEL_GROUP: template.model_group, naming.LABEL_GROUP: group}
        },
        "topologyKey": template.topology_key,
    }
    pod_affinity: dict[str, Any]
    if template.placement_mode == "Required":
        labelled = {"matchExpressions": [{"key": template.topology_key, "operator": "Exists"}]}
        terms = [_and_terms(term, labelled) for term in user_terms] or [labelled]
        node_affinity[required_key] = {"nodeSelectorTerms": terms}
        pod_affinity = {required_key: [same_group]}
    else:
        if user_terms:
            node_affinity[required_key] = {"nodeSelectorTerms": user_terms}
        pod_affinity = {preferred_key: [{"weight": 100, "podAffinityTerm": same_group}]}
    if preferred:
        node_affinity[preferred_key] = preferred
    affinity: dict[str, Any] = {"podAffinity": pod_affinity}
    if node_affinity:
        affinity["nodeAffinity"] = node_affinity
    return affinity


def _domain_affinity(template: GroupTemplate, domain: str) -> dict[str, Any]:
    """The group's domain as node affinity, combined with the spec's own node affinity.

    Required mode: the domain is added to every required term of the spec (terms are alternatives,
    requirements inside a term all hold). Preferred mode: the spec's required terms stay as they
    are and the domain becomes the strongest preference.
    """
    node = naming.node_of_domain(domain)
    domain_term: dict[str, Any]
    if node is not None:
        # A node without the topology label is a domain of its own (Preferred mode only).
        domain_term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    else:
        domain_term = {
            "matchExpressions": [{"key": template.topology_key, "operator": "In", "values": [domain]}]
        }
    user = template.node_affinity or NodeAffinity()
    required = user.required_during_scheduling_ignored_during_execution
    user_terms = [_pod_dict(term) for term in required.node_selector_terms] if required else []
    preferred = [_pod_dict(item) for item in user.preferred_during_scheduling_ignored_during_execution]
    affinity: dict[str, Any] = {}
    if template.placement_mode == "Required":
        terms = [_and_terms(term, domain_term) for term in user_terms] or [domain_term]
        affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": terms}
    else:
        if user_terms:
            affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": user_terms}
        preferred.insert(0, {"weight": 100, "preference": domain_term})
    if preferred:
        affinity["preferredDuringSchedulingIgnoredDuringExecution"] = preferred
    return affinity


def _and_terms(term: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """One node selector term requiring both terms' requirements."""
    merged = {key: list(values) for key, values in term.items()}
    for key, values in extra.items():
        merged[key] = merged.get(key, []) + list(values)
    return merged


def _render_container(
    template: GroupTemplate, group: str, rank: int, leader_address: str | None
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": ENGINE_CONTAINER_NAME,
        "image": template.image,
        "command": ["vllm", "serve"],
        "args": vllm_args(template, rank, leader_address),
        "env": _render_env(template, group, rank),
        "resources": _render_resources(template),
        "volumeMounts": [
            {"name": SHM_VOLUME, "mountPath": SHM_PATH},
            *(_pod_dict(mount) for mount in template.volume_mounts),
        ],
    }
    if template.security_context is not None:
        container["securityContext"] = _pod_dict(template.security_context)
    if rank == 0:
        container["ports"] = [
            {"name": "http", "containerPort": template.port, "protocol": "TCP"},
            {"name": "rendezvous", "containerPort": MASTER_PORT, "protocol": "TCP"},
        ]
        # The port refuses connections until the whole group has loaded, so the startup probe
        # carries the load-time budget and readiness only has to notice a dead engine.
        container["startupProbe"] = {
            "httpGet": {"path": "/health", "port": template.port},
            "periodSeconds": ENGINE_STARTUP_PROBE_PERIOD_SECONDS,
            "failureThreshold": max(
                1, math.ceil(template.startup_timeout_seconds / ENGINE_STARTUP_PROBE_PERIOD_SECONDS)
            ),
        }
        container["readinessProbe"] = {
            "httpGet": {"path": "/health", "port": template.port},
            "periodSeconds": 5,
            "failureThreshold": 3,
        }
    return container


def _render_resources(template: GroupTemplate) -> dict[str, Any]:
    """The engine's CPU and memory, and its GPUs: a device plugin's resource, or the pod's claim."""
    if template.gpu_device_class is not None:
        return {
            "requests": dict(template.requests),
            "limits": dict(template.limits),
            "claims": [{"name": naming.POD_CLAIM_NAME}],
        }
    gpus = str(template.gpus_per_pod)
    return {
        "requests": {**dict(template.requests), template.gpu_resource: gpus},
        "limits": {**dict(template.limits), template.gpu_resource: gpus},
    }


def _render_env(template: GroupTemplate, group: str, rank: int) -> list[dict[str, Any]]:
    """Pod identity first, then defaults a spec may override, then the spec's own variables."""
    identity: list[dict[str, Any]] = [
        {"name": "VLLM_HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "GOODPUT_MODEL_GROUP", "value": template.model_group},
        {"name": "GOODPUT_GROUP", "value": group},
        {"name": "GOODPUT_RANK", "value": str(rank)},
        {"name": "GOODPUT_GROUP_SIZE", "value": str(template.pods_per_group)},
    ]
    user = [
        {"name": item[0], "value": item[1]} if isinstance(item, tuple) else _pod_dict(item)
        for item in template.env
    ]
    named = {item["name"] for item in user}
    defaults = [
        {"name": name, "value": POD_INTERFACE}
        for name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
        if name not in named
    ]
    return identity + defaults + user
