"""The decisions of one tick, as pure stages called in a fixed order.

failures → readiness → drains → scale. Each stage takes the `Tick` so far and returns a new one with
the transitions it decided (`lifecycle`); none emits an action. Because victims are chosen (in
scale) before any action is derived (`actions`), no stage takes back what another emitted: a group
that became ready and was chosen for scale-in in the same tick is never marked ready.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import cast

from goodput.api.modelgroup import ACTIVE_STATES, RECENT_DRAINS, DrainRecord
from goodput.api.reasons import NoFitReason, Reason
from goodput.controllers import naming
from goodput.controllers.groups.assess import assess_group
from goodput.controllers.groups.drain import (
    CandidateState,
    DecidedDrain,
    DrainProgress,
    DrainStep,
    DrainView,
    KeepDraining,
    LeaderReading,
    LeaderSample,
    RemoveGroup,
    ScaleInCandidate,
    choose_victims,
    stale_loads,
    step_drain,
)
from goodput.controllers.groups.lifecycle import GroupEvent, GroupTransition, transition
from goodput.controllers.groups.model import (
    Assessment,
    DomainBackoff,
    GroupCreation,
    RolloutProgress,
    World,
    group_key,
    seconds_between,
)
from goodput.controllers.groups.observation import PodView, parse_pod
from goodput.controllers.groups.placement import (
    GroupShape,
    Inventory,
    NoFit,
    Placed,
    PlacementRules,
    ProvisionNodes,
    place_group,
    provision_or_limit,
)
from goodput.controllers.groups.pods import render_group


@dataclass(frozen=True, slots=True)
class Tick:
    """One tick's decisions so far.

    observed: every group as its pods show it, before any decision.
    groups: every group that still exists after the decisions so far (Failed ones until deleted),
    by name. transitions: the moves decided, in order. The rest is what a later step needs to turn
    a transition into actions: the drain step of each draining group, the new groups' manifests,
    the victims and the leaders to read before a ready group may be chosen.
    """

    world: World
    observed: Mapping[str, Assessment]
    groups: Mapping[str, Assessment]
    transitions: tuple[GroupTransition, ...] = ()
    backoffs: tuple[DomainBackoff, ...] = ()
    became_ready: tuple[Assessment, ...] = ()
    drain_steps: Mapping[str, DrainStep] = field(default_factory=dict)
    # Drains whose end is decided but not yet in `status.drain.recent`: recorded before deletion.
    drains_ending: Mapping[str, DecidedDrain] = field(default_factory=dict)
    creations: tuple[GroupCreation, ...] = ()
    victims: Mapping[str, ScaleInCandidate] = field(default_factory=dict)
    unread_leaders: tuple[str, ...] = ()
    placement_limit: NoFit | None = None
    group_counter: int = 0
    rollout: RolloutProgress | None = None

    def moved(self, group: Assessment | None, step: GroupTransition, **changes: object) -> Tick:
        """The tick with `step` recorded and the group's new assessment (None: it is deleted)."""
        groups = dict(self.groups)
        if group is None:
            groups.pop(step.group, None)
        else:
            groups[step.group] = group
        return replace(self, groups=groups, transitions=(*self.transitions, step), **changes)  # type: ignore[arg-type]

    def in_state(self, *states: str) -> list[Assessment]:
        return [group for group in self.groups.values() if group.state in states]

    @property
    def active(self) -> list[Assessment]:
        return [group for group in self.groups.values() if group.state in ACTIVE_STATES]

    @property
    def stalled(self) -> bool:
        """The rollout stopped: groups of the current template failed too often."""
        return self.rollout is not None and self.rollout.failed >= self.world.rollout.failure_limit

    @property
    def rolling(self) -> bool:
        """Groups of an older template serve or are on their way, and the rollout may proceed."""
        return not self.stalled and any(group.outdated for group in self.active)


