"""How fast the fleet simulator runs: simulated seconds per wall-clock second.

Run: .venv/bin/python bench/bench_simulator.py [--trace ../shared/traces/AzureLLMInferenceTrace_conv.csv]

Scenarios (each one process, one core):
- one simulated hour of a fixed 16-group fleet (Llama-3.1-8B, one H100 per group) at the trace's own
  rate — the design target is under 10 wall seconds;
- the same hour at 10x the rate on 8 groups (busy engines, mixed prefill and decode steps);
- the same busy hour driven by goodput's decision pipeline every 15 s (metrics scraped every 5 s);
- the same busy hour on 8 fixed groups behind the gateway's request path (admission gates, fair
  queue, routing; the sample ModelGroup and interactive SLOPolicy, whose engine it runs).
At fleet size (`--fleet`; the batched engine, `simulator/batched.py`):
- one simulated hour of 1,000 fixed groups of Llama-3.1-70B on eight H100s each (8,000 GPUs), the
  conversation trace's arrivals replicated 1,000 times (about 5,400 requests/s, 19 million requests);
- 60 simulated seconds of 10,000 requests/s on 1,000 fixed 8B groups, on the batched engine and, with
  `--event-at-fleet-size`, on the event engine too (minutes).
Without the trace file, a Poisson hour at the Azure conversation trace's mean rate and lengths is
used instead. Prints wall time, simulated/wall ratio and events; nothing is asserted.
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

import numpy as np

from goodput.controllers.autoscale.model import SloTargets
from goodput.controllers.compile.request_path import RequestPathPolicy
from goodput.estimators.capacity import build_capacity_profile
from goodput.estimators.service_time import H100_80G, LLAMA_3_1_8B, LLAMA_3_1_70B
from goodput.simulator.baselines import FixedFleet
from goodput.simulator.batched import BatchedRunSettings, simulate_batched
from goodput.simulator.config import build_setup
from goodput.simulator.engine import EngineConfig
from goodput.simulator.fleet import FleetConfig
from goodput.simulator.fleet_policy import FleetPolicy
from goodput.simulator.goodput_policy import GoodputPolicy, what_if_scaling_policy
from goodput.simulator.report import ClassTargets, judge
from goodput.simulator.runner import request_path_for
from goodput.simulator.simulation import SimulationConfig, simulate
from goodput.simulator.workload import (
    ClassRule,
    Workload,
    load_trace,
    multiply_rate,
    prepare,
    truncate,
)

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
    autoscaler: FleetPolicy,
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


def measure_fleet(
    label: str, workload: Workload, groups: int, engine: EngineConfig, gpus_per_group: int
) -> None:
    """A fixed fleet of `groups` on the batched engine; attainment against a 1 s TTFT, 80 ms TPOT."""
    fleet = FleetConfig(engine=engine, gpus_per_group=gpus_per_group, min_groups=1, max_groups=groups)
    started = time.perf_counter()
    result = simulate_batched(workload, fleet, BatchedRunSettings(groups))
    wall = time.perf_counter() - started
    attainment = float(judge(result, (ClassTargets("chat", 1.0, 0.08),)).met.mean())
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"{label:<46} {len(workload):>8} requests  {result.end_seconds:7.0f} sim-s  {wall:6.2f} wall-s  "
        f"ratio {result.end_seconds / wall:7.0f}x  attainment {attainment:.4f}  "
        f"{result.events_processed} ticks  peak RSS {peak_mib:.0f} MiB"
    )


def fleet_scale(base: Workload, rule: ClassRule, seed: int, event_too: bool) -> None:
    """The fleet-size scenarios: 8,000 GPUs for an hour, and 10,000 requests/s for a minute."""
    big = EngineConfig.for_hardware(LLAMA_3_1_70B, H100_80G, tensor_parallel=8)
    started = time.perf_counter()
    hour = prepare(multiply_rate(truncate(base, 3600.0), 1000.0, seed), rule, seed)
    print(f"(the 1,000x hour: {len(hour)} requests built in {time.perf_counter() - started:.1f} s)")
    measure_fleet("1 h, 1,000 groups 70B TP8, 1,000x trace, batched", hour, 1000, big, 8)
    del hour
    minute = prepare(load_trace("synthetic:rate=10000,duration=60", seed), rule, seed)
    small = EngineConfig.for_hardware(LLAMA_3_1_8B, H100_80G)
    measure_fleet("60 s, 1,000 groups 8B, 10,000 req/s, batched", minute, 1000, small, 1)
    if event_too:
        noisy = EngineConfig.for_hardware(LLAMA_3_1_8B, H100_80G, step_noise_sigma=0.04)
        measure("60 s, 1,000 groups 8B, 10,000 req/s, event", minute, 1000, FixedFleet(1000), noisy)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--fleet", action="store_true", help="run only the fleet-size scenarios")
    parser.add_argument(
        "--event-at-fleet-size",
        action="store_true",
        help="with --fleet, time the event engine on the minute too",
    )
    args = parser.parse_args()
    rule = ClassRule(("chat",), (1.0,))
    if args.trace.exists():
        base = load_trace(str(args.trace), args.seed)
    else:
        print(f"{args.trace} not found: using a Poisson hour at the conversation trace's rate")
        base = poisson_hour(args.seed)
    if args.fleet:
        fleet_scale(base, rule, args.seed, args.event_at_fleet_size)
        return
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
    policy = GoodputPolicy(what_if_scaling_policy(None, 1, 16, 0, (SloTargets("chat", 1.0, 0.08),)), profile)
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
