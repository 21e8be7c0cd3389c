"""Assemble a run from the command line's choices: workload, fleet, policy; then write its report.

`goodput simulate` runs one policy, `goodput bench` all of them on the same workload and seed; both
go through `Bench`, which measures the capacity envelope once and shares it between the oracle, the
warm start, the fixed fleet's size and goodput's own policy.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from goodput.estimators.work import WorkPricing
from goodput.simulator.baselines import (
    FixedFleet,
    HpaGpuUtilization,
    KedaWaitingRequests,
    KnativeKpa,
    KpaSpec,
)
from goodput.simulator.config import SimulationSetup
from goodput.simulator.envelope import (
    CapacityEnvelope,
    Oracle,
    demand_groups,
    measure_capacity,
    request_work_seconds,
)
from goodput.simulator.fleet import FleetConfig
from goodput.simulator.group_world import GroupRules
from goodput.simulator.plots import plot_run
from goodput.simulator.policy import Autoscaler
from goodput.simulator.report import DEFAULT_GPU_HOUR_PRICE, meets_every_class, summarize
from goodput.simulator.simulation import SimulationConfig, SimulationResult, simulate
from goodput.simulator.workload import ClassRule, Workload, class_weights_from, load_trace, prepare

POLICIES = ("goodput", "hpa", "keda", "kpa", "fixed", "oracle")


@dataclass(frozen=True, slots=True)
class RunOptions:
    """Everything a command line can vary besides the manifests."""

    trace: str
    seed: int = 0
    rate_multiplier: float = 1.0
    time_compression: float = 1.0
    duration_seconds: float | None = None
    start_seconds: float | None = None
    gpu_hour_price: float = DEFAULT_GPU_HOUR_PRICE
    fixed_groups: int | None = None
    initial_groups: int | None = None
    failure_rate_per_group_hour: float = 0.0
    scheduled_failures_seconds: tuple[float, ...] = ()
    router: str = "least-work"
    scrape_interval_seconds: float = 5.0
    scrape_delay_seconds: float = 5.0
    class_weights: tuple[float, ...] | None = None
    tenants: int = 4
    progress: bool = False
    trace_limit: int | None = None
    bin_seconds: float = 30.0
    capacity_trial_seconds: float = 600.0


@dataclass
class Bench:
    """One workload and fleet, shared by every policy run against it."""

    setup: SimulationSetup
    options: RunOptions
    workload: Workload = field(init=False)
    fleet: FleetConfig = field(init=False)
    pricing: WorkPricing = field(init=False)
    _envelope: CapacityEnvelope | None = field(default=None, init=False)
    _need: np.ndarray | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        options, setup = self.options, self.setup
        names = tuple(c.name for c in setup.classes)
        rule = ClassRule(names, class_weights_from(names, options.class_weights), options.tenants)
        raw = load_trace(options.trace, options.seed, options.trace_limit)
        self.workload = prepare(
            raw,
            rule,
            options.seed,
            rate_multiplier=options.rate_multiplier,
            time_compression=options.time_compression,
            duration_seconds=options.duration_seconds,
            start_seconds=options.start_seconds,
        )
        if len(self.workload) == 0:
            raise ValueError("the workload is empty after its transforms")
        self.fleet = FleetConfig(
            engine=setup.engine,
            gpus_per_group=setup.gpus_per_group,
            min_groups=setup.min_groups,
            max_groups=setup.max_groups,
            ready_time_median_seconds=setup.ready_time_seconds,
            router=options.router,
            failure_rate_per_group_hour=options.failure_rate_per_group_hour,
            scheduled_failures_seconds=options.scheduled_failures_seconds,
            prefix_block_tokens=self.workload.prefix_block_tokens,
            itl_targets_seconds=tuple(c.itl_seconds for c in setup.classes),
            group_rules=GroupRules.for_model_group(setup.model_group)
            if setup.model_group is not None
            else None,
        )
        self.pricing = WorkPricing.from_step_model(setup.engine.cost)

    @property
    def horizon_seconds(self) -> float:
        return self.options.duration_seconds or self.workload.span_seconds

    # ------------------------------------------------------------------ shared calibration
    def meets_slo(self, result: SimulationResult) -> bool:
        return bool(meets_every_class(result, self.setup.classes))

    @property
    def envelope(self) -> CapacityEnvelope:
        """C of one group on this workload: from the profile when it records one, else measured."""
        if self._envelope is None:
            measured = self.setup.measured_capacity_work_seconds_per_second
            goal = min(c.attainment for c in self.setup.classes)
            work = request_work_seconds(self.pricing, self.workload)
            if measured is not None:
                self._envelope = CapacityEnvelope(measured, measured / float(work.mean()), goal, 0)
            else:
                from goodput.simulator.goodput_policy import capacity_profile, scaling_policy_for

                analytic = capacity_profile(self.setup, scaling_policy_for(self.setup), self.workload, None)
                guess = analytic.reference.work_per_second / float(work.mean())
                self._envelope = measure_capacity(
                    self.fleet,
                    self.workload,
                    pricing=self.pricing,
                    meets_slo=self.meets_slo,
                    attainment_goal=goal,
                    first_guess_rate=guess,
                    trial_seconds=self.options.capacity_trial_seconds,
                    seed=self.options.seed,
                )
        return self._envelope

    @property
    def calibrated_envelope(self) -> CapacityEnvelope | None:
        """The envelope if a run has needed it already (None: no policy so far used it)."""
        return self._envelope

    @property
    def need(self) -> np.ndarray:
        """Groups the true work needs at each second, by the envelope."""
        if self._need is None:
            work = request_work_seconds(self.pricing, self.workload)
            self._need = demand_groups(self.workload, work, self.envelope)
        return self._need

    def clamp(self, groups: int) -> int:
        return int(max(self.setup.min_groups, min(self.setup.max_groups, groups)))

    @property
    def initial_groups(self) -> int:
        """Warm start, the same for every policy: what the first minute's work needs."""
        if self.options.initial_groups is not None:
            return self.clamp(self.options.initial_groups)
        return self.clamp(max(self.setup.warm_groups, int(self.need[:60].max())))

    @property
    def fixed_groups(self) -> int:
        """The fixed fleet provisions for the peak minute of the whole run."""
        if self.options.fixed_groups is not None:
            return self.options.fixed_groups
        return self.clamp(int(self.need.max()))

    @property
    def oracle_lead_seconds(self) -> float:
        """Placement plus the p90 of the lognormal ready time."""
        fleet = self.fleet
        p90_factor = math.exp(1.2816 * fleet.ready_time_sigma)
        return float(fleet.placement_seconds + fleet.ready_time_median_seconds * p90_factor)

    # ------------------------------------------------------------------ policies
    def autoscaler(self, name: str) -> Autoscaler:
        if name == "hpa":
            return HpaGpuUtilization()
        if name == "keda":
            return KedaWaitingRequests()
        if name == "kpa":
            concurrency = self.envelope.concurrency
            if concurrency is None:
                return KnativeKpa()
            return KnativeKpa(KpaSpec(target_per_group=max(1.0, 0.7 * concurrency)))
        if name == "fixed":
            return FixedFleet(self.fixed_groups)
        if name == "oracle":
            return Oracle(self.need, self.oracle_lead_seconds)
        if name == "goodput":
            from goodput.simulator.goodput_policy import GoodputPolicy

            return GoodputPolicy.for_setup(self.setup, self.workload, self.envelope)
        raise ValueError(f"unknown autoscaler {name!r}; choose one of {', '.join(POLICIES)}")

    def run(self, name: str) -> tuple[SimulationResult, dict[str, Any]]:
        autoscaler = self.autoscaler(name)
        config = SimulationConfig(
            fleet=self.fleet,
            seed=self.options.seed,
            initial_groups=self.initial_groups if name != "fixed" else self.fixed_groups,
            scrape_interval_seconds=self.options.scrape_interval_seconds,
            scrape_delay_seconds=self.options.scrape_delay_seconds,
            horizon_seconds=self.horizon_seconds,
        )
        result = simulate(self.workload, config, autoscaler, progress=self.options.progress)
        context = {
            "autoscaler": name,
            "autoscaler_parameters": autoscaler.describe(),
            "trace": self.options.trace,
            "seed": self.options.seed,
            "rate_multiplier": self.options.rate_multiplier,
            "time_compression": self.options.time_compression,
            "duration_seconds": self.options.duration_seconds,
            "start_seconds": self.options.start_seconds,
            "router": self.options.router,
            "scrape_interval_seconds": getattr(autoscaler, "scrape_interval_seconds", None)
            or self.options.scrape_interval_seconds,
            "scrape_delay_seconds": getattr(autoscaler, "scrape_delay_seconds", None)
            if getattr(autoscaler, "scrape_delay_seconds", None) is not None
            else self.options.scrape_delay_seconds,
            "initial_groups": config.initial_groups,
            "failure_rate_per_group_hour": self.options.failure_rate_per_group_hour,
            "scheduled_failures_seconds": list(self.options.scheduled_failures_seconds),
            "capacity_envelope": self._envelope_summary(),
            **self.setup.describe(),
        }
        report = summarize(
            result, self.setup.classes, self.options.gpu_hour_price, self.options.bin_seconds, context
        )
        return result, report

    def _envelope_summary(self) -> dict[str, Any] | None:
        if self._envelope is None:
            return None
        envelope = self._envelope
        return {
            "work_seconds_per_second": envelope.work_seconds_per_second,
            "requests_per_second": envelope.requests_per_second,
            "attainment_goal": envelope.attainment_goal,
            "concurrency_at_capacity": envelope.concurrency,
            "trials": envelope.trials,
            "source": "profile.capacityWorkSecondsPerSecond"
            if envelope.trials == 0
            else "measured by simulating one group",
        }


def write_report(report: dict[str, Any], out_dir: Path, title: str) -> list[Path]:
    """report.json and the plots into `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "report.json"
    path.write_text(json.dumps(sanitize(report), indent=2, default=_json_default, allow_nan=False) + "\n")
    return [path, *plot_run(report, title, out_dir)]


def _json_default(value: object) -> object:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def sanitize(report: Any) -> Any:
    """Replace NaN and infinities (not valid JSON) with None, recursively."""
    if isinstance(report, float):
        return report if math.isfinite(report) else None
    if isinstance(report, dict):
        return {key: sanitize(value) for key, value in report.items()}
    if isinstance(report, list | tuple):
        return [sanitize(value) for value in report]
    return report
