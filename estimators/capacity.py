"""Capacity C of one replica group at the SLO (design note §26).

C is not a peak benchmark: it is the work rate one group sustains while its decode steps stay within
the ITL target. In steady state a decode batch of B sequences admits B/n_out new requests per step, so
every step carries B decode tokens plus the prefill chunks of the requests that replace finished ones;
the step model gives that step's duration. The operating point is the largest B whose step fits the
ITL budget, bounded by max_num_seqs, the KV capacity (B resident contexts) and the per-step token
budget. C = requests per second at that point × priced work per request (`work.py`), in work-seconds
per second; it stays below 1 because the fixed per-step overhead is shared, not priced.

Continuous batching makes C depend on the mix (long contexts fill the KV cache long before the ITL
budget binds), so the profile keeps C on a grid of mean prompt and output lengths and interpolates in
log space, which keeps C continuous as the mix drifts (§26: a lookup table per workload mix).

Building a profile runs a few hundred step-model evaluations; it is done once per (model, hardware,
SLO), never inside a decision.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, replace

from goodput.estimators.service_time import StepCostModel
from goodput.estimators.work import WorkErrorProfile, WorkPricing

LIMIT_ITL = "itl"
LIMIT_MAX_NUM_SEQS = "max_num_seqs"
LIMIT_KV_CAPACITY = "kv_capacity"
LIMIT_TOKEN_BUDGET = "token_budget"

DEFAULT_INPUT_GRID_TOKENS: tuple[float, ...] = (128.0, 512.0, 2048.0, 8192.0, 32768.0)
DEFAULT_OUTPUT_GRID_TOKENS: tuple[float, ...] = (16.0, 64.0, 256.0, 1024.0, 4096.0)


@dataclass(frozen=True, slots=True)
class OperatingPoint:
    """One group's steady state at the SLO for one request mix."""

    batch: int
    step_seconds: float
    requests_per_second: float
    work_per_second: float
    limit: str
    attainable: bool


