"""How fast the fleet simulator runs: simulated seconds per wall-clock second.

Run: .venv/bin/python bench/bench_simulator.py [--trace ../shared/traces/AzureLLMInferenceTrace_conv.csv]

Scenarios (each one process, one core):
- one simulated hour of a fixed 16-group fleet (Llama-3.1-8B, one H100 per group) at the trace's own
  rate — the design target is under 10 wall seconds;
- the same hour at 10x the rate on 8 groups (busy engines, mixed prefill and decode steps);
- the same busy hour driven by goodput's decision pipeline every 15 s (metrics scraped every 5 s);
- the same busy hour on 8 fixed groups behind the gateway's request path (admission gates, fair
  queue, routing; the sample ModelGroup and interactive SLOPolicy, whose engine it runs).
Without the trace file, a Poisson hour at the Azure conversation trace's mean rate and lengths is
used instead. Prints wall time, simulated/wall ratio and events; nothing is asserted.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from goodput.controllers.autoscale_model import SloTargets
from goodput.controllers.request_path import RequestPathPolicy
from goodput.estimators.capacity import build_capacity_profile
from goodput.estimators.service_time import H100_80G, LLAMA_3_1_8B
from goodput.simulator.baselines import FixedFleet
from goodput.simulator.config import build_setup
from goodput.simulator.engine import EngineConfig
from goodput.simulator.fleet import FleetConfig
from goodput.simulator.goodput_policy import GoodputPolicy, scaling_policy
from goodput.simulator.policy import Autoscaler
from goodput.simulator.runner import request_path_for
from goodput.simulator.simulation import SimulationConfig, simulate
from goodput.simulator.workload import ClassRule, Workload, load_trace, multiply_rate, prepare, truncate

DEFAULT_TRACE = (
    Path(__file__).resolve().parents[1] / ".." / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv"
)


def poisson_hour(seed: int) -> Workload:
    """Stand-in for the conversation trace: 5.53 req/s, lognormal lengths with its means."""
    rng = np.random.default_rng(seed)
    times = np.sort(rng.uniform(0.0, 3600.0, rng.poisson(5.53 * 3600)))
    inputs = np.maximum(1, rng.lognormal(np.log(1020), 0.75, times.size)).astype(np.int64)
    outputs = np.maximum(1, rng.lognormal(np.log(129), 0.9, times.size)).astype(np.int64)
    return Workload("poisson-hour", times, inputs, outputs)


def measure(
    label: str,
    workload: Workload,
    groups: int,
    autoscaler: Autoscaler,
    engine: EngineConfig,
    *,
    request_path: RequestPathPolicy | None = None,
) -> None:
    config = SimulationConfig(
        fleet=FleetConfig(
            engine=engine,
            gpus_per_group=1,
            min_groups=1,
            max_groups=max(groups, 16),
            itl_targets_seconds=(0.08,),
        ),
        seed=1,
        initial_groups=groups,
        request_path=request_path,
    )
    started = time.perf_counter()
    result = simulate(workload, config, autoscaler)
    wall = time.perf_counter() - started
    print(
        f"{label:<46} {len(workload):>8} requests  {result.end_seconds:7.0f} sim-s  {wall:6.2f} wall-s  "
        f"ratio {result.end_seconds / wall:7.0f}x  {result.events_processed / wall / 1000:6.0f}k events/s  "
        f"{result.engine_totals['steps'] / 1e6:5.2f}M engine steps"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rule = ClassRule(("chat",), (1.0,))
    if args.trace.exists():
        base = load_trace(str(args.trace), args.seed)
    else:
        print(f"{args.trace} not found: using a Poisson hour at the conversation trace's rate")
        base = poisson_hour(args.seed)
    hour = prepare(truncate(base, 3600.0), rule, args.seed)
    busy = prepare(multiply_rate(truncate(base, 3600.0), 10.0, args.seed), rule, args.seed)
    engine = EngineConfig.for_hardware(LLAMA_3_1_8B, H100_80G, step_noise_sigma=0.04)
    measure("1 h, 16 groups, trace rate, fixed fleet", hour, 16, FixedFleet(16), engine)
    measure("1 h, 8 groups, 10x trace rate, fixed fleet", busy, 8, FixedFleet(8), engine)
    profile = build_capacity_profile(
        engine.cost,
        max_num_seqs=engine.max_num_seqs,
        max_num_batched_tokens=engine.max_num_batched_tokens,
        itl_target_seconds=0.08,
        ttft_target_seconds=1.0,
    )
    policy = GoodputPolicy(scaling_policy(None, 1, 16, 0, (SloTargets("chat", 1.0, 0.08),)), profile)
    measure("1 h, 10x trace rate, goodput's decision pipeline", busy, 8, policy, engine)
    samples = Path(__file__).resolve().parents[1] / "manifests" / "samples"
    setup = build_setup(
        samples / "modelgroup-llama-8b-tp1.yaml",
        samples / "slopolicy-interactive.yaml",
        step_noise_sigma=0.04,
    )
    gateway = request_path_for(setup)
    measure(
        "1 h, 8 groups, 10x trace rate, behind the gateway",
        busy,
        8,
        FixedFleet(8),
        setup.engine,
        request_path=gateway,
    )


if __name__ == "__main__":
    main()
