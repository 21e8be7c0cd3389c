"""The benchmark suite: every public trace (and seeded flash crowds) against both sample ModelGroups,
each case run by `simulator.fair_bench` (train on the first half, report the second).

Each trace keeps its shape and is brought to one level per ModelGroup: time is stretched or
compressed so the trace fills the case's duration, and the rate is thinned or replicated (seeded) to
a mean of `mean_groups` groups' worth of the service-time model's capacity, so every case needs a
few groups and sometimes more: the absolute level of a production fleet means nothing for one
ModelGroup. The level is set in two passes: at the service-time model's capacity, then at the
capacity the envelope measured on that first pass's training window (so a bursty or prefill-heavy
trace does not overrun `maxReplicas` by construction); the second pass reuses that envelope. That
envelope's trials keep the trace's time profile (`arrivals="trace"`): it sets the level, the warm
start and the oracle's capacity. goodput is calibrated on its own envelope, measured by the same
search on steady arrivals (as `goodput envelope` offers them) on the second pass's training window
(`FairBench.goodput_envelope`). Traces without requests (Azure 2024 week, ServeGen) draw (prompt,
output) pairs from an Azure 2023 trace (`simulator.rate_traces`). Classes are assigned per request
with equal shares by `numpy.random.default_rng([seed, 7])` (the Azure traces carry none).
"""

from __future__ import annotations

import itertools
import math
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from goodput.estimators.work import WorkPricing
from goodput.simulator.config import SimulationSetup, build_setup
from goodput.simulator.envelope import CapacityEnvelope, EnvelopeNotFoundError, EnvelopeSearch
from goodput.simulator.fair_bench import SWEEPS, FairBench, outcome_record
from goodput.simulator.feasible import NoFeasibleRequestsError
from goodput.simulator.oracle import ScheduleRules
from goodput.simulator.rate_traces import load_rate_series, renewal_arrivals, workload_from_rates
from goodput.simulator.runner import request_path_for
from goodput.simulator.workload import (
    ClassRule,
    Workload,
    assign_classes,
    compress_time,
    load_trace,
    multiply_rate,
    truncate,
)


@dataclass(frozen=True, slots=True)
class TraceCase:
    """A trace of the suite: `kind` is "requests" (a request trace), "rates" (a rate series, lengths
    from `lengths_file`) or "flash" (seeded flash crowds, lengths from `lengths_file`)."""

    name: str
    kind: str
    file: str
    lengths_file: str = "AzureLLMInferenceTrace_conv.csv"
    seed: int = 0


@dataclass(frozen=True, slots=True)
class ModelCase:
    name: str
    modelgroup: str
    policy: str
    duration_seconds: float
    """The shortest case; longer where the ModelGroup's ready time and minimum lifetime need it
    (`case_duration_seconds`)."""
    mean_groups: float


TRACES: tuple[TraceCase, ...] = (
    TraceCase("azure-code-2023", "requests", "AzureLLMInferenceTrace_code.csv"),
    TraceCase("azure-conv-2023", "requests", "AzureLLMInferenceTrace_conv.csv"),
    TraceCase(
        "azure-code-2024-week",
        "rates",
        "azure2024_code_1week_reqpermin_DIGITIZED.csv",
        "AzureLLMInferenceTrace_code.csv",
    ),
    TraceCase("azure-conv-2024-week", "rates", "azure2024_conv_1week_reqpermin_DIGITIZED.csv"),
    TraceCase("mooncake", "requests", "mooncake_synthetic_trace.jsonl"),
    TraceCase("servegen-m-large", "rates", "servegen_language_m-large_aggregate_rate.csv"),
    TraceCase("servegen-m-mid", "rates", "servegen_language_m-mid_aggregate_rate.csv"),
    TraceCase("servegen-m-small", "rates", "servegen_language_m-small_aggregate_rate.csv"),
    TraceCase("servegen-mm-image", "rates", "servegen_multimodal_mm-image_aggregate_rate.csv"),
    TraceCase("servegen-deepseek-r1", "rates", "servegen_reason_deepseek-r1_aggregate_rate.csv"),
    TraceCase("flash-crowd-1", "flash", "", seed=1),
    TraceCase("flash-crowd-2", "flash", "", seed=2),
)

SUITE_MODELS: tuple[ModelCase, ...] = (
    ModelCase("llama-8b-tp1", "modelgroup-llama-8b-tp1.yaml", "slopolicy-interactive.yaml", 1000.0, 2.0),
    ModelCase("llama-70b-tp8pp2", "modelgroup-llama-70b-tp8-pp2.yaml", "slopolicy-batch.yaml", 2000.0, 1.2),
)


