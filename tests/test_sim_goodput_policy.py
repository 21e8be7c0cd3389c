"""goodput's policy in the simulator: the snapshot it builds for `decide`, and the policy it compiles."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from goodput.api.slopolicy import SloPolicy
from goodput.controllers.autoscale.model import (
    Mode,
    ScalingPolicy,
    SloTargets,
    StaleMetricsAction,
    StepPolicyType,
)
from goodput.controllers.compile import scaling
from goodput.estimators.capacity import build_capacity_profile
from goodput.estimators.service_time import H100_80G, LLAMA_3_1_8B
from goodput.simulator.config import build_setup, load_model_group, load_slo_policy
from goodput.simulator.engine import EngineConfig
from goodput.simulator.fleet import FleetConfig
from goodput.simulator.fleet_policy import FleetObservation, GroupInfo
from goodput.simulator.goodput_policy import (
    GoodputPolicy,
    ReadyHistory,
    snapshot_from,
    what_if_scaling_policy,
)
from goodput.simulator.metrics import (
    ITL_BUCKETS_SECONDS,
    TTFT_BUCKETS_SECONDS,
    FleetSample,
    GroupScrape,
    HistogramAccumulator,
    MetricsView,
)
from goodput.simulator.report import judge
from goodput.simulator.simulation import SimulationConfig, simulate
from goodput.simulator.workload import BurstSpec, ClassRule, Workload, assign_classes, synthetic_bursts

ENGINE = EngineConfig.for_hardware(LLAMA_3_1_8B, H100_80G)
PROFILE = build_capacity_profile(
    ENGINE.cost,
    max_num_seqs=1024,
    max_num_batched_tokens=8192,
    itl_target_seconds=0.08,
    ttft_target_seconds=1.0,
)

POLICY = ScalingPolicy(min_groups=1, max_groups=8, classes=(SloTargets("chat", 1.0, 0.08),))


def scraped(
    name: str,
    *,
    prompt: int,
    finished: int,
    prompt_sum: int,
    ttfts: tuple[float, ...],
    waiting: int = 0,
    serving: bool = True,
) -> GroupScrape:
    ttft = HistogramAccumulator(TTFT_BUCKETS_SECONDS)
    tpot = HistogramAccumulator(ITL_BUCKETS_SECONDS)
    for value in ttfts:
        ttft.observe(value)
        tpot.observe(value / 20)
    empty = HistogramAccumulator(TTFT_BUCKETS_SECONDS).snapshot()
    return GroupScrape(
        group=name,
        serving=serving,
        num_requests_running=3,
        num_requests_waiting=waiting,
        kv_cache_usage_perc=0.25,
        kv_cache_size_tokens=400_000,
        prompt_tokens_total=prompt,
        generation_tokens_total=2 * prompt,
        prefix_cache_queries_total=prompt,
        prefix_cache_hits_total=prompt // 4,
        num_preemptions_total=0,
        request_success_total=finished,
        request_prompt_tokens_sum=prompt_sum,
        request_generation_tokens_sum=finished * 100,
        gpu_busy_seconds_total=0.0,
        in_flight_seconds_total=0.0,
        waiting_prompt_tokens=0,
        time_to_first_token_seconds=ttft.snapshot(),
        inter_token_latency_seconds=empty,
        request_queue_time_seconds=empty,
        e2e_request_latency_seconds=empty,
        request_time_per_output_token_seconds=tpot.snapshot(),
    )


def test_a_replacement_not_created_yet_counts_as_placing_as_the_operator_counts_it() -> None:
    """A failed group's replacement waits out the replacement delay: wanted, not created. The
    operator's snapshot counts such a group as placing capacity; so must the simulator's."""
    observation = FleetObservation(
        now=30.0,
        desired_groups=3,
        placing_groups=0,
        provisioning_groups=0,
        ready_groups=2,
        draining_groups=0,
        min_groups=1,
        max_groups=8,
        metrics=MetricsView(30.0, ()),
        groups=(GroupInfo("group-0", "Ready", 0.0, 0.0), GroupInfo("group-1", "Ready", 0.0, 0.0)),
    )
    snapshot = snapshot_from(observation, PROFILE, window_seconds=60.0, name="llama", policy=POLICY)
    assert [(g.state, g.unschedulable) for g in snapshot.groups] == [
        ("Ready", False),
        ("Ready", False),
        ("Placing", False),
    ]
    assert snapshot.groups[-1].created_at == 30.0


def test_the_snapshot_carries_gauges_window_rates_and_histogram_deltas_per_ready_group() -> None:
    start = scraped("group-0", prompt=1000, finished=10, prompt_sum=10_000, ttfts=(0.05,) * 10)
    end = scraped(
        "group-0", prompt=61_000, finished=70, prompt_sum=70_000, ttfts=(0.05,) * 10 + (2.0,) * 60, waiting=4
    )
    view = MetricsView(70.0, (FleetSample(0.0, (start,)), FleetSample(60.0, (end,))))
    observation = FleetObservation(
        now=72.0,
        desired_groups=3,
        placing_groups=1,
        provisioning_groups=1,
        ready_groups=1,
        draining_groups=1,
        min_groups=1,
        max_groups=8,
        metrics=view,
        groups=(
            GroupInfo("group-0", "Ready", 0.0, 0.0),
            GroupInfo("group-1", "Placing", 50.0, None),
            GroupInfo("group-2", "Provisioning", 40.0, None),
            GroupInfo("group-3", "Draining", 0.0, 0.0),
        ),
    )
    snapshot = snapshot_from(observation, PROFILE, window_seconds=60.0, name="llama", policy=POLICY)
    assert snapshot.spec_replicas == 3
    assert [g.state for g in snapshot.groups] == [
        "Ready",
        "Placing",
        "Provisioning",
        "Draining",
    ]
    assert all(g.metrics is None for g in snapshot.groups[1:])
    metrics = snapshot.groups[0].metrics
    assert metrics is not None
    assert metrics.age_seconds == pytest.approx(12.0)
    assert metrics.waiting_requests == 4.0
    assert metrics.prompt_tokens_per_second == pytest.approx(1000.0)
    assert metrics.mean_input_tokens == pytest.approx(1000.0)  # 60 000 prompt tokens over 60 requests
    assert metrics.mean_output_tokens == pytest.approx(100.0)
    assert metrics.prefix_hit_fraction == pytest.approx(0.25)
    assert metrics.finished_requests == 60.0
    assert metrics.ttft is not None and metrics.ttft.total == 60.0  # only the window's observations
    assert metrics.tpot is not None and metrics.tpot.total == 60.0
    at_bound = ITL_BUCKETS_SECONDS.index(0.1)  # each TPOT is 2.0 s / 20 = 0.1 s
    assert metrics.tpot.cumulative_counts[at_bound - 1 : at_bound + 1] == (0.0, 60.0)


SLO = SloPolicy.model_validate(
    {
        "apiVersion": "goodput.dev/v1alpha1",
        "kind": "SLOPolicy",
        "metadata": {"name": "chat"},
        "spec": {
            "revision": "r1",
            "classes": [
                {
                    "name": "chat",
                    "ttftSeconds": 1.0,
                    "itlSeconds": 0.08,
                    "attainment": 0.99,
                    "percentile": 0.95,
                }
            ],
            "autoscaling": {
                "mode": "Advisory",
                "intervalSeconds": 10,
                "signals": {
                    "queueWork": {"drainTargetSeconds": 20, "safetyFactor": 1.5},
                    "goodput": {"enabled": False},
                },
                "scaleDown": {
                    "stabilizationWindowSeconds": 120,
                    "policies": [{"type": "Groups", "value": 1, "periodSeconds": 60}],
                },
                "metrics": {"maxAgeSeconds": 30, "onStale": "Freeze"},
            },
        },
    }
)


def test_the_slo_policy_compiles_into_the_decision_pipelines_policy() -> None:
    policy = what_if_scaling_policy(SLO, 1, 6, 2, fallback_classes=())
    assert (policy.min_groups, policy.max_groups, policy.warm_groups) == (1, 6, 2)
    assert policy.mode is Mode.ADVISORY and policy.interval_seconds == 10.0 and policy.revision == "r1"
    assert policy.classes == (SloTargets("chat", 1.0, 0.08, 0.99, 0.95),)
    assert policy.signals.queue_work is not None and policy.signals.queue_work.safety_factor == 1.5
    assert policy.signals.goodput is None
    assert policy.scale_down.stabilization_window_seconds == 120.0
    assert policy.scale_down.policies[0].type is StepPolicyType.GROUPS
    assert policy.staleness.action is StaleMetricsAction.FREEZE


def test_goodput_scales_out_a_burst_through_the_decision_pipeline() -> None:
    spec = BurstSpec(
        duration_seconds=400.0,
        base_rate_per_second=4.0,
        burst_start_seconds=100.0,
        burst_seconds=300.0,
        burst_multiplier=8.0,
        input_median_tokens=800,
        output_median_tokens=150,
    )
    workload = assign_classes(synthetic_bursts(spec, seed=3), ClassRule(("chat",), (1.0,)), seed=3)
    classes = (SloTargets("chat", 1.0, 0.08, 0.99),)
    policy = GoodputPolicy(what_if_scaling_policy(None, 1, 8, 0, classes), PROFILE)
    config = SimulationConfig(
        fleet=FleetConfig(engine=ENGINE, gpus_per_group=1, max_groups=8, ready_time_median_seconds=30.0),
        seed=3,
        initial_groups=1,
        control_start_seconds=15.0,
    )
    result = simulate(workload, config, policy)
    ups = [event for event in result.scale_events if event.to_groups > event.from_groups]
    assert ups and ups[0].time > 100.0  # nothing to do before the burst
    assert max(event.to_groups for event in ups) >= 3
    assert policy.last_decision is not None and policy.last_decision.policy_revision == ""
    assert np.isfinite(result.gpu_seconds)


SAMPLES = Path(__file__).resolve().parents[1] / "manifests" / "samples"


def test_the_simulator_compiles_a_sample_exactly_as_the_operator_does() -> None:
    group = load_model_group(SAMPLES / "modelgroup-llama-8b-tp1.yaml")
    slo = load_slo_policy(SAMPLES / "slopolicy-interactive.yaml")
    spec = group.spec
    simulated = what_if_scaling_policy(
        slo, spec.min_replicas, spec.max_replicas, spec.warm_replicas, fallback_classes=()
    )
    assert simulated == scaling.scaling_policy(spec, slo.spec)


def bursts_around_a_lull(burst_seconds: float, lull_seconds: float) -> Workload:
    """Two conversation bursts at 30 requests/s (two groups' work) with a lull at 2/s between them."""
    rng = np.random.default_rng(5)
    second_start = burst_seconds + lull_seconds
    phases = ((0.0, burst_seconds, 30.0), (burst_seconds, second_start, 2.0),
              (second_start, second_start + burst_seconds, 30.0))  # fmt: skip
    pieces = [rng.uniform(start, end, rng.poisson(rate * (end - start))) for start, end, rate in phases]
    arrivals = np.sort(np.concatenate(pieces))
    inputs, outputs = rng.integers(200, 2000, arrivals.size), rng.integers(50, 400, arrivals.size)
    return assign_classes(Workload("lull", arrivals, inputs, outputs), ClassRule(("chat",), (1.0,)), seed=5)


def test_the_interactive_sample_keeps_its_groups_through_a_lull_shorter_than_its_scale_down_window() -> None:
    """A group scaled in between bursts serves the next one only after its ready time (120 s for the
    8B sample), so the sample's scale-down window outlasts the lulls of conversation traffic: with a
    two-minute window the second burst below met 13 % of its requests."""
    setup = build_setup(SAMPLES / "modelgroup-llama-8b-tp1.yaml", SAMPLES / "slopolicy-interactive.yaml")
    burst_seconds, lull_seconds = 300.0, 240.0
    workload = bursts_around_a_lull(burst_seconds, lull_seconds)
    fleet = replace(setup.fleet(), ready_time_sigma=0.0)
    config = SimulationConfig(
        fleet=fleet, seed=5, initial_groups=2, horizon_seconds=2 * burst_seconds + lull_seconds
    )
    result = simulate(workload, config, GoodputPolicy.for_setup(setup, workload, None))

    second_start = burst_seconds + lull_seconds
    scale_ins = [e for e in result.scale_events if e.to_groups < e.from_groups and e.time < second_start]
    assert scale_ins == []
    second_burst = workload.arrival_seconds >= second_start
    met = judge(result, setup.classes).met
    assert met[second_burst].mean() >= setup.classes[0].attainment


def test_what_only_the_operators_compile_had_holds_in_the_simulator() -> None:
    """An SLOPolicy with no step policies compiles (no step limit); warm groups never exceed the
    maximum."""
    body = SLO.model_dump(mode="json", by_alias=True)
    body["spec"]["autoscaling"]["scaleUp"] = {"policies": []}
    no_steps = SloPolicy.model_validate(body)
    policy = what_if_scaling_policy(no_steps, 1, 6, 9, fallback_classes=())
    assert policy.warm_groups == 6
    assert [(p.type, p.value) for p in policy.scale_up.policies] == [(StepPolicyType.GROUPS, 6)]


def observed_groups(now: float, groups: tuple[GroupInfo, ...]) -> FleetObservation:
    return FleetObservation(
        now=now,
        desired_groups=len(groups),
        placing_groups=0,
        provisioning_groups=0,
        ready_groups=len(groups),
        draining_groups=0,
        min_groups=1,
        max_groups=8,
        metrics=MetricsView(now, ()),
        groups=groups,
    )


def test_the_simulated_groups_ready_times_are_kept_after_they_leave_and_feed_the_operators_estimate() -> None:
    """As the operator keeps `status.readyTime.recent`: a group's ready time stays after a scale-in
    removed it, each group once; five of them replace the declared ready time with their own p90."""
    # Two groups the run started warm were created ready: they have no ready time to learn from.
    warm = (GroupInfo("group-w0", "Ready", 0.0, 0.0), GroupInfo("group-w1", "Ready", 0.0, 0.0))
    history = ReadyHistory().seen(observed_groups(0.0, warm))
    assert history.seconds == []
    for index, seconds in enumerate((100.0, 110.0, 120.0, 130.0, 150.0)):
        created = 1000.0 * index
        group = GroupInfo(f"group-{index}", "Ready", created, created + seconds)
        history = history.seen(observed_groups(created + seconds + 10, (group,)))
        history = history.seen(observed_groups(created + seconds + 20, (group,)))
    assert sorted(history.seconds) == [100.0, 110.0, 120.0, 130.0, 150.0]
    now = observed_groups(6000.0, (GroupInfo("group-4", "Ready", 4000.0, 4150.0),))
    snapshot = snapshot_from(
        now,
        PROFILE,
        window_seconds=60.0,
        name="llama",
        policy=POLICY,
        declared_ready_seconds=60.0,
        measured_ready_seconds=history.seconds,
    )
    assert (snapshot.group_ready_seconds, snapshot.group_ready_source) == (150.0, "measured")
    only_now = snapshot_from(
        now, PROFILE, window_seconds=60.0, name="llama", policy=POLICY, declared_ready_seconds=60.0
    )
    assert (only_now.group_ready_seconds, only_now.group_ready_source) == (60.0, "prior")
