"""A group's state from its pods alone: the observed transitions (Bound, Started, failures).

Deterministic: the same pods, rules and `now` give the same assessment, so a restarted operator
picks up exactly where the last one stopped.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime

from goodput.api.reasons import Reason
from goodput.controllers import naming
from goodput.controllers.groups.lifecycle import GroupEvent
from goodput.controllers.groups.model import (
    Assessment,
    World,
    latest,
    ranks_text,
    seconds_between,
)
from goodput.controllers.groups.observation import PodView


def assess_group(name: str, pods: Iterable[PodView], world: World) -> Assessment | None:
    """The state of one group; None when every pod is already terminating (the group is gone).

    The checks run in the lifecycle's order: a broken rank fails the group whatever its phase;
    then Placing until every pod is bound, Provisioning until every rank runs, and past that
    Draining, Ready or Warming.
    """
    everything = sorted(pods, key=lambda pod: pod.rank)
    live = tuple(pod for pod in everything if not pod.deleting)
    if not live:
        return None
    base = _base(name, live, world)
    if base.drain_outcome is not None:
        # The drain's end is decided and written: its ranks are leaving (some may be gone already),
        # so a missing rank is the deletion's progress, not a failure.
        return _draining(base)
    broken = _broken_rank(name, everything, live, world)
    if broken is not None:
        return _failed(base, *broken)
    if any(pod.gated for pod in live) or not all(pod.node_name for pod in live):
        return _placing(base, world)
    scheduled_at = latest(pod.scheduled.last_transition if pod.scheduled else None for pod in live)
    base = replace(base, scheduled_at=scheduled_at)
    if not all(pod.running_and_ready for pod in live):
        return _provisioning(base, world)
    running_at = latest(
        pod.containers_ready.last_transition if pod.containers_ready else None for pod in live
    )
    return _running(replace(base, running_at=running_at), world)


def _base(name: str, live: tuple[PodView, ...], world: World) -> Assessment:
    """What every state shares: the group's identity, age, domain and drain marks."""
    return Assessment(
        name=name,
        state="Placing",
        pods=live,
        domain=next((pod.topology_domain for pod in live if pod.topology_domain), None),
        created_at=min((pod.created_at for pod in live if pod.created_at), default=world.now),
        replaces=next((pod.replaces for pod in live if pod.replaces), None),
        outdated=any(pod.revision != world.template.revision for pod in live),
        draining_since=_draining_since(live, world),
        drain_progress=next((pod.drain_progress for pod in live if pod.rank == 0), None),
        drain_outcome=next((pod.drain_outcome for pod in live if pod.drain_outcome), None),
    )


def _draining_since(live: tuple[PodView, ...], world: World) -> datetime | None:
    """When the group's drain began: the earliest draining-since mark on any rank (a drain start
    cut short marks only some). A group-ready gate that is False with no mark anywhere was closed by
    an operator that wrote no intent first (an older version, or a hand edit): the group has left
    service, so it is judged Draining from the gate's time and the drain resumed, never taken for a
    Warming group that may be deleted at once."""
    marked = min((pod.draining_since for pod in live if pod.draining_since), default=None)
    if marked is not None:
        return marked
    closed = [pod.group_ready for pod in live if pod.group_ready and pod.group_ready.status == "False"]
    if not closed:
        return None
    return min((gate.last_transition or world.now for gate in closed), default=world.now)


def _draining(base: Assessment) -> Assessment:
    since = base.draining_since or (base.drain_outcome.record.started_at if base.drain_outcome else None)
    message = f"draining since {since.isoformat()}" if since else "draining"
    if base.drain_outcome is not None:
        message = f"drain ended ({base.drain_outcome.record.outcome}); removing every rank"
    return replace(
        base, state="Draining", draining_since=since, reason=Reason.GROUPS_DRAINING, message=message
    )


def _failed(
    base: Assessment, reason: str, message: str, cause: GroupEvent = GroupEvent.RANK_FAILED
) -> Assessment:
    return replace(base, state="Failed", reason=reason, message=message, failure=cause)


def _broken_rank(
    name: str, everything: list[PodView], live: tuple[PodView, ...], world: World
) -> tuple[str, str] | None:
    """Why a rank is lost (RankFailed from any state), or None: missing, or a fault of one rank."""
    missing = sorted(set(range(world.template.pods_per_group)) - {pod.rank for pod in live})
    if len(live) < len(everything) or missing:
        gone = sorted({pod.rank for pod in everything if pod.deleting} | set(missing))
        return Reason.GROUP_FAILED, f"group {name} is incomplete: rank {ranks_text(gone)} missing"
    for pod in live:
        fault = _rank_fault(pod, world)
        if fault is not None:
            return fault
    return None


