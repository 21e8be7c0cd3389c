"""ModelGroup (goodput.dev/v1alpha1): one served model run as N complete replica groups.

A group is the tensor x pipeline set of GPU pods that together hold one copy of the model; it
counts as capacity only when every rank is placed, started, NCCL-healthy, on the right revision and
warm. `spec.replicas` is the number of complete groups wanted and is what the scale subresource
(and so the autoscaler, `kubectl scale` or an HPA) writes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Annotated, Literal

from pydantic import Field, field_validator

from goodput.api.base import (
    DNS_LABEL_PATTERN,
    DNS_SUBDOMAIN_PATTERN,
    LABEL_KEY_PATTERN,
    LABEL_VALUE_PATTERN,
    CelRule,
    ObjectMeta,
    Quantity,
    SpecModel,
    StatusModel,
    Timestamp,
    list_map,
)
from goodput.api.conditions import Condition
from goodput.api.slopolicy import AutoscalingMode

GPU_RESOURCE = "nvidia.com/gpu"
# A device plugin's resource: a DNS-subdomain prefix and a name, as `amd.com/gpu`.
EXTENDED_RESOURCE_PATTERN = (
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
    r"/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)

# vLLM flags that goodput renders from the spec; setting them in `engine.args` as well would make
# the running engine disagree with the spec the autoscaler reasons about.
OPERATOR_OWNED_FLAGS_PATTERN = (
    r"^(-tp|-pp|-dp|--(tensor|pipeline|data)[-_]parallel[-_]size"
    r"|--(model|served[-_]model[-_]name|revision|port|nnodes|node[-_]rank|master[-_]addr|master[-_]port"
    r"|headless|shutdown[-_]timeout|max[-_]num[-_]seqs|max[-_]num[-_]batched[-_]tokens|disable[-_]log[-_]stats"
    r"|kv[-_]offloading[-_]size|kv[-_]offloading[-_]backend))"
    r"([= ].*)?$"
)

# `--kv-transfer-config` configures a KV connector by hand; `kvOffload` renders one as well.
KV_TRANSFER_CONFIG_PATTERN = r"^--kv[-_]transfer[-_]config([= ].*)?$"


class ModelSource(SpecModel):
    """Which weights to serve."""

    name: str = Field(min_length=1, max_length=512)
    """Model to load: a Hugging Face repository id such as 'meta-llama/Llama-3.1-8B-Instruct', or a
    path inside the image. Passed to `vllm serve` as the model argument."""
    revision: str = Field(default="main", min_length=1, max_length=256)
    """Model revision (branch, tag or commit). Readiness checks that every rank loaded this revision."""
    served_name: str | None = Field(default=None, min_length=1, max_length=256)
    """Name clients put in the request's `model` field (vLLM --served-model-name); absent: `name`."""


# What a key of a Secret or ConfigMap may be called (Kubernetes' ConfigMap key rule).
_CONFIG_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"
# Label and annotation keys on engine pods that goodput writes and reads back.
RESERVED_POD_LABEL_PREFIX = "goodput.dev/"
# The memory-backed volume goodput mounts at /dev/shm (NCCL and vLLM's shared-memory queues).
SHM_VOLUME = "dshm"
SHM_PATH = "/dev/shm"
# /dev/shm per GPU of a pod when `engine.sharedMemorySize` is absent: NCCL's shared-memory transport
# and vLLM's broadcast queues grow with the ranks that share a node; a container runtime's 64 MiB
# default stops tensor parallelism at start-up.
SHM_BYTES_PER_GPU = 2 * 1024**3


class SecretKeySelector(SpecModel):
    """One key of a Secret in the ModelGroup's namespace."""

    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)
    """Name of the Secret."""
    key: str = Field(min_length=1, max_length=253, pattern=_CONFIG_KEY_PATTERN)
    """Key in the Secret's data."""
    optional: bool | None = None
    """Start the engine even when the Secret or the key does not exist."""


class ConfigMapKeySelector(SpecModel):
    """One key of a ConfigMap in the ModelGroup's namespace."""

    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)
    """Name of the ConfigMap."""
    key: str = Field(min_length=1, max_length=253, pattern=_CONFIG_KEY_PATTERN)
    """Key in the ConfigMap's data."""
    optional: bool | None = None
    """Start the engine even when the ConfigMap or the key does not exist."""


class ObjectFieldSelector(SpecModel):
    """A field of the pod itself, as in a Pod's `env[].valueFrom.fieldRef`."""

    field_path: str = Field(min_length=1, max_length=256)
    """Path of the field, for example 'metadata.name' or 'spec.nodeName'."""
    api_version: str | None = Field(default=None, max_length=64)
    """Version of the schema the path is written in; absent: 'v1'."""


class EnvVarSource(SpecModel):
    """Where a variable's value comes from: exactly one of a Secret key, a ConfigMap key or a pod field."""

    cel_rules = (
        CelRule(
            rule="[has(self.secretKeyRef), has(self.configMapKeyRef), has(self.fieldRef)]"
            ".filter(x, x).size() == 1",
            message="`valueFrom` must set exactly one of `secretKeyRef`, `configMapKeyRef` and `fieldRef`",
            check=lambda source: (
                [source.secret_key_ref, source.config_map_key_ref, source.field_ref].count(None) == 2
            ),
        ),
    )

    secret_key_ref: SecretKeySelector | None = None
    """A key of a Secret, for example a Hugging Face token: the value never sits in the ModelGroup."""
    config_map_key_ref: ConfigMapKeySelector | None = None
    """A key of a ConfigMap."""
    field_ref: ObjectFieldSelector | None = None
    """A field of the pod."""


class EnvVar(SpecModel):
    """An environment variable of the engine container, as in a Pod spec."""

    cel_rules = (
        CelRule(
            rule="!has(self.valueFrom) || !has(self.value) || self.value == ''",
            message="an environment variable must set either `value` or `valueFrom`, not both",
            field_path=".valueFrom",
            check=lambda variable: variable.value_from is None or not variable.value,
        ),
    )

    name: str = Field(min_length=1, max_length=256)
    """Variable name."""
    value: str | None = Field(default=None, max_length=32768)
    """Variable value; `$(NAME)` refers to a variable defined earlier in the list."""
    value_from: EnvVarSource | None = None
    """Where the value comes from instead: a Secret or ConfigMap key, or a field of the pod."""


class KeyToPath(SpecModel):
    """One key of a Secret or ConfigMap projected to a file."""

    key: str = Field(min_length=1, max_length=253, pattern=_CONFIG_KEY_PATTERN)
    """The key."""
    path: str = Field(min_length=1, max_length=1024)
    """Relative path of the file in the volume."""


class SecretVolumeSource(SpecModel):
    """A Secret's keys as files."""

    secret_name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)
    """Name of the Secret in the ModelGroup's namespace."""
    items: tuple[KeyToPath, ...] = Field(default=(), max_length=64)
    """Keys to project; absent: every key, one file each."""
    optional: bool | None = None
    """Start the engine even when the Secret does not exist."""


class ConfigMapVolumeSource(SpecModel):
    """A ConfigMap's keys as files."""

    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)
    """Name of the ConfigMap in the ModelGroup's namespace."""
    items: tuple[KeyToPath, ...] = Field(default=(), max_length=64)
    """Keys to project; absent: every key, one file each."""
    optional: bool | None = None
    """Start the engine even when the ConfigMap does not exist."""


class PersistentVolumeClaimVolumeSource(SpecModel):
    """A PersistentVolumeClaim, for example a shared model-weights cache (ReadWriteMany or ReadOnlyMany)."""

    claim_name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)
    """Name of the claim in the ModelGroup's namespace."""
    read_only: bool | None = None
    """Mount the claim read-only."""


class EmptyDirVolumeSource(SpecModel):
    """A scratch directory that lives as long as the pod."""

    medium: Literal["", "Memory"] | None = None
    """'' for the node's disk, 'Memory' for a tmpfs counted against the pod's memory."""
    size_limit: Quantity | None = None
    """Largest size of the directory."""


class HostPathVolumeSource(SpecModel):
    """A path of the node, for example a node-local NVMe weights cache or the RDMA devices."""

    path: str = Field(min_length=1, max_length=4096)
    """Path on the node."""
    type: (
        Literal[
            "",
            "DirectoryOrCreate",
            "Directory",
            "FileOrCreate",
            "File",
            "Socket",
            "CharDevice",
            "BlockDevice",
        ]
        | None
    ) = None
    """What must exist at the path."""


class Volume(SpecModel):
    """A volume of the engine pods, in the shape of a Pod's `volumes[]` (the sources listed here)."""

    cel_rules = (
        CelRule(
            rule="[has(self.secret), has(self.configMap), has(self.persistentVolumeClaim), "
            "has(self.emptyDir), has(self.hostPath)].filter(x, x).size() == 1",
            message="a volume must set exactly one of `secret`, `configMap`, `persistentVolumeClaim`, "
            "`emptyDir` and `hostPath`",
            check=lambda volume: (
                [
                    volume.secret,
                    volume.config_map,
                    volume.persistent_volume_claim,
                    volume.empty_dir,
                    volume.host_path,
                ].count(None)
                == 4
            ),
        ),
        CelRule(
            rule=f"self.name != '{SHM_VOLUME}'",
            message=f"a volume's `name` must not be '{SHM_VOLUME}', goodput's /dev/shm: size it with "
            "`engine.sharedMemorySize` instead",
            field_path=".name",
            check=lambda volume: volume.name != SHM_VOLUME,
        ),
    )

    name: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)
    """Volume name, referred to by `engine.volumeMounts[].name`."""
    secret: SecretVolumeSource | None = None
    """A Secret's keys as files."""
    config_map: ConfigMapVolumeSource | None = None
    """A ConfigMap's keys as files."""
    persistent_volume_claim: PersistentVolumeClaimVolumeSource | None = None
    """A PersistentVolumeClaim."""
    empty_dir: EmptyDirVolumeSource | None = None
    """A scratch directory."""
    host_path: HostPathVolumeSource | None = None
    """A path of the node."""


