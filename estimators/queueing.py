"""Arrival work rate, queued work, predicted queue wait, queue budget and deadline slack (§7-§9, §25).

Two levels of knowledge are served by the same arithmetic:

- engine metrics only (vLLM's Prometheus series): counts of waiting and running requests, token
  rates and mean prompt and output lengths. Every waiting request is priced at the mean mix.
- exact queue contents, when a gateway supplies them: each request's prompt, prefix hit, predicted
  output, progress and deadline.

Queued work is modelled as a fluid served first come, first served by the pooled capacity of the
serving groups: a request waits for the work queued ahead of it. Running requests are not a backlog
more groups could drain faster (a sequence decodes one token per step whatever the number of
groups), so they count in Q_work but not in the wait of a queued request.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from goodput.estimators.work import WorkErrorProfile, WorkPricing

# A running request whose progress is unknown is, on average, half way through its output.
RUNNING_REMAINING_FRACTION = 0.5


@dataclass(frozen=True, slots=True)
class TrafficMix:
    """Mean request shape of the traffic being priced."""

    mean_input_tokens: float
    mean_output_tokens: float
    prefix_hit_fraction: float = 0.0


@dataclass(frozen=True, slots=True)
class QueueWork:
    """Remaining work in the queue, in work-seconds: mean estimate and p90 upper estimate."""

    waiting_seconds: float
    running_seconds: float
    waiting_seconds_p90: float
    running_seconds_p90: float

    @property
    def total_seconds(self) -> float:
        return self.waiting_seconds + self.running_seconds

    @property
    def total_seconds_p90(self) -> float:
        return self.waiting_seconds_p90 + self.running_seconds_p90


def prefill_work_per_request(pricing: WorkPricing, mix: TrafficMix) -> float:
    cached_tokens = mix.mean_input_tokens * mix.prefix_hit_fraction
    return pricing.prefill_work_seconds(mix.mean_input_tokens, cached_tokens)


def arrival_work_rate(
    pricing: WorkPricing,
    prompt_tokens_per_second: float,
    generation_tokens_per_second: float,
    mix: TrafficMix,
) -> float:
    """λ_w in work-seconds per second, from vLLM's prompt and generation token counters.

    Prompt tokens arrive in requests of the mix's mean length (the quadratic attention term is
    priced per request); generation tokens are priced at the mix's mean decode context.
    """
    mean_input_tokens = max(1.0, mix.mean_input_tokens)
    requests_per_second = prompt_tokens_per_second / mean_input_tokens
    mean_decode_context = mix.mean_input_tokens + mix.mean_output_tokens / 2
    return requests_per_second * prefill_work_per_request(pricing, mix) + (
        generation_tokens_per_second * pricing.decode_work_per_token(mean_decode_context)
    )


def queue_work_from_counts(
    pricing: WorkPricing,
    waiting_requests: float,
    running_requests: float,
    mix: TrafficMix,
    output_tokens_p90_over_mean: float,
) -> QueueWork:
    """Q_work when only engine gauges are known: every request is priced at the mean mix.

    The p90 upper estimate stretches the outputs by the mix's p90/mean output length: output length
    is what a queue cannot see.
    """
    waiting_prefill = prefill_work_per_request(pricing, mix)
    output_tokens = mix.mean_output_tokens
    input_tokens = mix.mean_input_tokens

    def waiting_decode(outputs: float) -> float:
        return pricing.decode_work_seconds(input_tokens, outputs)

    def running_decode(outputs: float) -> float:
        remaining = outputs * RUNNING_REMAINING_FRACTION
        return pricing.decode_work_seconds(input_tokens + outputs - remaining, remaining)

    upper_outputs = output_tokens * max(1.0, output_tokens_p90_over_mean)
    return QueueWork(
        waiting_seconds=waiting_requests * (waiting_prefill + waiting_decode(output_tokens)),
        running_seconds=running_requests * running_decode(output_tokens),
        waiting_seconds_p90=waiting_requests * (waiting_prefill + waiting_decode(upper_outputs)),
        running_seconds_p90=running_requests * running_decode(upper_outputs),
    )


@dataclass(frozen=True, slots=True)
class QueuedRequest:
    """One request as a gateway sees it: waiting for a group, or running on one.

    ttft_deadline: absolute time (same clock as `now`) of its first-token deadline; None when it has
    not been set, and then its class target from arrival applies.
    """

    arrival_time: float
    input_tokens: int
    expected_output_tokens: int
    cached_tokens: int = 0
    generated_tokens: int = 0
    running: bool = False
    class_name: str = ""
    ttft_deadline: float | None = None


def remaining_work_seconds(pricing: WorkPricing, request: QueuedRequest) -> float:
    """Predicted remaining work: the prefill if not started, then the outputs not yet generated
    (at least one: a request past its predicted length is still running)."""
    remaining_outputs = request.expected_output_tokens - request.generated_tokens
    decode = pricing.decode_work_seconds(
        request.input_tokens + request.generated_tokens, remaining_outputs if remaining_outputs > 1 else 1
    )
    if request.running:
        return decode
    return pricing.prefill_work_seconds(request.input_tokens, request.cached_tokens) + decode


def queue_work_exact(
    pricing: WorkPricing, requests: Sequence[QueuedRequest], work_error: WorkErrorProfile
) -> QueueWork:
    """Q_work from exact queue contents; the upper estimate uses each request's shape-bucket p90 error."""
    waiting = running = waiting_p90 = running_p90 = 0.0
    p90_ratio_for = work_error.p90_ratio_for
    for request in requests:
        work = remaining_work_seconds(pricing, request)
        upper = work * p90_ratio_for(request.input_tokens, request.expected_output_tokens)
        if request.running:
            running += work
            running_p90 += upper
        else:
            waiting += work
            waiting_p90 += upper
    return QueueWork(waiting, running, waiting_p90, running_p90)