def _rank_fault(pod: PodView, world: World) -> tuple[str, str] | None:
    """What is wrong with one rank, if anything: it ended, restarted, sits on a node that is not
    ready, lost NCCL health, or its health agent reported a critical GPU fault or a hung engine. Any
    one rank's fault fails the whole group, which is then replaced."""
    if pod.terminated:
        return Reason.GROUP_FAILED, f"rank {pod.rank} ({pod.name}) ended with phase {pod.phase}"
    if pod.restarts > 0:
        return Reason.GROUP_FAILED, f"rank {pod.rank} ({pod.name}) restarted {pod.restarts} time(s)"
    if pod.node_name and pod.node_name not in world.ready_nodes:
        return (
            Reason.GROUP_FAILED,
            f"rank {pod.rank} ({pod.name}) is on node {pod.node_name}, which is not ready",
        )
    if world.rules.nccl_required and pod.nccl_healthy is not None and pod.nccl_healthy.status == "False":
        check = pod.nccl_healthy
        detail = ": ".join(part for part in (check.reason, check.message) if part)
        return Reason.NCCL_UNHEALTHY, f"rank {pod.rank} ({pod.name}) lost NCCL health" + (
            f" ({detail})" if detail else ""
        )
    if pod.gpu_healthy is not None and pod.gpu_healthy.status == "False":
        return (
            Reason.GPU_UNHEALTHY,
            f"rank {pod.rank} ({pod.name}) has a GPU fault: {pod.gpu_healthy.message}",
        )
    if pod.engine_healthy is not None and pod.engine_healthy.status == "False":
        return (
            Reason.ENGINE_UNHEALTHY,
            f"rank {pod.rank} ({pod.name}) engine hung: {pod.engine_healthy.message}",
        )
    return None


def _placing(base: Assessment, world: World) -> Assessment:
    """Not every pod bound: Placing, or Failed (ScheduleTimedOut) past the schedule timeout."""
    rules = world.rules
    live = base.pods
    if base.waits_for_new_nodes and not any(pod.gated for pod in live):
        return _awaiting_nodes(base, world)
    if seconds_between(base.created_at, world.now) > rules.schedule_timeout_seconds:
        return _failed(
            base,
            Reason.SCHEDULE_TIMEOUT,
            f"not every pod was bound within {rules.schedule_timeout_seconds:g}s"
            f"{_unschedulable_detail(live)}",
            GroupEvent.SCHEDULE_TIMED_OUT,
        )
    gated = any(pod.gated for pod in live)
    message = (
        "waiting for the gang to be released"
        if gated
        else f"waiting for the scheduler{_unschedulable_detail(live)}"
    )
    return replace(base, state="Placing", reason=Reason.GROUPS_PLACING, message=message, gated=gated)


def _awaiting_nodes(base: Assessment, world: World) -> Assessment:
    """Pending for new nodes: Placing (reason NodesProvisioning), or Failed (NodesNotProvisioned)
    once not every pod is bound within the provisioning timeout. The failure deletes the whole
    group, so a node that did come holds no partial group for long, and the node autoscaler's
    consolidation takes it back."""
    timeout = world.rules.provisioning_timeout_seconds
    detail = _unschedulable_detail(base.pods)
    if seconds_between(base.created_at, world.now) > timeout:
        bound = sum(1 for pod in base.pods if pod.node_name)
        return _failed(
            base,
            Reason.NODE_PROVISIONING_TIMEOUT,
            f"{bound}/{len(base.pods)} pod(s) bound to nodes within {timeout:g}s of asking a node "
            f"autoscaler for nodes{detail}; check that a Karpenter NodePool or a cluster-autoscaler node "
            "group can create nodes with the group's GPUs and labels (its limits, instance types and "
            "requirements), or raise spec.placement.nodeProvisioning.provisioningTimeoutSeconds",
            GroupEvent.NODES_NOT_PROVISIONED,
        )
    return replace(
        base,
        state="Placing",
        reason=Reason.NODES_PROVISIONING,
        message=f"waiting for a node autoscaler to create nodes{detail}",
    )


def _startup_overdue(base: Assessment, world: World) -> bool:
    started = base.scheduled_at or base.created_at
    return seconds_between(started, world.now) > world.rules.startup_timeout_seconds


