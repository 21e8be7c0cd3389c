"""The snapshot's feasibility and the SLOAttainable verdict (controllers.autoscale.feasible_demand)."""

from __future__ import annotations

import pytest
from test_autoscale_world import PROFILE

from goodput.api.reasons import Attainability
from goodput.controllers.autoscale.feasible_demand import (
    TOLERATED_INFEASIBLE_SHARE,
    assess,
    attainability,
    floor_model,
    with_unfinished_prompts,
)
from goodput.controllers.autoscale.model import ClassFeasibility, GroupMetrics, SloTargets
from goodput.estimators.attainment import Histogram
from goodput.estimators.feasibility import longest_feasible_prompt_tokens, ttft_floor_seconds

PROMPT_BUCKETS = (100.0, 1000.0, 10_000.0, 100_000.0, 200_000.0)
INTERACTIVE = SloTargets("interactive", 1.0, 0.08)
RELAXED = SloTargets("batch", 30.0, 0.2)
MODEL = floor_model(PROFILE)
ONE_SECOND_THRESHOLD = longest_feasible_prompt_tokens(MODEL, 1.0)


def prompts(short: int, long: int) -> Histogram:
    return Histogram.from_observations(PROMPT_BUCKETS, [500] * short + [150_000] * long)


def test_each_class_is_judged_against_its_own_target() -> None:
    interactive, batch = assess(PROFILE, (INTERACTIVE, RELAXED), prompts(90, 10))
    assert interactive.longest_feasible_prompt_tokens == ONE_SECOND_THRESHOLD
    assert ttft_floor_seconds(MODEL, ONE_SECOND_THRESHOLD + 1) > 1.0
    assert interactive.infeasible_request_share == pytest.approx(0.10)
    assert interactive.infeasible_token_share is not None
    assert interactive.infeasible_token_share > 0.9
    assert batch.longest_feasible_prompt_tokens > 150_000
    assert batch.infeasible_request_share == pytest.approx(0.0)


def test_expected_prefix_hits_lengthen_the_threshold() -> None:
    (cold,) = assess(PROFILE, (INTERACTIVE,), None)
    (warm,) = assess(PROFILE, (INTERACTIVE,), None, expected_cached_fraction=0.5)
    assert warm.longest_feasible_prompt_tokens > cold.longest_feasible_prompt_tokens


def test_no_histogram_is_unknown_never_infeasible() -> None:
    (entry,) = assess(PROFILE, (INTERACTIVE,), None)
    assert entry.infeasible_request_share is None
    assert entry.feasible_request_fraction == 1.0


@pytest.mark.parametrize(
    ("target", "field"),
    [
        (SloTargets("realtime", 1e-4, 0.08), "ttftSeconds"),
        (SloTargets("realtime", 1.0, 1e-5), "itlSeconds"),
    ],
    ids=["ttft below a one-token prefill", "itl below one decode step"],
)
def test_a_class_no_request_can_meet_names_the_field(target: SloTargets, field: str) -> None:
    (entry,) = assess(PROFILE, (target,), None)
    assert entry.longest_feasible_prompt_tokens == 0
    assert entry.unmet_field == field
    assert entry.feasible_request_fraction == 0.0
    verdict = attainability((entry,), (target,), MODEL, tensor_parallel=1)
    assert verdict.status == "False"
    assert verdict.reason is Attainability.CLASS_UNATTAINABLE
    assert "class realtime" in verdict.message
    assert field in verdict.message


def test_a_share_past_the_threshold_names_the_length_and_the_fixes() -> None:
    histogram = prompts(80, 20)
    entries = assess(PROFILE, (INTERACTIVE,), histogram)
    verdict = attainability(entries, (INTERACTIVE,), MODEL, tensor_parallel=1, prompt_tokens=histogram)
    assert verdict.status == "False"
    assert verdict.reason is Attainability.INFEASIBLE_DEMAND
    assert f"longer than {ONE_SECOND_THRESHOLD} tokens" in verdict.message
    assert "20.0%" in verdict.message
    assert "tensor parallelism of about" in verdict.message
    assert "longer ttftSeconds" in verdict.message
    assert "class with a longer target" in verdict.message


