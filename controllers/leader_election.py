"""Leader election on a coordination.k8s.io/v1 Lease: the rules, without the I/O.

Several operator replicas compete for one Lease; the one named in `holderIdentity` acts, the others
wait. The rules are client-go's (`tools/leaderelection`), which controller-runtime and the Kubernetes
control plane use:

- A candidate never trusts the `renewTime` written by another machine's clock. It remembers when *it*
  last saw the record change (`observed_at_seconds`, its own monotonic clock) and takes the Lease only
  when the record has not changed for `leaseDurationSeconds` since then, or when the holder released
  it (an empty holder).
- The holder renews every retry period and counts its own deadline from the moment it *sent* its last
  successful renewal. Once `renew_deadline_seconds` pass without one it must stop acting at once. The
  renewal reached the API server after it was sent and another candidate saw it after that, so the
  holder stops at least `lease_duration - renew_deadline` seconds before anyone may take over.

Times in seconds: `*_seconds` values on a monotonic clock of the process (never compared between
machines), `datetime` values only for what is written into the Lease for people to read.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from goodput.api.times import parse_rfc3339, rfc3339_micros

# A waiting candidate sleeps the retry period and up to this fraction more between reads, so that
# candidates started together do not collide. The renew deadline must exceed that longest sleep
# (client-go's check against its JitterFactor of 1.2 retry periods).
RETRY_JITTER_FRACTION = 0.2
# A released Lease: no holder, and one second of duration so that any candidate takes it at once.
RELEASED_LEASE_DURATION_SECONDS = 1


@dataclass(frozen=True, slots=True)
class ElectionTiming:
    """client-go's defaults: 15 s lease, 10 s renew deadline, 2 s retry period."""

    lease_duration_seconds: int = 15
    renew_deadline_seconds: float = 10.0
    retry_period_seconds: float = 2.0

    def __post_init__(self) -> None:
        problems = timing_problems(self)
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def longest_retry_seconds(self) -> float:
        """The longest sleep of a waiting candidate between two reads of the Lease."""
        return self.retry_period_seconds * (1 + RETRY_JITTER_FRACTION)

    @property
    def takeover_bound_seconds(self) -> float:
        """Longest a follower waits after the holder's last renewal before it holds the Lease: it
        sees that renewal at its next read (up to one retry later), waits out the lease from there
        on its own clock, and takes over at its first read after that (up to one retry more)."""
        return self.lease_duration_seconds + 2 * self.longest_retry_seconds


def timing_problems(timing: ElectionTiming) -> list[str]:
    """What makes the timing unsafe, each naming the setting; empty when it is sound."""
    problems = []
    if timing.retry_period_seconds <= 0:
        problems.append(f"retry_period_seconds must be > 0, got {timing.retry_period_seconds:g}")
    if timing.renew_deadline_seconds <= timing.longest_retry_seconds:
        problems.append(
            f"renew_deadline_seconds ({timing.renew_deadline_seconds:g}) must exceed the longest retry, "
            f"{1 + RETRY_JITTER_FRACTION:g} x retry_period_seconds ({timing.retry_period_seconds:g})"
        )
    if timing.lease_duration_seconds <= timing.renew_deadline_seconds:
        problems.append(
            f"lease_duration_seconds ({timing.lease_duration_seconds}) must exceed "
            f"renew_deadline_seconds ({timing.renew_deadline_seconds:g}): the holder must stop before "
            "another replica may take over"
        )
    return problems


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """The election fields of a Lease's spec."""

    holder_identity: str
    lease_duration_seconds: int
    acquire_time: datetime | None = None
    renew_time: datetime | None = None
    lease_transitions: int = 0


@dataclass(frozen=True, slots=True)
class Observation:
    """A Lease as this candidate last read it: its record, its resourceVersion (the precondition of
    the next write), and when this record was first seen (monotonic seconds)."""

    record: LeaseRecord
    resource_version: str
    observed_at_seconds: float


class Step(enum.Enum):
    """What a candidate does with the Lease it just read."""

    CREATE = "create"  # no Lease yet: create it, holding it
    ACQUIRE = "acquire"  # held by nobody, or its holder stopped renewing: take it over
    RENEW = "renew"  # held by this candidate: renew it
    WAIT = "wait"  # held by another candidate that still renews: retry after the retry period


