"""Assemble a run from the command line's choices: workload, fleet, policy; then write its report.

`goodput simulate` runs one policy, `goodput bench` all of them on the same workload and seed; both
go through `Bench`, which measures the capacity envelope once and shares it between the oracle, the
warm start, the fixed fleet's size and goodput's own policy.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from goodput.controllers.compile.request_path import RequestPathPolicy, compile_request_path
from goodput.estimators.work import WorkPricing
from goodput.simulator.baselines import BASELINE_SETTINGS, FixedFleet, baseline_policy
from goodput.simulator.batched import BatchedRunSettings, check_tick_seconds, simulate_batched
from goodput.simulator.config import SimulationSetup
from goodput.simulator.envelope import (
    CapacityEnvelope,
    EnvelopeSearch,
    demand_groups,
    measure_envelope,
    request_work_seconds,
)
from goodput.simulator.feasible import Feasibility, assess, require_feasible_requests
from goodput.simulator.fleet import FleetConfig
from goodput.simulator.fleet_policy import FleetPolicy
from goodput.simulator.oracle import ScheduleFollower, ScheduleRules, hindsight_schedule, interval_work
from goodput.simulator.report import DEFAULT_GPU_HOUR_PRICE, meets_every_class, summarize
from goodput.simulator.simulation import SimulationConfig, SimulationResult, simulate
from goodput.simulator.workload import ClassRule, Workload, class_weights_from, load_trace, prepare

POLICIES = (
    "goodput",
    "hpa",
    "hpa-running",
    "keda",
    "keda-queue",
    "keda-cron-queue",
    "kpa",
    "fixed",
    "oracle",
)


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
    capacity_trial_seconds: float = 300.0
    kpa_target_per_group: float = 16.0
    baseline_settings: tuple[tuple[str, str], ...] = ()
    """A baseline's settings by name (`baselines.BASELINE_SETTINGS`), checked when it is built."""
    capacity_prior_factor: float = 1.0
    """goodput's capacity prior as a multiple of the simulator's own (to start from a wrong one)."""
    learn_capacity: bool = False
    """goodput refines its capacity from the simulated engines, as the operator does."""
    forecast: bool = False
    """goodput runs the operator's forecaster on the offered work its own decisions estimated."""
    gateway: bool = False
    """Put the gateway's request path (admission, fair queue, routing) in front of the groups."""
    engine: str = "event"
    """`event`: every engine step an event (every policy, the gateway, failures); `batched`: the
    whole fleet advanced in ticks of `tick_seconds`, for fleets of hundreds or thousands of groups
    (the `fixed` policy only; `simulator.batched`)."""
    tick_seconds: float = 0.1


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
    _feasibility: Feasibility | None = field(default=None, init=False)
    request_path: RequestPathPolicy | None = field(default=None, init=False)
    search: EnvelopeSearch | None = field(default=None, init=False)
    """How the envelope is measured when the profile holds no figure (default: `EnvelopeSearch`)."""

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
            window = (
                f"the window --start-seconds {options.start_seconds:g}"
                if options.start_seconds is not None
                else "the trace"
            )
            raise ValueError(
                f"{options.trace}: no requests in {window}"
                + (f" --duration-seconds {options.duration_seconds:g}" if options.duration_seconds else "")
                + f" ({len(raw)} requests over {raw.span_seconds:.0f} s before the transforms)"
            )
        self.fleet = replace(
            setup.fleet(),
            router=options.router,
            failure_rate_per_group_hour=options.failure_rate_per_group_hour,
            scheduled_failures_seconds=options.scheduled_failures_seconds,
            prefix_block_tokens=self.workload.prefix_block_tokens,
        )
        self.pricing = WorkPricing.from_step_model(setup.engine.cost)
        self.request_path = request_path_for(setup) if options.gateway else None

    @property
    def horizon_seconds(self) -> float:
        return self.options.duration_seconds or self.workload.span_seconds

    # ------------------------------------------------------------------ shared calibration
    def meets_slo(self, result: SimulationResult) -> bool:
        return bool(meets_every_class(result, self.setup.classes))

    @property
    def feasibility(self) -> Feasibility:
        """Which requests can meet their class's SLO on an idle group (the rest no policy can serve)."""
        if self._feasibility is None:
            self._feasibility = assess(self.workload, self.setup.engine, self.setup.classes)
        return self._feasibility

    @property
    def envelope(self) -> CapacityEnvelope:
        """C of one group on this workload: from the profile when it records one, else measured on the
        feasible requests by a fleet of several groups (`measure_envelope`)."""
        if self._envelope is None:
            measured = self.setup.measured_capacity_work_seconds_per_second
            goal = min(c.attainment for c in self.setup.classes)
            if measured is not None:
                feasible = self.workload.take(np.flatnonzero(self.feasibility.feasible), "feasible requests")
                work = request_work_seconds(self.pricing, feasible if len(feasible) else self.workload)
                self._envelope = CapacityEnvelope(measured, measured / float(work.mean()), goal, 0)
            else:
                self._envelope = measure_feasible_envelope(
                    self.setup,
                    self.fleet,
                    self.workload,
                    self.feasibility,
                    pricing=self.pricing,
                    search=self.search or EnvelopeSearch(trial_seconds=self.options.capacity_trial_seconds),
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

    @property
    def schedule_rules(self) -> ScheduleRules:
        """What the oracle's schedule respects: ready time, the HPA-default step limit, min lifetime."""
        group = self.setup.model_group
        lifetime = float(group.spec.drain.min_lifetime_seconds) if group is not None else 300.0
        return ScheduleRules(
            lead_seconds=self.oracle_lead_seconds,
            min_lifetime_seconds=lifetime,
            min_groups=self.setup.min_groups,
            max_groups=self.setup.max_groups,
        )

    # ------------------------------------------------------------------ policies
    def autoscaler(self, name: str) -> FleetPolicy:
        if name in BASELINE_SETTINGS:
            settings = dict(self.options.baseline_settings)
            if name == "kpa":
                settings.setdefault("target", str(self.options.kpa_target_per_group))
            return baseline_policy(name, settings, fixed_groups=self.fixed_groups)
        if name == "oracle":
            rules = self.schedule_rules
            feasible = self.feasibility.feasible
            work = interval_work(
                self.workload.arrival_seconds[feasible],
                request_work_seconds(self.pricing, self.workload)[feasible],
                self.horizon_seconds,
                rules.interval_seconds,
            )
            return ScheduleFollower(
                hindsight_schedule(work, self.envelope.work_seconds_per_second, 1.0, rules), rules, 1.0
            )
        if name == "goodput":
            from goodput.simulator.goodput_policy import GoodputPolicy

            return GoodputPolicy.for_setup(
                self.setup,
                self.workload,
                self.envelope,
                capacity_prior_factor=self.options.capacity_prior_factor,
                learn_capacity=self.options.learn_capacity,
                forecast=self.options.forecast,
            )
        raise ValueError(f"unknown autoscaler {name!r}; choose one of {', '.join(POLICIES)}")

    def run(
        self, name: str, autoscaler: FleetPolicy | None = None
    ) -> tuple[SimulationResult, dict[str, Any]]:
        """One policy's replay and report; `autoscaler`: one already built by `autoscaler(name)`,
        for a caller that reads its state afterwards (a benchmark of the capacity it learnt)."""
        if autoscaler is None:
            autoscaler = self.autoscaler(name)
        config = SimulationConfig(
            fleet=self.fleet,
            seed=self.options.seed,
            initial_groups=autoscaler.groups if isinstance(autoscaler, FixedFleet) else self.initial_groups,
            scrape_interval_seconds=self.options.scrape_interval_seconds,
            scrape_delay_seconds=self.options.scrape_delay_seconds,
            horizon_seconds=self.horizon_seconds,
            request_path=self.request_path,
        )
        result = self._replay(name, config, autoscaler)
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
            "engine": self.options.engine,
            "tick_seconds": self.options.tick_seconds if self.options.engine == "batched" else None,
            "gateway": self.request_path is not None,
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

    def _replay(self, name: str, config: SimulationConfig, autoscaler: FleetPolicy) -> SimulationResult:
        if self.options.engine == "event":
            return simulate(self.workload, config, autoscaler, progress=self.options.progress)
        self.check_batched(name)
        settings = BatchedRunSettings(
            groups=config.initial_groups,
            tick_seconds=self.options.tick_seconds,
            horizon_seconds=config.horizon_seconds,
            tail_seconds=config.tail_seconds,
        )
        return simulate_batched(self.workload, self.fleet, settings)

    def check_batched(self, name: str) -> None:
        """The batched engine runs a fixed fleet, without the gateway or failures: say so up front."""
        options = self.options
        unsupported = [
            (name != "fixed", f"--autoscaler {name} (it runs the fixed fleet only: --autoscaler fixed)"),
            (options.gateway, "--gateway"),
            (options.failure_rate_per_group_hour > 0 or bool(options.scheduled_failures_seconds), "failures"),
        ]
        refused = [what for condition, what in unsupported if condition]
        if refused:
            raise ValueError(f"--engine batched does not model {', '.join(refused)}")
        check_tick_seconds(options.tick_seconds, "--tick-seconds")

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
            "failing_requests_per_second": envelope.failing_requests_per_second,
            "attainment_lower_bounds_95": list(envelope.attainment_lower_bounds),
            "source": "profile.capacityWorkSecondsPerSecond"
            if envelope.trials == 0
            else f"measured on feasible requests: {envelope.groups} groups, {envelope.repeats} repeats",
        }


