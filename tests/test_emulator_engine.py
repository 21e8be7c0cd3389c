"""The real-time engine adapter and its `/metrics` exposition, run on a virtual clock.

The event loop here jumps its clock to the next timer instead of sleeping, so every run is exact and
instant: an emulated request's timeline can be compared with the discrete-event engine's to the
nanosecond, and nothing depends on how busy the machine is.
"""

from __future__ import annotations

import asyncio
import math
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from virtual_time import run_virtual

from goodput.estimators.service_time import H100_80G, LLAMA_3_1_8B
from goodput.simulator.engine import EngineConfig, SimulatedEngine
from goodput.simulator.records import RequestExit, RequestLog
from goodput.simulator.vllm_metrics import SnapshotCollector, engine_registry
from goodput.simulator.workload import Workload
from goodput.testbed.emulator_engine import (
    SAME_INSTANT_SECONDS,
    AdmissionRejectedError,
    InvalidRequestError,
    LiveRequest,
    RealtimeEngine,
    ServingProfile,
)

CONTRACT = yaml.safe_load((Path(__file__).parent / "fixtures" / "vllm_metrics_contract.yaml").read_text())


def profile(
    *,
    kv_capacity_tokens: int | None = None,
    max_num_seqs: int | None = None,
    max_model_len: int = 131072,
    max_queued: int | None = None,
    stream_interval_seconds: float = 0.02,
) -> ServingProfile:
    config = EngineConfig.for_hardware(
        LLAMA_3_1_8B, H100_80G, kv_capacity_tokens=kv_capacity_tokens, max_num_seqs=max_num_seqs
    )
    return ServingProfile(
        config,
        "llama",
        max_model_len=max_model_len,
        max_num_queued_requests=max_queued,
        stream_interval_seconds=stream_interval_seconds,
    )


async def wait_finished(request: LiveRequest) -> list[tuple[float, int]]:
    """Follow a request to its end; return (loop time, tokens ready) at each change."""
    loop = asyncio.get_running_loop()
    seen: list[tuple[float, int]] = []
    while not request.finished:
        await request.changed.wait()
        request.changed.clear()
        seen.append((loop.time(), request.tokens_ready))
    return seen


@dataclass(frozen=True)
class Arrival:
    at: float
    prompt: int
    output: int


def offline_finish_times(config: EngineConfig, arrivals: list[Arrival]) -> list[float]:
    """The discrete-event engine's finish time of each request, driven by its own event loop; a step
    ending at the same instant as an arrival (within the adapter's clock resolution) ends first."""
    workload = Workload(
        "offline",
        np.array([a.at for a in arrivals]),
        np.array([a.prompt for a in arrivals]),
        np.array([a.output for a in arrivals]),
    )
    log = RequestLog(workload)
    engine = SimulatedEngine(config, log, random.Random(0), prefix_block_tokens=256)
    for index, arrival in enumerate(arrivals):
        while engine.step_end is not None and engine.step_end <= arrival.at + SAME_INSTANT_SECONDS:
            engine.complete_step(engine.step_end)
        log.routed_at[index] = arrival.at
        engine.enqueue(index, arrival.prompt, arrival.output, None, arrival.at)
    while engine.step_end is not None:
        engine.complete_step(engine.step_end)
    assert all(outcome == RequestExit.FINISHED for outcome in log.outcome)
    return list(log.finished_at)


def replay(serving: ServingProfile, arrivals: list[Arrival], *, streaming: bool = True) -> dict[str, Any]:
    """Submit each arrival at its time on a virtual clock; return the requests, engine and timelines."""

    async def main() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        engine = RealtimeEngine(serving)
        origin = loop.time()
        requests: list[LiveRequest] = []
        followers: list[asyncio.Task[list[tuple[float, int]]]] = []
        for arrival in arrivals:
            await asyncio.sleep(max(0.0, origin + arrival.at - loop.time()))
            request = engine.submit(arrival.prompt, arrival.output, streaming=streaming)
            requests.append(request)
            followers.append(asyncio.create_task(wait_finished(request)))
        timelines = await asyncio.gather(*followers)
        return {"engine": engine, "origin": origin, "requests": requests, "timelines": timelines}

    return run_virtual(main)


# ------------------------------------------------------------------------------------ the timeline
def test_one_request_follows_the_cost_model_step_by_step() -> None:
    serving = profile()
    cost = serving.engine.cost
    result = replay(serving, [Arrival(0.0, 1000, 20)])
    request: LiveRequest = result["requests"][0]
    prefill = cost.step_seconds(1000, 1000 * 500.0, 0, 1)
    assert request.first_token_wall is not None
    assert request.first_token_wall - request.arrival_wall == pytest.approx(prefill, rel=1e-9)
    decode = sum(cost.step_seconds(1, 0.0, 1001 + step, 1) for step in range(19))
    assert request.finished_wall - request.arrival_wall == pytest.approx(prefill + decode, rel=1e-9)
    assert request.finish_reason == "length"
    assert request.tokens_ready == 20