def observe(
    previous: Observation | None, record: LeaseRecord, resource_version: str, now_seconds: float
) -> Observation:
    """The observation after a read: the clock restarts whenever the record changed, so a holder that
    keeps renewing is never taken over, whatever its `renewTime` says."""
    if previous is not None and previous.record == record:
        return replace(previous, resource_version=resource_version)
    return Observation(record, resource_version, now_seconds)


def decide(identity: str, observation: Observation | None, now_seconds: float) -> Step:
    """client-go's tryAcquireOrRenew on a Lease just read (None: no Lease exists)."""
    if observation is None:
        return Step.CREATE
    record = observation.record
    if record.holder_identity == identity:
        return Step.RENEW
    if not record.holder_identity:
        return Step.ACQUIRE
    expires_at = observation.observed_at_seconds + record.lease_duration_seconds
    return Step.ACQUIRE if now_seconds >= expires_at else Step.WAIT


def claimed(
    step: Step, identity: str, current: LeaseRecord | None, now: datetime, timing: ElectionTiming
) -> LeaseRecord:
    """The record to write for CREATE, ACQUIRE or RENEW: a renewal keeps the acquire time and the
    transition count, a takeover from someone else counts one transition more."""
    if step is Step.WAIT:
        raise ValueError("a waiting candidate writes nothing")
    if step is Step.RENEW and current is not None:
        return replace(
            current,
            lease_duration_seconds=timing.lease_duration_seconds,
            renew_time=now,
            acquire_time=current.acquire_time or now,
        )
    transitions = 0 if current is None else current.lease_transitions + 1
    return LeaseRecord(identity, timing.lease_duration_seconds, now, now, transitions)


def released(current: LeaseRecord, now: datetime) -> LeaseRecord:
    """The record a holder writes when it stops cleanly: no holder, so the next candidate need not
    wait out the lease (client-go's ReleaseOnCancel)."""
    return replace(
        current, holder_identity="", lease_duration_seconds=RELEASED_LEASE_DURATION_SECONDS, renew_time=now
    )


def leadership_lost(renewal_sent_at_seconds: float, now_seconds: float, timing: ElectionTiming) -> bool:
    """True once the holder's last successful renewal, counted from when it was sent, is as old as
    the renew deadline: from then on the holder must not act."""
    return now_seconds - renewal_sent_at_seconds >= timing.renew_deadline_seconds


def seconds_left(renewal_sent_at_seconds: float, now_seconds: float, timing: ElectionTiming) -> float:
    """How long the holder may still act without another renewal (0 when it may not)."""
    return max(0.0, timing.renew_deadline_seconds - (now_seconds - renewal_sent_at_seconds))


# --- the Lease object ---------------------------------------------------------------------------------


def record_of(lease: Mapping[str, Any]) -> LeaseRecord:
    """The election fields of a Lease as the API server returned it. A Lease with missing or unreadable
    fields reads as released (no holder): client-go overwrites such a record too."""
    spec = lease.get("spec") or {}
    duration = spec.get("leaseDurationSeconds")
    transitions = spec.get("leaseTransitions")
    return LeaseRecord(
        holder_identity=str(spec.get("holderIdentity") or ""),
        lease_duration_seconds=int(duration) if isinstance(duration, int) and duration > 0 else 1,
        acquire_time=parse_rfc3339(spec.get("acquireTime")),
        renew_time=parse_rfc3339(spec.get("renewTime")),
        lease_transitions=int(transitions) if isinstance(transitions, int) and transitions >= 0 else 0,
    )


def lease_object(
    name: str, namespace: str, record: LeaseRecord, resource_version: str | None = None
) -> dict[str, Any]:
    """A whole Lease to create, or to replace conditionally on `resource_version`."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if resource_version:
        metadata["resourceVersion"] = resource_version
    spec: dict[str, Any] = {
        "holderIdentity": record.holder_identity,
        "leaseDurationSeconds": record.lease_duration_seconds,
        "leaseTransitions": record.lease_transitions,
    }
    if record.acquire_time is not None:
        spec["acquireTime"] = rfc3339_micros(record.acquire_time)
    if record.renew_time is not None:
        spec["renewTime"] = rfc3339_micros(record.renew_time)
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}
