"""The gateway's own cost: added latency per request and streaming requests per second, live.

Run: .venv/bin/python bench/bench_gateway_latency.py [--requests 2000] [--stream-requests 5000]
     [--queue-requests 20000] [--queue-tenants 2,100,1000]
     [--soak-requests 50000] [--model-groups 20]

Three processes on this machine: a vLLM-like upstream that answers at once (tests/gateway_upstream.py,
16 tokens, no delay), one `goodput gateway` process in front of it (standalone mode, the sample
ModelGroup and SLOPolicy), and this client. Added latency: the same small non-streamed completion
sent one at a time straight to the upstream and through the gateway; the figures are each path's
p50/p99 and their difference. Throughput: streamed completions through the gateway from
`--concurrency` concurrent clients. Both are measured twice in the same run, the same way: with the
gateway serving one ModelGroup, then `--model-groups` ModelGroups (each its own served model, SLO
classes, queue and group; every group's leader is the same upstream stand-in), the requests spread
over the models in turn. Memory: `--soak-requests` requests from as many distinct
tenants, sessions and idempotency keys, the gateway's RSS read as they pass; it grows until the
gateway's bounded tables are full (100,000 sessions, 100,000 idempotency keys, 10,000 kept answers
and retry budgets), then holds. All three share the machine's cores, so the throughput is a
floor for the gateway alone: the bench prints each process's CPU time a request (gateway, upstream
stand-in, client) and the rate the three could reach together on the machine's cores. In-process,
before the live part: the deadline gate's prediction of a
newcomer's place in the fair order (`FairQueue.expected_work_ahead_seconds`) against a queue of
`--queue-requests` waiting requests spread over each of `--queue-tenants` tenant counts, the cost a
request adds when the queue is long (the live part's queue is empty). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import aiohttp
import numpy as np
import yaml

from goodput.controllers.requests.fairness import FairnessPolicy, FairQueue, QueuedItem
from goodput.testbed.cluster.controlplane import free_port
from goodput.testbed.cluster.processes import stop_child

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "manifests" / "samples"
MODEL = "llama-8b"
BODY = {"model": MODEL, "prompt": "Hello, my name is", "max_tokens": 16}


@contextmanager
def process(command: list[str]) -> Iterator[subprocess.Popen[bytes]]:
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        yield child
    finally:
        stop_child(child, grace_seconds=10)


def served_models(count: int) -> list[str]:
    """The model names of `count` ModelGroups; one ModelGroup keeps the sample's name."""
    return [MODEL] if count == 1 else [f"model-{index:02d}" for index in range(count)]


def write_model_groups(directory: Path, count: int) -> Path:
    """`count` copies of the sample ModelGroup in one file, each named and serving its own model."""
    sample = yaml.safe_load((SAMPLES / "modelgroup-llama-8b-tp1.yaml").read_text())
    documents = []
    for model in served_models(count):
        document = copy.deepcopy(sample)
        document["metadata"]["name"] = model
        document["spec"]["model"]["servedName"] = model
        documents.append(document)
    path = directory / f"modelgroups-{count}.yaml"
    path.write_text(yaml.safe_dump_all(documents))
    return path


@contextmanager
def gateway_process(upstream_url: str, model_groups: int) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """One standalone `goodput gateway` serving `model_groups` ModelGroups (the sample's, renamed,
    under the sample SLOPolicy), each with one group led by the upstream: its URL and process."""
    port = free_port()
    with tempfile.TemporaryDirectory() as directory:
        models = served_models(model_groups)
        gateway = [
            sys.executable, "-m", "goodput.operator.cli", "gateway",
            "--modelgroup", str(write_model_groups(Path(directory), model_groups)),
            "--policy", str(SAMPLES / "slopolicy-interactive.yaml"),
            *(f"--upstream={model}/g1={upstream_url}" for model in models),
            "--listen-host", "127.0.0.1", "--listen-port", str(port), "--metrics-port", "0",
        ]  # fmt: skip
        with process(gateway) as child:
            yield f"http://127.0.0.1:{port}", child


@contextmanager
def upstream_process() -> Iterator[tuple[str, int]]:
    """The upstream stand-in on a free loopback port: its base URL and process id."""
    port = free_port()
    command = [sys.executable, str(ROOT / "tests" / "gateway_upstream.py"), "--port", str(port)]
    with process(command) as child:
        yield f"http://127.0.0.1:{port}", child.pid


@contextmanager
def upstream() -> Iterator[str]:
    """The upstream stand-in on a free loopback port: its base URL."""
    with upstream_process() as (url, _):
        yield url


