"""Waiting on a condition, bounded: how a test waits for behaviour it cannot drive by a clock.

A test never sleeps a fixed time and hopes the code under test got there; it waits until what it
expects holds, and fails with `what` once `timeout_seconds` pass without it. The poll period is
short, so a passing test waits no longer than the behaviour takes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

POLL_SECONDS = 0.01


def wait_until(holds: Callable[[], bool], what: str, *, timeout_seconds: float = 10.0) -> None:
    """Block until `holds()` is true; AssertionError naming `what` after `timeout_seconds`."""
    deadline = time.monotonic() + timeout_seconds
    while not holds():
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout_seconds} s: {what}")
        time.sleep(POLL_SECONDS)  # bounded (allowed in test_no_sleeps.py)


async def until(holds: Callable[[], bool], what: str, *, timeout_seconds: float = 10.0) -> None:
    """Wait on the running loop until `holds()` is true; AssertionError naming `what` after
    `timeout_seconds`. The loop runs the code under test meanwhile."""
    deadline = time.monotonic() + timeout_seconds
    while not holds():
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout_seconds} s: {what}")
        await asyncio.sleep(POLL_SECONDS)  # bounded (allowed in test_no_sleeps.py)


async def connection_once_listening(
    host: str, port: int, *, timeout_seconds: float = 10.0
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to `host:port` as soon as something listens there (a server started as a task
    on the same loop opens its port after a few turns of the loop)."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        try:
            return await asyncio.open_connection(host, port)
        except OSError:
            if time.monotonic() >= deadline:
                raise
        await asyncio.sleep(POLL_SECONDS)  # bounded (allowed in test_no_sleeps.py)


async def eventually(
    check: Callable[[], Awaitable[bool]], what: str, *, timeout_seconds: float = 20.0
) -> None:
    """`until` for a check that must itself await (a probe over HTTP)."""
    deadline = time.monotonic() + timeout_seconds
    while not await check():
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout_seconds} s: {what}")
        await asyncio.sleep(POLL_SECONDS)  # bounded (allowed in test_no_sleeps.py)
