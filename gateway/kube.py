"""The gateway's view of the cluster: watches through the API server, never a poll loop.

`ResourceWatch` lists a collection once, then watches it from the list's resourceVersion with
bookmarks (`allowWatchBookmarks`), so a watch that ends (the server's `timeoutSeconds`, a dropped
connection) resumes from the last version it saw rather than listing again; a 410 Gone (history
compacted) lists again at once. Failed attempts back off exponentially up to a cap, and a
successful connection resets the backoff, so an API server outage costs a bounded retry rate.
The gateway watches the ModelGroups it serves with the SLOPolicies of their namespace
(`KubeModelGroupsSource`), recompiled on every change so that a policy change, a new ModelGroup or
a deleted one applies without a restart, and each served ModelGroup's leader pods
(`KubeGroupSource`, routing). The kubernetes client only loads the configuration (in-cluster
service account or kubeconfig); the watches run on aiohttp, in the gateway's event loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from kubernetes import client, config
from pydantic import ValidationError

from goodput.api.labels import LABEL_MODEL_GROUP, LABEL_RANK, LEADER_RANK
from goodput.api.modelgroup import ModelGroup
from goodput.api.slopolicy import SloPolicy
from goodput.controllers.compile.request_path import RequestPathPolicy, compile_request_path
from goodput.controllers.groups.observation import parse_pod
from goodput.gateway.groups import GroupEndpoint, GroupsCallback, endpoint_of

log = logging.getLogger("goodput.gateway.kube")

WATCH_TIMEOUT_SECONDS = 300
API_PREFIX = "/apis/goodput.dev/v1alpha1/namespaces"

ObjectsCallback = Callable[[Mapping[str, Mapping[str, Any]]], None]


@dataclass(frozen=True, slots=True)
class ApiServer:
    host: str
    headers: dict[str, str]
    ssl_context: ssl.SSLContext | bool


def api_server_from_environment() -> ApiServer:
    """In a pod: its service account; elsewhere: the current kubeconfig context."""
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]
    configuration = client.Configuration.get_default_copy()
    headers: dict[str, str] = {}
    token = configuration.get_api_key_with_prefix("BearerToken") or configuration.get_api_key_with_prefix(
        "authorization"
    )
    if token:
        headers["Authorization"] = token if token.lower().startswith("bearer ") else f"Bearer {token}"
    context: ssl.SSLContext | bool = False
    if configuration.verify_ssl:
        context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
        if configuration.cert_file:
            context.load_cert_chain(configuration.cert_file, configuration.key_file)
    return ApiServer(configuration.host.rstrip("/"), headers, context)


@dataclass(frozen=True, slots=True)
class WatchBackoff:
    """Delay before the n-th consecutive failed attempt: initial x factor^(n-1), at most max."""

    initial_seconds: float = 0.5
    max_seconds: float = 30.0
    factor: float = 2.0

    def delay_seconds(self, failures: int) -> float:
        return min(self.max_seconds, self.initial_seconds * self.factor ** max(0, failures - 1))


class WatchError(RuntimeError):
    """The API server ended a watch with an ERROR event."""


class WatchGoneError(WatchError):
    """410 Gone: the resourceVersion is older than the server's history; list again."""


@dataclass(slots=True)
class WatchedObjects:
    """The objects of one list-and-watch by name, and the resourceVersion to resume from ("" until
    listed, and after a 410)."""

    objects: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    resource_version: str = ""

    def replace(self, listing: Mapping[str, Any]) -> None:
        """A list answer replaces everything known."""
        self.objects = {item["metadata"]["name"]: item for item in listing.get("items") or ()}
        self.resource_version = str((listing.get("metadata") or {}).get("resourceVersion") or "")

    def apply(self, event: Mapping[str, Any]) -> bool:
        """One watch event; True when the objects changed. A BOOKMARK only moves the resume point;
        an ERROR raises (`WatchGoneError` for 410, after which only a new list helps)."""
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            message = f"watch error {obj.get('code', '?')}: {obj.get('message', obj)}"
            if obj.get("code") == 410:
                self.resource_version = ""
                raise WatchGoneError(message)
            raise WatchError(message)
        metadata = obj.get("metadata") or {}
        if metadata.get("resourceVersion"):
            self.resource_version = str(metadata["resourceVersion"])
        name = metadata.get("name")
        if kind == "BOOKMARK" or not name:
            return False
        if kind == "DELETED":
            return self.objects.pop(name, None) is not None
        if kind in ("ADDED", "MODIFIED"):
            self.objects[name] = obj
            return True
        return False