def start(world: World) -> Tick:
    """Every group as its pods show it, in ordinal order; expired back-offs dropped."""
    by_group: dict[str, list[PodView]] = {}
    for pod in world.pods:
        by_group.setdefault(pod.group, []).append(pod)
    groups = {
        name: assessed
        for name in sorted(by_group, key=group_key)
        if (assessed := assess_group(name, by_group[name], world)) is not None
    }
    # Terminating groups count too: a name is never reused while a pod of it may still exist.
    counter = max(world.group_counter, max(((naming.group_ordinal(g) or 0) + 1 for g in by_group), default=0))
    return Tick(
        world=world,
        observed=groups,
        groups=groups,
        backoffs=tuple(b for b in world.backoffs if b.until > world.now),
        group_counter=counter,
        rollout=_progress(world),
    )


def _progress(world: World) -> RolloutProgress:
    """The recorded rollout when it is to the current template; a new template starts afresh."""
    recorded = world.rollout_progress
    revision = world.template.revision
    return recorded if recorded is not None and recorded.revision == revision else RolloutProgress(revision)


def failures(tick: Tick) -> Tick:
    """Failed groups leave the ready count at once and are deleted whole (Replaced); a group that
    could not be scheduled backs its domain off."""
    world = tick.world
    for group in tick.in_state("Failed"):
        backoffs = tick.backoffs
        if group.failure is GroupEvent.NODES_NOT_PROVISIONED:
            # No new nodes came: ask again only after the back-off, never in a tight loop.
            until = world.now + timedelta(seconds=world.rules.backoff_seconds)
            backoffs = (
                *(b for b in backoffs if b.domain != naming.NEW_NODES_DOMAIN),
                DomainBackoff(naming.NEW_NODES_DOMAIN, until, NoFitReason.NODE_PROVISIONING_TIMEOUT),
            )
        elif group.schedule_timed_out and group.domain:
            # The scheduler's own words say whether GPUs were what was missing.
            cause = NoFitReason.INSUFFICIENT_GPUS if naming.GPU_RESOURCE in group.message else group.reason
            until = world.now + timedelta(seconds=world.rules.backoff_seconds)
            backoffs = (
                *(b for b in backoffs if b.domain != group.domain),
                DomainBackoff(group.domain, until, cause),
            )
        rollout = tick.rollout
        old_serving = any(g.outdated and g.state in ACTIVE_STATES for g in tick.observed.values())
        if rollout is not None and not group.outdated and old_serving:
            rollout = replace(rollout, failed=rollout.failed + 1)
        step = transition(group.name, "Failed", GroupEvent.REPLACED, group.message)
        tick = tick.moved(group, step, backoffs=backoffs, rollout=rollout)
    return tick


def readiness(tick: Tick) -> Tick:
    """Warming groups whose checks passed and whose warm-up succeeded become Ready (WarmedUp)."""
    now = tick.world.now
    for group in tick.in_state("Warming"):
        outcome = tick.world.warmups.get(group.name)
        if not group.checks_passed or outcome is None or not outcome.succeeded:
            continue
        ready = replace(group, state="Ready", reason=Reason.GROUPS_READY, message="", ready_at=now)
        times = ready.ready_times()
        assert times is not None  # ready_at is set
        phases = ready.ready_breakdown(now, ranks_checked=tick.world.rules.nccl_required).phases
        by_phase = ", ".join(
            f"{p.phase} {'unknown' if p.seconds is None else f'{p.seconds:.1f}s'}" for p in phases
        )
        message = (
            f"group {group.name} ready in {times.total_seconds:.1f}s (placing "
            f"{times.placing_seconds:.1f}s, provisioning {times.provisioning_seconds:.1f}s, "
            f"warming {times.warming_seconds:.1f}s; {by_phase})"
        )
        step = transition(group.name, "Warming", GroupEvent.WARMED_UP, message)
        tick = tick.moved(ready, step, became_ready=(*tick.became_ready, ready))
    return tick


