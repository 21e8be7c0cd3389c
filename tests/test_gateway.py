"""The gateway on 127.0.0.1 in front of in-test vLLM-like upstreams (goodput.gateway)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp.test_utils import TestServer
from gateway_upstream import Upstream
from waiting import until

from goodput.api.modelgroup import ModelGroup
from goodput.api.slopolicy import SloPolicy
from goodput.controllers.compile.request_path import RequestPathPolicy, compile_request_path
from goodput.gateway.connections import CONNECTION_GUARD, ConnectionGuard, start_serving
from goodput.gateway.front import GatewayFront
from goodput.gateway.groups import GroupEndpoint, StaticGroupSource, endpoints_from_pods
from goodput.gateway.limits import ClientLimits
from goodput.gateway.server import Gateway

SAMPLES = Path(__file__).resolve().parents[1] / "manifests" / "samples"
MODEL = "llama-8b"


def request_path_policy(
    max_num_seqs: int = 4, max_defer_seconds: float = 2.0, **changes: Any
) -> RequestPathPolicy:
    group_doc = yaml.safe_load((SAMPLES / "modelgroup-llama-8b-tp1.yaml").read_text())
    group_doc["spec"]["profile"]["maxNumSeqs"] = max_num_seqs
    policy_doc = yaml.safe_load((SAMPLES / "slopolicy-interactive.yaml").read_text())
    policy_doc["spec"]["classes"].append(
        {"name": "instant", "ttftSeconds": 0.02, "itlSeconds": 0.05, "overloadAction": "Reject"}
    )
    policy_doc["spec"]["admission"] = {"maxDeferSeconds": max_defer_seconds}
    policy_doc["spec"]["fairness"] = {"tenants": [{"name": "a"}, {"name": "b"}]}
    compiled = compile_request_path(
        ModelGroup.model_validate(group_doc), SloPolicy.model_validate(policy_doc)
    )
    assert isinstance(compiled, RequestPathPolicy), compiled
    return dataclasses.replace(compiled, **changes) if changes else compiled


@dataclass
class Rig:
    url: str
    gateway: Gateway
    source: StaticGroupSource
    upstreams: dict[str, Upstream]
    endpoints: dict[str, GroupEndpoint]
    session: aiohttp.ClientSession
    guard: ConnectionGuard
    front: GatewayFront

    def set_groups(self, **states: tuple[bool, bool]) -> None:
        """Group name -> (ready, draining)."""
        self.source.set(
            dataclasses.replace(self.endpoints[name], ready=ready, draining=draining)
            for name, (ready, draining) in states.items()
        )

    async def post(
        self, body: dict[str, Any], path: str = "/v1/completions", **headers: str
    ) -> aiohttp.ClientResponse:
        response = await self.session.post(self.url + path, json=body, headers=headers)
        await response.read()
        return response


@asynccontextmanager
async def rig(
    policy: RequestPathPolicy | None = None,
    groups: int = 1,
    limits: ClientLimits | None = None,
    clock: Callable[[], float] = time.monotonic,
    **upstream: Any,
) -> AsyncIterator[Rig]:
    """The gateway served as `goodput gateway` serves it (`start_serving`), in front of `groups`
    in-test upstreams; `clock` is the gateway's and its front's (the loop's own, on a virtual clock)."""
    upstreams = {f"g{i}": Upstream(f"g{i}", **upstream) for i in range(1, groups + 1)}
    servers = {name: TestServer(u.app(), host="127.0.0.1") for name, u in upstreams.items()}
    for server in servers.values():
        await server.start_server()
    endpoints = {
        name: GroupEndpoint(name, str(server.make_url("")).rstrip("/"), True, False)
        for name, server in servers.items()
    }
    source = StaticGroupSource(endpoints.values())
    limits = limits or ClientLimits()
    gateway = Gateway(policy or request_path_policy(), source, clock=clock)
    front = GatewayFront(
        metrics=gateway.metrics, limits=limits, label=gateway.policy.model_group, clock=clock
    )
    front.serve(gateway)
    runner = await start_serving(front.app(), "127.0.0.1", 0, limits, front.count_connection_closed)
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession() as session:
            guard = runner.app[CONNECTION_GUARD]
            url = f"http://127.0.0.1:{port}"
            yield Rig(url, gateway, source, upstreams, endpoints, session, guard, front)
    finally:
        await runner.cleanup()
        for server in servers.values():
            await server.close()


def completion(max_tokens: int | None = 4, prompt: str = "Hello there", **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "prompt": prompt, **extra}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), timeout=30))


