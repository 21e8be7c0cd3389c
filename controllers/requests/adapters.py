"""Routing a request for a LoRA adapter: to a group that holds it, else to one that loads it.

A ModelGroup's adapters share its groups: each group's engine holds at most `max_loaded_per_group`
of them at once (vLLM's `--max-loras`), and loading one takes time (`load_seconds`) that the request
waits through. So the rule, in order:

1. A group that holds the adapter costs only its predicted wait; a group that must load it costs
   its wait plus the load. The cheapest group that meets the request's wait budget and KV need
   wins, so a request goes to a holder unless every holder is busier than a load elsewhere costs.
2. A group loads into a free slot when it has one; when it is full it unloads the adapter no
   request is using or loading that had the fewest recent uses (a count that halves every
   `use_half_life_seconds`), the least recently used of those: under skewed demand an adapter
   asked for once does not push out one asked for every second, as plain LRU would. A group whose
   adapters are all in use cannot load now. A free slot is preferred over an eviction at the same
   cost (an eviction costs the evicted adapter a later load), and between evictions at the same
   cost the group whose victim is cheapest to lose (the same order) loads it, so the ModelGroup's
   slots together behave as one cache rather than one group churning while the others keep stale
   adapters.
3. A group where the adapter failed to load is not asked again until `failure_backoff_seconds`
   passed; when every serving group (with a free seat or not) is in that backoff the request is
   refused (`AdapterRefused`, until the earliest backoff ends), rather than sent to load it again.

The same predicted load time is added to the admission's view of every group that lacks the
adapter (`with_load_time`), so the gates see the wait a request for a cold adapter will have.
Nothing here knows about HTTP: the gateway calls the engine's runtime adapter API for what this
decides, and the load-routing bench runs the same rule on a simulated clock.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from goodput.controllers.requests.admission import GroupLoad
from goodput.controllers.requests.routing import Candidate, RouteRequest, eligible

DEFAULT_ADAPTER_LOAD_SECONDS = 0.5
"""A LoRA adapter of a few tens of MB read from local disk or a warm cache, moved to the GPU."""
DEFAULT_ADAPTER_FAILURE_BACKOFF_SECONDS = 30.0
DEFAULT_ADAPTER_USE_HALF_LIFE_SECONDS = 60.0
"""Long enough to tell an adapter used every few seconds from one used once; short enough that a
shift in demand shows within minutes."""


@dataclass(frozen=True, slots=True)
class AdapterPolicy:
    """A ModelGroup's adapters and what loading one costs.

    sources: adapter name -> what the engine loads it from (`lora_path`).
    load_seconds: the predicted time to load one adapter, priced into routing and admission.
    """

    sources: Mapping[str, str] = field(default_factory=dict)
    max_loaded_per_group: int = 8
    load_seconds: float = DEFAULT_ADAPTER_LOAD_SECONDS
    failure_backoff_seconds: float = DEFAULT_ADAPTER_FAILURE_BACKOFF_SECONDS
    use_half_life_seconds: float = DEFAULT_ADAPTER_USE_HALF_LIFE_SECONDS
    """How fast an adapter's recent uses are forgotten when choosing what to evict."""

    def declares(self, name: str) -> bool:
        return name in self.sources


@dataclass(frozen=True, slots=True)
class GroupAdapters:
    """What one group's engine holds, as the gateway last knew it.

    loaded: adapters loaded or being loaded, least recently used first.
    busy: adapters with requests in flight or a load under way: never evicted.
    failed_until: adapter -> when its load-failure backoff on this group ends.
    last_used: adapter -> when a request was last routed to it here (absent: learnt from the
    engine, never used through this gateway, so the first to go).
    recent_uses: adapter -> requests routed to it here, decayed (`decayed_uses`); absent: none.
    """

    loaded: tuple[str, ...] = ()
    busy: frozenset[str] = frozenset()
    failed_until: Mapping[str, float] = field(default_factory=dict)
    last_used: Mapping[str, float] = field(default_factory=dict)
    recent_uses: Mapping[str, float] = field(default_factory=dict)

    def holds(self, adapter: str) -> bool:
        return adapter in self.loaded

    def evictable(self) -> str | None:
        """The adapter nothing is using with the fewest recent uses, the least recently used of
        those; None when all are in use."""
        idle = [(self.recent_uses.get(name, 0.0), order, name) for order, name in enumerate(self.loaded)]
        kept = [entry for entry in idle if entry[2] not in self.busy]
        return min(kept)[2] if kept else None

    def eviction_key(self, victim: str) -> tuple[float, float]:
        """How cheap `victim` is to lose, for choosing between groups: fewest recent uses, then
        least recently used."""
        return self.recent_uses.get(victim, 0.0), self.last_used.get(victim, -math.inf)


