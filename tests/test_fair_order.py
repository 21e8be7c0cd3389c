"""A newcomer's place in the fair order: the work the fair queue serves before it
(goodput.controllers.requests.fairness: FairQueue.work_ahead_seconds, expected_work_ahead_seconds)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from goodput.controllers.requests import fairness
from goodput.controllers.requests.fairness import (
    CostWeights,
    FairnessPolicy,
    FairQueue,
    QueuedItem,
    work_arriving_during_wait,
)

# Every request below costs input + output tokens (the default cost weights) and its work is its cost
# over COST_PER_WORK_SECOND, so the numbers read as "requests of work 1".
COST_PER_WORK_SECOND = 200.0


def request(
    tenant: str, *, cost: int = 200, priority: int = 0, arrival: float = 0.0, payload: str = ""
) -> QueuedItem[str]:
    return QueuedItem(
        tenant,
        priority,
        10.0,
        arrival,
        cost // 2,
        cost - cost // 2,
        payload,
        work_seconds=cost / COST_PER_WORK_SECOND,
    )


@dataclass(frozen=True)
class OrderCase:
    """Pushes in order; `charges` then added to counters (service in flight); the newcomer's figures."""

    pushes: list[tuple[str, int]]  # (tenant, priority), each a request of work 1
    newcomer: tuple[str, int]
    expected: float
    charges: dict[str, float] = field(default_factory=dict)
    policy: FairnessPolicy = field(default_factory=FairnessPolicy)


ORDER_CASES = {
    "empty queue: nothing ahead": OrderCase([], ("a", 0), 0.0),
    "one tenant, first come first served: its whole backlog": OrderCase([("a", 0)] * 5, ("a", 0), 5.0),
    "light behind a heavy backlog: the heavy request that crosses its tag, not the backlog": OrderCase(
        [("heavy", 0)] * 10, ("light", 0), 1.0
    ),
    "light with a backlog of its own: its own, and as much of the heavy one's, and the crossing one": (
        OrderCase([("light", 0)] * 2 + [("heavy", 0)] * 10, ("light", 0), 5.0)
    ),
    "a tenant whose counter ran ahead waits for the others to catch up": OrderCase(
        [("heavy", 0)] * 10, ("light", 0), 6.0, charges={"light": 1000.0}
    ),
    "an idle tenant is lifted to the least backlogged counter, so the crossing request is ahead": (
        OrderCase([("heavy", 0)] * 3, ("light", 0), 1.0, charges={"heavy": 1000.0})
    ),
    "a tenant that is behind waits for no one ahead of its tag": OrderCase(
        [("light", 0)] + [("heavy", 0)] * 10, ("light", 0), 1.0, charges={"heavy": 5000.0}
    ),
    "a heavier-weighted tenant ahead is served its weighted share": OrderCase(
        [("light", 0)] + [("gold", 0)] * 10, ("light", 0), 5.0, policy=FairnessPolicy(weights={"gold": 3.0})
    ),
    "the tenant's own deferred requests, at a worse level, are not ahead": OrderCase(
        [("light", 100)] * 3, ("light", 0), 0.0
    ),
    "another tenant's better-priority requests jump only by the allowance": OrderCase(
        [("vip", 0)] * 5, ("std", 1), 3.0, policy=FairnessPolicy(priority_allowance=400.0)
    ),
    "with no allowance, priority gives another tenant no extra place": OrderCase(
        [("vip", 0)] * 5, ("std", 1), 1.0
    ),
}


@pytest.mark.parametrize("case", ORDER_CASES.values(), ids=ORDER_CASES.keys())
def test_work_ahead_is_the_place_in_the_fair_order(case: OrderCase) -> None:
    queue: FairQueue[str] = FairQueue(case.policy)
    for tenant, priority in case.pushes:
        queue.push(request(tenant, priority=priority))
    for tenant, cost in case.charges.items():
        queue.charge(tenant, cost, 0)
    tenant, priority = case.newcomer
    assert queue.work_ahead_seconds(tenant, priority) == pytest.approx(case.expected)


def test_requests_that_leave_leave_the_sums() -> None:
    queue: FairQueue[str] = FairQueue(FairnessPolicy())
    pushed = [queue.push(request("a")) for _ in range(4)]
    assert queue.cancel(pushed[1])
    assert queue.work_ahead_seconds("a", 0) == pytest.approx(3.0)
    queue.pop(0.0)
    assert queue.work_ahead_seconds("a", 0) == pytest.approx(2.0)
    queue.pop(0.0)
    queue.pop(0.0)
    assert queue.work_ahead_seconds("a", 0) == 0.0 and queue.pop(0.0) is None


