"""A small HTTP proxy in front of Prometheus, for the operator only: it passes queries through, or
answers them seconds late, or answers with every series missing (an empty result, as a Prometheus
whose scrapes stopped reaching the engines would). The mode is switched by the chaos run.

Bounded: each forwarded query times out after `upstream_timeout_seconds`; a slowed answer waits at
most the slow delay; the server runs in a daemon thread and `close()` stops it.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PASS = "pass"
SLOW = "slow"
MISSING_SERIES = "missing-series"


@dataclass
class ProxyMode:
    name: str = PASS
    slow_seconds: float = 0.0


def without_series(body: bytes) -> bytes:
    """A query answer with its result emptied (vector and matrix answers); others unchanged."""
    try:
        answer = json.loads(body)
    except ValueError:
        return body
    data = answer.get("data") if isinstance(answer, dict) else None
    if isinstance(data, dict) and data.get("resultType") in ("vector", "matrix"):
        data["result"] = []
        return json.dumps(answer).encode()
    return body


class PrometheusProxy:
    def __init__(self, upstream_url: str, *, upstream_timeout_seconds: float = 10.0) -> None:
        self.upstream_url = upstream_url.rstrip("/")
        self.upstream_timeout_seconds = upstream_timeout_seconds
        self.mode = ProxyMode()
        self.answered = {PASS: 0, SLOW: 0, MISSING_SERIES: 0, "upstream-error": 0}
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name="prom-proxy")

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> PrometheusProxy:
        self._thread.start()
        return self

    def set_mode(self, name: str, slow_seconds: float = 0.0) -> None:
        with self._lock:
            self.mode = ProxyMode(name, slow_seconds)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _count(self, key: str) -> None:
        with self._lock:
            self.answered[key] = self.answered.get(key, 0) + 1

    def forward(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str]
    ) -> tuple[int, bytes]:
        with self._lock:
            mode = ProxyMode(self.mode.name, self.mode.slow_seconds)
        if mode.name == SLOW:
            time.sleep(mode.slow_seconds)
        request = urllib.request.Request(self.upstream_url + path, data=body, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.upstream_timeout_seconds) as reply:
                status, payload = reply.status, reply.read()
        except urllib.error.HTTPError as error:
            status, payload = error.code, error.read()
        except OSError as error:
            self._count("upstream-error")
            return 502, json.dumps({"status": "error", "error": f"upstream: {error}"}).encode()
        self._count(mode.name)
        if mode.name == MISSING_SERIES and status == 200:
            payload = without_series(payload)
        return status, payload

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _relay(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("content-type", "accept")}
                status, payload = proxy.forward(method, self.path, body, headers)
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:
                    pass  # the operator gave up waiting: its timeout, as intended

            def do_GET(self) -> None:
                self._relay("GET")

            def do_POST(self) -> None:
                self._relay("POST")

            def log_message(self, *_: Any) -> None:
                pass

        return Handler
