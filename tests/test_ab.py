"""The A/B table: each figure counted from a run's report, the same way for every policy."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import yaml

from goodput.simulator.envelope import CapacityEnvelope
from goodput.simulator.goodput_policy import GoodputPolicy
from goodput.simulator.workload import Workload
from goodput.testbed import ab, demo
from goodput.testbed.ab import (
    AbRow,
    SimulatedRun,
    ab_row,
    burst_start,
    burst_to_capacity,
    held_gpu_hours,
    render_comparison,
    render_table,
    replica_changes,
    simulated_rows,
)
from goodput.testbed.cluster.binaries import repository_root


def sample(offset: float, wanted: int, ready: int, held: int | None = None) -> dict[str, Any]:
    return {
        "offset_seconds": offset, "desired_groups": wanted, "ready_groups": ready,
        "held_groups": ready if held is None else held,
    }  # fmt: skip


@dataclass(frozen=True)
class BurstCase:
    name: str
    samples: list[dict[str, Any]]
    start: float
    expected: float | None


BURST_CASES = [
    BurstCase("a second group ready 25 s into the burst",
              [sample(0, 1, 1), sample(60, 1, 1), sample(70, 2, 1), sample(85, 2, 2)], 60, 25),
    BurstCase("groups ready before the burst do not count",
              [sample(0, 2, 2), sample(60, 2, 2), sample(90, 2, 2)], 60, None),
    BurstCase("counted from the ready groups at the burst's start, not at the run's",
              [sample(0, 1, 1), sample(50, 2, 2), sample(61, 3, 2), sample(80, 3, 3)], 60, 20),
    BurstCase("no sample before the burst: unknown", [sample(61, 1, 1), sample(70, 2, 2)], 60, None),
]  # fmt: skip


@pytest.mark.parametrize("case", BURST_CASES, ids=[c.name for c in BURST_CASES])
def test_burst_to_capacity(case: BurstCase) -> None:
    assert burst_to_capacity(case.samples, case.start) == case.expected


def test_scale_events_are_changes_of_the_wanted_count_whoever_made_them() -> None:
    samples = [sample(t, wanted, 1) for t, wanted in enumerate([1, 1, 2, 3, 3, 2, 2, 1, 2])]
    assert replica_changes(samples) == (3, 2)
    assert replica_changes(samples, end_seconds=5) == (2, 1)  # what settles after the window is left out
    assert replica_changes([]) == (0, 0)


def test_the_burst_starts_after_the_phases_before_it() -> None:
    phases = [
        {"name": "before", "seconds": 60},
        {"name": "burst", "seconds": 75},
        {"name": "after", "seconds": 9},
    ]
    assert burst_start(phases) == 60
    assert burst_start([{"name": "steady", "seconds": 60}]) is None


def report(*, attained: int, samples: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "scenario": {
            "phases": [{"name": "before", "seconds": 10}, {"name": "burst", "seconds": 20}],
            "targets": {"ttft_seconds": 1.0},
        },
        "timeline": [
            {"start_seconds": 0, "ttft_p99_seconds": 0.2},
            {"start_seconds": 10, "ttft_p99_seconds": None},
        ],
        "summary": {
            "offered": 100, "attained": attained, "gpu_hours": 99.0, "gpus_per_group": 2,
            "attainment_offered": attained / 100, "lost_on_drained_groups": 1, "failed": 2,
        },
        "samples": samples,
    }  # fmt: skip


def test_a_row_reads_the_report_of_its_run_and_counts_gpu_hours_over_the_offered_window() -> None:
    # One group held 15 s, then two until the 30 s window ends (the settling after it, and its scale-in,
    # are not counted): 45 group-seconds of 2 GPUs.
    samples = [sample(0, 1, 1), sample(15, 2, 2), sample(40, 1, 1)]
    row = ab_row("keda", report(attained=90, samples=samples))
    assert row == AbRow(
        policy="keda", offered=100, slo_met=90, gpu_hours=pytest.approx(90 / 3600), attainment_offered=0.9,
        scale_outs=1, scale_ins=0, burst_to_capacity_seconds=5, lost_in_scale_in=1, failed=2,
    )  # fmt: skip
    assert row.slo_met_per_gpu_hour == pytest.approx(3600)


def test_groups_starting_count_as_held() -> None:
    assert held_gpu_hours([sample(0, 2, 1, held=2), sample(1800, 2, 2)], 1, 3600) == pytest.approx(2.0)
    assert held_gpu_hours([], 1, 3600) == 0.0


def test_the_table_has_a_row_per_policy_and_says_none_added_and_dash_plainly() -> None:
    rows = [
        ab_row("goodput", report(attained=95, samples=[sample(0, 1, 1), sample(15, 2, 2)])),
        ab_row("hpa", report(attained=0, samples=[])),
    ]
    table = render_table(rows).splitlines()
    assert len(table) == 4
    assert table[2].startswith("| goodput | 3,800 | 95.0% | 95 / 100 | 0.025 | 1 / 0 | 5 s | 1 | 2 |")
    assert table[3].startswith("| hpa | - | 0.0% | 0 / 100 | 0.000 | 0 / 0 | none added |")


def test_the_comparison_states_the_simulators_error_against_the_live_run() -> None:
    live = [ab_row("keda", report(attained=90, samples=[sample(0, 1, 1), sample(15, 2, 2)]))]
    simulated = [replace(live[0], slo_met=99)]
    (line,) = render_comparison(live, simulated).splitlines()[2:]
    assert line == "| keda | 3,600 | 3,960 | +10% | 90.0% | 90.0% | 0.025 | 0.025 |"


def test_the_simulator_replays_the_window_for_every_policy_on_the_demos_manifests() -> None:
    count = 300
    run = demo_run(
        steady_workload(count), goodput_envelope=ENVELOPE, thresholds={"goodput": 0.8, "keda": 0.5, "hpa": 60}
    )
    rows = simulated_rows(run, ["goodput", "keda", "hpa"])
    assert [row.policy for row in rows] == ["goodput", "keda", "hpa"]
    for row in rows:
        assert row.offered == count and 0 <= row.slo_met <= count
        assert row.gpu_hours >= 120 / 3600  # at least the minimum of one group for the whole window


def demo_run(workload: Workload, **changes: Any) -> SimulatedRun:
    manifests = repository_root() / "manifests" / "demo"
    run = SimulatedRun(
        model_group_path=manifests / "modelgroup-demo.yaml", policy_path=manifests / "slopolicy-demo.yaml",
        workload=workload, offered_seconds=120, burst_start_seconds=60, thresholds={"keda": 0.5, "hpa": 60},
    )  # fmt: skip
    return replace(run, **changes)


ENVELOPE = CapacityEnvelope(0.1, 1.5, 0.99, 14, groups=4, repeats=2)


def test_every_policy_gets_the_cheapest_setting_that_met_the_target_on_the_training_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # (attainment, GPU-hours) the simulator gives each setting on the training window.
    figures = {
        ("goodput", 0.8): (1.0, 0.19), ("goodput", 1.0): (0.83, 0.17), ("goodput", 1.25): (0.83, 0.16),
        ("goodput", 0.89): (0.99, 0.18), ("goodput", 0.94): (0.90, 0.175),  # the edge, bisected twice
        ("keda", 0.5): (1.0, 0.30), ("keda", 1.0): (0.995, 0.20), ("keda", 3.0): (0.90, 0.10),
        ("keda", 1.7): (0.97, 0.15), ("keda", 1.3): (0.99, 0.17),
        ("hpa", 60): (0.97, 0.30), ("hpa", 80): (0.98, 0.25), ("hpa", 95): (0.50, 0.05),
        ("hpa", 45): (0.96, 0.30),  # past the safe end, in whole percent: no more GPU-hours, the end
    }  # fmt: skip

    def simulated(run: SimulatedRun, policy: str, setting: float) -> AbRow:
        attainment, gpu_hours = figures[(policy, setting)]
        return AbRow(policy, 1000, round(1000 * attainment), gpu_hours, attainment, 1, 0, None, 0, 0)

    monkeypatch.setattr(ab, "_simulated_with", simulated)
    training = demo_run(steady_workload(), goodput_envelope=ENVELOPE)
    tunings = ab.tune_policies(training, target_attainment=0.99)
    assert (tunings["goodput"].chosen, tunings["goodput"].met_target) == (0.89, True)
    assert tunings["goodput"].settings == (0.8, 1.0, 1.25, 0.89, 0.94)
    assert (tunings["keda"].chosen, tunings["keda"].met_target) == (1.3, True)
    # None met 0.99: the best attainment, and the report says so.
    assert (tunings["hpa"].chosen, tunings["hpa"].met_target) == (80, False)
    assert tunings["hpa"].settings == (60, 80, 95, 45)
    text = ab.render_tuning(tunings, ENVELOPE)
    assert "goodput's envelope there: 0.1 work-s/s per group (1.5 req/s; 4 groups, 2 repeats)" in text
    assert "goodput: 0.89 (met the target)" in text
    assert "keda: 1.3 (met the target)" in text
    assert "hpa: 80 (none met the target: best attainment)" in text
    assert "95: 50.0% on 0.050 GPU-h, 45: 96.0% on 0.300 GPU-h" in text
    # Without an envelope goodput is not swept, and the account says why.
    untuned = ab.tune_policies(replace(training, goodput_envelope=None), target_attainment=0.99)
    assert list(untuned) == ["keda", "hpa"]
    assert "goodput: no envelope measured (no feasible request)" in ab.render_tuning(
        untuned, "no feasible request"
    )


def steady_workload(count: int = 300, seconds: float = 120.0) -> Workload:
    rng = np.random.default_rng(3)
    return Workload(
        "steady", np.sort(rng.uniform(0, seconds, count)), np.full(count, 500, dtype=np.int64),
        np.full(count, 100, dtype=np.int64),
    )  # fmt: skip


@pytest.mark.parametrize("factor", [0.8, 1.0, 1.25])
def test_the_simulated_goodput_runs_on_its_envelope_times_the_chosen_factor(factor: float) -> None:
    run = demo_run(steady_workload(), goodput_envelope=ENVELOPE, thresholds={"goodput": factor})
    setup, workload, _ = ab.simulation_inputs(run)
    policy = ab.simulated_autoscaler("goodput", run, setup, workload)
    assert isinstance(policy, GoodputPolicy)
    assert policy.profile.reference.work_per_second == pytest.approx(0.1 * factor)
    assert run.goodput_capacity() == pytest.approx(0.1 * factor)


def test_without_an_envelope_goodput_runs_on_the_manifests_profile() -> None:
    run = demo_run(steady_workload())
    setup, workload, _ = ab.simulation_inputs(run)
    policy = ab.simulated_autoscaler("goodput", run, setup, workload)
    assert isinstance(policy, GoodputPolicy)
    assert run.goodput_capacity() is None
    assert policy.profile.reference.work_per_second != pytest.approx(0.1)


def test_the_tuned_capacity_goes_into_the_modelgroup_every_run_applies(tmp_path: Path) -> None:
    source = repository_root() / "manifests" / "demo"
    written = ab.capacity_manifests(source, tmp_path / "manifests", 0.0751970680886419)
    objects = demo.read_manifests(written)  # still one valid ModelGroup, SLOPolicy and Service
    assert [path.name for path in objects.files] == sorted(path.name for path in source.glob("*.yaml"))
    (group,) = [doc for doc in yaml.safe_load_all((written / "modelgroup-demo.yaml").read_text()) if doc]
    original = yaml.safe_load((source / "modelgroup-demo.yaml").read_text())
    assert group["spec"]["profile"] == {**original["spec"]["profile"], "capacityWorkSecondsPerSecond": 0.0752}
    assert {**group, "spec": {**group["spec"], "profile": original["spec"]["profile"]}} == original
    policy = yaml.safe_load((written / "slopolicy-demo.yaml").read_text())
    assert policy == yaml.safe_load((source / "slopolicy-demo.yaml").read_text())


def test_a_policy_whose_run_failed_is_reported_with_its_reason_beside_the_others(tmp_path: Path) -> None:
    live = ab.LiveRuns()
    (tmp_path / "goodput").mkdir()
    samples = [sample(0, 1, 1), sample(15, 2, 2)]
    (tmp_path / "goodput" / "demo.json").write_text(json.dumps(report(attained=95, samples=samples)))
    assert live.record("goodput", (0, None), tmp_path / "goodput")
    reason = "keda: HPA keda-hpa-llama-8b-waiting cannot scale: FailedGetExternalMetric: no metric"
    assert live.record("keda", (1, reason), tmp_path / "keda")
    assert live.record("hpa", (1, None), tmp_path / "hpa")
    assert not live.record("kpa", (ab.INTERRUPTED, "interrupted"), tmp_path / "kpa")
    assert list(live.reports) == ["goodput"]
    assert live.failures == {"keda": reason, "hpa": "exit code 1"}
    ab.write_results(tmp_path, live, [], {}, "settings chosen on the training window: none")
    table = (tmp_path / "ab.md").read_text()
    assert "| goodput | 3,800 |" in table
    assert f"  keda: {reason}" in table and "  hpa: exit code 1" in table
    assert json.loads((tmp_path / "ab.json").read_text())["failed"] == live.failures
    assert (tmp_path / "ab.png").read_bytes().startswith(b"\x89PNG")  # the runs that gave a report


def test_an_interrupted_run_ends_the_ab_run_there_without_a_table(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ran: list[str] = []

    def run_policy(args: argparse.Namespace) -> tuple[int, str | None]:
        ran.append(args.scaler)
        if args.scaler == "keda":
            return ab.INTERRUPTED, "interrupted"
        args.out.mkdir(parents=True)
        (args.out / "demo.json").write_text(json.dumps(report(attained=95, samples=[sample(0, 1, 1)])))
        return 0, None

    window = demo_run(steady_workload())
    monkeypatch.setattr(ab, "RUN_POLICY", run_policy)
    monkeypatch.setattr(ab, "tuned_test_window", lambda args, cleanup: (window, {}, "settings: none"))
    monkeypatch.setattr(ab, "_cluster", lambda args, cleanup: SimpleNamespace(state_dir=tmp_path))
    parser = argparse.ArgumentParser()
    ab.add_arguments(parser)
    assert ab.run(parser.parse_args(["--out", str(tmp_path / "ab")])) == ab.INTERRUPTED
    assert ran == ["goodput", "keda"]  # the HPA's run is not started
    assert not (tmp_path / "ab" / "ab.md").exists()
