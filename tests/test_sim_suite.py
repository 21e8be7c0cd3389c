"""The suite's workloads: whole days at the trace's own time scale, the busiest window at the model
case's level, seeded bursts on a diurnal base; and the baselines' settings read off the training day."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from goodput.simulator.config import build_setup
from goodput.simulator.envelope import CapacityEnvelope
from goodput.simulator.fair_bench import SUITE_POLICIES, SWEEPS, FairBench
from goodput.simulator.rate_traces import RateSeries
from goodput.simulator.suite import DAY_CASES, DayCase, ModelCase, bursts_on, case_workload, rate_at
from goodput.simulator.workload import Workload

SAMPLES = Path(__file__).resolve().parents[1] / "manifests" / "samples"
LENGTHS = Workload("lengths", np.arange(3.0), np.array([100, 200, 300]), np.array([10, 20, 30]))
DAY = 86400.0


def _two_day_trace(folder: Path) -> None:
    """Lengths, and a ServeGen-shaped series of two days: 1 req/s by night (00-08), 3 by day."""
    (folder / "lengths.csv").write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        + "".join(f"2023-11-16 18:00:{second:02d},{100 + second},{10 + second}\n" for second in range(50))
    )
    rows = "".join(
        f"{start},3600,{1 if (start % 86400) < 8 * 3600 else 3},1\n" for start in range(0, 2 * 86400, 3600)
    )
    (folder / "servegen_t.csv").write_text(
        "window_start_s,window_len_s,sum_client_rate_rps,rate_weighted_mean_cv\n" + rows
    )


def test_a_case_replays_its_days_second_for_second_at_the_peak_level(tmp_path: Path) -> None:
    _two_day_trace(tmp_path)
    setup = build_setup(SAMPLES / "modelgroup-llama-8b-tp1.yaml", SAMPLES / "slopolicy-interactive.yaml")
    model = ModelCase("m", "", "", peak_groups=0.1)
    case = DayCase("t", "servegen_t.csv", lengths_file="lengths.csv", train_day=0)
    workload = case_workload(case, setup, model, tmp_path, seed=0, rate_per_group=2.0)
    assert workload.name == "t"
    # the busiest window at 0.1 groups of 2 req/s: 0.2 req/s by day, a third of it by night
    arrivals = workload.arrival_seconds
    day_hours = ((arrivals % DAY) >= 8 * 3600).sum() / (2 * 16 * 3600)
    night_hours = ((arrivals % DAY) < 8 * 3600).sum() / (2 * 8 * 3600)
    assert day_hours == pytest.approx(0.2, rel=0.05)
    assert night_hours == pytest.approx(0.2 / 3, rel=0.1)
    assert 2 * DAY - 600 < workload.span_seconds < 2 * DAY  # no compression: two days last two days
    assert set(workload.class_names) == {"chat", "reasoning"}


def test_bursts_stand_on_the_diurnal_base_by_day() -> None:
    series = RateSeries(
        "s", np.array([0.0, 43200.0]), np.array([43200.0, 43200.0]), np.array([1.0, 2.0]), np.ones(2), "t"
    )
    base = Workload(
        "base", np.sort(np.random.default_rng(1).uniform(0, DAY, 1000)), np.ones(1000), np.ones(1000)
    )
    burst = bursts_on(base, series, 1.0, LENGTHS, bursts_per_day=3, seed=5)
    added = len(burst) - len(base)
    assert added > 0
    assert np.all(np.diff(burst.arrival_seconds) >= 0)
    extra = np.setdiff1d(burst.arrival_seconds, base.arrival_seconds)
    assert np.all((extra >= 8 * 3600) & (extra < 20 * 3600 + 180))
    assert "bursts (seed 5)" in burst.notes[-1]
    again = bursts_on(base, series, 1.0, LENGTHS, bursts_per_day=3, seed=5)
    assert again.arrival_seconds.tolist() == burst.arrival_seconds.tolist()


@pytest.mark.parametrize(("seconds", "expected"), [(0.0, 1.0), (43199.0, 1.0), (43200.0, 2.0), (DAY, 0.0)])
def test_rate_at_reads_the_window_holding_the_time(seconds: float, expected: float) -> None:
    series = RateSeries(
        "s", np.array([0.0, 43200.0]), np.array([43200.0, 43200.0]), np.array([1.0, 2.0]), np.ones(2), "t"
    )
    assert rate_at(series, seconds) == expected


def test_every_suite_case_trains_on_a_day_and_every_policy_has_a_sweep() -> None:
    assert all(case.days >= 2 for case in DAY_CASES)
    assert {"azure-code-2024", "azure-conv-2024", "servegen-m-large"} <= {case.name for case in DAY_CASES}
    assert any(case.bursts_per_day for case in DAY_CASES)
    assert set(SUITE_POLICIES) <= set(SWEEPS)


def test_the_cron_floor_and_the_fixed_fleet_are_read_off_the_training_day(tmp_path: Path) -> None:
    _two_day_trace(tmp_path)
    setup = build_setup(SAMPLES / "modelgroup-llama-8b-tp1.yaml", SAMPLES / "slopolicy-interactive.yaml")
    model = ModelCase("m", "", "", peak_groups=0.1)
    case = DayCase("t", "servegen_t.csv", lengths_file="lengths.csv", train_day=0)
    workload = case_workload(case, setup, model, tmp_path, seed=0, rate_per_group=2.0)
    envelope = CapacityEnvelope(
        work_seconds_per_second=1.0, requests_per_second=2.0, attainment_goal=0.99, trials=0
    )
    bench = FairBench(setup, workload, measured_envelope=envelope)
    need = bench.groups_needed_per_minute()
    assert need.size == pytest.approx(DAY / 60, abs=2)
    # by day the minutes need three times what they need by night
    assert need[8 * 60 :].mean() == pytest.approx(3 * need[: 8 * 60].mean(), rel=0.1)
    assert bench.hourly_cron_floor() == (1,) * 24  # well under a group in every hour
    # a floor of one all day is still a cron schedule the policy runs with
    assert str(bench.policy("keda-cron-queue", 24.0).describe()["cron"]).startswith("0-1 h: 1, 1-2 h: 1")
    assert bench.fixed_groups_at(1.0) == max(setup.min_groups, int(np.ceil(need.max() - 1e-9)))
    assert bench.fixed_groups_at(need.max() / 3) == 3
    with pytest.raises(ValueError, match="load at the peak must be positive"):
        bench.fixed_groups_at(0.0)