def flash_crowds(lengths: Workload, duration_seconds: float, rate_per_second: float, seed: int) -> Workload:
    """Poisson arrivals at a base rate with one flash crowd in each half (x3 to x5 for 60 to 180 s,
    at seeded times), lengths drawn from `lengths`. The base is set so the mean stays at `rate`."""
    rng = np.random.default_rng([seed, 31])
    bursts = []
    for half in range(2):
        length = float(rng.uniform(60.0, 180.0))
        start = float(rng.uniform(half + 0.2, half + 0.7) * duration_seconds / 2)
        bursts.append((start, start + length, float(rng.uniform(3.0, 5.0))))
    extra = sum((end - start) * (factor - 1) for start, end, factor in bursts)
    base = rate_per_second * duration_seconds / (duration_seconds + extra)
    edges = sorted({0.0, duration_seconds, *(t for start, end, _ in bursts for t in (start, end))})
    pieces = []
    for start, end in itertools.pairwise(edges):
        factor = next((f for s, e, f in bursts if s <= start < e), 1.0)
        pieces.append(renewal_arrivals(rng, start, end, base * factor, 1.0))
    arrivals = np.sort(np.concatenate(pieces))
    chosen = rng.integers(0, len(lengths), size=arrivals.size)
    described = "; ".join(f"x{f:.1f} in [{s:.0f}, {e:.0f}) s" for s, e, f in bursts)
    return Workload(
        name=f"flash-crowd-{seed}",
        arrival_seconds=arrivals,
        input_tokens=lengths.input_tokens[chosen],
        output_tokens=lengths.output_tokens[chosen],
        notes=(
            f"flash crowds over Poisson {base:.3g} req/s: {described}; lengths from {lengths.name}; "
            f"seed {seed}",
        ),
    )


def case_duration_seconds(model: ModelCase, setup: SimulationSetup) -> float:
    """The case's duration: the model case's, or long enough that each half (the fair benchmark
    trains on one and reports the other) holds a group's ready time and its minimum lifetime.

    Why: a test window shorter than that cannot show a scale-in. With the 70B sample's 600 s ready
    time and 1,800 s minimum lifetime, a group asked for in a 1,000 s window could never be let go
    in it, and every policy that starts from the same warm groups ends on the same cost."""
    group = setup.model_group
    lifetime_seconds = float(group.spec.drain.min_lifetime_seconds) if group is not None else 0.0
    return max(model.duration_seconds, 2.0 * (setup.ready_time_seconds + lifetime_seconds))


def case_workload(
    trace: TraceCase,
    setup: SimulationSetup,
    model: ModelCase,
    traces_dir: Path,
    seed: int,
    *,
    rate_per_group: float | None = None,
) -> Workload:
    """The trace brought to the case's duration and a mean of `model.mean_groups` groups' worth of
    `rate_per_group` (default: the service-time model's capacity), classes assigned."""
    from goodput.simulator.runner import analytic_rate_per_group

    lengths_source = traces_dir / trace.lengths_file
    source = traces_dir / trace.file
    base = load_trace(str(source if trace.kind == "requests" else lengths_source), seed)
    pricing = WorkPricing.from_step_model(setup.engine.cost)
    per_group = (
        rate_per_group if rate_per_group is not None else analytic_rate_per_group(setup, base, pricing)
    )
    rate = model.mean_groups * per_group
    duration = model.duration_seconds
    if trace.kind == "requests":
        shaped = compress_time(base, base.span_seconds / duration)
        shaped = truncate(multiply_rate(shaped, rate * duration / len(shaped), seed), duration)
    elif trace.kind == "rates":
        shaped = workload_from_rates(
            load_rate_series(source), base, duration_seconds=duration, mean_rate_per_second=rate, seed=seed
        )
    elif trace.kind == "flash":
        shaped = flash_crowds(base, duration, rate, trace.seed)
    else:
        raise ValueError(f"trace case {trace.name}: unknown kind {trace.kind!r}")
    names = tuple(c.name for c in setup.classes)
    return replace(assign_classes(shaped, ClassRule(names, tuple(1.0 for _ in names)), seed), name=trace.name)


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


