"""Offered work one ready time ahead, learnt from the ModelGroup's own history.

A group asked for when the load rises is ready one ready time later; a forecast of the rise lets
the autoscaler ask that much earlier. The method is the simplest that is right often enough to be
worth it, and can be explained from its figures:

- the history: offered work per second (work-seconds per second, the decision's arrival estimate as
  the operator exports it), timestamped samples over up to a week, put on a regular grid of
  `step_seconds` (each grid point the mean of the samples in its step). A gap longer than
  `max_gap_seconds` cuts the history: only what came after it counts. Shorter gaps are bridged
  linearly;
- seasonal naive, daily: the work expected at `t` is what was offered one day before, around
  `t - 1 day` (the mean over `smoothing_seconds`);
- level correction: times the ratio of the last `level_window_seconds` to the same window one day
  earlier (within [1 / `max_level_ratio`, `max_level_ratio`]): a day busier than the last stays
  busier. The weekly swing (a weekend, a quieter Monday) shows as such a level change, and in the
  measured error;
- the margin: the same forecast made at every past instant the history allows, one horizon
  ahead, compared with what was then offered; the `error_quantile` of the relative errors (the
  share the work was above the forecast) is the margin, never below 0. It replaces a fixed
  safety factor: a steady day earns a thin margin, a ragged one a wide one.

When it cannot forecast, it says why (`ForecastUnavailable`) and the decision falls back to the
reactive signals: a history shorter than a day plus the horizon and enough past errors to measure
the margin (`HistoryTooShort`), one cut short by a gap (`HistoryGaps`), or one that runs backwards
in time or holds a figure no work rate can have: negative, not a number (`HistoryReset`). Nothing
is forecast from a made-up figure.

Everything here is pure: `fit_forecaster` turns a history into a frozen `WorkForecaster` (the
operator refits every few minutes, the simulator likewise), `forecast_work` reads it at `now`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from goodput.api.reasons import Reason

DAY_SECONDS = 86_400.0


class ForecastOutcome(StrEnum):
    """Why a history gives no forecast: `Reason`'s words for the Forecasting condition, as one type."""

    HISTORY_TOO_SHORT = Reason.HISTORY_TOO_SHORT
    HISTORY_GAPS = Reason.HISTORY_GAPS
    HISTORY_RESET = Reason.HISTORY_RESET
    FORECAST_STALE = Reason.FORECAST_STALE


@dataclass(frozen=True, slots=True)
class ForecastSettings:
    """The forecaster's constants; the defaults are what the operator and the simulator use."""

    step_seconds: float = 60.0
    max_gap_seconds: float = 900.0
    """A hole in the history longer than this cuts it (an operator down for a quarter of an hour
    is bridged; a day without figures is not)."""
    smoothing_seconds: float = 600.0
    level_window_seconds: float = 1800.0
    max_level_ratio: float = 2.0
    error_quantile: float = 0.9
    min_error_seconds: float = 3600.0
    """The past forecasts the margin is measured on must span at least this long."""
    max_age_seconds: float = 1800.0
    """A forecaster fitted on a history that ends longer ago than this is not used."""
    history_seconds: float = 7 * DAY_SECONDS
    """How much history is read: a week, for the daily profile, and for the weekly swing in the
    level correction and the measured error."""
    refresh_seconds: float = 600.0
    """How often the history is read and fitted again: the forecast moves with the day, not the
    minute. At the default step a week is 10,080 points, under Prometheus's 11,000 per range query."""

    def __post_init__(self) -> None:
        if not 0 < self.step_seconds <= self.max_gap_seconds:
            raise ValueError("step_seconds must be positive and at most max_gap_seconds")
        if not 0.5 <= self.error_quantile < 1:
            raise ValueError("error_quantile must be in [0.5, 1)")
        if self.max_level_ratio < 1:
            raise ValueError("max_level_ratio must be at least 1")


DEFAULT_FORECAST_SETTINGS = ForecastSettings()


@dataclass(frozen=True, slots=True)
class ForecastUnavailable:
    """No forecast, and why, in words that name the figures."""

    outcome: ForecastOutcome
    message: str


@dataclass(frozen=True, slots=True)
class WorkForecaster:
    """A history fitted for one horizon: the grid, the level ratio and the measured margin.

    grid_start: the time of `work_rates[0]`; each point stands for `step_seconds` from there.
    level_ratio: the last level window over the same window one day earlier (clamped).
    margin_fraction: the error quantile of past forecasts at `horizon_seconds`, at least 0.
    errors_measured: how many past forecasts the margin rests on.
    """

    grid_start: float
    step_seconds: float
    work_rates: tuple[float, ...]
    horizon_seconds: float
    level_ratio: float
    margin_fraction: float
    errors_measured: int
    error_quantile: float
    smoothing_seconds: float
    max_age_seconds: float

    @property
    def history_end(self) -> float:
        return self.grid_start + len(self.work_rates) * self.step_seconds

    @property
    def history_seconds(self) -> float:
        return len(self.work_rates) * self.step_seconds


