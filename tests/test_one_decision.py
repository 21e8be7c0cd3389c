"""One decision, two worlds: the goodput policy the operator runs and the one the simulator runs decide
the same from the same observations.

Neither world is handed the other's capacity profile: each compiles the manifests its own way in
(`compile_policy`, the simulator told the trace's mix as a benchmark would measure it), and the
profiles must come out equal. `test_one_controller.py` shows that both worlds run the same group
lifecycle for the same desired counts; here the desired counts come from the real policy
(`controllers.autoscale.decide` with the sample SLOPolicy compiled by `controllers.compile.scaling`).
Each control tick of a simulated run is observed twice:

- as the simulator observes it: `GoodputPolicy` builds its snapshot from its scrape history;
- as the operator observes it: the same scrapes rendered as the answer Prometheus gives to the
  operator's snapshot query (gauges of the latest scrape, the window's rates, sums and bucket
  increases, one series per group and quantity), parsed by `operator.metrics_source`, joined with the
  ModelGroup's spec and `status.groups` by `build_snapshot`, decided with the operator's compiled
  policy and its decision state threaded from tick to tick as the autoscaler keeps it.

The scenario: a steady load, a burst the fleet scales out for, a ready group failing
during the burst, a quiet spell and a new burst; the scale-in comes as the new burst begins (the
SLOPolicy's 300 s goodput window still remembers the first one).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from goodput.api.modelgroup import GroupStatus, ModelGroup, ModelGroupStatus
from goodput.api.slopolicy import SloPolicy
from goodput.controllers.autoscale import decide
from goodput.controllers.autoscale.model import Decision, DecisionState
from goodput.controllers.compile.scaling import (
    DEFAULT_RATE_WINDOW_SECONDS,
    CompiledPolicy,
    ReferenceMix,
    compile_policy,
)
from goodput.estimators.attainment import Histogram
from goodput.operator.metrics_source import build_snapshot, metrics_by_group, query_windows
from goodput.operator.promql import QUERY_LABEL, QueryQuantity, SeriesLabels, Windows
from goodput.simulator.config import SimulationSetup, build_setup
from goodput.simulator.fleet_policy import FleetObservation, PolicyAnswer
from goodput.simulator.goodput_policy import GoodputPolicy
from goodput.simulator.metrics import GroupScrape
from goodput.simulator.simulation import SimulationConfig, SimulationResult, simulate
from goodput.simulator.workload import ClassRule, Workload, assign_classes

SAMPLES = Path(__file__).resolve().parents[1] / "manifests" / "samples"
SETUP = build_setup(
    SAMPLES / "modelgroup-llama-8b-tp1.yaml", SAMPLES / "slopolicy-interactive.yaml", ready_time_seconds=30.0
)
LABELS = SeriesLabels()
# Arrivals per second by phase: steady, burst (a group fails in it), quiet (scale-in), new burst.
PHASES = ((0.0, 4.0), (120.0, 40.0), (330.0, 2.0), (600.0, 40.0), (720.0, 0.0))
FAILURE_AT = 240.0
# The simulator's group states in the API's words (`status.groups[].state`).
API_STATES = {"Placing": "Placing", "Provisioning": "Provisioning", "Ready": "Ready", "Draining": "Draining"}


def phased_load() -> Workload:
    rng = np.random.default_rng(11)
    times: list[float] = []
    for (start, rate), (end, _) in pairwise(PHASES):
        if rate > 0:
            times.extend(np.sort(rng.uniform(start, end, rng.poisson(rate * (end - start)))))
    arrivals = np.asarray(times)
    inputs = rng.integers(200, 1200, arrivals.size)
    outputs = rng.integers(100, 600, arrivals.size)
    return assign_classes(Workload("phased", arrivals, inputs, outputs), ClassRule(("chat",), (1.0,)), 5)


WORKLOAD = phased_load()


def model_group_setup() -> SimulationSetup:
    assert SETUP.model_group is not None and SETUP.slo_policy is not None
    return SETUP


def the_simulators_policy() -> GoodputPolicy:
    return GoodputPolicy.for_setup(model_group_setup(), WORKLOAD, None)


def the_traces_mix() -> ReferenceMix:
    """What a benchmark of this trace measures, the one thing the API cannot say: the request mix a
    capacity is priced at. Computed here from the trace itself, so neither world's code supplies it."""
    inputs, outputs = WORKLOAD.input_tokens, WORKLOAD.output_tokens
    return ReferenceMix(
        input_tokens=float(inputs.mean()),
        output_tokens=float(outputs.mean()),
        input_tokens_p90=float(np.percentile(inputs, 90)),
        output_tokens_p90_over_mean=float(np.percentile(outputs, 90) / max(1.0, outputs.mean())),
    )