def _policies_record(bench: FairBench) -> dict[str, Any]:
    """Every policy's sweep on the training window, the setting chosen, and its test-window outcome."""
    policies = {}
    for name in SWEEPS:
        result = bench.tune(name)
        policies[name] = {
            "sweep": [outcome_record(o) for o in result.sweep],
            "chosen_setting": result.chosen.setting,
            "chosen_met_target_on_train": result.chosen_met_target_on_train,
            "test": outcome_record(result.test),
        }
    return policies


def _oracle_record(bench: FairBench, setup: SimulationSetup) -> dict[str, Any]:
    """The hindsight oracle under the ModelGroup's lead time, minimum lifetime and bounds."""
    group = setup.model_group
    rules = ScheduleRules(
        lead_seconds=5.0 + setup.ready_time_seconds * math.exp(1.2816 * 0.25),
        min_lifetime_seconds=float(group.spec.drain.min_lifetime_seconds) if group is not None else 300.0,
        min_groups=setup.min_groups,
        max_groups=setup.max_groups,
    )
    oracle = bench.oracle(rules)
    return {
        "fluid_bound_gpu_hours": oracle.fluid_bound_gpu_hours,
        "searched": outcome_record(oracle.searched),
        "searched_met_target": oracle.searched_met_target,
        "searched_factor": oracle.searched_factor,
        "shave_trials": oracle.shave_trials,
        "shaved_group_intervals": oracle.shaved_group_intervals,
    }


def run_case(
    trace: TraceCase,
    model: ModelCase,
    traces_dir: Path,
    samples_dir: Path,
    seed: int = 0,
    *,
    gateway: bool = False,
) -> dict[str, Any]:
    """One (trace, ModelGroup) case, as a JSON-ready record; an error becomes the record's `error`.
    With `gateway`, every run has the request path compiled from the case's manifests in front."""
    started = time.perf_counter()
    record: dict[str, Any] = {"trace": trace.name, "model": model.name, "seed": seed}
    if gateway:
        record["gateway"] = True
    try:
        setup = build_setup(samples_dir / model.modelgroup, samples_dir / model.policy, step_noise_sigma=0.04)
        setup = replace(setup, measured_capacity_work_seconds_per_second=None)
        model = replace(model, duration_seconds=case_duration_seconds(model, setup))
        search = EnvelopeSearch(trial_seconds=240.0, refinements=3, arrivals="trace")
        # The level: first at the service-time model's capacity, then at what the envelope measured on
        # that first training window says a group sustains on this trace's shape (the envelope's trials
        # thin or replicate the window to each rate, so the figure carries over to the new level).
        probe = FairBench(
            setup, case_workload(trace, setup, model, traces_dir, seed), seed=seed, envelope_search=search
        )
        envelope = probe.envelope
        offered_per_group = envelope.requests_per_second / max(probe.train_feasibility.feasible_share, 1e-9)
        workload = case_workload(trace, setup, model, traces_dir, seed, rate_per_group=offered_per_group)
        bench = FairBench(
            setup,
            workload,
            seed=seed,
            envelope_search=search,
            measured_envelope=envelope,
            request_path=request_path_for(setup) if gateway else None,
        )
        record["workload"] = {
            "requests": len(workload),
            "train_requests": len(bench.train),
            "test_requests": len(bench.test),
            "duration_seconds": model.duration_seconds,
            "notes": list(workload.notes),
            "test_feasibility": bench.test_feasibility.describe(),
        }
        record["envelope"] = _envelope_record(envelope)
        record["goodput_envelope"] = _envelope_record(bench.goodput_envelope)
        record["warm_groups"] = bench.warm_groups()
        record["policies"] = _policies_record(bench)
        record["oracle"] = _oracle_record(bench, setup)
    except (EnvelopeNotFoundError, NoFeasibleRequestsError, ValueError, OSError) as error:
        record["error"] = f"{type(error).__name__}: {error}"
    record["wall_seconds"] = time.perf_counter() - started
    return record


def run_suite(
    traces_dir: Path,
    samples_dir: Path,
    *,
    traces: Sequence[TraceCase] = TRACES,
    models: Sequence[ModelCase] = SUITE_MODELS,
    workers: int = 2,
    seed: int = 0,
    gateway: bool = False,
) -> list[dict[str, Any]]:
    """Every case, `workers` at a time; records in the suite's order. `gateway`: every run behind
    the gateway's request path."""
    if not traces_dir.is_dir():
        raise ValueError(f"trace folder {traces_dir} does not exist (set TRACES=...)")
    cases = [(trace, model) for model in models for trace in traces]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [
            pool.submit(run_case, trace, model, traces_dir, samples_dir, seed, gateway=gateway)
            for trace, model in cases
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
