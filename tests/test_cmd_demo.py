"""`goodput demo`'s pure parts: the burst made from a trace, the requests the report judges, and
the demo's manifests (read and checked before any cluster is started)."""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from goodput.api.labels import LABEL_MODEL_GROUP, LABEL_RANK, LEADER_RANK
from goodput.api.modelgroup import ModelGroup
from goodput.api.slopolicy import SloPolicy
from goodput.simulator.workload import Workload
from goodput.testbed import demo
from goodput.testbed.demo import (
    DemoError,
    Phase,
    add_arguments,
    assign_tenants,
    burst_phases,
    count_by_tenant,
    phased_workload,
    read_manifests,
    request_records,
)
from goodput.testbed.demo_report import NOT_SENT
from goodput.testbed.loadgen import PlannedRequest, RequestResult

ROOT = Path(__file__).resolve().parent.parent
DEMO_MANIFESTS = ROOT / "manifests" / "demo"


def steady_trace(rate_per_second: float, seconds: float) -> Workload:
    """A trace with evenly spaced arrivals and request i of length i (to follow requests through)."""
    count = int(rate_per_second * seconds)
    return Workload(
        name="steady",
        arrival_seconds=np.arange(count) / rate_per_second,
        input_tokens=np.arange(1, count + 1, dtype=np.int64),
        output_tokens=np.full(count, 16, dtype=np.int64),
        notes=("steady test trace",),
    )


def per_phase_counts(workload: Workload, phases: tuple[Phase, ...]) -> list[int]:
    edges = np.cumsum([0.0, *(phase.seconds for phase in phases)])
    return [int(np.count_nonzero((workload.arrival_seconds >= a) & (workload.arrival_seconds < b)))
            for a, b in itertools.pairwise(edges)]  # fmt: skip


# ------------------------------------------------------------------------------------ the burst
def test_the_burst_steps_the_rate_up_and_back_down_by_whole_multipliers_exactly() -> None:
    phases = burst_phases(30, 20, 40, base=1.0, burst=3.0)

    workload = phased_workload(steady_trace(5, 200), phases, seed=1)

    assert [phase.name for phase in phases] == ["steady", "burst", "after"]
    assert per_phase_counts(workload, phases) == [150, 300, 200]
    assert workload.arrival_seconds.max() < 90
    assert np.all(np.diff(workload.arrival_seconds) >= 0), "arrivals stay in order across phases"
    assert "steady 30 s at x1, then burst 20 s at x3, then after 40 s at x1" in workload.notes[-1]
    assert workload.notes[0] == "steady test trace", "the trace's own notes are kept"


def test_the_replay_starts_where_asked_in_the_trace() -> None:
    trace = steady_trace(2, 100)
    phases = (Phase("only", 10, 1.0),)

    workload = phased_workload(trace, phases, seed=0, start_seconds=50)

    # Requests 100..119 of the trace (lengths 101..120), on a clock restarted at 50 s.
    assert workload.input_tokens.tolist() == list(range(101, 121))
    assert workload.arrival_seconds[0] == pytest.approx(0.0)


@settings(max_examples=40, deadline=None)
@given(
    base=st.floats(min_value=0.1, max_value=1.0),
    burst=st.floats(min_value=1.0, max_value=4.0),
    seed=st.integers(min_value=0, max_value=1000),
)
def test_a_burst_phase_offers_about_its_multiplier_times_the_trace(
    base: float, burst: float, seed: int
) -> None:
    phases = burst_phases(60, 60, 60, base=base, burst=burst)
    steady, spike, after = per_phase_counts(phased_workload(steady_trace(10, 200), phases, seed), phases)
    for count, multiplier in ((steady, base), (spike, burst), (after, base)):
        expected = 600 * multiplier
        assert abs(count - expected) <= 5 * np.sqrt(expected) + 2  # binomial thinning, far tails excluded


@pytest.mark.parametrize(
    ("seconds", "names"),
    [((60, 75, 105), ["steady", "burst", "after"]), ((0, 30, 30), ["burst", "after"])],
    ids=["full-story", "no-steady-start"],
)
def test_phases_of_no_length_are_left_out(seconds: tuple[float, float, float], names: list[str]) -> None:
    assert [p.name for p in burst_phases(*seconds, base=0.3, burst=1.0)] == names


@pytest.mark.parametrize(
    ("before", "base", "burst"),
    [(-1, 0.3, 1.0), (60, 0.0, 1.0), (60, 0.3, -2.0)],
    ids=["negative", "zero", "burst"],
)
def test_a_phase_needs_a_length_and_a_positive_multiplier(before: float, base: float, burst: float) -> None:
    with pytest.raises(ValueError, match="phase"):
        burst_phases(before, 30, 30, base, burst)


