"""Pools: the unit a ModelGroup's groups are planned, scaled and reported in.

A pool is a set of complete groups made from one template, with its own bounds, scale target,
status, decisions and autoscaler state. A ModelGroup that declares no roles is exactly one pool,
`SERVING_POOL`, whose bounds and count are the spec's own: nothing a user sees changes. Roles
(prefill and decode, each with its own template and scale target, as LWS's DisaggregatedSet has
them) become more pools derived here, so the group controller and the autoscaler, which already
work per pool, need no rewrite for them.

Pure: a spec in, pools out; pod labels in, a pool name out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

from goodput.api.labels import LABEL_POOL, SERVING_POOL
from goodput.api.modelgroup import ModelGroupSpec


def wanted_groups(replicas: int, min_replicas: int, max_replicas: int) -> int:
    """The complete groups a pool (a ModelGroup without roles) converges to.

    The API allows bounds moved past `replicas` (a user lowers `maxReplicas` below the current
    count); the count converges to the nearest bound rather than being refused.
    """
    return max(min_replicas, min(replicas, max_replicas))


@dataclass(frozen=True, slots=True, order=True)
class PoolKey:
    """Which pool of which ModelGroup: the key of what is kept per pool between passes (the
    autoscaler's memory)."""

    namespace: str
    model_group: str
    pool: str = SERVING_POOL


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """One pool as the spec declares it: its name, the groups asked for and their bounds."""

    name: str
    replicas: int
    min_replicas: int
    max_replicas: int
    warm_replicas: int = 0

    @property
    def desired_groups(self) -> int:
        """The groups the pool converges to: `replicas` within the bounds (the bounds may have
        moved past it; see `wanted_groups`)."""
        return wanted_groups(self.replicas, self.min_replicas, self.max_replicas)


def model_group_pools(spec: ModelGroupSpec) -> tuple[PoolSpec, ...]:
    """The pools of a ModelGroup, in a fixed order: today exactly one, `serving`, from the spec's
    own count and bounds (the scale subresource's `spec.replicas`)."""
    return (
        PoolSpec(
            name=SERVING_POOL,
            replicas=spec.replicas,
            min_replicas=spec.min_replicas,
            max_replicas=spec.max_replicas,
            warm_replicas=spec.warm_replicas,
        ),
    )


def pool_named(spec: ModelGroupSpec, name: str) -> PoolSpec:
    """The pool `name` of a ModelGroup; a name it does not declare is a caller's error."""
    for pool in model_group_pools(spec):
        if pool.name == name:
            return pool
    raise KeyError(f"the ModelGroup has no pool {name!r}")


def pool_of_labels(labels: Mapping[str, str]) -> str:
    """The pool a pod belongs to: its pool label, or `serving` for a pod created before pools had
    a label (an operator upgrade must not orphan a running group)."""
    return labels.get(LABEL_POOL) or SERVING_POOL


class _InPool(Protocol):
    @property
    def pool(self) -> str: ...


InPool = TypeVar("InPool", bound=_InPool)


def in_pool(items: Iterable[InPool], pool: str) -> tuple[InPool, ...]:
    """The items (pods, groups) of one pool, in their order."""
    return tuple(item for item in items if item.pool == pool)