class VolumeMount(SpecModel):
    """Where a volume of `pod.volumes` appears in the engine container."""

    cel_rules = (
        CelRule(
            rule=f"self.mountPath != '{SHM_PATH}' && !self.mountPath.startsWith('{SHM_PATH}/')",
            message=f"`mountPath` must not be {SHM_PATH}: goodput mounts a memory-backed volume there, "
            "sized by `engine.sharedMemorySize`",
            field_path=".mountPath",
            check=lambda mount: (
                mount.mount_path != SHM_PATH and not mount.mount_path.startswith(SHM_PATH + "/")
            ),
        ),
    )

    name: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)
    """Name of a volume in `pod.volumes`."""
    mount_path: str = Field(min_length=1, max_length=4096, pattern=r"^/")
    """Absolute path in the container."""
    read_only: bool | None = None
    """Mount read-only."""
    sub_path: str | None = Field(default=None, max_length=4096)
    """Path inside the volume to mount instead of its root."""


class Capabilities(SpecModel):
    """Linux capabilities added to or dropped from the engine container."""

    add: tuple[Annotated[str, Field(max_length=64)], ...] = Field(default=(), max_length=64)
    """Capabilities to add, for example IPC_LOCK for RDMA memory registration."""
    drop: tuple[Annotated[str, Field(max_length=64)], ...] = Field(default=(), max_length=64)
    """Capabilities to drop."""


class SecurityContext(SpecModel):
    """The engine container's security context, as in a Pod spec (the fields listed here)."""

    capabilities: Capabilities | None = None
    """Linux capabilities to add or drop."""
    privileged: bool | None = None
    """Run privileged (rarely needed; prefer specific capabilities)."""
    allow_privilege_escalation: bool | None = None
    """Whether a process may gain more privileges than its parent."""
    run_as_user: int | None = Field(default=None, ge=0, json_schema_extra={"format": "int64"})
    """User id of the engine process."""
    run_as_group: int | None = Field(default=None, ge=0, json_schema_extra={"format": "int64"})
    """Group id of the engine process."""
    run_as_non_root: bool | None = None
    """Refuse to start as root."""
    read_only_root_filesystem: bool | None = None
    """Mount the image read-only (the engine then needs writable volumes for its caches)."""


class SeccompProfile(SpecModel):
    """A seccomp profile."""

    type: Literal["RuntimeDefault", "Unconfined", "Localhost"]
    """Which profile."""
    localhost_profile: str | None = Field(default=None, max_length=4096)
    """With type 'Localhost': the profile's path on the node."""


class PodSecurityContext(SpecModel):
    """The engine pods' security context, as in a Pod spec (the fields listed here)."""

    run_as_user: int | None = Field(default=None, ge=0, json_schema_extra={"format": "int64"})
    """User id of every container."""
    run_as_group: int | None = Field(default=None, ge=0, json_schema_extra={"format": "int64"})
    """Group id of every container."""
    run_as_non_root: bool | None = None
    """Refuse to start containers as root."""
    fs_group: int | None = Field(default=None, ge=0, json_schema_extra={"format": "int64"})
    """Group that owns the volumes (a writable weights cache on a PersistentVolumeClaim needs it)."""
    supplemental_groups: tuple[Annotated[int, Field(ge=0)], ...] = Field(default=(), max_length=32)
    """Further groups of every container."""
    seccomp_profile: SeccompProfile | None = None
    """The seccomp profile of every container."""


class LocalObjectReference(SpecModel):
    """An object in the ModelGroup's namespace, by name."""

    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)
    """Name of the object."""


_RESERVED_KEYS_RULE = (
    f"self.all(key, !key.startsWith('{RESERVED_POD_LABEL_PREFIX}') && key != 'app.kubernetes.io/managed-by')"
)


def _no_reserved_keys(keys: Iterable[str]) -> bool:
    return all(
        not key.startswith(RESERVED_POD_LABEL_PREFIX) and key != "app.kubernetes.io/managed-by"
        for key in keys
    )


class PodOptions(SpecModel):
    """Settings of the engine pods a platform team owns, in the shape of a Pod spec.

    goodput owns the rest of the pod: GPU counts, ranks, ports, probes, scheduling and readiness gates,
    its own labels and annotations, and /dev/shm.
    """

    cel_rules = (
        CelRule(
            rule=f"!has(self.labels) || self.labels.{_RESERVED_KEYS_RULE.removeprefix('self.')}",
            message=f"`pod.labels` must not set keys under '{RESERVED_POD_LABEL_PREFIX}' or "
            "'app.kubernetes.io/managed-by': goodput identifies its pods by them",
            field_path=".labels",
            check=lambda pod: _no_reserved_keys(pod.labels),
        ),
        CelRule(
            rule=f"!has(self.annotations) || self.annotations.{_RESERVED_KEYS_RULE.removeprefix('self.')}",
            message=f"`pod.annotations` must not set keys under '{RESERVED_POD_LABEL_PREFIX}' or "
            "'app.kubernetes.io/managed-by': goodput records its own state in them",
            field_path=".annotations",
            check=lambda pod: _no_reserved_keys(pod.annotations),
        ),
    )

    # Keys are checked below, not in the schema: a CRD schema cannot constrain map keys.
    labels: dict[str, Annotated[str, Field(max_length=63, pattern=LABEL_VALUE_PATTERN)]] = Field(
        default={}, json_schema_extra={"maxProperties": 32}
    )
    """Labels added to every engine pod, for example for cost allocation."""
    annotations: dict[str, Annotated[str, Field(max_length=4096)]] = Field(
        default={}, json_schema_extra={"maxProperties": 32}
    )
    """Annotations added to every engine pod, for example Multus network attachments."""
    volumes: tuple[Volume, ...] = Field(default=(), max_length=32, json_schema_extra=list_map("name"))
    """Volumes of the engine pods: a model-weights cache, Secrets or ConfigMaps as files."""
    security_context: PodSecurityContext | None = None
    """The pods' security context."""
    runtime_class_name: str | None = Field(default=None, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)
    """RuntimeClass of the pods, for example 'nvidia' where the NVIDIA runtime is not the default."""
    image_pull_secrets: tuple[LocalObjectReference, ...] = Field(
        default=(), max_length=16, json_schema_extra=list_map("name")
    )
    """Secrets that pull the engine image from a private registry."""
    service_account_name: str | None = Field(default=None, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)
    """ServiceAccount of the pods; absent: the namespace's default."""
    automount_service_account_token: bool = False
    """Mount the ServiceAccount's token in the pods (off: vLLM needs no access to the API server)."""
    priority_class_name: str | None = Field(default=None, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)
    """PriorityClass of the pods."""

    @field_validator("labels", "annotations")
    @classmethod
    def _keys_are_label_keys(cls, value: dict[str, str]) -> dict[str, str]:
        """A key the API server would refuse on a pod fails here, before any pod is created."""
        bad = sorted(key for key in value if len(key) > 317 or not re.match(LABEL_KEY_PATTERN, key))
        if bad:
            raise ValueError(f"keys must be label keys ([prefix/]name): {', '.join(repr(k) for k in bad)}")
        return value


class ResourceRequirements(SpecModel):
    """CPU, memory and other per-pod resources of the engine container, as in a Pod spec."""

    cel_rules = (
        CelRule(
            rule=f"(!has(self.requests) || !('{GPU_RESOURCE}' in self.requests)) && "
            f"(!has(self.limits) || !('{GPU_RESOURCE}' in self.limits))",
            message=f"`engine.resources` must not set '{GPU_RESOURCE}': goodput requests "
            "`parallelism.gpusPerPod` GPUs for every pod",
            check=lambda resources: (
                GPU_RESOURCE not in resources.requests and GPU_RESOURCE not in resources.limits
            ),
        ),
    )

    requests: dict[str, Quantity] = Field(default={}, json_schema_extra={"maxProperties": 16})
    """Minimum resources per pod by resource name, for example {cpu: '16', memory: 200Gi}."""
    limits: dict[str, Quantity] = Field(default={}, json_schema_extra={"maxProperties": 16})
    """Maximum resources per pod by resource name."""


