"""Fairness between agent tenants: one whose sessions fan out ten times wider gets no more than its
weighted share while both are backlogged.

Run: .venv/bin/python bench/bench_agentic_fairness.py [--seconds 600] [--groups 4] [--seed 1]

The fleet and request path are `bench/bench_agentic_sessions.py`'s (sample ModelGroup
`modelgroup-llama-8b-tp1.yaml`, sample SLOPolicy `slopolicy-agents.yaml`, class `agent`, a fixed
fleet of `--groups` ready groups), with two tenants of equal weight: `narrow` sends the generator's
default sessions, `wide` the same sessions with every tool fan-out ten times wider (widths 10-40
instead of 1-4). Both send sessions at the same rate, chosen so that `narrow` alone offers the
fleet's whole capacity (twice its equal share): both are backlogged for the whole window, and `wide`
offers many times more.

The cost a tenant is served is what the simulated fair queue charges: prompt and output tokens at
the policy's `fairness.costWeights` (1 each). KV byte-seconds are not in it: the live gateway charges
them when a request ends and while a kept session waits on a tool (`gateway/tool_waits.py`), the
simulated gateway does not, so this bench measures the token half of the goal only. Arms: the fair
queue with the two tenants at weight 1, and the same requests as one tenant (first come, first
served). Two Jain indexes over the tenants: of the cost of the requests each had answered within the
window (both arms), and of the fair queue's charges at dispatches made while both waited
(`simulator.gateway_bench.tenant_figures`; the first-come arm's queue sees one tenant, so none).
Nothing is asserted; figures are printed.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np
from bench_agentic_sessions import CLASS, SAMPLES, in_policy_classes, work_by_session

from goodput.controllers.compile.request_path import RequestPathPolicy
from goodput.controllers.requests.fairness import CostWeights, jain_index
from goodput.simulator.agentic import AgenticSpec, agentic_sessions, tenants_together
from goodput.simulator.config import SimulationSetup, build_setup
from goodput.simulator.gateway_bench import as_one_tenant, run_fixed_fleet, tenant_figures
from goodput.simulator.records import RequestExit
from goodput.simulator.runner import request_path_for
from goodput.simulator.workload import Workload

TENANTS = ("narrow", "wide")


def with_tenants(policy: RequestPathPolicy) -> RequestPathPolicy:
    """The request path with the two tenants listed at weight 1, a token 1 either way."""
    weights = CostWeights(input_tokens=1.0, output_tokens=1.0)
    fairness = replace(policy.fairness, weights=dict.fromkeys(TENANTS, 1.0), cost_weights=weights)
    return replace(policy, fairness=fairness, listed_tenants=frozenset(TENANTS) | policy.listed_tenants)


def served_costs(
    result_requests: dict[str, np.ndarray], labels: Workload, policy: RequestPathPolicy, window: float
) -> dict[str, float]:
    """Per tenant, the fair-queue price of the requests answered within `window`, as `FairQueue`
    prices a request (tokens)."""
    weights = policy.fairness.cost_weights
    done = (result_requests["outcome"] == RequestExit.FINISHED) & (result_requests["finished_at"] <= window)
    served = result_requests.get("served_output_tokens", labels.output_tokens)
    costs = dict.fromkeys(labels.tenant_names, 0.0)
    for index in np.flatnonzero(done).tolist():
        tenant = labels.tenant_names[int(labels.tenant_index[index])]  # type: ignore[index]
        costs[tenant] += weights.cost(int(labels.input_tokens[index]), int(served[index]))
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    setup: SimulationSetup = build_setup(
        SAMPLES / "modelgroup-llama-8b-tp1.yaml", SAMPLES / "slopolicy-agents.yaml"
    )
    policy = with_tenants(request_path_for(setup))
    narrow_spec = AgenticSpec(duration_seconds=args.seconds, sessions_per_second=1.0)
    work = float(work_by_session(policy, agentic_sessions(narrow_spec, args.seed).workload).mean())
    rate = args.groups * policy.capacity_work_seconds_per_second / work  # narrow alone fills the fleet
    narrow = agentic_sessions(replace(narrow_spec, sessions_per_second=rate), args.seed).workload
    wide_spec = replace(narrow_spec, sessions_per_second=rate, fan_out_widths=(10, 20, 30, 40))
    wide = agentic_sessions(wide_spec, args.seed + 1).workload
    labels = in_policy_classes(tenants_together({"narrow": narrow, "wide": wide}), setup)
    offered = {
        name: float(work_by_session(policy, part).sum()) / args.seconds
        for name, part in (("narrow", narrow), ("wide", wide))
    }
    capacity = args.groups * policy.capacity_work_seconds_per_second
    print(
        f"{args.groups} groups, capacity {capacity:.2f} work-s/s; {rate:.3f} sessions/s per tenant; "
        f"offered work-s/s: narrow {offered['narrow']:.2f} ({offered['narrow'] / capacity:.2f}x), "
        f"wide {offered['wide']:.2f} ({offered['wide'] / capacity:.2f}x); class {CLASS}"
    )
    for name, replayed in (("fair queue", labels), ("first come", as_one_tenant(labels))):
        result = run_fixed_fleet(
            setup, replayed, args.groups, policy, horizon_seconds=args.seconds, seed=args.seed
        )
        figures = tenant_figures(result, setup, labels)
        costs = served_costs(result.requests, labels, policy, args.seconds)
        total = sum(costs.values()) or 1.0
        charged = (
            f"{figures.jain_while_backlogged:.3f}" if figures.jain_while_backlogged is not None else "n/a"
        )
        print(
            f"  {name:10s} served cost share: narrow {costs['narrow'] / total:.3f}, wide "
            f"{costs['wide'] / total:.3f}; Jain over served cost {jain_index(costs):.3f}; Jain over the "
            f"queue's charges while both waited {charged}; SLO-met requests narrow "
            f"{figures.slo_met['narrow']} of {figures.offered['narrow']}, wide {figures.slo_met['wide']} "
            f"of {figures.offered['wide']}"
        )


if __name__ == "__main__":
    main()
