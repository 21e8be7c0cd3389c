"""Batched Prometheus reads: one fleet answer cut per ModelGroup, and the batching of the ticks' reads.

The fleet answer is built by hand in the shape `promql.fleet_snapshot_query` returns (each series
keeps its namespace and ModelGroup labels); the batching runs against a reader the test controls,
which counts the queries it was asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from waiting import until

from goodput.operator.metrics_batch import BatchedMetricsSource, next_tick_delay_seconds
from goodput.operator.metrics_source import (
    MetricsReading,
    MetricsUnavailableError,
    ModelGroupKey,
    reading_from_result,
    readings_by_model_group,
    split_by_model_group,
)
from goodput.operator.promql import SeriesLabels, Windows, fleet_snapshot_query, snapshot_query

LABELS = SeriesLabels()
WINDOWS = Windows(8, 30)
ENGINE_GAUGES = {"waiting": "3", "running": "2", "kv_usage": "0.25", "sample_age": "1.5"}


def series(
    namespace: str | None, model_group: str | None, query: str, value: str, **labels: str
) -> dict[str, Any]:
    metric = {"goodput_query": query, **labels}
    if namespace is not None:
        metric["namespace"] = namespace
    if model_group is not None:
        metric["model_group"] = model_group
    return {"metric": metric, "value": [1796223986.4, value]}


def engine(namespace: str, model_group: str, group: str, **values: str) -> list[dict[str, Any]]:
    """One group's engine gauges, as the fleet query answers them."""
    return [
        series(namespace, model_group, query, value, group=group)
        for query, value in {**ENGINE_GAUGES, **values}.items()
    ]


def gateway(namespace: str, model_group: str) -> list[dict[str, Any]]:
    return [
        series(namespace, model_group, "gateway_sample_age", "0.5"),
        series(namespace, model_group, "gateway_running_requests", "4"),
        series(namespace, model_group, "gateway_queued_requests", "7", slo_class="chat"),
    ]


# --- cutting one fleet answer -------------------------------------------------------------------


@dataclass(frozen=True)
class CutCase:
    answer: list[dict[str, Any]]
    asked: list[ModelGroupKey]
    waiting: dict[ModelGroupKey, dict[str, float]]
    """Per asked ModelGroup, its groups' waiting requests ({}: a reading without engine metrics)."""
    with_gateway: frozenset[ModelGroupKey] = frozenset()


CUT_CASES = {
    "each ModelGroup gets its own groups": CutCase(
        answer=[
            *engine("ml", "llama", "g0", waiting="1"),
            *engine("ml", "llama", "g1", waiting="2"),
            *engine("ml", "mistral", "g0", waiting="5"),
        ],
        asked=[("ml", "llama"), ("ml", "mistral")],
        waiting={("ml", "llama"): {"g0": 1.0, "g1": 2.0}, ("ml", "mistral"): {"g0": 5.0}},
    ),
    "the same name in two namespaces stays apart": CutCase(
        answer=engine("team-a", "llama", "g0", waiting="1") + engine("team-b", "llama", "g0", waiting="9"),
        asked=[("team-a", "llama"), ("team-b", "llama")],
        waiting={("team-a", "llama"): {"g0": 1.0}, ("team-b", "llama"): {"g0": 9.0}},
    ),
    "one ModelGroup's series are absent: only it reads empty": CutCase(
        answer=engine("ml", "llama", "g0", waiting="4"),
        asked=[("ml", "llama"), ("ml", "scraped-never")],
        waiting={("ml", "llama"): {"g0": 4.0}, ("ml", "scraped-never"): {}},
    ),
    "one ModelGroup lacks a required gauge: only its group has no metrics": CutCase(
        answer=engine("ml", "llama", "g0")
        + [s for s in engine("ml", "mistral", "g0") if s["metric"]["goodput_query"] != "kv_usage"],
        asked=[("ml", "llama"), ("ml", "mistral")],
        waiting={("ml", "llama"): {"g0": 3.0}, ("ml", "mistral"): {}},
    ),
    "ModelGroups not asked for are left out": CutCase(
        answer=engine("ml", "llama", "g0") + engine("other", "not-mine", "g0"),
        asked=[("ml", "llama")],
        waiting={("ml", "llama"): {"g0": 3.0}},
    ),
    "series without namespace or ModelGroup belong to nobody": CutCase(
        answer=[
            *engine("ml", "llama", "g0"),
            series(None, "llama", "waiting", "50", group="g9"),
            series("ml", None, "waiting", "50", group="g9"),
        ],
        asked=[("ml", "llama")],
        waiting={("ml", "llama"): {"g0": 3.0}},
    ),
    "a gateway's series go to the ModelGroup it fronts": CutCase(
        answer=engine("ml", "llama", "g0") + gateway("ml", "llama") + engine("ml", "mistral", "g0"),
        asked=[("ml", "llama"), ("ml", "mistral")],
        waiting={("ml", "llama"): {"g0": 3.0}, ("ml", "mistral"): {"g0": 3.0}},
        with_gateway=frozenset({("ml", "llama")}),
    ),
    "an empty answer: every ModelGroup reads empty, none fails": CutCase(
        answer=[],
        asked=[("ml", "llama"), ("ml", "mistral")],
        waiting={("ml", "llama"): {}, ("ml", "mistral"): {}},
    ),
}


