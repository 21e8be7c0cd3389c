"""How often a request for a LoRA adapter reaches a group that already holds it: 50 adapters over 4
groups, at most 8 loaded per group, Zipf-distributed requests.

Run: .venv/bin/python bench/bench_lora_routing.py [--requests 20000] [--zipf 1.1] [--seed 7]
     .venv/bin/python bench/bench_lora_routing.py --through-gateway [--requests 2000] [--concurrency 64]

This runs the routing rule (`controllers.requests.adapters.choose_adapter_group`) on a simulated
clock, not the gateway or the network: requests arrive as a Poisson stream at `--load` of the
groups' pooled capacity, each holds its group's seat for an exponential service time, a load takes
`--load-seconds` and keeps the adapter busy (not evictable) until it ends, and each group's
predicted wait is its work in flight over its capacity, as the gateway's books give it. Adapter
popularity is Zipf with exponent `--zipf` over the adapters in a seeded random order. Prints the
fraction routed to a holder (the goal is at least 0.90), loads, evictions and how many requests
waited for a seat or an idle adapter slot (a waiting request does not hold up the ones behind it
here: each is retried whenever a request finishes); asserts nothing.

With `--through-gateway` the same workload (fewer requests, a fixed number in flight at a time)
goes through the real gateway on 127.0.0.1 to 4 emulated vLLM servers with LoRA on (one per group,
the emulator's load time `--load-seconds`), and the figures are the gateway's own counters
(`goodput_gateway_adapter_routes_total`, `..._adapter_loads_total`) and the engines' load counts.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import random
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field, replace
from pathlib import Path

import aiohttp
import yaml

from goodput.api.modelgroup import ModelGroup
from goodput.api.slopolicy import SloPolicy
from goodput.controllers.compile.request_path import RequestPathPolicy, compile_request_path
from goodput.controllers.requests.adapters import (
    AdapterPlacement,
    AdapterPolicy,
    AdapterRoute,
    GroupAdapters,
    choose_adapter_group,
    decayed_uses,
)
from goodput.controllers.requests.admission import GroupLoad
from goodput.controllers.requests.routing import Candidate, RouteRequest
from goodput.estimators.service_time import H100_80G, LLAMA_3_1_8B
from goodput.gateway.connections import start_serving
from goodput.gateway.front import GatewayFront
from goodput.gateway.groups import GroupEndpoint, StaticGroupSource
from goodput.gateway.server import Gateway
from goodput.simulator.engine import EngineConfig
from goodput.testbed.emulator_engine import ServingProfile
from goodput.testbed.emulator_netns import bind_listener
from goodput.testbed.emulator_server import ServerIdentity, VllmServer

SEATS_PER_GROUP = 64
CAPACITY_WORK_SECONDS_PER_SECOND = 16.0
MEAN_WORK_SECONDS = 2.0


@dataclass
class SimGroup:
    loaded: OrderedDict[str, None] = field(default_factory=OrderedDict)
    in_use: Counter[str] = field(default_factory=Counter)
    last_used: dict[str, float] = field(default_factory=dict)
    uses: dict[str, float] = field(default_factory=dict)
    in_flight: int = 0
    work_seconds: float = 0.0

    def view(self, now: float, half_life_seconds: float) -> GroupAdapters:
        busy = frozenset(a for a, n in self.in_use.items() if n > 0)
        recent = {
            a: decayed_uses(n, now - self.last_used[a], half_life_seconds) for a, n in self.uses.items()
        }
        return GroupAdapters(tuple(self.loaded), busy, last_used=dict(self.last_used), recent_uses=recent)

    def candidate(self, name: str) -> Candidate:
        load = GroupLoad(
            name=name,
            ready=True,
            draining=False,
            waiting_work_seconds=self.work_seconds,
            running_work_seconds=0.0,
            kv_capacity_tokens=1_000_000,
            kv_free_tokens=1_000_000,
            capacity_work_seconds_per_second=CAPACITY_WORK_SECONDS_PER_SECOND,
        )
        return Candidate(load, SEATS_PER_GROUP - self.in_flight)


def zipf_weights(count: int, exponent: float) -> list[float]:
    return [1.0 / (rank**exponent) for rank in range(1, count + 1)]


@dataclass
class Bench:
    """The simulated groups, the requests in flight (a heap by finish time) and the tally."""

    args: argparse.Namespace
    policy: AdapterPolicy
    rng: random.Random
    groups: dict[str, SimGroup]
    finishing: list[tuple[float, int, str, str, float]] = field(default_factory=list)
    waiting: deque[str] = field(default_factory=deque)
    tally: Counter[str] = field(default_factory=Counter)
    sent: int = 0

    def finish_until(self, now: float) -> None:
        """Requests done by `now` leave their groups; requests waiting get the seats, in order."""
        while self.finishing and self.finishing[0][0] <= now:
            _, _, name, adapter, work = heapq.heappop(self.finishing)
            group = self.groups[name]
            group.in_use[adapter] -= 1
            group.in_flight -= 1
            group.work_seconds = max(0.0, group.work_seconds - work)
            self.waiting = deque(adapter for adapter in self.waiting if not self.route(adapter, now))

    def route(self, adapter: str, now: float) -> bool:
        """Route one request as the gateway's pump does; False when it must wait."""
        half_life = self.policy.use_half_life_seconds
        holdings = {name: group.view(now, half_life) for name, group in self.groups.items()}
        candidates = [group.candidate(name) for name, group in self.groups.items()]
        request = RouteRequest(wait_budget_seconds=self.args.budget_seconds, kv_need_tokens=1000)
        route = choose_adapter_group(candidates, holdings, adapter, request, policy=self.policy, now=now)
        if not isinstance(route, AdapterRoute):
            return False
        group = self.groups[route.group]
        self.tally[route.placement.value] += 1
        before = group.uses.get(adapter, 0.0)
        elapsed = now - group.last_used.get(adapter, now)
        group.uses[adapter] = decayed_uses(before, elapsed, half_life) + 1.0
        group.last_used[adapter] = now
        if route.evict is not None:
            group.loaded.pop(route.evict)
            group.last_used.pop(route.evict, None)
            group.uses.pop(route.evict, None)
            self.tally["evictions"] += 1
        if route.placement is not AdapterPlacement.HELD:
            self.tally["loads"] += 1
        group.loaded[adapter] = None
        group.loaded.move_to_end(adapter)
        work = self.rng.expovariate(1.0 / MEAN_WORK_SECONDS)
        load_delay = 0.0 if route.placement is AdapterPlacement.HELD else self.args.load_seconds
        service = load_delay + work / (CAPACITY_WORK_SECONDS_PER_SECOND / SEATS_PER_GROUP)
        group.in_use[adapter] += 1
        group.in_flight += 1
        group.work_seconds += work
        self.sent += 1
        heapq.heappush(self.finishing, (now + service, self.sent, route.group, adapter, work))
        return True