def sample(gateway: Gateway, name: str, **labels: str) -> float:
    value = gateway.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_models_lists_the_served_model() -> None:
    async def main() -> None:
        async with rig() as r:
            response = await r.session.get(r.url + "/v1/models")
            body = await response.json()
            assert [m["id"] for m in body["data"]] == [MODEL]

    run(main)


def test_a_completion_is_proxied_with_its_outcome_marked() -> None:
    async def main() -> None:
        async with rig() as r:
            response = await r.post(completion(max_tokens=3), **{"X-Goodput-Tenant": "a"})
            assert response.status == 200
            assert (await response.json())["usage"]["completion_tokens"] == 3
            assert response.headers["X-Goodput-Outcome"] == "admitted"
            assert response.headers["X-Goodput-Group"] == "g1"
            assert r.upstreams["g1"].received[0].body["max_tokens"] == 3
            labels = {"model_group": MODEL, "slo_class": "chat", "tenant": "a"}
            assert sample(r.gateway, "goodput_gateway_requests_offered_total", **labels) == 1
            assert r.gateway.groups["g1"].book.in_flight == 0

    run(main)


def test_a_stream_is_relayed_event_by_event_and_timed() -> None:
    async def main() -> None:
        async with rig(tokens=5, token_delay_seconds=0.01) as r:
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": "hi"}],
                "stream": True,
                "max_tokens": 8,
            }
            response = await r.session.post(r.url + "/v1/chat/completions", json=body)
            text = (await response.read()).decode()
            events = [line for line in text.splitlines() if line.startswith("data: ")]
            assert len(events) == 6 and events[-1] == "data: [DONE]"
            labels = {"model_group": MODEL, "slo_class": "chat"}
            assert sample(r.gateway, "goodput_gateway_time_to_first_token_seconds_count", **labels) == 1
            assert sample(r.gateway, "goodput_gateway_inter_token_latency_seconds_count", **labels) >= 1

    run(main)


BAD_REQUESTS = [
    ("malformed JSON", b"{not json", {}, "valid JSON"),
    ("not an object", b"[1, 2]", {}, "JSON object"),
    ("missing model", json.dumps({"prompt": "x"}).encode(), {}, "`model` is required"),
    ("unknown class", json.dumps(completion()).encode(), {"X-Goodput-Class": "gold"}, "unknown SLO class"),
    ("negative max_tokens", json.dumps(completion(max_tokens=-1)).encode(), {}, "between 1 and"),
    ("absurd max_tokens", json.dumps(completion(max_tokens=10**9)).encode(), {}, "between 1 and"),
    (
        "max_tokens not an integer",
        json.dumps(completion() | {"max_tokens": "9"}).encode(),
        {},
        "must be an integer",
    ),
    ("missing prompt", json.dumps({"model": MODEL}).encode(), {}, "`prompt`"),
    ("prompt beyond the context", json.dumps(completion(prompt="word " * 8000)).encode(), {}, "context"),
    ("output beyond the context", json.dumps(completion(max_tokens=9000)).encode(), {}, "context"),
]


@pytest.mark.parametrize(
    ("name", "raw", "headers", "message"), BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS]
)
def test_bad_requests_get_400_and_never_reach_an_engine(
    name: str, raw: bytes, headers: dict[str, str], message: str
) -> None:
    async def main() -> None:
        async with rig() as r:
            all_headers = {"Content-Type": "application/json", **headers}
            response = await r.session.post(r.url + "/v1/completions", data=raw, headers=all_headers)
            assert response.status == 400, name
            assert message in (await response.json())["error"]["message"]
            assert r.upstreams["g1"].received == []

    run(main)


def test_an_infeasible_request_is_answered_at_once_with_its_class_action() -> None:
    async def main() -> None:
        async with rig() as r:
            response = await r.post(completion(prompt="word " * 3000), **{"X-Goodput-Class": "instant"})
            assert response.status == 429 and response.headers["X-Goodput-Reason"] == "Infeasible"
            assert int(response.headers["Retry-After"]) >= 1
            labels = {"model_group": MODEL, "slo_class": "instant", "tenant": "default"}
            assert sample(r.gateway, "goodput_gateway_requests_infeasible_total", **labels) == 1
            assert r.upstreams["g1"].received == []

    run(main)


