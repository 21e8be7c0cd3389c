"""Well-known label keys and pod condition types that goodput puts on the objects it creates.

They are API: the scale subresource's selector, Prometheus relabelling, dashboards and users'
own `kubectl get pods -l ...` all depend on them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from goodput.api.base import GROUP

LABEL_MODEL_GROUP: Final = f"{GROUP}/model-group"
"""Name of the ModelGroup a pod serves."""
LABEL_GROUP: Final = f"{GROUP}/group"
"""Name of the complete replica group the pod belongs to."""
LABEL_POOL: Final = f"{GROUP}/pool"
"""Name of the pool of the ModelGroup the pod's group belongs to. A pod without it (created before
pools existed) belongs to `SERVING_POOL`."""
SERVING_POOL: Final = "serving"
"""The pool of a ModelGroup that declares no roles: its one template, bounds and scale target."""
LABEL_RANK: Final = f"{GROUP}/rank"
"""Rank of the pod inside its group; '0' is the leader, the only pod that serves HTTP."""
LEADER_RANK: Final = "0"

CONDITION_GROUP_READY: Final = f"{GROUP}/group-ready"
"""Pod readiness gate: True on every rank at once when the whole group is ready, False to drain."""

# Written by the in-pod health agent (goodput.agent) on its own pod; read by the group controller.
CONDITION_NCCL_HEALTHY: Final = f"{GROUP}/NCCLHealthy"
"""Pod condition: an all-reduce across the group's ranks passed (True) or hung, failed or was far too
slow (False); the message carries the measured latency and bus bandwidth."""
CONDITION_GPU_HEALTHY: Final = f"{GROUP}/GPUHealthy"
"""Pod condition: the pod's GPUs show no fault that needs a reset (True; throttling is reported in
the reason and message), a critical fault (False), or no evidence could be read (Unknown)."""
CONDITION_ENGINE_HEALTHY: Final = f"{GROUP}/EngineHealthy"
"""Pod condition: the engine makes token progress while it has requests running (True), or it has
held requests without progress for longer than the agent's bound (False)."""
ANNOTATION_MODEL_REVISION: Final = f"{GROUP}/model-revision"
"""Pod annotation: the model revision the rank's engine loaded, as evidenced by the agent."""
ANNOTATION_NCCL_CHECK_REQUEST: Final = f"{GROUP}/nccl-check-requested"
"""Pod annotation: set (to any new value, e.g. a timestamp) to make the agent re-run the NCCL check."""
ANNOTATION_LAST_RESCALE: Final = f"{GROUP}/last-rescale"
"""ModelGroup annotation: the autoscaler's last applied decision (a `status.decisions[]` entry as
JSON, proposals without their inputs), written in the same patch as `spec.replicas`, so a change of
the count is never left without its record when the operator stops before its status write."""


def leader_label_selector(model_group: str) -> str:
    """`status.labelSelector` of a ModelGroup: its groups' leader pods, one pod per group.

    Selecting leaders only makes an external HPA's per-pod averages per-group averages.
    """
    return f"{LABEL_MODEL_GROUP}={model_group},{LABEL_RANK}={LEADER_RANK}"


def pool_leader_label_selector(model_group: str, pool: str, other_pools: Iterable[str] = ()) -> str:
    """The leader selector of one pool of a ModelGroup: `status.pools[].labelSelector`.

    The serving pool's pods may predate the pool label, so its selector does not ask for the label:
    it leaves out the other pools' pods instead (none today, so it is the ModelGroup's own
    selector and every existing pod still matches). Any other pool is selected by its label.
    """
    base = leader_label_selector(model_group)
    if pool != SERVING_POOL:
        return f"{base},{LABEL_POOL}={pool}"
    others = sorted(set(other_pools) - {SERVING_POOL})
    return f"{base},{LABEL_POOL} notin ({','.join(others)})" if others else base
