"""The gateway's request path in the simulator: the controllers' gates, fair queue and routing between
the workload and the simulated groups, its counts in the report, and its figures in the snapshot the
goodput policy decides on."""

from __future__ import annotations

import math
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from goodput.api.reasons import AdmissionReason
from goodput.api.slopolicy import SloPolicy
from goodput.controllers.compile.request_path import RequestPathPolicy, compile_request_path
from goodput.operator.metrics_source import gateway_from_result
from goodput.operator.promql import GATEWAY_CLASS_LABEL, QUERY_LABEL, QueryQuantity
from goodput.simulator.baselines import FixedFleet
from goodput.simulator.config import SimulationSetup, build_setup
from goodput.simulator.envelope import CapacityEnvelope
from goodput.simulator.fair_bench import FairBench, outcome_record
from goodput.simulator.fleet import FleetConfig
from goodput.simulator.fleet_policy import FleetObservation
from goodput.simulator.gateway import (
    ADMISSION_NAMES,
    GatewaySample,
    GatewayTreatment,
    SimGateway,
    gateway_observation,
)
from goodput.simulator.gateway_bench import (
    as_one_tenant,
    fleet_requests_per_second,
    poisson_workload,
    run_fixed_fleet,
    tenant_figures,
)
from goodput.simulator.goodput_policy import GoodputPolicy, snapshot_from
from goodput.simulator.metrics import FleetSample, MetricsView
from goodput.simulator.records import RequestExit
from goodput.simulator.report import judge, summarize
from goodput.simulator.runner import Bench, RunOptions, request_path_for
from goodput.simulator.simulation import SimulationConfig, SimulationResult, simulate
from goodput.simulator.workload import Workload

SAMPLES = Path(__file__).resolve().parents[1] / "manifests" / "samples"


@cache
def setup() -> SimulationSetup:
    return build_setup(
        SAMPLES / "modelgroup-llama-8b-tp1.yaml",
        SAMPLES / "slopolicy-interactive.yaml",
        step_noise_sigma=0.04,
    )


@cache
def policy() -> RequestPathPolicy:
    return request_path_for(setup())


def classes() -> tuple[str, ...]:
    return tuple(c.name for c in setup().classes)


@cache
def overload_runs() -> tuple[Workload, SimulationResult, SimulationResult]:
    """One group at 3x its capacity for 40 s, without and with the gateway."""
    seconds = 40.0
    rate = 3 * fleet_requests_per_second(policy(), 1)
    workload = poisson_workload({"a": rate / 2, "b": rate / 2}, seconds, 3, classes())
    without = run_fixed_fleet(setup(), workload, 1, None, horizon_seconds=seconds, seed=3)
    with_gateway = run_fixed_fleet(setup(), workload, 1, policy(), horizon_seconds=seconds, seed=3)
    return workload, without, with_gateway


def test_under_overload_the_gateway_refuses_some_and_the_admitted_meet_their_slo_far_more_often() -> None:
    workload, without, with_gateway = overload_runs()
    met_without, met_with = judge(without, setup().classes).met, judge(with_gateway, setup().classes).met
    sent_without = without.requests["group"] >= 0
    sent_with = with_gateway.requests["group"] >= 0
    refused = with_gateway.requests["outcome"] == RequestExit.REJECTED_ADMISSION
    assert refused.sum() > 0
    assert not (without.requests["outcome"] == RequestExit.REJECTED_ADMISSION).any()
    attained_with = met_with[sent_with].mean()
    attained_without = met_without[sent_without].mean()
    assert attained_with >= 0.8
    assert attained_with > attained_without + 0.3
    # The first goal, in small: more SLO-meeting requests per second on the same fleet.
    assert met_with.sum() >= 2 * met_without.sum()
    assert len(workload) == len(refused)


def test_every_offered_request_has_exactly_one_outcome_at_the_door_and_the_report_adds_up() -> None:
    workload, _, with_gateway = overload_runs()
    admission = with_gateway.requests["admission"]
    assert set(np.unique(admission).tolist()) <= set(ADMISSION_NAMES)
    report = summarize(with_gateway, setup().classes)
    gateway = report["gateway"]
    outcomes = tuple(ADMISSION_NAMES.values())
    assert gateway["offered"] == len(workload) == report["offered_requests"]
    assert sum(gateway[name] for name in outcomes) == gateway["offered"]
    assert report["rejected_requests"]["admission"] == gateway["rejected"] + gateway["hold_expired"]
    for entry in gateway["classes"].values():
        assert sum(entry[name] for name in outcomes) == entry["offered"]
        tenants = entry["tenants"].values()
        for name in (*outcomes, "offered", "slo_met", "infeasible"):
            assert sum(tenant[name] for tenant in tenants) == entry[name]
    assert sum(entry["offered"] for entry in gateway["classes"].values()) == gateway["offered"]
    assert gateway["slo_met"] == report["slo_met_requests"]
    # Requests refused at the door never reached a group; those that proceeded and were not
    # refused later did.
    refused = np.isin(admission, [GatewayTreatment.REJECTED, GatewayTreatment.HOLD_EXPIRED])
    assert (with_gateway.requests["group"][refused] == -1).all()
    assert report["attainment_offered"] == pytest.approx(report["slo_met_requests"] / len(workload))


