"""The counting rules the operator and the simulator apply before a decision."""

from __future__ import annotations

from dataclasses import fields
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from goodput.api.conditions import Condition
from goodput.api.modelgroup import GROUP_STATES, GroupState
from goodput.api.reasons import ConditionType, Reason
from goodput.controllers.autoscale.model import GroupMetrics, GroupObservation, ScalingPolicy, SloTargets
from goodput.controllers.autoscale.snapshot import (
    ModelGroupCounts,
    aligned,
    clamped,
    model_group_snapshot,
    unplaceable,
    wanted_groups,
    with_wanted_groups,
    without_replacements,
)
from goodput.estimators.attainment import Histogram
from goodput.estimators.capacity import build_capacity_profile
from goodput.estimators.service_time import H100_80G, LLAMA_3_1_8B, StepCostModel

AT = datetime(2026, 3, 1, tzinfo=UTC)
PROFILE = build_capacity_profile(
    StepCostModel.from_hardware(LLAMA_3_1_8B, H100_80G, 1, 1),
    max_num_seqs=256,
    max_num_batched_tokens=8192,
    itl_target_seconds=0.08,
    ttft_target_seconds=1.0,
)


@pytest.mark.parametrize(
    ("replicas", "low", "high", "wanted"),
    [(3, 1, 8, 3), (0, 1, 8, 1), (12, 1, 8, 8), (5, 0, 4, 4), (0, 0, 4, 0)],
    ids=["within", "below the minimum", "above the maximum", "maximum lowered past replicas", "zero allowed"],
)
def test_replicas_converge_to_the_nearest_bound(replicas: int, low: int, high: int, wanted: int) -> None:
    assert wanted_groups(replicas, low, high) == wanted


def limited(status: str, reason: str) -> Condition:
    return Condition(
        type=ConditionType.SCALING_LIMITED, status=status, reason=reason, message="", last_transition_time=AT
    )  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("conditions", "expected"),
    [
        ((), False),
        ((limited("True", Reason.INSUFFICIENT_GPUS),), True),
        ((limited("True", Reason.DOMAINS_BACKED_OFF),), True),
        ((limited("False", Reason.INSUFFICIENT_GPUS),), False),
        ((limited("True", "AtMaxReplicas"),), False),
    ],
    ids=["no condition", "no GPUs", "domains backed off", "limit lifted", "a limit that is not placement"],
)
def test_unschedulable_only_while_a_placement_reason_limits_scaling(
    conditions: tuple[Condition, ...], expected: bool
) -> None:
    assert unplaceable(conditions) is expected


states = st.sampled_from(GROUP_STATES)


@given(
    observed=st.lists(states, max_size=8),
    wanted=st.integers(min_value=0, max_value=10),
    blocked=st.booleans(),
)
def test_groups_wanted_but_not_created_are_placing_capacity(
    observed: list[GroupState], wanted: int, blocked: bool
) -> None:
    groups = [GroupObservation(f"g{i}", state, 0.0) for i, state in enumerate(observed)]
    live = sum(1 for state in observed if state not in ("Draining", "Failed"))
    result = with_wanted_groups(groups, wanted, now=42.0, unschedulable=blocked)
    assert result[: len(groups)] == tuple(groups)
    added = result[len(groups) :]
    assert len(added) == max(0, wanted - live)
    assert all(g.state == "Placing" and g.unschedulable is blocked and g.created_at == 42.0 for g in added)


def obs(name: str, state: GroupState, created_at: float = 0.0) -> GroupObservation:
    return GroupObservation(name, state, created_at)


@pytest.mark.parametrize(
    ("groups", "outdated", "kept"),
    [
        ((obs("g0", "Ready"), obs("g1", "Placing")), set(), ["g0", "g1"]),
        (
            (obs("g0", "Ready"), obs("g1", "Ready"), obs("g2", "Warming")),
            {"g0", "g1"},
            ["g0", "g1"],
        ),
        (
            (obs("g0", "Ready"), obs("g2", "Ready"), obs("g3", "Placing", 5.0)),
            {"g0"},
            ["g0", "g2"],
        ),
        (
            (obs("g0", "Draining"), obs("g2", "Ready"), obs("g3", "Placing")),
            {"g0"},
            ["g0", "g2", "g3"],
        ),
        (
            (
                obs("g0", "Ready"),
                obs("g2", "Placing", 1.0),
                obs("g3", "Placing", 2.0),
            ),
            {"g0"},
            ["g0", "g2"],
        ),
    ],
    ids=[
        "no rollout: a coming group is capacity on its way",
        "surge group replacing an old ready group is not",
        "with a new group ready, the next replacement is not extra either",
        "an old group already draining is replaced by nothing coming",
        "only as many as old ready groups, the newest left out",
    ],
)
def test_a_rollouts_new_groups_are_not_counted_as_extra_capacity(
    groups: tuple[GroupObservation, ...], outdated: set[str], kept: list[str]
) -> None:
    assert [g.name for g in without_replacements(groups, frozenset(outdated))] == kept


# --- Engine figures and the snapshot assembly both worlds share ---------------------------------------


