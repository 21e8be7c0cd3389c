"""The plan a tick's transitions call for: the operator's actions, derived once all is decided.

Each transition maps to its actions and Event in one place (`_TRANSITION_ACTIONS`), in the order
the transitions were decided; the steady actions (gate releases, warm-ups, leader reads of draining
groups) follow from each group's final state. Nothing here decides.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from goodput.api.modelgroup import ACTIVE_STATES, COMING_STATES
from goodput.api.reasons import EventReason, Reason
from goodput.controllers import naming
from goodput.controllers.events import EventRecord
from goodput.controllers.groups.drain import DecidedDrain, KeepDraining
from goodput.controllers.groups.lifecycle import GroupEvent, GroupTransition
from goodput.controllers.groups.model import (
    Assessment,
    DrainEnded,
    DrainMark,
    DrainOutcomeMark,
    DrainProgressMark,
    DrainStart,
    GateChange,
    GateRelease,
    GroupDeletion,
    LeaderProbe,
    Plan,
    RolloutProgress,
    RolloutStatus,
    WarmupOutcome,
    WarmupRequest,
    World,
    encode_backoffs,
    encode_rollout,
    group_key,
    seconds_between,
)
from goodput.controllers.groups.pods import SHUTDOWN_MARGIN_SECONDS
from goodput.controllers.groups.ready_phases import PhaseStall, ReadyBreakdown, stall_bounds, stalled
from goodput.controllers.groups.stages import Tick


@dataclass(slots=True)
class _Actions:
    """The plan's action lists while they are derived (local to `plan_actions`)."""

    drain_starts: list[DrainStart] = field(default_factory=list)
    unready: list[GateChange] = field(default_factory=list)
    deletions: list[GroupDeletion] = field(default_factory=list)
    drain_marks: list[DrainMark] = field(default_factory=list)
    ready: list[GateChange] = field(default_factory=list)
    events: list[EventRecord] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    probes: list[LeaderProbe | None] = field(default_factory=list)


def plan_actions(tick: Tick) -> Plan:
    """The plan: the actions of every transition, then the steady actions of the final states."""
    actions = _Actions()
    last_move = {step.group: index for index, step in enumerate(tick.transitions)}
    for index, step in enumerate(tick.transitions):
        superseded = last_move[step.group] != index
        _TRANSITION_ACTIONS[step.event](tick, step, actions, superseded)
    final = sorted(tick.groups.values(), key=lambda group: group_key(group.name))
    world = tick.world
    continuing = {name: step for name, step in tick.drain_steps.items() if isinstance(step, KeepDraining)}
    still_draining = [g for g in final if g.state == "Draining" and g.name in continuing]
    probes = [_probe(g, world) for g in still_draining if continuing[g.name].probe]
    probes += [_probe(tick.groups[name], world) for name in tick.unread_leaders]
    probes += actions.probes
    started = {start.group for start in actions.drain_starts}
    actions.drain_starts.extend(
        _resumed_start(g, world) for g in still_draining if g.name not in started and g.unstarted_drain_pods
    )
    outcomes = [_ending(tick.observed[name], record, tick) for name, record in tick.drains_ending.items()]
    reported = _start_problems(final, world) + _readiness_waits(final, world)
    actions.events.extend(event for _, event in reported)
    breakdowns, stalls = _ready_phases(final, world)
    stall_events = _stall_events(stalls, world)
    actions.events.extend(event for _, event in stall_events)
    rollout = _rollout_status(tick, final)
    actions.events.extend(_rollout_events(rollout, world))
    return Plan(
        annotations=_annotations(tick),
        drain_starts=tuple(actions.drain_starts),
        unready=tuple(actions.unready),
        drain_outcomes=tuple(mark for mark, _ in outcomes if mark is not None),
        deletions=tuple(actions.deletions),
        creations=tick.creations,
        gate_releases=tuple(
            GateRelease(g.name, g.pod_names) for g in final if g.state == "Placing" and g.gated
        ),
        drain_marks=tuple(actions.drain_marks),
        drain_progress=tuple(
            DrainProgressMark(g.name, g.pods[0].name, continuing[g.name].progress)
            for g in still_draining
            if continuing[g.name].progress != tick.observed[g.name].drain_progress
        ),
        ready=tuple(actions.ready),
        warmups=tuple(request for g in final if (request := _warmup(g, world)) is not None),
        leader_probes=tuple(probe for probe in probes if probe is not None),
        events=tuple(actions.events),
        drains_ended=tuple(ended for _, ended in outcomes),
        drains_cancelled=tuple(actions.cancelled),
        groups=tuple(final),
        placement_limit=tick.placement_limit,
        became_ready=tick.became_ready,
        backoffs=tick.backoffs,
        transitions=tick.transitions,
        readiness_reported=tuple(name for name, _ in reported),
        rollout=rollout,
        ready_breakdowns=breakdowns,
        stalls=stalls,
        stalls_reported=tuple(key for key, _ in stall_events),
    )