class Engine(SpecModel):
    """The vLLM container every rank of a group runs."""

    cel_rules = (
        CelRule(
            rule="!has(self.resources) || ((!has(self.resources.requests) || "
            "!(self.gpuResourceName in self.resources.requests)) && (!has(self.resources.limits) || "
            "!(self.gpuResourceName in self.resources.limits)))",
            message="`engine.resources` must not set `engine.gpuResourceName`: goodput requests "
            "`parallelism.gpusPerPod` of it for every pod",
            field_path=".resources",
            check=lambda engine: (
                engine.gpu_resource_name not in engine.resources.requests
                and engine.gpu_resource_name not in engine.resources.limits
            ),
        ),
        CelRule(
            rule=f"!has(self.gpuDeviceClassName) || !has(self.gpuResourceName) || "
            f"self.gpuResourceName == '{GPU_RESOURCE}'",
            message="`engine.gpuDeviceClassName` (GPUs through dynamic resource allocation) must not be set "
            "with an `engine.gpuResourceName` other than the default (GPUs through a device plugin)",
            field_path=".gpuDeviceClassName",
            check=lambda engine: (
                engine.gpu_device_class_name is None or engine.gpu_resource_name == GPU_RESOURCE
            ),
        ),
        CelRule(
            rule=f"!has(self.args) || self.args.all(arg, !arg.matches('{OPERATOR_OWNED_FLAGS_PATTERN}'))",
            message="`engine.args` must not set a flag that goodput renders from the spec (model, revision, "
            "served name, port, parallelism, node ranks, shutdown timeout, batch limits, log stats, KV "
            "offloading): set `model`, `engine.port`, `parallelism`, `engine.shutdownTimeoutSeconds`, "
            "`profile` or `kvOffload` instead",
            field_path=".args",
            check=lambda engine: not any(re.match(OPERATOR_OWNED_FLAGS_PATTERN, arg) for arg in engine.args),
        ),
    )

    image: str = Field(min_length=1, max_length=1024)
    """Container image with vLLM, for example 'vllm/vllm-openai:v0.33.0'."""
    gpu_resource_name: str = Field(default=GPU_RESOURCE, max_length=253, pattern=EXTENDED_RESOURCE_PATTERN)
    """Resource name under which the nodes' device plugin advertises the GPUs, for example
    'amd.com/gpu' or a MIG profile such as 'nvidia.com/mig-3g.40gb'. Every pod requests
    `parallelism.gpusPerPod` of it, and placement counts the nodes' free devices in it."""
    gpu_device_class_name: str | None = Field(default=None, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)
    """Request the GPUs through dynamic resource allocation instead: a DeviceClass, for example
    'gpu.nvidia.com'. Every pod then gets its own ResourceClaim (from a ResourceClaimTemplate the
    operator creates) for `parallelism.gpusPerPod` devices of this class, shared by the engine and the
    health agent, so the agent sees exactly the pod's GPUs; placement counts the devices of the
    nodes' ResourceSlices that the class selects and no claim holds. Kubernetes 1.34 or later."""
    args: tuple[Annotated[str, Field(max_length=1024)], ...] = Field(default=(), max_length=64)
    """Extra `vllm serve` arguments. Flags that goodput derives from the spec (parallelism, port,
    model, revision, ranks, shutdown timeout, batch limits) are rejected here."""
    env: tuple[EnvVar, ...] = Field(default=(), max_length=128, json_schema_extra=list_map("name"))
    """Extra environment variables of the engine container, each a `value` or a `valueFrom` (a Secret
    or ConfigMap key, or a field of the pod)."""
    volume_mounts: tuple[VolumeMount, ...] = Field(
        default=(), max_length=32, json_schema_extra=list_map("mountPath")
    )
    """Where volumes of `pod.volumes` appear in the engine container."""
    shared_memory_size: Quantity | None = None
    """Size of the memory-backed /dev/shm; absent: 2Gi per GPU of the pod. It counts against the
    pod's memory."""
    security_context: SecurityContext | None = None
    """The engine container's security context, for example `capabilities.add: [IPC_LOCK]` for RDMA."""
    resources: ResourceRequirements = ResourceRequirements()
    """CPU and memory of each pod. GPUs come from `parallelism.gpusPerPod` and must not be set here."""
    port: int = Field(default=8000, ge=1, le=65535)
    """HTTP port of the leader's OpenAI-compatible server and /metrics endpoint."""
    startup_timeout_seconds: int = Field(default=1800, ge=1, le=86400)
    """Longest a group may take from its pods starting to the engine answering /health (weights
    download and load, rank initialisation, graph capture) before the group is replaced."""
    shutdown_timeout_seconds: int = Field(default=30, ge=0, le=3600)
    """vLLM --shutdown-timeout: how long a terminating engine keeps finishing in-flight requests.
    Pods get a termination grace period longer than this."""


class Parallelism(SpecModel):
    """How one copy of the model is split over GPUs and pods. Immutable after creation."""

    cel_rules = (
        CelRule(
            rule="(self.tensor * self.pipeline) % self.gpusPerPod == 0",
            message="`parallelism.gpusPerPod` must divide the product of `parallelism.tensor` and "
            "`parallelism.pipeline`, so that every pod of a group holds the same number of GPUs",
            field_path=".gpusPerPod",
            check=lambda parallelism: (
                (parallelism.tensor * parallelism.pipeline) % parallelism.gpus_per_pod == 0
            ),
        ),
        CelRule(
            rule="self == oldSelf",
            message="`parallelism` must not change (it is immutable): create a new ModelGroup with the new "
            "parallelism and shift traffic to it",
        ),
    )

    tensor: int = Field(default=1, ge=1, le=64)
    """Tensor-parallel size: GPUs that split every layer (vLLM --tensor-parallel-size)."""
    pipeline: int = Field(default=1, ge=1, le=64)
    """Pipeline-parallel size: stages the layers are divided into (vLLM --pipeline-parallel-size)."""
    gpus_per_pod: int = Field(ge=1, le=64)
    """GPUs per pod (one node's share of the group). A group has tensor x pipeline / gpusPerPod pods."""

    @property
    def gpus_per_group(self) -> int:
        return self.tensor * self.pipeline

    @property
    def pods_per_group(self) -> int:
        """Pods in one complete group; rank 0 is the leader."""
        return self.gpus_per_group // self.gpus_per_pod


class Toleration(SpecModel):
    """A toleration of the engine pods, in the shape of a Pod's tolerations."""

    cel_rules = (
        CelRule(
            rule="self.operator != 'Exists' || !has(self.value) || self.value == ''",
            message="`value` must be empty when `operator` is 'Exists'",
            field_path=".value",
            check=lambda toleration: toleration.operator != "Exists" or not toleration.value,
        ),
        CelRule(
            rule="(has(self.key) && self.key != '') || self.operator == 'Exists'",
            message="`operator` must be 'Exists' when `key` is empty",
            field_path=".operator",
            check=lambda toleration: bool(toleration.key) or toleration.operator == "Exists",
        ),
        CelRule(
            rule="!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
            message="`effect` must be 'NoExecute' when `tolerationSeconds` is set",
            field_path=".effect",
            check=lambda toleration: (
                toleration.toleration_seconds is None or toleration.effect == "NoExecute"
            ),
        ),
    )

    key: str | None = Field(default=None, max_length=317, pattern=LABEL_KEY_PATTERN)
    """Taint key to tolerate; empty with operator 'Exists' tolerates every taint."""
    operator: Literal["Exists", "Equal"] = "Equal"
    """'Equal' matches the taint's value; 'Exists' matches any value."""
    value: str | None = Field(default=None, max_length=63)
    """Taint value to match with operator 'Equal'."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to match; absent matches every effect."""
    toleration_seconds: int | None = Field(default=None, json_schema_extra={"format": "int64"})
    """With effect 'NoExecute': how long the pod stays bound after the taint appears."""


class NodeSelectorTerm(SpecModel):
    """A node label the engine pods require."""

    key: str = Field(max_length=317, pattern=LABEL_KEY_PATTERN)
    """Node label key."""
    value: str = Field(max_length=63, pattern=LABEL_VALUE_PATTERN)
    """Required value of the label."""


class NodeSelectorRequirement(SpecModel):
    """One requirement on a node label, as in a Pod's node affinity."""

    cel_rules = (
        CelRule(
            rule="(self.operator in ['Exists', 'DoesNotExist']) == "
            "(!has(self.values) || size(self.values) == 0)",
            message="`values` must be empty for operators 'Exists' and 'DoesNotExist' and set for the others",
            field_path=".values",
            check=lambda term: (term.operator in ("Exists", "DoesNotExist")) == (not term.values),
        ),
        CelRule(
            rule="!(self.operator in ['Gt', 'Lt']) || "
            "(size(self.values) == 1 && self.values[0].matches('^-?[0-9]+$'))",
            message="`values` must hold exactly one integer for operators 'Gt' and 'Lt'",
            field_path=".values",
            check=lambda term: (
                term.operator not in ("Gt", "Lt")
                or (len(term.values) == 1 and re.match(r"^-?[0-9]+$", term.values[0]) is not None)
            ),
        ),
    )

    key: str = Field(max_length=317, pattern=LABEL_KEY_PATTERN)
    """Node label key."""
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    """How the label's value is compared with `values`."""
    values: tuple[Annotated[str, Field(max_length=63)], ...] = Field(default=(), max_length=64)
    """Values to compare with."""


class NodeAffinityTerm(SpecModel):
    """Requirements a node meets together."""

    match_expressions: tuple[NodeSelectorRequirement, ...] = Field(min_length=1, max_length=16)
    """Every requirement must hold."""


class RequiredNodeAffinity(SpecModel):
    """Node terms of which at least one must hold."""

    node_selector_terms: tuple[NodeAffinityTerm, ...] = Field(min_length=1, max_length=16)
    """At least one term must hold."""


class PreferredNodeAffinity(SpecModel):
    """A weighted preference for nodes meeting a term."""

    weight: int = Field(ge=1, le=100)
    """Weight of the preference against the scheduler's other scores."""
    preference: NodeAffinityTerm
    """The preferred nodes."""


