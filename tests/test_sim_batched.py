"""The batched fleet engine: its router, its bookkeeping, and its figures against the event engine's
on fleets both can run."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from goodput.estimators.service_time import H100_80G, LLAMA_3_1_8B, LLAMA_3_1_70B
from goodput.simulator.baselines import FixedFleet
from goodput.simulator.batched import BatchedRunSettings, simulate_batched, water_fill
from goodput.simulator.engine import EngineConfig
from goodput.simulator.fleet import FleetConfig
from goodput.simulator.records import RequestExit
from goodput.simulator.report import ClassTargets, judge, summarize
from goodput.simulator.simulation import SimulationConfig, SimulationResult, simulate
from goodput.simulator.workload import ClassRule, Workload, assign_classes

CLASSES = (ClassTargets("chat", ttft_seconds=1.0, itl_seconds=0.08),)
ENGINE_8B = EngineConfig.for_hardware(LLAMA_3_1_8B, H100_80G)
ENGINE_70B_TP8 = EngineConfig.for_hardware(LLAMA_3_1_70B, H100_80G, tensor_parallel=8)


def conversation_like(rate: float, seconds: float, seed: int = 3) -> Workload:
    """Poisson arrivals with the Azure conversation trace's mean lengths (lognormal)."""
    rng = np.random.default_rng(seed)
    times = np.sort(rng.uniform(0.0, seconds, rng.poisson(rate * seconds)))
    inputs = np.maximum(1, rng.lognormal(np.log(1020), 0.75, times.size)).astype(np.int64)
    outputs = np.maximum(1, rng.lognormal(np.log(129), 0.9, times.size)).astype(np.int64)
    return assign_classes(
        Workload("conversation-like", times, inputs, outputs), ClassRule(("chat",), (1.0,)), 0
    )


def fleet(engine: EngineConfig, groups: int, router: str = "least-work") -> FleetConfig:
    return FleetConfig(
        engine=engine,
        gpus_per_group=1,
        min_groups=1,
        max_groups=groups,
        router=router,
        itl_targets_seconds=(0.08,),
    )


def both_engines(
    workload: Workload, config: FleetConfig, groups: int
) -> tuple[SimulationResult, SimulationResult]:
    event = simulate(
        workload, SimulationConfig(fleet=config, seed=1, initial_groups=groups), FixedFleet(groups)
    )
    batched = simulate_batched(workload, config, BatchedRunSettings(groups))
    return event, batched


def figures(result: SimulationResult) -> dict[str, float]:
    verdicts = judge(result, CLASSES)
    done = verdicts.finished
    return {
        "attainment": float(verdicts.met.mean()),
        "ttft_p50": float(np.percentile(verdicts.ttft[done], 50)),
        "ttft_p90": float(np.percentile(verdicts.ttft[done], 90)),
        "tpot_p50": float(np.nanpercentile(verdicts.tpot[done], 50)),
        "finished": float(done.mean()),
    }


# ---------------------------------------------------------------------- against the event engine
# Four loads of four 70B TP8 groups, each with how far the batched engine's TTFT may stray from the
# event engine's. Below the knee (the 1 s TTFT target holds) by about one tick (0.1 s): a tick's
# arrivals share one prefill chunk. Where the KV cache is full (14.4 req/s per group) TTFT is not
# compared: the event engine preempts and recomputes, the batched engine pauses prefill, and its
# TTFT comes out about a third lower; attainment and TPOT still agree. Far past the knee, where the
# queue dominates, by a quarter.
LOADS = {
    "light, 4.8 req/s per group": (4.8, {"abs": 0.1}),
    "at the knee, 12 req/s per group": (12.0, {"abs": 0.1}),
    "KV cache full, 14.4 req/s per group": (14.4, None),
    "queues growing, 19.2 req/s per group": (19.2, {"rel": 0.25}),
}


@pytest.mark.parametrize(("per_group", "ttft_tolerance"), LOADS.values(), ids=LOADS.keys())
def test_the_batched_engine_agrees_with_the_event_engine(
    per_group: float, ttft_tolerance: dict[str, float] | None
) -> None:
    workload = conversation_like(4 * per_group, 300.0)
    event, batched = (figures(result) for result in both_engines(workload, fleet(ENGINE_70B_TP8, 4), 4))
    assert batched["finished"] == event["finished"] == 1.0
    assert batched["attainment"] == pytest.approx(event["attainment"], abs=0.015)
    assert batched["tpot_p50"] == pytest.approx(event["tpot_p50"], rel=0.10)
    if ttft_tolerance is not None:
        assert batched["ttft_p50"] == pytest.approx(event["ttft_p50"], **ttft_tolerance)
        assert batched["ttft_p90"] == pytest.approx(event["ttft_p90"], **ttft_tolerance)


# ---------------------------------------------------------------------- bookkeeping
def test_every_request_ends_once_in_order_and_on_a_group_of_the_fleet() -> None:
    workload = conversation_like(30.0, 120.0)
    result = simulate_batched(workload, fleet(ENGINE_8B, 3), BatchedRunSettings(3))
    requests = result.requests
    finished = requests["outcome"] == RequestExit.FINISHED
    assert finished.all()
    assert (requests["first_token_at"] >= requests["arrival"]).all()
    assert (requests["scheduled_at"] >= requests["arrival"]).all()
    assert (requests["finished_at"] >= requests["first_token_at"]).all()
    assert set(np.unique(requests["group"])) == {0, 1, 2}
    assert result.gpu_seconds == pytest.approx(3 * result.horizon_seconds)
    assert result.engine_totals["generation_tokens"] == workload.output_tokens.sum()