def test_streaming_tokens_arrive_in_batches_one_interval_apart() -> None:
    serving = profile(stream_interval_seconds=0.02)
    result = replay(serving, [Arrival(0.0, 100, 200)])
    timeline = result["timelines"][0]
    tokens = [count for _, count in timeline]
    assert tokens == sorted(tokens), "token counts never go back"
    assert tokens[0] == 1 and tokens[-1] == 200
    gaps = np.diff([at for at, _ in timeline[:-1]])
    assert gaps.max() <= 0.02 + 1e-9, "a streaming client hears from the engine at least every interval"
    assert len(timeline) < 200 / 2, "tokens are batched, not delivered one wake-up each"


def test_non_streaming_requests_cost_one_wake_up_at_the_end() -> None:
    result = replay(profile(), [Arrival(0.0, 100, 200)], streaming=False)
    timeline = result["timelines"][0]
    assert [count for _, count in timeline] == [1, 200], "first token, then the finish"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.floats(min_value=0.0, max_value=0.5),
            st.integers(min_value=1, max_value=3000),
            st.integers(min_value=1, max_value=300),
        ),
        min_size=1,
        max_size=30,
    )
)
@example(  # arrives 0.7 us before a step ends, when the engine goes idle: queued after that step
    [
        (0.01994872101131329, 2929, 34),
        (0.0625, 1171, 33),
        (0.125, 514, 32),
        (0.15625, 862, 31),
        (0.3125, 2696, 14),
        (0.4978164538593771, 1, 1),
    ]
)
@example(  # arrives 0.4 us before a busy engine's step ends: joins the very next step
    [(0.01994872101131329, 2929, 3), (0.0625, 1, 1), (0.0625, 113, 1), (0.0625, 840, 1), (0.125, 1, 1)]
)
@example(  # arrives 0.1 ns before a step ends, within the loop's clock resolution: the step ends first
    [
        (0.01994872101131329, 2929, 34),
        (0.0625, 106, 33),
        (0.0625, 844, 33),
        (0.0625, 1154, 33),
        (0.125, 123, 26),
        (0.125, 543, 32),
        (0.15625, 843, 31),
        (0.25, 1, 4),
        (0.25, 157, 18),
        (0.3125, 2688, 15),
        (0.375, 163, 13),
        (0.4375, 417, 6),
        (0.4978164538593771, 1, 1),
    ]
)
def test_the_adapter_times_every_request_as_the_discrete_event_engine_does(
    raw: list[tuple[float, int, int]],
) -> None:
    arrivals = sorted((Arrival(at, prompt, output) for at, prompt, output in raw), key=lambda a: a.at)
    serving = profile()
    expected = offline_finish_times(serving.engine, arrivals)
    result = replay(serving, arrivals)
    origin = result["origin"]
    for arrival, request, finish in zip(arrivals, result["requests"], expected, strict=True):
        assert request.finish_reason == "length"
        assert request.tokens_ready == arrival.output
        assert request.finished_wall - origin == pytest.approx(finish, rel=1e-9, abs=1e-9)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.floats(min_value=0.0, max_value=0.3), st.integers(1, 2000), st.integers(1, 400)),
        min_size=2,
        max_size=25,
    ),
    st.integers(min_value=2500, max_value=6000),
)
def test_under_kv_pressure_every_request_still_streams_all_its_tokens_in_order(
    raw: list[tuple[float, int, int]], kv_tokens: int
) -> None:
    arrivals = sorted((Arrival(at, prompt, output) for at, prompt, output in raw), key=lambda a: a.at)
    result = replay(profile(kv_capacity_tokens=kv_tokens, max_model_len=2400), arrivals)
    engine: RealtimeEngine = result["engine"]
    for arrival, request, timeline in zip(arrivals, result["requests"], result["timelines"], strict=True):
        counts = [count for _, count in timeline]
        assert counts == sorted(counts)
        assert counts[-1] == arrival.output
        assert request.finish_reason == "length"
    snapshot = engine.snapshot()
    assert snapshot.request_success == {"length": len(arrivals)}
    assert snapshot.generation_tokens == sum(a.output for a in arrivals)
    assert snapshot.prompt_tokens == sum(a.prompt for a in arrivals)
    assert snapshot.num_requests_running == snapshot.num_requests_waiting == 0
    assert snapshot.histograms["vllm:request_num_preemptions"].sum == snapshot.num_preemptions


