"""goodput's own policy in the simulator: the operator's decision pipeline fed with simulated metrics.

Each tick builds the same `ModelGroupSnapshot` the operator builds from Prometheus — per ready group,
the latest scrape's gauges and the window's counter rates and histogram deltas, each with its age —
and calls `goodput.controllers.autoscale.decide` with the policy compiled from the SLOPolicy and the
ModelGroup. Nothing here decides anything; it only translates.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from goodput.api.modelgroup import ModelGroup
from goodput.api.slopolicy import SloPolicy
from goodput.controllers.autoscale import decide
from goodput.controllers.autoscale_model import (
    Decision,
    DecisionState,
    GroupMetrics,
    GroupObservation,
    GroupState,
    ModelGroupSnapshot,
    ScalingPolicy,
    SloTargets,
)
from goodput.controllers.policy_compile import GroupBounds, bounded_scaling_policy
from goodput.controllers.snapshot import wanted_groups, with_wanted_groups
from goodput.estimators.attainment import histogram_delta
from goodput.estimators.capacity import CapacityProfile, build_capacity_profile
from goodput.simulator.config import SimulationSetup
from goodput.simulator.envelope import CapacityEnvelope
from goodput.simulator.metrics import FleetSample, GroupScrape, MetricsView
from goodput.simulator.policy import FleetObservation, PolicyAnswer
from goodput.simulator.report import ClassTargets
from goodput.simulator.workload import Workload

_STATES = {
    "Placing": GroupState.PLACING,
    "Loading": GroupState.PROVISIONING,
    "Ready": GroupState.READY,
    "Draining": GroupState.DRAINING,
    "Failed": GroupState.FAILED,
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


def scaling_policy(
    slo: SloPolicy | None,
    min_groups: int,
    max_groups: int,
    warm_groups: int,
    fallback_classes: tuple[SloTargets, ...],
) -> ScalingPolicy:
    """The decision pipeline's policy: the operator's compile of the SLOPolicy within the run's
    bounds, or the default policy with the fallback classes when the run has no SLOPolicy."""
    bounds = GroupBounds(min_groups, max_groups, warm_groups)
    if slo is None:
        return ScalingPolicy(
            min_groups=min_groups,
            max_groups=max_groups,
            warm_groups=min(warm_groups, max_groups),
            classes=fallback_classes,
        )
    return bounded_scaling_policy(bounds, slo.spec)


def scaling_policy_for(setup: SimulationSetup) -> ScalingPolicy:
    fallback = tuple(_targets(c) for c in setup.classes)
    return scaling_policy(setup.slo_policy, setup.min_groups, setup.max_groups, setup.warm_groups, fallback)


def capacity_profile(
    setup: SimulationSetup, policy: ScalingPolicy, workload: Workload, envelope: CapacityEnvelope | None
) -> CapacityProfile:
    """The group's capacity profile for the decision: the service-time model, calibrated to the
    measured envelope when there is one (as a ModelGroup's profile records a benchmark)."""
    engine = setup.engine
    inputs = workload.input_tokens
    outputs = workload.output_tokens
    profile = build_capacity_profile(
        engine.cost,
        max_num_seqs=engine.max_num_seqs,
        max_num_batched_tokens=engine.max_num_batched_tokens,
        itl_target_seconds=policy.primary_class.itl_seconds,
        ttft_target_seconds=policy.primary_class.ttft_seconds,
        reference_input_tokens=float(inputs.mean()),
        reference_output_tokens=float(outputs.mean()),
        input_tokens_p90=float(np.percentile(inputs, 90)),
        output_tokens_p90_over_mean=float(np.percentile(outputs, 90) / max(1.0, outputs.mean())),
    )
    if envelope is not None:
        profile = profile.calibrated(envelope.work_seconds_per_second)
    return profile


def _group_metrics(
    now: float, latest: FleetSample, metrics: GroupScrape, start: tuple[float, GroupScrape] | None
) -> GroupMetrics:
    """One group's snapshot entry: gauges from the latest scrape, rates and deltas over the window."""
    age = now - latest.time
    if start is None or latest.time <= start[0]:
        return GroupMetrics(
            age_seconds=age,
            waiting_requests=float(metrics.num_requests_waiting),
            running_requests=float(metrics.num_requests_running),
            kv_usage_fraction=metrics.kv_cache_usage_perc,
        )
    since, earlier = start
    span = latest.time - since
    finished = metrics.request_success_total - earlier.request_success_total
    queries = metrics.prefix_cache_queries_total - earlier.prefix_cache_queries_total
    hits = metrics.prefix_cache_hits_total - earlier.prefix_cache_hits_total
    return GroupMetrics(
        age_seconds=age,
        waiting_requests=float(metrics.num_requests_waiting),
        running_requests=float(metrics.num_requests_running),
        kv_usage_fraction=metrics.kv_cache_usage_perc,
        prompt_tokens_per_second=(metrics.prompt_tokens_total - earlier.prompt_tokens_total) / span,
        generation_tokens_per_second=(metrics.generation_tokens_total - earlier.generation_tokens_total)
        / span,
        mean_input_tokens=(metrics.request_prompt_tokens_sum - earlier.request_prompt_tokens_sum) / finished
        if finished > 0
        else None,
        mean_output_tokens=(metrics.request_generation_tokens_sum - earlier.request_generation_tokens_sum)
        / finished
        if finished > 0
        else None,
        prefix_hit_fraction=hits / queries if queries > 0 else 0.0,
        ttft=histogram_delta(metrics.time_to_first_token_seconds, earlier.time_to_first_token_seconds),
        itl=histogram_delta(metrics.inter_token_latency_seconds, earlier.inter_token_latency_seconds),
        queue_time=histogram_delta(metrics.request_queue_time_seconds, earlier.request_queue_time_seconds),
        tpot=None
        if metrics.request_time_per_output_token_seconds is None
        else histogram_delta(
            metrics.request_time_per_output_token_seconds, earlier.request_time_per_output_token_seconds
        ),
        finished_requests=float(finished),
    )


def snapshot_from(
    observation: FleetObservation, profile: CapacityProfile, window_seconds: float, name: str
) -> ModelGroupSnapshot:
    """The `ModelGroupSnapshot` the operator would build at `observation.now`."""
    view: MetricsView = observation.metrics
    latest = view.latest
    by_group = latest.by_group() if latest is not None else {}
    first_seen: dict[str, tuple[float, GroupScrape]] = {}
    if latest is not None:
        for sample in view.within(latest.time - window_seconds - 1e-9):
            for scraped in sample.groups:
                first_seen.setdefault(scraped.group, (sample.time, scraped))
    groups = []
    for info in observation.groups:
        state = _STATES[info.state]
        metrics: GroupMetrics | None = None
        if state is GroupState.READY and latest is not None and info.name in by_group:
            metrics = _group_metrics(observation.now, latest, by_group[info.name], first_seen.get(info.name))
        groups.append(GroupObservation(info.name, state, info.created_at, metrics=metrics))
    # A failed group's replacement not created yet (a replacement delay) is capacity on its way, as
    # the operator counts it; the simulated cluster always has room, so it is never unschedulable.
    wanted = wanted_groups(observation.desired_groups, observation.min_groups, observation.max_groups)
    return ModelGroupSnapshot(
        spec_replicas=observation.desired_groups,
        groups=with_wanted_groups(groups, wanted, now=observation.now, unschedulable=False),
        profile=profile,
        name=name,
        metrics_window_seconds=window_seconds,
    )


@dataclass
class GoodputPolicy:
    """`decide` on every tick, its state threaded from one tick to the next."""

    policy: ScalingPolicy
    profile: CapacityProfile
    model_group: str = "simulated"
    metrics_window_seconds: float = 60.0
    name: str = "goodput"
    state: DecisionState = field(default_factory=DecisionState.initial)
    last_decision: Decision | None = None

    @property
    def interval_seconds(self) -> float:
        return float(self.policy.interval_seconds)

    @classmethod
    def for_setup(
        cls, setup: SimulationSetup, workload: Workload, envelope: CapacityEnvelope | None
    ) -> GoodputPolicy:
        policy = scaling_policy_for(setup)
        group: ModelGroup | None = setup.model_group
        name = (group.metadata.name if group is not None else None) or "simulated"
        return cls(policy, capacity_profile(setup, policy, workload, envelope), model_group=name)

    def describe(self) -> dict[str, float | str]:
        policy = self.policy
        signals = policy.signals
        return {
            "decision": "goodput.controllers.autoscale.decide",
            "policy_revision": policy.revision,
            "interval_seconds": policy.interval_seconds,
            "capacity_work_seconds_per_second": self.profile.reference.work_per_second,
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
        }

    def recommend(self, observation: FleetObservation) -> PolicyAnswer:
        snapshot = snapshot_from(observation, self.profile, self.metrics_window_seconds, self.model_group)
        decision = decide(snapshot, self.policy, self.state, observation.now)
        self.state = decision.next_state
        self.last_decision = decision
        desired = decision.desired_groups if decision.applies else observation.desired_groups
        winner = next((p for p in decision.proposals if p.signal is decision.signal), None)
        detail: dict[str, float | str] = {"signal": str(decision.signal), "guards": ",".join(decision.guards)}
        why = winner.detail if winner is not None else ""
        if winner is not None:
            detail["proposal"] = winner.detail
        if decision.reason != str(decision.signal):
            why = f"signal {decision.signal}: {why}"
        return PolicyAnswer(desired, f"{decision.reason} ({why})", detail)