def test_a_prompt_larger_than_the_kv_cache_is_rejected_and_the_rest_served() -> None:
    too_long = ENGINE_8B.kv_capacity_tokens + 1
    workload = Workload(
        "one too long", np.array([0.0, 0.5, 1.0]), np.array([200, too_long, 300]), np.array([20, 20, 20])
    )
    outcome = simulate_batched(workload, fleet(ENGINE_8B, 2), BatchedRunSettings(2)).requests["outcome"]
    assert outcome.tolist() == [
        RequestExit.FINISHED,
        RequestExit.REJECTED_TOO_LONG,
        RequestExit.FINISHED,
    ]


def test_a_request_on_an_idle_group_waits_only_for_its_own_prefill_and_decode() -> None:
    """One request alone: TTFT is its prefill step, and each later token one decode step."""
    workload = Workload("alone", np.array([0.37]), np.array([1000]), np.array([50]))
    requests = simulate_batched(workload, fleet(ENGINE_8B, 1), BatchedRunSettings(1)).requests
    cost = ENGINE_8B.cost
    assert requests["first_token_at"][0] - 0.37 == pytest.approx(cost.prefill_seconds(1000), rel=1e-6)
    decode = requests["finished_at"][0] - requests["first_token_at"][0]
    assert decode == pytest.approx(49 * cost.decode_step_seconds(1, 1025), rel=0.01)


def test_requests_still_in_flight_when_the_tail_ends_are_unfinished() -> None:
    workload = conversation_like(200.0, 30.0)  # far beyond one group
    result = simulate_batched(workload, fleet(ENGINE_8B, 1), BatchedRunSettings(1, tail_seconds=5.0))
    outcome = result.requests["outcome"]
    assert (outcome == RequestExit.UNFINISHED).sum() > 0
    assert set(np.unique(outcome)) <= {RequestExit.FINISHED, RequestExit.UNFINISHED}
    assert result.end_seconds <= workload.span_seconds + 5.0 + 0.1


def test_round_robin_spreads_requests_evenly() -> None:
    workload = conversation_like(20.0, 60.0)
    groups = simulate_batched(workload, fleet(ENGINE_8B, 4, "round-robin"), BatchedRunSettings(4)).requests[
        "group"
    ]
    counts = np.bincount(groups, minlength=4)
    assert counts.max() - counts.min() <= 1


def test_the_report_leaves_out_the_token_gap_share_it_cannot_measure() -> None:
    workload = conversation_like(10.0, 60.0)
    result = simulate_batched(workload, fleet(ENGINE_8B, 2), BatchedRunSettings(2))
    report = summarize(result, CLASSES, 2.0, 30.0, {})
    assert report["classes"]["chat"]["token_gaps_within_itl_target_fraction"] is None
    assert report["finished_requests"] == len(workload)


@pytest.mark.parametrize(
    ("settings_kwargs", "field"),
    [({"groups": 0}, "groups"), ({"groups": 2, "tick_seconds": 0.0}, "tick_seconds")],
    ids=["no groups", "no tick"],
)
def test_bad_settings_name_their_field(settings_kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        BatchedRunSettings(**settings_kwargs)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- the router
ROUTING_CASES = {
    "one request goes to the least-loaded group": ([5.0, 1.0, 3.0], [2.0], [1]),
    "equal groups each take one of as many equal requests": ([0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0, 1, 2]),
    "a loaded group takes nothing while the others are below it": (
        [100.0, 0.0, 0.0],
        [10.0] * 4,
        [1, 1, 2, 2],
    ),
}


@pytest.mark.parametrize(("work", "weights", "expected"), ROUTING_CASES.values(), ids=ROUTING_CASES.keys())
def test_water_fill_cases(work: list[float], weights: list[float], expected: list[int]) -> None:
    assert water_fill(np.array(work), np.array(weights)).tolist() == expected


@settings(max_examples=200, deadline=None)
@given(
    work=st.lists(st.floats(0, 1000, allow_nan=False), min_size=1, max_size=20),
    weights=st.lists(st.floats(1, 200, allow_nan=False), min_size=1, max_size=40),
)
def test_water_fill_ends_no_more_uneven_than_one_by_one_routing(
    work: list[float], weights: list[float]
) -> None:
    """Sending the requests one by one to the least-loaded group and laying them along the shortfall
    below a common level end within one request's weight of each other at the top."""
    groups = water_fill(np.array(work), np.array(weights))
    assert groups.min() >= 0 and groups.max() < len(work)
    filled = np.array(work) + np.bincount(groups, np.array(weights), len(work))
    greedy = np.array(work)
    for weight in weights:
        greedy[int(np.argmin(greedy))] += weight
    assert filled.max() <= greedy.max() + max(weights) + 1e-6


@settings(max_examples=200, deadline=None)
@given(
    batch=st.floats(0, 20000),
    units=st.floats(0, 1e8),
    context=st.floats(0, 1e6),
    sequences=st.integers(0, 1024),
)
def test_the_array_step_cost_is_the_scalar_one(
    batch: float, units: float, context: float, sequences: int
) -> None:
    cost = ENGINE_70B_TP8.cost
    array = cost.step_seconds_array(
        np.array([batch]), np.array([units]), np.array([context]), np.array([sequences])
    )
    assert array[0] == pytest.approx(cost.step_seconds(batch, units, context, sequences), rel=1e-12, abs=0.0)
