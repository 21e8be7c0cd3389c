"""The arrival work rate a decision sizes groups for (`controllers.autoscale.arrival`): served work
lags a burst and is capped by the groups serving it; offered work and the queue's growth are not.

Worlds are test_autoscale_world's (an H100 group of an 8B model, loads in groups' worth of capacity).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_autoscale_world import (
    CAPACITY,
    MEAN_INPUT,
    MEAN_OUTPUT,
    PERMISSIVE,
    PRICING,
    REQUEST_WORK,
    ready_groups,
    waiting_requests_for,
    world,
)

from goodput.api.reasons import Guard
from goodput.controllers.autoscale import decide
from goodput.controllers.autoscale.arrival import (
    QUEUE_GROWTH_WINDOW_SECONDS,
    ArrivalReading,
    mean_request_work_seconds,
    offered_work_rate,
    queue_growth_work_rate,
    remember_queue,
)
from goodput.controllers.autoscale.model import (
    DecisionState,
    GatewayClassFigures,
    GatewayObservation,
    GroupObservation,
    QueueReading,
)
from goodput.estimators.queueing import TrafficMix

NOW = 1000.0
MIX = TrafficMix(MEAN_INPUT, MEAN_OUTPUT)
WINDOW = 300.0
CLASS = PERMISSIVE.primary_class.name


@dataclass(frozen=True)
class ReadingCase:
    name: str
    reading: ArrivalReading
    arrival: float | None


READING_CASES = [
    ReadingCase("nothing known", ArrivalReading(None, None, None), None),
    ReadingCase("served alone", ArrivalReading(2.0, None, None), 2.0),
    ReadingCase("offered beyond served: refused demand counts", ArrivalReading(2.0, 3.5, None), 3.5),
    ReadingCase("served beyond offered (a gateway's window lags)", ArrivalReading(2.0, 1.5, None), 2.0),
    ReadingCase("the queue's growth adds to the served rate", ArrivalReading(2.0, None, 0.75), 2.75),
    ReadingCase(
        "a saturated, growing queue: its groups serve their capacity now",
        ArrivalReading(1.4, None, 0.5, saturated_work_rate=2.0),
        2.5,
    ),
    ReadingCase(
        "saturation without growth says nothing about arrivals",
        ArrivalReading(1.4, None, 0.0, saturated_work_rate=2.0),
        1.4,
    ),
    ReadingCase("offered and growth", ArrivalReading(1.0, 3.0, 0.5), 3.5),
]


@pytest.mark.parametrize("case", READING_CASES, ids=lambda case: case.name)
def test_the_arrival_rate_is_the_larger_of_served_and_offered_plus_the_growth(case: ReadingCase) -> None:
    assert case.reading.arrival_work_rate == (None if case.arrival is None else pytest.approx(case.arrival))


def _gateway(offered: float, *, infeasible: float = 0.0, recent: float | None = None) -> GatewayObservation:
    entry = GatewayClassFigures(
        CLASS, offered_requests=offered, infeasible_requests=infeasible, recent_offered_per_second=recent
    )
    return GatewayObservation(age_seconds=1.0, classes=(entry,))


@dataclass(frozen=True)
class OfferedCase:
    name: str
    gateway: GatewayObservation | None
    requests_per_second: float | None


OFFERED_CASES = [
    OfferedCase("no gateway", None, None),
    OfferedCase("the goodput window's count", _gateway(600.0), 2.0),
    OfferedCase("infeasible requests set aside", _gateway(600.0, infeasible=150.0), 1.5),
    OfferedCase("a recent rate above the window's: a rise shows at once", _gateway(600.0, recent=6.0), 6.0),
    OfferedCase("a recent rate below the window's: a fall shows slowly", _gateway(600.0, recent=1.0), 2.0),
    OfferedCase(
        "the recent rate keeps the window's feasible share",
        _gateway(600.0, infeasible=300.0, recent=8.0),
        4.0,
    ),
]


@pytest.mark.parametrize("case", OFFERED_CASES, ids=lambda case: case.name)
def test_offered_work_is_the_gateways_feasible_requests_priced_at_the_mix(case: OfferedCase) -> None:
    rate = offered_work_rate(case.gateway, PRICING, MIX, WINDOW)
    if case.requests_per_second is None:
        assert rate is None
    else:
        assert rate == pytest.approx(case.requests_per_second * mean_request_work_seconds(PRICING, MIX))


def test_a_mean_request_is_priced_as_the_world_prices_it() -> None:
    assert mean_request_work_seconds(PRICING, MIX) == pytest.approx(REQUEST_WORK, rel=0.02)


GROWTH_CASES = [
    ("one reading", (QueueReading(NOW, 5.0),), None),
    ("grows by 30 work-seconds in 15 s", (QueueReading(NOW - 15, 0.0), QueueReading(NOW, 30.0)), 2.0),
    ("shrinks: reads 0", (QueueReading(NOW - 15, 30.0), QueueReading(NOW, 0.0)), 0.0),
    (
        "only the window counts",
        (QueueReading(NOW - 60, 500.0), QueueReading(NOW - 30, 0.0), QueueReading(NOW, 60.0)),
        2.0,
    ),
]


@pytest.mark.parametrize(
    ("readings", "growth"), [c[1:] for c in GROWTH_CASES], ids=[c[0] for c in GROWTH_CASES]
)
def test_queue_growth_is_read_over_the_short_window(
    readings: tuple[QueueReading, ...], growth: float | None
) -> None:
    assert queue_growth_work_rate(readings, NOW) == growth


def test_an_unknown_queue_breaks_the_trail_so_growth_is_never_read_across_a_gap() -> None:
    readings = remember_queue((QueueReading(NOW - 15, 0.0),), None, NOW)
    assert readings == ()
    assert queue_growth_work_rate(remember_queue(readings, 90.0, NOW + 15), NOW + 15) is None


@given(
    ticks=st.lists(st.floats(0.0, 1e4, allow_nan=False), min_size=1, max_size=40),
    interval=st.floats(1.0, 60.0),
)
def test_the_trail_stays_inside_its_window_and_growth_is_never_negative(
    ticks: list[float], interval: float
) -> None:
    readings: tuple[QueueReading, ...] = ()
    for index, waiting in enumerate(ticks):
        now = index * interval
        readings = remember_queue(readings, waiting, now)
        assert all(now - reading.at <= QUEUE_GROWTH_WINDOW_SECONDS for reading in readings)
        growth = queue_growth_work_rate(readings, now)
        assert growth is None or (growth >= 0 and math.isfinite(growth))


# --- in the decision -----------------------------------------------------------------------------------


def _starting(count: int) -> tuple[GroupObservation, ...]:
    return tuple(
        GroupObservation(f"s{index}", "Provisioning", created_at=NOW - 10, metrics=None)
        for index in range(count)
    )


def test_behind_a_gateway_a_burst_is_sized_on_offered_work_while_groups_start() -> None:
    """Two groups serve their capacity while three times their load is offered; two more are
    starting. Served work says the starting groups are enough (CapacityComing would hold at four);
    the offered work asks for the groups the burst needs."""
    offered_per_second = 3 * 2 * CAPACITY / REQUEST_WORK
    gateway = _gateway(offered_per_second * WINDOW / 4, recent=offered_per_second)
    snapshot = dataclasses.replace(
        world(*ready_groups(2, 1.0), *_starting(2)), gateway=gateway, metrics_window_seconds=WINDOW
    )
    decision = decide(snapshot, PERMISSIVE, DecisionState.initial(), NOW)
    needed = math.ceil(1.2 * 3 * 2 * CAPACITY / decision.estimates.capacity_per_group - 1e-9)
    assert decision.estimates.offered_work_rate == pytest.approx(6 * CAPACITY, rel=0.03)
    assert decision.desired_groups >= needed > 4
    served_only = dataclasses.replace(snapshot, gateway=_gateway(0.0))  # as if it saw only what was served
    assert decide(served_only, PERMISSIVE, DecisionState.initial(), NOW).desired_groups <= 4


def test_without_a_gateway_a_growing_queue_lets_decisions_stack_while_groups_start() -> None:
    """No gateway: two saturated groups, two starting, and a queue that grew by a group's worth of
    work a second for 15 s. The arrival reads the groups' capacity plus the growth (not the lagging
    window), so the guard lets a third and fourth group's worth through instead of holding."""
    waiting_before = waiting_requests_for(2.0, 2)
    grown = waiting_before + 15 * 2 * CAPACITY / REQUEST_WORK
    before = world(*ready_groups(2, 0.7, waiting=waiting_before / 2), *_starting(2))
    after = world(*ready_groups(2, 0.7, waiting=grown / 2), *_starting(2))
    first = decide(before, PERMISSIVE, DecisionState.initial(), NOW - 15)
    second = decide(after, PERMISSIVE, first.next_state, NOW)
    assert second.estimates.queue_growth_work_rate == pytest.approx(2 * CAPACITY, rel=0.05)
    assert second.estimates.arrival_work_rate == pytest.approx(4 * CAPACITY, rel=0.05)
    assert second.desired_groups > 4
    unaware = decide(after, PERMISSIVE, DecisionState.initial(), NOW)  # no earlier reading: no growth
    assert unaware.estimates.queue_growth_work_rate is None
    assert unaware.desired_groups == 4 and Guard.CAPACITY_COMING in unaware.guards
