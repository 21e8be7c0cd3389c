"""Admission and fairness of the gateway's pure core, in a discrete-event loop over simulated engines.

Run: .venv/bin/python bench/bench_gateway_admission.py [--seconds 120] [--groups 2] [--seed 1]

Not a live fleet: the gateway's decisions (`controllers.admission.admit`, `controllers.fairness.
FairQueue`, `controllers.routing.choose_group`) drive the simulator's vLLM engine model
(`simulator.engine.Engine`: continuous batching, chunked prefill, KV), one engine per group, for
Llama-3.1-8B on one H100 per group with the sample ModelGroup and the sample interactive SLOPolicy's
`chat` class (TTFT 1 s, ITL 75 ms, E2E 60 s). Requests: Poisson arrivals, prompts and outputs drawn
log-normally around 1,024 and 256 tokens; each request's `max_tokens` is its true output length
(a client that knows its answer's length; real clients ask more, which makes admission more
conservative). Nothing is asserted; the figures are printed.

Scenarios:
1. 3x overload for `--seconds`: SLO-meeting requests per second without admission (every request
   goes straight to the least busy engine, as a plain Service does) and with the gateway's gates,
   fair queue and routing.
2. Two equally weighted tenants, one at 10x the other (the light one at 40 % of the fleet's capacity,
   together 4.4x): the Jain index of served cost while both are backlogged, and the light tenant's
   attainment (SLO-met over offered) against its attainment alone; with fairness, for each way the
   deadline gate may predict the newcomer's wait (`PREDICTORS`), and without (FCFS: every request
   charged to one tenant).
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from goodput.api.modelgroup import ModelGroup
from goodput.api.slopolicy import SloPolicy
from goodput.controllers.admission import DrainRateMeter, GroupLoad, RequestShape, admit, slot_wait_seconds
from goodput.controllers.fairness import FairnessPolicy, FairQueue, QueuedItem, jain_index
from goodput.controllers.request_path import RequestPathPolicy, compile_request_path
from goodput.controllers.routing import Candidate, RouteRequest, choose_group, free_dispatch_slots
from goodput.simulator.engine import Engine, EngineConfig
from goodput.simulator.records import RequestLog
from goodput.simulator.workload import Workload

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "manifests" / "samples"


def request_path() -> RequestPathPolicy:
    group = ModelGroup.model_validate(yaml.safe_load((SAMPLES / "modelgroup-llama-8b-tp1.yaml").read_text()))
    slo = SloPolicy.model_validate(yaml.safe_load((SAMPLES / "slopolicy-interactive.yaml").read_text()))
    compiled = compile_request_path(group, slo)
    assert isinstance(compiled, RequestPathPolicy), compiled
    return compiled


def make_workload(rates: dict[str, float], seconds: float, seed: int) -> Workload:
    rng = np.random.default_rng(seed)
    arrivals, tenants = [], []
    for index, rate in enumerate(rates.values()):
        count = rng.poisson(rate * seconds)
        arrivals.append(rng.uniform(0, seconds, count))
        tenants.append(np.full(count, index))
    arrival = np.concatenate(arrivals)
    order = np.argsort(arrival, kind="stable")
    count = len(arrival)
    inputs = np.clip(rng.lognormal(math.log(1024), 0.6, count), 16, 6000).astype(int)
    outputs = np.clip(rng.lognormal(math.log(256), 0.6, count), 2, 1500).astype(int)
    return Workload(
        name="poisson",
        arrival_seconds=arrival[order],
        input_tokens=inputs,
        output_tokens=outputs,
        tenant_index=np.concatenate(tenants)[order],
        tenant_names=tuple(rates),
    )


@dataclass
class Result:
    offered: dict[str, int] = field(default_factory=dict)
    met: dict[str, int] = field(default_factory=dict)
    rejected: int = 0
    dispatched: dict[str, int] = field(default_factory=dict)
    both_backlogged_cost: dict[str, float] = field(default_factory=dict)
    both_backlogged_dispatches: int = 0


# How the deadline gate predicts a newcomer's queue wait (scenario 2 compares them):
# expected: its place in the fair order and what the tenants ahead of it send while it waits
#   (`FairQueue.expected_work_ahead_seconds`), the gateway's;
# order: its place in the fair order as it stands (`FairQueue.work_ahead_seconds`);
# share: a fluid fair share that ignores the counters (`fluid_share_ahead_seconds`), the gate before;
# whole: the whole queue's work, as if the queue were first come, first served.
PREDICTORS = ("expected", "order", "share", "whole")


def fluid_share_ahead_seconds(
    queued_work_by_tenant: dict[str, float], tenant: str, own_work_seconds: float, policy: FairnessPolicy
) -> float:
    """The previous gate's prediction: the tenant's own queued work W (with the newcomer's), and of every
    other tenant u at most W * w_u / w_t, whatever the counters say; less the newcomer's own work."""
    own = queued_work_by_tenant.get(tenant, 0.0) + own_work_seconds
    weight = policy.weight(tenant)
    others = sum(
        min(work, own * policy.weight(other) / weight)
        for other, work in queued_work_by_tenant.items()
        if other != tenant and work > 0
    )
    return own - own_work_seconds + others


class Loop:
    """One run: arrivals, engine steps and hold expiries in time order."""

    def __init__(
        self,
        policy: RequestPathPolicy,
        workload: Workload,
        groups: int,
        *,
        gateway: bool,
        fair: bool,
        predictor: str = "expected",
    ) -> None:
        self.policy = policy
        self.workload = workload
        self.gateway = gateway
        self.fair = fair
        self.predictor = predictor
        self.log = RequestLog(workload)
        profile_model = policy.admission.floor_model.step_model
        config = EngineConfig(
            profile_model,
            policy.max_in_flight_per_group,
            policy.admission.floor_model.chunk_tokens,
            policy.kv_capacity_tokens,
        )
        rng = random.Random(1)
        self.engines = [Engine(config, self.log, rng) for _ in range(groups)]
        self.in_flight: list[dict[int, float]] = [{} for _ in range(groups)]  # index -> work
        self.unstarted: list[dict[int, int]] = [{} for _ in range(groups)]  # index -> prompt tokens
        self.queue: FairQueue[int] = FairQueue(policy.fairness if fair else FairnessPolicy())
        self.items: dict[int, QueuedItem[int]] = {}
        self.work_by_tenant: dict[str, float] = {}
        self.events: list[tuple[float, int, int, int]] = []
        self.result = Result()
        self.contract = policy.admission.classes["chat"]
        self.meter = DrainRateMeter()

    def tenant(self, index: int) -> str:
        assert self.workload.tenant_index is not None
        return self.workload.tenant_names[int(self.workload.tenant_index[index])]

    def work(self, index: int) -> float:
        pricing = self.policy.admission.pricing
        prompt = int(self.workload.input_tokens[index])
        return pricing.prefill_work_seconds(prompt) + pricing.decode_work_seconds(
            prompt, int(self.workload.output_tokens[index])
        )

    def schedule_engine(self, group: int) -> None:
        engine = self.engines[group]
        if engine.step_end is not None:
            heapq.heappush(self.events, (engine.step_end, 1, group, engine.plan_version))

    def loads(self, tenant: str | None, own: float, now: float = 0.0) -> list[GroupLoad]:
        """The groups as the gate sees them for `tenant`'s newcomer (None: the whole queue, as routing
        sees it)."""
        measured = self.meter.work_seconds_per_second()
        rate = measured / len(self.engines) if measured else self.policy.capacity_work_seconds_per_second
        charged = tenant if self.fair else "all"
        if tenant is None or charged is None or self.predictor == "whole":
            ahead = sum(self.work_by_tenant.values())
        elif self.predictor == "share":
            ahead = fluid_share_ahead_seconds(self.work_by_tenant, charged, own, self.queue.policy)
        elif self.predictor == "order":
            ahead = self.queue.work_ahead_seconds(charged, 0)
        else:
            ahead = self.queue.expected_work_ahead_seconds(charged, 0, now, rate * len(self.engines))
        capacity = self.policy.kv_capacity_tokens
        return [
            GroupLoad(
                f"g{g}",
                True,
                False,
                ahead / len(self.engines),
                sum(self.in_flight[g].values()),
                capacity,
                capacity - engine.used_blocks * 16,
                rate,
                slot_wait_seconds(
                    len(self.in_flight[g]),
                    self.policy.max_in_flight_per_group,
                    sum(self.in_flight[g].values()),
                    rate,
                ),
            )
            for g, engine in enumerate(self.engines)
        ]

    def arrive(self, index: int, now: float) -> None:
        tenant = self.tenant(index)
        self.result.offered[tenant] = self.result.offered.get(tenant, 0) + 1
        if not self.gateway:
            group = min(range(len(self.engines)), key=lambda g: (self.engines[g].in_flight, g))
            self.dispatch_to(group, index, now)
            return
        prompt, output = int(self.workload.input_tokens[index]), int(self.workload.output_tokens[index])
        work = self.work(index)
        shape = RequestShape(tenant, "chat", prompt, output, now)
        decision = admit(self.policy.admission, shape, self.loads(tenant, work, now), now)
        if not decision.proceeds:
            self.result.rejected += 1
            return
        charged = tenant if self.fair else "all"
        item = QueuedItem(
            charged, 0, now + self.contract.ttft_seconds, now, prompt, output, index, work_seconds=work
        )
        self.items[index] = self.queue.push(item)
        self.work_by_tenant[charged] = self.work_by_tenant.get(charged, 0.0) + work
        hold = decision.hold_seconds or max(
            self.policy.admission.max_defer_seconds, self.contract.ttft_seconds
        )
        heapq.heappush(self.events, (now + hold, 2, index, 0))
        self.pump(now)

    def dispatch_to(self, group: int, index: int, now: float) -> None:
        self.in_flight[group][index] = self.work(index)
        if self.gateway:
            self.unstarted[group][index] = int(self.workload.input_tokens[index])
        self.engines[group].enqueue(
            index, int(self.workload.input_tokens[index]), int(self.workload.output_tokens[index]), None, now
        )
        self.schedule_engine(group)

    def pump(self, now: float) -> None:
        slots = self.policy.max_in_flight_per_group
        while len(self.queue):
            chunk = self.policy.admission.floor_model.chunk_tokens
            candidates = [
                Candidate(
                    load,
                    free_dispatch_slots(
                        slots - len(self.in_flight[g]), sum(self.unstarted[g].values()), chunk
                    ),
                )
                for g, load in enumerate(self.loads(None, 0.0))
            ]
            if not any(c.free_slots > 0 for c in candidates):
                return
            head = self.queue.peek(now)
            if head is not None and now > head.arrival_time:
                self.meter.record(now, self.work(head.payload))
            both = len(self.queue.backlogged()) >= 2
            dispatch = self.queue.pop(now)
            assert dispatch is not None
            index = dispatch.item.payload
            self.items.pop(index, None)
            served = self.result.dispatched
            served[self.tenant(index)] = served.get(self.tenant(index), 0) + 1
            charged = dispatch.item.tenant
            self.work_by_tenant[charged] = max(0.0, self.work_by_tenant.get(charged, 0.0) - self.work(index))
            if both:
                cost = self.result.both_backlogged_cost
                cost[charged] = cost.get(charged, 0.0) + dispatch.charged_cost
                self.result.both_backlogged_dispatches += 1
            request = RouteRequest(dispatch.item.deadline - now, dispatch.item.input_tokens * 2)
            route = choose_group(candidates, request, self.policy.routing)
            assert route is not None
            self.dispatch_to(int(route.group[1:]), index, now)

    def step(self, group: int, version: int, now: float) -> None:
        engine = self.engines[group]
        if engine.plan_version != version or engine.step_end is None:
            return
        engine.complete_step(now)
        unstarted = self.unstarted[group]
        for index in [i for i in unstarted if not math.isnan(self.log.first_token_at[i])]:
            del unstarted[index]  # the gateway sees the first streamed token
        finished = [i for i in self.in_flight[group] if not math.isnan(self.log.finished_at[i])]
        for index in finished:
            del self.in_flight[group][index]
            self.judge(index)
        self.schedule_engine(group)
        if self.gateway:
            self.pump(now)

    def judge(self, index: int) -> None:
        arrival, first, done = (
            self.log.arrival[index],
            self.log.first_token_at[index],
            self.log.finished_at[index],
        )
        output = int(self.workload.output_tokens[index])
        itl = (done - first) / (output - 1) if output > 1 else 0.0
        ok = first - arrival <= self.contract.ttft_seconds and itl <= self.contract.itl_seconds
        ok = ok and (self.contract.e2e_seconds is None or done - arrival <= self.contract.e2e_seconds)
        if ok:
            tenant = self.tenant(index)
            self.result.met[tenant] = self.result.met.get(tenant, 0) + 1

    def expire(self, index: int) -> None:
        item = self.items.pop(index, None)
        if item is not None and self.queue.cancel(item):
            self.result.rejected += 1
            self.work_by_tenant[item.tenant] = max(
                0.0, self.work_by_tenant.get(item.tenant, 0.0) - self.work(index)
            )

    def run(self, horizon: float) -> Result:
        for index, at in enumerate(self.workload.arrival_seconds.tolist()):
            heapq.heappush(self.events, (at, 0, index, 0))
        while self.events:
            now, kind, a, b = heapq.heappop(self.events)
            if now > horizon:
                break
            if kind == 0:
                self.arrive(a, now)
            elif kind == 1:
                self.step(a, b, now)
            else:
                self.expire(a)
        return self.result


def fleet_requests_per_second(policy: RequestPathPolicy, groups: int) -> float:
    """What the fleet sustains at the SLO for the mean request: C per group over a mean request's work."""
    pricing = policy.admission.pricing
    mean_work = pricing.prefill_work_seconds(1024 * 1.2) + pricing.decode_work_seconds(1024 * 1.2, 256 * 1.2)
    return groups * policy.capacity_work_seconds_per_second / mean_work


def overload(policy: RequestPathPolicy, groups: int, seconds: float, seed: int) -> None:
    capacity = fleet_requests_per_second(policy, groups)
    workload = make_workload({"all": 3 * capacity}, seconds, seed)
    print(
        f"3x overload: {groups} groups, fleet capacity ~{capacity:.1f} req/s at the SLO, offered "
        f"{len(workload) / seconds:.1f} req/s for {seconds:.0f} s"
    )
    figures = {}
    for name, gateway in (("without admission", False), ("with admission", True)):
        started = time.perf_counter()
        result = Loop(policy, workload, groups, gateway=gateway, fair=True).run(seconds + 120)
        met = sum(result.met.values())
        figures[name] = met / seconds
        print(
            f"  {name:18s} SLO-met {met / seconds:7.2f} req/s  attainment of offered "
            f"{met / len(workload):6.1%}  rejected {result.rejected:6d}  "
            f"({time.perf_counter() - started:.1f}s wall)"
        )
    ratio = figures["with admission"] / max(figures["without admission"], 1e-9)
    print(f"  SLO-met requests/s with admission / without: {ratio:.1f}x")


def tenants(policy: RequestPathPolicy, groups: int, seconds: float, seed: int) -> None:
    capacity = fleet_requests_per_second(policy, groups)
    light_rate = 0.4 * capacity
    print(f"two tenants, equal weights: light {light_rate:.1f} req/s, heavy {10 * light_rate:.1f} req/s")
    alone = Loop(policy, make_workload({"light": light_rate}, seconds, seed), groups, gateway=True, fair=True)
    base = alone.run(seconds + 120)
    base_attainment = base.met.get("light", 0) / max(1, base.offered.get("light", 0))
    print(f"  light alone:            attainment {base_attainment:6.1%}")
    both = make_workload({"light": light_rate, "heavy": 10 * light_rate}, seconds, seed)
    runs = [(f"fair (VTC), wait: {predictor}", True, predictor) for predictor in PREDICTORS]
    for name, fair, predictor in [*runs, ("FCFS, no fairness", False, "order")]:
        result = Loop(policy, both, groups, gateway=True, fair=fair, predictor=predictor).run(seconds + 120)
        light = result.met.get("light", 0) / max(1, result.offered.get("light", 0))
        heavy = result.met.get("heavy", 0) / max(1, result.offered.get("heavy", 0))
        heavy_sent = result.met.get("heavy", 0) / max(1, result.dispatched.get("heavy", 0))
        shares = result.both_backlogged_cost
        jain = (
            f"{jain_index(shares):.3f} over {result.both_backlogged_dispatches} dispatches" if fair else "n/a"
        )
        print(
            f"  {name:28s}  light attainment {light:6.1%} "
            f"({light / max(base_attainment, 1e-9):6.1%} of alone), "
            f"heavy {heavy:6.1%} ({heavy_sent:6.1%} of those sent); Jain index while both backlogged: {jain}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    policy = request_path()
    overload(policy, args.groups, args.seconds, args.seed)
    tenants(policy, args.groups, args.seconds, args.seed)


if __name__ == "__main__":
    main()
