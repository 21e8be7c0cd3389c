"""Group demands per signal (goodput.estimators.proposals)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from goodput.estimators.proposals import (
    arrival_demand_groups,
    ceil_groups,
    kv_demand_groups,
    queue_budget_demand_groups,
    work_demand_groups,
    work_left_when_ready,
)


@pytest.mark.parametrize(
    ("demand", "groups"),
    [(0.0, 0), (-1.0, 0), (0.01, 1), (3.0, 3), (3.0000000001, 3), (3.001, 4)],
    ids=[
        "nothing",
        "negative",
        "a sliver needs a group",
        "exact",
        "float noise above an integer",
        "just above",
    ],
)
def test_ceil_groups(demand: float, groups: int) -> None:
    assert ceil_groups(demand) == groups


@pytest.mark.parametrize(
    ("inputs", "expected"),
    [
        ((0.0, 0.0, 0.9, 10.0, 1.2), 0.0),
        ((3.0, 0.0, 0.9, 10.0, 1.2), 4.0),
        ((0.0, 45.0, 0.9, 10.0, 1.2), 5.0),
        ((3.0, 45.0, 0.9, 10.0, 1.2), 9.0),
        ((3.0, 45.0, 0.9, 30.0, 1.0), 5.0),
    ],
    ids=["idle", "arrivals only", "backlog only", "both", "slower drain, no headroom"],
)
def test_work_demand_is_the_design_formula(
    inputs: tuple[float, float, float, float, float], expected: float
) -> None:
    """(arrival work rate, backlog, C, T_d, s) -> (s·λ_w + Q/T_d) / C."""
    assert work_demand_groups(*inputs) == pytest.approx(expected)


def test_arrival_demand_ignores_the_backlog() -> None:
    assert arrival_demand_groups(3.0, 0.9, 1.2) == pytest.approx(4.0)


@pytest.mark.parametrize(
    ("waiting", "affordable", "expected"),
    [(0.0, 1.0, 0.0), (9.0, 2.0, 5.0), (9.0, 0.0, None), (9.0, -0.5, None)],
    ids=["empty queue", "queue over the affordable wait", "no affordable wait", "service time misses alone"],
)
def test_queue_budget_demand(waiting: float, affordable: float, expected: float | None) -> None:
    result = queue_budget_demand_groups(waiting, 0.9, affordable)
    assert result == (None if expected is None else pytest.approx(expected))


def test_kv_demand_keeps_the_free_fraction() -> None:
    assert kv_demand_groups(0.0, 400_000, 0.15) == 0.0
    assert kv_demand_groups(340_000, 400_000, 0.15) == pytest.approx(1.0)
    assert ceil_groups(kv_demand_groups(380_000, 400_000, 0.15)) == 2


@pytest.mark.parametrize(
    "call",
    [
        lambda: work_demand_groups(1.0, 1.0, 0.0, 10.0, 1.2),
        lambda: work_demand_groups(1.0, 1.0, 0.9, 0.0, 1.2),
        lambda: queue_budget_demand_groups(1.0, 0.0, 1.0),
        lambda: kv_demand_groups(1.0, 0, 0.1),
        lambda: kv_demand_groups(1.0, 100, 1.0),
    ],
    ids=["no capacity", "no drain target", "no capacity for the budget", "no KV", "nothing usable"],
)
def test_degenerate_inputs_are_rejected(call: Callable[[], object]) -> None:
    with pytest.raises(ValueError, match="positive"):
        call()


@given(
    arrival=st.floats(0, 1e3),
    backlog=st.floats(0, 1e5),
    more_arrival=st.floats(0, 1e3),
    more_backlog=st.floats(0, 1e5),
    capacity=st.floats(0.05, 1.0),
)
def test_more_work_never_lowers_the_work_demand(
    arrival: float, backlog: float, more_arrival: float, more_backlog: float, capacity: float
) -> None:
    base = work_demand_groups(arrival, backlog, capacity, 10.0, 1.2)
    assert work_demand_groups(arrival + more_arrival, backlog + more_backlog, capacity, 10.0, 1.2) >= base


@pytest.mark.parametrize(
    ("waiting", "serving", "arrival", "ready", "left"),
    [
        (100.0, 4, 3.0, 60.0, 40.0),
        (100.0, 4, 3.0, 200.0, 0.0),
        (100.0, 4, 4.0, 60.0, 100.0),
        (100.0, 4, 5.0, 60.0, 160.0),  # the excess 1/s for 60 s joins the backlog
        (100.0, 4, None, 60.0, 100.0),
        (100.0, 4, 3.0, None, 100.0),
        (100.0, 0, 0.0, 60.0, 100.0),
    ],
    ids=[
        "spare capacity drains part before ready",
        "drained before ready",
        "no spare capacity",
        "arrivals above capacity",
        "arrival rate unknown",
        "ready time unknown",
        "nothing serving",
    ],
)
def test_work_left_when_ready(
    waiting: float, serving: int, arrival: float | None, ready: float | None, left: float
) -> None:
    assert work_left_when_ready(waiting, serving, 1.0, arrival, ready) == pytest.approx(left)
