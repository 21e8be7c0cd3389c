"""The measured envelope: found on a fleet of several groups with a bracket and a confidence bound,
or a loud error that names the class, the attainment reached and the rates tried."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from goodput.estimators.service_time import H100_80G, LLAMA_3_1_8B
from goodput.estimators.work import WorkPricing
from goodput.simulator.engine import EngineConfig
from goodput.simulator.envelope import (
    CapacityEnvelope,
    EnvelopeNotFoundError,
    EnvelopeSearch,
    measure_envelope,
    wilson_lower_bound,
)
from goodput.simulator.fleet import FleetConfig
from goodput.simulator.report import ClassTargets
from goodput.simulator.workload import BurstSpec, ClassRule, Workload, assign_classes, synthetic_bursts

ENGINE = EngineConfig.for_hardware(LLAMA_3_1_8B, H100_80G)
FLEET = FleetConfig(engine=ENGINE, gpus_per_group=1, itl_targets_seconds=(0.075,))
PRICING = WorkPricing.from_step_model(ENGINE.cost)
SEARCH = EnvelopeSearch(groups=2, repeats=2, trial_seconds=120.0, refinements=2, min_requests_per_class=20)


def chat_workload(rate: float, seconds: float, burst_multiplier: float = 1.0) -> Workload:
    """Short chat requests at `rate`, times `burst_multiplier` over minutes 4 and 5."""
    spec = BurstSpec(
        duration_seconds=seconds,
        base_rate_per_second=rate,
        burst_start_seconds=240.0,
        burst_seconds=120.0,
        burst_multiplier=burst_multiplier,
        input_median_tokens=400,
        output_median_tokens=60,
        input_sigma=0.5,
        output_sigma=0.5,
    )
    return assign_classes(synthetic_bursts(spec, seed=5), ClassRule(("chat",), (1.0,)), seed=5)


def steady(rate: float = 20.0, seconds: float = 600.0) -> Workload:
    return chat_workload(rate, seconds)


def test_the_envelope_brackets_the_rate_and_bounds_the_attainment() -> None:
    chat = ClassTargets("chat", ttft_seconds=1.0, itl_seconds=0.075, attainment=0.99)
    envelope = measure_envelope(
        FLEET, steady(), (chat,), pricing=PRICING, first_guess_rate_per_group=5.0, search=SEARCH
    )
    assert envelope.failing_requests_per_second is not None
    assert envelope.requests_per_second < envelope.failing_requests_per_second
    passed = [t for t in envelope.trial_log if t.passed]
    failed = [t for t in envelope.trial_log if not t.passed]
    assert max(t.rate_per_group for t in passed) == envelope.requests_per_second
    assert min(t.rate_per_group for t in failed) == envelope.failing_requests_per_second
    assert envelope.groups == 2 and envelope.repeats == 2
    (bound,) = envelope.attainment_lower_bounds
    best = next(t for t in envelope.trial_log if t.rate_per_group == envelope.requests_per_second)
    assert bound <= best.attainment(0)
    assert envelope.work_seconds_per_second > 0


def test_a_target_no_rate_meets_fails_loudly_with_the_class_and_the_rates() -> None:
    # an ITL target below what a decode step at these contexts takes, alone or not
    strict = ClassTargets(
        "strict", ttft_seconds=1.0, itl_seconds=ENGINE.cost.decode_step_seconds(1, 20), attainment=0.99
    )
    with pytest.raises(
        EnvelopeNotFoundError, match=r"strict reached 0\.\d+ against attainment 0\.99.*rates tried"
    ):
        measure_envelope(
            FLEET, steady(), (strict,), pricing=PRICING, first_guess_rate_per_group=5.0, search=SEARCH
        )


def test_too_few_requests_to_judge_is_an_error_not_a_pass() -> None:
    chat = ClassTargets("chat", ttft_seconds=1.0, itl_seconds=0.075)
    with pytest.raises(EnvelopeNotFoundError, match="too few requests"):
        measure_envelope(
            FLEET,
            steady(rate=0.05),
            (chat,),
            pricing=PRICING,
            first_guess_rate_per_group=0.05,
            search=replace(SEARCH, min_requests_per_class=100),
        )


def test_an_empty_workload_is_an_error() -> None:
    chat = ClassTargets("chat", ttft_seconds=1.0, itl_seconds=0.075)
    empty = steady().take(np.zeros(0, dtype=np.int64), "none")
    with pytest.raises(EnvelopeNotFoundError, match="no feasible request"):
        measure_envelope(
            FLEET, empty, (chat,), pricing=PRICING, first_guess_rate_per_group=1.0, search=SEARCH
        )


@given(st.integers(0, 500), st.integers(1, 500))
@example(successes=0, extra=248)  # rounding once gave a share just below zero
def test_the_wilson_bound_lies_below_the_share(successes: int, extra: int) -> None:
    trials = successes + extra - 1 if successes + extra - 1 >= max(successes, 1) else max(successes, 1)
    bound = wilson_lower_bound(successes, trials)
    assert 0.0 <= bound <= successes / trials + 1e-12
    if successes < trials:
        assert wilson_lower_bound(successes + 1, trials) >= bound


def test_the_wilson_bound_of_nothing_is_nan() -> None:
    assert math.isnan(wilson_lower_bound(0, 0))


@given(st.floats(0.01, 100.0), st.floats(0.05, 4.0))
def test_a_scaled_envelope_scales_both_rates_and_keeps_the_rest(capacity: float, factor: float) -> None:
    envelope = CapacityEnvelope(capacity, capacity * 3.0, 0.99, 7, groups=4, repeats=2)
    scaled = envelope.scaled(factor)
    assert scaled.work_seconds_per_second == pytest.approx(capacity * factor)
    assert scaled.requests_per_second == pytest.approx(capacity * 3.0 * factor)
    assert (scaled.attainment_goal, scaled.trials, scaled.groups, scaled.repeats) == (0.99, 7, 4, 2)


@pytest.mark.parametrize("factor", [0.0, -0.5])
def test_an_envelope_factor_that_is_not_positive_is_refused(factor: float) -> None:
    with pytest.raises(ValueError, match="envelope factor must be positive"):
        CapacityEnvelope(0.1, 1.0, 0.99, 1).scaled(factor)


SUITE_SEARCH = EnvelopeSearch(trial_seconds=240.0, refinements=3)


@pytest.mark.parametrize(
    ("ttft_seconds", "span_seconds", "expected_seconds"),
    [
        (1.0, 5000.0, 240.0),
        (20.0, 5000.0, 1000.0),
        (60.0, 1000.0, 1000.0),
        (60.0, 100.0, 240.0),
    ],
    ids=[
        "a 1 s target shows an overload within the configured trial",
        "a 20 s target needs fifty times as long",
        "never longer than the workload",
        "a workload shorter than the configured trial keeps it",
    ],
)
def test_a_trial_lasts_long_against_the_tightest_ttft_target(
    ttft_seconds: float, span_seconds: float, expected_seconds: float
) -> None:
    classes = (
        ClassTargets("tight", ttft_seconds=ttft_seconds, itl_seconds=0.1),
        ClassTargets("loose", ttft_seconds=10 * ttft_seconds, itl_seconds=1.0),
    )
    assert SUITE_SEARCH.trial_seconds_for(classes, span_seconds) == pytest.approx(expected_seconds)


def _attainment_held_over(workload: Workload, rate_per_group: float, chat: ClassTargets) -> float:
    """The chat class's attainment when the search's fleet takes `rate_per_group` for the whole
    workload."""
    from goodput.simulator.baselines import FixedFleet
    from goodput.simulator.envelope import trial_workload
    from goodput.simulator.report import judge
    from goodput.simulator.simulation import SimulationConfig, simulate

    groups = SEARCH.groups
    held = trial_workload(workload, rate_per_group * groups, workload.span_seconds, seed=9)
    config = SimulationConfig(fleet=FLEET, seed=9, initial_groups=groups, tail_seconds=300.0)
    result = simulate(held, config, FixedFleet(groups))
    return float(judge(result, (chat,)).met.mean())


def test_a_rate_the_envelope_passes_is_sustained_for_the_whole_workload() -> None:
    """Under a 20 s TTFT target a 120 s trial cannot see a small overload (the running batches fill,
    then the backlog needs longer than the trial to delay a request by 20 s); the trial the search
    runs can, and the rate it passes holds over the whole workload."""
    chat = ClassTargets("chat", ttft_seconds=20.0, itl_seconds=1.0, attainment=0.99)
    workload = steady(rate=40.0, seconds=900.0)
    envelope = measure_envelope(
        FLEET, workload, (chat,), pricing=PRICING, first_guess_rate_per_group=10.0, search=SEARCH
    )
    assert envelope.trial_seconds == pytest.approx(workload.span_seconds)
    assert _attainment_held_over(workload, envelope.requests_per_second, chat) >= chat.attainment


def bursty(seconds: float = 600.0) -> Workload:
    """Twenty requests a second with a five-fold surge over minutes 4 and 5."""
    return chat_workload(20.0, seconds, burst_multiplier=5.0)


def _per_minute(workload: Workload, seconds: float) -> np.ndarray:
    return np.histogram(workload.arrival_seconds, np.arange(0.0, seconds + 1.0, 60.0))[0]


def test_a_steady_trial_offers_the_workloads_requests_on_poisson_arrivals() -> None:
    from goodput.simulator.envelope import steady_trial_workload, traced_trial_workload

    source = bursty()
    trial = steady_trial_workload(source, 30.0, 600.0, seed=3)
    assert abs(len(trial) - 18_000) < 4 * math.sqrt(18_000)
    gaps = np.diff(trial.arrival_seconds)
    assert float(gaps.std() / gaps.mean()) == pytest.approx(1.0, abs=0.05)  # exponential gaps
    minutes = _per_minute(trial, 600.0)
    assert minutes.max() < 1.1 * minutes.min()  # the surge is gone
    pairs = set(zip(source.input_tokens.tolist(), source.output_tokens.tolist(), strict=True))
    assert set(zip(trial.input_tokens.tolist(), trial.output_tokens.tolist(), strict=True)) <= pairs
    # the same rate on the trace's shape keeps the surge
    traced = _per_minute(traced_trial_workload(source, 30.0, 600.0, seed=3), 600.0)
    assert traced.max() > 3 * traced.min()


def test_a_surge_in_the_window_lowers_the_envelope_on_the_trace_shape_not_on_steady_arrivals() -> None:
    """The decision code reads the surge in the arrival rate; an envelope measured through it would
    count it a second time."""
    chat = ClassTargets("chat", ttft_seconds=1.0, itl_seconds=0.075, attainment=0.99)
    workload = bursty()
    search = replace(SEARCH, trial_seconds=workload.span_seconds)
    steady_envelope, traced_envelope = (
        measure_envelope(
            FLEET,
            workload,
            (chat,),
            pricing=PRICING,
            first_guess_rate_per_group=10.0,
            search=replace(search, arrivals=arrivals),
        )
        for arrivals in ("steady", "trace")
    )
    assert (steady_envelope.arrivals, traced_envelope.arrivals) == ("steady", "trace")
    assert steady_envelope.requests_per_second > 1.5 * traced_envelope.requests_per_second