def test_without_the_gateway_a_run_has_no_gateway_figures_and_the_engines_answer_logs_change_nothing() -> (
    None
):
    workload, without, _ = overload_runs()
    assert "admission" not in without.requests
    report = summarize(without, setup().classes)
    assert "gateway" not in report
    assert set(report["rejected_requests"]) == {"no_ready_group", "too_long"}
    assert without.backlogged_cost_by_tenant is None
    again = run_fixed_fleet(setup(), workload, 1, None, horizon_seconds=40.0, seed=3)
    for column, values in without.requests.items():
        np.testing.assert_array_equal(values, again.requests[column], err_msg=column)


def test_fair_queueing_keeps_a_light_tenant_near_its_attainment_alone_where_fcfs_does_not() -> None:
    seconds = 40.0
    light = 0.4 * fleet_requests_per_second(policy(), 1)
    both = poisson_workload({"light": light, "heavy": 10 * light}, seconds, 5, classes())
    alone = poisson_workload({"light": light}, seconds, 5, classes())
    base = tenant_figures(
        run_fixed_fleet(setup(), alone, 1, policy(), horizon_seconds=seconds, seed=5), setup(), alone
    ).attainment("light")
    fair = tenant_figures(
        run_fixed_fleet(setup(), both, 1, policy(), horizon_seconds=seconds, seed=5), setup(), both
    )
    fcfs = tenant_figures(
        run_fixed_fleet(setup(), as_one_tenant(both), 1, policy(), horizon_seconds=seconds, seed=5),
        setup(),
        both,
    )
    assert fair.attainment("light") >= 0.9 * base
    assert fcfs.attainment("light") < 0.7 * base
    assert fair.jain_while_backlogged is not None and fair.jain_while_backlogged >= 0.95
    assert fcfs.jain_while_backlogged is None  # one tenant: nobody to be fair to


# --- the gateway alone ----------------------------------------------------------------------------


def small_workload(count: int, prompt_tokens: int = 512, output_tokens: int = 64) -> Workload:
    return Workload(
        name="small",
        arrival_seconds=np.zeros(count),
        input_tokens=np.full(count, prompt_tokens),
        output_tokens=np.full(count, output_tokens),
        class_index=np.zeros(count, np.int64),
        class_names=classes(),
    )


def test_with_no_ready_group_a_request_is_held_and_goes_to_the_first_group_that_serves() -> None:
    gateway = SimGateway(policy(), small_workload(1))
    hold_until = gateway.arrive(0, 0.0, [])
    assert hold_until is not None and hold_until > 0.0
    assert gateway.admission[0] == GatewayTreatment.DEFERRED
    assert gateway.reason[0] == AdmissionReason.NO_READY_GROUP.value
    assert gateway.pump(1.0, []) == []
    sample = gateway.sample(1.0, [])
    assert sample.classes[0].waiting_requests == 1 and sample.routable_groups == 0
    sent = gateway.pump(2.0, [7])
    assert [(d.index, d.group) for d in sent] == [(0, 7)]
    assert not gateway.expire(0, hold_until)  # dispatched: its hold no longer matters


def test_a_held_request_no_group_takes_in_time_leaves_with_its_hold_expired() -> None:
    gateway = SimGateway(policy(), small_workload(1))
    hold_until = gateway.arrive(0, 0.0, [])
    assert hold_until is not None
    assert gateway.expire(0, hold_until)
    assert gateway.admission[0] == GatewayTreatment.HOLD_EXPIRED
    assert gateway.pump(hold_until + 1, [0]) == []
    assert not gateway.holds_requests()


def test_a_prompt_beyond_the_context_is_refused_at_the_door_and_counted_offered_and_rejected() -> None:
    gateway = SimGateway(policy(), small_workload(1, prompt_tokens=policy().admission.context_tokens + 10))
    assert gateway.arrive(0, 0.0, [0]) is None
    assert gateway.admission[0] == GatewayTreatment.REJECTED
    assert gateway.reason[0] == AdmissionReason.BEYOND_CONTEXT.value
    chat = gateway.sample(0.0, [0]).classes[0]
    assert (chat.offered, chat.admitted, chat.rejected) == (1, 0, 1)


