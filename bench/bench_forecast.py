"""Scale ahead of the day: goodput with and without its forecaster on a real day's rise, in the
simulator at real time scale.

    python bench/bench_forecast.py [--traces DIR] [--level 0.5] [--start-hour 11]
                                   [--hours 6] [--ready-time-seconds 120] [--seed 0]

The Azure 2024 code week's rates (requests per minute, digitized), at their own time scale (no
compression) and `--level` times their own level (1: the real one; lower runs faster), lengths
drawn from the Azure 2023 code trace; the sample Llama-3.1-8B ModelGroup on one H100 and its
interactive SLOPolicy. The forecaster learns from Monday 2024-05-13 (the training day) and Tuesday
up to the report window, `--hours` of Tuesday from `--start-hour` UTC (the default covers the
afternoon rise, 10x from trough to peak). Its history is the trace's offered work priced as the
decision prices it (requests per second x the mean request's work-seconds at the trace's mix),
then the run's own decisions' arrival estimates, as the operator reads back its exported series.

Printed per variant (reactive only, with the forecast): GPU-hours, the share of offered requests
that met the SLO, scale-ups asked for by the forecast (ahead of the load) and by the reactive
signals, and the fits' outcomes. Asserts nothing.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from goodput.api.reasons import Signal
from goodput.controllers.autoscale.arrival import mean_request_work_seconds
from goodput.estimators.queueing import TrafficMix
from goodput.simulator.config import build_setup
from goodput.simulator.fleet_policy import FleetObservation, PolicyAnswer
from goodput.simulator.goodput_policy import GoodputPolicy
from goodput.simulator.rate_traces import RateSeries, load_rate_series, workload_from_rates
from goodput.simulator.report import judge
from goodput.simulator.simulation import SimulationConfig, simulate
from goodput.simulator.workload import ClassRule, Workload, assign_classes, load_trace

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "manifests" / "samples"
MODELS = {"8b": "modelgroup-llama-8b-tp1.yaml", "70b": "modelgroup-llama-70b-tp8-pp2.yaml"}
SLO_POLICY = SAMPLES / "slopolicy-interactive.yaml"
RATES = "azure2024_code_1week_reqpermin_DIGITIZED.csv"
LENGTHS = "AzureLLMInferenceTrace_code.csv"
DAY = 86_400.0
TRAINING_DAY = np.datetime64("2024-05-13T00:00:00")
TRACE_START = np.datetime64("2024-05-10T00:07:00")


def window(series: RateSeries, start: float, end: float) -> RateSeries:
    """The series' windows starting in [start, end), their times from `start`."""
    keep = (series.start_seconds >= start) & (series.start_seconds < end)
    return replace(
        series,
        start_seconds=series.start_seconds[keep] - start,
        length_seconds=series.length_seconds[keep],
        rate_per_second=series.rate_per_second[keep],
        cv=series.cv[keep],
    )


def offered_history(
    series: RateSeries, since: float, until: float, work_per_request: float, level: float
) -> list[tuple[float, float]]:
    """The offered work per second of [since, until) on a one-minute grid, its times before 0."""
    times = np.arange(since, until, 60.0)
    index = np.searchsorted(series.start_seconds, times, side="right") - 1
    rates = series.rate_per_second[np.clip(index, 0, None)] * level
    return [
        (float(at - until), float(rate * work_per_request)) for at, rate in zip(times, rates, strict=True)
    ]


@dataclass
class TracedPolicy(GoodputPolicy):
    """goodput's policy, keeping per tick the forecast's proposal, the largest reactive one and the
    decision's count."""

    ticks: list[tuple[int | None, int, int]] = field(default_factory=list)

    def recommend(self, observation: FleetObservation) -> PolicyAnswer:
        answer = super().recommend(observation)
        decision = self.last_decision
        if decision is not None:
            ahead = (Signal.FORECAST, Signal.SCHEDULE)
            forecast = next((p.groups for p in decision.proposals if p.signal is Signal.FORECAST), None)
            reactive = max((p.groups for p in decision.proposals if p.signal not in ahead), default=0)
            self.ticks.append((forecast, reactive, decision.desired_groups))
        return answer


