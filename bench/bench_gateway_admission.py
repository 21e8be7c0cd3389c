"""Admission and fairness of the gateway's request path, run by the simulator on a fixed fleet.

Run: .venv/bin/python bench/bench_gateway_admission.py [--seconds 120] [--groups 2] [--seed 1]

The fleet and the request path are `goodput simulate`'s (`simulator.simulation` with a
`RequestPathPolicy`: `controllers.requests.admission.admit`, `controllers.requests.fairness.FairQueue`,
`controllers.requests.routing.choose_group` between the workload and the simulated vLLM engines), for
Llama-3.1-8B on one H100 per group with the sample ModelGroup and the sample interactive
SLOPolicy's `chat` class (TTFT 1 s, ITL 75 ms, E2E 60 s), on a fixed number of ready groups (no
autoscaler acts). Requests: Poisson arrivals, prompts and outputs log-normal around 1,024 and 256
tokens; each request's `max_tokens` is its true output length (a client that knows its answer's
length; real clients ask more, which makes admission more conservative). Nothing is asserted; the
figures are printed.

Scenarios:
1. 3x overload for `--seconds`: SLO-meeting requests per second without the gateway (every request
   goes straight to the least busy engine, as a plain Service does) and with it.
2. Two equally weighted tenants, one at 10x the other (the light one at 40 % of the fleet's capacity,
   together 4.4x): the Jain index of fair-queue cost while both are backlogged, and the light
   tenant's attainment (SLO-met over offered) against its attainment alone; with fairness and
   without (FCFS: the same requests sent as one tenant).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from goodput.controllers.compile.request_path import RequestPathPolicy
from goodput.simulator.config import SimulationSetup, build_setup
from goodput.simulator.gateway_bench import (
    as_one_tenant,
    fleet_requests_per_second,
    poisson_workload,
    run_fixed_fleet,
    tenant_figures,
)
from goodput.simulator.records import RequestExit
from goodput.simulator.runner import request_path_for

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "manifests" / "samples"
TAIL_SECONDS = 120.0


def overload(
    setup: SimulationSetup, policy: RequestPathPolicy, groups: int, seconds: float, seed: int
) -> None:
    capacity = fleet_requests_per_second(policy, groups)
    classes = tuple(c.name for c in setup.classes)
    workload = poisson_workload({"all": 3 * capacity}, seconds, seed, classes)
    print(
        f"3x overload: {groups} groups, fleet capacity ~{capacity:.1f} req/s at the SLO, offered "
        f"{len(workload) / seconds:.1f} req/s for {seconds:.0f} s"
    )
    figures = {}
    for name, path in (("without gateway", None), ("with gateway", policy)):
        started = time.perf_counter()
        result = run_fixed_fleet(setup, workload, groups, path, horizon_seconds=seconds, seed=seed)
        met = sum(tenant_figures(result, setup, workload).slo_met.values())
        refused = int((result.requests["outcome"] == RequestExit.REJECTED_ADMISSION).sum())
        figures[name] = met / seconds
        print(
            f"  {name:16s} SLO-met {met / seconds:7.2f} req/s  attainment of offered "
            f"{met / len(workload):6.1%}  refused {refused:6d}  ({time.perf_counter() - started:.1f}s wall)"
        )
    ratio = figures["with gateway"] / max(figures["without gateway"], 1e-9)
    print(f"  SLO-met requests/s with the gateway / without: {ratio:.1f}x")


def tenants(
    setup: SimulationSetup, policy: RequestPathPolicy, groups: int, seconds: float, seed: int
) -> None:
    capacity = fleet_requests_per_second(policy, groups)
    classes = tuple(c.name for c in setup.classes)
    light_rate = 0.4 * capacity
    print(f"two tenants, equal weights: light {light_rate:.1f} req/s, heavy {10 * light_rate:.1f} req/s")
    alone_load = poisson_workload({"light": light_rate}, seconds, seed, classes)
    alone = run_fixed_fleet(setup, alone_load, groups, policy, horizon_seconds=seconds, seed=seed)
    base = tenant_figures(alone, setup, alone_load).attainment("light")
    print(f"  light alone:            attainment {base:6.1%}")
    both = poisson_workload({"light": light_rate, "heavy": 10 * light_rate}, seconds, seed, classes)
    for name, replayed in (("fair (VTC)", both), ("FCFS, no fairness", as_one_tenant(both))):
        result = run_fixed_fleet(setup, replayed, groups, policy, horizon_seconds=seconds, seed=seed)
        figures = tenant_figures(result, setup, both)
        light, heavy = figures.attainment("light"), figures.attainment("heavy")
        jain = "n/a" if figures.jain_while_backlogged is None else f"{figures.jain_while_backlogged:.3f}"
        print(
            f"  {name:22s}  light attainment {light:6.1%} ({light / max(base, 1e-9):6.1%} of alone), "
            f"heavy {heavy:6.1%}; Jain index while both backlogged: {jain}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--step-noise", type=float, default=0.04, help="σ of the engine step noise")
    args = parser.parse_args()
    setup = build_setup(
        SAMPLES / "modelgroup-llama-8b-tp1.yaml",
        SAMPLES / "slopolicy-interactive.yaml",
        step_noise_sigma=args.step_noise,
    )
    policy = request_path_for(setup)
    overload(setup, policy, args.groups, args.seconds, args.seed)
    tenants(setup, policy, args.groups, args.seconds, args.seed)


if __name__ == "__main__":
    main()
