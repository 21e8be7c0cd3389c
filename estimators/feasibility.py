"""Feasibility: the latency a request gets on an idle group, and whether its SLO can be met at all.

A request's zero-load floors (design note §8, §10) are what it costs with the whole group to itself:
TTFT = routing + its uncached prefill, chunk by chunk as vLLM's chunked prefill runs it, + the first
decode step; ITL = one decode step at its context; end to end = TTFT + the remaining decode steps. A
request whose floor already exceeds its class's target cannot meet the SLO on any number of groups of
this hardware and parallelism: more groups do not help it, more tensor parallelism, a longer target or
another class does. Such demand is *infeasible*: counted and reported apart, never a reason to scale.

Expected prefix-cache hits lower the floor (cached tokens are not recomputed, though new tokens still
attend to them), so the floor is computed net of an expected cached fraction of the prompt.

The floors are monotone in prompt length, which gives a single threshold per target: the longest
prompt whose floor fits (`longest_feasible_prompt_tokens`). From a histogram of prompt lengths (vLLM's
`vllm:request_prompt_tokens`) the infeasible share is the share of prompts past that threshold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from goodput.estimators.attainment import Histogram, fraction_within
from goodput.estimators.service_time import StepCostModel

# The longest prompt the threshold search considers; beyond any model's context window today.
MAX_SEARCH_PROMPT_TOKENS = 1 << 24


@dataclass(frozen=True, slots=True)
class FloorModel:
    """What the floors depend on: one group's step costs, its prefill chunk and the routing hop.

    chunk_tokens: vLLM's `max_num_batched_tokens`, the most prompt tokens one step computes.
    route_seconds: the gateway or Service hop before the engine sees the request.
    expected_cached_fraction: the share of a prompt expected to be a prefix-cache hit (0 to 1).
    """

    step_model: StepCostModel
    chunk_tokens: int
    route_seconds: float = 0.0
    expected_cached_fraction: float = 0.0

    def __post_init__(self) -> None:
        if self.chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be at least 1, got {self.chunk_tokens}")
        if self.route_seconds < 0:
            raise ValueError(f"route_seconds must not be negative, got {self.route_seconds}")
        if not 0.0 <= self.expected_cached_fraction < 1.0:
            raise ValueError(
                f"expected_cached_fraction must be in [0, 1), got {self.expected_cached_fraction}"
            )


@dataclass(frozen=True, slots=True)
class RequestFloors:
    """A request's latencies on an idle group, in seconds."""

    ttft_seconds: float
    itl_seconds: float
    e2e_seconds: float


@dataclass(frozen=True, slots=True)
class FloorTargets:
    """A class's targets; an absent end-to-end target is no constraint."""

    ttft_seconds: float
    itl_seconds: float
    e2e_seconds: float | None = None


def prefill_floor_seconds(model: FloorModel, prompt_tokens: int, cached_tokens: int = 0) -> float:
    """The uncached part of a prompt computed alone, `chunk_tokens` per step, each chunk attending to
    every token before it (cached or computed in an earlier chunk)."""
    if prompt_tokens < 0 or cached_tokens < 0:
        raise ValueError("prompt_tokens and cached_tokens must not be negative")
    done_tokens = min(cached_tokens, prompt_tokens)
    total_seconds = 0.0
    while done_tokens < prompt_tokens:
        chunk = min(model.chunk_tokens, prompt_tokens - done_tokens)
        units = chunk * (done_tokens + chunk / 2)
        total_seconds += model.step_model.step_seconds(chunk, units, 0.0, 1)
        done_tokens += chunk
    return total_seconds


def expected_cached_tokens(model: FloorModel, prompt_tokens: int) -> int:
    return int(prompt_tokens * model.expected_cached_fraction)


def ttft_floor_seconds(model: FloorModel, prompt_tokens: int) -> float:
    """Routing, the uncached prefill and the decode step that emits the first token."""
    cached = expected_cached_tokens(model, prompt_tokens)
    first_decode = model.step_model.decode_step_seconds(1, prompt_tokens)
    return model.route_seconds + prefill_floor_seconds(model, prompt_tokens, cached) + first_decode


def request_floors(model: FloorModel, prompt_tokens: int, output_tokens: int) -> RequestFloors:
    """All three floors; decode steps are priced at the request's mean context while it decodes."""
    ttft = ttft_floor_seconds(model, prompt_tokens)
    remaining_tokens = max(0, output_tokens - 1)
    mean_context = prompt_tokens + output_tokens / 2
    itl = model.step_model.decode_step_seconds(1, mean_context)
    return RequestFloors(ttft_seconds=ttft, itl_seconds=itl, e2e_seconds=ttft + remaining_tokens * itl)


