"""Sessions: the budget a root request reserves for every branch it fans out to (§35).

An agent's one question becomes many generations: query rewrites, parallel tool summaries, repairs
of broken JSON, best-of-N candidates. Admitting each on its own lets one session take what its tenant
was never meant to have. Here a root request of a class with a `sessionBudget` opens a session; the
budget (tokens, branches, wall-clock seconds) is reserved at the root, and every request naming the
session is a child admitted against what is left: it reserves its prompt plus output budget on
admission and settles to what it really used when it ends, so the unused part returns to the session.

Invariant, at every instant: `reserved = spent + held + remaining` (spent: what finished children
used; held: what children in flight reserved); a session that ends (its deadline passed, or it sat
idle past the table's time-to-live) gives back everything it held and names the children in flight,
which the gateway cancels together.

Nothing here does I/O or reads a clock: the gateway and the simulator pass `now`.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from enum import StrEnum

from goodput.api.slopolicy import SessionBudget

SWEEP_INTERVAL_SECONDS = 10.0
"""Ended and idle sessions are swept from the table at a root's arrival, at most this often."""


class SessionRefusal(StrEnum):
    """Why a session request was refused: the `code` of the error body the gateway answers."""

    NOT_FOUND = "session_not_found"
    ENDED = "session_ended"
    EXPIRED = "session_expired"
    BUDGET_EXHAUSTED = "session_budget_exhausted"
    EXISTS = "session_exists"
    TABLE_FULL = "session_table_full"
    OTHER_CLASS = "session_class_mismatch"


REFUSAL_STATUS: dict[SessionRefusal, int] = {
    SessionRefusal.NOT_FOUND: 404,
    SessionRefusal.ENDED: 410,
    SessionRefusal.EXPIRED: 410,
    SessionRefusal.BUDGET_EXHAUSTED: 429,
    SessionRefusal.EXISTS: 409,
    SessionRefusal.TABLE_FULL: 503,
    SessionRefusal.OTHER_CLASS: 400,
}
"""The documented HTTP status of each refusal."""


@dataclass(frozen=True, slots=True)
class SessionLimits:
    """A session's budget as the request path enforces it; None: no limit on that dimension."""

    tokens: int | None
    branches: int | None
    wall_clock_seconds: float | None

    @classmethod
    def of(cls, budget: SessionBudget) -> SessionLimits:
        return cls(budget.tokens, budget.branches, budget.wall_clock_seconds)


@dataclass(slots=True)
class Session:
    """One open session: who it charges, its deadline, and its ledger of tokens and branches."""

    name: str
    tenant: str
    class_name: str
    limits: SessionLimits
    opened_at: float
    last_active: float
    spent_tokens: int = 0
    branches_used: int = 0
    held: dict[int, int] = field(default_factory=dict)  # child id -> tokens reserved

    @property
    def deadline(self) -> float:
        wall = self.limits.wall_clock_seconds
        return self.opened_at + wall if wall is not None else math.inf

    @property
    def held_tokens(self) -> int:
        return sum(self.held.values())

    @property
    def remaining_tokens(self) -> int | None:
        if self.limits.tokens is None:
            return None
        return self.limits.tokens - self.spent_tokens - self.held_tokens


@dataclass(frozen=True, slots=True)
class ChildGrant:
    """A child admitted against its session: the id to settle it by, and the output budget it may use
    (lower than asked when only a capped answer fits what is left and the class allows capping)."""

    session: str
    child: int
    tenant: str
    output_tokens: int
    capped: bool


@dataclass(frozen=True, slots=True)
class Refused:
    """A session request refused; `message` names the session and says what is spent."""

    refusal: SessionRefusal
    message: str

    @property
    def http_status(self) -> int:
        return REFUSAL_STATUS[self.refusal]


@dataclass(frozen=True, slots=True)
class EndedSession:
    """A session that ended: why, and the children still in flight the gateway must cancel."""

    name: str
    refusal: SessionRefusal
    children_in_flight: tuple[int, ...]


def fit_child(
    session: Session, prompt_tokens: int, output_tokens: int, now: float, *, may_cap: bool
) -> tuple[int, bool] | Refused:
    """The output budget a child gets within what its session has left, and whether it was capped;
    or why it gets nothing. Pure: the session is read, not changed."""
    if now >= session.deadline:
        return Refused(SessionRefusal.EXPIRED, f"session {session.name!r} passed its deadline")
    branches = session.limits.branches
    if branches is not None and session.branches_used >= branches:
        return Refused(
            SessionRefusal.BUDGET_EXHAUSTED,
            f"session {session.name!r} has made all {branches} requests of its branch budget",
        )
    remaining = session.remaining_tokens
    if remaining is None or prompt_tokens + output_tokens <= remaining:
        return output_tokens, False
    room = remaining - prompt_tokens
    if may_cap and room >= 1:
        return room, True
    return Refused(
        SessionRefusal.BUDGET_EXHAUSTED,
        f"session {session.name!r} has {max(0, remaining)} of its {session.limits.tokens} tokens left; "
        f"this request needs {prompt_tokens + output_tokens}",
    )


