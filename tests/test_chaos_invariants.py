"""The chaos run's invariants over frozen observations: each rule fires on the state it forbids, with
evidence naming the group, and stays quiet on the legitimate states next to it."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from goodput.testbed.chaos.invariants import (
    CheckerState,
    DecisionView,
    DrainCount,
    FaultMark,
    LeaderSpan,
    ModelGroupView,
    Observation,
    PodView,
    Rules,
    StreamView,
    Window,
    account_streams,
    check,
    drain_counts,
)

T0 = 1_000_000.0


def pods(group: str, ranks: int = 2, **flags: bool) -> tuple[PodView, ...]:
    return tuple(PodView(f"m-{group}-{r}", group, r, ip=f"10.1.0.{r}", **flags) for r in range(ranks))


def view(*pod_sets: tuple[PodView, ...], replicas: int = 2, **fields: object) -> ModelGroupView:
    all_pods = tuple(p for pod_set in pod_sets for p in pod_set)
    return ModelGroupView("m", replicas, 2, pods=all_pods, **fields)  # type: ignore[arg-type]


def run(
    *views: ModelGroupView, step_seconds: float = 1.0, windows: tuple[Window, ...] = ()
) -> list[tuple[str, str]]:
    """Check the views one after another; the (rule, evidence) of every violation found."""
    state = CheckerState()
    found = []
    for index, current in enumerate(views):
        result = check(Observation(T0 + index * step_seconds, (current,)), state, Rules(), windows)
        state = result.state
        found.extend((v.rule, v.evidence) for v in result.violations)
    return found


@dataclass(frozen=True)
class Case:
    name: str
    views: tuple[ModelGroupView, ...]
    rules: tuple[str, ...]
    step_seconds: float = 1.0
    windows: tuple[Window, ...] = field(default=())


CASES = [
    Case("two complete groups at two wanted", (view(pods("g1"), pods("g2")),), ()),
    Case("one surge group during a rollout", (view(pods("g1"), pods("g2"), pods("g3")),), ()),
    Case(
        "two groups over desired plus surge",
        (view(pods("g1"), pods("g2"), pods("g3"), pods("g4")),),
        ("too-many-groups",),
    ),
    Case(
        "draining and failed groups do not count against desired",
        (
            view(
                pods("g1"),
                pods("g2"),
                pods("g3", draining=True),
                pods("g4"),
                group_states={"g4": "Failed"},
            ),
        ),
        (),
    ),
    Case(
        "a scale-in just asked for: the old count holds for react_seconds",
        (
            view(pods("g1"), pods("g2"), pods("g3"), replicas=3),
            view(pods("g1"), pods("g2"), pods("g3"), replicas=1),
        ),
        (),
    ),
    Case(
        "a half-created group within its grace",
        (view(pods("g1"), pods("g2", ranks=1)),) * 3,
        (),
        step_seconds=10,
    ),
    Case(
        "a half-created group past its grace",
        (view(pods("g1"), pods("g2", ranks=1)),) * 6,
        ("incomplete-group",),
        step_seconds=10,
    ),
    Case(
        "a group whose rank 0 is being deleted while rank 1 stays",
        (view(pods("g1"), (PodView("m-g2-0", "g2", 0, deleting=True), PodView("m-g2-1", "g2", 1))),) * 6,
        ("incomplete-group",),
        step_seconds=10,
    ),
    Case(
        "a whole group being deleted is leaving, not incomplete",
        (view(pods("g1"), pods("g2", deleting=True)),) * 6,
        (),
        step_seconds=10,
    ),
    Case(
        "two pods holding one rank",
        (view(pods("g1"), (PodView("m-g1-0b", "g1", 0),)),),
        ("duplicate-rank",),
    ),
    Case(
        "a deleted group's name coming back",
        (view(pods("g1"), pods("g2")), view(pods("g1")), view(pods("g1"), pods("g2"))),
        ("group-name-reused",),
    ),
    Case(
        "a scale-in decided while Prometheus was stopped",
        (view(pods("g1"), decisions=(DecisionView(T0 + 8, 3, 2, "DesiredWithinRange"),)),),
        ("scale-in-on-stale-metrics",),
        windows=(Window(T0, T0 + 20, "stopped"),),
    ),
    Case(
        "a scale-out during the same fault is allowed",
        (view(pods("g1"), decisions=(DecisionView(T0 + 8, 2, 3, "DesiredWithinRange"),)),),
        (),
        windows=(Window(T0, T0 + 20, "stopped"),),
    ),
    Case(
        "a scale-in made on queries answered just before the fault",
        (view(pods("g1"), decisions=(DecisionView(T0 + 1, 3, 2),)),),
        (),
        windows=(Window(T0, T0 + 20, "stopped"),),
    ),
    Case(
        "a scale-in of an advisory policy is never applied",
        (view(pods("g1"), decisions=(DecisionView(T0 + 8, 3, 2, applied=False),)),),
        (),
        windows=(Window(T0, T0 + 20, "stopped"),),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_rules(case: Case) -> None:
    found = run(*case.views, step_seconds=case.step_seconds, windows=case.windows)
    assert tuple(rule for rule, _ in found) == case.rules, found


def autoscaled(
    replicas: int, decisions: tuple[DecisionView, ...] = (), events: tuple[tuple[float, int], ...] = ()
) -> ModelGroupView:
    return ModelGroupView(
        "a", replicas, 1, autoscaled=True, decisions=decisions, rescale_event_targets=events
    )


def test_a_replica_change_with_its_decision_record_is_settled() -> None:
    state = CheckerState()
    state = check(Observation(T0, (autoscaled(2),)), state).state
    state = check(Observation(T0 + 1, (autoscaled(3),)), state).state
    recorded = autoscaled(3, decisions=(DecisionView(T0 + 0.5, 2, 3),))
    result = check(Observation(T0 + 5, (recorded,)), state)
    later = check(Observation(T0 + 100, (autoscaled(3),)), result.state)
    assert result.violations == () and later.violations == ()


def test_a_rescale_event_also_records_the_change() -> None:
    state = check(Observation(T0, (autoscaled(2),)), CheckerState()).state
    state = check(Observation(T0 + 1, (autoscaled(1, events=((T0 + 0.8, 1),)),)), state).state
    assert check(Observation(T0 + 100, (autoscaled(1),)), state).violations == ()


def test_a_replica_change_nobody_recorded_is_reported_once_after_the_grace() -> None:
    state = check(Observation(T0, (autoscaled(2),)), CheckerState()).state
    state = check(Observation(T0 + 1, (autoscaled(4),)), state).state
    early = check(Observation(T0 + 10, (autoscaled(4, decisions=(DecisionView(T0 - 200, 1, 4),)),)), state)
    assert early.violations == ()
    late = check(Observation(T0 + 40, (autoscaled(4),)), early.state)
    assert [v.rule for v in late.violations] == ["decision-not-recorded"]
    assert "2 -> 4" in late.violations[0].evidence
    assert check(Observation(T0 + 41, (autoscaled(4),)), late.state).violations == ()


def test_the_manual_model_groups_changes_need_no_decision() -> None:
    state = check(Observation(T0, (view(replicas=1),)), CheckerState()).state
    state = check(Observation(T0 + 1, (view(replicas=3),)), state).state
    assert check(Observation(T0 + 100, (view(replicas=3),)), state).violations == ()


def test_deletions_remember_whether_the_group_drained_first() -> None:
    state = CheckerState()
    for at, current in [
        (T0, view(pods("g1"), pods("g2"))),
        (T0 + 1, view(pods("g1"), pods("g2", draining=True))),
        (T0 + 2, view(pods("g1"))),
        (T0 + 3, view(pods("g3"))),
    ]:
        state = check(Observation(at, (current,)), state).state
    assert [(d.group, d.drained, d.at) for d in state.deletions] == [
        ("g2", True, T0 + 2),
        ("g1", False, T0 + 3),
    ]


# --- stream accounting ---------------------------------------------------------------------------

LEADERS = (
    LeaderSpan("10.1.0.5", "m", "g1", T0, T0 + 100),
    LeaderSpan("10.1.0.6", "m", "g2", T0, T0 + 100),
    LeaderSpan("10.1.0.5", "m", "g7", T0 + 200, T0 + 300),  # the address reused by a later group
)


def stream(ip: str, outcome: str, sent: float = T0 + 10) -> StreamView:
    return StreamView(ip, sent, sent + 5, outcome)


@dataclass(frozen=True)
class StreamCase:
    name: str
    streams: tuple[StreamView, ...]
    faults: tuple[FaultMark, ...]
    counted: DrainCount
    lost: int
    rules: tuple[str, ...]


STREAM_CASES = [
    StreamCase(
        "all ok",
        (stream("10.1.0.5", "ok"), stream("10.1.0.6", "ok")),
        (),
        DrainCount("m", 0, frozenset()),
        0,
        (),
    ),
    StreamCase(
        "aborted by a timed-out drain and counted",
        (stream("10.1.0.6", "aborted"), stream("10.1.0.6", "cut")),
        (),
        DrainCount("m", 2, frozenset({"g2"})),
        0,
        (),
    ),
    StreamCase(
        "a timed-out drain that counted fewer than the clients saw",
        (stream("10.1.0.6", "aborted"), stream("10.1.0.6", "aborted")),
        (),
        DrainCount("m", 1, frozenset({"g2"})),
        1,
        ("stream-lost", "aborted-miscounted"),
    ),
    StreamCase(
        "one more counted than the clients saw: a stream that ended ok after the drain's deadline",
        (stream("10.1.0.6", "aborted"), stream("10.1.0.6", "ok", sent=T0 + 20)),
        (),
        DrainCount("m", 2, frozenset({"g2"}), {"g2": 2}, {"g2": T0 + 22}),
        0,
        (),
    ),
    StreamCase(
        "one more counted than the clients saw, but every ok stream ended before the deadline",
        (stream("10.1.0.6", "aborted"), stream("10.1.0.6", "ok", sent=T0 + 10)),
        (),
        DrainCount("m", 2, frozenset({"g2"}), {"g2": 2}, {"g2": T0 + 22}),
        0,
        ("aborted-miscounted",),
    ),
    StreamCase(
        "two more counted than the one stream that ended ok after the deadline",
        (stream("10.1.0.6", "ok", sent=T0 + 20),),
        (),
        DrainCount("m", 2, frozenset({"g2"}), {"g2": 2}, {"g2": T0 + 22}),
        0,
        ("aborted-miscounted",),
    ),
    StreamCase(
        "an ok stream after another group's deadline explains nothing",
        (stream("10.1.0.5", "ok", sent=T0 + 20),),
        (),
        DrainCount("m", 1, frozenset({"g2"}), {"g2": 1}, {"g2": T0 + 22}),
        0,
        ("aborted-miscounted",),
    ),
    StreamCase(
        "cut on a group deleted without a timed-out drain",
        (stream("10.1.0.5", "cut"),),
        (),
        DrainCount("m", 0, frozenset({"g2"})),
        1,
        ("stream-lost",),
    ),
    StreamCase(
        "cut by an injected rank crash on its group",
        (stream("10.1.0.5", "cut"),),
        (FaultMark("m", "g1", T0 + 12, "rank-crash-serving"),),
        DrainCount("m", 0, frozenset()),
        0,
        (),
    ),
    StreamCase(
        "hung by an injected fault, then aborted by the drain that timed out: the drain's to count",
        (stream("10.1.0.6", "aborted"),),
        (FaultMark("m", "g2", T0 + 11, "engine-hang"),),
        DrainCount("m", 1, frozenset({"g2"})),
        0,
        (),
    ),
    StreamCase(
        "a fault on another group explains nothing",
        (stream("10.1.0.5", "cut"),),
        (FaultMark("m", "g2", T0 + 12, "engine-hang"),),
        DrainCount("m", 0, frozenset()),
        1,
        ("stream-lost",),
    ),
    StreamCase(
        "a stream to a reused address belongs to the later group",
        (stream("10.1.0.5", "aborted", sent=T0 + 250),),
        (),
        DrainCount("m", 1, frozenset({"g7"})),
        0,
        (),
    ),
    StreamCase(
        "refused at connect is never admitted, not lost",
        (stream("10.1.0.6", "connect_error"),),
        (),
        DrainCount("m", 0, frozenset()),
        0,
        (),
    ),
]


@pytest.mark.parametrize("case", STREAM_CASES, ids=[c.name for c in STREAM_CASES])
def test_stream_accounting(case: StreamCase) -> None:
    rows, violations = account_streams(case.streams, LEADERS, case.faults, (case.counted,))
    (row,) = rows
    assert row.lost == case.lost
    assert tuple(v.rule for v in violations) == case.rules


@settings(max_examples=80, deadline=None)
@given(
    outcomes=st.lists(st.sampled_from(["ok", "aborted", "cut", "timeout", "connect_error"]), max_size=30),
    counted=st.integers(0, 40),
)
def test_every_stream_is_accounted_once(outcomes: list[str], counted: int) -> None:
    streams = [stream("10.1.0.6", outcome) for outcome in outcomes]
    (row,), _ = account_streams(streams, LEADERS, (), (DrainCount("m", counted, frozenset({"g2"})),))
    assert row.ok + row.failed + row.refused_at_connect == len(streams)
    assert row.ended_by_fault + row.ended_by_timed_out_drain <= row.failed
    assert row.lost == max(0, row.ended_by_timed_out_drain - counted)


def test_a_miscount_names_the_group_whose_drain_record_disagrees_with_the_clients() -> None:
    streams = [stream("10.1.0.6", "aborted"), stream("10.1.0.6", "aborted"), stream("10.1.0.5", "aborted")]
    counted = DrainCount("m", 2, frozenset({"g1", "g2"}), {"g1": 1, "g2": 1})
    _, violations = account_streams(streams, LEADERS, (), (counted,))
    (miscount,) = [v for v in violations if v.rule == "aborted-miscounted"]
    assert "g2 clients 2 / record 1" in miscount.evidence
    assert "g1" not in miscount.evidence.split("per group:")[1]


# --- drains whose aborted count is unknown ---------------------------------------------------------


def record(group: str, outcome: str = "TimedOut", **counts: int) -> dict[str, object]:
    return {"group": group, "outcome": outcome, "startedAt": "1970-01-12T13:46:40Z", **counts}


def test_a_timed_out_drain_recorded_without_an_abort_count_is_uncounted_not_counted_as_zero() -> None:
    records = {
        ("m", "g1", "1970-01-12T13:46:40Z"): record("g1", requestsAborted=2),
        ("m", "g2", "1970-01-12T13:46:40Z"): record("g2"),
        ("m", "g3", "1970-01-12T13:46:40Z"): record("g3", "Drained", requestsAborted=0),
    }
    statuses = {"m": {"drain": {"timedOut": 2, "requestsAborted": 2, "drainsWithUnknownAborts": 1}}}
    (count,) = drain_counts(statuses, records, drain_max_seconds=20)
    assert (count.aborted, dict(count.aborted_by_group)) == (2, {"g1": 2})
    assert count.timed_out_groups == {"g1", "g2"} and count.uncounted_groups == {"g2"}
    assert dict(count.deadline_by_group) == {"g1": T0 + 20}


def test_streams_ended_by_a_drain_whose_count_is_unknown_are_explained_and_compared_with_no_count() -> None:
    streams = (
        stream("10.1.0.6", "aborted"),
        stream("10.1.0.6", "cut"),
        stream("10.1.0.6", "ok", sent=T0 + 30),
    )
    counted = DrainCount("m", 0, frozenset({"g2"}), {}, {}, frozenset({"g2"}))
    (row,), violations = account_streams(streams, LEADERS, (), (counted,))
    assert violations == ()
    assert (row.failed, row.ended_by_uncounted_drain, row.ended_by_timed_out_drain, row.lost) == (2, 2, 0, 0)


def test_a_counted_drain_beside_an_uncounted_one_is_still_compared_with_the_clients() -> None:
    streams = (stream("10.1.0.6", "aborted"), stream("10.1.0.5", "aborted"), stream("10.1.0.5", "aborted"))
    counted = DrainCount("m", 1, frozenset({"g1", "g2"}), {"g1": 1}, {}, frozenset({"g2"}))
    (row,), violations = account_streams(streams, LEADERS, (), (counted,))
    assert (row.ended_by_timed_out_drain, row.ended_by_uncounted_drain, row.lost) == (2, 1, 1)
    assert [v.rule for v in violations] == ["stream-lost", "aborted-miscounted"]