def parse_event(line: bytes) -> Mapping[str, Any] | None:
    """One line of a watch stream; None for a blank keep-alive line. A line that is not a JSON
    object is a broken stream: it raises, and the watch resumes from the last version."""
    if not line.strip():
        return None
    event = json.loads(line)
    if not isinstance(event, dict):
        raise ValueError(f"a watch event must be a JSON object, got {type(event).__name__}")
    return event


class ResourceWatch:
    """Lists one collection and watches it; `on_change` gets every object after each change."""

    def __init__(
        self,
        server: ApiServer,
        path: str,
        on_change: ObjectsCallback,
        *,
        params: Mapping[str, str] | None = None,
        backoff: WatchBackoff | None = None,
    ) -> None:
        self.server = server
        self.path = path
        self.on_change = on_change
        self.params = dict(params or {})
        self.backoff = backoff or WatchBackoff()
        self.state = WatchedObjects()
        self.listed = False
        self.failures = 0

    async def run(self) -> None:
        """Until cancelled: list when there is no resume point, then watch; back off on failures."""
        async with aiohttp.ClientSession(headers=self.server.headers) as session:
            while True:
                try:
                    if not self.state.resource_version:
                        await self._list(session)
                    await self._watch(session)
                except asyncio.CancelledError:
                    raise
                except WatchGoneError as error:
                    log.info("watch of %s: %s; listing again", self.path, error)
                except Exception as error:  # any failure: retry after the backoff
                    self.failures += 1
                    delay = self.backoff.delay_seconds(self.failures)
                    log.warning("watch of %s failed (%s); again in %.1fs", self.path, _short(error), delay)
                    await asyncio.sleep(delay)

    async def _list(self, session: aiohttp.ClientSession) -> None:
        url = self.server.host + self.path
        async with session.get(url, params=self.params, ssl=self.server.ssl_context) as response:
            response.raise_for_status()
            listing = await response.json()
        self.state.replace(listing)
        self.listed = True
        self.on_change(self.state.objects)

    async def _watch(self, session: aiohttp.ClientSession) -> None:
        params = {
            **self.params,
            "watch": "1",
            "allowWatchBookmarks": "true",
            "resourceVersion": self.state.resource_version,
            "timeoutSeconds": str(WATCH_TIMEOUT_SECONDS),
        }
        timeout = aiohttp.ClientTimeout(total=None, sock_read=WATCH_TIMEOUT_SECONDS + 30)
        url = self.server.host + self.path
        async with session.get(url, params=params, ssl=self.server.ssl_context, timeout=timeout) as response:
            if response.status == 410:
                self.state.resource_version = ""
                raise WatchGoneError("watch error 410: resourceVersion too old")
            response.raise_for_status()
            self.failures = 0
            async for line in response.content:
                event = parse_event(line)
                if event is not None and self.state.apply(event):
                    self.on_change(self.state.objects)


def _short(error: BaseException, limit: int = 300) -> str:
    text = str(error) or type(error).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


class KubeGroupSource:
    """Watches the leader pods of one ModelGroup and reports its groups on every change: a drain
    marker or a False group-ready gate on a leader stops routing as soon as the watch shows it."""

    def __init__(
        self,
        server: ApiServer,
        namespace: str,
        model_group: str,
        port: int,
        *,
        backoff: WatchBackoff | None = None,
    ) -> None:
        self.namespace = namespace
        self.model_group = model_group
        self.port = port
        self.selector = f"{LABEL_MODEL_GROUP}={model_group},{LABEL_RANK}={LEADER_RANK}"
        self._on_change: GroupsCallback | None = None
        self.watch = ResourceWatch(
            server,
            f"/api/v1/namespaces/{namespace}/pods",
            self._pods_changed,
            params={"labelSelector": self.selector},
            backoff=backoff,
        )

    def endpoints(self) -> dict[str, GroupEndpoint]:
        endpoints: dict[str, GroupEndpoint] = {}
        for raw in self.watch.state.objects.values():
            pod = parse_pod(raw)
            endpoint = endpoint_of(pod, self.port) if pod is not None else None
            if endpoint is not None:
                endpoints[endpoint.name] = endpoint
        return endpoints

    def apply(self, event: Mapping[str, Any]) -> None:
        """One watch event (an ERROR raises: the watch lists again or resumes)."""
        self.watch.state.apply(event)

    def _pods_changed(self, _: Mapping[str, Mapping[str, Any]]) -> None:
        if self._on_change is not None:
            self._on_change(self.endpoints())

    async def run(self, on_change: GroupsCallback) -> None:
        self._on_change = on_change
        await self.watch.run()


