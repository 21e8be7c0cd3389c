"""`goodput simulate`: replay a trace through a simulated vLLM fleet driven by one scaling policy.

Writes DIR/report.json (offered, admitted and SLO-attaining requests, attainment against both,
goodput, GPU-hours, cost per SLO-attaining request, scale events and their reasons, per-class and
latency figures, a time series) and DIR/timeline.png. `--engine batched` replays a fixed fleet of
hundreds or thousands of groups, every group advanced together in ticks (`simulator.batched`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from goodput.simulator.baselines import BASELINE_SETTINGS, parse_baseline_settings
from goodput.simulator.config import build_setup
from goodput.simulator.fleet import ROUTERS
from goodput.simulator.report import DEFAULT_GPU_HOUR_PRICE
from goodput.simulator.runner import POLICIES, Bench, RunOptions, write_report


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by `simulate` and `bench`."""
    parser.add_argument(
        "--trace",
        required=True,
        help="Azure 2023 CSV, Mooncake JSONL, or 'synthetic:rate=5,burst_start=600,"
        "burst_seconds=120,burst_multiplier=4,duration=1800'",
    )
    parser.add_argument(
        "--modelgroup", type=Path, help="ModelGroup manifest (default: Llama-3.1-8B on one H100)"
    )
    parser.add_argument("--policy", type=Path, help="SLOPolicy manifest (default: one interactive class)")
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--seed", type=int, default=0, help="seed of every random choice (default 0)")
    _add_trace_window_arguments(parser)
    _add_fleet_arguments(parser)
    _add_world_arguments(parser)
    parser.add_argument(
        "--gateway",
        action="store_true",
        help="put the gateway's request path (admission gates, fair queue, routing) in front of the "
        "groups; needs --modelgroup and --policy",
    )
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar on stderr (default: when stderr is a terminal)",
    )


def _add_trace_window_arguments(parser: argparse.ArgumentParser) -> None:
    """How the trace is thinned, compressed and windowed before it is replayed."""
    parser.add_argument(
        "--rate-multiplier",
        type=float,
        default=1.0,
        help="thin (<1) or replicate (>1) arrivals, keeping the time profile",
    )
    parser.add_argument(
        "--time-compression", type=float, default=1.0, help="divide arrival times by this factor"
    )
    parser.add_argument(
        "--start-seconds",
        type=float,
        help="replay the trace from this second on (after compression), restarting the clock there; "
        "with --duration-seconds D the window [S, S+D) is replayed",
    )
    parser.add_argument(
        "--duration-seconds",
        type=float,
        help="keep D seconds of arrivals (after compression): the first D, or D from --start-seconds",
    )


def _add_fleet_arguments(parser: argparse.ArgumentParser) -> None:
    """The fleet's size, ready time and price."""
    parser.add_argument(
        "--ready-time-seconds",
        type=float,
        help="median group ready time (default: the profile's readyTimeSeconds, else 120)",
    )
    parser.add_argument("--max-groups", type=int, help="override maxReplicas (a larger GPU budget)")
    parser.add_argument(
        "--gpu-hour-price",
        type=float,
        default=DEFAULT_GPU_HOUR_PRICE,
        help=f"US$ per GPU-hour (default {DEFAULT_GPU_HOUR_PRICE})",
    )
    parser.add_argument(
        "--fixed-groups",
        type=int,
        help="size of the fixed fleet (default: what the peak minute's work needs)",
    )
    parser.add_argument(
        "--initial-groups",
        type=int,
        help="groups ready at t=0 for every policy (default: what the first minute needs)",
    )


def _add_world_arguments(parser: argparse.ArgumentParser) -> None:
    """The simulated world: failures, step noise, routing, scraping, classes, the envelope's trials."""
    parser.add_argument("--failure-rate", type=float, default=0.0, help="group failures per group-hour")
    parser.add_argument(
        "--fail-at",
        type=float,
        action="append",
        default=[],
        help="fail one ready group at this time (seconds; repeatable)",
    )
    parser.add_argument(
        "--step-noise",
        type=float,
        default=0.04,
        help="σ of the lognormal noise on each engine step (default 0.04; 0 = off)",
    )
    parser.add_argument("--router", choices=ROUTERS, default="least-work")
    parser.add_argument("--scrape-interval-seconds", type=float, default=5.0)
    parser.add_argument(
        "--scrape-delay-seconds", type=float, default=5.0, help="decisions see metrics as of now minus this"
    )
    parser.add_argument(
        "--class-weights",
        type=lambda text: tuple(float(v) for v in text.split(",")),
        help="share of requests per SLO class, in the policy's order (default: equal)",
    )
    parser.add_argument("--trace-limit", type=int, help="read only the first N rows of the trace")
    parser.add_argument(
        "--capacity-prior-factor",
        type=float,
        default=1.0,
        help="start goodput from a capacity prior this many times the simulator's own (for example 0.5 "
        "or 2), to see how fast --learn-capacity converges (default 1)",
    )
    parser.add_argument(
        "--learn-capacity",
        action="store_true",
        help="goodput refines its capacity from the simulated engines, as the operator does",
    )
    parser.add_argument(
        "--forecast",
        action="store_true",
        help="goodput forecasts the offered work from the run's own history and asks for groups one "
        "ready time ahead of a rise, as the operator does with spec.forecast (it forecasts once the "
        "run has a day and about two hours behind it)",
    )
    parser.add_argument(
        "--capacity-trial-seconds",
        type=float,
        default=300.0,
        help="shortest trial (a fleet of several groups, feasible requests only) that measures the "
        "capacity envelope; a trial also lasts 50 times the tightest TTFT target, within the window "
        "(default 300)",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)
    parser.add_argument(
        "--autoscaler", choices=POLICIES, default="goodput", help="scaling policy (default goodput)"
    )
    parser.add_argument(
        "--baseline",
        choices=tuple(BASELINE_SETTINGS),
        help="run this baseline (instead of --autoscaler), set with --baseline-setting",
    )
    parser.add_argument(
        "--baseline-setting",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one of the baseline's settings (repeatable): "
        + "; ".join(f"{name}: {', '.join(knobs)}" for name, knobs in BASELINE_SETTINGS.items()),
    )
    parser.add_argument(
        "--engine",
        choices=("event", "batched"),
        default="event",
        help="event: every engine step timed (default); batched: the whole fleet advanced in ticks, "
        "for fleets of hundreds or thousands of groups (fixed fleet only, no gateway or failures)",
    )
    parser.add_argument(
        "--tick-seconds",
        type=float,
        default=0.1,
        help="the batched engine's tick (default 0.1 s); requests are timed within it",
    )


