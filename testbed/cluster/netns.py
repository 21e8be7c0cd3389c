"""A network namespace per cluster that owns the fake pods' IP addresses.

Pod IPs cannot be loopback (the API server refuses loopback endpoints), so each cluster's pod range
10.<octet>.0.0/16 is routed from the host over a veth pair into a namespace of its own, where the
whole range is a local route on `lo`: a process started there can bind any pod IP without adding
addresses, and Prometheus or the operator on the host reach it at that IP. Needs root (CAP_NET_ADMIN).
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from goodput.testbed.cluster import processes
from goodput.testbed.cluster.topology import PodNetwork

NETNS_PREFIX = "goodput-"
FIRST_OCTET = 200  # pod ranges 10.200.0.0/16 .. 10.254.0.0/16, away from the usual 10.0-10.199 choices
LAST_OCTET = 254
NETNS_RUN_DIR = Path("/run/netns")
# Pod ranges are a machine-wide resource: clusters started at once from different state folders (the
# e2e suite's workers, a demo beside them) take them under one lock.
ALLOCATION_LOCK_DIR = Path("/run/goodput")


class NetnsError(RuntimeError):
    """The namespace, link or route could not be set up (usually: not root, or `ip` missing)."""


@dataclass(frozen=True, slots=True)
class NetnsPlan:
    """Names and addresses of one cluster's namespace and veth pair."""

    name: str
    network: PodNetwork

    @property
    def host_veth(self) -> str:
        return f"gp{self.network.octet}h"

    @property
    def namespace_veth(self) -> str:
        return f"gp{self.network.octet}n"

    def setup_commands(self) -> list[list[str]]:
        n = self.network
        inside = ["ip", "-n", self.name]
        return [
            ["ip", "netns", "add", self.name],
            ["ip", "link", "add", self.host_veth, "type", "veth", "peer", "name", self.namespace_veth],
            ["ip", "link", "set", self.namespace_veth, "netns", self.name],
            [*inside, "link", "set", "lo", "up"],
            [*inside, "addr", "add", n.namespace_link_address, "dev", self.namespace_veth],
            [*inside, "link", "set", self.namespace_veth, "up"],
            # Every pod IP is local inside: bind() to any of them works without adding addresses.
            [*inside, "route", "add", "local", n.pod_range, "dev", "lo"],
            [*inside, "route", "add", "default", "via", n.host_link_address.split("/")[0]],
            ["ip", "addr", "add", n.host_link_address, "dev", self.host_veth],
            ["ip", "link", "set", self.host_veth, "up"],
            ["ip", "route", "add", n.pod_range, "via", n.gateway, "dev", self.host_veth],
        ]

    def exec_argv(self, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.name, *argv]


def netns_name(cluster_name: str) -> str:
    return f"{NETNS_PREFIX}{cluster_name}"


def choose_octet(routes_in_use: Iterable[str], taken_octets: Iterable[int] = ()) -> int:
    """The first octet whose pod range overlaps no existing route or address and whose link network
    holds none (a broader link-local route, as zeroconf adds, is fine: the /30 is more specific)."""
    in_use = [ipaddress.ip_network(route, strict=False) for route in routes_in_use]
    in_use = [network for network in in_use if network.version == 4]
    taken = set(taken_octets)
    for octet in range(FIRST_OCTET, LAST_OCTET + 1):
        if octet in taken:
            continue
        network = PodNetwork(octet)
        pod_range = ipaddress.IPv4Network(network.pod_range)
        link = ipaddress.IPv4Network(network.host_link_address, strict=False)
        if any(pod_range.overlaps(used) for used in in_use):
            continue
        if any(used.subnet_of(link) for used in in_use):  # type: ignore[arg-type]
            continue
        return octet
    raise NetnsError("no free 10.x.0.0/16 pod range left between 10.200 and 10.254")


def routes_in_use() -> list[str]:
    """Destinations of every IPv4 route in every table, and every address, of the host namespace."""
    prefixes: list[str] = []
    routes = _ip_json("-4", "route", "show", "table", "all")
    for route in routes:
        dst = str(route.get("dst", ""))
        if dst and dst != "default" and not dst.startswith(("broadcast", "multicast")):
            prefixes.append(dst)
    for link in _ip_json("-4", "addr", "show"):
        addresses: list[dict[str, Any]] = link.get("addr_info", [])  # type: ignore[assignment]
        prefixes.extend(f"{info['local']}/32" for info in addresses)
    return prefixes


def existing_octets() -> set[int]:
    """Octets held by namespaces of other goodput clusters (from their veth names)."""
    octets: set[int] = set()
    for link in _ip_json("link", "show"):
        name = str(link.get("ifname", ""))
        if name.startswith("gp") and name.endswith("h") and name[2:-1].isdigit():
            octets.add(int(name[2:-1]))
    return octets


