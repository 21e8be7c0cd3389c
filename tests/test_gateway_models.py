"""Many ModelGroups behind one gateway: the served-name table (goodput.gateway.registry), and the
front on 127.0.0.1 routing each request by its `model` to that ModelGroup's own request path."""

from __future__ import annotations

import argparse
import asyncio
import copy
import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp.test_utils import TestServer
from gateway_upstream import Upstream
from hypothesis import given, settings
from hypothesis import strategies as st
from waiting import until

from goodput.api.modelgroup import ModelGroup
from goodput.api.slopolicy import SloPolicy
from goodput.controllers.compile.request_path import RequestPathPolicy, compile_request_path
from goodput.gateway.cli import add_arguments, standalone_model_groups
from goodput.gateway.connections import start_serving
from goodput.gateway.front import GatewayFront
from goodput.gateway.groups import GroupEndpoint, StaticGroupSource
from goodput.gateway.registry import (
    ModelClaim,
    NameConflict,
    ServingPlan,
    plan_serving,
    resolve_served_models,
)
from goodput.gateway.server import Gateway

SAMPLES = Path(__file__).resolve().parents[1] / "manifests" / "samples"
GROUP_DOC = yaml.safe_load((SAMPLES / "modelgroup-llama-8b-tp1.yaml").read_text())
POLICY_DOC = yaml.safe_load((SAMPLES / "slopolicy-interactive.yaml").read_text())


def policy_for(
    name: str, served: str, max_num_seqs: int = 4, max_defer_seconds: float = 2.0
) -> RequestPathPolicy:
    group = copy.deepcopy(GROUP_DOC)
    group["metadata"]["name"] = name
    group["spec"]["model"]["servedName"] = served
    group["spec"]["profile"]["maxNumSeqs"] = max_num_seqs
    slo = copy.deepcopy(POLICY_DOC)
    slo["spec"]["admission"] = {"maxDeferSeconds": max_defer_seconds}
    compiled = compile_request_path(ModelGroup.model_validate(group), SloPolicy.model_validate(slo))
    assert isinstance(compiled, RequestPathPolicy), compiled
    return compiled


# --- the served-name table -----------------------------------------------------------------------


@dataclass(frozen=True)
class TableCase:
    name: str
    claims: list[ModelClaim]
    table: dict[str, str]
    conflicts: list[NameConflict]


TABLE_CASES = [
    TableCase("nothing served", [], {}, []),
    TableCase(
        "two names, two ModelGroups",
        [ModelClaim("chat", "llama"), ModelClaim("code", "qwen")],
        {"llama": "chat", "qwen": "code"},
        [],
    ),
    TableCase(
        "the ModelGroup created first keeps a shared name",
        [
            ModelClaim("new", "llama", "2026-02-01T00:00:00Z"),
            ModelClaim("old", "llama", "2026-01-01T00:00:00Z"),
        ],
        {"llama": "old"},
        [NameConflict("llama", "old", ("new",))],
    ),
    TableCase(
        "created at the same second: by name",
        [ModelClaim("b", "llama", "2026-01-01T00:00:00Z"), ModelClaim("a", "llama", "2026-01-01T00:00:00Z")],
        {"llama": "a"},
        [NameConflict("llama", "a", ("b",))],
    ),
    TableCase(
        "three claimants: two left out, in creation order",
        [
            ModelClaim("c", "llama", "2026-03-01T00:00:00Z"),
            ModelClaim("a", "llama", "2026-01-01T00:00:00Z"),
            ModelClaim("b", "llama", "2026-02-01T00:00:00Z"),
            ModelClaim("d", "qwen", "2026-01-01T00:00:00Z"),
        ],
        {"llama": "a", "qwen": "d"},
        [NameConflict("llama", "a", ("b", "c"))],
    ),
]


@pytest.mark.parametrize("case", TABLE_CASES, ids=[case.name for case in TABLE_CASES])
def test_served_names(case: TableCase) -> None:
    served = resolve_served_models(case.claims)
    assert dict(served.by_model) == case.table
    assert list(served.conflicts) == case.conflicts


def test_a_conflict_message_names_the_model_and_every_modelgroup() -> None:
    message = NameConflict("llama", "old", ("new", "newer")).message()
    assert all(word in message for word in ("'llama'", "old", "new", "newer", "created first"))


