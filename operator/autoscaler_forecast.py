"""The forecast's history, read from Prometheus at a low cadence and never in a decision's way.

A ModelGroup with `spec.forecast` has its offered work (`promql.OFFERED_WORK_SERIES`, the decision's
arrival estimate the operator exports) read back over `ForecastSettings.history_seconds` every
`refresh_seconds`, and fitted one ready time ahead (`controllers.autoscale.forecast`). The read runs
as a task of its own: a decision uses the forecaster the last read left (none before the first has
finished), so a slow Prometheus delays the forecast, never the decision. A failed read keeps the
last forecaster until it is stale (`ForecastSettings.max_age_seconds`), and says so.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from goodput.api.modelgroup import Forecast
from goodput.api.reasons import Reason
from goodput.controllers.autoscale.forecast import DEFAULT_FORECAST_SETTINGS, WorkForecaster, fit_forecaster
from goodput.controllers.autoscale.record import ForecastHealth, forecast_health
from goodput.operator.metrics_source import MetricsUnavailableError
from goodput.operator.promql import offered_work_history_query

log = logging.getLogger("goodput.autoscaler")

SETTINGS = DEFAULT_FORECAST_SETTINGS


class HistorySource(Protocol):
    """A range query's one series (`metrics_source.PrometheusMetricsSource.history`); blocking."""

    def history(
        self, query: str, *, start: float, end: float, step_seconds: float
    ) -> list[tuple[float, float]]: ...


Offload = Callable[
    [Callable[[], WorkForecaster | ForecastHealth]], Awaitable[WorkForecaster | ForecastHealth]
]
"""Runs a blocking read-and-fit off the event loop (the autoscaler's executor)."""


@dataclass
class ForecastMemory:
    """One ModelGroup's forecaster and the health of its last read, kept between ticks."""

    forecaster: WorkForecaster | None = None
    health: ForecastHealth | None = None
    read_at: float | None = None
    reading: asyncio.Task[None] | None = field(default=None, repr=False)

    def due(self, now: float) -> bool:
        idle = self.reading is None or self.reading.done()
        return idle and (self.read_at is None or now - self.read_at >= SETTINGS.refresh_seconds)

    def usable(self, now: float) -> WorkForecaster | None:
        """The forecaster a decision may read: none once stale (`forecast_work` says so too)."""
        forecaster = self.forecaster
        if forecaster is None or now - forecaster.history_end > forecaster.max_age_seconds:
            return None
        return forecaster


def read_and_fit(
    source: HistorySource,
    namespace: str,
    name: str,
    *,
    horizon_seconds: float,
    forecast: Forecast,
    now: float,
) -> WorkForecaster | ForecastHealth:
    """Read the history and fit it (blocking): the forecaster, or why there is none."""
    try:
        samples = source.history(
            offered_work_history_query(namespace, name),
            start=now - SETTINGS.history_seconds,
            end=now,
            step_seconds=SETTINGS.step_seconds,
        )
    except MetricsUnavailableError as error:
        return ForecastHealth(
            "False", Reason.HISTORY_QUERY_FAILED, f"{error}; scaling reacts to the load only"
        )
    settings = dataclasses.replace(SETTINGS, error_quantile=forecast.error_quantile)
    fitted = fit_forecaster(samples, horizon_seconds, settings)
    return fitted if isinstance(fitted, WorkForecaster) else forecast_health(fitted)


async def refresh(
    memory: ForecastMemory,
    read: Callable[[], WorkForecaster | ForecastHealth],
    offload: Offload,
    *,
    now: float,
    where: dict[str, str],
) -> None:
    """One read into `memory`: a new forecaster replaces the old; a failed or unusable read keeps
    the old one (until stale) and records why."""
    memory.read_at = now
    outcome = await offload(read)
    if isinstance(outcome, WorkForecaster):
        memory.forecaster, memory.health = outcome, forecast_health(outcome)
        return
    if outcome.reason != Reason.HISTORY_QUERY_FAILED:
        memory.forecaster = None  # the history itself says no: nothing of it is forecast from
    memory.health = outcome
    log.info("forecast unavailable: %s: %s", outcome.reason, outcome.message, extra=where)


def ready_time_unknown() -> ForecastHealth:
    return ForecastHealth(
        "False",
        Reason.READY_TIME_UNKNOWN,
        "no profile.readyTimeSeconds and no group's ready time measured yet: no horizon to forecast at; "
        "scaling reacts to the load only",
    )