class NodeAffinity(SpecModel):
    """Node affinity of the engine pods, in the shape of a Pod's `affinity.nodeAffinity`."""

    required_during_scheduling_ignored_during_execution: RequiredNodeAffinity | None = None
    """Nodes the pods may run on. goodput's placement only considers such nodes, and adds its
    topology domain to every term."""
    preferred_during_scheduling_ignored_during_execution: tuple[PreferredNodeAffinity, ...] = Field(
        default=(), max_length=16
    )
    """Nodes the scheduler prefers, beside goodput's own preference for the group's domain."""


class NodeProvisioning(SpecModel):
    """Whether a group that no existing topology domain fits asks a node autoscaler for new nodes."""

    mode: Literal["Off", "Pods"] = "Off"
    """'Off' (the default): a group is created only where existing nodes fit it whole; past that the
    ModelGroup reports `ScalingLimited`. 'Pods': the group's pods are created anyway, ungated and
    pending, with GPU requests and a pod affinity that keeps the whole group in one `topologyKey`
    domain, so Karpenter or the cluster-autoscaler sees them and creates nodes."""
    provisioning_timeout_seconds: int = Field(default=600, ge=30, le=7200)
    """Longest a group may wait for new nodes. Past it the WHOLE group is deleted (no node keeps a
    partial group), `ScalingLimited` and a `NodeProvisioningTimeout` Event say why, and no new
    nodes are asked for again until the placement back-off has passed."""


class Placement(SpecModel):
    """Where the pods of a group may run. A group is placed as a whole or not at all."""

    topology_key: str = Field(default="nvidia.com/gpu.clique", max_length=317, pattern=LABEL_KEY_PATTERN)
    """Node label whose value names a topology domain (an NVLink clique, a rack, a network block);
    all pods of one group are placed in one domain. GPU Feature Discovery sets the default label only
    on multi-node NVLink systems (GB200 NVL72 and the like); see `mode` for nodes without it."""
    mode: Literal["Required", "Preferred"] = "Preferred"
    """'Preferred' (the default): a group goes to one domain when one fits it whole, else it is spread
    over several rather than waiting; a node without `topologyKey` is a domain of its own, so
    ordinary GPU nodes (which carry no `nvidia.com/gpu.clique`) still hold groups. 'Required': a
    group waits until one labelled domain fits all its pods; nodes without the label are never
    used, and `ScalingLimited` (reason TopologyLabelMissing) names them."""
    spread_key: str = Field(default="topology.kubernetes.io/zone", max_length=317, pattern=LABEL_KEY_PATTERN)
    """Node label whose domains groups are spread across (best effort), so losing one failure
    domain does not take every group."""
    schedule_timeout_seconds: int = Field(default=300, ge=1, le=3600)
    """Longest a group may wait for all its pods to be bound to nodes. Past it the whole group is
    deleted, its domain backed off, and `ScalingLimited` reports why."""
    tolerations: tuple[Toleration, ...] = Field(default=(), max_length=32)
    """Tolerations of the engine pods, for example of the GPU nodes' taints."""
    node_selector: tuple[NodeSelectorTerm, ...] = Field(
        default=(), max_length=32, json_schema_extra=list_map("key")
    )
    """Node labels every engine pod requires, as a list of key and value."""
    node_affinity: NodeAffinity | None = None
    """Node affinity of the engine pods, as in a Pod spec."""
    node_provisioning: NodeProvisioning = NodeProvisioning()
    """Asking a node autoscaler (Karpenter, the cluster-autoscaler) for nodes when none fit a group."""


class PolicyRef(SpecModel):
    """A reference to an SLOPolicy in the ModelGroup's namespace."""

    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)
    """Name of the SLOPolicy."""


class ModelShapeSpec(SpecModel):
    """Architecture numbers of a dense decoder-only transformer, which price a token."""

    parameters: float = Field(gt=0)
    """Number of parameters, for example 8.03e9."""
    layers: int = Field(ge=1, le=1024)
    """Number of transformer layers."""
    hidden_size: int = Field(ge=1, le=1048576)
    """Hidden dimension."""
    kv_heads: int = Field(ge=1, le=1024)
    """Number of key/value heads (grouped-query attention)."""
    head_dim: int = Field(ge=1, le=4096)
    """Dimension of one attention head."""
    dtype_bytes: int = Field(default=2, ge=1, le=4)
    """Bytes per weight and KV element: 2 for bf16/fp16, 1 for fp8."""


# A checkpoint's config.json as its text, pasted as a block (`modelConfig: |`): a string keeps the
# schema structural and the file exactly as written; the operator parses it and names the field that
# is missing or wrong. 64 KiB is many times the largest config.json of a decoder model.
MAX_MODEL_CONFIG_CHARACTERS = 65_536


class ModelConfigReference(SpecModel):
    """The key of a ConfigMap in the ModelGroup's namespace that holds the checkpoint's config.json,
    as `kubectl create configmap NAME --from-file=config.json` makes it."""

    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)
    """Name of the ConfigMap."""
    key: str = Field(default="config.json", min_length=1, max_length=253, pattern=_CONFIG_KEY_PATTERN)
    """Key in the ConfigMap's data whose value is the config.json text."""


class AcceleratorSpec(SpecModel):
    """An accelerator by its datasheet: peak dense FLOP/s per precision, memory and interconnect.

    goodput applies the efficiencies measured on the H100 (GEMM 0.65, attention 0.45, bandwidth 0.80)
    to these peaks, as it does for every catalogue accelerator without a measurement of its own.
    """

    bf16_flops: float = Field(gt=0)
    """Dense BF16/FP16 tensor FLOP/s (without sparsity), for example 989e12 for an H100 SXM."""
    fp8_flops: float | None = Field(default=None, gt=0)
    """Dense FP8 tensor FLOP/s; absent: the accelerator has no FP8 unit, and FP8 weights are priced at
    the BF16 rate."""
    fp4_flops: float | None = Field(default=None, gt=0)
    """Dense FP4 tensor FLOP/s; absent: none, as for FP8."""
    memory_bandwidth_bytes_per_second: float = Field(gt=0)
    """Peak memory bandwidth in bytes per second, for example 3.35e12."""
    memory_bytes: float = Field(gt=0)
    """Memory of one accelerator in bytes, for example 80e9."""
    interconnect_bytes_per_second: float | None = Field(default=None, gt=0)
    """Accelerator-to-accelerator bandwidth per direction (NVLink, Infinity Fabric, PCIe) in bytes
    per second, which prices tensor parallelism's all-reduces; absent: PCIe Gen4 x16, 32e9."""


class Profile(SpecModel):
    """The capacity envelope and service-time model of this model on this hardware.

    Measured by a benchmark and written here; what is left out comes from goodput's service-time
    model for `gpu` and the model's shape.
    """

    cel_rules = (
        CelRule(
            rule="[has(self.modelShape), has(self.modelConfig), has(self.modelConfigRef)]"
            ".filter(x, x).size() <= 1",
            message="`profile` must set at most one of `modelShape`, `modelConfig` and `modelConfigRef`: "
            "each describes the model on its own",
            check=lambda profile: (
                [profile.model_shape, profile.model_config_json, profile.model_config_ref].count(None) >= 2
            ),
        ),
    )

    gpu: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)
    """Accelerator of the nodes: one of goodput's catalogue ('l4', 'l40s', 'a10g', 'a100-40g',
    'a100-80g', 'h100-80g', 'h200', 'b200', 'mi300x'), or any name with `accelerator` describing it.
    Another accelerator without `accelerator` needs `kvCapacityTokens` and
    `capacityWorkSecondsPerSecond`, and is then priced as an H100."""
    accelerator: AcceleratorSpec | None = None
    """The accelerator's peak figures, for one goodput's catalogue does not hold (or to replace the
    catalogue's for `gpu`)."""
    model_shape: ModelShapeSpec | None = None
    """Architecture of the model; absent: read from `modelConfig` or `modelConfigRef`, else taken
    from goodput's catalog by the model's name (Llama 3.1 8B and 70B)."""
    model_config_json: str | None = Field(
        default=None, alias="modelConfig", min_length=2, max_length=MAX_MODEL_CONFIG_CHARACTERS
    )
    """The checkpoint's config.json, inline as its text (`modelConfig: |` and the file's content; its
    fields as written: `num_hidden_layers`,
    `hidden_size`, `num_key_value_heads`, `quantization_config`, ...). goodput prices any Llama,
    Mistral, Mixtral, Qwen2/3 (dense and MoE), Gemma 1/2/3, Phi-3 or DeepSeek-V2/V3 from it, in
    bf16, fp8 or a 4-bit quantisation; the engine's `--kv-cache-dtype` and `--quantization` are
    read from `engine.args`."""
    model_config_ref: ModelConfigReference | None = None
    """A ConfigMap holding the checkpoint's config.json, read by the operator (never downloaded)."""
    kv_capacity_tokens: int | None = Field(default=None, ge=1)
    """KV-cache tokens one group holds (vLLM's `kv_cache_size_tokens`); absent: estimated from the
    GPU memory, the model shape and the parallelism."""
    capacity_work_seconds_per_second: float | None = Field(default=None, gt=0)
    """Work one group sustains per second while still meeting the SLO (its capacity envelope, not its
    peak); absent: derived from the service-time model."""
    learn_capacity: bool | None = None
    """Whether the autoscaler refines the capacity from this ModelGroup's own engines (the served work
    while the SLO held, and at which it stopped holding). Absent: it learns when
    `capacityWorkSecondsPerSecond` is absent (the service-time model is a prior) and uses a measured
    figure as given; true: a measured figure is the learner's starting point; false: never learn.
    `status.capacity` says which capacity is in use."""
    max_num_seqs: int | None = Field(default=None, ge=1, le=65536)
    """vLLM --max-num-seqs for every group; absent: vLLM's default for `gpu`."""
    max_num_batched_tokens: int | None = Field(default=None, ge=1, le=1048576)
    """vLLM --max-num-batched-tokens for every group; absent: vLLM's default for `gpu`."""
    ready_time_seconds: int | None = Field(default=None, ge=1, le=86400)
    """Expected time from creating a group to it serving (placement, image, weights, rank
    initialisation, compilation, warm-up). A prior: once 5 groups were measured
    (`status.readyTime.recent`), the autoscaler uses their 90th percentile (at most 3x their
    median) instead; absent, the median of the groups measured so far. Queued work the ready groups
    drain before then asks for no new group."""


