"""A 3x step from 65 % load of two groups, in the simulator at real time scale: how fast goodput
sizes the burst, and how much of it is met, without and with the gateway in front.

    python bench/bench_burst_step.py [--seed 0] [--autoscalers goodput,kpa]

The sample Llama-3.1-8B ModelGroup on one H100 (manifests/samples), its interactive SLOPolicy, two
Ready groups at 21.2 requests a second (about 65 % of their measured envelope, 15.9 a second each),
then 63.6 a second from t = 600 s for 900 s. At the simulator's 120 s median ready time the burst
needs ceil(1.2 x 63.6 / C) groups (1.2: the queue-work signal's safety factor; C: the measured
envelope the run reports). Printed per policy and gateway setting: when a decision first asked for
that count (seconds after the step), when that many groups were Ready, the share of the burst's
offered requests that met the SLO, and the run's GPU-hours (a fleet that already held that count
before the step shows 0 and 0). Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MODEL_GROUP = ROOT / "manifests" / "samples" / "modelgroup-llama-8b-tp1.yaml"
SLO_POLICY = ROOT / "manifests" / "samples" / "slopolicy-interactive.yaml"
BASE_RATE, MULTIPLIER, STEP_AT, BURST_SECONDS = 21.2, 3.0, 600.0, 900.0
SAFETY_FACTOR = 1.2
TRACE = (
    f"synthetic:rate={BASE_RATE},burst_start={STEP_AT:g},burst_seconds={BURST_SECONDS:g},"
    f"burst_multiplier={MULTIPLIER:g},duration={STEP_AT + BURST_SECONDS:g}"
)


def simulate(out: Path, autoscaler: str, gateway: bool, seed: int) -> dict[str, Any]:
    argv = [
        str(ROOT / ".venv" / "bin" / "goodput"), "simulate", "--trace", TRACE, "--initial-groups", "2",
        "--modelgroup", str(MODEL_GROUP), "--policy", str(SLO_POLICY), "--autoscaler", autoscaler,
        "--seed", str(seed), "--out", str(out), "--no-progress",
    ]  # fmt: skip
    if gateway:
        argv.append("--gateway")
    subprocess.run(argv, check=True, capture_output=True, text=True)
    report: dict[str, Any] = json.loads((out / "report.json").read_text())
    return report


def needed_groups(report: dict[str, Any]) -> int | None:
    """The count the burst needs at the envelope goodput's run measured (None: no envelope in it)."""
    envelope = report["config"].get("capacity_envelope")
    if not envelope:
        return None
    return math.ceil(SAFETY_FACTOR * BASE_RATE * MULTIPLIER / float(envelope["requests_per_second"]) - 1e-9)


def burst_figures(report: dict[str, Any], needed: int) -> dict[str, float | None]:
    """When the needed count was asked for and Ready (seconds after the step), the burst's met share."""
    alive = [g for g in report["groups"] if g["ended_seconds"] is None or g["ended_seconds"] > STEP_AT]
    ready_at_step = sum(1 for g in alive if g["ready_seconds"] is not None and g["ready_seconds"] <= STEP_AT)
    asked = next(
        (
            e["time_seconds"]
            for e in report["scale_events"]
            if e["time_seconds"] >= STEP_AT and e["to_groups"] >= needed
        ),
        None,
    )
    ready_times = sorted(g["ready_seconds"] for g in alive if g["ready_seconds"] is not None)
    ready = ready_times[needed - 1] if len(ready_times) >= needed else None
    if ready_at_step >= needed:  # the fleet held the burst's count before it came
        asked, ready = STEP_AT, STEP_AT
    series = report["timeseries"]
    offered = met = 0.0
    for start, rate, share in zip(
        series["bin_start_seconds"],
        series["arrival_rate_per_second"],
        series["attainment_offered"],
        strict=True,
    ):
        if STEP_AT <= start < STEP_AT + BURST_SECONDS and rate and share is not None:
            offered += rate
            met += rate * share
    return {
        "needed": needed,
        "asked_after_seconds": None if asked is None else asked - STEP_AT,
        "ready_after_seconds": None if ready is None else ready - STEP_AT,
        "burst_met": met / offered if offered else None,
        "gpu_hours": report["gpu_hours"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--autoscalers", default="goodput,kpa", help="goodput first: its run measures C")
    args = parser.parse_args()
    print(f"trace {TRACE}; ready time median 120 s")
    header = ("policy", "gateway", "needed", "asked +s", "ready +s", "burst met", "GPU-h")
    print("".join(f"{name:<10}" if i < 2 else f"{name:>10}" for i, name in enumerate(header)))
    needed: int | None = None
    with tempfile.TemporaryDirectory() as scratch:
        for autoscaler in args.autoscalers.split(","):
            for gateway in (False, True):
                out = Path(scratch) / f"{autoscaler}-{gateway}"
                report = simulate(out, autoscaler, gateway, args.seed)
                needed = needed_groups(report) or needed
                if needed is None:
                    raise SystemExit("list goodput first: the needed count comes from its measured envelope")
                figures = burst_figures(report, needed)

                def show(value: float | None, form: str) -> str:
                    return "never" if value is None else format(value, form)

                cells = (
                    str(figures["needed"]),
                    show(figures["asked_after_seconds"], ".0f"),
                    show(figures["ready_after_seconds"], ".0f"),
                    show(figures["burst_met"], ".3f"),
                    show(figures["gpu_hours"], ".2f"),
                )
                row = f"{autoscaler:<10}{'yes' if gateway else 'no':<10}"
                print(row + "".join(f"{cell:>10}" for cell in cells), flush=True)


if __name__ == "__main__":
    main()
