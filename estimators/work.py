"""Work: what a request costs a replica group, in seconds of engine time (design note §6, §25).

Demand is work, not requests: a 32k-token prompt with a 4k-token answer and a 100-token chat are one
request each but differ by orders of magnitude in GPU time and KV memory. Work is priced with the
marginal costs of the shared step model (`service_time.StepCostModel`):

- a prefill token costs its GEMM and all-reduce share plus prefill attention over the tokens before it
  (cached prefix tokens are not recomputed, but new tokens still attend to them);
- a decode token costs its GEMM and all-reduce share, the per-sequence overhead and the read of the KV
  of its whole context.

The fixed per-step overhead (launch, weight read when memory-bound) is deliberately not in the price:
it is shared by the batch, and it is what separates a group's capacity C (`capacity.py`) from one
work-second per second. A request's KV footprint is priced as well, in bytes and byte-seconds.

Predictions are wrong in known ways (output length above all), so errors are kept per shape bucket
and a p90 upper estimate is available where a decision must be safe (§25).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from goodput.estimators.service_time import StepCostModel


@dataclass(frozen=True, slots=True)
class WorkPricing:
    """Marginal engine seconds per token of one replica group, folded from its step model."""

    prefill_seconds_per_token: float
    prefill_seconds_per_attention_unit: float
    decode_seconds_per_token: float
    decode_seconds_per_context_token: float
    kv_bytes_per_token: int

    @classmethod
    def from_step_model(cls, model: StepCostModel) -> WorkPricing:
        per_token = model.compute_seconds_per_token + model.communication_seconds_per_token
        return cls(
            prefill_seconds_per_token=per_token,
            prefill_seconds_per_attention_unit=model.attention_seconds_per_unit,
            decode_seconds_per_token=per_token + model.seconds_per_sequence,
            decode_seconds_per_context_token=model.context_read_seconds_per_token,
            kv_bytes_per_token=model.kv_bytes_per_token,
        )

    def prefill_work_seconds(self, input_tokens: float, cached_tokens: float = 0.0) -> float:
        """Work of computing a prompt's KV; chunking does not change it (Σ p·(h + p/2) telescopes)."""
        prefix_tokens = cached_tokens if cached_tokens > 0 else 0.0
        if prefix_tokens >= input_tokens:
            return 0.0
        new_tokens = input_tokens - prefix_tokens
        return new_tokens * (
            self.prefill_seconds_per_token
            + self.prefill_seconds_per_attention_unit * (prefix_tokens + new_tokens / 2)
        )

    def decode_work_seconds(self, context_tokens: float, output_tokens: float) -> float:
        """Work of generating `output_tokens` after `context_tokens`; each token reads all KV before it."""
        if output_tokens <= 0:
            return 0.0
        mean_context_tokens = context_tokens + (output_tokens - 1) / 2
        return output_tokens * (
            self.decode_seconds_per_token + self.decode_seconds_per_context_token * mean_context_tokens
        )

    def decode_work_per_token(self, context_tokens: float) -> float:
        return self.decode_seconds_per_token + self.decode_seconds_per_context_token * context_tokens


@dataclass(frozen=True, slots=True)
class RequestWork:
    """The priced demand of one request: engine work and KV memory."""

    prefill_seconds: float
    decode_seconds: float
    kv_bytes_peak: int
    kv_byte_seconds: float

    @property
    def total_seconds(self) -> float:
        return self.prefill_seconds + self.decode_seconds


def kv_byte_seconds(
    kv_bytes_per_token: int,
    input_tokens: int,
    output_tokens: int,
    inter_token_seconds: float,
    prefill_seconds: float = 0.0,
) -> float:
    """KV memory held over a request's life: the prompt for its whole residency, each output token
    from the step that produced it. This is what long generations and tool waits really cost (§16)."""
    decode_seconds = output_tokens * inter_token_seconds
    prompt_byte_seconds = input_tokens * (prefill_seconds + decode_seconds)
    output_byte_seconds = inter_token_seconds * output_tokens * (output_tokens + 1) / 2
    return kv_bytes_per_token * (prompt_byte_seconds + output_byte_seconds)


def request_work(
    pricing: WorkPricing,
    input_tokens: int,
    output_tokens: int,
    *,
    cached_tokens: int = 0,
    inter_token_seconds: float = 0.0,
    prefill_seconds: float = 0.0,
) -> RequestWork:
    """Price one request; the wall-clock figures only matter for KV byte-seconds."""
    return RequestWork(
        prefill_seconds=pricing.prefill_work_seconds(input_tokens, cached_tokens),
        decode_seconds=pricing.decode_work_seconds(input_tokens, output_tokens),
        kv_bytes_peak=pricing.kv_bytes_per_token * (input_tokens + output_tokens),
        kv_byte_seconds=kv_byte_seconds(
            pricing.kv_bytes_per_token, input_tokens, output_tokens, inter_token_seconds, prefill_seconds
        ),
    )


