"""The open-loop load generator: target safety, the plan, prompts, the report, and what it measures
against an emulated vLLM on loopback (every outcome it can classify, and every bound it keeps)."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from waiting import until

from goodput.estimators.service_time import H100_80G, LLAMA_3_1_8B
from goodput.simulator.engine import EngineConfig
from goodput.simulator.workload import Workload
from goodput.testbed.emulator_engine import ServingProfile
from goodput.testbed.emulator_netns import bind_listener
from goodput.testbed.emulator_server import ServerIdentity, VllmServer, count_prompt_tokens
from goodput.testbed.loadgen import (
    GROUP_HEADER,
    TENANT_HEADER,
    LoadGenerator,
    LoadReport,
    LoadSettings,
    PlannedRequest,
    RequestResult,
    TargetPolicy,
    TargetPool,
    UnsafeTargetError,
    build_report,
    parse_target,
    plan_requests,
    ready_endpoints,
    render_prompt,
)


# ------------------------------------------------------------------------------------ targets
def policy(routes: dict[str, str], kinds: dict[str, str]) -> TargetPolicy:
    return TargetPolicy(route_device=routes.get, device_kind=kinds.get)


@pytest.mark.parametrize(
    ("host", "routes", "kinds", "allowed"),
    [
        ("127.0.0.1", {}, {}, True),
        ("::1", {}, {}, True),
        ("localhost", {}, {}, True),
        ("10.200.3.7", {"10.200.3.7": "gp200h"}, {"gp200h": "veth"}, True),
        ("10.200.3.7", {"10.200.3.7": "eth0"}, {}, False),
        ("192.168.1.10", {"192.168.1.10": "docker0"}, {"docker0": "bridge"}, False),
        ("8.8.8.8", {"8.8.8.8": "gp200h"}, {"gp200h": "veth"}, False),
        ("10.9.9.9", {}, {}, False),
    ],
    ids=[
        "loopback",
        "loopback-v6",
        "localhost",
        "pod-ip-via-veth",
        "private-via-ethernet",
        "private-via-bridge",
        "public-even-via-veth",
        "unroutable",
    ],
)
def test_only_this_machine_is_a_valid_target(
    host: str, routes: dict[str, str], kinds: dict[str, str], allowed: bool
) -> None:
    check = policy(routes, kinds)
    if allowed:
        check.check(host)
    else:
        with pytest.raises(UnsafeTargetError, match="refusing to send"):
            check.check(host)


def test_a_pool_refuses_an_unsafe_target_before_anything_is_sent() -> None:
    with pytest.raises(UnsafeTargetError):
        TargetPool(["http://127.0.0.1:8000", "http://93.184.216.34:80"], TargetPolicy())


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000"),
        ("127.0.0.1:9", "http://127.0.0.1:9"),
        ("http://[::1]:8000", "http://[::1]:8000"),
        ("http://localhost", "http://localhost:80"),
    ],
    ids=["path-dropped", "scheme-added", "ipv6", "default-port"],
)
def test_targets_are_normalised_to_base_urls(text: str, expected: str) -> None:
    assert parse_target(text) == expected


def test_https_targets_are_rejected() -> None:
    with pytest.raises(ValueError, match="http://HOST:PORT"):
        parse_target("https://127.0.0.1:8443")


ENDPOINT_SLICES = [
    {
        "ports": [{"name": "rendezvous", "port": 29501}, {"name": "http", "port": 8000}],
        "endpoints": [
            {"addresses": ["10.200.0.5"], "conditions": {"ready": True}},
            {"addresses": ["10.200.0.6"], "conditions": {"ready": False}},
            {"addresses": ["10.200.1.5"], "conditions": {}},
        ],
    },
    {
        "ports": [{"port": 9000}],
        "endpoints": [{"addresses": ["10.200.2.5", "10.200.2.6"], "conditions": {"ready": True}}],
    },
]


@pytest.mark.parametrize(
    ("port_name", "expected"),
    [
        (None, ["http://10.200.0.5:8000", "http://10.200.2.5:9000"]),
        ("rendezvous", ["http://10.200.0.5:29501"]),
    ],
    ids=["http-port-else-first", "named-port"],
)
def test_only_ready_endpoints_are_targets(port_name: str | None, expected: list[str]) -> None:
    assert ready_endpoints(ENDPOINT_SLICES, port_name) == expected


# ------------------------------------------------------------------------------------ the plan
def workload(
    arrivals: list[float],
    inputs: list[int],
    outputs: list[int],
    blocks: tuple[tuple[int, ...], ...] | None = None,
) -> Workload:
    return Workload(
        "test", np.array(arrivals, dtype=float), np.array(inputs), np.array(outputs), prefix_blocks=blocks
    )


@pytest.mark.parametrize(
    ("max_requests", "duration", "cap", "expected_count", "expected_outputs"),
    [
        (10, 100.0, None, 5, [10, 20, 30, 40, 50]),
        (3, 100.0, None, 3, [10, 20, 30]),
        (10, 2.5, None, 3, [10, 20, 30]),
        (10, 100.0, 25, 5, [10, 20, 25, 25, 25]),
    ],
    ids=["everything", "count-bound", "duration-bound", "output-cap"],
)
def test_the_plan_keeps_the_bounds(
    max_requests: int, duration: float, cap: int | None, expected_count: int, expected_outputs: list[int]
) -> None:
    trace = workload([0.0, 1.0, 2.0, 3.0, 4.0], [5] * 5, [10, 20, 30, 40, 50])
    plan = plan_requests(trace, max_requests=max_requests, duration_seconds=duration, max_output_tokens=cap)
    assert len(plan) == expected_count
    assert [request.output_tokens for request in plan] == expected_outputs
    assert [request.send_at_seconds for request in plan] == [0.0, 1.0, 2.0, 3.0, 4.0][:expected_count]


@given(st.integers(1, 3000), st.lists(st.integers(0, 50), max_size=8), st.integers(0, 10_000))
def test_a_prompt_has_exactly_its_token_count_in_the_emulators_tokenizer(
    tokens: int, blocks: list[int], index: int
) -> None:
    request = PlannedRequest(index, 0.0, tokens, 1, tuple(blocks) or None)
    assert count_prompt_tokens(render_prompt(request, "run"))[0] == tokens


def test_prompts_share_exactly_the_traces_shared_prefix_blocks() -> None:
    first = render_prompt(PlannedRequest(0, 0.0, 1500, 1, (7, 8, 9)), "run").split()
    second = render_prompt(PlannedRequest(1, 0.0, 1500, 1, (7, 8, 10)), "run").split()
    plain_a = render_prompt(PlannedRequest(2, 0.0, 1500, 1, None), "run").split()
    plain_b = render_prompt(PlannedRequest(3, 0.0, 1500, 1, None), "run").split()
    shared = next(i for i, (a, b) in enumerate(zip(first, second, strict=True)) if a != b)
    assert shared == 1024, "two 512-token blocks in common"
    assert plain_a[0] != plain_b[0], "requests without prefix information share nothing"


# ------------------------------------------------------------------------------------ the report
def test_the_report_folds_results_into_counts_rates_and_percentiles() -> None:
    results = [
        RequestResult(
            0, "a", scheduled_at=0.0, sent_at=0.001, ttft_seconds=0.1, e2e_seconds=1.0, completion_tokens=10
        ),
        RequestResult(
            1, "b", scheduled_at=1.0, sent_at=1.003, ttft_seconds=0.3, e2e_seconds=2.0, completion_tokens=11
        ),
        RequestResult(
            2, "a", scheduled_at=2.0, sent_at=2.002, outcome="cut", ttft_seconds=0.2, e2e_seconds=0.5
        ),
    ]
    report = build_report(
        results,
        [0.05, 0.15],
        planned=5,
        not_sent=Counter({"concurrency_limit": 2}),
        wall_seconds=4.0,
        cpu_seconds=0.5,
    )
    assert (report.planned, report.sent, report.not_sent_concurrency_limit) == (5, 3, 2)
    assert report.outcomes == {
        "ok": 2,
        "rejected": 0,
        "aborted": 0,
        "cut": 1,
        "error": 0,
        "http_error": 0,
        "connect_error": 0,
        "timeout": 0,
    }
    assert report.send_span_seconds == pytest.approx(2.001)
    assert report.achieved_send_rate_per_second == pytest.approx(2 / 2.001)
    assert report.ttft_seconds.count == 3 and report.ttft_seconds.max == pytest.approx(0.3)
    assert report.e2e_seconds.count == 2, "only completed requests have an end-to-end latency"
    assert report.tpot_seconds.mean == pytest.approx(((0.9 / 9) + (1.7 / 10)) / 2)
    assert report.send_lag_seconds.max == pytest.approx(0.003)
    assert report.by_target == {"a": 2, "b": 1}
    assert report.as_dict()["itl_seconds"]["p50"] == pytest.approx(0.1)


# ------------------------------------------------------------------------------------ against an emulator
@contextlib.asynccontextmanager
async def emulated(max_model_len: int = 131072) -> AsyncIterator[tuple[VllmServer, str]]:
    config = EngineConfig.for_hardware(LLAMA_3_1_8B, H100_80G)
    server = VllmServer(
        ServingProfile(config, "llama", max_model_len=max_model_len), ServerIdentity("m", "llama")
    )
    await server.listen(bind_listener("127.0.0.1", 0))
    assert server.address is not None
    try:
        yield server, f"http://127.0.0.1:{server.address[1]}"
    finally:
        await server.close()


def same_time(count: int, prompt: int, output: int) -> list[PlannedRequest]:
    return [PlannedRequest(i, 0.0, prompt, output) for i in range(count)]


async def generate(url: str, plan: list[PlannedRequest], **settings: Any) -> LoadReport:
    return await LoadGenerator(TargetPool([url], TargetPolicy()), LoadSettings(**settings)).run(plan)


def test_a_replay_completes_every_request_and_agrees_with_the_servers_counts() -> None:
    plan = [PlannedRequest(i, i / 40, 50 + i, 5 + i % 7) for i in range(40)]

    async def main() -> tuple[LoadReport, Any]:
        async with emulated() as (server, url):
            report = await generate(url, plan, model="llama")
            return report, server.engine.snapshot()

    report, snapshot = asyncio.run(main())
    assert report.outcomes["ok"] == report.sent == 40
    assert report.completion_tokens == sum(r.output_tokens for r in plan) == snapshot.generation_tokens
    assert snapshot.prompt_tokens == sum(r.prompt_tokens for r in plan)
    server_ttft = snapshot.histograms["vllm:time_to_first_token_seconds"]
    assert server_ttft.total == 40
    assert report.ttft_seconds.mean >= server_ttft.sum / server_ttft.total, (
        "a client cannot see a token earlier"
    )
    assert report.send_lag_seconds.count == 40 and report.send_lag_seconds.p50 >= 0


@pytest.mark.parametrize(
    ("plan", "settings", "expected_sent", "not_sent"),
    [
        (
            same_time(5, 10, 2000),
            {"concurrency_limit": 2, "request_timeout_seconds": 0.5},
            2,
            {"concurrency_limit": 3},
        ),
        (
            [PlannedRequest(0, 0.0, 10, 2), PlannedRequest(1, 0.2, 10, 2), PlannedRequest(2, 60.0, 10, 2)],
            {"duration_seconds": 1.0},
            2,
            {"deadline": 1},
        ),
    ],
    ids=["concurrency-limit-counts-instead-of-delaying", "duration-stops-sending"],
)
def test_the_run_keeps_its_bounds(
    plan: list[PlannedRequest], settings: dict[str, Any], expected_sent: int, not_sent: dict[str, int]
) -> None:
    async def main() -> LoadReport:
        async with emulated() as (_, url):
            return await generate(url, plan, **settings)

    report = asyncio.run(main())
    assert report.sent == expected_sent
    got = {"concurrency_limit": report.not_sent_concurrency_limit, "deadline": report.not_sent_deadline}
    assert {key: got[key] for key in not_sent} == not_sent
    assert report.wall_seconds < 30, "a bounded run ends by itself"


@pytest.mark.parametrize(
    ("fault", "outcome"),
    [
        ("hang", "timeout"),
        ("terminate", "aborted"),
        ("close", "cut"),
        ("kill", "error"),
        ("wrong-model", "http_error"),
        ("nothing-listens", "connect_error"),
    ],
    ids=[
        "hung-server-times-out",
        "shutdown-aborts",
        "dropped-connection-cuts",
        "engine-death-errors",
        "http-status",
        "refused-connection",
    ],
)
def test_each_failure_is_classified(fault: str, outcome: str) -> None:
    async def main() -> LoadReport:
        async with emulated() as (server, url):
            if fault == "hang":
                server.hang()
            if fault == "nothing-listens":
                await server.close()
            model = "other" if fault == "wrong-model" else "llama"
            run = asyncio.create_task(
                generate(url, same_time(1, 10, 3000), model=model, request_timeout_seconds=3.0)
            )
            if fault in ("terminate", "close", "kill"):
                await until(lambda: server.engine.in_flight > 0, "the request is in flight")
            if fault == "terminate":
                await server.terminate(0.0)
            elif fault == "close":
                await server.close()
            elif fault == "kill":
                await server.kill_engine(linger_seconds=0.1)
            return await run

    report = asyncio.run(main())
    assert report.sent == 1
    assert report.outcomes[outcome] == 1, report.outcomes
    assert math.isnan(report.e2e_seconds.mean), "a failed request has no completion latency"


@contextlib.asynccontextmanager
async def admitting_only(tenant: str) -> AsyncIterator[tuple[list[str | None], str]]:
    """A gateway's answers, no more: `tenant` is streamed a completion by group g1, anyone else gets
    429 with Retry-After. Yields the tenant header of each request seen, and the base URL."""
    from aiohttp import web

    seen: list[str | None] = []

    async def complete(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get(TENANT_HEADER))
        if request.headers.get(TENANT_HEADER) != tenant:
            return web.Response(status=429, headers={"Retry-After": "3"}, text="over budget")
        response = web.StreamResponse(headers={GROUP_HEADER: "g1", "Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices": [{"text": "a", "finish_reason": "length"}]}\n\n')
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/v1/completions", complete)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield seen, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def test_tenants_are_named_to_a_gateway_its_refusals_are_rejections_and_the_serving_group_is_kept() -> None:
    plan = [
        PlannedRequest(0, 0.0, 10, 1, tenant="light"),
        PlannedRequest(1, 0.0, 10, 1, tenant="noisy"),
        PlannedRequest(2, 0.0, 10, 1),
    ]

    async def main() -> tuple[LoadReport, list[RequestResult], list[str | None]]:
        async with admitting_only("light") as (seen, url):
            generator = LoadGenerator(TargetPool([url], TargetPolicy()), LoadSettings())
            report = await generator.run(plan)
            return report, sorted(generator.results, key=lambda r: r.index), seen

    report, results, seen = asyncio.run(main())
    assert sorted(seen, key=str) == sorted(["light", "noisy", None], key=str)
    assert [(r.outcome, r.status, r.group) for r in results] == [
        ("ok", 200, "g1"),
        ("rejected", 429, None),
        ("rejected", 429, None),
    ]
    assert report.outcomes["rejected"] == 2 and report.outcomes["http_error"] == 0
