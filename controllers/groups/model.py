"""The group controller's value types: its world (one ModelGroup at one instant), a group's
assessment, the actions a tick decides, and the plan that carries them.

Lifecycle per group, from its pods alone (`assess`):
- Placing: pods created with the gang gate, or released but not all bound to nodes.
- Provisioning: all bound; containers starting and loading weights (not all Running and ready).
- Warming: every rank running; waiting for NCCL health, the reported revision and a warm-up
  completion through the leader.
- Ready: the group-ready gate is True on every rank.
- Draining: chosen for scale-in; gate False, waiting for in-flight requests to finish
  (the protocol and the victim choice are in `drain`).
- Failed: a rank failed, restarted, lost NCCL health or its node; or placement or start-up timed out.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from goodput.api.modelgroup import DrainRecord, GroupState
from goodput.api.times import parse_rfc3339, rfc3339_seconds
from goodput.controllers import naming
from goodput.controllers.events import EventRecord
from goodput.controllers.groups.drain import (
    DecidedDrain,
    DrainPolicy,
    DrainProgress,
    LeaderReading,
    LeaderSample,
    OnTimeout,
)
from goodput.controllers.groups.lifecycle import GroupEvent, GroupTransition
from goodput.controllers.groups.observation import PodView
from goodput.controllers.groups.placement import (
    Inventory,
    NoFit,
    PlacementRules,
)
from goodput.controllers.groups.pods import GroupTemplate
from goodput.controllers.groups.ready_phases import (
    PhaseStall,
    ReadyBreakdown,
    ReadyPhase,
    breakdown,
    milestones_of,
)


@dataclass(frozen=True, slots=True)
class ReadinessRules:
    """What a group must pass and how long each phase may take (from the ModelGroup spec)."""

    model_revision: str
    nccl_required: bool = True
    revision_check: bool = True
    schedule_timeout_seconds: float = 300
    # A group waiting for new nodes (`placement.nodeProvisioning`) may wait this long instead.
    provisioning_timeout_seconds: float = 600
    startup_timeout_seconds: float = 1800
    warmup_retry_seconds: float = 5
    warmup_prompt: str = "Hello, my name is"
    warmup_max_tokens: int = 8
    warmup_timeout_seconds: float = 60
    drain_max_seconds: float = 600
    drain_on_timeout: OnTimeout = "Abort"
    drain_settle_seconds: float = 5
    min_lifetime_seconds: float = 300
    backoff_seconds: float = 300
    # A group whose ranks all run but that is not ready this long after says what it waits for.
    readiness_report_seconds: float = 60

    def drain_policy(self) -> DrainPolicy:
        return DrainPolicy(
            max_seconds=self.drain_max_seconds,
            on_timeout=self.drain_on_timeout,
            settle_seconds=self.drain_settle_seconds,
        )


@dataclass(frozen=True, slots=True)
class RolloutRules:
    """How a changed pod template replaces groups (from `spec.rollout`), and how many failed groups
    of the new template stop it."""

    max_surge: int = 1
    max_unavailable: int = 0
    failure_limit: int = 2


@dataclass(frozen=True, slots=True)
class RolloutProgress:
    """The rollout to `revision` as recorded on the ModelGroup: groups of that revision that failed
    while older groups still served."""

    revision: str
    failed: int = 0


@dataclass(frozen=True, slots=True)
class RolloutStatus:
    """Where the groups stand against the current pod template, for status and conditions."""

    revision: str
    updated: int
    outdated: int
    failed: int
    stalled: bool


@dataclass(frozen=True, slots=True)
class WarmupOutcome:
    """The result of one warm-up completion sent through a group's leader."""

    succeeded: bool
    finished_at: datetime
    message: str = ""


@dataclass(frozen=True, slots=True)
class DomainBackoff:
    """A topology domain this ModelGroup avoids until `until`, because a group failed to schedule there."""

    domain: str
    until: datetime
    reason: str


