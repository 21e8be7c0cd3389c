"""The ModelGroup controller's decisions: group lifecycle, replacement and scale, as one pure plan.

A group moves Placing → Provisioning → Warming → Ready (→ Draining), and any rank's failure makes
the whole group Failed: it leaves the ready count at once and is deleted whole, and the shortfall is
made up by a new, complete group (design note §30, §34). Every tick the operator builds a `World`
(the ModelGroup's pods, the cluster's GPU inventory, warm-up results, `now`), calls
`plan_model_group`, and applies the returned `Plan`. The plan is deterministic: the same world gives
the same plan, so a restarted operator picks up exactly where the last one stopped.

Lifecycle per group, from its pods alone:
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
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Literal, cast

from goodput.api.modelgroup import DrainOutcome
from goodput.api.reasons import EventReason, Reason
from goodput.controllers import naming
from goodput.controllers.drain import (
    Candidate,
    CandidateState,
    DrainPolicy,
    DrainProgress,
    DrainView,
    LeaderReading,
    LeaderSample,
    OnTimeout,
    RemoveGroup,
    choose_victims,
    stale_loads,
    step_drain,
)
from goodput.controllers.observation import PodView, parse_pod, parse_time
from goodput.controllers.placement import (
    GroupShape,
    Inventory,
    NoFit,
    NoFitReason,
    Placed,
    PlacementRules,
    place_group,
)
from goodput.controllers.pods import SHUTDOWN_MARGIN_SECONDS, GroupTemplate, render_group

GroupState = Literal["Placing", "Provisioning", "Warming", "Ready", "Draining", "Failed"]
# Groups that count toward `replicas`: serving, or on their way to serving.
_ACTIVE_STATES = frozenset({"Placing", "Provisioning", "Warming", "Ready"})


@dataclass(frozen=True, slots=True)
class ReadinessRules:
    """What a group must pass and how long each phase may take (from the ModelGroup spec)."""

    model_revision: str
    nccl_required: bool = True
    revision_check: bool = True
    schedule_timeout_seconds: float = 300
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

    def drain_policy(self) -> DrainPolicy:
        return DrainPolicy(
            max_seconds=self.drain_max_seconds,
            on_timeout=self.drain_on_timeout,
            settle_seconds=self.drain_settle_seconds,
        )


@dataclass(frozen=True, slots=True)
class WarmupOutcome:
    """The result of one warm-up completion sent through a group's leader."""

    succeeded: bool
    finished_at: datetime
    message: str = ""


@dataclass(frozen=True, slots=True)
class Backoff:
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
    backoffs: tuple[Backoff, ...] = ()
    warmups: Mapping[str, WarmupOutcome] = field(default_factory=dict)
    warmups_in_flight: frozenset[str] = frozenset()
    leader_readings: Mapping[str, LeaderReading] = field(default_factory=dict)
    leader_samples: Mapping[str, LeaderSample] = field(default_factory=dict)
    routed_pods: frozenset[str] = frozenset()
    max_replicas: int | None = None
    deleting: bool = False


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
    # Placing: the gang gate is still on some pod.
    gated: bool = False
    # Warming: NCCL and revision checks passed; only the warm-up is left.
    checks_passed: bool = False
    # Failed because no pod was bound in time: back the domain off.
    schedule_timed_out: bool = False

    @property
    def pod_names(self) -> tuple[str, ...]:
        return tuple(pod.name for pod in self.pods)

    @property
    def ordinal(self) -> int:
        return naming.group_ordinal(self.name) or 0

    def ready_times(self) -> ReadyTimes | None:
        if self.ready_at is None:
            return None
        scheduled = self.scheduled_at or self.created_at
        running = self.running_at or scheduled
        return ReadyTimes(
            placing_seconds=_seconds(self.created_at, scheduled),
            provisioning_seconds=_seconds(scheduled, running),
            warming_seconds=_seconds(running, self.ready_at),
            total_seconds=_seconds(self.created_at, self.ready_at),
        )