def decayed_uses(uses: float, elapsed_seconds: float, memory_seconds: float) -> float:
    """A count of recent uses that halves every `memory_seconds` (ln 2 x the time constant)."""
    return uses * math.exp(-math.log(2) * max(0.0, elapsed_seconds) / memory_seconds)


class AdapterPlacement(enum.StrEnum):
    """How a request for an adapter reached its group (the `placement` label of the metrics)."""

    HELD = "held"
    """The group already held the adapter."""
    LOADED = "loaded"
    """The group loads it into a free slot."""
    EVICTED = "evicted"
    """The group unloads an idle adapter (fewest recent uses, then least recently used) to load this one."""


@dataclass(frozen=True, slots=True)
class AdapterRoute:
    """Where a request for an adapter goes, and what that group must do first."""

    group: str
    placement: AdapterPlacement
    evict: str | None = None
    fits: bool = True
    """False when no group met the request's budget and this is the cheapest anyway."""


@dataclass(frozen=True, slots=True)
class AdapterRefused:
    """Every serving group is in a load-failure backoff for the adapter until `backoff_ends`."""

    adapter: str
    backoff_ends: float


def _placement(held: GroupAdapters, adapter: str, limit: int) -> tuple[AdapterPlacement, str | None] | None:
    """How `adapter` can be served on a group: held, loaded into a free slot, or after an eviction;
    None when the group is full of adapters in use."""
    if held.holds(adapter):
        return AdapterPlacement.HELD, None
    if len(held.loaded) < limit:
        return AdapterPlacement.LOADED, None
    victim = held.evictable()
    return (AdapterPlacement.EVICTED, victim) if victim is not None else None


def _cost_seconds(candidate: Candidate, placement: AdapterPlacement, policy: AdapterPolicy) -> float:
    return candidate.wait_seconds + (0.0 if placement is AdapterPlacement.HELD else policy.load_seconds)


def choose_adapter_group(
    candidates: Sequence[Candidate],
    holdings: Mapping[str, GroupAdapters],
    adapter: str,
    request: RouteRequest,
    *,
    policy: AdapterPolicy,
    now: float,
) -> AdapterRoute | AdapterRefused | None:
    """The group for a request naming `adapter`; None when no group may take it now (no free seat,
    or every group with a seat is full of adapters in use): it waits in the queue."""
    empty = GroupAdapters()

    def backing_off(name: str) -> float | None:
        held = holdings.get(name, empty)
        until = held.failed_until.get(adapter)
        return until if until is not None and until > now and not held.holds(adapter) else None

    serving = [c for c in candidates if c.load.serving]
    backoffs = [backing_off(c.name) for c in serving]
    if serving and all(until is not None for until in backoffs):
        return AdapterRefused(adapter, min(until for until in backoffs if until is not None))
    options: list[tuple[float, bool, tuple[float, float], str, Candidate, AdapterPlacement, str | None]] = []
    for candidate in eligible(candidates):
        held = holdings.get(candidate.name, empty)
        shape = _placement(held, adapter, policy.max_loaded_per_group)
        if shape is None or backing_off(candidate.name) is not None:
            continue
        placement, victim = shape
        cost = _cost_seconds(candidate, placement, policy)
        victim_used = held.eviction_key(victim) if victim is not None else (0.0, -math.inf)
        evicts = placement is AdapterPlacement.EVICTED
        options.append((cost, evicts, victim_used, candidate.name, candidate, placement, victim))
    if not options:
        return None
    fitting = [
        option
        for option in options
        if option[0] <= request.wait_budget_seconds
        and option[4].load.kv_free_tokens >= request.kv_need_tokens
    ]
    best = min(fitting or options, key=lambda option: option[:4])
    return AdapterRoute(best[3], best[5], best[6], fits=bool(fitting))


def with_load_time(
    loads: Sequence[GroupLoad], holdings: Mapping[str, GroupAdapters], adapter: str, policy: AdapterPolicy
) -> list[GroupLoad]:
    """The admission's view for a request naming `adapter`: a group that lacks it shows the load as
    queued work ahead (its wait grows by `load_seconds`), so the gates price the load."""
    empty = GroupAdapters()
    priced: list[GroupLoad] = []
    for load in loads:
        if holdings.get(load.name, empty).holds(adapter):
            priced.append(load)
            continue
        extra = policy.load_seconds * load.capacity_work_seconds_per_second
        priced.append(dataclasses.replace(load, waiting_work_seconds=load.waiting_work_seconds + extra))
    return priced
