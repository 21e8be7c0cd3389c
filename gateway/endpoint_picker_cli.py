"""`goodput gateway endpoint-picker`: serve one InferencePool's endpoint picker (Envoy's
external-processing gRPC service) with goodput's admission, fairness and routing.

It watches the InferencePool `--pool` of `--namespace` through the API server, maps it to the goodput
ModelGroup its selector names (`inference_pool.pool_target`), and watches that ModelGroup with its
SLOPolicy and its group leaders' pods, as the gateway does. A change to any of them applies without
a restart; while the pool names no ModelGroup that can be served, every request is refused with 503
and the reason, which is also logged at every change.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import aiohttp
import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
from prometheus_client import start_http_server

from goodput.controllers.compile.request_path import RequestPathPolicy
from goodput.gateway.endpoint_picker import EndpointPickerService, PoolState
from goodput.gateway.groups import GroupSource
from goodput.gateway.inference_pool import (
    INFERENCE_POOL_PATH,
    PoolRefusal,
    PoolTarget,
    check_engine_port,
    pool_target,
)
from goodput.gateway.kube import (
    ApiServer,
    KubeGroupSource,
    KubeModelGroupsSource,
    ModelGroupsCallback,
    ResourceWatch,
    WatchBackoff,
    WatchedModelGroup,
    api_server_from_environment,
)
from goodput.gateway.metrics import GatewayMetrics
from goodput.gateway.server import Gateway

log = logging.getLogger("goodput.gateway.endpoint_picker")


class ModelGroupsWatch(Protocol):
    async def run(self, on_change: ModelGroupsCallback) -> None: ...


class PoolFollower:
    """Keeps the picker's `PoolState` on what the InferencePool names: the named ModelGroup's
    request path under its current policy, or the refusal that says why there is none."""

    def __init__(
        self,
        pool: PoolState,
        namespace: str,
        name: str,
        *,
        model_groups: Callable[[str], ModelGroupsWatch],
        group_source: Callable[[str, int], GroupSource],
        session: aiohttp.ClientSession,
        metrics: GatewayMetrics,
    ) -> None:
        self.pool = pool
        self.namespace = namespace
        self.name = name
        self.model_groups = model_groups
        self.group_source = group_source
        self.session = session
        self.metrics = metrics
        self.target: PoolTarget | PoolRefusal | None = None
        self.watch: asyncio.Task[None] | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    def on_pool(self, objects: Mapping[str, Mapping[str, Any]]) -> None:
        """The InferencePool changed (or was listed): follow the ModelGroup it names now."""
        target = pool_target(objects.get(self.name), self.namespace, self.name)
        if target == self.target:
            return
        self.target = target
        if self.watch is not None:
            self.watch.cancel()
            self.watch = None
        if isinstance(target, PoolRefusal):
            self.refuse(target.message)
            return
        log.info("InferencePool %s/%s serves ModelGroup %s", self.namespace, self.name, target.model_group)
        watch = self.model_groups(target.model_group)
        self.watch = asyncio.create_task(watch.run(self.on_model_groups), name="model-group-watch")

    def on_model_groups(self, report: Mapping[str, WatchedModelGroup]) -> None:
        target = self.target
        if not isinstance(target, PoolTarget):
            return
        watched = report.get(target.model_group)
        serving = self.pool.gateway is not None and self.pool.gateway.policy.model_group == target.model_group
        if watched is None:
            self.refuse(
                f"InferencePool {self.namespace}/{self.name} selects ModelGroup "
                f"{self.namespace}/{target.model_group}, which does not exist"
            )
        elif isinstance(watched.policy, str):
            if serving:
                log.error("keeping the last good policy of %s: %s", target.model_group, watched.policy)
            else:
                self.refuse(watched.policy)
        else:
            mismatch = check_engine_port(target, watched.port, self.namespace, self.name)
            if mismatch is not None:
                self.refuse(mismatch)
            else:
                self.serve(watched.policy, target.port)

    def serve(self, policy: RequestPathPolicy, port: int) -> None:
        current = self.pool.gateway
        if current is not None and current.policy.model_group == policy.model_group:
            try:
                current.update_policy(policy)
            except ValueError as error:
                log.error("keeping the current policy: %s", error)
            self.pool.refusal = None
            return
        if current is not None:  # the pool names another ModelGroup now: the old one's path retires
            self.refuse(
                f"InferencePool {self.namespace}/{self.name} now serves ModelGroup "
                f"{self.namespace}/{policy.model_group}; retry"
            )
        gateway = Gateway(policy, self.group_source(policy.model_group, port), metrics=self.metrics)
        gateway.start(self.session)
        self.pool.gateway, self.pool.refusal = gateway, None
        log.info("picking endpoints of ModelGroup %s/%s", self.namespace, policy.model_group)

    def refuse(self, message: str) -> None:
        """Serve nothing: every request is refused with 503 and `message`; requests queued for the
        ModelGroup served until now are answered with it too, not dropped."""
        log.error("refusing every request: %s", message)
        retired, self.pool.gateway, self.pool.refusal = self.pool.gateway, None, message
        if retired is not None:
            task = asyncio.create_task(retired.retire(message), name="retire")
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pool", default=os.environ.get("INFERENCE_POOL_NAME"), help="the InferencePool to pick for"
    )
    parser.add_argument(
        "--namespace",
        default=os.environ.get("POD_NAMESPACE", "default"),
        help="the InferencePool's namespace, and its ModelGroup's (default: $POD_NAMESPACE)",
    )
    parser.add_argument("--listen-host", default="[::]", help="address to serve the ext-proc service on")
    parser.add_argument("--grpc-port", type=int, default=9002, help="the ext-proc gRPC service's port")
    parser.add_argument("--metrics-port", type=int, default=9090, help="Prometheus metrics (0: none)")
    parser.add_argument(
        "--bytes-per-token", type=float, default=4.0, help="prompt text bytes per token estimate"
    )


async def serve_picker(pool: PoolState, port: int, host: str = "[::]") -> tuple[grpc.aio.Server, int]:
    """The ext-proc service on `host:port` (0: any free port), started; the server and its port."""
    server = grpc.aio.server()
    ext_proc_grpc.add_ExternalProcessorServicer_to_server(EndpointPickerService(pool), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    return server, bound


async def follow_pool(
    api: ApiServer,
    namespace: str,
    name: str,
    pool: PoolState,
    metrics: GatewayMetrics,
    *,
    backoff: WatchBackoff | None = None,
) -> None:
    """Until cancelled: keep `pool` on what the InferencePool `namespace/name` names, through the
    API server's watches of the pool, its ModelGroup with the SLOPolicies, and the leaders' pods."""
    async with aiohttp.ClientSession() as session:
        follower = PoolFollower(
            pool,
            namespace,
            name,
            model_groups=lambda group: KubeModelGroupsSource(api, namespace, name=group, backoff=backoff),
            group_source=lambda group, port: KubeGroupSource(api, namespace, group, port, backoff=backoff),
            session=session,
            metrics=metrics,
        )
        watch = ResourceWatch(
            api,
            f"{INFERENCE_POOL_PATH}/{namespace}/inferencepools",
            follower.on_pool,
            params={"fieldSelector": f"metadata.name={name}"},
            backoff=backoff,
        )
        try:
            await watch.run()
        finally:
            if follower.watch is not None:
                follower.watch.cancel()
            if pool.gateway is not None:
                await pool.gateway.stop()


async def _serve(args: argparse.Namespace) -> int:
    if not args.pool:
        raise SystemExit("--pool (or $INFERENCE_POOL_NAME) names the InferencePool to pick for")
    metrics = GatewayMetrics()
    pool = PoolState(bytes_per_token=args.bytes_per_token)
    api = api_server_from_environment()
    if args.metrics_port:
        start_http_server(args.metrics_port, registry=metrics.registry)
    server, _ = await serve_picker(pool, args.grpc_port, host=args.listen_host)
    log.info("endpoint picker for InferencePool %s/%s on :%d", args.namespace, args.pool, args.grpc_port)
    try:
        await follow_pool(api, args.namespace, args.pool, pool, metrics)
    finally:
        await server.stop(grace=5)
    return 0


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        return asyncio.run(_serve(args))
    except KeyboardInterrupt:
        return 0
