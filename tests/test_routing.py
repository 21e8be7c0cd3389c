"""Routing by predicted work, prefix affinity and session stickiness (controllers.requests.routing)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from goodput.api.reasons import RouteReason
from goodput.controllers.requests.admission import GroupLoad
from goodput.controllers.requests.routing import (
    Candidate,
    GroupBook,
    RouteRequest,
    RoutingPolicy,
    choose_group,
    prefix_key,
    rendezvous_rank,
)

POLICY = RoutingPolicy(affinity_slack_seconds=0.5)


def candidate(name: str, wait: float = 0.0, *, slots: int = 4, **fields: object) -> Candidate:
    values: dict[str, object] = {
        "name": name,
        "ready": True,
        "draining": False,
        "waiting_work_seconds": wait,
        "running_work_seconds": 0.0,
        "kv_capacity_tokens": 10_000,
        "kv_free_tokens": 10_000,
        "capacity_work_seconds_per_second": 1.0,
    }
    values.update(fields)
    return Candidate(GroupLoad(**values), slots)  # type: ignore[arg-type]


def home_of(key: bytes, names: list[str]) -> str:
    return rendezvous_rank(key, names)[0]


KEY = prefix_key("system prompt " * 100, POLICY)
assert KEY is not None
NAMES = ["g1", "g2", "g3"]
HOME = home_of(KEY, NAMES)
OTHERS = [name for name in NAMES if name != HOME]


@dataclass(frozen=True)
class Case:
    name: str
    candidates: tuple[Candidate, ...]
    request: RouteRequest
    group: str | None
    reason: RouteReason | None


CASES = [
    Case(
        "least predicted work",
        (candidate("g1", 3.0), candidate("g2", 1.0), candidate("g3", 2.0)),
        RouteRequest(5.0, 100),
        "g2",
        RouteReason.LEAST_WORK,
    ),
    Case(
        "never a draining group",
        (candidate("g1", 3.0), candidate("g2", 0.0, draining=True)),
        RouteRequest(5.0, 100),
        "g1",
        RouteReason.LEAST_WORK,
    ),
    Case(
        "never a group that is not ready",
        (candidate("g1", 3.0), candidate("g2", 0.0, ready=False)),
        RouteRequest(5.0, 100),
        "g1",
        RouteReason.LEAST_WORK,
    ),
    Case(
        "never a group without a free slot",
        (candidate("g1", 3.0), candidate("g2", 0.0, slots=0)),
        RouteRequest(5.0, 100),
        "g1",
        RouteReason.LEAST_WORK,
    ),
    Case("nothing eligible", (candidate("g1", draining=True),), RouteRequest(5.0, 100), None, None),
    Case(
        "KV headroom excludes a group",
        (candidate("g1", 0.0, kv_free_tokens=50), candidate("g2", 2.0)),
        RouteRequest(5.0, 100),
        "g2",
        RouteReason.LEAST_WORK,
    ),
    Case(
        "prefix home within the slack wins",
        tuple(candidate(name, 0.3 if name == HOME else 0.0) for name in NAMES),
        RouteRequest(5.0, 100, KEY),
        HOME,
        RouteReason.PREFIX,
    ),
    Case(
        "prefix home beyond the slack loses to least work",
        tuple(candidate(name, 2.0 if name == HOME else 0.0) for name in NAMES),
        RouteRequest(5.0, 100, KEY),
        min(OTHERS),
        RouteReason.LEAST_WORK,
    ),
    Case(
        "session sticks while its group fits",
        (candidate("g1", 0.0), candidate("g2", 3.0)),
        RouteRequest(5.0, 100, session_group="g2"),
        "g2",
        RouteReason.SESSION,
    ),
    Case(
        "session yields when its group is overloaded",
        (candidate("g1", 0.0), candidate("g2", 9.0)),
        RouteRequest(5.0, 100, session_group="g2"),
        "g1",
        RouteReason.LEAST_WORK,
    ),
    Case(
        "session yields when its group drains",
        (candidate("g1", 1.0), candidate("g2", 0.0, draining=True)),
        RouteRequest(5.0, 100, session_group="g2"),
        "g1",
        RouteReason.LEAST_WORK,
    ),
    Case(
        "none fits the budget: least work, marked",
        (candidate("g1", 9.0), candidate("g2", 7.0)),
        RouteRequest(5.0, 100),
        "g2",
        RouteReason.OVER_BUDGET,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_routing(case: Case) -> None:
    route = choose_group(case.candidates, case.request, POLICY)
    if case.group is None:
        assert route is None
    else:
        assert route is not None and (route.group, route.reason) == (case.group, case.reason)


def test_short_prompts_have_no_prefix_key() -> None:
    assert prefix_key("hi", POLICY) is None


def test_prefix_key_reads_only_the_leading_blocks() -> None:
    shared = "x" * (POLICY.prefix_block_chars * POLICY.prefix_blocks)
    assert prefix_key(shared + "question one", POLICY) == prefix_key(shared + "another question", POLICY)


@given(st.lists(st.binary(min_size=1, max_size=32), min_size=1, max_size=200, unique=True))
def test_rendezvous_moves_only_the_keys_of_a_removed_group(keys: list[bytes]) -> None:
    """Property: removing a group reassigns only the prefixes that lived on it (consistent hashing)."""
    before = {key: home_of(key, ["g1", "g2", "g3", "g4"]) for key in keys}
    after = {key: home_of(key, ["g1", "g2", "g4"]) for key in keys}
    for key in keys:
        if before[key] != "g3":
            assert after[key] == before[key]


def test_rendezvous_spreads_prefixes() -> None:
    homes = Counter(home_of(index.to_bytes(4, "big"), NAMES) for index in range(3000))
    assert min(homes.values()) > 800


@given(
    waits=st.lists(st.floats(0, 20), min_size=1, max_size=6),
    draining=st.lists(st.booleans(), min_size=6, max_size=6),
)
def test_choice_is_always_serving_and_least_loaded_when_no_preference(
    waits: list[float], draining: list[bool]
) -> None:
    candidates = [candidate(f"g{i}", wait, draining=draining[i]) for i, wait in enumerate(waits)]
    route = choose_group(candidates, RouteRequest(5.0, 100), POLICY)
    serving = [c for c in candidates if not c.load.draining]
    if not serving:
        assert route is None
        return
    assert route is not None
    chosen = next(c for c in candidates if c.name == route.group)
    assert not chosen.load.draining
    assert chosen.wait_seconds == min(c.wait_seconds for c in serving)


@pytest.mark.parametrize(
    ("seats", "unstarted", "expected"),
    [
        pytest.param(4, 0, 4, id="idle group: every seat"),
        pytest.param(0, 0, 0, id="no seat"),
        pytest.param(4, 4095, 4, id="prefill pipeline not yet full"),
        pytest.param(4, 4096, 0, id="two chunks of prompts not started: wait in the gateway"),
    ],
)
def test_free_dispatch_slots(seats: int, unstarted: int, expected: int) -> None:
    from goodput.controllers.requests.routing import free_dispatch_slots

    assert free_dispatch_slots(seats, unstarted, chunk_tokens=2048) == expected


# --- The gateway's book of what each group holds -----------------------------------------------------


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        ([("dispatch", 1)], (1, 2.0, 300, 100)),
        ([("dispatch", 1), ("start", 1)], (1, 2.0, 300, 0)),
        ([("dispatch", 1), ("start", 1), ("release", 1)], (0, 0.0, 0, 0)),
        # Failed or aborted before its first token: its prompt leaves the prefill pipeline too.
        ([("dispatch", 1), ("dispatch", 2), ("release", 1)], (1, 2.0, 300, 100)),
        ([("release", 1)], (0, 0.0, 0, 0)),
    ],
    ids=["sent", "started", "answered", "released before it started", "a release never goes negative"],
)
def test_the_book_counts_what_a_group_holds_until_it_is_released(
    steps: list[tuple[str, int]], expected: tuple[int, float, int, int]
) -> None:
    book = GroupBook()
    started: set[int] = set()
    for action, request in steps:
        if action == "dispatch":
            book.dispatched(work_seconds=2.0, kv_tokens=300, prompt_tokens=100)
        elif action == "start":
            book.started(100)
            started.add(request)
        else:
            book.released(2.0, 300, 100, started=request in started)
    assert (
        book.in_flight,
        book.running_work_seconds,
        book.kv_used_tokens,
        book.unstarted_prompt_tokens,
    ) == expected


def test_a_full_book_has_no_free_slot_and_routing_sees_its_wait() -> None:
    book = GroupBook()
    for _ in range(4):
        book.dispatched(work_seconds=1.0, kv_tokens=100, prompt_tokens=10)
    load = book.load(
        "g0",
        serving=(True, False),
        waiting_work_seconds=0.0,
        kv_capacity_tokens=1000,
        capacity_work_seconds_per_second=2.0,
        max_in_flight=4,
    )
    assert book.free_slots(4, chunk_tokens=2048) == 0
    assert book.free_slots(5, chunk_tokens=2048) == 1
    assert load.kv_free_tokens == 600 and load.slot_wait_seconds > 0
