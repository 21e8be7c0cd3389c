"""The ModelGroup status the group controller writes, computed as a whole value from a plan.

The controller owns the group counts, `groups[]`, `pools[]`, `replicas`, `labelSelector`, and the conditions
Ready, Progressing, Degraded and ScalingLimited (`ownership.GROUP_STATUS`). Decisions and the
autoscaler's conditions pass through untouched. The caller compares the result with the current
status and applies only a difference (its own part, under its own field manager), so an idle
ModelGroup costs no writes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import datetime

from goodput.api.conditions import Condition, ConditionStatus, set_condition
from goodput.api.labels import leader_label_selector, pool_leader_label_selector
from goodput.api.modelgroup import (
    RECENT_DRAINS,
    RECENT_READY_SAMPLES,
    DrainSummary,
    GroupStatus,
    ModelGroupStatus,
    PhaseSeconds,
    PoolStatus,
    ReadyPhaseStall,
    ReadyPhaseSummary,
    ReadySample,
    ReadyTime,
    ReadyTimeSummary,
)
from goodput.api.reasons import ConditionType, Reason
from goodput.controllers import naming
from goodput.controllers.groups.model import Assessment, DomainBackoff, DrainEnded, Plan
from goodput.controllers.groups.ready_phases import PhaseStall, ReadyBreakdown, ReadyPhase, nearest_rank
from goodput.controllers.ownership import GROUP_STATUS

# Drains kept in `status.drain.recent`, newest first.
# Progressing reports the earliest phase any group is in.
_PHASES = (
    ("Placing", Reason.GROUPS_PLACING),
    ("Provisioning", Reason.GROUPS_PROVISIONING),
    ("Warming", Reason.GROUPS_WARMING),
    ("Draining", Reason.GROUPS_DRAINING),
)


def phase_seconds(phases: ReadyBreakdown | None) -> tuple[PhaseSeconds, ...]:
    """A breakdown's phases as status shows them (to 0.1 s); an unknown phase has no seconds."""
    if phases is None:
        return ()
    return tuple(
        PhaseSeconds(phase=p.phase.value, seconds=None if p.seconds is None else round(p.seconds, 1))
        for p in phases.phases
    )


def group_status(
    group: Assessment, phases: ReadyBreakdown | None = None, pool: str = naming.SERVING_POOL
) -> GroupStatus:
    times = group.ready_times()
    ready_time = None
    if times is not None:
        ready_time = ReadyTime(
            placing_seconds=round(times.placing_seconds, 1),
            provisioning_seconds=round(times.provisioning_seconds, 1),
            warming_seconds=round(times.warming_seconds, 1),
            total_seconds=round(times.total_seconds, 1),
            phases=phase_seconds(phases),
        )
    return GroupStatus(
        name=group.name,
        state=group.state,
        domain=group.domain,
        pods=group.pod_names,
        created_at=group.created_at,
        ready_at=group.ready_at,
        ready_time=ready_time,
        drain_started_at=group.draining_since,
        outdated=group.outdated,
        message=group.message or None,
        pool=pool,
    )


def ready_time_summary(previous: ReadyTimeSummary | None, plan: Plan) -> ReadyTimeSummary | None:
    """The latest groups' ready times with the groups that became ready since added (once each: a
    group's name is never reused), their median and 90th percentile whole and by phase, and the
    groups stalled now. Absent while no group was ever ready or stalled."""
    recent = previous.recent if previous is not None else ()
    recorded = {sample.group for sample in recent}
    new = [
        ReadySample(
            group=group.name,
            ready_at=group.ready_at,
            total_seconds=round(phases.total_seconds, 1),
            phases=phase_seconds(phases),
        )
        for group in plan.groups
        if group.ready_at is not None
        and group.name not in recorded
        and (phases := plan.ready_breakdowns.get(group.name)) is not None
        and phases.total_seconds is not None
    ]
    samples = tuple(sorted([*new, *recent], key=lambda s: s.ready_at, reverse=True)[:RECENT_READY_SAMPLES])
    stalls = tuple(_stall_status(name, stall) for name, stall in sorted(plan.stalls.items()))
    if not samples and not stalls:
        return None
    totals = [sample.total_seconds for sample in samples]
    return ReadyTimeSummary(
        samples=len(samples),
        p50_seconds=nearest_rank(totals, 0.5),
        p90_seconds=nearest_rank(totals, 0.9),
        by_phase=tuple(_phase_summary(phase, samples) for phase in ReadyPhase),
        recent=samples,
        stalled=stalls,
    )


