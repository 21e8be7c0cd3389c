"""Scale-in that loses nothing: which groups to remove, and when a draining group may go.

Design note §32, DESIGN §7. Removing a serving group at once cuts every stream it holds and throws
its prefix cache away, so scale-in is a protocol:

1. Choose victims cheapest first (`choose_victims`): groups that serve nothing yet, then ready
   groups holding the least in-flight work and the least prefix-cache value. A ready group younger
   than `drain.minLifetimeSeconds` is spared, so scaling bursts do not churn freshly warmed groups,
   unless the ModelGroup is being deleted or runs more groups than `maxReplicas` allows.
2. Close admission: the group-ready readiness gate goes False on every rank, so the pods leave every
   Service's endpoints. That is verified in the EndpointSlices, not assumed, and routers are given
   `settle_seconds` more to catch up with them before the leader's count is trusted.
3. Wait for in-flight work: the leader's `vllm:num_requests_running` + `vllm:num_requests_waiting`
   reaching 0, or `drain.maxSeconds` (for a drain an operator resumed after a takeover or a restart,
   counted from when it resumed: `drain_deadline`).
4. Remove every rank together (each pod's grace period outlasts vLLM's `--shutdown-timeout`).
   On timeout the requests still in flight are counted as aborted: never silently.

A drain's state lives in the cluster, each part written before the act it announces, so an operator
killed at any write resumes it where it was (issue 18): the draining-since mark on every rank before
any readiness gate goes False; the drain's progress on the leader; its outcome (`DecidedDrain`,
the drain-outcome annotation) on every rank, then in `status.drain.recent`, and only then are the
ranks deleted. Everything here is pure: `step_drain` decides from a frozen view of one draining
group and `now`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Literal

from pydantic import ValidationError

from goodput.api.modelgroup import DrainOutcome, DrainRecord
from goodput.api.times import parse_rfc3339, rfc3339_millis

CandidateState = Literal["Placing", "Provisioning", "Warming", "Ready"]
OnTimeout = Literal["Abort", "Requeue"]
DrainPhase = Literal["StoppingRoutes", "Settling", "WaitingForRequests", "ReadingLeader"]

# Groups that serve nothing yet, cheapest to drop first: nothing placed is lost with a Placing group.
NOT_READY_ORDER: dict[str, int] = {"Placing": 0, "Provisioning": 1, "Warming": 2}
# A reading of a ready leader older than this is not trusted to choose a victim.
VICTIM_READING_MAX_AGE = timedelta(seconds=10)


# Leader readings.


@dataclass(frozen=True, slots=True)
class LeaderSample:
    """One read of a group leader's vLLM /metrics (summed over its engines).

    finished_total counts requests the engine finished for any reason but abort; aborted_total
    those it aborted (vllm:request_success_total by finished_reason). Client disconnects are in
    neither (vLLM does not count them).
    """

    at: datetime
    running: int
    waiting: int
    finished_total: int = 0
    aborted_total: int = 0
    kv_cache_usage: float | None = None
    prefix_cache_hit_ratio: float | None = None

    @property
    def in_flight(self) -> int:
        return self.running + self.waiting


@dataclass(frozen=True, slots=True)
class ProbeFailure:
    """The leader's /metrics could not be read at `at`."""

    at: datetime
    message: str


LeaderReading = LeaderSample | ProbeFailure


# Victim choice.


@dataclass(frozen=True, slots=True)
class ScaleInCandidate:
    """A group that could be removed: not draining, not failed."""

    name: str
    state: CandidateState
    ordinal: int
    ready_at: datetime | None = None
    outdated: bool = False
    load: LeaderSample | None = None
    """The leader's latest reading; None when unknown (sorted after every known load)."""


def victim_cost(candidate: ScaleInCandidate) -> tuple[float, ...]:
    """Sort key, cheapest to remove first (see the module docstring)."""
    if candidate.state != "Ready":
        return (0.0, float(NOT_READY_ORDER[candidate.state]), -float(candidate.ordinal))
    load = candidate.load
    unknown = math.inf
    in_flight = float(load.in_flight) if load is not None else unknown
    # KV in use weighs the in-flight work: long contexts hold more and lose more.
    kv_usage = load.kv_cache_usage if load is not None and load.kv_cache_usage is not None else unknown
    cache_value = (
        load.prefix_cache_hit_ratio
        if load is not None and load.prefix_cache_hit_ratio is not None
        else unknown
    )
    ready_at = candidate.ready_at.timestamp() if candidate.ready_at is not None else 0.0
    return (
        1.0,
        0.0 if candidate.outdated else 1.0,
        in_flight,
        kv_usage,
        cache_value,
        -ready_at,
        -float(candidate.ordinal),
    )