def the_operators_policy() -> CompiledPolicy:
    """The operator's compile of the same manifests, told only what the benchmark measured (the mix);
    the capacity profile is its own, built from the ModelGroup as the operator builds it."""
    setup = model_group_setup()
    assert setup.model_group is not None and setup.slo_policy is not None
    compiled = compile_policy(setup.model_group, setup.slo_policy, mix=the_traces_mix())
    assert isinstance(compiled, CompiledPolicy), compiled
    return compiled


# --- The operator's observation: Prometheus's answer to the snapshot query ---------------------------


def _sample(group: str, quantity: QueryQuantity, value: float, now: float, **labels: str) -> dict[str, Any]:
    metric = {QUERY_LABEL: quantity.value, LABELS.group: group, **labels}
    return {"metric": metric, "value": [now, repr(float(value))]}


def _buckets(group: str, quantity: QueryQuantity, increase: Histogram, now: float) -> list[dict[str, Any]]:
    bounds = [*(repr(bound) for bound in increase.upper_bounds), "+Inf"]
    return [
        _sample(group, quantity, count, now, le=bound)
        for bound, count in zip(bounds, increase.cumulative_counts, strict=True)
    ]


def _increase(later: Histogram, earlier: Histogram) -> Histogram:
    counts = tuple(a - b for a, b in zip(later.cumulative_counts, earlier.cumulative_counts, strict=True))
    return Histogram(later.upper_bounds, counts)


def _rate_series(
    name: str, latest: GroupScrape, earlier: GroupScrape, *, span: float, now: float
) -> list[dict[str, Any]]:
    """What `rate()` and `increase()` answer over the rate window for one group."""
    finished = latest.request_success_total - earlier.request_success_total
    figures = {
        QueryQuantity.PROMPT_TOKENS_RATE: (latest.prompt_tokens_total - earlier.prompt_tokens_total) / span,
        QueryQuantity.GENERATION_TOKENS_RATE: (
            latest.generation_tokens_total - earlier.generation_tokens_total
        )
        / span,
        QueryQuantity.PROMPT_TOKENS_SUM: latest.request_prompt_tokens_sum - earlier.request_prompt_tokens_sum,
        QueryQuantity.PROMPT_TOKENS_COUNT: finished,
        QueryQuantity.PROMPTS_STARTED: latest.time_to_first_token_seconds.total
        - earlier.time_to_first_token_seconds.total,
        QueryQuantity.PROMPT_TOKENS_STARTED: latest.prompt_tokens_total - earlier.prompt_tokens_total,
        QueryQuantity.GENERATION_TOKENS_SUM: latest.request_generation_tokens_sum
        - earlier.request_generation_tokens_sum,
        QueryQuantity.GENERATION_TOKENS_COUNT: finished,
        QueryQuantity.PREFIX_HITS: latest.prefix_cache_hits_total - earlier.prefix_cache_hits_total,
        QueryQuantity.PREFIX_QUERIES: latest.prefix_cache_queries_total - earlier.prefix_cache_queries_total,
    }
    return [_sample(name, quantity, value, now) for quantity, value in figures.items()]


def _histogram_series(
    name: str, latest: GroupScrape, earlier: GroupScrape, *, now: float
) -> list[dict[str, Any]]:
    """What `increase()` answers over the goodput window: the outcomes and the bucket increases."""
    series = [
        _sample(
            name, QueryQuantity.FINISHED, latest.request_success_total - earlier.request_success_total, now
        )
    ]
    histograms = {
        QueryQuantity.TTFT_BUCKETS: (latest.time_to_first_token_seconds, earlier.time_to_first_token_seconds),
        QueryQuantity.ITL_BUCKETS: (latest.inter_token_latency_seconds, earlier.inter_token_latency_seconds),
        QueryQuantity.QUEUE_TIME_BUCKETS: (
            latest.request_queue_time_seconds,
            earlier.request_queue_time_seconds,
        ),
        QueryQuantity.TPOT_BUCKETS: (
            latest.request_time_per_output_token_seconds,
            earlier.request_time_per_output_token_seconds,
        ),
    }
    for quantity, (later, before) in histograms.items():
        if later is not None and before is not None:
            series += _buckets(name, quantity, _increase(later, before), now)
    return series


def _first_scrapes(
    observation: FleetObservation, span_seconds: float
) -> dict[str, tuple[float, GroupScrape]]:
    view = observation.metrics
    assert view.latest is not None
    first: dict[str, tuple[float, GroupScrape]] = {}
    for sample in view.within(view.latest.time - span_seconds - 1e-9):
        for scraped in sample.groups:
            first.setdefault(scraped.group, (sample.time, scraped))
    return first


