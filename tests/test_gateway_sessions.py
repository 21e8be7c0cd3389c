"""Session budgets and the degrade ladder in the gateway, on 127.0.0.1 in front of in-test upstreams."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import yaml
from aiohttp.test_utils import TestServer
from gateway_upstream import Upstream
from test_gateway import MODEL, completion, rig, run, sample
from waiting import until

from goodput.api.modelgroup import ModelGroup
from goodput.api.slopolicy import SloPolicy
from goodput.controllers.compile.request_path import RequestPathPolicy, compile_request_path
from goodput.gateway.groups import GroupEndpoint, StaticGroupSource
from goodput.gateway.server import Gateway

SAMPLES = Path(__file__).resolve().parents[1] / "manifests" / "samples"
FAMILY = "llama-3.1"


def policy_with(*classes: dict[str, Any], **changes: Any) -> RequestPathPolicy:
    """The sample ModelGroup under a policy of `classes`, in the family FAMILY."""
    group_doc = yaml.safe_load((SAMPLES / "modelgroup-llama-8b-tp1.yaml").read_text())
    group_doc["spec"]["profile"]["maxNumSeqs"] = 4
    group_doc["metadata"].setdefault("labels", {})["goodput.dev/model-family"] = FAMILY
    policy_doc = yaml.safe_load((SAMPLES / "slopolicy-interactive.yaml").read_text())
    policy_doc["spec"]["classes"] = list(classes)
    policy_doc["spec"]["admission"] = {"maxDeferSeconds": 2.0}
    policy_doc["spec"]["fairness"] = {"tenants": [{"name": "a"}, {"name": "b"}]}
    compiled = compile_request_path(
        ModelGroup.model_validate(group_doc), SloPolicy.model_validate(policy_doc)
    )
    assert isinstance(compiled, RequestPathPolicy), compiled
    return dataclasses.replace(compiled, **changes) if changes else compiled


def agent(**fields: Any) -> dict[str, Any]:
    return {"name": "agent", "ttftSeconds": 5, "itlSeconds": 0.1, **fields}


def test_a_root_opens_a_session_and_its_children_spend_its_branches() -> None:
    policy = policy_with(agent(sessionBudget={"branches": 2}))

    async def main() -> None:
        async with rig(policy) as r:
            root = await r.post(completion(), **{"X-Goodput-Tenant": "a"})
            assert root.status == 200
            name = root.headers["X-Goodput-Session"]
            assert root.headers["X-Goodput-Served-By"].startswith(f"{policy.model_group}/")
            child = await r.post(completion(), **{"X-Goodput-Session": name, "X-Goodput-Tenant": "b"})
            assert child.status == 200 and child.headers["X-Goodput-Session"] == name
            over = await r.post(completion(), **{"X-Goodput-Session": name})
            assert over.status == 429
            assert (await over.json())["error"]["code"] == "session_budget_exhausted"
            # The child named tenant b, and was charged to its session's tenant a.
            offered = "goodput_gateway_requests_offered_total"
            assert (
                sample(r.gateway, offered, model_group=policy.model_group, slo_class="agent", tenant="a") == 2
            )
            assert (
                sample(r.gateway, offered, model_group=policy.model_group, slo_class="agent", tenant="b") == 0
            )
            assert len(r.upstreams["g1"].received) == 2

    run(main)


def test_bad_session_requests_get_documented_answers() -> None:
    policy = policy_with(agent(sessionBudget={"tokens": 10_000}))

    async def main() -> None:
        async with rig(policy) as r:
            unknown = await r.post(completion(), **{"X-Goodput-Session": "never-opened"})
            assert unknown.status == 404
            assert (await unknown.json())["error"]["code"] == "session_not_found"
            raised = await r.post(completion(), **{"X-Goodput-Session-Budget-Tokens": "1000000"})
            assert raised.status == 400
            error = (await raised.json())["error"]
            assert error["code"] == "session_budget_header"
            assert error["param"] == "X-Goodput-Session-Budget-Tokens"
            opened = await r.post(completion(), **{"X-Goodput-Session-Open": "mine"})
            assert opened.status == 200 and opened.headers["X-Goodput-Session"] == "mine"
            again = await r.post(completion(), **{"X-Goodput-Session-Open": "mine"})
            assert again.status == 409
            assert not r.upstreams["g1"].received[2:]

    run(main)


def test_a_child_over_the_token_budget_is_capped_then_refused() -> None:
    # The prompt "Hello there" is estimated at 3 tokens; 3 + 16 fit, then 3 + 5 of what is left.
    policy = policy_with(
        agent(sessionBudget={"tokens": 27}, degrade={"rungs": ["CapOutput", "Reject"], "capOutputTokens": 8})
    )

    async def main() -> None:
        async with rig(policy, tokens=100) as r:
            root = await r.post(completion(max_tokens=16))
            assert root.status == 200 and "X-Goodput-Degraded" not in root.headers
            name = root.headers["X-Goodput-Session"]
            capped = await r.post(completion(max_tokens=16), **{"X-Goodput-Session": name})
            assert capped.status == 200
            assert capped.headers["X-Goodput-Degraded"] == "CapOutput"
            assert r.upstreams["g1"].received[-1].body["max_tokens"] == 5
            refused = await r.post(completion(max_tokens=16), **{"X-Goodput-Session": name})
            assert refused.status == 429
            assert (await refused.json())["error"]["code"] == "session_budget_exhausted"
            counted = sample(
                r.gateway,
                "goodput_gateway_requests_degraded_total",
                model_group=policy.model_group,
                slo_class="agent",
                tenant="default",
                rung="CapOutput",
            )
            assert counted == 1

    run(main)


def test_the_deadline_cancels_every_child_in_flight() -> None:
    policy = policy_with(agent(sessionBudget={"wallClockSeconds": 2.0}))

    async def main() -> None:
        gate = asyncio.Event()
        async with rig(policy) as r:
            root = await r.post(completion(), **{"X-Goodput-Session-Open": "s1"})
            assert root.status == 200
            r.upstreams["g1"].gate = gate
            children = [
                asyncio.create_task(r.post(completion(), **{"X-Goodput-Session": "s1"})) for _ in range(3)
            ]
            await until(lambda: r.upstreams["g1"].running == 3, "three children in flight")
            answers = await asyncio.gather(*children)
            assert [a.status for a in answers] == [410, 410, 410]
            await until(lambda: r.upstreams["g1"].aborted == 3, "the engine saw all three closed")
            late = await r.post(completion(), **{"X-Goodput-Session": "s1"})
            assert late.status == 410
            assert (await late.json())["error"]["code"] == "session_expired"
            assert r.gateway.desk.table.get("s1") is None
            assert not r.gateway.desk.children

    run(main)


def test_a_class_that_lists_reject_is_refused_at_once_while_no_group_is_ready() -> None:
    policy = policy_with(agent(degrade={"rungs": ["CapOutput", "Reject"], "capOutputTokens": 1}))

    async def main() -> None:
        async with rig(policy) as r:
            r.set_groups(g1=(False, False))
            await until(lambda: not r.gateway.groups["g1"].endpoint.ready, "the group is warming")
            refused = await r.post(completion(max_tokens=64))
            assert refused.status == 429
            assert refused.headers["X-Goodput-Degraded"] == "CapOutput,Reject"
            assert "Retry-After" in refused.headers
            labels = {"model_group": policy.model_group, "slo_class": "agent", "tenant": "default"}
            assert sample(r.gateway, "goodput_gateway_requests_offered_total", **labels) == 1
            outcome = {**labels, "outcome": "rejected", "reason": "NoReadyGroup"}
            assert sample(r.gateway, "goodput_gateway_requests_total", **outcome) == 1

    run(main)


async def serve_fallback(r: Any, family: str) -> tuple[Upstream, TestServer]:
    """A second ModelGroup, `llama-small`, served by the same gateway with one Ready group."""
    upstream = Upstream("small")
    server = TestServer(upstream.app(), host="127.0.0.1")
    await server.start_server()
    endpoint = GroupEndpoint("s1", str(server.make_url("")).rstrip("/"), True, False)
    small = dataclasses.replace(
        r.gateway.policy, model_group="llama-small", served_model="llama-small", model_family=family
    )
    r.front.serve(Gateway(small, StaticGroupSource([endpoint])))
    await until(lambda: bool(r.front.model_groups["llama-small"].groups), "the fallback has its group")
    return upstream, server


def test_the_fallback_rung_serves_a_class_during_a_cold_start_and_says_so() -> None:
    ladder = {"rungs": ["Fallback", "Reject"], "fallbackModelGroup": "llama-small"}
    policy = policy_with(agent(degrade=ladder), {"name": "critical", "ttftSeconds": 5, "itlSeconds": 0.1})

    async def main() -> None:
        async with rig(policy) as r:
            upstream, server = await serve_fallback(r, FAMILY)
            try:
                r.set_groups(g1=(False, False))
                await until(lambda: not r.gateway.groups["g1"].endpoint.ready, "the group is warming")
                served = await r.post(completion(), **{"X-Goodput-Class": "agent"})
                assert served.status == 200
                assert served.headers["X-Goodput-Degraded"] == "Fallback"
                assert served.headers["X-Goodput-Served-By"].startswith("llama-small/")
                assert upstream.received[-1].body["model"] == "llama-small"
                # The critical class lists no rung: it waits for its own groups, never the fallback.
                held = asyncio.create_task(r.post(completion(), **{"X-Goodput-Class": "critical"}))
                await asyncio.sleep(0)
                r.set_groups(g1=(True, False))
                answer = await held
                assert answer.status == 200 and "X-Goodput-Degraded" not in answer.headers
                assert len(upstream.received) == 1
            finally:
                await server.close()

    run(main)


def test_a_fallback_of_another_family_is_never_served() -> None:
    ladder = {"rungs": ["Fallback", "Reject"], "fallbackModelGroup": "llama-small"}
    policy = policy_with(agent(degrade=ladder))

    async def main() -> None:
        async with rig(policy) as r:
            upstream, server = await serve_fallback(r, "qwen-2.5")
            try:
                r.set_groups(g1=(False, False))
                await until(lambda: not r.gateway.groups["g1"].endpoint.ready, "the group is warming")
                refused = await r.post(completion())
                assert refused.status == 429 and refused.headers["X-Goodput-Degraded"] == "Reject"
                assert upstream.received == []
            finally:
                await server.close()

    run(main)


def test_optional_messages_are_left_out_only_on_their_rung() -> None:
    ladder = {"rungs": ["DropOptionalContext", "Reject"]}
    policy = policy_with(agent(ttftSeconds=0.05, degrade=ladder))
    messages = [
        {"role": "system", "content": "cite your sources"},
        {"role": "user", "content": "x" * 28_000, "goodput_optional": True},
        {"role": "user", "content": "the question"},
    ]
    body = {"model": MODEL, "messages": messages, "max_tokens": 4}

    async def main() -> None:
        async with rig(policy) as r:
            answer = await r.post(body, path="/v1/chat/completions")
            assert answer.status == 200, await answer.text()
            assert answer.headers["X-Goodput-Degraded"] == "DropOptionalContext"
            sent = r.upstreams["g1"].received[-1].body["messages"]
            assert [m["content"] for m in sent] == ["cite your sources", "the question"]

    run(main)


def test_the_deadline_ends_a_stream_under_way_with_an_error_event() -> None:
    policy = policy_with(agent(sessionBudget={"wallClockSeconds": 2.0}))

    async def main() -> None:
        async with rig(policy, tokens=1000, token_delay_seconds=0.05) as r:
            stream = await r.session.post(
                r.url + "/v1/completions",
                json=completion(max_tokens=1000, stream=True),
                headers={"X-Goodput-Session-Open": "s1"},
            )
            assert stream.status == 200 and stream.headers["X-Goodput-Session"] == "s1"
            text = (await stream.read()).decode()
            assert "session_expired" in text.splitlines()[-2]
            await until(lambda: r.upstreams["g1"].aborted == 1, "the engine's stream was closed")

    run(main)


def test_async_batch_accepts_now_and_hands_the_answer_out_once() -> None:
    policy = policy_with(agent(degrade={"rungs": ["AsyncBatch"]}))

    async def main() -> None:
        async with rig(policy) as r:
            r.set_groups(g1=(False, False))
            await until(lambda: not r.gateway.groups["g1"].endpoint.ready, "the group is warming")
            accepted = await r.post(completion(stream=True))
            assert accepted.status == 202
            assert accepted.headers["X-Goodput-Degraded"] == "AsyncBatch"
            url = r.url + accepted.headers["Location"]
            assert (await accepted.json())["result_url"] == accepted.headers["Location"]
            pending = await r.session.get(url)
            assert pending.status == 202 and pending.headers["Retry-After"] == "1"
            r.set_groups(g1=(True, False))
            await until(lambda: r.upstreams["g1"].finished == 1, "the engine answered it")
            statuses: list[int] = []

            async def claimed() -> bool:
                answer = await r.session.get(url)
                statuses.append(answer.status)
                if answer.status == 200:
                    assert (await answer.json())["usage"]["completion_tokens"] == 4
                    assert answer.headers["X-Goodput-Degraded"] == "AsyncBatch"
                return answer.status == 200

            while not await claimed():
                assert statuses[-1] == 202
            assert r.upstreams["g1"].received[-1].body["stream"] is False
            twice = await r.session.get(url)
            assert twice.status == 410
            assert (await twice.json())["error"]["code"] == "result_delivered"
            unknown = await r.session.get(r.url + f"/v1/goodput/results/{policy.model_group}/nope")
            assert unknown.status == 404

    run(main)


def test_a_sessions_children_go_to_the_group_that_serves_its_root() -> None:
    """The root's prompt is likely still in that group's prefix cache: its branches share it."""
    policy = policy_with(agent(sessionBudget={"branches": 10}))

    async def main() -> None:
        gate = asyncio.Event()
        async with rig(policy, groups=2, gate=gate) as r:
            root = asyncio.create_task(r.post(completion(), **{"X-Goodput-Session-Open": "s1"}))
            await until(lambda: sum(u.running for u in r.upstreams.values()) == 1, "the root in flight")
            (busy,) = [name for name, u in r.upstreams.items() if u.running == 1]
            children = [
                asyncio.create_task(r.post(completion(), **{"X-Goodput-Session": "s1"})) for _ in range(2)
            ]
            await until(lambda: r.upstreams[busy].running == 3, "the children on the root's group")
            gate.set()
            answers = await asyncio.gather(root, *children)
            assert {a.headers["X-Goodput-Group"] for a in answers} == {busy}

    run(main)


def test_the_optional_mark_never_reaches_the_engine_of_a_class_that_may_drop_context() -> None:
    policy = policy_with(agent(degrade={"rungs": ["DropOptionalContext"]}), {**agent(), "name": "plain"})
    messages = [
        {"role": "user", "content": "background", "goodput_optional": True},
        {"role": "user", "content": "the question"},
    ]
    body = {"model": MODEL, "messages": messages, "max_tokens": 4}

    async def main() -> None:
        async with rig(policy) as r:
            answer = await r.post(body, path="/v1/chat/completions")
            assert answer.status == 200 and "X-Goodput-Degraded" not in answer.headers
            sent = r.upstreams["g1"].received[-1].body["messages"]
            assert sent == [{"role": "user", "content": "background"}, messages[1]]
            # A class without the rung passes the body through untouched.
            await r.post(body, path="/v1/chat/completions", **{"X-Goodput-Class": "plain"})
            assert r.upstreams["g1"].received[-1].body["messages"] == messages

    run(main)
