"""The config.json a ModelGroup's `profile.modelConfigRef` names, read from its ConfigMap.

A platform team keeps the checkpoint's config.json in a ConfigMap (`kubectl create configmap NAME
--from-file=config.json`) rather than inline in every ModelGroup. The pricing layers do no I/O, so
the autoscaler reads it here and hands the parsed object (or why it could not be read, naming the
ConfigMap, the key and what to do) to `compile.scaling.capacity_profile`, whose key includes the
content: an edited ConfigMap rebuilds the profile at the next reading.

One GET per referenced ConfigMap and `refresh_seconds` (five minutes), not per tick, so the fleet's
ticks stay free of API reads; a ConfigMap that is missing or holds no usable config.json is looked
at again after `retry_seconds`, and a moment without an answer from the API server keeps the last
config.json read, so a blip neither unprices a ModelGroup nor prices it on something made up.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from goodput.api.modelgroup import ModelConfigReference, ModelGroupSpec
from goodput.controllers.hardware import ReadConfig, config_from_text
from goodput.operator.kube import KubeError

REFRESH_SECONDS = 300.0
RETRY_SECONDS = 30.0

Fetch = Callable[[str], Awaitable[Any]]
"""GET of an API path, returning the decoded object; raises KubeError."""


def configmap_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{namespace}/configmaps/{name}"


def where(namespace: str, reference: ModelConfigReference) -> str:
    return f"ConfigMap {reference.name!r} in namespace {namespace!r} (spec.profile.modelConfigRef)"


def config_from_configmap(
    body: Mapping[str, Any], namespace: str, reference: ModelConfigReference
) -> ReadConfig:
    """The config.json object under the reference's key, or why there is none."""
    data = body.get("data") or {}
    text = data.get(reference.key)
    if text is None:
        keys = ", ".join(sorted(data)) or "none"
        return (
            f"{where(namespace, reference)} has no key {reference.key!r} (its keys: {keys}): set "
            "spec.profile.modelConfigRef.key to the one holding config.json"
        )
    return config_from_text(text, f"{where(namespace, reference)} key {reference.key!r}")


def missing(namespace: str, reference: ModelConfigReference) -> str:
    return (
        f"{where(namespace, reference)} does not exist: create it from the checkpoint's config.json with "
        f"`kubectl create configmap {reference.name} -n {namespace} --from-file={reference.key}=config.json`"
    )


@dataclass(frozen=True, slots=True)
class _Reading:
    at: float
    result: ReadConfig

    @property
    def good(self) -> bool:
        return isinstance(self.result, Mapping)


class ModelConfigReader:
    """Reads and caches the ConfigMaps that ModelGroups' profiles name.

    A config.json read is kept `refresh_seconds`; a ConfigMap that is missing, unreadable or not a
    config.json is looked at again after `retry_seconds`, so a team that creates or fixes it waits
    seconds, not minutes; a moment without an answer keeps the last config.json read.
    """

    def __init__(
        self,
        fetch: Fetch,
        *,
        clock: Callable[[], float] = time.monotonic,
        refresh_seconds: float = REFRESH_SECONDS,
        retry_seconds: float = RETRY_SECONDS,
    ) -> None:
        self.fetch = fetch
        self.clock = clock
        self.refresh_seconds = refresh_seconds
        self.retry_seconds = retry_seconds
        self.readings: dict[tuple[str, str, str], _Reading] = {}

    async def read(self, namespace: str, spec: ModelGroupSpec) -> ReadConfig:
        """The referenced config.json (None when the profile references none), or why there is none."""
        reference = spec.profile.model_config_ref if spec.profile is not None else None
        if reference is None:
            return None
        key = (namespace, reference.name, reference.key)
        now = self.clock()
        cached = self.readings.get(key)
        if cached is not None and now - cached.at < (
            self.refresh_seconds if cached.good else self.retry_seconds
        ):
            return cached.result
        result, answered = await self._fetch(namespace, reference)
        if not answered and cached is not None and cached.good:
            result = cached.result  # keep the last config.json through a moment without an answer
        self.readings[key] = _Reading(now, result)
        return result

    async def _fetch(self, namespace: str, reference: ModelConfigReference) -> tuple[ReadConfig, bool]:
        """What the ConfigMap holds or why it cannot be used, and whether the API server answered."""
        try:
            body = await self.fetch(configmap_path(namespace, reference.name))
        except KubeError as error:
            if error.status == 404:
                return missing(namespace, reference), True
            if error.status == 403:
                return (
                    f"{where(namespace, reference)} may not be read by the operator ({error}): grant it get "
                    "on configmaps (the chart's controller role does)",
                    True,
                )
            return f"{where(namespace, reference)} could not be read ({error}); retried shortly", False
        return config_from_configmap(body or {}, namespace, reference), True
