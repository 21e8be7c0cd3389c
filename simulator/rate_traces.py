"""Request streams from traces that record only rates: the Azure 2024 week (requests per minute) and
ServeGen's aggregate rate windows.

Those traces give the shape of the load over time (diurnal and weekly swing, burstiness), not its
requests. A replay keeps the shape and nothing else: the series is stretched or compressed onto the
replay's duration, scaled to a chosen mean rate (the absolute level of a production fleet means
nothing for one simulated ModelGroup), and each window's arrivals are drawn from a renewal process
with the window's rate (Poisson, or gamma gaps with the window's coefficient of variation where the
trace records one, as ServeGen does). Lengths are drawn jointly (prompt and output of one real
request) from an Azure 2023 trace. Every choice is seeded and written into the workload's notes.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from goodput.simulator.workload import Workload


@dataclass(frozen=True, slots=True)
class RateSeries:
    """Piecewise-constant arrival rates: window i starts at `start_seconds[i]` and lasts
    `length_seconds[i]`; `cv` is the coefficient of variation of inter-arrival gaps (1: Poisson)."""

    name: str
    start_seconds: np.ndarray
    length_seconds: np.ndarray
    rate_per_second: np.ndarray
    cv: np.ndarray
    source: str

    @property
    def span_seconds(self) -> float:
        return float(self.start_seconds[-1] + self.length_seconds[-1] - self.start_seconds[0])


def _rows(path: Path, required: tuple[str, ...]) -> list[dict[str, str]]:
    """The CSV's rows, or an error naming the file and the missing column."""
    try:
        with path.open(newline="") as handle:
            reader = csv.DictReader(handle)
            columns = tuple(reader.fieldnames or ())
            missing = [name for name in required if name not in columns]
            if missing:
                raise ValueError(
                    f"{path}: rate trace lacks column(s) {', '.join(missing)} (has: {', '.join(columns)})"
                )
            rows = list(reader)
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not a text CSV file ({error.reason})") from error
    if not rows:
        raise ValueError(f"{path}: rate trace has a header but no rows")
    return rows


def _number(row: dict[str, str], column: str, path: Path, line: int) -> float:
    try:
        value = float(row[column])
    except (TypeError, ValueError) as error:
        raise ValueError(f"{path}: line {line}: column {column} is {row[column]!r}, not a number") from error
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{path}: line {line}: column {column} is {value}, expected a finite value >= 0")
    return value


def load_azure2024_rates(path: Path) -> RateSeries:
    """Azure 2024 week, digitized: `approx_time_utc` and `req_per_min_mid` per ~7-minute column."""
    rows = _rows(path, ("approx_time_utc", "req_per_min_mid"))
    try:
        stamps = np.array([row["approx_time_utc"].strip().replace(" ", "T") for row in rows], "datetime64[s]")
    except ValueError as error:
        raise ValueError(
            f"{path}: column approx_time_utc holds a value that is not a time: {error}"
        ) from error
    seconds = (stamps - stamps[0]).astype(np.int64).astype(np.float64)
    if np.any(np.diff(seconds) <= 0):
        raise ValueError(f"{path}: column approx_time_utc is not strictly increasing")
    gaps = np.diff(seconds)
    lengths = np.append(gaps, gaps[-1] if gaps.size else 60.0)
    rates = np.array([_number(row, "req_per_min_mid", path, i + 2) / 60.0 for i, row in enumerate(rows)])
    return RateSeries(
        path.stem, seconds, lengths, rates, np.ones(len(rows)), f"{path.name} (Azure 2024, digitized)"
    )


def load_servegen_rates(path: Path) -> RateSeries:
    """ServeGen aggregate windows: start, length, summed client rate and rate-weighted mean CV."""
    rows = _rows(path, ("window_start_s", "window_len_s", "sum_client_rate_rps", "rate_weighted_mean_cv"))
    starts = np.array([_number(row, "window_start_s", path, i + 2) for i, row in enumerate(rows)])
    lengths = np.array([_number(row, "window_len_s", path, i + 2) for i, row in enumerate(rows)])
    rates = np.array([_number(row, "sum_client_rate_rps", path, i + 2) for i, row in enumerate(rows)])
    cv = np.array([_number(row, "rate_weighted_mean_cv", path, i + 2) for i, row in enumerate(rows)])
    if np.any(lengths <= 0):
        raise ValueError(f"{path}: column window_len_s must be positive in every row")
    return RateSeries(path.stem, starts - starts[0], lengths, rates, np.where(cv > 0, cv, 1.0), path.name)


def load_rate_series(path: Path) -> RateSeries:
    """By file name: `azure2024_*` or `servegen_*`."""
    if not path.is_file():
        raise ValueError(f"{path}: no such rate trace file")
    if path.name.startswith("azure2024_"):
        return load_azure2024_rates(path)
    if path.name.startswith("servegen_"):
        return load_servegen_rates(path)
    raise ValueError(f"{path}: unknown rate trace; expected a file named azure2024_* or servegen_*")