def test_a_new_policy_reprices_the_waiting_requests() -> None:
    """Cost weights that change under a waiting queue: the prediction is the one a queue built under the
    new policy gives."""
    pushes = [("heavy", 400), ("heavy", 4000), ("heavy", 400), ("light", 200)]
    output_only = FairnessPolicy(cost_weights=CostWeights(0.0, 1.0))
    switched: FairQueue[str] = FairQueue(FairnessPolicy())
    fresh: FairQueue[str] = FairQueue(output_only)
    for queue in (switched, fresh):
        for tenant, cost in pushes:
            queue.push(request(tenant, cost=cost))
    switched.policy = output_only
    for tenant in ("heavy", "light", "new"):
        assert switched.work_ahead_seconds(tenant, 0) == pytest.approx(fresh.work_ahead_seconds(tenant, 0))


ARRIVAL_CASES = {
    "no senders: nothing more": (2.0, [], 1.0, 0.0),
    "a sender at 40 % of the drain rate with room to spare stretches the wait by 1/0.6": (
        6.0,
        [(1e9, 0.4)],
        1.0,
        4.0,
    ),
    "a sender whose room fills first adds its room and no more": (6.0, [(1.0, 0.4)], 1.0, 1.0),
    "two senders, the first fills, the second keeps sending": (1.0, [(0.5, 0.5), (100.0, 0.25)], 1.0, 1.0),
    "senders faster than the queue drains are bounded by their rooms": (1.0, [(3.0, 2.0)], 1.0, 3.0),
    "a sender with no rate or no room adds nothing": (1.0, [(5.0, 0.0), (0.0, 3.0)], 1.0, 0.0),
}


@pytest.mark.parametrize(
    ("ahead", "lanes", "drain", "expected"), ARRIVAL_CASES.values(), ids=ARRIVAL_CASES.keys()
)
def test_work_arriving_during_the_wait(
    ahead: float, lanes: list[tuple[float, float]], drain: float, expected: float
) -> None:
    assert work_arriving_during_wait(ahead, lanes, drain) == pytest.approx(expected)


def test_a_heavy_request_waits_behind_the_light_tenants_arrivals_too() -> None:
    """Light sent work 2 just now (0.2 work-s/s over the 10 s window) and was served; heavy queues 4.
    A heavy newcomer's tag leaves light room for 8 more work-seconds: while the queue drains at 1 its
    wait W solves W = 4 + 0.2 W, so 5 work-seconds are served first, not the 4 queued."""
    queue: FairQueue[str] = FairQueue(FairnessPolicy())
    queue.push(request("light", cost=400))
    queue.pop(0.0)
    for _ in range(4):
        queue.push(request("heavy"))
    assert queue.work_ahead_seconds("heavy", 0) == pytest.approx(4.0)
    assert queue.expected_work_ahead_seconds("heavy", 0, 0.0, 1.0) == pytest.approx(5.0)
    # Light's rate decays as it stays quiet: a window later it counts e^-1 as much.
    later = queue.expected_work_ahead_seconds("heavy", 0, 10.0, 1.0)
    assert later == pytest.approx(4.0 / (1 - 0.2 / 2.718281828459045))


def test_a_light_request_does_not_wait_for_the_heavy_tenants_arrivals() -> None:
    """Heavy sends a lot and has a backlog past the light newcomer's tag: its later requests are behind."""
    queue: FairQueue[str] = FairQueue(FairnessPolicy())
    for _ in range(10):
        queue.push(request("heavy"))
    assert queue.expected_work_ahead_seconds("light", 0, 0.0, 1.0) == pytest.approx(1.0)


def served_one_off_senders(queue: FairQueue[str], names: int, spacing_seconds: float) -> None:
    """`names` tenants that each send one light request (work 0.1) and are served at once."""
    for index in range(names):
        queue.push(request(f"once-{index}", cost=20, arrival=index * spacing_seconds))
        queue.pop(index * spacing_seconds)


def heavy_backlog_prediction(
    queue: FairQueue[str], now: float, drain_work_seconds_per_second: float
) -> float:
    for _ in range(4):
        queue.push(request("heavy", arrival=now))
    return queue.expected_work_ahead_seconds("heavy", 0, now, drain_work_seconds_per_second)


def test_many_one_off_senders_are_pooled_and_still_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """5,000 distinct tenant names: the gate weighs at most twice MAX_TRACKED_ARRIVALS of them one by
    one and the rest as one pooled rate, and predicts the heavy request's wait as the exact walk over
    every sender does (their rooms under the tag are never what limits them)."""
    pooled: FairQueue[str] = FairQueue(FairnessPolicy())
    served_one_off_senders(pooled, 5_000, 0.002)
    assert len(pooled._arrivals) <= 2 * fairness.MAX_TRACKED_ARRIVALS < 200, "lanes, not one per name"
    monkeypatch.setattr(fairness, "MAX_TRACKED_ARRIVALS", 1_000_000)
    exact: FairQueue[str] = FairQueue(FairnessPolicy())
    served_one_off_senders(exact, 5_000, 0.002)
    assert len(exact._arrivals) == 5_000
    expected = heavy_backlog_prediction(exact, 10.0, 50.0)
    assert expected > 4.0 * 1.5, "the one-off senders' arrivals are a real part of the wait"
    assert heavy_backlog_prediction(pooled, 10.0, 50.0) == pytest.approx(expected, rel=0.01)


