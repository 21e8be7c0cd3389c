"""The gateway under hostile clients: what well-behaved clients see, and what the gateway's memory does.

Run: .venv/bin/python bench/bench_hostile_clients.py [--hostile 1000] [--phase-seconds 40]
     [--large-bodies 30]

Four processes on loopback only: a vLLM-like upstream that answers at once (tests/gateway_upstream.py),
one standalone `goodput gateway` in front of it with its default client limits (header 10 s, body
30 s, keep-alive 75 s, 256 connections per client address, 16 MiB bodies, 128 MiB of bodies in
flight), this client, and in phase 2 a second client process for the hostile connections. Three
phases, one after the other:

1. quiet: one well-behaved client sends small non-streamed completions one at a time for
   `--phase-seconds`; their p50 and p99.
2. hostile: `--hostile` connections held open, a quarter of each kind: slow heads (a request line,
   then one header line a second), slow bodies (a head declaring 1 MB, then one byte a second), idle
   kept-alive connections (one request, then nothing), oversized bodies (a head declaring 42 MiB and
   1 MiB of it, then nothing). Each is reopened as soon as the gateway closes it, so as many stay
   open for the whole phase. They come from 127.0.0.2 to 127.0.0.9 (125 from each: the cap counts
   per address; every 127/8 address is this machine's loopback), from a process of their own; the
   well-behaved client, from 127.0.0.1, sends as in phase 1 meanwhile. Printed: its p50 and p99 and
   what the hostile connections added to them, the gateway's peak RSS (its VmHWM), and what the
   gateway closed and refused.
3. large bodies: 10 concurrent 42 MiB bodies sent whole, then `--large-bodies` concurrent valid
   14 MiB bodies (within the limit, a prompt beyond the context); their answers by status and the
   gateway's peak RSS after each.

The phase is longer than the body timeout, so each slow body meets it; the clients and the gateway
share the machine's cores. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import numpy as np

from goodput.testbed.cluster.controlplane import free_ports
from goodput.testbed.cluster.processes import stop_child

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "manifests" / "samples"
BODY = {"model": "llama-8b", "prompt": "Hello, my name is", "max_tokens": 16}
HOSTILE_SOURCES = [f"127.0.0.{index}" for index in range(2, 10)]
KINDS = ("slow head", "slow body", "idle kept-alive", "oversized body")
MIB = 1024 * 1024


@dataclass
class Gateway:
    url: str
    host: str
    port: int
    metrics_url: str
    pid: int


@contextmanager
def process(command: list[str]) -> Iterator[subprocess.Popen[bytes]]:
    """A child whose log (stderr) is kept in a temporary file and printed if the run fails."""
    with tempfile.TemporaryFile() as log:
        child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)
        try:
            yield child
        except BaseException:
            log.seek(0)
            print(f"{command[1:4]} log:\n{log.read().decode(errors='replace')[-3000:]}", file=sys.stderr)
            raise
        finally:
            stop_child(child, grace_seconds=10)


@contextmanager
def upstream_and_gateway() -> Iterator[Gateway]:
    """The upstream stand-in and one standalone gateway in front of it, on free loopback ports."""
    upstream_port, gateway_port, metrics_port = free_ports(3)
    upstream = [sys.executable, str(ROOT / "tests" / "gateway_upstream.py"), "--port", str(upstream_port)]
    gateway = [
        sys.executable, "-m", "goodput.operator.cli", "gateway",
        "--modelgroup", str(SAMPLES / "modelgroup-llama-8b-tp1.yaml"),
        "--policy", str(SAMPLES / "slopolicy-interactive.yaml"),
        "--upstream", f"g1=http://127.0.0.1:{upstream_port}",
        "--listen-host", "127.0.0.1", "--listen-port", str(gateway_port),
        "--metrics-port", str(metrics_port),
    ]  # fmt: skip
    with process(upstream), process(gateway) as child:
        yield Gateway(
            f"http://127.0.0.1:{gateway_port}/v1/completions",
            "127.0.0.1",
            gateway_port,
            f"http://127.0.0.1:{metrics_port}/metrics",
            child.pid,
        )


def raise_open_file_limit(wanted: int) -> int:
    """Both this client and the gateway (a child, which inherits it) hold one descriptor per
    connection; the usual soft limit of 1,024 is too few for 1,000 connections."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident memory since it started (VmHWM), from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for pid {pid}")


def cpu_seconds(pid: int) -> float:
    """The process's user and system CPU time so far, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def gateway_counters(metrics_url: str) -> dict[str, float]:
    """The gateway's closed-connection and refused-body counters, by reason."""
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    wanted = ("goodput_gateway_connections_closed_total{", "goodput_gateway_bodies_refused_total{")
    counters = {}
    for line in text.splitlines():
        if line.startswith(wanted):
            name, value = line.rsplit(" ", 1)
            counters[name] = float(value)
    return counters


