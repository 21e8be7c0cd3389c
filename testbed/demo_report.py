"""What `goodput demo` saw, and what it means: a timeline per interval and a one-screen summary.

Everything here is pure: frozen observations in (the requests the load generator offered, samples of
the ModelGroup, the autoscaler's recorded decisions, the operator's Events), frozen rows and a
summary out, plus their renderings as text, JSON-ready dicts and PNG plots.

Attainment is counted against the offered population (design note §5): every planned request is in
the denominator, so a request that was never sent, failed or was cut counts as a miss rather than
vanishing from the statistics. A request attains its SLO when its stream completed, its TTFT is
within the class target, its TPOT (mean gap between tokens after the first) within the ITL target,
and its end-to-end latency within the completion target when the class has one: the rule the
simulator's report applies, so offline and live figures mean the same thing.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from goodput.api.reasons import EventReason
from goodput.testbed.loadgen import FAILED_OUTCOMES

OK = "ok"
NOT_SENT = "not_sent"
REJECTED = "rejected"
"""Refused by the gateway's admission (429 with Retry-After): answered, on purpose, not lost."""
DRAINING = "draining"
DRAINED = "drained"
DRAIN_TIMED_OUT = "timed_out"
BACK_IN_SERVICE = "back_in_service"
STILL_DRAINING = "unfinished"
_EVENT_GROUP = re.compile(r"^group (?P<group>\S+) ")


