"""`spec.replicaSchedule`: which window is open when, and what the decision does with it and with a
forecast (floors that never hold back a reactive scale-out and hold nothing once past)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo

import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_autoscale_world import PERMISSIVE, group, load, ready_groups, world
from test_forecast import HORIZON, STEP, diurnal, fitted, history

from goodput.api.modelgroup import ScheduledReplicas
from goodput.api.reasons import Guard, Signal
from goodput.controllers.autoscale import decide
from goodput.controllers.autoscale.model import DecisionState
from goodput.controllers.autoscale.schedule import is_open, scheduled_floor


def at(text: str, zone: str = "UTC") -> float:
    return datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(zone)).timestamp()


def window(
    start: str, end: str, *, days: tuple[str, ...] = (), zone: str = "UTC", floor: int = 4, name: str = "w"
):
    return ScheduledReplicas.model_validate(
        {"name": name, "start": start, "end": end, "days": list(days), "timeZone": zone, "minReplicas": floor}
    )


@dataclass(frozen=True)
class Open:
    name: str
    entry: ScheduledReplicas
    now: float
    expected: bool


# 2026-03-02 is a Monday; Europe/Paris moves to summer time on 2026-03-29.
OPEN = [
    Open("inside a working day", window("08:00", "18:00"), at("2026-03-02T09:30"), True),
    Open("the start minute opens it", window("08:00", "18:00"), at("2026-03-02T08:00"), True),
    Open("the end minute closes it", window("08:00", "18:00"), at("2026-03-02T18:00"), False),
    Open("past midnight, after the start", window("22:00", "06:00"), at("2026-03-02T23:00"), True),
    Open("past midnight, before the end", window("22:00", "06:00"), at("2026-03-03T05:59"), True),
    Open("past midnight, in the gap", window("22:00", "06:00"), at("2026-03-03T12:00"), False),
    Open(
        "a weekday window on a Saturday",
        window("08:00", "18:00", days=("Mon", "Fri")),
        at("2026-03-07T09:00"),
        False,
    ),
    Open(
        "a weekday window on its day",
        window("08:00", "18:00", days=("Mon", "Fri")),
        at("2026-03-06T09:00"),
        True,
    ),
    Open(
        "a Friday night window still open on Saturday morning",
        window("22:00", "06:00", days=("Fri",)),
        at("2026-03-07T03:00"),
        True,
    ),
    Open(
        "a Saturday night window is not open early on Saturday",
        window("22:00", "06:00", days=("Sat",)),
        at("2026-03-07T03:00"),
        False,
    ),
    Open(
        "local time: 08:00 in Paris is 07:00 UTC in winter",
        window("08:00", "09:00", zone="Europe/Paris"),
        at("2026-03-02T07:30"),
        True,
    ),
    Open(
        "local time follows summer time: 08:00 in Paris is 06:00 UTC",
        window("08:00", "09:00", zone="Europe/Paris"),
        at("2026-03-30T06:30"),
        True,
    ),
]


@pytest.mark.parametrize("case", OPEN, ids=lambda case: case.name)
def test_a_window_is_open_on_its_days_between_its_local_times(case: Open) -> None:
    assert is_open(case.entry, case.now) is case.expected


def test_the_largest_open_floor_wins_and_none_outside_every_window() -> None:
    entries = (window("08:00", "18:00", floor=3, name="day"), window("12:00", "14:00", floor=6, name="lunch"))
    assert scheduled_floor(entries, at("2026-03-02T13:00")).name == "lunch"
    assert scheduled_floor(entries, at("2026-03-02T09:00")).min_groups == 3
    assert scheduled_floor(entries, at("2026-03-02T19:00")) is None


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("end", "08:00", "must differ from `start`"),
        ("start", "8:00", "start"),
        ("end", "24:00", "end"),
        ("timeZone", "Mars/Olympus", "not an IANA time zone"),
        ("minReplicas", -1, "minReplicas"),
    ],
)
def test_a_bad_window_is_refused_naming_its_field(field: str, value: object, words: str) -> None:
    entry = {"name": "w", "start": "08:00", "end": "18:00", "minReplicas": 2, field: value}
    with pytest.raises(pydantic.ValidationError, match=words):
        ScheduledReplicas.model_validate(entry)


# --- The decision -----------------------------------------------------------------------------------

MONDAY_NINE = at("2026-03-02T09:00")


def decide_with(snapshot, now: float = MONDAY_NINE, policy=PERMISSIVE):
    return decide(snapshot, policy, DecisionState.initial(), now)


def test_an_open_window_raises_the_count_and_names_itself() -> None:
    snapshot = dataclasses.replace(world(*ready_groups(2, 0.5)), replica_schedule=(window("08:00", "18:00"),))
    decision = decide_with(snapshot)
    assert (decision.desired_groups, decision.reason, decision.signal) == (4, "schedule", Signal.SCHEDULE)
    proposal = next(p for p in decision.proposals if p.signal is Signal.SCHEDULE)
    assert "window w (daily 08:00-18:00 UTC) minReplicas=4" in proposal.detail


def test_a_window_past_holds_nothing() -> None:
    snapshot = dataclasses.replace(world(*ready_groups(4, 0.3)), replica_schedule=(window("08:00", "18:00"),))
    decision = decide_with(snapshot, at("2026-03-02T18:30"))
    assert decision.desired_groups < 4
    assert all(p.signal is not Signal.SCHEDULE for p in decision.proposals)


def test_a_window_never_holds_back_a_reactive_scale_out() -> None:
    snapshot = dataclasses.replace(world(*ready_groups(2, 3.0)), replica_schedule=(window("08:00", "18:00"),))
    decision = decide_with(snapshot)
    assert decision.desired_groups > 4
    assert decision.signal is Signal.QUEUE_WORK


def test_a_window_above_max_replicas_is_clamped_and_says_so() -> None:
    snapshot = dataclasses.replace(
        world(*ready_groups(2, 0.5)), replica_schedule=(window("08:00", "18:00", floor=8),)
    )
    decision = decide_with(snapshot, policy=dataclasses.replace(PERMISSIVE, max_groups=6))
    assert decision.desired_groups == 6
    assert Guard.TOO_MANY_REPLICAS in decision.guards
    proposal = next(p for p in decision.proposals if p.signal is Signal.SCHEDULE)
    assert "above maxReplicas=6: clamped" in proposal.detail


def _forecasting_world(utilisation: float, *, groups: int = 2, level: float = 1.0):
    """Ready groups under `utilisation`, and a history whose next hour rises to `level` times a
    group's capacity per unit of the day's profile."""
    samples = history(2.0, lambda t: level * diurnal(t))
    snapshot = world(*ready_groups(groups, utilisation))
    return dataclasses.replace(snapshot, forecaster=fitted(samples)), samples[-1][0] + STEP


def test_a_forecast_rise_asks_for_groups_one_ready_time_ahead_with_its_figures() -> None:
    snapshot, now = _forecasting_world(0.3, level=4.0)
    decision = decide_with(snapshot, now)
    capacity = decision.estimates.capacity_per_group
    expected = 4.0 * diurnal(now + HORIZON)
    assert decision.signal is Signal.FORECAST and decision.reason == "forecast"
    assert decision.desired_groups >= int(expected / capacity)
    proposal = next(p for p in decision.proposals if p.signal is Signal.FORECAST)
    assert f"in {HORIZON:g}s" in proposal.detail and "margin" in proposal.detail and "C=" in proposal.detail


def test_a_forecast_below_the_load_leaves_the_reactive_count() -> None:
    snapshot, now = _forecasting_world(3.0, level=0.1)
    decision = decide_with(snapshot, now)
    assert decision.signal is Signal.QUEUE_WORK
    forecast = next(p for p in decision.proposals if p.signal is Signal.FORECAST)
    assert forecast.groups < decision.desired_groups


def test_a_stale_forecaster_proposes_nothing() -> None:
    snapshot, now = _forecasting_world(0.3, level=4.0)
    decision = decide_with(snapshot, now + 2 * 3600)
    assert all(p.signal is not Signal.FORECAST for p in decision.proposals)


def test_groups_on_their_way_do_not_hold_back_a_forecast_floor() -> None:
    """A forecast rise while groups warm: the capacity-coming guard caps reactive proposals at
    today's arrival, not a floor sized for the load to come."""
    snapshot, now = _forecasting_world(0.3, level=4.0)
    warming = world(*ready_groups(2, 0.3), group(load(0.0), state="Warming", name="g-warm"))
    decision = decide_with(dataclasses.replace(warming, forecaster=snapshot.forecaster), now)
    assert decision.signal is Signal.FORECAST
    assert Guard.CAPACITY_COMING not in decision.guards
    assert decision.desired_groups > 3


