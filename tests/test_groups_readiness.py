"""Readiness that says what it waits for: which rank, which signal, which spec field, and an Event
once a group has waited a bounded time with every rank running."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import timedelta

import pytest
from test_groups import NOW, RULES, group, world

from goodput.api.modelgroup import ModelGroupStatus
from goodput.api.reasons import ConditionType, EventReason
from goodput.controllers.groups.controller import plan_model_group
from goodput.controllers.groups.model import WarmupOutcome
from goodput.controllers.groups.observation import ConditionView, ContainerWaiting, PodView
from goodput.controllers.groups.status import model_group_status


@dataclass(frozen=True)
class WaitCase:
    name: str
    stage: str
    changes: dict[str, object]
    expected: tuple[str, ...]


WAITS = [
    WaitCase(
        "no NCCL condition on any rank",
        "running",
        {},
        (
            "rank 0 (llama-70b-g0-0), rank 1 (llama-70b-g0-1) wait for pod condition "
            "goodput.dev/NCCLHealthy=True",
            "spec.readiness.ncclCheck: Required",
        ),
    ),
    WaitCase(
        "the agent could not run the check",
        "running",
        {
            "nccl_healthy": ConditionView(
                "Unknown",
                "NcclCheckNotRun",
                "not run: this container sees 8 GPUs but the pod was allocated 2",
                None,
            )
        },
        (
            "wait for pod condition goodput.dev/NCCLHealthy=True",
            "llama-70b-g0-0: NcclCheckNotRun: not run: this container sees 8 GPUs",
        ),
    ),
    WaitCase(
        "revision not reported",
        "healthy",
        {"reported_model_revision": None},
        ("wait for annotation goodput.dev/model-revision=main", "spec.readiness.revisionCheck: true"),
    ),
    WaitCase(
        "checks passed, warm-up pending",
        "healthy",
        {},
        ("rank 0 (llama-70b-g0-0) waits for a warm-up completion",),
    ),
]


@pytest.mark.parametrize("case", WAITS, ids=lambda case: case.name)
def test_a_warming_group_names_the_rank_and_the_signal_it_waits_for(case: WaitCase) -> None:
    plan = plan_model_group(
        world(group("g0", case.stage, **case.changes), desired=1, warmups_in_flight=frozenset({"g0"}))
    )
    (warming,) = plan.groups
    assert warming.state == "Warming"
    for part in case.expected:
        assert part in warming.message


def running_for(seconds: float) -> list[PodView]:
    """Ranks whose containers became ready `seconds` ago (the helper marks them 60 s after creation)."""
    return group("g0", "running", created=NOW - timedelta(seconds=60 + seconds))


@pytest.mark.parametrize(
    ("waited", "reported", "events"),
    [(59, False, 0), (60, False, 1), (600, False, 1), (600, True, 0)],
    ids=["not yet", "at the bound", "long after", "already reported"],
)
def test_a_group_waiting_past_the_bound_says_so_once(waited: float, reported: bool, events: int) -> None:
    plan = plan_model_group(
        world(running_for(waited), desired=1, readiness_reported=frozenset({"g0"} if reported else set()))
    )
    waits = [e for e in plan.events if e.reason == EventReason.READINESS_WAITING]
    assert len(waits) == events
    assert plan.readiness_reported == (("g0",) if events else ())
    if events:
        assert waits[0].type == "Warning"
        assert f"not ready {waited:.0f}s after every rank started" in waits[0].message
        assert "goodput.dev/NCCLHealthy=True" in waits[0].message


def test_a_group_that_becomes_ready_reports_no_wait() -> None:
    plan = plan_model_group(
        world(
            group("g0", "healthy", created=NOW - timedelta(seconds=200)),
            desired=1,
            warmups={"g0": WarmupOutcome(True, NOW)},
            rules=replace(RULES, readiness_report_seconds=0),
        )
    )
    assert [e.reason for e in plan.events] == [EventReason.GROUP_READY]


def test_the_progressing_condition_says_what_warming_groups_wait_for() -> None:
    plan = plan_model_group(world(running_for(5), desired=1))
    status = model_group_status(
        ModelGroupStatus(), name="llama", generation=1, desired_groups=1, plan=plan, now=NOW
    )
    (progressing,) = [c for c in status.conditions if c.type == ConditionType.PROGRESSING]
    assert progressing.message.startswith("1 warming; group g0: rank 0 (llama-70b-g0-0), rank 1")
    assert "goodput.dev/NCCLHealthy=True" in progressing.message


@pytest.mark.parametrize(
    ("waiting", "reported", "events"),
    [
        (ContainerWaiting("ImagePullBackOff", 'pull "vllm/vllm-openai:v9" failed'), False, 1),
        (ContainerWaiting("CreateContainerConfigError", 'secret "hf-token" not found'), False, 1),
        (ContainerWaiting("CreateContainerConfigError", 'secret "hf-token" not found'), True, 0),
        (ContainerWaiting("ContainerCreating", ""), False, 0),
    ],
    ids=["missing image", "missing secret", "already reported", "merely creating"],
)
def test_a_rank_that_cannot_start_is_an_event_naming_the_rank_and_the_field(
    waiting: ContainerWaiting, reported: bool, events: int
) -> None:
    pods = group("g0", "bound")
    stuck = [replace(pods[0], waiting=waiting), *pods[1:]]
    plan = plan_model_group(
        world(stuck, desired=1, readiness_reported=frozenset({"g0"} if reported else set()))
    )
    (provisioning,) = plan.groups
    assert provisioning.state == "Provisioning"
    problems = [e for e in plan.events if e.reason == EventReason.CONTAINERS_NOT_STARTING]
    assert len(problems) == events
    assert plan.readiness_reported == (("g0",) if events else ())
    if events:
        assert problems[0].type == "Warning"
        assert f"rank 0 ({pods[0].name}): {waiting.reason}: {waiting.message}" in problems[0].message
        assert f"(check {waiting.spec_field})" in problems[0].message
