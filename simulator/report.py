"""What a run means to users and to whoever pays for the GPUs: attainment against the offered and the
admitted population, request and token goodput, GPU-hours and cost per SLO-attaining request.

A request attains its SLO (design note §4) when it finished, its TTFT (from arrival at the router,
so any wait there counts) is within its class target, its TPOT — time per output token after the
first — is within the ITL target, and its end-to-end latency is within the class's completion
target when it has one. A mean TPOT hides stalls, so each class also reports its percentile
condition: the share of requests within the TTFT target and the share of all token gaps within the
ITL target (a preemption counts as one long gap) must both reach the class's `percentile`.

Requests rejected for lack of a ready group, lost to a failed group, or unfinished at the end count
against the offered population; rejected ones are not admitted (DESIGN §1: a policy that rejects
more must not look better).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from goodput.simulator.gateway import ADMISSION_NAMES
from goodput.simulator.records import RequestExit
from goodput.simulator.simulation import SimulationResult

DEFAULT_GPU_HOUR_PRICE = 2.5
"""US$ per GPU-hour used when none is given: a typical on-demand H100 price in 2025."""


@dataclass(frozen=True, slots=True)
class ClassTargets:
    """One SLO class's targets, as the SLOPolicy states them."""

    name: str
    ttft_seconds: float
    itl_seconds: float
    e2e_seconds: float | None = None
    attainment: float = 0.99
    percentile: float = 0.99


@dataclass(frozen=True, slots=True)
class RequestVerdicts:
    """Per-request latencies and SLO verdicts, by workload index."""

    ttft: np.ndarray
    tpot: np.ndarray
    e2e: np.ndarray
    finished: np.ndarray
    admitted: np.ndarray
    met: np.ndarray
    gaps: np.ndarray
    """Token gaps of each request (output tokens − 1)."""
    slow_gaps: np.ndarray | None
    """Token gaps longer than the request's ITL target; None from an engine that does not time each
    token (the batched fleet engine)."""


