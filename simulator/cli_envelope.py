"""`goodput envelope`: measure a ModelGroup's capacity envelope on a trace, and print the `profile`
block to paste into the manifest, so the operator runs on a measured figure.

The envelope is measured in the fleet simulator on the trace's feasible requests (those whose
zero-load floors fit their class's targets) by a fleet of several groups behind the router, each rate
repeated with other seeds (`simulator.envelope.measure_envelope`), on steady arrivals drawn from the
trace's requests by default (`--arrivals trace` keeps the trace's time profile: see that module for
why the decision code wants the steady figure). Any `capacityWorkSecondsPerSecond` already in the
manifest is ignored: it is what this command replaces. With `--endpoint URL --model NAME` the
envelope is measured on a live OpenAI-compatible server instead (`simulator.cli_endpoint`).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

import numpy as np
import yaml

from goodput.simulator import cli_endpoint
from goodput.simulator.cli_simulate import add_common_arguments, bench_from
from goodput.simulator.envelope import CapacityEnvelope, EnvelopeNotFoundError, EnvelopeSearch
from goodput.simulator.feasible import NoFeasibleRequestsError
from goodput.simulator.runner import Bench


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)
    cli_endpoint.add_arguments(parser)
    parser.add_argument("--groups", type=int, default=4, help="groups in the trial fleet (default 4)")
    parser.add_argument("--repeats", type=int, default=2, help="seeded repeats of each trial (default 2)")
    parser.add_argument(
        "--arrivals",
        choices=("steady", "trace"),
        default="steady",
        help="how trials offer the requests: Poisson arrivals at each rate (default), or the trace's "
        "own time profile",
    )


def profile_block(bench: Bench, envelope: CapacityEnvelope) -> dict[str, Any]:
    """The manifest's `profile` with the measured figure in `capacityWorkSecondsPerSecond`."""
    return cli_endpoint.profile_fields(bench, envelope.work_seconds_per_second, None)


def explanation(bench: Bench, envelope: CapacityEnvelope) -> list[str]:
    feasibility = bench.feasibility
    classes = bench.setup.classes
    lines = [
        f"trace {bench.options.trace}: {len(bench.workload)} requests, "
        f"{int(np.count_nonzero(feasibility.feasible))} feasible on an idle group",
    ]
    for summary in feasibility.classes:
        lines.append(
            f"  class {summary.name}: {summary.infeasible}/{summary.requests} infeasible "
            f"(prompts fit the TTFT target up to {summary.longest_feasible_prompt_tokens} tokens)"
        )
    bounds = ", ".join(
        f"{targets.name} >= {bound:.4f}"
        for targets, bound in zip(classes, envelope.attainment_lower_bounds, strict=False)
    )
    lines += [
        f"envelope: {envelope.requests_per_second:.3g} req/s per group passed, "
        f"{envelope.failing_requests_per_second:.3g} failed ({envelope.groups} groups, {envelope.repeats} "
        f"repeats of {envelope.trial_seconds:.0f} s per rate on {envelope.arrivals} arrivals, "
        f"{envelope.trials} rates)",
        f"attainment at that rate, 95 % lower bound: {bounds}",
    ]
    return [f"# {line}" for line in lines]


def run(args: argparse.Namespace) -> int:
    if args.endpoint:
        return cli_endpoint.run(args)
    try:
        bench = bench_from(args)
        bench.setup = dataclasses.replace(bench.setup, measured_capacity_work_seconds_per_second=None)
        bench.search = EnvelopeSearch(
            groups=args.groups,
            repeats=args.repeats,
            trial_seconds=args.capacity_trial_seconds,
            arrivals=args.arrivals,
        )
        envelope = bench.envelope
    except (EnvelopeNotFoundError, NoFeasibleRequestsError) as error:
        print(f"goodput envelope: {error}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as error:
        print(f"goodput envelope: {error}", file=sys.stderr)
        return 2
    print("\n".join(explanation(bench, envelope)))
    print(yaml.safe_dump(profile_block(bench, envelope), sort_keys=False), end="")
    return 0
