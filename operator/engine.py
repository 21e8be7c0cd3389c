"""HTTP calls to a group's leader: the warm-up completion and the in-flight request count.

Both go to the leader pod's IP and port directly (the production path, not through a Service):
the warm-up proves the whole group produces tokens at its shape, and the in-flight count tells a
draining group when its last request has finished.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

import aiohttp

from goodput.controllers.groups import WarmupOutcome, WarmupRequest

# Requests the leader still holds: running in a batch or waiting for one (vLLM metric names).
_IN_FLIGHT = re.compile(r"^vllm:num_requests_(?:running|waiting)(?:\{[^}]*\})?\s+([0-9.eE+-]+)", re.MULTILINE)
PROBE_TIMEOUT_SECONDS = 3.0


def generated_tokens(answer: object) -> int:
    """Tokens an OpenAI-style completion answer reports (usage, else the returned text is non-empty)."""
    if not isinstance(answer, dict):
        return 0
    usage = answer.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        return int(usage["completion_tokens"])
    choices = answer.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict) and choices[0].get("text"):
        return 1
    return 0


def in_flight_requests(exposition: str) -> int | None:
    """Running plus waiting requests from a vLLM /metrics page; None when it has neither metric."""
    values = [float(value) for value in _IN_FLIGHT.findall(exposition)]
    return round(sum(values)) if values else None


async def warm_up(session: aiohttp.ClientSession, request: WarmupRequest) -> WarmupOutcome:
    """Send the warm-up completion; it passes only if the leader answered with generated tokens."""
    try:
        timeout = aiohttp.ClientTimeout(total=request.timeout_seconds)
        async with session.post(request.url, json=request.body(), timeout=timeout) as response:
            if response.status != 200:
                text = (await response.text())[:200]
                return WarmupOutcome(False, datetime.now(UTC), f"HTTP {response.status}: {text}")
            tokens = generated_tokens(await response.json(content_type=None))
    except (TimeoutError, aiohttp.ClientError, ValueError) as error:
        return WarmupOutcome(False, datetime.now(UTC), f"{type(error).__name__}: {error}".rstrip(": "))
    if tokens == 0:
        return WarmupOutcome(False, datetime.now(UTC), "the completion returned no tokens")
    return WarmupOutcome(True, datetime.now(UTC), f"{tokens} token(s)")


async def leader_in_flight(session: aiohttp.ClientSession, url: str) -> int | None:
    """The leader's in-flight requests, or None when it cannot be read."""
    try:
        timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_SECONDS)
        async with session.get(url, timeout=timeout) as response:
            if response.status != 200:
                return None
            return in_flight_requests(await response.text())
    except (TimeoutError, aiohttp.ClientError):
        return None
