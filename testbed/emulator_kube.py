"""The few Kubernetes API calls the emulator makes, asynchronously, on one aiohttp session.

The `kubernetes` package reads the kubeconfig (certificates, token, server URL); requests go
through aiohttp so that pod watches, status patches and the emulated servers share one event loop.
Every request has a timeout; a watch ends by itself after `timeoutSeconds` and is restarted by the
caller.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import aiohttp
from kubernetes import client as kube_client
from kubernetes import config as kube_config

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


class KubeRequestError(RuntimeError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


@dataclass(frozen=True, slots=True)
class WatchEvent:
    kind: str
    """ADDED, MODIFIED, DELETED or BOOKMARK."""
    object: Mapping[str, Any]


class KubeClient:
    """List, watch, get and patch through the API server named in a kubeconfig."""

    def __init__(
        self,
        server: str,
        ssl_context: ssl.SSLContext | None,
        token: str | None,
        timeout_seconds: float = 15.0,
    ) -> None:
        self._server = server.rstrip("/")
        self._ssl: ssl.SSLContext | bool = ssl_context if ssl_context is not None else False
        self._headers = {"Authorization": token} if token else {}
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def from_kubeconfig(cls, path: str | None = None, context: str | None = None) -> KubeClient:
        """The current (or named) context of `path`, $KUBECONFIG or ~/.kube/config."""
        configuration = kube_client.Configuration()
        kube_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=path, context=context, client_configuration=configuration
        )
        context_ssl: ssl.SSLContext | None = None
        if configuration.host.startswith("https"):
            context_ssl = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
            if not configuration.verify_ssl:
                context_ssl.check_hostname = False
                context_ssl.verify_mode = ssl.CERT_NONE
            if configuration.cert_file:
                context_ssl.load_cert_chain(configuration.cert_file, configuration.key_file)
        token = configuration.api_key.get("authorization") or configuration.api_key.get("BearerToken")
        if token and not token.lower().startswith("bearer "):
            token = f"Bearer {token}"
        return cls(configuration.host, context_ssl, token)

    async def __aenter__(self) -> KubeClient:
        self._session = aiohttp.ClientSession(headers=self._headers)
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._session is not None:
            await self._session.close()
        self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("use the client as an async context manager")
        return self._session

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any] | None:
        """The object at `path`, or None when it does not exist."""
        url = self._url(path, params)
        async with self.session.get(url, ssl=self._ssl, timeout=self._timeout) as response:
            if response.status == 404:
                return None
            return await _json_or_raise(response)

    async def patch(self, path: str, body: Mapping[str, Any], content_type: str) -> dict[str, Any]:
        url = self._url(path, None)
        data = json.dumps(body)
        headers = {"Content-Type": content_type}
        async with self.session.patch(
            url, data=data, headers=headers, ssl=self._ssl, timeout=self._timeout
        ) as response:
            return await _json_or_raise(response)

    async def watch(
        self, path: str, params: Mapping[str, str], resource_version: str, timeout_seconds: int
    ) -> AsyncIterator[WatchEvent]:
        """Events after `resource_version` until the server ends the watch (after `timeout_seconds`).

        Raises KubeRequestError(410) when the version is too old: the caller lists again.
        """
        query = {
            **params,
            "watch": "1",
            "resourceVersion": resource_version,
            "timeoutSeconds": str(timeout_seconds),
            "allowWatchBookmarks": "true",
        }
        timeout = aiohttp.ClientTimeout(total=timeout_seconds + 15, sock_read=timeout_seconds + 10)
        async with self.session.get(self._url(path, query), ssl=self._ssl, timeout=timeout) as response:
            if response.status != 200:
                await _json_or_raise(response)
            async for line in response.content:
                if not line.strip():
                    continue
                event = json.loads(line)
                kind = str(event.get("type", ""))
                body = event.get("object") or {}
                if kind == "ERROR":
                    raise KubeRequestError(int(body.get("code", 500)), str(body.get("message", "")))
                yield WatchEvent(kind, body)

    def _url(self, path: str, params: Mapping[str, str] | None) -> str:
        return f"{self._server}{path}" + (f"?{urlencode(params)}" if params else "")


async def _json_or_raise(response: aiohttp.ClientResponse) -> dict[str, Any]:
    text = await response.text()
    if response.status >= 300:
        try:
            message = str(json.loads(text).get("message", text))
        except (json.JSONDecodeError, AttributeError):
            message = text
        raise KubeRequestError(response.status, message)
    body = json.loads(text) if text else {}
    return body if isinstance(body, dict) else {}