def drains(tick: Tick) -> Tick:
    """Draining groups leave when their leader is idle after routing stopped, or at the time limit
    (Drained / DrainTimedOut); the others record how far their drain got.

    A drain's end is decided once and kept on its ranks (`DecidedDrain`); the group is
    deleted only in a pass that finds that record in `status.drain.recent`, so an operator killed
    between the decision, the status write and the deletion neither loses nor repeats it."""
    world = tick.world
    policy = world.rules.drain_policy()
    steps = dict(tick.drain_steps)
    ending = dict(tick.drains_ending)
    # Drains already ended on their ranks first: at most RECENT_DRAINS may await their record.
    draining = sorted(tick.in_state("Draining"), key=lambda g: (g.drain_outcome is None, group_key(g.name)))
    for group in draining:
        decided = group.drain_outcome
        if decided is None:
            step = step_drain(_drain_view(group, world), policy, world.now)
            if isinstance(step, RemoveGroup) and len(ending) >= RECENT_DRAINS:
                waiting = "drain over: waiting a pass for other drains to be recorded first"
                step = KeepDraining("ReadingLeader", waiting, group.drain_progress or DrainProgress(), True)
            steps[group.name] = step
            if isinstance(step, KeepDraining):
                groups = {
                    **tick.groups,
                    group.name: replace(group, message=step.message, drain_progress=step.progress),
                }
                tick = replace(tick, groups=groups)
                continue
            decided = _outcome(group, step, world)
        if group.name in world.recorded_drains:
            event = GroupEvent.DRAIN_TIMED_OUT if decided.record.outcome == "TimedOut" else GroupEvent.DRAINED
            tick = tick.moved(None, transition(group.name, "Draining", event, decided.message))
        else:
            ending[group.name] = decided
            leaving = replace(group, drain_outcome=decided, message=f"drain ended: {decided.message}")
            tick = replace(tick, groups={**tick.groups, group.name: leaving})
    return replace(tick, drain_steps=steps, drains_ending=ending)


def _drain_view(group: Assessment, world: World) -> DrainView:
    started_at = group.draining_since or world.now
    acting_since = world.acting_since
    return DrainView(
        group=group.name,
        started_at=started_at,
        routed_pods=tuple(pod.name for pod in group.pods if pod.name in world.routed_pods),
        progress=group.drain_progress or DrainProgress(),
        reading=world.leader_readings.get(group.name),
        last_sample=world.leader_samples.get(group.name),
        leader_reachable=group.pods[0].ip is not None,
        resumed_at=acting_since if acting_since is not None and started_at < acting_since else None,
    )


def _outcome(group: Assessment, step: RemoveGroup, world: World) -> DecidedDrain:
    """The drain's end as `status.drain.recent` will hold it (times to the second, the duration to
    the tenth): what is written on the ranks reads back equal to what was decided."""
    record = DrainRecord(
        group=group.name,
        outcome=step.outcome,
        started_at=group.draining_since or world.now,
        ended_at=world.now,
        duration_seconds=round(step.duration_seconds, 1),
        requests_finished=step.requests_finished,
        requests_aborted=step.requests_aborted,
        on_timeout=world.rules.drain_on_timeout if step.outcome == "TimedOut" else None,
    )
    return DecidedDrain(record=record, message=step.message)


def scale(tick: Tick) -> Tick:
    """Make up the shortfall (drains cancelled first, then new groups) or remove the surplus."""
    shortfall = tick.world.desired_groups - len(tick.active)
    if shortfall > 0:
        tick = _cancel_drains(tick, shortfall)
        return _create(tick, tick.world.desired_groups - len(tick.active))
    # Removing old groups shrinks the surge a rollout may keep: scale in again until both agree.
    for _ in range(len(tick.active)):
        surplus = len(tick.active) - tick.world.desired_groups - _surge_in_use(tick)
        if surplus <= 0:
            break
        after = _scale_in(tick, surplus)
        if after.transitions == tick.transitions:
            return after  # the rest is spared (minimum lifetime) or waits for leader readings
        tick = after
    return tick


def _surge_in_use(tick: Tick) -> int:
    """Groups a rollout may run beyond `replicas`: never more than the old groups left to replace."""
    if not tick.rolling:
        return 0
    outdated = sum(1 for group in tick.active if group.outdated)
    return min(tick.world.rollout.max_surge, outdated)


