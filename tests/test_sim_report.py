"""SLO verdicts per request and the report's denominators, goodput and cost."""

from __future__ import annotations

import math

import numpy as np
import pytest

from goodput.simulator.records import RequestExit
from goodput.simulator.report import ClassTargets, judge, meets_every_class, summarize
from goodput.simulator.simulation import SimulationResult
from goodput.simulator.workload import Workload

NAN = math.nan
CHAT = ClassTargets(
    "chat", ttft_seconds=1.0, itl_seconds=0.08, e2e_seconds=10.0, attainment=0.5, percentile=0.9
)

# name, outcome, arrival, first token, finished, output tokens, slow gaps, met
CASES = [
    ("within-every-target", RequestExit.FINISHED, 0.0, 0.5, 5.5, 101, 0, True),
    ("first-token-too-late", RequestExit.FINISHED, 0.0, 1.5, 2.0, 11, 0, False),
    ("tokens-too-slow-on-average", RequestExit.FINISHED, 0.0, 0.5, 2.5, 21, 0, False),
    ("lost-to-a-failed-group", RequestExit.FAILED, 0.0, 0.5, 1.0, 50, 0, False),
    ("rejected-without-a-ready-group", RequestExit.REJECTED_NO_CAPACITY, 0.0, NAN, 0.0, 50, 0, False),
    ("one-token-has-no-token-gaps", RequestExit.FINISHED, 0.0, 0.2, 0.2, 1, 0, True),
    ("over-the-completion-target", RequestExit.FINISHED, 0.0, 0.5, 12.5, 201, 0, False),
    (
        "stalls-do-not-fail-a-request-whose-mean-is-fine",
        RequestExit.FINISHED,
        0.0,
        0.5,
        5.5,
        101,
        20,
        True,
    ),
]


def result_of(
    cases: list[tuple[str, RequestExit, float, float, float, int, int, bool]], gpu_seconds: float = 7200.0
) -> SimulationResult:
    count = len(cases)
    workload = Workload(
        "cases",
        np.zeros(count),
        np.full(count, 100),
        np.array([c[5] for c in cases]),
        class_index=np.zeros(count, np.int64),
        class_names=("chat",),
    )
    outcome = np.array([c[1] for c in cases])
    requests = {
        "arrival": np.array([c[2] for c in cases]),
        "group": np.where(outcome == RequestExit.REJECTED_NO_CAPACITY, -1, 0),
        "routed_at": np.array([c[2] for c in cases]),
        "scheduled_at": np.array([c[2] for c in cases]),
        "first_token_at": np.array([c[3] for c in cases]),
        "finished_at": np.array([c[4] for c in cases]),
        "outcome": outcome,
        "preemptions": np.zeros(count, np.int64),
        "cached_tokens": np.zeros(count, np.int64),
        "slow_gaps": np.array([c[6] for c in cases]),
    }
    return SimulationResult(
        workload=workload,
        requests=requests,
        horizon_seconds=100.0,
        end_seconds=100.0,
        gpu_seconds=gpu_seconds,
        timeline=(),
        scale_events=(),
        decisions=0,
        groups=(),
        engine_totals={},
        wall_seconds=1.0,
        events_processed=0,
    )


@pytest.mark.parametrize("index", range(len(CASES)), ids=[c[0] for c in CASES])
def test_a_request_meets_its_slo_only_within_every_target(index: int) -> None:
    verdicts = judge(result_of(CASES), (CHAT,))
    assert bool(verdicts.met[index]) is CASES[index][7]


def test_the_report_keeps_offered_and_admitted_apart_and_prices_what_was_good() -> None:
    report = summarize(result_of(CASES), (CHAT,), gpu_hour_price=2.5, bin_seconds=50.0)
    assert report["offered_requests"] == 8
    assert report["admitted_requests"] == 7
    assert report["slo_met_requests"] == 3
    assert report["attainment_offered"] == pytest.approx(3 / 8)
    assert report["attainment_admitted"] == pytest.approx(3 / 7)
    assert report["rejected_requests"] == {"no_ready_group": 1, "too_long": 0}
    assert report["failed_requests"] == 1
    assert report["goodput_rps"] == pytest.approx(3 / 100.0)
    assert report["token_goodput_tps"] == pytest.approx((101 + 1 + 101) / 100.0)
    assert report["gpu_hours"] == pytest.approx(2.0)
    assert report["cost_per_slo_request"] == pytest.approx(2.0 * 2.5 / 3)
    assert report["goodput_per_gpu_hour"] == pytest.approx(1.5)
    chat = report["classes"]["chat"]
    # 20 slow gaps out of 100 + 10 + 20 + 0 + 200 + 100 token gaps of finished requests
    assert chat["token_gaps_within_itl_target_fraction"] == pytest.approx(1 - 20 / 430)
    assert chat["percentile_target_met"] is False
    assert chat["attainment_target_met"] is False  # 3/8 < 0.5


def test_a_run_without_any_slo_met_has_no_cost_per_request() -> None:
    failing = [("late", RequestExit.FINISHED, 0.0, 5.0, 6.0, 10, 0, False)]
    report = summarize(result_of(failing), (CHAT,))
    assert report["slo_met_requests"] == 0
    assert report["cost_per_slo_request"] is None


def test_every_class_must_reach_its_attainment_target() -> None:
    assert meets_every_class(result_of(CASES[:1] + CASES[5:6]), (CHAT,))
    assert not meets_every_class(result_of(CASES), (CHAT,))
