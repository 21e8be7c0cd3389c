"""The chaos run's report as text: what was injected, what was checked, what broke, what was lost."""

from __future__ import annotations

from typing import Any


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{name} {count}" for name, count in counts.items()) or "none"


def _when(at_seconds: float | None) -> str:
    return "at the end" if at_seconds is None else f"at {at_seconds} s"


def format_report(report: dict[str, Any]) -> str:
    lines = [
        f"chaos run: seed {report['seed']}, {report['duration_seconds']:g} s "
        f"-> {'PASSED' if report['passed'] else 'FAILED'}",
        f"faults injected: {sum(report['faults_injected'].values())} ({_counts(report['faults_injected'])})",
        f"faults planned:  {_counts(report['faults_planned'])}",
        f"operator kills aimed at: {_counts(report['kills_aimed_at'])}",
        f"operator kills landed during: {_counts(report['kills_landed_during'])}",
        f"operator starts: {report['operator_starts']}, "
        f"exits it was not asked for: {report.get('operator_exits_unasked', 0)}, "
        f"log lines with a traceback: {report['operator_tracebacks']}",
        f"stimuli: {_counts(report['stimuli'])}",
        f"invariant checks: {report['invariant_checks']} over {report['observations']} observations "
        f"({report['observations_missed']} missed while the API server did not answer)",
    ]
    for skipped in report["faults_skipped"]:
        lines.append(f"  skipped {skipped['kind']} at {skipped['at']:g} s: {skipped['why']}")
    lines.append(f"violations: {len(report['violations'])}")
    for violation in report["violations"]:
        lines.append(
            f"  [{violation['rule']}] {violation['model_group']} "
            f"{_when(violation['at_seconds'])}: "
            f"{violation['evidence']}"
        )
    for row in report["streams"]:
        lines.append(
            f"streams {row['model_group']}: ok {row['ok']}, failed {row['failed']} "
            f"(by injected faults {row['ended_by_fault']}, by timed-out drains "
            f"{row['ended_by_timed_out_drain']}, operator counted {row['counted_aborted']} aborted; "
            f"by timed-out drains whose count is unknown {row.get('ended_by_uncounted_drain', 0)}), "
            f"refused at connect {row['refused_at_connect']}, lost {row['lost']}"
        )
    lines.append(f"requests lost: {report['requests_lost']} (goal 0)")
    for name, drain in report["drains"].items():
        lines.append(f"drains {name}: {drain}")
    settled = report["settled"]
    lines.append(
        f"settled after the chaos: {'yes' if settled['ok'] else 'NO'} in {settled['seconds']} s"
        + (f" ({settled['why_not']})" if settled["why_not"] else "")
    )
    return "\n".join(lines)
