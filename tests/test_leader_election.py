"""The Lease rules of leader election: who creates, renews, takes over or waits, and when a holder
must stop, on named cases and as properties over any timing and any moment."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from goodput.controllers.leader_election import (
    RETRY_JITTER_FRACTION,
    ElectionTiming,
    LeaseRecord,
    Observation,
    Step,
    claimed,
    decide,
    leadership_lost,
    lease_object,
    observe,
    record_of,
    released,
    seconds_left,
)

AT = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
TIMING = ElectionTiming()


def held_by(holder: str, duration: int = 15, transitions: int = 0) -> LeaseRecord:
    return LeaseRecord(holder, duration, AT, AT, transitions)


@dataclass(frozen=True)
class Case:
    name: str
    observation: Observation | None
    now_seconds: float
    expected: Step


CASES = [
    Case("no lease yet: create it", None, 0.0, Step.CREATE),
    Case("held by me: renew", Observation(held_by("me"), "1", 100.0), 100.0, Step.RENEW),
    Case("held by me, even long unrenewed: renew", Observation(held_by("me"), "1", 0.0), 500.0, Step.RENEW),
    Case("released (no holder): take it at once", Observation(held_by(""), "1", 100.0), 100.0, Step.ACQUIRE),
    Case("held by another, just seen: wait", Observation(held_by("other"), "1", 100.0), 100.0, Step.WAIT),
    Case(
        "held by another, unchanged for 14.9 s of 15: wait",
        Observation(held_by("other"), "1", 100.0),
        114.9,
        Step.WAIT,
    ),
    Case(
        "held by another, unchanged for the whole lease: take over",
        Observation(held_by("other"), "1", 100.0),
        115.0,
        Step.ACQUIRE,
    ),
    Case(
        "the holder's own shorter lease counts, not ours",
        Observation(held_by("other", duration=5), "1", 100.0),
        105.0,
        Step.ACQUIRE,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_decide(case: Case) -> None:
    assert decide("me", case.observation, case.now_seconds) is case.expected


def test_the_clock_restarts_only_when_the_record_changes() -> None:
    first = observe(None, held_by("other"), "1", now_seconds=10.0)
    same = observe(first, held_by("other"), "2", now_seconds=14.0)
    assert (same.observed_at_seconds, same.resource_version) == (10.0, "2")
    renewed = LeaseRecord("other", 15, AT, AT + timedelta(seconds=2))
    changed = observe(same, renewed, "3", now_seconds=16.0)
    assert changed.observed_at_seconds == 16.0
    # A holder that keeps renewing is never taken over, whatever time its clock writes.
    assert decide("me", changed, 16.0 + 14.0) is Step.WAIT


def test_a_renewal_keeps_the_acquire_time_and_transitions_a_takeover_counts_one() -> None:
    later = AT + timedelta(seconds=30)
    mine = held_by("me", transitions=4)
    renewed = claimed(Step.RENEW, "me", mine, later, TIMING)
    assert (renewed.holder_identity, renewed.acquire_time, renewed.renew_time) == ("me", AT, later)
    assert renewed.lease_transitions == 4
    taken = claimed(Step.ACQUIRE, "me", held_by("other", transitions=4), later, TIMING)
    assert (taken.holder_identity, taken.acquire_time, taken.lease_transitions) == ("me", later, 5)
    created = claimed(Step.CREATE, "me", None, later, TIMING)
    assert (created.lease_transitions, created.lease_duration_seconds) == (0, 15)
    with pytest.raises(ValueError, match="writes nothing"):
        claimed(Step.WAIT, "me", mine, later, TIMING)


def test_a_released_lease_is_taken_at_once_by_the_next_candidate() -> None:
    gone = released(held_by("me", transitions=2), AT)
    assert (gone.holder_identity, gone.lease_duration_seconds, gone.lease_transitions) == ("", 1, 2)
    assert decide("other", Observation(gone, "9", 50.0), 50.0) is Step.ACQUIRE


@pytest.mark.parametrize(
    ("timing", "message"),
    [
        ({"retry_period_seconds": 0.0}, "retry_period_seconds must be > 0"),
        (
            {"renew_deadline_seconds": 2.0, "retry_period_seconds": 2.0},
            "renew_deadline_seconds .* must exceed",
        ),
        (
            {"lease_duration_seconds": 10, "renew_deadline_seconds": 10.0},
            "lease_duration_seconds .* must exceed",
        ),
    ],
    ids=["retry not positive", "deadline within one retry", "lease not longer than the deadline"],
)
def test_unsafe_timings_are_refused_naming_the_setting(timing: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ElectionTiming(**timing)  # type: ignore[arg-type]


def test_the_holder_stops_at_its_renew_deadline_counted_from_the_sent_renewal() -> None:
    assert not leadership_lost(100.0, 109.99, TIMING)
    assert leadership_lost(100.0, 110.0, TIMING)
    assert seconds_left(100.0, 104.0, TIMING) == pytest.approx(6.0)
    assert seconds_left(100.0, 120.0, TIMING) == 0.0


def test_a_lease_round_trips_through_its_object() -> None:
    record = LeaseRecord("op-a_1f2e", 15, AT, AT + timedelta(microseconds=250), 3)
    body = lease_object("goodput", "ops", record, resource_version="42")
    assert body["metadata"] == {"name": "goodput", "namespace": "ops", "resourceVersion": "42"}
    assert body["spec"]["renewTime"] == "2026-03-01T12:00:00.000250Z"
    assert record_of(body) == record


@pytest.mark.parametrize(
    "spec",
    [
        {},
        {"holderIdentity": None, "leaseDurationSeconds": "x"},
        {"renewTime": "yesterday", "leaseTransitions": -1},
    ],
    ids=["empty", "wrong types", "unreadable time"],
)
def test_an_unreadable_lease_reads_as_released(spec: dict[str, object]) -> None:
    record = record_of({"spec": spec})
    assert record.holder_identity == ""
    assert decide("me", Observation(record, "1", 0.0), 0.0) is Step.ACQUIRE


timings = st.builds(
    lambda retry, deadline_extra, lease_extra: ElectionTiming(
        lease_duration_seconds=int(retry * 1.2 + deadline_extra) + lease_extra,
        renew_deadline_seconds=retry * 1.2 + deadline_extra,
        retry_period_seconds=retry,
    ),
    st.floats(0.1, 10),
    st.floats(0.01, 30),
    st.integers(1, 60),
)


@given(
    timing=timings,
    renewal_sent=st.floats(0, 1e5),
    delivery_delay=st.floats(0, 60),
    later=st.floats(0, 600),
)
def test_no_two_leaders_a_follower_takes_over_only_after_the_holder_stopped(
    timing: ElectionTiming, renewal_sent: float, delivery_delay: float, later: float
) -> None:
    """The follower sees the holder's last renewal no earlier than it was sent; at any moment it would
    take over, the holder has already passed its renew deadline (on the same clock's rate)."""
    observed_at = renewal_sent + delivery_delay
    now = observed_at + later
    record = held_by("leader", duration=timing.lease_duration_seconds)
    if decide("follower", Observation(record, "1", observed_at), now) is Step.ACQUIRE:
        assert leadership_lost(renewal_sent, now, timing)
        margin = timing.lease_duration_seconds - timing.renew_deadline_seconds
        assert now - (renewal_sent + timing.renew_deadline_seconds) >= margin - 1e-6


@given(timing=timings, observed_at=st.floats(0, 1e5), later=st.floats(0, 600))
def test_a_follower_takes_over_within_the_lease_after_the_last_change(
    timing: ElectionTiming, observed_at: float, later: float
) -> None:
    record = held_by("leader", duration=timing.lease_duration_seconds)
    step = decide("follower", Observation(record, "1", observed_at), observed_at + later)
    assert step is (Step.ACQUIRE if later >= timing.lease_duration_seconds else Step.WAIT)


def takeover_after_last_renewal(
    timing: ElectionTiming, first_read_after_renewal: float, sleep_fractions: list[float]
) -> float:
    """Seconds from the holder's last renewal until a follower polling as `Elector.acquire` does takes
    over: it reads `first_read_after_renewal` seconds after that renewal, then sleeps the retry period
    and its jitter times the next of `sleep_fractions` (in turn) between reads, deciding on each read
    with the rules."""
    record = held_by("leader", duration=timing.lease_duration_seconds)
    observation = observe(None, record, "1", first_read_after_renewal)
    now = first_read_after_renewal
    reads = math.ceil(timing.takeover_bound_seconds / timing.retry_period_seconds) + 2
    for fraction in itertools.islice(itertools.cycle(sleep_fractions), reads):
        if decide("follower", observation, now) is Step.ACQUIRE:
            return now
        observation = observe(observation, record, "1", now)
        now += timing.retry_period_seconds * (1 + RETRY_JITTER_FRACTION * fraction)
    raise AssertionError("the follower never took over")


def test_a_follower_that_sees_the_last_renewal_a_retry_late_takes_over_past_lease_plus_retry() -> None:
    """The case that makes the bound two retries: the follower read just before the last renewal, so
    it sees it a whole (jittered) retry later and counts the lease from there."""
    longest = TIMING.longest_retry_seconds
    seconds = takeover_after_last_renewal(TIMING, first_read_after_renewal=longest, sleep_fractions=[1.0])
    assert seconds > TIMING.lease_duration_seconds + TIMING.retry_period_seconds
    assert seconds <= TIMING.takeover_bound_seconds


@given(
    timing=timings,
    first_read=st.floats(0, 1),
    sleep_fractions=st.lists(st.floats(0, 1), min_size=1, max_size=50),
)
def test_a_follower_takes_over_within_the_bound_after_the_last_renewal(
    timing: ElectionTiming, first_read: float, sleep_fractions: list[float]
) -> None:
    seconds = takeover_after_last_renewal(timing, first_read * timing.longest_retry_seconds, sleep_fractions)
    assert timing.lease_duration_seconds <= seconds <= timing.takeover_bound_seconds + 1e-9
