"""Routing a request for a LoRA adapter (goodput.controllers.requests.adapters): a group that holds
it first, else a free slot, else the least recently used idle adapter's slot; a failed load is not
retried on that group until its backoff passes; and the load time is priced, in routing and in the
admission's view."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from goodput.controllers.requests.adapters import (
    AdapterPlacement,
    AdapterPolicy,
    AdapterRefused,
    AdapterRoute,
    GroupAdapters,
    choose_adapter_group,
    decayed_uses,
    with_load_time,
)
from goodput.controllers.requests.admission import GroupLoad
from goodput.controllers.requests.fairness import FairnessPolicy, FairQueue, QueuedItem
from goodput.controllers.requests.routing import Candidate, RouteRequest

POLICY = AdapterPolicy(
    sources={f"a{i}": f"/adapters/a{i}" for i in range(10)},
    max_loaded_per_group=2,
    load_seconds=0.5,
    failure_backoff_seconds=30.0,
)
CAPACITY = 10.0  # work-seconds per second


def candidate(name: str, wait_seconds: float = 0.0, free_slots: int = 4, ready: bool = True) -> Candidate:
    load = GroupLoad(
        name=name,
        ready=ready,
        draining=False,
        waiting_work_seconds=wait_seconds * CAPACITY,
        running_work_seconds=0.0,
        kv_capacity_tokens=100_000,
        kv_free_tokens=100_000,
        capacity_work_seconds_per_second=CAPACITY,
    )
    return Candidate(load, free_slots)


REQUEST = RouteRequest(wait_budget_seconds=2.0, kv_need_tokens=100)


@dataclass(frozen=True)
class Case:
    name: str
    candidates: list[Candidate]
    holdings: dict[str, GroupAdapters]
    expected: AdapterRoute | AdapterRefused | None
    adapter: str = "a1"
    request: RouteRequest = REQUEST
    now: float = 100.0


CASES = [
    Case(
        "a group that holds the adapter wins over an idler one with a free slot",
        [candidate("g1", wait_seconds=0.3), candidate("g2")],
        {"g1": GroupAdapters(("a1",)), "g2": GroupAdapters()},
        AdapterRoute("g1", AdapterPlacement.HELD),
    ),
    Case(
        "a holder busier than a load elsewhere costs loses: the load is priced, not forbidden",
        [candidate("g1", wait_seconds=1.5), candidate("g2", wait_seconds=0.2)],
        {"g1": GroupAdapters(("a1",)), "g2": GroupAdapters()},
        AdapterRoute("g2", AdapterPlacement.LOADED),
    ),
    Case(
        "nobody holds it: the least loaded group with a free slot loads it",
        [candidate("g1", wait_seconds=0.4), candidate("g2", wait_seconds=0.1)],
        {"g1": GroupAdapters(), "g2": GroupAdapters(("a2",))},
        AdapterRoute("g2", AdapterPlacement.LOADED),
    ),
    Case(
        "a free slot is preferred over an eviction at the same cost",
        [candidate("g1"), candidate("g2")],
        {"g1": GroupAdapters(("a2", "a3")), "g2": GroupAdapters(("a4",))},
        AdapterRoute("g2", AdapterPlacement.LOADED),
    ),
    Case(
        "a full group, no uses known: the least recently used adapter goes",
        [candidate("g1")],
        {"g1": GroupAdapters(("a2", "a3"))},
        AdapterRoute("g1", AdapterPlacement.EVICTED, evict="a2"),
    ),
    Case(
        "an adapter in use is never evicted: the next least recently used goes",
        [candidate("g1")],
        {"g1": GroupAdapters(("a2", "a3"), busy=frozenset({"a2"}))},
        AdapterRoute("g1", AdapterPlacement.EVICTED, evict="a3"),
    ),
    Case(
        "an adapter used often recently stays over a less recently used one asked for once",
        [candidate("g1")],
        {"g1": GroupAdapters(("a2", "a3"), recent_uses={"a2": 9.0, "a3": 1.0})},
        AdapterRoute("g1", AdapterPlacement.EVICTED, evict="a3"),
    ),
    Case(
        "every group full: the group whose victim is cheapest to lose loads it",
        [candidate("g1"), candidate("g2")],
        {
            "g1": GroupAdapters(("a2", "a3"), recent_uses={"a2": 5.0, "a3": 4.0}),
            "g2": GroupAdapters(("a4", "a5"), recent_uses={"a4": 0.5, "a5": 6.0}),
        },
        AdapterRoute("g2", AdapterPlacement.EVICTED, evict="a4"),
    ),
    Case(
        "a group full of adapters in use cannot load: the request waits",
        [candidate("g1")],
        {"g1": GroupAdapters(("a2", "a3"), busy=frozenset({"a2", "a3"}))},
        None,
    ),
    Case(
        "a group whose load failed is skipped during its backoff",
        [candidate("g1"), candidate("g2", wait_seconds=0.5)],
        {"g1": GroupAdapters(failed_until={"a1": 120.0}), "g2": GroupAdapters()},
        AdapterRoute("g2", AdapterPlacement.LOADED),
    ),
    Case(
        "after the backoff the group may load it again",
        [candidate("g1"), candidate("g2", wait_seconds=0.5)],
        {"g1": GroupAdapters(failed_until={"a1": 90.0}), "g2": GroupAdapters()},
        AdapterRoute("g1", AdapterPlacement.LOADED),
    ),
    Case(
        "every serving group in backoff: refused until the earliest backoff ends",
        [candidate("g1"), candidate("g2")],
        {"g1": GroupAdapters(failed_until={"a1": 120.0}), "g2": GroupAdapters(failed_until={"a1": 110.0})},
        AdapterRefused("a1", 110.0),
    ),
    Case(
        "the other groups in backoff and the only one left busy: the request waits, not refused",
        [candidate("g1"), candidate("g2", free_slots=0)],
        {"g1": GroupAdapters(failed_until={"a1": 120.0}), "g2": GroupAdapters()},
        None,
    ),
    Case(
        "a group without a free seat or not ready is never chosen",
        [candidate("g1", free_slots=0), candidate("g2", ready=False), candidate("g3", wait_seconds=1.0)],
        {"g1": GroupAdapters(("a1",)), "g2": GroupAdapters(("a1",))},
        AdapterRoute("g3", AdapterPlacement.LOADED),
    ),
    Case(
        "no group within the budget: the cheapest anyway, marked as over budget",
        [candidate("g1", wait_seconds=3.0), candidate("g2", wait_seconds=2.8)],
        {"g1": GroupAdapters(("a1",))},
        AdapterRoute("g1", AdapterPlacement.HELD, fits=False),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_adapter_routing(case: Case) -> None:
    chosen = choose_adapter_group(
        case.candidates, case.holdings, case.adapter, case.request, policy=POLICY, now=case.now
    )
    assert chosen == case.expected


def test_recent_uses_halve_every_half_life() -> None:
    assert decayed_uses(8.0, 60.0, 60.0) == pytest.approx(4.0)
    assert decayed_uses(8.0, 0.0, 60.0) == 8.0
    assert decayed_uses(8.0, -5.0, 60.0) == 8.0, "a clock that went back forgets nothing"


def test_admission_sees_the_load_time_on_groups_without_the_adapter() -> None:
    loads = [candidate("g1", wait_seconds=0.2).load, candidate("g2", wait_seconds=0.2).load]
    priced = with_load_time(loads, {"g1": GroupAdapters(("a1",))}, "a1", POLICY)
    waits = {load.name: load.waiting_work_seconds / load.capacity_work_seconds_per_second for load in priced}
    assert waits == pytest.approx({"g1": 0.2, "g2": 0.2 + POLICY.load_seconds})


@settings(max_examples=200, deadline=None)
@given(
    requests=st.lists(
        st.tuples(st.integers(0, 9), st.integers(0, 2), st.booleans()), min_size=1, max_size=200
    ),
    limit=st.integers(1, 4),
)
def test_no_group_ever_holds_more_than_its_limit(requests: list[tuple[int, int, bool]], limit: int) -> None:
    """Whatever requests arrive and finish, applying each decision keeps every group at or under
    `max_loaded_per_group` adapters, and never evicts an adapter in use."""
    policy = AdapterPolicy(sources=POLICY.sources, max_loaded_per_group=limit)
    loaded: dict[str, list[str]] = {"g0": [], "g1": [], "g2": []}
    in_use: dict[str, dict[str, int]] = {name: {} for name in loaded}
    for adapter_index, busy_group, finishes in requests:
        adapter = f"a{adapter_index}"
        holdings = {
            name: GroupAdapters(tuple(held), frozenset(a for a, n in in_use[name].items() if n > 0))
            for name, held in loaded.items()
        }
        candidates = [candidate(name, wait_seconds=0.1 * (i == busy_group)) for i, name in enumerate(loaded)]
        chosen = choose_adapter_group(candidates, holdings, adapter, REQUEST, policy=policy, now=0.0)
        if not isinstance(chosen, AdapterRoute):
            assert chosen is None  # nothing failed, so never refused
            continue
        held = loaded[chosen.group]
        if chosen.evict is not None:
            assert in_use[chosen.group].get(chosen.evict, 0) == 0, "an adapter in use was evicted"
            held.remove(chosen.evict)
        if adapter in held:
            held.remove(adapter)
        held.append(adapter)
        assert len(held) <= limit
        if not finishes:
            in_use[chosen.group][adapter] = in_use[chosen.group].get(adapter, 0) + 1
        else:  # an earlier request on this group finished
            for name in in_use[chosen.group]:
                in_use[chosen.group][name] = 0


def test_a_request_put_back_regains_its_place_and_its_tenant_the_charge() -> None:
    """The gateway pops a request for an adapter no group can load yet, lets the others by, then puts
    it back: the queue is as if it had never been popped."""
    queue: FairQueue[str] = FairQueue(FairnessPolicy())
    first = queue.push(QueuedItem("a", 0, 5.0, 0.0, 100, 50, "adapter request", work_seconds=1.0))
    queue.push(QueuedItem("b", 0, 6.0, 0.1, 100, 50, "base request", work_seconds=1.0))
    counters, ahead = dict(queue.counters), queue.work_ahead_seconds("c", 0)
    dispatch = queue.pop(1.0)
    assert dispatch is not None and dispatch.item is first
    queue.put_back(first)
    assert queue.counters == counters
    assert queue.work_ahead_seconds("c", 0) == ahead
    assert len(queue) == 2
    again = queue.pop(1.0)
    assert again is not None and again.item is first, "its place kept"
