"""Recording decisions: status entries and history, Events on transitions, conditions, and the
decision state that survives a restart. Decisions come from `decide` on the small worlds of
test_autoscale_world, so every record here is one the pipeline can produce.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_autoscale_world import DEFAULT, PERMISSIVE, TTFT_BUCKETS, group, load, ready_groups, world

from goodput.api.conditions import Condition, find_condition
from goodput.api.modelgroup import GroupStatus, ModelGroupStatus
from goodput.api.reasons import Attainability, Guard
from goodput.controllers.autoscale import decide
from goodput.controllers.autoscale.behavior import stabilize
from goodput.controllers.autoscale.feasible_demand import AttainabilityVerdict
from goodput.controllers.autoscale.model import (
    CapacitySource,
    ClassFeasibility,
    Decision,
    DecisionState,
    GoodputTrial,
    LearntCapacity,
    Mode,
    Recommendation,
    ScaleEvent,
    ScalingPolicy,
    ScalingRules,
    SloCheck,
    StepPolicy,
    StepPolicyType,
)
from goodput.controllers.autoscale.record import (
    HISTORY_LIMIT,
    attainability_conditions,
    attainability_event,
    autoscaler_conditions,
    capacity_status,
    decision_entry,
    decision_events,
    decode_states,
    encode_states,
    failure_conditions,
    failure_event,
    feasibility_status,
    metrics_health,
    persist_due,
    record_decisions,
    record_rescale,
    rescale_note,
    unrecorded_rescale,
)
from goodput.controllers.ownership import AUTOSCALER_STATUS, GROUP_STATUS
from goodput.estimators.attainment import Histogram

NOW = 1_800_000_000.0
WHEN = datetime.fromtimestamp(NOW, UTC)


def decided(snapshot_groups: tuple, policy: ScalingPolicy = PERMISSIVE, **world_options: object) -> Decision:
    return decide(world(*snapshot_groups, **world_options), policy, DecisionState.initial(), NOW)  # type: ignore[arg-type]


SCALE_OUT = decided(ready_groups(1, 1.5))  # one overloaded group: queueWork asks for 2
HOLD = decided(ready_groups(2, 0.7))  # two groups, each inside capacity
ADVISORY = decided(ready_groups(1, 1.5), dataclasses.replace(PERMISSIVE, mode=Mode.ADVISORY))
STALE_HOLD = decided((group(load(0.0, age=600.0), name="g0"), *ready_groups(2, 0.0)[1:]))
CLAMPED = decided(ready_groups(2, 3.0), dataclasses.replace(PERMISSIVE, max_groups=3))


def test_the_worlds_decide_what_the_tests_assume() -> None:
    assert (SCALE_OUT.current_groups, SCALE_OUT.desired_groups, SCALE_OUT.reason) == (1, 2, "queueWork")
    assert HOLD.desired_groups == HOLD.current_groups == 2
    assert (ADVISORY.desired_groups, ADVISORY.applies) == (2, False)
    assert Guard.STALE_METRICS_HOLD_SCALE_IN in STALE_HOLD.guards
    assert (CLAMPED.desired_groups, CLAMPED.reason) == (3, "TooManyReplicas")


def test_an_entry_holds_what_explains_the_decision() -> None:
    entry = decision_entry(SCALE_OUT)
    assert (entry.from_replicas, entry.to_replicas, entry.reason, entry.signal) == (
        1,
        2,
        "queueWork",
        "queueWork",
    )
    assert entry.time == WHEN
    assert (entry.policy_revision, entry.mode, entry.shadow) == ("test-1", "Active", False)
    by_signal = {proposal.signal: proposal for proposal in entry.proposals}
    assert by_signal["queueWork"].replicas == 2
    assert "lambda_w=" in by_signal["queueWork"].detail
    assert by_signal["minReplicas"].replicas == 1
    assert decision_entry(CLAMPED).guards == ("TooManyReplicas",)


# --- History -------------------------------------------------------------------------------------


def test_a_change_is_recorded_first_and_a_held_count_only_as_the_last_decision() -> None:
    status = record_decisions(ModelGroupStatus(), active=SCALE_OUT, shadow=None)
    assert status.last_decision == decision_entry(SCALE_OUT)
    assert status.decisions == (decision_entry(SCALE_OUT),)
    held = record_decisions(status, active=HOLD, shadow=None)
    assert held.last_decision == decision_entry(HOLD)
    assert held.decisions == (decision_entry(SCALE_OUT),)


def test_a_repeated_advisory_recommendation_is_one_entry() -> None:
    status = ModelGroupStatus()
    for _ in range(5):
        status = record_decisions(status, active=ADVISORY, shadow=None)
    assert len(status.decisions) == 1
    assert status.decisions[0].mode == "Advisory"


def test_the_shadow_decision_is_recorded_apart_and_never_in_the_history() -> None:
    status = record_decisions(ModelGroupStatus(), active=HOLD, shadow=ADVISORY)
    assert status.shadow_decision is not None and status.shadow_decision.shadow
    assert status.shadow_decision.to_replicas == 2
    assert status.decisions == ()


def test_what_others_wrote_stays() -> None:
    group_status = GroupStatus(name="g0", state="Ready", created_at=WHEN)
    condition = Condition(
        type="Ready", status="True", last_transition_time=WHEN, reason="GroupsReady", message=""
    )
    previous = ModelGroupStatus(ready_groups=1, groups=(group_status,), conditions=(condition,))
    status = record_decisions(previous, active=SCALE_OUT, shadow=None)
    assert (status.ready_groups, status.groups, status.conditions) == (1, (group_status,), (condition,))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 6), st.integers(1, 6)), min_size=1, max_size=40))
def test_history_is_bounded_newest_first_and_without_repeats(moves: list[tuple[int, int]]) -> None:
    status = ModelGroupStatus()
    changes = []
    for step, (current, desired) in enumerate(moves):
        decision = dataclasses.replace(
            SCALE_OUT, current_groups=current, desired_groups=desired, time=NOW + step
        )
        status = record_decisions(status, active=decision, shadow=None)
        if current != desired and (not changes or changes[-1] != (current, desired)):
            changes.append((current, desired))
    assert len(status.decisions) == min(len(changes), HISTORY_LIMIT)
    assert [(e.from_replicas, e.to_replicas) for e in status.decisions] == changes[::-1][:HISTORY_LIMIT]
    times = [entry.time for entry in status.decisions]
    assert times == sorted(times, reverse=True)


# --- The record the scale write carries ------------------------------------------------------------


def _later(decision: Decision, seconds: float) -> Decision:
    return dataclasses.replace(decision, time=decision.time + seconds)


@dataclass(frozen=True)
class NoteCase:
    status: ModelGroupStatus
    recovered: bool


NOTE_CASES = {
    "nothing recorded yet": NoteCase(ModelGroupStatus(), True),
    "an older decision recorded": NoteCase(
        record_decisions(ModelGroupStatus(), active=_later(HOLD, -10), shadow=None), True
    ),
    "this decision recorded": NoteCase(
        record_decisions(ModelGroupStatus(), active=SCALE_OUT, shadow=None), False
    ),
    "a later tick recorded": NoteCase(
        record_decisions(ModelGroupStatus(), active=_later(HOLD, 10), shadow=None), False
    ),
}


@pytest.mark.parametrize("case", NOTE_CASES.values(), ids=NOTE_CASES.keys())
def test_a_rescale_note_is_recovered_only_when_the_status_lacks_it(case: NoteCase) -> None:
    entry = unrecorded_rescale(rescale_note(SCALE_OUT), case.status)
    assert (entry is not None) == case.recovered
    if entry is not None:
        recorded = record_rescale(case.status, entry)
        assert recorded.last_decision == entry and recorded.decisions[0] == entry
        assert (entry.from_replicas, entry.to_replicas, entry.time) == (1, 2, WHEN)
        assert entry.proposals and all(proposal.detail == "" for proposal in entry.proposals)
        assert unrecorded_rescale(rescale_note(SCALE_OUT), recorded) is None, "recovered once"


@pytest.mark.parametrize("note", [None, "", "{", '{"time": "2027-01-15T08:00:00Z"}', "[]"])
def test_a_note_that_cannot_be_read_recovers_nothing(note: str | None) -> None:
    assert unrecorded_rescale(note, ModelGroupStatus()) is None


def test_the_note_leaves_the_proposals_inputs_to_the_status() -> None:
    note = rescale_note(SCALE_OUT)
    assert "lambda_w=" in decision_entry(SCALE_OUT).model_dump_json() and "lambda_w=" not in note
    assert len(note) < 600


# --- Events --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EventCase:
    name: str
    previous: Decision | None
    decision: Decision
    reasons: tuple[str, ...]
    shadow: bool = False


EVENT_CASES = [
    EventCase("an applied change is announced", None, SCALE_OUT, ("SuccessfulRescale",)),
    EventCase("an applied change is announced every time", SCALE_OUT, SCALE_OUT, ("SuccessfulRescale",)),
    EventCase("a held count says nothing", HOLD, HOLD, ()),
    EventCase("an advisory change is announced once", None, ADVISORY, ("AdvisoryRescale",)),
    EventCase("a repeated advisory change is not announced again", ADVISORY, ADVISORY, ()),
    EventCase(
        "an advisory change to another count is announced",
        dataclasses.replace(ADVISORY, desired_groups=3),
        ADVISORY,
        ("AdvisoryRescale",),
    ),
    EventCase("a guard that starts holding is announced", HOLD, STALE_HOLD, ("StaleMetricsHoldScaleIn",)),
    EventCase("a guard that keeps holding is not", STALE_HOLD, STALE_HOLD, ()),
    EventCase(
        "a clamp is announced with the change", None, CLAMPED, ("SuccessfulRescale", "TooManyReplicas")
    ),
    EventCase("a shadow policy only ever advises", None, ADVISORY, ("AdvisoryRescale",), shadow=True),
    EventCase("a shadow policy's guards are not announced", HOLD, STALE_HOLD, (), shadow=True),
]


@pytest.mark.parametrize("case", EVENT_CASES, ids=[case.name for case in EVENT_CASES])
def test_events_on_transitions_only(case: EventCase) -> None:
    previous = None if case.previous is None else decision_entry(case.previous, shadow=case.shadow)
    events = decision_events(previous, case.decision, policy_name="chat", shadow=case.shadow)
    assert tuple(event.reason for event in events) == case.reasons
    assert all("revision test-1" in event.message for event in events)


def test_event_wording_names_the_size_the_signal_and_the_policy() -> None:
    (event,) = decision_events(None, SCALE_OUT, policy_name="chat")
    assert event.type == "Normal"
    assert event.message.startswith("New size: 2 (from 1); reason: queueWork proposed 2 (lambda_w=")
    assert event.message.endswith("SLOPolicy chat revision test-1")
    (stale,) = decision_events(decision_entry(HOLD), STALE_HOLD, policy_name="chat")
    assert stale.type == "Warning" and "metrics of 1 ready group(s) are stale" in stale.message
    (shadow,) = decision_events(None, ADVISORY, policy_name="next", shadow=True)
    assert shadow.message.startswith("Would scale from 1 to 2 (Advisory)")
    assert "shadow SLOPolicy next" in shadow.message


def test_tolerance_is_never_announced() -> None:
    banded = dataclasses.replace(HOLD, guards=(Guard.TOLERANCE,), reason=str(Guard.TOLERANCE))
    assert decision_events(decision_entry(HOLD), banded, policy_name="chat") == ()


# --- Conditions ----------------------------------------------------------------------------------


def conditions_of(conditions: tuple[Condition, ...]) -> dict[str, tuple[str, str]]:
    return {condition.type: (condition.status, condition.reason) for condition in conditions}


FRESH = metrics_health(world(*ready_groups(2, 0.5)), 60.0)


@pytest.mark.parametrize(
    ("decision", "expected"),
    [
        (
            SCALE_OUT,
            {
                "ScalingActive": ("True", "SignalsComputed"),
                "MetricsAvailable": ("True", "MetricsFresh"),
                "DecisionLimited": ("False", "DesiredWithinRange"),
            },
        ),
        (ADVISORY, {"ScalingActive": ("True", "ModeAdvisory")}),
        (CLAMPED, {"DecisionLimited": ("True", "TooManyReplicas")}),
    ],
    ids=["an active decision", "an advisory decision", "a clamped decision"],
)
def test_conditions_after_a_decision(decision: Decision, expected: dict[str, tuple[str, str]]) -> None:
    conditions = conditions_of(autoscaler_conditions((), decision, FRESH, generation=3, now=WHEN))
    assert {kind: conditions[kind] for kind in expected} == expected


def test_a_placement_limit_of_the_group_controller_is_left_alone() -> None:
    placement = Condition(
        type="ScalingLimited",
        status="True",
        last_transition_time=WHEN,
        reason="InsufficientGPUs",
        message="no domain fits a group",
    )
    after = autoscaler_conditions((placement,), CLAMPED, FRESH, generation=3, now=WHEN)
    assert find_condition(after, "ScalingLimited") == placement
    assert conditions_of(after)["DecisionLimited"] == ("True", "TooManyReplicas")


@pytest.mark.parametrize("decision", [SCALE_OUT, ADVISORY, CLAMPED, HOLD], ids=lambda d: d.reason)
def test_every_condition_the_autoscaler_sets_is_one_it_owns(decision: Decision) -> None:
    """Server-side apply sends only owned types: a type set here but not owned would never be written."""
    after = autoscaler_conditions((), decision, FRESH, generation=3, now=WHEN)
    after = failure_conditions(after, reason="MetricsQueryFailed", message="down", generation=3, now=WHEN)
    assert {condition.type for condition in after} <= AUTOSCALER_STATUS.condition_types
    assert not AUTOSCALER_STATUS.condition_types & GROUP_STATUS.condition_types


def test_an_unchanged_condition_keeps_its_transition_time() -> None:
    first = autoscaler_conditions((), HOLD, FRESH, generation=3, now=WHEN)
    later = datetime.fromtimestamp(NOW + 600, UTC)
    again = autoscaler_conditions(first, HOLD, FRESH, generation=3, now=later)
    assert [c.last_transition_time for c in again] == [c.last_transition_time for c in first]


def test_conditions_change_only_when_the_outcome_does() -> None:
    """The inputs change every tick; the conditions must not, or every tick is a status write."""
    busier = decided(ready_groups(2, 0.8))
    assert (busier.desired_groups, busier.reason) == (HOLD.desired_groups, HOLD.reason)
    assert busier.proposals != HOLD.proposals
    first = autoscaler_conditions((), HOLD, FRESH, generation=3, now=WHEN)
    health = metrics_health(world(*ready_groups(2, 0.8, age=11.0)), 60.0)
    assert autoscaler_conditions(first, busier, health, generation=3, now=WHEN) == first


def test_a_failed_query_says_so_in_both_conditions_and_a_lost_policy_only_in_one() -> None:
    failed = conditions_of(
        failure_conditions((), reason="MetricsQueryFailed", message="down", generation=1, now=WHEN)
    )
    assert failed == {
        "ScalingActive": ("False", "MetricsQueryFailed"),
        "MetricsAvailable": ("False", "MetricsQueryFailed"),
    }
    lost = conditions_of(
        failure_conditions((), reason="PolicyNotFound", message="gone", generation=1, now=WHEN)
    )
    assert lost == {"ScalingActive": ("False", "PolicyNotFound")}


def test_a_failure_is_announced_when_it_starts() -> None:
    first = failure_event((), "MetricsQueryFailed", "Prometheus down")
    assert first is not None and (first.type, first.reason) == ("Warning", "MetricsQueryFailed")
    after = failure_conditions((), reason="MetricsQueryFailed", message="down", generation=1, now=WHEN)
    assert failure_event(after, "MetricsQueryFailed", "still down") is None
    assert failure_event(after, "PolicyNotFound", "gone") is not None


@pytest.mark.parametrize(
    ("groups", "expected", "mentions"),
    [
        (ready_groups(2, 0.5), ("True", "MetricsFresh"), "2 ready group(s)"),
        ((group(None, name="g7"), *ready_groups(1, 0.5)), ("False", "MetricsMissing"), "g7"),
        (
            (group(load(0.5, age=90.0), name="g3"), *ready_groups(1, 0.5)),
            ("False", "MetricsStale"),
            "g3 (90s)",
        ),
        ((group(None, "Warming"),), ("True", "MetricsFresh"), "no ready group"),
    ],
    ids=["fresh", "a group without metrics", "a group with old metrics", "nothing ready yet"],
)
def test_metrics_health_names_the_groups(groups: tuple, expected: tuple[str, str], mentions: str) -> None:
    health = metrics_health(world(*groups), 60.0)
    assert (health.status, health.reason) == expected
    assert mentions in health.message


# --- State across restarts -----------------------------------------------------------------------

UP = ScalingRules(stabilization_window_seconds=0.0, policies=(StepPolicy(StepPolicyType.GROUPS, 5, 60.0),))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 20), st.integers(0, 9)), min_size=1, max_size=40),
    st.integers(0, 9),
    st.integers(0, 9),
    st.integers(0, 400),
    st.integers(0, 400),
)
def test_the_saved_state_stabilises_exactly_like_the_live_one(
    steps: list[tuple[int, int]], current: int, recommended: int, up_window: int, down_window: int
) -> None:
    at = 0
    history = []
    for gap, groups in steps:
        at += gap
        history.append(Recommendation(float(at), groups))
    now = float(at)
    live = DecisionState(recommendations=tuple(history), started=True)
    restored = decode_states(encode_states(live, None, now=now), now=now, refresh_seconds=60.0).active
    up = ScalingRules(stabilization_window_seconds=float(up_window), policies=UP.policies)
    down = ScalingRules(stabilization_window_seconds=float(down_window), policies=UP.policies)
    expected = stabilize(current, recommended, live.recommendations, scale_up=up, scale_down=down, now=now)
    actual = stabilize(current, recommended, restored.recommendations, scale_up=up, scale_down=down, now=now)
    assert actual == expected
    assert restored.started


def test_the_state_is_compact_and_keeps_scale_events() -> None:
    state = DecisionState(
        recommendations=(*(Recommendation(NOW + 15 * i, 3) for i in range(20)), Recommendation(NOW + 300, 2)),
        scale_up_events=(ScaleEvent(NOW + 10.2, 1),),
        scale_down_events=(ScaleEvent(NOW + 300, 1),),
        started=True,
    )
    text = encode_states(state, None, now=NOW + 300)
    assert json.loads(text)["a"]["r"] == [[int(NOW) + 285, 3], [int(NOW) + 300, 2]]
    restored = decode_states(text, now=NOW + 300, refresh_seconds=60.0)
    assert restored.active.scale_up_events == (ScaleEvent(NOW + 11, 1),)  # rounded up, never early
    assert restored.active.scale_down_events == (ScaleEvent(NOW + 300, 1),)
    assert restored.shadow == DecisionState.initial()


def test_the_newest_recommendation_is_assumed_to_hold_until_the_state_could_have_been_rewritten() -> None:
    state = DecisionState(recommendations=(Recommendation(NOW, 4),), started=True)
    text = encode_states(state, None, now=NOW)
    soon = decode_states(text, now=NOW + 20, refresh_seconds=60.0).active
    assert soon.recommendations == (Recommendation(NOW + 20, 4),)
    much_later = decode_states(text, now=NOW + 3600, refresh_seconds=60.0).active
    assert much_later.recommendations == (Recommendation(NOW + 60, 4),)


@pytest.mark.parametrize(
    "text",
    [
        None,
        "",
        "not json",
        "[]",
        '{"v": 99, "w": 1, "a": {}}',
        '{"v": 1, "a": {"r": [[1, 2]]}}',
        '{"v":1,"w":1,"a":{"r":[1]}}',
    ],
    ids=["absent", "empty", "not json", "not an object", "another format", "no write time", "malformed runs"],
)
def test_an_unreadable_state_starts_fresh(text: str | None) -> None:
    restored = decode_states(text, now=NOW, refresh_seconds=60.0)
    assert restored.active == DecisionState.initial() and restored.shadow == DecisionState.initial()


@pytest.mark.parametrize("settled_at", [None, NOW + 40.0], ids=["trial not settled", "trial settled"])
def test_the_goodput_signals_trial_survives_a_restart(settled_at: float | None) -> None:
    trial = GoodputTrial(
        groups=3,
        baseline=SloCheck("ttft", within=0.91, required=0.99, observations=412.0),
        acted_at=NOW,
        settled_at=settled_at,
        judged=settled_at is not None,
        fruitless=1,
    )
    state = DecisionState(recommendations=(Recommendation(NOW, 3),), started=True, goodput_trial=trial)
    restored = decode_states(encode_states(state, None, now=NOW), now=NOW, refresh_seconds=60.0)
    assert restored.active.goodput_trial == trial


def test_the_shadow_state_is_saved_beside_the_active_one() -> None:
    active = DecisionState(recommendations=(Recommendation(NOW, 2),), started=True)
    shadow = DecisionState(recommendations=(Recommendation(NOW, 5),), started=True)
    restored = decode_states(encode_states(active, shadow, now=NOW), now=NOW, refresh_seconds=60.0)
    assert restored.active.recommendations == (Recommendation(NOW, 2),)
    assert restored.shadow.recommendations == (Recommendation(NOW, 5),)


def test_the_state_is_written_when_it_changes_and_refreshed_while_it_holds() -> None:
    def text(at: float, groups: int) -> str:
        state = DecisionState(
            recommendations=(Recommendation(NOW, 3), Recommendation(at, groups)), started=True
        )
        return encode_states(state, None, now=at)

    written = text(NOW + 15, 2)
    assert persist_due(None, written, written_at=None, now=NOW + 15, refresh_seconds=60.0)
    assert not persist_due(
        written, text(NOW + 30, 2), written_at=NOW + 15, now=NOW + 30, refresh_seconds=60.0
    )
    assert persist_due(written, text(NOW + 30, 4), written_at=NOW + 15, now=NOW + 30, refresh_seconds=60.0)
    assert persist_due(written, text(NOW + 75, 2), written_at=NOW + 15, now=NOW + 75, refresh_seconds=60.0)


def test_a_default_policy_decision_is_recorded_too() -> None:
    decision = decided(ready_groups(1, 1.5), DEFAULT)
    status = record_decisions(ModelGroupStatus(), active=decision, shadow=None)
    assert status.last_decision is not None and status.last_decision.policy_revision == "test-1"


# --- Feasibility ----------------------------------------------------------------------------------

ATTAINABLE = AttainabilityVerdict("True", Attainability.DEMAND_FEASIBLE, "at most 1% of prompts past")
UNKNOWN = AttainabilityVerdict("Unknown", Attainability.FEASIBILITY_UNKNOWN, "no prompt lengths observed yet")
INFEASIBLE = AttainabilityVerdict(
    "False", Attainability.INFEASIBLE_DEMAND, "class interactive: 12.0% of prompts"
)
UNATTAINABLE = AttainabilityVerdict("False", Attainability.CLASS_UNATTAINABLE, "class realtime: no request")


@pytest.mark.parametrize(
    ("before", "after", "event"),
    [
        (None, ATTAINABLE, None),
        (None, UNKNOWN, None),
        (None, INFEASIBLE, ("Warning", "SLOUnattainable")),
        (ATTAINABLE, INFEASIBLE, ("Warning", "SLOUnattainable")),
        (INFEASIBLE, AttainabilityVerdict("False", Attainability.INFEASIBLE_DEMAND, "13.0%"), None),
        (INFEASIBLE, UNATTAINABLE, ("Warning", "SLOUnattainable")),
        (INFEASIBLE, ATTAINABLE, ("Normal", "SLOAttainable")),
        (INFEASIBLE, UNKNOWN, ("Normal", "SLOAttainable")),
        (UNKNOWN, ATTAINABLE, None),
    ],
    ids=[
        "first sight, attainable",
        "first sight, unknown",
        "first sight, infeasible",
        "turns infeasible",
        "stays infeasible as the share moves",
        "another reason while False",
        "clears",
        "clears to unknown",
        "unknown becomes known",
    ],
)
def test_slo_attainable_events_on_transitions_only(
    before: AttainabilityVerdict | None, after: AttainabilityVerdict, event: tuple[str, str] | None
) -> None:
    previous = () if before is None else attainability_conditions((), before, generation=1, now=WHEN)
    posted = attainability_event(previous, after)
    assert (None if posted is None else (posted.type, posted.reason)) == event
    if posted is not None:
        assert posted.message == after.message


def test_slo_attainable_is_a_condition_with_the_verdicts_reason_and_message() -> None:
    (condition,) = attainability_conditions((), INFEASIBLE, generation=3, now=WHEN)
    assert (condition.type, condition.status, condition.reason) == (
        "SLOAttainable",
        "False",
        "InfeasibleDemand",
    )
    assert condition.message == INFEASIBLE.message
    assert condition.observed_generation == 3


def test_the_feasibility_status_carries_each_class_and_the_primarys_attainments() -> None:
    entries = (
        ClassFeasibility("interactive", 24_600, 0.125, 0.8),
        ClassFeasibility("realtime", 0, 1.0, 1.0, unmet_field="itlSeconds"),
        ClassFeasibility("batch", 900_000, None, None),
    )
    ttft = Histogram.from_observations(TTFT_BUCKETS, [0.5] * 80 + [4.0] * 20)
    observed = world(group(load(0.5, ttft=ttft, finished=100.0), name="g0"))
    decision = decide(
        dataclasses.replace(observed, feasibility=entries), PERMISSIVE, DecisionState.initial(), NOW
    )
    interactive, realtime, batch = feasibility_status(decision)
    assert (interactive.name, interactive.longest_feasible_prompt_tokens, interactive.infeasible_share) == (
        "interactive",
        24_600,
        0.125,
    )
    assert interactive.attainment_offered == pytest.approx(0.8)
    assert interactive.attainment_attainable == pytest.approx(0.8 / 0.875)
    assert (realtime.unmet_field, realtime.attainment_offered) == ("itlSeconds", None)
    assert batch.infeasible_share is None


@pytest.mark.parametrize(
    ("case", "value", "shown"),
    [
        ("a positive figure is shown", 0.91, True),
        ("zero is not a capacity", 0.0, False),
        ("an infinite figure is not shown", math.inf, False),
        ("NaN is not shown", math.nan, False),
    ],
)
def test_status_capacity_shows_only_a_figure_it_can_trust(case: str, value: float, shown: bool) -> None:
    learnt = LearntCapacity(CapacitySource.LEARNT, value, 0.5, evidence_start=NOW, evidence_end=NOW + 60)
    status = capacity_status(learnt)
    assert (status is not None) is shown, case
    if status is not None:
        assert status.model_dump(by_alias=True, mode="json", exclude_none=True) == {
            "source": "learnt",
            "workSecondsPerSecond": 0.91,
            "confidence": 0.5,
            "evidenceWindow": {
                "start": "2027-01-15T08:00:00Z",
                "end": "2027-01-15T08:01:00Z",
            },
            "reason": "",
        }


@pytest.mark.parametrize(
    ("case", "seconds", "source", "shown"),
    [
        ("a measured ready time", 184.0, "measured", {"source": "measured", "seconds": 184.0}),
        ("the declared prior", 120.0, "prior", {"source": "prior", "seconds": 120.0}),
        ("unknown: no ready time is made up", None, None, None),
    ],
)
def test_a_status_decision_says_which_ready_time_it_looked_ahead_by(
    case: str, seconds: float | None, source: str | None, shown: dict[str, object] | None
) -> None:
    observed = dataclasses.replace(
        world(group(load(0.5), name="g0")), group_ready_seconds=seconds, group_ready_source=source
    )
    entry = decision_entry(decide(observed, PERMISSIVE, DecisionState.initial(), NOW))
    recorded = entry.ready_time.model_dump(by_alias=True, mode="json") if entry.ready_time else None
    assert recorded == shown, case