def _phase_summary(phase: ReadyPhase, samples: Sequence[ReadySample]) -> ReadyPhaseSummary:
    known = [p.seconds for s in samples for p in s.phases if p.phase == phase and p.seconds is not None]
    return ReadyPhaseSummary(
        phase=phase.value,
        samples=len(known),
        p50_seconds=nearest_rank(known, 0.5),
        p90_seconds=nearest_rank(known, 0.9),
    )


def _stall_status(group: str, stall: PhaseStall) -> ReadyPhaseStall:
    return ReadyPhaseStall(
        group=group,
        phase=stall.phase.value,
        seconds=round(stall.seconds, 1),
        bound_seconds=round(stall.bound_seconds, 1),
    )


def recent_ready_phases(summary: ReadyTimeSummary | None) -> tuple[dict[ReadyPhase, float], ...]:
    """The recent groups' known phase times, as the group controller's stall bounds read them."""
    if summary is None:
        return ()
    return tuple(
        {ReadyPhase(p.phase): p.seconds for p in sample.phases if p.seconds is not None}
        for sample in summary.recent
    )


def state_counts(counts: Counter[str]) -> dict[str, int]:
    """The `*_groups` count fields of a ModelGroup's or a pool's status, from groups counted by state."""
    return {
        "placing_groups": counts["Placing"],
        "provisioning_groups": counts["Provisioning"],
        "warming_groups": counts["Warming"],
        "ready_groups": counts["Ready"],
        "draining_groups": counts["Draining"],
        "failed_groups": counts["Failed"],
    }


def pool_status(
    model_group: str, pool: str, *, desired_groups: int, counts: Counter[str], revision: str | None
) -> PoolStatus:
    """One pool's entry of `status.pools`, whole from the pool's plan: its counts by state, its
    template revision and the selector of its leaders."""
    return PoolStatus(
        name=pool,
        desired_groups=desired_groups,
        **state_counts(counts),
        revision=revision,
        label_selector=pool_leader_label_selector(model_group, pool),
    )


def with_others_conditions(ours: ModelGroupStatus, observed: ModelGroupStatus) -> ModelGroupStatus:
    """`ours` (a status this controller wrote, not yet echoed by the watch) with every condition of
    a type another controller owns taken from `observed`, so comparing with it sees only our change."""
    kept = [c for c in ours.conditions if GROUP_STATUS.owns(c.type)]
    others = [c for c in observed.conditions if not GROUP_STATUS.owns(c.type)]
    return ours.model_copy(update={"conditions": (*kept, *others)})


def model_group_status(
    previous: ModelGroupStatus,
    *,
    name: str,
    generation: int,
    desired_groups: int,
    plan: Plan,
    now: datetime,
    unrecorded_drains: Sequence[DrainEnded] = (),
    unrecorded_cancellations: int = 0,
    pool: str = naming.SERVING_POOL,
) -> ModelGroupStatus:
    """The status after applying `plan`, keeping what other controllers wrote.

    unrecorded_drains: drains that ended in an earlier pass whose status write did not land;
    unrecorded_cancellations: drains cancelled in such passes.
    pool: the pool `plan` is of; the ModelGroup's one pool is its whole `status.pools`.
    """
    counts: Counter[str] = Counter(group.state for group in plan.groups)
    revision = plan.rollout.revision if plan.rollout is not None else previous.revision
    return previous.model_copy(
        update={
            "observed_generation": generation,
            "replicas": counts["Ready"],
            "label_selector": leader_label_selector(name),
            "desired_groups": desired_groups,
            **state_counts(counts),
            "revision": revision,
            "updated_groups": plan.rollout.updated if plan.rollout is not None else 0,
            "outdated_groups": plan.rollout.outdated if plan.rollout is not None else 0,
            "groups": tuple(
                group_status(group, plan.ready_breakdowns.get(group.name), pool) for group in plan.groups
            ),
            "pools": (
                pool_status(name, pool, desired_groups=desired_groups, counts=counts, revision=revision),
            ),
            "ready_time": ready_time_summary(previous.ready_time, plan),
            "drain": drain_summary(
                previous.drain,
                [*unrecorded_drains, *plan.drains_ended],
                len(plan.drains_cancelled) + unrecorded_cancellations,
            ),
            "conditions": _group_conditions(
                previous, plan, counts=counts, desired_groups=desired_groups, generation=generation, now=now
            ),
        }
    )


