"""The operator's group controller in a simulated cluster: what its pods look like, and its world.

The fleet does not decide a group's lifecycle itself: every reconcile it builds the `World` the
operator would build (the ModelGroup's pods, a cluster with room for them, warm-up results and
leader readings, `now`), calls `goodput.controllers.groups.plan_model_group`, and applies the plan
as the operator does. Victim choice, the minimum lifetime, the drain protocol and its timeout, and
putting a draining group back in service on a scale-out are therefore the deployed controller's.

What the simulated cluster stands in for: the scheduler binds every pod of a released group after
the placement time; containers become ready after the group's loading time, when the health checks
the readiness rules ask for pass at once; EndpointSlices follow the group-ready gate at once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from goodput.api.modelgroup import ModelGroup
from goodput.controllers import naming
from goodput.controllers.groups.model import ReadinessRules
from goodput.controllers.groups.observation import ConditionView, PodView, parse_pod
from goodput.controllers.groups.placement import GpuClaim, Inventory, NodeInventory, PlacementRules
from goodput.controllers.groups.pods import GroupTemplate
from goodput.controllers.groups.template import group_template, placement_rules, readiness_rules

# Simulated seconds are counted from this instant in the controller's world.
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
# The operator's default pause between routes stopping and trusting the leader's count.
DRAIN_SETTLE_SECONDS = 5.0


def instant(seconds: float) -> datetime:
    return EPOCH + timedelta(seconds=seconds)


def seconds_at(moment: datetime) -> float:
    return (moment - EPOCH).total_seconds()


def default_model_group(gpus_per_group: int, max_groups: int) -> ModelGroup:
    """The ModelGroup of a run without one: one pod per group, the API's defaults elsewhere."""
    return ModelGroup.model_validate(
        {
            "metadata": {"name": "simulated", "namespace": "simulated"},
            "spec": {
                "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
                "engine": {"image": "vllm/vllm-openai"},
                "parallelism": {"tensor": gpus_per_group, "gpusPerPod": gpus_per_group},
                "maxReplicas": max(1, max_groups),
            },
        }
    )


@dataclass(frozen=True, slots=True)
class GroupRules:
    """What the group controller obeys for one simulated ModelGroup, compiled as the operator does."""

    template: GroupTemplate
    rules: ReadinessRules
    placement: PlacementRules

    @classmethod
    def for_model_group(cls, model_group: ModelGroup) -> GroupRules:
        spec = model_group.spec
        rules = replace(
            readiness_rules(spec),
            drain_on_timeout=spec.drain.on_timeout,
            drain_settle_seconds=DRAIN_SETTLE_SECONDS,
        )
        if not model_group.metadata.name:
            model_group = model_group.model_copy(
                update={"metadata": model_group.metadata.model_copy(update={"name": "simulated"})}
            )
        return cls(group_template(model_group), rules, placement_rules(spec))


def cluster_nodes(rules: GroupRules, groups: int) -> tuple[NodeInventory, ...]:
    """A cluster with room for `groups` groups, each in its own topology domain, every node
    satisfying the ModelGroup's node selector and offering its devices in the ModelGroup's own
    resource (nvidia.com/gpu, another device plugin's, or a DeviceClass's); the GPU budget is the
    fleet's `max_groups`."""
    template = rules.template
    labels = tuple(rules.placement.node_selector)
    resource = rules.placement.gpu_resource
    plugin_gpus = template.gpus_per_pod if resource == naming.GPU_RESOURCE else 0
    other = () if plugin_gpus else ((resource, template.gpus_per_pod),)
    return tuple(
        NodeInventory(
            f"node-{domain}-{rank}",
            tuple(sorted({*labels, (rules.placement.topology_key, f"d{domain}")})),
            plugin_gpus,
            other_devices=other,
        )
        for domain in range(groups)
        for rank in range(template.pods_per_group)
    )


def inventory(nodes: tuple[NodeInventory, ...], pods: list[PodView], placement: PlacementRules) -> Inventory:
    """The nodes with the GPUs of every simulated pod claimed on them, in the ModelGroup's resource."""
    claims = tuple(
        GpuClaim(pod.gpus, pod.node_name, placement.topology_key, pod.topology_domain, placement.gpu_resource)
        for pod in pods
    )
    return Inventory(nodes, claims)


def created_pods(manifests: tuple[dict[str, Any], ...], now: datetime) -> list[PodView]:
    """A new group's pods as the next reconcile sees them: created, released, not bound."""
    return [
        replace(view, created_at=now, gated=False) for m in manifests if (view := parse_pod(m)) is not None
    ]


def bound(pod: PodView, now: datetime) -> PodView:
    """The scheduler bound the pod to its domain's node for its rank; its engine starts at once (the
    image is cached), so the group's loading time is all WeightLoad in its ready-time phases."""
    node = f"node-{(pod.topology_domain or 'd0').removeprefix('d')}-{pod.rank}"
    return replace(
        pod,
        node_name=node,
        ip=f"sim://{pod.name}",
        scheduled=ConditionView("True", "", "", now),
        engine_started_at=now,
    )


def started(pod: PodView, now: datetime, rules: ReadinessRules) -> PodView:
    """Weights loaded and the engine up: running and ready, the health checks passed."""
    return replace(
        pod,
        phase="Running",
        containers_ready=ConditionView("True", "", "", now),
        nccl_healthy=ConditionView("True", "", "", now),
        reported_model_revision=rules.model_revision,
    )


def serving(pod: PodView, since: datetime, rules: ReadinessRules) -> PodView:
    """A pod of a group that was already serving when the run began."""
    return replace(started(bound(pod, since), since, rules), group_ready=ConditionView("True", "", "", since))


def gate(pod: PodView, ready: bool, now: datetime) -> PodView:
    return replace(pod, group_ready=ConditionView("True" if ready else "False", "", "", now))


def failed(pod: PodView) -> PodView:
    """A rank that crashed: its container restarted."""
    return replace(pod, restarts=pod.restarts + 1)