@contextlib.contextmanager
def _allocation_lock(lock_dir: Path) -> Iterator[None]:
    lock_dir.mkdir(parents=True, exist_ok=True)
    with (lock_dir / ".network.lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def create(cluster_name: str, *, lock_dir: Path) -> NetnsPlan:
    """Pick a free pod range and build the namespace, veth pair and routes for it."""
    if os.geteuid() != 0:
        raise NetnsError("creating a network namespace needs root; run as root or use --no-netns")
    name = netns_name(cluster_name)
    with _allocation_lock(lock_dir):
        if exists(name):
            raise NetnsError(
                f"network namespace {name} already exists (another cluster named {cluster_name}?)"
            )
        plan = NetnsPlan(name, PodNetwork(choose_octet(routes_in_use(), existing_octets())))
        try:
            for argv in plan.setup_commands():
                _run(argv)
        except NetnsError:
            delete(plan)
            raise
    return plan


def delete(plan: NetnsPlan, *, grace_seconds: float = 5.0) -> tuple[list[int], list[int]]:
    """Remove the namespace, its veth pair and route; ends processes still running inside it first
    (servers a test started there). Returns their PIDs, and those that had not exited even
    `processes.KILL_WAIT_SECONDS` after SIGKILL."""
    stopped: tuple[list[int], list[int]] = ([], [])
    if exists(plan.name):
        stopped = stop_processes_inside(plan.name, grace_seconds=grace_seconds)
        _run(["ip", "netns", "delete", plan.name], check=False)
    if Path(f"/sys/class/net/{plan.host_veth}").exists():
        _run(["ip", "link", "delete", plan.host_veth], check=False)
    return stopped


def exists(name: str) -> bool:
    return (NETNS_RUN_DIR / name).exists()


def pids_inside(name: str) -> list[int]:
    result = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True, check=False)
    return [int(pid) for pid in result.stdout.split() if pid.isdigit()]


def stop_processes_inside(name: str, *, grace_seconds: float) -> tuple[list[int], list[int]]:
    """SIGTERM to every process in the namespace, SIGKILL to those left after `grace_seconds`; then
    waits, bounded, until each has exited whole (`processes.has_exited`: `ip netns pids` stops
    listing a process whose main thread ended while its other threads still hold its sockets).
    Returns the PIDs signalled, and those still exiting at the end."""
    pids = pids_inside(name)
    started = _started(pids)
    for pid in started:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    if not _wait_exited(started, grace_seconds) or pids_inside(name):
        started |= _started(pids_inside(name))  # started meanwhile: killed too
        for pid, ticks in started.items():
            if not processes.has_exited(pid, ticks):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        _wait_exited(started, processes.KILL_WAIT_SECONDS)
    return sorted(started), [pid for pid, ticks in started.items() if not processes.has_exited(pid, ticks)]


def _started(pids: Iterable[int]) -> dict[int, int]:
    """Each running PID with its start time, which names it while it exits (its PID may be reused)."""
    return {pid: ticks for pid in pids if (ticks := processes.start_ticks(pid)) is not None}


def _wait_exited(started: Mapping[int, int], timeout_seconds: float) -> bool:
    deadline = time.monotonic() + timeout_seconds
    while True:
        _reap_children(started)
        if all(processes.has_exited(pid, ticks) for pid, ticks in started.items()):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def run_in_netns(
    name: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None, **popen_kwargs: Any
) -> subprocess.Popen[bytes]:
    """Start `argv` inside the namespace (`ip netns exec`): it can listen on any pod IP."""
    process: subprocess.Popen[bytes] = subprocess.Popen(
        ["ip", "netns", "exec", name, *argv], env=dict(env) if env is not None else None, **popen_kwargs
    )
    return process


def _reap_children(pids: Iterable[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def _ip_json(*args: str) -> list[dict[str, object]]:
    result = subprocess.run(["ip", "-j", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise NetnsError(f"ip -j {' '.join(args)} failed: {result.stderr.strip()}")
    data = json.loads(result.stdout or "[]")
    return [entry for entry in data if isinstance(entry, dict)]


def _run(argv: Sequence[str], *, check: bool = True) -> None:
    try:
        result = subprocess.run(list(argv), capture_output=True, text=True, check=False, timeout=30)
    except FileNotFoundError:
        raise NetnsError("the `ip` command is missing (Debian: apt-get install iproute2)") from None
    if check and result.returncode != 0:
        raise NetnsError(f"{' '.join(argv)} failed: {result.stderr.strip()}")