class SessionTable:
    """The open sessions of one request path, bounded in number and time.

    A session ends at its deadline, or when it has had no child in flight for `idle_ttl_seconds`;
    an ended session's name is remembered (bounded too) so that a late child is told it ended (410)
    rather than that it never existed (404). Past `max_sessions` the least recently active idle
    session ends to make room; when every session has children in flight, a new root is refused.
    """

    def __init__(
        self, *, max_sessions: int = 100_000, idle_ttl_seconds: float = 600.0, max_ended: int = 100_000
    ) -> None:
        self.max_sessions = max_sessions
        self.idle_ttl_seconds = idle_ttl_seconds
        self.max_ended = max_ended
        self.open: OrderedDict[str, Session] = OrderedDict()
        self.ended: OrderedDict[str, SessionRefusal] = OrderedDict()
        self._next_child = 0

    def __len__(self) -> int:
        return len(self.open)

    def get(self, name: str) -> Session | None:
        return self.open.get(name)

    def open_session(
        self, name: str, tenant: str, class_name: str, limits: SessionLimits, now: float
    ) -> Session | Refused:
        """Open a session for a root request; its name must be new (neither open nor recently ended)."""
        if name in self.open or name in self.ended:
            return Refused(SessionRefusal.EXISTS, f"session {name!r} already exists: a root opens a new one")
        if len(self.open) >= self.max_sessions and not self._evict_idle(now):
            return Refused(
                SessionRefusal.TABLE_FULL,
                f"all {self.max_sessions} sessions have requests in flight; retry when one ends",
            )
        session = Session(name, tenant, class_name, limits, now, now)
        self.open[name] = session
        return session

    def lookup(self, name: str, class_name: str) -> Session | Refused:
        """The open session a child names, or why it cannot be a child of it."""
        session = self.open.get(name)
        if session is not None:
            if session.class_name != class_name:
                return Refused(
                    SessionRefusal.OTHER_CLASS,
                    f"session {name!r} is of class {session.class_name!r}, not {class_name!r}: a child "
                    "inherits its root's class",
                )
            return session
        ended = self.ended.get(name)
        if ended is not None:
            return Refused(ended, f"session {name!r} has ended ({ended.value})")
        return Refused(SessionRefusal.NOT_FOUND, f"no session {name!r}: a root request opens one")

    def admit_child(
        self, session: Session, prompt_tokens: int, output_tokens: int, now: float, *, may_cap: bool
    ) -> ChildGrant | Refused:
        """Reserve a child's prompt and output budget in its session, or refuse it."""
        fitted = fit_child(session, prompt_tokens, output_tokens, now, may_cap=may_cap)
        if isinstance(fitted, Refused):
            return fitted
        granted, capped = fitted
        self._next_child += 1
        child = self._next_child
        session.held[child] = prompt_tokens + granted
        session.branches_used += 1
        session.last_active = now
        self.open.move_to_end(session.name)
        return ChildGrant(session.name, child, session.tenant, granted, capped)

    def settle(self, grant: ChildGrant, used_tokens: int, now: float) -> None:
        """A child ended: charge what it used (never more than it reserved), give back the rest.
        A session that ended meanwhile already gave everything back: nothing to do."""
        session = self.open.get(grant.session)
        if session is None:
            return
        reserved = session.held.pop(grant.child, None)
        if reserved is None:
            return
        session.spent_tokens += min(max(0, used_tokens), reserved)
        session.last_active = now

    def expire(self, now: float) -> list[EndedSession]:
        """End every session past its deadline, and every idle one past its time-to-live."""
        ended: list[EndedSession] = []
        for name, session in list(self.open.items()):
            if now >= session.deadline:
                ended.append(self.end(name, SessionRefusal.EXPIRED))
            elif not session.held and now - session.last_active >= self.idle_ttl_seconds:
                ended.append(self.end(name, SessionRefusal.ENDED))
        return ended

    def end(self, name: str, why: SessionRefusal) -> EndedSession:
        """End one session: everything it held is given back; its children in flight are named."""
        session = self.open.pop(name, None)
        children = tuple(session.held) if session is not None else ()
        if session is not None:
            session.held.clear()
        self.ended[name] = why
        self.ended.move_to_end(name)
        while len(self.ended) > self.max_ended:
            self.ended.popitem(last=False)
        return EndedSession(name, why, children)

    def _evict_idle(self, now: float) -> bool:
        for name, session in self.open.items():  # least recently active first
            if not session.held:
                self.end(name, SessionRefusal.ENDED)
                return True
        return False