def _ready_phases(
    final: list[Assessment], world: World
) -> tuple[dict[str, ReadyBreakdown], dict[str, PhaseStall]]:
    """Every group's ready time by phase, and the starting groups stalled in one: past a few times
    what the recent groups took in that phase, or half the start-up timeout before there are enough
    of them (the timeout itself fails the group)."""
    bounds = stall_bounds(world.recent_ready_phases, world.rules.startup_timeout_seconds / 2)
    breakdowns: dict[str, ReadyBreakdown] = {}
    stalls: dict[str, PhaseStall] = {}
    for group in final:
        phases = group.ready_breakdown(world.now, ranks_checked=world.rules.nccl_required)
        breakdowns[group.name] = phases
        stall = stalled(phases, bounds) if group.state in COMING_STATES else None
        if stall is not None:
            stalls[group.name] = stall
    return breakdowns, stalls


def _stall_events(stalls: dict[str, PhaseStall], world: World) -> list[tuple[str, EventRecord]]:
    """A Warning naming the stalled phase, once per group and phase."""
    events = []
    for name, stall in stalls.items():
        key = f"{name}/{stall.phase}"
        if key in world.stalls_reported:
            continue
        source = "3x the recent groups' p90" if stall.measured else "half the start-up timeout"
        message = (
            f"group {name} stalled in {stall.phase}: {stall.seconds:.0f}s, past its bound of "
            f"{stall.bound_seconds:.0f}s ({source})"
        )
        events.append((key, EventRecord("Warning", EventReason.READY_PHASE_STALLED, message)))
    return events


def _annotations(tick: Tick) -> dict[str, str]:
    """What must survive a restart, written on the ModelGroup when it changed: the group counter,
    the placement back-offs, and the rollout's failures once there are any."""
    world = tick.world
    annotations: dict[str, str] = {}
    if tick.group_counter != world.group_counter:
        annotations[naming.ANNOTATION_GROUP_COUNTER] = str(tick.group_counter)
    if tick.backoffs != world.backoffs:
        annotations[naming.ANNOTATION_PLACEMENT_BACKOFF] = encode_backoffs(tick.backoffs)
    recorded = world.rollout_progress
    if (
        tick.rollout is not None
        and tick.rollout != recorded
        and (tick.rollout.failed or recorded is not None)
    ):
        annotations[naming.ANNOTATION_ROLLOUT] = encode_rollout(tick.rollout)
    return annotations


def _rollout_events(rollout: RolloutStatus | None, world: World) -> list[EventRecord]:
    """A Warning the pass a rollout stops (not on every pass after)."""
    recorded = world.rollout_progress
    if rollout is None or not rollout.stalled or (recorded is not None and _stalled(recorded, world)):
        return []
    message = (
        f"rollout to revision {rollout.revision} stopped: {rollout.failed} group(s) of that revision "
        f"failed; {rollout.outdated} group(s) of the older revision keep serving"
    )
    return [EventRecord("Warning", EventReason.ROLLOUT_STALLED, message)]


def _stalled(progress: RolloutProgress, world: World) -> bool:
    return progress.revision == world.template.revision and progress.failed >= world.rollout.failure_limit


def _rollout_status(tick: Tick, final: list[Assessment]) -> RolloutStatus | None:
    """Groups of the current template and of older ones, and whether replacing them stopped."""
    if tick.rollout is None:
        return None
    active = [g for g in final if g.state in ACTIVE_STATES]
    outdated = sum(1 for g in active if g.outdated)
    return RolloutStatus(
        revision=tick.rollout.revision,
        updated=len(active) - outdated,
        outdated=outdated,
        failed=tick.rollout.failed,
        stalled=tick.stalled and outdated > 0,
    )


