"""The contract between the simulated fleet and a scaling policy.

Every `interval_seconds` the simulation hands the policy a `FleetObservation` (group counts now, and
the scraped metrics as of `now − scrape delay`) and applies the `PolicyAnswer` it returns. Policies
keep their own memory between calls (stabilisation windows, panic mode) — the baselines as frozen
state values threaded through pure functions, so the formulas can be tested alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from goodput.simulator.metrics import MetricsView


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """What the control plane knows about one live or draining group."""

    name: str
    state: str
    created_at: float
    ready_at: float | None


@dataclass(frozen=True, slots=True)
class FleetObservation:
    """One control tick's input."""

    now: float
    desired_groups: int
    placing_groups: int
    provisioning_groups: int
    ready_groups: int
    draining_groups: int
    min_groups: int
    max_groups: int
    metrics: MetricsView
    groups: tuple[GroupInfo, ...] = ()

    @property
    def starting_groups(self) -> int:
        """Groups that will become capacity without a new decision (placing or provisioning)."""
        return self.placing_groups + self.provisioning_groups


@dataclass(frozen=True, slots=True)
class PolicyAnswer:
    """A policy's answer: the groups it wants and why, with the figures behind it."""

    desired_groups: int
    reason: str
    detail: dict[str, float | str] = field(default_factory=dict)


class FleetPolicy(Protocol):
    """A scaling policy as the simulated fleet drives it: goodput's own, or a baseline (HPA, KEDA)."""

    @property
    def name(self) -> str:
        """Short name for reports ("hpa", "goodput", ...)."""
        ...

    @property
    def interval_seconds(self) -> float:
        """Time between two calls of `recommend`."""
        ...

    def recommend(self, observation: FleetObservation) -> PolicyAnswer:
        """The desired number of groups now."""
        ...

    def describe(self) -> dict[str, float | str]:
        """The policy's parameters, for the report."""
        ...
