"""A small world for decision tests: one Llama-3.1-8B-on-H100 group profile and loads stated in
groups' worth of work. The other autoscale tests import these builders; the tests here check that the
builders say what they mean (a load of u is u x C of arrival work, a wait of w seconds is w seconds).
"""

from __future__ import annotations

import pytest

from goodput.api.modelgroup import GroupState
from goodput.controllers.autoscale import decide
from goodput.controllers.autoscale.model import (
    DecisionState,
    GroupMetrics,
    GroupObservation,
    ModelGroupSnapshot,
    RequestQueue,
    ScalingPolicy,
    ScalingRules,
    SelectPolicy,
    StepPolicy,
    StepPolicyType,
)
from goodput.estimators.attainment import Histogram
from goodput.estimators.capacity import build_capacity_profile
from goodput.estimators.queueing import QueuedRequest
from goodput.estimators.service_time import H100_80G, LLAMA_3_1_8B, StepCostModel, default_batch_limits

_SEQS, _TOKENS = default_batch_limits(H100_80G)
PROFILE = build_capacity_profile(
    StepCostModel.from_hardware(LLAMA_3_1_8B, H100_80G),
    max_num_seqs=_SEQS,
    max_num_batched_tokens=_TOKENS,
    itl_target_seconds=0.08,
    ttft_target_seconds=2.0,
)
PRICING = PROFILE.pricing
MEAN_INPUT, MEAN_OUTPUT = 1024.0, 256.0
CAPACITY = PROFILE.capacity_per_group(MEAN_INPUT, MEAN_OUTPUT)
REQUEST_WORK = PRICING.prefill_work_seconds(MEAN_INPUT) + PRICING.decode_work_seconds(MEAN_INPUT, MEAN_OUTPUT)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
QUEUE_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0)
SLO_BATCH = PROFILE.slo_batch_per_group(MEAN_INPUT, MEAN_OUTPUT)

# Acts on every tick and is not rate limited: for tests of what the signals ask for.
IMMEDIATE = ScalingRules(
    tolerance=0.1,
    stabilization_window_seconds=0.0,
    policies=(StepPolicy(StepPolicyType.PERCENT, 1000, 1.0),),
    select_policy=SelectPolicy.MAX,
)
PERMISSIVE = ScalingPolicy(
    min_groups=1, max_groups=50, revision="test-1", scale_up=IMMEDIATE, scale_down=IMMEDIATE
)
DEFAULT = ScalingPolicy(min_groups=1, max_groups=50, revision="test-1")


def waiting_requests_for(wait_seconds: float, serving_groups: int) -> float:
    """Waiting requests (mean shape) that make a new arrival wait `wait_seconds` on `serving_groups`."""
    return wait_seconds * serving_groups * CAPACITY / REQUEST_WORK


def load(
    utilisation: float,
    *,
    waiting: float = 0.0,
    kv_usage: float = 0.2,
    age: float = 5.0,
    ttft: Histogram | None = None,
    itl: Histogram | None = None,
    tpot: Histogram | None = None,
    queue_time: Histogram | None = None,
    finished: float = 0.0,
) -> GroupMetrics:
    """A group receiving `utilisation` x C of arrival work in requests of the mean shape.

    Its running sequences follow by Little's law at the reference step, so at u = 1 it runs about
    the profile's SLO batch: the batch at which C is defined.
    """
    requests_per_second = utilisation * CAPACITY / REQUEST_WORK
    return GroupMetrics(
        age_seconds=age,
        waiting_requests=waiting,
        running_requests=requests_per_second * MEAN_OUTPUT * PROFILE.reference.step_seconds,
        kv_usage_fraction=kv_usage,
        prompt_tokens_per_second=requests_per_second * MEAN_INPUT,
        generation_tokens_per_second=requests_per_second * MEAN_OUTPUT,
        # One finished request's prompt and output stand for the window's means.
        prompt_tokens_sum=MEAN_INPUT,
        prompt_tokens_count=1.0,
        generation_tokens_sum=MEAN_OUTPUT,
        generation_tokens_count=1.0,
        ttft=ttft,
        itl=itl,
        tpot=tpot,
        queue_time=queue_time,
        finished_requests=finished,
    )


def group(
    metrics: GroupMetrics | None,
    state: GroupState = "Ready",
    *,
    unschedulable: bool = False,
    name: str = "",
) -> GroupObservation:
    return GroupObservation(
        name or f"g-{state.lower()}", state, created_at=0.0, unschedulable=unschedulable, metrics=metrics
    )


def world(
    *groups: GroupObservation, spec: int | None = None, queue: tuple[QueuedRequest, ...] | None = None
) -> ModelGroupSnapshot:
    """A ModelGroup whose spec counts every group that is not draining, unless told otherwise."""
    if spec is None:
        spec = sum(1 for observed in groups if observed.state != "Draining")
    return ModelGroupSnapshot(
        spec_replicas=spec,
        groups=tuple(groups),
        profile=PROFILE,
        name="default/chat",
        queue=None if queue is None else RequestQueue(queue, age_seconds=1.0),
    )


def ready_groups(
    count: int, utilisation: float, *, waiting: float = 0.0, kv_usage: float = 0.2, age: float = 5.0
) -> tuple[GroupObservation, ...]:
    """`count` ready groups with the same load each."""
    metrics = load(utilisation, waiting=waiting, kv_usage=kv_usage, age=age)
    return tuple(group(metrics, name=f"g{index}") for index in range(count))


def test_load_is_stated_in_groups_of_capacity() -> None:
    decision = decide(world(*ready_groups(3, 0.5)), PERMISSIVE, DecisionState.initial(), 0.0)
    assert decision.estimates.capacity_per_group == pytest.approx(CAPACITY)
    assert decision.estimates.arrival_work_rate == pytest.approx(3 * 0.5 * CAPACITY, rel=1e-3)
    assert decision.estimates.mean_input_tokens == MEAN_INPUT
    assert decision.estimates.mean_output_tokens == MEAN_OUTPUT


def test_waiting_requests_are_stated_in_seconds_of_wait() -> None:
    waiting = waiting_requests_for(1.5, 2) / 2
    decision = decide(world(*ready_groups(2, 0.5, waiting=waiting)), PERMISSIVE, DecisionState.initial(), 0.0)
    assert decision.estimates.predicted_queue_wait_seconds == pytest.approx(1.5)
    budget = decision.estimates.queue_budget_seconds
    assert decision.estimates.earliest_slack_seconds == pytest.approx(budget - 1.5)


def test_the_world_is_an_h100_8b_group_with_a_two_second_ttft() -> None:
    assert 0.9 < CAPACITY < 1.0
    assert 1.5 < 2.0 - PROFILE.ttft_floor_seconds < 2.0


def test_a_group_crosses_the_slo_batch_at_full_load() -> None:
    """The SLO batch is interpolated between operating points of the grid, so u = 1 lands near it."""
    assert load(0.9).running_requests < SLO_BATCH < load(1.15).running_requests