def _readiness_waits(final: list[Assessment], world: World) -> list[tuple[str, EventRecord]]:
    """A warming group not ready `readiness_report_seconds` after every rank started says, once,
    which rank waits for what: a check no agent on the cluster answers must not wait unseen."""
    reports = []
    for group in final:
        if group.state != "Warming" or group.running_at is None or group.name in world.readiness_reported:
            continue
        waited = seconds_between(group.running_at, world.now)
        if waited >= world.rules.readiness_report_seconds:
            message = f"group {group.name} not ready {waited:.0f}s after every rank started: {group.message}"
            reports.append((group.name, EventRecord("Warning", EventReason.READINESS_WAITING, message)))
    return reports


def _start_problems(final: list[Assessment], world: World) -> list[tuple[str, EventRecord]]:
    """A starting group whose rank waits on something waiting does not fix (the kubelet cannot pull
    the image, or a Secret or key it names does not exist) says so once, naming the rank, the
    kubelet's reason and the spec field to check. A group is reported once, for whichever of this
    and a readiness wait comes first."""
    reports = []
    for group in final:
        if group.state != "Provisioning" or group.name in world.readiness_reported:
            continue
        stuck = [
            f"rank {pod.rank} ({pod.name}): {pod.waiting.describe()}"
            for pod in group.pods
            if pod.waiting is not None and pod.waiting.spec_field is not None
        ]
        if stuck:
            message = f"group {group.name} cannot start: " + "; ".join(stuck)
            reports.append((group.name, EventRecord("Warning", EventReason.CONTAINERS_NOT_STARTING, message)))
    return reports


def _deletion(tick: Tick, group: Assessment) -> GroupDeletion:
    template = tick.world.template
    service = naming.service_name(template.model_group, group.name) if template.pods_per_group > 1 else None
    return GroupDeletion(group.name, group.pod_names, service)


def _replaced(tick: Tick, step: GroupTransition, actions: _Actions, superseded: bool) -> None:
    group = tick.groups[step.group]
    if any(pod.marked_group_ready for pod in group.pods):
        actions.unready.append(GateChange(group.name, group.pod_names, False, group.reason, group.message))
    actions.deletions.append(_deletion(tick, group))
    if group.failure is GroupEvent.NODES_NOT_PROVISIONED:
        backoff = tick.world.rules.backoff_seconds
        message = f"group {group.name} deleted whole: {group.message}; no new nodes asked for {backoff:g}s"
        record = EventRecord("Warning", EventReason.NODE_PROVISIONING_TIMEOUT, message, group.name)
        actions.events.append(record)
    elif group.schedule_timed_out and group.domain:
        backoff = tick.world.rules.backoff_seconds
        message = (
            f"group {group.name} deleted: {group.message}; domain {group.domain} backed off for {backoff:g}s"
        )
        actions.events.append(EventRecord("Warning", EventReason.SCHEDULE_TIMEOUT, message, group.name))
    else:
        message = f"group {group.name} failed, replacing it whole: {group.message}"
        actions.events.append(EventRecord("Warning", EventReason.GROUP_FAILED, message, group.name))


def _warmed_up(tick: Tick, step: GroupTransition, actions: _Actions, superseded: bool) -> None:
    if superseded:
        return  # chosen for scale-in in the same tick: it never serves, so it is never marked ready
    group = tick.groups[step.group]
    actions.ready.append(GateChange(group.name, group.pod_names, True, Reason.GROUPS_READY, step.message))
    actions.events.append(EventRecord("Normal", EventReason.GROUP_READY, step.message, group.name))


def _drain_ended(tick: Tick, step: GroupTransition, actions: _Actions, superseded: bool) -> None:
    """The drain's end is in `status.drain.recent` (recorded and announced by an earlier pass):
    only now are its ranks deleted."""
    actions.deletions.append(_deletion(tick, tick.observed[step.group]))


