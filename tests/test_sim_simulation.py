"""The fleet in the event loop: lifecycle and cost, drain, failures, routing, the scrape delay and
determinism."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pytest

from goodput.estimators.service_time import H100_80G, LLAMA_3_1_8B
from goodput.simulator.engine import EngineConfig
from goodput.simulator.fleet import FleetConfig
from goodput.simulator.fleet_policy import FleetObservation, PolicyAnswer
from goodput.simulator.group_world import DRAIN_SETTLE_SECONDS
from goodput.simulator.records import RequestExit
from goodput.simulator.report import ClassTargets, summarize
from goodput.simulator.simulation import SimulationConfig, SimulationResult, simulate
from goodput.simulator.workload import ClassRule, Workload, assign_classes

ENGINE = EngineConfig.for_hardware(LLAMA_3_1_8B, H100_80G, step_noise_sigma=0.04)
CLASSES = (ClassTargets("chat", ttft_seconds=1.0, itl_seconds=0.08),)


def poisson(rate: float, seconds: float, seed: int = 1) -> Workload:
    rng = np.random.default_rng(seed)
    times = np.sort(rng.uniform(0.0, seconds, rng.poisson(rate * seconds)))
    inputs = rng.integers(100, 2000, times.size)
    outputs = rng.integers(10, 300, times.size)
    return assign_classes(Workload("poisson", times, inputs, outputs), ClassRule(("chat",), (1.0,)), seed)


@dataclass
class Scripted:
    """Desired groups by time: the last (time, groups) at or before now wins."""

    script: list[tuple[float, int]]
    interval_seconds: float = 5.0
    name: str = "scripted"
    seen: list[tuple[float, float | None]] = field(default_factory=list)

    def describe(self) -> dict[str, float | str]:
        return {}

    def recommend(self, observation: FleetObservation) -> PolicyAnswer:
        latest = observation.metrics.latest
        self.seen.append((observation.now, None if latest is None else latest.time))
        groups = [g for t, g in self.script if t <= observation.now][-1]
        return PolicyAnswer(groups, "scripted")


def run(workload: Workload, script: list[tuple[float, int]], **fleet_overrides: object) -> SimulationResult:
    config = SimulationConfig(
        fleet=replace(
            FleetConfig(
                engine=ENGINE,
                gpus_per_group=1,
                min_groups=1,
                max_groups=8,
                ready_time_median_seconds=30.0,
                itl_targets_seconds=(0.08,),
            ),
            **fleet_overrides,
        ),  # type: ignore[arg-type]
        seed=7,
        initial_groups=script[0][1],
        control_start_seconds=5.0,
    )
    return simulate(workload, config, Scripted(script))


def test_a_fixed_fleet_costs_its_gpus_over_the_offered_window() -> None:
    workload = poisson(3.0, 120.0)
    result = run(workload, [(0.0, 2)], gpus_per_group=8)
    assert result.gpu_seconds == pytest.approx(2 * 8 * result.horizon_seconds)
    assert (result.requests["outcome"] == RequestExit.FINISHED).all()


def test_a_new_group_costs_from_placement_and_serves_only_once_ready() -> None:
    workload = poisson(5.0, 200.0)
    result = run(workload, [(0.0, 1), (50.0, 2)])
    created = result.groups[1]
    assert created.created_at == 50.0
    assert created.ready_at is not None and created.ready_at > 50.0 + 5.0  # placement, then loading
    routed = result.requests["group"] == 1
    assert routed.any()
    assert result.requests["routed_at"][routed].min() >= created.ready_at
    horizon = result.horizon_seconds
    assert result.gpu_seconds == pytest.approx(horizon + (horizon - 50.0))


def test_a_draining_group_takes_no_new_requests_and_leaves_when_empty() -> None:
    workload = poisson(6.0, 150.0)
    result = run(workload, [(0.0, 2), (60.0, 1)])
    drained = next(g for g in result.groups if g.final_state == "Deleted")
    index = int(drained.name.split("-")[1])
    mine = result.requests["group"] == index
    assert result.requests["routed_at"][mine].max() <= 60.0
    # The operator's drain protocol: routes stop at the scale-in, routers get the settle time, then
    # the group goes at the first controller pass that reads an idle leader.
    settled = max(60.0 + DRAIN_SETTLE_SECONDS, float(result.requests["finished_at"][mine].max()))
    interval = FleetConfig(engine=ENGINE, gpus_per_group=1).reconcile_interval_seconds
    assert settled <= drained.ended_at <= settled + interval
    assert (result.requests["outcome"] == RequestExit.FINISHED).all()


def test_a_failed_group_loses_its_requests_and_is_replaced() -> None:
    workload = poisson(6.0, 200.0)
    result = run(workload, [(0.0, 2)], scheduled_failures_seconds=(80.0,))
    failed = [g for g in result.groups if g.final_state == "Failed"]
    assert len(failed) == 1 and failed[0].ended_at == 80.0
    lost = result.requests["outcome"] == RequestExit.FAILED
    assert lost.any()
    assert (result.requests["finished_at"][lost] == 80.0).all()
    assert len(result.groups) == 3  # the replacement
    assert result.engine_totals["requests_lost_to_failures"] == lost.sum()
    report = summarize(result, CLASSES)
    assert report["failed_requests"] == int(lost.sum())
    assert report["slo_met_requests"] <= report["admitted_requests"] - report["failed_requests"]


def test_without_a_ready_group_arrivals_are_rejected_and_not_admitted() -> None:
    workload = poisson(4.0, 120.0)
    result = run(workload, [(0.0, 1)], scheduled_failures_seconds=(30.0,))
    rejected = result.requests["outcome"] == RequestExit.REJECTED_NO_CAPACITY
    assert rejected.any()
    arrivals = result.requests["arrival"][rejected]
    replacement_ready = result.groups[1].ready_at
    assert replacement_ready is not None
    assert arrivals.min() >= 30.0 and arrivals.max() < replacement_ready
    report = summarize(result, CLASSES)
    assert report["admitted_requests"] == report["offered_requests"] - int(rejected.sum())
    assert report["attainment_offered"] < report["attainment_admitted"]


def test_decisions_never_see_metrics_newer_than_the_scrape_delay() -> None:
    workload = poisson(3.0, 100.0)
    policy = Scripted([(0.0, 1)])
    config = SimulationConfig(
        fleet=FleetConfig(engine=ENGINE, gpus_per_group=1),
        seed=1,
        initial_groups=1,
        scrape_interval_seconds=2.0,
        scrape_delay_seconds=7.0,
        control_start_seconds=5.0,
    )
    simulate(workload, config, policy)
    assert policy.seen
    for now, seen in policy.seen:
        if now < 7.0:
            assert seen is None
        else:
            assert seen is not None and now - 7.0 - 2.0 <= seen <= now - 7.0


def test_least_work_routing_spreads_requests_over_the_ready_groups() -> None:
    workload = poisson(20.0, 60.0)
    result = run(workload, [(0.0, 4)])
    counts = np.bincount(result.requests["group"], minlength=4)
    assert counts.min() >= 0.15 * counts.sum()


def test_the_same_seed_gives_the_same_report_and_another_seed_does_not() -> None:
    workload = poisson(8.0, 120.0)

    def report(seed: int) -> dict[str, object]:
        config = SimulationConfig(
            fleet=FleetConfig(engine=ENGINE, gpus_per_group=1, ready_time_median_seconds=20.0),
            seed=seed,
            initial_groups=1,
            control_start_seconds=5.0,
        )
        summary = summarize(simulate(workload, config, Scripted([(0.0, 1), (30.0, 3), (90.0, 2)])), CLASSES)
        del summary["simulation"]  # wall-clock figures
        return summary

    first, again, other = report(3), report(3), report(4)
    assert first == again
    assert first["latency"] != other["latency"]
