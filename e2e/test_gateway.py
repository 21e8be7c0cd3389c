"""The gateway's stories (issue 17, item 7), each against the live emulator behind the real gateway.

- A pool scaled to zero wakes on the first request that reaches its gateway, and serves it.
- A noisy tenant at 10x the light one's rate does not push the light one below its SLO.
- An overload of 3x capacity keeps admitted requests inside their SLO; the rest get 429 and
  Retry-After.
- An infeasible request gets its class's overload action at once and never reaches an engine.
- A drain loses no request routed through the gateway, and nothing is routed to the draining group
  after its drain mark.
- Bad input gets its documented code, and the gateway keeps serving.
- Two ModelGroups behind one gateway: each request goes to its model's ModelGroup, `/v1/models`
  lists both, and a deleted ModelGroup's model goes away without a restart while the other serves.

Outcomes are measured from the client side (status, headers, the time to the first streamed chunk)
and from the gateway's and engines' own counters; no test asserts a timing of its own.

On the production path: the gateway (`goodput gateway`) runs on the host as a process, watching the
ModelGroup, its SLOPolicy and the leader pods through the API server and routing to the leaders'
pod IPs; the cluster's Prometheus scrapes it as a static target; the operator (`goodput run`) reads
the gateway's queue from Prometheus and scales through the scale subresource; the vLLM emulator
serves the new group's leader at its pod IP once it is loaded.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import test_autoscaler
from test_autoscaler import (
    LONG_PROMPT_TOKENS,
    Stage,
    model_group,
    slo_policy,
)

from goodput.api.labels import LEADER_RANK
from goodput.controllers.groups.observation import parse_pod
from goodput.testbed.cluster.testing import wait_for
from goodput.testbed.operator_process import GatewayProcess, operator_metric

pytestmark = pytest.mark.e2e

NAME = "chat"
POLICY = "interactive"
HOLD_SECONDS = 150  # longer than placing, loading and warming one group, and the decisions before


# The autoscaler stories' fixture (a GPU node, the emulator and the operator in the test's namespace),
# bound here so pytest finds it under the same name.
stage = test_autoscaler.stage


def held_policy(namespace: str) -> dict[str, Any]:
    policy = slo_policy(POLICY, namespace)
    policy["spec"]["admission"] = {"maxDeferSeconds": HOLD_SECONDS}
    return policy


def pool_at_zero(namespace: str) -> dict[str, Any]:
    group = model_group(NAME, namespace, replicas=0, policy=POLICY)
    group["spec"]["minReplicas"] = 0
    return group


@dataclass
class Answer:
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: dict[str, Any] = field(default_factory=dict)


def complete(url: str, timeout_seconds: float, **headers: str) -> Answer:
    body = json.dumps({"model": "llama", "prompt": "Hello there", "max_tokens": 4}).encode()
    request = urllib.request.Request(
        url + "/v1/completions", body, {"Content-Type": "application/json", **headers}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_seconds) as response:
            return Answer(response.status, dict(response.headers), json.loads(response.read()))
    except urllib.error.HTTPError as error:
        return Answer(error.code, dict(error.headers), json.loads(error.read() or b"{}"))


def test_a_pool_at_zero_wakes_on_the_gateways_queue_and_serves_the_held_request(
    stage: Stage, tmp_path: Path
) -> None:
    stage.apply(held_policy(stage.namespace), pool_at_zero(stage.namespace))
    with GatewayProcess(stage.cluster, stage.namespace, NAME, tmp_path / "gateway.log") as gateway:
        gateway.wait_serving()
        assert stage.replicas(NAME) == 0

        answer = Answer()

        def send() -> None:
            answer.__dict__.update(complete(gateway.url, HOLD_SECONDS + 20).__dict__)

        sender = threading.Thread(target=send, daemon=True, name="held-request")
        sender.start()

        def describe() -> str:
            return f"{stage.describe(NAME)}\ngateway log:\n{gateway.log_tail()}"

        wait_for(lambda: stage.replicas(NAME) == 1, timeout_seconds=90, describe=describe)
        stage.wait_ready_groups(NAME, 1, timeout_seconds=120)
        sender.join(timeout=HOLD_SECONDS + 30)
        assert answer.status == 200, f"{answer}\n{describe()}"
        # It was held for want of a ready group, then routed to the group that woke for it.
        assert answer.headers.get("X-Goodput-Reason") == "NoReadyGroup"
        ready = [g["name"] for g in stage.status(NAME).get("groups", []) if g["state"] == "Ready"]
        assert answer.headers.get("X-Goodput-Group") in ready
        assert answer.body["choices"]

        woke = [d for d in stage.decisions(NAME) if d["result"]["desired_groups"] == 1]
        assert woke, describe()
        assert woke[0]["reason"] == "gatewayQueue" and woke[0]["result"]["current_groups"] == 0
        assert woke[0]["inputs"]["gateway"] == "fresh"

        # A policy change applies without a restart: a new class is served, not refused as unknown.
        assert complete(gateway.url, 30, **{"X-Goodput-Class": "batch"}).status == 400
        changed = held_policy(stage.namespace)
        changed["spec"]["revision"] = "r2"
        changed["spec"]["classes"].append({"name": "batch", "ttftSeconds": 30.0, "itlSeconds": 0.5})
        stage.apply(changed)
        wait_for(
            lambda: complete(gateway.url, 30, **{"X-Goodput-Class": "batch"}).status == 200,
            timeout_seconds=30,
            interval_seconds=1.0,
            describe=describe,
        )


# --- a fixed fleet behind the gateway, and a bounded streaming client --------------------------------

TTFT_TARGET_SECONDS = 1.0  # the class of `slo_policy`: 1 s to the first token, 50 ms between tokens
ATTAINMENT = 0.9
"""The class's attainment target in these stories: the fraction of its admitted requests that must
meet the TTFT target, as the client measures it (on 2 shared cores, with the client on them too)."""
STREAM_PROMPT_TOKENS, STREAM_OUTPUT_TOKENS = 256, 64
# One group (`maxNumSeqs: 2`) serves about four 256-in/64-out requests a second.
GROUP_REQUESTS_PER_SECOND = 4.0
REQUEST_TIMEOUT_SECONDS = 30.0


def fixed_policy(namespace: str, **spec: Any) -> dict[str, Any]:
    """The class of `slo_policy` with ATTAINMENT; autoscaling Frozen, so the fleet stays as applied."""
    policy = slo_policy(POLICY, namespace, mode="Frozen")
    policy["spec"]["classes"][0]["attainment"] = ATTAINMENT
    policy["spec"].update(spec)
    return policy


def fixed_fleet(namespace: str, groups: int, *engine_args: str) -> dict[str, Any]:
    group = model_group(NAME, namespace, replicas=groups, policy=POLICY)
    group["spec"]["minReplicas"] = 1
    group["spec"]["maxReplicas"] = groups
    if engine_args:
        group["spec"]["engine"]["args"] = list(engine_args)
    return group


@dataclass(frozen=True)
class Planned:
    """One request of a plan: when to send it (seconds after the start), as whom, and its body."""

    at_seconds: float
    tenant: str = "default"
    prompt_tokens: int = STREAM_PROMPT_TOKENS
    output_tokens: int = STREAM_OUTPUT_TOKENS


@dataclass
class Seen:
    """What the client saw of one request."""

    planned: Planned
    sent_at: float = 0.0  # wall clock
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    ttft_seconds: float | None = None
    error: str = ""

    def met_ttft(self) -> bool:
        return (
            self.status == 200 and self.ttft_seconds is not None and self.ttft_seconds <= TTFT_TARGET_SECONDS
        )


def prompt_of(tokens: int, salt: str = "") -> str:
    """A prompt the gateway counts as `tokens` tokens (4 bytes a token), starting with `salt`: distinct
    salts make distinct prefixes, so prefix-cache affinity does not pin every request to one group."""
    return (f"{salt} " + "word " * tokens)[: 4 * tokens]


async def _send(session: aiohttp.ClientSession, url: str, seen: Seen, start: float) -> None:
    planned = seen.planned
    await asyncio.sleep(max(0.0, start + planned.at_seconds - time.monotonic()))
    body = {
        "model": "llama",
        "prompt": prompt_of(planned.prompt_tokens, f"{planned.tenant}-{planned.at_seconds:.3f}"),
        "max_tokens": planned.output_tokens,
        "stream": True,
    }
    seen.sent_at = time.time()
    sent = time.monotonic()
    try:
        async with session.post(
            url + "/v1/completions", json=body, headers={"X-Goodput-Tenant": planned.tenant}
        ) as answer:
            seen.status, seen.headers = answer.status, dict(answer.headers)
            async for chunk in answer.content.iter_any():
                if seen.ttft_seconds is None and b"data: " in chunk and answer.status == 200:
                    seen.ttft_seconds = time.monotonic() - sent
    except (aiohttp.ClientError, TimeoutError) as error:
        seen.error = f"{type(error).__name__}: {error}"


def offer(url: str, plan: list[Planned]) -> list[Seen]:
    """Send every planned request (streamed, open loop) and wait for every answer; bounded by the plan
    and by REQUEST_TIMEOUT_SECONDS a request."""

    async def run() -> list[Seen]:
        seen = [Seen(planned) for planned in plan]
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_SECONDS)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            start = time.monotonic() + 0.2
            await asyncio.gather(*(_send(session, url, one, start) for one in seen))
        return seen

    return asyncio.run(run())


def steady(rate_per_second: float, seconds: float, tenant: str = "default") -> list[Planned]:
    return [Planned(index / rate_per_second, tenant) for index in range(int(rate_per_second * seconds))]


def attainment(seen: list[Seen]) -> float:
    return sum(1 for one in seen if one.met_ttft()) / len(seen) if seen else 0.0


def summary(seen: list[Seen]) -> str:
    statuses: dict[str, int] = {}
    for one in seen:
        key = f"{one.status} {one.headers.get('X-Goodput-Reason', '')} {one.error[:60]}".strip()
        statuses[key] = statuses.get(key, 0) + 1
    ttfts = sorted(one.ttft_seconds for one in seen if one.ttft_seconds is not None)
    p50 = ttfts[len(ttfts) // 2] if ttfts else None
    p99 = ttfts[min(len(ttfts) - 1, int(len(ttfts) * 0.99))] if ttfts else None
    served = attainment([one for one in seen if one.status == 200])
    return (
        f"{len(seen)} requests: {statuses}; TTFT of the served p50 {p50}, p99 {p99}; "
        f"attainment of the served {served:.3f}"
    )


def retry_after_seconds(seen: Seen) -> int:
    """The Retry-After header as a positive whole number of seconds (fails the test otherwise)."""
    value = seen.headers.get("Retry-After", "")
    assert value.isdigit() and int(value) >= 1, f"Retry-After {value!r} on {seen}"
    return int(value)


def gateway_metric(gateway: GatewayProcess, name: str, **labels: str) -> float:
    value = operator_metric(gateway.metrics_port, name, {"model_group": NAME, **labels})
    return 0.0 if value is None else value


def serving_fleet(stage: Stage, groups: int, gateway: GatewayProcess) -> None:
    """Until `groups` groups are Ready and the gateway routes to all of them."""
    stage.wait_ready_groups(NAME, groups, timeout_seconds=120)
    gateway.wait_serving()
    wait_for(
        lambda: gateway_metric(gateway, "goodput_gateway_routable_groups") == groups,
        timeout_seconds=30,
        describe=lambda: f"the gateway routing to {groups} groups\n{gateway.log_tail()}",
    )


# --- the stories on a fixed fleet --------------------------------------------------------------------


def test_a_noisy_tenant_at_ten_times_the_rate_does_not_push_a_light_tenant_below_its_slo(
    stage: Stage, tmp_path: Path
) -> None:
    tenants = {"tenants": [{"name": "light", "weight": 1}, {"name": "noisy", "weight": 1}]}
    stage.apply(fixed_policy(stage.namespace, fairness=tenants), fixed_fleet(stage.namespace, 1))
    with GatewayProcess(stage.cluster, stage.namespace, NAME, tmp_path / "gateway.log") as gateway:
        serving_fleet(stage, 1, gateway)
        # The noisy tenant alone offers 1.5x what the group serves; the light one a tenth of that.
        noisy_rate = 1.5 * GROUP_REQUESTS_PER_SECOND
        plan = steady(noisy_rate, 30, "noisy") + steady(noisy_rate / 10, 30, "light")
        seen = offer(gateway.url, plan)
        light = [one for one in seen if one.planned.tenant == "light"]
        noisy = [one for one in seen if one.planned.tenant == "noisy"]
        report = f"light: {summary(light)}\nnoisy: {summary(noisy)}\ngateway log:\n{gateway.log_tail()}"
        print(f"noisy tenant story: light {summary(light)}; noisy {summary(noisy)}")

        # The light tenant is served, and inside its SLO, as if alone.
        assert all(one.status == 200 for one in light), report
        assert attainment(light) >= ATTAINMENT, report
        # The noisy one is held to what is left: refused with a time to come back, not served late.
        refused = [one for one in noisy if one.status == 429]
        assert len(refused) >= len(noisy) // 5, report
        assert all(one.status in (200, 429) for one in noisy), report
        for one in refused:
            retry_after_seconds(one)
        assert attainment([one for one in noisy if one.status == 200]) >= ATTAINMENT, report
        # The gateway counted the same: the noisy tenant's refusals, none of the light one's.
        for tenant, group in (("light", light), ("noisy", noisy)):
            offered = gateway_metric(gateway, "goodput_gateway_requests_offered_total", tenant=tenant)
            assert offered == len(group), report
        rejected = gateway_metric(
            gateway, "goodput_gateway_requests_total", tenant="light", outcome="rejected"
        )
        assert rejected == 0, report


def test_an_overload_of_three_times_capacity_keeps_admitted_requests_inside_the_slo(
    stage: Stage, tmp_path: Path
) -> None:
    stage.apply(fixed_policy(stage.namespace), fixed_fleet(stage.namespace, 1))
    with GatewayProcess(stage.cluster, stage.namespace, NAME, tmp_path / "gateway.log") as gateway:
        serving_fleet(stage, 1, gateway)
        seen = offer(gateway.url, steady(3 * GROUP_REQUESTS_PER_SECOND, 20))
        report = f"{summary(seen)}\ngateway log:\n{gateway.log_tail()}"
        print(f"overload story: {summary(seen)}")

        assert all(one.status in (200, 429) for one in seen), report
        admitted = [one for one in seen if one.status == 200]
        refused = [one for one in seen if one.status == 429]
        # About a third is served; the rest is refused at the door rather than served late.
        assert len(admitted) >= len(seen) // 6, report
        assert len(refused) >= len(seen) // 3, report
        assert attainment(admitted) >= ATTAINMENT, report
        # Each refusal says when to come back: whole seconds, from the time the queue needs to drain
        # enough (a short queue here: never the hold limit, let alone more).
        waits = [retry_after_seconds(one) for one in refused]
        print(f"overload story: Retry-After seconds {sorted(set(waits))}")
        assert max(waits) <= 30, report
        assert all(one.headers.get("X-Goodput-Reason") == "Deadline" for one in refused), report


def test_an_infeasible_request_gets_its_class_overload_action_at_once_and_never_reaches_an_engine(
    stage: Stage, tmp_path: Path
) -> None:
    # Two classes that act on overload differently; the engine's context holds the long prompt, so
    # it is refused for its zero-load TTFT floor (about 1.6 s of prefill), not for its length.
    classes = [
        {"name": "chat", "ttftSeconds": 1.0, "itlSeconds": 0.05, "overloadAction": "Reject"},
        {"name": "deferrable", "ttftSeconds": 1.0, "itlSeconds": 0.05, "overloadAction": "Defer"},
    ]
    stage.apply(
        fixed_policy(stage.namespace, classes=classes),
        fixed_fleet(stage.namespace, 1, "--max-model-len", "65536"),
    )
    with GatewayProcess(stage.cluster, stage.namespace, NAME, tmp_path / "gateway.log") as gateway:
        serving_fleet(stage, 1, gateway)
        # The engines' count of finished requests, once it has counted a first feasible one.
        finished = f'sum(vllm:request_success_total{{namespace="{stage.namespace}"}})'
        assert complete(gateway.url, 30).status == 200
        before = settled_value(stage, finished)
        long_prompt = {"model": "llama", "prompt": prompt_of(LONG_PROMPT_TOKENS), "max_tokens": 4}
        for cls in ("chat", "deferrable"):
            started = time.monotonic()
            answer = post(gateway.url, long_prompt, **{"X-Goodput-Class": cls})
            elapsed = time.monotonic() - started
            assert answer.status == 429 and elapsed < 1.0, (cls, answer, elapsed)
            assert answer.headers.get("X-Goodput-Reason") == "Infeasible", answer
            assert "X-Goodput-Group" not in answer.headers, answer
            assert answer.headers.get("Retry-After", "").isdigit(), answer
            infeasible = gateway_metric(gateway, "goodput_gateway_requests_infeasible_total", slo_class=cls)
            assert infeasible == 1, gateway.log_tail()
        # A feasible request after them is served; the engines finish exactly that one.
        assert complete(gateway.url, 30).status == 200
        wait_for(
            lambda: prometheus_values(stage, finished) == [before + 1],
            timeout_seconds=30,
            describe=lambda: (
                f"the engine's finished count {prometheus_values(stage, finished)} at {before + 1}"
            ),
        )
        # Three scrapes later still: an infeasible request sent to an engine would have finished by now.
        assert settled_value(stage, finished) == before + 1


SCRAPE_SECONDS = 2.0  # the session cluster's scrape interval


def settled_value(stage: Stage, query: str) -> float:
    """The query's one value once three scrapes apart agree (what the engines counted so far)."""

    def settled() -> list[float]:
        first = prometheus_values(stage, query)
        time.sleep(3 * SCRAPE_SECONDS)
        return first if first and first == prometheus_values(stage, query) else []

    return wait_for(settled, timeout_seconds=40, describe=f"a settled value of {query}")[0]