def _ending(
    group: Assessment, decided: DecidedDrain, tick: Tick
) -> tuple[DrainOutcomeMark | None, DrainEnded]:
    """A drain whose end is decided but not recorded yet: its outcome written on every rank that
    lacks it, then its status record and Event. The ranks stay until a pass sees the record."""
    template = tick.world.template
    grace = template.shutdown_timeout_seconds + SHUTDOWN_MARGIN_SECONDS
    timed_out = decided.record.outcome == "TimedOut"
    event = EventRecord(
        "Warning" if timed_out else "Normal",
        EventReason.DRAIN_TIMED_OUT if timed_out else EventReason.DRAIN_FINISHED,
        f"{decided.message}; {len(group.pods)} pod(s) deleted together with a "
        f"{grace}s grace period (vLLM --shutdown-timeout {template.shutdown_timeout_seconds}s)",
        group.name,
    )
    unmarked = tuple(pod.name for pod in group.pods if pod.drain_outcome != decided)
    ended = DrainEnded(record=decided.record, event=event)
    return (DrainOutcomeMark(group.name, unmarked, decided) if unmarked else None), ended


def _resumed_start(group: Assessment, world: World) -> DrainStart:
    """Finish a drain start an operator left part-done: every rank marked, then every gate False.
    Whether the stopped operator posted DrainStarted (after its last mark, before the gates) is not
    known, so the resumed start announces itself: at least once, never a drain nobody was told of."""
    since = group.draining_since or world.now
    message = (
        f"group {group.name} draining since {since.isoformat()}: resuming a drain start that was "
        f"cut short (rank(s) {', '.join(group.unstarted_drain_pods)} not yet out of service)"
    )
    event = EventRecord("Normal", EventReason.DRAIN_STARTED, message, group.name)
    return DrainStart(group.name, group.pod_names, since, Reason.GROUPS_DRAINING, message, event)


def _scaled_out(tick: Tick, step: GroupTransition, actions: _Actions, superseded: bool) -> None:
    group = tick.groups[step.group]
    actions.drain_marks.append(DrainMark(group.name, group.pod_names, None))
    actions.ready.append(GateChange(group.name, group.pod_names, True, Reason.GROUPS_READY, step.message))
    actions.cancelled.append(group.name)
    actions.events.append(EventRecord("Normal", EventReason.DRAIN_CANCELLED, step.message, group.name))


def _created(tick: Tick, step: GroupTransition, actions: _Actions, superseded: bool) -> None:
    actions.events.append(EventRecord("Normal", EventReason.GROUP_CREATED, step.message, step.group))


def _scaled_in(tick: Tick, step: GroupTransition, actions: _Actions, superseded: bool) -> None:
    if step.after == "Draining":
        group = tick.groups[step.group]
        event = EventRecord("Normal", EventReason.DRAIN_STARTED, step.message, group.name)
        actions.drain_starts.append(
            DrainStart(
                group.name, group.pod_names, tick.world.now, Reason.GROUPS_DRAINING, step.message, event
            )
        )
        # The drain's baseline: the leader's counters as admission closes.
        actions.probes.append(_probe(group, tick.world))
        return
    group = tick.observed[step.group]
    actions.deletions.append(_deletion(tick, group))
    actions.events.append(EventRecord("Normal", EventReason.GROUP_DELETED, step.message, group.name))


def _probe(group: Assessment, world: World) -> LeaderProbe | None:
    leader = group.pods[0]
    return LeaderProbe(group.name, f"http://{leader.ip}:{world.template.port}/metrics") if leader.ip else None


def _warmup(group: Assessment, world: World) -> WarmupRequest | None:
    """A warm-up through the leader of a warming group whose checks passed, unless one is in flight
    or the last failed less than the retry interval ago."""
    if group.state != "Warming" or not group.checks_passed or group.name in world.warmups_in_flight:
        return None
    outcome: WarmupOutcome | None = world.warmups.get(group.name)
    if (
        outcome is not None
        and seconds_between(outcome.finished_at, world.now) < world.rules.warmup_retry_seconds
    ):
        return None
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


_Handler = Callable[[Tick, GroupTransition, _Actions, bool], None]
_TRANSITION_ACTIONS: dict[GroupEvent, _Handler] = {
    GroupEvent.REPLACED: _replaced,
    GroupEvent.WARMED_UP: _warmed_up,
    GroupEvent.DRAINED: _drain_ended,
    GroupEvent.DRAIN_TIMED_OUT: _drain_ended,
    GroupEvent.SCALED_OUT: _scaled_out,
    GroupEvent.CREATED: _created,
    GroupEvent.SCALED_IN: _scaled_in,
    GroupEvent.OUTDATED: _scaled_in,
}