def prometheus_answer(observation: FleetObservation, windows: Windows) -> list[dict[str, Any]]:
    """The snapshot query's answer for the scrapes a tick sees: every group's latest gauges and their
    age, its rate figures once the rate window holds two of its scrapes (as `rate()` needs), and its
    outcomes and histograms once the goodput window does."""
    latest = observation.metrics.latest
    if latest is None:
        return []
    rate_starts = _first_scrapes(observation, windows.rate_seconds)
    histogram_starts = _first_scrapes(observation, windows.histogram_seconds)
    now = observation.now
    series: list[dict[str, Any]] = []
    for scraped in latest.groups:
        name = scraped.group
        series += [
            _sample(name, QueryQuantity.WAITING, scraped.num_requests_waiting, now),
            _sample(name, QueryQuantity.RUNNING, scraped.num_requests_running, now),
            _sample(name, QueryQuantity.KV_USAGE, scraped.kv_cache_usage_perc, now),
            _sample(name, QueryQuantity.SAMPLE_AGE, now - latest.time, now),
        ]
        since, earlier = rate_starts.get(name, (latest.time, scraped))
        if latest.time > since:
            series += _rate_series(name, scraped, earlier, span=latest.time - since, now=now)
        since, earlier = histogram_starts.get(name, (latest.time, scraped))
        if latest.time > since:
            series += _histogram_series(name, scraped, earlier, now=now)
    return series


def observed_model_group(observation: FleetObservation) -> tuple[ModelGroup, ModelGroupStatus]:
    """The ModelGroup as the operator reads it at this tick: `spec.replicas` as last scaled, and
    `status.groups` as the group controller wrote them."""
    setup = model_group_setup()
    assert setup.model_group is not None
    spec = setup.model_group.spec.model_copy(update={"replicas": observation.desired_groups})
    status = ModelGroupStatus(
        groups=tuple(
            GroupStatus(
                name=info.name,
                state=API_STATES[info.state],
                created_at=datetime.fromtimestamp(info.created_at, UTC),
            )
            for info in observation.groups
            if info.state in API_STATES
        )
    )
    return setup.model_group.model_copy(update={"spec": spec}), status


@dataclass
class ThroughTheOperator:
    """The operator's autoscaler tick on the simulated cluster: Prometheus's answer parsed, the
    snapshot built, `decide` called with the compiled policy, the state kept for the next tick."""

    compiled: CompiledPolicy
    name: str = "operator"
    state: DecisionState = field(default_factory=DecisionState.initial)
    decisions: list[tuple[float, Decision]] = field(default_factory=list)

    @property
    def interval_seconds(self) -> float:
        return float(self.compiled.policy.interval_seconds)

    def describe(self) -> dict[str, float | str]:
        return {}

    def decide(self, observation: FleetObservation) -> Decision:
        answer = prometheus_answer(observation, query_windows(self.compiled, DEFAULT_RATE_WINDOW_SECONDS))
        model_group, status = observed_model_group(observation)
        metrics = metrics_by_group(answer, LABELS)
        snapshot = build_snapshot(model_group, status, self.compiled, metrics, now=observation.now)
        decision = decide(snapshot, self.compiled.policy, self.state, observation.now)
        self.state = decision.next_state
        self.decisions.append((observation.now, decision))
        return decision

    def recommend(self, observation: FleetObservation) -> PolicyAnswer:
        decision = self.decide(observation)
        desired = decision.desired_groups if decision.applies else observation.desired_groups
        return PolicyAnswer(desired, decision.reason)


@dataclass
class Recorded:
    """The simulator's own goodput policy, its decisions kept; optionally the operator's path asked
    the same question at every tick (it only watches: the simulator's answer is acted on)."""

    simulated: GoodputPolicy
    watcher: ThroughTheOperator | None = None
    name: str = "goodput"
    decisions: list[tuple[float, Decision]] = field(default_factory=list)

    @property
    def interval_seconds(self) -> float:
        return self.simulated.interval_seconds

    def describe(self) -> dict[str, float | str]:
        return {}

    def recommend(self, observation: FleetObservation) -> PolicyAnswer:
        answer = self.simulated.recommend(observation)
        assert self.simulated.last_decision is not None
        self.decisions.append((observation.now, self.simulated.last_decision))
        if self.watcher is not None:
            self.watcher.decide(observation)
        return answer


def run(autoscaler: Recorded | ThroughTheOperator) -> SimulationResult:
    setup = model_group_setup()
    fleet = dataclasses.replace(setup.fleet(), ready_time_sigma=0.0, scheduled_failures_seconds=(FAILURE_AT,))
    config = SimulationConfig(
        fleet=fleet, seed=7, initial_groups=2, control_start_seconds=15.0, tail_seconds=60.0
    )
    return simulate(WORKLOAD, config, autoscaler)