def request_path_for(setup: SimulationSetup) -> RequestPathPolicy:
    """The gateway's policy, compiled from the ModelGroup and the SLOPolicy as the gateway compiles
    it; both manifests are needed (the request path prices and limits come from both)."""
    if setup.model_group is None or setup.slo_policy is None:
        raise ValueError(
            "--gateway needs --modelgroup and --policy: the request path is compiled from both manifests"
        )
    compiled = compile_request_path(setup.model_group, setup.slo_policy)
    if isinstance(compiled, str):
        raise ValueError(f"--gateway: the request path cannot be compiled: {compiled}")
    return compiled


def analytic_rate_per_group(setup: SimulationSetup, workload: Workload, pricing: WorkPricing) -> float:
    """The service-time model's capacity of one group in requests per second, before any measured
    figure calibrates it: where the measured envelope's search starts."""
    from goodput.controllers.compile.scaling import model_capacity_profile
    from goodput.simulator.goodput_policy import workload_mix

    engine, primary = setup.engine, setup.classes[0]
    analytic = model_capacity_profile(
        engine.cost,
        (engine.max_num_seqs, engine.max_num_batched_tokens),
        (primary.ttft_seconds, primary.itl_seconds),
        workload_mix(workload),
        None,
    )
    return float(analytic.reference.work_per_second / request_work_seconds(pricing, workload).mean())