# ---------------------------------------------------------------------------------------- observations
@dataclass(frozen=True, slots=True)
class SloTargets:
    """The targets of the SLO class the demo's requests belong to, as its SLOPolicy states them."""

    class_name: str
    ttft_seconds: float
    itl_seconds: float
    e2e_seconds: float | None = None
    attainment: float = 0.99


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One planned request and what became of it."""

    offset_seconds: float
    """When the plan offered it, from the start of the load."""
    outcome: str
    """`ok`, `rejected` (by the gateway's admission), one of FAILED_OUTCOMES, or `not_sent` (the
    generator's concurrency limit, deadline or no ready target)."""
    ttft_seconds: float | None = None
    tpot_seconds: float | None = None
    e2e_seconds: float | None = None
    target_host: str | None = None
    """The address it was sent to (a group leader's pod IP, or the gateway's)."""
    tenant: str | None = None
    group: str | None = None
    """The group that served it, as the gateway named it; None when sent to a leader directly."""

    def attained(self, targets: SloTargets) -> bool:
        if self.outcome != OK or self.ttft_seconds is None or self.ttft_seconds > targets.ttft_seconds:
            return False
        if self.tpot_seconds is not None and self.tpot_seconds > targets.itl_seconds:
            return False
        return not (
            targets.e2e_seconds is not None
            and (self.e2e_seconds is None or self.e2e_seconds > targets.e2e_seconds)
        )

    @property
    def failed(self) -> bool:
        return self.outcome in FAILED_OUTCOMES


@dataclass(frozen=True, slots=True)
class StatusGroup:
    """One complete replica group as the ModelGroup's status showed it."""

    name: str
    state: str
    leader_address: str | None = None
    ready_seconds: float | None = None
    """How long it took from creation to ready (`readyTime.totalSeconds`), once ready."""


@dataclass(frozen=True, slots=True)
class ModelGroupSample:
    """The ModelGroup at one instant: the count the autoscaler wants and the groups that exist."""

    offset_seconds: float
    desired_groups: int
    ready_groups: int
    coming_groups: int
    """Placing, provisioning or warming: capacity on its way."""
    draining_groups: int
    groups: tuple[StatusGroup, ...] = ()

    @property
    def held_groups(self) -> int:
        """Groups holding GPUs, whatever their state: what the fleet costs at this instant."""
        return len(self.groups)


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """One decision of the active policy, as recorded in the ModelGroup's status."""

    offset_seconds: float
    from_groups: int
    to_groups: int
    reason: str
    signal: str
    detail: str = ""
    """The winning signal's own account of its proposal (its inputs)."""
    guards: tuple[str, ...] = ()

    @property
    def changes(self) -> bool:
        return self.to_groups != self.from_groups

    def describe(self) -> str:
        because = self.signal if self.reason in ("", self.signal) else f"{self.signal}, {self.reason}"
        return f"{self.from_groups}→{self.to_groups} ({because})"


def fleet_sample(
    model_group: Mapping[str, Any], leader_addresses: Mapping[str, str], offset_seconds: float
) -> ModelGroupSample:
    """A ModelGroupSample from a ModelGroup object and the pod IPs of its leaders, by group name."""
    spec = model_group.get("spec") or {}
    status = model_group.get("status") or {}
    groups = []
    for group in status.get("groups") or ():
        ready_time = group.get("readyTime") or {}
        total = ready_time.get("totalSeconds")
        groups.append(
            StatusGroup(
                name=str(group["name"]),
                state=str(group.get("state", "")),
                leader_address=leader_addresses.get(str(group["name"])),
                ready_seconds=None if total is None else float(total),
            )
        )
    return ModelGroupSample(
        offset_seconds=offset_seconds,
        desired_groups=int(spec.get("replicas") or 0),
        ready_groups=int(status.get("readyGroups") or 0),
        coming_groups=sum(
            int(status.get(key) or 0) for key in ("placingGroups", "provisioningGroups", "warmingGroups")
        ),
        draining_groups=int(status.get("drainingGroups") or 0),
        groups=tuple(groups),
    )


def decision_records(model_group: Mapping[str, Any], start: datetime) -> list[DecisionRecord]:
    """The active policy's decisions in a ModelGroup's status (latest and history), timed from `start`
    (an aware datetime). Shadow decisions are left out: they never change the count."""
    status = model_group.get("status") or {}
    entries = [status.get("lastDecision"), *(status.get("decisions") or ())]
    records = []
    for entry in entries:
        if not entry or entry.get("shadow") or not entry.get("time"):
            continue
        at = datetime.fromisoformat(str(entry["time"]).replace("Z", "+00:00"))
        winner = next(
            (p for p in entry.get("proposals") or () if p.get("signal") == entry.get("signal")), None
        )
        records.append(
            DecisionRecord(
                offset_seconds=(at - start).total_seconds(),
                from_groups=int(entry.get("fromReplicas", 0)),
                to_groups=int(entry.get("toReplicas", 0)),
                reason=str(entry.get("reason") or ""),
                signal=str(entry.get("signal") or ""),
                detail=str((winner or {}).get("detail") or ""),
                guards=tuple(str(guard) for guard in entry.get("guards") or ()),
            )
        )
    return records


def merge_decisions(records: Iterable[DecisionRecord]) -> tuple[DecisionRecord, ...]:
    """Each decision once (seen on many polls, as the latest and in the history), in time order;
    the first sighting is kept, as `decision_records` lists the latest decision, the fullest, first."""
    unique: dict[tuple[float, int, int], DecisionRecord] = {}
    for record in records:
        unique.setdefault((record.offset_seconds, record.from_groups, record.to_groups), record)
    return tuple(unique[key] for key in sorted(unique))


def count_changes(samples: Sequence[ModelGroupSample], scaler: str) -> tuple[DecisionRecord, ...]:
    """The wanted count's changes between consecutive samples, named for `scaler`: a run's scaling
    events when another autoscaler (KEDA's HPA) sets `spec.replicas`, which records no decision in the
    ModelGroup's status."""
    return tuple(
        DecisionRecord(after.offset_seconds, before.desired_groups, after.desired_groups, "", scaler)
        for before, after in itertools.pairwise(samples)
        if after.desired_groups != before.desired_groups
    )


def advice_changes(decisions: Sequence[DecisionRecord]) -> tuple[DecisionRecord, ...]:
    """goodput's recommendations to change the count while it only advises, each once: nothing applies
    them, so the same from -> to is recorded tick after tick; only a recommendation that differs from
    the decision before it (a hold included) says something new."""
    pairs = itertools.pairwise([None, *decisions])
    return tuple(
        after
        for before, after in pairs
        if after is not None
        and after.changes
        and (before is None or (before.from_groups, before.to_groups) != (after.from_groups, after.to_groups))
    )


@dataclass(frozen=True, slots=True)
class GroupEvent:
    """A change in a group's service the operator announced with an Event (exact to the microsecond,
    where a sample every second can miss a drain that took less than that)."""

    offset_seconds: float
    group: str
    change: str
    """DRAINING, DRAINED (its leader reported no request in flight), DRAIN_TIMED_OUT (deleted at
    drain.maxSeconds with requests left) or BACK_IN_SERVICE (needed again while draining)."""


_DRAIN_EVENTS = {
    EventReason.DRAIN_STARTED: DRAINING,
    EventReason.DRAIN_FINISHED: DRAINED,
    EventReason.DRAIN_TIMED_OUT: DRAIN_TIMED_OUT,
    EventReason.DRAIN_CANCELLED: BACK_IN_SERVICE,
}


def group_events(
    events: Iterable[Mapping[str, Any]], start: datetime, *, since: datetime | None = None
) -> tuple[GroupEvent, ...]:
    """The drain-related Events of the operator, timed from `start` (an aware datetime), in order;
    those before `since` (an earlier life of an object of the same name) are left out."""
    found = []
    for event in events:
        change = _DRAIN_EVENTS.get(str(event.get("reason")))
        match = _EVENT_GROUP.match(str(event.get("message") or ""))
        stamp = event.get("eventTime") or event.get("lastTimestamp") or event.get("firstTimestamp")
        if change is None or match is None or not stamp:
            continue
        at = datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
        if since is None or at >= since:
            found.append(GroupEvent((at - start).total_seconds(), match["group"], change))
    return tuple(sorted(found, key=lambda event: event.offset_seconds))


# ---------------------------------------------------------------------------------------- groups
@dataclass(frozen=True, slots=True)
class GroupHistory:
    """One group's life as the samples saw it (offsets in seconds from the start of the load)."""

    name: str
    first_seen: float
    ready_at: float | None
    gone_at: float | None
    """First sample without it; None while it still existed at the last sample."""
    leader_address: str | None
    ready_seconds: float | None


def group_histories(samples: Sequence[ModelGroupSample]) -> tuple[GroupHistory, ...]:
    """Fold the samples into one history per group, in order of appearance."""
    histories: dict[str, dict[str, Any]] = {}
    for sample in samples:
        present = set()
        for group in sample.groups:
            present.add(group.name)
            history = histories.setdefault(
                group.name,
                {"first_seen": sample.offset_seconds, "ready_at": None, "gone_at": None},
            )
            history["gone_at"] = None  # seen again: not gone (a sample may miss a group briefly)
            if group.state == "Ready" and history["ready_at"] is None:
                history["ready_at"] = sample.offset_seconds
            if group.leader_address:
                history["leader_address"] = group.leader_address
            if group.ready_seconds is not None:
                history["ready_seconds"] = group.ready_seconds
        for name, history in histories.items():
            if name not in present and history["gone_at"] is None:
                history["gone_at"] = sample.offset_seconds
    return tuple(
        GroupHistory(
            name=name,
            first_seen=history["first_seen"],
            ready_at=history["ready_at"],
            gone_at=history["gone_at"],
            leader_address=history.get("leader_address"),
            ready_seconds=history.get("ready_seconds"),
        )
        for name, history in histories.items()
    )


@dataclass(frozen=True, slots=True)
class DrainRecord:
    """A group drained for scale-in: how long it took, how it ended, what its clients lost."""

    group: str
    started_at: float
    ended_at: float | None
    ending: str
    """DRAINED, DRAIN_TIMED_OUT, or STILL_DRAINING at the end of the run."""
    requests_served: int
    """Requests sent to its leader during its life."""
    requests_lost: int
    """Of those, the ones that did not complete (cut, aborted, failed, timed out)."""

    @property
    def drain_seconds(self) -> float | None:
        return None if self.ended_at is None else self.ended_at - self.started_at


def drain_records(
    events: Sequence[GroupEvent], histories: Sequence[GroupHistory], requests: Sequence[RequestRecord]
) -> tuple[DrainRecord, ...]:
    """Every drain the Events tell of that did not end with the group back in service, with the
    requests it lost: those the gateway says it served, or, sent to leaders directly, those sent to
    its leader's address while the group existed (pod IPs are reused)."""
    by_name = {history.name: history for history in histories}

    def record(group: str, started: float, ended: float | None, ending: str) -> DrainRecord:
        history = by_name.get(group)
        mine = [request for request in requests if _served_by(request, group, history, ended)]
        return DrainRecord(group, started, ended, ending, len(mine), sum(1 for r in mine if r.failed))

    draining: dict[str, float] = {}
    drains = []
    for event in events:
        if event.change == DRAINING:
            draining.setdefault(event.group, event.offset_seconds)
        elif event.change == BACK_IN_SERVICE:
            draining.pop(event.group, None)
        elif event.group in draining:
            drains.append(record(event.group, draining.pop(event.group), event.offset_seconds, event.change))
    drains += [record(group, started, None, STILL_DRAINING) for group, started in draining.items()]
    return tuple(sorted(drains, key=lambda drain: drain.started_at))


def _served_by(request: RequestRecord, group: str, history: GroupHistory | None, ended: float | None) -> bool:
    if request.group is not None:
        return request.group == group
    return (
        history is not None
        and history.leader_address is not None
        and request.target_host == history.leader_address
        and request.offset_seconds >= history.first_seen
        and (ended is None or request.offset_seconds <= ended)
    )


# ---------------------------------------------------------------------------------------- tenants
@dataclass(frozen=True, slots=True)
class TenantFigures:
    """What one tenant offered in a span of the run, what the gateway refused and what attained."""

    tenant: str
    offered: int
    rejected: int
    attained: int
    ttft_p99_seconds: float | None

    @property
    def attainment_offered(self) -> float | None:
        return self.attained / self.offered if self.offered else None

    @property
    def attainment_admitted(self) -> float | None:
        admitted = self.offered - self.rejected
        return self.attained / admitted if admitted else None


def tenant_figures(requests: Sequence[RequestRecord], targets: SloTargets) -> tuple[TenantFigures, ...]:
    """Per tenant, in name order; empty when no request named a tenant (no gateway)."""
    names = sorted({request.tenant for request in requests if request.tenant is not None})
    figures = []
    for name in names:
        mine = [request for request in requests if request.tenant == name]
        figures.append(
            TenantFigures(
                tenant=name,
                offered=len(mine),
                rejected=sum(1 for request in mine if request.outcome == REJECTED),
                attained=sum(1 for request in mine if request.attained(targets)),
                ttft_p99_seconds=percentile([r.ttft_seconds for r in mine if r.ttft_seconds is not None], 99),
            )
        )
    return tuple(figures)


# ---------------------------------------------------------------------------------------- timeline
@dataclass(frozen=True, slots=True)
class IntervalRow:
    """One interval of the timeline."""

    start_seconds: float
    end_seconds: float
    offered: int
    desired_groups: int
    ready_groups: int
    draining_groups: int
    ttft_p99_seconds: float | None
    attained: int
    decisions: tuple[DecisionRecord, ...]
    """Decisions in the interval that changed the count."""
    rejected: int = 0
    tenants: tuple[TenantFigures, ...] = ()

    @property
    def offered_per_second(self) -> float:
        return self.offered / (self.end_seconds - self.start_seconds)

    @property
    def attainment_offered(self) -> float | None:
        return self.attained / self.offered if self.offered else None


def sample_at(samples: Sequence[ModelGroupSample], offset_seconds: float) -> ModelGroupSample | None:
    """The last sample taken at or before `offset_seconds` (samples are in time order)."""
    chosen = None
    for sample in samples:
        if sample.offset_seconds > offset_seconds:
            break
        chosen = sample
    return chosen


def percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else None


def timeline(
    requests: Sequence[RequestRecord],
    samples: Sequence[ModelGroupSample],
    decisions: Sequence[DecisionRecord],
    targets: SloTargets,
    *,
    interval_seconds: float,
    end_seconds: float,
) -> tuple[IntervalRow, ...]:
    """Rows of `interval_seconds` from the start of the load to `end_seconds`; requests fall in the
    interval that offered them, the group counts are those at the interval's end."""
    if interval_seconds <= 0:
        raise ValueError("the timeline interval must be positive")
    rows = []
    count = max(1, math.ceil(end_seconds / interval_seconds - 1e-9))
    for index in range(count):
        start, end = index * interval_seconds, min((index + 1) * interval_seconds, end_seconds)
        if end <= start:
            break
        offered = [r for r in requests if start <= r.offset_seconds < end]
        state = sample_at(samples, end)
        rows.append(
            IntervalRow(
                start_seconds=start,
                end_seconds=end,
                offered=len(offered),
                desired_groups=state.desired_groups if state else 0,
                ready_groups=state.ready_groups if state else 0,
                draining_groups=state.draining_groups if state else 0,
                ttft_p99_seconds=percentile(
                    [r.ttft_seconds for r in offered if r.ttft_seconds is not None], 99
                ),
                attained=sum(1 for r in offered if r.attained(targets)),
                decisions=tuple(d for d in decisions if d.changes and start <= d.offset_seconds < end),
                rejected=sum(1 for r in offered if r.outcome == REJECTED),
                tenants=tenant_figures(offered, targets),
            )
        )
    return tuple(rows)


def gpu_hours(samples: Sequence[ModelGroupSample], gpus_per_group: int, *, end_seconds: float) -> float:
    """GPU-hours held from the start of the load to `end_seconds`: each sample's groups, held until
    the next sample (the one before the start covers the start)."""
    total = 0.0
    for index, sample in enumerate(samples):
        following = samples[index + 1].offset_seconds if index + 1 < len(samples) else end_seconds
        start, end = max(sample.offset_seconds, 0.0), min(following, end_seconds)
        if end > start:
            total += (end - start) * sample.held_groups * gpus_per_group
    return total / 3600.0


# ---------------------------------------------------------------------------------------- summary
@dataclass(frozen=True, slots=True)
class DemoSummary:
    """The claims the demo makes, each one counted from the observations."""

    duration_seconds: float
    offered: int
    sent: int
    completed: int
    failed: int
    failed_by_outcome: dict[str, int]
    not_sent: int
    rejected: int
    """Sent and refused by the gateway's admission (429): answered at once, not lost."""
    attained: int
    attainment_offered: float | None
    attainment_admitted: float | None
    target_attainment: float
    ttft_p50_seconds: float | None
    ttft_p99_seconds: float | None
    scale_outs: tuple[DecisionRecord, ...]
    scale_ins: tuple[DecisionRecord, ...]
    drains: tuple[DrainRecord, ...]
    peak_groups: int
    new_group_ready_seconds: tuple[float, ...]
    """Ready times of the groups created during the run."""
    gpus_per_group: int
    gpu_hours: float
    fixed_peak_gpu_hours: float
    """What a fleet held at the peak for the whole run would have cost."""
    tenants: tuple[TenantFigures, ...] = ()
    advice: tuple[DecisionRecord, ...] = ()
    """goodput's recommendations when another autoscaler set the count (Advisory: not applied)."""

    @property
    def drained_scale_ins(self) -> int:
        return sum(1 for drain in self.drains if drain.ending == DRAINED)

    @property
    def lost_on_drained_groups(self) -> int:
        return sum(drain.requests_lost for drain in self.drains)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["drained_scale_ins"] = self.drained_scale_ins
        data["lost_on_drained_groups"] = self.lost_on_drained_groups
        for drain, raw in zip(self.drains, data["drains"], strict=True):
            raw["drain_seconds"] = drain.drain_seconds
        data["tenants"] = [tenant_dict(figures) for figures in self.tenants]
        return data


def tenant_dict(figures: TenantFigures) -> dict[str, Any]:
    return {
        **asdict(figures),
        "attainment_offered": figures.attainment_offered,
        "attainment_admitted": figures.attainment_admitted,
    }


def summarize(
    requests: Sequence[RequestRecord],
    samples: Sequence[ModelGroupSample],
    decisions: Sequence[DecisionRecord],
    targets: SloTargets,
    *,
    drains: Sequence[DrainRecord],
    histories: Sequence[GroupHistory],
    gpus_per_group: int,
    end_seconds: float,
    advice: Sequence[DecisionRecord] = (),
) -> DemoSummary:
    """decisions: what changed the count (goodput's, or `count_changes` for another autoscaler);
    advice: goodput's recommendations when it only advised."""
    sent = [r for r in requests if r.outcome != NOT_SENT]
    admitted = [r for r in sent if r.outcome != REJECTED]
    attained = sum(1 for r in requests if r.attained(targets))
    ttfts = [r.ttft_seconds for r in requests if r.ttft_seconds is not None]
    in_run = [s for s in samples if s.offset_seconds <= end_seconds]
    peak = max((s.held_groups for s in in_run), default=0)
    return DemoSummary(
        duration_seconds=end_seconds,
        offered=len(requests),
        sent=len(sent),
        completed=sum(1 for r in requests if r.outcome == OK),
        failed=sum(1 for r in requests if r.failed),
        failed_by_outcome={name: sum(1 for r in requests if r.outcome == name) for name in FAILED_OUTCOMES},
        not_sent=len(requests) - len(sent),
        rejected=len(sent) - len(admitted),
        attained=attained,
        attainment_offered=attained / len(requests) if requests else None,
        attainment_admitted=attained / len(admitted) if admitted else None,
        target_attainment=targets.attainment,
        ttft_p50_seconds=percentile(ttfts, 50),
        ttft_p99_seconds=percentile(ttfts, 99),
        scale_outs=tuple(d for d in decisions if d.to_groups > d.from_groups),
        scale_ins=tuple(d for d in decisions if d.to_groups < d.from_groups),
        drains=tuple(drains),
        peak_groups=peak,
        new_group_ready_seconds=tuple(
            h.ready_seconds for h in histories if h.first_seen > 0 and h.ready_seconds is not None
        ),
        gpus_per_group=gpus_per_group,
        gpu_hours=gpu_hours(samples, gpus_per_group, end_seconds=end_seconds),
        fixed_peak_gpu_hours=peak * gpus_per_group * end_seconds / 3600.0,
        tenants=tenant_figures(requests, targets),
        advice=tuple(advice),
    )


# ---------------------------------------------------------------------------------------- text
def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1e3:.0f} ms" if value < 1 else f"{value:.2f} s"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def render_timeline(rows: Sequence[IntervalRow], targets: SloTargets) -> str:
    tenants = sorted({figures.tenant for row in rows for figures in row.tenants})
    header = (
        f"{'t (s)':>9}  {'offered/s':>9}  {'desired':>7}  {'ready':>5}  {'draining':>8}  "
        f"{'TTFT p99':>9}  {'attained':>8}  "
        + "".join(f"{name + ': offered/s rejected attained':<36}  " for name in tenants)
        + "decisions"
    )
    lines = [
        f"timeline (class {targets.class_name}: TTFT ≤ {_seconds(targets.ttft_seconds)}, "
        f"TPOT ≤ {_seconds(targets.itl_seconds)}; attainment against offered load"
        + ("; per tenant, what it offered, what the gateway refused, what attained" if tenants else "")
        + ")",
        header,
    ]
    for row in rows:
        line = (
            f"{row.start_seconds:>4.0f}-{row.end_seconds:<4.0f}  {row.offered_per_second:>9.1f}  "
            f"{row.desired_groups:>7}  {row.ready_groups:>5}  {row.draining_groups:>8}  "
            f"{_seconds(row.ttft_p99_seconds):>9}  {_share(row.attainment_offered):>8}  "
            + "".join(f"{_tenant_cell(row, name):<36}  " for name in tenants)
            + "; ".join(decision.describe() for decision in row.decisions)
        )
        lines.append(line.rstrip())
    return "\n".join(lines)


