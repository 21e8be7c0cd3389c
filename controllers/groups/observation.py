"""Compact, frozen views of the pods and nodes the ModelGroup controller reads.

The operator keeps these views in its indexes instead of whole objects: they are what the pure
planning code needs, they cost little memory with hundreds of pods, and they make the controller's
inputs explicit. Parsing is pure: plain dicts in (as the API server sends them), values out.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from goodput.api.times import parse_rfc3339
from goodput.controllers import naming
from goodput.controllers.groups.drain import DecidedDrain, DrainProgress, parse_outcome, parse_progress
from goodput.controllers.groups.placement import GpuClaim, NodeInventory, Taint
from goodput.controllers.groups.pods import ENGINE_CONTAINER_NAME
from goodput.controllers.pools import pool_of_labels

_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True, slots=True)
class ConditionView:
    status: str
    reason: str
    message: str
    last_transition: datetime | None


@dataclass(frozen=True, slots=True)
class PodView:
    """One rank of a group as last seen."""

    name: str
    model_group: str
    group: str
    rank: int
    revision: str
    created_at: datetime | None
    deleting: bool
    phase: str
    node_name: str | None
    ip: str | None
    gated: bool
    topology_domain: str | None
    replaces: str | None
    draining_since: datetime | None
    gpus: int
    restarts: int
    containers_ready: ConditionView | None
    scheduled: ConditionView | None
    group_ready: ConditionView | None
    nccl_healthy: ConditionView | None
    reported_model_revision: str | None
    drain_progress: DrainProgress | None = None
    gpu_healthy: ConditionView | None = None
    """Written by the in-pod health agent; False is a critical GPU fault."""
    engine_healthy: ConditionView | None = None
    """Written by the in-pod health agent; False is an engine holding requests without progress."""
    waiting: ContainerWaiting | None = None
    """Why the engine container is not running yet, when the kubelet says (image pull, config)."""
    drain_outcome: DecidedDrain | None = None
    """How the group's drain ended, written before any rank is deleted (see `drain`)."""
    engine_started_at: datetime | None = None
    """When the engine container last started running (`state.running.startedAt`): the image is
    pulled and the init containers are done; None while it does not run."""
    pool: str = naming.SERVING_POOL
    """The pool of its group: the pool label, or `serving` for a pod created before the label."""

    @property
    def terminated(self) -> bool:
        return self.phase in _TERMINAL_PHASES

    @property
    def running_and_ready(self) -> bool:
        """Running with every container ready (ContainersReady: Ready also waits for our own gate)."""
        return self.phase == "Running" and _is_true(self.containers_ready)

    @property
    def marked_group_ready(self) -> bool:
        return _is_true(self.group_ready)


# Waiting reasons that are the spec's fault, and the ModelGroup field to fix; the others
# (ContainerCreating, PodInitializing) are progress.
_WAITING_FIELDS = {
    "ErrImagePull": "spec.engine.image (or spec.pod.imagePullSecrets)",
    "ImagePullBackOff": "spec.engine.image (or spec.pod.imagePullSecrets)",
    "InvalidImageName": "spec.engine.image",
    "CreateContainerConfigError": "spec.engine.env[].valueFrom or spec.pod.volumes",
    "CreateContainerError": "spec.engine or spec.pod",
    "RunContainerError": "spec.engine or spec.pod",
    "CrashLoopBackOff": "spec.engine (read the rank's logs with --previous)",
}


@dataclass(frozen=True, slots=True)
class ContainerWaiting:
    """A container's `state.waiting` as the kubelet reports it."""

    reason: str
    message: str

    @property
    def spec_field(self) -> str | None:
        """The ModelGroup field to look at, for a reason that no amount of waiting fixes."""
        return _WAITING_FIELDS.get(self.reason)

    def describe(self) -> str:
        detail = f": {self.message}" if self.message else ""
        field = f" (check {self.spec_field})" if self.spec_field else ""
        return f"{self.reason}{detail}{field}"


@dataclass(frozen=True, slots=True)
class RouteView:
    """One of our pods as an endpoint of a Service (from its EndpointSlice)."""

    pod: str
    service: str
    ready: bool
    """What kube-proxy and Service-following routers act on: a ready endpoint gets traffic."""


@dataclass(frozen=True, slots=True)
class NodeView:
    inventory: NodeInventory
    ready: bool


