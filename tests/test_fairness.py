"""Weighted virtual token counters (goodput.controllers.requests.fairness)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from goodput.api.slopolicy import Fairness
from goodput.controllers.requests.fairness import (
    CostWeights,
    FairnessPolicy,
    FairQueue,
    QueuedItem,
    fairness_policy,
    jain_index,
)


def item(
    tenant: str,
    *,
    input_tokens: int = 100,
    output_tokens: int = 100,
    priority: int = 0,
    deadline: float = 10.0,
    arrival: float = 0.0,
    payload: str = "",
) -> QueuedItem[str]:
    return QueuedItem(
        tenant, priority, deadline, arrival, input_tokens, output_tokens, payload, work_seconds=0.0
    )


def serve(queue: FairQueue[str], count: int, now: float = 0.0) -> list[str]:
    served = []
    for _ in range(count):
        dispatch = queue.pop(now)
        if dispatch is None:
            break
        served.append(dispatch.item.tenant)
    return served


def test_equal_tenants_alternate() -> None:
    queue: FairQueue[str] = FairQueue(FairnessPolicy())
    for _ in range(10):
        queue.push(item("a"))
        queue.push(item("b"))
    served = serve(queue, 10)
    assert Counter(served) == {"a": 5, "b": 5}


def test_weights_split_service() -> None:
    queue: FairQueue[str] = FairQueue(FairnessPolicy(weights={"gold": 3.0}))
    for _ in range(40):
        queue.push(item("gold"))
        queue.push(item("free"))
    assert Counter(serve(queue, 40)) == {"gold": 30, "free": 10}


def test_cost_weights_price_output_tokens() -> None:
    """Tenant `long` asks 10x the output per request: with output priced, it gets ~1/10 the requests."""
    queue: FairQueue[str] = FairQueue(FairnessPolicy(cost_weights=CostWeights(0.0, 1.0)))
    for _ in range(100):
        queue.push(item("long", output_tokens=1000))
        queue.push(item("short", output_tokens=100))
    counts = Counter(serve(queue, 55))
    assert counts["short"] == 50 and counts["long"] == 5


def test_a_newly_backlogged_tenant_is_lifted_and_banks_no_idle_time() -> None:
    queue: FairQueue[str] = FairQueue(FairnessPolicy())
    for _ in range(50):
        queue.push(item("busy"))
    serve(queue, 40)  # busy's counter is now 40 requests' worth
    for _ in range(20):
        queue.push(item("late"))
    assert queue.counters["late"] == queue.counters["busy"]
    served = serve(queue, 10)
    assert 4 <= served.count("late") <= 6  # shares from now on, not 40 requests of catch-up


def test_lift_after_an_idle_queue_uses_the_last_served_counter() -> None:
    queue: FairQueue[str] = FairQueue(FairnessPolicy())
    for _ in range(5):
        queue.push(item("a"))
    serve(queue, 5)
    queue.push(item("b"))
    assert queue.counters["b"] == queue.counters["a"]


def test_deadline_orders_a_tenants_own_requests() -> None:
    queue: FairQueue[str] = FairQueue(FairnessPolicy())
    for deadline, name in ((30.0, "late"), (5.0, "urgent"), (10.0, "soon")):
        queue.push(item("a", deadline=deadline, payload=name))
    order = [queue.pop(0.0) for _ in range(3)]
    assert [d.item.payload for d in order if d is not None] == ["urgent", "soon", "late"]


def test_priority_is_bounded_by_the_allowance() -> None:
    strict: FairQueue[str] = FairQueue(FairnessPolicy(priority_allowance=0.0))
    lenient: FairQueue[str] = FairQueue(FairnessPolicy(priority_allowance=1000.0))
    for queue in (strict, lenient):
        queue.charge("vip", 500, 0)  # vip already got 500 cost more than `std`
        queue.push(item("std", priority=5))
        queue.push(item("vip", priority=0))
    strict_first = strict.pop(0.0)
    lenient_first = lenient.pop(0.0)
    assert strict_first is not None and strict_first.item.tenant == "std"
    assert lenient_first is not None and lenient_first.item.tenant == "vip"


def test_priority_ages() -> None:
    queue: FairQueue[str] = FairQueue(FairnessPolicy(aging_seconds=1.0))
    queue.push(item("a", priority=5, arrival=0.0, payload="old-low"))
    queue.push(item("a", priority=0, arrival=9.0, payload="new-high"))
    first = queue.pop(now=10.0)  # old-low has aged 10 levels: effective -5 < -1
    assert first is not None and first.item.payload == "old-low"


def test_cancel_frees_the_slot_and_backlog() -> None:
    queue: FairQueue[str] = FairQueue(FairnessPolicy())
    gone = queue.push(item("a", payload="gone"))
    queue.push(item("a", payload="stays"))
    assert queue.cancel(gone) and not queue.cancel(gone)
    assert queue.backlog("a") == 1 and len(queue) == 1
    first = queue.pop(0.0)
    assert first is not None and first.item.payload == "stays"
    assert queue.pop(0.0) is None and queue.backlogged() == ()


def test_settle_corrects_the_predicted_output() -> None:
    queue: FairQueue[str] = FairQueue(FairnessPolicy())
    queue.push(item("a", input_tokens=10, output_tokens=100))
    dispatch = queue.pop(0.0)
    assert dispatch is not None and queue.counters["a"] == 110
    queue.settle("a", expected_output_tokens=100, actual_output_tokens=30)
    assert queue.counters["a"] == 40


def test_policy_from_the_slopolicy() -> None:
    spec = Fairness.model_validate(
        {"tenants": [{"name": "gold", "weight": 4}], "costWeights": {"kvByteSeconds": 1e-9}}
    )
    compiled = fairness_policy(spec)
    assert compiled.weight("gold") == 4 and compiled.weight("anyone") == 1
    assert compiled.cost_weights.kv_byte_seconds == 1e-9


@pytest.mark.parametrize(
    ("shares", "expected"), [({"a": 1, "b": 1}, 1.0), ({"a": 1, "b": 0}, 0.5), ({}, 1.0)]
)
def test_jain_index(shares: dict[str, float], expected: float) -> None:
    assert jain_index(shares) == pytest.approx(expected)


sizes = st.lists(st.tuples(st.integers(1, 4000), st.integers(1, 2000)), min_size=1, max_size=30)


@settings(max_examples=50, deadline=None)
@given(heavy=sizes, light=sizes, heavy_factor=st.integers(1, 10))
def test_backlogged_equal_tenants_get_equal_service(
    heavy: list[tuple[int, int]], light: list[tuple[int, int]], heavy_factor: int
) -> None:
    """Property: while both stay backlogged, two equally weighted tenants' served cost differs by at
    most one request's cost (the VTC bound), whatever their request sizes or arrival ratio; so their
    shares have a Jain index near 1 once a few requests are served."""
    queue: FairQueue[str] = FairQueue(FairnessPolicy())
    for repeat in range(heavy_factor * 4):
        for input_tokens, output_tokens in heavy:
            queue.push(item("heavy", input_tokens=input_tokens, output_tokens=output_tokens, arrival=repeat))
    for input_tokens, output_tokens in light * 4:
        queue.push(item("light", input_tokens=input_tokens, output_tokens=output_tokens))
    served: Counter[str] = Counter()
    largest = max(i + o for i, o in heavy + light)
    while queue.backlog("heavy") and queue.backlog("light"):
        dispatch = queue.pop(0.0)
        assert dispatch is not None
        served[dispatch.item.tenant] += dispatch.charged_cost
        assert abs(served["heavy"] - served["light"]) <= largest
    if min(served.values(), default=0) >= 10 * largest:
        assert jain_index(served) >= 0.95


@settings(max_examples=50, deadline=None)
@given(weights=st.lists(st.floats(0.1, 10), min_size=2, max_size=5), rounds=st.integers(1, 200))
def test_no_backlogged_tenant_starves(weights: list[float], rounds: int) -> None:
    """Property: every backlogged tenant is served within a bounded number of dispatches."""
    names = [f"t{index}" for index in range(len(weights))]
    queue: FairQueue[str] = FairQueue(FairnessPolicy(weights=dict(zip(names, weights, strict=True))))
    for name in names:
        for _ in range(rounds + 200):
            queue.push(item(name))
    ratio = max(weights) / min(weights)
    bound = int(len(names) * ratio) + len(names) + 1
    since_served = dict.fromkeys(names, 0)
    for _ in range(rounds):
        dispatch = queue.pop(0.0)
        assert dispatch is not None
        for name in names:
            since_served[name] = 0 if name == dispatch.item.tenant else since_served[name] + 1
            assert since_served[name] <= bound


def test_prune_forgets_only_tenants_the_lift_would_erase_anyway() -> None:
    queue: FairQueue[str] = FairQueue(FairnessPolicy())
    for name in ("idle-low", "ahead", "busy"):
        queue.push(item(name))
    queue.charge("ahead", 10_000, 0)  # far ahead: must be remembered
    serve(queue, 3)
    for _ in range(3):
        queue.push(item("busy"))
    queue.charge("busy", 500, 0)
    forgotten_before = dict(queue.counters)
    assert queue.prune() == 1  # idle-low is at or below the floor
    assert "idle-low" not in queue.counters and "ahead" in queue.counters
    queue.push(item("idle-low"))  # comes back: lifted exactly as if remembered
    assert queue.counters["idle-low"] == max(forgotten_before["idle-low"], queue.counters["busy"])


def test_many_one_off_tenants_do_not_grow_the_queue_state() -> None:
    queue: FairQueue[str] = FairQueue(FairnessPolicy())
    for index in range(5000):
        queue.push(item(f"tenant-{index}"))
        queue.pop(0.0)
    assert len(queue.counters) < 1100
