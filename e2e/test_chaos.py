"""A platform team's chaos test, short: a seeded run of the chaos harness (testbed/chaos) against the
session cluster, the live emulator and streaming load. The operator is SIGKILLed every few seconds
(aimed at scale-outs, readiness, drains, rollouts), and infrastructure faults land one after
another (API server and etcd restarts, Prometheus stopped, slowed or missing series, a node lost,
ranks crashed, an engine hung) while the invariants are checked every second. Any violation, a
request lost, or a stage that does not settle fails the story; the report is printed (pytest -s).
`make chaos` runs the long version.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from goodput.testbed.chaos.report import format_report
from goodput.testbed.chaos.run import run_chaos
from goodput.testbed.chaos.schedule import ChaosSettings
from goodput.testbed.cluster.controlplane import LocalCluster

pytestmark = pytest.mark.e2e

SECONDS = float(os.environ.get("CHAOS_E2E_SECONDS", "170"))
SEED = int(os.environ.get("CHAOS_E2E_SEED", "4"))


def test_a_short_seeded_chaos_run_breaks_no_invariant_and_loses_no_request(
    cluster: LocalCluster, goodput_crds: list[str], namespace: str, tmp_path: Path
) -> None:
    settings = ChaosSettings(duration_seconds=SECONDS, seed=SEED, warmup_seconds=30, quiet_tail_seconds=50)
    report = run_chaos(cluster, namespace, settings, tmp_path / "chaos")
    text = format_report(report)
    print("\n" + text)
    assert report["faults_injected"].get("operator-kill", 0) >= 5, text
    assert len(report["faults_injected"]) >= 3, text
    assert report["invariant_checks"] > 0 and report["observations"] >= SECONDS / 2, text
    assert report["violations"] == [], text
    assert report["requests_lost"] == 0, text
    assert report["settled"]["ok"], text
    # Exceptions the operator logs while the API server restarts are handled, not crashes; a crash
    # is an exit nobody asked for.
    assert report["operator_exits_unasked"] == 0, text
    assert json.loads((tmp_path / "chaos" / "report.json").read_text())["seed"] == SEED