@pytest.mark.parametrize(
    ("figures", "expected"),
    [
        (
            GroupMetrics(
                age_seconds=-0.5, waiting_requests=-1e-9, running_requests=3.0, kv_usage_fraction=1.02
            ),
            {"age_seconds": 0.0, "waiting_requests": 0.0, "running_requests": 3.0, "kv_usage_fraction": 1.0},
        ),
        (
            GroupMetrics(1.0, 0.0, 0.0, -0.01, prefix_hits=11.0, prefix_queries=10.0, finished_requests=-0.2),
            {"kv_usage_fraction": 0.0, "prefix_hit_fraction": 1.0, "finished_requests": 0.0},
        ),
        (
            GroupMetrics(1.0, 0.0, 0.0, 0.5, prompt_tokens_sum=0.0, prompt_tokens_count=0.0),
            {"mean_input_tokens": None, "mean_output_tokens": None, "prefix_hit_fraction": 0.0},
        ),
        (
            GroupMetrics(2.0, 4.0, 1.0, 0.5, prompt_tokens_sum=3000.0, prompt_tokens_count=3.0),
            {"mean_input_tokens": 1000.0, "waiting_requests": 4.0},
        ),
        (
            GroupMetrics(
                1.0,
                0.0,
                1.0,
                0.5,
                prompt_tokens_sum=8.0,
                prompt_tokens_count=2.0,
                prompts_started=2.0,
                prompt_tokens_started=80_004.0,
            ),
            {"mean_input_tokens": 40_002.0, "unfinished_prompts": 0.0, "unfinished_prompt_tokens": 79_996.0},
        ),
        (
            GroupMetrics(
                1.0,
                0.0,
                1.0,
                0.5,
                prompt_tokens_sum=3000.0,
                prompt_tokens_count=3.0,
                prompts_started=1.0,
                prompt_tokens_started=500.0,
            ),
            {"mean_input_tokens": 500.0, "unfinished_prompts": 0.0, "unfinished_prompt_tokens": 0.0},
        ),
    ],
    ids=[
        "extrapolated below zero and usage above one",
        "more hits than queries and a negative increase",
        "nothing finished: unknown means, no hits",
        "a window of three prompts",
        "a long prompt begun and not finished",
        "more finished than begun",
    ],
)
def test_engine_figures_are_read_within_their_meaningful_range(
    figures: GroupMetrics, expected: dict[str, float | None]
) -> None:
    metrics = clamped(figures)
    assert {name: getattr(metrics, name) for name in expected} == expected


FIGURES = tuple(field.name for field in fields(GroupMetrics) if field.type == "float")


@given(
    st.lists(
        st.floats(min_value=-1e6, max_value=1e6, allow_nan=False),
        min_size=len(FIGURES),
        max_size=len(FIGURES),
    )
)
def test_engine_metrics_never_read_a_negative_count_or_a_fraction_outside_zero_to_one(
    values: list[float],
) -> None:
    metrics = clamped(GroupMetrics(**dict(zip(FIGURES, values, strict=True))))
    for name in (
        "age_seconds",
        "waiting_requests",
        "running_requests",
        "finished_requests",
        "aborted_requests",
        "unfinished_prompts",
        "unfinished_prompt_tokens",
    ):
        assert getattr(metrics, name) >= 0.0, name
    assert 0.0 <= metrics.kv_usage_fraction <= 1.0
    assert 0.0 <= metrics.prefix_hit_fraction <= 1.0


POLICY = ScalingPolicy(min_groups=1, max_groups=8, classes=(SloTargets("chat", 1.0, 0.08),))


def test_the_snapshot_counts_wanted_groups_leaves_out_replacements_and_judges_feasibility() -> None:
    fresh = GroupMetrics(
        age_seconds=1.0,
        prompt_tokens_per_second=100.0,
        prompt_tokens=Histogram((512.0, 4096.0, 65536.0), (90.0, 95.0, 100.0, 100.0)),
    )
    observed = [
        GroupObservation("old", "Ready", 0.0, metrics=fresh),
        GroupObservation("surge", "Placing", 5.0),
    ]
    counts = ModelGroupCounts(spec_replicas=3, min_replicas=1, max_replicas=8, outdated=frozenset({"old"}))
    snapshot = model_group_snapshot(
        observed, counts, profile=PROFILE, policy=POLICY, name="llama", metrics_window_seconds=120.0, now=9.0
    )
    assert [(g.name, g.state) for g in snapshot.groups] == [
        ("old", "Ready"),
        ("wanted-0", "Placing"),
        ("wanted-1", "Placing"),
    ]
    assert snapshot.spec_replicas == 3 and snapshot.metrics_window_seconds == 120.0
    (chat,) = snapshot.feasibility
    assert chat.class_name == "chat" and chat.infeasible_request_share is not None


def test_histograms_unlike_most_groups_are_dropped_and_only_theirs() -> None:
    common = Histogram((0.1, 1.0), (1.0, 2.0, 3.0))
    odd = Histogram((0.5,), (1.0, 3.0))
    groups = {
        "a": GroupMetrics(1.0, ttft=common, itl=common),
        "b": GroupMetrics(1.0, ttft=common, itl=odd),
        "c": GroupMetrics(1.0, ttft=odd, itl=common),
    }
    kept = aligned(groups)
    assert [kept[name].ttft for name in "abc"] == [common, common, None]
    assert [kept[name].itl for name in "abc"] == [common, None, common]
