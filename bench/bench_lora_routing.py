"""How often a request for a LoRA adapter reaches a group that already holds it: 50 adapters over 4
groups, at most 8 loaded per group, Zipf-distributed requests.

Run: .venv/bin/python bench/bench_lora_routing.py [--requests 20000] [--zipf 1.1] [--seed 7]

This runs the routing rule (`controllers.requests.adapters.choose_adapter_group`) on a simulated
clock, not the gateway or the network: requests arrive as a Poisson stream at `--load` of the
groups' pooled capacity, each holds its group's seat for an exponential service time, a load takes
`--load-seconds` and keeps the adapter busy (not evictable) until it ends, and each group's
predicted wait is its work in flight over its capacity, as the gateway's books give it. Adapter
popularity is Zipf with exponent `--zipf` over the adapters in a seeded random order. Prints the
fraction routed to a holder (the goal is at least 0.90), loads, evictions and how many requests
waited for a seat or an idle adapter slot (a waiting request does not hold up the ones behind it
here: each is retried whenever a request finishes); asserts nothing.
"""

from __future__ import annotations

import argparse
import heapq
import random
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field

from goodput.controllers.requests.adapters import (
    AdapterPlacement,
    AdapterPolicy,
    AdapterRoute,
    GroupAdapters,
    choose_adapter_group,
)
from goodput.controllers.requests.admission import GroupLoad
from goodput.controllers.requests.routing import Candidate, RouteRequest

SEATS_PER_GROUP = 64
CAPACITY_WORK_SECONDS_PER_SECOND = 16.0
MEAN_WORK_SECONDS = 2.0


@dataclass
class SimGroup:
    loaded: OrderedDict[str, None] = field(default_factory=OrderedDict)
    in_use: Counter[str] = field(default_factory=Counter)
    in_flight: int = 0
    work_seconds: float = 0.0

    def view(self) -> GroupAdapters:
        return GroupAdapters(tuple(self.loaded), frozenset(a for a, n in self.in_use.items() if n > 0))

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
        holdings = {name: group.view() for name, group in self.groups.items()}
        candidates = [group.candidate(name) for name, group in self.groups.items()]
        request = RouteRequest(wait_budget_seconds=self.args.budget_seconds, kv_need_tokens=1000)
        route = choose_adapter_group(candidates, holdings, adapter, request, policy=self.policy, now=now)
        if not isinstance(route, AdapterRoute):
            return False
        group = self.groups[route.group]
        self.tally[route.placement.value] += 1
        if route.evict is not None:
            group.loaded.pop(route.evict)
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
    args = parser.parse_args()
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
