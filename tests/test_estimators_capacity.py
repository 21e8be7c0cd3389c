"""Capacity C of one group at the SLO, and the capacity profile (goodput.estimators.capacity)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from goodput.estimators.capacity import (
    LIMIT_ITL,
    LIMIT_KV_CAPACITY,
    LIMIT_MAX_NUM_SEQS,
    LIMIT_TOKEN_BUDGET,
    CapacityProfile,
    OperatingPoint,
    build_capacity_profile,
    operating_point,
)
from goodput.estimators.service_time import (
    A100_80G,
    H100_80G,
    LLAMA_3_1_8B,
    LLAMA_3_1_70B,
    StepCostModel,
    default_batch_limits,
)
from goodput.estimators.work import WorkPricing

H100_8B = StepCostModel.from_hardware(LLAMA_3_1_8B, H100_80G)
A100_70B_TP4 = StepCostModel.from_hardware(LLAMA_3_1_70B, A100_80G, 4)


@dataclass(frozen=True)
class PointCase:
    name: str
    model: StepCostModel
    input_tokens: float
    output_tokens: float
    step_budget_seconds: float
    max_num_seqs: int
    max_num_batched_tokens: int
    limit: str
    attainable: bool = True


POINT_CASES = [
    PointCase(
        "chat under a 64 ms step is bound by the ITL target", H100_8B, 1024, 256, 0.064, 1024, 8192, LIMIT_ITL
    ),
    PointCase("a small max_num_seqs binds first", H100_8B, 1024, 256, 0.064, 32, 8192, LIMIT_MAX_NUM_SEQS),
    PointCase(
        "long contexts fill the KV cache first", H100_8B, 60_000, 2000, 1.0, 1024, 65536, LIMIT_KV_CAPACITY
    ),
    PointCase(
        "prefill-heavy mix hits the token budget", H100_8B, 8192, 16, 1.0, 1024, 2048, LIMIT_TOKEN_BUDGET
    ),
    PointCase(
        "a step budget below one decode step", A100_70B_TP4, 1024, 256, 0.005, 256, 2048, LIMIT_ITL, False
    ),
]


def _point(case: PointCase) -> OperatingPoint:
    return operating_point(
        case.model,
        WorkPricing.from_step_model(case.model),
        case.input_tokens,
        case.output_tokens,
        step_budget_seconds=case.step_budget_seconds,
        max_num_seqs=case.max_num_seqs,
        max_num_batched_tokens=case.max_num_batched_tokens,
    )


def _steady_step_seconds(case: PointCase, batch: int) -> float:
    """The step of a steady batch: `batch` decodes plus the prefill of the requests replacing them,
    as averages per step (fractional: a request joins every output_tokens/batch steps)."""
    joins = batch / case.output_tokens
    return case.model.step_seconds(
        batch + joins * case.input_tokens,
        joins * case.input_tokens * case.input_tokens / 2,
        batch * (case.input_tokens + case.output_tokens / 2),
        batch + joins,
    )


@pytest.mark.parametrize("case", POINT_CASES, ids=[case.name for case in POINT_CASES])
def test_operating_point_is_the_largest_batch_within_every_limit(case: PointCase) -> None:
    point = _point(case)
    assert point.limit == case.limit
    assert point.attainable is case.attainable
    assert point.step_seconds == pytest.approx(_steady_step_seconds(case, point.batch))
    assert point.requests_per_second == pytest.approx(point.batch / (case.output_tokens * point.step_seconds))
    assert 0 < point.work_per_second < 1
    if not case.attainable:
        assert point.batch == 1
        return
    assert point.step_seconds <= case.step_budget_seconds
    assert point.batch <= case.max_num_seqs
    assert point.batch * (case.input_tokens + case.output_tokens / 2) <= case.model.kv_capacity_tokens
    if case.limit == LIMIT_ITL:
        assert _steady_step_seconds(case, point.batch + 1) > case.step_budget_seconds


@given(
    budget_low=st.floats(0.02, 0.2),
    extra=st.floats(0.0, 0.2),
    input_tokens=st.integers(64, 16_000),
    output_tokens=st.integers(8, 4_000),
)
# Found once: rounding the per-step averages up made the work rate dip at a larger batch.
@example(budget_low=0.06918842889150306, extra=0.125, input_tokens=2047, output_tokens=245)
def test_a_looser_itl_target_never_lowers_capacity(
    budget_low: float, extra: float, input_tokens: int, output_tokens: int
) -> None:
    pricing = WorkPricing.from_step_model(H100_8B)

    def capacity(budget: float) -> float:
        return operating_point(
            H100_8B,
            pricing,
            input_tokens,
            output_tokens,
            step_budget_seconds=budget,
            max_num_seqs=1024,
            max_num_batched_tokens=8192,
        ).work_per_second

    assert capacity(budget_low + extra) >= capacity(budget_low) - 1e-12


def test_fixed_step_overhead_is_what_capacity_loses() -> None:
    """In the compute-bound regime a step is its fixed overhead plus priced work, so C = 1 - T0/T."""
    point = _point(POINT_CASES[0])
    fixed = H100_8B.fixed_seconds + H100_8B.communication_fixed_seconds
    assert point.work_per_second == pytest.approx(1 - fixed / point.step_seconds, rel=0.02)


@pytest.fixture(scope="module")
def h100_profile() -> CapacityProfile:
    seqs, tokens = default_batch_limits(H100_80G)
    return build_capacity_profile(
        H100_8B,
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
        itl_target_seconds=0.08,
        ttft_target_seconds=2.0,
    )


def test_profile_capacity_interpolates_grid_points_exactly(h100_profile: CapacityProfile) -> None:
    for row_index, input_log2 in enumerate(h100_profile.input_grid_log2):
        for column_index, output_log2 in enumerate(h100_profile.output_grid_log2):
            expected = h100_profile.capacity_grid[row_index][column_index]
            assert h100_profile.capacity_per_group(2**input_log2, 2**output_log2) == pytest.approx(expected)


def test_profile_capacity_clamps_outside_the_grid(h100_profile: CapacityProfile) -> None:
    grid = h100_profile.capacity_grid
    assert h100_profile.capacity_per_group(1, 1) == pytest.approx(grid[0][0])
    assert h100_profile.capacity_per_group(10**7, 10**6) == pytest.approx(grid[-1][-1])


@given(
    input_tokens=st.floats(10, 100_000),
    output_tokens=st.floats(1, 10_000),
    nudge=st.floats(0.999, 1.001),
)
def test_profile_capacity_is_continuous_in_the_mix(
    input_tokens: float, output_tokens: float, nudge: float
) -> None:
    """No step in C when the mean lengths drift: a jump would flap the decision."""
    seqs, tokens = default_batch_limits(H100_80G)
    profile = _cached_profile(seqs, tokens)
    here = profile.capacity_per_group(input_tokens, output_tokens)
    there = profile.capacity_per_group(input_tokens * nudge, output_tokens * nudge)
    assert there == pytest.approx(here, rel=0.01)


_PROFILES: dict[tuple[int, int], CapacityProfile] = {}


def _cached_profile(seqs: int, tokens: int) -> CapacityProfile:
    key = (seqs, tokens)
    if key not in _PROFILES:
        _PROFILES[key] = build_capacity_profile(
            H100_8B,
            max_num_seqs=seqs,
            max_num_batched_tokens=tokens,
            itl_target_seconds=0.08,
            ttft_target_seconds=2,
        )
    return _PROFILES[key]


def test_reference_point_and_ttft_floor(h100_profile: CapacityProfile) -> None:
    reference = h100_profile.reference
    assert h100_profile.capacity_per_group(1024, 256) == pytest.approx(reference.work_per_second, rel=0.01)
    assert h100_profile.first_decode_seconds == reference.step_seconds
    assert h100_profile.prefill_seconds_p90 == pytest.approx(H100_8B.prefill_seconds(2560))
    assert h100_profile.ttft_floor_seconds == pytest.approx(
        h100_profile.prefill_seconds_p90 + reference.step_seconds
    )
    assert h100_profile.ttft_attainable


def test_an_unreachable_ttft_target_is_reported() -> None:
    profile = build_capacity_profile(
        A100_70B_TP4,
        max_num_seqs=256,
        max_num_batched_tokens=2048,
        itl_target_seconds=0.1,
        ttft_target_seconds=0.2,
    )
    assert not profile.ttft_attainable


def test_calibration_scales_capacity_to_the_measured_envelope(h100_profile: CapacityProfile) -> None:
    calibrated = h100_profile.calibrated(0.5)
    assert calibrated.reference.work_per_second == 0.5
    ratio = 0.5 / h100_profile.reference.work_per_second
    assert calibrated.capacity_per_group(3000, 90) == pytest.approx(
        h100_profile.capacity_per_group(3000, 90) * ratio
    )
    with pytest.raises(ValueError, match="positive"):
        h100_profile.calibrated(0.0)


def test_profile_rejects_a_degenerate_grid() -> None:
    with pytest.raises(ValueError, match="two points"):
        build_capacity_profile(
            H100_8B,
            max_num_seqs=1024,
            max_num_batched_tokens=8192,
            itl_target_seconds=0.08,
            ttft_target_seconds=2,
            input_grid_tokens=(1024.0,),
        )


def test_the_slo_batch_is_the_operating_points_batch_on_the_grid(h100_profile: CapacityProfile) -> None:
    """Between grid points it is interpolated like C; on them it is the batch C was computed at."""
    for input_log2 in h100_profile.input_grid_log2:
        for output_log2 in h100_profile.output_grid_log2:
            point = operating_point(
                H100_8B,
                h100_profile.pricing,
                2**input_log2,
                2**output_log2,
                step_budget_seconds=h100_profile.step_budget_seconds,
                max_num_seqs=h100_profile.max_num_seqs,
                max_num_batched_tokens=h100_profile.max_num_batched_tokens,
            )
            batch = h100_profile.slo_batch_per_group(2**input_log2, 2**output_log2)
            assert batch == pytest.approx(point.batch)


def test_a_step_at_the_slo_batch_fits_the_itl_budget_and_one_more_sequence_does_not() -> None:
    """Where the ITL budget binds, the SLO batch is exactly the edge: the batch past which load
    itself makes the steps too long."""
    seqs, tokens = default_batch_limits(H100_80G)
    point = operating_point(
        H100_8B,
        _cached_profile(seqs, tokens).pricing,
        1024,
        256,
        step_budget_seconds=0.064,
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
    )
    assert point.limit == LIMIT_ITL
    assert point.step_seconds <= 0.064
    bigger = operating_point(
        H100_8B,
        _cached_profile(seqs, tokens).pricing,
        1024,
        256,
        step_budget_seconds=0.064,
        max_num_seqs=point.batch + 1,
        max_num_batched_tokens=tokens,
    )
    assert bigger.batch == point.batch  # one more sequence would break the budget


def test_calibration_keeps_the_slo_batch(h100_profile: CapacityProfile) -> None:
    """C is rescaled to a measured envelope; the batch at which steps reach the ITL budget is a
    property of the step model and stays."""
    calibrated = h100_profile.calibrated(0.5)
    assert calibrated.slo_batch_per_group(3000, 90) == h100_profile.slo_batch_per_group(3000, 90)