def pod_gpus(pod: Mapping[str, Any], resource: str = naming.GPU_RESOURCE) -> int:
    """Devices of `resource` a pod requests as the scheduler counts them: max(sum over containers,
    any init container). For a DeviceClass, what our pod's annotations say its claim asks for."""
    device_class = naming.device_class_of_resource(resource)
    if device_class is not None:
        return _claimed_devices(pod) if _device_class(pod) == device_class else 0
    spec = pod.get("spec") or {}

    def gpus(container: Mapping[str, Any]) -> int:
        resources = container.get("resources") or {}
        quantity = (
            (resources.get("requests") or {}).get(resource)
            or (resources.get("limits") or {}).get(resource)
            or 0
        )
        try:
            return int(quantity)
        except (TypeError, ValueError):
            return 0

    regular = sum(gpus(c) for c in spec.get("containers") or ())
    init = max((gpus(c) for c in spec.get("initContainers") or ()), default=0)
    return max(regular, init)


def pod_accelerator(pod: Mapping[str, Any]) -> str | None:
    """The device resource a pod requests: nvidia.com/gpu when it asks for it, else the first (by
    name) other domain-qualified resource it asks for (amd.com/gpu, a MIG profile), else None."""
    device_class = _device_class(pod)
    if device_class is not None:
        return naming.device_class_resource(device_class)
    names: set[str] = set()
    spec = pod.get("spec") or {}
    for container in [*(spec.get("containers") or ()), *(spec.get("initContainers") or ())]:
        resources = container.get("resources") or {} if isinstance(container, Mapping) else {}
        for kind in ("requests", "limits"):
            names.update(name for name in (resources.get(kind) or {}) if "/" in name)
    if naming.GPU_RESOURCE in names:
        return naming.GPU_RESOURCE
    return next((name for name in sorted(names) if pod_gpus(pod, name) > 0), None)


def gpu_claim(pod: Mapping[str, Any]) -> GpuClaim | None:
    """The devices a live pod holds or is about to hold; None for pods that hold none.

    A scheduled pod of a DeviceClass holds none here: its ResourceClaim was allocated before it was
    bound, and the allocation is what counts (`dynamic_resources`)."""
    resource = pod_accelerator(pod)
    gpus = pod_gpus(pod, resource) if resource is not None else 0
    status = pod.get("status") or {}
    if resource is None or gpus == 0 or status.get("phase") in _TERMINAL_PHASES:
        return None
    metadata = pod.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    node_name = (pod.get("spec") or {}).get("nodeName") or None
    if node_name is not None and naming.device_class_of_resource(resource) is not None:
        return None
    return GpuClaim(
        gpus=gpus,
        node_name=node_name,
        topology_key=annotations.get(naming.ANNOTATION_TOPOLOGY_KEY),
        domain=annotations.get(naming.ANNOTATION_TOPOLOGY_DOMAIN),
        resource=resource,
    )


