"""The production group source: a watch on the ModelGroup's leader pods through the API server.

List once, then watch from the list's resourceVersion (no poll loop); on a 410 Gone or a dropped
connection, list again. The kubernetes client only loads the configuration (in-cluster service
account or kubeconfig); the watch itself runs on aiohttp, in the gateway's event loop.
"""

from __future__ import annotations

import json
import logging
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from kubernetes import client, config

from goodput.api.labels import LEADER_RANK, MODEL_GROUP_LABEL, RANK_LABEL
from goodput.controllers.observation import parse_pod
from goodput.gateway.groups import GroupEndpoint, GroupsCallback, endpoint_of, run_forever

log = logging.getLogger("goodput.gateway.kube")

WATCH_TIMEOUT_SECONDS = 300
RELIST_DELAY_SECONDS = 1.0


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


class KubeGroupSource:
    """Watches the leader pods of one ModelGroup and reports its groups on every change."""

    def __init__(self, server: ApiServer, namespace: str, model_group: str, port: int) -> None:
        self.server = server
        self.namespace = namespace
        self.model_group = model_group
        self.port = port
        self.selector = f"{MODEL_GROUP_LABEL}={model_group},{RANK_LABEL}={LEADER_RANK}"
        self._pods: dict[str, Mapping[str, Any]] = {}

    @property
    def path(self) -> str:
        return f"{self.server.host}/api/v1/namespaces/{self.namespace}/pods"

    def endpoints(self) -> dict[str, GroupEndpoint]:
        endpoints: dict[str, GroupEndpoint] = {}
        for raw in self._pods.values():
            pod = parse_pod(raw)
            endpoint = endpoint_of(pod, self.port) if pod is not None else None
            if endpoint is not None:
                endpoints[endpoint.name] = endpoint
        return endpoints

    async def run(self, on_change: GroupsCallback) -> None:
        async with aiohttp.ClientSession(headers=self.server.headers) as session:

            async def once() -> None:
                try:
                    await self._list_and_watch(session, on_change)
                except Exception as error:
                    log.warning(
                        "pod watch of %s/%s ended: %s; listing again", self.namespace, self.model_group, error
                    )
                    raise

            await run_forever(once, RELIST_DELAY_SECONDS, attempts=None)

    async def _list_and_watch(self, session: aiohttp.ClientSession, on_change: GroupsCallback) -> None:
        params = {"labelSelector": self.selector}
        async with session.get(self.path, params=params, ssl=self.server.ssl_context) as response:
            response.raise_for_status()
            listing = await response.json()
        self._pods = {item["metadata"]["name"]: item for item in listing.get("items", [])}
        on_change(self.endpoints())
        version = listing["metadata"]["resourceVersion"]
        watch = {
            **params,
            "watch": "1",
            "resourceVersion": version,
            "timeoutSeconds": str(WATCH_TIMEOUT_SECONDS),
        }
        timeout = aiohttp.ClientTimeout(total=None, sock_read=WATCH_TIMEOUT_SECONDS + 30)
        async with session.get(
            self.path, params=watch, ssl=self.server.ssl_context, timeout=timeout
        ) as response:
            response.raise_for_status()
            async for line in response.content:
                if line.strip():
                    self.apply(json.loads(line))
                    on_change(self.endpoints())

    def apply(self, event: Mapping[str, Any]) -> None:
        """One watch event; an ERROR event (410 Gone: history compacted) ends the watch to relist."""
        kind = event.get("type")
        pod = event.get("object") or {}
        if kind == "ERROR":
            raise RuntimeError(f"watch error: {pod.get('message', pod)}")
        name = (pod.get("metadata") or {}).get("name")
        if not name:
            return
        if kind == "DELETED":
            self._pods.pop(name, None)
        else:
            self._pods[name] = pod