@dataclass(frozen=True, slots=True)
class WorkForecast:
    """The work expected one horizon ahead of `at`, and the figures behind it."""

    at: float
    horizon_seconds: float
    expected_work_rate: float
    """Work-seconds per second expected at `at + horizon_seconds`."""
    margin_fraction: float
    level_ratio: float
    errors_measured: int
    error_quantile: float

    @property
    def upper_work_rate(self) -> float:
        """The expected work with the measured margin: what the groups are sized for."""
        return self.expected_work_rate * (1.0 + self.margin_fraction)

    def detail(self) -> str:
        return (
            f"forecast lambda_w={self.expected_work_rate:.4g}/s in {self.horizon_seconds:g}s "
            f"+{self.margin_fraction:.3g} margin (p{self.error_quantile * 100:g} of "
            f"{self.errors_measured} past errors) level={self.level_ratio:.3g}"
        )


def _validate(samples: Sequence[tuple[float, float]]) -> ForecastUnavailable | None:
    previous = -math.inf
    for at, value in samples:
        if not (math.isfinite(at) and math.isfinite(value)) or value < 0:
            return ForecastUnavailable(
                ForecastOutcome.HISTORY_RESET,
                f"the history holds {value!r} at {at!r}: not a work rate; nothing is forecast from it",
            )
        if at <= previous:
            return ForecastUnavailable(
                ForecastOutcome.HISTORY_RESET,
                f"the history goes back in time at {at:.0f} (after {previous:.0f}): a reset series",
            )
        previous = at
    return None


def _after_last_gap(
    samples: Sequence[tuple[float, float]], max_gap_seconds: float
) -> tuple[list[tuple[float, float]], float | None]:
    """The samples after the last gap longer than `max_gap_seconds`, and that gap's length."""
    for index in range(len(samples) - 1, 0, -1):
        gap = samples[index][0] - samples[index - 1][0]
        if gap > max_gap_seconds:
            return list(samples[index:]), gap
    return list(samples), None


