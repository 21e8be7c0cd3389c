"""`goodput ab`, shortened, on the session's cluster: goodput, the real KEDA and the real HPA each
size the demo's ModelGroup under the same replay, and one table holds every policy, live and
simulated. Run as a user runs it (the CLI, its own process), in namespaces and a Helm release of its
own."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from pathlib import Path

import yaml

from goodput.testbed.cluster.controlplane import LocalCluster
from goodput.testbed.cluster.testing import wait_for

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# 20 s steady, a 45 s burst at about three times the rate, 20 s steady; the count is not waited back
# down (the HPA holds its scale-down for 300 s).
SHORT = [
    "--before-seconds", "20", "--burst-seconds", "45", "--after-seconds", "20",
    "--interval-seconds", "5", "--engine-load-seconds", "3", "--settle-seconds", "5",
]  # fmt: skip


def test_a_short_ab_run_gives_every_policy_a_live_and_a_simulated_row(
    cluster: LocalCluster, goodput_crds: list[str], tmp_path: Path
) -> None:
    suffix = secrets.token_hex(3)
    out = tmp_path / "ab"
    argv = [
        sys.executable, "-m", "goodput.operator.cli", "ab", "--cluster-state-dir", str(cluster.state_dir),
        "--out", str(out), "--namespace", f"e2e-ab-{suffix}", "--release", f"gp-ab-{suffix}",
        "--release-namespace", f"e2e-ab-{suffix}-op", *SHORT,
    ]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
    assert result.returncode == 0, f"goodput ab failed ({result.returncode}):\n{result.stdout[-5000:]}"
    document = json.loads((out / "ab.json").read_text())
    live = {row["policy"]: row for row in document["live"]}
    simulated = {row["policy"]: row for row in document["simulated"]}
    assert list(live) == list(simulated) == ["goodput", "keda", "hpa"]
    for policy, row in live.items():
        assert row["offered"] > 0 and row["offered"] == simulated[policy]["offered"], (policy, row)
        assert row["gpu_hours"] > 0 and 0 <= row["slo_met"] <= row["offered"], (policy, row)
        assert row["failed"] == 0 and row["lost_in_scale_in"] == 0, (policy, row)
    # Every knob was chosen on the training window; goodput's capacity is the ModelGroup's as applied.
    assert [tuning["policy"] for tuning in document["tuning"]] == ["goodput", "keda", "hpa"]
    capacity = document["goodput_capacity_work_seconds_per_second"]
    applied = yaml.safe_load((out / "manifests" / "modelgroup-demo.yaml").read_text())
    assert capacity > 0 and applied["spec"]["profile"]["capacityWorkSecondsPerSecond"] == float(
        f"{capacity:.4g}"
    )
    # Each scaler really moved the ModelGroup during the burst.
    assert all(live[policy]["scale_outs"] >= 1 for policy in live), live
    table = (out / "ab.md").read_text()
    assert "| goodput |" in table and "| keda |" in table and "| hpa |" in table
    assert "simulated" in table and "error" in table
    assert (out / "ab.png").read_bytes().startswith(PNG_MAGIC)
    for policy in live:
        assert (out / policy / "demo.json").exists()
    # A baseline's own report names its scaler's changes of the count; goodput's records are advice.
    for policy in ("keda", "hpa"):
        summary = json.loads((out / policy / "demo.json").read_text())["summary"]
        assert summary["scale_outs"] and {d["signal"] for d in summary["scale_outs"]} == {policy}, summary

    def leftovers() -> list[str]:
        names = cluster.kubectl("get", "namespaces", "-o", "name").stdout.split()
        return [name for name in names if name.startswith(f"namespace/e2e-ab-{suffix}")]

    # Every run's namespace, and the release namespace the A/B run made, are removed.
    wait_for(lambda: not leftovers(), timeout_seconds=120, describe=lambda: f"namespaces gone: {leftovers()}")
