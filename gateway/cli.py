"""`goodput gateway`: serve the OpenAI API in front of one ModelGroup's Ready leaders.

Cluster mode (default): read the ModelGroup and its SLOPolicy from the API server, watch the group
leaders' pods. Standalone mode (`--modelgroup FILE --policy FILE --upstream NAME=URL ...`): the same
gateway in front of fixed upstreams, for benchmarks and local tries.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web
from prometheus_client import start_http_server

from goodput.api.modelgroup import ModelGroup
from goodput.api.slopolicy import SloPolicy
from goodput.controllers.request_path import RequestPathPolicy, compile_request_path
from goodput.gateway.groups import GroupEndpoint, GroupSource, StaticGroupSource
from goodput.gateway.kube import ApiServer, KubeGroupSource, api_server_from_environment
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


async def _read_object(server: ApiServer, path: str) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession(headers=server.headers) as session,
        session.get(server.host + path, ssl=server.ssl_context) as response,
    ):
        response.raise_for_status()
        body: dict[str, Any] = await response.json()
        return body


async def _cluster_policy(
    args: argparse.Namespace,
) -> tuple[RequestPathPolicy | str, ModelGroup | None, ApiServer]:
    server = api_server_from_environment()
    base = f"/apis/goodput.dev/v1alpha1/namespaces/{args.namespace}"
    model_group = ModelGroup.model_validate(
        await _read_object(server, f"{base}/modelgroups/{args.model_group}")
    )
    ref = model_group.spec.policy_ref
    if ref is None:
        return (
            f"ModelGroup {args.model_group} has no spec.policyRef: the gateway needs its SLOPolicy",
            None,
            server,
        )
    slo = SloPolicy.model_validate(await _read_object(server, f"{base}/slopolicies/{ref.name}"))
    return compile_request_path(model_group, slo), model_group, server


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
    source: GroupSource
    if args.modelgroup or args.policy:
        if not (args.modelgroup and args.policy):
            raise SystemExit("standalone mode needs both --modelgroup and --policy")
        policy, source = _standalone(args)
    else:
        if not args.model_group:
            raise SystemExit("--model-group (or $GOODPUT_MODEL_GROUP) is required")
        policy, model_group, server = await _cluster_policy(args)
        if isinstance(policy, RequestPathPolicy) and model_group is not None:
            source = KubeGroupSource(server, args.namespace, args.model_group, model_group.spec.engine.port)
    if isinstance(policy, str):
        log.error("cannot serve: %s", policy)
        return 2
    metrics = GatewayMetrics()
    if args.metrics_port:
        start_http_server(args.metrics_port, registry=metrics.registry)
    gateway = Gateway(policy, source, metrics=metrics, bytes_per_token=args.bytes_per_token)
    runner = web.AppRunner(gateway.app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, args.listen_host, args.listen_port)
    await site.start()
    log.info("gateway for %s serving on %s:%d", policy.served_model, args.listen_host, args.listen_port)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
    return 0


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        return asyncio.run(_serve(args))
    except KeyboardInterrupt:
        return 0
