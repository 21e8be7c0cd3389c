"""Request-path comparisons on a fixed fleet: the same workload with and without the gateway.

What `bench/bench_gateway_admission.py` prints, and what the tests of the simulated gateway run:
a fixed number of groups (no autoscaler acting), a Poisson workload of one class with named tenants,
and `simulate` with or without the request path compiled from the ModelGroup and the SLOPolicy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from goodput.controllers.compile.request_path import RequestPathPolicy
from goodput.controllers.requests.fairness import jain_index
from goodput.simulator.baselines import FixedFleet
from goodput.simulator.config import SimulationSetup
from goodput.simulator.report import judge
from goodput.simulator.simulation import SimulationConfig, SimulationResult, simulate
from goodput.simulator.workload import Workload

MEAN_INPUT_TOKENS = 1024
MEAN_OUTPUT_TOKENS = 256


def poisson_workload(
    rates_per_second: dict[str, float], seconds: float, seed: int, class_names: tuple[str, ...]
) -> Workload:
    """Poisson arrivals per tenant, prompts and outputs log-normal around 1,024 and 256 tokens,
    every request of the first of `class_names` (the SLOPolicy's classes, in its order)."""
    rng = np.random.default_rng(seed)
    arrivals, tenants = [], []
    for index, rate in enumerate(rates_per_second.values()):
        count = rng.poisson(rate * seconds)
        arrivals.append(rng.uniform(0, seconds, count))
        tenants.append(np.full(count, index))
    arrival = np.concatenate(arrivals)
    order = np.argsort(arrival, kind="stable")
    count = len(arrival)
    inputs = np.clip(rng.lognormal(math.log(MEAN_INPUT_TOKENS), 0.6, count), 16, 6000).astype(np.int64)
    outputs = np.clip(rng.lognormal(math.log(MEAN_OUTPUT_TOKENS), 0.6, count), 2, 1500).astype(np.int64)
    return Workload(
        name=f"poisson {seconds:g}s",
        arrival_seconds=arrival[order],
        input_tokens=inputs,
        output_tokens=outputs,
        class_index=np.zeros(count, np.int64),
        tenant_index=np.concatenate(tenants)[order].astype(np.int64),
        class_names=class_names,
        tenant_names=tuple(rates_per_second),
    )


def fleet_requests_per_second(policy: RequestPathPolicy, groups: int) -> float:
    """What the fleet sustains at the SLO for the mean request: C per group over the work of the
    workload's mean request (the log-normal's mean is 1.2 times its median)."""
    pricing = policy.admission.pricing
    prompt, output = MEAN_INPUT_TOKENS * 1.2, MEAN_OUTPUT_TOKENS * 1.2
    mean_work = pricing.prefill_work_seconds(prompt) + pricing.decode_work_seconds(prompt, output)
    return groups * policy.capacity_work_seconds_per_second / mean_work


def run_fixed_fleet(
    setup: SimulationSetup,
    workload: Workload,
    groups: int,
    request_path: RequestPathPolicy | None,
    *,
    horizon_seconds: float,
    seed: int = 0,
    router: str = "least-requests",
) -> SimulationResult:
    """`groups` ready groups for the whole run; the gateway in front when `request_path` is given,
    else every request goes to the router at once (a plain Service's least-busy choice by default)."""
    fleet = replace(setup.fleet(), min_groups=groups, max_groups=groups, router=router)
    config = SimulationConfig(
        fleet=fleet,
        seed=seed,
        initial_groups=groups,
        horizon_seconds=horizon_seconds,
        request_path=request_path,
    )
    return simulate(workload, config, FixedFleet(groups))


@dataclass(frozen=True, slots=True)
class TenantFigures:
    """Per tenant: requests offered and SLO-met; the Jain index of fair-queue cost while two or more
    tenants waited (None without a gateway or when they never waited together)."""

    offered: dict[str, int]
    slo_met: dict[str, int]
    jain_while_backlogged: float | None

    def attainment(self, tenant: str) -> float:
        return self.slo_met.get(tenant, 0) / max(1, self.offered.get(tenant, 0))


def tenant_figures(result: SimulationResult, setup: SimulationSetup, labels: Workload) -> TenantFigures:
    """Offered and SLO-met requests by the tenants of `labels` (the workload as the tenants sent
    it, which may differ from the one replayed: FCFS replays it as one tenant)."""
    met = judge(result, setup.classes).met
    index = labels.tenant_index if labels.tenant_index is not None else np.zeros(len(labels), np.int64)
    offered = {name: int((index == t).sum()) for t, name in enumerate(labels.tenant_names)}
    slo_met = {name: int((met & (index == t)).sum()) for t, name in enumerate(labels.tenant_names)}
    shares = result.backlogged_cost_by_tenant
    jain = jain_index(shares) if shares and len(shares) >= 2 else None
    return TenantFigures(offered, slo_met, jain)


def as_one_tenant(workload: Workload) -> Workload:
    """The same requests sent as one tenant: the gateway's queue is then first come, first served."""
    return replace(workload, tenant_index=None, tenant_names=())