def test_a_share_within_the_tolerance_is_attainable() -> None:
    entry = ClassFeasibility("interactive", ONE_SECOND_THRESHOLD, TOLERATED_INFEASIBLE_SHARE / 2, 0.1)
    verdict = attainability((entry,), (INTERACTIVE,), MODEL, tensor_parallel=1)
    assert verdict.status == "True"
    assert verdict.reason is Attainability.DEMAND_FEASIBLE
    assert str(ONE_SECOND_THRESHOLD) in verdict.message


def test_unknown_shares_are_an_unknown_condition() -> None:
    entries = assess(PROFILE, (INTERACTIVE,), None)
    verdict = attainability(entries, (INTERACTIVE,), MODEL, tensor_parallel=1)
    assert verdict.status == "Unknown"
    assert verdict.reason is Attainability.FEASIBILITY_UNKNOWN


def test_a_share_out_of_range_names_the_field() -> None:
    with pytest.raises(ValueError, match="infeasible_request_share"):
        ClassFeasibility("interactive", 100, 1.5)


def test_a_tensor_parallel_degree_out_of_reach_is_not_offered() -> None:
    """A 0.1 ms TTFT is below the fixed cost of any step: more ranks would not reach it."""
    target = SloTargets("realtime", 1e-4, 0.08)
    verdict = attainability(assess(PROFILE, (target,), None), (target,), MODEL, tensor_parallel=1)
    assert "tensor parallelism" not in verdict.message
    assert "a longer ttftSeconds, or another class" in verdict.message


def begun(prompts: float, tokens: float) -> GroupMetrics:
    """A group whose window counted `tokens` prompt tokens of `prompts` requests not finished yet."""
    return GroupMetrics(age_seconds=1.0, prompts_started=prompts, prompt_tokens_started=tokens)


@pytest.mark.parametrize(
    ("groups", "added"),
    [
        ([begun(0.0, 0.0)], []),
        ([begun(1.0, 150_000.0)], [150_000]),
        # A short prompt finished in the window as the long one began: the net count is 0, the
        # tokens are still one long prompt's.
        ([begun(0.0, 150_000.0)], [150_000]),
        ([begun(3.0, 1_500.0)], [500, 500, 500]),
        ([begun(1.0, 150_000.0), begun(2.0, 1_000.0)], [150_000, 500, 500]),
        # Prometheus' extrapolation leaves a fraction of a token where nothing began.
        ([begun(0.2, 0.4)], []),
    ],
    ids=[
        "nothing begun",
        "one long prompt decoding",
        "a short one finished as a long one began",
        "three begun share their tokens",
        "each group's own",
        "extrapolation noise",
    ],
)
def test_prompts_begun_and_not_finished_join_the_finished_ones(
    groups: list[GroupMetrics], added: list[int]
) -> None:
    finished = prompts(9, 0)
    joined = with_unfinished_prompts(finished, groups)
    expected = Histogram.from_observations(PROMPT_BUCKETS, [500] * 9 + added)
    assert joined is not None
    assert joined.cumulative_counts == expected.cumulative_counts


def test_a_long_prompt_decoding_makes_the_share_infeasible_before_it_finishes() -> None:
    finished_only = prompts(3, 0)
    (before,) = assess(PROFILE, (INTERACTIVE,), finished_only)
    (now,) = assess(PROFILE, (INTERACTIVE,), with_unfinished_prompts(finished_only, [begun(1.0, 150_000.0)]))
    assert before.infeasible_token_share == 0.0
    assert now.infeasible_request_share == pytest.approx(0.25)
    assert now.infeasible_token_share is not None
    assert now.infeasible_token_share > 0.95


def test_without_finished_prompts_the_bounds_are_unknown_and_nothing_is_added() -> None:
    assert with_unfinished_prompts(None, [begun(1.0, 150_000.0)]) is None