@dataclass(frozen=True, slots=True)
class World:
    """Everything one tick of the controller knows about one ModelGroup, at one instant.

    pods: this ModelGroup's pods, with the operator's own not-yet-observed writes overlaid.
    inventory: every node and every GPU claim in the cluster (ours included).
    ready_nodes: names of the nodes whose Ready condition is True.
    group_counter: the next group ordinal recorded on the ModelGroup (survives restarts).
    warmups: the latest warm-up outcome per group; warmups_in_flight: groups being warmed now.
    leader_readings: the latest read of each probed leader's /metrics (or why it failed);
    leader_samples: the latest successful one.
    routed_pods: our pods that some Service lists as ready endpoints (from its EndpointSlices).
    max_replicas: `spec.maxReplicas`; deleting: the ModelGroup is being deleted. Either lets
    scale-in take groups younger than the minimum lifetime (DESIGN §7).
    """

    now: datetime
    template: GroupTemplate
    rules: ReadinessRules
    placement: PlacementRules
    desired_groups: int
    pods: tuple[PodView, ...]
    inventory: Inventory
    ready_nodes: frozenset[str]
    group_counter: int = 0
    backoffs: tuple[DomainBackoff, ...] = ()
    warmups: Mapping[str, WarmupOutcome] = field(default_factory=dict)
    warmups_in_flight: frozenset[str] = frozenset()
    leader_readings: Mapping[str, LeaderReading] = field(default_factory=dict)
    leader_samples: Mapping[str, LeaderSample] = field(default_factory=dict)
    routed_pods: frozenset[str] = frozenset()
    max_replicas: int | None = None
    deleting: bool = False
    # Groups whose wait for readiness was already reported with an Event (the operator's memory).
    readiness_reported: frozenset[str] = frozenset()
    rollout: RolloutRules = RolloutRules()
    # The rollout recorded on the ModelGroup (annotation), or None before any.
    rollout_progress: RolloutProgress | None = None
    # Groups whose ended drain is in the ModelGroup's `status.drain.recent`: those may be deleted.
    recorded_drains: frozenset[str] = frozenset()
    # When this operator first acted on this ModelGroup (its first pass); None: not told. A drain
    # that began before then was resumed, and its time limit counts from here (`drain_deadline`).
    acting_since: datetime | None = None
    # The latest groups' ready time by phase (`status.readyTime.recent`): the phases' stall bounds.
    recent_ready_phases: tuple[Mapping[ReadyPhase, float], ...] = ()
    # Stalled phases already reported with an Event, as "group/phase" (the operator's memory).
    stalls_reported: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class ReadyTimes:
    placing_seconds: float
    provisioning_seconds: float
    warming_seconds: float
    total_seconds: float


@dataclass(frozen=True, slots=True)
class Assessment:
    """One group's state, derived from its pods, and why."""

    name: str
    state: GroupState
    pods: tuple[PodView, ...]
    domain: str | None
    created_at: datetime
    reason: str = ""
    message: str = ""
    replaces: str | None = None
    outdated: bool = False
    scheduled_at: datetime | None = None
    running_at: datetime | None = None
    ready_at: datetime | None = None
    draining_since: datetime | None = None
    drain_progress: DrainProgress | None = None
    # Draining: how the drain ended, once decided and written on some rank (the group is leaving).
    drain_outcome: DecidedDrain | None = None
    # Placing: the gang gate is still on some pod.
    gated: bool = False
    # Warming: NCCL and revision checks passed; only the warm-up is left.
    checks_passed: bool = False
    # Failed: what the pods showed (a rank failed, or placement or start-up timed out).
    failure: GroupEvent | None = None

    @property
    def schedule_timed_out(self) -> bool:
        """Failed because no pod was bound in time: the domain is backed off."""
        return self.failure is GroupEvent.SCHEDULE_TIMED_OUT

    @property
    def waits_for_new_nodes(self) -> bool:
        """Created for nodes a node autoscaler is to add (`placement.nodeProvisioning`)."""
        return self.domain == naming.NEW_NODES_DOMAIN

    @property
    def pod_names(self) -> tuple[str, ...]:
        return tuple(pod.name for pod in self.pods)

    @property
    def unstarted_drain_pods(self) -> tuple[str, ...]:
        """Ranks of a draining group whose drain start is not complete: no draining-since mark, or a
        readiness gate not yet False (an operator stopped part-way through starting the drain)."""
        return tuple(
            pod.name
            for pod in self.pods
            if pod.draining_since is None or pod.group_ready is None or pod.group_ready.status != "False"
        )

    @property
    def ordinal(self) -> int:
        return naming.group_ordinal(self.name) or 0

    def ready_times(self) -> ReadyTimes | None:
        if self.ready_at is None:
            return None
        scheduled = self.scheduled_at or self.created_at
        running = self.running_at or scheduled
        return ReadyTimes(
            placing_seconds=seconds_between(self.created_at, scheduled),
            provisioning_seconds=seconds_between(scheduled, running),
            warming_seconds=seconds_between(running, self.ready_at),
            total_seconds=seconds_between(self.created_at, self.ready_at),
        )

    def ready_breakdown(self, now: datetime, *, ranks_checked: bool) -> ReadyBreakdown:
        """The group's ready time by phase, from its ranks' recorded milestones (`ready_phases`)."""
        milestones = milestones_of(self.pods, self.created_at, self.ready_at, ranks_checked=ranks_checked)
        return breakdown(milestones, now)


