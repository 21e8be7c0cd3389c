"""The measured capacity envelope of one group (DESIGN §1, §26), and the oracle built on it.

Work is priced in work-seconds exactly as the decision code prices it (`estimators.work`). The
capacity envelope C is then *measured*, not assumed: one simulated group replays a sample of the
workload at rising rates until SLO attainment falls below the goal; C is the work rate it sustained
(what a ModelGroup's `profile.capacityWorkSecondsPerSecond` records from a benchmark). The oracle,
the warm start and the fixed fleet's size are all read from C, so they share one definition of
"enough".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from goodput.estimators.work import WorkPricing
from goodput.simulator.fleet import FleetConfig
from goodput.simulator.policy import FleetObservation, Recommendation
from goodput.simulator.workload import Workload, compress_time

if TYPE_CHECKING:
    from goodput.simulator.simulation import SimulationResult


def request_work_seconds(pricing: WorkPricing, workload: Workload) -> np.ndarray:
    """Each request's work in work-seconds, priced as the decision code prices it (`estimators.work`)."""
    return np.fromiter(
        (
            pricing.prefill_work_seconds(float(n_in)) + pricing.decode_work_seconds(float(n_in), float(n_out))
            for n_in, n_out in zip(
                workload.input_tokens.tolist(), workload.output_tokens.tolist(), strict=True
            )
        ),
        dtype=np.float64,
        count=len(workload),
    )


@dataclass(frozen=True, slots=True)
class CapacityEnvelope:
    """What one group sustains at the SLO, measured on the workload."""

    work_seconds_per_second: float
    requests_per_second: float
    attainment_goal: float
    trials: int
    """Simulated trials behind the figure (0: taken from the ModelGroup's profile)."""
    concurrency: float | None = None
    """Mean requests in flight (running + waiting) in one group at that rate, when measured."""

    def groups_for(self, work_rate: float) -> int:
        return max(1, math.ceil(work_rate / self.work_seconds_per_second - 1e-9))


def trial_workload(workload: Workload, rate_per_second: float, trial_seconds: float, seed: int) -> Workload:
    """The workload's first `trial_seconds` at `rate_per_second`: thinned (seeded), or time-compressed
    when the rate is above the workload's own. The length mix and the time profile are kept."""
    own_rate = len(workload) / max(workload.span_seconds, 1e-9)
    ratio = rate_per_second / own_rate
    shaped = workload
    if ratio < 1.0:
        keep = np.random.default_rng([seed, 11]).random(len(workload)) < ratio
        shaped = workload.take(np.flatnonzero(keep), f"thinned to {rate_per_second:.3g}/s")
    elif ratio > 1.0:
        shaped = compress_time(workload, ratio)
    return shaped.take(np.flatnonzero(shaped.arrival_seconds < trial_seconds), f"first {trial_seconds:g} s")


def measure_capacity(
    fleet: FleetConfig,
    workload: Workload,
    *,
    pricing: WorkPricing,
    meets_slo: Callable[[SimulationResult], bool],
    attainment_goal: float,
    first_guess_rate: float,
    trial_seconds: float = 600.0,
    seed: int = 0,
    refinements: int = 4,
) -> CapacityEnvelope:
    """The highest arrival rate at which one group still meets its SLO (`meets_slo`) for `trial_seconds`.

    Brackets the rate from `first_guess_rate` by factors of 1.5, then bisects (geometrically)
    `refinements` times. A trial must last long enough for an overloaded queue to show: a short one
    overstates capacity.
    """
    from goodput.simulator.baselines import FixedFleet
    from goodput.simulator.simulation import SimulationConfig, simulate

    single = FleetConfig(
        engine=fleet.engine,
        gpus_per_group=fleet.gpus_per_group,
        min_groups=1,
        max_groups=1,
        prefix_block_tokens=fleet.prefix_block_tokens,
        itl_targets_seconds=fleet.itl_targets_seconds,
    )
    work = request_work_seconds(pricing, workload)
    mean_work = float(work.mean())
    trials: dict[float, bool] = {}
    concurrency: dict[float, float] = {}

    def meets(rate: float) -> bool:
        if rate not in trials:
            sample = trial_workload(workload, rate, trial_seconds, seed)
            if len(sample) < 2:
                trials[rate] = True
            else:
                result = simulate(
                    sample,
                    SimulationConfig(fleet=single, seed=seed, initial_groups=1, tail_seconds=300.0),
                    FixedFleet(1),
                )
                trials[rate] = meets_slo(result)
                resident = result.requests["finished_at"] - result.requests["routed_at"]
                concurrency[rate] = float(np.nansum(resident)) / max(result.horizon_seconds, 1e-9)
        return trials[rate]

    low, high = first_guess_rate, first_guess_rate
    if meets(first_guess_rate):
        while meets(high * 1.5) and high < 1e5:
            high *= 1.5
        low, high = high, high * 1.5
    else:
        while not meets(low / 1.5) and low > 1e-3:
            low /= 1.5
        low, high = low / 1.5, low
    for _ in range(refinements):
        middle = math.sqrt(low * high)
        if meets(middle):
            low = middle
        else:
            high = middle
    return CapacityEnvelope(
        work_seconds_per_second=low * mean_work,
        requests_per_second=low,
        attainment_goal=attainment_goal,
        trials=len(trials),
        concurrency=concurrency.get(low),
    )


def demand_groups(
    workload: Workload,
    work_seconds: np.ndarray,
    envelope: CapacityEnvelope,
    smoothing_seconds: float = 30.0,
) -> np.ndarray:
    """Groups needed at each second: trailing-window work arrival rate over the envelope."""
    span = math.ceil(workload.span_seconds) + 1
    per_request = work_seconds
    per_second = np.bincount(workload.arrival_seconds.astype(np.int64), weights=per_request, minlength=span)
    window = max(1, int(smoothing_seconds))
    cumulative = np.concatenate(([0.0], np.cumsum(per_second)))
    trailing = (cumulative[window:] - cumulative[:-window]) / window
    rates = np.concatenate((cumulative[1:window] / window, trailing))[:span]
    return np.maximum(1, np.ceil(rates / envelope.work_seconds_per_second - 1e-9)).astype(np.int64)


class Oracle:
    """Knows every future arrival: provisions ahead by the ready time for the true future work.

    A bound, not a policy. At each tick it asks for the most groups needed at any second between now
    and the moment a group created now would be ready (p90 of the ready time) plus one tick, so
    capacity is there when work arrives and is released once no future second needs it.
    """

    name = "oracle"

    def __init__(self, need: np.ndarray, lead_seconds: float, interval_seconds: float = 15.0) -> None:
        self._need = need
        self.lead_seconds = lead_seconds
        self.interval_seconds = interval_seconds

    def describe(self) -> dict[str, float | str]:
        return {
            "lead_seconds": self.lead_seconds,
            "interval_seconds": self.interval_seconds,
            "peak_groups": float(self._need.max()) if self._need.size else 0.0,
        }

    def recommend(self, observation: FleetObservation) -> Recommendation:
        start = int(observation.now)
        end = int(observation.now + self.lead_seconds + self.interval_seconds) + 1
        window = self._need[start:end]
        desired = int(window.max()) if window.size else observation.min_groups
        desired = max(observation.min_groups, min(observation.max_groups, desired))
        return Recommendation(
            desired,
            f"oracle: {desired} groups cover the true work until "
            f"t+{self.lead_seconds + self.interval_seconds:.0f}s",
        )
