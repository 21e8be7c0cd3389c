"""A small vLLM-like upstream for gateway tests and benchmarks: OpenAI endpoints, streamed or not.

Every request it receives is recorded (group, tenant header, body); `gate` lets a test hold
requests in flight to create contention; `tokens` and `token_delay_seconds` shape a stream, and
`first_token_delay_seconds` is a prefill slower than any figure the gateway holds.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Received:
    group: str
    tenant: str
    body: dict[str, Any]
    at: float


@dataclass
class Upstream:
    name: str
    tokens: int = 4
    token_delay_seconds: float = 0.0
    first_token_delay_seconds: float = 0.0
    gate: asyncio.Event | None = None
    received: list[Received] = field(default_factory=list)
    running: int = 0
    finished: int = 0
    aborted: int = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self.handle)
        app.router.add_post("/v1/chat/completions", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.received.append(
            Received(self.name, request.headers.get("X-Goodput-Tenant", ""), body, time.monotonic())
        )
        self.running += 1
        try:
            if self.gate is not None:
                await self.gate.wait()
            count = min(self.tokens, int(body.get("max_tokens") or body.get("max_completion_tokens") or 16))
            if self.first_token_delay_seconds:
                await asyncio.sleep(self.first_token_delay_seconds)
            if body.get("stream"):
                return await self._stream(request, count)
            await asyncio.sleep(self.token_delay_seconds * count)
            self.finished += 1
            usage = {"prompt_tokens": 10, "completion_tokens": count, "total_tokens": 10 + count}
            return web.json_response(
                {
                    "id": "cmpl-1",
                    "object": "text_completion",
                    "choices": [{"text": "x" * count}],
                    "usage": usage,
                }
            )
        except asyncio.CancelledError:
            self.aborted += 1
            raise
        finally:
            self.running -= 1

    async def _stream(self, request: web.Request, count: int) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await response.prepare(request)
        for index in range(count):
            await asyncio.sleep(self.token_delay_seconds)
            chunk = {"id": "cmpl-1", "choices": [{"index": 0, "text": f"t{index}"}]}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        self.finished += 1
        return response


def main() -> None:
    """Serve one upstream on 127.0.0.1 (the gateway benchmarks run it as a separate process)."""
    import argparse

    parser = argparse.ArgumentParser(description="a vLLM-like upstream for gateway benchmarks")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--token-delay-seconds", type=float, default=0.0)
    args = parser.parse_args()
    upstream = Upstream("g1", tokens=args.tokens, token_delay_seconds=args.token_delay_seconds)
    upstream.received = _Discard()
    web.run_app(upstream.app(), host="127.0.0.1", port=args.port, access_log=None, print=None)


class _Discard(list[Received]):
    """A benchmark's upstream keeps nothing: its memory stays flat."""

    def append(self, _: Received) -> None:
        return None


if __name__ == "__main__":
    main()