@pytest.mark.parametrize("case", CUT_CASES.values(), ids=CUT_CASES.keys())
def test_a_fleet_answer_is_cut_per_model_group(case: CutCase) -> None:
    readings = readings_by_model_group(case.asked, case.answer, LABELS)
    assert set(readings) == set(case.asked)
    for key, reading in readings.items():
        assert {name: metrics.waiting_requests for name, metrics in reading.groups.items()} == case.waiting[
            key
        ]
        assert (reading.gateway is not None) == (key in case.with_gateway)


def test_a_model_groups_part_of_the_fleet_answer_reads_as_its_own_query_would() -> None:
    """The per-ModelGroup answer has no namespace or ModelGroup labels; the cut part has them: the
    readings must not differ for it."""
    mine = engine("ml", "llama", "g0", waiting="2") + gateway("ml", "llama")
    alone = [
        {**s, "metric": {k: v for k, v in s["metric"].items() if k not in {"namespace", "model_group"}}}
        for s in mine
    ]
    fleet = readings_by_model_group([("ml", "llama")], mine + engine("ml", "other", "g0"), LABELS)
    assert fleet[("ml", "llama")] == readings_by_model_group([("ml", "llama")], mine, LABELS)[("ml", "llama")]
    assert split_by_model_group(mine, LABELS) == {("ml", "llama"): mine}
    assert fleet[("ml", "llama")] == reading_from_result(alone, LABELS)


def test_the_fleet_query_keeps_namespace_and_model_group_in_every_aggregation() -> None:
    query = fleet_snapshot_query(LABELS, WINDOWS)
    single = snapshot_query(LABELS, "ml", "llama", WINDOWS)
    assert query.count("\n  or ") == single.count("\n  or ") > 30
    clauses = [part.split(")", 1)[0] for part in query.split("by (")[1:]]
    assert clauses and all(clause.startswith("namespace, model_group") for clause in clauses)
    assert 'namespace="' not in query and 'model_group="' not in query
    assert query.count("label_replace(") == single.count("label_replace(")


def test_the_fleet_query_follows_relabelled_label_names() -> None:
    labels = SeriesLabels(namespace="kubernetes_namespace", model_group="mg", group="replica")
    query = fleet_snapshot_query(labels, WINDOWS)
    assert "by (kubernetes_namespace, mg, replica)" in query
    answer = [
        {
            "metric": {"goodput_query": q, "kubernetes_namespace": "ml", "mg": "llama", "replica": "r0"},
            "value": [0, v],
        }
        for q, v in ENGINE_GAUGES.items()
    ]
    assert set(readings_by_model_group([("ml", "llama")], answer, labels)[("ml", "llama")].groups) == {"r0"}