def test_overload_is_rejected_with_retry_after() -> None:
    """One slot, held busy by a request whose work at this tiny capacity is far past the TTFT target:
    the next request would wait for that slot past its target, so it is refused at once with a
    Retry-After, and the one in flight still completes."""

    async def main() -> None:
        gate = asyncio.Event()
        slow = request_path_policy(max_num_seqs=1, capacity_work_seconds_per_second=1e-4)
        async with rig(slow, gate=gate) as r:
            first = asyncio.create_task(r.post(completion()))
            await until(lambda: r.upstreams["g1"].running == 1, "the first request holds the slot")
            refused = await r.post(completion())
            assert refused.status == 429 and refused.headers["X-Goodput-Reason"] == "Deadline"
            assert int(refused.headers["Retry-After"]) >= 1
            gate.set()
            assert (await first).status == 200

    run(main)


def test_draining_group_gets_no_new_request() -> None:
    async def main() -> None:
        async with rig(groups=2) as r:
            r.set_groups(g1=(True, True), g2=(True, False))
            for _ in range(4):
                assert (await r.post(completion())).status == 200
            assert r.upstreams["g1"].received == [] and len(r.upstreams["g2"].received) == 4

    run(main)


def test_with_no_ready_group_a_request_is_held_then_served_when_one_comes() -> None:
    async def main() -> None:
        async with rig() as r:
            r.set_groups(g1=(False, False))
            held = asyncio.create_task(r.post(completion()))
            await until(lambda: len(r.gateway.queue) == 1, "the request is held")
            assert not held.done()
            r.set_groups(g1=(True, False))
            response = await held
            assert response.status == 200 and response.headers["X-Goodput-Reason"] == "NoReadyGroup"

    run(main)


def test_a_request_held_at_zero_groups_is_exported_by_class_for_the_autoscaler() -> None:
    async def main() -> None:
        async with rig() as r:
            r.set_groups()  # zero groups: a pool scaled to zero
            held = asyncio.create_task(r.post(completion(max_tokens=8), **{"X-Goodput-Class": "chat"}))
            await until(lambda: len(r.gateway.queue) == 1, "the request is held")
            r.gateway.publish_gauges()
            name = r.gateway.policy.model_group
            interactive = {"model_group": name, "slo_class": "chat"}
            idle = {"model_group": name, "slo_class": "instant"}
            assert sample(r.gateway, "goodput_gateway_queued_requests", **interactive) == 1
            assert sample(r.gateway, "goodput_gateway_queued_prompt_tokens", **interactive) > 0
            assert sample(r.gateway, "goodput_gateway_queued_work_seconds", **interactive) > 0
            # Nothing serves what waits: its slack is -Inf; an idle class's is +Inf, its count 0.
            assert sample(r.gateway, "goodput_gateway_earliest_slack_seconds", **interactive) == float("-inf")
            assert sample(r.gateway, "goodput_gateway_earliest_slack_seconds", **idle) == float("inf")
            assert r.gateway.metrics.registry.get_sample_value("goodput_gateway_queued_requests", idle) == 0
            r.set_groups(g1=(True, False))
            assert (await held).status == 200
            r.gateway.publish_gauges()
            assert sample(r.gateway, "goodput_gateway_queued_requests", **interactive) == 0
            assert sample(r.gateway, "goodput_gateway_running_requests", model_group=name) == 0

    run(main)


def test_a_hold_that_runs_out_is_503_with_retry_after() -> None:
    async def main() -> None:
        async with rig(request_path_policy(max_defer_seconds=0.3)) as r:
            r.set_groups(g1=(True, True))
            response = await r.post(completion())
            assert response.status == 503 and int(response.headers["Retry-After"]) >= 1
            assert len(r.gateway.queue) == 0 and r.gateway.queued_work_seconds == 0

    run(main)


def test_a_client_disconnect_frees_its_slot_and_counters() -> None:
    async def main() -> None:
        async with rig(request_path_policy(max_num_seqs=1), tokens=200, token_delay_seconds=0.02) as r:
            body = completion(max_tokens=200, stream=True)
            async with r.session.post(r.url + "/v1/completions", json=body) as response:
                await response.content.readline()  # the stream has started
            queued = asyncio.create_task(
                r.session.post(r.url + "/v1/completions", json=completion(max_tokens=2))
            )
            # The disconnect frees the only slot, so the next request is served.
            response = await asyncio.wait_for(queued, timeout=10)
            assert response.status == 200
            await until(lambda: r.gateway.groups["g1"].book.in_flight == 0, "the book frees the slot")
            book = r.gateway.groups["g1"].book
            assert book.in_flight == 0 and book.kv_used_tokens == 0
            assert r.upstreams["g1"].aborted == 1
            stages = {"model_group": MODEL}
            assert (
                sample(r.gateway, "goodput_gateway_client_disconnects_total", **stages, stage="streaming")
                == 1
            )

    run(main)