def _tenant_cell(row: IntervalRow, tenant: str) -> str:
    figures = next((f for f in row.tenants if f.tenant == tenant), None)
    indent = " " * len(tenant)
    if figures is None:
        return f"{indent}  {'-':>9} {'-':>8} {'-':>8}"
    seconds = row.end_seconds - row.start_seconds
    return (
        f"{indent}  {figures.offered / seconds:>9.1f} {figures.rejected:>8} "
        f"{_share(figures.attainment_offered):>8}"
    )


def render_summary(summary: DemoSummary, targets: SloTargets, *, title: str) -> str:
    s = summary
    failed_detail = ", ".join(f"{name} {count}" for name, count in s.failed_by_outcome.items() if count)
    lines = [
        title,
        f"  offered {s.offered} requests in {s.duration_seconds:.0f} s; sent {s.sent}, completed "
        f"{s.completed}, failed {s.failed}"
        + (f" ({failed_detail})" if failed_detail else "")
        + (f", not sent {s.not_sent}" if s.not_sent else ""),
        f"  attainment against offered load: {_share(s.attainment_offered)} "
        f"(target {s.target_attainment:.0%} of {targets.class_name}: TTFT ≤ {_seconds(targets.ttft_seconds)},"
        f" TPOT ≤ {_seconds(targets.itl_seconds)}); against admitted: {_share(s.attainment_admitted)}",
        f"  TTFT p50 {_seconds(s.ttft_p50_seconds)}, p99 {_seconds(s.ttft_p99_seconds)}",
        *_render_tenants(s),
    ]
    if s.scale_outs:
        steps = ", ".join(f"{d.describe()} at {d.offset_seconds:.0f} s" for d in s.scale_outs)
        ready = (
            f"; new groups ready in {np.mean(s.new_group_ready_seconds):.1f} s on average"
            if s.new_group_ready_seconds
            else ""
        )
        lines.append(f"  scale-outs: {len(s.scale_outs)}: {steps}{ready}")
    else:
        lines.append("  scale-outs: none")
    if s.scale_ins:
        steps = ", ".join(f"{d.describe()} at {d.offset_seconds:.0f} s" for d in s.scale_ins)
        lines.append(f"  scale-ins: {len(s.scale_ins)}: {steps}")
    else:
        lines.append("  scale-ins: none")
    if s.advice:
        steps = ", ".join(f"{d.describe()} at {d.offset_seconds:.0f} s" for d in s.advice)
        lines.append(f"  goodput's advice (Advisory: recorded, not applied): {steps}")
    if s.drains:
        each = ", ".join(
            f"{d.group} {d.ending.replace('_', ' ')}"
            + (f" in {d.drain_seconds:.1f} s" if d.drain_seconds is not None else "")
            + f" ({d.requests_served} served, {d.requests_lost} lost)"
            for d in s.drains
        )
        lines.append(
            f"  drained scale-ins: {s.drained_scale_ins} of {len(s.drains)} drains ended with no request in "
            f"flight; requests lost on draining groups: {s.lost_on_drained_groups}"
        )
        lines.append(f"    {each}")
    else:
        lines.append("  drained scale-ins: none")
    lines.append(
        f"  GPU-hours: {s.gpu_hours:.3f} ({s.gpus_per_group} GPU per group, peak {s.peak_groups} groups; "
        f"a fleet fixed at the peak: {s.fixed_peak_gpu_hours:.3f})"
    )
    return "\n".join(lines)


