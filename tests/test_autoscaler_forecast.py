"""The operator's forecast: the history read from Prometheus in the background, what the decision and
the status say with it, and without it (too short, a failed read, no ready time)."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Any

import pytest
from test_autoscaler import IDLE, NAME, NAMESPACE, START, Harness, harness, model_group_body

from goodput.api.reasons import Signal
from goodput.controllers.autoscale.forecast import DEFAULT_FORECAST_SETTINGS
from goodput.controllers.pools import PoolKey
from goodput.operator.metrics_source import MetricsUnavailableError, history_from_result
from goodput.operator.promql import offered_work_history_query

DAY = 86_400.0
HISTORY_SECONDS = DEFAULT_FORECAST_SETTINGS.history_seconds
HISTORY_REFRESH_SECONDS = DEFAULT_FORECAST_SETTINGS.refresh_seconds
STEP_SECONDS = DEFAULT_FORECAST_SETTINGS.step_seconds


def offered(days: float, level: float) -> list[tuple[float, float]]:
    """Offered work per second ending at START: a day's swing around `level`, rising at START."""
    steps = int(days * DAY / STEP_SECONDS)
    return [
        (at, level * (1.0 + 0.8 * math.sin(2 * math.pi * (at - START) / DAY)))
        for at in (START - (steps - index) * STEP_SECONDS for index in range(steps))
    ]


@dataclass
class History:
    """Prometheus's range queries: the samples a test sets, or a failure."""

    samples: list[tuple[float, float]] = field(default_factory=list)
    down: bool = False
    asked: list[tuple[str, float, float, float]] = field(default_factory=list)

    def history(
        self, query: str, *, start: float, end: float, step_seconds: float
    ) -> list[tuple[float, float]]:
        self.asked.append((query, start, end, step_seconds))
        if self.down:
            raise MetricsUnavailableError("Prometheus at http://prometheus:9090 did not answer within 5s")
        return [(at, value) for at, value in self.samples if start <= at <= end]


def forecasting(history: History, **spec: Any) -> Harness:
    body = model_group_body(forecast={}, **spec)
    body["spec"]["profile"]["readyTimeSeconds"] = 300
    h = harness(body, groups={"g0": IDLE})
    assert h.autoscaler is not None
    h.autoscaler.history = history
    return h


def run_ticks(h: Harness, *ats: float) -> list[Any]:
    """Ticks at these offsets in one event loop, each followed by the history read it started."""

    async def ticks() -> list[Any]:
        assert h.autoscaler is not None
        outcomes = []
        for at in ats:
            h.clock.now = START + at
            outcomes.append(await h.autoscaler.tick(NAMESPACE, NAME, h.policies, h.post))
            reading = h.autoscaler.memories[PoolKey(NAMESPACE, NAME)].forecast.reading
            if reading is not None:
                await reading
        return outcomes

    return asyncio.run(ticks())


def test_a_week_of_offered_work_is_read_in_the_background_and_a_rise_asks_for_groups_ahead() -> None:
    history = History(offered(3, level=2.0))
    h = forecasting(history)
    first, second = run_ticks(h, 0.0, 10.0)
    assert all(p.signal is not Signal.FORECAST for p in first.active.proposals), "the read was not waited for"
    query, start, end, step = history.asked[0]
    assert query == offered_work_history_query(NAMESPACE, NAME)
    assert query == 'max(goodput_autoscaler_arrival_work_rate{namespace="serving",model_group="llama"})'
    assert (end - start, step) == (HISTORY_SECONDS, STEP_SECONDS)
    forecast = next(p for p in second.active.proposals if p.signal is Signal.FORECAST)
    assert "in 300s" in forecast.detail and "margin" in forecast.detail
    assert second.active.signal is Signal.FORECAST and second.active.desired_groups > 1
    assert h.status["lastDecision"]["signal"] == "forecast"
    assert h.condition("Forecasting") == ("True", "ForecastReady")


def test_the_history_is_read_again_only_every_refresh() -> None:
    history = History(offered(3, level=2.0))
    run_ticks(forecasting(history), 0.0, 10.0, HISTORY_REFRESH_SECONDS - 1, HISTORY_REFRESH_SECONDS)
    assert len(history.asked) == 2