# Actions, in the order the operator applies them.


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
    """Record on every rank when the group started draining; since=None ends the drain (and
    clears its progress) because the group goes back in service."""

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
class DrainEnded:
    """A drain that ended with the group's removal, for status, metrics and Events."""

    group: str
    outcome: DrainOutcome
    started_at: datetime
    ended_at: datetime
    duration_seconds: float
    requests_finished: int | None
    requests_aborted: int | None
    on_timeout: OnTimeout | None = None


@dataclass(frozen=True, slots=True)
class GroupDeletion:
    group: str
    pods: tuple[str, ...]
    service: str | None


@dataclass(frozen=True, slots=True)
class GroupCreation:
    """Create the Service and every pod (gated), then release all the gates together."""

    group: str
    domain: str
    service: dict[str, Any] | None
    pods: tuple[dict[str, Any], ...]


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


@dataclass(frozen=True, slots=True)
class EventRecord:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Plan:
    """What one tick decided. `groups` is the state of every group once the plan is applied."""

    annotations: Mapping[str, str]
    unready: tuple[GateChange, ...] = ()
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
    backoffs: tuple[Backoff, ...] = ()


def assess_group(name: str, pods: Iterable[PodView], world: World) -> Assessment | None:
    """The state of one group; None when every pod is already terminating (the group is gone)."""
    everything = sorted(pods, key=lambda pod: pod.rank)
    live = tuple(pod for pod in everything if not pod.deleting)
    if not live:
        return None
    rules = world.rules
    now = world.now
    expected = world.template.pods_per_group
    created_at = min((pod.created_at for pod in live if pod.created_at), default=now)
    base = Assessment(
        name=name,
        state="Placing",
        pods=live,
        domain=next((pod.topology_domain for pod in live if pod.topology_domain), None),
        created_at=created_at,
        replaces=next((pod.replaces for pod in live if pod.replaces), None),
        outdated=any(pod.revision != world.template.revision for pod in live),
        draining_since=min((pod.draining_since for pod in live if pod.draining_since), default=None),
        drain_progress=next((pod.drain_progress for pod in live if pod.rank == 0), None),
    )

    def failed(reason: str, message: str, *, schedule_timed_out: bool = False) -> Assessment:
        return replace(
            base, state="Failed", reason=reason, message=message, schedule_timed_out=schedule_timed_out
        )

    missing = sorted(set(range(expected)) - {pod.rank for pod in live})
    if len(live) < len(everything) or missing:
        gone = sorted({pod.rank for pod in everything if pod.deleting} | set(missing))
        return failed(Reason.GROUP_FAILED, f"group {name} is incomplete: rank {_ranks(gone)} missing")
    for pod in live:
        if pod.terminated:
            return failed(Reason.GROUP_FAILED, f"rank {pod.rank} ({pod.name}) ended with phase {pod.phase}")
        if pod.restarts > 0:
            return failed(
                Reason.GROUP_FAILED, f"rank {pod.rank} ({pod.name}) restarted {pod.restarts} time(s)"
            )
        if pod.node_name and pod.node_name not in world.ready_nodes:
            return failed(
                Reason.GROUP_FAILED,
                f"rank {pod.rank} ({pod.name}) is on node {pod.node_name}, which is not ready",
            )
        if rules.nccl_required and pod.nccl_healthy is not None and pod.nccl_healthy.status == "False":
            detail = f": {pod.nccl_healthy.message}" if pod.nccl_healthy.message else ""
            return failed(Reason.NCCL_UNHEALTHY, f"rank {pod.rank} ({pod.name}) lost NCCL health{detail}")

    gated = any(pod.gated for pod in live)
    if gated or not all(pod.node_name for pod in live):
        if _seconds(created_at, now) > rules.schedule_timeout_seconds:
            return failed(
                Reason.SCHEDULE_TIMEOUT,
                f"not every pod was bound within {rules.schedule_timeout_seconds:g}s"
                f"{_unschedulable_detail(live)}",
                schedule_timed_out=True,
            )
        message = (
            "waiting for the gang to be released"
            if gated
            else f"waiting for the scheduler{_unschedulable_detail(live)}"
        )
        return replace(base, state="Placing", reason=Reason.GROUPS_PLACING, message=message, gated=gated)

    scheduled_at = _latest(pod.scheduled.last_transition if pod.scheduled else None for pod in live)
    base = replace(base, scheduled_at=scheduled_at)
    started = scheduled_at or created_at
    startup_overdue = _seconds(started, now) > rules.startup_timeout_seconds

    if not all(pod.running_and_ready for pod in live):
        if startup_overdue:
            return failed(
                Reason.GROUP_FAILED,
                f"ranks not running and ready within {rules.startup_timeout_seconds:g}s of scheduling",
            )
        waiting = [pod.rank for pod in live if not pod.running_and_ready]
        return replace(
            base,
            state="Provisioning",
            reason=Reason.GROUPS_PROVISIONING,
            message=f"rank {_ranks(waiting)} starting",
        )

    running_at = _latest(
        pod.containers_ready.last_transition if pod.containers_ready else None for pod in live
    )
    base = replace(base, running_at=running_at)
    if base.draining_since is not None:
        return replace(
            base,
            state="Draining",
            reason=Reason.GROUPS_DRAINING,
            message=f"draining since {base.draining_since.isoformat()}",
        )
    if all(pod.marked_group_ready for pod in live):
        ready_at = min(pod.group_ready.last_transition or now for pod in live if pod.group_ready)
        return replace(base, state="Ready", reason=Reason.GROUPS_READY, ready_at=ready_at, checks_passed=True)

    checks_blocker = _readiness_blocker(live, world)
    blocker = checks_blocker
    outcome = world.warmups.get(name)
    if blocker is None and outcome is not None and not outcome.succeeded:
        blocker = (Reason.WARMUP_FAILED, f"warm-up through the leader failed: {outcome.message}")
    if startup_overdue:
        reason, message = blocker or (Reason.WARMUP_FAILED, "warm-up did not complete")
        return failed(reason, f"not ready within {rules.startup_timeout_seconds:g}s of scheduling: {message}")
    reason, message = blocker or (Reason.GROUPS_WARMING, "warming up through the leader")
    return replace(
        base, state="Warming", reason=reason, message=message, checks_passed=checks_blocker is None
    )


