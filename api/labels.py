"""Well-known label keys and pod condition types that goodput puts on the objects it creates.

They are API: the scale subresource's selector, Prometheus relabelling, dashboards and users'
own `kubectl get pods -l ...` all depend on them.
"""

from __future__ import annotations

from typing import Final

from goodput.api.base import GROUP

MODEL_GROUP_LABEL: Final = f"{GROUP}/model-group"
"""Name of the ModelGroup a pod serves."""
GROUP_LABEL: Final = f"{GROUP}/group"
"""Name of the complete replica group the pod belongs to."""
RANK_LABEL: Final = f"{GROUP}/rank"
"""Rank of the pod inside its group; '0' is the leader, the only pod that serves HTTP."""
LEADER_RANK: Final = "0"

GROUP_READY_CONDITION: Final = f"{GROUP}/group-ready"
"""Pod readiness gate: True on every rank at once when the whole group is ready, False to drain."""


def leader_label_selector(model_group: str) -> str:
    """`status.labelSelector` of a ModelGroup: its groups' leader pods, one pod per group.

    Selecting leaders only makes an external HPA's per-pod averages per-group averages.
    """
    return f"{MODEL_GROUP_LABEL}={model_group},{RANK_LABEL}={LEADER_RANK}"
