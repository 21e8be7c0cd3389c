"""The health agent as a native sidecar of every rank (an init container with `restartPolicy: Always`).

The agent (goodput.agent) reads the rank's GPUs, runs the NCCL check across the group and watches
the engine; it writes its own pod's conditions and revision annotation, so it needs an API token,
and only it: the pod keeps `automountServiceAccountToken: false`, runs as the `goodput-agent`
ServiceAccount (RBAC: get pods, patch pods and pods/status in its namespace) and the token is a
projected volume mounted into the agent's container alone.

Its startup probe passes once the first NCCL check has finished (the agent writes a file), so the
engine container, which Kubernetes starts only after its sidecars have started, never competes with
the check for GPU memory; a failed check still lets the engine start and the group controller fail
the group from the NCCLHealthy condition.

Under a device plugin the agent container requests no GPU (a GPU cannot be requested twice in one
pod), so what it sees depends on the node's container runtime (the NVIDIA container toolkit exposes
the devices named by NVIDIA_VISIBLE_DEVICES). Under dynamic resource allocation it references the
pod's ResourceClaim beside the engine, and sees exactly the pod's GPUs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final

from goodput.api import labels
from goodput.api.modelgroup import ModelGroupSpec

AGENT_CONTAINER_NAME: Final = "goodput-agent"
SERVICE_ACCOUNT: Final = "goodput-agent"
TOKEN_VOLUME: Final = "goodput-agent-token"
RUN_VOLUME: Final = "goodput-agent-run"
TMP_VOLUME: Final = "goodput-agent-tmp"
# Where the kubernetes client's in-cluster configuration looks for the token, CA and namespace.
TOKEN_PATH: Final = "/var/run/secrets/kubernetes.io/serviceaccount"
RUN_PATH: Final = "/run/goodput-agent"
TMP_PATH: Final = "/tmp"
# A user with no entry in the image's /etc/passwd: the agent needs no identity, only the GPUs' device
# nodes (world-readable and -writable under the NVIDIA container toolkit and CDI) and its volumes.
RUN_AS_USER: Final = 65532
CHECKED_FILE: Final = f"{RUN_PATH}/nccl-checked"
METRICS_PORT: Final = 9410
RENDEZVOUS_PORT: Final = 29510
TOKEN_EXPIRATION_SECONDS: Final = 3600
NCCL_TIMEOUT_SECONDS: Final = 180
AGENT_STARTUP_PROBE_PERIOD_SECONDS: Final = 5
# Time for the agent to start (spawn its rank processes, import the collective) beyond the check.
STARTUP_MARGIN_SECONDS: Final = 120


@dataclass(frozen=True, slots=True)
class AgentSidecar:
    """The operator's setting for the agent: its image (empty: the agent is not injected)."""

    image: str


@dataclass(frozen=True, slots=True)
class AgentRank:
    """What one rank's agent must know about its group; plain values, so pods.py need not be imported."""

    rank: int
    pods_per_group: int
    gpus_per_pod: int
    model: str
    model_revision: str
    engine_port: int
    leader_address: str | None
    """The group Service's DNS name for a multi-pod group; None: the pod is the whole group."""
    device_claim: str | None = None
    """The pod's ResourceClaim of its GPUs (dynamic resource allocation): the agent shares it with the
    engine and so sees exactly the pod's GPUs. None: GPUs from a device plugin, which it cannot share."""


