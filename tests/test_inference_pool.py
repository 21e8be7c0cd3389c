"""Reading an InferencePool: which goodput ModelGroup it stands for, and what the picker serves as
the pool and the ModelGroup change (the follower, with the API server's watches faked)."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import grpc
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
from test_endpoint_picker import immediate, picked_endpoint, request_body, request_headers
from test_gateway import MODEL, completion, request_path_policy, run
from test_gateway_watch import FAST, MODEL_GROUP, SLO_POLICY, with_version
from waiting import until

from goodput.api.labels import LABEL_MODEL_GROUP
from goodput.gateway.endpoint_picker import PoolState
from goodput.gateway.endpoint_picker_cli import PoolFollower, follow_pool, serve_picker
from goodput.gateway.groups import GroupEndpoint, StaticGroupSource
from goodput.gateway.inference_pool import PoolRefusal, PoolTarget, check_engine_port, pool_target
from goodput.gateway.kube import ApiServer, ModelGroupsCallback, WatchedModelGroup
from goodput.gateway.metrics import GatewayMetrics
from goodput.gateway.requests import ParsedRequest


def pool(labels: Mapping[str, str] | None, ports: list[Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"targetPorts": [{"number": 8000}] if ports is None else ports}
    if labels is not None:
        spec["selector"] = {"matchLabels": dict(labels)}
    spec["endpointPickerRef"] = {"name": "chat-picker", "port": {"number": 9002}}
    return {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool", "spec": spec}


@pytest.mark.parametrize(
    ("case", "document", "expected"),
    [
        ("names a ModelGroup", pool({LABEL_MODEL_GROUP: MODEL}), PoolTarget(MODEL, 8000)),
        ("beside other labels", pool({"app": "x", LABEL_MODEL_GROUP: MODEL}), PoolTarget(MODEL, 8000)),
        ("missing", None, "does not exist"),
        ("names no ModelGroup", pool({"app": "vllm-llama"}), "names no goodput ModelGroup"),
        ("no selector", pool(None), "spec.selector.matchLabels must hold goodput.dev/model-group"),
        ("no target port", pool({LABEL_MODEL_GROUP: MODEL}, []), "spec.targetPorts"),
        ("two target ports", pool({LABEL_MODEL_GROUP: MODEL}, [{"number": 1}, {"number": 2}]), "exactly one"),
        ("a port out of range", pool({LABEL_MODEL_GROUP: MODEL}, [{"number": 70000}]), "spec.targetPorts"),
    ],
)
def test_a_pool_names_its_modelgroup_by_goodputs_label_or_is_refused_by_field(
    case: str, document: dict[str, Any] | None, expected: PoolTarget | str
) -> None:
    target = pool_target(document, "default", "chat")
    if isinstance(expected, PoolTarget):
        assert target == expected, case
    else:
        assert isinstance(target, PoolRefusal), case
        assert expected in target.message and "InferencePool default/chat" in target.message, case


def test_a_pool_port_that_is_not_the_engines_is_named_with_both_fields() -> None:
    message = check_engine_port(PoolTarget(MODEL, 8080), 8000, "default", "chat")
    assert message is not None and "spec.targetPorts[0].number is 8080" in message
    assert "spec.engine.port" in message and "8000" in message
    assert check_engine_port(PoolTarget(MODEL, 8000), 8000, "default", "chat") is None


class FakeModelGroups:
    """The ModelGroup watch: the test pushes reports through the callback the follower gives."""

    def __init__(self) -> None:
        self.callbacks: dict[str, ModelGroupsCallback] = {}

    def watch(self, name: str) -> FakeModelGroups.Watch:
        return FakeModelGroups.Watch(self, name)

    class Watch:
        def __init__(self, owner: FakeModelGroups, name: str) -> None:
            self.owner, self.name = owner, name

        async def run(self, on_change: ModelGroupsCallback) -> None:
            self.owner.callbacks[self.name] = on_change
            await asyncio.Event().wait()


def parsed() -> ParsedRequest:
    return ParsedRequest({"model": MODEL, "prompt": "hi"}, MODEL, False, 2, 4, "max_tokens", "hi")


def test_the_picker_follows_the_pool_and_refuses_by_name_when_it_names_no_modelgroup() -> None:
    """Served while the pool names a ModelGroup that compiles on the pool's port; refused, with the
    reason, when it names none, a missing one, or a port its engines do not serve on; a request
    queued for the ModelGroup served until then is answered with that reason, not dropped."""

    async def main() -> None:
        state, fakes, ports = PoolState(), FakeModelGroups(), []
        endpoints = [GroupEndpoint("g1", "http://10.0.0.1:8000", ready=False, draining=False)]

        def group_source(name: str, port: int) -> StaticGroupSource:
            ports.append((name, port))
            return StaticGroupSource(endpoints)

        async with aiohttp.ClientSession() as session:
            follower = PoolFollower(
                state,
                "default",
                "chat",
                model_groups=fakes.watch,
                group_source=group_source,
                session=session,
                metrics=GatewayMetrics(),
            )
            assert state.gateway is None and state.refusal is not None  # nothing read yet
            follower.on_pool({"chat": pool({LABEL_MODEL_GROUP: MODEL})})
            await until(lambda: MODEL in fakes.callbacks, "the ModelGroup watched")
            fakes.callbacks[MODEL]({})
            assert state.gateway is None and state.refusal is not None
            assert f"ModelGroup default/{MODEL}, which does not exist" in state.refusal
            fakes.callbacks[MODEL]({MODEL: WatchedModelGroup(request_path_policy(), port=8080)})
            assert state.gateway is None and "spec.engine.port" in (state.refusal or "")
            fakes.callbacks[MODEL]({MODEL: WatchedModelGroup(request_path_policy(), port=8000)})
            gateway = state.gateway
            assert gateway is not None and state.refusal is None and ports == [(MODEL, 8000)]
            fakes.callbacks[MODEL](
                {MODEL: WatchedModelGroup("SLOPolicy default/x does not exist", port=8000)}
            )
            assert state.gateway is gateway  # a policy that stops compiling: the last good one stays

            shape = gateway.shape_of({}, parsed(), gateway.clock())
            queued = asyncio.create_task(gateway.place(parsed(), shape, None))  # no ready group: waits
            await until(lambda: len(gateway.queue) == 1, "the request queued")
            follower.on_pool({"chat": pool({"app": "vllm"})})
            assert state.gateway is None and "names no goodput ModelGroup" in (state.refusal or "")
            answer = await queued
            assert isinstance(answer, web.Response) and answer.status == 503
            assert isinstance(answer.body, bytes) and b"names no goodput ModelGroup" in answer.body
            follower.on_pool({})
            assert "InferencePool default/chat does not exist" in (state.refusal or "")

            follower.on_pool({"chat": pool({LABEL_MODEL_GROUP: MODEL})})  # back, then to another
            await until(lambda: fakes.callbacks.get(MODEL) is not None, "the ModelGroup watched again")
            fakes.callbacks[MODEL]({MODEL: WatchedModelGroup(request_path_policy(), port=8000)})
            first = state.gateway
            assert first is not None
            follower.on_pool({"chat": pool({LABEL_MODEL_GROUP: "other"})})
            await until(lambda: "other" in fakes.callbacks, "the other ModelGroup watched")
            other = dataclasses.replace(request_path_policy(), model_group="other")
            fakes.callbacks["other"]({"other": WatchedModelGroup(other, port=8000)})
            assert state.gateway is not None and state.gateway.policy.model_group == "other"
            await until(lambda: first.retired is not None, "the first ModelGroup's path retired")
            assert "now serves ModelGroup default/other" in (first.retired or "")

    run(main)


# --- the picker following its pool through an API server double -----------------------------------


@dataclass
class StreamingApi:
    """Answers list requests from `lists`; a watch streams what the test puts on its path's queue,
    and stays open until the test ends (so the test decides when each change arrives)."""

    lists: dict[str, dict[str, Any]]
    events: dict[str, asyncio.Queue[dict[str, Any]]] = field(default_factory=dict)

    def queue(self, path: str) -> asyncio.Queue[dict[str, Any]]:
        return self.events.setdefault(path, asyncio.Queue())

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = "/" + request.match_info["path"]
        if request.query.get("watch") != "1":
            return web.json_response(self.lists[path])
        response = web.StreamResponse()
        await response.prepare(request)
        while True:
            event = await self.queue(path).get()
            await response.write(json.dumps(event).encode() + b"\n")


NS = "ns"
POOLS = f"/apis/inference.networking.k8s.io/v1/namespaces/{NS}/inferencepools"
GROUPS = f"/apis/goodput.dev/v1alpha1/namespaces/{NS}"
PODS = f"/api/v1/namespaces/{NS}/pods"


def named(document: dict[str, Any], name: str, version: str) -> dict[str, Any]:
    document = copy.deepcopy(document)
    document.setdefault("metadata", {}).update(name=name, namespace=NS, resourceVersion=version)
    return document


def leader_pod(model_group: str, ip: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"{model_group}-g1-0",
            "resourceVersion": "3",
            "labels": {LABEL_MODEL_GROUP: model_group, "goodput.dev/group": "g1", "goodput.dev/rank": "0"},
        },
        "spec": {},
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [
                {"type": "ContainersReady", "status": "True"},
                {"type": "goodput.dev/group-ready", "status": "True"},
            ],
        },
    }


def test_the_picker_reads_its_pool_from_the_api_server_and_follows_it() -> None:
    """The pool first names no ModelGroup: 503 naming the pool. Fixed to name the sample ModelGroup:
    requests are picked its leader on the pool's port. Deleted: 503 saying so."""
    name = MODEL_GROUP["metadata"]["name"]
    unnamed = named(pool({"app": "vllm"}), "chat", "5")
    fixed = named(pool({LABEL_MODEL_GROUP: name, "goodput.dev/rank": "0"}), "chat", "6")
    listing: dict[str, Any] = {"metadata": {"resourceVersion": "5"}}
    api = StreamingApi(
        lists={
            POOLS: {**listing, "items": [unnamed]},
            f"{GROUPS}/modelgroups": {**listing, "items": [named(MODEL_GROUP, name, "4")]},
            f"{GROUPS}/slopolicies": {**listing, "items": [with_version(SLO_POLICY, "4")]},
            PODS: {**listing, "items": [leader_pod(name, "10.9.8.7")]},
        }
    )

    async def body(server: ApiServer) -> None:
        state, metrics = PoolState(), GatewayMetrics()
        grpc_server, port = await serve_picker(state, 0, host="127.0.0.1")
        follow = asyncio.create_task(follow_pool(server, NS, "chat", state, metrics, backoff=FAST))
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = ext_proc_grpc.ExternalProcessorStub(channel)

                async def ask() -> ext_proc.ProcessingResponse:
                    call = stub.Process()
                    await call.write(request_headers())
                    await call.read()
                    await call.write(request_body(completion(model=name)))
                    answer = await call.read()
                    call.cancel()
                    return answer

                await until(lambda: "names no goodput ModelGroup" in (state.refusal or ""), "the pool read")
                status, _, error = immediate(await ask())
                assert (
                    status == 503
                    and "InferencePool ns/chat names no goodput ModelGroup" in error["error"]["message"]
                )

                api.queue(POOLS).put_nowait({"type": "MODIFIED", "object": fixed})
                await until(
                    lambda: state.gateway is not None and "g1" in state.gateway.groups, "the leader found"
                )
                assert picked_endpoint(await ask()) == ("10.9.8.7:8000", "10.9.8.7:8000")

                api.queue(POOLS).put_nowait({"type": "DELETED", "object": named(fixed, "chat", "7")})
                await until(lambda: state.gateway is None, "the pool's deletion seen")
                status, _, error = immediate(await ask())
                assert status == 503 and error["error"]["message"] == "InferencePool ns/chat does not exist"
        finally:
            follow.cancel()
            await asyncio.gather(follow, return_exceptions=True)
            await grpc_server.stop(grace=None)

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/{path:.*}", api.handle)
        test_server = TestServer(app, host="127.0.0.1")
        await test_server.start_server()
        try:
            await body(ApiServer(str(test_server.make_url("")).rstrip("/"), {}, False))
        finally:
            await test_server.close()

    run(main)