def mean_rate(series: RateSeries) -> float:
    """The series' time-weighted mean rate (requests per second)."""
    return float(np.sum(series.rate_per_second * series.length_seconds)) / series.span_seconds


def renewal_arrivals(
    rng: np.random.Generator, start: float, end: float, rate: float, cv: float
) -> np.ndarray:
    """Arrivals in [start, end) at `rate` with gamma gaps of coefficient of variation `cv`."""
    if rate <= 0 or end <= start:
        return np.zeros(0)
    shape = 1.0 / max(cv, 0.05) ** 2
    expected = rate * (end - start)
    gaps = rng.gamma(shape, 1.0 / (shape * rate), size=int(expected * 1.5 + 10 * math.sqrt(expected) + 10))
    # a stationary start: the first gap is a uniform fraction of a full one
    gaps[0] *= rng.random()
    times = start + np.cumsum(gaps)
    return times[times < end]


def workload_from_rates(
    series: RateSeries,
    lengths: Workload,
    *,
    duration_seconds: float | None,
    mean_rate_per_second: float,
    seed: int,
) -> Workload:
    """The series' shape on [0, duration_seconds), at `mean_rate_per_second` on average, with
    (prompt, output) pairs drawn from `lengths`. `duration_seconds=None` keeps the series' own time
    scale (no stretch), up to the end of its last window."""
    if duration_seconds is None:
        duration_seconds = float(series.start_seconds[-1] + series.length_seconds[-1])
        stretch = 1.0
    else:
        stretch = duration_seconds / series.span_seconds if series.span_seconds > 0 else 0.0
    if duration_seconds <= 0 or mean_rate_per_second <= 0:
        raise ValueError("duration_seconds and mean_rate_per_second must be positive")
    if len(lengths) == 0:
        raise ValueError(f"the length source {lengths.name} holds no requests")
    total_rate = mean_rate(series)
    if total_rate <= 0:
        raise ValueError(f"{series.source}: every window has rate 0; no requests to replay")
    level = mean_rate_per_second / total_rate
    rng = np.random.default_rng([seed, 23])
    pieces = [
        renewal_arrivals(rng, start * stretch, (start + length) * stretch, rate * level, cv)
        for start, length, rate, cv in zip(
            series.start_seconds.tolist(),
            series.length_seconds.tolist(),
            series.rate_per_second.tolist(),
            series.cv.tolist(),
            strict=True,
        )
    ]
    arrivals = np.sort(np.concatenate(pieces)) if pieces else np.zeros(0)
    arrivals = arrivals[arrivals < duration_seconds]
    chosen = rng.integers(0, len(lengths), size=arrivals.size)
    note = (
        f"rates from {series.source}: {series.span_seconds:.0f} s of windows mapped onto "
        f"{duration_seconds:g} s (x{stretch:.3g} time), scaled to a mean of {mean_rate_per_second:g} req/s; "
        f"gaps gamma with each window's CV; (prompt, output) pairs drawn from {lengths.name}; seed {seed}"
    )
    return Workload(
        name=series.name,
        arrival_seconds=arrivals.astype(np.float64),
        input_tokens=lengths.input_tokens[chosen].astype(np.int64),
        output_tokens=lengths.output_tokens[chosen].astype(np.int64),
        notes=(note,),
    )


def days_of(series: RateSeries, first_day: int, days: int) -> RateSeries:
    """The windows that start within days [first_day, first_day + days) of the series, the clock
    restarted at the first day's midnight (second 0 of the series is taken as midnight).

    Why: the real-time suite replays whole days at the trace's own time scale, tuning on one day and
    reporting on the next, so it needs the days themselves, not the week squeezed onto a duration.
    """
    if first_day < 0 or days < 1:
        raise ValueError(f"days_of: first_day must be >= 0 and days >= 1, got {first_day} and {days}")
    start, end = first_day * 86400.0, (first_day + days) * 86400.0
    inside = (series.start_seconds >= start) & (series.start_seconds < end)
    if not inside.any() or series.start_seconds[-1] + series.length_seconds[-1] < end - 3600.0:
        raise ValueError(
            f"{series.source}: holds {series.span_seconds / 86400:.2f} days; days {first_day} to "
            f"{first_day + days - 1} are not all in it"
        )
    starts = series.start_seconds[inside] - start
    lengths = np.minimum(series.length_seconds[inside], end - start - starts)
    return RateSeries(
        f"{series.name}-days-{first_day}-{first_day + days - 1}",
        starts,
        lengths,
        series.rate_per_second[inside],
        series.cv[inside],
        f"{series.source}, days {first_day} to {first_day + days - 1}",
    )