def predicted_queue_wait_seconds(
    waiting_work_seconds: float, serving_groups: int, capacity_per_group: float
) -> float:
    """Wait of a request arriving now, behind the queued work, served by the pooled groups.

    Infinite when work is queued and nothing serves it (no ready group, or no capacity).
    """
    if waiting_work_seconds <= 0:
        return 0.0
    if serving_groups <= 0 or capacity_per_group <= 0:
        return math.inf
    return waiting_work_seconds / (serving_groups * capacity_per_group)


def queue_budget_seconds(
    ttft_target_seconds: float,
    prefill_seconds: float,
    first_decode_seconds: float,
    route_seconds: float = 0.0,
    margin_seconds: float = 0.0,
) -> float:
    """B_queue = D_ttft - T_route - T_prefill - T_first - margin (§8): the wait a request can afford.

    Negative when the service time alone misses the target: no number of groups meets it then.
    """
    return ttft_target_seconds - route_seconds - prefill_seconds - first_decode_seconds - margin_seconds


@dataclass(frozen=True, slots=True)
class SlackSummary:
    """Deadline slack of the waiting requests (§9), and the groups that would keep it.

    earliest_slack_seconds: the least slack of any waiting request at the current serving capacity.
    low_slack_fraction: share of waiting requests whose slack is below the minimum.
    lost_requests: waiting requests whose deadline cannot be met even with no wait at all.
    demand_groups: groups at which at most the allowed fraction of waiting requests is below the
    minimum slack (lost requests count against the allowance); 0 when nothing waits.
    """

    waiting_requests: int
    earliest_slack_seconds: float | None
    low_slack_fraction: float | None
    lost_requests: int
    demand_groups: float


def slack_from_requests(
    pricing: WorkPricing,
    requests: Sequence[QueuedRequest],
    *,
    now: float,
    serving_groups: int,
    capacity_per_group: float,
    ttft_target_seconds: Callable[[str], float],
    service_seconds: Callable[[QueuedRequest], float],
    min_slack_seconds: float,
    low_slack_fraction: float,
    margin_seconds: float = 0.0,
) -> SlackSummary:
    """slack_i = D_i - now - T̂_wait,i - T̂_service,i - U (§9), for every waiting request in queue order.

    ttft_target_seconds: a class's TTFT target, for requests without an explicit deadline.
    service_seconds: predicted prefill plus first decode step of a request once it is admitted.
    The wait of request i is the work queued ahead of it over the pooled capacity; so the groups that
    give it `min_slack_seconds` are work_ahead_i / (C · (D_i - now - service_i - U - min_slack)).
    """
    if capacity_per_group <= 0:
        raise ValueError("capacity per group must be positive")
    pooled_capacity = serving_groups * capacity_per_group
    work_ahead = 0.0
    waiting = lost = low = 0
    earliest = math.inf
    needed: list[float] = []
    for request in requests:
        if request.running:
            continue
        waiting += 1
        deadline = request.ttft_deadline
        if deadline is None:
            deadline = request.arrival_time + ttft_target_seconds(request.class_name)
        available = deadline - now - service_seconds(request) - margin_seconds
        if work_ahead <= 0:
            wait = 0.0
        elif pooled_capacity > 0:
            wait = work_ahead / pooled_capacity
        else:
            wait = math.inf
        slack = available - wait
        earliest = min(earliest, slack)
        if slack < min_slack_seconds:
            low += 1
        affordable_wait = available - min_slack_seconds
        if affordable_wait <= 0:
            lost += 1
        elif work_ahead > 0:
            needed.append(work_ahead / (capacity_per_group * affordable_wait))
        work_ahead += remaining_work_seconds(pricing, request)
    if waiting == 0:
        return SlackSummary(0, None, None, 0, 0.0)
    # Let the `allowed` most demanding requests miss (lost ones first), meet the rest.
    allowed = math.floor(low_slack_fraction * waiting) - lost
    needed.sort(reverse=True)
    demand = needed[max(0, allowed)] if max(0, allowed) < len(needed) else 0.0
    return SlackSummary(
        waiting_requests=waiting,
        earliest_slack_seconds=earliest,
        low_slack_fraction=low / waiting,
        lost_requests=lost,
        demand_groups=demand,
    )