def plan_model_group(world: World) -> Plan:
    """Decide this tick's actions for one ModelGroup (see the module docstring)."""
    now = world.now
    template = world.template
    by_group: defaultdict[str, list[PodView]] = defaultdict(list)
    for pod in world.pods:
        by_group[pod.group].append(pod)
    assessments = [
        a
        for name, pods in sorted(by_group.items(), key=lambda item: _group_key(item[0]))
        if (a := assess_group(name, pods, world)) is not None
    ]

    events: list[EventRecord] = []
    unready: list[GateChange] = []
    deletions: list[GroupDeletion] = []
    creations: list[GroupCreation] = []
    releases: list[GateRelease] = []
    drain_marks: list[DrainMark] = []
    progress_marks: list[DrainProgressMark] = []
    ready: list[GateChange] = []
    warmups: list[WarmupRequest] = []
    probes: list[LeaderProbe] = []
    became_ready: list[Assessment] = []
    drains_ended: list[DrainEnded] = []
    cancelled: list[str] = []
    backoffs = [b for b in world.backoffs if b.until > now]
    final: dict[str, Assessment] = {}

    def delete(group: Assessment) -> None:
        service = (
            naming.service_name(template.model_group, group.name) if template.pods_per_group > 1 else None
        )
        deletions.append(GroupDeletion(group.name, group.pod_names, service))

    # 1. Failed groups leave the ready count at once and are deleted whole.
    failures: list[Assessment] = []
    for group in assessments:
        if group.state != "Failed":
            continue
        failures.append(group)
        marked = tuple(pod.name for pod in group.pods if pod.marked_group_ready)
        if marked:
            unready.append(GateChange(group.name, group.pod_names, False, group.reason, group.message))
        delete(group)
        if group.schedule_timed_out and group.domain:
            backoffs = [b for b in backoffs if b.domain != group.domain]
            # The scheduler's own words say whether GPUs were what was missing.
            cause = NoFitReason.INSUFFICIENT_GPUS if naming.GPU_RESOURCE in group.message else group.reason
            backoffs.append(
                Backoff(group.domain, now + timedelta(seconds=world.rules.backoff_seconds), cause)
            )
            events.append(
                EventRecord(
                    "Warning",
                    EventReason.SCHEDULE_TIMEOUT,
                    f"group {group.name} deleted: {group.message}; domain {group.domain} "
                    f"backed off for {world.rules.backoff_seconds:g}s",
                )
            )
        else:
            events.append(
                EventRecord(
                    "Warning",
                    EventReason.GROUP_FAILED,
                    f"group {group.name} failed, replacing it whole: {group.message}",
                )
            )
        final[group.name] = group

    # 2. Groups on their way: release gates, warm up, mark ready, probe draining leaders.
    for group in assessments:
        if group.state == "Placing" and group.gated:
            releases.append(GateRelease(group.name, group.pod_names))
        elif group.state == "Warming" and group.checks_passed:
            outcome = world.warmups.get(group.name)
            if outcome is not None and outcome.succeeded:
                now_ready = replace(
                    group, state="Ready", reason=Reason.GROUPS_READY, message="", ready_at=now
                )
                times = now_ready.ready_times() or ReadyTimes(0.0, 0.0, 0.0, 0.0)
                message = (
                    f"group {group.name} ready in {times.total_seconds:.1f}s (placing "
                    f"{times.placing_seconds:.1f}s, provisioning {times.provisioning_seconds:.1f}s, "
                    f"warming {times.warming_seconds:.1f}s)"
                )
                ready.append(GateChange(group.name, group.pod_names, True, Reason.GROUPS_READY, message))
                events.append(EventRecord("Normal", EventReason.GROUP_READY, message))
                became_ready.append(now_ready)
                final[group.name] = now_ready
            elif group.name not in world.warmups_in_flight and _warmup_due(outcome, world):
                request = _warmup_request(group, world)
                if request is not None:
                    warmups.append(request)
        final.setdefault(group.name, group)

    # 3. Draining groups leave when their leader is idle after routing stopped, or at the time limit.
    policy = world.rules.drain_policy()
    still_draining: list[Assessment] = []
    for group in (a for a in assessments if a.state == "Draining"):
        leader = group.pods[0]
        started_at = group.draining_since or now
        progress = group.drain_progress or DrainProgress()
        step = step_drain(
            DrainView(
                group=group.name,
                started_at=started_at,
                routed_pods=tuple(pod.name for pod in group.pods if pod.name in world.routed_pods),
                progress=progress,
                reading=world.leader_readings.get(group.name),
                last_sample=world.leader_samples.get(group.name),
                leader_reachable=leader.ip is not None,
            ),
            policy,
            now,
        )
        if isinstance(step, RemoveGroup):
            delete(group)
            del final[group.name]
            timed_out = step.outcome == "TimedOut"
            drains_ended.append(
                DrainEnded(
                    group=group.name,
                    outcome=step.outcome,
                    started_at=started_at,
                    ended_at=now,
                    duration_seconds=step.duration_seconds,
                    requests_finished=step.requests_finished,
                    requests_aborted=step.requests_aborted,
                    on_timeout=policy.on_timeout if timed_out else None,
                )
            )
            grace = template.shutdown_timeout_seconds + SHUTDOWN_MARGIN_SECONDS
            events.append(
                EventRecord(
                    "Warning" if timed_out else "Normal",
                    EventReason.DRAIN_TIMED_OUT if timed_out else EventReason.DRAIN_FINISHED,
                    f"{step.message}; {len(group.pods)} pod(s) deleted together with a "
                    f"{grace}s grace period (vLLM --shutdown-timeout {template.shutdown_timeout_seconds}s)",
                )
            )
            continue
        draining = replace(group, message=step.message, drain_progress=step.progress)
        still_draining.append(draining)
        final[group.name] = draining
        if step.progress != group.drain_progress:
            progress_marks.append(DrainProgressMark(group.name, leader.name, step.progress))
        if step.probe and leader.ip:
            probes.append(LeaderProbe(group.name, _metrics_url(leader.ip, template.port)))

    # 4. Scale: make up the shortfall, or remove the surplus.
    active = [
        final[a.name] for a in assessments if final.get(a.name) and final[a.name].state in _ACTIVE_STATES
    ]
    shortfall = world.desired_groups - len(active)
    # A draining group is warm, whole and healthy (else it would be Failed): putting it back in
    # service always beats creating a new one. The drain begun last has lost the least.
    reused = sorted(still_draining, key=lambda g: (g.draining_since or now, g.ordinal), reverse=True)
    for group in reused[: max(0, shortfall)]:
        drain_marks.append(DrainMark(group.name, group.pod_names, None))
        message = (
            f"group {group.name} back in service after "
            f"{_seconds(group.draining_since or now, now):.1f}s of draining: a scale-out needs it, "
            "and it is whole, healthy and warm"
        )
        ready.append(GateChange(group.name, group.pod_names, True, Reason.GROUPS_READY, message))
        probes = [probe for probe in probes if probe.group != group.name]
        progress_marks = [mark for mark in progress_marks if mark.group != group.name]
        restored = replace(
            group,
            state="Ready",
            draining_since=None,
            drain_progress=None,
            reason=Reason.GROUPS_READY,
            message="",
        )
        final[group.name] = restored
        active.append(restored)
        shortfall -= 1
        cancelled.append(group.name)
        events.append(EventRecord("Normal", EventReason.DRAIN_CANCELLED, message))

    # Terminating groups count too: a name is never reused while a pod of it may still exist.
    counter = max(world.group_counter, max(((naming.group_ordinal(g) or 0) + 1 for g in by_group), default=0))
    placement_limit: NoFit | None = None
    if shortfall > 0:
        inventory = world.inventory
        spread_counts = _spread_counts(active, inventory, world.placement)
        replaced = [f.name for f in failures]
        shape = GroupShape(template.pods_per_group, template.gpus_per_pod, template.gpu_resource)
        for _ in range(shortfall):
            decision = place_group(
                inventory,
                shape,
                world.placement,
                groups_by_spread_value=spread_counts,
                backed_off=frozenset(b.domain for b in backoffs),
            )
            if not isinstance(decision, Placed):
                placement_limit = decision
                break
            name = naming.group_name(counter)
            counter += 1
            replaces = replaced.pop(0) if replaced else None
            manifests = render_group(template, name, decision.domain, replaces)
            creations.append(GroupCreation(name, decision.domain, manifests.service, manifests.pods))
            inventory = inventory.with_group(world.placement.topology_key, decision.domain, shape)
            spread_counts[decision.spread_value] = spread_counts.get(decision.spread_value, 0) + 1
            # As the next pass will see it: every pod created, the gang released, none bound yet.
            created = [
                replace(view, created_at=now, gated=False)
                for manifest in manifests.pods
                if (view := parse_pod(manifest)) is not None
            ]
            final[name] = assess_group(name, created, world) or Assessment(
                name, "Placing", (), decision.domain, now
            )
            events.append(
                EventRecord(
                    "Normal",
                    EventReason.GROUP_CREATED,
                    f"group {name} created in {world.placement.topology_key}={decision.domain} "
                    f"({shape.pods} pod(s) × {shape.gpus_per_pod} GPU(s))"
                    + (f", replacing {replaces}" if replaces else ""),
                )
            )
    elif shortfall < 0:
        candidates = [
            Candidate(
                name=group.name,
                state=cast(CandidateState, group.state),
                ordinal=group.ordinal,
                ready_at=group.ready_at,
                outdated=group.outdated,
                load=_sample(world.leader_readings.get(group.name)),
            )
            for group in active
        ]
        over_max = max(0, len(active) - world.max_replicas) if world.max_replicas is not None else 0
        victims = choose_victims(
            candidates,
            -shortfall,
            now=now,
            min_lifetime_seconds=world.rules.min_lifetime_seconds,
            may_ignore_lifetime=len(active) if world.deleting else over_max,
        )
        # Ready groups are compared by their leaders' load: when a ready group would be chosen,
        # read every ready leader not read lately first, and choose among ready groups next pass.
        unread = stale_loads(candidates, world.leader_readings, now)
        if unread and any(victim.state == "Ready" for victim in victims):
            by_name = {group.name: group for group in active}
            for name in unread:
                leader = by_name[name].pods[0]
                if leader.ip:
                    probes.append(LeaderProbe(name, _metrics_url(leader.ip, template.port)))
            victims = tuple(victim for victim in victims if victim.state != "Ready")
        for victim in victims:
            chosen = final[victim.name]
            if chosen.state == "Ready":
                message = f"group {chosen.name} draining for scale-in: {_why_chosen(victim)}"
                unready.append(
                    GateChange(chosen.name, chosen.pod_names, False, Reason.GROUPS_DRAINING, message)
                )
                drain_marks.append(DrainMark(chosen.name, chosen.pod_names, now))
                # Chosen the moment it became ready (no minimum lifetime): it must not be marked ready.
                ready = [change for change in ready if change.group != chosen.name]
                final[chosen.name] = replace(
                    chosen,
                    state="Draining",
                    draining_since=now,
                    drain_progress=DrainProgress(),
                    reason=Reason.GROUPS_DRAINING,
                    message="draining: closing admission",
                )
                events.append(EventRecord("Normal", EventReason.DRAIN_STARTED, message))
                # The drain's baseline: the leader's counters as admission closes.
                leader = chosen.pods[0]
                if leader.ip:
                    probes = [probe for probe in probes if probe.group != chosen.name]
                    probes.append(LeaderProbe(chosen.name, _metrics_url(leader.ip, template.port)))
            else:
                delete(chosen)
                del final[chosen.name]
                # A group removed before it served anything must not reach the gate-setting steps.
                ready = [change for change in ready if change.group != chosen.name]
                warmups = [request for request in warmups if request.group != chosen.name]
                releases = [release for release in releases if release.group != chosen.name]
                events.append(
                    EventRecord(
                        "Normal",
                        EventReason.GROUP_DELETED,
                        f"group {chosen.name} ({chosen.state.lower()}) deleted for scale-in",
                    )
                )

    annotations: dict[str, str] = {}
    if counter != world.group_counter:
        annotations[naming.ANNOTATION_GROUP_COUNTER] = str(counter)
    if backoffs != list(world.backoffs):
        annotations[naming.ANNOTATION_PLACEMENT_BACKOFF] = encode_backoffs(backoffs)

    groups = tuple(sorted(final.values(), key=lambda a: _group_key(a.name)))
    return Plan(
        annotations=annotations,
        unready=tuple(unready),
        deletions=tuple(deletions),
        creations=tuple(creations),
        gate_releases=tuple(releases),
        drain_marks=tuple(drain_marks),
        drain_progress=tuple(progress_marks),
        ready=tuple(ready),
        warmups=tuple(warmups),
        leader_probes=tuple(probes),
        events=tuple(events),
        drains_ended=tuple(drains_ended),
        drains_cancelled=tuple(cancelled),
        groups=groups,
        placement_limit=placement_limit,
        became_ready=tuple(became_ready),
        backoffs=tuple(backoffs),
    )


