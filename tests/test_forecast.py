"""The forecaster of offered work: what it forecasts from a day's profile, the margin it measures,
and the named outcomes when a history gives no forecast."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from goodput.controllers.autoscale.forecast import (
    DAY_SECONDS,
    ForecastOutcome,
    ForecastUnavailable,
    WorkForecast,
    WorkForecaster,
    fit_forecaster,
    forecast_work,
)

STEP = 60.0
HORIZON = 300.0


def diurnal(at: float, *, level: float = 1.0) -> float:
    """Work-seconds per second: a day's swing between 0.2 and 1.8 times `level`."""
    return level * (1.0 + 0.8 * math.sin(2 * math.pi * at / DAY_SECONDS))


def history(days: float, shape=diurnal, start: float = 0.0) -> list[tuple[float, float]]:
    return [(at, shape(at)) for at in np.arange(start, start + days * DAY_SECONDS, STEP).tolist()]


def fitted(samples: list[tuple[float, float]], horizon: float = HORIZON) -> WorkForecaster:
    forecaster = fit_forecaster(samples, horizon)
    assert isinstance(forecaster, WorkForecaster), forecaster
    return forecaster


def forecast_after(samples: list[tuple[float, float]], horizon: float = HORIZON) -> WorkForecast:
    forecaster = fitted(samples, horizon)
    forecast = forecast_work(forecaster, samples[-1][0] + STEP)
    assert isinstance(forecast, WorkForecast), forecast
    return forecast


def test_a_repeating_day_is_forecast_one_horizon_ahead_with_no_margin() -> None:
    samples = history(3)
    now = samples[-1][0] + STEP
    forecast = forecast_after(samples)
    assert forecast.expected_work_rate == pytest.approx(diurnal(now + HORIZON), rel=0.02)
    assert forecast.margin_fraction == pytest.approx(0.0, abs=0.02)
    assert forecast.level_ratio == pytest.approx(1.0, abs=1e-6)


def test_a_busier_day_than_the_last_is_forecast_at_its_level() -> None:
    """Today runs at 1.5 times yesterday's level: the level ratio carries it into the forecast."""

    def busier_today(at: float) -> float:
        return diurnal(at, level=1.5 if at >= 2 * DAY_SECONDS else 1.0)

    samples = history(2.5, busier_today)
    now = samples[-1][0] + STEP
    forecast = forecast_after(samples)
    assert forecast.level_ratio == pytest.approx(1.5, rel=1e-6)
    assert forecast.expected_work_rate == pytest.approx(busier_today(now + HORIZON), rel=0.03)


def test_the_margin_covers_the_measured_error_at_its_quantile() -> None:
    """Noise on each day: the margin is what the work exceeded the forecast by, nine times in ten."""
    rng = np.random.default_rng(7)
    noise = {at: rng.normal(0.0, 0.1) for at, _ in history(4)}
    samples = [(at, max(0.0, value * (1.0 + noise[at]))) for at, value in history(4)]
    forecaster = fitted(samples[: int(3 * DAY_SECONDS / STEP)])
    assert 0.0 < forecaster.margin_fraction < 0.5
    covered = []
    for index in range(int(3 * DAY_SECONDS / STEP), len(samples) - 30, 10):
        now = samples[index][0]
        refit = fitted(samples[: index + 1])
        forecast = forecast_work(refit, now + STEP)
        assert isinstance(forecast, WorkForecast)
        future = [value for at, value in samples if now + HORIZON - 300 <= at < now + HORIZON + 300]
        covered.append(float(np.mean(future)) <= forecast.upper_work_rate)
    assert np.mean(covered) >= 0.8


@dataclass(frozen=True)
class Unusable:
    name: str
    samples: list[tuple[float, float]]
    outcome: ForecastOutcome


def _with_gap(samples: list[tuple[float, float]], start: float, seconds: float) -> list[tuple[float, float]]:
    return [(at, value) for at, value in samples if not start <= at < start + seconds]


