"""Arrival work rate, queued work, queue wait, queue budget and slack (goodput.estimators.queueing)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from goodput.estimators.queueing import (
    QueuedRequest,
    TrafficMix,
    arrival_work_rate,
    predicted_queue_wait_seconds,
    queue_budget_seconds,
    queue_work_exact,
    queue_work_from_counts,
    remaining_work_seconds,
    slack_from_requests,
)
from goodput.estimators.service_time import H100_80G, LLAMA_3_1_8B, StepCostModel
from goodput.estimators.work import ShapeBucket, WorkErrorProfile, WorkPricing, shape_bucket

PRICING = WorkPricing.from_step_model(StepCostModel.from_hardware(LLAMA_3_1_8B, H100_80G))
MIX = TrafficMix(mean_input_tokens=1000, mean_output_tokens=200)


def test_arrival_work_rate_prices_one_request_per_mean_prompt() -> None:
    """10 requests/s of the mean shape arrive as 10 x 1000 prompt and 10 x 200 output tokens/s."""
    rate = arrival_work_rate(PRICING, 10_000.0, 2_000.0, MIX)
    per_request = PRICING.prefill_work_seconds(1000) + 200 * PRICING.decode_work_per_token(1100)
    assert rate == pytest.approx(10 * per_request)
    assert arrival_work_rate(PRICING, 0.0, 0.0, MIX) == 0.0


def test_prefix_hits_lower_the_arrival_work_rate() -> None:
    cold = arrival_work_rate(PRICING, 10_000.0, 2_000.0, MIX)
    warm = arrival_work_rate(PRICING, 10_000.0, 2_000.0, TrafficMix(1000, 200, prefix_hit_fraction=0.6))
    assert warm < cold


@given(
    prompt_rate=st.floats(0, 1e6),
    generation_rate=st.floats(0, 1e5),
    more_prompt=st.floats(0, 1e5),
    more_generation=st.floats(0, 1e4),
)
def test_arrival_work_rate_is_monotone_in_token_rates(
    prompt_rate: float, generation_rate: float, more_prompt: float, more_generation: float
) -> None:
    base = arrival_work_rate(PRICING, prompt_rate, generation_rate, MIX)
    assert (
        arrival_work_rate(PRICING, prompt_rate + more_prompt, generation_rate + more_generation, MIX) >= base
    )


def test_queue_work_from_counts_prices_waiting_whole_and_running_half_done() -> None:
    work = queue_work_from_counts(
        PRICING, waiting_requests=4, running_requests=10, mix=MIX, output_tokens_p90_over_mean=2
    )
    waiting_each = PRICING.prefill_work_seconds(1000) + PRICING.decode_work_seconds(1000, 200)
    running_each = PRICING.decode_work_seconds(1100, 100)
    assert work.waiting_seconds == pytest.approx(4 * waiting_each)
    assert work.running_seconds == pytest.approx(10 * running_each)
    assert work.total_seconds == pytest.approx(4 * waiting_each + 10 * running_each)
    assert work.waiting_seconds_p90 == pytest.approx(
        4 * (PRICING.prefill_work_seconds(1000) + PRICING.decode_work_seconds(1000, 400))
    )
    assert work.running_seconds_p90 == pytest.approx(10 * PRICING.decode_work_seconds(1200, 200))


def test_exact_queue_agrees_with_counts_when_every_request_has_the_mean_shape() -> None:
    waiting = [QueuedRequest(0.0, 1000, 200)] * 3
    running = [QueuedRequest(0.0, 1000, 200, generated_tokens=100, running=True)] * 5
    exact = queue_work_exact(PRICING, waiting + running, WorkErrorProfile())
    counted = queue_work_from_counts(PRICING, 3, 5, MIX, output_tokens_p90_over_mean=2)
    assert exact.waiting_seconds == pytest.approx(counted.waiting_seconds)
    assert exact.running_seconds == pytest.approx(counted.running_seconds)


def test_exact_upper_estimate_uses_each_requests_bucket_error() -> None:
    chat = QueuedRequest(0.0, 200, 20)
    long = QueuedRequest(0.0, 20_000, 1500)
    grid = [[0.0] * 5 for _ in range(6)]
    grid[shape_bucket(200, 20).input_index][shape_bucket(200, 20).output_index] = 3.0
    profile = WorkErrorProfile(default_p90_ratio=1.2, p90_ratio_grid=tuple(tuple(row) for row in grid))
    work = queue_work_exact(PRICING, [chat, long], profile)
    assert work.waiting_seconds_p90 == pytest.approx(
        3.0 * remaining_work_seconds(PRICING, chat) + 1.2 * remaining_work_seconds(PRICING, long)
    )
    assert profile.p90_ratio(ShapeBucket(4, 3)) == 1.2


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        (
            QueuedRequest(0.0, 500, 50),
            PRICING.prefill_work_seconds(500) + PRICING.decode_work_seconds(500, 50),
        ),
        (
            QueuedRequest(0.0, 500, 50, cached_tokens=400),
            PRICING.prefill_work_seconds(500, 400) + PRICING.decode_work_seconds(500, 50),
        ),
        (
            QueuedRequest(0.0, 500, 50, generated_tokens=20, running=True),
            PRICING.decode_work_seconds(520, 30),
        ),
        (QueuedRequest(0.0, 500, 50, generated_tokens=80, running=True), PRICING.decode_work_seconds(580, 1)),
    ],
    ids=["waiting", "waiting with prefix hit", "running", "running past its prediction"],
)
def test_remaining_work(request_: QueuedRequest, expected: float) -> None:
    assert remaining_work_seconds(PRICING, request_) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("waiting_work", "groups", "capacity", "expected"),
    [(0.0, 0, 0.9, 0.0), (9.0, 2, 0.9, 5.0), (9.0, 0, 0.9, math.inf), (1.0, 3, 0.0, math.inf)],
    ids=["empty queue", "two groups", "no group serves the queue", "no capacity"],
)
def test_predicted_queue_wait(waiting_work: float, groups: int, capacity: float, expected: float) -> None:
    assert predicted_queue_wait_seconds(waiting_work, groups, capacity) == pytest.approx(expected)


def test_queue_budget_subtracts_service_time_from_the_ttft_target() -> None:
    assert queue_budget_seconds(2.0, 0.3, 0.05, route_seconds=0.02, margin_seconds=0.1) == pytest.approx(1.53)
    assert queue_budget_seconds(0.2, 0.3, 0.05) < 0


@dataclass(frozen=True)
class SlackCase:
    name: str
    requests: list[QueuedRequest]
    groups: int
    earliest_slack: float | None
    low_fraction: float | None
    lost: int
    demand_groups: float
    low_slack_allowance: float = 0.0
    min_slack: float = 0.0
    targets: dict[str, float] = field(default_factory=dict)


UNIT_PRICING = WorkPricing(
    prefill_seconds_per_token=0.0,
    prefill_seconds_per_attention_unit=0.0,
    decode_seconds_per_token=0.01,
    decode_seconds_per_context_token=0.0,
    kv_bytes_per_token=1,
)
# With UNIT_PRICING a request of n expected outputs is n/100 work-seconds; capacity 1/group; service 0.1 s.


def _waiting(
    arrival: float, outputs: int, class_name: str = "", deadline: float | None = None
) -> QueuedRequest:
    return QueuedRequest(arrival, 10, outputs, class_name=class_name, ttft_deadline=deadline)


SLACK_CASES = [
    SlackCase("empty queue", [], 1, None, None, 0, 0.0),
    SlackCase(
        "running requests are not waiting",
        [QueuedRequest(0.0, 10, 100, running=True)],
        1,
        None,
        None,
        0,
        0.0,
    ),
    SlackCase("head of the queue waits for nothing", [_waiting(10.0, 100)], 1, 1.9, 0.0, 0, 0.0),
    SlackCase(
        # deadlines 12, 12, 12; work ahead 0, 1, 2 s; available 1.9 each; at 1 group: slack 1.9, 0.9, -0.1
        "third request misses with one group",
        [_waiting(10.0, 100), _waiting(10.0, 100), _waiting(10.0, 100)],
        1,
        -0.1,
        1 / 3,
        0,
        2 / 1.9,
    ),
    SlackCase(
        "the allowance lets the worst request miss",
        [_waiting(10.0, 100), _waiting(10.0, 100), _waiting(10.0, 100)],
        1,
        -0.1,
        1 / 3,
        0,
        1 / 1.9,
        low_slack_allowance=0.34,
    ),
    SlackCase(
        "a request past its deadline is lost whatever the groups",
        [_waiting(7.0, 100), _waiting(10.0, 100)],
        2,
        -1.1,
        0.5,
        1,
        1 / 1.9,
    ),
    SlackCase(
        "class targets and explicit deadlines",
        [_waiting(10.0, 100, "batch"), _waiting(10.0, 100, deadline=10.6)],
        1,
        -0.5,
        0.5,
        0,
        2.0,
        targets={"batch": 30.0},
    ),
    SlackCase(
        "a minimum slack asks for more room",
        [_waiting(10.0, 100), _waiting(10.0, 100)],
        1,
        0.9,
        0.5,
        0,
        1 / 0.9,
        min_slack=1.0,
    ),
]


@pytest.mark.parametrize("case", SLACK_CASES, ids=[case.name for case in SLACK_CASES])
def test_slack_from_requests(case: SlackCase) -> None:
    summary = slack_from_requests(
        UNIT_PRICING,
        case.requests,
        now=10.0,
        serving_groups=case.groups,
        capacity_per_group=1.0,
        ttft_target_seconds=lambda name: case.targets.get(name, 2.0),
        service_seconds=lambda request: 0.1,
        min_slack_seconds=case.min_slack,
        low_slack_fraction=case.low_slack_allowance,
    )
    assert summary.waiting_requests == sum(1 for request in case.requests if not request.running)
    if case.earliest_slack is None:
        assert summary.earliest_slack_seconds is None
    else:
        assert summary.earliest_slack_seconds == pytest.approx(case.earliest_slack)
    assert summary.low_slack_fraction == (
        None if case.low_fraction is None else pytest.approx(case.low_fraction)
    )
    assert summary.lost_requests == case.lost
    assert summary.demand_groups == pytest.approx(case.demand_groups)


def test_slack_with_no_serving_group_is_minus_infinity_behind_the_head() -> None:
    summary = slack_from_requests(
        UNIT_PRICING,
        [_waiting(10.0, 100), _waiting(10.0, 100)],
        now=10.0,
        serving_groups=0,
        capacity_per_group=1.0,
        ttft_target_seconds=lambda name: 2.0,
        service_seconds=lambda request: 0.1,
        min_slack_seconds=0.0,
        low_slack_fraction=0.0,
    )
    assert summary.earliest_slack_seconds == -math.inf
    assert summary.demand_groups == pytest.approx(1 / 1.9)


@given(outputs=st.lists(st.integers(1, 2000), min_size=1, max_size=30), extra=st.integers(1, 2000))
def test_more_queued_work_never_lowers_the_slack_demand(outputs: list[int], extra: int) -> None:
    def demand(queue_outputs: list[int]) -> float:
        return slack_from_requests(
            UNIT_PRICING,
            [_waiting(10.0, count) for count in queue_outputs],
            now=10.0,
            serving_groups=1,
            capacity_per_group=1.0,
            ttft_target_seconds=lambda name: 2.0,
            service_seconds=lambda request: 0.1,
            min_slack_seconds=0.0,
            low_slack_fraction=0.0,
        ).demand_groups

    assert demand([extra, *outputs]) >= demand(outputs)