def _render_tenants(summary: DemoSummary) -> list[str]:
    if not summary.tenants:
        return []
    lines = [
        f"  through the gateway: {summary.rejected} of {summary.sent} sent refused by admission "
        "(429, Retry-After); per tenant:"
    ]
    for figures in summary.tenants:
        lines.append(
            f"    {figures.tenant}: offered {figures.offered}, rejected {figures.rejected}, attainment "
            f"against offered {_share(figures.attainment_offered)}, against admitted "
            f"{_share(figures.attainment_admitted)}, TTFT p99 {_seconds(figures.ttft_p99_seconds)}"
        )
    return lines


def report_dict(
    *,
    scenario: Mapping[str, Any],
    rows: Sequence[IntervalRow],
    summary: DemoSummary,
    decisions: Sequence[DecisionRecord],
    histories: Sequence[GroupHistory],
    samples: Sequence[ModelGroupSample],
    load: Mapping[str, Any],
) -> dict[str, Any]:
    """Everything the demo observed and concluded, as one JSON document."""
    return {
        "scenario": dict(scenario),
        "summary": summary.as_dict(),
        "timeline": [
            {
                "start_seconds": row.start_seconds,
                "end_seconds": row.end_seconds,
                "offered": row.offered,
                "offered_per_second": row.offered_per_second,
                "desired_groups": row.desired_groups,
                "ready_groups": row.ready_groups,
                "draining_groups": row.draining_groups,
                "ttft_p99_seconds": row.ttft_p99_seconds,
                "attained": row.attained,
                "attainment_offered": row.attainment_offered,
                "rejected": row.rejected,
                "tenants": [tenant_dict(figures) for figures in row.tenants],
                "decisions": [asdict(decision) for decision in row.decisions],
            }
            for row in rows
        ],
        "decisions": [asdict(decision) for decision in decisions],
        "groups": [asdict(history) for history in histories],
        "samples": [
            {
                "offset_seconds": sample.offset_seconds,
                "desired_groups": sample.desired_groups,
                "ready_groups": sample.ready_groups,
                "coming_groups": sample.coming_groups,
                "draining_groups": sample.draining_groups,
                "held_groups": sample.held_groups,
            }
            for sample in samples
        ],
        "load": dict(load),
    }


