"""Where the gateway learns its groups: a source that pushes the current set of group leaders.

The server depends only on `GroupSource`; production uses the Kubernetes watch (`kube.py`), tests
and benchmarks feed a `StaticGroupSource` by hand. A group is routable only while its leader's pod
is Running, its containers are ready, the operator's group-ready gate is True, and it carries no
drain marker (`goodput.dev/draining-since`) and no deletion timestamp. A drain turns the group-ready
condition False and writes the marker on every rank; the watch sees either change on the leader pod
itself, so routing stops before the endpoints controller takes the pod out of EndpointSlices.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from goodput.api.labels import LEADER_RANK
from goodput.controllers.groups.observation import PodView, parse_pod


@dataclass(frozen=True, slots=True)
class GroupEndpoint:
    """One replica group's leader as the gateway routes to it."""

    name: str
    base_url: str
    ready: bool
    draining: bool


GroupsCallback = Callable[[Mapping[str, GroupEndpoint]], None]


class GroupSource(Protocol):
    """Runs until cancelled, calling `on_change` with the whole current set after every change."""

    async def run(self, on_change: GroupsCallback) -> None: ...


class StaticGroupSource:
    """A source fed by hand: `set` replaces the groups and notifies the running gateway."""

    def __init__(self, groups: Iterable[GroupEndpoint] = ()) -> None:
        self._groups = {group.name: group for group in groups}
        self._callback: GroupsCallback | None = None
        self._stopped = asyncio.Event()

    def set(self, groups: Iterable[GroupEndpoint]) -> None:
        self._groups = {group.name: group for group in groups}
        if self._callback is not None:
            self._callback(dict(self._groups))

    async def run(self, on_change: GroupsCallback) -> None:
        self._callback = on_change
        on_change(dict(self._groups))
        await self._stopped.wait()


def endpoint_of(pod: PodView, port: int) -> GroupEndpoint | None:
    """The leader pod as an endpoint; None for other ranks or a leader without an address."""
    if str(pod.rank) != LEADER_RANK or pod.ip is None:
        return None
    ready = pod.running_and_ready and pod.marked_group_ready
    draining = pod.draining_since is not None or pod.deleting or pod.terminated
    host = f"[{pod.ip}]" if ":" in pod.ip else pod.ip
    return GroupEndpoint(pod.group, f"http://{host}:{port}", ready, draining)


def endpoints_from_pods(
    pods: Iterable[Mapping[str, Any]], model_group: str, port: int
) -> dict[str, GroupEndpoint]:
    """Every group of `model_group` whose leader pod has an address, from raw pod objects."""
    endpoints: dict[str, GroupEndpoint] = {}
    for raw in pods:
        pod = parse_pod(raw)
        if pod is None or pod.model_group != model_group:
            continue
        endpoint = endpoint_of(pod, port)
        if endpoint is not None:
            endpoints[endpoint.name] = endpoint
    return endpoints