async def wait_ready(session: aiohttp.ClientSession, url: str, attempts: int = 600) -> None:
    for _ in range(attempts):
        try:
            async with session.post(url, json=BODY) as response:
                if response.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} never answered")


async def sequential_latencies(session: aiohttp.ClientSession, url: str, seconds: float) -> np.ndarray:
    """One well-behaved client: small completions one at a time for `seconds`; each one's latency."""
    latencies = []
    statuses: Counter[int] = Counter()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        started = time.perf_counter()
        async with session.post(url, json=BODY) as response:
            await response.read()
            statuses[response.status] += 1
        latencies.append(time.perf_counter() - started)
    if set(statuses) != {200}:
        print(f"  well-behaved answers by status: {dict(statuses)}")
    return np.array(latencies)


# --- hostile connections ----------------------------------------------------------------------------


@dataclass
class HostileStats:
    open: Counter[str] = field(default_factory=Counter)
    opened: Counter[str] = field(default_factory=Counter)
    closed_by_gateway: Counter[str] = field(default_factory=Counter)
    failed_opens: int = 0


async def read_until_closed(reader: asyncio.StreamReader) -> None:
    """Read and drop whatever the gateway sends (an answer to an oversized body) until it closes."""
    try:
        while await reader.read(65536):
            pass
    except ConnectionError:
        pass


async def hold(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    stop: asyncio.Event,
    drip: bytes | None,
    interval_seconds: float = 1.0,
) -> bool:
    """Keep the connection, writing `drip` every interval; True when the gateway closed it."""
    closed = asyncio.ensure_future(read_until_closed(reader))
    try:
        while not closed.done() and not stop.is_set():
            if drip is not None and not writer.is_closing():
                writer.write(drip)
            await asyncio.wait([closed], timeout=interval_seconds)
        return closed.done()
    finally:
        closed.cancel()


def opening_bytes(kind: str, host: str) -> bytes:
    """What each kind sends when it opens: a partial head, a head and a partial body, or a request."""
    if kind == "slow head":
        return f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\n".encode()
    if kind == "slow body":
        return f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Length: 1000000\r\n\r\n".encode()
    if kind == "idle kept-alive":
        return f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
    declared = 42 * MIB
    return (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {declared}\r\n\r\n"
    ).encode() + b" " * MIB


DRIPS: dict[str, bytes | None] = {
    "slow head": b"X-Slow: 1\r\n",
    "slow body": b"x",
    "idle kept-alive": None,
    "oversized body": None,
}


async def hostile(kind: str, source: str, port: int, stop: asyncio.Event, stats: HostileStats) -> None:
    """One hostile connection of `kind`, from `source`, reopened whenever the gateway closes it."""
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
        except OSError:
            stats.failed_opens += 1
            await asyncio.sleep(1.0)
            continue
        stats.open[kind] += 1
        stats.opened[kind] += 1
        try:
            writer.write(opening_bytes(kind, "127.0.0.1"))
            if await hold(reader, writer, stop, DRIPS[kind]):
                stats.closed_by_gateway[kind] += 1
        except ConnectionError:
            stats.closed_by_gateway[kind] += 1
        finally:
            stats.open[kind] -= 1
            writer.close()