def too_young(candidate: ScaleInCandidate, now: datetime, min_lifetime_seconds: float) -> bool:
    """A ready group that became ready less than the minimum lifetime ago."""
    if candidate.state != "Ready" or candidate.ready_at is None:
        return False
    return (now - candidate.ready_at).total_seconds() < min_lifetime_seconds


def choose_victims(
    candidates: Iterable[ScaleInCandidate],
    count: int,
    *,
    now: datetime,
    min_lifetime_seconds: float,
    may_ignore_lifetime: int = 0,
) -> tuple[ScaleInCandidate, ...]:
    """Up to `count` groups to remove, cheapest first.

    may_ignore_lifetime: how many of them may be younger than the minimum lifetime (all when the
    ModelGroup is being deleted; the excess over maxReplicas otherwise). Groups old enough are
    always taken before any young one.
    """
    ordered = sorted(candidates, key=victim_cost)
    old_enough = [c for c in ordered if not too_young(c, now, min_lifetime_seconds)]
    young = [c for c in ordered if too_young(c, now, min_lifetime_seconds)]
    wanted = max(0, count)
    chosen = old_enough[:wanted]
    chosen += young[: max(0, min(wanted - len(chosen), may_ignore_lifetime))]
    return tuple(sorted(chosen, key=victim_cost))


def stale_loads(
    candidates: Iterable[ScaleInCandidate], readings: Mapping[str, LeaderReading], now: datetime
) -> tuple[str, ...]:
    """Ready candidates whose leader has no reading fresh enough to compare them (probe them first)."""
    return tuple(
        c.name
        for c in candidates
        if c.state == "Ready"
        and ((reading := readings.get(c.name)) is None or now - reading.at > VICTIM_READING_MAX_AGE)
    )


# The drain of one group.


@dataclass(frozen=True, slots=True)
class DrainBaseline:
    """The leader's counters when the drain began: what it finishes or aborts is counted from here."""

    at: datetime
    finished_total: int
    aborted_total: int
    in_flight: int


@dataclass(frozen=True, slots=True)
class DrainProgress:
    """What a drain has established so far, kept on the leader pod so a restart resumes it."""

    baseline: DrainBaseline | None = None
    routes_stopped_at: datetime | None = None
    """When no Service's endpoints listed any rank as ready any more (verified)."""


@dataclass(frozen=True, slots=True)
class DrainPolicy:
    """A ModelGroup's `spec.drain`, with the operator's timings for routers and the final reading."""

    max_seconds: float
    on_timeout: OnTimeout = "Abort"
    settle_seconds: float = 5.0
    """After the endpoints are verified gone, how long routers get to notice before the leader's
    in-flight count is trusted to stay at 0."""
    final_reading_grace_seconds: float = 5.0
    """At the time limit, how long to wait for a reading taken after it (the count to abort)."""


@dataclass(frozen=True, slots=True)
class DrainView:
    """One draining group at one instant."""

    group: str
    started_at: datetime
    routed_pods: tuple[str, ...] = ()
    """Ranks some Service still lists as ready endpoints (the group's own rendezvous Service aside)."""
    progress: DrainProgress = field(default_factory=DrainProgress)
    reading: LeaderReading | None = None
    last_sample: LeaderSample | None = None
    """The latest successful reading, if the latest reading failed."""
    leader_reachable: bool = True
    resumed_at: datetime | None = None
    """When this operator resumed a drain that began before it acted (another replica's, or one of
    a process that was restarted); None when this operator began it. See `drain_deadline`."""


@dataclass(frozen=True, slots=True)
class KeepDraining:
    phase: DrainPhase
    message: str
    progress: DrainProgress
    probe: bool


@dataclass(frozen=True, slots=True)
class RemoveGroup:
    outcome: DrainOutcome
    duration_seconds: float
    requests_finished: int | None
    """Finished during the drain; None when the leader's counters were never read."""
    requests_aborted: int | None
    """In flight at the removal (plus engine aborts during the drain); None when unknown."""
    message: str


DrainStep = KeepDraining | RemoveGroup


def drain_deadline(view: DrainView, policy: DrainPolicy) -> datetime:
    """When the drain reaches `max_seconds`: counted from its start, or, for a drain this operator
    resumed, from the moment it resumed it (observed time only).

    Between the last pass of the operator that stopped and the first pass of the one that resumed,
    nobody read the leader, and the requests it was finishing then are not the engine's fault:
    counted from the start, a takeover longer than the limit would end an idle group as timed out
    without one reading. How long the stopped operator watched the drain cannot be told from its
    absence (that would take a write every pass), so the resumed drain gets the whole limit again:
    a drain may outlast `max_seconds` once per takeover, never by more."""
    counted_from = view.started_at if view.resumed_at is None else max(view.started_at, view.resumed_at)
    return counted_from + timedelta(seconds=policy.max_seconds)


