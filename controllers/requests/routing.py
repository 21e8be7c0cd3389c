"""Routing by predicted work, prefix locality and session stickiness (§21-§22).

A request goes to the group with the least predicted work among those that can meet its deadline.
Two preferences bend that choice, each only while it costs the request nothing it cannot afford:

- **prefix affinity**: the prompt's leading blocks are hashed and ranked over the groups by
  rendezvous (highest-random-weight) hashing, a consistent hash: a group joining or leaving moves
  only the prefixes that hashed to it. The top-ranked group holds that prefix's KV cache, so it is
  preferred while its predicted wait stays within `affinity_slack_seconds` of the least loaded group
  and within the request's budget.
- **session stickiness**: a session keeps its group (its conversation's KV is there) until that
  group cannot meet the deadline or lacks KV headroom: stickiness yields under overload.

A group that is not Ready, is draining, or has no free slot is never chosen.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from goodput.api.reasons import RouteReason
from goodput.controllers.requests.admission import GroupLoad, slot_wait_seconds


@dataclass(frozen=True, slots=True)
class RoutingPolicy:
    """prefix_block_chars: characters per hashed block (about 64 tokens at 4 characters a token);
    prefix_blocks: how many leading blocks make a prefix's key."""

    prefix_block_chars: int = 256
    prefix_blocks: int = 4
    affinity_slack_seconds: float = 0.5


@dataclass(frozen=True, slots=True)
class Candidate:
    """A group a request may go to, with its free slots and predicted wait for this request."""

    load: GroupLoad
    free_slots: int

    @property
    def name(self) -> str:
        return self.load.name

    @property
    def wait_seconds(self) -> float:
        capacity = self.load.capacity_work_seconds_per_second
        if self.load.waiting_work_seconds <= 0:
            return 0.0
        return self.load.waiting_work_seconds / capacity if capacity > 0 else float("inf")

    @property
    def work_seconds(self) -> float:
        return self.load.waiting_work_seconds + self.load.running_work_seconds


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """What routing knows of a request: its budget for waiting, its KV need, prefix and session."""

    wait_budget_seconds: float
    kv_need_tokens: int
    prefix_key: bytes | None = None
    session_group: str | None = None


@dataclass(frozen=True, slots=True)
class Route:
    group: str
    reason: RouteReason