def test_finished_requests_give_back_their_slots() -> None:
    arrivals = [Arrival(0.1 * wave, 50, 5) for wave in range(40)]
    result = replay(profile(), arrivals)
    engine: RealtimeEngine = result["engine"]
    slots = {request.slot for request in result["requests"]}
    assert slots == {0}, "each request ends before the next arrives, so one slot serves them all"
    assert engine.in_flight == 0


# ------------------------------------------------------------------------------------ admission, faults
@pytest.mark.parametrize(
    ("prompt", "output", "message"),
    [
        (2000, 100, "maximum context length is 2048"),
        (0, 10, "at least one token"),
        (10, 0, "at least one token"),
    ],
    ids=["longer-than-the-context", "empty-prompt", "no-output"],
)
def test_requests_that_can_never_be_served_are_refused(prompt: int, output: int, message: str) -> None:
    async def main() -> None:
        engine = RealtimeEngine(profile(max_model_len=2048))
        with pytest.raises(InvalidRequestError, match=message):
            engine.submit(prompt, output)
        assert engine.in_flight == 0

    run_virtual(main)


def test_the_queue_limit_refuses_with_503_and_counts_the_rejection() -> None:
    async def main() -> None:
        engine = RealtimeEngine(profile(max_queued=3))
        accepted = [engine.submit(100, 50) for _ in range(3)]
        with pytest.raises(AdmissionRejectedError) as refused:
            engine.submit(100, 50)
        assert refused.value.reason == "max_num_queued_reqs"
        assert engine.snapshot().admission_rejections == {"max_num_queued_reqs": 1}
        await asyncio.gather(*(wait_finished(request) for request in accepted))
        engine.submit(100, 50)  # room again

    run_virtual(main)


def test_a_hang_stops_tokens_and_the_model_resumes_where_it_froze() -> None:
    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        engine = RealtimeEngine(profile())
        origin = loop.time()
        request = engine.submit(100, 100, streaming=True)
        await asyncio.sleep(0.2)
        before = request.tokens_ready
        engine.hang()
        hung_at = loop.time()
        held = engine.submit(100, 10)
        await asyncio.sleep(30.0)
        assert request.tokens_ready == before, "no token while hung"
        assert not held.finished and held.first_token_wall is None
        engine.resume()
        hung_for = loop.time() - hung_at
        await wait_finished(request)
        await wait_finished(held)
        assert request.finished_wall - request.arrival_wall > 30.0, "clients see the stall"
        assert engine.snapshot().histograms["vllm:e2e_request_latency_seconds"].sum > 60.0
        return request.finished_wall - hung_for - origin, held.finished_wall - hung_for - origin

    # The model lost no work and did none twice: minus the stall, both requests finish exactly when
    # they would have without it (the held request arriving when the hang began).
    first, second = run_virtual(main)
    untouched = replay(profile(), [Arrival(0.0, 100, 100), Arrival(0.2, 100, 10)])
    expected = [request.finished_wall - untouched["origin"] for request in untouched["requests"]]
    assert [first, second] == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("reason", ["abort", "error"], ids=["shutdown-abort", "engine-death"])
def test_abort_all_ends_every_request_with_the_reason_and_counts_it(reason: str) -> None:
    async def main() -> None:
        engine = RealtimeEngine(profile(max_num_seqs=2))
        requests = [engine.submit(500, 1000, streaming=True) for _ in range(5)]
        await asyncio.sleep(0.1)
        engine.hang()
        held = engine.submit(10, 10)
        assert engine.abort_all(reason) == 6
        assert all(r.finish_reason == reason for r in [*requests, held])
        snapshot = engine.snapshot()
        assert snapshot.request_success == {reason: 6}
        assert snapshot.num_requests_running == snapshot.num_requests_waiting == 0
        assert engine.in_flight == 0

    run_virtual(main)


def test_a_detached_request_appears_in_no_metric() -> None:
    async def main() -> None:
        engine = RealtimeEngine(profile())
        gone = engine.submit(100, 50, streaming=True)
        kept = engine.submit(100, 50, streaming=True)
        engine.detach(gone)
        await wait_finished(kept)
        await wait_finished(gone)
        snapshot = engine.snapshot()
        assert snapshot.request_success == {"length": 1}
        assert snapshot.histograms["vllm:time_to_first_token_seconds"].total == 1

    run_virtual(main)


# ------------------------------------------------------------------------------------ exposition
def _exposition(requests: list[Arrival]) -> tuple[str, RealtimeEngine]:
    async def main() -> tuple[str, RealtimeEngine]:
        engine = RealtimeEngine(profile())
        live = []
        for arrival in requests:
            live.append(engine.submit(arrival.prompt, arrival.output, streaming=True))
        await asyncio.gather(*(wait_finished(request) for request in live))
        registry = engine_registry(SnapshotCollector(engine.snapshot, engine.specs))
        return generate_latest(registry).decode(), engine

    return run_virtual(main)


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def _parse(text: str) -> tuple[dict[str, str], list[tuple[str, dict[str, str], float]]]:
    types: dict[str, str] = {}
    samples: list[tuple[str, dict[str, str], float]] = []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            types[name] = kind
        elif line and not line.startswith("#"):
            match = _SAMPLE.match(line)
            assert match, f"not an exposition line: {line!r}"
            samples.append((match[1], dict(_LABEL.findall(match[2] or "")), float(match[3])))
    return types, samples