def step_drain(view: DrainView, policy: DrainPolicy, now: datetime) -> DrainStep:
    """What to do with one draining group now: keep waiting (and why), or remove it whole.

    Drained once routing stopped, routers had `settle_seconds` to notice, and a fresh leader reading
    taken after that shows nothing in flight; timed out at `drain_deadline` (after one last reading
    of a reachable leader, within its grace). A resumed drain's deadline lies ahead of its first
    pass, so the leader is read before the deadline is judged."""
    sample = view.reading if isinstance(view.reading, LeaderSample) else view.last_sample
    progress = _advanced(view, sample, now)
    elapsed = _seconds(view.started_at, now)
    routes_stopped_at = progress.routes_stopped_at
    settled_at = routes_stopped_at + timedelta(seconds=policy.settle_seconds) if routes_stopped_at else None
    fresh = isinstance(view.reading, LeaderSample)
    if (
        fresh
        and sample is not None
        and settled_at is not None
        and sample.at >= settled_at
        and sample.in_flight == 0
    ):
        return _drained(view, progress, sample, elapsed)
    deadline = drain_deadline(view, policy)
    if now >= deadline:
        final_reading = fresh and sample is not None and sample.at >= deadline
        grace_over = _seconds(deadline, now) >= policy.final_reading_grace_seconds
        if final_reading or grace_over or not view.leader_reachable:
            return _timed_out(view, policy, progress, sample, elapsed)
        return KeepDraining("ReadingLeader", "drain time is up: reading the leader once more", progress, True)
    phase, message = _waiting_for(view, policy, sample if fresh else None, settled_at, now)
    remaining = _seconds(now, deadline)
    return KeepDraining(
        phase, f"draining: {message} ({remaining:.0f}s left)", progress, view.leader_reachable
    )


def _advanced(view: DrainView, sample: LeaderSample | None, now: datetime) -> DrainProgress:
    """The drain's progress with what this look adds: the leader's counters as the baseline (the
    first reading taken since the drain started), and when the group's ranks left every Service."""
    progress = view.progress
    if progress.baseline is None and sample is not None and sample.at >= view.started_at:
        progress = replace(
            progress,
            baseline=DrainBaseline(sample.at, sample.finished_total, sample.aborted_total, sample.in_flight),
        )
    if view.routed_pods:
        return replace(progress, routes_stopped_at=None)
    if progress.routes_stopped_at is None:
        return replace(progress, routes_stopped_at=now)
    return progress


def _drained(view: DrainView, progress: DrainProgress, sample: LeaderSample, elapsed: float) -> RemoveGroup:
    finished = _finished(progress.baseline, sample)
    aborted = _engine_aborts(progress.baseline, sample)
    return RemoveGroup(
        outcome="Drained",
        duration_seconds=elapsed,
        requests_finished=finished,
        requests_aborted=aborted,
        message=f"group {view.group} drained in {elapsed:.1f}s: "
        f"{_count(finished)} request(s) finished during the drain, none left in flight"
        + (f", {aborted} aborted by the engine itself" if aborted else ""),
    )


def _waiting_for(
    view: DrainView,
    policy: DrainPolicy,
    fresh_sample: LeaderSample | None,
    settled_at: datetime | None,
    now: datetime,
) -> tuple[DrainPhase, str]:
    """What a drain that goes on waits for: the endpoints, the routers, a reading, or requests."""
    if view.routed_pods:
        return "StoppingRoutes", f"waiting for {', '.join(view.routed_pods)} to leave the Service endpoints"
    if settled_at is not None and now < settled_at:
        return "Settling", f"endpoints removed; giving routers {policy.settle_seconds:g}s to notice"
    if fresh_sample is None:
        return "ReadingLeader", "routing stopped; the leader's in-flight requests are not known yet"
    return (
        "WaitingForRequests",
        f"routing stopped; {fresh_sample.running} running and {fresh_sample.waiting} waiting request(s) "
        "at the leader",
    )


def _timed_out(
    view: DrainView,
    policy: DrainPolicy,
    progress: DrainProgress,
    sample: LeaderSample | None,
    elapsed: float,
) -> RemoveGroup:
    finished = _finished(progress.baseline, sample) if sample is not None else None
    aborted: int | None = None
    if sample is not None:
        aborted = sample.in_flight + (_engine_aborts(progress.baseline, sample) or 0)
    if view.routed_pods:
        why = f"{', '.join(view.routed_pods)} still listed as ready Service endpoints"
    elif sample is None:
        why = "the leader's in-flight requests could not be read"
    else:
        why = f"{sample.in_flight} request(s) still in flight"
    action = "deleted every rank"
    if policy.on_timeout == "Requeue":
        action += (
            "; onTimeout is Requeue but no gateway is configured to re-dispatch requests, "
            "so they were aborted"
        )
    # Still routed, requests may have arrived after the last reading: what it held is a floor.
    aborted_words = f"at least {aborted}" if view.routed_pods and aborted is not None else _count(aborted)
    counted = ""
    if view.resumed_at is not None:
        counted = (
            f" (counted from {rfc3339_millis(view.resumed_at)}, when this operator resumed the drain "
            f"{_seconds(view.started_at, view.resumed_at):.1f}s after it began)"
        )
    return RemoveGroup(
        outcome="TimedOut",
        duration_seconds=elapsed,
        requests_finished=finished,
        requests_aborted=aborted,
        message=f"group {view.group} reached drain.maxSeconds={policy.max_seconds:g}s{counted} with "
        f"{why}: {action}; {aborted_words} request(s) aborted, {_count(finished)} finished during the drain",
    )