def _cancel_drains(tick: Tick, shortfall: int) -> Tick:
    """A draining group is warm, whole and healthy (else it would be Failed): putting it back in
    service (ScaledOut) always beats creating a new one. The drain begun last has lost the least."""
    now = tick.world.now
    # A group of an older template drained by a rollout goes back only if the rollout stopped.
    reusable = [
        g
        for g in tick.in_state("Draining")
        if (not g.outdated or tick.stalled) and g.drain_outcome is None and g.name not in tick.drains_ending
    ]
    draining = sorted(reusable, key=lambda g: (g.draining_since or now, g.ordinal), reverse=True)
    for group in draining[:shortfall]:
        message = (
            f"group {group.name} back in service after "
            f"{seconds_between(group.draining_since or now, now):.1f}s of draining: a scale-out needs it, "
            "and it is whole, healthy and warm"
        )
        restored = replace(
            group,
            state="Ready",
            draining_since=None,
            drain_progress=None,
            reason=Reason.GROUPS_READY,
            message="",
        )
        tick = tick.moved(restored, transition(group.name, "Draining", GroupEvent.SCALED_OUT, message))
    return tick


def _create(tick: Tick, shortfall: int) -> Tick:
    """New complete groups (Created), each placed on the inventory as the previous one left it;
    stops at the first group that does not fit, and says why."""
    world = tick.world
    template = world.template
    inventory = world.inventory
    spread_counts = _spread_counts(tick.active, inventory, world.placement)
    # Each failed group is replaced once, also when both scale and the rollout create this tick.
    claimed = {group.replaces for group in tick.groups.values() if group.replaces}
    replaced = [
        step.group
        for step in tick.transitions
        if step.event is GroupEvent.REPLACED and step.group not in claimed
    ]
    shape = GroupShape(template.pods_per_group, template.gpus_per_pod, template.gpu_resource)
    for _ in range(shortfall):
        decision = _place_or_provision(tick, inventory, shape, spread_counts)
        if isinstance(decision, NoFit):
            return replace(tick, placement_limit=decision)
        name = naming.group_name(tick.group_counter)
        replaces = replaced.pop(0) if replaced else None
        if isinstance(decision, Placed):
            domain = decision.domain
            inventory = inventory.with_group(world.placement.topology_key, domain, shape)
            spread_counts[decision.spread_value] = spread_counts.get(decision.spread_value, 0) + 1
            where = f"in {world.placement.topology_key}={domain}"
        else:
            domain = naming.NEW_NODES_DOMAIN
            where = f"for new nodes ({decision.why.message})"
        manifests = render_group(template, name, domain, replaces)
        # As the next pass will see it: every pod created, the gang released, none bound yet.
        created = [
            replace(view, created_at=world.now, gated=False)
            for manifest in manifests.pods
            if (view := parse_pod(manifest)) is not None
        ]
        group = assess_group(name, created, world) or Assessment(name, "Placing", (), domain, world.now)
        message = f"group {name} created {where} ({shape.pods} pod(s) × {shape.gpus_per_pod} GPU(s))" + (
            f", replacing {replaces}" if replaces else ""
        )
        creation = GroupCreation(name, domain, manifests.service, manifests.pods, manifests.claim_template)
        tick = tick.moved(
            group,
            transition(name, None, GroupEvent.CREATED, message),
            creations=(*tick.creations, creation),
            group_counter=tick.group_counter + 1,
        )
    return tick


def _place_or_provision(
    tick: Tick, inventory: Inventory, shape: GroupShape, spread_counts: Mapping[str, int]
) -> Placed | ProvisionNodes | NoFit:
    """An existing domain for the next group; else new nodes, where the spec asks for them and no
    recent request for nodes timed out; else why not."""
    world = tick.world
    backed_off = frozenset(b.domain for b in tick.backoffs)
    decision = place_group(
        inventory, shape, world.placement, groups_by_spread_value=spread_counts, backed_off=backed_off
    )
    if isinstance(decision, Placed):
        return decision
    nodes_backoff = next((b.until for b in tick.backoffs if b.domain == naming.NEW_NODES_DOMAIN), None)
    return provision_or_limit(decision, world.placement, nodes_backoff)


