"""Attainment and goodput, from Prometheus histograms or from per-request outcomes (§4, §5).

A histogram only says how many observations fell at or below each bucket bound, so the fraction
within a target that is not a bound is interpolated linearly inside the bucket that holds it, as
Prometheus' histogram_quantile does. Observations above the last finite bound are never counted as
attaining. A histogram with no observations gives None, "unknown": neither a perfect nor a failed SLO.
What may ask for GPUs reads the other way (`fraction_not_shown_beyond`): only the misses the buckets
show count.

Denominators are kept apart (§5): offered = admitted + rejected. Attainment is reported against both,
so a policy that rejects more cannot look better.

vLLM's histograms give one metric at a time, not the joint "TTFT and ITL" of one request (perf-model
§6), so from engine metrics request goodput counts finished requests within the TTFT target, and
token goodput counts generated tokens whose inter-token gap was within the ITL target. Per-request
outcomes (a gateway, the simulator) give the joint figures exactly.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Histogram:
    """A Prometheus histogram: ascending finite upper bounds and cumulative counts.

    `cumulative_counts` has one entry per bound plus a last one for +Inf (the total). `sum` is the
    series' `_sum`, the sum of the observed values; the estimators never read it, but an exporter
    (the simulator's `/metrics`) writes it, so the one histogram type carries it. 0 where unknown.
    """

    upper_bounds: tuple[float, ...]
    cumulative_counts: tuple[float, ...]
    sum: float = 0.0

    def __post_init__(self) -> None:
        if len(self.cumulative_counts) != len(self.upper_bounds) + 1:
            raise ValueError("cumulative_counts needs one count per bound plus the +Inf count")

    @property
    def total(self) -> float:
        return self.cumulative_counts[-1]

    @classmethod
    def empty(cls, upper_bounds: Sequence[float]) -> Histogram:
        return cls(tuple(upper_bounds), (0.0,) * (len(upper_bounds) + 1))

    @classmethod
    def from_observations(cls, upper_bounds: Sequence[float], observations: Iterable[float]) -> Histogram:
        """Bucket raw observations as prometheus_client does (value <= bound)."""
        return cls.from_weighted_observations(upper_bounds, ((value, 1.0) for value in observations))

    @classmethod
    def from_weighted_observations(
        cls, upper_bounds: Sequence[float], observations: Iterable[tuple[float, float]]
    ) -> Histogram:
        """Bucket (value, how many times it was observed) pairs as `from_observations` buckets each."""
        bounds = tuple(upper_bounds)
        counts = [0.0] * (len(bounds) + 1)
        observed_sum = 0.0
        for value, times in observations:
            counts[bisect_left(bounds, value)] += times
            observed_sum += value * times
        cumulative = []
        running = 0.0
        for count in counts:
            running += count
            cumulative.append(running)
        return cls(bounds, tuple(cumulative), observed_sum)


def histogram_delta(later: Histogram, earlier: Histogram | None) -> Histogram:
    """Observations between two scrapes of a cumulative histogram.

    A counter reset (the engine restarted) shows as a count going down; then everything in `later`
    happened after the reset, as Prometheus' increase() assumes.
    """
    if earlier is None:
        return later
    if later.upper_bounds != earlier.upper_bounds:
        raise ValueError("histograms with different bucket bounds cannot be subtracted")
    if any(
        now < before for now, before in zip(later.cumulative_counts, earlier.cumulative_counts, strict=True)
    ):
        return later
    return Histogram(
        later.upper_bounds,
        tuple(
            now - before
            for now, before in zip(later.cumulative_counts, earlier.cumulative_counts, strict=True)
        ),
        later.sum - earlier.sum,
    )


def merge_histograms(histograms: Iterable[Histogram]) -> Histogram | None:
    """Sum histograms with the same bounds (one per group); None when there are none."""
    parts = list(histograms)
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    bounds = parts[0].upper_bounds
    for histogram in parts:
        if histogram.upper_bounds is not bounds and histogram.upper_bounds != bounds:
            raise ValueError("histograms with different bucket bounds cannot be merged")
    # One pass over the columns; equal bounds mean equal lengths (a Histogram checks its own shape).
    columns = zip(*(histogram.cumulative_counts for histogram in parts), strict=True)
    return Histogram(bounds, tuple(map(sum, columns)), sum(histogram.sum for histogram in parts))


def fraction_within(
    histogram: Histogram | None, target: float, min_observations: float = 1.0
) -> float | None:
    """Fraction of observations <= target, interpolated inside the bucket holding the target.

    None ("unknown") when there are fewer than `min_observations` observations.
    """
    if histogram is None or histogram.total < max(min_observations, 1e-12):
        return None
    bounds = histogram.upper_bounds
    counts = histogram.cumulative_counts
    if not bounds or target > bounds[-1]:
        # Beyond the last finite bound nothing is known about the +Inf bucket: count it as missing.
        within = counts[-2] if bounds else 0.0
    else:
        index = bisect_left(bounds, target)
        lower_bound = bounds[index - 1] if index > 0 else 0.0
        below = counts[index - 1] if index > 0 else 0.0
        width = bounds[index] - lower_bound
        share = 1.0 if width <= 0 else max(0.0, target - lower_bound) / width
        within = below + (counts[index] - below) * share
    return min(1.0, max(0.0, within / histogram.total))


def fraction_not_shown_beyond(histogram: Histogram | None, target: float) -> float | None:
    """Fraction of observations the histogram does not show beyond `target`: every observation at or
    below the first bucket bound at or above it (all of them when the target is past the last finite
    bound). Equal to `fraction_within` when the target is a bound.

    Why: where a target falls inside a bucket, the histogram cannot tell which of that bucket's
    observations missed it. Interpolation spreads them evenly, which on a thin tail misreads: against
    a 60 s TTFT target, vLLM's bucket from 40 s to 80 s holds requests at 45 s, and interpolation
    counts a third of them as misses that never happened. A scale-out is paid for in GPUs, so the
    SLO checks that ask for one count only the misses the histogram shows.
    None ("unknown") without observations.
    """
    if histogram is None or histogram.total <= 0:
        return None
    index = bisect_left(histogram.upper_bounds, target)
    return min(1.0, max(0.0, histogram.cumulative_counts[index] / histogram.total))


def bound_read_for(histogram: Histogram | None, target: float) -> float | None:
    """The bucket bound `fraction_not_shown_beyond` reads a target at, when the target lies inside a
    bucket (None: no histogram, the target is a bound, or it is past the last finite bound)."""
    if histogram is None:
        return None
    index = bisect_left(histogram.upper_bounds, target)
    if index >= len(histogram.upper_bounds) or histogram.upper_bounds[index] == target:
        return None
    return histogram.upper_bounds[index]


def histogram_quantile(histogram: Histogram | None, quantile: float) -> float | None:
    """The q-quantile, interpolated linearly inside its bucket (Prometheus' rule); None if empty.

    A quantile in the +Inf bucket returns the last finite bound, as Prometheus does.
    """
    if histogram is None or histogram.total <= 0 or not histogram.upper_bounds:
        return None
    rank = quantile * histogram.total
    counts = histogram.cumulative_counts
    bounds = histogram.upper_bounds
    index = bisect_left(counts, rank)
    if index >= len(bounds):
        return bounds[-1]
    lower_bound = bounds[index - 1] if index > 0 else 0.0
    below = counts[index - 1] if index > 0 else 0.0
    in_bucket = counts[index] - below
    if in_bucket <= 0:
        return bounds[index]
    return lower_bound + (bounds[index] - lower_bound) * (rank - below) / in_bucket


def rose_beyond_noise(
    before_share: float, before_observations: float, after_share: float, after_observations: float
) -> bool:
    """Whether a measured share rose by more than one standard error of the difference.

    Each share is a binomial estimate from its observations; two samples of an unchanged share
    differ by more than one standard error only about one time in six, so a rise smaller than that
    is not evidence that anything improved.
    """
    variance = before_share * (1.0 - before_share) / max(before_observations, 1.0) + after_share * (
        1.0 - after_share
    ) / max(after_observations, 1.0)
    return after_share - before_share > math.sqrt(max(variance, 0.0))


@dataclass(frozen=True, slots=True)
class GoodputReport:
    """SLO-attaining work over a window, with the offered population beside it (§5).

    attaining_requests: admitted requests that finished within their targets.
    attainment_admitted / attainment_offered: attaining over admitted / over offered; None if the
    denominator is zero (unknown, not perfect).
    feasible_requests / attainment_attainable: the admitted requests whose SLO could be met at all
    (their zero-load floor is within target), and attaining over those: attainment against the
    attainable ceiling. None when feasibility is unknown.
    """

    window_seconds: float
    offered_requests: float
    admitted_requests: float
    rejected_requests: float
    attaining_requests: float | None
    attainment_admitted: float | None
    attainment_offered: float | None
    request_goodput_per_second: float | None
    token_goodput_per_second: float | None
    feasible_requests: float | None = None
    attainment_attainable: float | None = None


def _ratio(numerator: float | None, denominator: float) -> float | None:
    if numerator is None or denominator <= 0:
        return None
    return numerator / denominator


def goodput_from_histograms(
    *,
    window_seconds: float,
    ttft_within_target: float | None,
    itl_within_target: float | None,
    finished_requests: float,
    aborted_requests: float,
    rejected_requests: float,
    generated_tokens: float,
    feasible_share: float | None = None,
) -> GoodputReport:
    """Goodput from engine metrics over a window.

    ttft_within_target / itl_within_target: fractions from `fraction_within` (None if unknown).
    finished_requests: requests that finished normally (stop or length) in the window.
    aborted_requests: admitted requests that ended in abort or error; they never attain.
    rejected_requests: requests refused at admission (vLLM's 503s or a gateway's rejections).
    feasible_share: the share of admitted requests whose SLO can be met at all (None: unknown);
    infeasible requests cannot attain, so attainment against the ceiling is attaining over them.
    """
    admitted = finished_requests + aborted_requests
    offered = admitted + rejected_requests
    attaining = None if ttft_within_target is None else finished_requests * ttft_within_target
    window = max(window_seconds, 1e-9)
    token_goodput = None if itl_within_target is None else generated_tokens * itl_within_target / window
    feasible = None if feasible_share is None else admitted * min(1.0, max(0.0, feasible_share))
    attainable = None if feasible is None else _ratio(attaining, feasible)
    return GoodputReport(
        window_seconds=window_seconds,
        offered_requests=offered,
        admitted_requests=admitted,
        rejected_requests=rejected_requests,
        attaining_requests=attaining,
        attainment_admitted=_ratio(attaining, admitted),
        attainment_offered=_ratio(attaining, offered),
        request_goodput_per_second=None if attaining is None else attaining / window,
        token_goodput_per_second=token_goodput,
        feasible_requests=feasible,
        attainment_attainable=None if attainable is None else min(1.0, attainable),
    )


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """How one offered request ended, as a gateway or the simulator records it.

    max_itl_seconds: the largest gap between its output tokens (None if it produced at most one);
    a mean would hide the stalls the ITL target bounds (§2).
    """

    class_name: str
    admitted: bool
    succeeded: bool
    ttft_seconds: float | None
    max_itl_seconds: float | None
    output_tokens: int


@dataclass(frozen=True, slots=True)
class LatencyTargets:
    ttft_seconds: float
    itl_seconds: float


def attains(outcome: RequestOutcome, targets: LatencyTargets) -> bool:
    """The joint test of §4: admitted, succeeded, TTFT and every inter-token gap within target."""
    return (
        outcome.admitted
        and outcome.succeeded
        and outcome.ttft_seconds is not None
        and outcome.ttft_seconds <= targets.ttft_seconds
        and (outcome.max_itl_seconds is None or outcome.max_itl_seconds <= targets.itl_seconds)
    )


def goodput_from_outcomes(
    outcomes: Iterable[RequestOutcome],
    targets_for_class: Callable[[str], LatencyTargets],
    window_seconds: float,
) -> GoodputReport:
    """Exact request and token goodput from per-request outcomes over a window."""
    offered = admitted = attaining = attaining_tokens = 0.0
    for outcome in outcomes:
        offered += 1
        if outcome.admitted:
            admitted += 1
        if attains(outcome, targets_for_class(outcome.class_name)):
            attaining += 1
            attaining_tokens += outcome.output_tokens
    window = max(window_seconds, 1e-9)
    known = offered > 0
    return GoodputReport(
        window_seconds=window_seconds,
        offered_requests=offered,
        admitted_requests=admitted,
        rejected_requests=offered - admitted,
        attaining_requests=attaining if known else None,
        attainment_admitted=_ratio(attaining, admitted),
        attainment_offered=_ratio(attaining, offered),
        request_goodput_per_second=attaining / window if known else None,
        token_goodput_per_second=attaining_tokens / window if known else None,
    )
