"""Tenant fairness in the request path: weighted virtual token counters (§14-§18).

The Virtual Token Counter (Sheng et al., "Fairness in Serving Large Language Models", OSDI 2024):
each tenant has a counter of the service it received, priced by the SLOPolicy's cost weights (input
tokens, output tokens, KV byte-seconds) and divided by its weight; when capacity frees, the
backlogged tenant with the smallest counter is served next. A tenant that becomes backlogged is
lifted to the smallest counter among the backlogged tenants (or to the counter of the tenant served
last when none is), so idle time is never banked into a burst that starves the others.

Service is charged when a request is dispatched, at its prompt and its predicted output, and
settled when it finishes (the output it really generated, the KV byte-seconds it held): counters
move at once, so a tenant cannot run ahead while its requests are in flight.

Priority is a bounded exception: a request of a higher-priority class (lower number) may be served
before the least-served tenant only when its own tenant's counter is within `allowance` of the
smallest; with allowance 0 fairness is strict. Priority ages: a request's effective priority falls by
one level per `aging_seconds` waited, so lower classes are never starved by a stream of higher ones.
Within a tenant and a priority level, the earliest deadline goes first.

Pure state (no I/O, no clock): the caller passes `now`; the gateway and the simulator both drive it.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from goodput.api.slopolicy import Fairness

PayloadT = TypeVar("PayloadT")
# How often the queue forgets idle tenants it no longer needs (see `FairQueue.prune`).
PRUNE_EVERY_PUSHES = 1024


@dataclass(frozen=True, slots=True)
class CostWeights:
    """Price of service in fairness accounting (the SLOPolicy's `fairness.costWeights`)."""

    input_tokens: float = 1.0
    output_tokens: float = 1.0
    kv_byte_seconds: float = 0.0

    def cost(self, input_tokens: float, output_tokens: float, kv_byte_seconds: float = 0.0) -> float:
        return (
            self.input_tokens * input_tokens
            + self.output_tokens * output_tokens
            + self.kv_byte_seconds * kv_byte_seconds
        )


@dataclass(frozen=True, slots=True)
class FairnessPolicy:
    """Tenant weights (unlisted tenants weigh 1), cost weights, the priority allowance and aging."""

    weights: Mapping[str, float] = field(default_factory=dict)
    cost_weights: CostWeights = CostWeights()
    priority_allowance: float = 0.0
    aging_seconds: float = 10.0

    def __post_init__(self) -> None:
        if any(weight <= 0 for weight in self.weights.values()):
            raise ValueError("tenant weights must be positive")
        if self.priority_allowance < 0:
            raise ValueError("priority_allowance must not be negative")
        if self.aging_seconds <= 0:
            raise ValueError("aging_seconds must be positive")

    def weight(self, tenant: str) -> float:
        return self.weights.get(tenant, 1.0)


def fairness_policy(spec: Fairness, aging_seconds: float = 10.0) -> FairnessPolicy:
    """The SLOPolicy's `fairness` compiled for the queue."""
    weights = spec.cost_weights
    return FairnessPolicy(
        weights={tenant.name: tenant.weight for tenant in spec.tenants},
        cost_weights=CostWeights(weights.input_tokens, weights.output_tokens, weights.kv_byte_seconds),
        priority_allowance=spec.priority_allowance_tokens,
        aging_seconds=aging_seconds,
    )


@dataclass(slots=True)
class QueuedItem(Generic[PayloadT]):
    """One request waiting in the fair queue.

    deadline: absolute time of its first-token deadline (same clock as `now`); orders a tenant's own
    requests. expected_output_tokens: what is charged at dispatch, settled at completion.
    """

    tenant: str
    priority: int
    deadline: float
    arrival_time: float
    input_tokens: int
    expected_output_tokens: int
    payload: PayloadT
    sequence: int = 0
    cancelled: bool = False


@dataclass(frozen=True, slots=True)
class Dispatch(Generic[PayloadT]):
    """A request leaving the queue, and what its tenant was charged for it."""

    item: QueuedItem[PayloadT]
    charged_cost: float


class FairQueue(Generic[PayloadT]):
    """Requests waiting for capacity, served by weighted virtual token counters."""

    def __init__(self, policy: FairnessPolicy) -> None:
        self.policy = policy
        self.counters: dict[str, float] = {}
        # tenant -> priority -> heap of (deadline, sequence, item)
        self._heaps: dict[str, dict[int, list[tuple[float, int, QueuedItem[PayloadT]]]]] = {}
        self._backlog: dict[str, int] = {}
        self._sequence = itertools.count()
        self._last_served: str | None = None
        self._pushes = 0

    def __len__(self) -> int:
        return sum(self._backlog.values())

    def backlogged(self) -> tuple[str, ...]:
        return tuple(tenant for tenant, count in self._backlog.items() if count > 0)

    def backlog(self, tenant: str) -> int:
        return self._backlog.get(tenant, 0)

    def items(self) -> Iterator[QueuedItem[PayloadT]]:
        """Every waiting request (no order promised)."""
        for levels in self._heaps.values():
            for heap in levels.values():
                for _, _, item in heap:
                    if not item.cancelled:
                        yield item

    def push(self, item: QueuedItem[PayloadT]) -> QueuedItem[PayloadT]:
        """Queue a request; a tenant that was not backlogged is lifted first (the VTC lift rule)."""
        tenant = item.tenant
        if self._backlog.get(tenant, 0) == 0:
            self._lift(tenant)
        item.sequence = next(self._sequence)
        levels = self._heaps.setdefault(tenant, {})
        heapq.heappush(levels.setdefault(item.priority, []), (item.deadline, item.sequence, item))
        self._backlog[tenant] = self._backlog.get(tenant, 0) + 1
        self._pushes += 1
        if self._pushes % PRUNE_EVERY_PUSHES == 0:
            self.prune()
        return item

    def prune(self) -> int:
        """Forget idle tenants whose counter is at or below the lift floor; returns how many.

        Lossless: such a tenant, on its next request, would be lifted to at least the floor anyway, and
        a forgotten one starts from 0 and is lifted the same. It bounds memory by the tenants that are
        backlogged or ahead of the others, however many distinct tenant names clients send.
        """
        backlogged = self.backlogged()
        if backlogged:
            floor = min(self.counters.get(tenant, 0.0) for tenant in backlogged)
        elif self._last_served is not None:
            floor = self.counters.get(self._last_served, 0.0)
        else:
            return 0
        idle = [
            tenant
            for tenant, counter in self.counters.items()
            if self._backlog.get(tenant, 0) == 0 and counter <= floor and tenant != self._last_served
        ]
        for tenant in idle:
            del self.counters[tenant]
            self._backlog.pop(tenant, None)
            self._heaps.pop(tenant, None)
        return len(idle)

    def _lift(self, tenant: str) -> None:
        others = [self.counters.get(other, 0.0) for other in self.backlogged() if other != tenant]
        if others:
            floor = min(others)
        elif self._last_served is not None:
            floor = self.counters.get(self._last_served, 0.0)
        else:
            floor = 0.0
        self.counters[tenant] = max(self.counters.get(tenant, 0.0), floor)

    def cancel(self, item: QueuedItem[PayloadT]) -> bool:
        """Withdraw a waiting request (client gone, hold expired); False when it already left."""
        if item.cancelled or not self._contains(item):
            return False
        item.cancelled = True
        self._backlog[item.tenant] -= 1
        return True

    def _contains(self, item: QueuedItem[PayloadT]) -> bool:
        heap = self._heaps.get(item.tenant, {}).get(item.priority, [])
        return any(entry[2] is item for entry in heap)

    def _head(self, tenant: str, priority: int) -> QueuedItem[PayloadT] | None:
        heap = self._heaps[tenant][priority]
        while heap and heap[0][2].cancelled:
            heapq.heappop(heap)
        return heap[0][2] if heap else None

    def effective_priority(self, item: QueuedItem[PayloadT], now: float) -> float:
        """Priority improved (lowered) by one level per `aging_seconds` waited."""
        waited = max(0.0, now - item.arrival_time)
        return item.priority - waited / self.policy.aging_seconds

    def peek(self, now: float) -> QueuedItem[PayloadT] | None:
        """The request the counters choose next, without removing it."""
        tenants = self.backlogged()
        if not tenants:
            return None
        least = min(self.counters.get(tenant, 0.0) for tenant in tenants)
        bound = least + self.policy.priority_allowance
        best: tuple[float, float, float, int] | None = None
        chosen: QueuedItem[PayloadT] | None = None
        for tenant in tenants:
            counter = self.counters.get(tenant, 0.0)
            if counter > bound:
                continue
            for priority in self._heaps[tenant]:
                head = self._head(tenant, priority)
                if head is None:
                    continue
                key = (self.effective_priority(head, now), counter, head.deadline, head.sequence)
                if best is None or key < best:
                    best, chosen = key, head
        return chosen

    def pop(self, now: float) -> Dispatch[PayloadT] | None:
        """Remove the chosen request and charge its tenant its prompt and predicted output."""
        item = self.peek(now)
        if item is None:
            return None
        heap = self._heaps[item.tenant][item.priority]
        heapq.heappop(heap)
        self._backlog[item.tenant] -= 1
        cost = self.charge(item.tenant, item.input_tokens, item.expected_output_tokens)
        self._last_served = item.tenant
        return Dispatch(item, cost)

    def charge(
        self, tenant: str, input_tokens: float, output_tokens: float, kv_byte_seconds: float = 0.0
    ) -> float:
        """Add service to a tenant's counter (negative amounts refund a prediction that was too high)."""
        cost = self.policy.cost_weights.cost(input_tokens, output_tokens, kv_byte_seconds)
        self.counters[tenant] = self.counters.get(tenant, 0.0) + cost / self.policy.weight(tenant)
        return cost

    def settle(
        self,
        tenant: str,
        expected_output_tokens: int,
        actual_output_tokens: int,
        kv_byte_seconds: float = 0.0,
    ) -> float:
        """Correct a finished request's charge to the output it generated and the KV it held."""
        return self.charge(tenant, 0.0, actual_output_tokens - expected_output_tokens, kv_byte_seconds)


def jain_index(shares: Mapping[str, float]) -> float:
    """Jain's fairness index of per-tenant service (1: equal; 1/n: one tenant has everything)."""
    values = list(shares.values())
    if not values:
        return 1.0
    total = sum(values)
    squares = sum(value * value for value in values)
    if squares == 0:
        return 1.0
    return total * total / (len(values) * squares)


def fair_work_ahead_seconds(
    queued_work_by_tenant: Mapping[str, float], tenant: str, own_work_seconds: float, policy: FairnessPolicy
) -> float:
    """Queued work served before a new request of `tenant` starts, when the queue is shared fairly.

    Under weighted fair sharing (which the counters approximate), while the newcomer's tenant still
    has W = its queued work + the newcomer's, every other tenant u is served at most W·w_u/w_t
    alongside it: Σ_u min(Q_u, W·w_u/w_t) + W, less the newcomer's own work. A light tenant behind
    a heavy one therefore waits for its own share, not for the heavy tenant's whole backlog; the
    deadline gate prices its wait so.
    """
    own = queued_work_by_tenant.get(tenant, 0.0) + own_work_seconds
    weight = policy.weight(tenant)
    others = sum(
        min(work, own * policy.weight(other) / weight)
        for other, work in queued_work_by_tenant.items()
        if other != tenant and work > 0
    )
    return own - own_work_seconds + others
