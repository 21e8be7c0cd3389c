"""Helpers for tests against the local cluster: bounded polling and servers inside the pod network.

Every wait is bounded in time; every process started here is ended when its context exits.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from goodput.testbed.cluster import netns
from goodput.testbed.cluster.processes import stop_child

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T | None],
    *,
    timeout_seconds: float,
    interval_seconds: float = 0.2,
    describe: Callable[[], str] | str = "",
) -> T:
    """Call `predicate` until it returns something truthy and return that value (never None: a
    predicate that answers "not yet" with None gives its caller the found value's own type).

    After `timeout_seconds` raise AssertionError naming what was awaited (`describe`, called only
    then if it is a function) and the last value seen. Exceptions from `predicate` propagate.
    """
    deadline = time.monotonic() + timeout_seconds
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            break
        time.sleep(max(0.0, min(interval_seconds, deadline - time.monotonic())))
    what = describe() if callable(describe) else describe
    what = what or getattr(predicate, "__name__", "condition")
    raise AssertionError(f"timed out after {timeout_seconds:g} s waiting for {what}; last value: {value!r}")


def port_accepts(host: str, port: int, *, timeout_seconds: float = 0.5) -> bool:
    """Whether a TCP connection to host:port succeeds now."""
    try:
        with socket.create_connection((host, port), timeout=timeout_seconds):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def serving_in_netns(
    namespace: str,
    argv: Sequence[str],
    *,
    address: tuple[str, int] | None = None,
    ready_timeout_seconds: float = 20.0,
    stop_timeout_seconds: float = 5.0,
    **popen_kwargs: Any,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run `argv` inside the cluster's pod network namespace for the duration of the block.

    With `address` (a pod IP and port), wait until it accepts connections from the host before
    yielding, so the caller knows Prometheus or the operator can reach it. The process is
    terminated (then killed) on exit.
    """
    process = netns.run_in_netns(namespace, argv, **popen_kwargs)
    try:
        if address is not None:
            host, port = address

            def reachable() -> bool:
                if process.poll() is not None:
                    raise AssertionError(
                        f"{argv[0]} exited with {process.returncode} before serving {host}:{port}"
                    )
                return port_accepts(host, port)

            wait_for(reachable, timeout_seconds=ready_timeout_seconds, describe=f"a server on {host}:{port}")
        yield process
    finally:
        stop_child(process, grace_seconds=stop_timeout_seconds)
