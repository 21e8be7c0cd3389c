"""Capacity learnt on the cluster, in the fleet simulator: goodput started from a wrong prior.

    python bench/bench_capacity_learning.py [--trace TRACE] [--start-seconds 1200]
        [--duration-seconds 2700] [--rate-multiplier 8] [--factors 0.5,1,2] [--seed 0]

One trace window of ordinary load at its real time scale, replayed once per prior: goodput's capacity
prior is the simulator's own (its measured envelope, the truth) times each factor, and the operator's
capacity learner (`controllers.autoscale.capacity_learner`) refines it from the simulated engines on
every tick. Printed per factor: the capacity in use every five minutes (source, value, confidence),
the first time it came within 10 % of the truth, the time from which it stayed there to the end
of the replay, the share of decisions after 30 minutes within 10 % of it, and
SLO-met requests per GPU-hour against the run started from the truth (factor 1). With
--without-learning the same factors run once more with the learner off, for contrast.
Asserts nothing: these are figures.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from goodput.controllers.autoscale.model import LearntCapacity
from goodput.simulator.config import build_setup
from goodput.simulator.goodput_policy import GoodputPolicy
from goodput.simulator.runner import Bench, RunOptions

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT.parent / "shared" / "traces"
WITHIN = 0.10


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trace", default=str(TRACES / "AzureLLMInferenceTrace_conv.csv"))
    parser.add_argument("--modelgroup", default=str(ROOT / "manifests/samples/modelgroup-llama-8b-tp1.yaml"))
    parser.add_argument("--policy", default=str(ROOT / "manifests/samples/slopolicy-interactive.yaml"))
    parser.add_argument("--start-seconds", type=float, default=1200.0)
    parser.add_argument("--duration-seconds", type=float, default=2700.0)
    parser.add_argument("--rate-multiplier", type=float, default=8.0)
    parser.add_argument("--factors", default="0.5,1,2", help="prior / truth, comma-separated (1 is added)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--without-learning", action="store_true", help="also run each factor unlearnt")
    return parser.parse_args()


def converged_at(history: list[tuple[float, LearntCapacity]], truth: float, start: float) -> float | None:
    """Seconds from the start of the replay after which the capacity in use stayed within 10 % of
    the truth to the end; None if it never settled there."""
    settled: float | None = None
    for at, capacity in history:
        if abs(capacity.work_seconds_per_second / truth - 1) <= WITHIN:
            settled = at if settled is None else settled
        else:
            settled = None
    return None if settled is None else settled - start


def first_within(history: list[tuple[float, LearntCapacity]], truth: float, start: float) -> float | None:
    """Seconds from the start of the replay to the first capacity in use within 10 % of the truth."""
    return next(
        (at - start for at, c in history if abs(c.work_seconds_per_second / truth - 1) <= WITHIN), None
    )


def share_within_after(
    history: list[tuple[float, LearntCapacity]], truth: float, start: float, after_seconds: float
) -> float | None:
    """The share of decisions from `after_seconds` on whose capacity was within 10 % of the truth."""
    late = [c for at, c in history if at - start >= after_seconds]
    if not late:
        return None
    return sum(abs(c.work_seconds_per_second / truth - 1) <= WITHIN for c in late) / len(late)


def one_run(bench: Bench, factor: float, *, learn: bool) -> tuple[GoodputPolicy, dict[str, Any], float]:
    policy = GoodputPolicy.for_setup(
        bench.setup, bench.workload, bench.envelope, capacity_prior_factor=factor, learn_capacity=learn
    )
    started = time.perf_counter()
    _, report = bench.run("goodput", policy)
    return policy, report, time.perf_counter() - started


def main() -> None:
    args = parse_args()
    factors = sorted({1.0, *(float(value) for value in args.factors.split(","))})
    setup = build_setup(Path(args.modelgroup), Path(args.policy))
    options = RunOptions(
        trace=args.trace,
        seed=args.seed,
        rate_multiplier=args.rate_multiplier,
        start_seconds=args.start_seconds,
        duration_seconds=args.duration_seconds,
    )
    bench = Bench(setup, options)
    truth = bench.envelope.work_seconds_per_second
    print(
        f"trace {Path(args.trace).name} from {args.start_seconds:g} s for {args.duration_seconds:g} s at "
        f"{args.rate_multiplier:g}x, {len(bench.workload)} requests; {setup.model_name} on {setup.gpu_name}"
    )
    print(f"truth (the simulator's measured envelope): C = {truth:.4f} work-s/s per group")
    runs = {factor: one_run(bench, factor, learn=True) for factor in factors}
    baseline = float(runs[1.0][1]["goodput_per_gpu_hour"])
    for factor, (policy, report, wall) in runs.items():
        history = policy.capacity_history
        start = history[0][0] if history else 0.0
        print(f"\nprior {factor:g}x truth, learning on ({wall:.0f} s wall)")
        next_print = start
        for at, capacity in history:
            if at >= next_print:
                print(
                    f"  t={at - start:5.0f} s  {capacity.source:8s} C={capacity.work_seconds_per_second:.4f} "
                    f"({capacity.work_seconds_per_second / truth:.2f}x)  confidence {capacity.confidence:.2f}"
                )
                next_print = at + 300.0
        settled = converged_at(history, truth, start)
        first = first_within(history, truth, start)
        late = share_within_after(history, truth, start, 1800.0)
        print(
            "  first within 10 % of the truth at: "
            + ("never" if first is None else f"{first:.0f} s ({first / 60:.1f} min)")
            + "; decisions within 10 % after 30 min: "
            + ("none made" if late is None else f"{late:.0%}")
        )
        per_hour = float(report["goodput_per_gpu_hour"])
        print(
            "  within 10 % of the truth to the end from: "
            + ("never" if settled is None else f"{settled:.0f} s ({settled / 60:.1f} min)")
        )
        print(
            f"  SLO-met requests per GPU-hour {per_hour:.0f} vs {baseline:.0f} from the truth "
            f"({per_hour / baseline - 1:+.1%}); GPU-hours {report['gpu_hours']:.2f}"
        )
    if args.without_learning:
        print("\nwithout learning (the prior used as given):")
        for factor in factors:
            _, report, _ = one_run(bench, factor, learn=False)
            per_hour = float(report["goodput_per_gpu_hour"])
            print(
                f"  prior {factor:g}x: SLO-met requests per GPU-hour {per_hour:.0f} "
                f"({per_hour / baseline - 1:+.1%} vs learnt from the truth); "
                f"GPU-hours {report['gpu_hours']:.2f}"
            )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
