"""The deadline gate's correction from its measured error (controllers.requests.calibration)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from goodput.controllers.requests.calibration import TtftCalibration, TtftCalibrationSettings

SETTINGS = TtftCalibrationSettings()  # 95 % met, 4 samples at least, 128 kept, 60 s, at most 4

Seen = tuple[float, float, float]  # predicted wait and service, budget, observed TTFT: from the decision on


def calibrated(
    seen: Sequence[Seen], settings: TtftCalibrationSettings = SETTINGS, start: float = 0.0
) -> TtftCalibration:
    """The requests' figures, one a second from `start`."""
    calibration = TtftCalibration(settings)
    for index, (predicted, budget, observed) in enumerate(seen):
        calibration = calibration.observed(predicted, budget, observed, start + index)
    return calibration


MET_WITH_ROOM: Seen = (0.4, 1.0, 0.6)  # headroom 2.5
MISSED_NEAR_THE_EDGE: Seen = (0.8, 1.0, 1.2)  # headroom 1.25


@pytest.mark.parametrize(
    ("seen", "expected"),
    [
        pytest.param([], 1.0, id="nothing-seen"),
        pytest.param([MISSED_NEAR_THE_EDGE] * 3, 1.0, id="one-short-of-the-minimum"),
        pytest.param([MET_WITH_ROOM] * 20, 1.0, id="every-one-met"),
        # Four times slower than predicted, and still inside the target: not a miss, no correction.
        pytest.param([(0.2, 1.0, 0.8)] * 20, 1.0, id="slower-than-predicted-but-met"),
        pytest.param(
            [MISSED_NEAR_THE_EDGE] * 10 + [MET_WITH_ROOM] * 10,
            (1.25 + 2.5) / 2,
            id="misses-near-the-edge-raise-it-past-their-headroom",
        ),
        pytest.param(
            [(0.91, 1.0, 1.1)] + [(0.5, 1.0, 0.7)] * 20, 1.0, id="one-miss-in-twenty-one-is-within-95-percent"
        ),
        pytest.param(
            [(0.91, 1.0, 1.1)] + [(0.5, 1.0, 0.7)] * 9,
            (1.0 / 0.91 + 2.0) / 2,
            id="one-miss-in-ten-is-not",
        ),
        pytest.param([MISSED_NEAR_THE_EDGE] * 20, 4.0, id="every-one-missed-holds-it-at-the-bound"),
        pytest.param(
            [(0.2, 1.0, 1.5)] * 10 + [(0.1, 1.0, 0.5)] * 10,
            4.0,
            id="a-correction-past-the-bound-is-held-at-it",
        ),
    ],
)
def test_the_correction_is_the_least_under_which_those_still_admitted_met_their_target(
    seen: list[Seen], expected: float
) -> None:
    assert calibrated(seen).ttft_correction(now=len(seen)) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("predicted", "budget", "observed"),
    [
        pytest.param(0.0, 1.0, 1.0, id="a-zero-prediction"),
        pytest.param(-1.0, 1.0, 1.0, id="a-negative-prediction"),
        pytest.param(math.inf, 1.0, 1.0, id="an-unbounded-prediction"),
        pytest.param(math.nan, 1.0, 1.0, id="a-nan-prediction"),
        pytest.param(0.5, 0.0, 1.0, id="no-budget-left"),
        pytest.param(0.5, math.nan, 1.0, id="a-nan-budget"),
        pytest.param(0.5, 1.0, -0.1, id="a-negative-observation"),
        pytest.param(0.5, 1.0, math.inf, id="an-unbounded-observation"),
        pytest.param(0.5, 1.0, math.nan, id="a-nan-observation"),
    ],
)
def test_a_request_that_says_nothing_of_the_error_is_left_out(
    predicted: float, budget: float, observed: float
) -> None:
    calibration = calibrated([MET_WITH_ROOM] * 16)
    assert calibration.observed(predicted, budget, observed, now=16.0) is calibration


def test_an_old_slow_spell_stops_counting() -> None:
    """Misses near the edge for 20 s, then requests that meet theirs. While the misses are in the
    window the gate stays strict; 60 s after them it is back to 1, and with no samples at all too."""
    slow = calibrated([MISSED_NEAR_THE_EDGE] * 10 + [MET_WITH_ROOM] * 10)
    assert slow.ttft_correction(now=20.0) > 1.0
    mixed = slow
    for index in range(20):
        mixed = mixed.observed(*MET_WITH_ROOM, now=40.0 + index)
    assert mixed.ttft_correction(now=59.0) > 1.0  # the slow spell is still in the window
    assert mixed.ttft_correction(now=80.0) == 1.0  # 60 s on, it is gone
    assert slow.ttft_correction(now=200.0) == 1.0
    assert slow.live_samples(now=200.0) == 0