def _finished(baseline: DrainBaseline | None, sample: LeaderSample | None) -> int | None:
    if baseline is None or sample is None:
        return None
    return max(0, sample.finished_total - baseline.finished_total)


def _engine_aborts(baseline: DrainBaseline | None, sample: LeaderSample) -> int | None:
    if baseline is None:
        return None
    return max(0, sample.aborted_total - baseline.aborted_total)


def _count(value: int | None) -> str:
    return "an unknown number of" if value is None else str(value)


def _seconds(start: datetime, end: datetime) -> float:
    return max(0.0, (end - start).total_seconds())


# The drain-progress annotation.


def encode_progress(progress: DrainProgress) -> str:
    document: dict[str, object] = {}
    if progress.baseline is not None:
        baseline = progress.baseline
        document["baseline"] = {
            "at": rfc3339_millis(baseline.at),
            "finished": baseline.finished_total,
            "aborted": baseline.aborted_total,
            "inFlight": baseline.in_flight,
        }
    if progress.routes_stopped_at is not None:
        document["routesStoppedAt"] = rfc3339_millis(progress.routes_stopped_at)
    return json.dumps(document, separators=(",", ":"), sort_keys=True)


def parse_progress(text: str | None) -> DrainProgress | None:
    """The drain progress stored on a leader; None when absent. Unreadable parts count as unknown."""
    if not text:
        return None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError:
        return DrainProgress()
    if not isinstance(raw, dict):
        return DrainProgress()
    baseline = None
    stored = raw.get("baseline")
    if isinstance(stored, dict):
        at = parse_rfc3339(stored.get("at"))
        numbers = [stored.get(key) for key in ("finished", "aborted", "inFlight")]
        if at is not None and all(isinstance(n, int) and n >= 0 for n in numbers):
            finished, aborted, in_flight = (int(n) for n in numbers)  # type: ignore[arg-type]
            baseline = DrainBaseline(at, finished, aborted, in_flight)
    return DrainProgress(baseline=baseline, routes_stopped_at=parse_rfc3339(raw.get("routesStoppedAt")))


# The drain-outcome annotation: a drain's end, written on every rank before any rank is deleted.


@dataclass(frozen=True, slots=True)
class DecidedDrain:
    """How a drain ended, as decided once: the API's `DrainRecord` exactly as `status.drain.recent`
    will hold it, and the words of its Event. It is written on every rank before the group's status
    record and before any deletion, so an operator killed in between rebuilds the same record from
    the pods (never recomputes it from a leader that may have changed) and counts it exactly once.
    The ranks, the status and the metrics read the one record: no field is copied between forms."""

    record: DrainRecord
    message: str = ""


def encode_outcome(decided: DecidedDrain) -> str:
    """The annotation's text: the status record's own JSON, and the message."""
    document: dict[str, object] = {**decided.record.model_dump(mode="json"), "message": decided.message}
    return json.dumps(document, separators=(",", ":"), sort_keys=True)


def parse_outcome(text: str | None, group: str) -> DecidedDrain | None:
    """The drain outcome stored on a rank of `group`; None when absent or unreadable (the drain then
    resumes and decides its end again, which is safe: nothing was recorded or deleted on its account).

    A count or an onTimeout that does not read is unknown (None), never a reason to decide again. An
    annotation without the group's name (written before the record was the API's) takes the pod's.
    """
    if not text:
        return None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(raw, dict) or raw.get("outcome") not in ("Drained", "TimedOut"):
        return None
    on_timeout = raw.get("onTimeout")
    document = {
        **raw,
        "group": group,
        "requestsFinished": _count_or_none(raw.get("requestsFinished")),
        "requestsAborted": _count_or_none(raw.get("requestsAborted")),
        "onTimeout": on_timeout if on_timeout in ("Abort", "Requeue") else None,
    }
    try:
        record = DrainRecord.model_validate(document)
    except ValidationError:
        return None
    return DecidedDrain(record=record, message=str(raw.get("message") or ""))


def _count_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