def judge(result: SimulationResult, classes: tuple[ClassTargets, ...]) -> RequestVerdicts:
    """Which requests attained their class's SLO."""
    requests = result.requests
    workload = result.workload
    outcome = requests["outcome"]
    arrival = requests["arrival"]
    finished = outcome == RequestExit.FINISHED
    admitted = requests["group"] >= 0
    ttft = requests["first_token_at"] - arrival
    e2e = requests["finished_at"] - arrival
    # Behind a gateway a degraded request is served a lower max_tokens: its gaps are those it got.
    outputs = requests.get("served_output_tokens", workload.output_tokens)
    gaps = np.maximum(outputs - 1, 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(
            gaps > 0, (requests["finished_at"] - requests["first_token_at"]) / np.maximum(gaps, 1), np.nan
        )
    class_index = (
        workload.class_index if workload.class_index is not None else np.zeros(len(workload), np.int64)
    )
    ttft_target = np.array([c.ttft_seconds for c in classes])[class_index]
    itl_target = np.array([c.itl_seconds for c in classes])[class_index]
    e2e_target = np.array([math.inf if c.e2e_seconds is None else c.e2e_seconds for c in classes])[
        class_index
    ]
    with np.errstate(invalid="ignore"):
        tpot_ok = np.where(gaps > 0, tpot <= itl_target, True)
        met = finished & (ttft <= ttft_target) & tpot_ok & (e2e <= e2e_target)
    if "best_effort" in requests:  # served outside its class's SLO: never attaining (nor a miss)
        met &= ~requests["best_effort"]
    return RequestVerdicts(ttft, tpot, e2e, finished, admitted, met, gaps, requests.get("slow_gaps"))


def meets_every_class(result: SimulationResult, classes: tuple[ClassTargets, ...]) -> bool:
    """Every class reaches its attainment target among admitted requests (the envelope's test)."""
    verdicts = judge(result, classes)
    workload = result.workload
    class_index = (
        workload.class_index if workload.class_index is not None else np.zeros(len(workload), np.int64)
    )
    for index, targets in enumerate(classes):
        admitted = verdicts.admitted & (class_index == index)
        count = int(admitted.sum())
        if count and float((verdicts.met & admitted).sum()) / count < targets.attainment:
            return False
    return True


def _percentiles(values: np.ndarray, prefix: str) -> dict[str, float]:
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return {
            f"{prefix}_p50_seconds": math.nan,
            f"{prefix}_p90_seconds": math.nan,
            f"{prefix}_p99_seconds": math.nan,
        }
    p50, p90, p99 = np.percentile(finite, [50, 90, 99])
    return {
        f"{prefix}_p50_seconds": float(p50),
        f"{prefix}_p90_seconds": float(p90),
        f"{prefix}_p99_seconds": float(p99),
    }


def _step_value(times: np.ndarray, values: np.ndarray, at: np.ndarray) -> np.ndarray:
    """A step function's value at `at` (the last change at or before each point; 0 before any)."""
    if times.size == 0:
        return np.zeros(at.size)
    index = np.searchsorted(times, at, side="right") - 1
    return np.where(index >= 0, values[np.maximum(index, 0)], 0)


def timeseries(
    result: SimulationResult, verdicts: RequestVerdicts, bin_seconds: float
) -> dict[str, list[float]]:
    """Per time bin: load, groups, TTFT p99 and attainment of the requests that arrived in it."""
    horizon = max(result.horizon_seconds, bin_seconds)
    bins = math.ceil(horizon / bin_seconds)
    starts = np.arange(bins) * bin_seconds
    arrival = result.requests["arrival"]
    which = np.minimum((arrival // bin_seconds).astype(np.int64), bins - 1)
    offered = np.bincount(which, minlength=bins).astype(np.float64)
    met = np.bincount(which, weights=verdicts.met.astype(np.float64), minlength=bins)
    tokens = np.bincount(
        which, weights=result.workload.input_tokens + result.workload.output_tokens, minlength=bins
    )
    ttft_p99 = np.full(bins, np.nan)
    order = np.argsort(which, kind="stable")
    edges = np.searchsorted(which[order], np.arange(bins + 1))
    ttft = np.where(verdicts.finished, verdicts.ttft, np.inf)[order]
    for b in range(bins):
        chunk = ttft[edges[b] : edges[b + 1]]
        if chunk.size:
            # unfinished requests count as infinitely late; "higher" avoids interpolating with infinity
            ttft_p99[b] = float(np.percentile(chunk, 99, method="higher"))
    times = np.array([c.time for c in result.timeline])
    series = {
        name: np.array([getattr(c, name) for c in result.timeline])
        for name in ("desired", "placing", "provisioning", "ready", "draining")
    }
    middle = starts + bin_seconds / 2
    with np.errstate(invalid="ignore", divide="ignore"):
        attainment = np.where(offered > 0, met / np.maximum(offered, 1), np.nan)
    return {
        "bin_start_seconds": starts.tolist(),
        "arrival_rate_per_second": (offered / bin_seconds).tolist(),
        "token_rate_per_second": (tokens / bin_seconds).tolist(),
        "desired_groups": _step_value(times, series["desired"], middle).astype(float).tolist(),
        "ready_groups": _step_value(times, series["ready"], middle).astype(float).tolist(),
        "starting_groups": _step_value(times, series["placing"] + series["provisioning"], middle)
        .astype(float)
        .tolist(),
        "draining_groups": _step_value(times, series["draining"], middle).astype(float).tolist(),
        "ttft_p99_seconds": [None if math.isnan(v) else (v if math.isfinite(v) else 1e9) for v in ttft_p99],
        "attainment_offered": [None if math.isnan(v) else float(v) for v in attainment],
    }


def summarize(
    result: SimulationResult,
    classes: tuple[ClassTargets, ...],
    gpu_hour_price: float = DEFAULT_GPU_HOUR_PRICE,
    bin_seconds: float = 30.0,
    context: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The run's report, JSON-ready."""
    verdicts = judge(result, classes)
    workload = result.workload
    report: dict[str, Any] = {
        **_population(result, verdicts),
        **_admission(result, verdicts, classes),
        **_cost(result, verdicts, gpu_hour_price),
        "scale_events": [
            {
                "time_seconds": round(event.time, 3),
                "from_groups": event.from_groups,
                "to_groups": event.to_groups,
                "reason": event.reason,
            }
            for event in result.scale_events
        ],
        "scale_event_count": len(result.scale_events),
        "decisions": result.decisions,
        "latency": _latency(result, verdicts),
        "classes": {
            targets.name: _class_report(result, verdicts, index, targets)
            for index, targets in enumerate(classes)
        },
        "engine": _engine(result),
        "groups": [
            {
                "name": group.name,
                "created_seconds": group.created_at,
                "ready_seconds": group.ready_at,
                "ended_seconds": group.ended_at,
                "state": group.final_state,
            }
            for group in result.groups
        ],
        "workload": {
            "name": workload.name,
            "notes": list(workload.notes),
            "classes": list(workload.class_names),
            "tenants": list(workload.tenant_names),
        },
        "simulation": {
            "wall_seconds": result.wall_seconds,
            "simulated_seconds": result.end_seconds,
            "speed_ratio": result.end_seconds / result.wall_seconds if result.wall_seconds else None,
            "events": result.events_processed,
        },
        "timeseries": timeseries(result, verdicts, bin_seconds),
    }
    if context:
        report["config"] = context
    return report


def _population(result: SimulationResult, verdicts: RequestVerdicts) -> dict[str, Any]:
    """§5: the offered population and what became of it, beside the attainment it gives."""
    outcome = result.requests["outcome"]
    offered = len(result.workload)
    admitted = int(verdicts.admitted.sum())
    met = int(verdicts.met.sum())
    return {
        "offered_requests": offered,
        "admitted_requests": admitted,
        "rejected_requests": {
            "no_ready_group": int((outcome == RequestExit.REJECTED_NO_CAPACITY).sum()),
            "too_long": int((outcome == RequestExit.REJECTED_TOO_LONG).sum()),
            **(
                {"admission": int((outcome == RequestExit.REJECTED_ADMISSION).sum())}
                if "admission" in result.requests
                else {}
            ),
        },
        "failed_requests": int((outcome == RequestExit.FAILED).sum()),
        "unfinished_requests": int((outcome == RequestExit.UNFINISHED).sum()),
        "finished_requests": int(verdicts.finished.sum()),
        "slo_met_requests": met,
        "attainment_offered": met / offered if offered else None,
        "attainment_admitted": met / admitted if admitted else None,
    }


def _admission_counts(admission: np.ndarray, infeasible: np.ndarray, met: np.ndarray) -> dict[str, int]:
    counts = {name: int((admission == code).sum()) for code, name in ADMISSION_NAMES.items()}
    return {
        "offered": len(admission),
        **counts,
        "infeasible": int(infeasible.sum()),
        "slo_met": int(met.sum()),
    }


def _admission(
    result: SimulationResult, verdicts: RequestVerdicts, classes: tuple[ClassTargets, ...]
) -> dict[str, Any]:
    """With a gateway in front (§5): every offered request's outcome at the door, by class and by
    tenant within it (admitted, deferred, degraded, rejected, its hold expired; infeasible counted
    apart, across outcomes), beside the requests that met their SLO. Nothing without a gateway."""
    requests = result.requests
    if "admission" not in requests:
        return {}
    workload = result.workload
    admission, infeasible, met = requests["admission"], requests["infeasible"], verdicts.met
    count = len(workload)
    class_index = workload.class_index if workload.class_index is not None else np.zeros(count, np.int64)
    tenant_index = workload.tenant_index if workload.tenant_index is not None else np.zeros(count, np.int64)
    tenants = workload.tenant_names or ("default",)
    by_class: dict[str, Any] = {}
    for index, targets in enumerate(classes):
        in_class = class_index == index
        by_tenant = {
            tenant: _admission_counts(admission[mask], infeasible[mask], met[mask])
            for t, tenant in enumerate(tenants)
            if (mask := in_class & (tenant_index == t)).any()
        }
        by_class[targets.name] = {
            **_admission_counts(admission[in_class], infeasible[in_class], met[in_class]),
            "tenants": by_tenant,
        }
    total = _admission_counts(admission, infeasible, met)
    return {"gateway": {**total, "classes": by_class}}


def _cost(result: SimulationResult, verdicts: RequestVerdicts, gpu_hour_price: float) -> dict[str, Any]:
    """Goodput over the offered window, and what the GPUs cost for it."""
    met = int(verdicts.met.sum())
    horizon = max(result.horizon_seconds, 1e-9)
    gpu_hours = result.gpu_seconds / 3600.0
    cost = gpu_hours * gpu_hour_price
    outputs = result.requests.get("served_output_tokens", result.workload.output_tokens)
    good_tokens = float(outputs[verdicts.met].sum())
    return {
        "offered_window_seconds": result.horizon_seconds,
        "goodput_rps": met / horizon,
        "token_goodput_tps": good_tokens / horizon,
        "gpu_hours": gpu_hours,
        "gpu_hour_price_usd": gpu_hour_price,
        "cost_usd": cost,
        "cost_per_slo_request": cost / met if met else None,
        "goodput_per_gpu_hour": met / gpu_hours if gpu_hours else None,
        "mean_gpus": result.gpu_seconds / horizon,
    }


def _latency(result: SimulationResult, verdicts: RequestVerdicts) -> dict[str, Any]:
    """Percentiles of the finished requests' TTFT, TPOT, end-to-end latency and queue time."""
    requests = result.requests
    finished = verdicts.finished
    queue = _percentiles((requests["scheduled_at"] - requests["routed_at"])[finished], "queue")
    return {
        **_percentiles(verdicts.ttft[finished], "ttft"),
        **_percentiles(verdicts.tpot[finished], "tpot"),
        **_percentiles(verdicts.e2e[finished], "e2e"),
        "queue_p99_seconds": queue["queue_p99_seconds"],
    }


def _class_report(
    result: SimulationResult, verdicts: RequestVerdicts, index: int, targets: ClassTargets
) -> dict[str, Any]:
    """One class against its own targets: attainment, and the TTFT and token-gap shares."""
    workload = result.workload
    class_index = (
        workload.class_index if workload.class_index is not None else np.zeros(len(workload), np.int64)
    )
    mask = class_index == index
    class_offered = int(mask.sum())
    class_admitted = int((mask & verdicts.admitted).sum())
    class_met = int((mask & verdicts.met).sum())
    done = mask & verdicts.finished
    ttft_within = float((verdicts.ttft[done] <= targets.ttft_seconds).mean()) if done.any() else None
    gaps = float(verdicts.gaps[done].sum())
    slow_gaps = verdicts.slow_gaps
    gaps_within = 1.0 - float(slow_gaps[done].sum()) / gaps if gaps and slow_gaps is not None else None
    return {
        "targets": {
            "ttft_seconds": targets.ttft_seconds,
            "itl_seconds": targets.itl_seconds,
            "e2e_seconds": targets.e2e_seconds,
            "attainment": targets.attainment,
            "percentile": targets.percentile,
        },
        "offered_requests": class_offered,
        "admitted_requests": class_admitted,
        "slo_met_requests": class_met,
        "attainment_offered": class_met / class_offered if class_offered else None,
        "attainment_admitted": class_met / class_admitted if class_admitted else None,
        "attainment_target_met": (class_met / class_offered >= targets.attainment) if class_offered else None,
        "ttft_within_target_fraction": ttft_within,
        "token_gaps_within_itl_target_fraction": gaps_within,
        "percentile_target_met": None
        if ttft_within is None or gaps_within is None
        else bool(ttft_within >= targets.percentile and gaps_within >= targets.percentile),
        **_percentiles(verdicts.ttft[done], "ttft"),
    }


def _engine(result: SimulationResult) -> dict[str, Any]:
    """The engines' totals, with the prefix-cache hit rate and the requests preempted."""
    totals = result.engine_totals
    queries = totals.get("prefix_cache_queries_tokens", 0.0)
    return {
        **totals,
        "prefix_cache_hit_rate": totals.get("prefix_cache_hits_tokens", 0.0) / queries if queries else None,
        "requests_preempted": int((result.requests["preemptions"] > 0).sum()),
    }