def simulate(args: argparse.Namespace) -> Counter[str]:
    rng = random.Random(args.seed)
    adapters = [f"adapter-{i:02d}" for i in range(args.adapters)]
    rng.shuffle(adapters)  # popularity is not the name order
    weights = zipf_weights(len(adapters), args.zipf)
    policy = AdapterPolicy(
        sources={name: f"/adapters/{name}" for name in adapters},
        max_loaded_per_group=args.max_loaded,
        load_seconds=args.load_seconds,
    )
    bench = Bench(args, policy, rng, {f"g{i}": SimGroup() for i in range(args.groups)})
    rate = args.load * CAPACITY_WORK_SECONDS_PER_SECOND * args.groups / MEAN_WORK_SECONDS  # per second
    now = 0.0
    for _ in range(args.requests):
        now += rng.expovariate(rate)
        bench.finish_until(now)
        adapter = rng.choices(adapters, weights)[0]
        if not bench.route(adapter, now):
            bench.waiting.append(adapter)
            bench.tally["waited"] += 1
    bench.finish_until(float("inf"))
    return bench.tally


SAMPLES = Path(__file__).resolve().parents[1] / "manifests" / "samples"


def gateway_policy(args: argparse.Namespace, adapters: list[str]) -> RequestPathPolicy:
    """The sample ModelGroup and SLOPolicy with the bench's adapters and limits."""
    group = yaml.safe_load((SAMPLES / "modelgroup-llama-8b-tp1.yaml").read_text())
    group["metadata"]["name"] = "chat"
    group["spec"]["model"]["servedName"] = "llama"
    group["spec"]["adapters"] = [{"name": name, "source": f"/adapters/{name}"} for name in adapters]
    group["spec"]["adapterLimits"] = {"maxLoadedPerGroup": args.max_loaded}
    slo = yaml.safe_load((SAMPLES / "slopolicy-interactive.yaml").read_text())
    slo["spec"]["admission"] = {"maxDeferSeconds": 30.0}
    policy = compile_request_path(ModelGroup.model_validate(group), SloPolicy.model_validate(slo))
    if isinstance(policy, str):
        raise SystemExit(f"the sample ModelGroup does not compile: {policy}")
    return replace(policy, adapters=replace(policy.adapters, load_seconds=args.load_seconds))


