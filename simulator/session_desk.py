"""Session budgets in the simulated request path, by the live gateway's rule.

`gateway.sessions.SessionDesk` enters every request of a class with a `sessionBudget` into its
session before the class's own gates: a root opens the session (its name new), a child looks it up
(ended at its deadline if that has passed), and either is admitted against what the session has left
(`SessionTable.admit_child`: capped when the class's ladder accepts a capped answer, refused
otherwise); whatever the gates then decide, the request settles what it used when it leaves. Here the
same calls are made in the same order on the simulator's clock; the request's session and whether it
is a root come from the workload's session columns (`simulator.agentic`).

Not simulated: the cancellation of a session's children in flight at its deadline (the simulated
engines cannot abort one request); a child that arrives after the deadline is refused, as live.
"""

from __future__ import annotations

from goodput.controllers.requests.admission import ClassContract
from goodput.controllers.requests.sessions import (
    SWEEP_INTERVAL_SECONDS,
    ChildGrant,
    Refused,
    Session,
    SessionRefusal,
    SessionTable,
)
from goodput.simulator.workload import Workload


class SimSessionDesk:
    """The sessions of one simulated gateway: the table, and each admitted request's grant."""

    def __init__(self, workload: Workload, table: SessionTable | None = None) -> None:
        if workload.session_index is None or workload.parent_index is None:
            raise ValueError("the session desk needs a workload of sessions (session and parent columns)")
        self.table = table or SessionTable()
        self._session = workload.session_index.tolist()
        self._root = (workload.parent_index < 0).tolist()
        self.grants: dict[int, ChildGrant] = {}
        self._swept_at = -SWEEP_INTERVAL_SECONDS

    def enter(  # noqa: PLR0917 (one request's shape)
        self, index: int, contract: ClassContract | None, tenant: str, prompt: int, asked: int, now: float
    ) -> ChildGrant | Refused | None:
        """Request `index` entered into its session: its grant, why it is refused, or None when its
        class keeps no sessions (then it is admitted on its own, as before)."""
        if contract is None or contract.session_limits is None:
            return None
        session = self._session_for(index, contract, tenant, now)
        if isinstance(session, Refused):
            return session
        may_cap = contract.ladder is not None and contract.ladder.caps_output
        grant = self.table.admit_child(session, prompt, asked, now, may_cap=may_cap)
        if isinstance(grant, ChildGrant):
            self.grants[index] = grant
        return grant

    def _session_for(self, index: int, contract: ClassContract, tenant: str, now: float) -> Session | Refused:
        name = f"session-{self._session[index]}"
        if not self._root[index]:
            found = self.table.lookup(name, contract.name)
            if isinstance(found, Session) and now >= found.deadline:
                self.table.end(found.name, SessionRefusal.EXPIRED)
                return self.table.lookup(name, contract.name)
            return found
        if now - self._swept_at >= SWEEP_INTERVAL_SECONDS:
            self._swept_at = now
            self.table.expire(now)
        assert contract.session_limits is not None
        return self.table.open_session(name, tenant, contract.name, contract.session_limits, now)

    def settle(self, index: int, used_tokens: int, now: float) -> None:
        """Request `index` left (answered, refused by the gates, expired in the queue or lost): its
        session is charged what it used, the rest of its reservation given back."""
        grant = self.grants.pop(index, None)
        if grant is not None:
            self.table.settle(grant, used_tokens, now)
