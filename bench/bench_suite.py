"""The fair benchmark suite (`make bench`): every trace against both sample ModelGroups, each policy
tuned on the training window and reported on the test window, with the hindsight oracle.

Run: .venv/bin/python bench/bench_suite.py --traces ../shared/traces --out out/bench [--workers 2]
        [--only TRACE,...] [--models llama-8b-tp1,...] [--gateway] [--seed N]

--seed draws every case anew: the thinning or replication of each request trace, the arrivals and
lengths of each rate series, every request's class and the step-time noise (a flash crowd's
arrivals and lengths keep their own seed, the trace's). The default, 0, is the run docs/benchmarks.md
shows; another seed tells whether a case's verdict rests on one draw.

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

from goodput.simulator.runner import sanitize
from goodput.simulator.suite import SUITE_MODELS, TRACES, run_suite
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
    parser.add_argument("--only", type=lambda text: set(text.split(",")), help="trace names to run")
    parser.add_argument("--models", type=lambda text: set(text.split(",")), help="model names to run")
    parser.add_argument(
        "--gateway", action="store_true", help="the gateway's request path in front of the groups"
    )
    parser.add_argument("--seed", type=int, default=0, help="the draw of every case (default 0)")
    args = parser.parse_args()
    traces = [t for t in TRACES if args.only is None or t.name in args.only]
    models = [m for m in SUITE_MODELS if args.models is None or m.name in args.models]
    if not traces or not models:
        print(
            f"bench_suite: nothing to run; traces: {', '.join(t.name for t in TRACES)}; "
            f"models: {', '.join(m.name for m in SUITE_MODELS)}",
            file=sys.stderr,
        )
        return 2
    started = time.perf_counter()
    try:
        records = run_suite(
            args.traces,
            args.samples,
            traces=traces,
            models=models,
            workers=args.workers,
            seed=args.seed,
            gateway=args.gateway,
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
    run += ["behind the gateway"] if args.gateway else []
    run += [f"seed {args.seed}"] if args.seed else []
    preamble = f"`make bench` ({', '.join(run)}): wall {wall:.0f} s on {machine()}."
    text = markdown(records, preamble)
    (args.out / "table.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