def _sample(reading: LeaderReading | None) -> LeaderSample | None:
    return reading if isinstance(reading, LeaderSample) else None


def _why_chosen(victim: Candidate) -> str:
    """The facts the victim choice weighed, for the DrainStarted Event."""
    parts = ["an outdated template"] if victim.outdated else []
    load = victim.load
    if load is None:
        parts.append("its leader's load could not be read")
    else:
        parts.append(f"{load.running} running and {load.waiting} waiting request(s) at its leader")
        if load.kv_cache_usage is not None:
            parts.append(f"KV cache {load.kv_cache_usage:.0%} used")
        if load.prefix_cache_hit_ratio is not None:
            parts.append(f"prefix-cache hit ratio {load.prefix_cache_hit_ratio:.0%}")
    return "the cheapest ready group to remove: " + ", ".join(parts)


def _metrics_url(ip: str, port: int) -> str:
    return f"http://{ip}:{port}/metrics"


def parse_backoffs(text: str | None) -> tuple[Backoff, ...]:
    """The back-off list stored on the ModelGroup; an unreadable annotation counts as none."""
    if not text:
        return ()
    try:
        raw = json.loads(text)
    except json.JSONDecodeError:
        return ()
    backoffs = []
    for item in raw if isinstance(raw, list) else ():
        until = parse_time(item.get("until")) if isinstance(item, dict) else None
        if until is not None and isinstance(item.get("domain"), str):
            backoffs.append(Backoff(item["domain"], until, str(item.get("reason", ""))))
    return tuple(backoffs)