def test_a_client_that_leaves_a_non_streamed_request_at_the_engine_is_counted_as_dispatched() -> None:
    async def main() -> None:
        gate = asyncio.Event()
        async with rig(gate=gate) as r:
            leaving = asyncio.create_task(r.post(completion()))
            await until(lambda: r.upstreams["g1"].running == 1, "the request reaches the engine")
            leaving.cancel()
            await until(lambda: r.upstreams["g1"].aborted == 1, "the engine's request is aborted")
            count = {
                stage: sample(
                    r.gateway, "goodput_gateway_client_disconnects_total", model_group=MODEL, stage=stage
                )
                for stage in ("queued", "dispatched", "streaming")
            }
            assert count == {"queued": 0, "dispatched": 1, "streaming": 0}
            gate.set()

    run(main)


@pytest.mark.parametrize(
    ("path", "body", "headers", "param"),
    [
        ("/v1/completions", completion(), {"X-Goodput-Class": "gold"}, "X-Goodput-Class"),
        ("/v1/completions", completion(prompt="word " * 8000), {}, "prompt"),
        ("/v1/completions", completion(max_tokens=9000), {}, "max_tokens"),
        (
            "/v1/chat/completions",
            {"model": MODEL, "messages": [{"role": "user", "content": "word " * 8000}]},
            {},
            "messages",
        ),
        (
            "/v1/chat/completions",
            {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 9000},
            {},
            "max_completion_tokens",
        ),
    ],
    ids=[
        "unknown class",
        "prompt beyond the context",
        "output beyond the context",
        "chat beyond the context",
        "chat output beyond the context",
    ],
)
def test_a_class_or_context_refusal_names_the_field(
    path: str, body: dict[str, Any], headers: dict[str, str], param: str
) -> None:
    async def main() -> None:
        async with rig() as r:
            response = await r.post(body, path, **headers)
            assert response.status == 400
            assert (await response.json())["error"]["param"] == param

    run(main)


def test_class_limit_refusals_name_the_prompt_or_the_output_field_and_overload_names_none() -> None:
    from goodput.api.reasons import AdmissionReason
    from goodput.gateway.requests import CHAT_PATH, parse_request
    from goodput.gateway.server import refusal_field

    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    parsed = parse_request(json.dumps(chat).encode(), CHAT_PATH)
    assert refusal_field(AdmissionReason.PROMPT_OVER_CLASS_LIMIT, parsed, 8192) == "messages"
    assert refusal_field(AdmissionReason.OUTPUT_OVER_CLASS_LIMIT, parsed, 8192) == "max_tokens"
    assert refusal_field(AdmissionReason.DEADLINE, parsed, 8192) is None


def test_a_queued_client_that_leaves_is_withdrawn() -> None:
    async def main() -> None:
        gate = asyncio.Event()
        async with rig(request_path_policy(max_num_seqs=1), gate=gate) as r:
            first = asyncio.create_task(r.post(completion()))
            await until(lambda: r.upstreams["g1"].running == 1, "the first request holds the slot")
            leaving = asyncio.create_task(r.post(completion()))
            await until(lambda: len(r.gateway.queue) == 1, "the second request queues")
            leaving.cancel()
            await until(lambda: len(r.gateway.queue) == 0, "the leaving client is withdrawn")
            assert len(r.gateway.queue) == 0 and r.gateway.queued_work_seconds == 0
            gate.set()
            assert (await first).status == 200
            assert len(r.upstreams["g1"].received) == 1

    run(main)