def _grid(samples: Sequence[tuple[float, float]], step: float) -> tuple[float, np.ndarray]:
    """The samples on a regular grid from the first: each step's mean, empty steps bridged linearly."""
    times = np.array([at for at, _ in samples])
    values = np.array([value for _, value in samples])
    start = float(times[0])
    points = int((times[-1] - start) // step) + 1
    index = ((times - start) // step).astype(np.int64)
    sums = np.bincount(index, weights=values, minlength=points)
    counts = np.bincount(index, minlength=points)
    filled = counts > 0
    centres = np.arange(points)
    grid = np.interp(centres, centres[filled], sums[filled] / counts[filled])
    return start, grid


def _windowed_means(grid: np.ndarray, width: int) -> np.ndarray:
    """means[i]: the mean of grid[i - width + 1 .. i] (the window ending at i); NaN before it fills."""
    sums = np.concatenate(([0.0], np.cumsum(grid)))
    means = np.full(grid.size, np.nan)
    if width <= grid.size:
        means[width - 1 :] = (sums[width:] - sums[:-width]) / width
    return means


def _ratio(now_level: float, then_level: float, bound: float) -> float:
    if then_level <= 0:
        return 1.0 if now_level <= 0 else bound
    return min(bound, max(1.0 / bound, now_level / then_level))


def _ratios(now_levels: np.ndarray, then_levels: np.ndarray, bound: float) -> np.ndarray:
    """`_ratio` for arrays of levels."""
    safe = np.where(then_levels > 0, then_levels, 1.0)
    ratios = np.clip(now_levels / safe, 1.0 / bound, bound)
    unknown_then = np.where(now_levels <= 0, 1.0, bound)
    return np.where(then_levels > 0, ratios, unknown_then)


@dataclass(frozen=True, slots=True)
class _Steps:
    day: int
    horizon: int
    smooth: int
    level: int

    @classmethod
    def of(cls, settings: ForecastSettings, horizon_seconds: float) -> _Steps:
        step = settings.step_seconds
        return cls(
            day=round(DAY_SECONDS / step),
            horizon=max(0, round(horizon_seconds / step)),
            smooth=max(1, round(settings.smoothing_seconds / step)),
            level=max(1, round(settings.level_window_seconds / step)),
        )


def _past_errors(
    grid: np.ndarray, steps: _Steps, settings: ForecastSettings
) -> tuple[np.ndarray, np.ndarray]:
    """For every past instant i with a full day behind it and the horizon ahead of it: the forecast
    made then (as `forecast_work` makes it now) and the work offered one horizon later (both means
    over the smoothing window, centred)."""
    smooth = _windowed_means(grid, steps.smooth)
    level = _windowed_means(grid, steps.level)
    # a window centred on c ends at c + ahead; the forecast made at i for i + horizon reads the
    # window centred on i + horizon - day
    ahead = steps.smooth - 1 - steps.smooth // 2
    first = steps.day + steps.level - 1
    last = grid.size - 1 - steps.horizon - ahead
    if last < first:
        return np.zeros(0), np.zeros(0)
    made = np.arange(first, last + 1)
    seasonal = smooth[made + steps.horizon - steps.day + ahead]
    forecasts = seasonal * _ratios(level[made], level[made - steps.day], settings.max_level_ratio)
    actual = smooth[made + steps.horizon + ahead]
    usable = np.isfinite(forecasts) & np.isfinite(actual)
    return forecasts[usable], actual[usable]


def _margin(forecasts: np.ndarray, actual: np.ndarray, quantile: float) -> float:
    """The `quantile` of (actual - forecast) / forecast where the forecast is above zero, at least 0.

    Where the forecast is zero the error is counted against the mean forecast, so an idle night
    followed by work is an error, not a division by zero."""
    scale = np.where(forecasts > 0, forecasts, max(float(np.mean(forecasts)), 1e-12))
    errors = (actual - forecasts) / scale
    return max(0.0, float(np.quantile(errors, quantile)))


def fit_forecaster(
    samples: Sequence[tuple[float, float]],
    horizon_seconds: float,
    settings: ForecastSettings = DEFAULT_FORECAST_SETTINGS,
) -> WorkForecaster | ForecastUnavailable:
    """The forecaster for `horizon_seconds` ahead from `samples` (time in seconds, offered work per
    second), or why there is none."""
    if not (math.isfinite(horizon_seconds) and horizon_seconds >= 0):
        raise ValueError(f"horizon_seconds must be finite and >= 0, got {horizon_seconds}")
    invalid = _validate(samples)
    if invalid is not None:
        return invalid
    kept, gap = _after_last_gap(samples, settings.max_gap_seconds)
    steps = _Steps.of(settings, horizon_seconds)
    need_seconds = DAY_SECONDS + horizon_seconds + settings.level_window_seconds + settings.min_error_seconds
    span = kept[-1][0] - kept[0][0] if kept else 0.0
    if span < need_seconds:
        outcome = ForecastOutcome.HISTORY_GAPS if gap is not None else ForecastOutcome.HISTORY_TOO_SHORT
        cut = f" after a gap of {gap:.0f}s" if gap is not None else ""
        return ForecastUnavailable(
            outcome,
            f"{span / 3600:.3g}h of history{cut}; a forecast {horizon_seconds:g}s ahead needs "
            f"{need_seconds / 3600:.3g}h (a day, the horizon, the level window and "
            f"{settings.min_error_seconds:g}s of past errors)",
        )
    start, grid = _grid(kept, settings.step_seconds)
    forecasts, actual = _past_errors(grid, steps, settings)
    if forecasts.size * settings.step_seconds < settings.min_error_seconds:
        return ForecastUnavailable(
            ForecastOutcome.HISTORY_TOO_SHORT,
            f"only {forecasts.size} past forecasts to measure the error on; "
            f"{settings.min_error_seconds:g}s of them are needed",
        )
    level = _windowed_means(grid, steps.level)
    end = grid.size - 1
    return WorkForecaster(
        grid_start=start,
        step_seconds=settings.step_seconds,
        work_rates=tuple(float(value) for value in grid),
        horizon_seconds=float(horizon_seconds),
        level_ratio=_ratio(float(level[end]), float(level[end - steps.day]), settings.max_level_ratio),
        margin_fraction=_margin(forecasts, actual, settings.error_quantile),
        errors_measured=int(forecasts.size),
        error_quantile=settings.error_quantile,
        smoothing_seconds=settings.smoothing_seconds,
        max_age_seconds=settings.max_age_seconds,
    )


def forecast_work(forecaster: WorkForecaster, now: float) -> WorkForecast | ForecastUnavailable:
    """The work expected one horizon after `now`: the day before's, around then, times the level ratio."""
    age = now - forecaster.history_end
    if age > forecaster.max_age_seconds:
        return ForecastUnavailable(
            ForecastOutcome.FORECAST_STALE,
            f"the history ends {age:.0f}s before now (at most {forecaster.max_age_seconds:g}s)",
        )
    step = forecaster.step_seconds
    centre = now + forecaster.horizon_seconds - DAY_SECONDS
    half = forecaster.smoothing_seconds / 2
    first = max(0, math.floor((centre - half - forecaster.grid_start) / step))
    last = min(len(forecaster.work_rates), math.ceil((centre + half - forecaster.grid_start) / step))
    if last <= first:
        return ForecastUnavailable(
            ForecastOutcome.HISTORY_TOO_SHORT,
            f"the history holds nothing one day before {now + forecaster.horizon_seconds:.0f}",
        )
    window = forecaster.work_rates[first:last]
    seasonal = sum(window) / len(window)
    return WorkForecast(
        at=now,
        horizon_seconds=forecaster.horizon_seconds,
        expected_work_rate=seasonal * forecaster.level_ratio,
        margin_fraction=forecaster.margin_fraction,
        level_ratio=forecaster.level_ratio,
        errors_measured=forecaster.errors_measured,
        error_quantile=forecaster.error_quantile,
    )
