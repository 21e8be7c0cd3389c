"""Per-request outcomes of a simulation run, written on the hot path and read once by the report."""

from __future__ import annotations

import math
from enum import IntEnum

import numpy as np

from goodput.simulator.workload import Workload


class RequestExit(IntEnum):
    """How a request left the system. Only FINISHED requests can attain their SLO."""

    PENDING = 0
    FINISHED = 1
    FAILED = 2
    """Its group failed while it was in flight: the work is lost."""
    REJECTED_NO_CAPACITY = 3
    """No ready group could take it when it arrived (none ready, or the router's queue timed out)."""
    REJECTED_TOO_LONG = 4
    """The prompt (or prompt plus output) does not fit a group's KV cache at all."""
    UNFINISHED = 5
    """Still in flight when the simulation stopped."""
    REJECTED_ADMISSION = 6
    """The gateway refused it at the door (429, 503), or its hold in the gateway's queue ran out."""
    NOT_SENT = 7
    """A session's child whose parent was never answered: the agent had nothing to continue from."""


NOT_YET = math.nan


class RequestLog:
    """Timestamps and outcome of every request, by workload index.

    Plain lists, not numpy arrays: the engine writes one element at a time, which lists do fastest.
    `routed_at` is when the router handed the request to a group (equal to arrival unless it waited
    at the router for a ready group); `scheduled_at` is the engine's first scheduling of it.
    """

    __slots__ = (
        "arrival",
        "cached_tokens",
        "finished_at",
        "first_token_at",
        "group",
        "outcome",
        "preemptions",
        "routed_at",
        "scheduled_at",
        "slow_gaps",
    )

    def __init__(self, workload: Workload) -> None:
        count = len(workload)
        self.arrival: list[float] = workload.arrival_seconds.tolist()
        self.group: list[int] = [-1] * count
        self.routed_at: list[float] = [NOT_YET] * count
        self.scheduled_at: list[float] = [NOT_YET] * count
        self.first_token_at: list[float] = [NOT_YET] * count
        self.finished_at: list[float] = [NOT_YET] * count
        self.outcome: list[int] = [RequestExit.PENDING] * count
        self.preemptions: list[int] = [0] * count
        self.cached_tokens: list[int] = [0] * count
        self.slow_gaps: list[int] = [0] * count
        """Token gaps longer than the request's ITL target (a preemption counts as one)."""

    def arrays(self) -> dict[str, np.ndarray]:
        """The columns as numpy arrays for vectorised reporting."""
        return {
            "arrival": np.asarray(self.arrival, dtype=np.float64),
            "group": np.asarray(self.group, dtype=np.int64),
            "routed_at": np.asarray(self.routed_at, dtype=np.float64),
            "scheduled_at": np.asarray(self.scheduled_at, dtype=np.float64),
            "first_token_at": np.asarray(self.first_token_at, dtype=np.float64),
            "finished_at": np.asarray(self.finished_at, dtype=np.float64),
            "outcome": np.asarray(self.outcome, dtype=np.int64),
            "preemptions": np.asarray(self.preemptions, dtype=np.int64),
            "cached_tokens": np.asarray(self.cached_tokens, dtype=np.int64),
            "slow_gaps": np.asarray(self.slow_gaps, dtype=np.int64),
        }