# ---------------------------------------------------------------------------------------- plots
def _plot_offered(axes: Any, rows: Sequence[IntervalRow]) -> None:
    """Offered load per interval, stacked by tenant when there are tenants, with what the gateway
    refused drawn over it."""
    starts = [row.start_seconds for row in rows]
    widths = [row.end_seconds - row.start_seconds for row in rows]
    tenants = sorted({figures.tenant for row in rows for figures in row.tenants})
    if not tenants:
        axes.bar(starts, [row.offered_per_second for row in rows], width=widths, align="edge", alpha=0.6)
        return
    bottom = [0.0] * len(rows)
    for tenant in tenants:
        rates = [
            next((f.offered for f in row.tenants if f.tenant == tenant), 0) / width
            for row, width in zip(rows, widths, strict=True)
        ]
        axes.bar(
            starts, rates, width=widths, bottom=bottom, align="edge", alpha=0.6, label=f"{tenant} offered"
        )
        bottom = [b + r for b, r in zip(bottom, rates, strict=True)]
    refused = [row.rejected / width for row, width in zip(rows, widths, strict=True)]
    axes.step(starts, refused, where="post", color="black", linewidth=1, label="refused by the gateway")
    axes.legend(loc="upper right", fontsize=8)


def plot_timeline(
    rows: Sequence[IntervalRow],
    samples: Sequence[ModelGroupSample],
    decisions: Sequence[DecisionRecord],
    targets: SloTargets,
    *,
    title: str,
    out_dir: Path,
) -> list[Path]:
    """groups.png (offered load against desired, ready and draining groups, with the scaling
    decisions marked) and latency.png (TTFT p99 against its target, attainment against offered load)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    visible = [s for s in samples if s.offset_seconds >= 0]
    before = sample_at(samples, 0.0)
    series = (
        [ModelGroupSample(0.0, before.desired_groups, before.ready_groups, 0, before.draining_groups)]
        if before
        else []
    )
    series += visible
    times = [s.offset_seconds for s in series]

    figure, (load, groups) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    _plot_offered(load, rows)
    load.set_ylabel("offered requests / s")
    load.set_title(title)
    groups.step(times, [s.desired_groups for s in series], where="post", label="desired", color="tab:orange")
    groups.step(times, [s.ready_groups for s in series], where="post", label="ready", color="tab:green")
    groups.step(
        times,
        [s.draining_groups for s in series],
        where="post",
        label="draining",
        color="tab:gray",
        linestyle=":",
    )
    for decision in (d for d in decisions if d.changes and d.offset_seconds >= 0):
        groups.axvline(decision.offset_seconds, color="tab:red", alpha=0.3, linewidth=1)
        groups.annotate(
            decision.describe(),
            (decision.offset_seconds, decision.to_groups),
            textcoords="offset points",
            xytext=(3, 4),
            fontsize=7,
            color="tab:red",
        )
    groups.set_ylabel("groups")
    groups.set_xlabel("seconds since the load started")
    groups.set_ylim(bottom=0)
    groups.yaxis.get_major_locator().set_params(integer=True)
    groups.legend(loc="upper left")
    figure.tight_layout()
    groups_path = out_dir / "groups.png"
    figure.savefig(groups_path, dpi=110)
    plt.close(figure)

    latency_path = _plot_latency(plt, rows, targets, title=title, out_dir=out_dir)
    return [groups_path, latency_path]


def _plot_latency(
    plt: Any, rows: Sequence[IntervalRow], targets: SloTargets, *, title: str, out_dir: Path
) -> Path:
    """latency.png: TTFT p99 per interval against its target, attainment against offered load."""
    middles = [(row.start_seconds + row.end_seconds) / 2 for row in rows]
    figure, latency = plt.subplots(figsize=(10, 4.5))
    ttft = [math.nan if row.ttft_p99_seconds is None else row.ttft_p99_seconds for row in rows]
    latency.plot(middles, ttft, marker="o", color="tab:red", label="TTFT p99")
    latency.axhline(targets.ttft_seconds, color="tab:red", linestyle="--", alpha=0.5, label="TTFT target")
    latency.set_ylabel("TTFT p99 (s)")
    latency.set_xlabel("seconds since the load started")
    latency.set_title(f"{title}: latency and attainment")
    share = latency.twinx()
    attainment = [math.nan if row.attainment_offered is None else row.attainment_offered for row in rows]
    share.plot(middles, attainment, marker=".", color="tab:purple", label="attainment (offered)")
    share.axhline(targets.attainment, color="tab:purple", linestyle=":", alpha=0.5, label="attainment target")
    share.set_ylim(0, 1.05)
    share.set_ylabel("attainment against offered load")
    lines = latency.get_lines() + share.get_lines()
    latency.legend(lines, [str(line.get_label()) for line in lines], loc="lower left", fontsize=8)
    figure.tight_layout()
    latency_path = out_dir / "latency.png"
    figure.savefig(latency_path, dpi=110)
    plt.close(figure)
    return latency_path