def test_a_short_history_is_named_and_the_decision_only_reacts() -> None:
    h = forecasting(History(offered(0.5, level=2.0)))
    _, second = run_ticks(h, 0.0, 10.0)
    assert all(p.signal is not Signal.FORECAST for p in second.active.proposals)
    assert h.condition("Forecasting") == ("False", "HistoryTooShort")


def test_a_failed_read_keeps_deciding_and_keeps_the_last_forecaster_until_stale() -> None:
    history = History(offered(3, level=2.0))
    h = forecasting(history)
    run_ticks(h, 0.0)
    history.down = True
    _, later = run_ticks(h, HISTORY_REFRESH_SECONDS, HISTORY_REFRESH_SECONDS + 10)
    assert later.active is not None, "the decision was made"
    assert h.condition("Forecasting") == ("False", "HistoryQueryFailed")
    assert any(p.signal is Signal.FORECAST for p in later.active.proposals)
    (stale,) = run_ticks(h, 4 * HISTORY_REFRESH_SECONDS)
    assert all(p.signal is not Signal.FORECAST for p in stale.active.proposals)


def test_without_a_ready_time_there_is_no_horizon_and_nothing_is_read() -> None:
    history = History(offered(3, level=2.0))
    body = model_group_body(forecast={})
    h = harness(body, groups={"g0": IDLE})
    assert h.autoscaler is not None
    h.autoscaler.history = history
    run_ticks(h, 0.0, 10.0)
    assert history.asked == []
    assert h.condition("Forecasting") == ("False", "ReadyTimeUnknown")


def test_without_spec_forecast_nothing_is_read_and_no_condition_is_set() -> None:
    history = History(offered(3, level=2.0))
    h = harness(groups={"g0": IDLE})
    assert h.autoscaler is not None
    h.autoscaler.history = history
    run_ticks(h, 0.0, 10.0)
    assert history.asked == [] and h.condition("Forecasting") is None


def test_removing_spec_forecast_removes_the_condition() -> None:
    h = forecasting(History(offered(3, level=2.0)))
    run_ticks(h, 0.0, 10.0)
    assert h.condition("Forecasting") == ("True", "ForecastReady")
    del h.api.body["spec"]["forecast"]
    h.api.body["metadata"]["generation"] = 5
    run_ticks(h, 20.0)
    assert h.condition("Forecasting") is None


def test_a_scheduled_window_is_the_decisions_reason() -> None:
    window = {"name": "launch", "start": "00:00", "end": "23:59", "timeZone": "UTC", "minReplicas": 3}
    h = harness(model_group_body(replicaSchedule=[window]), groups={"g0": IDLE})
    outcome = h.tick()
    assert outcome.active.desired_groups == 3 and outcome.active.signal is Signal.SCHEDULE
    assert h.status["lastDecision"]["reason"] == "schedule"


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ([], []),
        ([{"metric": {}, "values": [[1.0, "0.5"], [61.0, "NaN"]]}], [(1.0, 0.5), (61.0, math.nan)]),
    ],
)
def test_a_range_answer_is_one_series_of_samples(
    answer: list[Any], expected: list[tuple[float, float]]
) -> None:
    samples = history_from_result(answer, "http://prometheus:9090")
    assert len(samples) == len(expected)
    for (at, value), (want_at, want) in zip(samples, expected, strict=True):
        assert at == want_at and (value == want or (math.isnan(value) and math.isnan(want)))


@pytest.mark.parametrize(
    "answer",
    [
        {"resultType": "vector"},
        [{"metric": {}, "values": []}, {"metric": {}, "values": []}],
        [{"metric": {}, "values": [[1.0]]}],
        [{"metric": {}}],
    ],
    ids=["not a matrix", "two series", "a sample without its value", "no values"],
)
def test_a_malformed_range_answer_is_a_failed_read(answer: object) -> None:
    with pytest.raises(MetricsUnavailableError, match=r"history query|malformed"):
        history_from_result(answer, "http://prometheus:9090")
