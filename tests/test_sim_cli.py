"""`goodput simulate` and `goodput bench` end to end on a small synthetic workload."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from goodput.operator.cli import main

TRACE = "synthetic:rate=6,duration=240,burst_start=120,burst_seconds=60,burst_multiplier=3"

MODEL_GROUP = """
apiVersion: goodput.dev/v1alpha1
kind: ModelGroup
metadata: {name: llama-8b}
spec:
  model: {name: meta-llama/Llama-3.1-8B-Instruct}
  engine: {image: vllm/vllm-openai:v0.33.0}
  parallelism: {tensor: 1, pipeline: 1, gpusPerPod: 1}
  minReplicas: 1
  maxReplicas: 4
  policyRef: {name: chat}
  profile: {gpu: h100-80g, readyTimeSeconds: 45}
"""

POLICY = """
apiVersion: goodput.dev/v1alpha1
kind: SLOPolicy
metadata: {name: chat}
spec:
  revision: chat-1
  classes:
  - {name: chat, ttftSeconds: 1.0, itlSeconds: 0.1, attainment: 0.95}
"""

REQUIRED_KEYS = (
    "offered_requests",
    "admitted_requests",
    "slo_met_requests",
    "attainment_offered",
    "attainment_admitted",
    "goodput_rps",
    "gpu_hours",
    "cost_per_slo_request",
    "scale_events",
)


@pytest.fixture
def manifests(tmp_path: Path) -> tuple[Path, Path]:
    model_group, policy = tmp_path / "mg.yaml", tmp_path / "slo.yaml"
    model_group.write_text(MODEL_GROUP)
    policy.write_text(POLICY)
    return model_group, policy


def test_simulate_writes_the_report_and_its_plot(
    tmp_path: Path, manifests: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    model_group, policy = manifests
    out = tmp_path / "run"
    code = main(
        [
            "simulate",
            "--trace",
            TRACE,
            "--modelgroup",
            str(model_group),
            "--policy",
            str(policy),
            "--autoscaler",
            "hpa",
            "--out",
            str(out),
            "--seed",
            "2",
            "--no-progress",
        ]
    )
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    assert all(key in report for key in REQUIRED_KEYS)
    assert report["offered_requests"] > 1000
    assert report["config"]["ready_time_median_seconds"] == 45.0
    assert report["config"]["policy_revision"] == "chat-1"
    assert any("seed=2" in note for note in report["workload"]["notes"])
    assert (out / "timeline.png").stat().st_size > 10_000
    assert "hpa:" in capsys.readouterr().out


def test_bench_runs_every_chosen_policy_on_the_same_workload(
    tmp_path: Path, manifests: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    model_group, policy = manifests
    out = tmp_path / "bench"
    code = main(
        [
            "bench",
            "--trace",
            TRACE,
            "--modelgroup",
            str(model_group),
            "--policy",
            str(policy),
            "--out",
            str(out),
            "--policies",
            "fixed,oracle,goodput",
            "--capacity-trial-seconds",
            "120",
            "--no-progress",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    for name in ("fixed", "oracle", "goodput"):
        assert name in printed
        report = json.loads((out / name / "report.json").read_text())
        assert (
            report["offered_requests"]
            == json.loads((out / "fixed" / "report.json").read_text())["offered_requests"]
        )
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["policies"]) == {"fixed", "oracle", "goodput"}
    assert (out / "comparison.png").exists()


def test_a_window_of_the_trace_is_replayed_from_its_start(
    tmp_path: Path, manifests: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """`--start-seconds 120 --duration-seconds 60` replays the burst minute alone: about 18 req/s."""
    model_group, policy = manifests
    out = tmp_path / "window"
    arguments = ["--trace", TRACE, "--modelgroup", str(model_group), "--policy", str(policy), "--no-progress"]
    window = ["--start-seconds", "120", "--duration-seconds", "60"]
    code = main(
        ["simulate", *arguments, *window, "--autoscaler", "fixed", "--fixed-groups", "2", "--out", str(out)]
    )
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    assert report["config"]["start_seconds"] == 120.0
    assert report["offered_window_seconds"] == 60.0
    assert report["offered_requests"] == pytest.approx(18 * 60, rel=0.15)
    assert any(note.startswith("window [120, 180)") for note in report["workload"]["notes"])
    capsys.readouterr()


def test_an_unknown_policy_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "--trace", TRACE, "--out", str(tmp_path), "--policies", "fixed,magic"])
    assert code == 2
    assert "magic" in capsys.readouterr().err


def test_bench_behind_the_gateway_counts_what_it_refused(
    tmp_path: Path, manifests: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """At twice what one fixed group serves, the gateway refuses some requests and says so."""
    model_group, policy = manifests
    out = tmp_path / "gateway"
    arguments = ["--trace", "synthetic:rate=40,duration=60", "--modelgroup", str(model_group)]
    code = main(
        [
            "bench",
            *arguments,
            "--policy",
            str(policy),
            "--policies",
            "fixed",
            "--fixed-groups",
            "1",
            "--gateway",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert code == 0
    assert "refused" in capsys.readouterr().out
    report = json.loads((out / "fixed" / "report.json").read_text())
    gateway = report["gateway"]
    assert report["config"]["gateway"] is True
    assert gateway["offered"] == report["offered_requests"]
    assert gateway["rejected"] > 0
    assert report["rejected_requests"]["admission"] == gateway["rejected"] + gateway["hold_expired"]


def test_the_gateway_needs_both_manifests(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", "--trace", TRACE, "--out", str(tmp_path), "--gateway", "--no-progress"])
    assert code == 2
    assert "--gateway needs --modelgroup and --policy" in capsys.readouterr().err


def test_simulate_runs_a_fixed_fleet_on_the_batched_engine(
    tmp_path: Path, manifests: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    model_group, policy = manifests
    out = tmp_path / "batched"
    common = ["simulate", "--trace", TRACE, "--modelgroup", str(model_group), "--policy", str(policy)]
    code = main(
        [*common, "--autoscaler", "fixed", "--fixed-groups", "3", "--engine", "batched", "--out", str(out)]
    )
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    assert report["config"]["engine"] == "batched"
    assert report["config"]["initial_groups"] == 3
    assert report["finished_requests"] == report["offered_requests"] > 1000
    assert report["gpu_hours"] == pytest.approx(3 * report["offered_window_seconds"] / 3600)
    assert "fixed:" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--autoscaler", "goodput"], "--autoscaler goodput"),
        (["--autoscaler", "fixed", "--fail-at", "30"], "failures"),
        (["--autoscaler", "fixed", "--tick-seconds", "5"], "--tick-seconds"),
    ],
    ids=["a scaling policy", "failures", "a tick too long"],
)
def test_the_batched_engine_refuses_what_it_does_not_model(
    tmp_path: Path,
    manifests: tuple[Path, Path],
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    named: str,
) -> None:
    model_group, policy = manifests
    common = ["simulate", "--trace", TRACE, "--modelgroup", str(model_group), "--policy", str(policy)]
    code = main([*common, *extra, "--engine", "batched", "--out", str(tmp_path / "refused")])
    assert code == 2
    assert named in capsys.readouterr().err
    assert not (tmp_path / "refused" / "report.json").exists()


def test_simulate_takes_a_baseline_and_its_settings_by_name(
    tmp_path: Path, manifests: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    model_group, policy = manifests
    out = tmp_path / "run"
    code = main(
        [
            "simulate",
            "--trace",
            TRACE,
            "--modelgroup",
            str(model_group),
            "--policy",
            str(policy),
            "--baseline",
            "keda-cron-queue",
            "--baseline-setting",
            "target=20",
            "--baseline-setting",
            "cron=0-24:3",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    parameters = report["config"]["autoscaler_parameters"]
    assert parameters["target_average_value"] == 20.0
    assert parameters["cron"] == "0-24 h: 3"
    # the cron floor of 3 holds from the first sync on, whatever the queue says
    assert max(event["to_groups"] for event in report["scale_events"]) == 3
    assert "keda-cron-queue:" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--baseline", "hpa-running", "--baseline-setting", "targt=4"], "has no setting 'targt'"),
        (
            ["--baseline", "hpa-running", "--baseline-setting", "target=four"],
            "target: 'four' is not a number",
        ),
        (["--baseline-setting", "target=4"], "--baseline-setting needs --baseline NAME"),
        (["--baseline", "kpa", "--autoscaler", "hpa"], "name two policies"),
    ],
)
def test_a_bad_baseline_setting_is_refused_naming_it(
    tmp_path: Path, arguments: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["simulate", "--trace", TRACE, "--out", str(tmp_path), "--no-progress", *arguments])
    assert code == 2
    assert message in capsys.readouterr().err