def unmet_targets(floors: RequestFloors, targets: FloorTargets) -> tuple[str, ...]:
    """The SLIs whose floor already exceeds the target (empty: the request is feasible)."""
    unmet: list[str] = []
    if floors.ttft_seconds > targets.ttft_seconds:
        unmet.append("ttft")
    if floors.itl_seconds > targets.itl_seconds:
        unmet.append("itl")
    if targets.e2e_seconds is not None and floors.e2e_seconds > targets.e2e_seconds:
        unmet.append("e2e")
    return tuple(unmet)


def is_feasible(model: FloorModel, targets: FloorTargets, prompt_tokens: int, output_tokens: int) -> bool:
    return not unmet_targets(request_floors(model, prompt_tokens, output_tokens), targets)


def longest_feasible_prompt_tokens(model: FloorModel, ttft_target_seconds: float) -> int:
    """The longest prompt whose TTFT floor fits the target; 0 when not even a one-token prompt does.

    The floor only grows with the prompt, so a binary search finds the threshold in ~25 evaluations.
    """
    if ttft_floor_seconds(model, 1) > ttft_target_seconds:
        return 0
    low, high = 1, 2
    while high < MAX_SEARCH_PROMPT_TOKENS and ttft_floor_seconds(model, high) <= ttft_target_seconds:
        low, high = high, high * 2
    if high >= MAX_SEARCH_PROMPT_TOKENS:
        return MAX_SEARCH_PROMPT_TOKENS
    while high - low > 1:
        middle = (low + high) // 2
        if ttft_floor_seconds(model, middle) <= ttft_target_seconds:
            low = middle
        else:
            high = middle
    return low


def infeasible_share(
    prompt_tokens: Histogram | None, longest_feasible_tokens: int, *, conservative: bool = False
) -> float | None:
    """Share of observed prompts longer than the feasible threshold; None when nothing was observed.

    Interpolated inside the bucket that holds the threshold, as Prometheus does; `conservative`
    counts that whole bucket as infeasible instead. A decision needs the conservative figure:
    vLLM's 1-2-5 buckets are wide (20k-50k tokens), the interpolation spreads a bucket's prompts
    evenly over it, and prompts all past a threshold in the bucket's lower part would be counted
    partly feasible and scaled for. Nothing is known of prompts past the last finite bound, so when
    the threshold lies beyond it they count as infeasible: the side that never drives a scale-out.
    """
    threshold = float(longest_feasible_tokens)
    if conservative and prompt_tokens is not None:
        threshold = max((bound for bound in prompt_tokens.upper_bounds if bound <= threshold), default=0.0)
    within = fraction_within(prompt_tokens, threshold)
    return None if within is None else 1.0 - within


def minimum_tensor_parallel_hint(
    current_tensor_parallel: int, floor_seconds: float, target_seconds: float
) -> int:
    """A rough tensor-parallel degree that would bring a compute-bound floor under the target.

    Prefill is compute-bound, so its floor shrinks about linearly with tensor parallelism; the hint is
    for a message a person reads ("needs TP≈16"), not for a decision.
    """
    if target_seconds <= 0:
        raise ValueError("target_seconds must be positive")
    factor = floor_seconds / target_seconds
    needed = 2 ** math.ceil(math.log2(max(1.0, current_tensor_parallel * factor)))
    return max(current_tensor_parallel, int(needed))


def infeasible_token_share(
    prompt_tokens: Histogram | None, longest_feasible_tokens: int, *, conservative: bool = False
) -> float | None:
    """Share of observed prompt *tokens* in prompts past the feasible threshold; None when nothing
    was observed.

    Infeasible prompts are the long ones, so they carry more of the prompt tokens (and of the prefill
    work and KV) than of the requests. Each bucket's prompts are priced at its midpoint, the bucket
    holding the threshold split linearly at it, and the +Inf bucket at the last finite bound, counted
    infeasible as `infeasible_share` counts it (vLLM's prompt buckets end at the context window, so
    it is empty in practice). `conservative` counts the bucket holding the threshold as infeasible,
    as `infeasible_share` does.
    """
    if prompt_tokens is None or prompt_tokens.total <= 0:
        return None
    threshold = float(longest_feasible_tokens)
    lower_bound = 0.0
    below = 0.0
    feasible_tokens = total_tokens = 0.0
    bounds = (*prompt_tokens.upper_bounds, math.inf)
    for bound, cumulative in zip(bounds, prompt_tokens.cumulative_counts, strict=True):
        count = max(0.0, cumulative - below)
        finite = math.isfinite(bound)
        upper = bound if finite else max(lower_bound, 1.0)
        total_tokens += count * (lower_bound + upper) / 2
        if not finite:
            pass
        elif threshold >= upper:
            feasible_tokens += count * (lower_bound + upper) / 2
        elif threshold > lower_bound and not conservative:
            share = (threshold - lower_bound) / (upper - lower_bound)
            feasible_tokens += count * share * (lower_bound + threshold) / 2
        below = max(below, cumulative)
        lower_bound = upper
    if total_tokens <= 0:
        return 0.0 if longest_feasible_tokens > 0 else 1.0
    return min(1.0, max(0.0, 1.0 - feasible_tokens / total_tokens))
