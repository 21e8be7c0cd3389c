"""The gateway's book of sessions waiting on a tool (`controllers.requests.tool_waits`).

When a session's last child in flight ends, the session is waiting: on a tool, a person, the next
step of its agent. The desk chooses what happens to its KV meanwhile (keep, offload, recompute) and
remembers it; when the session's next child arrives, the wait is over: it was as long as the gap,
which the desk learns, and a kept session's tenant is charged the KV byte-seconds it held on the GPU
(fairness prices waiting as it prices generating). A session that ends while waiting is charged up
to its end and forgotten.

A hold lasts at most the wait predicted for it: a session that outwaits its prediction is in the
distribution's tail, so its KV stops counting as held (and charged) then, rather than keep KV room
from everyone for a session that may never come back. Its group stays its preference: the engine's
prefix cache may well still hold its prefix.

The desk does no I/O and reads no clock: `SessionDesk` passes `now` and applies what it answers
(the session's group affinity, the metrics, the fairness charge).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, replace

from goodput.controllers.requests.tool_waits import (
    HeldKv,
    TierWrites,
    ToolWaitBook,
    ToolWaitPolicy,
    WaitAction,
    WaitChoice,
    choose_wait_action,
    turnover_seconds,
)


@dataclass(frozen=True, slots=True)
class WaitingSession:
    """A session between its last answer and its next child: whose it is, where its KV is, how much."""

    tenant: str
    class_name: str
    group: str
    kv_tokens: int
    kv_bytes_per_token: int
    action: WaitAction
    since: float
    held_until: float


@dataclass(frozen=True, slots=True)
class WaitCharge:
    """A wait that ended: the tenant to charge and the GPU KV byte-seconds it held (0 unless kept)."""

    tenant: str
    kv_byte_seconds: float


class WaitDesk:
    """The waiting sessions of one request path and the waits it learnt, bounded by `max_waiting`
    (the oldest wait is forgotten first: its session has most likely gone)."""

    def __init__(self, policy: ToolWaitPolicy | None = None, *, max_waiting: int = 100_000) -> None:
        self.book = ToolWaitBook(policy)
        self.max_waiting = max_waiting
        self.waiting: dict[str, WaitingSession] = {}
        self._tokens: dict[tuple[str, WaitAction], int] = {}  # (group, action) -> waiting KV tokens
        self._writes: dict[str, TierWrites] = {}  # group -> prompt tokens its engine writes to its tier
        self._lapses: list[tuple[float, str]] = []  # (held until, session): a heap, checked lazily

    @property
    def policy(self) -> ToolWaitPolicy:
        return self.book.policy

    @policy.setter
    def policy(self, policy: ToolWaitPolicy) -> None:
        """A changed ModelGroup (offload switched on or off): new waits are chosen under it; the
        waits already learnt are kept."""
        self.book.policy = policy

    def written(self, group: str, prompt_tokens: int, now: float) -> None:
        """A prompt was sent to `group`: its engine writes it to its CPU tier (offload on only)."""
        if self.policy.offload_enabled:
            self._writes.setdefault(group, TierWrites()).written(prompt_tokens, now)

    def keep_groups(self, groups: set[str]) -> None:
        """Forget the tier writes of groups that are gone."""
        for gone in self._writes.keys() - groups:
            del self._writes[gone]

    def turnover_seconds(self, group: str, kv_bytes_per_token: int, now: float) -> float:
        """How long `group`'s CPU tier keeps what it is written, at the rate it is sent prompts."""
        writes = self._writes.get(group)
        rate = writes.tokens_per_second(now) if writes is not None else 0.0
        return turnover_seconds(self.policy.offload_cpu_bytes, rate, kv_bytes_per_token)

    def kept_tokens(self, group: str) -> int:
        """KV tokens that kept waiting sessions hold on `group`'s GPUs: taken from what it can admit."""
        return self._tokens.get((group, WaitAction.KEEP), 0)

    def tokens(self, action: WaitAction) -> int:
        """KV tokens of every session waiting under `action` (the gauge)."""
        return sum(tokens for (_group, held), tokens in self._tokens.items() if held is action)

    def waits(  # noqa: PLR0917 (one session's whole wait)
        self,
        name: str,
        tenant: str,
        model_group: str,
        class_name: str,
        group: str,
        held: HeldKv,
        now: float,
    ) -> WaitChoice:
        """The session's last child in flight ended on `group`: choose and remember its wait."""
        self.forget(name, now)
        predicted = self.book.predicted_wait(model_group, class_name, now)
        choice = choose_wait_action(self.policy, predicted, held)
        if choice.action is WaitAction.RECOMPUTE:  # its wait is learnt too; it holds nothing
            self.waiting[name] = WaitingSession(tenant, class_name, group, 0, 0, choice.action, now, now)
        else:
            wait = predicted.seconds if predicted.seconds is not None else math.inf
            until = now + wait
            self.waiting[name] = WaitingSession(
                tenant, class_name, group, held.kv_tokens, held.kv_bytes_per_token, choice.action, now, until
            )
            self._count(group, choice.action, held.kv_tokens)
            if math.isfinite(until):
                heapq.heappush(self._lapses, (until, name))
        while len(self.waiting) > self.max_waiting:
            self.forget(next(iter(self.waiting)), now)
        return choice

    def lapse(self, now: float) -> list[WaitCharge]:
        """Holds past their predicted wait stop counting (module docstring); what they cost."""
        charges: list[WaitCharge] = []
        while self._lapses and self._lapses[0][0] <= now:
            until, name = heapq.heappop(self._lapses)
            waiting = self.waiting.get(name)
            if waiting is None or waiting.held_until != until or waiting.action is WaitAction.RECOMPUTE:
                continue  # resumed, ended or chosen again since
            charges.append(self._release(waiting, now))
            self.waiting[name] = replace(waiting, kv_tokens=0, action=WaitAction.RECOMPUTE)
        if len(self._lapses) > 2 * self.max_waiting:  # entries of waits that ended: drop them
            self._lapses = [(until, name) for until, name in self._lapses if name in self.waiting]
            heapq.heapify(self._lapses)
        return charges

    def resumed(self, name: str, model_group: str, now: float) -> WaitCharge | None:
        """The session's next child arrived: learn the wait, and say what it cost its tenant."""
        waiting = self.waiting.get(name)
        if waiting is None:
            return None
        self.book.observe(model_group, waiting.class_name, max(0.0, now - waiting.since), now)
        return self.forget(name, now)

    def forget(self, name: str, now: float) -> WaitCharge | None:
        """The wait ended (the next child came, or the session ended): release its KV figure and say
        what it cost its tenant."""
        waiting = self.waiting.pop(name, None)
        return None if waiting is None else self._release(waiting, now)

    def _count(self, group: str, action: WaitAction, tokens: int) -> None:
        key = (group, action)
        left = self._tokens.get(key, 0) + tokens
        if left > 0:
            self._tokens[key] = left
        else:
            self._tokens.pop(key, None)

    def _release(self, waiting: WaitingSession, now: float) -> WaitCharge:
        """Take the session's KV out of the figures; its GPU KV byte-seconds up to now or its lapse."""
        self._count(waiting.group, waiting.action, -waiting.kv_tokens)
        held_seconds = max(0.0, min(now, waiting.held_until) - waiting.since)
        kept = waiting.action is WaitAction.KEEP
        gpu_bytes = waiting.kv_tokens * waiting.kv_bytes_per_token if kept else 0
        return WaitCharge(waiting.tenant, gpu_bytes * held_seconds)
