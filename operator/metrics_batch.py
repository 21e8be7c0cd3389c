"""One Prometheus query per query shape for every ModelGroup due at about the same moment.

Each ModelGroup's autoscaler tick asks for its own reading (`BatchedMetricsSource.read`). The first
request of a query shape (its `Windows`) opens a batch; requests of the same shape that arrive within
`gather_seconds` join it; then one `fleet_snapshot_query` answers all of them, cut per ModelGroup by
its namespace and ModelGroup labels. Ticks are aligned to the interval (`next_tick_delay_seconds`),
so the ModelGroups of one interval ask together and an interval costs one query per shape, not one
per ModelGroup. A request that arrives while a batch is being answered waits for the next batch.

A ModelGroup without series in the answer gets an empty reading, and the decision's missing-metrics
guard holds its count: an absent series is that ModelGroup's problem, never the batch's. When the
batched query itself fails (an error answer, a timeout), each ModelGroup of the batch is asked alone
(the per-ModelGroup query of before), one after the other; once one of those cannot reach
Prometheus or times out, the rest of the batch fails with that error rather than waiting for each.
A Prometheus that refuses connections fails the whole batch at once.

`gather_seconds` 0 turns batching off: every read is its own query, as before.

The blocking queries run on an executor of their own (`executor`, one thread in the operator), never
on asyncio's default one: there they queued behind every Kubernetes write of the operator, and at
fleet size a tick waited longer for its turn to query than the query took.

A read that comes after the operator's cleanup shut the query executor down, or a batch still
gathering at that moment, fails with MetricsUnavailableError like any unanswered query: an exception
of another kind would leave `kopf.run` from the batch's task.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from goodput.operator.metrics_source import MetricsReading, MetricsUnavailableError, ModelGroupKey
from goodput.operator.promql import Windows

_T = TypeVar("_T")
QueryCounter = Callable[[str, bool], None]
"""Told of each query sent: its scope ('fleet' or 'model_group') and whether it was answered."""


class FleetReader(Protocol):
    """The blocking reads `BatchedMetricsSource` drives (`PrometheusMetricsSource`)."""

    def read(self, namespace: str, model_group: str, windows: Windows) -> MetricsReading: ...

    def read_fleet(
        self, keys: Sequence[ModelGroupKey], windows: Windows
    ) -> dict[ModelGroupKey, MetricsReading]: ...


def next_tick_delay_seconds(interval_seconds: float, now: float, started: float | None = None) -> float:
    """Seconds to the next multiple of the interval (wall clock), so that every ModelGroup with this
    interval ticks at the same moments and their reads share a batch. A boundary closer than a
    quarter interval is skipped, so a first tick (started at any moment) is not followed at once by
    a second.

    `started`: when the tick that just ended began. The next tick is due at the boundary after that
    moment, however long the tick took: a slow tick makes the next one come sooner (at once if that
    boundary has passed), never a whole interval later. Counted from the end instead, every tick
    slower than three quarters of the interval skipped one, and at fleet size most did."""
    if interval_seconds <= 0:
        raise ValueError(f"interval_seconds must be positive, got {interval_seconds}")
    begun = now if started is None else min(started, now)
    gap = interval_seconds - (begun % interval_seconds)
    due = begun + (gap + interval_seconds if gap < interval_seconds / 4 else gap)
    return max(0.0, due - now)


@dataclass
class _Batch:
    windows: Windows
    waiters: dict[ModelGroupKey, asyncio.Future[MetricsReading]] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None


QueryOutcome = MetricsReading | MetricsUnavailableError
EXECUTOR_STOPPED = "the operator is stopping: its Prometheus queries are no longer sent"


def _retrieved(future: asyncio.Future[MetricsReading]) -> None:
    if not future.cancelled():
        future.exception()


class BatchedMetricsSource:
    """Reads for the autoscaler's ticks, batched per query shape (see the module docstring)."""

    def __init__(
        self,
        reader: FleetReader,
        *,
        gather_seconds: float,
        on_query: QueryCounter | None = None,
        executor: Executor | None = None,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        """`executor` runs the blocking queries (None: asyncio's default executor). `sleep` waits
        out a batch's gather window (`gather_seconds`); a test passes its own to close it at will."""
        if gather_seconds < 0:
            raise ValueError(f"gather_seconds must not be negative, got {gather_seconds}")
        self.reader = reader
        self.gather_seconds = gather_seconds
        self.executor = executor
        self._sleep = sleep
        self._on_query = on_query or (lambda scope, answered: None)
        self._open: dict[Windows, _Batch] = {}

    async def read(self, namespace: str, model_group: str, windows: Windows) -> MetricsReading:
        """This ModelGroup's reading; raises MetricsUnavailableError when Prometheus cannot tell."""
        if self.gather_seconds == 0:
            return await self._blocking(self._read_alone, (namespace, model_group), windows)
        batch = self._open.get(windows)
        if batch is None:
            batch = self._open[windows] = _Batch(windows)
            batch.task = asyncio.create_task(self._answer(batch))
        future = batch.waiters.get((namespace, model_group))
        if future is None:
            future = batch.waiters[(namespace, model_group)] = asyncio.get_running_loop().create_future()
            # A waiter cancelled meanwhile never looks at its failure; nobody else needs to hear of it.
            future.add_done_callback(_retrieved)
        # Shielded: a tick cancelled while waiting (its daemon stopped) leaves the batch to the others.
        return await asyncio.shield(future)

    async def _blocking(self, function: Callable[..., _T], *args: object) -> _T:
        """`function` on the query executor. Once the operator stops, its cleanup shuts that
        executor down while ticks may still ask (and a batch may still be gathering): they learn
        that nothing is known (MetricsUnavailableError), as from a Prometheus that cannot answer,
        never a RuntimeError that would leave kopf and skip the Lease's release."""
        loop = asyncio.get_running_loop()
        try:
            pending = loop.run_in_executor(self.executor, functools.partial(function, *args))
        except RuntimeError as error:  # "cannot schedule new futures after shutdown"
            raise MetricsUnavailableError(EXECUTOR_STOPPED, kind="unreachable") from error
        try:
            return await pending
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this read itself was cancelled
            # The query was cancelled with its executor (shut down with cancel_futures).
            raise MetricsUnavailableError(EXECUTOR_STOPPED, kind="unreachable") from None

    async def _answer(self, batch: _Batch) -> None:
        """Gather, close the batch to newcomers, ask once, hand each waiter its reading."""
        outcomes: dict[ModelGroupKey, QueryOutcome] = {}
        try:
            await self._sleep(self.gather_seconds)
            if self._open.get(batch.windows) is batch:
                del self._open[batch.windows]
            keys = list(batch.waiters)
            try:
                outcomes = await self._blocking(self._read_batch, keys, batch.windows)
            except MetricsUnavailableError as error:
                outcomes = dict.fromkeys(keys, error)
        finally:
            if self._open.get(batch.windows) is batch:
                del self._open[batch.windows]
            for key, future in batch.waiters.items():
                if future.done():
                    continue
                outcome = outcomes.get(key)
                if outcome is None:
                    future.set_exception(MetricsUnavailableError("the batched metrics read stopped"))
                elif isinstance(outcome, MetricsUnavailableError):
                    future.set_exception(outcome)
                else:
                    future.set_result(outcome)

    def _read_batch(
        self, keys: Sequence[ModelGroupKey], windows: Windows
    ) -> dict[ModelGroupKey, QueryOutcome]:
        """Blocking: the fleet query, or after its failure each ModelGroup alone."""
        try:
            readings = self.reader.read_fleet(keys, windows)
        except MetricsUnavailableError as error:
            self._on_query("fleet", False)
            if error.kind == "unreachable":
                return dict.fromkeys(keys, error)
            return self._read_each(keys, windows)
        self._on_query("fleet", True)
        return dict(readings)

    def _read_each(
        self, keys: Sequence[ModelGroupKey], windows: Windows
    ) -> dict[ModelGroupKey, QueryOutcome]:
        """The fallback: one query per ModelGroup, until one shows Prometheus itself is out of reach."""
        outcomes: dict[ModelGroupKey, QueryOutcome] = {}
        for key in keys:
            try:
                outcomes[key] = self._read_alone(key, windows)
            except MetricsUnavailableError as error:
                outcomes[key] = error
                if error.kind != "answer":
                    return {**dict.fromkeys(keys, error), **outcomes}
        return outcomes

    def _read_alone(self, key: ModelGroupKey, windows: Windows) -> MetricsReading:
        try:
            reading = self.reader.read(key[0], key[1], windows)
        except MetricsUnavailableError:
            self._on_query("model_group", False)
            raise
        self._on_query("model_group", True)
        return reading
