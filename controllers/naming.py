"""The names, labels, annotations and conditions by which goodput recognises its own objects.

Every object the operator creates carries its identity in its name and labels, so the state of a
ModelGroup can be rebuilt from the cluster alone after a restart: pod `<mg>-<group>-<rank>`, group
Service `<mg>-<group>`, group `g<ordinal>` with a per-ModelGroup ordinal that only grows.
"""

from __future__ import annotations

import hashlib
import re
from typing import Final

from goodput.api.base import API_VERSION, GROUP
from goodput.api.labels import (
    ANNOTATION_MODEL_REVISION,
    ANNOTATION_NCCL_CHECK_REQUEST,
    CONDITION_ENGINE_HEALTHY,
    CONDITION_GPU_HEALTHY,
    CONDITION_GROUP_READY,
    CONDITION_NCCL_HEALTHY,
    LABEL_GROUP,
    LABEL_MODEL_GROUP,
    LABEL_POOL,
    LABEL_RANK,
    SERVING_POOL,
)
from goodput.api.modelgroup import GPU_RESOURCE

DOMAIN: Final = GROUP

# Labels on every pod of a group (and the group's Service).
# A hash of the pod template the group was created from: groups of an older spec are outdated.
LABEL_REVISION: Final = f"{DOMAIN}/revision"
# On leaders only: Prometheus scrapes pods with this label.
LABEL_METRICS: Final = f"{DOMAIN}/metrics"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "goodput"

# Pod annotations written at creation.
ANNOTATION_TOPOLOGY_KEY: Final = f"{DOMAIN}/topology-key"
ANNOTATION_TOPOLOGY_DOMAIN: Final = f"{DOMAIN}/topology-domain"
ANNOTATION_REPLACES: Final = f"{DOMAIN}/replaces"
# On pods whose GPUs come from a ResourceClaim (dynamic resource allocation): the DeviceClass and the
# device count the claim asks for, so placement counts a pod's devices before its claim exists.
ANNOTATION_DEVICE_CLASS: Final = f"{DOMAIN}/device-class"
ANNOTATION_DEVICE_COUNT: Final = f"{DOMAIN}/device-count"
# Pod annotation written when a group starts draining (RFC 3339).
ANNOTATION_DRAINING_SINCE: Final = f"{DOMAIN}/draining-since"
# Leader annotation: what a drain has established (its baseline counters, when routing stopped).
ANNOTATION_DRAIN_PROGRESS: Final = f"{DOMAIN}/drain-progress"
# How a drain ended, on every rank before any is deleted: a restart records it from the pods.
ANNOTATION_DRAIN_OUTCOME: Final = f"{DOMAIN}/drain-outcome"
# Pod annotation written by the in-pod health agent: the model revision the rank loaded.
# Pod annotation an operator or a user sets to make the health agent re-run its NCCL check.

# ModelGroup annotations: state that must survive an operator restart.
ANNOTATION_GROUP_COUNTER: Final = f"{DOMAIN}/group-counter"
ANNOTATION_PLACEMENT_BACKOFF: Final = f"{DOMAIN}/placement-backoff"
ANNOTATION_ROLLOUT: Final = f"{DOMAIN}/rollout"

# Held on every pod from creation until the whole group exists, so no rank binds GPUs alone.
SCHEDULING_GATE: Final = f"{DOMAIN}/gang"
# Readiness gate on every pod; the operator sets it on all ranks at once.
# Pod condition set by the in-pod health agent after an all-reduce across the group's ranks.
# Pod conditions set by the health agent: a critical GPU fault, a hung engine (False fails the group).

# Placement counts devices under one name per kind; a DeviceClass's devices go under this prefix
# (no device plugin can advertise it: the API server reserves the domain).
DEVICE_CLASS_RESOURCE_PREFIX: Final = "deviceclass.resource.k8s.io/"
# The name of the claim in a DRA pod's spec.resourceClaims (both containers reference it).
POD_CLAIM_NAME: Final = "gpus"
MODEL_GROUP_API_VERSION: Final = API_VERSION
MODEL_GROUP_KIND: Final = "ModelGroup"

# The topology domain of a node without the topology label (Preferred placement): the node alone.
# A label value cannot hold "/", so it never collides with a domain named by a label value.
NODE_DOMAIN_PREFIX: Final = "node/"
# The domain of a group that no existing domain fitted and that waits for a node autoscaler to
# create nodes for it (`placement.nodeProvisioning`); the same "/" keeps it apart from label values.
NEW_NODES_DOMAIN: Final = "new-nodes/"

