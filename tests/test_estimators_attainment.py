"""Attainment from Prometheus histograms, and goodput with its denominators (estimators.attainment)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from goodput.estimators.attainment import (
    GoodputReport,
    Histogram,
    LatencyTargets,
    RequestOutcome,
    attains,
    bound_read_for,
    fraction_not_shown_beyond,
    fraction_within,
    goodput_from_histograms,
    goodput_from_outcomes,
    histogram_delta,
    histogram_quantile,
    merge_histograms,
    rose_beyond_noise,
)

# vLLM's default TTFT buckets (vllm-contract §1.3).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
SMALL = Histogram(
    (1.0, 2.0, 4.0), (10.0, 30.0, 70.0, 100.0)
)  # 10 in (0,1], 20 in (1,2], 40 in (2,4], 30 above


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (2.0, 0.30),
        (1.5, 0.20),
        (0.5, 0.05),
        (3.0, 0.50),
        (4.0, 0.70),
        (100.0, 0.70),
    ],
    ids=[
        "on a bound",
        "half way inside a bucket",
        "inside the first bucket from zero",
        "inside a wider bucket",
        "on the last finite bound",
        "above every bound: +Inf never counts",
    ],
)
def test_fraction_within_interpolates_inside_the_target_bucket(target: float, expected: float) -> None:
    assert fraction_within(SMALL, target) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (2.0, 0.30),
        (1.5, 0.30),
        (0.5, 0.10),
        (3.0, 0.70),
        (100.0, 1.00),
    ],
    ids=[
        "on a bound: as fraction_within",
        "inside a bucket: its observations are not shown beyond",
        "inside the first bucket from zero",
        "inside a wider bucket",
        "above every bound: nothing is shown beyond",
    ],
)
def test_fraction_not_shown_beyond_counts_only_the_misses_the_buckets_show(
    target: float, expected: float
) -> None:
    assert fraction_not_shown_beyond(SMALL, target) == pytest.approx(expected)


def test_a_thin_tail_inside_the_target_bucket_is_no_miss() -> None:
    """vLLM's TTFT bucket (40 s, 80 s] against a 60 s target: 3 % of requests at 45 s met it, and
    interpolation reads half of them as missed (0.985 < 0.99)."""
    bounds = (10.0, 20.0, 40.0, 80.0, 160.0)
    histogram = Histogram.from_observations(bounds, [15.0] * 97 + [45.0] * 3)
    assert fraction_within(histogram, 60.0) == pytest.approx(0.985)
    assert fraction_not_shown_beyond(histogram, 60.0) == 1.0
    late = Histogram.from_observations(bounds, [15.0] * 97 + [90.0] * 3)
    assert fraction_not_shown_beyond(late, 60.0) == pytest.approx(0.97)


@pytest.mark.parametrize(
    ("target", "expected"),
    [(2.0, None), (1.5, 2.0), (0.5, 1.0), (100.0, None)],
    ids=["on a bound", "inside a bucket: its upper bound", "inside the first bucket", "past every bound"],
)
def test_the_bound_a_target_is_read_at(target: float, expected: float | None) -> None:
    assert bound_read_for(SMALL, target) == expected
    assert bound_read_for(None, target) is None


@given(
    observations=st.lists(st.floats(0.0, 20.0), min_size=1, max_size=200),
    target=st.floats(0.0, 30.0),
)
def test_not_shown_beyond_is_never_below_the_true_share(observations: list[float], target: float) -> None:
    """No observation within the target is ever counted as a miss."""
    histogram = Histogram.from_observations(TTFT_BUCKETS, observations)
    exact = sum(1 for value in observations if value <= target) / len(observations)
    share = fraction_not_shown_beyond(histogram, target)
    assert share is not None and share >= exact - 1e-12


@pytest.mark.parametrize(
    "histogram",
    [None, Histogram.empty(TTFT_BUCKETS)],
    ids=["no histogram", "histogram with no observations"],
)
def test_no_observations_is_unknown_not_zero_or_one(histogram: Histogram | None) -> None:
    assert fraction_within(histogram, 2.0) is None
    assert fraction_not_shown_beyond(histogram, 2.0) is None
    assert histogram_quantile(histogram, 0.99) is None


def test_too_few_observations_is_unknown() -> None:
    assert fraction_within(SMALL, 2.0, min_observations=101) is None
    assert fraction_within(SMALL, 2.0, min_observations=100) == pytest.approx(0.3)


def test_from_observations_buckets_like_prometheus_client() -> None:
    histogram = Histogram.from_observations((1.0, 2.0), [0.5, 1.0, 1.5, 2.0, 2.5, 9.0])
    assert histogram.cumulative_counts == (2.0, 4.0, 6.0)
    assert histogram.total == 6.0
    assert histogram.sum == pytest.approx(16.5)  # the series' _sum


def test_histogram_shape_is_checked() -> None:
    with pytest.raises(ValueError, match="one count per bound"):
        Histogram((1.0, 2.0), (1.0, 2.0))


def test_delta_over_a_window_and_across_a_reset() -> None:
    before = Histogram((1.0, 2.0), (5.0, 8.0, 10.0), 12.0)
    after = Histogram((1.0, 2.0), (9.0, 15.0, 20.0), 30.5)
    assert histogram_delta(after, before) == Histogram((1.0, 2.0), (4.0, 7.0, 10.0), 18.5)
    restarted = Histogram((1.0, 2.0), (1.0, 1.0, 2.0))
    assert histogram_delta(restarted, before) == restarted
    assert histogram_delta(after, None) == after
    with pytest.raises(ValueError, match="bucket bounds"):
        histogram_delta(after, Histogram((1.0,), (0.0, 0.0)))


def test_merge_sums_groups() -> None:
    one = Histogram((1.0,), (1.0, 2.0), 2.5)
    two = Histogram((1.0,), (3.0, 3.0), 1.5)
    assert merge_histograms([one, two]) == Histogram((1.0,), (4.0, 5.0), 4.0)
    assert merge_histograms([]) is None
    with pytest.raises(ValueError, match="bucket bounds"):
        merge_histograms([one, Histogram((2.0,), (0.0, 0.0))])


@pytest.mark.parametrize(
    ("quantile", "expected"),
    [(0.05, 0.5), (0.2, 1.5), (0.5, 3.0), (0.95, 4.0)],
    ids=["first bucket", "second bucket", "median", "in +Inf: last finite bound"],
)
def test_histogram_quantile_follows_prometheus(quantile: float, expected: float) -> None:
    assert histogram_quantile(SMALL, quantile) == pytest.approx(expected)


@given(
    observations=st.lists(st.floats(0.0, 20.0), min_size=1, max_size=200),
    low=st.floats(0.0, 12.0),
    step=st.floats(0.0, 12.0),
)
def test_fraction_within_is_monotone_and_bounded(observations: list[float], low: float, step: float) -> None:
    histogram = Histogram.from_observations(TTFT_BUCKETS, observations)
    lower = fraction_within(histogram, low)
    higher = fraction_within(histogram, low + step)
    assert lower is not None and higher is not None
    assert 0.0 <= lower <= higher <= 1.0


@given(
    observations=st.lists(st.floats(0.0, 20.0), min_size=1, max_size=200),
    target=st.sampled_from(TTFT_BUCKETS),
)
def test_on_a_bound_the_fraction_is_exact(observations: list[float], target: float) -> None:
    histogram = Histogram.from_observations(TTFT_BUCKETS, observations)
    exact = sum(1 for value in observations if value <= target) / len(observations)
    assert fraction_within(histogram, target) == pytest.approx(exact)


def test_goodput_keeps_offered_admitted_and_rejected_apart() -> None:
    """Rejecting more raises admitted attainment but not offered attainment (§5)."""
    served = goodput_from_histograms(
        window_seconds=60,
        ttft_within_target=0.8,
        itl_within_target=0.9,
        finished_requests=90,
        aborted_requests=10,
        rejected_requests=0,
        generated_tokens=6000,
    )
    rejecting = goodput_from_histograms(
        window_seconds=60,
        ttft_within_target=1.0,
        itl_within_target=1.0,
        finished_requests=72,
        aborted_requests=0,
        rejected_requests=28,
        generated_tokens=4800,
    )
    assert served == GoodputReport(60, 100, 100, 0, 72.0, 0.72, 0.72, 1.2, 90.0)
    assert rejecting.attaining_requests == served.attaining_requests
    assert rejecting.attainment_admitted == 1.0
    assert rejecting.attainment_offered == pytest.approx(served.attainment_offered)


def test_goodput_without_observations_is_unknown() -> None:
    report = goodput_from_histograms(
        window_seconds=60,
        ttft_within_target=None,
        itl_within_target=None,
        finished_requests=0,
        aborted_requests=0,
        rejected_requests=0,
        generated_tokens=0,
    )
    assert report.attaining_requests is None
    assert report.attainment_admitted is None
    assert report.attainment_offered is None
    assert report.request_goodput_per_second is None
    assert report.token_goodput_per_second is None


TARGETS = {"interactive": LatencyTargets(2.0, 0.08), "batch": LatencyTargets(60.0, 1.0)}


@pytest.mark.parametrize(
    ("outcome", "expected"),
    [
        (RequestOutcome("interactive", True, True, 1.0, 0.05, 100), True),
        (RequestOutcome("interactive", True, True, 2.5, 0.05, 100), False),
        (RequestOutcome("interactive", True, True, 1.0, 0.2, 100), False),
        (RequestOutcome("interactive", True, False, 1.0, 0.05, 100), False),
        (RequestOutcome("interactive", False, False, None, None, 0), False),
        (RequestOutcome("batch", True, True, 30.0, 0.5, 100), True),
        (RequestOutcome("interactive", True, True, 0.5, None, 1), True),
    ],
    ids=["within", "late first token", "one stall", "failed", "rejected", "batch class", "single token"],
)
def test_joint_attainment_of_one_request(outcome: RequestOutcome, expected: bool) -> None:
    assert attains(outcome, TARGETS[outcome.class_name]) is expected


def test_goodput_from_outcomes_is_exact() -> None:
    outcomes = [
        RequestOutcome("interactive", True, True, 1.0, 0.05, 100),
        RequestOutcome("interactive", True, True, 3.0, 0.05, 200),
        RequestOutcome("batch", True, True, 10.0, 0.5, 300),
        RequestOutcome("interactive", False, False, None, None, 0),
    ]
    report = goodput_from_outcomes(outcomes, TARGETS.__getitem__, window_seconds=10)
    assert report == GoodputReport(10, 4, 3, 1, 2, 2 / 3, 0.5, 0.2, 40.0)
    assert goodput_from_outcomes([], TARGETS.__getitem__, 10).attainment_offered is None


@pytest.mark.parametrize(
    ("before", "before_count", "after", "after_count", "rose"),
    [
        (0.5, 100, 0.7, 100, True),
        (0.5, 100, 0.55, 100, False),
        (0.96, 10_000, 0.965, 10_000, True),
        (0.96, 100, 0.965, 100, False),
        (0.9, 100, 0.8, 100, False),
        (1.0, 100, 1.0, 100, False),
        (0.0, 10, 0.1, 10, True),
    ],
    ids=[
        "a large rise on a hundred requests",
        "a rise within the noise of a hundred requests",
        "a small rise on many observations",
        "the same small rise on few observations",
        "a fall",
        "no change at a perfect share",
        "a rise from zero beyond the noise of the new share",
    ],
)
def test_a_rise_counts_only_beyond_one_standard_error(
    before: float, before_count: float, after: float, after_count: float, rose: bool
) -> None:
    assert rose_beyond_noise(before, before_count, after, after_count) is rose


@given(share=st.floats(0.0, 1.0), count=st.floats(1.0, 1e6))
def test_an_unchanged_share_never_rose(share: float, count: float) -> None:
    assert not rose_beyond_noise(share, count, share, count)


@given(
    st.lists(
        st.tuples(
            st.floats(min_value=0.0, max_value=1e6, allow_nan=False), st.integers(min_value=0, max_value=50)
        ),
        max_size=20,
    )
)
def test_a_value_observed_n_times_buckets_as_n_observations_of_it(pairs: list[tuple[float, int]]) -> None:
    bounds = (1.0, 10.0, 1_000.0, 100_000.0)
    weighted = Histogram.from_weighted_observations(bounds, [(value, float(times)) for value, times in pairs])
    repeated = Histogram.from_observations(bounds, [value for value, times in pairs for _ in range(times)])
    assert weighted.cumulative_counts == repeated.cumulative_counts
    assert weighted.sum == pytest.approx(repeated.sum)