def test_contending_tenants_are_served_by_their_counters() -> None:
    """One slot: tenant a queues six requests before b's two; b is not served last."""

    async def main() -> None:
        gate = asyncio.Event()
        async with rig(request_path_policy(max_num_seqs=1, max_defer_seconds=10), gate=gate) as r:
            tasks = [
                asyncio.create_task(r.post(completion(user="a"), **{"X-Goodput-Tenant": "a"}))
                for _ in range(7)
            ]
            await until(lambda: len(r.gateway.queue) == 6, "a's requests: one served, six queued")
            tasks += [
                asyncio.create_task(r.post(completion(user="b"), **{"X-Goodput-Tenant": "b"}))
                for _ in range(2)
            ]
            await until(lambda: len(r.gateway.queue) == 8, "b's requests queued behind a's")
            gate.set()
            assert all(response.status == 200 for response in await asyncio.gather(*tasks))
            tenants = [received.body["user"] for received in r.upstreams["g1"].received]
            assert len(tenants) == 9
            assert tenants.index("b") <= 3 and tenants[:6].count("b") == 2, tenants

    run(main)


def test_the_deadline_gate_prices_a_tenants_wait_by_its_place_in_the_fair_order() -> None:
    """One slot held busy; each request's work is a fifth of a second at this capacity. Tenant a queues
    until its own backlog would miss the TTFT target and is refused; tenant b, arriving behind a's whole
    backlog, waits only for the a request ahead of its tag (a whole-queue gate would refuse it), and is
    admitted and served."""

    async def main() -> None:
        gate = asyncio.Event()
        base = request_path_policy(max_num_seqs=1)
        pricing = base.admission.pricing
        work = pricing.prefill_work_seconds(3) + pricing.decode_work_seconds(3, 4)
        policy = dataclasses.replace(base, capacity_work_seconds_per_second=work / 0.2)
        async with rig(policy, gate=gate) as r:
            tasks: list[asyncio.Task[aiohttp.ClientResponse]] = []

            def held(posted: list[asyncio.Task[aiohttp.ClientResponse]]) -> bool:
                """Every request not yet answered is at the engine or in the gateway's queue."""
                waiting = sum(not task.done() for task in posted)
                return r.upstreams["g1"].running + len(r.gateway.queue) == waiting

            for _ in range(6):
                tasks.append(asyncio.create_task(r.post(completion(user="a"), **{"X-Goodput-Tenant": "a"})))
                await until(lambda: tasks[-1].done() or held(tasks), "the request is refused or held")
            queued_for_a = [task for task in tasks if not task.done()]
            refused_a = [task.result() for task in tasks if task.done()]
            assert len(queued_for_a) == 4 and len(refused_a) == 2  # one running, three queued
            assert all(
                one.status == 429 and one.headers["X-Goodput-Reason"] == "Deadline" for one in refused_a
            )
            light = asyncio.create_task(r.post(completion(user="b"), **{"X-Goodput-Tenant": "b"}))
            await until(lambda: light.done() or held([*tasks, light]), "b's request is refused or held")
            assert not light.done()  # admitted and waiting in the fair queue, not refused
            gate.set()
            answered = await light
            assert answered.status == 200 and answered.headers["X-Goodput-Outcome"] == "admitted"
            assert all(response.status == 200 for response in await asyncio.gather(*queued_for_a))
            order = [received.body["user"] for received in r.upstreams["g1"].received]
            assert order.index("b") <= 2, order  # served after the one running and the one ahead

    run(main)


def test_duplicate_idempotency_keys_collapse_into_one_engine_request() -> None:
    async def main() -> None:
        async with rig(token_delay_seconds=0.02) as r:
            headers = {"Idempotency-Key": "order-42"}
            first, second = await asyncio.gather(
                r.post(completion(), **headers), r.post(completion(), **headers)
            )
            assert first.status == second.status == 200
            assert len(r.upstreams["g1"].received) == 1
            third = await r.post(completion(), **headers)  # replayed from the kept answer
            assert third.status == 200 and len(r.upstreams["g1"].received) == 1

    run(main)


def test_degraded_requests_are_marked_and_sent_with_the_lower_budget() -> None:
    async def main() -> None:
        policy = request_path_policy()
        tight = dataclasses.replace(policy.admission.classes["chat"], e2e_seconds=0.5)
        tight = dataclasses.replace(tight, overload_action=type(tight.overload_action)("Degrade"))
        admission = dataclasses.replace(policy.admission, classes={**policy.admission.classes, "chat": tight})
        async with rig(dataclasses.replace(policy, admission=admission)) as r:
            response = await r.post(completion(max_tokens=5000))
            assert response.status == 200 and response.headers["X-Goodput-Outcome"] == "degraded"
            lowered = int(response.headers["X-Goodput-Max-Tokens"])
            assert 1 <= lowered < 5000
            assert r.upstreams["g1"].received[0].body["max_tokens"] == lowered

    run(main)