def prefix_key(prompt: str, policy: RoutingPolicy) -> bytes | None:
    """The hash of the prompt's leading whole blocks (None for a prompt shorter than one block:
    nothing worth caching)."""
    whole = min(policy.prefix_blocks, len(prompt) // policy.prefix_block_chars)
    if whole < 1:
        return None
    head = prompt[: whole * policy.prefix_block_chars]
    return hashlib.blake2b(head.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def rendezvous_rank(key: bytes, groups: Sequence[str]) -> tuple[str, ...]:
    """Groups ordered by highest random weight for `key`: consistent under groups joining or leaving."""

    def weight(group: str) -> bytes:
        return hashlib.blake2b(key + group.encode(), digest_size=8).digest()

    return tuple(sorted(groups, key=weight, reverse=True))


def eligible(candidates: Sequence[Candidate]) -> list[Candidate]:
    """Ready, not draining, with a free slot."""
    return [c for c in candidates if c.load.serving and c.free_slots > 0]


def _fits(candidate: Candidate, request: RouteRequest) -> bool:
    return candidate.wait_seconds <= request.wait_budget_seconds and (
        candidate.load.kv_free_tokens >= request.kv_need_tokens
    )


def choose_group(
    candidates: Sequence[Candidate], request: RouteRequest, policy: RoutingPolicy
) -> Route | None:
    """The group for one request, or None when no group may take it now."""
    usable = eligible(candidates)
    if not usable:
        return None
    by_name = {c.name: c for c in usable}
    fitting = [c for c in usable if _fits(c, request)]
    if request.session_group is not None:
        sticky = by_name.get(request.session_group)
        if sticky is not None and _fits(sticky, request):
            return Route(sticky.name, RouteReason.SESSION)
    if not fitting:
        least = min(usable, key=lambda c: (c.wait_seconds, c.work_seconds, c.name))
        return Route(least.name, RouteReason.OVER_BUDGET)
    least = min(fitting, key=lambda c: (c.wait_seconds, c.work_seconds, c.name))
    if request.prefix_key is not None:
        ranked = rendezvous_rank(request.prefix_key, [c.name for c in candidates if c.load.serving])
        home = by_name.get(ranked[0]) if ranked else None
        if (
            home is not None
            and _fits(home, request)
            and home.wait_seconds <= least.wait_seconds + policy.affinity_slack_seconds
        ):
            return Route(home.name, RouteReason.PREFIX)
    return Route(least.name, RouteReason.LEAST_WORK)


# A group keeps at most this many steps' worth of prompt chunks not yet started: enough that its
# next steps are never short of prefill, few enough that requests wait in the gateway's fair queue
# (where fairness and deadlines order them) rather than in the engine's first-come queue.
PREFILL_STEPS_AHEAD = 2


def free_dispatch_slots(
    free_seats: int, unstarted_prompt_tokens: int, chunk_tokens: int, steps_ahead: int = PREFILL_STEPS_AHEAD
) -> int:
    """How many more requests a group may be sent now: a free seat (below max_num_seqs), and room in
    its prefill pipeline (prompts sent but not yet started, under `steps_ahead` chunks)."""
    if free_seats <= 0 or unstarted_prompt_tokens >= steps_ahead * chunk_tokens:
        return 0
    return free_seats


@dataclass(slots=True)
class GroupBook:
    """What a gateway keeps per group between dispatch and answer: the requests it sent there and
    has not seen answered, their work and KV reservations, and the prompts not started yet.

    The live gateway and the simulated one keep it alike, so routing and the dispatch limit see the
    same loads offline and deployed.
    """

    in_flight: int = 0
    running_work_seconds: float = 0.0
    kv_used_tokens: int = 0
    unstarted_prompt_tokens: int = 0

    def dispatched(self, work_seconds: float, kv_tokens: int, prompt_tokens: int) -> None:
        self.in_flight += 1
        self.running_work_seconds += work_seconds
        self.kv_used_tokens += kv_tokens
        self.unstarted_prompt_tokens += prompt_tokens

    def started(self, prompt_tokens: int) -> None:
        """The request's prefill began: its prompt leaves the group's prefill pipeline."""
        self.unstarted_prompt_tokens = max(0, self.unstarted_prompt_tokens - prompt_tokens)

    def released(self, work_seconds: float, kv_tokens: int, prompt_tokens: int, *, started: bool) -> None:
        """The request left the group (answered, failed or aborted); one that never started takes
        its prompt out of the prefill pipeline too."""
        if not started:
            self.started(prompt_tokens)
        self.in_flight = max(0, self.in_flight - 1)
        self.running_work_seconds = max(0.0, self.running_work_seconds - work_seconds)
        self.kv_used_tokens = max(0, self.kv_used_tokens - kv_tokens)

    def free_slots(self, max_in_flight: int, chunk_tokens: int) -> int:
        """How many more requests the group may be sent now (`free_dispatch_slots`)."""
        return free_dispatch_slots(max_in_flight - self.in_flight, self.unstarted_prompt_tokens, chunk_tokens)

    def load(
        self,
        name: str,
        *,
        serving: tuple[bool, bool],
        waiting_work_seconds: float,
        kv_capacity_tokens: int,
        capacity_work_seconds_per_second: float,
        max_in_flight: int,
    ) -> GroupLoad:
        """The group as routing sees it; `serving` is (ready, draining) from the group's endpoints."""
        ready, draining = serving
        rate = capacity_work_seconds_per_second
        return GroupLoad(
            name=name,
            ready=ready,
            draining=draining,
            waiting_work_seconds=waiting_work_seconds,
            running_work_seconds=self.running_work_seconds,
            kv_capacity_tokens=kv_capacity_tokens,
            kv_free_tokens=kv_capacity_tokens - self.kv_used_tokens,
            capacity_work_seconds_per_second=rate,
            slot_wait_seconds=slot_wait_seconds(
                self.in_flight, max_in_flight, self.running_work_seconds, rate
            ),
        )
