"""The endpoint picker's own cost: how long a pick takes and how many requests it carries a second.

Run: .venv/bin/python bench/bench_endpoint_picker.py [--requests 2000] [--exchanges 5000]
     [--concurrency 32] [--groups 4]

One process on this machine: the picker's gRPC service (`goodput gateway endpoint-picker`'s, on
127.0.0.1) in front of the sample ModelGroup and SLOPolicy with `--groups` Ready groups (endpoints
only: the picker never calls an engine, the proxy does), and a client built from Envoy's published
ext-proc definitions that plays the proxy, one stream per request: the request's headers and
body, the pick, then the answer's headers and a whole non-streamed body with its usage, which
settle the request. `maxNumSeqs` is raised so no request waits for a slot: the figures are the
picker's cost, not queueing. Three figures:

1. the decision alone: `Gateway.place` (admission, fair queue, routing) called in-process, p50/p99;
2. a pick over gRPC: from the body sent to the pick read, one request at a time, p50/p99 (the
   decision, the protocol's encoding and the loopback);
3. whole exchanges (pick and the answer's settling, 4 messages each way) per second from
   `--concurrency` concurrent streams, and the process's CPU time per exchange (a figure the
   other work on the cores disturbs less than the wall clock).

The client and the service share one event loop and the machine's cores, so 2 and 3 include the
client's own cost: they bound the picker's from above. Nothing is asserted; the figures are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import numpy as np
import yaml
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc

from goodput.api.modelgroup import ModelGroup
from goodput.api.slopolicy import SloPolicy
from goodput.controllers.compile.request_path import RequestPathPolicy, compile_request_path
from goodput.gateway.endpoint_picker import PoolState
from goodput.gateway.endpoint_picker_cli import serve_picker
from goodput.gateway.groups import GroupEndpoint, StaticGroupSource
from goodput.gateway.requests import parse_request
from goodput.gateway.server import Admitted, Gateway

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "manifests" / "samples"
BODY = json.dumps({"model": "llama-8b", "prompt": "Hello, my name is", "max_tokens": 16}).encode()
ANSWER = json.dumps({"usage": {"prompt_tokens": 5, "completion_tokens": 16}}).encode()


def sample_policy() -> RequestPathPolicy:
    group = yaml.safe_load((SAMPLES / "modelgroup-llama-8b-tp1.yaml").read_text())
    group["spec"]["profile"]["maxNumSeqs"] = 4096
    slo = yaml.safe_load((SAMPLES / "slopolicy-interactive.yaml").read_text())
    policy = compile_request_path(ModelGroup.model_validate(group), SloPolicy.model_validate(slo))
    assert isinstance(policy, RequestPathPolicy), policy
    return policy


def headers(pairs: list[tuple[str, str]]) -> ext_proc.HttpHeaders:
    return ext_proc.HttpHeaders(
        headers=base_pb2.HeaderMap(
            headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs]
        )
    )


REQUEST_HEADERS = ext_proc.ProcessingRequest(
    request_headers=headers([(":method", "POST"), (":path", "/v1/completions"), ("x-goodput-tenant", "a")])
)
REQUEST_BODY = ext_proc.ProcessingRequest(request_body=ext_proc.HttpBody(body=BODY, end_of_stream=True))
RESPONSE_HEADERS = ext_proc.ProcessingRequest(response_headers=headers([(":status", "200")]))
RESPONSE_BODY = ext_proc.ProcessingRequest(response_body=ext_proc.HttpBody(body=ANSWER, end_of_stream=True))


async def exchange(stub: Any) -> float:
    """One request as the proxy carries it; the seconds from its body sent to the pick read."""
    call = stub.Process()
    await call.write(REQUEST_HEADERS)
    await call.read()
    started = time.perf_counter()
    await call.write(REQUEST_BODY)
    pick = await call.read()
    picked = time.perf_counter() - started
    assert pick.HasField("request_body"), pick
    await call.write(RESPONSE_HEADERS)
    await call.read()
    await call.write(RESPONSE_BODY)
    await call.read()
    await call.done_writing()
    return picked


def percentiles(seconds: list[float]) -> str:
    p50, p99 = np.percentile(np.array(seconds) * 1e3, [50, 99])
    return f"p50 {p50:.3f} ms, p99 {p99:.3f} ms"


async def decision_alone(gateway: Gateway, requests: int) -> list[float]:
    parsed = parse_request(BODY, "/v1/completions")
    timings = []
    for _ in range(requests):
        started = time.perf_counter()
        placed = await gateway.place(parsed, gateway.shape_of({}, parsed, gateway.clock()), None)
        timings.append(time.perf_counter() - started)
        assert isinstance(placed, Admitted) and placed.group is not None
        gateway.settle(placed, placed.group, 16, gateway.clock())
    return timings


async def run(args: argparse.Namespace) -> None:
    endpoints = [GroupEndpoint(f"g{i}", f"http://10.0.0.{i}:8000", True, False) for i in range(args.groups)]
    gateway = Gateway(sample_policy(), StaticGroupSource(endpoints))
    pool = PoolState(gateway=gateway, refusal=None)
    async with aiohttp.ClientSession() as session:
        gateway.start(session)
        await asyncio.sleep(0)  # the group source reports its groups
        alone = await decision_alone(gateway, args.requests)
        print(f"decision alone (Gateway.place), {args.requests} requests: {percentiles(alone)}")
        server, port = await serve_picker(pool, 0, host="127.0.0.1")
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = ext_proc_grpc.ExternalProcessorStub(channel)
                await exchange(stub)  # the channel connected
                one_by_one = [await exchange(stub) for _ in range(args.requests)]
                print(f"a pick over gRPC, one at a time, {args.requests} requests: {percentiles(one_by_one)}")
                remaining = args.exchanges

                async def worker() -> None:
                    nonlocal remaining
                    while remaining > 0:
                        remaining -= 1
                        await exchange(stub)

                started, cpu = time.perf_counter(), time.process_time()
                await asyncio.gather(*(worker() for _ in range(args.concurrency)))
                elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
                print(
                    f"whole exchanges, {args.concurrency} concurrent streams: {args.exchanges} in "
                    f"{elapsed:.2f} s, {args.exchanges / elapsed:.0f} requests/s; CPU time "
                    f"{cpu / args.exchanges * 1e3:.3f} ms a request (picker and client together)"
                )
        finally:
            await server.stop(grace=None)
            await gateway.stop()
    in_flight = sum(state.book.in_flight for state in gateway.groups.values())
    print(f"after the run: {in_flight} requests held on the groups, {len(gateway.queue)} queued")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--exchanges", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--groups", type=int, default=4)
    args = parser.parse_args()
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
