"""`goodput envelope --endpoint URL --model NAME`: measure a live server's capacity envelope.

The ModelGroup, SLOPolicy and trace options are those of the simulated `goodput envelope`: the trace
gives the lengths (its feasible requests, as the operator counts them: those whose zero-load floors
fit their class's targets on this ModelGroup), the policy (or `--ttft-seconds`, `--itl-seconds`,
`--attainment`) the targets, the ModelGroup the work-seconds each request is priced at
(`estimators.work`, as the operator prices it). The server is swept with open-loop Poisson arrivals
(`simulator.endpoint_sweep` decides, `simulator.endpoint_client` sends), within `--max-requests`,
`--max-seconds` and `--max-rate`. The capacity printed is the highest rate that held times the mean
work of the requests offered: the figure `profile.capacityWorkSecondsPerSecond` records.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import numpy as np
import yaml

from goodput.estimators.work import WorkPricing
from goodput.simulator.cli_simulate import bench_from
from goodput.simulator.endpoint_client import (
    Endpoint,
    EndpointError,
    ServedModel,
    plan_requests,
    probe,
    run_step,
    served_model,
    settle,
)
from goodput.simulator.endpoint_sweep import (
    StepOutcome,
    StepRule,
    SweepBudget,
    SweepPlan,
    SweepStep,
    SweepStop,
    deadline_seconds,
    judge_step,
    next_step,
)
from goodput.simulator.envelope import wilson_lower_bound
from goodput.simulator.feasible import NoFeasibleRequestsError, assess, require_feasible_requests
from goodput.simulator.report import ClassTargets
from goodput.simulator.runner import Bench, analytic_rate_per_group
from goodput.simulator.workload import Workload


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The endpoint's flags, beside the simulated envelope's."""
    group = parser.add_argument_group("a live endpoint (instead of the simulator)")
    group.add_argument(
        "--endpoint", help="base URL of an OpenAI-compatible server, e.g. http://vllm-chat:8000"
    )
    group.add_argument("--model", help="the served model name (as /v1/models lists it)")
    group.add_argument("--max-requests", type=int, default=5000, help="requests sent at most (default 5000)")
    group.add_argument(
        "--max-seconds", type=float, default=1800.0, help="wall time of the sweep at most (default 1800)"
    )
    group.add_argument(
        "--max-rate", type=float, default=50.0, help="arrival rate at most, requests/s (default 50)"
    )
    group.add_argument("--first-rate", type=float, help="first rate tried (default: the profile's estimate)")
    group.add_argument(
        "--min-step-requests", type=int, default=200, help="requests a step offers at least (default 200)"
    )
    group.add_argument(
        "--min-step-seconds", type=float, default=30.0, help="seconds a step lasts at least (default 30)"
    )
    group.add_argument(
        "--timeout-seconds",
        type=float,
        default=30.0,
        help="how long the checks before the sweep wait for an answer (default 30)",
    )
    group.add_argument(
        "--api-key-env", help="environment variable holding the server's API key (vLLM's --api-key)"
    )
    group.add_argument("--ttft-seconds", type=float, help="one SLO class's TTFT target, instead of --policy")
    group.add_argument("--itl-seconds", type=float, help="its ITL target (mean gap between tokens)")
    group.add_argument("--attainment", type=float, default=0.95, help="its attainment target (default 0.95)")


@dataclass(frozen=True, slots=True)
class Offered:
    """The requests the sweep draws from: lengths, class and SLO deadline of each."""

    input_tokens: np.ndarray
    output_tokens: np.ndarray
    class_number: np.ndarray
    deadline_seconds: np.ndarray

    def fitting(self, max_model_len: int | None) -> Offered:
        if max_model_len is None:
            return self
        keep = self.input_tokens + self.output_tokens <= max_model_len
        return Offered(
            self.input_tokens[keep],
            self.output_tokens[keep],
            self.class_number[keep],
            self.deadline_seconds[keep],
        )


@dataclass(frozen=True, slots=True)
class SweepResult:
    """Every step, in the order run, why the search stopped, and what the server said of itself."""

    steps: tuple[StepOutcome, ...]
    stop: SweepStop
    served: ServedModel
    offered: Offered
    """The requests drawn from: the trace's feasible ones that fit the server's context."""


def offered_requests(workload: Workload, classes: Sequence[ClassTargets]) -> Offered:
    index = workload.class_index if workload.class_index is not None else np.zeros(len(workload), np.int64)
    deadlines = np.array(
        [
            deadline_seconds(classes[int(c)], int(n))
            for c, n in zip(index.tolist(), workload.output_tokens.tolist(), strict=True)
        ]
    )
    return Offered(workload.input_tokens, workload.output_tokens, index, deadlines)


