"""Zero-load floors and feasibility (goodput.estimators.feasibility)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from goodput.estimators.attainment import Histogram
from goodput.estimators.feasibility import (
    FloorModel,
    FloorTargets,
    infeasible_share,
    infeasible_token_share,
    is_feasible,
    longest_feasible_prompt_tokens,
    minimum_tensor_parallel_hint,
    prefill_floor_seconds,
    request_floors,
    ttft_floor_seconds,
    unmet_targets,
)
from goodput.estimators.service_time import H100_80G, LLAMA_3_1_8B, LLAMA_3_1_70B, StepCostModel

H100_8B = StepCostModel.from_hardware(LLAMA_3_1_8B, H100_80G)
H100_70B_TP8 = StepCostModel.from_hardware(LLAMA_3_1_70B, H100_80G, 8)
CHUNK_2K = FloorModel(H100_8B, chunk_tokens=2048)
CHAT = FloorTargets(ttft_seconds=1.0, itl_seconds=0.05)


def test_a_prompt_within_one_chunk_is_one_step() -> None:
    assert prefill_floor_seconds(CHUNK_2K, 1000) == pytest.approx(H100_8B.prefill_seconds(1000))


def test_chunking_costs_a_step_overhead_per_chunk() -> None:
    one_big_chunk = FloorModel(H100_8B, chunk_tokens=1 << 20)
    chunked = prefill_floor_seconds(CHUNK_2K, 20_000)
    whole = prefill_floor_seconds(one_big_chunk, 20_000)
    # Ten chunks pay the per-step fixed cost and weight read ten times; the attention work is equal.
    assert chunked > whole
    assert chunked - whole < 10 * (H100_8B.fixed_seconds + H100_8B.weight_read_seconds + 1e-3)


def test_cached_prefix_lowers_the_floor() -> None:
    cold = ttft_floor_seconds(CHUNK_2K, 30_000)
    warm = ttft_floor_seconds(FloorModel(H100_8B, 2048, expected_cached_fraction=0.5), 30_000)
    assert warm < cold


def test_route_hop_is_added_to_ttft_only() -> None:
    routed = FloorModel(H100_8B, 2048, route_seconds=0.2)
    plain, hopped = request_floors(CHUNK_2K, 500, 100), request_floors(routed, 500, 100)
    assert hopped.ttft_seconds == pytest.approx(plain.ttft_seconds + 0.2)
    assert hopped.itl_seconds == pytest.approx(plain.itl_seconds)


@dataclass(frozen=True)
class FeasibilityCase:
    name: str
    prompt_tokens: int
    output_tokens: int
    targets: FloorTargets
    unmet: tuple[str, ...]


CASES = [
    FeasibilityCase("short chat fits every target", 500, 200, CHAT, ()),
    FeasibilityCase("128k prompt cannot reach a 1 s TTFT", 128_000, 200, CHAT, ("ttft",)),
    FeasibilityCase("ITL of 1 ms is below one decode step", 500, 200, FloorTargets(1.0, 0.001), ("itl",)),
    FeasibilityCase(
        "long answer cannot finish in 2 s", 500, 4000, FloorTargets(1.0, 0.05, e2e_seconds=2.0), ("e2e",)
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_unmet_targets(case: FeasibilityCase) -> None:
    floors = request_floors(CHUNK_2K, case.prompt_tokens, case.output_tokens)
    assert unmet_targets(floors, case.targets) == case.unmet
    assert is_feasible(CHUNK_2K, case.targets, case.prompt_tokens, case.output_tokens) == (not case.unmet)


@given(st.integers(1, 200_000), st.integers(1, 200_000))
def test_ttft_floor_is_monotone_in_prompt_length(shorter: int, longer: int) -> None:
    shorter, longer = min(shorter, longer), max(shorter, longer)
    assert ttft_floor_seconds(CHUNK_2K, shorter) <= ttft_floor_seconds(CHUNK_2K, longer)


@pytest.mark.parametrize("target_seconds", [0.05, 0.25, 1.0, 3.0])
def test_threshold_is_the_exact_boundary(target_seconds: float) -> None:
    threshold = longest_feasible_prompt_tokens(CHUNK_2K, target_seconds)
    assert threshold > 0
    assert ttft_floor_seconds(CHUNK_2K, threshold) <= target_seconds
    assert ttft_floor_seconds(CHUNK_2K, threshold + 1) > target_seconds


def test_threshold_is_zero_when_nothing_fits() -> None:
    assert longest_feasible_prompt_tokens(CHUNK_2K, 1e-6) == 0


def test_more_tensor_parallelism_raises_the_threshold() -> None:
    tp8 = longest_feasible_prompt_tokens(FloorModel(H100_70B_TP8, 2048), 1.0)
    tp1 = longest_feasible_prompt_tokens(
        FloorModel(StepCostModel.from_hardware(LLAMA_3_1_70B, H100_80G), 2048), 1.0
    )
    assert tp8 > tp1


def test_infeasible_share_from_prompt_histogram() -> None:
    bounds = (1000.0, 10_000.0, 100_000.0)
    prompts = [500] * 70 + [5000] * 20 + [50_000] * 10
    histogram = Histogram.from_observations(bounds, prompts)
    assert infeasible_share(histogram, 10_000) == pytest.approx(0.10)
    assert infeasible_share(histogram, 100_000) == pytest.approx(0.0)
    assert infeasible_share(None, 10_000) is None
    assert infeasible_share(Histogram.empty(bounds), 10_000) is None


def test_tensor_parallel_hint_names_a_larger_power_of_two() -> None:
    assert minimum_tensor_parallel_hint(1, floor_seconds=3.0, target_seconds=1.0) == 4
    assert minimum_tensor_parallel_hint(8, floor_seconds=0.5, target_seconds=1.0) == 8


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("chunk_tokens", {"chunk_tokens": 0}),
        ("route_seconds", {"route_seconds": -1.0}),
        ("expected_cached_fraction", {"expected_cached_fraction": 1.0}),
    ],
)
def test_bad_floor_model_names_the_field(field: str, kwargs: dict[str, float]) -> None:
    arguments = {"step_model": H100_8B, "chunk_tokens": 2048, **kwargs}
    with pytest.raises(ValueError, match=field):
        FloorModel(**arguments)  # type: ignore[arg-type]


def test_infeasible_token_share_weighs_long_prompts_by_their_tokens() -> None:
    bounds = (1000.0, 10_000.0, 100_000.0)
    prompts = [500] * 70 + [5000] * 20 + [50_000] * 10
    histogram = Histogram.from_observations(bounds, prompts)
    # Midpoints: 70 x 500, 20 x 5500, 10 x 55000 tokens; the last bucket is past the threshold.
    expected = 10 * 55_000 / (70 * 500 + 20 * 5500 + 10 * 55_000)
    assert infeasible_token_share(histogram, 10_000) == pytest.approx(expected)
    assert infeasible_token_share(histogram, 100_000) == pytest.approx(0.0)
    assert infeasible_token_share(histogram, 0) == pytest.approx(1.0)
    assert infeasible_token_share(None, 10_000) is None
    assert infeasible_token_share(Histogram.empty(bounds), 10_000) is None


def test_prompts_past_the_last_bound_are_infeasible_by_tokens_too() -> None:
    histogram = Histogram.from_observations((1000.0,), [500] * 9 + [5000])
    assert infeasible_share(histogram, 100_000) == pytest.approx(0.1)
    assert infeasible_token_share(histogram, 100_000) == pytest.approx(1000 / (9 * 500 + 1000))


@given(
    st.lists(st.integers(1, 200_000), min_size=1, max_size=50),
    st.integers(0, 200_000),
)
def test_token_share_is_at_least_the_request_share(prompts: list[int], threshold: int) -> None:
    """The prompts past a threshold are the longest, so their share of tokens is never below their
    share of requests (what lets the decision strip both from the pooled rates)."""
    histogram = Histogram.from_observations((1000.0, 10_000.0, 100_000.0), prompts)
    by_requests = infeasible_share(histogram, threshold)
    by_tokens = infeasible_token_share(histogram, threshold)
    assert by_requests is not None and by_tokens is not None
    assert by_tokens >= by_requests - 1e-9


# vLLM's 1-2-5 prompt buckets around the 1 s threshold of an 8B model on one H100 (~24.6k tokens).
VLLM_BOUNDS = (1000.0, 2000.0, 5000.0, 10_000.0, 20_000.0, 50_000.0, 100_000.0)


def test_conservative_shares_count_the_bucket_holding_the_threshold_as_infeasible() -> None:
    """Every prompt is 40k tokens, past a 24.6k threshold in the same (20k, 50k] bucket: the
    interpolation calls 15 % of them feasible, the conservative share none."""
    histogram = Histogram.from_observations(VLLM_BOUNDS, [40_000] * 100)
    assert infeasible_share(histogram, 24_600) == pytest.approx(1 - 4_600 / 30_000)
    assert infeasible_share(histogram, 24_600, conservative=True) == pytest.approx(1.0)
    assert infeasible_token_share(histogram, 24_600, conservative=True) == pytest.approx(1.0)


def test_conservative_shares_keep_the_buckets_below_the_threshold() -> None:
    histogram = Histogram.from_observations(VLLM_BOUNDS, [500] * 60 + [15_000] * 20 + [40_000] * 20)
    assert infeasible_share(histogram, 24_600, conservative=True) == pytest.approx(0.2)
    assert infeasible_share(histogram, 20_000, conservative=True) == pytest.approx(0.2)  # on a bound
    expected_tokens = 20 * 35_000 / (60 * 500 + 20 * 15_000 + 20 * 35_000)
    assert infeasible_token_share(histogram, 24_600, conservative=True) == pytest.approx(expected_tokens)


@given(st.lists(st.integers(1, 200_000), min_size=1, max_size=50), st.integers(0, 200_000))
def test_the_conservative_share_is_never_below_the_interpolated_one(
    prompts: list[int], threshold: int
) -> None:
    histogram = Histogram.from_observations(VLLM_BOUNDS, prompts)
    interpolated = infeasible_share(histogram, threshold)
    conservative = infeasible_share(histogram, threshold, conservative=True)
    assert interpolated is not None and conservative is not None
    assert conservative >= interpolated - 1e-12
    tokens = infeasible_token_share(histogram, threshold)
    conservative_tokens = infeasible_token_share(histogram, threshold, conservative=True)
    assert tokens is not None and conservative_tokens is not None
    assert conservative_tokens >= tokens - 1e-12