class Warmup(SpecModel):
    """The request sent through the leader before a group counts as ready."""

    prompt: str = Field(default="Hello, my name is", min_length=1, max_length=8192)
    """Prompt of the warm-up completion."""
    max_tokens: int = Field(default=8, ge=1, le=4096)
    """Tokens the warm-up must generate."""
    timeout_seconds: int = Field(default=60, ge=1, le=3600)
    """Longest the warm-up may take before the group is reported not ready."""


class Readiness(SpecModel):
    """What a group must prove before it counts as capacity: serving correct tokens, not just listening."""

    nccl_check: Literal["Required", "Skip"] = "Skip"
    """'Required': every rank must report a passing NCCL health check, the pod condition
    `goodput.dev/NCCLHealthy` that goodput's health agent writes; only set it where the agent runs in
    the engine pods, or groups never become ready. 'Skip' (the default): trust the engine's own
    start-up, which already fails when the ranks cannot form their process group."""
    revision_check: bool = False
    """Require every rank to report, in the pod annotation `goodput.dev/model-revision` that
    goodput's health agent writes, the model revision of `model.revision`. Off by default: only set
    it where the agent runs in the engine pods, or groups never become ready."""
    warmup: Warmup = Warmup()
    """The warm-up request."""


class Drain(SpecModel):
    """How a group leaves: stop routing, let in-flight requests finish, then remove every rank together."""

    max_seconds: int = Field(default=600, ge=0, le=86400)
    """Longest to wait for the leader to report no running or waiting requests, counted from the
    drain's start; for a drain an operator resumed after a takeover or a restart, from when it
    resumed it (the time no operator acted is not charged to the engine)."""
    on_timeout: Literal["Abort", "Requeue"] = "Abort"
    """What happens to requests still in flight after `maxSeconds`: 'Abort' ends them (and counts
    them); 'Requeue' hands them back to the gateway to retry on another group."""
    min_lifetime_seconds: int = Field(default=300, ge=0, le=86400)
    """A group younger than this (since it became ready) is not chosen for scale-in."""


class Rollout(SpecModel):
    """How a change to the groups' pod template (engine, model) reaches running groups: complete
    groups are replaced a few at a time, a new group ready before an old one drains."""

    cel_rules = (
        CelRule(
            rule="self.maxSurge > 0 || self.maxUnavailable > 0",
            message="`rollout.maxSurge` and `rollout.maxUnavailable` must not both be 0: a rollout could "
            "then neither add a new group nor remove an old one",
            field_path=".maxSurge",
            check=lambda rollout: rollout.max_surge > 0 or rollout.max_unavailable > 0,
        ),
    )

    max_surge: int = Field(default=1, ge=0, le=64)
    """Groups of the new revision that may run beyond `replicas` while old groups remain."""
    max_unavailable: int = Field(default=0, ge=0, le=64)
    """Ready groups below `replicas` a rollout may take out of service at once."""


Weekday = Literal["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
WEEKDAYS: tuple[Weekday, ...] = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_CLOCK_PATTERN = r"^([01][0-9]|2[0-3]):[0-5][0-9]$"


class ScheduledReplicas(SpecModel):
    """A floor on the group count for a time of day: what a team knows about its load and the
    history does not show yet (a launch, a batch window, the working day of a new region). The
    autoscaler proposes at least `minReplicas` groups inside the window; it may propose more."""

    cel_rules = (
        CelRule(
            rule="self.start != self.end",
            message="`end` must differ from `start`: a window that starts when it ends is empty",
            field_path=".end",
            check=lambda entry: entry.start != entry.end,
        ),
    )

    name: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)
    """Names the window in decision records (`schedule` proposals)."""
    start: str = Field(max_length=5, pattern=_CLOCK_PATTERN)
    """Local time the window opens, "HH:MM" (24 h)."""
    end: str = Field(max_length=5, pattern=_CLOCK_PATTERN)
    """Local time the window closes, "HH:MM"; earlier than `start`: it closes the next day."""
    days: tuple[Weekday, ...] = Field(
        default=(), max_length=7, json_schema_extra={"x-kubernetes-list-type": "set"}
    )
    """Days the window opens on ("Mon" .. "Sun"); empty: every day. A window past midnight
    belongs to the day it opened."""
    time_zone: str = Field(default="UTC", min_length=1, max_length=64)
    """IANA time zone of `start` and `end` ("Europe/Paris"); daylight saving time is followed."""
    min_replicas: int = Field(ge=0, le=1000)
    """Fewest groups proposed inside the window. Above `maxReplicas` it is clamped to
    `maxReplicas`, and the decision says so (guard TooManyReplicas)."""

    @field_validator("time_zone")
    @classmethod
    def _known_time_zone(cls, value: str) -> str:
        """A zone the operator cannot load would make the window open at a guessed time."""
        if not _time_zone_known(value):
            raise ValueError(f"{value!r} is not an IANA time zone (for example UTC or America/New_York)")
        return value


def _time_zone_known(name: str) -> bool:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return False
    return True


class Forecast(SpecModel):
    """Asking for groups ahead of a rise the ModelGroup's own history forecasts."""

    error_quantile: float = Field(default=0.9, ge=0.5, le=0.99)
    """The share of past forecast errors the safety margin covers: 0.9 sizes the groups for the
    forecast plus the error it stayed under nine times in ten."""


# With optionalOldSelf, oldSelf is absent on create, so the bounds then apply to `replicas` too.
_REPLICAS_UNCHANGED = "(oldSelf.hasValue() && oldSelf.value().replicas == self.replicas)"


# The LoRA ranks vLLM accepts for `--max-lora-rank` (vllm/config/lora.py).
LoraRank = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]


class Adapter(SpecModel):
    """One LoRA adapter of the base model, loaded into an engine at run time when a request asks for it."""

    name: str = Field(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9][-A-Za-z0-9_.:/@]*$")
    """The name clients put in the request's `model` field, and the engine's `lora_name`."""
    source: str = Field(min_length=1, max_length=2048)
    """Where the engine reads the adapter: a path inside the image or a volume, or a Hugging Face
    repository id (vLLM's `lora_path` of `POST /v1/load_lora_adapter`)."""
    max_rank: LoraRank | None = None
    """The adapter's rank, when known: it must not exceed `adapterLimits.maxRank`."""


class AdapterLimits(SpecModel):
    """What each replica group's engine holds of the adapters (vLLM's LoRA flags)."""

    max_loaded_per_group: int = Field(default=8, ge=1, le=256)
    """Adapters loaded at once in one group's engine (`--max-loras`): the gateway unloads the least
    recently used one to load another."""
    max_rank: LoraRank = 16
    """Largest adapter rank the engine accepts (`--max-lora-rank`)."""
    max_cpu_loaded: int | None = Field(default=None, ge=1, le=4096)
    """Adapters cached in host memory (`--max-cpu-loras`); absent: vLLM's default (`maxLoadedPerGroup`).
    Must be at least `maxLoadedPerGroup`."""

    cel_rules = (
        CelRule(
            rule="!has(self.maxCpuLoaded) || self.maxCpuLoaded >= self.maxLoadedPerGroup",
            message="`maxCpuLoaded` must be at least `maxLoadedPerGroup`: vLLM refuses a smaller CPU cache",
            field_path=".maxCpuLoaded",
            check=lambda limits: (
                limits.max_cpu_loaded is None or limits.max_cpu_loaded >= limits.max_loaded_per_group
            ),
        ),
    )


class KvOffload(SpecModel):
    """The engines' KV offloading to CPU memory (vLLM's `--kv-offloading-size` and
    `--kv-offloading-backend`, vLLM 0.14 or later): KV blocks copied to host memory and loaded back
    on a prefix hit instead of recomputed. The gateway offloads the KV of sessions waiting on a tool
    only when it is set."""

    backend: Literal["native", "lmcache"] = "native"
    """`native`: vLLM's OffloadingConnector; `lmcache`: the LMCache connector (its local CPU tier)."""
    cpu_size_gib: float = Field(gt=0, le=4096)
    """Host memory for offloaded KV, in GiB, across all the tensor-parallel ranks of one engine: the
    pods' memory requests must leave room for it."""