def test_leader_pods_become_endpoints_and_the_drain_marker_stops_routing() -> None:
    def pod(
        name: str, group: str, rank: str, *, ready: bool = True, draining: bool = False
    ) -> dict[str, Any]:
        annotations = {"goodput.dev/draining-since": "2026-01-01T00:00:00Z"} if draining else {}
        status = "True" if ready else "False"
        return {
            "metadata": {
                "name": name,
                "labels": {
                    "goodput.dev/model-group": MODEL,
                    "goodput.dev/group": group,
                    "goodput.dev/rank": rank,
                },
                "annotations": annotations,
            },
            "spec": {},
            "status": {
                "phase": "Running",
                "podIP": "10.0.0." + name[-1],
                "conditions": [
                    {"type": "ContainersReady", "status": "True"},
                    {"type": "goodput.dev/group-ready", "status": status},
                ],
            },
        }

    pods = [
        pod("m-g1-0", "g1", "0"),
        pod("m-g1-1", "g1", "1"),
        pod("m-g2-2", "g2", "0", draining=True),
        pod("m-g3-3", "g3", "0", ready=False),
    ]
    endpoints = endpoints_from_pods(pods, MODEL, 8000)
    assert endpoints["g1"] == GroupEndpoint("g1", "http://10.0.0.0:8000", True, False)
    assert endpoints["g2"].draining and endpoints["g2"].ready
    assert not endpoints["g3"].ready
    assert set(endpoints) == {"g1", "g2", "g3"}


def test_the_watch_applies_pod_events_and_relists_on_error() -> None:
    from goodput.gateway.kube import ApiServer, KubeGroupSource

    source = KubeGroupSource(ApiServer("https://127.0.0.1:1", {}, False), "ns", MODEL, 8000)
    leader = {
        "metadata": {
            "name": "m-g1-0",
            "labels": {"goodput.dev/model-group": MODEL, "goodput.dev/group": "g1", "goodput.dev/rank": "0"},
        },
        "status": {
            "phase": "Running",
            "podIP": "10.1.0.5",
            "conditions": [
                {"type": "ContainersReady", "status": "True"},
                {"type": "goodput.dev/group-ready", "status": "True"},
            ],
        },
    }
    source.apply({"type": "ADDED", "object": leader})
    assert source.endpoints()["g1"].ready and not source.endpoints()["g1"].draining
    marked = json.loads(json.dumps(leader))
    marked["metadata"]["annotations"] = {"goodput.dev/draining-since": "2026-01-01T00:00:00Z"}
    source.apply({"type": "MODIFIED", "object": marked})
    assert source.endpoints()["g1"].draining  # before the readiness gate turns False
    source.apply({"type": "DELETED", "object": marked})
    assert source.endpoints() == {}
    with pytest.raises(RuntimeError, match="too old"):
        source.apply({"type": "ERROR", "object": {"message": "too old resource version", "code": 410}})


@pytest.mark.parametrize(
    ("args", "expected"),
    [((), 8192), (("--max-model-len=32768",), 32768), (("--max-model-len", "4096"), 4096)],
)
def test_the_context_comes_from_the_engine_arguments(args: tuple[str, ...], expected: int) -> None:
    from goodput.controllers.compile.request_path import context_tokens

    doc = yaml.safe_load((SAMPLES / "modelgroup-llama-8b-tp1.yaml").read_text())
    doc["spec"]["engine"]["args"] = list(args)
    assert context_tokens(ModelGroup.model_validate(doc)) == expected


def test_kv_byte_seconds_are_charged_to_the_tenant_when_the_policy_prices_them() -> None:
    from goodput.controllers.requests.fairness import CostWeights, FairnessPolicy

    async def main() -> None:
        kv_only = request_path_policy(fairness=FairnessPolicy(cost_weights=CostWeights(0.0, 0.0, 1.0)))
        async with rig(kv_only, token_delay_seconds=0.01) as r:
            assert (await r.post(completion(max_tokens=4), **{"X-Goodput-Tenant": "a"})).status == 200
            # Only KV is priced: the counter holds the KV bytes the request kept for its residency.
            bytes_per_token = kv_only.admission.pricing.kv_bytes_per_token
            assert r.gateway.queue.counters["a"] > bytes_per_token * 3 * 0.01

    run(main)