def test_it_keeps_the_most_recent_samples_only() -> None:
    settings = TtftCalibrationSettings(min_samples=2, max_samples=4)
    calibration = calibrated([MISSED_NEAR_THE_EDGE] * 10 + [MET_WITH_ROOM] * 4, settings)
    assert len(calibration.samples) == 4
    assert calibration.ttft_correction(now=14.0) == 1.0


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        pytest.param({"attainment": 0.0}, "attainment", id="attainment-zero"),
        pytest.param({"attainment": 1.5}, "attainment", id="attainment-over-one"),
        pytest.param({"min_samples": 0}, "min_samples", id="no-minimum"),
        pytest.param({"min_samples": 10, "max_samples": 5}, "max_samples", id="minimum-over-the-kept"),
        pytest.param({"max_age_seconds": 0.0}, "max_age_seconds", id="no-window"),
        pytest.param({"max_ttft_correction": 0.9}, "max_ttft_correction", id="a-bound-under-one"),
        pytest.param({"max_ttft_correction": math.inf}, "max_ttft_correction", id="no-bound"),
    ],
)
def test_settings_that_cannot_work_are_refused_naming_the_field(fields: dict[str, float], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        TtftCalibrationSettings(**fields)  # type: ignore[arg-type]


seconds = st.floats(0.001, 10.0, allow_nan=False)
one_seen = st.tuples(seconds, seconds, st.floats(0.0, 20.0, allow_nan=False))
seen_strategy = st.lists(one_seen, min_size=0, max_size=60)


@given(seen=seen_strategy)
def test_the_correction_stays_within_its_bounds(seen: list[Seen]) -> None:
    correction = calibrated(seen).ttft_correction(now=len(seen))
    assert 1.0 <= correction <= SETTINGS.max_ttft_correction


@given(seen=seen_strategy)
def test_under_the_correction_those_still_admitted_met_their_target(seen: list[Seen]) -> None:
    """The defining property: once measured (enough requests the gate's figures admitted) and unless
    held at its bound, the requests whose headroom admits them under the correction met their target
    at least `attainment` of the time."""
    calibration = calibrated(seen)
    correction = calibration.ttft_correction(now=len(seen))
    measured = sum(sample.headroom >= 1.0 for sample in calibration.samples) >= SETTINGS.min_samples
    if correction >= SETTINGS.max_ttft_correction or not measured:
        return
    still_admitted = [sample for sample in calibration.samples if sample.headroom >= correction]
    missed = sum(not sample.met for sample in still_admitted)
    assert missed <= (1.0 - SETTINGS.attainment) * len(still_admitted) + 1e-9


@given(seen=seen_strategy)
def test_fewer_samples_than_the_minimum_leave_it_at_one(seen: list[Seen]) -> None:
    few = seen[: SETTINGS.min_samples - 1]
    assert calibrated(few).ttft_correction(now=len(few)) == 1.0


@given(seen=st.lists(one_seen, min_size=1, max_size=60), data=st.data())
def test_a_slower_first_token_never_lowers_the_correction(seen: list[Seen], data: st.DataObject) -> None:
    index = data.draw(st.integers(0, len(seen) - 1))
    slower_by = data.draw(st.floats(0.0, 20.0, allow_nan=False))
    slower = list(seen)
    predicted, budget, observed = seen[index]
    slower[index] = (predicted, budget, observed + slower_by)
    now = len(seen)
    assert calibrated(slower).ttft_correction(now) >= calibrated(seen).ttft_correction(now)


@given(seen=seen_strategy, later=st.floats(0.0, 1000.0, allow_nan=False))
def test_with_no_new_sample_it_decays_back_to_one(seen: list[Seen], later: float) -> None:
    calibration = calibrated(seen)
    gone = len(seen) + SETTINGS.max_age_seconds + later
    assert calibration.ttft_correction(now=gone) == 1.0


@given(seen=st.lists(st.tuples(seconds, seconds), min_size=0, max_size=60))
def test_when_every_request_met_its_target_there_is_nothing_to_correct(
    seen: list[tuple[float, float]],
) -> None:
    met = [(predicted, budget, budget * 0.99) for predicted, budget in seen]
    assert calibrated(met).ttft_correction(now=len(met)) == 1.0
