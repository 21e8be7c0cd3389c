"""The benchmark suite at the time scale users live in: whole days of the public rate traces,
replayed at their own time scale (no compression), each policy tuned on one day and reported on
the days that follow (`simulator.fair_bench`), plus seeded bursts on top of a diurnal day.

A case is one day case (`DayCase`) against one sample ModelGroup (`ModelCase`). The days are cut
from the trace (`rate_traces.days_of`: the Azure 2024 week starts on a Sunday, so day 1 is a
Monday; ServeGen's language windows run fourteen days) and replayed second for second. Only the
level is set: the rate is scaled so the busiest window of the case's days needs `peak_groups`
groups at the service-time model's capacity (the absolute level of a production fleet means
nothing for one ModelGroup, the day's shape does). One envelope, measured on the training day on
steady arrivals, sets the warm start, the oracle's capacity and goodput's calibration: a trial
that kept the trace's time profile would squeeze the day onto its 240 s, the compression this
suite exists to avoid. (prompt, output) pairs are drawn from the matching
Azure 2023 trace; classes are assigned per request with equal shares by
`numpy.random.default_rng([seed, 7])` (the traces carry none).

Why real time: squeezed onto a few minutes, a day is shorter than a group's ready time plus the
scale-down window; no reactive policy can follow it, so a fixed fleet wins by construction and the
suite cannot tell policies apart.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from goodput.controllers.autoscale.forecast import DAY_SECONDS
from goodput.estimators.work import WorkPricing
from goodput.simulator.config import SimulationSetup, build_setup
from goodput.simulator.envelope import CapacityEnvelope, EnvelopeNotFoundError, EnvelopeSearch
from goodput.simulator.fair_bench import SUITE_POLICIES, FairBench, FairnessRunFigures, outcome_record
from goodput.simulator.feasible import Feasibility, NoFeasibleRequestsError
from goodput.simulator.fleet_policy import FleetPolicy
from goodput.simulator.oracle import ScheduleRules
from goodput.simulator.rate_traces import (
    RateSeries,
    days_of,
    load_rate_series,
    mean_rate,
    renewal_arrivals,
    workload_from_rates,
)
from goodput.simulator.runner import request_path_for
from goodput.simulator.workload import ClassRule, Workload, assign_classes, load_trace


@dataclass(frozen=True, slots=True)
class DayCase:
    """Days of a rate trace: tune on `train_day`, report on the `test_days` after it. With
    `bursts_per_day`, seeded bursts (x2 to x3 for 60 to 180 s, between 08:00 and 20:00) stand on
    the diurnal base, whose peak is then `level_share` of the model case's."""

    name: str
    file: str
    lengths_file: str = "AzureLLMInferenceTrace_conv.csv"
    train_day: int = 1
    test_days: int = 1
    bursts_per_day: int = 0
    level_share: float = 1.0

    @property
    def days(self) -> int:
        return 1 + self.test_days


@dataclass(frozen=True, slots=True)
class ModelCase:
    name: str
    modelgroup: str
    policy: str
    peak_groups: float
    """Groups the busiest window of the case's days needs at the service-time model's capacity."""


AZURE_CODE_2024 = "azure2024_code_1week_reqpermin_DIGITIZED.csv"
AZURE_CONV_2024 = "azure2024_conv_1week_reqpermin_DIGITIZED.csv"

DAY_CASES: tuple[DayCase, ...] = (
    DayCase("azure-code-2024", AZURE_CODE_2024, "AzureLLMInferenceTrace_code.csv"),
    DayCase("azure-conv-2024", AZURE_CONV_2024),
    DayCase("servegen-m-large", "servegen_language_m-large_aggregate_rate.csv"),
    DayCase("servegen-m-mid", "servegen_language_m-mid_aggregate_rate.csv"),
    DayCase("servegen-m-small", "servegen_language_m-small_aggregate_rate.csv"),
    DayCase("bursts-on-azure-conv-2024", AZURE_CONV_2024, bursts_per_day=3, level_share=0.5),
)

SUITE_MODELS: tuple[ModelCase, ...] = (
    ModelCase("llama-8b-tp1", "modelgroup-llama-8b-tp1.yaml", "slopolicy-interactive.yaml", 4.0),
    ModelCase("llama-70b-tp8pp2", "modelgroup-llama-70b-tp8-pp2.yaml", "slopolicy-batch.yaml", 3.0),
)


def rate_at(series: RateSeries, seconds: float) -> float:
    """The series' rate in the window holding `seconds` (0 outside every window)."""
    index = int(np.searchsorted(series.start_seconds, seconds, side="right")) - 1
    if index < 0 or seconds >= series.start_seconds[index] + series.length_seconds[index]:
        return 0.0
    return float(series.rate_per_second[index])