# Actions, in the order the operator applies them (`APPLY_ORDER`).


@dataclass(frozen=True, slots=True)
class DrainStart:
    """Start (or finish starting) a group's drain, intent first: the draining-since mark is
    written on every rank, then the DrainStarted Event is posted, and only then does the
    group-ready gate go False on any rank. An operator killed at any point leaves either an
    untouched serving group or a marked one, which the next pass judges Draining and completes
    (`Assessment.unstarted_drain_pods`); never a group out of service with no drain on record."""

    group: str
    pods: tuple[str, ...]
    since: datetime
    reason: str
    message: str
    event: EventRecord | None


@dataclass(frozen=True, slots=True)
class GateChange:
    """Set the group-ready readiness gate condition on every rank of a group at once."""

    group: str
    pods: tuple[str, ...]
    ready: bool
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class DrainMark:
    """Clear the draining-since mark (and the drain's progress) on every rank: the group goes
    back in service. A drain's start is a `DrainStart`."""

    group: str
    pods: tuple[str, ...]
    since: datetime | None


@dataclass(frozen=True, slots=True)
class DrainProgressMark:
    """Record on the leader what a drain has established, so a restarted operator resumes it."""

    group: str
    leader: str
    progress: DrainProgress


@dataclass(frozen=True, slots=True)
class DrainOutcomeMark:
    """Write how a drain ended on every rank, before its status record and before any deletion."""

    group: str
    pods: tuple[str, ...]
    decided: DecidedDrain


@dataclass(frozen=True, slots=True)
class DrainEnded:
    """A drain that ended, for the status record, metrics and its Event. Emitted (again) by every
    pass until `status.drain.recent` holds the group; the ranks are deleted only after that."""

    record: DrainRecord
    """The status entry, as decided once and stored on the ranks."""
    # DrainFinished or DrainTimedOut, posted once per drain by the operator that records it.
    event: EventRecord | None = None


@dataclass(frozen=True, slots=True)
class GroupDeletion:
    group: str
    pods: tuple[str, ...]
    service: str | None


@dataclass(frozen=True, slots=True)
class GroupCreation:
    """Create the Service and every pod (gated), then release all the gates together; first the
    ResourceClaimTemplate the pods' claims come from, when they have one and it is missing."""

    group: str
    domain: str
    service: dict[str, Any] | None
    pods: tuple[dict[str, Any], ...]
    claim_template: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class GateRelease:
    """Remove the gang scheduling gate from every pod of a fully created group."""

    group: str
    pods: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class WarmupRequest:
    group: str
    leader_ip: str
    port: int
    model: str
    prompt: str
    max_tokens: int
    timeout_seconds: float

    @property
    def url(self) -> str:
        return f"http://{self.leader_ip}:{self.port}/v1/completions"

    def body(self) -> dict[str, Any]:
        return {"model": self.model, "prompt": self.prompt, "max_tokens": self.max_tokens, "temperature": 0}


@dataclass(frozen=True, slots=True)
class LeaderProbe:
    """Read a leader's vLLM /metrics: in-flight requests of a draining group, or the load of a
    ready group that may be chosen for scale-in."""

    group: str
    url: str


# The order the operator applies a plan's actions in. Intent comes before the act it announces:
# a drain's mark before its gate (`DrainStart`), a drain's outcome on the ranks and in the status
# before the ranks are deleted (`DrainOutcomeMark`, `DrainEnded`; the deletion waits for a pass
# that sees the record in `status.drain.recent`). Each step is resumable from the API server alone.
APPLY_ORDER: tuple[str, ...] = (
    "annotations",
    "drain_starts",
    "unready",
    "drain_outcomes",
    "deletions",
    "drains_ended",
    "creations",
    "gate_releases",
    "drain_marks",
    "drain_progress",
    "ready",
    "warmups",
    "leader_probes",
)


