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

The deadline gate asks the queue where a newcomer would stand (`FairQueue.work_ahead_seconds`): the
work dispatched before it is read from the counters (its virtual start tag) and per-tenant backlog
sums, not from the whole queue, so a light tenant behind a heavy one's burst is promised the wait
it will get; `expected_work_ahead_seconds` adds what tenants below its tag send while it waits.

Pure state (no I/O, no clock): the caller passes `now`; the gateway and the simulator both drive it.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from goodput.api.slopolicy import Fairness

PayloadT = TypeVar("PayloadT")
# How often the queue forgets idle tenants it no longer needs (see `FairQueue.prune`).
PRUNE_EVERY_PUSHES = 1024
# Deferred and best-effort requests queue this many priority levels behind admitted ones: served when
# nothing admitted waits, and, as priority ages one level per `aging_seconds`, never starved for good.
# The gateway and the simulated gateway both queue by it.
LOWER_PRECEDENCE_LEVELS = 100
# A tenant's arrival rate is forgotten after this many arrival windows without a request (it has
# decayed below e^-20 of itself).
QUIET_WINDOWS = 20
# The senders whose arrival rates the deadline gate weighs one by one: the fastest this many, kept
# between this many and twice as many (`FairQueue._compact_arrivals`); the slower rest are one
# pooled rate. Each prediction walks these lanes, so their number, not how many distinct tenant
# names clients send, is what the prediction costs a request.
MAX_TRACKED_ARRIVALS = 64


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
    """Tenant weights (unlisted tenants weigh 1), cost weights, the priority allowance and aging.

    arrival_window_seconds: the time constant over which a tenant's recent arrival rate is averaged
    (`expected_work_ahead_seconds` counts the work its arrivals put ahead of a waiting request).
    """

    weights: Mapping[str, float] = field(default_factory=dict)
    cost_weights: CostWeights = CostWeights()
    priority_allowance: float = 0.0
    aging_seconds: float = 10.0
    arrival_window_seconds: float = 10.0

    def __post_init__(self) -> None:
        if any(weight <= 0 for weight in self.weights.values()):
            raise ValueError("tenant weights must be positive")
        if self.priority_allowance < 0:
            raise ValueError("priority_allowance must not be negative")
        if self.aging_seconds <= 0:
            raise ValueError("aging_seconds must be positive")
        if self.arrival_window_seconds <= 0:
            raise ValueError("arrival_window_seconds must be positive")

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
    work_seconds: its predicted service work, summed into the queue's backlog so the work ahead of a
    newcomer (`FairQueue.work_ahead_seconds`) needs no scan; required, because an item without it
    would make the deadline gate see an empty queue. cost: what the queue priced it at when
    it was pushed (set by the queue).
    """

    tenant: str
    priority: int
    deadline: float
    arrival_time: float
    input_tokens: int
    expected_output_tokens: int
    payload: PayloadT
    work_seconds: float
    sequence: int = 0
    cancelled: bool = False
    cost: float = 0.0


@dataclass(frozen=True, slots=True)
class Dispatch(Generic[PayloadT]):
    """A request leaving the queue, and what its tenant was charged for it."""

    item: QueuedItem[PayloadT]
    charged_cost: float


@dataclass(slots=True)
class ArrivalRate:
    """A tenant's recent arrivals, as work-seconds and cost per second, decayed exponentially over the
    policy's arrival window: each arrival adds amount / window, and the sum decays by e^(-dt / window)."""

    work_per_second: float = 0.0
    cost_per_second: float = 0.0
    at: float = -math.inf

    def add(self, at: float, work_seconds: float, cost: float, window_seconds: float) -> None:
        if math.isfinite(self.at) and at > self.at:
            decay = math.exp(-(at - self.at) / window_seconds)
            self.work_per_second *= decay
            self.cost_per_second *= decay
        self.work_per_second += work_seconds / window_seconds
        self.cost_per_second += cost / window_seconds
        self.at = max(self.at, at)

    def rates_at(self, now: float, window_seconds: float) -> tuple[float, float]:
        """(work-seconds per second, cost per second) as of `now`."""
        decay = math.exp(-max(0.0, now - self.at) / window_seconds)
        return self.work_per_second * decay, self.cost_per_second * decay


@dataclass(slots=True)
class PooledArrivals:
    """Senders no longer tracked one by one: their summed arrival rates, and how many of them are
    recent (each counted by how fresh its last request is, decaying like the rates), which sizes the
    room the pool may put ahead of a newcomer."""

    rate: ArrivalRate = field(default_factory=ArrivalRate)
    senders: float = 0.0

    def pool(self, arrivals: ArrivalRate, now: float, window_seconds: float) -> None:
        work_rate, cost_rate = arrivals.rates_at(now, window_seconds)
        freshness = math.exp(-max(0.0, now - arrivals.at) / window_seconds)
        self.senders = self.senders_at(now, window_seconds) + freshness
        self.rate.add(now, work_rate * window_seconds, cost_rate * window_seconds, window_seconds)

    def senders_at(self, now: float, window_seconds: float) -> float:
        if not math.isfinite(self.rate.at):
            return 0.0
        return self.senders * math.exp(-max(0.0, now - self.rate.at) / window_seconds)