def test_slots_free_only_as_answers_come_back() -> None:
    limit = policy().max_in_flight_per_group
    count = limit + 5
    gateway = SimGateway(policy(), small_workload(count, prompt_tokens=16, output_tokens=8))
    sent = []
    for index in range(count):
        assert gateway.arrive(index, 0.0, [0]) is not None
        sent += gateway.pump(0.0, [0])
        for dispatch in sent[len(sent) - 1 :] if sent else []:
            gateway.started(dispatch.index)  # tiny prompts start at once
    assert len(sent) == limit
    first = sent[0].index
    gateway.finished(first, 0.0, 0.1, 0.5)
    assert [d.index for d in gateway.pump(0.5, [0])] == [limit]
    chat = gateway.sample(0.5, [0]).classes[0]
    assert chat.attaining == 1 and chat.missed == 0
    assert chat.waiting_requests == count - limit - 1


# --- what the autoscaler reads ----------------------------------------------------------------------


def as_prometheus_answer(
    sample: GatewaySample,
    earlier: GatewaySample,
    age_seconds: float,
    recent: tuple[float, GatewaySample, float] | None = None,
) -> list[dict[str, Any]]:
    """The gateway's series as the operator's snapshot query answers them: gauges of the latest
    scrape, counters' increases and bucket increases over the window, and, given `recent` (the first
    sample inside the recent window, its time, the latest's time), the offered requests' rate."""

    def series(quantity: QueryQuantity, value: float, **labels: str) -> dict[str, Any]:
        return {"metric": {QUERY_LABEL: quantity.value, **labels}, "value": [0, str(value)]}

    answer = [
        series(QueryQuantity.GATEWAY_SAMPLE_AGE, age_seconds),
        series(QueryQuantity.GATEWAY_RUNNING_REQUESTS, sample.running_requests),
        series(QueryQuantity.GATEWAY_RUNNING_WORK, sample.running_work_seconds),
        series(QueryQuantity.GATEWAY_ROUTABLE_GROUPS, sample.routable_groups),
    ]
    before = {entry.class_name: entry for entry in earlier.classes}
    for entry in sample.classes:
        start = before[entry.class_name]
        label = {GATEWAY_CLASS_LABEL: entry.class_name}
        slack = math.inf if entry.earliest_slack_seconds is None else entry.earliest_slack_seconds
        answer += [
            series(QueryQuantity.GATEWAY_QUEUED_REQUESTS, entry.waiting_requests, **label),
            series(QueryQuantity.GATEWAY_QUEUED_WORK, entry.waiting_work_seconds, **label),
            series(QueryQuantity.GATEWAY_QUEUED_PROMPT_TOKENS, entry.waiting_prompt_tokens, **label),
            series(QueryQuantity.GATEWAY_EARLIEST_SLACK, slack, **label),
            series(QueryQuantity.GATEWAY_ADMITTED, entry.admitted - start.admitted, **label),
            series(QueryQuantity.GATEWAY_REJECTED, entry.rejected - start.rejected, **label),
            series(QueryQuantity.GATEWAY_INFEASIBLE, entry.infeasible - start.infeasible, **label),
            series(QueryQuantity.GATEWAY_ATTAINING, entry.attaining - start.attaining, **label),
            series(QueryQuantity.GATEWAY_MISSED, entry.missed - start.missed, **label),
        ]
        if recent is not None:
            first_time, first, latest_time = recent
            offered = {e.class_name: e.offered for e in first.classes}.get(entry.class_name, 0)
            rate = (entry.offered - offered) / (latest_time - first_time)
            answer.append(series(QueryQuantity.GATEWAY_OFFERED_RECENT, rate, **label))
        bounds = (*entry.ttft.upper_bounds, math.inf)
        for bound, later, first in zip(
            bounds, entry.ttft.cumulative_counts, start.ttft.cumulative_counts, strict=True
        ):
            le = "+Inf" if bound == math.inf else repr(bound)
            answer.append(series(QueryQuantity.GATEWAY_TTFT_BUCKETS, later - first, **label, le=le))
    return answer