def _scale_in(tick: Tick, surplus: int) -> Tick:
    """The cheapest groups leave (ScaledIn): a ready group drains, one not serving yet is deleted.

    Ready groups are compared by their leaders' load: when a ready group would be chosen, every
    ready leader not read lately is read first, and the choice among ready groups waits a pass.
    """
    world = tick.world
    active = tick.active
    candidates = [
        ScaleInCandidate(
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
        surplus,
        now=world.now,
        min_lifetime_seconds=world.rules.min_lifetime_seconds,
        may_ignore_lifetime=len(active) if world.deleting else over_max,
    )
    unread = tuple(stale_loads(candidates, world.leader_readings, world.now))
    if unread and any(victim.state == "Ready" for victim in victims):
        tick = replace(tick, unread_leaders=unread)
        victims = tuple(victim for victim in victims if victim.state != "Ready")
    for victim in victims:
        tick = _remove(tick, tick.groups[victim.name], victim)
    return tick


def _remove(tick: Tick, chosen: Assessment, victim: ScaleInCandidate) -> Tick:
    tick = replace(tick, victims={**tick.victims, chosen.name: victim})
    if chosen.state == "Ready":
        message = f"group {chosen.name} draining for scale-in: {_why_chosen(victim)}"
        draining = replace(
            chosen,
            state="Draining",
            draining_since=tick.world.now,
            drain_progress=DrainProgress(),
            reason=Reason.GROUPS_DRAINING,
            message="draining: closing admission",
        )
        return tick.moved(draining, transition(chosen.name, "Ready", GroupEvent.SCALED_IN, message))
    message = f"group {chosen.name} ({chosen.state.lower()}) deleted for scale-in"
    return tick.moved(None, transition(chosen.name, chosen.state, GroupEvent.SCALED_IN, message))


def _sample(reading: LeaderReading | None) -> LeaderSample | None:
    return reading if isinstance(reading, LeaderSample) else None


def _why_chosen(victim: ScaleInCandidate) -> str:
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


def rollout(tick: Tick) -> Tick:
    """Replace groups of an older pod template: remove old groups (Outdated) while enough stay
    ready, then create current ones while the surge allows. A rollout whose new groups keep
    failing stops here, and the old groups keep serving."""
    if not tick.rolling:
        return tick
    world = tick.world
    rules = world.rollout
    old_coming = [g for g in tick.active if g.outdated and g.state != "Ready"]
    for group in sorted(old_coming, key=lambda g: -g.ordinal):
        message = f"group {group.name} ({group.state.lower()}) deleted: its pods are of an older revision"
        tick = tick.moved(None, transition(group.name, group.state, GroupEvent.OUTDATED, message))
    ready = [g for g in tick.active if g.state == "Ready"]
    spare = len(ready) - max(0, world.desired_groups - rules.max_unavailable)
    old_ready = sorted((g for g in ready if g.outdated), key=lambda g: (g.ready_at or world.now, g.ordinal))
    for group in old_ready[: max(0, spare)]:
        tick = _outdate(tick, group)
    updated = sum(1 for g in tick.active if not g.outdated)
    room = min(world.desired_groups + rules.max_surge - len(tick.active), world.desired_groups - updated)
    return _create(tick, room) if room > 0 else tick


def _outdate(tick: Tick, group: Assessment) -> Tick:
    message = (
        f"group {group.name} draining for the rollout to revision {tick.world.template.revision}: "
        "enough groups of the current revision are ready"
    )
    draining = replace(
        group,
        state="Draining",
        draining_since=tick.world.now,
        drain_progress=DrainProgress(),
        reason=Reason.GROUPS_DRAINING,
        message="draining: closing admission",
    )
    return tick.moved(draining, transition(group.name, "Ready", GroupEvent.OUTDATED, message))


STAGES = (failures, readiness, drains, scale, rollout)


def decide(world: World) -> Tick:
    """Every stage, in order."""
    tick = start(world)
    for stage in STAGES:
        tick = stage(tick)
    return tick


__all__ = ["STAGES", "KeepDraining", "Tick", "decide"]