# Shape buckets: powers of four in input tokens and output tokens. Coarse enough that each bucket
# collects enough finished requests to estimate its prediction error, fine enough that a 100-token
# chat and a 32k-token prompt never share one.
INPUT_BUCKET_UPPER_TOKENS: tuple[int, ...] = (256, 1024, 4096, 16384, 65536)
OUTPUT_BUCKET_UPPER_TOKENS: tuple[int, ...] = (32, 128, 512, 2048)


@dataclass(frozen=True, slots=True, order=True)
class ShapeBucket:
    """A (prompt length, output length) class; index len(bounds) holds everything above the last bound."""

    input_index: int
    output_index: int

    @property
    def label(self) -> str:
        return f"in{_bucket_label(INPUT_BUCKET_UPPER_TOKENS, self.input_index)}" + (
            f"/out{_bucket_label(OUTPUT_BUCKET_UPPER_TOKENS, self.output_index)}"
        )


def _bucket_label(bounds: tuple[int, ...], index: int) -> str:
    if index < len(bounds):
        return f"<={bounds[index]}"
    return f">{bounds[-1]}"


def shape_bucket(input_tokens: int, output_tokens: int) -> ShapeBucket:
    return ShapeBucket(
        bisect_left(INPUT_BUCKET_UPPER_TOKENS, input_tokens),
        bisect_left(OUTPUT_BUCKET_UPPER_TOKENS, output_tokens),
    )


@dataclass(frozen=True, slots=True)
class WorkErrorProfile:
    """How far actual work exceeds predicted work: the p90 of actual/predicted, per shape bucket.

    `p90_ratio_grid[input_index][output_index]` holds a fitted ratio, or 0 where a bucket has too
    little history and `default_p90_ratio` applies. A ratio is never below 1: an upper estimate must
    not be lower than the prediction it bounds.
    """

    default_p90_ratio: float = 1.5
    p90_ratio_grid: tuple[tuple[float, ...], ...] = ()

    def p90_ratio(self, bucket: ShapeBucket) -> float:
        return self.p90_ratio_at(bucket.input_index, bucket.output_index)

    def p90_ratio_at(self, input_index: int, output_index: int) -> float:
        # Plain comparisons rather than max(): this runs once per queued request.
        fitted = 0.0
        grid = self.p90_ratio_grid
        if input_index < len(grid):
            row = grid[input_index]
            if output_index < len(row):
                fitted = row[output_index]
        ratio = fitted if fitted > 0 else self.default_p90_ratio
        return ratio if ratio > 1.0 else 1.0

    def p90_ratio_for(self, input_tokens: int, output_tokens: int) -> float:
        """The ratio of the shape bucket a request falls in (no bucket object: used per request)."""
        return self.p90_ratio_at(
            bisect_left(INPUT_BUCKET_UPPER_TOKENS, input_tokens),
            bisect_left(OUTPUT_BUCKET_UPPER_TOKENS, output_tokens),
        )

    def upper_work_seconds(self, predicted_seconds: float, bucket: ShapeBucket) -> float:
        return predicted_seconds * self.p90_ratio(bucket)


def fit_work_error_profile(
    observations: Iterable[tuple[ShapeBucket, float, float]],
    default_p90_ratio: float = 1.5,
    min_samples: int = 20,
) -> WorkErrorProfile:
    """Learn the per-bucket p90 of actual/predicted work from finished requests.

    observations: (bucket, predicted work seconds, actual work seconds) of finished requests.
    """
    ratios: dict[ShapeBucket, list[float]] = {}
    for bucket, predicted, actual in observations:
        if predicted > 0 and math.isfinite(actual):
            ratios.setdefault(bucket, []).append(actual / predicted)
    grid = np.zeros((len(INPUT_BUCKET_UPPER_TOKENS) + 1, len(OUTPUT_BUCKET_UPPER_TOKENS) + 1))
    for bucket, values in ratios.items():
        if len(values) >= min_samples:
            grid[bucket.input_index, bucket.output_index] = max(1.0, float(np.percentile(values, 90)))
    return WorkErrorProfile(
        default_p90_ratio=default_p90_ratio,
        p90_ratio_grid=tuple(tuple(float(ratio) for ratio in row) for row in grid),
    )