# ------------------------------------------------------------------------------------ what the client saw
def test_every_planned_request_gets_one_record_with_its_tpot_and_target() -> None:
    plan = [PlannedRequest(i, float(i), 100, 11) for i in range(4)]
    results = [
        RequestResult(
            0, "http://10.7.0.4:8000", 0.0, 0.0, ttft_seconds=0.2, e2e_seconds=1.2, completion_tokens=11
        ),
        RequestResult(
            1, "http://10.7.1.4:8000", 1.0, 1.0, outcome="cut", ttft_seconds=0.3, completion_tokens=4
        ),
        RequestResult(
            3, "http://10.7.0.4:8000", 3.0, 3.0, ttft_seconds=0.2, e2e_seconds=0.2, completion_tokens=1
        ),
    ]

    records = request_records(plan, results)

    assert [(r.offset_seconds, r.outcome, r.target_host) for r in records] == [
        (0.0, "ok", "10.7.0.4"),
        (1.0, "cut", "10.7.1.4"),
        (2.0, NOT_SENT, None),
        (3.0, "ok", "10.7.0.4"),
    ]
    assert records[0].tpot_seconds == pytest.approx(0.1)
    assert records[1].tpot_seconds is None, "a cut stream has no meaningful TPOT"
    assert records[3].tpot_seconds is None, "one token has no gap"


# ------------------------------------------------------------------------------------ manifests
def test_the_reader_returns_what_the_manifests_say(tmp_path: Path) -> None:
    """The demo reads its names, shape and targets from the files, whatever they are."""
    for path in DEMO_MANIFESTS.glob("*.yaml"):
        text = path.read_text().replace("llama-8b", "qwen-7b").replace("name: chat", "name: talk")
        text = text.replace("ttftSeconds: 1.0", "ttftSeconds: 2.5").replace("tensor: 1", "tensor: 2")
        (tmp_path / path.name).write_text(text)

    objects = read_manifests(tmp_path)

    assert (objects.model_group, objects.service, objects.policy) == ("qwen-7b", "qwen-7b", "demo")
    assert objects.gpus_per_group == 2
    assert (objects.targets.class_name, objects.targets.ttft_seconds) == ("talk", 2.5)
    assert objects.files == tuple(sorted(tmp_path.glob("*.yaml")))


def test_the_demo_manifests_fit_the_story_of_the_default_run() -> None:
    """A burst that can add groups, a Service over the ModelGroup's leaders, and policy windows short
    enough that the scale-out and the drained scale-in both happen within the default load."""
    objects = read_manifests(DEMO_MANIFESTS)
    documents = {
        doc["kind"]: doc for path in objects.files for doc in yaml.safe_load_all(path.read_text()) if doc
    }
    model_group = ModelGroup.model_validate(documents["ModelGroup"])
    policy = SloPolicy.model_validate(documents["SLOPolicy"])
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([])

    selector = documents["Service"]["spec"]["selector"]
    assert selector == {LABEL_MODEL_GROUP: objects.model_group, LABEL_RANK: LEADER_RANK}
    assert model_group.spec.max_replicas > objects.min_groups, "the burst must be able to add groups"
    autoscaling = policy.spec.autoscaling
    assert policy.spec.goodput.window_seconds < args.burst_seconds
    assert autoscaling.scale_down.stabilization_window_seconds < args.after_seconds
    assert model_group.spec.drain.min_lifetime_seconds < args.burst_seconds + args.after_seconds


def test_manifests_without_a_service_are_refused_before_anything_starts(tmp_path: Path) -> None:
    for name in ("modelgroup-demo.yaml", "slopolicy-demo.yaml"):
        shutil.copy(DEMO_MANIFESTS / name, tmp_path / name)
    with pytest.raises(DemoError, match="one ModelGroup, one SLOPolicy and one Service"):
        read_manifests(tmp_path)


def test_a_model_group_bound_to_another_policy_is_refused(tmp_path: Path) -> None:
    for path in DEMO_MANIFESTS.glob("*.yaml"):
        text = path.read_text()
        (tmp_path / path.name).write_text(
            text.replace("name: demo\n", "name: other\n") if "SLOPolicy" in text else text
        )
    with pytest.raises(DemoError, match="bound to its SLOPolicy other"):
        read_manifests(tmp_path)


def test_the_defaults_tell_a_story_of_a_few_minutes() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([])

    load_seconds = args.before_seconds + args.burst_seconds + args.after_seconds
    assert 120 <= load_seconds <= 300
    assert args.burst_rate_multiplier > 2 * args.rate_multiplier, "the burst must need more groups"
    assert not args.keep, "by default the demo stops the cluster it started"


