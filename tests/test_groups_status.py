"""ModelGroup status from a plan: counts, conditions, and leaving other controllers' fields alone."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from goodput.api.base import wire_dict
from goodput.api.conditions import Condition, find_condition
from goodput.api.modelgroup import DrainRecord, ModelGroupStatus, ScalingDecision
from goodput.api.reasons import ConditionType, NoFitReason, Reason
from goodput.controllers.groups.model import Assessment, DomainBackoff, DrainEnded, Plan
from goodput.controllers.groups.observation import ContainerWaiting, PodView
from goodput.controllers.groups.placement import NoFit
from goodput.controllers.groups.status import (
    RECENT_DRAINS,
    drain_summary,
    invalid_spec_status,
    model_group_status,
    with_others_conditions,
)
from goodput.controllers.ownership import GROUP_STATUS

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
EARLIER = NOW - timedelta(minutes=5)


def assessment(name: str, state: str, **changes: Any) -> Assessment:
    base = Assessment(name=name, state=state, pods=(), domain="a", created_at=EARLIER)  # type: ignore[arg-type]
    return replace(base, **changes)


def status_of(
    *groups: Assessment,
    desired: int,
    limit: NoFit | None = None,
    previous: ModelGroupStatus | None = None,
    now: datetime = NOW,
) -> ModelGroupStatus:
    plan = Plan(annotations={}, groups=groups, placement_limit=limit)
    return model_group_status(
        previous or ModelGroupStatus(), name="llama", generation=3, desired_groups=desired, plan=plan, now=now
    )


def condition(status: ModelGroupStatus, kind: str) -> tuple[str, str]:
    found = find_condition(status.conditions, kind)
    assert found is not None, kind
    return found.status, found.reason


@pytest.mark.parametrize(
    ("groups", "desired", "ready", "progressing", "degraded"),
    [
        ((), 0, ("True", Reason.SCALED_TO_ZERO), ("False", Reason.STABLE), ("False", Reason.STABLE)),
        (
            (assessment("g0", "Ready"), assessment("g1", "Ready")),
            2,
            ("True", Reason.GROUPS_READY),
            ("False", Reason.STABLE),
            ("False", Reason.STABLE),
        ),
        (
            (assessment("g0", "Ready"), assessment("g1", "Warming")),
            2,
            ("False", Reason.GROUPS_NOT_READY),
            ("True", Reason.GROUPS_WARMING),
            ("False", Reason.STABLE),
        ),
        (
            (assessment("g0", "Provisioning"), assessment("g1", "Placing")),
            2,
            ("False", Reason.GROUPS_NOT_READY),
            ("True", Reason.GROUPS_PLACING),
            ("False", Reason.STABLE),
        ),
        (
            (
                assessment("g0", "Failed", reason=Reason.NCCL_UNHEALTHY, message="rank 1 lost NCCL health"),
                assessment("g1", "Placing", replaces="g0"),
            ),
            1,
            ("False", Reason.GROUPS_NOT_READY),
            ("True", Reason.GROUPS_PLACING),
            ("True", Reason.NCCL_UNHEALTHY),
        ),
        (
            (assessment("g1", "Warming", replaces="g0"),),
            1,
            ("False", Reason.GROUPS_NOT_READY),
            ("True", Reason.GROUPS_WARMING),
            ("True", Reason.GROUP_FAILED),
        ),
        (
            (assessment("g0", "Ready"), assessment("g1", "Draining")),
            1,
            ("True", Reason.GROUPS_READY),
            ("True", Reason.GROUPS_DRAINING),
            ("False", Reason.STABLE),
        ),
    ],
    ids=[
        "scaled to zero",
        "all ready",
        "one warming",
        "earliest phase wins",
        "failed and replacing",
        "replacement warming",
        "draining after scale-in",
    ],
)
def test_conditions_summarise_the_groups(
    groups: tuple[Assessment, ...],
    desired: int,
    ready: tuple[str, str],
    progressing: tuple[str, str],
    degraded: tuple[str, str],
) -> None:
    status = status_of(*groups, desired=desired)
    assert condition(status, ConditionType.READY) == ready
    assert condition(status, ConditionType.PROGRESSING) == progressing
    assert condition(status, ConditionType.DEGRADED) == degraded


def test_counts_replicas_and_selector() -> None:
    status = status_of(
        assessment("g0", "Ready"),
        assessment("g1", "Ready"),
        assessment("g2", "Warming"),
        assessment("g3", "Failed"),
        assessment("g4", "Draining"),
        desired=3,
    )
    assert (
        status.replicas,
        status.ready_groups,
        status.warming_groups,
        status.failed_groups,
        status.draining_groups,
        status.desired_groups,
    ) == (2, 2, 1, 1, 1, 3)
    assert status.label_selector == "goodput.dev/model-group=llama,goodput.dev/rank=0"
    assert status.observed_generation == 3
    assert [g.name for g in status.groups] == ["g0", "g1", "g2", "g3", "g4"]


def test_a_placement_limit_sets_scaling_limited_and_its_clearing_is_ours() -> None:
    limit = NoFit(NoFitReason.INSUFFICIENT_GPUS, "insufficient GPUs: a group needs 16 GPUs")
    limited = status_of(assessment("g0", "Ready"), desired=2, limit=limit)
    assert condition(limited, ConditionType.SCALING_LIMITED) == ("True", "InsufficientGPUs")
    cleared = status_of(assessment("g0", "Ready"), assessment("g1", "Ready"), desired=2, previous=limited)
    assert condition(cleared, ConditionType.SCALING_LIMITED) == ("False", Reason.DESIRED_WITHIN_RANGE)


def test_the_autoscalers_fields_pass_through() -> None:
    decision = ScalingDecision(
        time=EARLIER,
        from_replicas=1,
        to_replicas=2,
        reason=Reason.DESIRED_WITHIN_RANGE,
        signal="queueWork",
        policy_revision="r1",
        mode="Active",
    )
    theirs = Condition(
        type=ConditionType.DECISION_LIMITED,
        status="True",
        last_transition_time=EARLIER,
        reason=Reason.TOO_MANY_REPLICAS,
        message="clamped to maxReplicas",
    )
    previous = ModelGroupStatus(
        last_decision=decision, decisions=(decision,), autoscaler_state="{}", conditions=(theirs,)
    )
    status = status_of(assessment("g0", "Ready"), desired=1, previous=previous)
    assert status.last_decision == decision and status.decisions == (decision,)
    assert status.autoscaler_state == "{}"
    assert find_condition(status.conditions, ConditionType.DECISION_LIMITED) == theirs
    # What the group controller applies holds none of it: only its own fields and conditions.
    applied = GROUP_STATUS.apply_body("serving", "llama", status)["status"]
    assert not {"lastDecision", "decisions", "autoscalerState"} & applied.keys()
    assert {c["type"] for c in applied["conditions"]} == {
        ConditionType.READY,
        ConditionType.PROGRESSING,
        ConditionType.DEGRADED,
        ConditionType.SCALING_LIMITED,
    }


def test_an_unchanged_world_gives_an_equal_status() -> None:
    first = status_of(assessment("g0", "Ready"), desired=1)
    later = status_of(assessment("g0", "Ready"), desired=1, previous=first, now=NOW + timedelta(minutes=1))
    assert later == first


def test_transition_times_move_only_when_a_condition_flips() -> None:
    first = status_of(assessment("g0", "Warming"), desired=1)
    later = NOW + timedelta(minutes=1)
    second = status_of(assessment("g0", "Ready"), desired=1, previous=first, now=later)
    ready = find_condition(second.conditions, ConditionType.READY)
    degraded = find_condition(second.conditions, ConditionType.DEGRADED)
    assert ready is not None and ready.last_transition_time == later
    assert degraded is not None and degraded.last_transition_time == NOW


def test_invalid_spec_is_reported_on_ready_and_progressing() -> None:
    status = invalid_spec_status(
        ModelGroupStatus(),
        name="llama",
        generation=4,
        problems="spec.engine.image: 'Bad Image' is not a valid image reference",
        now=NOW,
    )
    assert condition(status, ConditionType.READY) == ("False", Reason.INVALID_SPEC)
    assert condition(status, ConditionType.PROGRESSING) == ("False", Reason.INVALID_SPEC)
    assert status.observed_generation == 4 and status.groups == ()


def test_a_backed_off_domain_keeps_scaling_limited_until_it_expires() -> None:
    backoff = DomainBackoff("clique-a", NOW + timedelta(minutes=5), "InsufficientGPUs")
    plan = Plan(annotations={}, groups=(assessment("g1", "Placing"),), backoffs=(backoff,))
    status = model_group_status(
        ModelGroupStatus(), name="llama", generation=1, desired_groups=1, plan=plan, now=NOW
    )
    limited = find_condition(status.conditions, ConditionType.SCALING_LIMITED)
    assert limited is not None and (limited.status, limited.reason) == ("True", "InsufficientGPUs")
    assert "clique-a" in limited.message
    later = status_of(assessment("g1", "Ready"), desired=1, previous=status)
    assert condition(later, ConditionType.SCALING_LIMITED) == ("False", Reason.DESIRED_WITHIN_RANGE)


# Drain totals.


def ended(
    group: str,
    outcome: str = "Drained",
    *,
    finished: int | None = 3,
    aborted: int | None = 0,
    at: datetime = NOW,
) -> DrainEnded:
    record = DrainRecord(
        group=group,
        outcome=outcome,  # type: ignore[arg-type]
        started_at=at - timedelta(seconds=20),
        ended_at=at,
        duration_seconds=20.0,
        requests_finished=finished,
        requests_aborted=aborted,
        on_timeout="Abort" if outcome == "TimedOut" else None,
    )
    return DrainEnded(record=record)


def test_ended_drains_are_added_to_the_totals_newest_first() -> None:
    first = drain_summary(None, [ended("g1")], cancelled=0)
    second = drain_summary(
        first, [ended("g2", "TimedOut", finished=1, aborted=4, at=NOW + timedelta(minutes=1))], cancelled=1
    )
    assert second is not None
    assert (second.drained, second.timed_out, second.cancelled) == (1, 1, 1)
    assert (second.requests_finished, second.requests_aborted) == (4, 4)
    assert [(r.group, r.outcome, r.requests_aborted) for r in second.recent] == [
        ("g2", "TimedOut", 4),
        ("g1", "Drained", 0),
    ]
    assert second.recent[0].on_timeout == "Abort" and second.recent[1].duration_seconds == 20.0


def test_a_drain_recorded_once_is_not_counted_again() -> None:
    once = drain_summary(None, [ended("g1")], cancelled=0)
    assert drain_summary(once, [ended("g1")], cancelled=0) == once


def test_no_drain_no_summary_and_no_change() -> None:
    assert drain_summary(None, [], cancelled=0) is None
    summary = drain_summary(None, [ended("g1")], cancelled=0)
    assert drain_summary(summary, [], cancelled=0) is summary


def test_an_unknown_abort_count_stays_unknown_in_the_record_and_out_of_the_totals() -> None:
    counted = drain_summary(None, [ended("g1", "TimedOut", finished=2, aborted=4)], cancelled=0)
    summary = drain_summary(
        counted,
        [ended("g2", "TimedOut", finished=None, aborted=None, at=NOW + timedelta(minutes=1))],
        cancelled=0,
    )
    assert summary is not None and summary.timed_out == 2
    unknown = summary.recent[0]
    assert (unknown.group, unknown.requests_finished, unknown.requests_aborted) == ("g2", None, None)
    assert "requestsAborted" not in wire_dict(unknown) and "requestsFinished" not in wire_dict(unknown)
    # The totals are what was counted, and say how many drains they leave out.
    assert (summary.requests_finished, summary.requests_aborted) == (2, 4)
    assert (summary.drains_with_unknown_finished, summary.drains_with_unknown_aborts) == (1, 1)


def test_a_drain_whose_counts_are_known_leaves_no_unknown_drain_in_the_totals() -> None:
    summary = drain_summary(None, [ended("g1", "TimedOut", finished=0, aborted=0)], cancelled=0)
    assert summary is not None and summary.recent[0].requests_aborted == 0
    assert wire_dict(summary)["recent"][0]["requestsAborted"] == 0
    assert (summary.drains_with_unknown_finished, summary.drains_with_unknown_aborts) == (0, 0)


def test_only_the_latest_drains_are_kept_but_every_one_is_counted() -> None:
    summary = None
    for index in range(RECENT_DRAINS + 3):
        summary = drain_summary(summary, [ended(f"g{index}", at=NOW + timedelta(minutes=index))], cancelled=0)
    assert summary is not None and summary.drained == RECENT_DRAINS + 3
    assert [r.group for r in summary.recent] == [f"g{i}" for i in range(RECENT_DRAINS + 2, 2, -1)]


def test_the_status_carries_the_drains_of_the_plan_and_earlier_unwritten_ones() -> None:
    plan = Plan(
        annotations={}, drains_ended=(ended("g2", at=NOW + timedelta(seconds=5)),), drains_cancelled=("g3",)
    )
    status = model_group_status(
        ModelGroupStatus(),
        name="llama",
        generation=3,
        desired_groups=1,
        plan=plan,
        now=NOW,
        unrecorded_drains=[ended("g1")],
    )
    assert status.drain is not None
    assert [r.group for r in status.drain.recent] == ["g2", "g1"] and status.drain.cancelled == 1


def test_a_drain_listed_twice_in_one_pass_is_counted_once() -> None:
    summary = drain_summary(None, [ended("g1"), ended("g1")], cancelled=0)
    assert summary is not None and summary.drained == 1 and len(summary.recent) == 1


def cond(kind: str, status: str, reason: str) -> Condition:
    return Condition(
        type=kind,
        status=status,
        reason=reason,
        message="m",
        last_transition_time=EARLIER,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("ours", "observed", "expected"),
    [
        pytest.param(
            [cond(ConditionType.READY, "True", Reason.GROUPS_READY)],
            [
                cond(ConditionType.READY, "False", Reason.GROUPS_NOT_READY),
                cond("MetricsAvailable", "False", "X"),
            ],
            {ConditionType.READY: "True", "MetricsAvailable": "False"},
            id="the autoscaler's condition written meanwhile is kept; our own stays ours",
        ),
        pytest.param(
            [cond(ConditionType.DECISION_LIMITED, "False", Reason.DESIRED_WITHIN_RANGE)],
            [cond(ConditionType.DECISION_LIMITED, "True", "TooManyReplicas")],
            {ConditionType.DECISION_LIMITED: "True"},
            id="a type the autoscaler owns is taken from what was observed",
        ),
        pytest.param(
            [cond(ConditionType.SCALING_LIMITED, "True", NoFitReason.INSUFFICIENT_GPUS.value)],
            [cond(ConditionType.SCALING_LIMITED, "False", Reason.DESIRED_WITHIN_RANGE)],
            {ConditionType.SCALING_LIMITED: "True"},
            id="our placement limit stays until the watch echoes it",
        ),
    ],
)
def test_building_on_our_unechoed_write_keeps_other_controllers_conditions(
    ours: list[Condition], observed: list[Condition], expected: dict[str, str]
) -> None:
    merged = with_others_conditions(ModelGroupStatus(conditions=ours), ModelGroupStatus(conditions=observed))
    assert {c.type: c.status for c in merged.conditions} == expected


def test_a_rank_whose_container_cannot_start_is_named_with_its_reason_and_field() -> None:
    def rank(index: int, waiting: ContainerWaiting | None) -> PodView:
        return PodView(
            name=f"llama-g0-{index}", model_group="llama", group="g0", rank=index, revision="r",
            created_at=EARLIER, deleting=False, phase="Pending", node_name="n", ip=None, gated=False,
            topology_domain="a", replaces=None, draining_since=None, gpus=8, restarts=0,
            containers_ready=None, scheduled=None, group_ready=None, nccl_healthy=None,
            reported_model_revision=None, waiting=waiting,
        )  # fmt: skip

    missing_secret = ContainerWaiting("CreateContainerConfigError", 'secret "hf-token" not found')
    blocked = assessment(
        "g0",
        "Provisioning",
        pods=(rank(0, ContainerWaiting("ContainerCreating", "")), rank(1, missing_secret)),
    )
    status = status_of(blocked, assessment("g1", "Ready"), desired=2)
    progressing = find_condition(status.conditions, ConditionType.PROGRESSING)
    assert progressing is not None
    assert (progressing.status, progressing.reason) == ("True", Reason.CONTAINERS_NOT_STARTING)
    assert progressing.message == (
        'group g0 rank 1 (llama-g0-1): CreateContainerConfigError: secret "hf-token" not found '
        "(check spec.engine.env[].valueFrom or spec.pod.volumes)"
    )
    # Containers that are merely being created are progress, not a problem.
    starting = assessment("g0", "Provisioning", pods=(rank(0, ContainerWaiting("ContainerCreating", "")),))
    assert condition(status_of(starting, desired=1), ConditionType.PROGRESSING) == (
        "True",
        Reason.GROUPS_PROVISIONING,
    )