def summary(decision: Decision) -> tuple[object, ...]:
    """What a decision does and why: the count, whether it applies, its reason, winning signal,
    guards and every signal's proposal."""
    return (
        decision.desired_groups,
        decision.applies,
        str(decision.reason),
        str(decision.signal),
        tuple(decision.guards),
        tuple((str(p.signal), p.groups) for p in decision.proposals),
    )


def scale_events(result: SimulationResult) -> list[tuple[float, int, int]]:
    return [(event.time, event.from_groups, event.to_groups) for event in result.scale_events]


def moves(result: SimulationResult) -> list[tuple[float, str, str, str | None, str]]:
    return [(at, t.group, str(t.event), t.before, t.after) for at, t in result.group_transitions]


def test_both_worlds_compile_the_same_policy_and_read_the_same_window() -> None:
    simulated = the_simulators_policy()
    compiled = the_operators_policy()
    assert simulated.policy == compiled.policy
    assert simulated.profile == compiled.profile
    assert simulated.metrics_window_seconds == compiled.metrics_window_seconds
    windows = query_windows(compiled, DEFAULT_RATE_WINDOW_SECONDS)
    assert windows.rate_seconds < windows.histogram_seconds
    assert simulated.describe()["rate_window_seconds"] == windows.rate_seconds


def test_both_worlds_read_arrivals_over_a_drain_target_longer_than_the_rate_window() -> None:
    simulated = the_simulators_policy()
    queue_work = simulated.policy.signals.queue_work
    assert queue_work is not None
    signals = dataclasses.replace(
        simulated.policy.signals, queue_work=dataclasses.replace(queue_work, drain_target_seconds=600.0)
    )
    policy = dataclasses.replace(simulated.policy, signals=signals)
    simulated = dataclasses.replace(simulated, policy=policy, metrics_window_seconds=900.0)
    compiled = dataclasses.replace(the_operators_policy(), policy=policy, metrics_window_seconds=900.0)
    windows = query_windows(compiled, DEFAULT_RATE_WINDOW_SECONDS)
    assert windows.rate_seconds == 600
    assert simulated.describe()["rate_window_seconds"] == windows.rate_seconds


def test_the_same_observations_give_the_same_decisions_at_every_interval() -> None:
    simulated = the_simulators_policy()
    watcher = ThroughTheOperator(the_operators_policy())
    recorded = Recorded(simulated, watcher)
    run(recorded)
    ours = [(at, summary(d)) for at, d in recorded.decisions]
    theirs = [(at, summary(d)) for at, d in watcher.decisions]
    assert len(ours) > 40
    for mine, operators in zip(ours, theirs, strict=True):
        assert mine == operators


def test_acting_on_either_worlds_decisions_gives_the_same_scale_events_and_group_transitions() -> None:
    simulated = the_simulators_policy()
    recorded = Recorded(simulated)
    operator = ThroughTheOperator(the_operators_policy())
    offline, deployed = run(recorded), run(operator)
    assert [summary(d) for _, d in recorded.decisions] == [summary(d) for _, d in operator.decisions]
    assert scale_events(offline) == scale_events(deployed)
    assert moves(offline) == moves(deployed)
    events = {event for _, _, event, _, _ in moves(offline)}
    assert {"Created", "WarmedUp", "Replaced", "ScaledIn"} <= events


def test_both_worlds_build_the_same_capacity_profile_from_the_model_group() -> None:
    """Neither side is handed the other's profile: a step model, batch limit, target or calibration
    that differed between the two would show here as two profiles."""
    simulated = the_simulators_policy().profile
    deployed = the_operators_policy().profile

    assert simulated.step_model == deployed.step_model
    assert (simulated.max_num_seqs, simulated.max_num_batched_tokens) == (
        deployed.max_num_seqs,
        deployed.max_num_batched_tokens,
    )
    assert simulated.reference == deployed.reference
    assert simulated == deployed


def test_the_simulator_refuses_a_policy_the_operator_rejects_with_the_same_words() -> None:
    setup = model_group_setup()
    assert setup.model_group is not None and setup.slo_policy is not None
    body = setup.slo_policy.model_dump(by_alias=True, mode="json")
    # A scale-down window shorter than the interval passes the API server but not the operator.
    body["spec"]["autoscaling"]["intervalSeconds"] = 30
    body["spec"]["autoscaling"]["scaleDown"]["stabilizationWindowSeconds"] = 10
    rejected = SloPolicy.model_validate(body)
    operators_answer = compile_policy(setup.model_group, rejected)
    assert isinstance(operators_answer, str)

    with pytest.raises(ValueError) as refused:
        GoodputPolicy.for_setup(dataclasses.replace(setup, slo_policy=rejected), WORKLOAD, None)

    assert str(refused.value) == operators_answer
