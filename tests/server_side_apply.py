"""Server-side apply of a status, as the API server does it for the fields the operator writes.

Each field manager owns the top-level status fields and the condition types (the list-map key) it
applied last; applying sets them, and a field or condition the manager applied before and leaves
out now is removed unless another manager still owns it. With force, a field another manager set
to a different value changes hands; an equal value is owned by both. Enough of the real merge for
the operator's writes: it never applies below the top level of status, except conditions by type.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class AppliedStatus:
    """One object's status and who owns which part of it."""

    status: dict[str, Any] = field(default_factory=dict)
    fields: dict[str, set[str]] = field(default_factory=dict)
    """Top-level status fields by field manager."""
    conditions: dict[str, set[str]] = field(default_factory=dict)
    """Condition types by field manager."""
    applies: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    """Every apply body, with its field manager, in order."""

    def apply(self, body: Mapping[str, Any], field_manager: str) -> None:
        applied = dict(copy.deepcopy(body["status"]))
        self.applies.append((field_manager, copy.deepcopy(dict(body))))
        applied_conditions = {c["type"]: c for c in applied.pop("conditions", [])}
        current = {c["type"]: c for c in self.status.get("conditions", [])}
        self._merge(self.status, self.fields, field_manager, applied)
        self._merge(current, self.conditions, field_manager, applied_conditions)
        if current:
            self.status["conditions"] = list(current.values())
        else:
            self.status.pop("conditions", None)

    @staticmethod
    def _merge(
        target: dict[str, Any], owners: dict[str, set[str]], manager: str, applied: Mapping[str, Any]
    ) -> None:
        keys = set(applied)
        for other, owned in owners.items():
            if other != manager:
                owned -= {key for key in keys if target.get(key) != applied[key]}
        for key in owners.get(manager, set()) - keys:
            if not any(key in owned for other, owned in owners.items() if other != manager):
                target.pop(key, None)
        for key in keys:
            target[key] = applied[key]
        owners[manager] = keys

    def owner_of_condition(self, condition_type: str) -> set[str]:
        return {manager for manager, owned in self.conditions.items() if condition_type in owned}

    def last(self, field_manager: str) -> dict[str, Any]:
        """The status part of the manager's latest apply."""
        return next(body["status"] for manager, body in reversed(self.applies) if manager == field_manager)

    def of(self, field_manager: str) -> list[dict[str, Any]]:
        return [body["status"] for manager, body in self.applies if manager == field_manager]