def bursts_on(
    base: Workload, series: RateSeries, level: float, lengths: Workload, *, bursts_per_day: int, seed: int
) -> Workload:
    """`base` with seeded bursts on top: each adds Poisson arrivals at (factor - 1) times the base
    rate where it starts, so the offered rate steps to x2 to x3 for 60 to 180 s."""
    rng = np.random.default_rng([seed, 41])
    days = math.ceil(base.span_seconds / DAY_SECONDS)
    pieces, described = [base.arrival_seconds], []
    for day in range(days):
        for _ in range(bursts_per_day):
            start = day * DAY_SECONDS + float(rng.uniform(8.0, 20.0)) * 3600.0
            length, factor = float(rng.uniform(60.0, 180.0)), float(rng.uniform(2.0, 3.0))
            extra = (factor - 1.0) * level * rate_at(series, start)
            pieces.append(renewal_arrivals(rng, start, start + length, extra, 1.0))
            described.append(f"x{factor:.1f} at {start:.0f} s for {length:.0f} s")
    added = np.concatenate(pieces[1:]) if len(pieces) > 1 else np.zeros(0)
    chosen = rng.integers(0, len(lengths), size=added.size)
    arrivals = np.concatenate([base.arrival_seconds, added])
    order = np.argsort(arrivals, kind="stable")
    return Workload(
        name=base.name,
        arrival_seconds=arrivals[order],
        input_tokens=np.concatenate([base.input_tokens, lengths.input_tokens[chosen]])[order],
        output_tokens=np.concatenate([base.output_tokens, lengths.output_tokens[chosen]])[order],
        notes=(*base.notes, f"bursts (seed {seed}): " + "; ".join(described)),
    )


def case_workload(
    case: DayCase,
    setup: SimulationSetup,
    model: ModelCase,
    traces_dir: Path,
    seed: int,
    *,
    rate_per_group: float | None = None,
) -> Workload:
    """The case's days at their own time scale, the busiest window at `model.peak_groups` groups'
    worth of `rate_per_group` (default: the service-time model's capacity), classes assigned."""
    from goodput.simulator.runner import analytic_rate_per_group

    lengths = load_trace(str(traces_dir / case.lengths_file), seed)
    series = days_of(load_rate_series(traces_dir / case.file), case.train_day, case.days)
    pricing = WorkPricing.from_step_model(setup.engine.cost)
    per_group = (
        rate_per_group if rate_per_group is not None else analytic_rate_per_group(setup, lengths, pricing)
    )
    peak_rate = model.peak_groups * case.level_share * per_group
    level = peak_rate / float(series.rate_per_second.max())
    shaped = workload_from_rates(
        series, lengths, duration_seconds=None, mean_rate_per_second=level * mean_rate(series), seed=seed
    )
    if case.bursts_per_day:
        shaped = bursts_on(shaped, series, level, lengths, bursts_per_day=case.bursts_per_day, seed=seed)
    names = tuple(c.name for c in setup.classes)
    return replace(assign_classes(shaped, ClassRule(names, tuple(1.0 for _ in names)), seed), name=case.name)


def _envelope_record(envelope: CapacityEnvelope) -> dict[str, Any]:
    return {
        "requests_per_second_per_group": envelope.requests_per_second,
        "failing_requests_per_second_per_group": envelope.failing_requests_per_second,
        "work_seconds_per_second": envelope.work_seconds_per_second,
        "attainment_lower_bounds_95": list(envelope.attainment_lower_bounds),
        "trial_groups": envelope.groups,
        "trial_seconds": envelope.trial_seconds,
        "repeats": envelope.repeats,
        "arrivals": envelope.arrivals,
    }


class TimedBench(FairBench):
    """A FairBench that prints every run's figures and wall time to stderr as it ends: a day-long
    case runs for hours, and what each run cost and reached is worth reading before it ends."""

    label: str = ""

    def run(
        self, workload: Workload, feasibility: Feasibility, autoscaler: FleetPolicy, horizon: float
    ) -> FairnessRunFigures:
        started = time.perf_counter()
        figures = super().run(workload, feasibility, autoscaler, horizon)
        wall = time.perf_counter() - started
        pace = len(workload) / max(wall, 1e-9)
        print(
            f"{self.label} {autoscaler.name} {autoscaler.describe()}: {len(workload)} requests over "
            f"{horizon / 3600:.1f} h in {wall:.0f} s wall ({pace:.0f} requests/s); "
            f"met {figures.attainment_offered:.3f} of offered on {figures.gpu_hours:.1f} GPU-h, "
            f"{figures.scale_outs} scale-outs, {figures.scale_ins} scale-ins",
            file=sys.stderr,
            flush=True,
        )
        return figures


def _policies_record(bench: FairBench, policies: Sequence[str]) -> dict[str, Any]:
    """Every policy's sweep on the training window, the setting chosen, and its test-window outcome."""
    record = {}
    for name in policies:
        result = bench.tune(name)
        record[name] = {
            "sweep": [outcome_record(o) for o in result.sweep],
            "chosen_setting": result.chosen.setting,
            "chosen_met_target_on_train": result.chosen_met_target_on_train,
            "test": outcome_record(result.test),
        }
    return record


