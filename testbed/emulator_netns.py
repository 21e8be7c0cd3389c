"""Listening sockets opened inside another network namespace by a process that stays in its own.

The emulator must reach the API server on the host's loopback (a network namespace has a loopback
of its own, where nothing listens) and must listen on pod IPs that are local only inside the
harness's namespace. A socket belongs for its whole life to the namespace of the thread that created
it, whichever thread uses it later, and setns(2) moves only the calling thread. So one worker thread
enters the pod namespace once and creates every listening socket; the event loop on the main thread
(still in the host namespace, next to the API server) serves on them. No second process, no
instructions over a pipe, and `ip netns pids` does not list the emulator: only its sockets live there.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import ipaddress
import os
import socket
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures.thread import BrokenThreadPool
from pathlib import Path

CLONE_NEWNET = 0x40000000
NETNS_RUN_DIR = Path("/run/netns")


class NetnsUnavailableError(RuntimeError):
    """The namespace does not exist or this process may not enter it (needs CAP_SYS_ADMIN)."""


def netns_path(name_or_path: str) -> Path:
    """`/run/netns/<name>` for a name made by `ip netns add`, or the path itself."""
    return Path(name_or_path) if "/" in name_or_path else NETNS_RUN_DIR / name_or_path


def enter_netns(path: Path) -> None:
    """Move the calling thread into the network namespace at `path`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as error:
        raise NetnsUnavailableError(f"cannot open network namespace {path}: {error.strerror}") from None
    try:
        setns = getattr(os, "setns", None)
        if setns is not None:  # Python 3.12+
            setns(fd, CLONE_NEWNET)
            return
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        if libc.setns(fd, CLONE_NEWNET) != 0:
            code = ctypes.get_errno()
            raise NetnsUnavailableError(f"setns({path}) failed: {os.strerror(code)} (needs CAP_SYS_ADMIN)")
    finally:
        os.close(fd)


def bind_listener(host: str, port: int, backlog: int = 1024) -> socket.socket:
    """A non-blocking listening TCP socket on host:port (in the calling thread's namespace)."""
    family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class ListenerFactory:
    """Creates listening sockets in one network namespace (None: this process's own)."""

    def __init__(self, netns: str | None = None) -> None:
        self.netns = netns
        self._executor: ThreadPoolExecutor | None = None
        if netns is not None:
            path = netns_path(netns)
            if not path.exists():
                raise NetnsUnavailableError(f"network namespace {path} does not exist")
            self._executor = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="netns-listener", initializer=enter_netns, initargs=(path,)
            )
            try:  # enter now, so a missing privilege fails at start rather than at the first pod
                self._executor.submit(os.getpid).result(timeout=10)
            except BrokenThreadPool:
                self._executor = None
                raise NetnsUnavailableError(
                    f"cannot enter network namespace {path}: setns needs root (CAP_SYS_ADMIN)"
                ) from None

    async def open(self, host: str, port: int) -> socket.socket:
        if self._executor is None:
            return bind_listener(host, port)
        return await asyncio.get_running_loop().run_in_executor(self._executor, bind_listener, host, port)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None