def render_agent_container(sidecar: AgentSidecar, rank: AgentRank) -> dict[str, Any]:
    """The init container (a native sidecar) of one rank."""
    failure_threshold = math.ceil(
        (NCCL_TIMEOUT_SECONDS + STARTUP_MARGIN_SECONDS) / AGENT_STARTUP_PROBE_PERIOD_SECONDS
    )
    return {
        "name": AGENT_CONTAINER_NAME,
        "image": sidecar.image,
        "restartPolicy": "Always",
        "command": ["goodput-agent"],
        "args": [f"--nccl-timeout-seconds={NCCL_TIMEOUT_SECONDS}"],
        "env": _env(rank),
        "ports": [{"name": "agent-metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}]
        + (
            [{"name": "agent-rdzv", "containerPort": RENDEZVOUS_PORT, "protocol": "TCP"}]
            if rank.rank == 0
            else []
        ),
        "startupProbe": {
            "exec": {"command": ["test", "-e", CHECKED_FILE]},
            "periodSeconds": AGENT_STARTUP_PROBE_PERIOD_SECONDS,
            "failureThreshold": failure_threshold,
        },
        "resources": {
            "requests": {"cpu": "100m", "memory": "256Mi"},
            "limits": {"memory": "4Gi"},
            **({"claims": [{"name": rank.device_claim}]} if rank.device_claim else {}),
        },
        "securityContext": _security_context(),
        "volumeMounts": [
            {"name": TOKEN_VOLUME, "mountPath": TOKEN_PATH, "readOnly": True},
            {"name": RUN_VOLUME, "mountPath": RUN_PATH},
            {"name": TMP_VOLUME, "mountPath": TMP_PATH},
        ],
    }


def _security_context() -> dict[str, Any]:
    """The agent runs beside the user's engine with a token: the least a container can be given.

    Not root even in an image whose default user is (vLLM's), no privilege escalation, no
    capabilities, the runtime's default seccomp profile, and a read-only root filesystem; what the
    NCCL check writes (Python's and the collective's caches and temporary files) goes to `/tmp`, an
    emptyDir of its own."""
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_USER,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _env(rank: AgentRank) -> list[dict[str, Any]]:
    def field(path: str) -> dict[str, Any]:
        return {"valueFrom": {"fieldRef": {"fieldPath": path}}}

    leader = {"value": rank.leader_address} if rank.leader_address else field("status.podIP")
    engine_host = "127.0.0.1" if rank.rank == 0 or not rank.leader_address else rank.leader_address
    return [
        {"name": "GOODPUT_POD_NAME", **field("metadata.name")},
        {"name": "GOODPUT_POD_NAMESPACE", **field("metadata.namespace")},
        {"name": "GOODPUT_RANK", **field(f"metadata.labels['{labels.LABEL_RANK}']")},
        {"name": "GOODPUT_LEADER_ADDRESS", **leader},
        {"name": "GOODPUT_GROUP_SIZE", "value": str(rank.pods_per_group)},
        {"name": "GOODPUT_GPUS_PER_POD", "value": str(rank.gpus_per_pod)},
        {"name": "GOODPUT_MODEL", "value": rank.model},
        {"name": "GOODPUT_MODEL_REVISION", "value": rank.model_revision},
        {"name": "GOODPUT_ENGINE_URL", "value": f"http://{engine_host}:{rank.engine_port}"},
        {"name": "GOODPUT_AGENT_RENDEZVOUS_PORT", "value": str(RENDEZVOUS_PORT)},
        {"name": "GOODPUT_AGENT_METRICS_PORT", "value": str(METRICS_PORT)},
        {"name": "GOODPUT_AGENT_CHECKED_FILE", "value": CHECKED_FILE},
        # The run user has no passwd entry: HOME and USER keep caches and getpass.getuser() working.
        {"name": "HOME", "value": TMP_PATH},
        {"name": "USER", "value": AGENT_CONTAINER_NAME},
    ]


def agent_volumes() -> list[dict[str, Any]]:
    """The token (the pod's ServiceAccount's, short-lived, rotated by the kubelet), the cluster CA and
    the namespace: what an automounted token would carry, for the agent's container only."""
    return [
        {
            "name": TOKEN_VOLUME,
            "projected": {
                "sources": [
                    {"serviceAccountToken": {"path": "token", "expirationSeconds": TOKEN_EXPIRATION_SECONDS}},
                    {
                        "configMap": {
                            "name": "kube-root-ca.crt",
                            "items": [{"key": "ca.crt", "path": "ca.crt"}],
                        }
                    },
                    {
                        "downwardAPI": {
                            "items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]
                        }
                    },
                ]
            },
        },
        {"name": RUN_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        {"name": TMP_VOLUME, "emptyDir": {"sizeLimit": "1Gi"}},
    ]


def add_agent(pod_spec: dict[str, Any], sidecar: AgentSidecar | None, rank: AgentRank) -> dict[str, Any]:
    """The pod spec with the agent added (a new dict; `pod_spec` is not changed); as it was when the
    agent is not wanted."""
    if sidecar is None or not sidecar.image:
        return pod_spec
    return {
        **pod_spec,
        "serviceAccountName": SERVICE_ACCOUNT,
        "initContainers": [*pod_spec.get("initContainers", ()), render_agent_container(sidecar, rank)],
        "volumes": [*pod_spec.get("volumes", ()), *agent_volumes()],
    }


def agent_sidecar(spec: ModelGroupSpec, image: str) -> AgentSidecar | None:
    """The agent a ModelGroup asks for: its ranks must pass the NCCL check, and the operator has an
    agent image to inject."""
    if spec.readiness.nccl_check != "Required" or not image:
        return None
    return AgentSidecar(image=image)