async def measure_endpoint(
    endpoint: Endpoint,
    offered: Offered,
    classes: Sequence[ClassTargets],
    plan: SweepPlan,
    budget: SweepBudget,
    *,
    seed: int = 0,
) -> SweepResult:
    """Check the server, then sweep it until the planner stops; raises `EndpointError` on a server
    that cannot be measured (refused, timed out, errors, malformed replies, another model)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=endpoint.timeout_seconds)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        served = await served_model(session, endpoint)
        offered = offered.fitting(served.max_model_len)
        if len(offered.deadline_seconds) == 0:
            raise EndpointError(
                f"no request of the trace fits the server's max_model_len {served.max_model_len}: "
                "use a trace of shorter requests"
            )
        await probe(session, endpoint)
        drain = float(offered.deadline_seconds.max())
        plan = dataclasses.replace(plan, drain_seconds=drain, settle_seconds=drain)
        steps: list[StepOutcome] = []
        spent_requests = 1  # the probe
        rng = np.random.default_rng([seed, 23])
        while True:
            decided = next_step(
                plan, budget, steps, spent_requests=spent_requests, spent_seconds=loop.time() - start
            )
            if isinstance(decided, SweepStop):
                return SweepResult(tuple(steps), decided, served, offered)
            requests = plan_requests(
                decided,
                (offered.input_tokens, offered.output_tokens, offered.class_number),
                offered.deadline_seconds,
                rng,
            )
            spent_requests += len(requests)
            step_start = loop.time()
            timings = await run_step(session, endpoint, requests, seed + len(steps))
            elapsed = loop.time() - step_start
            if timings and all(timing.first_token_seconds is None for timing in timings):
                raise _silent(endpoint, decided, len(timings))
            await settle(session, endpoint, plan.settle_seconds)
            steps.append(judge_step(decided, timings, classes, elapsed))


def _silent(endpoint: Endpoint, step: SweepStep, requests: int) -> EndpointError:
    return EndpointError(
        f"none of the {requests} requests at {step.rate_per_second:.3g} req/s got a token from "
        f"{endpoint.base} before its SLO deadline: the server accepts requests but does not answer; "
        "check its health, or a --first-rate far below this one"
    )


def _classes(args: argparse.Namespace, bench: Bench) -> tuple[ClassTargets, ...]:
    if args.ttft_seconds is None and args.itl_seconds is None:
        return bench.setup.classes
    if args.ttft_seconds is None or args.itl_seconds is None:
        raise ValueError("--ttft-seconds and --itl-seconds go together (or give the targets in --policy)")
    return (ClassTargets("endpoint", args.ttft_seconds, args.itl_seconds, attainment=args.attainment),)


def _check_flags(args: argparse.Namespace) -> None:
    if not args.endpoint.startswith(("http://", "https://")):
        raise ValueError(
            f"--endpoint {args.endpoint!r} is no URL: give the server's base URL, e.g. http://vllm-chat:8000"
        )
    if not args.model:
        raise ValueError(
            "--endpoint needs --model: the served model name, as the server's /v1/models lists it"
        )
    if args.min_step_requests < 1 or args.min_step_seconds <= 0 or args.timeout_seconds <= 0:
        raise ValueError("--min-step-requests, --min-step-seconds and --timeout-seconds must be positive")
    if args.first_rate is not None and not args.first_rate > 0:
        raise ValueError(f"--first-rate must be positive, got {args.first_rate}")
    if not 0 < args.attainment <= 1:
        raise ValueError(f"--attainment must be in (0, 1], got {args.attainment}")


def prepare(
    args: argparse.Namespace,
) -> tuple[Bench, Offered, tuple[ClassTargets, ...], SweepPlan, SweepBudget]:
    """Everything the sweep needs from the flags, the manifests and the trace; ValueError on bad input."""
    _check_flags(args)
    budget = SweepBudget(args.max_requests, args.max_seconds, args.max_rate)
    bench = bench_from(args)
    classes = _classes(args, bench)
    workload = bench.workload
    if len(classes) != len(bench.setup.classes):
        workload = dataclasses.replace(workload, class_index=np.zeros(len(workload), np.int64))
    bench.setup = dataclasses.replace(bench.setup, classes=classes)
    feasibility = assess(workload, bench.setup.engine, classes)
    require_feasible_requests(feasibility, classes)
    feasible = workload.take(np.flatnonzero(feasibility.feasible), "feasible requests")
    bench.workload = feasible
    first = (
        args.first_rate
        if args.first_rate is not None
        else analytic_rate_per_group(bench.setup, feasible, bench.pricing)
    )
    plan = SweepPlan(
        first_rate_per_second=first,
        tightest_ttft_seconds=min(c.ttft_seconds for c in classes),
        drain_seconds=0.0,
        step=StepRule(min_requests=args.min_step_requests, min_seconds=args.min_step_seconds),
    )
    return bench, offered_requests(feasible, classes), classes, plan, budget


def step_table(steps: Sequence[StepOutcome], classes: Sequence[ClassTargets]) -> list[str]:
    """One line per step, in the order run: rate, length, requests, and each class's attainment."""
    lines = [
        "  rate req/s  seconds  requests  " + "  ".join(f"{c.name} (goal {c.attainment:g})" for c in classes)
    ]
    for outcome in steps:
        shares = "  ".join(
            f"{outcome.met[n]}/{outcome.judged[n]} = {outcome.attainment(n):.3f}" for n in range(len(classes))
        )
        verdict = "held" if outcome.passed else "failed"
        step = outcome.step
        lines.append(
            f"  {step.rate_per_second:10.3g}  {step.seconds:7.0f}  {outcome.requests:8d}  {shares}  {verdict}"
        )
    return lines


