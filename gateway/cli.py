"""`goodput gateway`: serve the OpenAI API in front of the Ready leaders of one or many ModelGroups.

Cluster mode (default): watch the ModelGroups of `--namespace` that `--selector` picks (every one
without a selector; `--model-group NAME` picks one) with their SLOPolicies through the API server,
and each served ModelGroup's group leaders' pods. A new, changed or deleted ModelGroup applies
without a restart; one that cannot be compiled is logged and a served one keeps its last good
policy. Standalone mode (`--modelgroup FILE --policy FILE --upstream [MODELGROUP/]GROUP=URL ...`):
the same gateway in front of fixed upstreams, for benchmarks and local tries.
`goodput gateway endpoint-picker --pool NAME` serves an InferencePool's endpoint picker instead
(`endpoint_picker_cli`).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import uvloop
import yaml
from prometheus_client import start_http_server

from goodput.api.modelgroup import ModelGroup
from goodput.api.slopolicy import SloPolicy
from goodput.controllers.compile.request_path import RequestPathPolicy, compile_request_path
from goodput.gateway import endpoint_picker_cli
from goodput.gateway.connections import start_serving
from goodput.gateway.front import ANY_MODEL_GROUP, GatewayFront
from goodput.gateway.groups import GroupEndpoint, GroupSource, StaticGroupSource
from goodput.gateway.kube import (
    ApiServer,
    KubeGroupSource,
    KubeModelGroupsSource,
    WatchedModelGroup,
    api_server_from_environment,
)
from goodput.gateway.limits import MIB, ClientLimits
from goodput.gateway.metrics import GatewayMetrics
from goodput.gateway.registry import plan_serving
from goodput.gateway.server import Gateway

log = logging.getLogger("goodput.gateway")

ModelGroupsReport = Mapping[str, WatchedModelGroup]

# Container allocations between two young-generation collections while serving: ten times
# CPython's 700. Each proxied request makes hundreds of short-lived objects, so at the default the
# collector ran every few requests.
YOUNG_COLLECTION_THRESHOLD = 7_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    picker = parser.add_subparsers(dest="gateway_command", metavar="[endpoint-picker]").add_parser(
        "endpoint-picker",
        help="serve an InferencePool's endpoint picker (Envoy ext-proc) with goodput's admission and routing",
    )
    endpoint_picker_cli.add_arguments(picker)
    picker.set_defaults(handler=endpoint_picker_cli.run)
    parser.add_argument(
        "--model-group",
        default=os.environ.get("GOODPUT_MODEL_GROUP"),
        help="serve this one ModelGroup (a selector of one)",
    )
    parser.add_argument(
        "--selector",
        default=os.environ.get("GOODPUT_MODEL_GROUP_SELECTOR", ""),
        help="label selector of the ModelGroups to serve (default: every ModelGroup of the namespace)",
    )
    parser.add_argument(
        "--namespace",
        default=os.environ.get("POD_NAMESPACE", "default"),
        help="the ModelGroups' namespace (default: $POD_NAMESPACE)",
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
        help="how long to wait for the API server's first answer about the ModelGroups at start",
    )
    _add_client_limits(parser.add_argument_group("client limits (docs/gateway.md)"))
    standalone = parser.add_argument_group("standalone mode")
    standalone.add_argument(
        "--modelgroup",
        type=Path,
        action="append",
        default=[],
        help="ModelGroup YAML instead of the API server's (repeatable; a file may hold several)",
    )
    standalone.add_argument(
        "--policy",
        type=Path,
        action="append",
        default=[],
        help="SLOPolicy YAML (repeatable); a ModelGroup takes the one its policyRef names, or the only one",
    )
    standalone.add_argument(
        "--upstream",
        action="append",
        default=[],
        metavar="[MODELGROUP/]GROUP=URL",
        help="a Ready group's leader (repeatable; name the ModelGroup when there are several)",
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


async def _first_report(
    source: KubeModelGroupsSource, timeout_seconds: float
) -> tuple[Mapping[str, WatchedModelGroup] | None, asyncio.Task[None], asyncio.Queue[ModelGroupsReport]]:
    """Start the ModelGroup and SLOPolicy watches and wait for their first report (None when the API
    server did not answer in time); later ones arrive on the returned queue."""
    updates: asyncio.Queue[ModelGroupsReport] = asyncio.Queue()
    task = asyncio.create_task(source.run(updates.put_nowait), name="model-group-watch")
    try:
        return await asyncio.wait_for(updates.get(), timeout_seconds), task, updates
    except TimeoutError:
        return None, task, updates


class ModelGroupFollower:
    """Keeps the front serving what the watch selects: a new ModelGroup is served, a changed one
    updated, a deleted or unselected one retired, all without a restart; one whose policy cannot be
    compiled is logged, and a served one keeps its last good policy."""

    def __init__(self, front: GatewayFront, server: ApiServer, namespace: str) -> None:
        self.front = front
        self.server = server
        self.namespace = namespace

    async def apply(self, report: Mapping[str, WatchedModelGroup]) -> None:
        served = {name: gateway.policy for name, gateway in self.front.model_groups.items()}
        plan = plan_serving(served, {name: watched.policy for name, watched in report.items()})
        for name, why in plan.unservable.items():
            what = "keeping the last good policy of" if name in served else "not serving"
            log.error("%s %s/%s: %s", what, self.namespace, name, why)
        for name in plan.retire:
            log.info("retiring ModelGroup %s/%s", self.namespace, name)
            reason = (
                f"ModelGroup {self.namespace}/{name} was deleted or is no longer selected by this gateway"
            )
            await self.front.retire(name, reason)
        for name in plan.update:
            policy = report[name].policy
            assert not isinstance(policy, str)
            try:
                self.front.update_policy(policy)
            except ValueError as error:
                log.error("keeping the current policy: %s", error)
                continue
            log.info("policy updated for %s/%s", self.namespace, name)
        for name in plan.start:
            watched = report[name]
            assert not isinstance(watched.policy, str) and watched.port is not None
            source = KubeGroupSource(self.server, self.namespace, name, watched.port)
            self.front.serve(Gateway(watched.policy, source, metrics=self.front.metrics), watched.created)
            log.info("serving ModelGroup %s/%s as %r", self.namespace, name, watched.policy.served_model)

    async def follow(self, updates: asyncio.Queue[ModelGroupsReport]) -> None:
        while True:
            await self.apply(await updates.get())


def _load_documents(paths: Sequence[Path]) -> list[dict[str, Any]]:
    return [doc for path in paths for doc in yaml.safe_load_all(path.read_text()) if doc]


def standalone_model_groups(args: argparse.Namespace) -> list[tuple[RequestPathPolicy | str, GroupSource]]:
    """Each ModelGroup of the --modelgroup files under its SLOPolicy (by spec.policyRef among the
    --policy files, or the only one), in front of its --upstream groups."""
    model_groups = [ModelGroup.model_validate(doc) for doc in _load_documents(args.modelgroup)]
    slos = [SloPolicy.model_validate(doc) for doc in _load_documents(args.policy)]
    by_name = {slo.metadata.name: slo for slo in slos}
    names = [model_group.metadata.name or "" for model_group in model_groups]
    endpoints: dict[str, list[GroupEndpoint]] = {name: [] for name in names}
    for item in args.upstream:
        target, _, url = item.partition("=")
        owner, _, group = target.rpartition("/")
        if not group or not url or (not owner and len(names) != 1):
            raise SystemExit(f"--upstream {item!r}: expected GROUP=URL, or MODELGROUP/GROUP=URL for several")
        owner = owner or names[0]
        if owner not in endpoints:
            raise SystemExit(f"--upstream {item!r}: no ModelGroup {owner!r} in --modelgroup")
        endpoints[owner].append(GroupEndpoint(group, url.rstrip("/"), ready=True, draining=False))
    served: list[tuple[RequestPathPolicy | str, GroupSource]] = []
    for model_group, name in zip(model_groups, names, strict=True):
        ref = model_group.spec.policy_ref
        slo = by_name.get(ref.name) if ref is not None else None
        slo = slo or (slos[0] if len(slos) == 1 else None)
        if slo is None:
            raise SystemExit(f"ModelGroup {name}: no SLOPolicy named by its spec.policyRef in --policy")
        served.append((compile_request_path(model_group, slo), StaticGroupSource(endpoints[name])))
    return served


async def _serve_from_cluster(
    args: argparse.Namespace, front: GatewayFront
) -> list[asyncio.Task[None]] | None:
    """Serve what the watch selects; None (after logging why) when there is nothing to start from."""
    server = api_server_from_environment()
    source = KubeModelGroupsSource(
        server, args.namespace, selector=args.selector or "", name=args.model_group or None
    )
    first, watch, updates = await _first_report(source, args.start_timeout_seconds)
    if first is None:
        log.error("cannot serve: no answer from the API server in %gs", args.start_timeout_seconds)
    elif args.model_group:  # one named ModelGroup: as before, it must be servable at start
        watched = first.get(args.model_group)
        why = (
            f"ModelGroup {args.namespace}/{args.model_group} does not exist"
            if watched is None
            else watched.policy
        )
        if isinstance(why, str):
            log.error("cannot serve: %s", why)
            first = None
    if first is None:
        watch.cancel()
        return None
    follower = ModelGroupFollower(front, server, args.namespace)
    await follower.apply(first)
    return [watch, asyncio.create_task(follower.follow(updates), name="model-group-updates")]


async def _serve(args: argparse.Namespace) -> int:
    limits = client_limits(args)
    metrics = GatewayMetrics()
    label = args.model_group or ANY_MODEL_GROUP
    front = GatewayFront(metrics=metrics, limits=limits, label=label, bytes_per_token=args.bytes_per_token)
    background: list[asyncio.Task[None]] = []
    if args.modelgroup or args.policy:
        if not (args.modelgroup and args.policy):
            raise SystemExit("standalone mode needs both --modelgroup and --policy")
        for policy, source in standalone_model_groups(args):
            if isinstance(policy, str):
                log.error("cannot serve: %s", policy)
                return 2
            front.serve(Gateway(policy, source, metrics=metrics))
    else:
        tasks = await _serve_from_cluster(args, front)
        if tasks is None:
            return 2
        background.extend(tasks)
    if args.metrics_port:
        start_http_server(args.metrics_port, registry=metrics.registry)
    runner = await start_serving(
        front.app(), args.listen_host, args.listen_port, limits, front.count_connection_closed
    )
    served = ", ".join(front.served.by_model) or "no model yet"
    log.info("gateway for %s serving on %s:%d", served, args.listen_host, args.listen_port)
    settle_garbage_collection()
    try:
        await asyncio.Event().wait()
    finally:
        for task in background:
            task.cancel()
        await runner.cleanup()
    return 0


def settle_garbage_collection() -> None:
    """Once started: what start-up built (modules, policies, the app) lives as long as the process,
    so no collection walks it again (`gc.freeze`), and the young generation is collected a tenth as
    often. Together they took about 8 % off the gateway's CPU time per streamed request, measured
    side by side with the defaults (docs/benchmarks.md, "One gateway in front of 20 ModelGroups")."""
    gc.freeze()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, *gc.get_threshold()[1:])


def run(args: argparse.Namespace) -> int:
    """Serve until stopped, on uvloop: its event loop and transports, written in C, take less of the
    gateway's CPU time per proxied request than asyncio's own (docs/benchmarks.md, "One gateway in
    front of 20 ModelGroups")."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(_serve(args))
    except KeyboardInterrupt:
        return 0
