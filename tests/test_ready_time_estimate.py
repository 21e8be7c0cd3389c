"""The ready time the autoscaler looks ahead by: the declared prior until enough groups were measured,
then a high quantile of their ready times, bounded by a multiple of their median; never made up."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from goodput.controllers.autoscale.ready_time import (
    READY_MAX_MEDIAN_FACTOR,
    READY_MIN_SAMPLES,
    ReadyTimeEstimate,
    estimate_ready_time,
)


@dataclass(frozen=True)
class EstimateCase:
    name: str
    prior: float | None
    measured: list[float]
    expected: ReadyTimeEstimate | None


CASES = [
    EstimateCase("the prior before any group is measured", 120.0, [], ReadyTimeEstimate(120.0, "prior", 0)),
    EstimateCase(
        "the prior while fewer than five groups are measured",
        120.0,
        [300.0, 310.0, 320.0, 330.0],
        ReadyTimeEstimate(120.0, "prior", 4),
    ),
    EstimateCase(
        "the 90th percentile of the measured groups once there are five",
        120.0,
        [100.0, 110.0, 120.0, 130.0, 200.0],
        ReadyTimeEstimate(200.0, "measured", 5),
    ),
    EstimateCase(
        "one group that waited for a node is bounded by 3x the median",
        120.0,
        [100.0, 100.0, 110.0, 110.0, 2000.0],
        ReadyTimeEstimate(330.0, "measured", 5),
    ),
    EstimateCase(
        "no prior: the median of the few measured",
        None,
        [30.0, 90.0, 40.0],
        ReadyTimeEstimate(40.0, "measured", 3),
    ),
    EstimateCase("no prior, an even count", None, [30.0, 40.0], ReadyTimeEstimate(35.0, "measured", 2)),
    EstimateCase("nothing known: unknown, not 0", None, [], None),
    EstimateCase("nonsense measurements are ignored", None, [-1.0, math.nan, math.inf], None),
    EstimateCase("a prior of 0 is no prior", 0.0, [], None),
]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_the_ready_time_to_look_ahead_by(case: EstimateCase) -> None:
    assert estimate_ready_time(case.prior, case.measured) == case.expected


seconds = st.floats(min_value=0, max_value=1e5, allow_nan=False)


@given(prior=st.one_of(st.none(), seconds), measured=st.lists(seconds, max_size=40))
def test_a_measured_estimate_lies_within_the_samples_and_the_median_bound(
    prior: float | None, measured: list[float]
) -> None:
    estimate = estimate_ready_time(prior, measured)
    if len(measured) >= READY_MIN_SAMPLES:
        assert estimate is not None
        assert estimate.source == "measured"
        ordered = sorted(measured)
        median = ordered[math.ceil(0.5 * len(ordered)) - 1]
        assert min(measured) <= estimate.seconds <= max(measured)
        assert estimate.seconds <= READY_MAX_MEDIAN_FACTOR * median
        assert estimate.seconds >= median or estimate.seconds == READY_MAX_MEDIAN_FACTOR * median
    elif prior:
        assert estimate == ReadyTimeEstimate(prior, "prior", len(measured))
    elif not measured:
        assert estimate is None