def _provisioning(base: Assessment, world: World) -> Assessment:
    """Bound (the Bound transition) but not every rank running: Provisioning, or Failed
    (StartupTimedOut) past the start-up timeout."""
    if _startup_overdue(base, world):
        return _failed(
            base,
            Reason.GROUP_FAILED,
            f"ranks not running and ready within {world.rules.startup_timeout_seconds:g}s of scheduling",
            GroupEvent.STARTUP_TIMED_OUT,
        )
    waiting = [pod.rank for pod in base.pods if not pod.running_and_ready]
    return replace(
        base,
        state="Provisioning",
        reason=Reason.GROUPS_PROVISIONING,
        message=f"rank {ranks_text(waiting)} starting",
    )


def _running(base: Assessment, world: World) -> Assessment:
    """Every rank running (the Started transition): Draining, Ready, or Warming until its checks and
    warm-up pass, Failed (StartupTimedOut) past the start-up timeout."""
    live = base.pods
    if base.draining_since is not None:
        return _draining(base)
    if all(pod.marked_group_ready for pod in live):
        ready_at = min(pod.group_ready.last_transition or world.now for pod in live if pod.group_ready)
        return replace(base, state="Ready", reason=Reason.GROUPS_READY, ready_at=ready_at, checks_passed=True)
    checks_blocker = _readiness_blocker(live, world)
    blocker = checks_blocker
    outcome = world.warmups.get(base.name)
    if blocker is None and outcome is not None and not outcome.succeeded:
        blocker = (Reason.WARMUP_FAILED, f"warm-up through the leader failed: {outcome.message}")
    if _startup_overdue(base, world):
        reason, message = blocker or (Reason.WARMUP_FAILED, "warm-up did not complete")
        return _failed(
            base,
            reason,
            f"not ready within {world.rules.startup_timeout_seconds:g}s of scheduling: {message}",
            GroupEvent.STARTUP_TIMED_OUT,
        )
    leader = live[0]
    reason, message = blocker or (
        Reason.GROUPS_WARMING,
        f"rank 0 ({leader.name}) waits for a warm-up completion through the leader",
    )
    return replace(
        base, state="Warming", reason=reason, message=message, checks_passed=checks_blocker is None
    )


def _readiness_blocker(pods: tuple[PodView, ...], world: World) -> tuple[str, str] | None:
    """What still keeps running ranks from serving (before the warm-up), or None: which rank waits
    for which signal, and which spec field asks for it, so a cluster without the health agent
    shows at once why its groups never become ready."""
    rules = world.rules
    if rules.nccl_required:
        waiting = [pod for pod in pods if pod.nccl_healthy is None or pod.nccl_healthy.status != "True"]
        if waiting:
            return (
                Reason.GROUPS_WARMING,
                f"{_ranks_of(waiting)} {_wait(waiting)} for pod condition "
                f"{naming.CONDITION_NCCL_HEALTHY}=True (spec.readiness.ncclCheck: Required)"
                + _agent_word(waiting),
            )
    if rules.revision_check:
        unreported = [pod for pod in pods if pod.reported_model_revision is None]
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
                f"{_ranks_of(unreported)} {_wait(unreported)} for annotation "
                f"{naming.ANNOTATION_MODEL_REVISION}={rules.model_revision} "
                "(spec.readiness.revisionCheck: true)",
            )
    return None


def _ranks_of(pods: list[PodView]) -> str:
    return ", ".join(f"rank {pod.rank} ({pod.name})" for pod in pods)


def _agent_word(pods: list[PodView]) -> str:
    """What the first waiting rank's health agent said, when it said something (a check it could not
    run says why, and what would fix it)."""
    for pod in pods:
        said = pod.nccl_healthy
        if said is not None and said.message:
            return f"; {pod.name}: {said.reason}: {said.message}"
    return ""


def _wait(pods: list[PodView]) -> str:
    return "waits" if len(pods) == 1 else "wait"


def _unschedulable_detail(pods: Iterable[PodView]) -> str:
    """The scheduler's word on a pod it cannot place, with the spec field to check when the cause is
    in the ModelGroup (a PersistentVolumeClaim that does not exist or is not bound)."""
    for pod in pods:
        if pod.scheduled is not None and pod.scheduled.status == "False" and pod.scheduled.message:
            field = " (check spec.pod.volumes)" if "persistentvolumeclaim" in pod.scheduled.message else ""
            return f" ({pod.name}: {pod.scheduled.message}{field})"
    return ""