# --- batching the ticks' reads --------------------------------------------------------------------


@dataclass
class Reader:
    """A Prometheus stand-in: a fleet answer per windows, failures to order, and every query asked."""

    answer: list[dict[str, Any]] = field(default_factory=list)
    fleet_failure: MetricsUnavailableError | None = None
    alone_failures: dict[ModelGroupKey, MetricsUnavailableError] = field(default_factory=dict)
    queries: list[tuple[str, Any]] = field(default_factory=list)

    def read(self, namespace: str, model_group: str, windows: Windows) -> MetricsReading:
        self.queries.append(("model_group", (namespace, model_group)))
        failure = self.alone_failures.get((namespace, model_group))
        if failure is not None:
            raise failure
        mine = split_by_model_group(self.answer, LABELS).get((namespace, model_group), [])
        return readings_by_model_group([(namespace, model_group)], mine, LABELS)[(namespace, model_group)]

    def read_fleet(
        self, keys: Sequence[ModelGroupKey], windows: Windows
    ) -> dict[ModelGroupKey, MetricsReading]:
        self.queries.append(("fleet", windows))
        if self.fleet_failure is not None:
            raise self.fleet_failure
        return readings_by_model_group(keys, self.answer, LABELS)


KEYS = [("ml", "llama"), ("ml", "mistral"), ("team-b", "llama")]
ANSWER = [entry for namespace, name in KEYS for entry in engine(namespace, name, "g0")]


async def read_all(
    source: BatchedMetricsSource, keys: Sequence[ModelGroupKey], windows: Windows = WINDOWS
) -> list[MetricsReading | BaseException]:
    results = await asyncio.gather(
        *(source.read(ns, name, windows) for ns, name in keys), return_exceptions=True
    )
    return list(results)


def counted() -> tuple[list[tuple[str, bool]], Any]:
    seen: list[tuple[str, bool]] = []
    return seen, lambda scope, answered: seen.append((scope, answered))


def test_model_groups_ticking_together_share_one_query_and_each_gets_its_own_groups() -> None:
    reader = Reader(ANSWER)
    seen, on_query = counted()
    source = BatchedMetricsSource(reader, gather_seconds=0.05, on_query=on_query)
    results = asyncio.run(read_all(source, KEYS))
    assert reader.queries == [("fleet", WINDOWS)]
    assert seen == [("fleet", True)]
    assert all(isinstance(result, MetricsReading) and set(result.groups) == {"g0"} for result in results)


def test_each_query_shape_is_its_own_batch() -> None:
    reader = Reader(ANSWER)
    source = BatchedMetricsSource(reader, gather_seconds=0.05)

    async def both() -> None:
        await asyncio.gather(read_all(source, KEYS[:2], WINDOWS), read_all(source, KEYS[2:], Windows(8, 300)))

    asyncio.run(both())
    assert sorted(str(windows) for _, windows in reader.queries) == sorted(
        [str(WINDOWS), str(Windows(8, 300))]
    )


def test_a_model_group_missing_from_the_answer_reads_empty_and_the_rest_of_the_batch_is_served() -> None:
    reader = Reader(engine("ml", "llama", "g0"))
    results = asyncio.run(read_all(BatchedMetricsSource(reader, gather_seconds=0.05), KEYS))
    assert isinstance(results[0], MetricsReading) and set(results[0].groups) == {"g0"}
    assert results[1] == MetricsReading() and results[2] == MetricsReading()
    assert reader.queries == [("fleet", WINDOWS)]


