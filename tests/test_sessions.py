"""Session budgets of the request path (goodput.controllers.requests.sessions)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from goodput.controllers.requests.sessions import (
    ChildGrant,
    Refused,
    Session,
    SessionLimits,
    SessionRefusal,
    SessionTable,
    fit_child,
)


def opened(table: SessionTable, limits: SessionLimits, now: float = 0.0, name: str = "s1") -> Session:
    session = table.open_session(name, "team-a", "agent", limits, now)
    assert isinstance(session, Session)
    return session


@dataclass(frozen=True)
class FitCase:
    name: str
    limits: SessionLimits
    spent: int
    branches_used: int
    prompt: int
    output: int
    now: float
    may_cap: bool
    expected: tuple[int, bool] | SessionRefusal


FIT_CASES = [
    FitCase("fits whole", SessionLimits(1000, None, None), 0, 0, 100, 200, 0.0, False, (200, False)),
    FitCase("no token limit", SessionLimits(None, 5, None), 0, 0, 10**6, 10**6, 0.0, False, (10**6, False)),
    FitCase(
        "capped to what is left", SessionLimits(1000, None, None), 700, 1, 100, 500, 0.0, True, (200, True)
    ),
    FitCase(
        "over, class may not cap",
        SessionLimits(1000, None, None),
        700,
        1,
        100,
        500,
        0.0,
        False,
        SessionRefusal.BUDGET_EXHAUSTED,
    ),
    FitCase(
        "prompt alone uses what is left",
        SessionLimits(1000, None, None),
        900,
        1,
        100,
        50,
        0.0,
        True,
        SessionRefusal.BUDGET_EXHAUSTED,
    ),
    FitCase(
        "branches spent", SessionLimits(None, 3, None), 0, 3, 1, 1, 0.0, True, SessionRefusal.BUDGET_EXHAUSTED
    ),
    FitCase(
        "deadline passed", SessionLimits(None, None, 30.0), 0, 1, 1, 1, 30.0, True, SessionRefusal.EXPIRED
    ),
    FitCase("before the deadline", SessionLimits(None, None, 30.0), 0, 1, 1, 1, 29.9, True, (1, False)),
]


@pytest.mark.parametrize("case", FIT_CASES, ids=lambda case: case.name)
def test_a_child_gets_what_its_session_has_left(case: FitCase) -> None:
    session = Session("s1", "team-a", "agent", case.limits, 0.0, 0.0, case.spent, case.branches_used)
    fitted = fit_child(session, case.prompt, case.output, case.now, may_cap=case.may_cap)
    if isinstance(case.expected, SessionRefusal):
        assert isinstance(fitted, Refused)
        assert fitted.refusal is case.expected
        assert "s1" in fitted.message
    else:
        assert fitted == case.expected


def test_a_child_settles_to_what_it_used_and_gives_back_the_rest() -> None:
    table = SessionTable()
    session = opened(table, SessionLimits(1000, None, None))
    grant = table.admit_child(session, 100, 400, 1.0, may_cap=False)
    assert isinstance(grant, ChildGrant)
    assert session.remaining_tokens == 500
    table.settle(grant, 150, 2.0)
    assert session.remaining_tokens == 850
    assert session.spent_tokens == 150
    table.settle(grant, 150, 2.0)  # settled twice: charged once
    assert session.spent_tokens == 150


def test_a_child_is_never_charged_more_than_it_reserved() -> None:
    table = SessionTable()
    session = opened(table, SessionLimits(1000, None, None))
    grant = table.admit_child(session, 10, 10, 1.0, may_cap=False)
    assert isinstance(grant, ChildGrant)
    table.settle(grant, 10_000, 2.0)
    assert session.spent_tokens == 20


@dataclass(frozen=True)
class LookupCase:
    name: str
    child_class: str
    ask: str
    expected: SessionRefusal | None


LOOKUP_CASES = [
    LookupCase("open session of the same class", "agent", "s1", None),
    LookupCase("unknown session", "agent", "nope", SessionRefusal.NOT_FOUND),
    LookupCase("expired session", "agent", "old", SessionRefusal.EXPIRED),
    LookupCase("another class", "chat", "s1", SessionRefusal.OTHER_CLASS),
]


@pytest.mark.parametrize("case", LOOKUP_CASES, ids=lambda case: case.name)
def test_a_child_names_an_open_session_of_its_class(case: LookupCase) -> None:
    table = SessionTable()
    opened(table, SessionLimits(None, None, 5.0), name="old")
    opened(table, SessionLimits(100, None, None), now=1.0, name="s1")
    assert [ended.name for ended in table.expire(6.0)] == ["old"]
    found = table.lookup(case.ask, case.child_class)
    if case.expected is None:
        assert isinstance(found, Session)
    else:
        assert isinstance(found, Refused)
        assert found.refusal is case.expected


def test_a_root_cannot_reopen_a_session_by_name() -> None:
    table = SessionTable()
    opened(table, SessionLimits(100, None, None))
    again = table.open_session("s1", "team-b", "agent", SessionLimits(10**6, None, None), 1.0)
    assert isinstance(again, Refused) and again.refusal is SessionRefusal.EXISTS
    table.end("s1", SessionRefusal.EXPIRED)
    again = table.open_session("s1", "team-b", "agent", SessionLimits(10**6, None, None), 1.0)
    assert isinstance(again, Refused) and again.refusal is SessionRefusal.EXISTS


def test_the_deadline_names_every_child_in_flight_and_releases_them() -> None:
    table = SessionTable()
    session = opened(table, SessionLimits(1000, None, 10.0))
    grants = [table.admit_child(session, 10, 10, 1.0, may_cap=False) for _ in range(3)]
    assert all(isinstance(grant, ChildGrant) for grant in grants)
    first = grants[0]
    assert isinstance(first, ChildGrant)
    table.settle(first, 5, 2.0)
    assert table.expire(9.9) == []
    (ended,) = table.expire(10.0)
    assert ended.refusal is SessionRefusal.EXPIRED
    assert sorted(ended.children_in_flight) == sorted(
        g.child for g in grants[1:] if isinstance(g, ChildGrant)
    )
    assert session.held_tokens == 0
    assert table.get("s1") is None


def test_the_table_is_bounded_and_ends_the_least_recent_idle_session_first() -> None:
    table = SessionTable(max_sessions=2, max_ended=1)
    busy = opened(table, SessionLimits(100, None, None), name="busy")
    assert isinstance(table.admit_child(busy, 1, 1, 0.0, may_cap=False), ChildGrant)
    opened(table, SessionLimits(100, None, None), name="idle")
    opened(table, SessionLimits(100, None, None), now=1.0, name="new")
    assert set(table.open) == {"busy", "new"}
    assert isinstance(table.lookup("idle", "agent"), Refused)
    newest = table.get("new")
    assert newest is not None
    assert isinstance(table.admit_child(newest, 1, 1, 1.0, may_cap=False), ChildGrant)
    full = table.open_session("more", "team-a", "agent", SessionLimits(1, None, None), 2.0)
    assert isinstance(full, Refused) and full.refusal is SessionRefusal.TABLE_FULL
    assert len(table.ended) == 1


def test_an_idle_session_ends_after_its_time_to_live() -> None:
    table = SessionTable(idle_ttl_seconds=60.0)
    opened(table, SessionLimits(100, None, None))
    assert table.expire(59.0) == []
    (ended,) = table.expire(60.0)
    assert ended.refusal is SessionRefusal.ENDED
    refused = table.lookup("s1", "agent")
    assert isinstance(refused, Refused) and refused.http_status == 410


operations = st.lists(
    st.one_of(
        st.tuples(st.just("child"), st.integers(1, 300), st.integers(1, 300), st.booleans()),
        st.tuples(st.just("settle"), st.integers(0, 20), st.integers(0, 700), st.booleans()),
        st.tuples(st.just("tick"), st.integers(0, 20), st.integers(0, 0), st.booleans()),
    ),
    max_size=60,
)


@given(
    operations,
    st.integers(1, 3000),
    st.one_of(st.none(), st.integers(1, 20)),
    st.one_of(st.none(), st.floats(1.0, 50.0)),
)
def test_no_budget_is_leaked(
    ops: list[tuple[str, int, int, bool]], tokens: int, branches: int | None, wall: float | None
) -> None:
    """reserved = spent + held + remaining at every step; nothing goes below zero; the branch limit
    holds; a child's charge never exceeds its reservation; the end gives back everything held."""
    table = SessionTable()
    session = opened(table, SessionLimits(tokens, branches, wall))
    grants: list[ChildGrant] = []
    charged = 0
    now = 0.0
    for kind, a, b, flag in ops:
        if kind == "child":
            grant = table.admit_child(session, a, b, now, may_cap=flag)
            if isinstance(grant, ChildGrant):
                assert grant.output_tokens <= b and (grant.capped or grant.output_tokens == b)
                grants.append(grant)
        elif kind == "settle" and grants:
            grant = grants.pop(a % len(grants))
            before = session.spent_tokens
            table.settle(grant, b, now)
            charged += session.spent_tokens - before
        elif kind == "tick":
            now += a
            table.expire(now)
        remaining = session.remaining_tokens
        assert remaining is not None and remaining >= 0
        assert tokens == session.spent_tokens + session.held_tokens + remaining
        assert session.spent_tokens == charged
        assert branches is None or session.branches_used <= branches
    ended = table.end("s1", SessionRefusal.EXPIRED) if table.get("s1") else None
    assert session.held_tokens == 0
    if ended is not None:
        assert set(ended.children_in_flight) == {grant.child for grant in grants}