def mean_work_seconds(pricing: WorkPricing, offered: Offered) -> float:
    """The mean work of the requests the sweep drew from, priced as the operator prices it."""
    return float(
        np.mean(
            [
                pricing.prefill_work_seconds(float(n_in))
                + pricing.decode_work_seconds(float(n_in), float(n_out))
                for n_in, n_out in zip(
                    offered.input_tokens.tolist(), offered.output_tokens.tolist(), strict=True
                )
            ]
        )
    )


def profile_fields(
    bench: Bench, work_seconds_per_second: float, kv_capacity_tokens: int | None
) -> dict[str, Any]:
    group = bench.setup.model_group
    profile = group.spec.profile if group is not None else None
    fields: dict[str, Any] = (
        profile.model_dump(by_alias=True, exclude_none=True, mode="json") if profile is not None else {}
    )
    fields["capacityWorkSecondsPerSecond"] = float(f"{work_seconds_per_second:.4g}")
    if kv_capacity_tokens is not None:
        fields["kvCapacityTokens"] = kv_capacity_tokens
    return {"profile": fields}


def _report(args: argparse.Namespace, result: SweepResult, classes: Sequence[ClassTargets]) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    steps = [
        {
            "rate_per_second": o.step.rate_per_second,
            "seconds": o.step.seconds,
            "elapsed_seconds": o.elapsed_seconds,
            "met": list(o.met),
            "judged": list(o.judged),
            "passed": o.passed,
        }
        for o in result.steps
    ]
    body = {
        "endpoint": args.endpoint,
        "model": args.model,
        "classes": [c.name for c in classes],
        "stop": dataclasses.asdict(result.stop),
        "steps": steps,
    }
    (args.out / "endpoint-sweep.json").write_text(json.dumps(body, indent=2))


def run(
    args: argparse.Namespace,
    run_loop: Callable[[Coroutine[Any, Any, SweepResult]], SweepResult] = asyncio.run,
) -> int:
    """The command: 0 and the profile block, or a message naming what is wrong and no figure.
    `run_loop` runs the sweep's coroutine (a test runs it on a virtual clock)."""
    try:
        bench, offered, classes, plan, budget = prepare(args)
    except NoFeasibleRequestsError as error:
        print(f"goodput envelope: {error}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as error:
        print(f"goodput envelope: {error}", file=sys.stderr)
        return 2
    api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
    if args.api_key_env and not api_key:
        print(f"goodput envelope: --api-key-env names {args.api_key_env}, which is not set", file=sys.stderr)
        return 2
    endpoint = Endpoint(args.endpoint, args.model, args.timeout_seconds, api_key)
    try:
        result = run_loop(measure_endpoint(endpoint, offered, classes, plan, budget, seed=args.seed))
    except EndpointError as error:
        print(f"goodput envelope: {error}", file=sys.stderr)
        return 3
    _report(args, result, classes)
    table = step_table(result.steps, classes)
    if result.stop.capacity_per_second is None:
        print("\n".join(f"# {line}" for line in table), file=sys.stderr)
        print(f"goodput envelope: no capacity measured: {result.stop.reason}", file=sys.stderr)
        return 1
    work = result.stop.capacity_per_second * mean_work_seconds(bench.pricing, result.offered)
    print("\n".join(f"# {line}" for line in _explanation(args, result, classes, work) + table))
    print(
        yaml.safe_dump(profile_fields(bench, work, result.served.kv_capacity_tokens), sort_keys=False), end=""
    )
    return 0


def _explanation(
    args: argparse.Namespace, result: SweepResult, classes: Sequence[ClassTargets], work: float
) -> list[str]:
    held = next(
        o for o in result.steps if o.passed and o.step.rate_per_second == result.stop.capacity_per_second
    )
    bounds = ", ".join(
        f"{c.name} >= {wilson_lower_bound(held.met[n], held.judged[n]):.4f}" for n, c in enumerate(classes)
    )
    requests = sum(o.requests for o in result.steps)
    return [
        f"endpoint {args.endpoint}, model {args.model}: {len(result.steps)} steps, {requests} requests",
        f"envelope: {result.stop.reason}; {work:.4g} work-seconds per second",
        f"attainment at that rate, 95 % lower bound: {bounds}",
    ]