class ModelGroupSpec(SpecModel):
    """Desired state of a ModelGroup."""

    cel_rules = (
        CelRule(
            rule="self.minReplicas <= self.maxReplicas",
            message="`minReplicas` must be less than or equal to `maxReplicas`",
            field_path=".minReplicas",
            check=lambda spec: spec.min_replicas <= spec.max_replicas,
        ),
        CelRule(
            rule="self.warmReplicas <= self.maxReplicas",
            message="`warmReplicas` must be less than or equal to `maxReplicas`",
            field_path=".warmReplicas",
            check=lambda spec: spec.warm_replicas <= spec.max_replicas,
        ),
        # Checked when `replicas` is set or changed (create, `kubectl scale`, the autoscaler), not
        # when only the bounds move: lowering `maxReplicas` below the running count is accepted and
        # the operator then drains down to it, instead of a GitOps change failing on a field the
        # autoscaler owns. So the operator's own parsing must accept such an object: no Python twin.
        CelRule(
            rule=f"self.replicas <= self.maxReplicas || {_REPLICAS_UNCHANGED}",
            message="`replicas` must be less than or equal to `maxReplicas`: "
            "raise `maxReplicas` to run more groups",
            field_path=".replicas",
            optional_old_self=True,
        ),
        CelRule(
            rule=f"self.replicas >= self.minReplicas || {_REPLICAS_UNCHANGED}",
            message="`replicas` must be greater than or equal to `minReplicas`: "
            "lower `minReplicas` to run fewer groups",
            field_path=".replicas",
            optional_old_self=True,
        ),
        CelRule(
            rule="!has(self.engine.volumeMounts) || self.engine.volumeMounts.all(m, has(self.pod) && "
            "has(self.pod.volumes) && self.pod.volumes.exists(v, v.name == m.name))",
            message="every `engine.volumeMounts[].name` must name a volume of `pod.volumes`",
            field_path=".engine.volumeMounts",
            check=lambda spec: (
                {m.name for m in spec.engine.volume_mounts} <= {v.name for v in spec.pod.volumes}
            ),
        ),
        CelRule(
            rule="!has(self.placement) || !has(self.placement.nodeProvisioning) || "
            "!has(self.placement.nodeProvisioning.mode) || self.placement.nodeProvisioning.mode == 'Off' "
            "|| !has(self.engine.gpuDeviceClassName)",
            message="`placement.nodeProvisioning.mode` must be Off when `engine.gpuDeviceClassName` is "
            "set: node autoscalers do not size new nodes from ResourceClaims, so request GPUs as a "
            "device-plugin resource (`engine.gpuResourceName`) to have nodes created",
            field_path=".placement.nodeProvisioning.mode",
            check=lambda spec: (
                spec.placement.node_provisioning.mode == "Off" or spec.engine.gpu_device_class_name is None
            ),
        ),
        CelRule(
            rule="has(self.profile) || (!has(self.policyRef) && !has(self.shadowPolicyRef))",
            message="`profile` must be set when `policyRef` or `shadowPolicyRef` is set: the autoscaler "
            "prices work with it",
            field_path=".profile",
            check=lambda spec: (
                spec.profile is not None or (spec.policy_ref is None and spec.shadow_policy_ref is None)
            ),
        ),
        CelRule(
            rule="!has(self.adapters) || self.adapters.all(a, a.name != "
            "(has(self.model.servedName) ? self.model.servedName : self.model.name))",
            message="an adapter's `name` must differ from the served model name: requests for the base "
            "model and for the adapter would be indistinguishable",
            field_path=".adapters",
            check=lambda spec: all(
                adapter.name != (spec.model.served_name or spec.model.name) for adapter in spec.adapters
            ),
        ),
        CelRule(
            rule="!has(self.adapters) || self.adapters.all(a, !has(a.maxRank) || "
            "a.maxRank <= (has(self.adapterLimits) && has(self.adapterLimits.maxRank) ? "
            "self.adapterLimits.maxRank : 16))",
            message="an adapter's `maxRank` must not exceed `adapterLimits.maxRank`: the engine refuses it",
            field_path=".adapters",
            check=lambda spec: all(
                adapter.max_rank is None or adapter.max_rank <= spec.adapter_limits.max_rank
                for adapter in spec.adapters
            ),
        ),
        CelRule(
            rule=f"!has(self.kvOffload) || !has(self.engine.args) || "
            f"self.engine.args.all(arg, !arg.matches('{KV_TRANSFER_CONFIG_PATTERN}'))",
            message="`engine.args` must not set `--kv-transfer-config` with `kvOffload`: both configure "
            "the engine's KV connector, set one of them",
            field_path=".kvOffload",
            check=lambda spec: (
                spec.kv_offload is None
                or not any(re.match(KV_TRANSFER_CONFIG_PATTERN, arg) for arg in spec.engine.args)
            ),
        ),
    )

    model: ModelSource
    """The model to serve."""
    engine: Engine
    """The vLLM container."""
    parallelism: Parallelism
    """Tensor and pipeline parallelism and the pods of one group. Immutable."""
    placement: Placement = Placement()
    """Gang placement of each group into one topology domain."""
    pod: PodOptions = PodOptions()
    """Settings of the engine pods a platform team owns: labels, annotations, volumes, security
    context, runtime class, image pull secrets, ServiceAccount, priority class."""
    replicas: int = Field(default=1, ge=0, le=1000)
    """Complete groups wanted. Written by the autoscaler when `policyRef` is set, with the decision
    in the annotation `goodput.dev/last-rescale` (leave both out of GitOps diffs then), else by hand
    or by another autoscaler (`kubectl scale`, an HPA, KEDA).
    Setting it outside [`minReplicas`, `maxReplicas`] is rejected; moving the bounds past it is
    accepted and the operator converges to the nearest bound."""
    min_replicas: int = Field(default=1, ge=0, le=1000)
    """Fewest groups `replicas` may ask for. 0 lets the autoscaler remove the last group, but nothing
    in the operator brings a pool back from zero groups yet: with no group there is no engine whose
    metrics show waiting requests, and requests sent meanwhile fail. Until the gateway holds requests
    and signals demand at zero groups, use 0 only for pools that someone (or something) scales up
    by hand, for example `kubectl scale mg <name> --replicas=1`."""
    max_replicas: int = Field(ge=1, le=1000)
    """Most groups `replicas` may ask for: the GPU budget is maxReplicas x tensor x pipeline GPUs."""
    warm_replicas: int = Field(default=0, ge=0, le=1000)
    """Warm floor: the autoscaler proposes at least this many groups whatever the load, so bursts
    shorter than the ready time find warm capacity. Unlike `minReplicas` it does not bound a manual
    `kubectl scale`."""
    policy_ref: PolicyRef | None = None
    """The SLOPolicy whose decisions are applied; absent: goodput does not autoscale this group."""
    shadow_policy_ref: PolicyRef | None = None
    """An SLOPolicy whose decisions are computed and recorded in `status.shadowDecision` but never
    applied: how a pipeline trials a new policy revision against live traffic."""
    profile: Profile | None = None
    """Capacity envelope and service-time model on this hardware. Required with a policy."""
    readiness: Readiness = Readiness()
    """What a group must pass before it counts as capacity."""
    drain: Drain = Drain()
    """How groups are removed on scale-in."""
    rollout: Rollout = Rollout()
    """How a changed pod template replaces running groups."""
    replica_schedule: tuple[ScheduledReplicas, ...] = Field(
        default=(), max_length=32, json_schema_extra=list_map("name")
    )
    """Floors on the group count by time of day, as a team knows its load; with `policyRef`."""
    forecast: Forecast | None = None
    """Forecast the offered work from the ModelGroup's history and ask for groups one ready time
    ahead of a rise; absent: the autoscaler only reacts. Needs a week's history at most, a day and
    an hour at least; until then (or when the history has gaps) it reacts, and says why."""
    adapters: tuple[Adapter, ...] = Field(default=(), max_length=1024, json_schema_extra=list_map("name"))
    """LoRA adapters of the model, each served under its own name: the engine starts with LoRA
    enabled, and the gateway loads an adapter into a group when a request asks for it. Names are
    unique and differ from the served model name."""
    adapter_limits: AdapterLimits = AdapterLimits()
    """How many adapters one group's engine holds, and their largest rank; used only with `adapters`."""
    kv_offload: KvOffload | None = None
    """Offload KV to the engines' CPU memory; absent: KV lives in GPU memory only, and the gateway
    keeps or recomputes the KV of sessions waiting on a tool, never offloads it."""

    @field_validator("adapters")
    @classmethod
    def _adapter_names_unique(cls, value: tuple[Adapter, ...]) -> tuple[Adapter, ...]:
        """The API server refuses duplicates by the list's map key; an object that came another way
        fails here, before a request could name two adapters at once."""
        names = [adapter.name for adapter in value]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"adapter names must be unique: {', '.join(repr(n) for n in repeated)} repeated")
        return value


GroupState = Literal["Placing", "Provisioning", "Warming", "Ready", "Draining", "Failed"]
"""A group's state: `status.groups[].state`, the group controller's lifecycle and the autoscaler's
counts alike."""
GROUP_STATES: tuple[GroupState, ...] = ("Placing", "Provisioning", "Warming", "Ready", "Draining", "Failed")
ACTIVE_STATES: frozenset[GroupState] = frozenset({"Placing", "Provisioning", "Warming", "Ready"})
"""Groups that count toward `replicas`: serving, or on their way to serving."""
COMING_STATES: frozenset[GroupState] = frozenset({"Placing", "Provisioning", "Warming"})
"""Groups on their way to serving: capacity that comes without a new decision."""


class ReadyTime(StatusModel):
    """How long a group took to become ready, by phase."""

    placing_seconds: float = Field(ge=0)
    """From creation until every pod was bound to a node."""
    provisioning_seconds: float = Field(ge=0)
    """From binding until every rank's container was running and the engine answered /health."""
    warming_seconds: float = Field(ge=0)
    """From /health until the NCCL, revision and warm-up checks passed."""
    total_seconds: float = Field(ge=0)
    """From creation to ready."""
    phases: tuple[PhaseSeconds, ...] = Field(default=(), max_length=8)
    """The same time in finer phases, in order (Scheduling, ContainerStart, WeightLoad, RankFormation
    where the NCCL check is required, WarmUp); see `status.readyTime`."""