@dataclass(slots=True)
class BacklogSums:
    """The waiting requests of one tenant at one priority level: how many, their cost (as the counters
    price it) and their predicted work."""

    count: int = 0
    cost_total: float = 0.0
    work_seconds: float = 0.0

    def take(self, cost_budget: float) -> tuple[float, float]:
        """(cost, work) served of these requests within `cost_budget` of cost, taken as fluid."""
        if cost_budget >= self.cost_total:
            return self.cost_total, self.work_seconds
        if cost_budget <= 0:
            return 0.0, 0.0
        return cost_budget, self.work_seconds * cost_budget / self.cost_total


class FairQueue(Generic[PayloadT]):
    """Requests waiting for capacity, served by weighted virtual token counters."""

    def __init__(self, policy: FairnessPolicy) -> None:
        self._policy = policy
        self.counters: dict[str, float] = {}
        # tenant -> priority -> heap of (deadline, sequence, item)
        self._heaps: dict[str, dict[int, list[tuple[float, int, QueuedItem[PayloadT]]]]] = {}
        self._backlog: dict[str, int] = {}
        # tenant -> priority -> the waiting requests' count, cost and work, kept on every push and exit
        self._sums: dict[str, dict[int, BacklogSums]] = {}
        self._arrivals: dict[str, ArrivalRate] = {}
        # The pooled arrivals of senders no longer tracked one by one (see MAX_TRACKED_ARRIVALS).
        self._pooled_arrivals = PooledArrivals()
        self._sequence = itertools.count()
        self._last_served: str | None = None
        self._pushes = 0

    @property
    def policy(self) -> FairnessPolicy:
        return self._policy

    @policy.setter
    def policy(self, policy: FairnessPolicy) -> None:
        """A new policy reprices the waiting requests (cost weights may have changed): one pass over
        the queue, once per policy change."""
        self._policy = policy
        self._sums = {}
        for item in self.items():
            item.cost = policy.cost_weights.cost(item.input_tokens, item.expected_output_tokens)
            self._add(item, 1)

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
        item.cost = self.policy.cost_weights.cost(item.input_tokens, item.expected_output_tokens)
        levels = self._heaps.setdefault(tenant, {})
        heapq.heappush(levels.setdefault(item.priority, []), (item.deadline, item.sequence, item))
        self._backlog[tenant] = self._backlog.get(tenant, 0) + 1
        self._add(item, 1)
        arrivals = self._arrivals.setdefault(tenant, ArrivalRate())
        arrivals.add(item.arrival_time, item.work_seconds, item.cost, self.policy.arrival_window_seconds)
        if len(self._arrivals) > 2 * MAX_TRACKED_ARRIVALS:
            self._compact_arrivals(item.arrival_time)
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
            self._sums.pop(tenant, None)
        self._forget_quiet_arrivals()
        return len(idle)

    def _forget_quiet_arrivals(self) -> None:
        """Drop arrival rates decayed to nothing."""
        if not self._arrivals:
            return
        latest = max(arrivals.at for arrivals in self._arrivals.values())
        horizon = latest - QUIET_WINDOWS * self.policy.arrival_window_seconds
        self._arrivals = {
            tenant: arrivals for tenant, arrivals in self._arrivals.items() if arrivals.at >= horizon
        }

    def _compact_arrivals(self, now: float) -> None:
        """Keep the MAX_TRACKED_ARRIVALS fastest senders one by one and pool the rest's rates.

        Amortised: it runs once per MAX_TRACKED_ARRIVALS new senders. Pooled senders still count in
        the deadline gate's arrivals, as one lane (`expected_work_ahead_seconds`) whose room is what
        each recent one of them could put ahead at the lift floor with weight 1, a sender counted as
        far as its last request is recent. Measured against the walk over every sender one by one
        (tests/test_fair_order.py): the same wherever the wait is seconds; where the senders send
        faster than the queue drains, both predict thousands of seconds. A pooled sender that sends
        again is tracked again from its new arrival.
        """
        window = self.policy.arrival_window_seconds
        ranked = sorted(
            self._arrivals.items(), key=lambda entry: entry[1].rates_at(now, window)[0], reverse=True
        )
        self._arrivals = dict(ranked[:MAX_TRACKED_ARRIVALS])
        for _, arrivals in ranked[MAX_TRACKED_ARRIVALS:]:
            self._pooled_arrivals.pool(arrivals, now, window)

    def _lift(self, tenant: str) -> None:
        """Called before a tenant with nothing waiting queues a request (see the module's lift rule)."""
        self.counters[tenant] = max(self.counters.get(tenant, 0.0), self._lift_floor())

    def _add(self, item: QueuedItem[PayloadT], sign: int) -> None:
        """Enter (+1) or leave (-1) a request in its tenant's and level's sums."""
        levels = self._sums.setdefault(item.tenant, {})
        sums = levels.setdefault(item.priority, BacklogSums())
        sums.count += sign
        if sums.count <= 0:
            del levels[item.priority]  # exact zeros: no float residue outlives the last request
            if not levels:
                del self._sums[item.tenant]
            return
        sums.cost_total = max(0.0, sums.cost_total + sign * item.cost)
        sums.work_seconds = max(0.0, sums.work_seconds + sign * item.work_seconds)

    def cancel(self, item: QueuedItem[PayloadT]) -> bool:
        """Withdraw a waiting request (client gone, hold expired); False when it already left."""
        if item.cancelled or not self._contains(item):
            return False
        item.cancelled = True
        self._backlog[item.tenant] -= 1
        self._add(item, -1)
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
        self._add(item, -1)
        cost = self.charge(item.tenant, item.input_tokens, item.expected_output_tokens)
        self._last_served = item.tenant
        return Dispatch(item, cost)

    def put_back(self, item: QueuedItem[PayloadT]) -> None:
        """Undo a `pop` whose request no group could take after all (a LoRA adapter with no slot to
        load into): it regains its place (same deadline and sequence), its tenant the charge, and it
        is not counted as a new arrival."""
        self.charge(item.tenant, -item.input_tokens, -item.expected_output_tokens)
        levels = self._heaps.setdefault(item.tenant, {})
        heapq.heappush(levels.setdefault(item.priority, []), (item.deadline, item.sequence, item))
        self._backlog[item.tenant] = self._backlog.get(item.tenant, 0) + 1
        self._add(item, 1)

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

    def work_ahead_seconds(self, tenant: str, priority: int) -> float:
        """Queued work the counters dispatch before a request of `tenant` at `priority` queued now.

        Its place in the fair order, read from the counters (the virtual start tags) and the
        per-tenant, per-level backlog sums, so it costs O(tenants x levels), never a scan of the
        queue. The tenant's waiting requests at the same or a better level go first (a deferred or
        best-effort one, queued at a worse level, does not); the newcomer heads its tenant once the
        tenant's counter, lifted as `push` would lift it, has grown by their cost over its weight: its
        start tag. Another backlogged tenant u is served before it while u's counter is at or below
        that tag (or the tag plus the priority allowance, for u's requests of a better level): the cost
        (tag - counter_u) x weight_u and the request that crosses the tag (priced at u's mean), at most
        u's backlog. A light tenant behind a heavy one's backlog therefore waits for the heavy one's
        share, not its whole backlog; a tenant whose counter ran ahead waits until the others catch
        up. Requests that arrive later are not counted here: this is the order as it stands (see
        `expected_work_ahead_seconds`).
        """
        return self._order_ahead(tenant, priority, self._lift_floor()).work_seconds

    def expected_work_ahead_seconds(
        self, tenant: str, priority: int, now: float, drain_work_seconds_per_second: float
    ) -> float:
        """The work served before the newcomer, counting what other tenants send while it waits.

        A tenant whose counter is below the newcomer's start tag keeps going first with the requests
        it sends later, until its counter passes the tag: a heavy tenant's request waits behind the
        light tenant's arrivals during its wait as well as behind today's queue. With the queue
        draining at C and tenant u sending work at r_u (its recent arrivals) with room R_u left
        under the tag, the wait W solves C*W = ahead + sum_u min(R_u, r_u*W); the figure returned is
        C*W, the work the gate prices the wait by. Senders pooled past MAX_TRACKED_ARRIVALS are one
        lane (`_compact_arrivals`).
        """
        floor = self._lift_floor()
        order = self._order_ahead(tenant, priority, floor)
        if drain_work_seconds_per_second <= 0:
            return order.work_seconds
        window = self.policy.arrival_window_seconds
        lanes: list[tuple[float, float]] = []
        for other, arrivals in self._arrivals.items():
            if other == tenant:
                continue
            counter = self.counters.get(other, 0.0)
            if other not in self._sums:
                counter = max(counter, floor)  # lifted when it sends its next request
            room_cost = (order.start_tag - counter) * self.policy.weight(other)
            room_cost -= order.cost_taken.get(other, 0.0)
            if room_cost <= 0:
                continue
            work_rate, cost_rate = arrivals.rates_at(now, window)
            if work_rate > 0 and cost_rate > 0:
                lanes.append((room_cost * work_rate / cost_rate, work_rate))
        pooled = self._pooled_arrivals
        work_rate, cost_rate = pooled.rate.rates_at(now, window)
        if work_rate > 0 and cost_rate > 0:
            room_cost = pooled.senders_at(now, window) * max(0.0, order.start_tag - floor)
            lanes.append((room_cost * work_rate / cost_rate, work_rate))
        return order.work_seconds + work_arriving_during_wait(
            order.work_seconds, lanes, drain_work_seconds_per_second
        )

    def _lift_floor(self) -> float:
        """The counter a tenant that is not backlogged is lifted to when it queues a request: the least
        backlogged counter, or the last served tenant's when none waits (O(backlogged tenants))."""
        if self._sums:
            return min(self.counters.get(tenant, 0.0) for tenant in self._sums)
        if self._last_served is not None:
            return self.counters.get(self._last_served, 0.0)
        return 0.0

    def _order_ahead(self, tenant: str, priority: int, floor: float) -> OrderAhead:
        own_cost, own_work = 0.0, 0.0
        for level, sums in self._sums.get(tenant, {}).items():
            if level <= priority:
                own_cost += sums.cost_total
                own_work += sums.work_seconds
        counter = self.counters.get(tenant, 0.0)
        lifted = counter if tenant in self._sums else max(counter, floor)
        start = lifted + own_cost / self.policy.weight(tenant)
        ahead = own_work
        taken: dict[str, float] = {}
        allowance = self.policy.priority_allowance
        for other, levels in self._sums.items():
            counter = self.counters.get(other, 0.0)
            if other == tenant or counter > start + allowance:
                continue  # past the tag: none of its requests goes first
            weight = self.policy.weight(other)
            better, rest = _split_at(levels, priority)
            mean_cost = (better.cost_total + rest.cost_total) / (better.count + rest.count)
            better_cost, better_work = better.take(
                _cost_budget(counter, start + allowance, weight, mean_cost)
            )
            rest_cost, rest_work = 0.0, 0.0
            if counter <= start:
                rest_cost, rest_work = rest.take(
                    _cost_budget(counter, start, weight, mean_cost) - better_cost
                )
            ahead += better_work + rest_work
            taken[other] = better_cost + rest_cost
        return OrderAhead(ahead, start, taken)