CLAIMS = st.lists(
    st.builds(
        ModelClaim,
        st.text("abcdef", min_size=1, max_size=3),
        st.sampled_from(["llama", "qwen", "mistral", "phi"]),
        st.sampled_from(["", "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"]),
    ),
    max_size=12,
    unique_by=lambda claim: claim.model_group,
)


@given(CLAIMS, st.randoms(use_true_random=False))
def test_a_model_routes_only_to_a_modelgroup_that_serves_it_whatever_the_order(
    claims: list[ModelClaim], random: Any
) -> None:
    served = resolve_served_models(claims)
    shuffled = list(claims)
    random.shuffle(shuffled)
    assert resolve_served_models(shuffled) == served  # the watch's order never changes the answer
    serves = {claim.model_group: claim.served_model for claim in claims}
    for model, model_group in served.by_model.items():
        assert serves[model_group] == model  # never another model's ModelGroup
    assert set(served.by_model) == set(serves.values())  # every claimed name is served by one
    left_out = [name for conflict in served.conflicts for name in conflict.left_out]
    assert len(left_out) == len(claims) - len(served.by_model)
    assert served.model_group_for("gpt-9") is None


NAMES, SERVED = ("a", "b", "c", "d"), ("x", "y", "z")
POLICIES = {(name, served): policy_for(name, served) for name in NAMES for served in SERVED}
OPERATIONS = st.lists(
    st.tuples(
        st.sampled_from(["serve", "retire", "rename"]), st.sampled_from(NAMES), st.sampled_from(SERVED)
    ),
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(OPERATIONS)
def test_while_modelgroups_come_go_and_are_renamed_a_model_reaches_only_a_modelgroup_serving_it(
    operations: list[tuple[str, str, str]],
) -> None:
    """The front's table after any sequence of serving, retiring and renaming: every model it
    answers for goes to a served ModelGroup that serves that name, every claimed name is answered
    for, and /v1/models lists exactly those names."""

    async def main() -> None:
        front = GatewayFront()
        for operation, name, served in operations:
            if operation == "serve" and name not in front.model_groups:
                front.serve(Gateway(POLICIES[name, served], StaticGroupSource()))
            elif operation == "retire":
                await front.retire(name, "gone")
            elif operation == "rename" and name in front.model_groups:
                front.update_policy(POLICIES[name, served])
            claimed = {gateway.policy.served_model for gateway in front.model_groups.values()}
            for model in SERVED:
                gateway = front.gateway_for(model)
                if model not in claimed:
                    assert gateway is None
                    continue
                assert gateway is not None and gateway.policy.served_model == model
                assert front.model_groups[gateway.policy.model_group] is gateway
            assert set(front.served.by_model) == claimed

    asyncio.run(main())


A = policy_for("chat", "llama")
A_CHANGED = policy_for("chat", "llama", max_num_seqs=8)
B = policy_for("code", "qwen")


@dataclass(frozen=True)
class PlanCase:
    name: str
    served: dict[str, RequestPathPolicy]
    watched: dict[str, RequestPathPolicy | str]
    plan: ServingPlan


PLAN_CASES = [
    PlanCase("the first report starts all", {}, {"chat": A, "code": B}, ServingPlan(start=("chat", "code"))),
    PlanCase("the same again changes nothing", {"chat": A}, {"chat": A}, ServingPlan()),
    PlanCase("a changed policy updates", {"chat": A}, {"chat": A_CHANGED}, ServingPlan(update=("chat",))),
    PlanCase(
        "a deleted ModelGroup retires", {"chat": A, "code": B}, {"code": B}, ServingPlan(retire=("chat",))
    ),
    PlanCase(
        "a broken policy keeps the served one and starts nothing",
        {"chat": A},
        {"chat": "SLOPolicy ns/x does not exist", "code": "no policyRef"},
        ServingPlan(unservable={"chat": "SLOPolicy ns/x does not exist", "code": "no policyRef"}),
    ),
]


@pytest.mark.parametrize("case", PLAN_CASES, ids=[case.name for case in PLAN_CASES])
def test_serving_plan(case: PlanCase) -> None:
    assert plan_serving(case.served, case.watched) == case.plan


# --- the front: many ModelGroups, one server ------------------------------------------------------


@dataclass
class Bed:
    url: str
    front: GatewayFront
    upstreams: dict[str, Upstream]  # by ModelGroup
    session: aiohttp.ClientSession

    async def post(self, model: str, **headers: str) -> aiohttp.ClientResponse:
        body = {"model": model, "prompt": "Hello there", "max_tokens": 4}
        response = await self.session.post(self.url + "/v1/completions", json=body, headers=headers)
        await response.read()
        return response

    async def add(self, policy: RequestPathPolicy, **upstream: Any) -> Gateway:
        """One more ModelGroup with one group in front of an in-test upstream, while serving."""
        upstream_doubles = Upstream(f"{policy.model_group}-g1", **upstream)
        server = TestServer(upstream_doubles.app(), host="127.0.0.1")
        await server.start_server()
        self._servers.append(server)
        endpoint = GroupEndpoint("g1", str(server.make_url("")).rstrip("/"), True, False)
        gateway = Gateway(policy, StaticGroupSource([endpoint]), metrics=self.front.metrics)
        self.front.serve(gateway)
        self.upstreams[policy.model_group] = upstream_doubles
        await until(lambda: "g1" in gateway.groups, "the new ModelGroup's group is known")
        return gateway

    _servers: list[TestServer] = dataclasses.field(default_factory=list)


@asynccontextmanager
async def bed(*policies: RequestPathPolicy, **upstream: Any) -> AsyncIterator[Bed]:
    front = GatewayFront()
    runner = await start_serving(front.app(), "127.0.0.1", 0, front.limits, front.count_connection_closed)
    port = runner.addresses[0][1]
    async with aiohttp.ClientSession() as session:
        rig = Bed(f"http://127.0.0.1:{port}", front, {}, session)
        try:
            for policy in policies:
                await rig.add(policy, **upstream)
            yield rig
        finally:
            await runner.cleanup()
            for server in rig._servers:
                await server.close()


def run(test: Any) -> None:
    asyncio.run(asyncio.wait_for(test(), timeout=30))


def sample(front: GatewayFront, name: str, **labels: str) -> float:
    value = front.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_models_lists_every_served_model() -> None:
    async def main() -> None:
        async with bed(A, B) as b:
            response = await b.session.get(b.url + "/v1/models")
            body = await response.json()
            assert body["object"] == "list"
            assert [(m["id"], m["object"]) for m in body["data"]] == [("llama", "model"), ("qwen", "model")]

    run(main)


def test_each_request_goes_to_its_models_modelgroup_and_is_counted_there() -> None:
    async def main() -> None:
        async with bed(A, B) as b:
            for model in ("llama", "qwen", "qwen"):
                response = await b.post(model)
                assert response.status == 200, await response.text()
            assert [r.body["model"] for r in b.upstreams["chat"].received] == ["llama"]
            assert [r.body["model"] for r in b.upstreams["code"].received] == ["qwen", "qwen"]
            offered = "goodput_gateway_requests_offered_total"
            labels = {"slo_class": "chat", "tenant": "default"}
            assert sample(b.front, offered, model_group="chat", **labels) == 1
            assert sample(b.front, offered, model_group="code", **labels) == 2

    run(main)


def test_an_unknown_model_is_a_404_naming_it_and_the_served_ones() -> None:
    async def main() -> None:
        async with bed(A, B) as b:
            response = await b.post("gpt-9")
            assert response.status == 404
            error = (await response.json())["error"]
            assert error["param"] == "model" and error["code"] == "model_not_found"
            assert all(name in error["message"] for name in ("'gpt-9'", "'llama'", "'qwen'"))
            assert not b.upstreams["chat"].received and not b.upstreams["code"].received

    run(main)


def test_one_modelgroups_overload_leaves_the_others_admission_alone() -> None:
    """chat's single seat is held and its queue refuses; code, behind the same gateway, is served."""

    async def main() -> None:
        gate = asyncio.Event()
        async with bed(policy_for("chat", "llama", max_num_seqs=1, max_defer_seconds=0.3), B) as b:
            b.upstreams["chat"].gate = gate
            chat = b.front.model_groups["chat"]
            held = [asyncio.create_task(b.post("llama")) for _ in range(3)]
            await until(lambda: b.upstreams["chat"].running == 1 and len(chat.queue) >= 1, "chat is full")
            response = await b.post("qwen")
            assert response.status == 200 and len(b.front.model_groups["code"].queue) == 0
            gate.set()
            await asyncio.gather(*held)

    run(main)


def test_a_modelgroup_added_while_serving_is_served_and_a_retired_one_answers_its_queue() -> None:
    async def main() -> None:
        gate = asyncio.Event()
        async with bed(policy_for("chat", "llama", max_num_seqs=1, max_defer_seconds=10.0)) as b:
            assert (await b.post("qwen")).status == 404
            await b.add(B)
            assert (await b.post("qwen")).status == 200
            b.upstreams["chat"].gate = gate
            chat = b.front.model_groups["chat"]
            first = asyncio.create_task(b.post("llama"))
            queued = asyncio.create_task(b.post("llama"))
            await until(lambda: len(chat.queue) == 1, "the second request waits for chat's seat")
            await b.front.retire("chat", "ModelGroup ns/chat was deleted")
            answer = await queued
            assert answer.status == 503 and answer.headers["Retry-After"] == "1"
            error = (await answer.json())["error"]
            assert error["code"] == "ModelGroupRetired" and "ns/chat was deleted" in error["message"]
            gate.set()
            assert (await first).status == 200  # in flight when retired: finished on its engine
            assert (await b.post("llama")).status == 404
            assert (await b.post("qwen")).status == 200
            queued_gauge = "goodput_gateway_queued_requests"
            assert (
                b.front.metrics.registry.get_sample_value(
                    queued_gauge, {"model_group": "chat", "slo_class": "chat"}
                )
                is None
            )

    run(main)


def test_two_modelgroups_serving_one_name_leave_the_newer_out_and_say_so() -> None:
    async def main() -> None:
        async with bed(A) as b:
            await b.add(policy_for("chat-copy", "llama"))  # created later: left out
            for _ in range(2):
                assert (await b.post("llama")).status == 200
            assert len(b.upstreams["chat"].received) == 2 and not b.upstreams["chat-copy"].received
            conflicts = "goodput_gateway_served_model_conflicts"
            assert sample(b.front, conflicts, model_group="chat-copy", served_model="llama") == 1
            await b.front.retire("chat", "ModelGroup ns/chat was deleted")
            assert (await b.post("llama")).status == 200  # the other claimant takes the name
            assert len(b.upstreams["chat-copy"].received) == 1
            assert (
                b.front.metrics.registry.get_sample_value(
                    conflicts, {"model_group": "chat-copy", "served_model": "llama"}
                )
                is None
            )

    run(main)


# --- standalone mode: several ModelGroups from files ----------------------------------------------


def standalone_args(tmp_path: Path, *upstreams: str) -> Any:
    documents = []
    for name, served in (("chat", "llama"), ("code", "qwen")):
        group = copy.deepcopy(GROUP_DOC)
        group["metadata"]["name"] = name
        group["spec"]["model"]["servedName"] = served
        documents.append(group)
    (tmp_path / "groups.yaml").write_text(yaml.safe_dump_all(documents))
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(POLICY_DOC))
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    argv = ["--modelgroup", str(tmp_path / "groups.yaml"), "--policy", str(tmp_path / "policy.yaml")]
    return parser.parse_args([*argv, *(f"--upstream={item}" for item in upstreams)])