def policy_name(args: argparse.Namespace) -> str:
    """The policy to run: `--baseline` when given (it must agree with an explicit `--autoscaler`)."""
    baseline = getattr(args, "baseline", None)
    autoscaler: str = getattr(args, "autoscaler", "goodput")
    if baseline is None:
        if getattr(args, "baseline_setting", []):
            raise ValueError("--baseline-setting needs --baseline NAME (the baseline it sets)")
        return autoscaler
    if autoscaler not in ("goodput", baseline):
        raise ValueError(f"--baseline {baseline} and --autoscaler {autoscaler} name two policies; give one")
    return str(baseline)


def options_from(args: argparse.Namespace) -> RunOptions:
    progress = args.progress if args.progress is not None else sys.stderr.isatty()
    baseline = getattr(args, "baseline", None)
    settings = (
        parse_baseline_settings(baseline, getattr(args, "baseline_setting", []))
        if baseline is not None
        else {}
    )
    return RunOptions(
        baseline_settings=tuple(settings.items()),
        trace=args.trace,
        seed=args.seed,
        rate_multiplier=args.rate_multiplier,
        time_compression=args.time_compression,
        duration_seconds=args.duration_seconds,
        start_seconds=args.start_seconds,
        gpu_hour_price=args.gpu_hour_price,
        fixed_groups=args.fixed_groups,
        initial_groups=args.initial_groups,
        failure_rate_per_group_hour=args.failure_rate,
        scheduled_failures_seconds=tuple(args.fail_at),
        router=args.router,
        scrape_interval_seconds=args.scrape_interval_seconds,
        scrape_delay_seconds=args.scrape_delay_seconds,
        class_weights=args.class_weights,
        progress=progress,
        trace_limit=args.trace_limit,
        capacity_trial_seconds=args.capacity_trial_seconds,
        capacity_prior_factor=args.capacity_prior_factor,
        learn_capacity=args.learn_capacity,
        forecast=args.forecast,
        gateway=args.gateway,
        engine=getattr(args, "engine", "event"),
        tick_seconds=getattr(args, "tick_seconds", 0.1),
    )


def bench_from(args: argparse.Namespace) -> Bench:
    setup = build_setup(
        args.modelgroup,
        args.policy,
        ready_time_seconds=args.ready_time_seconds,
        step_noise_sigma=args.step_noise,
        max_groups=args.max_groups,
    )
    return Bench(setup, options_from(args))


def gateway_outcomes(figures: dict[str, object]) -> str:
    """The offered requests' outcomes at the gateway's door, on one line."""
    names = ("admitted", "deferred", "degraded", "rejected", "hold_expired", "infeasible")
    return f"{figures['offered']} offered: " + ", ".join(f"{figures[name]} {name}" for name in names)


def run(args: argparse.Namespace) -> int:
    try:
        name = policy_name(args)
        bench = bench_from(args)
        if bench.options.engine == "batched":
            bench.check_batched(name)
        autoscaler = bench.autoscaler(name)
    except (OSError, ValueError) as error:
        print(f"goodput simulate: {error}", file=sys.stderr)
        return 2
    _, report = bench.run(name, autoscaler)
    paths = write_report(report, args.out, f"{name} on {bench.workload.name}")
    print(
        f"{name}: {report['slo_met_requests']}/{report['offered_requests']} requests met the SLO "
        f"(attainment {report['attainment_offered']:.3f} of offered), {report['gpu_hours']:.2f} GPU-hours, "
        f"{report['scale_event_count']} scale events"
    )
    gateway = report.get("gateway")
    if gateway is not None:
        print("gateway: " + gateway_outcomes(gateway))
    for path in paths:
        print(f"wrote {path}")
    return 0
