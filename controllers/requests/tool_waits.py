"""KV across tool waits: keep it on the GPU, offload it to CPU memory, or let it go (§36).

An agent's session alternates between generating and waiting on a tool (a search, a code run, a
human). While it waits, the KV of its conversation either stays in the engine's GPU cache (the next
child resumes with a prefix hit, but the cache is taken from everyone else for the whole wait), goes
to the engine's CPU offload tier (a DMA round trip, and CPU memory, instead of GPU memory), or is
given up (the next child recomputes its prefix). Which is cheapest depends on how long the wait will
be, so the gateway learns it: a `ToolWaitRecord` per ModelGroup and class keeps the waits it saw
(from the end of a session's response to the arrival of its next child), bounded in number and
decayed in time, and predicts a wait as an upper quantile of them.

`choose_wait_action` prices the three in engine-seconds, the currency of the service-time model:

- **recompute**: the prefix's prefill work `R`, paid once by the next child, whatever the wait;
- **keep**: holding a share `tokens / capacity` of the group's KV for the wait `W`, at the group's KV
  pressure `p` (the fraction in use): `W · p · tokens / capacity`. A full cache turns held KV into
  batch room denied to others; an empty one makes holding free;
- **offload**: the round trip `O = 2 · bytes / transfer rate`, counted in full as if it were engine
  time (it delays the resumed child, and errs against offload), plus holding a share of the CPU tier
  for the wait, taken as full (an LRU tier is): `O + W · bytes / cpu_bytes`.

Each cost is a line in `W`, and their slopes fall from keep to offload to recompute, so the cheapest
is keep below one threshold, offload between the two, recompute above: both thresholds come from
the measured wait distribution, the model's bytes per token and prefill price, the group's
pressure, and the transfer rate. Where offload is off (the ModelGroup enables no CPU tier), or never
strictly cheapest, the two thresholds are one: keep while `W · p · share ≤ R`.

With too few waits observed the distribution says nothing yet: offload (a bet on the distribution)
is not chosen, and a session is kept only when the longest wait seen so far is shorter than its
recompute time, `W ≤ R`, which is cheaper held than rebuilt at any pressure (a session holds at most
the whole cache, `p · share ≤ 1`). With no wait seen at all, it is let go.

Nothing here does I/O or reads a clock: the gateway passes `now`.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

# The one-way host-device DMA rate vLLM's OffloadingConnector reached on one H100 with
# Llama-3.1-8B (vLLM blog, "offloading connector", 2025-12-29: ~50 GB/s one way, 83.4 GB/s both).
OFFLOAD_TRANSFER_BYTES_PER_SECOND = 50e9


class WaitAction(StrEnum):
    """What happens to a waiting session's KV; the label of the gateway's action counter."""

    KEEP = "keep"
    OFFLOAD = "offload"
    RECOMPUTE = "recompute"


@dataclass(frozen=True, slots=True)
class ToolWaitPolicy:
    """How a ModelGroup's request path decides over tool waits.

    offload_cpu_bytes: the engines' CPU offload tier (the ModelGroup's `kvOffload`), None when off.
    transfer_bytes_per_second: host-device copy rate one way (OFFLOAD_TRANSFER_BYTES_PER_SECOND).
    wait_quantile: the quantile of the learnt waits taken as the predicted wait; an upper one,
    because a keep that runs long takes memory others need now, while a recompute costs only the
    resumed child.
    min_observations: the (decayed) number of waits below which the distribution is not trusted.
    half_life_seconds: a wait observed this long ago weighs half; max_samples bounds the memory.
    """

    offload_cpu_bytes: int | None = None
    transfer_bytes_per_second: float = OFFLOAD_TRANSFER_BYTES_PER_SECOND
    wait_quantile: float = 0.9
    min_observations: float = 8.0
    half_life_seconds: float = 600.0
    max_samples: int = 256

    def __post_init__(self) -> None:
        if self.offload_cpu_bytes is not None and self.offload_cpu_bytes <= 0:
            raise ValueError("offload_cpu_bytes must be positive (None: offload off)")
        if not 0.0 < self.wait_quantile <= 1.0:
            raise ValueError("wait_quantile must be in (0, 1]")
        if self.transfer_bytes_per_second <= 0 or self.half_life_seconds <= 0 or self.max_samples < 1:
            raise ValueError("transfer_bytes_per_second, half_life_seconds and max_samples must be positive")

    @property
    def offload_enabled(self) -> bool:
        return self.offload_cpu_bytes is not None


@dataclass(slots=True)
class ToolWaitRecord:
    """The tool waits observed for one ModelGroup and class: the latest `max_samples`, each weighing
    half as much per `half_life_seconds` of age, so the prediction follows a workload that changes."""

    max_samples: int = 256
    half_life_seconds: float = 600.0
    samples: deque[tuple[float, float]] = field(default_factory=deque)  # (observed at, wait seconds)

    def observe(self, wait_seconds: float, now: float) -> None:
        """A session's next child arrived `wait_seconds` after its previous response ended."""
        if not math.isfinite(wait_seconds) or wait_seconds < 0:
            raise ValueError(f"wait_seconds must be a finite non-negative number, not {wait_seconds!r}")
        self.samples.append((now, wait_seconds))
        while len(self.samples) > self.max_samples:
            self.samples.popleft()

    def _weighted(self, now: float) -> list[tuple[float, float]]:
        return [(wait, 0.5 ** (max(0.0, now - at) / self.half_life_seconds)) for at, wait in self.samples]

    def observations(self, now: float) -> float:
        """The decayed count of waits: how much the distribution has seen recently."""
        return sum(weight for _wait, weight in self._weighted(now))

    def quantile(self, q: float, now: float) -> float | None:
        """The weighted `q`-quantile of the waits (None when none was seen): the smallest wait with at
        least a share `q` of the total weight at or below it."""
        weighted = sorted(self._weighted(now))
        total = sum(weight for _wait, weight in weighted)
        if total <= 0:
            return None
        below = 0.0
        for wait, weight in weighted:
            below += weight
            if below >= q * total * (1 - 1e-12):
                return wait
        return weighted[-1][0]

    def longest(self) -> float | None:
        return max((wait for _at, wait in self.samples), default=None)

    def predicted_wait(self, policy: ToolWaitPolicy, now: float) -> PredictedWait:
        """The wait a session about to wait is predicted to have, and whether the distribution is
        trusted (enough recent observations) or only an upper bound of the few seen."""
        if self.observations(now) >= policy.min_observations:
            return PredictedWait(self.quantile(policy.wait_quantile, now), learnt=True)
        return PredictedWait(self.longest(), learnt=False)