def _split_at(levels: Mapping[int, BacklogSums], priority: int) -> tuple[BacklogSums, BacklogSums]:
    """A tenant's sums over the levels better than `priority`, and over the rest."""
    better, rest = BacklogSums(), BacklogSums()
    for level, sums in levels.items():
        part = better if level < priority else rest
        part.count += sums.count
        part.cost_total += sums.cost_total
        part.work_seconds += sums.work_seconds
    return better, rest


@dataclass(frozen=True, slots=True)
class OrderAhead:
    """A newcomer's place in the fair order: the queued work before it, its start tag, and the cost of
    each other tenant's backlog counted before it."""

    work_seconds: float
    start_tag: float
    cost_taken: Mapping[str, float]


def work_arriving_during_wait(
    ahead_work_seconds: float, lanes: Sequence[tuple[float, float]], drain_work_seconds_per_second: float
) -> float:
    """The work that arrives ahead of a waiting request before it is served.

    lanes: per other tenant, (room, rate): it may put at most `room` work-seconds ahead, arriving at
    `rate` work-seconds per second. The wait W is the least solution of C*W = A + sum min(room,
    rate*W), found exactly: the right side is concave and piecewise linear, so walk its segments in
    the order the lanes fill (room / rate) until the line C*W meets it. Returns C*W - A.
    """
    capacity = drain_work_seconds_per_second
    sending = [(room, rate) for room, rate in lanes if room > 0 and rate > 0]
    fixed, slope = ahead_work_seconds, sum(rate for _, rate in sending)
    for room, rate in sorted(sending, key=lambda lane: lane[0] / lane[1]):
        if slope < capacity and fixed / (capacity - slope) <= room / rate:
            break
        fixed, slope = fixed + room, slope - rate
    if slope >= capacity:  # unreachable with finite rooms: every lane fills before the loop ends
        return math.inf
    return max(0.0, capacity * fixed / (capacity - slope) - ahead_work_seconds)


def _cost_budget(counter: float, tag: float, weight: float, crossing_cost: float) -> float:
    """Cost a tenant at `counter` is served before its counter passes `tag`: the gap times its weight,
    and the request that crosses; 0 for a tenant already past the tag."""
    if counter > tag:
        return 0.0
    return (tag - counter) * weight + crossing_cost


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