def test_standalone_mode_serves_each_modelgroup_of_the_files_with_its_own_upstreams(tmp_path: Path) -> None:
    args = standalone_args(tmp_path, "chat/g1=http://a:1", "code/g1=http://b:2", "code/g2=http://c:3/")
    served = standalone_model_groups(args)
    policies = [policy for policy, _ in served]
    assert [(p.model_group, p.served_model) for p in policies if not isinstance(p, str)] == [
        ("chat", "llama"),
        ("code", "qwen"),
    ]
    sources = [source for _, source in served]
    assert isinstance(sources[1], StaticGroupSource)
    assert {g.base_url for g in sources[1]._groups.values()} == {"http://b:2", "http://c:3"}


@pytest.mark.parametrize(
    ("upstream", "message"),
    [
        ("g1=http://a:1", "MODELGROUP/GROUP=URL for several"),
        ("nope/g1=http://a:1", "no ModelGroup 'nope'"),
        ("chat/g1", "expected GROUP=URL"),
    ],
    ids=["unnamed with several ModelGroups", "an unknown ModelGroup", "no URL"],
)
def test_a_standalone_upstream_that_names_no_served_modelgroup_is_refused(
    tmp_path: Path, upstream: str, message: str
) -> None:
    with pytest.raises(SystemExit, match=message):
        standalone_model_groups(standalone_args(tmp_path, upstream))
