"""The gateway's watches: list, then watch with bookmarks from the last resourceVersion; 410 lists
again; failures back off; a changed ModelGroup or SLOPolicy reaches the running gateway.

The API server is a double on 127.0.0.1 (aiohttp) that answers list requests and streams scripted
watch events, recording every request's query, so the resume points are asserted as sent.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import waiting
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer

from goodput.controllers.compile.request_path import RequestPathPolicy
from goodput.gateway.cli import ModelGroupFollower
from goodput.gateway.front import GatewayFront
from goodput.gateway.groups import StaticGroupSource
from goodput.gateway.kube import (
    ApiServer,
    KubeModelGroupsSource,
    ResourceWatch,
    WatchBackoff,
    WatchedObjects,
    WatchError,
    WatchGoneError,
    compile_from_objects,
    parse_event,
)
from goodput.gateway.server import Gateway

SAMPLES = Path(__file__).resolve().parents[1] / "manifests" / "samples"
MODEL_GROUP = yaml.safe_load((SAMPLES / "modelgroup-llama-8b-tp1.yaml").read_text())
SLO_POLICY = yaml.safe_load((SAMPLES / "slopolicy-interactive.yaml").read_text())
FAST = WatchBackoff(initial_seconds=0.01, max_seconds=0.05)


def obj(name: str, version: str, **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": version}, **extra}


def with_version(doc: dict[str, Any], version: str) -> dict[str, Any]:
    copied = copy.deepcopy(doc)
    copied["metadata"]["resourceVersion"] = version
    return copied


# --- the event rules ---------------------------------------------------------------------------


@dataclass(frozen=True)
class EventCase:
    name: str
    event: dict[str, Any]
    changed: bool
    names: set[str]
    version: str


EVENT_CASES = [
    EventCase("an added object is kept", {"type": "ADDED", "object": obj("b", "6")}, True, {"a", "b"}, "6"),
    EventCase("a modified one replaces it", {"type": "MODIFIED", "object": obj("a", "7")}, True, {"a"}, "7"),
    EventCase("a deleted one goes", {"type": "DELETED", "object": obj("a", "8")}, True, set(), "8"),
    EventCase(
        "deleting the unknown changes nothing",
        {"type": "DELETED", "object": obj("z", "8")},
        False,
        {"a"},
        "8",
    ),
    EventCase(
        "a bookmark only moves the version", {"type": "BOOKMARK", "object": obj("", "42")}, False, {"a"}, "42"
    ),
    EventCase(
        "an unnamed object is ignored", {"type": "ADDED", "object": {"metadata": {}}}, False, {"a"}, "5"
    ),
]


@pytest.mark.parametrize("case", EVENT_CASES, ids=[case.name for case in EVENT_CASES])
def test_event(case: EventCase) -> None:
    state = WatchedObjects()
    state.replace({"metadata": {"resourceVersion": "5"}, "items": [obj("a", "3")]})
    assert state.apply(case.event) is case.changed
    assert (set(state.objects), state.resource_version) == (case.names, case.version)


def test_410_forgets_the_resume_point_and_other_errors_keep_it() -> None:
    state = WatchedObjects(resource_version="9")
    with pytest.raises(WatchError, match="500"):
        state.apply({"type": "ERROR", "object": {"code": 500, "message": "internal"}})
    assert state.resource_version == "9"
    with pytest.raises(WatchGoneError, match="too old"):
        state.apply({"type": "ERROR", "object": {"code": 410, "message": "too old resource version"}})
    assert state.resource_version == ""


def test_event_lines() -> None:
    assert parse_event(b"\n") is None
    assert parse_event(b'{"type": "ADDED", "object": {}}\n') == {"type": "ADDED", "object": {}}
    with pytest.raises(ValueError, match="JSON object"):
        parse_event(b"[1, 2]\n")
    with pytest.raises(ValueError):
        parse_event(b"{truncated\n")


def test_backoff_grows_and_is_capped() -> None:
    backoff = WatchBackoff(initial_seconds=0.5, max_seconds=4.0)
    assert [backoff.delay_seconds(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


# --- the loop against an API server double -------------------------------------------------------


@dataclass
class FakeApi:
    """Serves `lists[path]` to list requests and, per watch request on a path, the next script:
    a list of events to stream then close, or an int status to answer with."""

    lists: dict[str, dict[str, Any]]
    scripts: dict[str, list[list[dict[str, Any]] | int]]
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    hold: asyncio.Event = field(default_factory=asyncio.Event)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/{path:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = "/" + request.match_info["path"]
        self.requests.append((path, dict(request.query)))
        if request.query.get("watch") != "1":
            return web.json_response(self.lists[path])
        script = self.scripts.get(path) or []
        if not script:
            await self.hold.wait()  # an idle watch: stays open until the test ends
            return web.Response(status=200)
        step = script.pop(0)
        if isinstance(step, int):
            return web.Response(status=step)
        response = web.StreamResponse()
        await response.prepare(request)
        for event in step:
            await response.write(json.dumps(event).encode() + b"\n")
        await response.write_eof()
        return response

    def watches(self, path: str) -> list[dict[str, str]]:
        return [query for p, query in self.requests if p == path and query.get("watch") == "1"]

    def list_count(self, path: str) -> int:
        return sum(1 for p, query in self.requests if p == path and query.get("watch") != "1")


async def until(condition: Callable[[], bool], seconds: float = 5.0) -> None:
    await waiting.until(condition, "the watch's expected state", timeout_seconds=seconds)


async def with_api(api: FakeApi, body: Callable[[ApiServer], Awaitable[None]]) -> None:
    server = TestServer(api.app(), host="127.0.0.1")
    await server.start_server()
    try:
        await body(ApiServer(str(server.make_url("")).rstrip("/"), {}, False))
    finally:
        api.hold.set()
        await server.close()


PODS = "/api/v1/namespaces/ns/pods"


def test_the_watch_resumes_from_bookmarks_relists_on_410_and_backs_off_on_failures() -> None:
    api = FakeApi(
        lists={PODS: {"metadata": {"resourceVersion": "10"}, "items": [obj("p0", "9")]}},
        scripts={
            PODS: [
                [{"type": "ADDED", "object": obj("p1", "11")}, {"type": "BOOKMARK", "object": obj("", "15")}],
                500,
                [{"type": "ERROR", "object": {"code": 410, "message": "too old resource version"}}],
            ]
        },
    )
    seen: list[set[str]] = []

    async def body(server: ApiServer) -> None:
        watch = ResourceWatch(server, PODS, lambda objects: seen.append(set(objects)), backoff=FAST)
        task = asyncio.create_task(watch.run())
        try:
            await until(lambda: len(api.watches(PODS)) >= 4)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(asyncio.wait_for(with_api(api, body), 20))
    versions = [query["resourceVersion"] for query in api.watches(PODS)]
    # From the list; from the bookmark (the stream ended: resume, no list); again after the 500;
    # after the 410, from a new list's version.
    assert versions[:4] == ["10", "15", "15", "10"]
    assert all(query["allowWatchBookmarks"] == "true" for query in api.watches(PODS))
    assert api.list_count(PODS) == 2
    assert seen[:2] == [{"p0"}, {"p0", "p1"}]


BASE = "/apis/goodput.dev/v1alpha1/namespaces/ns"


def test_a_policy_change_reaches_the_running_gateway() -> None:
    group = with_version(MODEL_GROUP, "3")
    policy = with_version(SLO_POLICY, "4")
    changed = copy.deepcopy(policy)
    changed["metadata"]["resourceVersion"] = "12"
    changed["spec"]["classes"].append({"name": "batch", "ttftSeconds": 30.0, "itlSeconds": 0.5})
    api = FakeApi(
        lists={
            f"{BASE}/modelgroups": {"metadata": {"resourceVersion": "5"}, "items": [group]},
            f"{BASE}/slopolicies": {"metadata": {"resourceVersion": "5"}, "items": [policy]},
        },
        scripts={f"{BASE}/slopolicies": [[{"type": "MODIFIED", "object": changed}]]},
    )
    updates: list[RequestPathPolicy | str] = []

    async def body(server: ApiServer) -> None:
        source = KubeModelGroupsSource(server, "ns", name=MODEL_GROUP["metadata"]["name"], backoff=FAST)
        task = asyncio.create_task(source.run(lambda report: updates.append(report[NAME].policy)))
        try:
            await until(lambda: len(updates) >= 2)
            first, second = updates[:2]
            assert isinstance(first, RequestPathPolicy) and isinstance(second, RequestPathPolicy)
            gateway = Gateway(first, StaticGroupSource())
            gateway.update_policy(second)
            assert "batch" in gateway.policy.admission.classes
            assert gateway.queue.policy is second.fairness
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(asyncio.wait_for(with_api(api, body), 20))
    assert len(updates) == 2  # the same objects again compile to the same policy: not repeated
    watched = api.watches(f"{BASE}/modelgroups")
    assert watched and watched[0]["fieldSelector"] == f"metadata.name={MODEL_GROUP['metadata']['name']}"


def labelled(name: str, version: str, served: str, created: str) -> dict[str, Any]:
    """The sample ModelGroup renamed, serving `served`, labelled for the gateway's selector."""
    doc = with_version(MODEL_GROUP, version)
    doc["metadata"].update(name=name, creationTimestamp=created, labels={"team": "search"})
    doc["spec"]["model"]["servedName"] = served
    return doc