def prometheus_values(stage: Stage, query: str) -> list[float]:
    url = f"{stage.cluster.prometheus_url}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
    with urllib.request.urlopen(url, timeout=5) as reply:
        result = json.load(reply)["data"]["result"]
    return [float(series["value"][1]) for series in result]


def post(url: str, body: dict[str, Any] | bytes, path: str = "/v1/completions", **headers: str) -> Answer:
    """One request with a body as given (JSON unless bytes); the answer whatever its status."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(
        url + path, data, {"Content-Type": "application/json", **headers}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_SECONDS) as response:
            return Answer(response.status, dict(response.headers), json.loads(response.read()))
    except urllib.error.HTTPError as error:
        return Answer(error.code, dict(error.headers), json.loads(error.read() or b"{}"))


# Draining-since is the operator's decision time; it reaches the leader pod, and through the watch the
# gateway, a moment later. Requests sent this long after the mark must not land on the group.
MARK_DELIVERY_SECONDS = 0.5


def drain_marks(stage: Stage) -> dict[str, float]:
    """The drain mark (wall clock) of every group whose leader carries one."""
    listing = stage.cluster.api.get(f"/api/v1/namespaces/{stage.namespace}/pods") or {}
    marks: dict[str, float] = {}
    for raw in listing.get("items", []):
        pod = parse_pod(raw)
        if pod is not None and str(pod.rank) == LEADER_RANK and pod.draining_since is not None:
            marks[pod.group] = pod.draining_since.timestamp()
    return marks


def test_a_drain_loses_no_request_routed_through_the_gateway_and_routes_none_after_its_mark(
    stage: Stage, tmp_path: Path
) -> None:
    stage.apply(fixed_policy(stage.namespace), fixed_fleet(stage.namespace, 2))
    with GatewayProcess(stage.cluster, stage.namespace, NAME, tmp_path / "gateway.log") as gateway:
        serving_fleet(stage, 2, gateway)
        marks: dict[str, float] = {}

        def scale_in_mid_stream() -> None:
            time.sleep(8)
            path = f"/apis/goodput.dev/v1alpha1/namespaces/{stage.namespace}/modelgroups/{NAME}"
            stage.cluster.api.patch(path, {"spec": {"replicas": 1}})
            marks.update(wait_for(lambda: drain_marks(stage), timeout_seconds=30, interval_seconds=0.2))

        scaler = threading.Thread(target=scale_in_mid_stream, daemon=True, name="scale-in")
        scaler.start()
        seen = offer(gateway.url, steady(GROUP_REQUESTS_PER_SECOND / 2, 30))
        scaler.join(timeout=40)
        report = (
            f"{summary(seen)}\nmarks: {marks}\n{stage.describe(NAME)}\ngateway log:\n{gateway.log_tail()}"
        )

        assert len(marks) == 1, report
        ((victim, mark),) = marks.items()
        assert all(one.status == 200 for one in seen), report
        routed = [(one.sent_at, one.headers.get("X-Goodput-Group")) for one in seen]
        # The draining group served before its mark (so this could fail), and nothing sent after it.
        assert any(group == victim for at, group in routed if at < mark), report
        on_victim = sum(1 for _, group in routed if group == victim)
        print(f"drain story: {summary(seen)}; {on_victim} on {victim}, drain mark at {mark:.3f}")
        late = [at - mark for at, group in routed if group == victim and at > mark + MARK_DELIVERY_SECONDS]
        assert not late, f"sent this long after the mark, routed to {victim}: {late}\n{report}"
        assert any(group != victim for at, group in routed if at > mark + MARK_DELIVERY_SECONDS), report


def test_bad_input_through_the_live_gateway_gets_its_code_and_the_gateway_keeps_serving(
    stage: Stage, tmp_path: Path
) -> None:
    stage.apply(fixed_policy(stage.namespace), fixed_fleet(stage.namespace, 1))
    with GatewayProcess(stage.cluster, stage.namespace, NAME, tmp_path / "gateway.log") as gateway:
        serving_fleet(stage, 1, gateway)
        cases: dict[str, tuple[bytes | dict[str, Any], dict[str, str], str | None]] = {
            "malformed JSON": (b'{"model": "llama", "prompt": ', {}, None),
            "negative max_tokens": ({"model": "llama", "prompt": "Hi", "max_tokens": -1}, {}, "max_tokens"),
            "absurd max_tokens": ({"model": "llama", "prompt": "Hi", "max_tokens": 10**12}, {}, "max_tokens"),
            "prompt beyond the context": (
                {"model": "llama", "prompt": prompt_of(9000), "max_tokens": 4},
                {},
                None,
            ),
            "unknown class": (
                {"model": "llama", "prompt": "Hi", "max_tokens": 4},
                {"X-Goodput-Class": "gold"},
                None,
            ),
        }
        unknown = post(gateway.url, {"model": "gpt-9", "prompt": "Hi", "max_tokens": 4})
        assert unknown.status == 404, unknown
        assert unknown.body["error"]["param"] == "model" and "gpt-9" in unknown.body["error"]["message"]
        for case, (body, headers, param) in cases.items():
            answer = post(gateway.url, body, **headers)
            assert answer.status == 400, (case, answer)
            error = answer.body.get("error", {})
            assert error.get("message"), (case, answer)
            if param is not None:
                assert error.get("param") == param, (case, answer)
        # A client hanging up mid-stream frees its seat in the gateway (the engine, like vLLM, counts
        # a client's disconnect in no metric).
        abandon_a_stream(gateway)
        wait_for(
            lambda: (
                gateway_metric(gateway, "goodput_gateway_client_disconnects_total", stage="streaming") == 1
                and gateway_metric(gateway, "goodput_gateway_running_requests") == 0
            ),
            timeout_seconds=15,
            describe=lambda: f"the abandoned stream released\n{gateway.log_tail()}",
        )
        # Everyone else is still served.
        seen = offer(gateway.url, steady(2.0, 3))
        assert all(one.status == 200 for one in seen), summary(seen)


def abandon_a_stream(gateway: GatewayProcess) -> None:
    """Start a long stream, read its first bytes, and hang up."""
    body = json.dumps(
        {"model": "llama", "prompt": "Tell me a long story", "max_tokens": 2000, "stream": True}
    )
    connection = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=REQUEST_TIMEOUT_SECONDS)
    try:
        connection.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 200, response.read()
        assert b"data: " in response.read1(4096)
    finally:
        connection.close()


# --- many ModelGroups, one gateway ----------------------------------------------------------------

SECOND, SECOND_MODEL = "code", "qwen"
TEAM = "team=e2e"


def labelled(group: dict[str, Any]) -> dict[str, Any]:
    group["metadata"]["labels"] = {"team": "e2e"}
    return group


def test_two_model_groups_behind_one_gateway_are_routed_by_model_and_one_goes_without_a_restart(
    stage: Stage, tmp_path: Path
) -> None:
    second = fixed_fleet(stage.namespace, 1)
    second["metadata"]["name"] = SECOND
    second["spec"]["model"]["servedName"] = SECOND_MODEL
    stage.apply(fixed_policy(stage.namespace), labelled(fixed_fleet(stage.namespace, 1)), labelled(second))
    log = tmp_path / "gateway.log"
    with GatewayProcess(stage.cluster, stage.namespace, "", log, selector=TEAM) as gateway:
        serving_fleet(stage, 1, gateway)
        stage.wait_ready_groups(SECOND, 1, timeout_seconds=120)
        wait_for(
            lambda: (
                operator_metric(
                    gateway.metrics_port, "goodput_gateway_routable_groups", {"model_group": SECOND}
                )
                == 1
            ),
            timeout_seconds=30,
            describe=lambda: f"the gateway routing to {SECOND}'s group\n{gateway.log_tail()}",
        )
        with urllib.request.urlopen(gateway.url + "/v1/models", timeout=10) as reply:
            assert [model["id"] for model in json.loads(reply.read())["data"]] == ["llama", SECOND_MODEL]
        groups = {
            name: {g["name"] for g in stage.status(name).get("groups", []) if g["state"] == "Ready"}
            for name in (NAME, SECOND)
        }
        for model, name in (("llama", NAME), (SECOND_MODEL, SECOND), ("llama", NAME), (SECOND_MODEL, SECOND)):
            answer = post(gateway.url, {"model": model, "prompt": "Hi", "max_tokens": 4})
            assert answer.status == 200, answer
            assert answer.headers["X-Goodput-Group"] in groups[name], (model, answer.headers, groups)
            assert answer.body["model"] == model
        for name in (NAME, SECOND):  # the autoscaler's series, per ModelGroup
            offered = operator_metric(
                gateway.metrics_port,
                "goodput_gateway_requests_offered_total",
                {"model_group": name, "slo_class": "chat", "tenant": "default"},
            )
            assert offered == 2, (name, offered)

        stage.cluster.kubectl("delete", "modelgroup", SECOND, "-n", stage.namespace, "--wait=false")
        wait_for(
            lambda: post(gateway.url, {"model": SECOND_MODEL, "prompt": "Hi", "max_tokens": 4}).status == 404,
            timeout_seconds=30,
            interval_seconds=0.5,
            describe=lambda: f"{SECOND_MODEL} gone from the gateway\n{gateway.log_tail()}",
        )
        assert gateway.process is not None and gateway.process.poll() is None  # the same process
        assert post(gateway.url, {"model": "llama", "prompt": "Hi", "max_tokens": 4}).status == 200
