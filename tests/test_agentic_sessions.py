"""Agentic sessions: the trace generator's shapes and invariants, the simulated gateway's session
admission (the live rule, `controllers.requests.sessions`), and children sent only once their parent
was answered."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import replace
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from goodput.controllers.compile.request_path import RequestPathPolicy
from goodput.controllers.requests.degrade import Ladder, Rung
from goodput.controllers.requests.sessions import SessionLimits, SessionRefusal
from goodput.simulator.agentic import (
    AgenticKind,
    AgenticSpec,
    agentic_sessions,
    sessions_within_slo,
    tenants_together,
)
from goodput.simulator.config import SimulationSetup, build_setup
from goodput.simulator.gateway import GatewayTreatment, SimGateway
from goodput.simulator.gateway_bench import run_fixed_fleet
from goodput.simulator.records import RequestExit
from goodput.simulator.runner import request_path_for
from goodput.simulator.workload import Workload, truncate

SAMPLES = Path(__file__).resolve().parents[1] / "manifests" / "samples"


@cache
def setup() -> SimulationSetup:
    return build_setup(SAMPLES / "modelgroup-llama-8b-tp1.yaml", SAMPLES / "slopolicy-agents.yaml")


def agent_policy(limits: SessionLimits | None, rungs: tuple[Rung, ...] = (Rung.REJECT,)) -> RequestPathPolicy:
    """The agents sample's request path with the `agent` class's budget and ladder replaced."""
    policy = request_path_for(setup())
    agent = replace(policy.admission.classes["agent"], session_limits=limits, ladder=Ladder(rungs))
    classes = {**policy.admission.classes, "agent": agent}
    return replace(policy, admission=replace(policy.admission, classes=classes))


def one_session(children: int, prompt_tokens: int = 100, output_tokens: int = 50) -> Workload:
    """A root and `children` children of it, one second apart, all of class `agent`."""
    count = children + 1
    names = tuple(c.name for c in setup().classes)
    return Workload(
        name="one session",
        arrival_seconds=np.arange(count, dtype=np.float64),
        input_tokens=np.full(count, prompt_tokens, np.int64),
        output_tokens=np.full(count, output_tokens, np.int64),
        class_index=np.full(count, names.index("agent"), np.int64),
        class_names=names,
        session_index=np.zeros(count, np.int64),
        parent_index=np.array([-1] + [0] * children, np.int64),
        after_parent_seconds=np.zeros(count, np.float64),
    )


# ---------------------------------------------------------------------------------- the generator
def big_trace() -> tuple[AgenticSpec, np.ndarray, Workload, np.ndarray]:
    spec = AgenticSpec(duration_seconds=4000.0, sessions_per_second=1.0)
    trace = agentic_sessions(spec, seed=3)
    return spec, trace.kind, trace.workload, trace.tool_wait_seconds


def test_the_same_spec_and_seed_give_the_same_trace_and_another_seed_another() -> None:
    spec = AgenticSpec(duration_seconds=120.0)
    first, again, other = agentic_sessions(spec, 7), agentic_sessions(spec, 7), agentic_sessions(spec, 8)
    for column in ("arrival_seconds", "input_tokens", "output_tokens", "parent_index", "session_index"):
        assert np.array_equal(getattr(first.workload, column), getattr(again.workload, column)), column
    assert np.array_equal(first.kind, again.kind)
    assert not np.array_equal(first.workload.input_tokens[:50], other.workload.input_tokens[:50])


def test_fan_out_tool_waits_and_retries_have_the_spec_shapes_over_a_large_sample() -> None:
    spec, kind, workload, wait = big_trace()
    assert workload.parent_index is not None
    parents = workload.parent_index
    branches = kind == AgenticKind.BRANCH
    fanning = np.unique(parents[branches])  # the steps that called tools
    assert branches.sum() / fanning.size == pytest.approx(spec.mean_fan_out, rel=0.05)
    waits = wait[branches]
    assert np.median(waits) == pytest.approx(spec.tool_wait_median_seconds, rel=0.1)
    p99 = math.exp(math.log(spec.tool_wait_median_seconds) + 2.326 * spec.tool_wait_sigma)
    assert np.quantile(waits, 0.99) == pytest.approx(p99, rel=0.25)
    first_retries = (kind == AgenticKind.RETRY) & (kind[np.maximum(parents, 0)] != AgenticKind.RETRY)
    originals = kind != AgenticKind.RETRY
    assert first_retries.sum() / originals.sum() == pytest.approx(spec.retry_rate, rel=0.1)


def test_best_of_n_candidates_share_their_final_steps_parent_and_arrival() -> None:
    spec, kind, workload, _ = big_trace()
    assert workload.parent_index is not None
    candidates = np.flatnonzero(kind == AgenticKind.CANDIDATE)
    assert candidates.size > 0
    for index in candidates[:50].tolist():
        parent = workload.parent_index[index]
        siblings = np.flatnonzero((workload.parent_index == parent) & (kind == AgenticKind.STEP))
        assert workload.arrival_seconds[index] in workload.arrival_seconds[siblings]
    sessions_with = np.unique(workload.session_index[candidates]).size  # type: ignore[index]
    assert candidates.size == sessions_with * (spec.best_of_n - 1)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    mean_steps=st.floats(1.0, 6.0),
    max_steps=st.integers(1, 8),
    retry_rate=st.floats(0.0, 0.9),
)
def test_every_child_has_a_parent_that_came_before_it_in_its_session_and_depth_is_bounded(
    seed: int, mean_steps: float, max_steps: int, retry_rate: float
) -> None:
    spec = AgenticSpec(
        duration_seconds=60.0, sessions_per_second=0.5, mean_steps=mean_steps, max_steps=max_steps,
        retry_rate=retry_rate,
    )  # fmt: skip
    workload = agentic_sessions(spec, seed).workload
    parents, sessions = workload.parent_index, workload.session_index
    assert parents is not None and sessions is not None and workload.after_parent_seconds is not None
    children = np.flatnonzero(parents >= 0)
    assert np.all(parents[children] < children)
    assert np.all(workload.arrival_seconds[parents[children]] < workload.arrival_seconds[children])
    assert np.array_equal(sessions[parents[children]], sessions[children])
    assert np.all(workload.after_parent_seconds >= 0)
    assert np.bincount(sessions[parents < 0]).max(initial=1) == 1  # one root a session
    depth = np.zeros(len(workload), np.int64)
    for child in children.tolist():  # parents come first, so their depth is known
        depth[child] = depth[parents[child]] + 1
    assert depth.max(initial=0) + 1 <= spec.max_depth


def test_tenants_together_keep_each_tenants_sessions_whole_and_apart() -> None:
    narrow = agentic_sessions(AgenticSpec(duration_seconds=60.0, sessions_per_second=0.5), 3).workload
    wide_spec = AgenticSpec(duration_seconds=60.0, sessions_per_second=0.5, fan_out_widths=(10, 20, 30, 40))
    wide = agentic_sessions(wide_spec, 4).workload
    both = tenants_together({"narrow": narrow, "wide": wide})
    assert len(both) == len(narrow) + len(wide) and both.tenant_names == ("narrow", "wide")
    assert np.all(np.diff(both.arrival_seconds) >= 0)
    assert both.session_index is not None and both.parent_index is not None
    sessions_of = {t: set(both.session_index[both.tenant_index == t].tolist()) for t in (0, 1)}
    assert not sessions_of[0] & sessions_of[1], "sessions renumbered apart"
    children = np.flatnonzero(both.parent_index >= 0)
    parents = both.parent_index[children]
    assert np.all(parents < children), "a parent comes before its child"
    assert np.all(both.session_index[parents] == both.session_index[children])
    assert np.all(both.tenant_index[parents] == both.tenant_index[children])
    per_session = np.bincount(both.session_index, minlength=int(both.session_index.max()) + 1)
    wide_sessions = sorted(sessions_of[1])
    narrow_sessions = sorted(sessions_of[0])
    # Branches are a share of a session's requests (steps, root and answer are not widened).
    assert per_session[wide_sessions].mean() > 2 * per_session[narrow_sessions].mean(), (
        "each tenant keeps its own shapes"
    )


def test_tenants_together_refuses_workloads_without_sessions() -> None:
    plain = agentic_sessions(AgenticSpec(duration_seconds=10.0), 1).workload
    with pytest.raises(ValueError, match="workloads of sessions"):
        tenants_together({"a": plain, "b": dataclasses.replace(plain, parent_index=None)})


def test_a_rate_trace_shapes_session_arrivals() -> None:
    spec = AgenticSpec(duration_seconds=200.0, rate_trace_per_second=(0.0, 2.0), rate_interval_seconds=100.0)
    workload = agentic_sessions(spec, 1).workload
    assert workload.parent_index is not None
    roots = workload.arrival_seconds[workload.parent_index < 0]
    assert roots.size > 100 and roots.min() >= 100.0


def test_a_selection_that_cuts_sessions_apart_is_refused_and_a_truncation_keeps_them() -> None:
    workload = agentic_sessions(AgenticSpec(duration_seconds=60.0), 2).workload
    kept = truncate(workload, 30.0)
    assert kept.parent_index is not None and np.all(kept.parent_index < np.arange(len(kept)))
    with pytest.raises(ValueError, match="cuts sessions apart"):
        workload.take(np.arange(1, len(workload)), "drop the first root")


def test_bad_fan_out_weights_are_named() -> None:
    with pytest.raises(ValueError, match="fan_out_weights"):
        AgenticSpec(fan_out_widths=(1, 2), fan_out_weights=(1.0,))


# ------------------------------------------------------------------ session admission, simulated
def test_a_session_over_its_branch_budget_has_its_extra_children_refused() -> None:
    gateway = SimGateway(agent_policy(SessionLimits(None, 3, None)), one_session(5))
    for index in range(6):
        gateway.arrive(index, float(index), [0])
    assert gateway.admission[:3] == [GatewayTreatment.ADMITTED] * 3  # the root is one of the 3
    assert gateway.admission[3:] == [GatewayTreatment.REJECTED] * 3
    assert gateway.reason[3:] == [SessionRefusal.BUDGET_EXHAUSTED.value] * 3


def test_over_its_token_budget_a_child_is_capped_when_the_class_accepts_a_capped_answer() -> None:
    limits = SessionLimits(tokens=420, branches=None, wall_clock_seconds=None)
    capped = SimGateway(agent_policy(limits, (Rung.CAP_OUTPUT, Rung.REJECT)), one_session(2))
    refused = SimGateway(agent_policy(limits), one_session(2))
    for gateway in (capped, refused):
        for index in range(3):
            gateway.arrive(index, float(index), [0])
    # the root and the first child reserve 100 + 50 each; 120 are left: a 100-token prompt and 20 out
    admitted, degraded = GatewayTreatment.ADMITTED, GatewayTreatment.DEGRADED
    assert capped.admission == [admitted, admitted, degraded]
    assert capped.served_output_tokens[2] == 20
    assert refused.admission[2] == GatewayTreatment.REJECTED
    assert refused.reason[2] == SessionRefusal.BUDGET_EXHAUSTED.value


def test_a_child_after_its_sessions_wall_clock_is_refused_as_expired() -> None:
    gateway = SimGateway(agent_policy(SessionLimits(None, None, 1.5)), one_session(2))
    for index in range(3):
        gateway.arrive(index, float(index), [0])
    assert gateway.admission[1] == GatewayTreatment.ADMITTED
    assert gateway.reason[2] == SessionRefusal.EXPIRED.value


def test_without_a_session_budget_children_are_admitted_one_by_one() -> None:
    gateway = SimGateway(agent_policy(None), one_session(5))
    for index in range(6):
        gateway.arrive(index, float(index), [0])
    assert gateway.admission == [GatewayTreatment.ADMITTED] * 6


def test_an_answered_child_gives_back_what_it_did_not_use() -> None:
    gateway = SimGateway(agent_policy(SessionLimits(1000, None, None)), one_session(1))
    gateway.arrive(0, 0.0, [0])
    [sent] = gateway.pump(0.0, [0])
    gateway.finished(sent.index, 0.0, 0.1, 1.0)
    assert gateway.sessions is not None
    session = gateway.sessions.table.get("session-0")
    assert session is not None and session.held_tokens == 0 and session.spent_tokens == 150


def test_a_child_the_class_gates_refuse_gives_its_reservation_back_to_its_session() -> None:
    too_long = policy_context_tokens() + 10
    workload = one_session(1)
    workload = replace(workload, input_tokens=np.array([100, too_long], np.int64))
    gateway = SimGateway(agent_policy(SessionLimits(10 * too_long, None, None)), workload)
    gateway.arrive(0, 0.0, [0])
    assert gateway.arrive(1, 1.0, [0]) is None  # admitted by its session, refused by the gates
    assert gateway.reason[1] != SessionRefusal.BUDGET_EXHAUSTED.value
    assert gateway.sessions is not None
    session = gateway.sessions.table.get("session-0")
    assert session is not None and session.branches_used == 2
    assert set(session.held) == {1}  # only the root's reservation is still held
    assert session.spent_tokens == too_long  # its prompt is charged, as the live gateway charges it


def policy_context_tokens() -> int:
    return request_path_for(setup()).admission.context_tokens


def test_copies_of_a_sessions_requests_are_refused() -> None:
    workload = agentic_sessions(AgenticSpec(duration_seconds=30.0), 2).workload
    with pytest.raises(ValueError, match="cannot repeat requests"):
        workload.placed(np.zeros(2, np.int64), np.zeros(2), "the root twice")


# --------------------------------------------------------------- children follow answered parents
def test_in_a_run_children_arrive_after_their_parents_answer_and_never_without_it() -> None:
    spec = AgenticSpec(duration_seconds=60.0, sessions_per_second=0.3)
    policy = agent_policy(SessionLimits(None, 4, None))
    names = tuple(c.name for c in setup().classes)
    trace = agentic_sessions(spec, 5).workload
    workload = replace(
        trace, class_index=np.full(len(trace), names.index("agent"), np.int64), class_names=names
    )
    result = run_fixed_fleet(setup(), workload, 1, policy, horizon_seconds=60.0, seed=5)
    requests = result.requests
    parents = workload.parent_index
    assert parents is not None and workload.after_parent_seconds is not None
    sent = (parents >= 0) & (requests["outcome"] != RequestExit.NOT_SENT)
    answered_at = requests["finished_at"][parents[sent]]
    assert np.allclose(requests["arrival"][sent], answered_at + workload.after_parent_seconds[sent])
    not_sent = requests["outcome"] == RequestExit.NOT_SENT
    assert not_sent.any()  # the branch budget of 4 refuses children, whose own children never come
    assert np.all(requests["outcome"][parents[not_sent]] != RequestExit.FINISHED)


def test_a_session_completes_only_with_every_request_met_inside_its_wall_clock() -> None:
    workload = Workload(
        name="two sessions",
        arrival_seconds=np.array([0.0, 1.0, 2.0, 3.0]),
        input_tokens=np.ones(4, np.int64),
        output_tokens=np.ones(4, np.int64),
        session_index=np.array([0, 1, 0, 1]),
        parent_index=np.array([-1, -1, 0, 1]),
        after_parent_seconds=np.zeros(4),
    )
    met = np.array([True, True, True, False])
    finished = np.array([1.0, 2.0, 9.0, 4.0])
    assert sessions_within_slo(workload, met, finished, None).tolist() == [True, False]
    assert sessions_within_slo(workload, met, finished, 5.0).tolist() == [False, False]