@settings(max_examples=25, deadline=None)
@given(
    groups=st.integers(min_value=1, max_value=6),
    utilisation=st.floats(min_value=0.0, max_value=4.0),
    level=st.floats(min_value=0.0, max_value=6.0),
    floor=st.integers(min_value=0, max_value=12),
    hour=st.integers(min_value=0, max_value=23),
)
def test_floors_only_ever_raise_the_reactive_count_and_a_closed_window_changes_nothing(
    groups: int, utilisation: float, level: float, floor: int, hour: int
) -> None:
    reactive = world(*ready_groups(groups, utilisation))
    now = at(f"2026-03-02T{hour:02d}:30")
    entry = window("08:00", "18:00", floor=floor)
    forecaster = fitted(history(2.0, lambda t: level * diurnal(t)), HORIZON)
    forecaster = dataclasses.replace(
        forecaster, grid_start=forecaster.grid_start + now - forecaster.history_end
    )
    alone = decide_with(reactive, now)
    ahead = decide_with(dataclasses.replace(reactive, replica_schedule=(entry,), forecaster=forecaster), now)
    assert ahead.desired_groups >= alone.desired_groups
    if not 8 <= hour < 18:
        closed = decide_with(dataclasses.replace(reactive, replica_schedule=(entry,)), now)
        assert closed.desired_groups == alone.desired_groups and closed.proposals == alone.proposals