def _oracle_record(bench: FairBench, setup: SimulationSetup, shave_trials: int) -> dict[str, Any]:
    """The hindsight oracle under the ModelGroup's lead time, minimum lifetime and bounds."""
    group = setup.model_group
    rules = ScheduleRules(
        lead_seconds=5.0 + setup.ready_time_seconds * math.exp(1.2816 * 0.25),
        min_lifetime_seconds=float(group.spec.drain.min_lifetime_seconds) if group is not None else 300.0,
        min_groups=setup.min_groups,
        max_groups=setup.max_groups,
    )
    oracle = bench.oracle(rules, shave_trials=shave_trials)
    return {
        "fluid_bound_gpu_hours": oracle.fluid_bound_gpu_hours,
        "searched": outcome_record(oracle.searched),
        "searched_met_target": oracle.searched_met_target,
        "searched_factor": oracle.searched_factor,
        "shave_trials": oracle.shave_trials,
        "shaved_group_intervals": oracle.shaved_group_intervals,
    }


@dataclass(frozen=True, slots=True)
class SuiteOptions:
    """What a suite run covers: the policies tuned (default all of `SUITE_POLICIES`), the oracle's
    shaving budget in test-day runs, the draw, and whether the gateway stands in front."""

    policies: tuple[str, ...] = SUITE_POLICIES
    shave_trials: int = 24
    seed: int = 0
    gateway: bool = False


def run_case(
    case: DayCase, model: ModelCase, traces_dir: Path, samples_dir: Path, options: SuiteOptions
) -> dict[str, Any]:
    """One (day case, ModelGroup) case, as a JSON-ready record; an error becomes the record's
    `error`. With `options.gateway`, every run has the request path compiled from the case's
    manifests in front."""
    started = time.perf_counter()
    seed = options.seed
    record: dict[str, Any] = {"trace": case.name, "model": model.name, "seed": seed}
    if options.gateway:
        record["gateway"] = True
    try:
        setup = build_setup(samples_dir / model.modelgroup, samples_dir / model.policy, step_noise_sigma=0.04)
        setup = replace(setup, measured_capacity_work_seconds_per_second=None)
        workload = case_workload(case, setup, model, traces_dir, seed)
        bench = TimedBench(
            setup,
            workload,
            train_fraction=1.0 / case.days,
            seed=seed,
            envelope_search=EnvelopeSearch(trial_seconds=240.0, refinements=3, arrivals="steady"),
            request_path=request_path_for(setup) if options.gateway else None,
        )
        bench.label = f"{model.name} {case.name}"
        record["workload"] = {
            "requests": len(workload),
            "train_requests": len(bench.train),
            "test_requests": len(bench.test),
            "train_day": case.train_day,
            "test_days": case.test_days,
            "duration_seconds": case.days * DAY_SECONDS,
            "notes": list(workload.notes),
            "test_feasibility": bench.test_feasibility.describe(),
        }
        record["envelope"] = _envelope_record(bench.envelope)
        if "goodput" in options.policies:
            record["goodput_envelope"] = _envelope_record(bench.goodput_envelope)
        record["warm_groups"] = bench.warm_groups()
        record["cron_floor_by_hour"] = list(bench.hourly_cron_floor())
        record["policies"] = _policies_record(bench, options.policies)
        record["oracle"] = _oracle_record(bench, setup, options.shave_trials)
    except (EnvelopeNotFoundError, NoFeasibleRequestsError, ValueError, OSError) as error:
        record["error"] = f"{type(error).__name__}: {error}"
    record["wall_seconds"] = time.perf_counter() - started
    return record


def run_suite(
    traces_dir: Path,
    samples_dir: Path,
    *,
    cases: Sequence[DayCase] = DAY_CASES,
    models: Sequence[ModelCase] = SUITE_MODELS,
    workers: int = 2,
    options: SuiteOptions = SuiteOptions(),
) -> list[dict[str, Any]]:
    """Every case, `workers` at a time; records in the suite's order."""
    if not traces_dir.is_dir():
        raise ValueError(f"trace folder {traces_dir} does not exist (set TRACES=...)")
    unknown = [name for name in options.policies if name not in SUITE_POLICIES]
    if unknown:
        raise ValueError(f"unknown policy {', '.join(unknown)}; the suite has {', '.join(SUITE_POLICIES)}")
    pairs = [(case, model) for model in models for case in cases]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [
            pool.submit(run_case, case, model, traces_dir, samples_dir, options) for case, model in pairs
        ]
        records = []
        for future in futures:
            record = future.result()
            print(
                f"{record['model']} {record['trace']}: {record['wall_seconds']:.0f} s"
                + (f" ({record['error']})" if "error" in record else ""),
                file=sys.stderr,
                flush=True,
            )
            records.append(record)
    return records
