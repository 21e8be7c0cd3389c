"""The fair benchmark's rules: one sweep rule for every policy, a split that refuses an empty
window, and the attainment target judged on feasible requests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from goodput.simulator.config import build_setup
from goodput.simulator.fair_bench import Outcome, cheapest_meeting_target, meets_target
from goodput.simulator.feasible import Feasibility
from goodput.simulator.report import ClassTargets
from goodput.simulator.workload import Workload

SAMPLES = Path(__file__).resolve().parents[1] / "manifests" / "samples"


def outcome(setting: float, gpu_hours: float, met: int, meets: bool) -> Outcome:
    return Outcome(setting, gpu_hours, offered=100, feasible=100, met=met, meets_target=meets)


@dataclass(frozen=True)
class SweepCase:
    name: str
    sweep: tuple[Outcome, ...]
    chosen_setting: float
    met_target: bool


SWEEP_CASES = [
    SweepCase(
        "cheapest of those meeting",
        (outcome(0.5, 3.0, 99, True), outcome(0.8, 2.0, 99, True), outcome(0.95, 1.0, 90, False)),
        0.8,
        True,
    ),
    SweepCase(
        "none meets: best attainment",
        (outcome(1.0, 1.0, 80, False), outcome(3.0, 2.0, 95, False)),
        3.0,
        False,
    ),
    SweepCase(
        "tie on cost: smaller setting", (outcome(2.0, 1.0, 99, True), outcome(1.0, 1.0, 99, True)), 1.0, True
    ),
]


@pytest.mark.parametrize("case", SWEEP_CASES, ids=lambda case: case.name)
def test_the_sweep_rule(case: SweepCase) -> None:
    chosen, met = cheapest_meeting_target(case.sweep)
    assert (chosen.setting, met) == (case.chosen_setting, case.met_target)


def test_an_empty_sweep_is_an_error() -> None:
    with pytest.raises(ValueError, match="empty sweep"):
        cheapest_meeting_target(())


def test_the_target_ignores_infeasible_requests_and_counts_the_rest() -> None:
    classes = (ClassTargets("chat", 1.0, 0.075, attainment=0.9),)
    workload = Workload(
        "w", np.arange(10.0), np.ones(10, np.int64), np.ones(10, np.int64), class_index=np.zeros(10, np.int64)
    )
    feasible = np.array([True] * 9 + [False])
    met = np.array([True] * 8 + [False, False])
    assert not meets_target(met, Feasibility(feasible, ()), workload, classes)  # 8/9 < 0.9
    met[8] = True
    assert meets_target(met, Feasibility(feasible, ()), workload, classes)  # 9/9, the infeasible one aside


def test_a_window_with_no_requests_is_named() -> None:
    from goodput.simulator.fair_bench import FairBench

    setup = build_setup(SAMPLES / "modelgroup-llama-8b-tp1.yaml", SAMPLES / "slopolicy-interactive.yaml")
    arrivals = np.array([400.0, 500.0, 1000.0])  # a quiet opening: nothing before 300 s
    workload = Workload("gappy", arrivals, np.full(3, 100), np.full(3, 10), class_index=np.zeros(3, np.int64))
    with pytest.raises(ValueError, match="the training window of gappy holds no requests"):
        FairBench(setup, workload, train_fraction=0.3)