@contextmanager
def upstream_and_gateway() -> Iterator[tuple[str, str, subprocess.Popen[bytes]]]:
    """The upstream stand-in and one standalone gateway serving the sample ModelGroup in front of it:
    their base URLs and the gateway's process."""
    with upstream() as upstream_url, gateway_process(upstream_url, 1) as (gateway_url, child):
        yield upstream_url, gateway_url, child


def prediction_cost(queue_requests: int, tenants: int, calls: int = 2000) -> None:
    """p50 and p99 of one prediction against a long queue, with a hot tenant holding half of it."""
    rng = np.random.default_rng(1)
    queue: FairQueue[int] = FairQueue(FairnessPolicy())
    names = [f"tenant-{index}" for index in range(tenants)]
    for index in range(queue_requests):
        tenant = names[0] if index % 2 == 0 or tenants == 1 else names[int(rng.integers(1, tenants))]
        prompt, output = int(rng.integers(16, 4000)), int(rng.integers(2, 1000))
        arrival = index * 0.001
        queue.push(QueuedItem(tenant, int(rng.integers(0, 2)), arrival + 1.0, arrival, prompt, output, index,
                              work_seconds=(prompt + 20 * output) * 1e-4))  # fmt: skip
    now = queue_requests * 0.001
    timings = []
    for call in range(calls):
        tenant = names[call % tenants]
        started = time.perf_counter()
        queue.expected_work_ahead_seconds(tenant, call % 2, now, 5.0)
        timings.append(time.perf_counter() - started)
    p50, p99 = np.percentile(np.array(timings), [50, 99]) * 1e6
    print(
        f"  {queue_requests} waiting over {tenants:5d} tenants: p50 {p50:7.1f} us  p99 {p99:7.1f} us "
        "per prediction"
    )


async def wait_ready(
    session: aiohttp.ClientSession, url: str, model: str = MODEL, attempts: int = 300
) -> None:
    for _ in range(attempts):
        try:
            async with session.post(url, json={**BODY, "model": model}) as response:
                if response.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} never answered")


async def sequential_latencies(
    session: aiohttp.ClientSession, url: str, count: int, models: Sequence[str] = (MODEL,)
) -> np.ndarray:
    latencies = []
    for index in range(count):
        body = {**BODY, "model": models[index % len(models)]}
        started = time.perf_counter()
        async with session.post(url, json=body) as response:
            await response.read()
            assert response.status == 200, response.status
        latencies.append(time.perf_counter() - started)
    return np.array(latencies)


async def stream_throughput(
    session: aiohttp.ClientSession,
    url: str,
    total: int,
    concurrency: int,
    models: Sequence[str] = (MODEL,),
) -> float:
    remaining = total
    failures = 0

    async def worker() -> None:
        nonlocal remaining, failures
        while remaining > 0:
            remaining -= 1
            body = {**BODY, "stream": True, "model": models[remaining % len(models)]}
            async with session.post(url, json=body) as response:
                await response.read()
                failures += response.status != 200

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    if failures:
        print(f"  {failures} streamed requests failed")
    return total / elapsed


def cpu_seconds(pid: int) -> float:
    """A process's CPU time so far (user and system), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    """A process's resident memory, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


