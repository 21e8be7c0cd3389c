"""Which goodput ModelGroup an `InferencePool` (`inference.networking.k8s.io/v1`) stands for.

The endpoint picker serves one pool. The pool's `spec.selector.matchLabels` picks the model server
pods; goodput's engine pods carry `goodput.dev/model-group` (`api.labels`), so a pool belongs to
goodput when its selector names a ModelGroup by that label. The picker then routes to that
ModelGroup's group leaders (rank 0, the only pod of a group that serves HTTP) on the pool's target
port, which must be the ModelGroup's engine port: an endpoint on another port would be one no engine
answers. A pool that names no ModelGroup, a ModelGroup that does not exist, or ports that disagree
are not guessed around: the picker refuses every request with 503 and a message naming the pool and
the field (`PoolRefusal`), and logs it, until the pool or the ModelGroup is fixed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from goodput.api.labels import LABEL_MODEL_GROUP

INFERENCE_POOL_PATH = "/apis/inference.networking.k8s.io/v1/namespaces"


@dataclass(frozen=True, slots=True)
class PoolTarget:
    """The ModelGroup an InferencePool serves and the port its endpoints are reached on."""

    model_group: str
    port: int


@dataclass(frozen=True, slots=True)
class PoolRefusal:
    """Why the picker cannot serve the pool: every request is refused with 503 and this message."""

    message: str


def pool_target(pool: Mapping[str, Any] | None, namespace: str, name: str) -> PoolTarget | PoolRefusal:
    """The pool's ModelGroup and target port, read from its spec; a refusal naming the field when
    the pool does not exist or selects no goodput ModelGroup."""
    where = f"InferencePool {namespace}/{name}"
    if pool is None:
        return PoolRefusal(f"{where} does not exist")
    spec = pool.get("spec") or {}
    labels = (spec.get("selector") or {}).get("matchLabels") or {}
    model_group = labels.get(LABEL_MODEL_GROUP) if isinstance(labels, Mapping) else None
    if not isinstance(model_group, str) or not model_group:
        return PoolRefusal(
            f"{where} names no goodput ModelGroup: spec.selector.matchLabels must hold "
            f"{LABEL_MODEL_GROUP}: <ModelGroup name> (the label goodput puts on its engine pods)"
        )
    ports = [port.get("number") for port in spec.get("targetPorts") or () if isinstance(port, Mapping)]
    numbers = [number for number in ports if isinstance(number, int) and 0 < number < 65536]
    if len(numbers) != 1 or len(ports) != 1:
        return PoolRefusal(
            f"{where}: spec.targetPorts must hold exactly one port number (the engine's), got {ports}"
        )
    return PoolTarget(model_group, numbers[0])


def check_engine_port(target: PoolTarget, engine_port: int | None, namespace: str, name: str) -> str | None:
    """Why the pool's port cannot reach the ModelGroup's engines, or None when it can."""
    if engine_port is None or engine_port == target.port:
        return None
    return (
        f"InferencePool {namespace}/{name}: spec.targetPorts[0].number is {target.port}, but ModelGroup "
        f"{namespace}/{target.model_group} serves on port {engine_port} (spec.engine.port)"
    )