def test_a_failed_batch_is_asked_again_per_model_group() -> None:
    reader = Reader(ANSWER, fleet_failure=MetricsUnavailableError("Prometheus failed: 422 query too heavy"))
    reader.alone_failures[("ml", "mistral")] = MetricsUnavailableError("Prometheus failed: bad_data")
    seen, on_query = counted()
    results = asyncio.run(
        read_all(BatchedMetricsSource(reader, gather_seconds=0.05, on_query=on_query), KEYS)
    )
    assert [scope for scope, _ in reader.queries] == ["fleet", "model_group", "model_group", "model_group"]
    assert isinstance(results[0], MetricsReading) and set(results[0].groups) == {"g0"}
    assert isinstance(results[1], MetricsUnavailableError) and "bad_data" in str(results[1])
    assert isinstance(results[2], MetricsReading) and set(results[2].groups) == {"g0"}
    assert seen == [("fleet", False), ("model_group", True), ("model_group", False), ("model_group", True)]


def test_an_unreachable_prometheus_fails_the_batch_at_once_without_a_query_per_model_group() -> None:
    down = MetricsUnavailableError("Prometheus at http://p:9090 is unreachable: refused", kind="unreachable")
    reader = Reader(ANSWER, fleet_failure=down)
    results = asyncio.run(read_all(BatchedMetricsSource(reader, gather_seconds=0.05), KEYS))
    assert reader.queries == [("fleet", WINDOWS)]
    assert all(result is down for result in results)


def test_the_fallback_stops_at_the_first_timeout_instead_of_waiting_once_per_model_group() -> None:
    slow = MetricsUnavailableError("Prometheus did not answer within 5s", kind="timeout")
    reader = Reader(ANSWER, fleet_failure=slow, alone_failures={("ml", "llama"): slow})
    results = asyncio.run(read_all(BatchedMetricsSource(reader, gather_seconds=0.05), KEYS))
    assert [scope for scope, _ in reader.queries] == ["fleet", "model_group"]
    assert all(result is slow for result in results)


def test_without_batching_each_read_is_its_own_query() -> None:
    reader = Reader(ANSWER)
    results = asyncio.run(read_all(BatchedMetricsSource(reader, gather_seconds=0), KEYS))
    assert sorted(key for _, key in reader.queries) == sorted(KEYS)
    assert all(isinstance(result, MetricsReading) and set(result.groups) == {"g0"} for result in results)


class GatherWindows:
    """The batches' gather windows, each closed when the test says (in place of asyncio.sleep)."""

    def __init__(self) -> None:
        self.open: list[asyncio.Event] = []

    async def sleep(self, seconds: float) -> None:
        assert seconds > 0
        window = asyncio.Event()
        self.open.append(window)
        await window.wait()

    async def close(self, index: int) -> None:
        """Close the index-th batch's window, once that batch gathers."""
        await until(lambda: len(self.open) > index, f"batch {index} gathers")
        self.open[index].set()


class HeldReader(Reader):
    """A Reader whose first fleet query is held until the test releases it: a batch being answered."""

    def __init__(self, answer: list[dict[str, Any]]) -> None:
        super().__init__(answer)
        self.answering, self.release = threading.Event(), threading.Event()

    def read_fleet(
        self, keys: Sequence[ModelGroupKey], windows: Windows
    ) -> dict[ModelGroupKey, MetricsReading]:
        if not self.answering.is_set():
            self.answering.set()
            assert self.release.wait(10), "the test released the first query"
        return super().read_fleet(keys, windows)


def test_a_read_arriving_while_a_batch_is_answered_waits_for_the_next_batch() -> None:
    reader = HeldReader(ANSWER)
    windows = GatherWindows()
    source = BatchedMetricsSource(reader, gather_seconds=0.05, sleep=windows.sleep)

    async def late_joiner() -> None:
        first = asyncio.create_task(source.read("ml", "llama", WINDOWS))
        await windows.close(0)
        await until(reader.answering.is_set, "the first batch has closed and is being answered")
        second = asyncio.create_task(source.read("ml", "mistral", WINDOWS))
        try:
            await until(lambda: len(windows.open) == 2, "the late read opens a batch of its own")
        finally:
            reader.release.set()
        await windows.close(1)
        assert set((await first).groups) == {"g0"} and set((await second).groups) == {"g0"}

    asyncio.run(late_joiner())
    assert reader.queries == [("fleet", WINDOWS), ("fleet", WINDOWS)]


