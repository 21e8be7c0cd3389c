"""`goodput load`: replay a trace as real streaming HTTP requests, open loop, bounded in count and time.

Targets are base URLs (`--target http://HOST:PORT`, repeatable) or the ready endpoints of a Service
(`--service NAMESPACE/NAME`, from its EndpointSlices, refreshed while sending). Only this machine is
ever contacted: loopback, or the local cluster's pod network (see `loadgen.TargetPolicy`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import secrets
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from goodput.simulator.workload import compress_time, load_trace, multiply_rate, truncate
from goodput.testbed.emulator_kube import KubeClient
from goodput.testbed.loadgen import (
    DEFAULT_CONCURRENCY_LIMIT,
    DEFAULT_DURATION_SECONDS,
    DEFAULT_MAX_REQUESTS,
    DEFAULT_REQUEST_TIMEOUT_SECONDS,
    LoadGenerator,
    LoadReport,
    LoadSettings,
    TargetPolicy,
    TargetPool,
    UnsafeTargetError,
    parse_target,
    plan_requests,
    ready_endpoints,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trace",
        required=True,
        help="Azure CSV, Mooncake JSONL or synthetic:rate=...,duration=... (as `goodput simulate`)",
    )
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--target", action="append", metavar="URL", help="http://HOST:PORT (repeatable)")
    where.add_argument("--service", metavar="NAMESPACE/NAME", help="send to the Service's ready endpoints")
    parser.add_argument(
        "--service-port", default=None, help="port name or number (default: 'http', else the first)"
    )
    parser.add_argument(
        "--kubeconfig", default=os.environ.get("KUBECONFIG"), help="for --service (default: $KUBECONFIG)"
    )
    parser.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    parser.add_argument("--model", default=None, help="model field of each request (default: left out)")
    parser.add_argument("--rate-multiplier", type=float, default=1.0)
    parser.add_argument("--time-compression", type=float, default=1.0)
    parser.add_argument("--max-requests", type=int, default=DEFAULT_MAX_REQUESTS)
    parser.add_argument(
        "--duration-seconds",
        type=float,
        default=DEFAULT_DURATION_SECONDS,
        help="stop sending after this long (the run ends at most one request timeout later)",
    )
    parser.add_argument(
        "--concurrency-limit",
        type=int,
        default=DEFAULT_CONCURRENCY_LIMIT,
        help="most requests in flight; a request due beyond it is counted and not sent",
    )
    parser.add_argument("--request-timeout-seconds", type=float, default=DEFAULT_REQUEST_TIMEOUT_SECONDS)
    parser.add_argument("--max-output-tokens", type=int, default=None, help="cap each request's output")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write the report as JSON here")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.max_requests < 1 or args.duration_seconds <= 0 or args.concurrency_limit < 1:
        print(
            "goodput load: --max-requests, --duration-seconds and --concurrency-limit must be positive",
            file=sys.stderr,
        )
        return 2
    try:
        report = asyncio.run(_main(args))
    except (UnsafeTargetError, ValueError, OSError) as error:
        print(f"goodput load: {error}", file=sys.stderr)
        return 2
    print(report.summary())
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report.as_dict(), indent=2) + "\n")
        print(f"report written to {args.out}")
    return 0


async def _main(args: argparse.Namespace) -> LoadReport:
    workload = load_trace(args.trace, seed=args.seed)
    workload = compress_time(workload, args.time_compression)
    workload = multiply_rate(workload, args.rate_multiplier, args.seed)
    workload = truncate(workload, args.duration_seconds)
    plan = plan_requests(
        workload,
        max_requests=args.max_requests,
        duration_seconds=args.duration_seconds,
        max_output_tokens=args.max_output_tokens,
    )
    policy = TargetPolicy()
    run_id = secrets.token_hex(3)

    def settings(refresh: Callable[[], Awaitable[Sequence[str]]] | None = None) -> LoadSettings:
        return LoadSettings(
            endpoint=args.endpoint,
            model=args.model,
            duration_seconds=args.duration_seconds,
            concurrency_limit=args.concurrency_limit,
            request_timeout_seconds=args.request_timeout_seconds,
            run_id=run_id,
            refresh_targets=refresh,
        )

    if args.target:
        pool = TargetPool([parse_target(url) for url in args.target], policy)
        return await LoadGenerator(pool, settings()).run(plan, notes=workload.notes)
    namespace, _, name = args.service.partition("/")
    if not namespace or not name:
        raise ValueError(f"--service wants NAMESPACE/NAME, got {args.service!r}")
    if not args.kubeconfig:
        raise ValueError("--service needs a kubeconfig (--kubeconfig or $KUBECONFIG)")
    async with KubeClient.from_kubeconfig(args.kubeconfig) as kube:

        async def endpoints() -> list[str]:
            listing = await kube.get(
                f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices",
                {"labelSelector": f"kubernetes.io/service-name={name}"},
            )
            return ready_endpoints((listing or {}).get("items") or (), args.service_port)

        pool = TargetPool(await endpoints(), policy)
        if not pool.urls:
            print(
                f"goodput load: Service {args.service} has no ready endpoint yet; "
                "requests due before one appears are counted as not sent",
                file=sys.stderr,
            )
        return await LoadGenerator(pool, settings(endpoints)).run(plan, notes=workload.notes)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="goodput load", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
