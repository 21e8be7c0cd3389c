"""A day of trace in minutes: how long the simulator takes to replay one real-time test day of a
suite case for goodput and for each baseline, and what each reached there.

Run: .venv/bin/python bench/bench_realtime_day.py --traces TRACES [--case azure-code-2024]
        [--model llama-8b-tp1] [--policies goodput,hpa-running,...] [--hours 24] [--workers 2]

Each policy runs once on the case's test day at the middle of its suite grid (goodput at factor 1),
untuned: this measures the replay's cost, not the policies (`bench_suite.py` tunes and judges them).
The capacity every policy and the warm start use is the service-time model's, not a measured
envelope, so no envelope search runs before the clock starts. Prints, per policy: requests, wall
and CPU seconds, requests replayed per wall second, attainment of offered, GPU-hours and scale
changes. Nothing is asserted: these are figures.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

from goodput.controllers.autoscale.forecast import DAY_SECONDS
from goodput.estimators.work import WorkPricing
from goodput.simulator.config import build_setup
from goodput.simulator.envelope import CapacityEnvelope, request_work_seconds
from goodput.simulator.fair_bench import SUITE_POLICIES, SWEEPS, FairBench
from goodput.simulator.runner import analytic_rate_per_group
from goodput.simulator.suite import DAY_CASES, SUITE_MODELS, case_workload
from goodput.simulator.workload import window


def replay_day(
    traces: Path, samples: Path, *, case_name: str, model_name: str, name: str, hours: float
) -> str:
    """One policy's replay of the case's test day (its first `hours`), as a printed line."""
    case = next(c for c in DAY_CASES if c.name == case_name)
    model = next(m for m in SUITE_MODELS if m.name == model_name)
    setup = build_setup(samples / model.modelgroup, samples / model.policy, step_noise_sigma=0.04)
    setup = replace(setup, measured_capacity_work_seconds_per_second=None)
    workload = case_workload(case, setup, model, traces, seed=0)
    end = DAY_SECONDS + hours * 3600.0
    workload = window(workload, 0.0, end) if hours < 24 else workload
    pricing = WorkPricing.from_step_model(setup.engine.cost)
    per_group = analytic_rate_per_group(setup, workload, pricing)
    work = float(request_work_seconds(pricing, workload).mean())
    envelope = CapacityEnvelope(per_group * work, per_group, min(c.attainment for c in setup.classes), 0)
    bench = FairBench(setup, workload, train_fraction=DAY_SECONDS / end, measured_envelope=envelope)
    setting = 1.0 if name == "goodput" else SWEEPS[name][1]
    policy = bench.policy(name, setting)
    wall, cpu = time.perf_counter(), time.process_time()
    figures = bench.run(bench.test, bench.test_feasibility, policy, bench.test_seconds)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return (
        f"{model_name} {case_name} {name} at {setting:g}: {figures.offered} requests over "
        f"{bench.test_seconds / 3600:.1f} h in {wall:.0f} s wall, {cpu:.0f} s CPU "
        f"({figures.offered / wall:.0f} requests per wall second); met {figures.attainment_offered:.3f} "
        f"of offered on {figures.gpu_hours:.1f} GPU-h; {figures.scale_outs} scale-outs, "
        f"{figures.scale_ins} scale-ins"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, required=True)
    parser.add_argument("--samples", type=Path, default=Path("manifests/samples"))
    parser.add_argument("--case", default="azure-code-2024", choices=[c.name for c in DAY_CASES])
    parser.add_argument("--model", default="llama-8b-tp1", choices=[m.name for m in SUITE_MODELS])
    parser.add_argument("--policies", type=lambda text: tuple(text.split(",")), default=SUITE_POLICIES)
    parser.add_argument("--hours", type=float, default=24.0, help="replay the test day's first hours only")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    unknown = [name for name in args.policies if name not in SUITE_POLICIES]
    if unknown or not 0 < args.hours <= 24:
        print(f"bench_realtime_day: unknown policy {unknown} or --hours outside (0, 24]", file=sys.stderr)
        return 2
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        futures = [
            pool.submit(
                replay_day,
                args.traces,
                args.samples,
                case_name=args.case,
                model_name=args.model,
                name=name,
                hours=args.hours,
            )
            for name in args.policies
        ]
        for future in futures:
            print(future.result(), flush=True)
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    wall = time.perf_counter() - started
    print(f"wall {wall:.0f} s on {os.cpu_count()} cores, load average at the end {load}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