UNUSABLE = [
    Unusable("no history at all", [], ForecastOutcome.HISTORY_TOO_SHORT),
    Unusable("half a day", history(0.5), ForecastOutcome.HISTORY_TOO_SHORT),
    Unusable(
        "a day exactly: no past errors to measure the margin on",
        history(1),
        ForecastOutcome.HISTORY_TOO_SHORT,
    ),
    Unusable(
        "three days cut by a two-hour gap twelve hours ago",
        _with_gap(history(3), 2.5 * DAY_SECONDS - 7200, 7200),
        ForecastOutcome.HISTORY_GAPS,
    ),
    Unusable(
        "time going backwards (a series reset)",
        [*history(2), (DAY_SECONDS, 1.0)],
        ForecastOutcome.HISTORY_RESET,
    ),
    Unusable(
        "a negative work rate", [*history(2), (2 * DAY_SECONDS + 1, -0.5)], ForecastOutcome.HISTORY_RESET
    ),
    Unusable(
        "a figure that is not a number",
        [*history(2), (2 * DAY_SECONDS + 1, math.nan)],
        ForecastOutcome.HISTORY_RESET,
    ),
]


@pytest.mark.parametrize("case", UNUSABLE, ids=lambda case: case.name)
def test_an_unusable_history_gives_a_named_outcome_and_no_figure(case: Unusable) -> None:
    result = fit_forecaster(case.samples, HORIZON)
    assert isinstance(result, ForecastUnavailable)
    assert result.outcome is case.outcome
    assert result.message


def test_short_gaps_are_bridged_and_an_old_long_gap_only_shortens_the_history() -> None:
    short_gaps = _with_gap(_with_gap(history(3), 1.2 * DAY_SECONDS, 600), 2.4 * DAY_SECONDS, 600)
    assert isinstance(fit_forecaster(short_gaps, HORIZON), WorkForecaster)
    old_gap = _with_gap(history(4), 0.5 * DAY_SECONDS, 7200)
    forecaster = fitted(old_gap)
    assert forecaster.grid_start >= 0.5 * DAY_SECONDS + 7200


def test_a_forecaster_fitted_long_ago_gives_no_forecast() -> None:
    forecaster = fitted(history(3))
    stale = forecast_work(forecaster, forecaster.history_end + forecaster.max_age_seconds + 1)
    assert isinstance(stale, ForecastUnavailable)
    assert stale.outcome is ForecastOutcome.FORECAST_STALE


def test_a_horizon_must_be_a_duration() -> None:
    with pytest.raises(ValueError, match="horizon_seconds"):
        fit_forecaster(history(3), -1.0)


@settings(max_examples=15, deadline=None)
@given(
    scale=st.floats(min_value=0.01, max_value=100.0),
    phase=st.floats(min_value=0.0, max_value=DAY_SECONDS),
    horizon=st.sampled_from([0.0, 120.0, 600.0, 1800.0]),
)
def test_forecasts_scale_with_the_work_and_never_go_negative(
    scale: float, phase: float, horizon: float
) -> None:
    """Work stated in other units (a bigger fleet, a heavier mix) scales the forecast, not its margin."""

    def shape(at: float) -> float:
        return diurnal(at + phase) + 0.3 * math.sin(2 * math.pi * at / 3700.0) ** 2

    samples = history(2.2, shape)
    scaled = [(at, value * scale) for at, value in samples]
    base, bigger = forecast_after(samples, horizon), forecast_after(scaled, horizon)
    assert base.expected_work_rate >= 0 and base.margin_fraction >= 0
    assert bigger.expected_work_rate == pytest.approx(base.expected_work_rate * scale, rel=1e-6)
    assert bigger.margin_fraction == pytest.approx(base.margin_fraction, rel=1e-6, abs=1e-9)
    assert bigger.upper_work_rate >= bigger.expected_work_rate


@settings(max_examples=15, deadline=None)
@given(st.lists(st.floats(min_value=0.0, max_value=10.0), min_size=0, max_size=200))
def test_any_history_gives_a_forecast_or_a_named_outcome(values: list[float]) -> None:
    samples = [(index * 900.0, value) for index, value in enumerate(values)]
    result = fit_forecaster(samples, HORIZON)
    if isinstance(result, ForecastUnavailable):
        assert result.outcome in ForecastOutcome
    else:
        forecast = forecast_work(result, samples[-1][0])
        assert not isinstance(forecast, WorkForecast) or forecast.upper_work_rate >= 0
