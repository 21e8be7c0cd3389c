"""What a decision starts from: the groups counted by state, and the fresh metrics of the ready
ones pooled (stale or missing ones set aside, never guessed)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeGuard

from goodput.api.modelgroup import COMING_STATES
from goodput.controllers.autoscale.model import (
    GatewayObservation,
    GroupCounts,
    GroupMetrics,
    GroupObservation,
    ModelGroupSnapshot,
    RequestQueue,
    ScalingPolicy,
)
from goodput.estimators.attainment import (
    Histogram,
)
from goodput.estimators.capacity import CapacityProfile
from goodput.estimators.queueing import (
    QueuedRequest,
    TrafficMix,
)


def _feasible_fractions(
    snapshot: ModelGroupSnapshot, policy: ScalingPolicy
) -> tuple[float, float, float | None]:
    """The primary class's feasible share of requests and of prompt tokens (1 while unknown), and
    the attainable ceiling (None while unknown)."""
    entry = snapshot.feasibility_for(policy.primary_class.name)
    if entry is None:
        return 1.0, 1.0, None
    known = entry.longest_feasible_prompt_tokens == 0 or entry.infeasible_request_share is not None
    request_fraction = entry.feasible_request_fraction
    return request_fraction, entry.feasible_token_fraction, request_fraction if known else None


def _feasible_queue(queue: RequestQueue, snapshot: ModelGroupSnapshot, policy: ScalingPolicy) -> RequestQueue:
    """The queue without the requests no group can serve within their class's TTFT (each judged
    against its own class's threshold; a class without one keeps all its requests)."""
    if not snapshot.feasibility:
        return queue

    def feasible(request: QueuedRequest) -> bool:
        entry = snapshot.feasibility_for(policy.targets_for(request.class_name).name)
        return entry is None or entry.admits(request.input_tokens)

    kept = tuple(request for request in queue.requests if feasible(request))
    return queue if len(kept) == len(queue.requests) else RequestQueue(kept, queue.age_seconds)


def _finite(metrics: GroupMetrics) -> bool:
    """Every number the signals add up is finite (a sum is NaN or infinite if any term is)."""
    return math.isfinite(
        metrics.age_seconds
        + metrics.waiting_requests
        + metrics.running_requests
        + metrics.kv_usage_fraction
        + metrics.prompt_tokens_per_second
        + metrics.generation_tokens_per_second
        + metrics.prefix_hit_fraction
    )


def _positive(value: float | None) -> TypeGuard[float]:
    return value is not None and 0 < value < math.inf


@dataclass(slots=True)
class _GroupStates:
    """How many groups are in each state, and how many ready ones have no usable metrics."""

    ready: int = 0
    coming: int = 0
    draining: int = 0
    failed: int = 0
    unschedulable: int = 0
    stale: int = 0
    missing: int = 0


def _classify_groups(
    groups: Sequence[GroupObservation], max_age_seconds: float
) -> tuple[_GroupStates, list[GroupMetrics]]:
    """The groups counted by state, and the fresh metrics of the ready ones (in snapshot order)."""
    states = _GroupStates()
    fresh: list[GroupMetrics] = []
    for group in groups:
        if group.unschedulable:
            states.unschedulable += 1
        state = group.state
        if state != "Ready":
            if state in COMING_STATES:
                states.coming += 1
            elif state == "Draining":
                states.draining += 1
            elif state == "Failed":
                states.failed += 1
            continue
        states.ready += 1
        metrics = group.metrics
        if metrics is None or not _finite(metrics):
            states.missing += 1  # NaN or infinite series (a 0/0 in a query) are not knowledge
        elif metrics.age_seconds > max_age_seconds:
            states.stale += 1
        else:
            fresh.append(metrics)
    return states, fresh


@dataclass(slots=True)
class _Pool:
    """The sums over the fresh metrics of ready groups: counts, rates, KV use, the traffic mix's
    weights and the histograms to merge."""

    waiting: float = 0.0
    running: float = 0.0
    prompt_rate: float = 0.0
    generation_rate: float = 0.0
    kv_used: float = 0.0
    hit_tokens: float = 0.0
    mix_weight: float = 0.0
    mix_input: float = 0.0
    mix_output: float = 0.0
    finished: float = 0.0
    aborted: float = 0.0
    rejected: float = 0.0
    max_fresh_age: float = 0.0
    ttft: list[Histogram] = field(default_factory=list)
    itl: list[Histogram] = field(default_factory=list)
    queue_time: list[Histogram] = field(default_factory=list)
    tpot: list[Histogram] = field(default_factory=list)

    def add(self, metrics: GroupMetrics, profile: CapacityProfile) -> None:
        self.max_fresh_age = max(self.max_fresh_age, metrics.age_seconds)
        self.waiting += metrics.waiting_requests
        self.running += metrics.running_requests
        self.prompt_rate += metrics.prompt_tokens_per_second
        self.generation_rate += metrics.generation_tokens_per_second
        self.kv_used += metrics.kv_usage_fraction * profile.kv_capacity_tokens
        self.hit_tokens += metrics.prompt_tokens_per_second * metrics.prefix_hit_fraction
        self._add_mix(metrics, profile.reference_output_tokens)
        self.finished += metrics.finished_requests
        self.aborted += metrics.aborted_requests
        self.rejected += metrics.rejected_requests
        for pooled, histogram in (
            (self.ttft, metrics.ttft),
            (self.itl, metrics.itl),
            (self.queue_time, metrics.queue_time),
            (self.tpot, metrics.tpot),
        ):
            if histogram is not None:
                pooled.append(histogram)

    def _add_mix(self, metrics: GroupMetrics, reference_output_tokens: float) -> None:
        """The group's requests per second weigh its mean prompt and output lengths in the mix."""
        mean_input = metrics.mean_input_tokens
        if not (_positive(mean_input) and metrics.prompt_tokens_per_second > 0):
            return
        requests_per_second = metrics.prompt_tokens_per_second / mean_input
        mean_output = metrics.mean_output_tokens
        self.mix_weight += requests_per_second
        self.mix_input += metrics.prompt_tokens_per_second
        self.mix_output += requests_per_second * (
            mean_output if _positive(mean_output) else reference_output_tokens
        )

    def keep_feasible(self, request_fraction: float, token_fraction: float) -> None:
        """Scale the sums to the feasible share: request counts by requests, token sums by tokens."""
        self.waiting, self.running = self.waiting * request_fraction, self.running * request_fraction
        self.prompt_rate = self.prompt_rate * token_fraction
        self.generation_rate = self.generation_rate * request_fraction
        self.kv_used, self.hit_tokens = self.kv_used * token_fraction, self.hit_tokens * token_fraction
        self.mix_weight, self.mix_input = self.mix_weight * request_fraction, self.mix_input * token_fraction
        self.mix_output *= request_fraction

    def mix(self, profile: CapacityProfile) -> TrafficMix:
        """The traffic mix the pooled groups served; the profile's reference where they served none."""
        weight = self.mix_weight
        return TrafficMix(
            mean_input_tokens=max(1.0, self.mix_input / weight)
            if weight > 0
            else profile.reference_input_tokens,
            mean_output_tokens=self.mix_output / weight if weight > 0 else profile.reference_output_tokens,
            prefix_hit_fraction=self.hit_tokens / self.prompt_rate if self.prompt_rate > 0 else 0.0,
        )


