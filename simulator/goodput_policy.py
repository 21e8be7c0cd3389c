"""goodput's own policy in the simulator: the operator's decision pipeline fed with simulated metrics.

Each tick builds the same `ModelGroupSnapshot` the operator builds from Prometheus — per ready group,
the latest scrape's gauges and the window's counter rates and histogram deltas, each with its age —
and calls `goodput.controllers.autoscale.decide` with the policy compiled from the SLOPolicy and the
ModelGroup. Nothing here decides anything; it only translates.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from goodput.api.modelgroup import RECENT_READY_SAMPLES, GroupState, ModelGroup, ScheduledReplicas
from goodput.api.reasons import Reason
from goodput.api.slopolicy import SloPolicy
from goodput.controllers.autoscale import decide
from goodput.controllers.autoscale.capacity_learner import (
    LearnerState,
    PriorCapacity,
    capacity_evidence,
    estimate,
    observe,
    with_capacity,
)
from goodput.controllers.autoscale.forecast import (
    DEFAULT_FORECAST_SETTINGS,
    ForecastUnavailable,
    WorkForecaster,
    fit_forecaster,
)
from goodput.controllers.autoscale.model import (
    Decision,
    DecisionState,
    GroupMetrics,
    GroupObservation,
    LearntCapacity,
    ModelGroupSnapshot,
    ScalingPolicy,
    SloTargets,
)
from goodput.controllers.autoscale.ready_time import estimate_ready_time
from goodput.controllers.autoscale.record import forecast_health
from goodput.controllers.autoscale.snapshot import (
    ModelGroupCounts,
    aligned,
    clamped,
    model_group_snapshot,
)
from goodput.controllers.compile.scaling import (
    DEFAULT_RATE_WINDOW_SECONDS,
    CompiledPolicy,
    GroupBounds,
    ReferenceMix,
    bounded_scaling_policy,
    compile_policy,
    drain_target_seconds,
    metrics_window_seconds,
    model_capacity_profile,
    rate_window_seconds,
)
from goodput.controllers.compile.slo_policy import policy_problems
from goodput.estimators.attainment import histogram_delta
from goodput.estimators.capacity import CapacityProfile
from goodput.simulator.config import SimulationSetup
from goodput.simulator.envelope import CapacityEnvelope
from goodput.simulator.fleet_policy import FleetObservation, GroupInfo, PolicyAnswer
from goodput.simulator.gateway import gateway_observation
from goodput.simulator.metrics import FleetSample, GroupScrape, MetricsView
from goodput.simulator.report import ClassTargets
from goodput.simulator.workload import Workload

_STATES: dict[str, GroupState] = {
    "Placing": "Placing",
    "Provisioning": "Provisioning",
    "Ready": "Ready",
    "Draining": "Draining",
    "Failed": "Failed",
}


def _targets(slo_class: ClassTargets) -> SloTargets:
    """The simulator's default class, for a run without an SLOPolicy."""
    return SloTargets(
        slo_class.name,
        slo_class.ttft_seconds,
        slo_class.itl_seconds,
        slo_class.attainment,
        slo_class.percentile,
    )


def what_if_scaling_policy(
    slo: SloPolicy | None,
    min_groups: int,
    max_groups: int,
    warm_groups: int,
    fallback_classes: tuple[SloTargets, ...],
) -> ScalingPolicy:
    """The decision pipeline's policy within a run's bounds: the operator's compile of the SLOPolicy
    (refused, with the operator's words, where the operator would not accept it), or the API's
    defaults with the fallback classes when the run has no SLOPolicy."""
    if slo is None:
        return ScalingPolicy(
            min_groups=min_groups,
            max_groups=max_groups,
            warm_groups=min(warm_groups, max_groups),
            classes=fallback_classes,
        )
    problems = policy_problems(slo.spec)
    if problems:
        raise ValueError("; ".join(problems))
    return bounded_scaling_policy(GroupBounds(min_groups, max_groups, warm_groups), slo.spec)


def workload_mix(workload: Workload) -> ReferenceMix:
    """The request mix a trace measures: the reference a simulated run prices its capacity at."""
    inputs = workload.input_tokens
    outputs = workload.output_tokens
    return ReferenceMix(
        input_tokens=float(inputs.mean()),
        output_tokens=float(outputs.mean()),
        input_tokens_p90=float(np.percentile(inputs, 90)),
        output_tokens_p90_over_mean=float(np.percentile(outputs, 90) / max(1.0, outputs.mean())),
    )


