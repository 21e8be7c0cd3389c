"""Rate-only traces: the loaders name the file, column and line of bad input; a replay keeps the
series' shape at the chosen mean rate."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from goodput.simulator.rate_traces import RateSeries, load_rate_series, workload_from_rates
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