def test_a_tick_cancelled_while_waiting_leaves_the_batch_to_the_others() -> None:
    reader = Reader(ANSWER)
    windows = GatherWindows()
    source = BatchedMetricsSource(reader, gather_seconds=0.05, sleep=windows.sleep)

    async def one_cancelled() -> MetricsReading:
        doomed = asyncio.create_task(source.read("ml", "llama", WINDOWS))
        kept = asyncio.create_task(source.read("ml", "mistral", WINDOWS))
        await until(lambda: len(windows.open) == 1, "the batch gathers both reads")
        assert len(source._open[WINDOWS].waiters) == 2
        doomed.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await doomed
        await windows.close(0)
        return await kept

    assert set(asyncio.run(one_cancelled()).groups) == {"g0"}
    assert reader.queries == [("fleet", WINDOWS)]


def test_a_negative_gather_time_is_refused() -> None:
    with pytest.raises(ValueError, match="gather_seconds"):
        BatchedMetricsSource(Reader(), gather_seconds=-1)


# --- aligned ticks --------------------------------------------------------------------------------

ALIGNED = {
    "mid-interval": (15.0, 1_000_012.0, 8.0),
    "just after a boundary": (15.0, 1_000_005.5, 14.5),
    "a boundary closer than a quarter interval is skipped": (15.0, 1_000_004.0, 16.0),
    "exactly on a boundary": (10.0, 1_000_000.0, 10.0),
}


@pytest.mark.parametrize(("interval", "now", "delay"), ALIGNED.values(), ids=ALIGNED.keys())
def test_the_next_tick_lands_on_a_multiple_of_the_interval(interval: float, now: float, delay: float) -> None:
    assert next_tick_delay_seconds(interval, now) == pytest.approx(delay)


@given(
    interval=st.integers(min_value=1, max_value=600),
    now=st.floats(min_value=1.6e9, max_value=2.0e9, allow_nan=False),
)
def test_ticks_stay_on_the_interval_grid_at_least_a_quarter_interval_apart(interval: int, now: float) -> None:
    delay = next_tick_delay_seconds(interval, now)
    assert interval / 4 - 1e-6 <= delay <= 1.25 * interval + 1e-6
    landing = (now + delay) % interval
    assert min(landing, interval - landing) < 1e-3 * interval


def test_an_interval_of_zero_is_refused() -> None:
    with pytest.raises(ValueError, match="interval_seconds"):
        next_tick_delay_seconds(0, 10.0)


# --- the next tick counts from the start of the last one ------------------------------------------

BOUNDARY = 1_000_005.0  # a multiple of 15
FROM_START = {
    "a quick tick waits for the next boundary": (15.0, BOUNDARY, BOUNDARY + 0.5, 14.5),
    "a tick slower than three quarters of the interval is followed at the next boundary, not one later": (
        15.0,
        BOUNDARY,
        BOUNDARY + 12.0,
        3.0,
    ),
    "a tick that ran past the next boundary is followed at once": (15.0, BOUNDARY, BOUNDARY + 16.0, 0.0),
    "a first tick started just before a boundary keeps the quarter rule": (
        15.0,
        BOUNDARY - 1.0,
        BOUNDARY - 0.5,
        15.5,
    ),
}


@pytest.mark.parametrize(("interval", "started", "now", "delay"), FROM_START.values(), ids=FROM_START.keys())
def test_the_next_tick_is_due_at_the_boundary_after_the_last_ones_start(
    interval: float, started: float, now: float, delay: float
) -> None:
    assert next_tick_delay_seconds(interval, now, started=started) == pytest.approx(delay)


@given(
    interval=st.integers(min_value=1, max_value=600),
    started=st.floats(min_value=1.6e9, max_value=2.0e9, allow_nan=False),
    took=st.floats(min_value=0.0, max_value=1000.0, allow_nan=False),
)
def test_a_slow_tick_never_skips_a_boundary(interval: int, started: float, took: float) -> None:
    now = started + took
    delay = next_tick_delay_seconds(interval, now, started=started)
    assert delay >= 0.0
    # The next tick lands on the grid (or at once, when its boundary has passed), never later than
    # one and a quarter intervals after the last one started, however long that one took.
    assert now + delay <= max(now, started + 1.25 * interval) + 1e-3
    if delay > 0:
        landing = (now + delay) % interval
        assert min(landing, interval - landing) < 1e-3 * interval


