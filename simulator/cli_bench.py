"""`goodput bench`: every scaling policy on the same trace, fleet and seed, side by side.

Writes DIR/<policy>/report.json and timeline.png for each policy, DIR/summary.json with the
comparison rows, and DIR/comparison.png; prints the comparison table.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from goodput.simulator.cli_simulate import add_common_arguments, bench_from
from goodput.simulator.runner import POLICIES, optional_plots, sanitize, write_report

BENCH_COLUMNS: tuple[tuple[str, str, str], ...] = (
    # (header, report key, format)
    ("goodput req/s", "goodput_rps", "{:.2f}"),
    ("attain(offered)", "attainment_offered", "{:.3f}"),
    ("attain(admitted)", "attainment_admitted", "{:.3f}"),
    ("GPU-hours", "gpu_hours", "{:.2f}"),
    ("$/SLO req", "cost_per_slo_request", "{:.5f}"),
    ("good req/GPU-h", "goodput_per_gpu_hour", "{:.0f}"),
    ("scale events", "scale_event_count", "{:d}"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)
    parser.add_argument(
        "--policies",
        type=lambda text: tuple(text.split(",")),
        default=POLICIES,
        help=f"comma-separated subset of {','.join(POLICIES)} (default: all)",
    )


GATEWAY_COLUMNS: tuple[tuple[str, str, str], ...] = (("refused", "refused_requests", "{:d}"),)
"""Added when the gateway ran: the requests it refused at the door or whose hold expired."""


def _cell(report: Mapping[str, Any], key: str, pattern: str) -> str:
    value = report.get(key)
    if key == "refused_requests":
        value = report.get("rejected_requests", {}).get("admission")
    return "-" if value is None else pattern.format(value)


def comparison_table(reports: Mapping[str, Mapping[str, Any]]) -> str:
    """One row per policy; the figures a platform team and its finance team compare."""
    gateway = any("gateway" in report for report in reports.values())
    columns = BENCH_COLUMNS + GATEWAY_COLUMNS if gateway else BENCH_COLUMNS
    headers = ("policy", *(header for header, _, _ in columns))
    rows = [
        (name, *(_cell(report, key, pattern) for _, key, pattern in columns))
        for name, report in reports.items()
    ]
    widths = [max(len(headers[i]), *(len(row[i]) for row in rows)) for i in range(len(headers))]
    lines = [
        "  ".join(
            text.rjust(width) if i else text.ljust(width)
            for i, (text, width) in enumerate(zip(line, widths, strict=True))
        )
        for line in (headers, *rows)
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    unknown = [name for name in args.policies if name not in POLICIES]
    if unknown:
        print(
            f"goodput bench: unknown policies {', '.join(unknown)}; choose from {', '.join(POLICIES)}",
            file=sys.stderr,
        )
        return 2
    try:
        bench = bench_from(args)
    except (OSError, ValueError) as error:
        print(f"goodput bench: {error}", file=sys.stderr)
        return 2
    reports: dict[str, dict[str, Any]] = {}
    for name in args.policies:
        _, report = bench.run(name)
        reports[name] = report
        write_report(report, args.out / name, f"{name} on {bench.workload.name}")
        print(f"{name}: done in {report['simulation']['wall_seconds']:.1f} s", file=sys.stderr)
    table = comparison_table(reports)
    print(_preamble(bench, reports))
    print(table)
    summary = {
        name: {key: report.get(key) for _, key, _ in BENCH_COLUMNS} for name, report in reports.items()
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(
        json.dumps(sanitize({"policies": summary, "table": table}), indent=2) + "\n"
    )
    plots = optional_plots()
    if plots is not None:
        plots.plot_comparison(reports, args.out)
    return 0


def _preamble(bench: Any, reports: Mapping[str, Mapping[str, Any]]) -> str:
    workload = bench.workload
    envelope = bench.calibrated_envelope
    lines: Sequence[str] = [
        f"trace {bench.options.trace}{_window(bench.options)}: {len(workload)} requests over "
        f"{bench.horizon_seconds:.0f} s "
        f"(rate x{bench.options.rate_multiplier:g}, seed {bench.options.seed}); {bench.setup.model_name} on "
        f"{bench.setup.gpus_per_group} x {bench.setup.gpu_name} per group, ready time median "
        f"{bench.setup.ready_time_seconds:.0f} s, {bench.setup.min_groups}..{bench.setup.max_groups} groups, "
        f"${bench.options.gpu_hour_price:g}/GPU-hour",
    ]
    if envelope is not None:
        lines = [
            *lines,
            f"capacity envelope C = {envelope.work_seconds_per_second:.3f} work-s/s per group "
            f"(~{envelope.requests_per_second:.1f} req/s at attainment {envelope.attainment_goal})",
        ]
    return "\n".join(lines)


def _window(options: Any) -> str:
    start = options.start_seconds
    if start is None:
        return ""
    duration = options.duration_seconds
    return f" [{start:g} s, {'end' if duration is None else f'{start + duration:g} s'})"
