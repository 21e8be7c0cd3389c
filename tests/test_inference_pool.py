"""Reading an InferencePool: which goodput ModelGroup it stands for, and what the picker serves as
the pool and the ModelGroup change (the follower, with the API server's watches faked)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from test_gateway import MODEL, request_path_policy, run
from waiting import until

from goodput.api.labels import LABEL_MODEL_GROUP
from goodput.gateway.endpoint_picker import PoolState
from goodput.gateway.endpoint_picker_cli import PoolFollower
from goodput.gateway.groups import GroupEndpoint, StaticGroupSource
from goodput.gateway.inference_pool import PoolRefusal, PoolTarget, check_engine_port, pool_target
from goodput.gateway.kube import ModelGroupsCallback, WatchedModelGroup
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

    run(main)
