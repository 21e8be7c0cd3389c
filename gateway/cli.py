"""`goodput gateway`: serve the OpenAI API in front of one ModelGroup's Ready leaders.

Cluster mode (default): watch the ModelGroup and its SLOPolicy through the API server (a change
applies without a restart; one that cannot be compiled is logged and the last good policy stays),
and watch the group leaders' pods. Standalone mode (`--modelgroup FILE --policy FILE --upstream
NAME=URL ...`): the same gateway in front of fixed upstreams, for benchmarks and local tries.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from pathlib import Path

import yaml
from prometheus_client import start_http_server

from goodput.api.modelgroup import ModelGroup
from goodput.api.slopolicy import SloPolicy
from goodput.controllers.compile.request_path import RequestPathPolicy, compile_request_path
from goodput.gateway.connections import start_serving
from goodput.gateway.groups import GroupEndpoint, GroupSource, StaticGroupSource
from goodput.gateway.kube import KubeGroupSource, KubePolicySource, api_server_from_environment
from goodput.gateway.limits import MIB, ClientLimits
from goodput.gateway.metrics import GatewayMetrics
from goodput.gateway.server import Gateway

log = logging.getLogger("goodput.gateway")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model-group", default=os.environ.get("GOODPUT_MODEL_GROUP"), help="ModelGroup to front"
    )
    parser.add_argument(
        "--namespace",
        default=os.environ.get("POD_NAMESPACE", "default"),
        help="its namespace (default: $POD_NAMESPACE)",
    )
    parser.add_argument("--listen-host", default="0.0.0.0", help="address to serve the OpenAI API on")
    parser.add_argument("--listen-port", type=int, default=8080)
    parser.add_argument("--metrics-port", type=int, default=9090, help="Prometheus metrics (0: none)")
    parser.add_argument(
        "--bytes-per-token", type=float, default=4.0, help="prompt text bytes per token estimate"
    )
    parser.add_argument(
        "--start-timeout-seconds",
        type=float,
        default=30.0,
        help="how long to wait for the ModelGroup and SLOPolicy at start",
    )
    _add_client_limits(parser.add_argument_group("client limits (docs/gateway.md)"))
    standalone = parser.add_argument_group("standalone mode")
    standalone.add_argument("--modelgroup", type=Path, help="ModelGroup YAML instead of the API server's")
    standalone.add_argument("--policy", type=Path, help="SLOPolicy YAML instead of the API server's")
    standalone.add_argument(
        "--upstream",
        action="append",
        default=[],
        metavar="GROUP=URL",
        help="a Ready group's leader (repeatable)",
    )


def _add_client_limits(group: argparse._ArgumentGroup) -> None:
    """The bounds on what one client may hold (`ClientLimits`, whose defaults these are)."""
    default = ClientLimits()
    options: list[tuple[str, type, float, str]] = [
        (
            "--header-timeout-seconds",
            float,
            default.header_timeout_seconds,
            "close a connection whose request head is not whole this long after it opened or after "
            "the head's first byte",
        ),
        (
            "--body-timeout-seconds",
            float,
            default.body_timeout_seconds,
            "answer 408 and close when a request body is not whole this long after its head",
        ),
        (
            "--keepalive-timeout-seconds",
            float,
            default.keepalive_timeout_seconds,
            "close a connection idle this long between requests",
        ),
        (
            "--max-connections-per-client",
            int,
            default.max_connections_per_client,
            "connections one client address may hold open; more are closed as they open (0: no cap)",
        ),
        (
            "--max-body-mib",
            float,
            default.max_body_bytes / MIB,
            "refuse a larger request body with 413, before reading it",
        ),
        (
            "--body-budget-mib",
            float,
            default.body_budget_bytes / MIB,
            "MiB all request bodies in the gateway may hold together; past it, 503 with Retry-After",
        ),
    ]
    for flag, kind, value, text in options:
        group.add_argument(flag, type=kind, default=value, help=f"{text} (default %(default)g)")


def client_limits(args: argparse.Namespace) -> ClientLimits:
    try:
        return ClientLimits(
            header_timeout_seconds=args.header_timeout_seconds,
            body_timeout_seconds=args.body_timeout_seconds,
            keepalive_timeout_seconds=args.keepalive_timeout_seconds,
            max_connections_per_client=args.max_connections_per_client,
            max_body_bytes=round(args.max_body_mib * MIB),
            body_budget_bytes=round(args.body_budget_mib * MIB),
        )
    except ValueError as error:
        raise SystemExit(f"client limits: {error}") from None


async def _first_policy(
    source: KubePolicySource, timeout_seconds: float
) -> tuple[RequestPathPolicy | str, asyncio.Task[None], asyncio.Queue[RequestPathPolicy | str]]:
    """Start the ModelGroup and SLOPolicy watches and wait for their first compiled policy; later
    ones arrive on the returned queue."""
    updates: asyncio.Queue[RequestPathPolicy | str] = asyncio.Queue()
    task = asyncio.create_task(source.run(updates.put_nowait), name="policy-watch")
    try:
        first = await asyncio.wait_for(updates.get(), timeout_seconds)
    except TimeoutError:
        first = (
            f"no answer from the API server about {source.namespace}/{source.name} in {timeout_seconds:g}s"
        )
    return first, task, updates


async def _follow_policy(gateway: Gateway, updates: asyncio.Queue[RequestPathPolicy | str]) -> None:
    """Apply every later policy; one that cannot be compiled is logged and the last good one stays."""
    while True:
        update = await updates.get()
        if isinstance(update, str):
            log.error("keeping the current policy: %s", update)
            continue
        try:
            gateway.update_policy(update)
        except ValueError as error:
            log.error("keeping the current policy: %s", error)
            continue
        log.info("policy updated for %s", update.model_group)


def _standalone(args: argparse.Namespace) -> tuple[RequestPathPolicy | str, GroupSource]:
    model_group = ModelGroup.model_validate(yaml.safe_load(args.modelgroup.read_text()))
    slo = SloPolicy.model_validate(yaml.safe_load(args.policy.read_text()))
    endpoints = []
    for item in args.upstream:
        name, _, url = item.partition("=")
        if not name or not url:
            raise SystemExit(f"--upstream {item!r}: expected GROUP=URL")
        endpoints.append(GroupEndpoint(name, url.rstrip("/"), ready=True, draining=False))
    return compile_request_path(model_group, slo), StaticGroupSource(endpoints)


async def _serve(args: argparse.Namespace) -> int:
    limits = client_limits(args)
    source: GroupSource
    background: list[asyncio.Task[None]] = []
    updates: asyncio.Queue[RequestPathPolicy | str] | None = None
    if args.modelgroup or args.policy:
        if not (args.modelgroup and args.policy):
            raise SystemExit("standalone mode needs both --modelgroup and --policy")
        policy, source = _standalone(args)
    else:
        if not args.model_group:
            raise SystemExit("--model-group (or $GOODPUT_MODEL_GROUP) is required")
        server = api_server_from_environment()
        policies = KubePolicySource(server, args.namespace, args.model_group)
        policy, watch, updates = await _first_policy(policies, args.start_timeout_seconds)
        background.append(watch)
        if policies.model_group is not None:
            port = policies.model_group.spec.engine.port
            source = KubeGroupSource(server, args.namespace, args.model_group, port)
    if isinstance(policy, str):
        log.error("cannot serve: %s", policy)
        for task in background:
            task.cancel()
        return 2
    metrics = GatewayMetrics()
    if args.metrics_port:
        start_http_server(args.metrics_port, registry=metrics.registry)
    gateway = Gateway(policy, source, metrics=metrics, bytes_per_token=args.bytes_per_token, limits=limits)
    if updates is not None:
        background.append(asyncio.create_task(_follow_policy(gateway, updates), name="policy-updates"))
    runner = await start_serving(
        gateway.app(), args.listen_host, args.listen_port, limits, gateway.count_connection_closed
    )
    log.info("gateway for %s serving on %s:%d", policy.served_model, args.listen_host, args.listen_port)
    try:
        await asyncio.Event().wait()
    finally:
        for task in background:
            task.cancel()
        await runner.cleanup()
    return 0


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        return asyncio.run(_serve(args))
    except KeyboardInterrupt:
        return 0
