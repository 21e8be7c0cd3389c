"""Scale-in that loses nothing: the victim choice and the drain of one group, from frozen views."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from goodput.api.modelgroup import DrainRecord
from goodput.controllers.groups.drain import (
    DecidedDrain,
    DrainBaseline,
    DrainPolicy,
    DrainProgress,
    DrainView,
    KeepDraining,
    LeaderSample,
    ProbeFailure,
    RemoveGroup,
    ScaleInCandidate,
    choose_victims,
    drain_deadline,
    encode_outcome,
    encode_progress,
    parse_outcome,
    parse_progress,
    stale_loads,
    step_drain,
    too_young,
)
from goodput.controllers.groups.observation import RouteView, parse_endpoint_slice

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
LIFETIME = 300.0
OLD = NOW - timedelta(hours=1)


def ready(name: str, ordinal: int, *, ready_at: datetime = OLD, **load: float) -> ScaleInCandidate:
    sample = None
    if load:
        sample = LeaderSample(
            at=NOW,
            running=int(load.get("running", 0)),
            waiting=int(load.get("waiting", 0)),
            kv_cache_usage=load.get("kv"),
            prefix_cache_hit_ratio=load.get("hits"),
        )
    return ScaleInCandidate(name, "Ready", ordinal, ready_at=ready_at, load=sample)


# Victim choice.


@dataclass(frozen=True)
class VictimCase:
    name: str
    candidates: tuple[ScaleInCandidate, ...]
    count: int
    chosen: tuple[str, ...]
    may_ignore_lifetime: int = 0


VICTIM_CASES = [
    VictimCase(
        "not-ready groups first, cheapest state first",
        (
            ready("g0", 0, running=0),
            ScaleInCandidate("g1", "Warming", 1),
            ScaleInCandidate("g2", "Placing", 2),
            ScaleInCandidate("g3", "Provisioning", 3),
        ),
        2,
        ("g2", "g3"),
    ),
    VictimCase(
        "among equal states the latest created first",
        (ScaleInCandidate("g1", "Placing", 1), ScaleInCandidate("g4", "Placing", 4)),
        1,
        ("g4",),
    ),
    VictimCase(
        "the ready group with the fewest requests in flight",
        (ready("g0", 0, running=4, waiting=1), ready("g1", 1, running=1), ready("g2", 2, running=2)),
        1,
        ("g1",),
    ),
    VictimCase(
        "waiting requests count as in-flight work",
        (ready("g0", 0, running=1, waiting=5), ready("g1", 1, running=3)),
        1,
        ("g1",),
    ),
    VictimCase(
        "equal requests: the one holding less KV cache",
        (ready("g0", 0, running=2, kv=0.7), ready("g1", 1, running=2, kv=0.2)),
        1,
        ("g1",),
    ),
    VictimCase(
        "equal work: the one whose prefix cache is worth least",
        (ready("g0", 0, running=0, kv=0.0, hits=0.1), ready("g1", 1, running=0, kv=0.0, hits=0.6)),
        1,
        ("g0",),
    ),
    VictimCase(
        "nothing to tell them apart: the youngest",
        (ready("g0", 0, running=0), ready("g1", 1, running=0, ready_at=OLD + timedelta(minutes=5))),
        1,
        ("g1",),
    ),
    VictimCase(
        "an unknown load is taken after every known one",
        (ready("g0", 0), ready("g1", 1, running=30)),
        1,
        ("g1",),
    ),
    VictimCase(
        "too young to be drained",
        (ready("g0", 0, running=0, ready_at=NOW - timedelta(seconds=60)), ready("g1", 1, running=9)),
        1,
        ("g1",),
    ),
    VictimCase(
        "only young groups left: none chosen",
        (ready("g0", 0, running=0, ready_at=NOW - timedelta(seconds=60)),),
        1,
        (),
    ),
    VictimCase(
        "over maxReplicas: one young group may go too, the cheapest young one",
        (
            ready("g0", 0, running=0, ready_at=NOW - timedelta(seconds=60)),
            ready("g1", 1, running=9),
            ready("g2", 2, running=3, ready_at=NOW - timedelta(seconds=30)),
        ),
        3,
        ("g0", "g1"),
        1,
    ),
    VictimCase(
        "not-ready groups are never too young",
        (ScaleInCandidate("g5", "Placing", 5),),
        1,
        ("g5",),
    ),
]


@pytest.mark.parametrize("case", VICTIM_CASES, ids=lambda case: case.name)
def test_victim_choice(case: VictimCase) -> None:
    chosen = choose_victims(
        case.candidates,
        case.count,
        now=NOW,
        min_lifetime_seconds=LIFETIME,
        may_ignore_lifetime=case.may_ignore_lifetime,
    )
    assert tuple(c.name for c in chosen) == case.chosen


def test_outdated_ready_groups_go_before_current_ones() -> None:
    outdated = replace(ready("g0", 0, running=9), outdated=True)
    assert [
        c.name
        for c in choose_victims([ready("g1", 1, running=0), outdated], 1, now=NOW, min_lifetime_seconds=0)
    ] == ["g0"]


states = st.sampled_from(["Placing", "Provisioning", "Warming", "Ready"])


@st.composite
def candidate_sets(draw: st.DrawFn) -> list[ScaleInCandidate]:
    count = draw(st.integers(min_value=0, max_value=8))
    candidates = []
    for ordinal in range(count):
        state = draw(states)
        age = draw(st.integers(min_value=0, max_value=1000))
        load = draw(st.none() | st.tuples(st.integers(0, 50), st.integers(0, 50)))
        candidates.append(
            ScaleInCandidate(
                f"g{ordinal}",
                state,
                ordinal,
                ready_at=NOW - timedelta(seconds=age) if state == "Ready" else None,
                outdated=draw(st.booleans()),
                load=LeaderSample(NOW, *load) if load is not None else None,
            )
        )
    return candidates


@settings(max_examples=300, deadline=None)
@given(candidates=candidate_sets(), count=st.integers(0, 8), override=st.integers(0, 8))
def test_victim_choice_invariants(candidates: list[ScaleInCandidate], count: int, override: int) -> None:
    chosen = choose_victims(
        candidates, count, now=NOW, min_lifetime_seconds=LIFETIME, may_ignore_lifetime=override
    )
    names = {c.name for c in chosen}
    left = [c for c in candidates if c.name not in names]
    assert len(chosen) == len(names) <= count
    # Never a ready group while a group that serves nothing yet is left.
    if any(c.state == "Ready" for c in chosen):
        assert all(c.state == "Ready" for c in left)
    # Never a too-young group while an old-enough one is left.
    young_chosen = [c for c in chosen if too_young(c, NOW, LIFETIME)]
    if young_chosen:
        assert all(too_young(c, NOW, LIFETIME) for c in left)
    assert len(young_chosen) <= override
    # Only a lack of candidates old enough (or allowed) leaves the count short.
    allowed = [c for c in candidates if not too_young(c, NOW, LIFETIME)]
    assert len(chosen) == min(count, len(allowed) + min(override, len(candidates) - len(allowed)))


@settings(max_examples=200, deadline=None)
@given(candidates=candidate_sets(), count=st.integers(0, 8))
def test_victim_choice_does_not_depend_on_the_listing_order(
    candidates: list[ScaleInCandidate], count: int
) -> None:
    forward = choose_victims(candidates, count, now=NOW, min_lifetime_seconds=LIFETIME)
    backward = choose_victims(list(reversed(candidates)), count, now=NOW, min_lifetime_seconds=LIFETIME)
    assert forward == backward


def test_only_ready_groups_without_a_recent_reading_need_one() -> None:
    candidates = [
        ready("g0", 0),
        ready("g1", 1),
        ready("g2", 2),
        ScaleInCandidate("g3", "Warming", 3),
    ]
    readings = {
        "g0": LeaderSample(NOW - timedelta(seconds=3), 0, 0),
        "g1": LeaderSample(NOW - timedelta(seconds=60), 0, 0),
        "g2": ProbeFailure(NOW, "connection refused"),
    }
    assert stale_loads(candidates, readings, NOW) == ("g1",)


# The drain of one group.

POLICY = DrainPolicy(max_seconds=60, on_timeout="Abort", settle_seconds=5)
STARTED = NOW - timedelta(seconds=20)
BASELINE = DrainBaseline(STARTED, finished_total=100, aborted_total=2, in_flight=4)
SETTLED = DrainProgress(baseline=BASELINE, routes_stopped_at=STARTED + timedelta(seconds=2))


def sample(
    running: int, waiting: int = 0, *, at: datetime = NOW, finished: int = 100, aborted: int = 2
) -> LeaderSample:
    return LeaderSample(at, running, waiting, finished_total=finished, aborted_total=aborted)


@dataclass(frozen=True)
class StepCase:
    name: str
    view: DrainView
    expected: str
    """The phase of KeepDraining, or the outcome of RemoveGroup."""
    finished: int | None = None
    aborted: int | None = None
    policy: DrainPolicy = POLICY
    now: datetime = NOW
    message: str = ""


def view(**changes: object) -> DrainView:
    base = DrainView(group="g1", started_at=STARTED, progress=SETTLED, reading=sample(0, finished=104))
    return replace(base, **changes)  # type: ignore[arg-type]


STEP_CASES = [
    StepCase("idle after routing stopped and settled", view(), "Drained", finished=4, aborted=0),
    StepCase(
        "requests still running",
        view(reading=sample(2, 1)),
        "WaitingForRequests",
        message="2 running and 1 waiting",
    ),
    StepCase(
        "a rank still a ready endpoint",
        view(routed_pods=("llama-g1-0",)),
        "StoppingRoutes",
        message="llama-g1-0 to leave the Service endpoints",
    ),
    StepCase(
        "endpoints just removed: routers get time to notice",
        view(progress=DrainProgress(baseline=BASELINE, routes_stopped_at=NOW - timedelta(seconds=1))),
        "Settling",
    ),
    StepCase(
        "an idle reading from before routing settled is not trusted",
        view(
            progress=DrainProgress(baseline=BASELINE, routes_stopped_at=NOW - timedelta(seconds=6)),
            reading=sample(0, at=NOW - timedelta(seconds=3)),
        ),
        "WaitingForRequests",
    ),
    StepCase(
        "the leader cannot be read",
        view(reading=ProbeFailure(NOW, "timeout"), last_sample=sample(0, at=NOW - timedelta(seconds=2))),
        "ReadingLeader",
    ),
    StepCase(
        "time is up: the requests in flight are aborted and counted",
        view(started_at=NOW - timedelta(seconds=61), reading=sample(3, 1, finished=103)),
        "TimedOut",
        finished=3,
        aborted=4,
        message="4 request(s) still in flight",
    ),
    StepCase(
        "time is up: engine-side aborts during the drain count too",
        view(started_at=NOW - timedelta(seconds=61), reading=sample(1, finished=103, aborted=4)),
        "TimedOut",
        finished=3,
        aborted=3,
    ),
    StepCase(
        "time is up but the reading predates the limit: read once more",
        view(started_at=NOW - timedelta(seconds=61), reading=sample(3, at=NOW - timedelta(seconds=2))),
        "ReadingLeader",
    ),
    StepCase(
        "time is up and the leader stays unreadable: the last reading counts",
        view(
            started_at=NOW - timedelta(seconds=70),
            reading=ProbeFailure(NOW, "connection refused"),
            last_sample=sample(2, at=NOW - timedelta(seconds=12), finished=101),
        ),
        "TimedOut",
        finished=1,
        aborted=2,
    ),
    StepCase(
        "time is up and the leader was never read",
        view(started_at=NOW - timedelta(seconds=70), reading=None, progress=DrainProgress()),
        "TimedOut",
        finished=None,
        aborted=None,
        message="could not be read",
    ),
    StepCase(
        "Requeue without a gateway says so and aborts",
        view(started_at=NOW - timedelta(seconds=61), reading=sample(2)),
        "TimedOut",
        aborted=2,
        finished=0,
        policy=replace(POLICY, on_timeout="Requeue"),
        message="no gateway is configured",
    ),
    StepCase(
        "time is up while a Service still routes to it",
        view(started_at=NOW - timedelta(seconds=61), routed_pods=("llama-g1-0",), reading=sample(3)),
        "TimedOut",
        aborted=3,
        finished=0,
        message="still listed as ready Service endpoints: deleted every rank; at least 3 request(s) aborted",
    ),
]


@pytest.mark.parametrize("case", STEP_CASES, ids=lambda case: case.name)
def test_drain_step(case: StepCase) -> None:
    step = step_drain(case.view, case.policy, case.now)
    if isinstance(step, RemoveGroup):
        assert step.outcome == case.expected
        assert (step.requests_finished, step.requests_aborted) == (case.finished, case.aborted)
        assert step.duration_seconds == (case.now - case.view.started_at).total_seconds()
    else:
        assert step.phase == case.expected
        assert step.probe
    assert case.message in step.message


def test_the_first_reading_after_the_start_becomes_the_baseline() -> None:
    step = step_drain(
        DrainView("g1", STARTED, progress=DrainProgress(), reading=sample(5, 2, finished=40, aborted=1)),
        POLICY,
        NOW,
    )
    assert isinstance(step, KeepDraining)
    assert step.progress.baseline == DrainBaseline(NOW, 40, 1, 7)
    assert step.progress.routes_stopped_at == NOW


def test_a_reading_from_before_the_drain_is_not_its_baseline() -> None:
    before = sample(5, at=STARTED - timedelta(seconds=1))
    step = step_drain(DrainView("g1", STARTED, progress=DrainProgress(), reading=before), POLICY, NOW)
    assert step.progress.baseline is None if isinstance(step, KeepDraining) else False


def test_routes_coming_back_restart_the_settling() -> None:
    step = step_drain(view(routed_pods=("llama-g1-0",)), POLICY, NOW)
    assert isinstance(step, KeepDraining) and step.progress.routes_stopped_at is None


def test_an_unreachable_leader_is_not_probed() -> None:
    step = step_drain(view(reading=sample(1), leader_reachable=False), POLICY, NOW)
    assert isinstance(step, KeepDraining) and not step.probe


@settings(max_examples=300, deadline=None)
@given(
    elapsed_ms=st.integers(min_value=0, max_value=200_000),
    max_seconds=st.integers(min_value=0, max_value=120),
    in_flight=st.integers(0, 20),
    routed=st.booleans(),
    reading_age_ms=st.integers(min_value=0, max_value=30_000),
)
def test_a_drain_never_removes_a_busy_group_before_its_time(
    elapsed_ms: int, max_seconds: int, in_flight: int, routed: bool, reading_age_ms: int
) -> None:
    elapsed = elapsed_ms / 1000
    reading_age = reading_age_ms / 1000
    started = NOW - timedelta(seconds=elapsed)
    step = step_drain(
        DrainView(
            "g1",
            started,
            routed_pods=("llama-g1-0",) if routed else (),
            progress=DrainProgress(routes_stopped_at=started),
            reading=sample(in_flight, at=NOW - timedelta(seconds=reading_age)),
        ),
        DrainPolicy(max_seconds=max_seconds, settle_seconds=5),
        NOW,
    )
    if isinstance(step, RemoveGroup):
        if step.outcome == "Drained":
            assert in_flight == 0 and not routed
        else:
            assert elapsed >= max_seconds
            assert step.requests_aborted is not None and step.requests_aborted >= in_flight
    else:
        assert elapsed < max_seconds + POLICY.final_reading_grace_seconds


# A drain resumed by another operator (after a takeover or a restart): the time nobody acted is
# not the engine's. The drain below began 34.1 s before NOW with a 20 s limit, its routes stopped
# and settled; the operator that resumed it made its first pass at RESUMED.

RESUME_POLICY = DrainPolicy(max_seconds=20, on_timeout="Abort", settle_seconds=5)
BEGAN = NOW - timedelta(seconds=34.1)
RESUMED = NOW - timedelta(seconds=0.4)
ROUTES_GONE = DrainProgress(
    baseline=DrainBaseline(BEGAN, finished_total=100, aborted_total=2, in_flight=0),
    routes_stopped_at=BEGAN + timedelta(seconds=1),
)


def resumed(**changes: object) -> DrainView:
    base = DrainView(group="g1", started_at=BEGAN, progress=ROUTES_GONE, reading=None, resumed_at=RESUMED)
    return replace(base, **changes)  # type: ignore[arg-type]


@dataclass(frozen=True)
class ResumeCase:
    name: str
    view: DrainView
    now: datetime
    expected: str
    """The phase of KeepDraining, or the outcome of RemoveGroup."""
    message: str = ""


RESUME_CASES = [
    ResumeCase(
        "resumed past the limit counted from its start: the leader is read before anything is judged",
        resumed(),
        NOW,
        "ReadingLeader",
        message="not known yet",
    ),
    ResumeCase(
        "resumed and the leader idle: drained, not timed out",
        resumed(reading=sample(0, at=NOW)),
        NOW,
        "Drained",
    ),
    ResumeCase(
        "resumed with requests running: the time left counts from the resume",
        resumed(reading=sample(2, at=NOW)),
        NOW,
        "WaitingForRequests",
        message="(20s left)",
    ),
    ResumeCase(
        "resumed and busy for the whole limit after the resume: timed out, and the message says since when",
        resumed(reading=sample(2, at=RESUMED + timedelta(seconds=20.5))),
        RESUMED + timedelta(seconds=20.5),
        "TimedOut",
        message="counted from 2026-03-01T11:59:59.600Z, when this operator resumed the drain 33.7s "
        "after it began",
    ),
    ResumeCase(
        "resumed and the leader never answers: timed out at the limit after the resume, count unknown",
        resumed(reading=ProbeFailure(RESUMED + timedelta(seconds=26), "connection refused")),
        RESUMED + timedelta(seconds=26),
        "TimedOut",
        message="an unknown number of request(s) aborted",
    ),
    ResumeCase(
        "begun by this operator, past its limit and never read: timed out as before",
        resumed(resumed_at=None),
        NOW,
        "TimedOut",
        message="could not be read",
    ),
]


@pytest.mark.parametrize("case", RESUME_CASES, ids=lambda case: case.name)
def test_a_resumed_drain_is_judged_on_the_time_an_operator_watched_it(case: ResumeCase) -> None:
    step = step_drain(case.view, RESUME_POLICY, case.now)
    if isinstance(step, RemoveGroup):
        assert step.outcome == case.expected
        assert step.duration_seconds == (case.now - BEGAN).total_seconds(), "the whole drain, as it lasted"
    else:
        assert step.phase == case.expected and step.probe
    assert case.message in step.message


def test_the_deadline_counts_from_the_start_or_from_the_resume_whichever_is_later() -> None:
    assert drain_deadline(resumed(resumed_at=None), RESUME_POLICY) == BEGAN + timedelta(seconds=20)
    assert drain_deadline(resumed(), RESUME_POLICY) == RESUMED + timedelta(seconds=20)
    assert drain_deadline(resumed(resumed_at=BEGAN - timedelta(seconds=5)), RESUME_POLICY) == (
        BEGAN + timedelta(seconds=20)
    )


@settings(max_examples=200, deadline=None)
@given(
    absent_ms=st.integers(min_value=0, max_value=120_000),
    since_resume_ms=st.integers(min_value=0, max_value=40_000),
    in_flight=st.integers(0, 5),
)
def test_a_resumed_busy_drain_is_never_timed_out_before_the_limit_has_passed_since_the_resume(
    absent_ms: int, since_resume_ms: int, in_flight: int
) -> None:
    resumed_at = BEGAN + timedelta(milliseconds=absent_ms)
    now = resumed_at + timedelta(milliseconds=since_resume_ms)
    view = resumed(resumed_at=resumed_at, reading=sample(in_flight, at=now))
    step = step_drain(view, RESUME_POLICY, now)
    if isinstance(step, RemoveGroup) and step.outcome == "TimedOut":
        assert since_resume_ms >= RESUME_POLICY.max_seconds * 1000


# Persistence of a drain's progress on the leader.


@pytest.mark.parametrize(
    "progress",
    [
        DrainProgress(),
        DrainProgress(baseline=BASELINE),
        DrainProgress(routes_stopped_at=NOW),
        SETTLED,
        DrainProgress(
            DrainBaseline(NOW.replace(microsecond=250_000), 3, 0, 1), NOW.replace(microsecond=500_000)
        ),
    ],
    ids=["empty", "baseline only", "routes only", "both", "sub-second times"],
)
def test_progress_round_trips_through_its_annotation(progress: DrainProgress) -> None:
    assert parse_progress(encode_progress(progress)) == progress


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, None),
        ("", None),
        ("not json", DrainProgress()),
        ("[1, 2]", DrainProgress()),
        ('{"baseline": {"at": "yesterday", "finished": 1, "aborted": 0, "inFlight": 0}}', DrainProgress()),
        (
            '{"baseline": {"at": "2026-03-01T12:00:00Z", "finished": -1, "aborted": 0, "inFlight": 0}}',
            DrainProgress(),
        ),
        ('{"routesStoppedAt": "2026-03-01T12:00:00Z"}', DrainProgress(routes_stopped_at=NOW)),
    ],
    ids=["absent", "empty", "garbage", "not an object", "bad time", "negative counter", "routes only"],
)
def test_an_unreadable_progress_counts_as_unknown_not_as_an_error(
    text: str | None, expected: DrainProgress | None
) -> None:
    assert parse_progress(text) == expected


# EndpointSlices: where a draining group's pods must have left.


@dataclass(frozen=True)
class SliceCase:
    name: str
    labels: dict[str, str]
    endpoints: list[dict[str, object]]
    routes: tuple[RouteView, ...] = field(default_factory=tuple)


def endpoint(pod: str, ready: bool | None, kind: str = "Pod") -> dict[str, object]:
    conditions = {} if ready is None else {"ready": ready, "serving": ready}
    return {"addresses": ["10.0.0.1"], "conditions": conditions, "targetRef": {"kind": kind, "name": pod}}


SERVICE = {"kubernetes.io/service-name": "llama"}
SLICE_CASES = [
    SliceCase(
        "ready and not-ready group pods",
        SERVICE,
        [endpoint("llama-g0-0", True), endpoint("llama-g1-0", False)],
        (RouteView("llama-g0-0", "llama", True), RouteView("llama-g1-0", "llama", False)),
    ),
    SliceCase(
        "no ready condition means ready",
        SERVICE,
        [endpoint("llama-g0-0", None)],
        (RouteView("llama-g0-0", "llama", True),),
    ),
    SliceCase("other workloads' pods are left out", SERVICE, [endpoint("web-7d9f-abcde", True)]),
    SliceCase("targets that are not pods are left out", SERVICE, [endpoint("llama-g0-0", True, kind="Node")]),
    SliceCase(
        "a group's own rendezvous Service carries no traffic",
        {**SERVICE, "goodput.dev/group": "g0"},
        [endpoint("llama-g0-0", True)],
    ),
]


@pytest.mark.parametrize("case", SLICE_CASES, ids=lambda case: case.name)
def test_endpoint_slices(case: SliceCase) -> None:
    body = {"metadata": {"name": "llama-x7k2p", "labels": case.labels}, "endpoints": case.endpoints}
    assert parse_endpoint_slice(body) == case.routes


# The drain-outcome annotation: what a restarted operator records must be what was decided.


def _drain_record(**fields: Any) -> DrainRecord:
    """A record by its Python field names (hypothesis would otherwise also fill the wire aliases)."""
    return DrainRecord(**fields)


drain_records = st.builds(
    _drain_record,
    group=st.from_regex(r"[a-z][a-z0-9-]{0,40}[a-z0-9]", fullmatch=True),
    outcome=st.sampled_from(["Drained", "TimedOut"]),
    started_at=st.datetimes(
        min_value=datetime(2020, 1, 1), max_value=datetime(2040, 1, 1), timezones=st.just(UTC)
    ),
    ended_at=st.datetimes(
        min_value=datetime(2020, 1, 1), max_value=datetime(2040, 1, 1), timezones=st.just(UTC)
    ),
    duration_seconds=st.floats(min_value=0, max_value=1e6),
    requests_finished=st.none() | st.integers(min_value=0, max_value=10**9),
    requests_aborted=st.none() | st.integers(min_value=0, max_value=10**9),
    on_timeout=st.none() | st.sampled_from(["Abort", "Requeue"]),
)


@settings(max_examples=200, deadline=None)
@given(drain_records, st.text(max_size=200))
def test_a_drain_outcome_reads_back_as_the_status_record_decided(record: DrainRecord, message: str) -> None:
    decided = DecidedDrain(record=record, message=message)
    assert parse_outcome(encode_outcome(decided), record.group) == decided


def test_an_outcome_written_before_the_record_was_the_apis_reads_with_the_pods_group() -> None:
    text = (
        '{"durationSeconds":38.117,"endedAt":"2026-01-01T00:00:38.117Z","message":"group g1 drained",'
        '"outcome":"Drained","requestsAborted":0,"requestsFinished":5,"startedAt":"2026-01-01T00:00:00.000Z"}'
    )
    decided = parse_outcome(text, "g1")
    assert decided is not None
    assert (decided.record.group, decided.record.ended_at, decided.message) == (
        "g1",
        datetime(2026, 1, 1, 0, 0, 38, tzinfo=UTC),
        "group g1 drained",
    )


@pytest.mark.parametrize(
    "text",
    [
        None,
        "",
        "not json",
        "[]",
        '{"outcome": "Vanished", "startedAt": "2026-01-01T00:00:00Z"}',
        '{"outcome": "Drained", "startedAt": "yesterday", "endedAt": "2026-01-01T00:00:00Z", '
        '"durationSeconds": 1}',
        '{"outcome": "Drained", "startedAt": "2026-01-01T00:00:00Z", "endedAt": "2026-01-01T00:00:00Z", '
        '"durationSeconds": -4}',
    ],
    ids=["absent", "empty", "not json", "not an object", "unknown outcome", "bad time", "negative"],
)
def test_an_unreadable_drain_outcome_is_none_so_the_drain_decides_again(text: str | None) -> None:
    assert parse_outcome(text, "g1") is None


def test_a_drain_outcome_with_unreadable_counts_keeps_them_unknown() -> None:
    text = (
        '{"outcome": "TimedOut", "startedAt": "2026-01-01T00:00:00Z", "endedAt": "2026-01-01T00:01:00Z", '
        '"durationSeconds": 60, "requestsFinished": "many", "requestsAborted": -1, "onTimeout": "Retry"}'
    )
    decided = parse_outcome(text, "g1")
    assert decided is not None
    record = decided.record
    assert (record.requests_finished, record.requests_aborted, record.on_timeout) == (None, None, None)