def measure_feasible_envelope(
    setup: SimulationSetup,
    fleet: FleetConfig,
    workload: Workload,
    feasibility: Feasibility,
    *,
    pricing: WorkPricing,
    search: EnvelopeSearch,
    seed: int,
) -> CapacityEnvelope:
    """C of one group measured on the workload's feasible requests by a fleet behind the router, the
    search starting at the service-time model's rate: one recipe for `goodput envelope`, the fair
    benchmark's training window and `goodput ab`'s. No feasible request of a class is an error."""
    require_feasible_requests(feasibility, setup.classes)
    feasible = workload.take(np.flatnonzero(feasibility.feasible), "feasible requests")
    return measure_envelope(
        fleet,
        feasible,
        setup.classes,
        pricing=pricing,
        first_guess_rate_per_group=analytic_rate_per_group(setup, feasible, pricing),
        search=search,
        seed=seed,
    )


def optional_plots() -> ModuleType | None:
    """The plotting module, or None (said on stderr) when the `plots` extra is not installed: the
    simulator's figures do not depend on matplotlib, only its pictures do."""
    if importlib.util.find_spec("matplotlib") is None:
        print("plots skipped: matplotlib is not installed (pip install 'goodput[plots]')", file=sys.stderr)
        return None
    from goodput.simulator import plots

    return plots


def write_report(report: dict[str, Any], out_dir: Path, title: str) -> list[Path]:
    """report.json and the plots into `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "report.json"
    path.write_text(json.dumps(sanitize(report), indent=2, default=_json_default, allow_nan=False) + "\n")
    plots = optional_plots()
    return [path, *(plots.plot_run(report, title, out_dir) if plots is not None else [])]


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
