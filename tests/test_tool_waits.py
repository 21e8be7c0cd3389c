"""KV across tool waits: the learnt waits and the keep/offload/recompute rule
(goodput.controllers.requests.tool_waits)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from goodput.controllers.requests.tool_waits import (
    HeldKv,
    PredictedWait,
    TierWrites,
    ToolWaitBook,
    ToolWaitPolicy,
    ToolWaitRecord,
    WaitAction,
    choose_wait_action,
    turnover_seconds,
    wait_thresholds,
)

GIB = 2**30
LLAMA_8B_KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2  # 128 KiB
# An 8k-token conversation on a group of 400k KV tokens, 90 % full, whose prefix costs 0.5 s to
# recompute, with a 64 GiB CPU tier that turns over in a minute: keep below ~4 s of wait, offload to
# ~150 s, recompute beyond; without the tier, keep below ~28 s.
HELD = HeldKv(
    kv_tokens=8000,
    kv_bytes_per_token=LLAMA_8B_KV_BYTES_PER_TOKEN,
    recompute_seconds=0.5,
    group_kv_capacity_tokens=400_000,
    kv_pressure=0.9,
    offload_turnover_seconds=60.0,
)
OFFLOAD = ToolWaitPolicy(offload_cpu_bytes=64 * GIB)
NO_OFFLOAD = ToolWaitPolicy()


def learnt(seconds: float) -> PredictedWait:
    return PredictedWait(seconds, learnt=True)


@dataclass(frozen=True)
class ChoiceCase:
    name: str
    policy: ToolWaitPolicy
    predicted: PredictedWait
    held: HeldKv
    expected: WaitAction


CHOICES = [
    ChoiceCase("a short wait keeps its KV", OFFLOAD, learnt(2.0), HELD, WaitAction.KEEP),
    ChoiceCase("a middling wait offloads", OFFLOAD, learnt(20.0), HELD, WaitAction.OFFLOAD),
    ChoiceCase("the same wait keeps where offload is off", NO_OFFLOAD, learnt(20.0), HELD, WaitAction.KEEP),
    ChoiceCase("a long wait recomputes", OFFLOAD, learnt(600.0), HELD, WaitAction.RECOMPUTE),
    ChoiceCase(
        "a tier nobody writes keeps what it holds",
        OFFLOAD,
        learnt(3600.0),
        replace(HELD, offload_turnover_seconds=math.inf),
        WaitAction.OFFLOAD,
    ),
    ChoiceCase("a long wait, no offload, recomputes", NO_OFFLOAD, learnt(60.0), HELD, WaitAction.RECOMPUTE),
    ChoiceCase(
        "an empty cache keeps whatever the wait",
        OFFLOAD,
        learnt(3600.0),
        replace(HELD, kv_pressure=0.0),
        WaitAction.KEEP,
    ),
    ChoiceCase(
        "a dear prefix is kept longer",
        NO_OFFLOAD,
        learnt(60.0),
        replace(HELD, recompute_seconds=2.0),
        WaitAction.KEEP,
    ),
    ChoiceCase(
        "KV larger than the CPU tier is not offloaded",
        ToolWaitPolicy(offload_cpu_bytes=GIB // 2),
        learnt(20.0),
        HELD,
        WaitAction.KEEP,
    ),
    ChoiceCase(
        "too few waits: the longest seen is shorter than the recompute, kept",
        OFFLOAD,
        PredictedWait(0.3, learnt=False),
        HELD,
        WaitAction.KEEP,
    ),
    ChoiceCase(
        "too few waits: never offloaded, let go",
        OFFLOAD,
        PredictedWait(20.0, learnt=False),
        HELD,
        WaitAction.RECOMPUTE,
    ),
    ChoiceCase(
        "no wait seen yet: let go", OFFLOAD, PredictedWait(None, learnt=False), HELD, WaitAction.RECOMPUTE
    ),
]


@pytest.mark.parametrize("case", CHOICES, ids=lambda case: case.name)
def test_choose_wait_action(case: ChoiceCase) -> None:
    assert choose_wait_action(case.policy, case.predicted, case.held).action is case.expected


def test_thresholds_come_from_the_figures() -> None:
    """Keep gives way to offload where holding the GPU share costs the round trip plus the chance of
    an eviction times the recompute; offload to recompute where that chance makes it dearer."""
    keep_below, recompute_above = wait_thresholds(OFFLOAD, HELD)
    kv_bytes = HELD.kv_tokens * HELD.kv_bytes_per_token
    round_trip = 2 * kv_bytes / OFFLOAD.transfer_bytes_per_second
    keep_slope = HELD.kv_pressure * HELD.kv_tokens / HELD.group_kv_capacity_tokens
    turnover = HELD.offload_turnover_seconds
    evicted = 1 - math.exp(-keep_below / turnover)
    assert keep_slope * keep_below == pytest.approx(round_trip + evicted * HELD.recompute_seconds)
    assert recompute_above == pytest.approx(turnover * math.log(HELD.recompute_seconds / round_trip))
    assert 3.0 < keep_below < 6.0 and 140.0 < recompute_above < 160.0
    assert wait_thresholds(NO_OFFLOAD, HELD) == pytest.approx((0.5 / keep_slope, 0.5 / keep_slope))


def test_a_busier_tier_keeps_offloaded_prefixes_for_less_time() -> None:
    _, calm = wait_thresholds(OFFLOAD, HELD)
    _, busy = wait_thresholds(OFFLOAD, replace(HELD, offload_turnover_seconds=30.0))
    assert busy == pytest.approx(calm / 2)


def test_the_tier_turns_over_at_what_the_group_is_sent() -> None:
    writes = TierWrites(time_constant_seconds=60.0)
    assert turnover_seconds(64 * GIB, writes.tokens_per_second(0.0), LLAMA_8B_KV_BYTES_PER_TOKEN) == math.inf
    for second in range(600):
        writes.written(1000, now=float(second))  # a thousand prompt tokens a second, for ten minutes
    rate = writes.tokens_per_second(600.0)
    assert rate == pytest.approx(1000.0, rel=0.02)
    turnover = turnover_seconds(64 * GIB, rate, LLAMA_8B_KV_BYTES_PER_TOKEN)
    assert turnover == pytest.approx(64 * GIB / (1000 * LLAMA_8B_KV_BYTES_PER_TOKEN), rel=0.02)
    assert turnover_seconds(None, rate, LLAMA_8B_KV_BYTES_PER_TOKEN) == math.inf
    assert writes.tokens_per_second(600.0 + 600.0) < rate / 1000, "a quiet group's rate fades"


def test_a_round_trip_dearer_than_the_recompute_never_offloads() -> None:
    slow = replace(OFFLOAD, transfer_bytes_per_second=1e9)  # 2 s round trip for a 0.5 s prefix
    keep_below, recompute_above = wait_thresholds(slow, HELD)
    assert keep_below == recompute_above


held_kv = st.builds(
    HeldKv,
    kv_tokens=st.integers(1, 200_000),
    kv_bytes_per_token=st.sampled_from([LLAMA_8B_KV_BYTES_PER_TOKEN, 327_680, 70_272]),
    recompute_seconds=st.floats(0.0, 30.0),
    group_kv_capacity_tokens=st.integers(1, 2_000_000),
    kv_pressure=st.floats(0.0, 1.0),
    offload_turnover_seconds=st.one_of(st.just(math.inf), st.floats(0.0, 1e5)),
)
policies = st.builds(
    ToolWaitPolicy,
    offload_cpu_bytes=st.one_of(st.none(), st.integers(1, 512 * GIB)),
    transfer_bytes_per_second=st.floats(1e8, 1e11),
)
RANK = {WaitAction.KEEP: 0, WaitAction.OFFLOAD: 1, WaitAction.RECOMPUTE: 2}


@given(policies, held_kv, st.floats(0.0, 1e5), st.floats(0.0, 1e5))
def test_longer_waits_never_hold_more(
    policy: ToolWaitPolicy, held: HeldKv, first: float, second: float
) -> None:
    shorter, longer = sorted((first, second))
    a = choose_wait_action(policy, learnt(shorter), held).action
    b = choose_wait_action(policy, learnt(longer), held).action
    assert RANK[a] <= RANK[b]


@given(held_kv, st.floats(0.0, 1e5), st.booleans())
def test_never_offload_without_offload(held: HeldKv, wait: float, was_learnt: bool) -> None:
    choice = choose_wait_action(NO_OFFLOAD, PredictedWait(wait, learnt=was_learnt), held)
    assert choice.action is not WaitAction.OFFLOAD


@given(policies, held_kv, st.floats(0.0, 30.0), st.floats(0.0, 30.0))
def test_thresholds_move_with_the_recompute_cost(
    policy: ToolWaitPolicy, held: HeldKv, first: float, second: float
) -> None:
    cheap, dear = sorted((first, second))
    cheap_keep, cheap_recompute = wait_thresholds(policy, replace(held, recompute_seconds=cheap))
    dear_keep, dear_recompute = wait_thresholds(policy, replace(held, recompute_seconds=dear))
    assert cheap_keep <= dear_keep * (1 + 1e-9)
    assert cheap_recompute <= dear_recompute * (1 + 1e-9)
    if held.kv_pressure > 0 and dear > cheap * 1.01 and math.isfinite(dear_recompute):
        assert cheap_recompute < dear_recompute


def test_the_record_predicts_an_upper_quantile_once_it_has_seen_enough() -> None:
    book = ToolWaitBook(ToolWaitPolicy(wait_quantile=0.9, min_observations=8))
    for index in range(7):
        book.observe("chat", "agent", float(index + 1), now=0.0)
    assert book.predicted_wait("chat", "agent", 0.0) == PredictedWait(7.0, learnt=False)
    for index in range(7, 20):
        book.observe("chat", "agent", float(index + 1), now=0.0)
    assert book.predicted_wait("chat", "agent", 0.0) == PredictedWait(18.0, learnt=True)
    assert book.predicted_wait("chat", "other-class", 0.0) == PredictedWait(None, learnt=False)


def test_old_waits_fade_so_the_prediction_follows_the_workload() -> None:
    record = ToolWaitRecord(max_samples=256, half_life_seconds=60.0)
    for _ in range(20):
        record.observe(30.0, now=0.0)  # a slow tool, an hour ago
    for _ in range(20):
        record.observe(1.0, now=3600.0)
    assert record.quantile(0.9, now=3600.0) == 1.0
    assert record.observations(3600.0) == pytest.approx(20.0, rel=1e-6)


def test_the_record_is_bounded() -> None:
    record = ToolWaitRecord(max_samples=4)
    for index in range(10):
        record.observe(float(index), now=float(index))
    assert [wait for _at, wait in record.samples] == [6.0, 7.0, 8.0, 9.0]


@pytest.mark.parametrize("bad", [-1.0, math.inf, math.nan])
def test_a_wait_must_be_a_finite_duration(bad: float) -> None:
    with pytest.raises(ValueError, match="wait_seconds"):
        ToolWaitRecord().observe(bad, now=0.0)


def test_a_policy_names_the_setting_it_refuses() -> None:
    with pytest.raises(ValueError, match="offload_cpu_bytes"):
        ToolWaitPolicy(offload_cpu_bytes=0)