def gateway_samples(seconds: float, every_seconds: float) -> list[tuple[float, GatewaySample]]:
    """A busy gateway's scrapes: arrivals every 50 ms on two groups, answers 2 s after dispatch."""
    count = int(seconds / 0.05)
    workload = Workload(
        name="steady",
        arrival_seconds=np.arange(count) * 0.05,
        input_tokens=np.full(count, 900),
        output_tokens=np.full(count, 120),
        class_index=np.zeros(count, np.int64),
        class_names=classes(),
    )
    gateway = SimGateway(policy(), workload)
    samples, answers, next_scrape = [], [], 0.0
    for index, at in enumerate(workload.arrival_seconds.tolist()):
        while answers and answers[0][0] <= at:
            done, sent = answers.pop(0)
            gateway.started(sent)
            gateway.finished(sent, workload.arrival_seconds[sent], done - 1.9, done)
        if at >= next_scrape:
            samples.append((at, gateway.sample(at, [0, 1])))
            next_scrape += every_seconds
        gateway.arrive(index, at, [0, 1])
        answers += [(at + 2.0, d.index) for d in gateway.pump(at, [0, 1])]
    return samples


def test_the_simulators_gateway_view_is_the_one_the_operator_parses_from_prometheus() -> None:
    samples = gateway_samples(90.0, 5.0)
    window, recent_window, now = 60.0, 20.0, samples[-1][0] + 7.0
    simulated = gateway_observation(samples, now, window, recent_window)
    latest_time, latest = samples[-1]
    earlier = next(sample for time, sample in samples if time >= latest_time - window - 1e-9)
    first_time, first = next(pair for pair in samples if pair[0] >= latest_time - recent_window - 1e-9)
    parsed = gateway_from_result(
        as_prometheus_answer(latest, earlier, now - latest_time, (first_time, first, latest_time))
    )
    assert simulated is not None and parsed is not None
    assert simulated.age_seconds == pytest.approx(parsed.age_seconds)
    assert simulated.running_requests == parsed.running_requests > 0
    assert simulated.routable_groups == parsed.routable_groups == 2
    for mine, theirs in zip(simulated.classes, parsed.classes, strict=True):
        assert mine.class_name == theirs.class_name
        for name in (
            "waiting_requests",
            "waiting_work_seconds",
            "offered_requests",
            "admitted_requests",
            "rejected_requests",
            "attaining_requests",
            "missed_requests",
            "recent_offered_per_second",
        ):
            assert getattr(mine, name) == pytest.approx(getattr(theirs, name)), name
        assert (
            mine.earliest_slack_seconds == theirs.earliest_slack_seconds
            or mine.earliest_slack_seconds == (pytest.approx(theirs.earliest_slack_seconds))
        )
        assert (mine.ttft is None) == (theirs.ttft is None)
        if mine.ttft is not None and theirs.ttft is not None:
            assert mine.ttft.cumulative_counts == pytest.approx(theirs.ttft.cumulative_counts)
    chat = simulated.figures_for("chat")
    assert chat is not None and chat.offered_requests > 0 and chat.attaining_requests > 0
    # arrivals every 50 ms: 20 a second over the recent window
    assert chat.recent_offered_per_second == pytest.approx(20.0, rel=0.05)


@settings(max_examples=25, deadline=None)
@given(window=st.floats(5.0, 80.0), every=st.sampled_from([1.0, 5.0, 15.0]))
def test_counter_increases_over_a_window_never_exceed_what_the_counters_hold(
    window: float, every: float
) -> None:
    samples = gateway_samples(40.0, every)
    observed = gateway_observation(samples, samples[-1][0], window)
    assert observed is not None
    latest = {entry.class_name: entry for entry in samples[-1][1].classes}
    for figures in observed.classes:
        total = latest[figures.class_name]
        assert 0 <= figures.offered_requests <= total.offered
        assert figures.offered_requests == pytest.approx(
            figures.admitted_requests + figures.rejected_requests
        )
        assert 0 <= figures.attaining_requests <= total.attaining


def test_the_goodput_policys_snapshot_carries_the_gateways_figures_only_when_there_is_a_gateway() -> None:
    samples = gateway_samples(30.0, 5.0)
    with_gateway = tuple(FleetSample(time, (), sample) for time, sample in samples)
    without = tuple(FleetSample(time, ()) for time, _ in samples)
    decider = GoodputPolicy.for_setup(setup(), small_workload(4), None)

    def snapshot(history: tuple[FleetSample, ...]) -> Any:
        observation = FleetObservation(
            now=history[-1].time + 5.0,
            desired_groups=2,
            placing_groups=0,
            provisioning_groups=0,
            ready_groups=2,
            draining_groups=0,
            min_groups=1,
            max_groups=4,
            metrics=MetricsView(history[-1].time, history),
        )
        return snapshot_from(
            observation, decider.profile, decider.metrics_window_seconds, "m", policy=decider.policy
        )

    assert snapshot(without).gateway is None
    fronted = snapshot(with_gateway).gateway
    assert fronted is not None
    assert fronted.waiting_requests == samples[-1][1].classes[0].waiting_requests
    assert fronted.age_seconds == pytest.approx(5.0)