def compile_for_setup(
    setup: SimulationSetup, workload: Workload, envelope: CapacityEnvelope | None
) -> CompiledPolicy:
    """The run's policy and capacity profile through the operator's own compile (`compile_policy`),
    with what the benchmark measures in place of what the API says: the run's bounds, the trace's
    mix and, when there is one, the measured envelope. A policy the operator rejects is refused
    here with the same words (ValueError). A what-if run without a ModelGroup prices the simulated
    engine with the same profile builder."""
    envelope_capacity = envelope.work_seconds_per_second if envelope is not None else None
    mix = workload_mix(workload)
    if setup.model_group is not None and setup.slo_policy is not None:
        compiled = compile_policy(
            setup.model_group,
            setup.slo_policy,
            bounds=GroupBounds(setup.min_groups, setup.max_groups, setup.warm_groups),
            mix=mix,
            envelope_work_seconds_per_second=envelope_capacity,
        )
        if isinstance(compiled, str):
            raise ValueError(compiled)
        return compiled
    fallback = tuple(_targets(c) for c in setup.classes)
    policy = what_if_scaling_policy(
        setup.slo_policy, setup.min_groups, setup.max_groups, setup.warm_groups, fallback
    )
    engine = setup.engine
    profile = model_capacity_profile(
        engine.cost,
        (engine.max_num_seqs, engine.max_num_batched_tokens),
        (policy.primary_class.ttft_seconds, policy.primary_class.itl_seconds),
        mix,
        envelope_capacity,
    )
    window = 60.0 if setup.slo_policy is None else metrics_window_seconds(setup.slo_policy.spec)
    name = "" if setup.slo_policy is None else setup.slo_policy.metadata.name or ""
    return CompiledPolicy(policy=policy, profile=profile, policy_name=name, metrics_window_seconds=window)


def _group_figures(
    now: float,
    latest: FleetSample,
    metrics: GroupScrape,
    rate_start: tuple[float, GroupScrape] | None,
    histogram_start: tuple[float, GroupScrape] | None,
) -> GroupMetrics:
    """One group's figures, as Prometheus would answer the operator's query: gauges from the latest
    scrape; token rates, sums, counts and the request mix over the rate window; outcomes and
    histogram deltas over the goodput window (gauges only before a second scrape)."""
    age = now - latest.time
    gauges = GroupMetrics(
        age_seconds=age,
        waiting_requests=float(metrics.num_requests_waiting),
        running_requests=float(metrics.num_requests_running),
        kv_usage_fraction=metrics.kv_cache_usage_perc,
    )
    with_rates = _rate_figures(gauges, latest, metrics, rate_start)
    if histogram_start is None or latest.time <= histogram_start[0]:
        return with_rates
    earlier = histogram_start[1]
    tpot = metrics.request_time_per_output_token_seconds
    return replace(
        with_rates,
        finished_requests=metrics.request_success_total - earlier.request_success_total,
        ttft=histogram_delta(metrics.time_to_first_token_seconds, earlier.time_to_first_token_seconds),
        itl=histogram_delta(metrics.inter_token_latency_seconds, earlier.inter_token_latency_seconds),
        queue_time=histogram_delta(metrics.request_queue_time_seconds, earlier.request_queue_time_seconds),
        tpot=None if tpot is None else histogram_delta(tpot, earlier.request_time_per_output_token_seconds),
    )


def _rate_figures(
    gauges: GroupMetrics, latest: FleetSample, metrics: GroupScrape, start: tuple[float, GroupScrape] | None
) -> GroupMetrics:
    """The rate window's part: token rates, the prompts begun and finished and their lengths, the
    prefix hits."""
    if start is None or latest.time <= start[0]:
        return gauges
    since, earlier = start
    span = latest.time - since
    finished = metrics.request_success_total - earlier.request_success_total
    begun = histogram_delta(metrics.time_to_first_token_seconds, earlier.time_to_first_token_seconds)
    prompt_tokens_started = metrics.prompt_tokens_total - earlier.prompt_tokens_total
    return replace(
        gauges,
        prompt_tokens_per_second=prompt_tokens_started / span,
        prompts_started=begun.total,
        prompt_tokens_started=prompt_tokens_started,
        generation_tokens_per_second=(metrics.generation_tokens_total - earlier.generation_tokens_total)
        / span,
        prompt_tokens_sum=metrics.request_prompt_tokens_sum - earlier.request_prompt_tokens_sum,
        prompt_tokens_count=finished,
        generation_tokens_sum=metrics.request_generation_tokens_sum - earlier.request_generation_tokens_sum,
        generation_tokens_count=finished,
        prefix_hits=metrics.prefix_cache_hits_total - earlier.prefix_cache_hits_total,
        prefix_queries=metrics.prefix_cache_queries_total - earlier.prefix_cache_queries_total,
    )


