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
  time (it delays the resumed child, and errs against offload), and the recompute after all if the
  tier evicted the prefix before the wait ended. The engine writes every prompt to its tier, which
  evicts least recently used first, so an offloaded prefix survives about the tier's turnover time
  `τ = cpu_bytes / bytes written per second` (measured: the prompt tokens the gateway sends the
  group); taking evictions as a Poisson process, it is gone after `W` with chance `1 - e^(-W/τ)`:
  `O + (1 - e^(-W/τ)) · R`. Host memory itself is not priced: it takes nothing from the GPUs.

Keep is a line from 0, offload a rising curve bounded by `O + R`, recompute the constant `R`, so the
cheapest is keep below one threshold, offload between the two, recompute above: keep gives way to
offload where `W · p · share = O + (1 - e^(-W/τ)) · R`, offload to recompute at `W = τ · ln(R / O)`.
Both come from the measured wait distribution and tier turnover, the model's bytes per token and
prefill price, the group's pressure and the transfer rate. Where offload is off (no CPU tier, a
round trip dearer than the recompute, KV larger than the tier) or never strictly cheapest, the two
thresholds are one: keep while `W · p · share ≤ R`.

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


@dataclass(slots=True)
class TierWrites:
    """The tokens a group's engine writes to its CPU tier (every prompt it is sent), as a rate
    averaged over `time_constant_seconds` (an exponential moving average: two floats of state)."""

    time_constant_seconds: float = 60.0
    _weighted_tokens: float = 0.0
    _at: float | None = None

    def written(self, tokens: int, now: float) -> None:
        self._weighted_tokens = self._decayed(now) + max(0, tokens)
        self._at = now

    def tokens_per_second(self, now: float) -> float:
        return self._decayed(now) / self.time_constant_seconds

    def _decayed(self, now: float) -> float:
        if self._at is None:
            return 0.0
        return self._weighted_tokens * math.exp(-max(0.0, now - self._at) / self.time_constant_seconds)


def turnover_seconds(cpu_bytes: int | None, tokens_per_second: float, kv_bytes_per_token: int) -> float:
    """How long a CPU tier of `cpu_bytes` keeps what it is written: its size over the bytes written a
    second (inf when nothing is written, or no tier)."""
    written = tokens_per_second * kv_bytes_per_token
    if cpu_bytes is None or written <= 0:
        return math.inf
    return cpu_bytes / written


@dataclass(frozen=True, slots=True)
class HeldKv:
    """What a session about to wait holds, and what the group holding it looks like.

    kv_tokens: its context (prompt and answer so far: the next child's prefix); kv_bytes_per_token
    from the model; recompute_seconds: the prefill work of that prefix (`WorkPricing`);
    kv_pressure: the fraction of the group's KV in use, in [0, 1]; offload_turnover_seconds: how
    long the group's CPU tier keeps what it is written (`turnover_seconds`), inf when nothing is.
    """

    kv_tokens: int
    kv_bytes_per_token: int
    recompute_seconds: float
    group_kv_capacity_tokens: int
    kv_pressure: float
    offload_turnover_seconds: float = math.inf

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
    """(keep below, recompute above) in seconds of wait: where the costs of the module docstring
    cross. A zero keep slope (an empty cache) makes keeping free, whatever the wait."""
    recompute = max(0.0, held.recompute_seconds)
    share = held.kv_tokens / held.group_kv_capacity_tokens if held.group_kv_capacity_tokens > 0 else 1.0
    keep_slope = min(1.0, max(0.0, held.kv_pressure)) * min(1.0, share)
    keep_vs_recompute = recompute / keep_slope if keep_slope > 0 else math.inf
    cpu_bytes = policy.offload_cpu_bytes
    if cpu_bytes is None or held.kv_bytes > cpu_bytes or held.kv_bytes <= 0 or keep_slope <= 0:
        return keep_vs_recompute, keep_vs_recompute
    round_trip = 2 * held.kv_bytes / policy.transfer_bytes_per_second
    if round_trip >= recompute:
        return keep_vs_recompute, keep_vs_recompute
    turnover = held.offload_turnover_seconds
    offload_vs_recompute = turnover * math.log(recompute / round_trip) if turnover > 0 else 0.0
    keep_vs_offload = _keep_meets_offload(keep_slope, round_trip, recompute, turnover)
    if keep_vs_offload < offload_vs_recompute:
        return keep_vs_offload, offload_vs_recompute
    return keep_vs_recompute, keep_vs_recompute


def _keep_meets_offload(keep_slope: float, round_trip: float, recompute: float, turnover: float) -> float:
    """The wait W > 0 where `keep_slope · W = round_trip + (1 - e^(-W/turnover)) · recompute`: one
    crossing, since keep minus offload is convex, negative at 0 and not below 0 at (O + R) / slope."""
    if math.isinf(turnover):
        return round_trip / keep_slope
    if turnover <= 0:
        return (round_trip + recompute) / keep_slope
    low, high = 0.0, (round_trip + recompute) / keep_slope
    for _ in range(100):
        middle = (low + high) / 2
        offload = round_trip + -math.expm1(-middle / turnover) * recompute
        if keep_slope * middle < offload:
            low = middle
        else:
            high = middle
    return high


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