async def soak(session: aiohttp.ClientSession, url: str, total: int, concurrency: int, pid: int) -> None:
    """Requests that each leave something behind (a new tenant, session and idempotency key, the
    answer kept for replay), with the gateway's memory read at every fifth of the run: what the
    gateway keeps per client must stay bounded however many distinct clients pass."""
    sent = 0
    checkpoints = {total * step // 5 for step in range(1, 6)}
    readings = [f"{rss_mib(pid):.1f}"]
    statuses: dict[int, int] = {}

    async def worker() -> None:
        nonlocal sent
        while sent < total:
            sent += 1
            index = sent
            headers = {
                "X-Goodput-Tenant": f"tenant-{index}",
                "X-Goodput-Session": f"session-{index}",
                "Idempotency-Key": f"key-{index}",
            }
            async with session.post(url, json=BODY, headers=headers) as response:
                await response.read()
                statuses[response.status] = statuses.get(response.status, 0) + 1
            if index in checkpoints:
                readings.append(f"{rss_mib(pid):.1f}")

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    print(f"{total} requests, each from a new tenant, session and idempotency key ({elapsed:.0f} s):")
    print(f"  gateway RSS MiB at start and after each fifth: {' -> '.join(readings)}")
    print(f"  answers by status: {dict(sorted(statuses.items()))}")


async def measure_path(
    session: aiohttp.ClientSession,
    args: argparse.Namespace,
    upstream_url: str,
    gateway_url: str,
    *,
    count: int,
    pid: int,
) -> None:
    """Added latency and streamed requests/s through a gateway serving `count` ModelGroups, against
    the upstream measured just before it; and the gateway's CPU time per streamed request, which
    other work on the machine's cores does not inflate the way it does the wall-clock figures."""
    models = served_models(count)
    await wait_ready(session, gateway_url + "/v1/completions", models[0])
    for url in (upstream_url, gateway_url):  # warm both paths
        await sequential_latencies(session, url + "/v1/completions", 200, models)
    direct = await sequential_latencies(session, upstream_url + "/v1/completions", args.requests, models)
    routed = await sequential_latencies(session, gateway_url + "/v1/completions", args.requests, models)
    p_direct = np.percentile(direct, [50, 99]) * 1000
    p_routed = np.percentile(routed, [50, 99]) * 1000
    spread = f", spread over {count} models" if count > 1 else ""
    print(f"one gateway process serving {count} ModelGroup{'s' if count > 1 else ''}:")
    print(f"  non-streamed, one at a time, {args.requests} requests each{spread}:")
    print(f"    direct to upstream   p50 {p_direct[0]:.2f} ms  p99 {p_direct[1]:.2f} ms")
    print(f"    through the gateway  p50 {p_routed[0]:.2f} ms  p99 {p_routed[1]:.2f} ms")
    print(
        f"    added by the gateway p50 {p_routed[0] - p_direct[0]:.2f} ms  "
        f"p99 {p_routed[1] - p_direct[1]:.2f} ms"
    )
    cpu_before = cpu_seconds(pid), cpu_seconds(args.upstream_pid), time.process_time()
    rate = await stream_throughput(
        session, gateway_url + "/v1/completions", args.stream_requests, args.concurrency, models
    )
    cpu_after = cpu_seconds(pid), cpu_seconds(args.upstream_pid), time.process_time()
    cpu_per_request, upstream_cpu, client_cpu = (
        (after - before) / args.stream_requests for before, after in zip(cpu_before, cpu_after, strict=True)
    )
    print(
        f"  streamed, {args.concurrency} concurrent clients, {args.stream_requests} requests of 16 tokens"
        f"{spread}:"
    )
    print(f"    {rate:.0f} requests/s through one gateway process")
    print(
        f"    the gateway's CPU time: {cpu_per_request * 1000:.3f} ms a request, "
        f"{1 / cpu_per_request:.0f} requests per CPU-second"
    )
    together, cores = cpu_per_request + upstream_cpu + client_cpu, os.cpu_count() or 1
    print(
        f"    the upstream stand-in's CPU time: {upstream_cpu * 1000:.3f} ms a request, this client's "
        f"{client_cpu * 1000:.3f} ms: the three together {together * 1000:.3f} ms, so at most "
        f"{cores / together:.0f} requests/s on this machine's {cores} cores"
    )


async def measure(args: argparse.Namespace, upstream_url: str) -> None:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        await wait_ready(session, upstream_url + "/v1/completions")
        counts = [1] + ([args.model_groups] if args.model_groups > 1 else [])
        for count in counts:
            with gateway_process(upstream_url, count) as (gateway_url, child):
                try:
                    await measure_path(session, args, upstream_url, gateway_url, count=count, pid=child.pid)
                    if args.soak_requests and count == 1:
                        await soak(
                            session,
                            gateway_url + "/v1/completions",
                            args.soak_requests,
                            args.concurrency,
                            child.pid,
                        )
                except RuntimeError:
                    child.terminate()
                    print(child.communicate(timeout=10)[1].decode()[-2000:])
                    raise


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--stream-requests", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--queue-requests", type=int, default=20_000)
    parser.add_argument("--queue-tenants", default="2,100,1000")
    parser.add_argument("--soak-requests", type=int, default=50_000, help="0: no memory soak")
    parser.add_argument(
        "--model-groups",
        type=int,
        default=20,
        help="ModelGroups behind one gateway, beside one (1: only one)",
    )
    args = parser.parse_args()
    print("the deadline gate's place-in-the-fair-order prediction, in process:")
    for tenants in (int(count) for count in args.queue_tenants.split(",")):
        prediction_cost(args.queue_requests, tenants)
    with upstream_process() as (upstream_url, args.upstream_pid):
        asyncio.run(measure(args, upstream_url))


if __name__ == "__main__":
    main()
