"""The gateway's memory over an hour of a public trace, replayed live.

Run: .venv/bin/python bench/bench_gateway_replay.py [--trace ../shared/traces/AzureLLMInferenceTrace_conv.csv]
     [--speed 1] [--tenants 8] [--sessions 500] [--sample-seconds 300] [--limit N]

One upstream stand-in (tests/gateway_upstream.py: answers at once, 16 tokens) and one `goodput gateway`
process (standalone, the sample ModelGroup and SLOPolicy) on this machine. Every request of the trace
is sent, streamed, at its arrival time (divided by `--speed`), with a prompt of its ContextTokens
(at the gateway's 4 bytes per token), its GeneratedTokens as `max_tokens`, one of `--tenants`
tenants, one of `--sessions` sessions and an idempotency key of its own. Prints the gateway's RSS
every `--sample-seconds` of replay and at the end, and the answers by status. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

import aiohttp
from bench_gateway_latency import rss_mib, upstream_and_gateway, wait_ready

from goodput.simulator.workload import Workload, compress_time, load_trace

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv"


async def send(
    session: aiohttp.ClientSession, url: str, index: int, workload: Workload, args: argparse.Namespace
) -> int:
    body = {
        "model": "llama-8b",
        "prompt": "abcd" * int(workload.input_tokens[index]),
        "max_tokens": max(1, int(workload.output_tokens[index])),
        "stream": True,
    }
    headers = {
        "X-Goodput-Tenant": f"tenant-{index % args.tenants}",
        "X-Goodput-Session": f"session-{index % args.sessions}",
        "Idempotency-Key": f"key-{index}",
    }
    async with session.post(url, json=body, headers=headers) as response:
        await response.read()
        return response.status


async def replay(args: argparse.Namespace, workload: Workload, url: str, pid: int) -> None:
    statuses: dict[int, int] = {}
    in_flight: set[asyncio.Task[int]] = set()

    def done(task: asyncio.Task[int]) -> None:
        in_flight.discard(task)
        status = -1 if task.cancelled() or task.exception() is not None else task.result()
        statuses[status] = statuses.get(status, 0) + 1

    arrivals = workload.arrival_seconds.tolist()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await wait_ready(session, url)
        started = time.monotonic()
        next_sample = 0.0
        print(f"{'replay s':>9} {'sent':>7} {'in flight':>9} {'gateway RSS MiB':>16}", flush=True)
        for index, at in enumerate(arrivals):
            while at >= next_sample:
                print(f"{next_sample:9.0f} {index:7d} {len(in_flight):9d} {rss_mib(pid):16.1f}", flush=True)
                next_sample += args.sample_seconds
            delay = started + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(send(session, url, index, workload, args))
            in_flight.add(task)
            task.add_done_callback(done)
        if in_flight:
            await asyncio.wait(set(in_flight), timeout=60)
        elapsed = time.monotonic() - started
        print(f"{elapsed:9.0f} {len(arrivals):7d} {len(in_flight):9d} {rss_mib(pid):16.1f}  (end)")
    print(f"answers by status (-1: no answer): {dict(sorted(statuses.items()))}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--speed", type=float, default=1.0, help="replay this many times faster")
    parser.add_argument("--tenants", type=int, default=8)
    parser.add_argument("--sessions", type=int, default=500)
    parser.add_argument("--sample-seconds", type=float, default=300.0)
    parser.add_argument("--limit", type=int, help="only the first this many requests")
    args = parser.parse_args()
    workload = load_trace(str(args.trace), limit=args.limit)
    if args.speed != 1.0:
        workload = compress_time(workload, args.speed)
    span = workload.arrival_seconds[-1] - workload.arrival_seconds[0]
    print(f"{args.trace.name}: {len(workload.arrival_seconds)} requests over {span:.0f} s of replay")
    with upstream_and_gateway() as (_, gateway_url, gateway_process):
        asyncio.run(replay(args, workload, gateway_url + "/v1/completions", gateway_process.pid))


if __name__ == "__main__":
    main()
