"""PNG plots of a run (and of a policy comparison), drawn with matplotlib's Agg backend."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def _series(report: Mapping[str, Any], name: str) -> list[float]:
    return [float("nan") if value is None else float(value) for value in report["timeseries"][name]]


def plot_run(report: Mapping[str, Any], title: str, out_dir: Path) -> list[Path]:
    """timeline.png: load; desired vs ready groups; TTFT p99 and attainment per time bin."""
    minutes = [start / 60.0 for start in report["timeseries"]["bin_start_seconds"]]
    figure, (load, groups, latency) = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    load.plot(minutes, _series(report, "arrival_rate_per_second"), color="tab:blue")
    load.set_ylabel("arrivals / s")
    load.set_title(title)
    groups.step(minutes, _series(report, "desired_groups"), where="post", label="desired", color="tab:orange")
    groups.step(minutes, _series(report, "ready_groups"), where="post", label="ready", color="tab:green")
    groups.step(
        minutes,
        _series(report, "starting_groups"),
        where="post",
        label="starting",
        color="tab:gray",
        linestyle=":",
    )
    groups.set_ylabel("groups")
    groups.legend(loc="upper left")
    ttft = [min(value, 1e4) for value in _series(report, "ttft_p99_seconds")]
    latency.semilogy(minutes, ttft, color="tab:red", label="TTFT p99 (s)")
    latency.set_ylabel("TTFT p99 (s)")
    latency.set_xlabel("minutes")
    share = latency.twinx()
    share.plot(
        minutes, _series(report, "attainment_offered"), color="tab:purple", label="attainment (offered)"
    )
    share.set_ylim(0, 1.05)
    share.set_ylabel("attainment")
    lines = latency.get_lines() + share.get_lines()
    latency.legend(lines, [line.get_label() for line in lines], loc="lower left")
    figure.tight_layout()
    path = out_dir / "timeline.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return [path]


def plot_comparison(reports: Mapping[str, Mapping[str, Any]], out_dir: Path) -> Path:
    """comparison.png: ready groups over time per policy, and goodput per GPU-hour per policy."""
    figure, (groups, bars) = plt.subplots(2, 1, figsize=(10, 8))
    for name, report in reports.items():
        minutes = [start / 60.0 for start in report["timeseries"]["bin_start_seconds"]]
        groups.step(minutes, _series(report, "ready_groups"), where="post", label=name)
    groups.set_ylabel("ready groups")
    groups.set_xlabel("minutes")
    groups.legend(loc="upper left", ncol=3)
    names: Sequence[str] = list(reports)
    values = [float(reports[name].get("goodput_per_gpu_hour") or 0.0) for name in names]
    bars.bar(names, values, color="tab:blue")
    bars.set_ylabel("SLO-attaining requests per GPU-hour")
    figure.tight_layout()
    path = out_dir / "comparison.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
