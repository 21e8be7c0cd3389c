"""The Events a controller asks the operator to post: a neutral record, so that the SLOPolicy
controller, the autoscaler and the group controller can each say what happened without importing
one another."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class EventRecord:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str
    group: str | None = None
    """The group whose API writes this Event reports (its creation, deletion, gates or drain
    marks): the operator posts it only once they all succeeded. None: an observation, posted as is."""