def compile_from_objects(
    model_groups: Mapping[str, Mapping[str, Any]],
    policies: Mapping[str, Mapping[str, Any]],
    namespace: str,
    name: str,
) -> tuple[RequestPathPolicy | str, ModelGroup | None]:
    """The request path of ModelGroup `name` from the watched objects, or why there is none (the
    gateway then keeps serving under the last policy it could read, never under a guess)."""
    raw = model_groups.get(name)
    if raw is None:
        return f"ModelGroup {namespace}/{name} does not exist", None
    try:
        model_group = ModelGroup.model_validate(raw)
    except ValidationError as error:
        return f"ModelGroup {namespace}/{name} cannot be read: {_short(error)}", None
    ref = model_group.spec.policy_ref
    if ref is None:
        return f"ModelGroup {namespace}/{name} has no spec.policyRef: the gateway needs its SLOPolicy", None
    raw_policy = policies.get(ref.name)
    if raw_policy is None:
        return f"SLOPolicy {namespace}/{ref.name} (spec.policyRef of {name}) does not exist", model_group
    try:
        slo = SloPolicy.model_validate(raw_policy)
    except ValidationError as error:
        return f"SLOPolicy {namespace}/{ref.name} cannot be read: {_short(error)}", model_group
    return compile_request_path(model_group, slo), model_group


@dataclass(frozen=True, slots=True)
class WatchedModelGroup:
    """One selected ModelGroup as the watch last compiled it: its request path, or why there is none
    (then the gateway keeps the last good one, or does not serve it yet); `created` is its
    creationTimestamp (settles served-name conflicts) and `port` its engine's."""

    policy: RequestPathPolicy | str
    created: str = ""
    port: int | None = None


ModelGroupsCallback = Callable[[Mapping[str, WatchedModelGroup]], None]


class KubeModelGroupsSource:
    """Watches the ModelGroups of one namespace that a label selector picks (`--selector`), or one
    named ModelGroup (`--model-group`, a selector of one), and the namespace's SLOPolicies; after
    every change that alters what is served, reports every selected ModelGroup compiled. A
    ModelGroup that stops matching the selector or is deleted drops out of the report."""

    def __init__(
        self,
        server: ApiServer,
        namespace: str,
        *,
        selector: str = "",
        name: str | None = None,
        backoff: WatchBackoff | None = None,
    ) -> None:
        self.namespace = namespace
        self.last: dict[str, WatchedModelGroup] | None = None
        self._on_change: ModelGroupsCallback | None = None
        base = f"{API_PREFIX}/{namespace}"
        params = {"labelSelector": selector} if selector else {}
        if name is not None:
            params["fieldSelector"] = f"metadata.name={name}"
        self.groups = ResourceWatch(
            server, f"{base}/modelgroups", self._changed, params=params, backoff=backoff
        )
        self.policies = ResourceWatch(server, f"{base}/slopolicies", self._changed, backoff=backoff)

    def _changed(self, _: Mapping[str, Mapping[str, Any]]) -> None:
        if not (self.groups.listed and self.policies.listed):
            return  # both lists first: a policy compiled from half the picture would be a guess
        report = watched_model_groups(self.groups.state.objects, self.policies.state.objects, self.namespace)
        if report == self.last:
            return
        self.last = report
        if self._on_change is not None:
            self._on_change(report)

    async def run(self, on_change: ModelGroupsCallback) -> None:
        self._on_change = on_change
        await asyncio.gather(self.groups.run(), self.policies.run())


def watched_model_groups(
    model_groups: Mapping[str, Mapping[str, Any]], policies: Mapping[str, Mapping[str, Any]], namespace: str
) -> dict[str, WatchedModelGroup]:
    """Every watched ModelGroup compiled against the watched SLOPolicies."""
    report: dict[str, WatchedModelGroup] = {}
    for name, raw in model_groups.items():
        policy, model_group = compile_from_objects(model_groups, policies, namespace, name)
        metadata = raw.get("metadata") or {}
        port = model_group.spec.engine.port if model_group is not None else None
        report[name] = WatchedModelGroup(policy, str(metadata.get("creationTimestamp") or ""), port)
    return report
