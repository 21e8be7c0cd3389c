"""A small Kubernetes REST client over the admin client certificate, and HTTP health probes.

The harness only needs a handful of calls (readiness, nodes, pod status); the standard library does
them without the start-up cost of a full client, and the same TLS setup serves the health probes.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

PATCH_TYPES = {
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "json": "application/json-patch+json",
}


class ApiError(RuntimeError):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason


@dataclass(frozen=True, slots=True)
class KubeClient:
    server: str
    ca_file: Path
    cert_file: Path
    key_file: Path
    timeout_seconds: float = 10.0

    @classmethod
    def from_kubeconfig(cls, path: Path) -> KubeClient:
        """Reads the current context of a kubeconfig that uses file paths (as ours does)."""
        config = yaml.safe_load(path.read_text())
        context_name = config["current-context"]
        context = next(c["context"] for c in config["contexts"] if c["name"] == context_name)
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
        user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
        return cls(
            server=cluster["server"],
            ca_file=Path(cluster["certificate-authority"]),
            cert_file=Path(user["client-certificate"]),
            key_file=Path(user["client-key"]),
        )

    def _context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca_file))
        context.load_cert_chain(str(self.cert_file), str(self.key_file))
        return context

    def request(
        self, method: str, path: str, body: Any = None, *, content_type: str = "application/json"
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.server + path, data=data, method=method)
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(
                request, context=self._context(), timeout=self.timeout_seconds
            ) as reply:
                payload = reply.read()
        except urllib.error.HTTPError as error:
            raise _api_error(error) from None
        return json.loads(payload) if payload else None

    def get(self, path: str) -> Any:
        """The object, or None when it does not exist."""
        try:
            return self.request("GET", path)
        except ApiError as error:
            if error.status == 404:
                return None
            raise

    def create(self, path: str, obj: dict[str, Any]) -> Any:
        return self.request("POST", path, obj)

    def patch(self, path: str, patch: Any, *, patch_type: str = "merge") -> Any:
        return self.request("PATCH", path, patch, content_type=PATCH_TYPES[patch_type])

    def delete(self, path: str) -> bool:
        """Whether there was something to delete."""
        try:
            self.request("DELETE", path)
        except ApiError as error:
            if error.status == 404:
                return False
            raise
        return True


def _api_error(error: urllib.error.HTTPError) -> ApiError:
    try:
        status = json.loads(error.read() or b"{}")
    except ValueError:
        status = {}
    return ApiError(error.code, str(status.get("reason", error.reason)), str(status.get("message", "")))


def probe(url: str, *, ca_file: Path | None = None, timeout_seconds: float = 2.0) -> tuple[bool, str]:
    """GET `url`; healthy on a 2xx. HTTPS is verified against `ca_file` if given, else accepted as is
    (the scheduler and controller manager serve self-signed certificates on loopback)."""
    context: ssl.SSLContext | None = None
    if url.startswith("https://"):
        if ca_file is not None:
            context = ssl.create_default_context(cafile=str(ca_file))
        else:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, context=context, timeout=timeout_seconds) as reply:
            body = reply.read(200).decode(errors="replace").strip()
            return 200 <= reply.status < 300, body or str(reply.status)
    except urllib.error.HTTPError as error:
        return False, f"HTTP {error.code}"
    except (OSError, ssl.SSLError) as error:
        return False, str(getattr(error, "reason", error))
