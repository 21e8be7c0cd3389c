"""What a scrape of a simulated group's vLLM `/metrics` returns, and the scraped history a policy reads.

Names follow vLLM 0.33's wire names (vllm-contract §1.2) and its default histogram bucket bounds
(§1.3), so the decision code sees the same shapes from the simulator as from Prometheus. Policies
read the history through `MetricsView`, which hides every sample newer than `now - scrape_delay`:
a decision never sees metrics the real pipeline would not yet have.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from goodput.estimators.attainment import Histogram

if TYPE_CHECKING:
    from goodput.simulator.gateway import GatewaySample

TTFT_BUCKETS_SECONDS: tuple[float, ...] = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS_SECONDS: tuple[float, ...] = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
REQUEST_LATENCY_BUCKETS_SECONDS: tuple[float, ...] = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)


class HistogramAccumulator:
    """A Prometheus-style histogram being filled: per-bucket counts, the last bucket is +Inf.

    A scrape reads it as the estimators' `Histogram`, the one histogram type of the project, so the
    decision code reads simulated histograms with the same functions as Prometheus' ones.
    """

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float, weight: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += weight
        self.total += value * weight

    def observe_linear(self, first: float, increment: float, steps: int, weight: int) -> None:
        """Observe `steps` values first, first+increment, … each `weight` times, in O(buckets).

        This is how a run of identical decode steps, whose durations grow linearly with context,
        enters the inter-token-latency histogram without a loop over steps.
        """
        if steps <= 0 or weight <= 0:
            return
        last = first + increment * (steps - 1)
        self.total += weight * (steps * first + increment * steps * (steps - 1) / 2.0)
        first_bucket = bisect.bisect_left(self.bounds, first)
        last_bucket = bisect.bisect_left(self.bounds, last)
        if first_bucket == last_bucket or increment <= 0.0:
            self.counts[first_bucket] += steps * weight
            return
        counted = 0
        for bucket in range(first_bucket, last_bucket):
            bound = self.bounds[bucket]
            at_or_below = min(steps, int((bound - first) // increment) + 1)
            # the division can land one off at an exact bound: settle it on the values themselves
            while at_or_below > counted and first + increment * (at_or_below - 1) > bound:
                at_or_below -= 1
            while at_or_below < steps and first + increment * at_or_below <= bound:
                at_or_below += 1
            self.counts[bucket] += (at_or_below - counted) * weight
            counted = at_or_below
        self.counts[last_bucket] += (steps - counted) * weight

    def snapshot(self) -> Histogram:
        """The cumulative histogram a scrape reads now."""
        cumulative: list[int] = []
        running = 0
        for count in self.counts:
            running += count
            cumulative.append(running)
        return Histogram(self.bounds, tuple(cumulative), self.total)


@dataclass(frozen=True, slots=True)
class GroupScrape:
    """One group's leader `/metrics` at one scrape (rank 0 serves the whole group's engine), raw:
    the controllers' `GroupMetrics` is what the operator derives from such scrapes over a window.

    Counters are cumulative since the group started, as Prometheus sees them. `gpu_busy_seconds_total`
    is what DCGM's GPU utilisation integrates (time with a kernel running: any engine step), and
    `in_flight_seconds_total` is ∫ (running + waiting) dt, the time-weighted concurrency a Knative
    queue-proxy reports.
    """

    group: str
    serving: bool
    """False while draining: the pods still export metrics but take no new requests."""
    num_requests_running: int
    num_requests_waiting: int
    kv_cache_usage_perc: float
    kv_cache_size_tokens: int
    prompt_tokens_total: int
    generation_tokens_total: int
    prefix_cache_queries_total: int
    prefix_cache_hits_total: int
    num_preemptions_total: int
    request_success_total: int
    request_prompt_tokens_sum: int
    """`vllm:request_prompt_tokens_sum`: prompt tokens of finished requests (its count is request_success)."""
    request_generation_tokens_sum: int
    """`vllm:request_generation_tokens_sum`: output tokens of finished requests."""
    gpu_busy_seconds_total: float
    in_flight_seconds_total: float
    waiting_prompt_tokens: int
    """Prompt tokens not yet prefilled (waiting and partly prefilled requests): a gateway-side figure."""
    time_to_first_token_seconds: Histogram
    inter_token_latency_seconds: Histogram
    request_queue_time_seconds: Histogram
    e2e_request_latency_seconds: Histogram
    request_time_per_output_token_seconds: Histogram | None = None
    """Per-request TPOT; None for an exporter without it."""


@dataclass(frozen=True, slots=True)
class FleetSample:
    """Every serving or draining group's metrics from one scrape round, at `time`."""

    time: float
    groups: tuple[GroupScrape, ...]
    gateway: GatewaySample | None = None
    """The gateway's own series at the same scrape, when a gateway stands in front of the groups."""

    def by_group(self) -> dict[str, GroupScrape]:
        return {metrics.group: metrics for metrics in self.groups}


class MetricsHistory:
    """The scrape rounds of the recent past; older rounds are dropped (policies look back ≤ minutes)."""

    def __init__(self, retention_seconds: float = 900.0) -> None:
        self._samples: deque[FleetSample] = deque()
        self._retention_seconds = retention_seconds

    def append(self, sample: FleetSample) -> None:
        self._samples.append(sample)
        horizon = sample.time - self._retention_seconds
        while self._samples and self._samples[0].time < horizon:
            self._samples.popleft()

    def view(self, as_of: float) -> MetricsView:
        """The samples a query at `as_of` can see (time ≤ as_of), oldest first."""
        visible = [sample for sample in self._samples if sample.time <= as_of]
        return MetricsView(as_of, tuple(visible))


@dataclass(frozen=True, slots=True)
class MetricsView:
    """What a policy sees: scrape rounds up to `as_of` (= now − scrape delay), oldest first."""

    as_of: float
    samples: tuple[FleetSample, ...]

    @property
    def latest(self) -> FleetSample | None:
        return self.samples[-1] if self.samples else None

    def at_or_before(self, time: float) -> FleetSample | None:
        """The newest sample no later than `time` (the left edge of a rate window)."""
        times = [sample.time for sample in self.samples]
        index = bisect.bisect_right(times, time) - 1
        return self.samples[index] if index >= 0 else None

    def within(self, start: float) -> Iterator[FleetSample]:
        """Samples with time > start, oldest first."""
        return (sample for sample in self.samples if sample.time > start)


def window_increase(latest: FleetSample, earlier: FleetSample | None, counter: str) -> tuple[float, float]:
    """(Σ increase of a counter over groups present in both samples, window seconds).

    Groups that appeared after `earlier` count from zero, as PromQL `increase` over a new series does.
    """
    if earlier is None:
        return 0.0, 0.0
    before = earlier.by_group()
    total = 0.0
    for metrics in latest.groups:
        now_value = float(getattr(metrics, counter))
        previous = before.get(metrics.group)
        total += now_value - (float(getattr(previous, counter)) if previous is not None else 0.0)
    return total, latest.time - earlier.time