@dataclass(frozen=True, slots=True)
class Plan:
    """What one tick decided. `groups` is the state of every group once the plan is applied.
    The operator applies the actions in `APPLY_ORDER`; `drains_ended` reaches the status write."""

    annotations: Mapping[str, str]
    drain_starts: tuple[DrainStart, ...] = ()
    unready: tuple[GateChange, ...] = ()
    drain_outcomes: tuple[DrainOutcomeMark, ...] = ()
    deletions: tuple[GroupDeletion, ...] = ()
    creations: tuple[GroupCreation, ...] = ()
    gate_releases: tuple[GateRelease, ...] = ()
    drain_marks: tuple[DrainMark, ...] = ()
    drain_progress: tuple[DrainProgressMark, ...] = ()
    ready: tuple[GateChange, ...] = ()
    warmups: tuple[WarmupRequest, ...] = ()
    leader_probes: tuple[LeaderProbe, ...] = ()
    events: tuple[EventRecord, ...] = ()
    drains_ended: tuple[DrainEnded, ...] = ()
    drains_cancelled: tuple[str, ...] = ()
    groups: tuple[Assessment, ...] = ()
    placement_limit: NoFit | None = None
    became_ready: tuple[Assessment, ...] = ()
    # Domains avoided after a group failed to schedule there, still in force after this plan.
    backoffs: tuple[DomainBackoff, ...] = ()
    # Every group's move this tick, in the order decided (see `lifecycle`).
    transitions: tuple[GroupTransition, ...] = ()
    # Groups whose wait for readiness this plan reports with an Event, for the operator to remember.
    readiness_reported: tuple[str, ...] = ()
    rollout: RolloutStatus | None = None
    # Each group's ready time by phase (its phase in progress while starting), by group name.
    ready_breakdowns: Mapping[str, ReadyBreakdown] = field(default_factory=dict)
    # Starting groups whose current phase has lasted past its bound, by group name.
    stalls: Mapping[str, PhaseStall] = field(default_factory=dict)
    # Stalls this plan reports with an Event ("group/phase"), for the operator to remember.
    stalls_reported: tuple[str, ...] = ()


def parse_backoffs(text: str | None) -> tuple[DomainBackoff, ...]:
    """The back-off list stored on the ModelGroup; an unreadable annotation counts as none."""
    if not text:
        return ()
    try:
        raw = json.loads(text)
    except json.JSONDecodeError:
        return ()
    backoffs = []
    for item in raw if isinstance(raw, list) else ():
        until = parse_rfc3339(item.get("until")) if isinstance(item, dict) else None
        if until is not None and isinstance(item.get("domain"), str):
            backoffs.append(DomainBackoff(item["domain"], until, str(item.get("reason", ""))))
    return tuple(backoffs)


def encode_backoffs(backoffs: Iterable[DomainBackoff]) -> str:
    return json.dumps(
        [
            {"domain": b.domain, "until": rfc3339_seconds(b.until), "reason": b.reason}
            for b in sorted(backoffs, key=lambda b: b.domain)
        ],
        separators=(",", ":"),
    )


def group_key(name: str) -> tuple[int, str]:
    ordinal = naming.group_ordinal(name)
    return (ordinal if ordinal is not None else -1, name)


def latest(times: Iterable[datetime | None]) -> datetime | None:
    known = [t for t in times if t is not None]
    return max(known) if known else None


def seconds_between(start: datetime, end: datetime) -> float:
    return max(0.0, (end - start).total_seconds())


def ranks_text(ranks: Iterable[int]) -> str:
    return ", ".join(str(rank) for rank in ranks)


def parse_rollout(text: str | None) -> RolloutProgress | None:
    """The rollout record stored on the ModelGroup; an unreadable annotation counts as none."""
    try:
        raw = json.loads(text) if text else None
    except json.JSONDecodeError:
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("revision"), str):
        return None
    failed = raw.get("failed")
    return RolloutProgress(raw["revision"], failed if isinstance(failed, int) and failed >= 0 else 0)


def encode_rollout(progress: RolloutProgress) -> str:
    return json.dumps({"revision": progress.revision, "failed": progress.failed}, separators=(",", ":"))