def encode_backoffs(backoffs: Iterable[Backoff]) -> str:
    return json.dumps(
        [
            {"domain": b.domain, "until": b.until.strftime("%Y-%m-%dT%H:%M:%SZ"), "reason": b.reason}
            for b in sorted(backoffs, key=lambda b: b.domain)
        ],
        separators=(",", ":"),
    )


def _readiness_blocker(pods: tuple[PodView, ...], world: World) -> tuple[str, str] | None:
    """What still keeps running ranks from serving (before the warm-up), or None."""
    rules = world.rules
    if rules.nccl_required:
        waiting = [pod.rank for pod in pods if pod.nccl_healthy is None or pod.nccl_healthy.status != "True"]
        if waiting:
            return Reason.GROUPS_WARMING, f"waiting for NCCL health on rank {_ranks(waiting)}"
    if rules.revision_check:
        unreported = [pod.rank for pod in pods if pod.reported_model_revision is None]
        wrong = [pod for pod in pods if pod.reported_model_revision not in (None, rules.model_revision)]
        if wrong:
            return (
                Reason.REVISION_MISMATCH,
                f"rank {wrong[0].rank} reports model revision "
                f"{wrong[0].reported_model_revision!r}, want {rules.model_revision!r}",
            )
        if unreported:
            return (
                Reason.GROUPS_WARMING,
                f"waiting for rank {_ranks(unreported)} to report the model revision",
            )
    return None


