"""The demo's account of a run: which requests attained the SLO, the timeline per interval, group
lifecycles and drains, GPU-hours, and the summary's claims, from hand-made observations."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from goodput.testbed.demo_report import (
    BACK_IN_SERVICE,
    DRAIN_TIMED_OUT,
    DRAINED,
    DRAINING,
    NOT_SENT,
    STILL_DRAINING,
    DecisionRecord,
    GroupEvent,
    ModelGroupSample,
    RequestRecord,
    SloTargets,
    StatusGroup,
    advice_changes,
    count_changes,
    decision_records,
    drain_records,
    fleet_sample,
    gpu_hours,
    group_events,
    group_histories,
    merge_decisions,
    plot_timeline,
    render_summary,
    render_timeline,
    report_dict,
    summarize,
    timeline,
)

CHAT = SloTargets("chat", ttft_seconds=1.0, itl_seconds=0.05, attainment=0.99)
START = datetime(2026, 12, 2, 15, 0, 0, tzinfo=UTC)


def ok(
    offset: float, ttft: float = 0.2, tpot: float | None = 0.01, host: str | None = "10.1.0.5"
) -> RequestRecord:
    return RequestRecord(
        offset, "ok", ttft_seconds=ttft, tpot_seconds=tpot, e2e_seconds=2.0, target_host=host
    )


def sample(
    offset: float, desired: int, groups: dict[str, str], addresses: dict[str, str] | None = None
) -> ModelGroupSample:
    observed = tuple(StatusGroup(name, state, (addresses or {}).get(name)) for name, state in groups.items())
    return ModelGroupSample(
        offset_seconds=offset,
        desired_groups=desired,
        ready_groups=sum(1 for state in groups.values() if state == "Ready"),
        coming_groups=sum(1 for state in groups.values() if state in ("Placing", "Provisioning", "Warming")),
        draining_groups=sum(1 for state in groups.values() if state == "Draining"),
        groups=observed,
    )


def decision(offset: float, before: int, after: int, signal: str = "queueWork") -> DecisionRecord:
    return DecisionRecord(offset, before, after, reason="DesiredWithinRange", signal=signal)


# ------------------------------------------------------------------------------------ attainment
@dataclass(frozen=True)
class AttainCase:
    name: str
    request: RequestRecord
    targets: SloTargets
    attained: bool


ATTAIN_CASES = [
    AttainCase("fast-and-smooth", ok(0, ttft=0.3, tpot=0.02), CHAT, True),
    AttainCase("ttft-at-the-target", ok(0, ttft=1.0, tpot=0.02), CHAT, True),
    AttainCase("first-token-late", ok(0, ttft=1.2, tpot=0.02), CHAT, False),
    AttainCase("tokens-too-slow", ok(0, ttft=0.3, tpot=0.08), CHAT, False),
    AttainCase("one-token-has-no-tpot", ok(0, ttft=0.3, tpot=None), CHAT, True),
    AttainCase("stream-cut", RequestRecord(0, "cut", ttft_seconds=0.1, target_host="h"), CHAT, False),
    AttainCase("never-sent", RequestRecord(0, NOT_SENT), CHAT, False),
    AttainCase("over-the-completion-target", ok(0), SloTargets("c", 1.0, 0.05, e2e_seconds=1.5), False),
    AttainCase("within-the-completion-target", ok(0), SloTargets("c", 1.0, 0.05, e2e_seconds=3.0), True),
]


@pytest.mark.parametrize("case", ATTAIN_CASES, ids=[case.name for case in ATTAIN_CASES])
def test_a_request_attains_only_when_it_completed_within_every_target(case: AttainCase) -> None:
    assert case.request.attained(case.targets) is case.attained


@pytest.mark.parametrize(
    ("outcome", "lost"),
    [
        ("ok", False),
        (NOT_SENT, False),
        ("rejected", False),
        ("cut", True),
        ("aborted", True),
        ("timeout", True),
        ("http_error", True),
    ],
)
def test_only_requests_that_were_sent_and_did_not_complete_failed(outcome: str, lost: bool) -> None:
    assert RequestRecord(0.0, outcome).failed is lost


# ------------------------------------------------------------------------------------ parsing
def entry(clock: str, before: int, after: int, signal: str) -> dict[str, Any]:
    """A decision as the status records it."""
    return {
        "time": f"2026-12-02T{clock}Z",
        "fromReplicas": before,
        "toReplicas": after,
        "reason": "DesiredWithinRange",
        "signal": signal,
        "policyRevision": "demo-1",
        "mode": "Active",
    }


def model_group_object() -> dict[str, Any]:
    return {
        "spec": {"replicas": 3},
        "status": {
            "readyGroups": 1,
            "placingGroups": 0,
            "provisioningGroups": 1,
            "warmingGroups": 0,
            "drainingGroups": 1,
            "groups": [
                {"name": "g0", "state": "Ready", "readyTime": {"totalSeconds": 9.5}},
                {"name": "g1", "state": "Provisioning"},
                {"name": "g2", "state": "Draining"},
            ],
            "lastDecision": entry("15:00:42", 2, 3, "slack")
            | {
                "proposals": [
                    {"signal": "queueWork", "replicas": 2, "detail": "Q_work=3s"},
                    {"signal": "slack", "replicas": 3, "detail": "earliest slack -0.4s"},
                ],
                "guards": ["ComingCapacity"],
            },
            "decisions": [entry("15:00:42", 2, 3, "slack"), entry("15:00:20", 1, 2, "queueWork")],
            "shadowDecision": entry("15:00:42", 2, 4, "kvCache") | {"shadow": True, "mode": "Advisory"},
        },
    }


def test_a_sample_counts_the_groups_by_state_and_knows_each_leaders_address() -> None:
    found = fleet_sample(model_group_object(), {"g0": "10.1.0.5", "g2": "10.1.1.7"}, 12.5)

    assert (found.desired_groups, found.ready_groups, found.coming_groups, found.draining_groups) == (
        3,
        1,
        1,
        1,
    )
    assert found.held_groups == 3
    assert [(g.name, g.state, g.leader_address, g.ready_seconds) for g in found.groups] == [
        ("g0", "Ready", "10.1.0.5", 9.5),
        ("g1", "Provisioning", None, None),
        ("g2", "Draining", "10.1.1.7", None),
    ]


def test_decisions_are_timed_from_the_start_with_the_winners_detail_and_the_shadow_left_out() -> None:
    records = merge_decisions(decision_records(model_group_object(), START))

    assert [(r.offset_seconds, r.from_groups, r.to_groups, r.signal) for r in records] == [
        (20.0, 1, 2, "queueWork"),
        (42.0, 2, 3, "slack"),
    ]
    latest = records[-1]
    assert latest.detail == "earliest slack -0.4s" and latest.guards == ("ComingCapacity",)
    assert latest.describe() == "2→3 (slack, DesiredWithinRange)"


def test_each_decision_is_kept_once_however_many_polls_saw_it() -> None:
    polls = [decision_records(model_group_object(), START) for _ in range(3)]
    assert len(merge_decisions(record for poll in polls for record in poll)) == 2


def event(clock: str, reason: str, message: str) -> dict[str, Any]:
    return {"eventTime": f"2026-12-02T{clock}Z", "reason": reason, "message": message}


def test_the_operators_events_say_when_each_group_drained_and_how_it_ended() -> None:
    events = [
        event(
            "15:01:10.250000",
            "DrainFinished",
            "group g1 drained in 1.2s: 1 request(s) finished during the drain",
        ),
        event("15:01:09.000000", "DrainStarted", "group g1 draining for scale-in: the cheapest ready group"),
        event("15:01:20.000000", "GroupDeleted", "group g4 (placing) deleted for scale-in"),
        event("15:01:30.000000", "DrainTimedOut", "group g2 drain timed out after 60s: 3 request(s) aborted"),
        event("15:01:31.000000", "DrainCancelled", "group g3 back in service after 2.0s of draining"),
        event("15:01:32.000000", "GroupReady", "group g5 ready in 9.6s (placing 0.0s, ...)"),
        event("15:01:33.000000", "SuccessfulRescale", "New size: 2 (from 3)"),
        event("14:50:00.000000", "DrainStarted", "group g1 draining for scale-in"),  # an earlier demo's
    ]

    found = group_events(events, START, since=START - timedelta(seconds=5))

    assert found == (
        GroupEvent(69.0, "g1", DRAINING),
        GroupEvent(70.25, "g1", DRAINED),
        GroupEvent(90.0, "g2", DRAIN_TIMED_OUT),
        GroupEvent(91.0, "g3", BACK_IN_SERVICE),
    )


# ------------------------------------------------------------------------------------ groups and drains
def burst_samples() -> list[ModelGroupSample]:
    """g0 serves throughout; g1 is added for a burst and drained; g2 starts draining and is put back."""
    addresses = {"g0": "10.1.0.5", "g1": "10.1.0.6", "g2": "10.1.0.7"}
    return [
        sample(-1, 1, {"g0": "Ready"}, addresses),
        sample(10, 3, {"g0": "Ready", "g1": "Provisioning", "g2": "Provisioning"}, addresses),
        sample(20, 3, {"g0": "Ready", "g1": "Ready", "g2": "Ready"}, addresses),
        sample(40, 2, {"g0": "Ready", "g1": "Draining", "g2": "Draining"}, addresses),
        sample(45, 2, {"g0": "Ready", "g1": "Draining", "g2": "Ready"}, addresses),
        sample(50, 1, {"g0": "Ready", "g2": "Ready"}, addresses),
    ]


def test_group_histories_follow_each_group_from_creation_to_its_end() -> None:
    histories = {h.name: h for h in group_histories(burst_samples())}

    g0, g1 = histories["g0"], histories["g1"]
    assert (g0.first_seen, g0.ready_at, g0.gone_at) == (-1, -1, None)
    assert (g1.first_seen, g1.ready_at, g1.gone_at) == (10, 20, 50)
    assert g1.leader_address == "10.1.0.6"


G1_DRAIN = (GroupEvent(40.5, "g1", DRAINING), GroupEvent(49.5, "g1", DRAINED))


def test_a_drain_counts_the_requests_its_leader_lost_and_nobody_elses() -> None:
    requests = [
        ok(15, host="10.1.0.6"),
        ok(41, host="10.1.0.6"),
        RequestRecord(42, "cut", ttft_seconds=0.1, target_host="10.1.0.6"),
        RequestRecord(43, "timeout", target_host="10.1.0.5"),  # another group's loss
        RequestRecord(70, "cut", target_host="10.1.0.6"),  # the address reused after g1 was gone
    ]

    (drain,) = drain_records(G1_DRAIN, group_histories(burst_samples()), requests)

    assert (drain.group, drain.started_at, drain.ended_at, drain.drain_seconds) == ("g1", 40.5, 49.5, 9.0)
    assert (drain.ending, drain.requests_served, drain.requests_lost) == (DRAINED, 3, 1)


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        (G1_DRAIN, [("g1", DRAINED)]),
        ((G1_DRAIN[0], GroupEvent(100.5, "g1", DRAIN_TIMED_OUT)), [("g1", DRAIN_TIMED_OUT)]),
        (G1_DRAIN[:1], [("g1", STILL_DRAINING)]),
        ((G1_DRAIN[0], GroupEvent(42, "g1", BACK_IN_SERVICE)), []),
        ((GroupEvent(49.5, "g1", DRAINED),), []),
        (
            (*G1_DRAIN, GroupEvent(50, "g2", DRAINING), GroupEvent(50.2, "g2", DRAINED)),
            [("g1", DRAINED), ("g2", DRAINED)],
        ),
    ],
    ids=["drained", "timed-out", "still-draining", "back-in-service", "end-without-start", "two-drains"],
)
def test_a_drain_is_what_the_events_say_from_its_start_to_its_end(
    events: tuple[GroupEvent, ...], expected: list[tuple[str, str]]
) -> None:
    drains = drain_records(events, group_histories(burst_samples()), [])
    assert [(d.group, d.ending) for d in drains] == expected


# ------------------------------------------------------------------------------------ timeline
def test_the_timeline_puts_each_request_in_the_interval_that_offered_it() -> None:
    requests = [ok(1), ok(2, ttft=1.5), RequestRecord(3, NOT_SENT), ok(12), ok(13), ok(14, ttft=0.9)]
    decisions = [
        decision(5, 1, 3),
        DecisionRecord(8, 3, 3, "ScaleDownStabilized", "current"),
        decision(15, 3, 2),
    ]

    rows = timeline(requests, burst_samples(), decisions, CHAT, interval_seconds=10, end_seconds=20)

    assert [(r.start_seconds, r.end_seconds, r.offered, r.attained) for r in rows] == [
        (0, 10, 3, 1),
        (10, 20, 3, 3),
    ]
    assert rows[0].attainment_offered == pytest.approx(1 / 3)
    assert rows[0].offered_per_second == pytest.approx(0.3)
    assert rows[0].ttft_p99_seconds == pytest.approx(1.5, abs=0.02)
    assert [d.describe() for d in rows[0].decisions] == ["1→3 (queueWork, DesiredWithinRange)"], (
        "holds are left out"
    )
    # The counts are those at the interval's end.
    assert (rows[0].desired_groups, rows[0].ready_groups) == (3, 1)
    assert (rows[1].desired_groups, rows[1].ready_groups) == (3, 3)


def test_the_last_interval_is_cut_at_the_end_of_the_run() -> None:
    rows = timeline([ok(1), ok(24)], burst_samples(), [], CHAT, interval_seconds=10, end_seconds=25)
    assert [(r.start_seconds, r.end_seconds, r.offered) for r in rows] == [
        (0, 10, 1),
        (10, 20, 0),
        (20, 25, 1),
    ]
    assert rows[1].attainment_offered is None and rows[1].ttft_p99_seconds is None
    assert rows[2].offered_per_second == pytest.approx(0.2)


def test_gpu_hours_hold_each_sampled_fleet_until_the_next_sample() -> None:
    # From 0 (the sample before the start covers it): 1 group for 10 s, 3 for 40 s, then 2 for 10 s.
    expected = (10 * 1 + 40 * 3 + 10 * 2) * 8 / 3600
    assert gpu_hours(burst_samples(), 8, end_seconds=60) == pytest.approx(expected)


@given(
    held=st.lists(st.integers(min_value=0, max_value=6), min_size=1, max_size=20),
    gaps=st.lists(st.floats(min_value=0.1, max_value=30), min_size=20, max_size=20),
    end=st.floats(min_value=1, max_value=500),
)
def test_gpu_hours_lie_between_the_smallest_and_the_largest_fleet_held(
    held: list[int], gaps: list[float], end: float
) -> None:
    offsets = [-0.5]
    for gap in gaps[: len(held) - 1]:
        offsets.append(offsets[-1] + gap)
    samples = [ModelGroupSample(t, n, n, 0, 0, tuple(StatusGroup(f"g{i}", "Ready") for i in range(n)))
               for t, n in zip(offsets, held, strict=True)]  # fmt: skip
    within = [s.held_groups for s in samples if s.offset_seconds < end]
    total = gpu_hours(samples, 2, end_seconds=end)
    assert min(within) * 2 * end / 3600 - 1e-9 <= total <= max(within) * 2 * end / 3600 + 1e-9


@given(
    offsets=st.lists(st.floats(min_value=0, max_value=99.9), max_size=60),
    outcomes=st.lists(st.sampled_from(["ok", "ok", "cut", NOT_SENT]), min_size=60, max_size=60),
    interval=st.sampled_from([1.0, 5.0, 7.0, 10.0]),
)
def test_the_timeline_accounts_for_every_request_once_and_never_beats_the_admitted_view(
    offsets: list[float], outcomes: list[str], interval: float
) -> None:
    requests = [RequestRecord(t, outcome, ttft_seconds=0.5 if outcome == "ok" else None)
                for t, outcome in zip(offsets, outcomes, strict=False)]  # fmt: skip
    rows = timeline(requests, [], [], CHAT, interval_seconds=interval, end_seconds=100)
    assert sum(row.offered for row in rows) == len(requests)
    assert sum(row.attained for row in rows) == sum(1 for r in requests if r.attained(CHAT))
    summary = summarize(requests, [], [], CHAT, drains=(), histories=(), gpus_per_group=1, end_seconds=100)
    if summary.attainment_offered is not None and summary.attainment_admitted is not None:
        assert summary.attainment_offered <= summary.attainment_admitted


# ------------------------------------------------------------------------------------ summary
def run_summary() -> tuple[Any, ...]:
    samples = burst_samples()
    histories = group_histories(samples)
    requests = [ok(1), ok(5, ttft=1.4), RequestRecord(6, NOT_SENT), ok(15, host="10.1.0.6"),
                RequestRecord(42, "cut", ttft_seconds=0.1, target_host="10.1.0.6"), ok(55)]  # fmt: skip
    decisions = merge_decisions([decision(5, 1, 3), decision(35, 3, 2), decision(48, 2, 1)])
    drains = drain_records(G1_DRAIN, histories, requests)
    summary = summarize(
        requests,
        samples,
        decisions,
        CHAT,
        drains=drains,
        histories=histories,
        gpus_per_group=1,
        end_seconds=60,
    )
    return summary, requests, samples, decisions, histories


def test_the_summary_counts_scaling_drains_losses_and_attainment_against_offered_load() -> None:
    summary, *_ = run_summary()

    assert (summary.offered, summary.sent, summary.completed, summary.not_sent) == (6, 5, 4, 1)
    assert summary.failed == 1 and summary.failed_by_outcome["cut"] == 1
    assert summary.attained == 3
    assert summary.attainment_offered == pytest.approx(3 / 6)
    assert summary.attainment_admitted == pytest.approx(3 / 5)
    assert [d.to_groups for d in summary.scale_outs] == [3]
    assert [d.to_groups for d in summary.scale_ins] == [2, 1]
    assert (summary.drained_scale_ins, summary.lost_on_drained_groups) == (1, 1)
    assert summary.peak_groups == 3
    assert summary.fixed_peak_gpu_hours == pytest.approx(3 * 60 / 3600)
    assert summary.gpu_hours < summary.fixed_peak_gpu_hours
    assert summary.new_group_ready_seconds == (), "no ready time was reported for the new groups"


def test_the_text_and_the_json_carry_the_same_claims() -> None:
    summary, requests, samples, decisions, histories = run_summary()
    rows = timeline(requests, samples, decisions, CHAT, interval_seconds=10, end_seconds=60)

    text = render_summary(summary, CHAT, title="demo")
    table = render_timeline(rows, CHAT)
    document = report_dict(
        scenario={"model_group": "llama-8b"}, rows=rows, summary=summary, decisions=decisions,
        histories=histories, samples=samples, load={"planned": 6},
    )  # fmt: skip

    assert "attainment against offered load: 50.0%" in text and "against admitted: 60.0%" in text
    assert "failed 1 (cut 1), not sent 1" in text
    assert "scale-outs: 1: 1→3 (queueWork, DesiredWithinRange) at 5 s" in text
    assert "drained scale-ins: 1 of 1 drains ended with no request in flight" in text
    assert "requests lost on draining groups: 1\n    g1 drained in 9.0 s (2 served, 1 lost)" in text
    assert len(table.splitlines()) == 2 + len(rows) and "1→3 (queueWork" in table.splitlines()[2]
    assert document["summary"]["drained_scale_ins"] == 1
    assert document["summary"]["lost_on_drained_groups"] == 1
    assert document["summary"]["drains"][0]["drain_seconds"] == pytest.approx(9.0)
    assert [row["offered"] for row in document["timeline"]] == [row.offered for row in rows]


def test_another_autoscalers_changes_are_read_from_the_wanted_count_between_samples() -> None:
    changes = count_changes(burst_samples(), "keda")
    assert [(c.offset_seconds, c.from_groups, c.to_groups) for c in changes] == [
        (10, 1, 3),
        (40, 3, 2),
        (50, 2, 1),
    ]
    assert changes[0].describe() == "1→3 (keda)"
    assert count_changes(burst_samples()[:1], "hpa") == ()


def test_advice_repeated_tick_after_tick_is_listed_once_per_change_of_recommendation() -> None:
    advised = [decision(5, 1, 2), decision(10, 1, 2), decision(15, 1, 3), decision(20, 1, 1),
               decision(25, 1, 3), decision(30, 4, 3), decision(35, 4, 3)]  # fmt: skip
    kept = advice_changes(advised)
    assert [(d.offset_seconds, d.from_groups, d.to_groups) for d in kept] == [
        (5, 1, 2), (15, 1, 3), (25, 1, 3), (30, 4, 3),
    ]  # fmt: skip


def test_with_another_autoscaler_the_summary_counts_its_changes_and_lists_goodputs_advice_apart() -> None:
    samples = burst_samples()
    advised = advice_changes([decision(5, 1, 2), decision(10, 1, 2), decision(40, 3, 2, "queueWork")])
    summary = summarize(
        [ok(1)], samples, count_changes(samples, "hpa"), CHAT, drains=(), histories=group_histories(samples),
        gpus_per_group=1, end_seconds=60, advice=advised,
    )  # fmt: skip
    assert [(d.from_groups, d.to_groups) for d in summary.scale_outs] == [(1, 3)]
    assert [(d.from_groups, d.to_groups) for d in summary.scale_ins] == [(3, 2), (2, 1)]
    text = render_summary(summary, CHAT, title="demo")
    assert "scale-outs: 1: 1→3 (hpa) at 10 s" in text
    assert (
        "goodput's advice (Advisory: recorded, not applied): 1→2 (queueWork, DesiredWithinRange) at 5 s, "
        "3→2 (queueWork, DesiredWithinRange) at 40 s"
    ) in text
    assert [d["to_groups"] for d in summary.as_dict()["advice"]] == [2, 2]
    # goodput's own run has no advice line.
    assert "advice" not in render_summary(run_summary()[0], CHAT, title="demo")


def test_the_plots_are_written_as_non_empty_pngs(tmp_path: Path) -> None:
    _, requests, samples, decisions, _ = run_summary()
    rows = timeline(requests, samples, decisions, CHAT, interval_seconds=10, end_seconds=60)

    paths = plot_timeline(rows, samples, decisions, CHAT, title="llama-8b", out_dir=tmp_path / "out")

    assert [path.name for path in paths] == ["groups.png", "latency.png"]
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_decision_offsets_use_the_start_given() -> None:
    later = START + timedelta(seconds=30)
    records = decision_records(model_group_object(), later)
    assert min(r.offset_seconds for r in records) == pytest.approx(-10.0)


# ------------------------------------------------------------------------------------ through a gateway
def through_gateway() -> list[RequestRecord]:
    """Requests as the gateway answered them: all sent to its address, the serving group named."""

    def served(
        offset: float, tenant: str, group: str, outcome: str = "ok", ttft: float = 0.2
    ) -> RequestRecord:
        return RequestRecord(
            offset, outcome, ttft_seconds=ttft, tpot_seconds=0.01, e2e_seconds=2.0,
            target_host="127.0.0.1", tenant=tenant, group=group,
        )  # fmt: skip

    return [
        served(1, "team-a", "g0"),
        served(2, "team-b", "g0"),
        RequestRecord(3, "rejected", target_host="127.0.0.1", tenant="team-b"),
        RequestRecord(4, "rejected", target_host="127.0.0.1", tenant="team-b"),
        served(12, "team-a", "g1", ttft=1.5),
        served(41, "team-b", "g1", outcome="cut"),
        served(42, "team-a", "g0", outcome="cut"),
        RequestRecord(44, NOT_SENT, tenant="team-a"),
    ]


def test_through_a_gateway_each_tenant_has_its_offered_refused_and_attained_per_interval() -> None:
    rows = timeline(through_gateway(), burst_samples(), [], CHAT, interval_seconds=10, end_seconds=50)

    first = {f.tenant: (f.offered, f.rejected, f.attained) for f in rows[0].tenants}
    assert first == {"team-a": (1, 0, 1), "team-b": (3, 2, 1)}
    assert rows[0].rejected == 2
    assert {f.tenant: (f.offered, f.attained) for f in rows[1].tenants} == {"team-a": (1, 0)}
    assert rows[2].tenants == () and rows[2].offered == 0
    table = render_timeline(rows, CHAT)
    assert "team-a: offered/s rejected attained" in table and "team-b: offered/s" in table


def test_a_refusal_is_neither_a_failure_nor_admitted_and_each_tenant_is_judged_apart() -> None:
    requests = through_gateway()
    samples = burst_samples()
    summary = summarize(
        requests, samples, [], CHAT, drains=[], histories=group_histories(samples),
        gpus_per_group=1, end_seconds=60,
    )  # fmt: skip

    assert (summary.sent, summary.rejected, summary.failed) == (7, 2, 2)
    assert summary.attainment_admitted == pytest.approx(2 / 5)
    tenants = {f.tenant: f for f in summary.tenants}
    assert (tenants["team-a"].offered, tenants["team-a"].rejected) == (4, 0)
    assert tenants["team-a"].attainment_offered == pytest.approx(1 / 4)
    assert tenants["team-b"].attainment_admitted == pytest.approx(1 / 2)
    text = render_summary(summary, CHAT, title="demo")
    assert "2 of 7 sent refused by admission" in text
    assert "team-b: offered 4, rejected 2, attainment against offered 25.0%, against admitted 50.0%" in text
    document = summary.as_dict()
    assert [t["tenant"] for t in document["tenants"]] == ["team-a", "team-b"]
    assert document["tenants"][1]["attainment_admitted"] == pytest.approx(1 / 2)


def test_through_a_gateway_a_drain_counts_what_the_gateway_says_its_group_served() -> None:
    """All requests go to the gateway's address, so only the group it names can tie them to a drain."""
    (drain,) = drain_records(G1_DRAIN, group_histories(burst_samples()), through_gateway())

    assert (drain.group, drain.requests_served, drain.requests_lost) == ("g1", 2, 1)