def _first_scrapes(view: MetricsView, since: float) -> dict[str, tuple[float, GroupScrape]]:
    """Each group's earliest scrape at or after `since`: where a window's increase starts."""
    first_seen: dict[str, tuple[float, GroupScrape]] = {}
    for sample in view.within(since - 1e-9):
        for scraped in sample.groups:
            first_seen.setdefault(scraped.group, (sample.time, scraped))
    return first_seen


def window_figures(
    observation: FleetObservation, window_seconds: float, rate_window_seconds: float | None = None
) -> dict[str, GroupMetrics]:
    """Every scraped group's figures as of the latest scrape: rates over `rate_window_seconds`
    (default: the whole window), outcomes and histograms over `window_seconds`."""
    view: MetricsView = observation.metrics
    latest = view.latest
    if latest is None:
        return {}
    rate_window = window_seconds if rate_window_seconds is None else min(rate_window_seconds, window_seconds)
    rate_starts = _first_scrapes(view, latest.time - rate_window)
    histogram_starts = _first_scrapes(view, latest.time - window_seconds)
    return {
        name: _group_figures(
            observation.now, latest, scraped, rate_starts.get(name), histogram_starts.get(name)
        )
        for name, scraped in latest.by_group().items()
    }


def group_observations(
    observation: FleetObservation, figures: Mapping[str, GroupMetrics]
) -> list[GroupObservation]:
    """The simulated groups in the decision's vocabulary, the ready ones with their engine metrics."""
    metrics = aligned({name: clamped(entry) for name, entry in figures.items()})
    return [
        GroupObservation(
            info.name,
            _STATES[info.state],
            info.created_at,
            metrics=metrics.get(info.name) if _STATES[info.state] == "Ready" else None,
        )
        for info in observation.groups
    ]


def snapshot_from(
    observation: FleetObservation,
    profile: CapacityProfile,
    window_seconds: float,
    name: str,
    *,
    policy: ScalingPolicy,
    rate_window_seconds: float | None = None,
    declared_ready_seconds: float | None = None,
    measured_ready_seconds: Sequence[float] | None = None,
) -> ModelGroupSnapshot:
    """The `ModelGroupSnapshot` the operator would build at `observation.now`, by the same assembly.

    With a gateway in front, its scraped figures go in as the operator's `gateway_from_result`
    reads them from Prometheus: the decision then counts the gateway's queue and offered requests.
    A failed group's replacement not created yet (a replacement delay) is capacity on its way, as the
    operator counts it; the simulated cluster always has room, so it is never unschedulable, and it
    runs no rollout, so no group is outdated.

    measured_ready_seconds: the recent groups' ready times, as the operator keeps them in
    `status.readyTime.recent` (absent: those of the groups observed now).
    """
    counts = ModelGroupCounts(observation.desired_groups, observation.min_groups, observation.max_groups)
    scraped = [
        (sample.time, sample.gateway) for sample in observation.metrics.samples if sample.gateway is not None
    ]
    return model_group_snapshot(
        group_observations(observation, window_figures(observation, window_seconds, rate_window_seconds)),
        counts,
        profile=profile,
        policy=policy,
        name=name,
        metrics_window_seconds=window_seconds,
        now=observation.now,
        gateway=gateway_observation(scraped, observation.now, window_seconds, rate_window_seconds),
        ready_time=estimate_ready_time(
            declared_ready_seconds,
            measured_ready_seconds if measured_ready_seconds is not None else ready_seconds_of(observation),
        ),
    )


def measured_ready(info: GroupInfo) -> float | None:
    """A group's ready time, once it became ready; None for a group the run started warm (created
    ready at the start: it has no ready time, and a 0 would drag the estimate down)."""
    if info.ready_at is None or info.ready_at <= info.created_at:
        return None
    return info.ready_at - info.created_at


def ready_seconds_of(observation: FleetObservation) -> list[float]:
    """The ready time of each observed group that became ready."""
    return [seconds for info in observation.groups if (seconds := measured_ready(info)) is not None]


@dataclass(frozen=True, slots=True)
class ReadyHistory:
    """The latest groups' ready times, kept after the groups are gone, as `status.readyTime.recent`
    keeps them: a group once (names are never reused), at most RECENT_READY_SAMPLES, newest first."""

    samples: tuple[tuple[str, float, float], ...] = ()
    """(group, ready at, ready seconds), newest first."""

    def seen(self, observation: FleetObservation) -> ReadyHistory:
        known = {name for name, _, _ in self.samples}
        new = [
            (info.name, info.ready_at, seconds)
            for info in observation.groups
            if info.ready_at is not None
            and info.name not in known
            and (seconds := measured_ready(info)) is not None
        ]
        merged = sorted([*new, *self.samples], key=lambda sample: sample[1], reverse=True)
        return ReadyHistory(tuple(merged[:RECENT_READY_SAMPLES]))

    @property
    def seconds(self) -> list[float]:
        return [seconds for _, _, seconds in self.samples]