def test_the_queries_run_on_the_executor_given_not_on_asyncios_default() -> None:
    threads: list[str] = []

    class Recording(Reader):
        def read_fleet(
            self, keys: Sequence[ModelGroupKey], windows: Windows
        ) -> dict[ModelGroupKey, MetricsReading]:
            threads.append(threading.current_thread().name)
            return super().read_fleet(keys, windows)

    with ThreadPoolExecutor(1, thread_name_prefix="prometheus-queries") as executor:
        source = BatchedMetricsSource(Recording(answer=ANSWER), gather_seconds=0.01, executor=executor)
        results = asyncio.run(read_all(source, KEYS))
    assert all(isinstance(result, MetricsReading) for result in results)
    assert len(threads) == 1 and threads[0].startswith("prometheus-queries")


# --- the operator stopping: the query executor shut down under the reads --------------------------


async def reads_and_leftover_tasks(
    source: BatchedMetricsSource, during_gather: Any
) -> tuple[list[MetricsReading | BaseException], list[BaseException | None]]:
    """Every ModelGroup of KEYS reading while `during_gather()` runs (the batch is gathering), then
    what each task left on the loop ended with: kopf re-raises those exceptions from `kopf.run`."""
    reads = [asyncio.create_task(source.read(ns, name, WINDOWS)) for ns, name in KEYS]
    await asyncio.sleep(0)
    batches = asyncio.all_tasks() - {asyncio.current_task(), *reads}
    during_gather()
    results = list(await asyncio.gather(*reads, return_exceptions=True))
    await asyncio.wait(batches, timeout=5)
    return results, [None if task.cancelled() else task.exception() for task in batches]


def test_a_batch_gathering_when_the_executor_shuts_down_fails_its_reads_as_unavailable_not_raising() -> None:
    executor = ThreadPoolExecutor(1)
    reader = Reader(ANSWER)
    source = BatchedMetricsSource(reader, gather_seconds=0.05, executor=executor)
    results, leftover_errors = asyncio.run(
        reads_and_leftover_tasks(source, lambda: executor.shutdown(wait=False, cancel_futures=True))
    )
    assert leftover_errors == [None], leftover_errors
    assert all(isinstance(result, MetricsUnavailableError) for result in results), results
    assert "stopping" in str(results[0])
    assert reader.queries == []


def test_an_unbatched_query_cancelled_with_its_executor_is_unavailable_not_a_cancellation() -> None:
    executor = ThreadPoolExecutor(1)
    busy = threading.Event()
    executor.submit(busy.wait, 5)  # the only thread is taken: the read's query waits in the queue
    source = BatchedMetricsSource(Reader(ANSWER), gather_seconds=0, executor=executor)

    async def read_while_stopping() -> MetricsReading | BaseException:
        read = asyncio.create_task(source.read("ml", "llama", WINDOWS))
        await asyncio.sleep(0)  # one turn of the loop: the read sends its query to the executor's queue
        executor.shutdown(wait=False, cancel_futures=True)
        busy.set()
        (result,) = await asyncio.gather(read, return_exceptions=True)
        return result

    result = asyncio.run(read_while_stopping())
    assert isinstance(result, MetricsUnavailableError) and "stopping" in str(result), repr(result)


def test_an_unbatched_read_after_the_executor_shut_down_is_unavailable() -> None:
    executor = ThreadPoolExecutor(1)
    executor.shutdown()
    source = BatchedMetricsSource(Reader(ANSWER), gather_seconds=0, executor=executor)
    with pytest.raises(MetricsUnavailableError, match="stopping"):
        asyncio.run(source.read("ml", "llama", WINDOWS))
