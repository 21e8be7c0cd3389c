"""LoRA adapters through the gateway, against emulated vLLM servers on 127.0.0.1: `/v1/models` lists
them, a request for an adapter no group holds is loaded once and served, later ones go where it
lives, a full group unloads its least recently used idle adapter, an unknown adapter is a 404, and
one that fails to load is a 502 naming it and quoting the engine, then a 503 until the backoff ends."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import yaml
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
from test_endpoint_picker import request_body, request_headers
from waiting import until

from goodput.api.modelgroup import ModelGroup
from goodput.api.slopolicy import SloPolicy
from goodput.controllers.compile.request_path import RequestPathPolicy, compile_request_path
from goodput.estimators.service_time import H100_80G, LLAMA_3_1_8B
from goodput.gateway.connections import start_serving
from goodput.gateway.endpoint_picker import PoolState
from goodput.gateway.endpoint_picker_cli import serve_picker
from goodput.gateway.front import GatewayFront
from goodput.gateway.groups import GroupEndpoint, StaticGroupSource
from goodput.gateway.server import Gateway
from goodput.simulator.engine import EngineConfig
from goodput.testbed.emulator_engine import ServingProfile
from goodput.testbed.emulator_netns import bind_listener
from goodput.testbed.emulator_server import ServerIdentity, VllmServer

SAMPLES = Path(__file__).resolve().parents[1] / "manifests" / "samples"
GROUP_DOC = yaml.safe_load((SAMPLES / "modelgroup-llama-8b-tp1.yaml").read_text())
POLICY_DOC = yaml.safe_load((SAMPLES / "slopolicy-interactive.yaml").read_text())
SERVED = "llama"
LONG_OUTPUT_TOKENS = 150  # long enough that a base-model request is answered while it runs
BROKEN_SOURCE = "/adapters/broken"
ADAPTERS = {
    "sql": "/adapters/sql",
    "legal": "/adapters/legal",
    "poetry": "/adapters/poetry",
    "broken": BROKEN_SOURCE,
}


def adapter_policy(max_loaded: int) -> RequestPathPolicy:
    group = copy.deepcopy(GROUP_DOC)
    group["metadata"]["name"] = "chat"
    group["spec"]["model"]["servedName"] = SERVED
    group["spec"]["adapters"] = [{"name": name, "source": source} for name, source in ADAPTERS.items()]
    group["spec"]["adapterLimits"] = {"maxLoadedPerGroup": max_loaded}
    slo = copy.deepcopy(POLICY_DOC)
    slo["spec"]["admission"] = {"maxDeferSeconds": 2.0}
    compiled = compile_request_path(ModelGroup.model_validate(group), SloPolicy.model_validate(slo))
    assert isinstance(compiled, RequestPathPolicy), compiled
    return compiled


@dataclass
class Bed:
    url: str
    front: GatewayFront
    gateway: Gateway
    servers: dict[str, VllmServer]
    session: aiohttp.ClientSession

    async def post(self, model: str, max_tokens: int = 2) -> tuple[int, dict[str, Any], str]:
        body = {"model": model, "prompt": "Hello there", "max_tokens": max_tokens}
        async with self.session.post(self.url + "/v1/completions", json=body) as response:
            return response.status, await response.json(), response.headers.get("X-Goodput-Group", "")

    def sample(self, name: str, **labels: str) -> float:
        value = self.front.metrics.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value

    def loads(self) -> int:
        return sum(server.adapter_loads for server in self.servers.values())


@asynccontextmanager
async def bed(groups: int = 2, max_loaded: int = 2, load_seconds: float = 0.05) -> AsyncIterator[Bed]:
    """`groups` emulated engines with LoRA on behind one gateway serving the 'chat' ModelGroup."""
    policy = adapter_policy(max_loaded)
    policy = replace(policy, adapters=replace(policy.adapters, load_seconds=load_seconds))
    profile = ServingProfile(
        EngineConfig.for_hardware(LLAMA_3_1_8B, H100_80G),
        SERVED,
        max_loras=max_loaded,
        lora_load_seconds=load_seconds,
        unreadable_lora_paths=frozenset({BROKEN_SOURCE}),
    )
    servers = {f"g{i}": VllmServer(profile, ServerIdentity("m", SERVED)) for i in range(1, groups + 1)}
    endpoints = []
    for name, server in servers.items():
        await server.listen(bind_listener("127.0.0.1", 0))
        assert server.address is not None
        endpoints.append(GroupEndpoint(name, f"http://127.0.0.1:{server.address[1]}", True, False))
    front = GatewayFront()
    gateway = Gateway(policy, StaticGroupSource(endpoints), metrics=front.metrics)
    front.serve(gateway)
    runner = await start_serving(front.app(), "127.0.0.1", 0, front.limits, front.count_connection_closed)
    port = runner.addresses[0][1]
    async with aiohttp.ClientSession() as session:
        try:
            await until(lambda: len(gateway.groups) == groups, "the gateway knows every group")
            yield Bed(f"http://127.0.0.1:{port}", front, gateway, servers, session)
        finally:
            await runner.cleanup()
            for server in servers.values():
                await server.close()


def run(test: Any) -> None:
    asyncio.run(asyncio.wait_for(test(), timeout=30))


def test_models_lists_each_adapter_with_its_base_model_as_parent() -> None:
    async def main() -> None:
        async with bed() as b:
            async with b.session.get(b.url + "/v1/models") as response:
                data = (await response.json())["data"]
            parents = {entry["id"]: entry.get("parent") for entry in data}
            assert parents == {SERVED: None, **dict.fromkeys(ADAPTERS, SERVED)}
            assert {entry["id"]: entry["root"] for entry in data if entry.get("parent")} == ADAPTERS

    run(main)


def test_an_adapter_is_loaded_once_then_routed_where_it_lives() -> None:
    async def main() -> None:
        async with bed() as b:
            first = await b.post("sql")
            assert first[0] == 200, first[1]
            home = first[2]
            assert "sql" in b.servers[home].adapters
            for _ in range(4):
                status, _, group = await b.post("sql")
                assert (status, group) == (200, home)
            assert b.loads() == 1
            assert (
                b.sample(
                    "goodput_gateway_adapter_routes_total",
                    model_group="chat",
                    adapter="sql",
                    placement="held",
                )
                == 4
            )
            assert (
                b.sample(
                    "goodput_gateway_adapter_loads_total",
                    model_group="chat",
                    adapter="sql",
                    action="load",
                    result="succeeded",
                )
                == 1
            )
            assert (
                b.sample(
                    "goodput_gateway_adapter_requests_total",
                    model_group="chat",
                    adapter="sql",
                    outcome="admitted",
                )
                == 5
            )

    run(main)


def test_concurrent_requests_for_a_cold_adapter_share_one_load() -> None:
    async def main() -> None:
        async with bed(load_seconds=0.2) as b:
            answers = await asyncio.gather(*(b.post("legal") for _ in range(6)))
            assert [status for status, _, _ in answers] == [200] * 6
            assert b.loads() == 1, "every request waited for the one load"

    run(main)


def test_a_full_group_unloads_its_least_recently_used_adapter() -> None:
    async def main() -> None:
        async with bed(groups=1, max_loaded=2) as b:
            for model in ("sql", "legal", "sql", "poetry"):
                status, body, _ = await b.post(model)
                assert status == 200, body
            assert list(b.servers["g1"].adapters) == ["sql", "poetry"], "legal was the least recently used"
            assert (
                b.sample(
                    "goodput_gateway_adapter_loads_total",
                    model_group="chat",
                    adapter="legal",
                    action="unload",
                    result="succeeded",
                )
                == 1
            )

    run(main)


def test_an_unknown_adapter_is_a_404_as_for_an_unknown_model() -> None:
    async def main() -> None:
        async with bed() as b:
            status, body, _ = await b.post("no-such-adapter")
            assert status == 404
            assert body["error"]["code"] == "model_not_found"
            assert "'no-such-adapter'" in body["error"]["message"]
            assert b.loads() == 0

    run(main)


def test_an_adapter_that_fails_to_load_is_a_502_then_not_tried_again_until_the_backoff_ends() -> None:
    async def main() -> None:
        async with bed(groups=1) as b:
            status, body, _ = await b.post("broken")
            assert status == 502
            assert body["error"]["code"] == "adapter_load_failed"
            assert "'broken'" in body["error"]["message"]
            assert f"No adapter found for {BROKEN_SOURCE}" in body["error"]["message"], "the engine's words"
            async with b.session.post(
                b.url + "/v1/completions", json={"model": "broken", "prompt": "x", "max_tokens": 2}
            ) as again:
                assert again.status == 503
                assert (await again.json())["error"]["code"] == "adapter_load_failed"
                assert int(again.headers["Retry-After"]) >= 1
            assert (
                b.sample(
                    "goodput_gateway_adapter_loads_total",
                    model_group="chat",
                    adapter="broken",
                    action="load",
                    result="failed",
                )
                == 1
            ), "the backoff asked the engine nothing"
            status, _, _ = await b.post("sql")
            assert status == 200, "other adapters are served meanwhile"

    run(main)


def test_a_restarted_gateway_learns_what_engines_already_hold() -> None:
    async def main() -> None:
        async with bed(groups=1) as b:
            server = b.servers["g1"]
            server.adapters["poetry"] = ADAPTERS["poetry"]  # loaded before this gateway saw the group
            endpoint = b.gateway.groups["g1"].endpoint
            b.gateway.on_groups({})
            b.gateway.on_groups({"g1": endpoint})
            await until(
                lambda: b.gateway.adapters.holders("poetry") == ["g1"], "the engine's adapters are learnt"
            )
            status, _, _ = await b.post("poetry")
            assert status == 200
            assert server.adapter_loads == 0, "an adapter the engine held is not loaded again"

    run(main)


def test_a_request_waiting_for_an_adapter_slot_holds_up_no_other_request() -> None:
    """One group holding one adapter, in use by a long request: a request for another adapter waits
    (the adapter in use is not unloaded under it) while a request for the base model is served; when
    the long one ends, the waiting one evicts the idle adapter and is served."""

    async def main() -> None:
        async with bed(groups=1, max_loaded=1) as b:
            long = asyncio.create_task(b.post("sql", max_tokens=LONG_OUTPUT_TOKENS))
            await until(lambda: "sql" in b.servers["g1"].adapters, "the long request's adapter is loaded")
            waiting = asyncio.create_task(b.post("legal"))
            await until(lambda: len(b.gateway.queue) == 1, "the request for the other adapter is queued")
            base = await b.post(SERVED)
            assert base[0] == 200, base[1]
            held = b.gateway.adapters.holdings(0.0, 60.0)["g1"]
            assert (held.loaded, held.busy) == (("sql",), {"sql"}), "the base request went by the waiting one"
            assert not waiting.done(), "the other adapter waits for the slot"
            assert (await long)[0] == 200
            status, body, _ = await waiting
            assert status == 200, body
            assert list(b.servers["g1"].adapters) == ["legal"]

    run(main)


def test_the_endpoint_picker_loads_an_adapter_before_it_hands_the_group_to_the_proxy() -> None:
    """Behind an InferencePool the proxy sends the request straight to the picked engine, so the
    engine must hold the adapter by then: the picker loads it once before it names the endpoint."""

    async def main() -> None:
        async with bed(groups=1) as b:
            pool = PoolState(gateway=b.gateway, refusal=None)
            server, port = await serve_picker(pool, 0, host="127.0.0.1")
            try:
                async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                    call = ext_proc_grpc.ExternalProcessorStub(channel).Process()
                    await call.write(request_headers())
                    await call.read()
                    await call.write(request_body({"model": "sql", "prompt": "Hi", "max_tokens": 2}))
                    answer = await call.read()
                    assert answer.HasField("request_body"), answer
                    assert "sql" in b.servers["g1"].adapters
                    assert b.loads() == 1
                    await call.done_writing()
            finally:
                await server.stop(grace=None)

    run(main)
