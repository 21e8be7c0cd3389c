"""Which requests of a workload can meet their class's SLO at all on this ModelGroup's hardware.

The floors come from `estimators.feasibility` (one definition for the operator and the simulator);
this module applies them to a whole workload, per class, and says plainly when a class has no
request it could ever serve in time: a benchmark or an envelope measured on such a class measures
nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from goodput.estimators.feasibility import (
    FloorModel,
    FloorTargets,
    longest_feasible_prompt_tokens,
    request_floors,
    unmet_targets,
)
from goodput.simulator.engine import EngineConfig
from goodput.simulator.report import ClassTargets
from goodput.simulator.workload import Workload


class NoFeasibleRequestsError(ValueError):
    """A class none of whose requests can meet its targets on an idle group."""


@dataclass(frozen=True, slots=True)
class ClassFloorCheck:
    """One class's requests against its floors."""

    name: str
    requests: int
    infeasible: int
    longest_feasible_prompt_tokens: int
    unmet_counts: dict[str, int]
    """How many requests miss each SLI's target already at zero load ("ttft", "itl", "e2e")."""

    @property
    def infeasible_share(self) -> float:
        return self.infeasible / self.requests if self.requests else 0.0


@dataclass(frozen=True, slots=True)
class Feasibility:
    """Per request, whether its floors fit its class's targets; per class, the counts."""

    feasible: np.ndarray
    classes: tuple[ClassFloorCheck, ...]

    @property
    def feasible_share(self) -> float:
        return float(self.feasible.mean()) if self.feasible.size else 0.0

    def describe(self) -> list[dict[str, object]]:
        return [
            {
                "class": c.name,
                "requests": c.requests,
                "infeasible": c.infeasible,
                "infeasible_share": round(c.infeasible_share, 4),
                "longest_feasible_prompt_tokens": c.longest_feasible_prompt_tokens,
                "unmet_at_zero_load": c.unmet_counts,
            }
            for c in self.classes
        ]


def floor_model(engine: EngineConfig) -> FloorModel:
    """The floors of one group as the simulator runs it (no routing hop, no expected cache hits)."""
    return FloorModel(step_model=engine.cost, chunk_tokens=engine.max_num_batched_tokens)


def class_index_of(workload: Workload) -> np.ndarray:
    if workload.class_index is None:
        return np.zeros(len(workload), np.int64)
    return workload.class_index


def assess(workload: Workload, engine: EngineConfig, classes: Sequence[ClassTargets]) -> Feasibility:
    """Every request's floors against its class's targets (requests with equal lengths share the work)."""
    model = floor_model(engine)
    index = class_index_of(workload)
    feasible = np.zeros(len(workload), dtype=bool)
    summaries: list[ClassFloorCheck] = []
    for number, targets in enumerate(classes):
        slo = FloorTargets(targets.ttft_seconds, targets.itl_seconds, targets.e2e_seconds)
        members = np.flatnonzero(index == number)
        pairs = np.stack((workload.input_tokens[members], workload.output_tokens[members]), axis=1)
        unique, inverse = np.unique(pairs, axis=0, return_inverse=True)
        unmet = [unmet_targets(request_floors(model, int(p), int(o)), slo) for p, o in unique.tolist()]
        ok = np.array([not reasons for reasons in unmet], dtype=bool)
        flat_inverse = inverse.reshape(-1)
        feasible[members] = ok[flat_inverse]
        counts = {"ttft": 0, "itl": 0, "e2e": 0}
        weights = np.bincount(flat_inverse, minlength=len(unique))
        for reasons, weight in zip(unmet, weights.tolist(), strict=True):
            for reason in reasons:
                counts[reason] += int(weight)
        summaries.append(
            ClassFloorCheck(
                targets.name,
                int(members.size),
                int(members.size - feasible[members].sum()),
                longest_feasible_prompt_tokens(model, targets.ttft_seconds),
                counts,
            )
        )
    return Feasibility(feasible, tuple(summaries))


def require_feasible_requests(feasibility: Feasibility, classes: Sequence[ClassTargets]) -> None:
    """Raise, naming the class and its targets, when a class has requests but none of them can meet
    its SLO even on an idle group."""
    for summary, targets in zip(feasibility.classes, classes, strict=True):
        if summary.requests and summary.infeasible == summary.requests:
            misses = ", ".join(f"{sli} {count}" for sli, count in summary.unmet_counts.items() if count)
            raise NoFeasibleRequestsError(
                f"SLO class {summary.name!r}: none of its {summary.requests} requests can meet "
                f"ttftSeconds={targets.ttft_seconds:g}, itlSeconds={targets.itl_seconds:g}"
                + (f", e2eSeconds={targets.e2e_seconds:g}" if targets.e2e_seconds is not None else "")
                + f" on an idle group (misses at zero load: {misses}; prompts fit the TTFT target only up "
                f"to {summary.longest_feasible_prompt_tokens} tokens); a longer target, more tensor "
                "parallelism or another class would"
            )
