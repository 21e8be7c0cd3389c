"""Rate-only traces: the loaders name the file, column and line of bad input; a replay keeps the
series' shape at the chosen mean rate."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from goodput.simulator.rate_traces import RateSeries, days_of, load_rate_series, workload_from_rates
from goodput.simulator.workload import Workload, load_trace

LENGTHS = Workload(
    name="lengths",
    arrival_seconds=np.arange(4, dtype=np.float64),
    input_tokens=np.array([100, 200, 300, 400]),
    output_tokens=np.array([10, 20, 30, 40]),
)


def test_servegen_rows_load(tmp_path: Path) -> None:
    path = tmp_path / "servegen_x.csv"
    path.write_text(
        "window_start_s,window_len_s,sum_client_rate_rps,active_clients,rate_weighted_mean_cv\n"
        "0,600,10,3,1.5\n600,600,30,3,0.5\n"
    )
    series = load_rate_series(path)
    assert series.rate_per_second.tolist() == [10.0, 30.0]
    assert series.cv.tolist() == [1.5, 0.5]
    assert series.span_seconds == 1200.0


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("servegen_a.csv", "window_start_s,window_len_s\n0,600\n", "lacks column.*sum_client_rate_rps"),
        (
            "servegen_b.csv",
            "window_start_s,window_len_s,sum_client_rate_rps,rate_weighted_mean_cv\n0,600,fast,1\n",
            "line 2: column sum_client_rate_rps is 'fast'",
        ),
        ("azure2024_c.csv", "approx_time_utc,req_per_min_mid\n", "no rows"),
        ("other.csv", "a\n1\n", "unknown rate trace"),
    ],
)
def test_bad_rate_traces_name_the_field(tmp_path: Path, name: str, text: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_rate_series(path)


def test_a_missing_request_trace_is_named() -> None:
    with pytest.raises(ValueError, match="no such trace file"):
        load_trace("/nonexistent/trace.csv")


def test_a_request_trace_without_a_column_names_it(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:17:03,10\n")
    with pytest.raises(ValueError, match="GeneratedTokens"):
        load_trace(str(path))


def test_the_replay_keeps_the_shape_at_the_mean_rate() -> None:
    series = RateSeries(
        "s",
        np.array([0.0, 100.0]),
        np.array([100.0, 100.0]),
        np.array([1.0, 3.0]),
        np.array([1.0, 1.0]),
        "test",
    )
    replay = workload_from_rates(series, LENGTHS, duration_seconds=2000.0, mean_rate_per_second=4.0, seed=3)
    first = int((replay.arrival_seconds < 1000.0).sum())
    second = len(replay) - first
    assert abs(len(replay) / 2000.0 - 4.0) < 0.4
    assert 2.4 < second / first < 3.8
    assert set(replay.input_tokens.tolist()) <= {100, 200, 300, 400}


def _hourly_week() -> RateSeries:
    """Seven days of hourly windows; the rate is 1 + the day's number, so a day is known by its rate."""
    starts = np.arange(7 * 24, dtype=np.float64) * 3600.0
    return RateSeries(
        "week",
        starts,
        np.full(starts.size, 3600.0),
        1.0 + starts // 86400.0,
        np.ones(starts.size),
        "test",
    )


def test_days_are_cut_at_midnight_with_the_clock_restarted() -> None:
    days = days_of(_hourly_week(), 2, 2)
    assert days.start_seconds[0] == 0.0
    assert days.span_seconds == 2 * 86400.0
    assert sorted(set(days.rate_per_second.tolist())) == [3.0, 4.0]


def test_a_real_time_replay_keeps_the_series_time_scale() -> None:
    days = days_of(_hourly_week(), 1, 2)
    replay = workload_from_rates(days, LENGTHS, duration_seconds=None, mean_rate_per_second=0.25, seed=1)
    # day 1 at rate 2 and day 2 at rate 3 (levelled by 0.25 / 2.5): the second day holds 1.5x the first
    first = int((replay.arrival_seconds < 86400.0).sum())
    assert 1.35 < (len(replay) - first) / first < 1.65
    assert 86000.0 < replay.span_seconds < 2 * 86400.0
    assert "x1 time" in replay.notes[0]


@pytest.mark.parametrize(("first", "count"), [(6, 2), (7, 1), (-1, 1), (0, 0)])
def test_days_outside_the_series_are_an_error(first: int, count: int) -> None:
    with pytest.raises(ValueError, match="days"):
        days_of(_hourly_week(), first, count)