ReadyPhaseName = Literal["Scheduling", "ContainerStart", "WeightLoad", "RankFormation", "WarmUp"]
"""A phase of a group's ready time, ended by its last rank: bound to a node (PodScheduled), engine
container running (image pulled, init containers done), engine answering /health (weights loaded),
NCCLHealthy (ranks formed), and the group-ready gate (revision check and warm-up passed)."""


class PhaseSeconds(StatusModel):
    """One phase of one group's ready time."""

    phase: ReadyPhaseName
    """The phase."""
    seconds: float | None = Field(default=None, ge=0)
    """How long the group spent in it; absent: unknown (its end was not recorded: its time counts
    in the next phase)."""


class ReadyPhaseSummary(StatusModel):
    """The recent groups' time in one phase."""

    phase: ReadyPhaseName
    """The phase."""
    samples: int = Field(ge=0)
    """Recent groups whose time in this phase is known."""
    p50_seconds: float | None = Field(default=None, ge=0)
    """Median over those groups; absent with none."""
    p90_seconds: float | None = Field(default=None, ge=0)
    """90th percentile (nearest rank) over those groups; absent with none."""


class ReadySample(StatusModel):
    """One group's ready time, kept after the group is gone."""

    group: str = Field(max_length=63)
    """The group (names are never reused, so a group is recorded once)."""
    ready_at: Timestamp
    """When it became ready."""
    total_seconds: float = Field(ge=0)
    """From creation to ready."""
    phases: tuple[PhaseSeconds, ...] = Field(default=(), max_length=8)
    """By phase, in order."""


class ReadyPhaseStall(StatusModel):
    """A group not ready whose current phase has lasted past its bound."""

    group: str = Field(max_length=63)
    """The group."""
    phase: ReadyPhaseName
    """The phase it is stuck in."""
    seconds: float = Field(ge=0)
    """How long it has been in that phase."""
    bound_seconds: float = Field(ge=0)
    """The bound it passed: 3x the recent groups' 90th percentile in that phase (at least 60 s) once
    5 of them recorded it, else half of `readiness.startupTimeoutSeconds`."""


# Groups kept in `status.readyTime.recent`: the distribution the autoscaler reads.
RECENT_READY_SAMPLES = 20


class ReadyTimeSummary(StatusModel):
    """How long this ModelGroup's groups took to become ready, whole and by phase, over the latest
    groups; and the groups whose current phase is stalled."""

    samples: int = Field(default=0, ge=0)
    """Groups in `recent`."""
    p50_seconds: float | None = Field(default=None, ge=0)
    """Median ready time over `recent`; absent with none."""
    p90_seconds: float | None = Field(default=None, ge=0)
    """90th percentile (nearest rank) ready time over `recent`; absent with none."""
    by_phase: tuple[ReadyPhaseSummary, ...] = Field(default=(), max_length=8)
    """The same, per phase."""
    recent: tuple[ReadySample, ...] = Field(default=(), max_length=RECENT_READY_SAMPLES)
    """The latest groups to become ready, newest first (at most 20)."""
    stalled: tuple[ReadyPhaseStall, ...] = Field(default=(), max_length=64)
    """Groups not ready whose current phase has lasted past its bound, with the phase named (a
    ReadyPhaseStalled Warning Event is posted once per group and phase)."""


class GroupStatus(StatusModel):
    """One complete replica group."""

    name: str = Field(max_length=63, pattern=DNS_LABEL_PATTERN)
    """Group name; its pods carry it in the goodput.dev/group label."""
    state: GroupState
    """'Placing' (pods gated or not yet bound), 'Provisioning' (containers starting, weights
    loading), 'Warming' (readiness checks), 'Ready' (counted as capacity), 'Draining' (no new
    requests, finishing in-flight ones) or 'Failed' (to be replaced)."""
    domain: str | None = None
    """Value of `placement.topologyKey` of the domain the group was placed in."""
    pods: tuple[str, ...] = ()
    """Pod names by rank; the first is the leader."""
    created_at: Timestamp
    """When the group's pods were created."""
    ready_at: Timestamp | None = None
    """When the group became ready."""
    ready_time: ReadyTime | None = None
    """Ready time by phase, once ready."""
    drain_started_at: Timestamp | None = None
    """When draining began."""
    outdated: bool = False
    """Its pods are of an older pod template: a rollout replaces it."""
    message: str | None = Field(default=None, max_length=32768)
    """Why the group is in its state, when that is not obvious (for example why it failed)."""
    pool: str | None = Field(default=None, max_length=63, pattern=DNS_LABEL_PATTERN)
    """The pool the group belongs to (`status.pools[].name`); absent in a record an older operator
    wrote, whose groups are all of the `serving` pool."""


class Proposal(StatusModel):
    """One signal's proposed number of groups."""

    signal: str = Field(max_length=64)
    """Signal name: 'queueWork', 'slack', 'kvCache', 'goodput', 'scaleFromZero', 'gatewayQueue', 'warmFloor'
    or 'minReplicas' (api.reasons.Signal)."""
    replicas: int = Field(ge=0)
    """Groups this signal asks for."""
    detail: str = Field(default="", max_length=1024)
    """The inputs behind the proposal, for example 'Q_work=412s lambda_w=38.2/s C=9.1/s'."""


CapacitySourceName = Literal["prior", "learnt", "measured"]


class DecisionCapacity(StatusModel):
    """The capacity a decision used: where it comes from and how sure it is."""

    source: CapacitySourceName
    """'prior' (the service-time model), 'learnt' (refined from this ModelGroup's engines) or
    'measured' (`profile.capacityWorkSecondsPerSecond`)."""
    work_seconds_per_second: float = Field(gt=0)
    """Capacity C of one group at the profile's reference request mix."""
    confidence: float = Field(ge=0, le=1)
    """0 for a prior nothing confirmed, growing towards 1 with evidence; 1 for a measured figure."""


class DecisionReadyTime(StatusModel):
    """The ready time a decision looked ahead by (the backlog the serving groups drain before a
    group asked for now is ready asks for no group), and where it comes from."""

    source: Literal["prior", "measured"]
    """'prior' (`profile.readyTimeSeconds`) or 'measured' (the 90th percentile of the recent groups
    in `status.readyTime`, or their median while there are fewer than 5 and no prior)."""
    seconds: float = Field(ge=0)
    """The ready time used."""


class EvidenceWindow(StatusModel):
    """The time span of the evidence behind a learnt capacity."""

    start: Timestamp
    """The first evidence since learning (re)started."""
    end: Timestamp
    """The latest evidence."""


class CapacityStatus(DecisionCapacity):
    """The capacity the autoscaler uses for this ModelGroup, and why."""

    evidence_window: EvidenceWindow | None = None
    """Absent for a prior or a measured figure used as given."""
    reason: str = Field(default="", max_length=256)
    """Why this source: for example 'learning', 'change detected: relearning', 'evidence stale'."""


class ScalingDecision(StatusModel):
    """One autoscaler decision: its inputs, what each signal proposed, and what was done."""

    time: Timestamp
    """When the decision was made."""
    from_replicas: int = Field(ge=0)
    """`spec.replicas` before the decision."""
    to_replicas: int = Field(ge=0)
    """`spec.replicas` the decision asked for."""
    reason: str = Field(max_length=128)
    """Why the result is what it is, for example 'DesiredWithinRange' or 'ScaleDownStabilized'."""
    signal: str = Field(max_length=64)
    """The signal whose proposal won (the largest)."""
    proposals: tuple[Proposal, ...] = Field(default=(), max_length=16)
    """Every signal's proposal."""
    guards: tuple[str, ...] = Field(default=(), max_length=16)
    """Safety guards that changed or held the result, for example 'StaleMetricsHoldScaleIn'."""
    policy_revision: str = Field(max_length=128)
    """`spec.revision` of the SLOPolicy that made the decision."""
    mode: AutoscalingMode
    """The policy's mode: only 'Active' decisions are applied."""
    shadow: bool = False
    """True for a decision of the shadow policy, which is never applied."""
    capacity: DecisionCapacity | None = None
    """The capacity the decision used (absent where the decision did not say)."""
    ready_time: DecisionReadyTime | None = None
    """The ready time the decision looked ahead by and its source; absent: unknown (no backlog was
    discounted by a ready time)."""
    pool: str | None = Field(default=None, max_length=63, pattern=DNS_LABEL_PATTERN)
    """The pool the decision scaled (`status.pools[].name`); absent in a record an older operator
    wrote, which scaled the `serving` pool."""


DrainOutcome = Literal["Drained", "TimedOut"]