def _group_conditions(
    previous: ModelGroupStatus,
    plan: Plan,
    *,
    counts: Counter[str],
    desired_groups: int,
    generation: int,
    now: datetime,
) -> tuple[Condition, ...]:
    """The group controller's conditions (Ready, Progressing, Degraded, ScalingLimited) after `plan`,
    set on the previous ones so each keeps its transition time while its status holds."""
    conditions = previous.conditions
    summary = _summary(counts)
    degraded = _degraded(plan.groups)
    found: list[tuple[str, tuple[ConditionStatus, str, str]]] = [
        (ConditionType.READY, _ready_condition(counts["Ready"], desired_groups, summary)),
        (ConditionType.PROGRESSING, _progressing(plan, counts, summary)),
        (
            ConditionType.DEGRADED,
            ("True", *degraded)
            if degraded is not None
            else ("False", Reason.STABLE, "no group failed or is being replaced"),
        ),
        (ConditionType.SCALING_LIMITED, _scaling_limited(plan)),
    ]
    for kind, (status, reason, message) in found:
        new = Condition(
            type=kind,
            status=status,
            observed_generation=generation,
            last_transition_time=now,
            reason=reason,
            message=message,
        )
        conditions = set_condition(conditions, new, now)
    return conditions


def _containers_not_starting(groups: Iterable[Assessment]) -> list[str]:
    """Ranks of starting groups whose container waits for something waiting does not fix, with the
    kubelet's reason and message and the ModelGroup field to look at."""
    return [
        f"group {group.name} rank {pod.rank} ({pod.name}): {pod.waiting.describe()}"
        for group in groups
        if group.state == "Provisioning"
        for pod in group.pods
        if pod.waiting is not None and pod.waiting.spec_field is not None
    ]


def drain_summary(
    previous: DrainSummary | None, ended: Iterable[DrainEnded], cancelled: int
) -> DrainSummary | None:
    """The drain totals with these drains added; a drain already recorded (same group, which is
    never renamed or reused) is not counted twice. A count a drain could not take stays unknown:
    it adds nothing to the request totals and one to the drains whose count is unknown, so the
    totals read as what they are, the requests counted (a lower bound while any count is unknown)."""
    recorded = {record.group for record in previous.recent} if previous is not None else set()
    new = []
    for drain in ended:
        if drain.record.group not in recorded:
            recorded.add(drain.record.group)
            new.append(drain.record)
    if not new and not cancelled:
        return previous
    summary = previous or DrainSummary()
    records = new
    return summary.model_copy(
        update={
            "drained": summary.drained + sum(1 for r in records if r.outcome == "Drained"),
            "timed_out": summary.timed_out + sum(1 for r in records if r.outcome == "TimedOut"),
            "cancelled": summary.cancelled + cancelled,
            "requests_finished": summary.requests_finished
            + sum(r.requests_finished for r in records if r.requests_finished is not None),
            "requests_aborted": summary.requests_aborted
            + sum(r.requests_aborted for r in records if r.requests_aborted is not None),
            "drains_with_unknown_finished": summary.drains_with_unknown_finished
            + sum(1 for r in records if r.requests_finished is None),
            "drains_with_unknown_aborts": summary.drains_with_unknown_aborts
            + sum(1 for r in records if r.requests_aborted is None),
            "recent": tuple(
                sorted([*records, *summary.recent], key=lambda r: r.ended_at, reverse=True)[:RECENT_DRAINS]
            ),
        }
    )


def invalid_spec_status(
    previous: ModelGroupStatus, *, name: str, generation: int, problems: str, now: datetime
) -> ModelGroupStatus:
    """The status of a ModelGroup whose spec cannot be acted on: the groups it has are left alone."""
    conditions = previous.conditions
    for kind in (ConditionType.READY, ConditionType.PROGRESSING):
        new = Condition(
            type=kind,
            status="False",
            observed_generation=generation,
            last_transition_time=now,
            reason=Reason.INVALID_SPEC,
            message=problems,
        )
        conditions = set_condition(conditions, new, now)
    return previous.model_copy(
        update={
            "observed_generation": generation,
            "label_selector": leader_label_selector(name),
            "conditions": conditions,
        }
    )


def _ready_condition(ready: int, desired_groups: int, summary: str) -> tuple[ConditionStatus, str, str]:
    if desired_groups == 0 and ready == 0:
        return "True", Reason.SCALED_TO_ZERO, "no group wanted"
    if ready >= desired_groups:
        return "True", Reason.GROUPS_READY, f"{ready}/{desired_groups} groups ready"
    return (
        "False",
        Reason.GROUPS_NOT_READY,
        f"{ready}/{desired_groups} groups ready" + (f"; {summary}" if summary else ""),
    )