def test_model_groups_selected_come_and_go_in_the_gateway_without_a_restart() -> None:
    """The watch of a selector, followed into the front: a ModelGroup added while serving is served,
    its model listed; a deleted one is retired and its model is gone."""
    first = labelled("chat", "3", "chat-model", "2026-01-01T00:00:00Z")
    second = labelled("code", "6", "code-model", "2026-01-02T00:00:00Z")
    api = FakeApi(
        lists={
            f"{BASE}/modelgroups": {"metadata": {"resourceVersion": "5"}, "items": [first]},
            f"{BASE}/slopolicies": {"metadata": {"resourceVersion": "5"}, "items": [SLO_POLICY]},
            PODS: {"metadata": {"resourceVersion": "5"}, "items": []},
        },
        scripts={
            f"{BASE}/modelgroups": [
                [{"type": "ADDED", "object": second}],
                [{"type": "DELETED", "object": with_version(first, "7")}],
            ]
        },
    )
    seen: list[list[str]] = []

    async def body(server: ApiServer) -> None:
        front = GatewayFront()
        follower = ModelGroupFollower(front, server, "ns")
        source = KubeModelGroupsSource(server, "ns", selector="team=search", backoff=FAST)

        async def apply(report: Any) -> None:
            await follower.apply(report)
            seen.append(sorted(front.served.by_model))

        reports: asyncio.Queue[Any] = asyncio.Queue()
        task = asyncio.create_task(source.run(reports.put_nowait))
        try:
            for _ in range(3):
                await apply(await asyncio.wait_for(reports.get(), 10))
            assert front.gateway_for("chat-model") is None and set(front.model_groups) == {"code"}
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await asyncio.gather(*(gateway.stop() for gateway in front.model_groups.values()))

    asyncio.run(asyncio.wait_for(with_api(api, body), 20))
    assert seen == [["chat-model"], ["chat-model", "code-model"], ["code-model"]]
    watched = api.watches(f"{BASE}/modelgroups")
    assert watched and watched[0]["labelSelector"] == "team=search"


