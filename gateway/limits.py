"""What one client may hold of the gateway: time on a connection, bytes of body, bytes of memory.

Every bound closes or refuses something a client holds without making progress; a client that sends
its request promptly and reads its answer never meets one. Request bodies are read here rather than
by aiohttp's `Request.read()`, which buffers a body whole (up to the size limit, even for a body it
then refuses with 413) and keeps a second copy of it: a body is refused on its declared length before
a byte is read, counted as it arrives (a chunked body too), and held against a budget that all bodies
in the gateway share.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from aiohttp import web

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class ClientLimits:
    """The bounds on what clients hold; every one is a `goodput gateway` option (docs/gateway.md).

    `header_timeout_seconds`: a request's head (request line and headers) must arrive whole this long
    after the connection opened, or after its first byte on a kept-alive connection; else the
    connection is closed. `body_timeout_seconds`: its body must arrive whole this long after the head;
    else 408 and the connection is closed. `keepalive_timeout_seconds`: a connection idle this long
    between requests is closed. `max_connections_per_client`: connections open at once from one client
    address; one more is closed as it opens (0: no cap). `max_body_bytes`: a larger body is refused
    with 413, on its declared length before it is read, or as soon as a chunked body passes it.
    `body_budget_bytes`: the bytes all bodies in the gateway hold together, each from its first byte
    until its request is answered; a body that would pass it is refused with 503 and Retry-After.
    """

    header_timeout_seconds: float = 10.0
    body_timeout_seconds: float = 30.0
    keepalive_timeout_seconds: float = 75.0
    max_connections_per_client: int = 256
    max_body_bytes: int = 16 * MIB
    body_budget_bytes: int = 128 * MIB

    def __post_init__(self) -> None:
        for name in ("header_timeout_seconds", "body_timeout_seconds", "keepalive_timeout_seconds"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.max_connections_per_client < 0:
            raise ValueError(
                f"max_connections_per_client must be 0 or more, got {self.max_connections_per_client}"
            )
        if not 0 < self.max_body_bytes <= self.body_budget_bytes:
            raise ValueError(
                f"max_body_bytes ({self.max_body_bytes}) must be positive and within body_budget_bytes "
                f"({self.body_budget_bytes}): a body the budget can never hold could never be served"
            )


class BodyBudget:
    """The bytes of request bodies the gateway holds at once, shared by every request in it.

    Each body takes its bytes as they arrive and gives them back when its request ends, so the bound
    covers the parsed copy and the engine's copy made from it too; a client that sends slowly holds
    only what it has sent."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.held_bytes = 0

    @property
    def free_bytes(self) -> int:
        return self.capacity_bytes - self.held_bytes

    def take(self, count_bytes: int) -> bool:
        """Hold `count_bytes` more, or nothing when that would pass the capacity."""
        if count_bytes > self.free_bytes:
            return False
        self.held_bytes += count_bytes
        return True

    def give_back(self, count_bytes: int) -> None:
        self.held_bytes = max(0, self.held_bytes - count_bytes)

    @contextmanager
    def lease(self) -> Iterator[BodyLease]:
        """One request's share, given back whole however the request ends."""
        lease = BodyLease(self)
        try:
            yield lease
        finally:
            self.give_back(lease.held_bytes)
            lease.held_bytes = 0


@dataclass(slots=True)
class BodyLease:
    """What one request's body holds of the shared budget."""

    budget: BodyBudget
    held_bytes: int = 0

    def take(self, count_bytes: int) -> bool:
        if not self.budget.take(count_bytes):
            return False
        self.held_bytes += count_bytes
        return True


class BodyRefusedError(Exception):
    """A body the gateway will not read (or read no further): the status, why, and whether the
    connection is closed at once rather than drained (a client too slow to finish its body would only
    hold the connection longer)."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str,
        *,
        retry_after_seconds: int | None = None,
        close: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.retry_after_seconds = retry_after_seconds
        self.close = close


def too_large(size_bytes: int, limits: ClientLimits, declared: bool) -> BodyRefusedError:
    how = "declares" if declared else "passed"
    return BodyRefusedError(
        413, f"request body {how} {size_bytes} bytes; the limit is {limits.max_body_bytes}", "BodyTooLarge"
    )


def over_budget(size_bytes: int) -> BodyRefusedError:
    return BodyRefusedError(
        503,
        f"the gateway holds as many request bodies as it may; {size_bytes} more bytes do not fit now",
        "BodyBudget",
        retry_after_seconds=1,
    )


def check_declared_length(declared_bytes: int | None, limits: ClientLimits, budget: BodyBudget) -> None:
    """Refuse a body on its Content-Length, before reading any of it: too large for the limit (413),
    or more than the shared budget has free now (503)."""
    if declared_bytes is None:
        return
    if declared_bytes > limits.max_body_bytes:
        raise too_large(declared_bytes, limits, declared=True)
    if declared_bytes > budget.free_bytes:
        raise over_budget(declared_bytes)


async def read_body(request: web.BaseRequest, limits: ClientLimits, lease: BodyLease) -> bytearray:
    """The whole body, each chunk counted against the size limit and taken from the budget as it
    arrives; BodyRefusedError when it is too large, does not fit the budget, or does not arrive
    within `body_timeout_seconds`."""
    check_declared_length(request.content_length, limits, lease.budget)
    body = bytearray()
    try:
        async with asyncio.timeout(limits.body_timeout_seconds):
            while chunk := await request.content.readany():
                if len(body) + len(chunk) > limits.max_body_bytes:
                    raise too_large(len(body) + len(chunk), limits, declared=False)
                if not lease.take(len(chunk)):
                    raise over_budget(len(chunk))
                body += chunk
    except TimeoutError:
        message = (
            f"request body incomplete after {limits.body_timeout_seconds:g}s ({len(body)} bytes received)"
        )
        raise BodyRefusedError(408, message, "BodyTimeout", close=True) from None
    return body