def test_pooled_senders_sending_faster_than_the_drain_put_a_bounded_wait_ahead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same senders, now sending faster than the queue drains: each may still put only its room
    under the tag ahead, so the wait is finite, thousands of seconds by the exact walk and by the
    pool alike (the pool counts a sender's room only as far as its last request is recent)."""
    pooled: FairQueue[str] = FairQueue(FairnessPolicy())
    served_one_off_senders(pooled, 5_000, 0.002)
    monkeypatch.setattr(fairness, "MAX_TRACKED_ARRIVALS", 1_000_000)
    exact: FairQueue[str] = FairQueue(FairnessPolicy())
    served_one_off_senders(exact, 5_000, 0.002)
    expected = heavy_backlog_prediction(exact, 10.0, 1.0)
    predicted = heavy_backlog_prediction(pooled, 10.0, 1.0)
    assert math.isfinite(predicted) and expected > 10_000
    assert expected / 2 <= predicted <= expected


def test_a_fast_sender_keeps_its_own_lane_among_many_slow_ones() -> None:
    queue: FairQueue[str] = FairQueue(FairnessPolicy())
    for index in range(200):
        queue.push(request("fast", arrival=index * 0.01))
        queue.pop(index * 0.01)
    served_one_off_senders(queue, 1_000, 0.001)
    assert "fast" in queue._arrivals


# --- properties --------------------------------------------------------------------------------------

tenant_names = st.sampled_from(["a", "b", "c", "d"])
queued = st.lists(
    st.tuples(tenant_names, st.sampled_from([0, 1, 100]), st.integers(2, 4000)), min_size=0, max_size=40
)
charges = st.dictionaries(tenant_names, st.floats(0, 20_000), max_size=4)


def filled(
    pushes: list[tuple[str, int, int]], extra: dict[str, float], policy: FairnessPolicy
) -> FairQueue[str]:
    queue: FairQueue[str] = FairQueue(policy)
    for tenant, priority, cost in pushes:
        queue.push(request(tenant, priority=priority, cost=cost))
    for tenant, cost in extra.items():
        queue.charge(tenant, cost, 0)
    return queue


@settings(max_examples=200, deadline=None)
@given(
    pushes=queued,
    extra=charges,
    newcomer=tenant_names,
    priority=st.sampled_from([0, 1, 100]),
    allowance=st.sampled_from([0.0, 500.0]),
)
def test_the_work_ahead_never_exceeds_the_whole_queue(
    pushes: list[tuple[str, int, int]],
    extra: dict[str, float],
    newcomer: str,
    priority: int,
    allowance: float,
) -> None:
    queue = filled(pushes, extra, FairnessPolicy(priority_allowance=allowance))
    whole = sum(cost / COST_PER_WORK_SECOND for _, _, cost in pushes)
    ahead = queue.work_ahead_seconds(newcomer, priority)
    assert 0.0 <= ahead <= whole + 1e-9


@settings(max_examples=100, deadline=None)
@given(costs=st.lists(st.integers(2, 4000), max_size=40), extra=st.floats(0, 20_000))
def test_under_one_tenant_the_request_at_the_back_waits_for_the_whole_queue(
    costs: list[int], extra: float
) -> None:
    queue = filled([("a", 0, cost) for cost in costs], {"a": extra}, FairnessPolicy())
    whole = sum(cost / COST_PER_WORK_SECOND for cost in costs)
    assert queue.work_ahead_seconds("a", 0) == pytest.approx(whole)


@settings(max_examples=200, deadline=None)
@given(
    pushes=st.lists(st.tuples(tenant_names, st.integers(2, 4000)), max_size=40),
    extra=charges,
    newcomer=tenant_names,
    weights=st.dictionaries(tenant_names, st.sampled_from([0.5, 1.0, 3.0]), max_size=4),
)
def test_the_prediction_is_the_dispatch_order_to_within_one_request_per_tenant(
    pushes: list[tuple[str, int]], extra: dict[str, float], newcomer: str, weights: dict[str, float]
) -> None:
    """Property: push the newcomer and serve until it leaves; the work served before it differs from the
    prediction by at most one request of each other tenant (the one crossing its tag)."""
    policy = FairnessPolicy(weights=weights)
    queue = filled([(tenant, 0, cost) for tenant, cost in pushes], extra, policy)
    predicted = queue.work_ahead_seconds(newcomer, 0)
    queue.push(request(newcomer, payload="newcomer"))
    served_before = 0.0
    while (dispatch := queue.pop(0.0)) is not None and dispatch.item.payload != "newcomer":
        served_before += dispatch.item.work_seconds
    assert dispatch is not None
    largest: dict[str, float] = {}
    for tenant, cost in pushes:
        largest[tenant] = max(largest.get(tenant, 0.0), cost / COST_PER_WORK_SECOND)
    slack = sum(work for tenant, work in largest.items() if tenant != newcomer)
    assert abs(served_before - predicted) <= slack + 1e-9


def test_an_arrival_window_that_is_not_positive_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="arrival_window_seconds"):
        FairnessPolicy(arrival_window_seconds=0.0)
