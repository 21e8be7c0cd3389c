"""The chaos run's text report says whether the run passed and carries every violation's evidence."""

from __future__ import annotations

from typing import Any

from goodput.testbed.chaos.report import format_report


def report(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "seed": 11,
        "duration_seconds": 900.0,
        "passed": True,
        "faults_injected": {"operator-kill": 62, "etcd-restart": 3},
        "faults_planned": {"operator-kill": 62, "etcd-restart": 3},
        "kills_aimed_at": {"drain": 13},
        "kills_landed_during": {"drain": 27, "idle": 20},
        "operator_starts": 63,
        "operator_tracebacks": 0,
        "stimuli": {"scale": 26},
        "invariant_checks": 6230,
        "observations": 765,
        "observations_missed": 61,
        "faults_skipped": [],
        "violations": [],
        "streams": [
            {
                "model_group": "chat",
                "ok": 1269,
                "failed": 17,
                "ended_by_fault": 12,
                "ended_by_timed_out_drain": 5,
                "counted_aborted": 4,
                "refused_at_connect": 2,
                "lost": 1,
            }
        ],
        "requests_lost": 1,
        "drains": {},
        "settled": {"ok": True, "seconds": 0.1, "why_not": ""},
    }
    return base | overrides


def test_a_clean_run_reads_passed_with_its_figures() -> None:
    text = format_report(report())
    assert text.splitlines()[0] == "chaos run: seed 11, 900 s -> PASSED"
    assert "faults injected: 65 (operator-kill 62, etcd-restart 3)" in text
    assert "invariant checks: 6230 over 765 observations (61 missed" in text
    assert "requests lost: 1 (goal 0)" in text


def test_a_failed_run_lists_each_violation_and_each_skipped_fault() -> None:
    violation = {"rule": "too-many-groups", "model_group": "chat", "at_seconds": 42.0, "evidence": "6 groups"}
    skipped = {"kind": "rank-crash-warming", "at": 300.0, "why": "no group warming within 30 s"}
    text = format_report(
        report(
            passed=False,
            violations=[violation],
            faults_skipped=[skipped],
            settled={"ok": False, "seconds": 150, "why_not": "chat: 2 wanted"},
        )
    )
    assert text.splitlines()[0].endswith("FAILED")
    assert "[too-many-groups] chat at 42.0 s: 6 groups" in text
    assert "skipped rank-crash-warming at 300 s: no group warming within 30 s" in text
    assert "settled after the chaos: NO in 150 s (chat: 2 wanted)" in text
