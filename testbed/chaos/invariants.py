"""The chaos run's invariants: rules over a frozen observation of the cluster, checked every second.

Pure: `check(observation, state, rules)` takes what the API server held at one instant (pods,
ModelGroup specs and statuses) plus the checker's memory of earlier instants, and returns the
violations it found and the new memory. `account_streams` compares, at the end, what the load
generator saw fail with what the operator counted as aborted. Times are unix seconds throughout.

The rules (issue #18, item 1):
- `too-many-groups`: groups in service or on their way (not draining, not failed, not being deleted)
  never exceed the most `spec.replicas` of the last `react_seconds` plus `maxSurge`;
- `incomplete-group`: no pod outlives `incomplete_grace_seconds` outside a complete group (every
  rank present, none being deleted while others are not);
- `duplicate-rank` / `group-name-reused`: no two live pods hold one rank of one group, and a group
  name once deleted never comes back;
- `scale-in-on-stale-metrics`: no applied scale-in decision made while Prometheus was down, slow
  or missing series (`metrics_faults`, from the injector's record);
- `decision-not-recorded`: every change of an autoscaled ModelGroup's `spec.replicas` has a
  decision record with that target in status (or a SuccessfulRescale Event) within `record_grace_seconds`;
- `stream-lost` / `aborted-miscounted` (`account_streams`): every failed or cut stream was either
  ended by an injected fault on its group or by a drain that timed out, and the operator counted
  every one of the latter as aborted. The operator counts what the leader still held at its last
  reading (taken at or after the drain's deadline) before deleting the ranks, so it may count more:
  a request that finished in the moment between that reading and the shutdown. Every such extra is
  a stream the clients saw end ok on that group after its deadline; any other difference is a
  violation. A timed-out drain whose record leaves its aborted count out (its leader could not be
  read) explains the streams it ended, which are reported apart and compared with no count: an
  unknown count is not 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from goodput.api.times import parse_rfc3339
from goodput.testbed.loadgen import FAILED_OUTCOMES


@dataclass(frozen=True, slots=True)
class PodView:
    name: str
    group: str
    rank: int
    deleting: bool = False
    draining: bool = False
    """The pod carries `goodput.dev/draining-since`: its group is being drained."""
    ip: str | None = None


@dataclass(frozen=True, slots=True)
class DecisionView:
    time: float
    from_replicas: int
    to_replicas: int
    reason: str = ""
    guards: tuple[str, ...] = ()
    applied: bool = True
    """Active mode and not a shadow decision."""

    @property
    def scale_in(self) -> bool:
        return self.applied and self.to_replicas < self.from_replicas


@dataclass(frozen=True, slots=True)
class ModelGroupView:
    name: str
    replicas: int
    pods_per_group: int
    max_surge: int = 1
    autoscaled: bool = False
    pods: tuple[PodView, ...] = ()
    group_states: Mapping[str, str] = field(default_factory=dict)
    """status.groups[].state by group name (as last written by the operator)."""
    decisions: tuple[DecisionView, ...] = ()
    """status.lastDecision and status.decisions, as held now."""
    rescale_event_targets: tuple[tuple[float, int], ...] = ()
    """(time, new size) of its SuccessfulRescale Events."""


@dataclass(frozen=True, slots=True)
class Observation:
    at: float
    model_groups: tuple[ModelGroupView, ...]


@dataclass(frozen=True, slots=True)
class Window:
    start: float
    end: float
    label: str = ""

    def holds(self, at: float) -> bool:
        return self.start <= at <= self.end


@dataclass(frozen=True, slots=True)
class Rules:
    react_seconds: float = 20.0
    incomplete_grace_seconds: float = 45.0
    record_grace_seconds: float = 30.0
    decision_lead_seconds: float = 60.0
    """How long before a replica change its decision may have been made (the record is written
    with the decision's time)."""
    metrics_fault_lead_seconds: float = 3.0
    """A decision this soon after a Prometheus fault began may rest on queries answered before it."""


@dataclass(frozen=True, slots=True)
class Violation:
    rule: str
    at: float
    model_group: str
    evidence: str


@dataclass(frozen=True, slots=True)
class Deletion:
    """A group seen leaving: its pods being deleted or gone."""

    model_group: str
    group: str
    at: float
    drained: bool
    """Seen draining at or before its deletion."""


@dataclass(frozen=True, slots=True)
class ReplicaChange:
    model_group: str
    at: float
    before: int
    after: int


@dataclass(frozen=True, slots=True)
class CheckerState:
    replicas_history: tuple[tuple[float, str, int], ...] = ()
    incomplete_since: Mapping[tuple[str, str], float] = field(default_factory=dict)
    live_groups: frozenset[tuple[str, str]] = frozenset()
    draining_seen: frozenset[tuple[str, str]] = frozenset()
    gone_groups: frozenset[tuple[str, str]] = frozenset()
    deletions: tuple[Deletion, ...] = ()
    decisions_seen: frozenset[tuple[str, DecisionView]] = frozenset()
    rescales_seen: frozenset[tuple[str, float, int]] = frozenset()
    pending_changes: tuple[ReplicaChange, ...] = ()
    last_replicas: Mapping[str, int] = field(default_factory=dict)
    reported: frozenset[tuple[str, str, str]] = frozenset()
    """(rule, model group, subject) already reported, so a lasting violation is counted once."""


@dataclass(frozen=True, slots=True)
class CheckResult:
    state: CheckerState
    violations: tuple[Violation, ...]
    checks: int
    """Rule evaluations made (one per rule per ModelGroup, plus one per decision judged)."""


def live_groups(view: ModelGroupView) -> dict[str, list[PodView]]:
    groups: dict[str, list[PodView]] = {}
    for pod in view.pods:
        groups.setdefault(pod.group, []).append(pod)
    return groups


def check(
    observation: Observation,
    state: CheckerState,
    rules: Rules = Rules(),
    metrics_faults: Iterable[Window] = (),
) -> CheckResult:
    """Every rule on `observation`, given what earlier observations left in `state`."""
    found: list[Violation] = []
    checks = 0
    windows = tuple(metrics_faults)
    for view in observation.model_groups:
        state = _remember_replicas(view, observation.at, state, rules)
        for rule in (_too_many_groups, _incomplete_groups, _duplicates, _deletions):
            state, violations = rule(view, observation.at, state, rules)
            found.extend(violations)
            checks += 1
        state, violations, judged = _decisions(view, observation.at, state, rules, windows)
        found.extend(violations)
        checks += judged
    state, violations = _unrecorded_changes(observation.at, state, rules)
    found.extend(violations)
    return _once(state, found, checks)


def _once(state: CheckerState, found: list[Violation], checks: int) -> CheckResult:
    """Drop violations already reported for the same subject (the evidence's first line)."""
    fresh = []
    reported = set(state.reported)
    for violation in found:
        key = (violation.rule, violation.model_group, violation.evidence.split(":", 1)[0])
        if key not in reported:
            reported.add(key)
            fresh.append(violation)
    return CheckResult(replace(state, reported=frozenset(reported)), tuple(fresh), checks)


def _remember_replicas(view: ModelGroupView, at: float, state: CheckerState, rules: Rules) -> CheckerState:
    recent = [entry for entry in state.replicas_history if entry[0] >= at - rules.react_seconds]
    history = (*recent, (at, view.name, view.replicas))
    pending = state.pending_changes
    before = state.last_replicas.get(view.name)
    if view.autoscaled and before is not None and before != view.replicas:
        pending = (*pending, ReplicaChange(view.name, at, before, view.replicas))
    last = {**state.last_replicas, view.name: view.replicas}
    return replace(state, replicas_history=history, pending_changes=pending, last_replicas=last)


def _serving_or_coming(view: ModelGroupView) -> list[str]:
    """Groups that count against desired plus surge: none of their pods draining or being deleted,
    and not Failed or Draining in the operator's status."""
    return sorted(
        name
        for name, pods in live_groups(view).items()
        if not any(pod.deleting or pod.draining for pod in pods)
        and view.group_states.get(name) not in ("Failed", "Draining")
    )


def _too_many_groups(
    view: ModelGroupView, at: float, state: CheckerState, rules: Rules
) -> tuple[CheckerState, list[Violation]]:
    wanted = max(replicas for _, name, replicas in state.replicas_history if name == view.name)
    groups = _serving_or_coming(view)
    if len(groups) <= wanted + view.max_surge:
        return state, []
    evidence = (
        f"{len(groups)} groups: {len(groups)} groups in service or coming ({', '.join(groups)}) > "
        f"{wanted} wanted (most spec.replicas in {rules.react_seconds:g} s) + maxSurge {view.max_surge}"
    )
    return state, [Violation("too-many-groups", at, view.name, evidence)]


def _incomplete_groups(
    view: ModelGroupView, at: float, state: CheckerState, rules: Rules
) -> tuple[CheckerState, list[Violation]]:
    since = {key: t for key, t in state.incomplete_since.items() if key[0] != view.name}
    violations = []
    for name, pods in live_groups(view).items():
        ranks = sorted(pod.rank for pod in pods if not pod.deleting)
        partly_deleted = any(pod.deleting for pod in pods) and not all(pod.deleting for pod in pods)
        if ranks == list(range(view.pods_per_group)) and not partly_deleted:
            continue
        if not ranks:
            continue  # every pod of it being deleted: leaving whole
        first = state.incomplete_since.get((view.name, name), at)
        since[(view.name, name)] = first
        if at - first > rules.incomplete_grace_seconds:
            evidence = (
                f"{name}: ranks {ranks} of {view.pods_per_group} live"
                f"{', others being deleted' if partly_deleted else ''} for {at - first:.0f} s"
            )
            violations.append(Violation("incomplete-group", at, view.name, evidence))
    return replace(state, incomplete_since=since), violations


def _duplicates(
    view: ModelGroupView, at: float, state: CheckerState, rules: Rules
) -> tuple[CheckerState, list[Violation]]:
    violations = []
    holders: dict[tuple[str, int], list[str]] = {}
    for pod in view.pods:
        if not pod.deleting:
            holders.setdefault((pod.group, pod.rank), []).append(pod.name)
    for (group, rank), names in sorted(holders.items()):
        if len(names) > 1:
            evidence = f"{group}/{rank}: rank {rank} of {group} held by {sorted(names)}"
            violations.append(Violation("duplicate-rank", at, view.name, evidence))
    for group in sorted({group for group, _ in holders}):
        if (view.name, group) in state.gone_groups:
            evidence = f"{group}: group {group} was deleted earlier and has live pods again"
            violations.append(Violation("group-name-reused", at, view.name, evidence))
    return state, violations


def _deletions(
    view: ModelGroupView, at: float, state: CheckerState, rules: Rules
) -> tuple[CheckerState, list[Violation]]:
    """Remember which groups left and whether they were seen draining first (for `account_streams`)."""
    groups = live_groups(view)
    draining = set(state.draining_seen) | {
        (view.name, name) for name, pods in groups.items() if any(pod.draining for pod in pods)
    }
    leaving = {(view.name, name) for name, pods in groups.items() if all(pod.deleting for pod in pods)}
    present = {(view.name, name) for name in groups} - leaving
    earlier = {key for key in state.live_groups if key[0] == view.name}
    deletions = list(state.deletions)
    known = {(d.model_group, d.group) for d in deletions}
    for key in sorted((earlier - present) | leaving):
        if key not in known:
            deletions.append(Deletion(key[0], key[1], at, drained=key in draining))
    others = {key for key in state.live_groups if key[0] != view.name}
    return replace(
        state,
        live_groups=frozenset(others | present),
        draining_seen=frozenset(draining),
        gone_groups=state.gone_groups | frozenset((earlier - present) | leaving),
        deletions=tuple(deletions),
    ), []


def _decisions(
    view: ModelGroupView, at: float, state: CheckerState, rules: Rules, windows: tuple[Window, ...]
) -> tuple[CheckerState, list[Violation], int]:
    violations = []
    seen = set(state.decisions_seen)
    judged = 0
    for decision in view.decisions:
        if (view.name, decision) in seen:
            continue
        seen.add((view.name, decision))
        judged += 1
        if not decision.scale_in:
            continue
        for window in windows:
            if window.start + rules.metrics_fault_lead_seconds <= decision.time <= window.end:
                evidence = (
                    f"{decision.time:.1f}: scale-in {decision.from_replicas} -> {decision.to_replicas} "
                    f"({decision.reason}, guards {list(decision.guards)}) made while Prometheus was "
                    f"{window.label} ({window.start:.1f} .. {window.end:.1f})"
                )
                violations.append(Violation("scale-in-on-stale-metrics", at, view.name, evidence))
    rescales = set(state.rescales_seen) | {(view.name, t, n) for t, n in view.rescale_event_targets}
    return (
        replace(state, decisions_seen=frozenset(seen), rescales_seen=frozenset(rescales)),
        violations,
        judged,
    )


def _unrecorded_changes(at: float, state: CheckerState, rules: Rules) -> tuple[CheckerState, list[Violation]]:
    """A replica change is settled once a decision or Event with its target is seen; reported once
    `record_grace_seconds` pass without one."""
    pending = []
    violations = []
    for change in state.pending_changes:
        if _recorded(change, state, rules):
            continue
        if at - change.at <= rules.record_grace_seconds:
            pending.append(change)
            continue
        evidence = (
            f"{change.at:.1f}: spec.replicas {change.before} -> {change.after} with no decision record "
            f"or SuccessfulRescale Event for {change.after} within {rules.record_grace_seconds:g} s"
        )
        violations.append(Violation("decision-not-recorded", at, change.model_group, evidence))
    return replace(state, pending_changes=tuple(pending)), violations


def _recorded(change: ReplicaChange, state: CheckerState, rules: Rules) -> bool:
    earliest = change.at - rules.decision_lead_seconds
    latest = change.at + rules.record_grace_seconds
    if any(
        name == change.model_group
        and d.applied
        and d.to_replicas == change.after
        and earliest <= d.time <= latest
        for name, d in state.decisions_seen
    ):
        return True
    return any(
        name == change.model_group and n == change.after and earliest <= t <= latest
        for name, t, n in state.rescales_seen
    )


# --- streams -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StreamView:
    """One request as the load generator saw it."""

    target_ip: str
    sent_at: float
    ended_at: float
    outcome: str


@dataclass(frozen=True, slots=True)
class LeaderSpan:
    """A pod IP that was a group's leader from `first_seen` to `last_seen`."""

    ip: str
    model_group: str
    group: str
    first_seen: float
    last_seen: float


@dataclass(frozen=True, slots=True)
class FaultMark:
    """An injected fault that can end streams on a group (a rank crash, a hang, a lost node)."""

    model_group: str
    group: str
    at: float
    kind: str


@dataclass(frozen=True, slots=True)
class DrainCount:
    """What the operator counted for one ModelGroup over the run."""

    model_group: str
    aborted: int
    timed_out_groups: frozenset[str]
    aborted_by_group: Mapping[str, int] = field(default_factory=dict)
    """requestsAborted of each group's timed-out drain record, where the record was seen."""
    deadline_by_group: Mapping[str, float] = field(default_factory=dict)
    """When each timed-out drain reached `drain.maxSeconds` (its start plus the limit)."""
    uncounted_groups: frozenset[str] = frozenset()
    """Timed-out drains whose record leaves the aborted count out (the leader could not be read):
    the streams they ended are explained, but there is no count to compare them with."""


def drain_counts(
    statuses: Mapping[str, Mapping[str, Any]],
    records: Mapping[tuple[str, str, str], Mapping[str, Any]],
    drain_max_seconds: float,
) -> list[DrainCount]:
    """What the operator counted per ModelGroup: its last status's `drain.requestsAborted`, and the
    timed-out drain records seen over the run (by ModelGroup, group and start). A record without
    `requestsAborted` says the count is unknown: that group is uncounted, never counted as 0."""
    counts = []
    for name, status in statuses.items():
        by_group: dict[str, int] = {}
        deadlines: dict[str, float] = {}
        uncounted: set[str] = set()
        for (model_group, group, started), record in records.items():
            if model_group != name or record.get("outcome") != "TimedOut":
                continue
            if record.get("requestsAborted") is None:
                uncounted.add(group)
                continue
            by_group[group] = by_group.get(group, 0) + int(record["requestsAborted"])
            started_at = parse_rfc3339(started)
            if started_at is not None:
                deadlines[group] = started_at.timestamp() + drain_max_seconds
        aborted = int((status.get("drain") or {}).get("requestsAborted", 0))
        timed_out = frozenset(by_group) | uncounted
        counts.append(DrainCount(name, aborted, timed_out, by_group, deadlines, frozenset(uncounted)))
    return counts


@dataclass(frozen=True, slots=True)
class Accounting:
    model_group: str
    ok: int
    failed: int
    refused_at_connect: int
    """Never admitted (a stale endpoint): a router retries these elsewhere."""
    ended_by_fault: int
    ended_by_timed_out_drain: int
    counted_aborted: int
    lost: int
    """Failed streams no injected fault and no counted drain explain: the goal is 0."""
    ended_by_uncounted_drain: int = 0
    """Ended by a timed-out drain whose aborted count the operator recorded as unknown: neither
    lost nor compared with a count (an unknown count is not 0)."""


def account_streams(
    streams: Iterable[StreamView],
    leaders: Iterable[LeaderSpan],
    faults: Iterable[FaultMark],
    counts: Iterable[DrainCount],
) -> tuple[tuple[Accounting, ...], tuple[Violation, ...]]:
    """Attribute every failed stream to its group (by leader IP at the time it was sent) and to a
    cause: an injected fault on that group before it ended, or a drain of that group that timed out.
    Streams to an address no leader held are counted per ModelGroup '?'."""
    spans = tuple(leaders)
    marks = tuple(faults)
    drains = tuple(counts)
    by_model_group: dict[str, dict[str, int]] = {}
    seen_by_group: dict[tuple[str, str], int] = {}
    deadlines = {
        (c.model_group, group): at
        for c in drains
        for group, at in c.deadline_by_group.items()
        if group not in c.uncounted_groups
    }
    uncounted = {(c.model_group, group) for c in drains for group in c.uncounted_groups}
    for stream in streams:
        owner, cause = attribute(stream, spans, marks, drains)
        name = owner.model_group if owner else "?"
        tally = by_model_group.setdefault(name, _empty_tally())
        if cause == "drain" and owner is not None and (name, owner.group) in uncounted:
            cause = "drain_uncounted"
        if cause in ("ok", "connect"):
            tally[cause] += 1
            if cause == "ok" and owner is not None:
                deadline = deadlines.get((name, owner.group))
                tally["ok_after_deadline"] += deadline is not None and stream.ended_at >= deadline
            continue
        tally["failed"] += 1
        if cause in ("fault", "drain", "drain_uncounted"):
            tally[cause] += 1
        if owner is not None and cause == "drain":
            seen_by_group[(name, owner.group)] = seen_by_group.get((name, owner.group), 0) + 1
    return _settle(by_model_group, {c.model_group: c for c in drains}, seen_by_group)


def _empty_tally() -> dict[str, int]:
    return {
        "ok": 0,
        "failed": 0,
        "connect": 0,
        "fault": 0,
        "drain": 0,
        "drain_uncounted": 0,
        "ok_after_deadline": 0,
    }


def attribute(
    stream: StreamView,
    spans: tuple[LeaderSpan, ...],
    marks: tuple[FaultMark, ...],
    drains: tuple[DrainCount, ...],
) -> tuple[LeaderSpan | None, str]:
    """The group a stream went to, and its cause: 'ok', 'connect' (never admitted), 'fault', 'drain'
    or 'unexplained'."""
    owner = _owner(stream, spans)
    if stream.outcome == "ok":
        return owner, "ok"
    if stream.outcome == "connect_error" or stream.outcome not in FAILED_OUTCOMES:
        return owner, "connect"
    return owner, _cause(stream, owner, marks, drains)


def _owner(stream: StreamView, spans: tuple[LeaderSpan, ...]) -> LeaderSpan | None:
    candidates = [
        span for span in spans if span.ip == stream.target_ip and span.first_seen - 5 <= stream.sent_at
    ]
    return max(candidates, key=lambda span: span.first_seen, default=None)


def _cause(
    stream: StreamView, owner: LeaderSpan | None, marks: tuple[FaultMark, ...], drains: tuple[DrainCount, ...]
) -> str:
    """'fault', 'drain' or 'unexplained'."""
    if owner is None:
        return "unexplained"
    timed_out = any(c.model_group == owner.model_group and owner.group in c.timed_out_groups for c in drains)
    if timed_out and stream.outcome == "aborted":
        return "drain"  # the engine's own abort at shutdown: what a timed-out drain does
    if any(
        mark.model_group == owner.model_group and mark.group == owner.group and mark.at <= stream.ended_at
        for mark in marks
    ):
        return "fault"
    return "drain" if timed_out else "unexplained"


def _settle(
    tallies: dict[str, dict[str, int]],
    counts: Mapping[str, DrainCount],
    seen_by_group: Mapping[tuple[str, str], int],
) -> tuple[tuple[Accounting, ...], tuple[Violation, ...]]:
    rows = []
    violations = []
    for name in sorted(set(tallies) | set(counts)):
        tally = tallies.get(name, _empty_tally())
        counted = counts[name].aborted if name in counts else 0
        unexplained = tally["failed"] - tally["fault"] - tally["drain"] - tally["drain_uncounted"]
        lost = unexplained + max(0, tally["drain"] - counted)
        rows.append(
            Accounting(
                name,
                tally["ok"],
                tally["failed"],
                tally["connect"],
                tally["fault"],
                tally["drain"],
                counted,
                lost,
                tally["drain_uncounted"],
            )
        )
        if lost:
            evidence = (
                f"lost: {tally['failed']} failed streams, {tally['fault']} ended by injected faults, "
                f"{tally['drain']} by timed-out drains, {unexplained} by nothing that was injected or counted"
            )
            violations.append(Violation("stream-lost", 0.0, name, evidence))
        # Fewer counted than the clients saw is a miscount; more is one only beyond the streams
        # that were still running at the final reading and finished ok before the shutdown.
        if not tally["drain"] <= counted <= tally["drain"] + tally["ok_after_deadline"]:
            by_group = counts[name].aborted_by_group if name in counts else {}
            groups = sorted({g for (mg, g) in seen_by_group if mg == name} | set(by_group))
            differ = [
                f"{g} clients {seen_by_group.get((name, g), 0)} / record {by_group.get(g, 'none')}"
                for g in groups
                if seen_by_group.get((name, g), 0) != by_group.get(g)
            ]
            evidence = (
                f"aborted: the clients saw {tally['drain']} streams end with their group's timed-out "
                f"drain and {tally['ok_after_deadline']} end ok after their group's drain deadline; "
                f"the operator counted {counted} aborted "
                f"(per group: {', '.join(differ) or 'all equal'})"
            )
            violations.append(Violation("aborted-miscounted", 0.0, name, evidence))
    return tuple(rows), tuple(violations)