@dataclass
class GoodputPolicy:
    """`decide` on every tick, its state threaded from one tick to the next."""

    policy: ScalingPolicy
    profile: CapacityProfile
    model_group: str = "simulated"
    metrics_window_seconds: float = 60.0
    rate_window_seconds: float = DEFAULT_RATE_WINDOW_SECONDS
    """The operator's default (GOODPUT_PROMETHEUS_RATE_WINDOW_SECONDS), capped by the goodput window
    as the operator caps it."""
    declared_ready_seconds: float | None = None
    """The ModelGroup's `profile.readyTimeSeconds`; absent: learnt from the simulated groups."""
    name: str = "goodput"
    state: DecisionState = field(default_factory=DecisionState.initial)
    ready_history: ReadyHistory = field(default_factory=ReadyHistory)
    last_decision: Decision | None = None
    learn_capacity: bool = False
    """Refine the profile's capacity from the simulated engines (`capacity_learner`), as the operator
    does; off: the profile's capacity is used as compiled."""
    learner: LearnerState = field(default_factory=LearnerState)
    capacity_history: list[tuple[float, LearntCapacity]] = field(default_factory=list)
    """Each tick's capacity in use, for a benchmark of how fast it converges."""
    forecast: bool = False
    """Run the operator's forecaster (`spec.forecast`) on `offered_history`, refitted every
    `ForecastSettings.refresh_seconds` of simulated time; off: the decision only reacts."""
    offered_history: list[tuple[float, float]] = field(default_factory=list)
    """Offered work per second by time: what the run started with (a benchmark's previous days)
    and, appended each tick, the arrival estimate of every decision, as the operator reads its own
    exported series back from Prometheus."""
    forecaster: WorkForecaster | None = None
    forecast_fitted_at: float | None = None
    forecast_outcomes: list[tuple[float, str]] = field(default_factory=list)
    """Each fit's outcome by time: ForecastReady or why not (the Forecasting condition's reason)."""
    replica_schedule: tuple[ScheduledReplicas, ...] = ()
    """The ModelGroup's `spec.replicaSchedule` (simulated time 0 is 1970-01-01 00:00 UTC)."""

    @property
    def interval_seconds(self) -> float:
        return float(self.policy.interval_seconds)

    @property
    def effective_rate_window_seconds(self) -> float:
        """The window the operator reads this policy's rates over (`rate_window_seconds`)."""
        return rate_window_seconds(
            self.metrics_window_seconds, self.rate_window_seconds, drain_target_seconds(self.policy)
        )

    @classmethod
    def for_setup(
        cls,
        setup: SimulationSetup,
        workload: Workload,
        envelope: CapacityEnvelope | None,
        *,
        capacity_prior_factor: float = 1.0,
        learn_capacity: bool = False,
        forecast: bool = False,
        offered_history: list[tuple[float, float]] | None = None,
    ) -> GoodputPolicy:
        """The policy the operator would run for the setup. capacity_prior_factor scales the
        compiled capacity (the simulator's own, or its measured envelope) to start from a wrong
        prior; learn_capacity runs the operator's capacity learner; forecast its forecaster, on
        `offered_history` (work-seconds per second by simulated time, before 0 for days before the
        run) and the run's own decisions."""
        if not (capacity_prior_factor > 0 and math.isfinite(capacity_prior_factor)):
            raise ValueError(
                f"--capacity-prior-factor must be a positive number, not {capacity_prior_factor}"
            )
        compiled = compile_for_setup(setup, workload, envelope)
        group: ModelGroup | None = setup.model_group
        name = (group.metadata.name if group is not None else None) or "simulated"
        declared = group.spec.profile.ready_time_seconds if group and group.spec.profile else None
        ready = None if declared is None else float(declared)
        profile = compiled.profile
        if capacity_prior_factor != 1.0:
            profile = profile.calibrated(profile.reference.work_per_second * capacity_prior_factor)
        return cls(
            compiled.policy,
            profile,
            model_group=name,
            metrics_window_seconds=compiled.metrics_window_seconds,
            declared_ready_seconds=ready,
            learn_capacity=learn_capacity,
            forecast=forecast,
            offered_history=list(offered_history or ()),
            replica_schedule=group.spec.replica_schedule if group is not None else (),
        )

    def describe(self) -> dict[str, float | str]:
        policy = self.policy
        signals = policy.signals
        return {
            "decision": "goodput.controllers.autoscale.decide",
            "policy_revision": policy.revision,
            "interval_seconds": policy.interval_seconds,
            "capacity_work_seconds_per_second": self.profile.reference.work_per_second,
            "capacity_learning": "on" if self.learn_capacity else "off",
            "forecast": "on" if self.forecast else "off",
            "queue_work": "off"
            if signals.queue_work is None
            else f"T_d={signals.queue_work.drain_target_seconds:g}s s={signals.queue_work.safety_factor:g}",
            "slack": "off" if signals.slack is None else f"min={signals.slack.min_slack_seconds:g}s",
            "kv_cache": "off"
            if signals.kv_cache is None
            else f"min_free={signals.kv_cache.min_free_fraction:g}",
            "goodput": "off"
            if signals.goodput is None
            else f"floor={signals.goodput.attainment_floor:g} "
            f"max_fruitless_steps={signals.goodput.max_fruitless_steps}",
            "scale_down_window_seconds": policy.scale_down.stabilization_window_seconds,
            "metrics_window_seconds": self.metrics_window_seconds,
            "rate_window_seconds": self.effective_rate_window_seconds,
        }

    def forecaster_at(self, now: float, horizon_seconds: float | None) -> WorkForecaster | None:
        """The forecaster this tick reads: refitted when due, as the operator's history read is."""
        settings = DEFAULT_FORECAST_SETTINGS
        if not self.forecast:
            return None
        if self.forecast_fitted_at is None or now - self.forecast_fitted_at >= settings.refresh_seconds:
            self.forecast_fitted_at = now
            fitted: WorkForecaster | ForecastUnavailable | None = None
            if horizon_seconds is not None:
                since = now - settings.history_seconds
                history = [sample for sample in self.offered_history if since <= sample[0] <= now]
                fitted = fit_forecaster(history, horizon_seconds, settings)
            self.forecaster = fitted if isinstance(fitted, WorkForecaster) else None
            outcome = Reason.READY_TIME_UNKNOWN if fitted is None else forecast_health(fitted).reason
            self.forecast_outcomes.append((now, outcome))
        forecaster = self.forecaster
        if forecaster is None or now - forecaster.history_end > forecaster.max_age_seconds:
            return None
        return forecaster

    def capacity_in_use(self, now: float) -> LearntCapacity:
        """The capacity this tick decides with: the learner's estimate, or the compiled prior."""
        prior = PriorCapacity(self.profile.reference.work_per_second, learn=self.learn_capacity)
        return estimate(self.learner, prior, now)

    def recommend(self, observation: FleetObservation) -> PolicyAnswer:
        capacity = self.capacity_in_use(observation.now)
        self.ready_history = self.ready_history.seen(observation)
        snapshot = snapshot_from(
            observation,
            with_capacity(self.profile, capacity),
            self.metrics_window_seconds,
            self.model_group,
            policy=self.policy,
            rate_window_seconds=self.effective_rate_window_seconds,
            declared_ready_seconds=self.declared_ready_seconds,
            measured_ready_seconds=self.ready_history.seconds,
        )
        snapshot = replace(
            snapshot,
            capacity=capacity,
            replica_schedule=self.replica_schedule,
            forecaster=self.forecaster_at(observation.now, snapshot.group_ready_seconds),
        )
        decision = decide(snapshot, self.policy, self.state, observation.now)
        self.state = decision.next_state
        arrival = decision.estimates.arrival_work_rate
        if self.forecast and arrival is not None:
            self.offered_history.append((observation.now, arrival))
        self.last_decision = decision
        self.capacity_history.append((observation.now, capacity))
        if self.learn_capacity:
            evidence = capacity_evidence(decision, self.profile, identity=self.model_group)
            if evidence is not None:
                self.learner = observe(self.learner, evidence, observation.now)
        desired = decision.desired_groups if decision.applies else observation.desired_groups
        winner = next((p for p in decision.proposals if p.signal is decision.signal), None)
        detail: dict[str, float | str] = {"signal": str(decision.signal), "guards": ",".join(decision.guards)}
        why = winner.detail if winner is not None else ""
        if winner is not None:
            detail["proposal"] = winner.detail
        if decision.reason != str(decision.signal):
            why = f"signal {decision.signal}: {why}"
        return PolicyAnswer(desired, f"{decision.reason} ({why})", detail)