# A DNS-1123 label is at most 63 characters; the longest suffix we add is "-g99999-999".
_MAX_DNS_LABEL: Final = 63
_LONGEST_SUFFIX: Final = len("-g99999-999")
_GROUP_NAME = re.compile(r"^g(?P<ordinal>[0-9]+)$")
_POD_NAME = re.compile(r"^(?P<model_group>.+)-(?P<group>g[0-9]+)-(?P<rank>[0-9]+)$")


def group_name(ordinal: int) -> str:
    return f"g{ordinal}"


def group_ordinal(name: str) -> int | None:
    """The ordinal of a group name written by `group_name`, None for any other string."""
    match = _GROUP_NAME.match(name)
    return int(match["ordinal"]) if match else None


def service_name(model_group: str, group: str) -> str:
    return f"{model_group}-{group}"


def pod_name(model_group: str, group: str, rank: int) -> str:
    return f"{model_group}-{group}-{rank}"


def model_group_of_pod(pod: str) -> str | None:
    """The ModelGroup a pod name written by `pod_name` belongs to, None for any other name."""
    match = _POD_NAME.match(pod)
    return match["model_group"] if match else None


def max_model_group_name_length() -> int:
    """Longest ModelGroup name whose Service and pod names still fit a DNS-1123 label."""
    return _MAX_DNS_LABEL - _LONGEST_SUFFIX


def node_domain(node_name: str) -> str:
    """The domain of one node that lacks the topology label: the node alone."""
    return NODE_DOMAIN_PREFIX + node_name


def node_of_domain(domain: str) -> str | None:
    """The node a single-node domain stands for; None for a domain named by a label value."""
    return domain.removeprefix(NODE_DOMAIN_PREFIX) if domain.startswith(NODE_DOMAIN_PREFIX) else None


def device_class_resource(device_class: str) -> str:
    """The name placement counts a DeviceClass's devices under."""
    return f"{DEVICE_CLASS_RESOURCE_PREFIX}{device_class}"


def device_class_of_resource(resource: str) -> str | None:
    """The DeviceClass a placement resource name stands for; None for a device-plugin resource."""
    if resource.startswith(DEVICE_CLASS_RESOURCE_PREFIX):
        return resource.removeprefix(DEVICE_CLASS_RESOURCE_PREFIX)
    return None


def claim_template_name(model_group: str, device_class: str, devices: int) -> str:
    """The ResourceClaimTemplate of a ModelGroup's pods. A template's spec cannot change, so the name
    carries what it asks for: a new class or count is a new template, and pods of the old one keep it."""
    digest = hashlib.sha256(f"{device_class}/{devices}".encode()).hexdigest()[:8]
    return f"{model_group}-gpus-{digest}"


# The labels, conditions and annotations that are API are defined once, in api/labels.py, and
# listed here under the same names so the controllers find every name in one module.
__all__ = [
    "ANNOTATION_DEVICE_CLASS",
    "ANNOTATION_DEVICE_COUNT",
    "ANNOTATION_DRAINING_SINCE",
    "ANNOTATION_DRAIN_OUTCOME",
    "ANNOTATION_DRAIN_PROGRESS",
    "ANNOTATION_GROUP_COUNTER",
    "ANNOTATION_MODEL_REVISION",
    "ANNOTATION_NCCL_CHECK_REQUEST",
    "ANNOTATION_PLACEMENT_BACKOFF",
    "ANNOTATION_REPLACES",
    "ANNOTATION_ROLLOUT",
    "ANNOTATION_TOPOLOGY_DOMAIN",
    "ANNOTATION_TOPOLOGY_KEY",
    "CONDITION_ENGINE_HEALTHY",
    "CONDITION_GPU_HEALTHY",
    "CONDITION_GROUP_READY",
    "CONDITION_NCCL_HEALTHY",
    "DEVICE_CLASS_RESOURCE_PREFIX",
    "DOMAIN",
    "GPU_RESOURCE",
    "LABEL_GROUP",
    "LABEL_MANAGED_BY",
    "LABEL_METRICS",
    "LABEL_MODEL_GROUP",
    "LABEL_POOL",
    "LABEL_RANK",
    "LABEL_REVISION",
    "MANAGED_BY",
    "MODEL_GROUP_API_VERSION",
    "MODEL_GROUP_KIND",
    "NEW_NODES_DOMAIN",
    "NODE_DOMAIN_PREFIX",
    "POD_CLAIM_NAME",
    "SCHEDULING_GATE",
    "SERVING_POOL",
    "claim_template_name",
    "device_class_of_resource",
    "device_class_resource",
    "group_name",
    "group_ordinal",
    "max_model_group_name_length",
    "model_group_of_pod",
    "node_domain",
    "node_of_domain",
    "pod_name",
    "service_name",
]