class DrainRecord(StatusModel):
    """How one drained group left: idle after routing stopped, or at `drain.maxSeconds`."""

    group: str = Field(max_length=63, pattern=DNS_LABEL_PATTERN)
    """The group's name."""
    outcome: DrainOutcome
    """'Drained' (its leader reported no request running or waiting after routing stopped) or
    'TimedOut' (requests were still in flight at `drain.maxSeconds`)."""
    started_at: Timestamp
    """When the drain began (the readiness gate went False)."""
    ended_at: Timestamp
    """When every rank was deleted."""
    duration_seconds: float = Field(ge=0)
    """From the start of the drain to the deletion."""
    requests_finished: int | None = Field(default=None, ge=0)
    """Requests the leader finished during the drain; absent when unknown (the leader's counters
    were not read both at the start of the drain and at its end)."""
    requests_aborted: int | None = Field(default=None, ge=0)
    """Requests the leader still held at its last reading before the deletion, ended by the shutdown:
    never dropped silently. One that finishes in the moment between that reading and the shutdown is
    counted too, so this may count more than were aborted, never fewer. Absent when unknown (the
    leader could not be read): never 0 for a count nobody took."""
    on_timeout: Literal["Abort", "Requeue"] | None = None
    """`drain.onTimeout` as applied, for a drain that timed out."""


# Drains kept in `status.drain.recent`. A drain is deleted only once it is there, so no more drains
# end (are recorded) in one pass than this holds.
RECENT_DRAINS = 10


class DrainSummary(StatusModel):
    """Every drain of this ModelGroup as seen by the operator: totals and the latest ones."""

    drained: int = Field(default=0, ge=0)
    """Drains that ended with the leader idle."""
    timed_out: int = Field(default=0, ge=0)
    """Drains that reached `drain.maxSeconds` with requests in flight."""
    cancelled: int = Field(default=0, ge=0)
    """Drains called off by a scale-out that put the group back in service."""
    requests_finished: int = Field(default=0, ge=0)
    """Requests finished by draining groups, over every drain whose count is known: a lower bound
    while `drainsWithUnknownFinished` is above 0."""
    requests_aborted: int = Field(default=0, ge=0)
    """Requests aborted when a drain timed out, over every drain whose count is known: a lower bound
    while `drainsWithUnknownAborts` is above 0."""
    drains_with_unknown_finished: int = Field(default=0, ge=0)
    """Drains that ended without a count of the requests they finished: `requestsFinished` holds
    none of theirs."""
    drains_with_unknown_aborts: int = Field(default=0, ge=0)
    """Drains that ended without a count of the requests they aborted (the leader could not be read
    at the end): `requestsAborted` holds none of theirs, and it says nothing of how many those were."""
    recent: tuple[DrainRecord, ...] = Field(default=(), max_length=RECENT_DRAINS)
    """The latest drains, newest first (at most 10)."""


class ClassFeasibilityStatus(StatusModel):
    """One SLO class's feasible demand: the prompts whose SLO no number of groups of this shape can
    meet are counted here and never scaled for."""

    name: str = Field(max_length=63)
    """The SLOPolicy class."""
    longest_feasible_prompt_tokens: int = Field(ge=0, json_schema_extra={"format": "int64"})
    """The longest prompt whose prefill on an idle group (net of expected prefix-cache hits) fits
    the class's TTFT target; 0 when no request can meet the class."""
    infeasible_share: float | None = Field(default=None, ge=0, le=1)
    """Share of the window's prompts longer than that (from vllm:request_prompt_tokens; the last ten
    minutes' when none finished within the window); absent while no prompt lengths were observed
    (unknown, counted as feasible)."""
    unmet_field: str | None = Field(default=None, max_length=64)
    """The class's field no request can meet ('ttftSeconds' or 'itlSeconds'), if any."""
    attainment_offered: float | None = Field(default=None, ge=0, le=1)
    """Requests within the SLO over all offered requests in the goodput window (primary class: the
    engine histograms carry no class)."""
    attainment_attainable: float | None = Field(default=None, ge=0, le=1)
    """Requests within the SLO over the requests that could meet it at all: attainment against
    the attainable ceiling (primary class)."""


class PoolStatus(StatusModel):
    """One pool of a ModelGroup: a set of complete groups from one template, with its own bounds
    and scale. A ModelGroup without roles has one pool, `serving`, whose figures equal the
    ModelGroup's own."""

    name: str = Field(max_length=63, pattern=DNS_LABEL_PATTERN)
    """The pool's name; its pods carry it in the goodput.dev/pool label (pods created before the
    label existed belong to `serving`)."""
    desired_groups: int = Field(default=0, ge=0)
    """Groups wanted in this pool, as last acted on."""
    placing_groups: int = Field(default=0, ge=0)
    """Groups whose pods are not all bound to nodes yet."""
    provisioning_groups: int = Field(default=0, ge=0)
    """Groups whose containers are starting or loading weights."""
    warming_groups: int = Field(default=0, ge=0)
    """Groups running their readiness checks."""
    ready_groups: int = Field(default=0, ge=0)
    """Groups counted as capacity."""
    draining_groups: int = Field(default=0, ge=0)
    """Groups finishing in-flight requests before removal."""
    failed_groups: int = Field(default=0, ge=0)
    """Groups that failed and await replacement."""
    revision: str | None = Field(default=None, max_length=64)
    """The pool's current pod template revision; absent until the group controller planned it."""
    label_selector: str | None = Field(default=None, max_length=1024)
    """Selector of the pool's leader pods, one per group: what an HPA or KEDA scaling this pool
    averages over."""


class ModelGroupStatus(StatusModel):
    """Observed state of a ModelGroup, written by the operator."""

    observed_generation: int = Field(default=-1, json_schema_extra={"format": "int64"})
    """The `metadata.generation` last acted on; -1 before the operator's first visit."""
    replicas: int = Field(default=0, ge=0)
    """Ready complete groups: the capacity that counts (scale subresource `status.replicas`)."""
    label_selector: str | None = Field(default=None, max_length=1024)
    """Selector of the groups' leader pods, one per group (scale subresource selector)."""
    desired_groups: int = Field(default=0, ge=0)
    """Groups wanted: `spec.replicas` as last acted on."""
    placing_groups: int = Field(default=0, ge=0)
    """Groups whose pods are not all bound to nodes yet."""
    provisioning_groups: int = Field(default=0, ge=0)
    """Groups whose containers are starting or loading weights."""
    warming_groups: int = Field(default=0, ge=0)
    """Groups running their readiness checks."""
    ready_groups: int = Field(default=0, ge=0)
    """Groups counted as capacity."""
    draining_groups: int = Field(default=0, ge=0)
    """Groups finishing in-flight requests before removal."""
    failed_groups: int = Field(default=0, ge=0)
    """Groups that failed and await replacement."""
    revision: str | None = Field(default=None, max_length=64)
    """The current pod template's revision (a hash of every field that shapes a pod)."""
    updated_groups: int = Field(default=0, ge=0)
    """Groups serving or on their way whose pods are of the current revision."""
    outdated_groups: int = Field(default=0, ge=0)
    """Groups serving or on their way whose pods are of an older revision: a rollout replaces them."""
    groups: tuple[GroupStatus, ...] = Field(default=(), json_schema_extra=list_map("name"))
    """Every group and its state."""
    pools: tuple[PoolStatus, ...] = Field(default=(), max_length=8, json_schema_extra=list_map("name"))
    """Every pool and its groups' counts; one pool, `serving`, for a ModelGroup without roles. The
    scale subresource (`kubectl scale`, an HPA or KEDA) targets that pool."""
    drain: DrainSummary | None = None
    """Scale-in drains: how many ended idle, timed out or were cancelled, and the requests they
    finished and aborted."""
    ready_time: ReadyTimeSummary | None = None
    """Ready time of the latest groups, whole and by phase (median, 90th percentile), and the groups
    whose current phase is stalled. Absent until a group became ready or stalled."""
    last_decision: ScalingDecision | None = None
    """The latest decision of the bound policy."""
    decisions: tuple[ScalingDecision, ...] = Field(default=(), max_length=10)
    """The latest decisions that changed `spec.replicas`, newest first (at most 10)."""
    shadow_decision: ScalingDecision | None = None
    """The latest decision of the shadow policy (never applied)."""
    feasibility: tuple[ClassFeasibilityStatus, ...] = Field(
        default=(), max_length=16, json_schema_extra=list_map("name")
    )
    """Per SLO class: the prompt length beyond which its TTFT target is unreachable, the share of
    prompts past it, and attainment against offered requests and against the attainable ceiling."""
    capacity: CapacityStatus | None = None
    """The capacity per group the autoscaler decides with: its source (prior, learnt, measured),
    value, confidence and the window of the evidence behind it. Absent until the autoscaler decided
    (unknown, never 0)."""
    autoscaler_state: str | None = Field(default=None, max_length=65536)
    """The autoscaler's memory (recent recommendations, scale events, the goodput signal's trial) in a
    compact versioned form, so an operator restart keeps its stabilisation windows and step limits.
    Written by the autoscaler only; not an interface."""
    conditions: tuple[Condition, ...] = Field(default=(), json_schema_extra=list_map("type"))
    """The group controller's 'Ready', 'Progressing', 'Degraded' and 'ScalingLimited' (a group cannot
    be placed); the autoscaler's 'ScalingActive', 'MetricsAvailable', 'DecisionLimited' and
    'SLOAttainable'. Each is applied by its controller's own field manager."""


class ModelGroup(SpecModel):
    """A served model run as complete replica groups of GPU pods, autoscaled against an SLOPolicy."""

    api_version: Literal["goodput.dev/v1alpha1"] = "goodput.dev/v1alpha1"
    """API version of the object."""
    kind: Literal["ModelGroup"] = "ModelGroup"
    """Kind of the object."""
    metadata: ObjectMeta = ObjectMeta()
    """Standard object metadata."""
    spec: ModelGroupSpec
    """Desired state."""
    status: ModelGroupStatus = ModelGroupStatus()
    """Observed state, written by the operator."""