def _scaling_limited(plan: Plan) -> tuple[ConditionStatus, str, str]:
    """ScalingLimited: whether a wanted group cannot be placed, and why."""
    if plan.placement_limit is not None:
        return "True", plan.placement_limit.reason, plan.placement_limit.message
    if plan.backoffs:
        return (
            "True",
            plan.backoffs[0].reason,
            "; ".join(_backoff_text(b) for b in plan.backoffs),
        )
    return "False", Reason.DESIRED_WITHIN_RANGE, "every wanted group could be placed"


def _backoff_text(backoff: DomainBackoff) -> str:
    until = backoff.until.strftime("%Y-%m-%dT%H:%M:%SZ")
    if backoff.domain == naming.NEW_NODES_DOMAIN:
        return (
            f"a group got no new nodes in time ({backoff.reason}); no nodes asked for until {until}: "
            "check the node autoscaler's NodePool or node groups, or raise "
            "spec.placement.nodeProvisioning.provisioningTimeoutSeconds"
        )
    return f"a group did not fit {backoff.domain} in time ({backoff.reason}); domain avoided until {until}"


def _progressing(plan: Plan, counts: Counter[str], summary: str) -> tuple[ConditionStatus, str, str]:
    """Progressing: a rollout under way or stopped, else the earliest phase any group is in."""
    rollout = plan.rollout
    if rollout is not None and rollout.outdated and rollout.stalled:
        return (
            "False",
            Reason.ROLLOUT_STALLED,
            f"rollout to revision {rollout.revision} stopped after {rollout.failed} failed group(s) of that "
            f"revision; {rollout.outdated} group(s) of an older revision keep serving",
        )
    if rollout is not None and rollout.outdated:
        return (
            "True",
            Reason.ROLLING_OUT,
            f"{rollout.updated} group(s) of revision {rollout.revision}, {rollout.outdated} of an older one"
            + (f"; {summary}" if summary else ""),
        )
    not_starting = _containers_not_starting(plan.groups)
    if not_starting:
        return "True", Reason.CONTAINERS_NOT_STARTING, "; ".join(not_starting)
    phase = next(((state, reason) for state, reason in _PHASES if counts[state]), None)
    if phase is not None and phase[0] == "Placing" and _awaiting_nodes(plan.groups):
        return "True", Reason.NODES_PROVISIONING, summary + _awaiting_nodes(plan.groups)
    if phase is not None:
        return "True", phase[1], summary + _waits(plan.groups)
    return "False", Reason.STABLE, "no group is placing, starting or draining"


def _summary(counts: Counter[str]) -> str:
    parts = [
        f"{counts[state]} {state.lower()}"
        for state in ("Placing", "Provisioning", "Warming", "Draining", "Failed")
        if counts[state]
    ]
    return ", ".join(parts)


# Warming groups whose wait the Progressing condition spells out (the rest are counted).
_WAITS_SHOWN = 3


def _awaiting_nodes(groups: Iterable[Assessment]) -> str:
    """Which placing groups wait for a node autoscaler (`placement.nodeProvisioning`), if any."""
    waiting = [g.name for g in groups if g.state == "Placing" and g.reason == Reason.NODES_PROVISIONING]
    return f"; group(s) {', '.join(waiting)} waiting for new nodes" if waiting else ""


def _waits(groups: Iterable[Assessment]) -> str:
    """What warming groups wait for, rank by rank (see `assess`): a readiness check that nothing on
    the cluster answers shows in `kubectl describe` without reading pod annotations."""
    warming = [group for group in groups if group.state == "Warming" and group.message]
    shown = "".join(f"; group {group.name}: {group.message}" for group in warming[:_WAITS_SHOWN])
    more = len(warming) - _WAITS_SHOWN
    return shown + (f"; {more} more warming" if more > 0 else "")


def _degraded(groups: Iterable[Assessment]) -> tuple[str, str] | None:
    """Degraded while a group is failed, or its replacement is not ready yet."""
    groups = list(groups)
    failed = [group for group in groups if group.state == "Failed"]
    if failed:
        return failed[0].reason or Reason.GROUP_FAILED, "; ".join(
            f"group {group.name}: {group.message}" for group in failed
        )
    replacing = [group for group in groups if group.replaces and group.state != "Ready"]
    if replacing:
        return Reason.GROUP_FAILED, "; ".join(
            f"group {group.name} replaces failed group {group.replaces} ({group.state.lower()})"
            for group in replacing
        )
    return None
