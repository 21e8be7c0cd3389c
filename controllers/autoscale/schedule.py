"""The scheduled floor: `spec.replicaSchedule`'s windows evaluated at an instant.

A window is open from `start` to `end`, local time in its `timeZone` (daylight saving followed by
`zoneinfo`), on its `days` (every day when none are named); a window that ends before it starts
closes the next day and belongs to the day it opened. The floor is the largest `minReplicas` of
the windows open at `now`; outside every window there is none, so a schedule holds nothing once
its window is past. Pure: `now` is passed in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from goodput.api.modelgroup import WEEKDAYS, ScheduledReplicas


@dataclass(frozen=True, slots=True)
class ScheduledFloor:
    """The window that sets the floor now, and the floor it asks for."""

    name: str
    min_groups: int
    window: str
    """The window as written: "Mon,Tue 08:00-18:00 Europe/Paris"."""


def _minutes(clock: str) -> int:
    hours, minutes = clock.split(":")
    return int(hours) * 60 + int(minutes)


def window_text(entry: ScheduledReplicas) -> str:
    days = ",".join(entry.days) if entry.days else "daily"
    return f"{days} {entry.start}-{entry.end} {entry.time_zone}"


def is_open(entry: ScheduledReplicas, now: float) -> bool:
    """Whether `entry`'s window is open at `now` (seconds since the epoch)."""
    local = datetime.fromtimestamp(now, UTC).astimezone(ZoneInfo(entry.time_zone))
    minute = local.hour * 60 + local.minute
    start, end = _minutes(entry.start), _minutes(entry.end)
    if start < end:
        opened_on = local if start <= minute < end else None
    elif minute >= start:
        opened_on = local
    elif minute < end:
        opened_on = local - timedelta(days=1)
    else:
        opened_on = None
    if opened_on is None:
        return False
    return not entry.days or WEEKDAYS[opened_on.weekday()] in entry.days


def scheduled_floor(entries: Sequence[ScheduledReplicas], now: float) -> ScheduledFloor | None:
    """The largest floor among the windows open at `now` (the first named on a tie), or None."""
    best: ScheduledFloor | None = None
    for entry in entries:
        if is_open(entry, now) and (best is None or entry.min_replicas > best.min_groups):
            best = ScheduledFloor(entry.name, entry.min_replicas, window_text(entry))
    return best