# --- compiling from what is watched --------------------------------------------------------------

NAME = MODEL_GROUP["metadata"]["name"]
UNREF = copy.deepcopy(MODEL_GROUP)
del UNREF["spec"]["policyRef"]
BROKEN_POLICY = copy.deepcopy(SLO_POLICY)
BROKEN_POLICY["spec"]["classes"] = "not a list"


@pytest.mark.parametrize(
    ("name", "groups", "policies", "message"),
    [
        ("the ModelGroup is gone", {}, {"interactive": SLO_POLICY}, "does not exist"),
        ("no policyRef", {NAME: UNREF}, {"interactive": SLO_POLICY}, "spec.policyRef"),
        ("the policy is missing", {NAME: MODEL_GROUP}, {}, "SLOPolicy ns/interactive"),
        ("the policy cannot be read", {NAME: MODEL_GROUP}, {"interactive": BROKEN_POLICY}, "cannot be read"),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_what_cannot_be_compiled_says_why(
    name: str, groups: dict[str, Any], policies: dict[str, Any], message: str
) -> None:
    result, _ = compile_from_objects(groups, policies, "ns", NAME)
    assert isinstance(result, str) and message in result


def test_the_watched_objects_compile() -> None:
    result, model_group = compile_from_objects({NAME: MODEL_GROUP}, {"interactive": SLO_POLICY}, "ns", NAME)
    assert isinstance(result, RequestPathPolicy) and model_group is not None
    assert result.model_group == NAME


def test_a_policy_for_another_model_group_is_refused() -> None:
    result, _ = compile_from_objects({NAME: MODEL_GROUP}, {"interactive": SLO_POLICY}, "ns", NAME)
    assert isinstance(result, RequestPathPolicy)
    gateway = Gateway(result, StaticGroupSource())
    other = copy.deepcopy(MODEL_GROUP)
    other["metadata"]["name"] = "other"
    renamed, _ = compile_from_objects({"other": other}, {"interactive": SLO_POLICY}, "ns", "other")
    assert isinstance(renamed, RequestPathPolicy)
    with pytest.raises(ValueError, match="gets its own"):
        gateway.update_policy(renamed)