def test_a_policy_without_two_tenants_is_refused_the_demo_needs_a_steady_and_a_bursting_one(
    tmp_path: Path,
) -> None:
    for path in DEMO_MANIFESTS.glob("*.yaml"):
        document = yaml.safe_load(path.read_text())
        if document["kind"] == "SLOPolicy":
            document["spec"]["fairness"]["tenants"] = document["spec"]["fairness"]["tenants"][:1]
        (tmp_path / path.name).write_text(yaml.safe_dump(document))
    with pytest.raises(DemoError, match=r"two tenants in spec\.fairness\.tenants"):
        read_manifests(tmp_path)


# ------------------------------------------------------------------------------------ tenants
def test_the_steady_tenant_keeps_half_the_steady_rate_and_the_burst_is_the_other_tenants() -> None:
    phases = burst_phases(100.0, 100.0, 100.0, 1.0, 4.0)
    # 20/s, then 80/s in the burst, then 20/s again: the rates a phased plan offers.
    times = [*np.arange(0, 100, 0.05), *np.arange(100, 200, 0.0125), *np.arange(200, 300, 0.05)]
    plan = [PlannedRequest(i, float(t), 10, 10) for i, t in enumerate(times)]

    assigned = assign_tenants(plan, phases, ("steady", "bursty"), seed=7)

    def count(tenant: str, start: float, end: float) -> int:
        return sum(1 for r in assigned if r.tenant == tenant and start <= r.send_at_seconds < end)

    for start in (0, 100, 200):  # the steady tenant sends about 10/s throughout
        assert count("steady", start, start + 100) == pytest.approx(1000, rel=0.1), start
    assert count("bursty", 0, 100) == pytest.approx(1000, rel=0.1)
    assert count("bursty", 100, 200) == pytest.approx(7000, rel=0.05), "the whole burst is bursty's"
    assert [r.index for r in assigned] == list(range(len(plan))), "the plan itself is unchanged"
    assert assign_tenants(plan, phases, ("steady", "bursty"), seed=7) == assigned


def test_the_gateways_own_counts_are_read_per_tenant_and_outcome() -> None:
    text = """# HELP goodput_gateway_requests_offered_total Requests offered.
# TYPE goodput_gateway_requests_offered_total counter
goodput_gateway_requests_offered_total{slo_class="chat",tenant="a"} 7.0
goodput_gateway_requests_offered_total{slo_class="batch",tenant="a"} 2.0
goodput_gateway_requests_offered_total{slo_class="chat",tenant="b"} 9.0
# HELP goodput_gateway_requests_total Requests by admission outcome.
# TYPE goodput_gateway_requests_total counter
goodput_gateway_requests_total{slo_class="chat",tenant="a",outcome="admitted",reason="Fits"} 9.0
goodput_gateway_requests_total{slo_class="chat",tenant="b",outcome="admitted",reason="Fits"} 4.0
goodput_gateway_requests_total{slo_class="chat",tenant="b",outcome="rejected",reason="Budget"} 3.0
goodput_gateway_requests_total{slo_class="chat",tenant="b",outcome="rejected",reason="Deadline"} 2.0
"""
    assert count_by_tenant(text) == {
        "a": {"offered": 9, "admitted": 9},
        "b": {"offered": 9, "admitted": 4, "rejected": 5},
    }


def _interrupted() -> int:
    raise KeyboardInterrupt


def _terminated() -> int:
    os.kill(os.getpid(), signal.SIGTERM)  # as `kill` or a CI runner would stop the demo
    return 0


def _failed() -> int:
    raise DemoError("no ready group")


OUTCOMES = [
    pytest.param(_interrupted, (demo.INTERRUPTED, "interrupted"), id="ctrl-c"),
    pytest.param(_terminated, (demo.INTERRUPTED, "interrupted"), id="sigterm"),
    pytest.param(_failed, (1, "no ready group"), id="failure"),
    pytest.param(lambda: 0, (0, None), id="success"),
]


@pytest.mark.parametrize(("run", "expected"), OUTCOMES)
def test_a_run_reports_how_it_ended_and_undoes_what_it_started(
    monkeypatch: pytest.MonkeyPatch, run: Callable[[], int], expected: tuple[int, str | None]
) -> None:
    undone: list[str] = []

    class Started:
        def __init__(self, args: argparse.Namespace, cleanup: contextlib.ExitStack, say: object) -> None:
            cleanup.callback(undone.append, "cluster stopped")

        def run(self) -> int:
            return run()

    monkeypatch.setattr(demo, "Demo", Started)
    handler = signal.getsignal(signal.SIGTERM)
    assert demo.run_reporting(argparse.Namespace()) == expected
    assert undone == ["cluster stopped"]
    assert signal.getsignal(signal.SIGTERM) is handler  # SIGTERM is ours only while a run lasts