async def hostile_worker(port: int, count: int, kinds: list[str]) -> None:
    """The hostile connections, in a process of their own (`--hostile-worker`), so that the
    well-behaved client's latency is the gateway's and not this client's own event loop's: prints
    `ready N` once they are open, holds them until its stdin closes, then prints what they saw. It
    runs at the lowest priority: an attacker does not share the gateway's cores, and here the two
    clients, the upstream and the gateway share two."""
    os.nice(19)
    stats = HostileStats()
    stop = asyncio.Event()
    sources = itertools.cycle(HOSTILE_SOURCES)
    tasks = [
        asyncio.create_task(hostile(kinds[index % len(kinds)], next(sources), port, stop, stats))
        for index in range(count)
    ]
    deadline = time.monotonic() + 30
    while sum(stats.open.values()) < count and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    print(f"ready {sum(stats.open.values())}", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    summary = {
        "open at the end": dict(stats.open),
        "opened": dict(stats.opened),
        "closed by the gateway": dict(stats.closed_by_gateway),
        "failed opens": stats.failed_opens,
    }
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    print(json.dumps(summary), flush=True)


async def with_hostile_connections(
    gateway: Gateway, count: int, kinds: str, measure: Callable[[], Awaitable[np.ndarray]]
) -> np.ndarray:
    """Run `measure` while `count` hostile connections are held open by a worker process."""
    worker = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--hostile-worker", str(gateway.port), "--hostile", str(count),
        "--kinds", kinds,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert worker.stdin is not None and worker.stdout is not None
    ready = (await worker.stdout.readline()).decode().split()
    print(f"  {ready[-1] if ready else 0} hostile connections open; measuring")
    try:
        return await measure()
    finally:
        worker.stdin.close()
        summary = json.loads(await worker.stdout.readline() or b"{}")
        await worker.wait()
        for name, value in summary.items():
            print(f"  hostile connections, {name}: {value}")


# --- large bodies -----------------------------------------------------------------------------------


async def post_at_once(url: str, body: bytes, count: int) -> Counter[int | str]:
    """`count` copies of `body` posted at once, each on its own connection: the answers by status."""
    statuses: Counter[int | str] = Counter()
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one() -> None:
            try:
                async with session.post(url, data=body, headers=headers) as response:
                    await response.read()
                    statuses[response.status] += 1
            except aiohttp.ClientError as error:
                statuses[type(error).__name__] += 1

        await asyncio.gather(*(one() for _ in range(count)))
    return statuses


async def large_bodies(gateway: Gateway, count: int) -> None:
    """10 bodies of 42 MiB sent whole at once, then `count` valid 14 MiB bodies at once: the answers
    by status and the gateway's peak RSS after each."""
    bare = json.dumps({**BODY, "prompt": ""})
    within = json.dumps({**BODY, "prompt": "x" * (14 * MIB - len(bare))}).encode()
    for label, body, concurrent in (("42 MiB", b" " * (42 * MIB), 10), ("14 MiB", within, count)):
        statuses = await post_at_once(gateway.url, body, concurrent)
        print(
            f"  {concurrent} concurrent {label} bodies: answers {dict(statuses)}; gateway peak RSS "
            f"{peak_rss_mib(gateway.pid):.1f} MiB"
        )


def percentiles(latencies: np.ndarray) -> tuple[float, float]:
    p50, p99 = np.percentile(latencies, [50, 99]) * 1000
    return float(p50), float(p99)


async def measure(args: argparse.Namespace, gateway: Gateway) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await wait_ready(session, gateway.url)
        await sequential_latencies(session, gateway.url, 2.0)  # warm
        print(f"gateway peak RSS after start: {peak_rss_mib(gateway.pid):.1f} MiB")
        cpu = cpu_seconds(gateway.pid)
        quiet = await sequential_latencies(session, gateway.url, args.phase_seconds)
        q50, q99 = percentiles(quiet)
        print(f"quiet: {len(quiet)} requests, one at a time: p50 {q50:.2f} ms  p99 {q99:.2f} ms")
        print(f"  gateway CPU: {cpu_seconds(gateway.pid) - cpu:.1f} s")
        sources = len(HOSTILE_SOURCES)
        print(f"hostile: {args.hostile} connections ({args.kinds}) from {sources} loopback addresses")
        cpu = cpu_seconds(gateway.pid)
        loud = await with_hostile_connections(
            gateway,
            args.hostile,
            args.kinds,
            lambda: sequential_latencies(session, gateway.url, args.phase_seconds),
        )
        print(f"  gateway CPU, from the hostile connections' opening: {cpu_seconds(gateway.pid) - cpu:.1f} s")
        h50, h99 = percentiles(loud)
        print(f"  {len(loud)} requests, one at a time: p50 {h50:.2f} ms  p99 {h99:.2f} ms")
        print(f"  added by the hostile connections: p50 {h50 - q50:.2f} ms  p99 {h99 - q99:.2f} ms")
        print(f"  gateway peak RSS so far: {peak_rss_mib(gateway.pid):.1f} MiB")
        for name, value in gateway_counters(gateway.metrics_url).items():
            print(f"  {name} {value:g}")
    print("large bodies:")
    await large_bodies(gateway, args.large_bodies)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hostile", type=int, default=1000)
    parser.add_argument("--phase-seconds", type=float, default=40.0)
    parser.add_argument("--large-bodies", type=int, default=30)
    parser.add_argument(
        "--kinds", default=",".join(KINDS), help=f"hostile kinds, shared out in turn (default: all, {KINDS})"
    )
    parser.add_argument("--hostile-worker", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if unknown := set(args.kinds.split(",")) - set(KINDS):
        parser.error(f"unknown kinds {sorted(unknown)}: the kinds are {KINDS}")
    limit = raise_open_file_limit(4 * args.hostile + 1024)
    if args.hostile_worker:
        asyncio.run(hostile_worker(args.hostile_worker, args.hostile, args.kinds.split(",")))
        return
    print(f"open-file limit: {limit}")
    with upstream_and_gateway() as gateway:
        asyncio.run(measure(args, gateway))


if __name__ == "__main__":
    main()
