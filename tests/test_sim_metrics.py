"""Scraped metrics: vLLM bucket semantics, bulk observation, window arithmetic and the scrape delay."""

from __future__ import annotations

import bisect

import pytest
from hypothesis import given
from hypothesis import strategies as st

from goodput.estimators.attainment import fraction_within, histogram_delta, histogram_quantile
from goodput.simulator.metrics import (
    ITL_BUCKETS_SECONDS,
    TTFT_BUCKETS_SECONDS,
    FleetSample,
    HistogramAccumulator,
    MetricsHistory,
)


def test_an_observation_on_a_bound_counts_in_that_bucket() -> None:
    histogram = HistogramAccumulator(TTFT_BUCKETS_SECONDS)
    for value in (0.1, 0.10000001, 3000.0):
        histogram.observe(value)
    snapshot = histogram.snapshot()
    le = dict(zip(TTFT_BUCKETS_SECONDS, snapshot.cumulative_counts, strict=False))
    assert le[0.1] == 1  # prometheus_client: value <= bound
    assert le[0.25] == 2
    assert snapshot.total == 3  # the last value is only in +Inf
    assert snapshot.cumulative_counts[-2] == 2
    assert snapshot.sum == pytest.approx(0.1 + 0.10000001 + 3000.0)


@given(
    first=st.floats(0.001, 2.0),
    increment=st.floats(0.0, 0.05),
    steps=st.integers(1, 300),
    weight=st.integers(1, 64),
)
def test_bulk_observation_equals_observing_every_step(
    first: float, increment: float, steps: int, weight: int
) -> None:
    bulk = HistogramAccumulator(ITL_BUCKETS_SECONDS)
    bulk.observe_linear(first, increment, steps, weight)
    each = [0] * (len(ITL_BUCKETS_SECONDS) + 1)
    for j in range(steps):
        each[bisect.bisect_left(ITL_BUCKETS_SECONDS, first + increment * j)] += weight
    assert bulk.counts == each
    assert bulk.total == pytest.approx(weight * sum(first + increment * j for j in range(steps)))


@pytest.mark.parametrize(
    ("observations", "q", "expected"),
    [
        # all ten in (0.04, 0.06]: the median sits half way through that bucket
        pytest.param([0.05] * 10, 0.5, 0.05, id="inside-one-bucket-interpolates-linearly"),
        # rank 9.9 of 10 falls 90 % into the (20, 40] bucket that holds the one slow request
        pytest.param([0.005] * 9 + [30.0], 0.99, 38.0, id="tail-bucket-upper-part"),
        pytest.param([5000.0], 0.5, 2560.0, id="beyond-the-last-bound-is-the-last-bound"),
    ],
)
def test_a_scrape_reads_with_histogram_quantile(observations: list[float], q: float, expected: float) -> None:
    histogram = HistogramAccumulator(TTFT_BUCKETS_SECONDS)
    for value in observations:
        histogram.observe(value)
    assert histogram_quantile(histogram.snapshot(), q) == pytest.approx(expected)


def test_a_window_is_the_difference_of_two_scrapes() -> None:
    histogram = HistogramAccumulator(TTFT_BUCKETS_SECONDS)
    histogram.observe(0.05)
    earlier = histogram.snapshot()
    histogram.observe(0.5)
    histogram.observe(5.0)
    window = histogram_delta(histogram.snapshot(), earlier)
    assert window.total == 2
    assert window.sum == pytest.approx(5.5)
    assert fraction_within(window, 1.0) == 0.5
    assert fraction_within(window, 0.25) == 0.0
    # 0.3 is a fifth of the way through (0.25, 0.5], the bucket holding one of the two
    assert fraction_within(window, 0.3) == pytest.approx(0.1)


def test_a_view_hides_samples_newer_than_its_as_of_time() -> None:
    history = MetricsHistory(retention_seconds=100.0)
    for time in range(0, 205, 5):
        history.append(FleetSample(float(time), ()))
    view = history.view(as_of=157.0)
    assert view.latest is not None and view.latest.time == 155.0
    assert view.samples[0].time == 100.0  # samples older than the retention are dropped
    sample = view.at_or_before(120.0)
    assert sample is not None and sample.time == 120.0
    assert [s.time for s in view.within(140.0)] == [145.0, 150.0, 155.0]