def operating_point(
    model: StepCostModel,
    pricing: WorkPricing,
    input_tokens: float,
    output_tokens: float,
    *,
    step_budget_seconds: float,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    cached_tokens: float = 0.0,
) -> OperatingPoint:
    """The largest steady decode batch whose step fits `step_budget_seconds`, and its work rate.

    `attainable` is False when a single sequence already breaks the budget or does not fit in KV:
    the group then runs at batch 1 and adding groups cannot meet the ITL target.
    """
    output_tokens = max(1.0, output_tokens)
    input_tokens = max(1.0, input_tokens)
    new_tokens = max(0.0, input_tokens - cached_tokens)
    prefix_tokens = input_tokens - new_tokens
    resident_tokens = input_tokens + output_tokens / 2

    def step_seconds(batch: int) -> float:
        # Steady-state averages per step, kept fractional: rounding them up would make the work
        # rate dip at some batch sizes, and a looser ITL target could then lower the capacity.
        joins = batch / output_tokens
        return model.step_seconds(
            batch + joins * new_tokens,
            joins * new_tokens * (prefix_tokens + new_tokens / 2),
            batch * resident_tokens,
            batch + joins,
        )

    bounds = {
        LIMIT_MAX_NUM_SEQS: max_num_seqs,
        LIMIT_KV_CAPACITY: int(model.kv_capacity_tokens // resident_tokens),
        LIMIT_TOKEN_BUDGET: int(max_num_batched_tokens // (1 + new_tokens / output_tokens)),
    }
    batch, limit, attainable = _largest_batch(step_seconds, step_budget_seconds, bounds)
    seconds = step_seconds(batch)
    requests_per_second = batch / (output_tokens * seconds)
    work_per_request = pricing.prefill_work_seconds(input_tokens, cached_tokens) + (
        pricing.decode_work_seconds(input_tokens, output_tokens)
    )
    return OperatingPoint(
        batch=batch,
        step_seconds=seconds,
        requests_per_second=requests_per_second,
        work_per_second=requests_per_second * work_per_request,
        limit=limit,
        attainable=attainable,
    )


def _largest_batch(
    step_seconds: Callable[[int], float], step_budget_seconds: float, bounds: dict[str, int]
) -> tuple[int, str, bool]:
    """The largest batch within the hard bounds whose step fits the budget, the limit that stops it,
    and whether one sequence fits at all (the step time grows with the batch: a bisection finds it)."""
    hard_limit_name = min(bounds, key=lambda name: bounds[name])
    hard_limit = bounds[hard_limit_name]
    if hard_limit < 1 or step_seconds(1) > step_budget_seconds:
        return 1, (LIMIT_ITL if hard_limit >= 1 else hard_limit_name), False
    if step_seconds(hard_limit) <= step_budget_seconds:
        return hard_limit, hard_limit_name, True
    low, high = 1, hard_limit  # step(low) fits, step(high) does not
    while high - low > 1:
        middle = (low + high) // 2
        if step_seconds(middle) <= step_budget_seconds:
            low = middle
        else:
            high = middle
    return low, LIMIT_ITL, True


@dataclass(frozen=True, slots=True)
class CapacityProfile:
    """What a decision needs to know about one group's hardware: prices, C by mix, KV and limits."""

    step_model: StepCostModel
    pricing: WorkPricing
    max_num_seqs: int
    max_num_batched_tokens: int
    itl_target_seconds: float
    ttft_target_seconds: float
    step_budget_seconds: float
    reference_input_tokens: float
    reference_output_tokens: float
    reference: OperatingPoint
    input_grid_log2: tuple[float, ...]
    output_grid_log2: tuple[float, ...]
    capacity_grid: tuple[tuple[float, ...], ...]
    batch_grid: tuple[tuple[float, ...], ...]
    prefill_seconds_p90: float
    output_tokens_p90_over_mean: float
    work_error: WorkErrorProfile

    @property
    def kv_capacity_tokens(self) -> int:
        return self.step_model.kv_capacity_tokens

    @property
    def first_decode_seconds(self) -> float:
        """The first decode step after a prefill runs at the operating point's step time."""
        return self.reference.step_seconds

    @property
    def ttft_floor_seconds(self) -> float:
        """TTFT of a p90 prompt on an idle queue: no number of groups gets below it."""
        return self.prefill_seconds_p90 + self.first_decode_seconds

    @property
    def ttft_attainable(self) -> bool:
        return self.ttft_floor_seconds <= self.ttft_target_seconds

    def capacity_per_group(self, mean_input_tokens: float, mean_output_tokens: float) -> float:
        """C in work-seconds per second for this mix: bilinear in log2 lengths, clamped to the grid."""
        return self._interpolate(self.capacity_grid, mean_input_tokens, mean_output_tokens)

    def slo_batch_per_group(self, mean_input_tokens: float, mean_output_tokens: float) -> float:
        """The steady decode batch of the operating point for this mix: the most sequences one group
        runs while its steps stay within the ITL budget (or a hard limit: seats, KV, token budget).

        A group running more sequences than this runs steps longer than the ITL budget, so its ITL
        misses come from load and fewer sequences per group (more groups) shorten them. It is a
        property of the step model, so calibrating C to a measured envelope leaves it unchanged.
        """
        return self._interpolate(self.batch_grid, mean_input_tokens, mean_output_tokens)

    def _interpolate(
        self, grid: tuple[tuple[float, ...], ...], mean_input_tokens: float, mean_output_tokens: float
    ) -> float:
        x = math.log2(max(1.0, mean_input_tokens))
        y = math.log2(max(1.0, mean_output_tokens))
        i, tx = _cell(self.input_grid_log2, x)
        j, ty = _cell(self.output_grid_log2, y)
        low = grid[i][j] + (grid[i][j + 1] - grid[i][j]) * ty
        high = grid[i + 1][j] + (grid[i + 1][j + 1] - grid[i + 1][j]) * ty
        return low + (high - low) * tx

    def calibrated(self, measured_work_per_second: float) -> CapacityProfile:
        """Scale C so that it matches a benchmark of the reference mix (the measured envelope wins)."""
        if measured_work_per_second <= 0:
            raise ValueError("measured capacity must be positive")
        scale = measured_work_per_second / self.reference.work_per_second
        return replace(
            self,
            reference=replace(
                self.reference,
                work_per_second=measured_work_per_second,
                requests_per_second=self.reference.requests_per_second * scale,
            ),
            capacity_grid=tuple(tuple(value * scale for value in row) for row in self.capacity_grid),
        )


def _cell(grid: tuple[float, ...], value: float) -> tuple[int, float]:
    """Index of the grid cell holding `value` and the position inside it, clamped to the ends."""
    if value <= grid[0]:
        return 0, 0.0
    if value >= grid[-1]:
        return len(grid) - 2, 1.0
    index = bisect_right(grid, value) - 1
    return index, (value - grid[index]) / (grid[index + 1] - grid[index])


def build_capacity_profile(
    model: StepCostModel,
    *,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    itl_target_seconds: float,
    ttft_target_seconds: float,
    reference_input_tokens: float = 1024.0,
    reference_output_tokens: float = 256.0,
    input_tokens_p90: float | None = None,
    output_tokens_p90_over_mean: float = 2.0,
    step_utilisation: float = 0.8,
    work_error: WorkErrorProfile | None = None,
    input_grid_tokens: tuple[float, ...] = DEFAULT_INPUT_GRID_TOKENS,
    output_grid_tokens: tuple[float, ...] = DEFAULT_OUTPUT_GRID_TOKENS,
) -> CapacityProfile:
    """Price work and tabulate C for one group of `model` under an ITL and a TTFT target.

    step_utilisation: the share of the ITL target a mean step may use. Steps vary by 5-15 % and a
    prefill chunk lengthens the step it joins, so running the mean step at the target would miss it
    about half the time.
    input_tokens_p90: p90 prompt length for the queue budget's prefill term; 2.5 × the reference
    mean if unknown (the ratio of the public chat and code traces).
    output_tokens_p90_over_mean: p90/mean of output lengths, for upper estimates of remaining work
    when only engine metrics are known (about 2 in the public traces).
    """
    if len(input_grid_tokens) < 2 or len(output_grid_tokens) < 2:
        raise ValueError("a capacity grid needs at least two points on each axis")
    if not 0 < step_utilisation <= 1:
        raise ValueError("step_utilisation must be in (0, 1]")
    pricing = WorkPricing.from_step_model(model)
    step_budget_seconds = itl_target_seconds * step_utilisation

    def point(input_tokens: float, output_tokens: float) -> OperatingPoint:
        return operating_point(
            model,
            pricing,
            input_tokens,
            output_tokens,
            step_budget_seconds=step_budget_seconds,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
        )

    p90_input = input_tokens_p90 if input_tokens_p90 is not None else 2.5 * reference_input_tokens
    grid = tuple(
        tuple(point(input_tokens, output_tokens) for output_tokens in output_grid_tokens)
        for input_tokens in input_grid_tokens
    )
    return CapacityProfile(
        step_model=model,
        pricing=pricing,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        itl_target_seconds=itl_target_seconds,
        ttft_target_seconds=ttft_target_seconds,
        step_budget_seconds=step_budget_seconds,
        reference_input_tokens=reference_input_tokens,
        reference_output_tokens=reference_output_tokens,
        reference=point(reference_input_tokens, reference_output_tokens),
        input_grid_log2=tuple(math.log2(tokens) for tokens in input_grid_tokens),
        output_grid_log2=tuple(math.log2(tokens) for tokens in output_grid_tokens),
        capacity_grid=tuple(tuple(cell.work_per_second for cell in row) for row in grid),
        batch_grid=tuple(tuple(float(cell.batch) for cell in row) for row in grid),
        prefill_seconds_p90=model.prefill_seconds(math.ceil(p90_input)),
        output_tokens_p90_over_mean=output_tokens_p90_over_mean,
        work_error=work_error if work_error is not None else WorkErrorProfile(),
    )