class ObservedGroups:
    """Group counts and the pooled fresh metrics of ready groups, gathered in one pass."""

    __slots__ = (
        "aborted",
        "attainable_fraction",
        "coming",
        "current",
        "draining",
        "failed",
        "finished",
        "fresh",
        "gateway",
        "gateway_stale",
        "generation_rate",
        "itl",
        "kv_used_tokens",
        "max_fresh_age",
        "missing",
        "mix",
        "prompt_rate",
        "queue",
        "queue_stale",
        "queue_time",
        "ready",
        "rejected",
        "running",
        "stale",
        "tpot",
        "ttft",
        "unschedulable",
        "waiting",
    )

    def __init__(self, snapshot: ModelGroupSnapshot, policy: ScalingPolicy) -> None:
        max_age = policy.staleness.max_age_seconds
        self.current = snapshot.spec_replicas
        states, fresh_metrics = _classify_groups(snapshot.groups, max_age)
        pool = _Pool()
        for metrics in fresh_metrics:
            pool.add(metrics, snapshot.profile)
        # Only feasible demand is scaled for: strip the primary class's infeasible share (engine
        # series carry no class) from the pooled counts and rates, by requests and by prompt tokens.
        request_fraction, token_fraction, self.attainable_fraction = _feasible_fractions(snapshot, policy)
        pool.keep_feasible(request_fraction, token_fraction)
        self.ready, self.coming, self.draining, self.failed = (
            states.ready,
            states.coming,
            states.draining,
            states.failed,
        )
        self.unschedulable, self.stale, self.missing = states.unschedulable, states.stale, states.missing
        self.fresh = len(fresh_metrics)
        self.waiting, self.running = pool.waiting, pool.running
        self.prompt_rate, self.generation_rate = pool.prompt_rate, pool.generation_rate
        self.kv_used_tokens = pool.kv_used
        self.finished, self.aborted, self.rejected = pool.finished, pool.aborted, pool.rejected
        self.ttft, self.itl, self.queue_time, self.tpot = pool.ttft, pool.itl, pool.queue_time, pool.tpot
        self.max_fresh_age = pool.max_fresh_age
        self.mix = pool.mix(snapshot.profile)
        queue = snapshot.queue
        self.queue_stale = queue is not None and queue.age_seconds > max_age
        self.queue: RequestQueue | None = (
            _feasible_queue(queue, snapshot, policy) if queue is not None and not self.queue_stale else None
        )
        gateway = snapshot.gateway
        self.gateway_stale = gateway is not None and gateway.age_seconds > max_age
        self.gateway: GatewayObservation | None = None if self.gateway_stale else gateway

    @property
    def load_known(self) -> bool:
        return self.fresh > 0 or self.queue is not None or self.gateway is not None

    @property
    def gateway_holds(self) -> float:
        """Requests the gateway holds or has in flight (0 without a fresh gateway)."""
        gateway = self.gateway
        return 0.0 if gateway is None else gateway.waiting_requests + gateway.running_requests

    @property
    def has_demand(self) -> bool:
        """Any work waiting, running or arriving: what wakes a pool at zero groups."""
        if self.queue is not None and self.queue.requests:
            return True
        if self.gateway_holds > 0:
            return True
        return self.waiting > 0 or self.running > 0 or self.prompt_rate > 0 or self.generation_rate > 0

    def counts(self) -> GroupCounts:
        return GroupCounts(
            current=self.current,
            ready=self.ready,
            coming=self.coming,
            draining=self.draining,
            failed=self.failed,
            unschedulable=self.unschedulable,
            fresh_metrics=self.fresh,
            stale_metrics=self.stale,
            missing_metrics=self.missing,
            gateway_fresh=self.gateway is not None,
            gateway_stale=self.gateway_stale,
        )