def figures(result: Any, policy: TracedPolicy, classes: Any) -> dict[str, Any]:
    met = judge(result, classes).met
    ups = [change for change in result.scale_events if change.to_groups > change.from_groups]
    ahead = [c for c in ups if c.detail.get("signal") in (Signal.FORECAST, Signal.SCHEDULE)]
    outcomes: dict[str, int] = {}
    for _, outcome in policy.forecast_outcomes:
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    forecasting = [(f, r, d) for f, r, d in policy.ticks if f is not None]
    return {
        "forecast_ticks": len(forecasting),
        "forecast_above_reactive": sum(1 for f, r, _ in forecasting if f > r),
        "forecast_share_of_reactive": float(np.mean([f / r for f, r, _ in forecasting if r > 0]))
        if forecasting
        else math.nan,
        "gpu_hours": result.gpu_seconds / 3600.0,
        "attainment": float(met.sum()) / max(1, len(result.workload)),
        "scale_ups_ahead": len(ahead),
        "scale_ups_reactive": len(ups) - len(ahead),
        "groups_asked_ahead": sum(c.to_groups - c.from_groups for c in ahead),
        "fits": outcomes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--traces",
        type=Path,
        default=ROOT.parent / "shared" / "traces",
        help="the public traces (the Makefile's TRACES)",
    )
    parser.add_argument("--level", type=float, default=0.5, help="times the trace's own request rate")
    parser.add_argument("--start-hour", type=float, default=11.0, help="report window start, UTC, Tuesday")
    parser.add_argument("--hours", type=float, default=6.0, help="report window length")
    parser.add_argument(
        "--ready-time-seconds",
        type=float,
        default=None,
        help="median group ready time (default: the profile's)",
    )
    parser.add_argument("--model", choices=sorted(MODELS), default="8b", help="the sample ModelGroup")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    setup = build_setup(
        SAMPLES / MODELS[args.model],
        SLO_POLICY,
        ready_time_seconds=args.ready_time_seconds,
        step_noise_sigma=0.04,
    )
    series = load_rate_series(args.traces / RATES)
    lengths = load_trace(str(args.traces / LENGTHS), args.seed)
    training = float((TRAINING_DAY - TRACE_START) / np.timedelta64(1, "s"))
    start = training + DAY + args.start_hour * 3600.0
    end = start + args.hours * 3600.0
    part = window(series, start, end)
    mean_rate = float(np.sum(part.rate_per_second * part.length_seconds)) / part.span_seconds * args.level
    shaped = workload_from_rates(
        part, lengths, duration_seconds=part.span_seconds, mean_rate_per_second=mean_rate, seed=args.seed
    )
    names = tuple(c.name for c in setup.classes)
    workload: Workload = assign_classes(shaped, ClassRule(names, tuple(1.0 for _ in names)), args.seed)

    reactive = GoodputPolicy.for_setup(setup, workload, None)
    mix = TrafficMix(float(workload.input_tokens.mean()), float(workload.output_tokens.mean()))
    work_per_request = mean_request_work_seconds(reactive.profile.pricing, mix)
    history = offered_history(series, training, start, work_per_request, args.level)
    capacity = reactive.profile.reference.work_per_second
    first_minute = float(np.sum(workload.arrival_seconds < 60.0)) / 60.0 * work_per_request
    initial = max(setup.min_groups, min(setup.max_groups, math.ceil(1.2 * first_minute / capacity)))
    config = SimulationConfig(
        fleet=setup.fleet(),
        seed=args.seed,
        initial_groups=initial,
        horizon_seconds=part.span_seconds,
        tail_seconds=300.0,
    )
    print(
        f"Azure 2024 code, Tuesday {args.start_hour:g}:00 UTC + {args.hours:g} h at x{args.level:g} "
        f"its level: {len(workload)} requests, {mean_rate:.3g}/s mean; history {len(history)} minutes "
        f"from Monday 00:00; C={capacity:.3g} work-s/s per group, {work_per_request:.3g} work-s per "
        f"request; ready time {setup.ready_time_seconds:g} s; {initial} groups at start"
    )
    for name, forecast in (("reactive", False), ("forecast", True)):
        policy = TracedPolicy.for_setup(setup, workload, None, forecast=forecast, offered_history=history)
        assert isinstance(policy, TracedPolicy)
        policy.declared_ready_seconds = setup.ready_time_seconds  # the horizon is the run's ready time
        began = time.perf_counter()
        result = simulate(workload, config, policy)
        row = figures(result, policy, setup.classes)
        print(
            f"{name:9s} GPU-hours {row['gpu_hours']:.2f}  attainment {row['attainment']:.4f}  "
            f"scale-ups ahead {row['scale_ups_ahead']} (+{row['groups_asked_ahead']} groups) "
            f"reactive {row['scale_ups_reactive']}  fits {row['fits']}  ({time.perf_counter() - began:.0f} s)"
        )
        if forecast:
            print(
                f"          forecast proposed on {row['forecast_ticks']} of {len(policy.ticks)} ticks, "
                f"above every reactive proposal on {row['forecast_above_reactive']}; on average "
                f"{row['forecast_share_of_reactive']:.2f}x the largest reactive proposal"
            )


if __name__ == "__main__":
    main()
