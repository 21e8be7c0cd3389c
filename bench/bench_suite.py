"""The fair benchmark suite (`make bench`): whole days of every rate trace at their own time scale
against both sample ModelGroups, each policy tuned on the training day and reported on the test
day, with the hindsight oracle.

Run: .venv/bin/python bench/bench_suite.py --traces TRACES --out out/bench [--workers 2]
        [--only CASE,...] [--models llama-8b-tp1,...] [--policies goodput,kpa,...]
        [--shave-trials N] [--gateway] [--seed N]

--seed draws every case anew: the arrivals and lengths of each day, the bursts, every request's
class and the step-time noise. The default, 0, is the run docs/benchmarks.md shows; another seed
tells whether a case's verdict rests on one draw. --policies and --shave-trials bound the run time
(a day of the 8B sample at its level is millions of requests): each run prints its figures and wall
time to stderr as it ends.

With --gateway every run (each policy's sweep and test, and the oracle's search) has the gateway's
request path (admission gates, fair queue, routing) in front of the groups; each run's record then
counts the requests it refused.

Writes OUT/results.json (every case's sweep, choice, test run, envelope and oracle), OUT/table.md
(the tables below, with the machine and the wall time) and OUT/<model>/<trace>/cost-vs-attainment.png.
Prints the table. Nothing is asserted: these are figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

from goodput.simulator.fair_bench import SUITE_POLICIES
from goodput.simulator.runner import sanitize
from goodput.simulator.suite import DAY_CASES, SUITE_MODELS, SuiteOptions, run_suite
from goodput.simulator.suite_report import markdown, plot_curves


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    return (
        f"{os.cpu_count()} cores ({cpu}), load average at the end {load}; Python {platform.python_version()}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=Path("../shared/traces"))
    parser.add_argument("--samples", type=Path, default=Path("manifests/samples"))
    parser.add_argument("--out", type=Path, default=Path("out/bench"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--only", type=lambda text: set(text.split(",")), help="day cases to run")
    parser.add_argument(
        "--policies",
        type=lambda text: tuple(text.split(",")),
        default=SUITE_POLICIES,
        help=f"policies to tune (default all: {','.join(SUITE_POLICIES)})",
    )
    parser.add_argument(
        "--shave-trials", type=int, default=24, help="test-day runs the oracle may spend shaving (default 24)"
    )
    parser.add_argument("--models", type=lambda text: set(text.split(",")), help="model names to run")
    parser.add_argument(
        "--gateway", action="store_true", help="the gateway's request path in front of the groups"
    )
    parser.add_argument("--seed", type=int, default=0, help="the draw of every case (default 0)")
    args = parser.parse_args()
    traces = [t for t in DAY_CASES if args.only is None or t.name in args.only]
    models = [m for m in SUITE_MODELS if args.models is None or m.name in args.models]
    if not traces or not models:
        print(
            f"bench_suite: nothing to run; cases: {', '.join(t.name for t in DAY_CASES)}; "
            f"models: {', '.join(m.name for m in SUITE_MODELS)}",
            file=sys.stderr,
        )
        return 2
    started = time.perf_counter()
    try:
        records = run_suite(
            args.traces,
            args.samples,
            cases=traces,
            models=models,
            workers=args.workers,
            options=SuiteOptions(
                policies=args.policies, shave_trials=args.shave_trials, seed=args.seed, gateway=args.gateway
            ),
        )
    except ValueError as error:
        print(f"bench_suite: {error}", file=sys.stderr)
        return 2
    wall = time.perf_counter() - started
    args.out.mkdir(parents=True, exist_ok=True)
    for record in records:
        if "error" not in record:
            plot_curves(record, args.out / record["model"] / record["trace"])
    (args.out / "results.json").write_text(json.dumps(sanitize(records), indent=1) + "\n")
    run = [f"{len(records)} cases", f"{args.workers} worker processes"]
    run += [f"policies {','.join(args.policies)}"] if args.policies != SUITE_POLICIES else []
    run += [f"oracle shaving {args.shave_trials} runs"] if args.shave_trials != 24 else []
    run += ["behind the gateway"] if args.gateway else []
    run += [f"seed {args.seed}"] if args.seed else []
    preamble = f"`make bench` ({', '.join(run)}): wall {wall:.0f} s on {machine()}."
    text = markdown(records, preamble)
    (args.out / "table.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