@dataclass(frozen=True, slots=True)
class PredictedWait:
    """seconds: None when no wait was ever seen; learnt: False while too few were (`min_observations`)."""

    seconds: float | None
    learnt: bool


class ToolWaitBook:
    """The records of one request path, one per (ModelGroup, class)."""

    def __init__(self, policy: ToolWaitPolicy | None = None) -> None:
        self.policy = policy or ToolWaitPolicy()
        self.records: dict[tuple[str, str], ToolWaitRecord] = {}

    def record(self, model_group: str, class_name: str) -> ToolWaitRecord:
        key = (model_group, class_name)
        found = self.records.get(key)
        if found is None:
            found = self.records[key] = ToolWaitRecord(self.policy.max_samples, self.policy.half_life_seconds)
        return found

    def observe(self, model_group: str, class_name: str, wait_seconds: float, now: float) -> None:
        self.record(model_group, class_name).observe(wait_seconds, now)

    def predicted_wait(self, model_group: str, class_name: str, now: float) -> PredictedWait:
        return self.record(model_group, class_name).predicted_wait(self.policy, now)


@dataclass(frozen=True, slots=True)
class HeldKv:
    """What a session about to wait holds, and what the group holding it looks like.

    kv_tokens: its context (prompt and answer so far: the next child's prefix); kv_bytes_per_token
    from the model; recompute_seconds: the prefill work of that prefix (`WorkPricing`);
    kv_pressure: the fraction of the group's KV in use, in [0, 1].
    """

    kv_tokens: int
    kv_bytes_per_token: int
    recompute_seconds: float
    group_kv_capacity_tokens: int
    kv_pressure: float

    @property
    def kv_bytes(self) -> int:
        return self.kv_tokens * self.kv_bytes_per_token


@dataclass(frozen=True, slots=True)
class WaitChoice:
    """The action, and the figures that chose it: keep up to `keep_below_seconds` of predicted wait,
    offload up to `recompute_above_seconds`, recompute beyond (equal thresholds: no offload band)."""

    action: WaitAction
    predicted_wait_seconds: float | None
    keep_below_seconds: float
    recompute_above_seconds: float


def wait_thresholds(policy: ToolWaitPolicy, held: HeldKv) -> tuple[float, float]:
    """(keep below, recompute above) in seconds of wait: where the cost lines of the module
    docstring cross. Keep and offload slopes are the held share per second of wait; a zero slope
    makes its threshold infinite."""
    recompute = max(0.0, held.recompute_seconds)
    share = held.kv_tokens / held.group_kv_capacity_tokens if held.group_kv_capacity_tokens > 0 else 1.0
    keep_slope = min(1.0, max(0.0, held.kv_pressure)) * min(1.0, share)
    keep_vs_recompute = recompute / keep_slope if keep_slope > 0 else math.inf
    cpu_bytes = policy.offload_cpu_bytes
    if cpu_bytes is None or held.kv_bytes > cpu_bytes or held.kv_bytes <= 0:
        return keep_vs_recompute, keep_vs_recompute
    round_trip = 2 * held.kv_bytes / policy.transfer_bytes_per_second
    offload_slope = held.kv_bytes / cpu_bytes
    keep_vs_offload = round_trip / (keep_slope - offload_slope) if keep_slope > offload_slope else math.inf
    offload_vs_recompute = (recompute - round_trip) / offload_slope if recompute > round_trip else 0.0
    if keep_vs_offload < offload_vs_recompute:
        return keep_vs_offload, offload_vs_recompute
    return keep_vs_recompute, keep_vs_recompute


def choose_wait_action(policy: ToolWaitPolicy, predicted: PredictedWait, held: HeldKv) -> WaitChoice:
    """Keep, offload or recompute the KV of a session about to wait `predicted` (module docstring)."""
    if not predicted.learnt:
        wait = predicted.seconds
        short = wait is not None and wait <= held.recompute_seconds
        action = WaitAction.KEEP if short else WaitAction.RECOMPUTE
        recompute = max(0.0, held.recompute_seconds)
        return WaitChoice(action, wait, recompute, recompute)
    keep_below, recompute_above = wait_thresholds(policy, held)
    wait = predicted.seconds if predicted.seconds is not None else math.inf
    if wait <= keep_below:
        action = WaitAction.KEEP
    elif wait <= recompute_above:
        action = WaitAction.OFFLOAD
    else:
        action = WaitAction.RECOMPUTE
    return WaitChoice(action, predicted.seconds, keep_below, recompute_above)
