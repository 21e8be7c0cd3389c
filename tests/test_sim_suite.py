"""The suite's workloads: seeded flash crowds with one crowd in each half at the asked mean rate,
and every trace brought to the case's duration and level."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from goodput.simulator.config import build_setup
from goodput.simulator.suite import (
    SUITE_MODELS,
    ModelCase,
    TraceCase,
    case_duration_seconds,
    case_workload,
    flash_crowds,
)
from goodput.simulator.workload import Workload

SAMPLES = Path(__file__).resolve().parents[1] / "manifests" / "samples"
LENGTHS = Workload("lengths", np.arange(3.0), np.array([100, 200, 300]), np.array([10, 20, 30]))


def test_flash_crowds_keep_the_mean_and_crowd_each_half() -> None:
    crowd = flash_crowds(LENGTHS, 2000.0, 10.0, seed=4)
    assert abs(len(crowd) / 2000.0 - 10.0) < 0.6
    per_ten_seconds = np.bincount((crowd.arrival_seconds // 10).astype(int), minlength=200)
    first, second = per_ten_seconds[:100], per_ten_seconds[100:]
    for half in (first, second):
        assert half.max() > 2.5 * np.median(per_ten_seconds)
    assert (
        flash_crowds(LENGTHS, 2000.0, 10.0, seed=4).arrival_seconds.tolist() == crowd.arrival_seconds.tolist()
    )


def test_a_rate_trace_is_brought_to_the_case(tmp_path: Path) -> None:
    (tmp_path / "lengths.csv").write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        + "".join(f"2023-11-16 18:00:{second:02d},{100 + second},{10 + second}\n" for second in range(50))
    )
    (tmp_path / "servegen_t.csv").write_text(
        "window_start_s,window_len_s,sum_client_rate_rps,rate_weighted_mean_cv\n0,600,5,1\n600,600,15,1\n"
    )
    setup = build_setup(SAMPLES / "modelgroup-llama-8b-tp1.yaml", SAMPLES / "slopolicy-interactive.yaml")
    model = ModelCase("m", "", "", duration_seconds=400.0, mean_groups=2.0)
    trace = TraceCase("t", "rates", "servegen_t.csv", lengths_file="lengths.csv")
    workload = case_workload(trace, setup, model, tmp_path, seed=0, rate_per_group=3.0)
    assert workload.name == "t"
    assert abs(len(workload) / 400.0 - 6.0) < 0.8
    assert workload.arrival_seconds.max() < 400.0
    assert set(workload.class_names) == {"chat", "reasoning"}
    assert (workload.arrival_seconds >= 200).sum() > 2 * (workload.arrival_seconds < 200).sum()


@pytest.mark.parametrize(
    ("model", "expected_seconds"),
    [
        # 120 s ready, 300 s minimum lifetime: each 500 s half already holds both
        (SUITE_MODELS[0], 1000.0),
        # 600 s ready, 1,800 s minimum lifetime: each half must hold 2,400 s
        (SUITE_MODELS[1], 4800.0),
    ],
    ids=lambda value: value.name if isinstance(value, ModelCase) else None,
)
def test_each_half_of_a_case_holds_a_ready_time_and_a_minimum_lifetime(
    model: ModelCase, expected_seconds: float
) -> None:
    setup = build_setup(SAMPLES / model.modelgroup, SAMPLES / model.policy)
    assert case_duration_seconds(model, setup) == expected_seconds