def test_goodput_bench_with_the_gateway_needs_both_manifests() -> None:
    bare = build_setup(None, None)
    with pytest.raises(ValueError, match="--gateway needs --modelgroup and --policy"):
        Bench(bare, RunOptions(trace="synthetic:rate=1,duration=30", gateway=True))


def test_the_fair_bench_runs_behind_the_gateway_only_when_asked_and_counts_what_it_refused() -> None:
    workload, _, _ = overload_runs()
    capacity = policy().capacity_work_seconds_per_second
    envelope = CapacityEnvelope(capacity, fleet_requests_per_second(policy(), 1), 0.99, 0)
    records = {}
    for name, path in (("plain", None), ("gateway", policy())):
        bench = FairBench(setup(), workload, measured_envelope=envelope, request_path=path)
        outcome = bench.run(bench.test, bench.test_feasibility, FixedFleet(1), bench.test_seconds)
        records[name] = (outcome, outcome_record(outcome))
    plain, plain_record = records["plain"]
    fronted, fronted_record = records["gateway"]
    assert plain.refused is None and "refused" not in plain_record
    assert fronted.refused is not None and fronted.refused > 0
    assert fronted_record["refused"] == fronted.refused
    assert fronted.met > plain.met


def degrading_policy() -> RequestPathPolicy:
    """The sample request path with the chat class's overload action set to Degrade."""
    document = yaml.safe_load((SAMPLES / "slopolicy-interactive.yaml").read_text())
    document["spec"]["classes"][0]["overloadAction"] = "Degrade"
    model_group = setup().model_group
    assert model_group is not None
    compiled = compile_request_path(model_group, SloPolicy.model_validate(document))
    assert isinstance(compiled, RequestPathPolicy)
    return compiled


def test_degraded_requests_are_served_and_best_effort_ones_never_count_as_attaining() -> None:
    workload, _, _ = overload_runs()
    result = run_fixed_fleet(setup(), workload, 1, degrading_policy(), horizon_seconds=40.0, seed=3)
    requests = result.requests
    degraded = requests["admission"] == GatewayTreatment.DEGRADED
    best_effort = requests["best_effort"]
    assert degraded.sum() > 0
    assert not (requests["admission"] == GatewayTreatment.REJECTED).any()  # Degrade serves instead
    # Best effort queues behind every request admitted on time: it is served, or its hold expires.
    expired = requests["admission"] == GatewayTreatment.HOLD_EXPIRED
    assert (best_effort <= (degraded | expired)).all()
    assert (requests["group"][degraded] >= 0).all()
    assert (requests["served_output_tokens"] <= workload.output_tokens).all()
    met = judge(result, setup().classes).met
    assert not met[best_effort].any()
    report = summarize(result, setup().classes)
    assert report["gateway"]["degraded"] == int(degraded.sum())


def test_from_zero_groups_the_gateways_held_queue_wakes_the_pool_and_is_served() -> None:
    """No group at the start and minReplicas 0: engines report nothing, so only the requests the
    gateway holds tell the goodput policy there is demand. Without the gateway nobody holds them."""
    zero = replace(
        build_setup(
            SAMPLES / "modelgroup-llama-8b-tp1.yaml",
            SAMPLES / "slopolicy-interactive.yaml",
            ready_time_seconds=10.0,
        ),
        min_groups=0,
        warm_groups=0,
    )
    seconds = 240.0
    workload = poisson_workload({"a": 2.0}, seconds, 9, classes())
    fleet = FleetConfig(
        engine=zero.engine,
        gpus_per_group=1,
        min_groups=0,
        max_groups=4,
        ready_time_median_seconds=10.0,
        itl_targets_seconds=tuple(c.itl_seconds for c in zero.classes),
    )
    outcomes = {}
    for name, path in (("plain", None), ("gateway", request_path_for(zero))):
        config = SimulationConfig(fleet=fleet, initial_groups=0, horizon_seconds=seconds, request_path=path)
        result = simulate(workload, config, GoodputPolicy.for_setup(zero, workload, None))
        outcomes[name] = (result, int(judge(result, zero.classes).met.sum()))
    plain, plain_met = outcomes["plain"]
    fronted, fronted_met = outcomes["gateway"]
    assert plain_met == 0 and not plain.scale_events
    assert fronted.scale_events and fronted.scale_events[0].from_groups == 0
    assert fronted.scale_events[0].to_groups >= 1
    assert fronted_met > len(workload) / 2