def _family_samples(samples: list[tuple[str, dict[str, str], float]], name: str, kind: str) -> list[Any]:
    names = {name} if kind != "histogram" else {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return [sample for sample in samples if sample[0] in names]


@dataclass(frozen=True)
class Exposition:
    text: str
    engine: RealtimeEngine
    types: dict[str, str]
    samples: list[tuple[str, dict[str, str], float]]


@pytest.fixture(scope="module")
def exposition() -> Exposition:
    """The /metrics text after two requests: 1000 prompt + 30 output tokens, 3000 + 5."""
    text, engine = _exposition([Arrival(0.0, 1000, 30), Arrival(0.01, 3000, 5)])
    types, samples = _parse(text)
    return Exposition(text, engine, types, samples)


@pytest.mark.parametrize("metric", CONTRACT["metrics"], ids=[m["name"] for m in CONTRACT["metrics"]])
def test_every_contract_metric_has_its_name_type_labels_and_buckets(
    metric: dict[str, Any], exposition: Exposition
) -> None:
    TYPES, SAMPLES = exposition.types, exposition.samples  # noqa: N806
    name, kind = metric["name"], metric["type"]
    assert TYPES.get(name) == kind, f"# TYPE {name} {kind} is missing"
    samples = _family_samples(SAMPLES, name, kind)
    assert samples, f"{name} has no samples"
    for _, labels, _ in samples:
        names = set(labels) - {"le"}
        if "labels" in metric:
            assert names == set(metric["labels"])
        else:
            assert set(metric["labels_include"]) <= names
            assert not set(metric["labels_exclude"]) & names
    for label, values in (metric.get("values") or {}).items():
        assert {labels[label] for _, labels, _ in samples} == set(values)
    if "buckets" in metric:
        expected = [float(bound) for bound in CONTRACT["bucket_families"][metric["buckets"]]] + [math.inf]
        bounds = [float(labels["le"]) for sample, labels, _ in samples if sample.endswith("_bucket")]
        assert bounds == expected
        counts = [value for sample, _, value in samples if sample.endswith("_bucket")]
        assert counts == sorted(counts), "buckets are cumulative"
        (count,) = [value for sample, _, value in samples if sample.endswith("_count")]
        assert counts[-1] == count
    if "value" in metric:
        assert [value for _, _, value in samples] == [metric["value"]]


@pytest.mark.parametrize("name", CONTRACT["removed"])
def test_names_removed_before_0_33_are_not_exported(name: str, exposition: Exposition) -> None:
    assert name not in exposition.types
    assert not any(sample == name or sample.startswith(f"{name}_") for sample, _, _ in exposition.samples)


def test_counters_carry_total_and_created_as_prometheus_client_writes_them(exposition: Exposition) -> None:
    counters = [name for name, kind in exposition.types.items() if kind == "counter"]
    assert sorted(counters) == sorted(m["name"] for m in CONTRACT["metrics"] if m["type"] == "counter")
    for name in counters:
        assert name.endswith("_total")
        assert exposition.types.get(name.removesuffix("_total") + "_created") == "gauge"


def test_the_exposition_parses_with_prometheus_client_and_values_match_the_run(
    exposition: Exposition,
) -> None:
    families = {family.name: family for family in text_string_to_metric_families(exposition.text)}
    engine_labels = {"model_name": "llama", "engine": "0"}

    def value(family: str, sample: str, **labels: str) -> float:
        wanted = {**engine_labels, **labels}
        return next(s.value for s in families[family].samples if s.name == sample and s.labels == wanted)

    assert value("vllm:request_success", "vllm:request_success_total", finished_reason="length") == 2
    assert value("vllm:generation_tokens", "vllm:generation_tokens_total") == 35
    assert value("vllm:prompt_tokens", "vllm:prompt_tokens_total") == 4000
    ttft = families["vllm:time_to_first_token_seconds"]
    assert next(s.value for s in ttft.samples if s.name.endswith("_count")) == 2
    info = next(s for s in families["vllm:cache_config_info"].samples)
    capacity = exposition.engine.profile.engine.kv_capacity_tokens
    assert info.labels["kv_cache_size_tokens"] == str(capacity)
    assert int(info.labels["num_gpu_blocks"]) * int(info.labels["block_size"]) <= capacity