def _warmup_due(outcome: WarmupOutcome | None, world: World) -> bool:
    return outcome is None or _seconds(outcome.finished_at, world.now) >= world.rules.warmup_retry_seconds


def _warmup_request(group: Assessment, world: World) -> WarmupRequest | None:
    leader = group.pods[0]
    if not leader.ip:
        return None
    template = world.template
    return WarmupRequest(
        group=group.name,
        leader_ip=leader.ip,
        port=template.port,
        model=template.served_name or template.model,
        prompt=world.rules.warmup_prompt,
        max_tokens=world.rules.warmup_max_tokens,
        timeout_seconds=world.rules.warmup_timeout_seconds,
    )


def _spread_counts(
    groups: Iterable[Assessment], inventory: Inventory, rules: PlacementRules
) -> dict[str, int]:
    """Groups of this ModelGroup per spread-domain value, by the spread label of their domain's nodes."""
    spread_of_domain: dict[str, str] = {}
    if rules.spread_key:
        for node in inventory.nodes:
            domain = node.label(rules.topology_key)
            spread = node.label(rules.spread_key)
            if domain is not None and spread is not None:
                spread_of_domain.setdefault(domain, spread)
    counts: Counter[str] = Counter()
    for group in groups:
        if group.domain is not None:
            counts[spread_of_domain.get(group.domain, "")] += 1
    return dict(counts)


def _unschedulable_detail(pods: Iterable[PodView]) -> str:
    for pod in pods:
        if pod.scheduled is not None and pod.scheduled.status == "False" and pod.scheduled.message:
            return f" ({pod.name}: {pod.scheduled.message})"
    return ""


def _group_key(name: str) -> tuple[int, str]:
    ordinal = naming.group_ordinal(name)
    return (ordinal if ordinal is not None else -1, name)


def _latest(times: Iterable[datetime | None]) -> datetime | None:
    known = [t for t in times if t is not None]
    return max(known) if known else None


def _seconds(start: datetime, end: datetime) -> float:
    return max(0.0, (end - start).total_seconds())


def _ranks(ranks: Iterable[int]) -> str:
    return ", ".join(str(rank) for rank in ranks)