def _device_class(pod: Mapping[str, Any]) -> str | None:
    """The DeviceClass our pod's ResourceClaim asks for, from its annotation; None for other pods."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    device_class = annotations.get(naming.ANNOTATION_DEVICE_CLASS)
    return str(device_class) if device_class else None


def _claimed_devices(pod: Mapping[str, Any]) -> int:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    try:
        return max(0, int(annotations.get(naming.ANNOTATION_DEVICE_COUNT) or 0))
    except (TypeError, ValueError):
        return 0


def parse_pod(pod: Mapping[str, Any]) -> PodView | None:
    """The view of one of our group pods; None for a pod without our identity labels."""
    metadata = pod.get("metadata") or {}
    labels = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    model_group = labels.get(naming.LABEL_MODEL_GROUP)
    group = labels.get(naming.LABEL_GROUP)
    rank_text = labels.get(naming.LABEL_RANK)
    if not model_group or not group or rank_text is None or not rank_text.isdigit():
        return None
    conditions = {c.get("type"): c for c in status.get("conditions") or () if isinstance(c, Mapping)}
    restarts = sum(int(s.get("restartCount") or 0) for s in status.get("containerStatuses") or ())
    return PodView(
        name=metadata.get("name", ""),
        model_group=model_group,
        group=group,
        rank=int(rank_text),
        revision=labels.get(naming.LABEL_REVISION, ""),
        created_at=parse_rfc3339(metadata.get("creationTimestamp")),
        deleting=bool(metadata.get("deletionTimestamp")),
        phase=status.get("phase") or "Pending",
        node_name=spec.get("nodeName") or None,
        ip=status.get("podIP") or None,
        gated=any(g.get("name") == naming.SCHEDULING_GATE for g in spec.get("schedulingGates") or ()),
        topology_domain=annotations.get(naming.ANNOTATION_TOPOLOGY_DOMAIN),
        replaces=annotations.get(naming.ANNOTATION_REPLACES),
        draining_since=parse_rfc3339(annotations.get(naming.ANNOTATION_DRAINING_SINCE)),
        gpus=pod_gpus(pod, pod_accelerator(pod) or naming.GPU_RESOURCE),
        restarts=restarts,
        containers_ready=_condition(conditions.get("ContainersReady")),
        scheduled=_condition(conditions.get("PodScheduled")),
        group_ready=_condition(conditions.get(naming.CONDITION_GROUP_READY)),
        nccl_healthy=_condition(conditions.get(naming.CONDITION_NCCL_HEALTHY)),
        reported_model_revision=annotations.get(naming.ANNOTATION_MODEL_REVISION),
        drain_progress=parse_progress(annotations.get(naming.ANNOTATION_DRAIN_PROGRESS)),
        gpu_healthy=_condition(conditions.get(naming.CONDITION_GPU_HEALTHY)),
        engine_healthy=_condition(conditions.get(naming.CONDITION_ENGINE_HEALTHY)),
        waiting=_container_waiting(status),
        drain_outcome=parse_outcome(annotations.get(naming.ANNOTATION_DRAIN_OUTCOME), group),
        engine_started_at=_engine_started_at(status),
        pool=pool_of_labels(labels),
    )


def _engine_started_at(status: Mapping[str, Any]) -> datetime | None:
    for container in status.get("containerStatuses") or ():
        if isinstance(container, Mapping) and container.get("name") == ENGINE_CONTAINER_NAME:
            running = (container.get("state") or {}).get("running") or {}
            return parse_rfc3339(running.get("startedAt"))
    return None


def _container_waiting(status: Mapping[str, Any]) -> ContainerWaiting | None:
    """The first waiting container with a reason (init containers first, as the kubelet runs them)."""
    statuses = [*(status.get("initContainerStatuses") or ()), *(status.get("containerStatuses") or ())]
    for container in statuses:
        waiting = (
            ((container.get("state") or {}).get("waiting") or {}) if isinstance(container, Mapping) else {}
        )
        if waiting.get("reason"):
            return ContainerWaiting(str(waiting["reason"]), str(waiting.get("message") or ""))
    return None


def parse_endpoint_slice(endpoint_slice: Mapping[str, Any]) -> tuple[RouteView, ...]:
    """The endpoints of a Service that are group pods (by their name), with their readiness.

    A group's own rendezvous Service is left out: it publishes not-ready addresses (followers must
    find the leader while it starts) and carries no traffic.
    """
    metadata = endpoint_slice.get("metadata") or {}
    labels = metadata.get("labels") or {}
    if naming.LABEL_GROUP in labels:
        return ()
    service = labels.get("kubernetes.io/service-name") or metadata.get("name") or ""
    routes = []
    for endpoint in endpoint_slice.get("endpoints") or ():
        target = endpoint.get("targetRef") or {}
        name = target.get("name")
        if target.get("kind") != "Pod" or not name or naming.model_group_of_pod(name) is None:
            continue
        # An absent ready condition means ready (EndpointSlice API: "unknown state ... as ready").
        ready = (endpoint.get("conditions") or {}).get("ready") is not False
        routes.append(RouteView(pod=name, service=service, ready=ready))
    return tuple(routes)


def parse_node(node: Mapping[str, Any]) -> NodeView:
    metadata = node.get("metadata") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    allocatable = (status.get("allocatable") or {}).get(naming.GPU_RESOURCE, 0)
    try:
        gpus = int(allocatable)
    except (TypeError, ValueError):
        gpus = 0
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ()
    )
    taints = tuple(
        Taint(key=t.get("key", ""), value=t.get("value") or "", effect=t.get("effect", ""))
        for t in spec.get("taints") or ()
    )
    labels = tuple(sorted((metadata.get("labels") or {}).items()))
    devices = []
    for resource, quantity in (status.get("allocatable") or {}).items():
        if "/" in resource and resource != naming.GPU_RESOURCE:
            with contextlib.suppress(TypeError, ValueError):
                devices.append((resource, int(quantity)))
    inventory = NodeInventory(
        name=metadata.get("name", ""),
        labels=labels,
        allocatable_gpus=gpus,
        schedulable=ready and not spec.get("unschedulable", False),
        taints=taints,
        other_devices=tuple(sorted(devices)),
    )
    return NodeView(inventory=inventory, ready=ready)


def _condition(raw: Mapping[str, Any] | None) -> ConditionView | None:
    if raw is None:
        return None
    return ConditionView(
        status=str(raw.get("status", "Unknown")),
        reason=str(raw.get("reason") or ""),
        message=str(raw.get("message") or ""),
        last_transition=parse_rfc3339(raw.get("lastTransitionTime")),
    )


def _is_true(condition: ConditionView | None) -> bool:
    return condition is not None and condition.status == "True"