async def through_gateway(args: argparse.Namespace) -> tuple[Counter[str], Counter[int], int]:
    """The workload through the real gateway to emulated engines; the gateway's counters, the
    answers' statuses, and the engines' loads."""
    rng = random.Random(args.seed)
    adapters = [f"adapter-{i:02d}" for i in range(args.adapters)]
    rng.shuffle(adapters)
    weights = zipf_weights(len(adapters), args.zipf)
    policy = gateway_policy(args, adapters)
    profile = ServingProfile(
        EngineConfig.for_hardware(LLAMA_3_1_8B, H100_80G),
        "llama",
        max_loras=args.max_loaded,
        lora_load_seconds=args.load_seconds,
    )
    servers = [VllmServer(profile, ServerIdentity("m", "llama")) for _ in range(args.groups)]
    endpoints = []
    for index, server in enumerate(servers):
        await server.listen(bind_listener("127.0.0.1", 0))
        assert server.address is not None
        endpoints.append(GroupEndpoint(f"g{index}", f"http://127.0.0.1:{server.address[1]}", True, False))
    front = GatewayFront()
    front.serve(Gateway(policy, StaticGroupSource(endpoints), metrics=front.metrics))
    runner = await start_serving(front.app(), "127.0.0.1", 0, front.limits, front.count_connection_closed)
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1/completions"
    statuses: Counter[int] = Counter()
    plan = iter(rng.choices(adapters, weights, k=args.requests))

    async def client(session: aiohttp.ClientSession) -> None:
        for adapter in plan:
            body = {"model": adapter, "prompt": "Hello there", "max_tokens": args.output_tokens}
            async with session.post(url, json=body) as response:
                await response.read()
                statuses[response.status] += 1

    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            await asyncio.gather(*(client(session) for _ in range(args.concurrency)))
    finally:
        await runner.cleanup()
        for server in servers:
            await server.close()
    tally: Counter[str] = Counter()
    for metric in front.metrics.registry.collect():
        for sample in metric.samples:
            if sample.name == "goodput_gateway_adapter_routes_total":
                tally[sample.labels["placement"]] += int(sample.value)
    return tally, statuses, sum(server.adapter_loads for server in servers)


def report_gateway(args: argparse.Namespace) -> None:
    tally, statuses, engine_loads = asyncio.run(through_gateway(args))
    held = tally[AdapterPlacement.HELD.value]
    routed = sum(tally.values())
    print(
        f"through the gateway to {args.groups} emulated engines: {args.requests} requests, "
        f"{args.concurrency} in flight, {args.adapters} adapters, at most {args.max_loaded} loaded per "
        f"group, Zipf exponent {args.zipf}, seed {args.seed}, load time {args.load_seconds}s"
    )
    print(f"routed to a group already holding the adapter: {held / routed:.3f} ({held} of {routed})")
    print(
        f"loads (gateway): {routed - held}, of them after an eviction: "
        f"{tally[AdapterPlacement.EVICTED.value]}; loads the engines served: {engine_loads}; "
        f"answers by status: {dict(sorted(statuses.items()))}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--adapters", type=int, default=50)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--max-loaded", type=int, default=8)
    parser.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent of adapter popularity")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--load", type=float, default=0.7, help="offered work over pooled capacity")
    parser.add_argument("--load-seconds", type=float, default=0.5)
    parser.add_argument("--budget-seconds", type=float, default=1.0, help="the request's wait budget")
    parser.add_argument("--through-gateway", action="store_true", help="the real gateway and emulators")
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight (gateway mode)")
    parser.add_argument("--output-tokens", type=int, default=16, help="tokens per answer (gateway mode)")
    args = parser.parse_args()
    if args.through_gateway:
        report_gateway(args)
        return
    tally = simulate(args)
    held = tally[AdapterPlacement.HELD.value]
    routed = held + tally["loads"]
    print(
        f"routing rule on a simulated clock: {args.requests} requests, {args.adapters} adapters, "
        f"{args.groups} groups, at most {args.max_loaded} loaded per group, Zipf exponent {args.zipf}, "
        f"seed {args.seed}, load {args.load:.0%} of capacity"
    )
    print(f"routed to a group already holding the adapter: {held / routed:.3f} ({held} of {routed})")
    print(
        f"loads: {tally['loads']} (into a free slot {tally[AdapterPlacement.LOADED.value]}), "
        f"evictions: {tally['evictions']}, waited for a seat or an idle adapter slot: {tally['waited']}"
    )


if __name__ == "__main__":
    main()
