"""Agentic sessions as a workload: one user question becomes a tree of generations.

A session starts with a root request (the user's question, answered with a plan and tool calls).
Each agent step calls `fan-out` tools in parallel; every tool's result, after its tool wait, is read
by a branch request (a summary, a sub-query); the next step follows the branch that ends last, with
every tool result and answer so far appended to its prompt, so prompts grow along a session. The last
step answers; with probability `best_of_n_rate` it is sampled as `best_of_n` candidates (a session of
one step, its root alone, is never). Any answer
fails to parse with probability `retry_rate` and is repaired by a retry (its prompt plus the parse
error), at most `max_retries` times in a row.

The shapes and where the defaults come from:

- Steps, fan-out and tool waits: "TraceLab: Characterizing Coding Agent Workloads for LLM Serving"
  (Zhu et al., 2026, https://arxiv.org/abs/2606.30560): about 4,300 coding-agent sessions with
  350,000 model calls and 430,000 tool calls (1.23 tool calls per step), long autonomous loops, long
  contexts with short outputs, heavily tailed tool latencies. The fan-out default (one tool 80 %, two
  12 %, three 5 %, four 3 %: mean 1.31) is shaped on that ratio; the tool wait is log-normal (median
  1 s, σ 1.5: p99 about 33 s) for its heavy tail, an assumption where the paper's per-tool quantiles
  vary by tool. Coding sessions run to 80 steps and more; the default (mean 4 steps, at most 10) is
  an assumption sized for sessions that must end within a 120 s wall-clock budget.
- Tool waits between a response and the next request as interceptions of a generation: "InferCept:
  Efficient Intercept Support for Augmented Large Language Model Inference" (Abhyankar et al.,
  ICML 2024).
- The retry rate (8 % of answers repaired) and the best-of-N share (20 % of sessions, 4 candidates)
  are assumptions: no public trace we found counts JSON-repair retries or sampled candidates.

The trace is open-loop in its arrival column only as a schedule: a child's `arrival_seconds` is
when it would arrive on an idle fleet (its parent's arrival, plus the parent's time to answer at
`nominal_ttft_seconds` and `nominal_itl_seconds`, plus the tool wait). The simulator sends a child
`after_parent_seconds` after its parent's answer really ended, and never when its parent was not
answered (`simulator.simulation`): an agent cannot continue from an answer it did not get.

Seeded and deterministic: the same spec and seed give the same trace.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np

from goodput.simulator.workload import Workload


class AgenticKind(IntEnum):
    """What one request of a session is."""

    ROOT = 0
    STEP = 1
    """An agent step after the first: reads every tool result so far, calls tools or answers."""
    BRANCH = 2
    """Reads one tool's result (a summary, a sub-query), after the tool's wait."""
    RETRY = 3
    """Repairs the answer before it, which did not parse."""
    CANDIDATE = 4
    """One of the best-of-N candidates beyond the first, sent with the final step."""


@dataclass(frozen=True, slots=True)
class AgenticSpec:
    """The session shapes; every default is cited or named an assumption in the module docstring."""

    duration_seconds: float = 600.0
    sessions_per_second: float = 0.5
    rate_trace_per_second: tuple[float, ...] = ()
    """Sessions per second in consecutive `rate_interval_seconds` slices (replaces the Poisson rate)."""
    rate_interval_seconds: float = 60.0
    mean_steps: float = 4.0
    max_steps: int = 10
    fan_out_widths: tuple[int, ...] = (1, 2, 3, 4)
    fan_out_weights: tuple[float, ...] = (0.80, 0.12, 0.05, 0.03)
    tool_wait_median_seconds: float = 1.0
    tool_wait_sigma: float = 1.5
    max_tool_wait_seconds: float = 300.0
    retry_rate: float = 0.08
    max_retries: int = 2
    best_of_n_rate: float = 0.2
    best_of_n: int = 4
    root_prompt_median_tokens: float = 1500.0
    step_output_median_tokens: float = 120.0
    branch_output_median_tokens: float = 80.0
    answer_output_median_tokens: float = 300.0
    tool_result_median_tokens: float = 400.0
    repair_prompt_tokens: int = 60
    length_sigma: float = 0.6
    max_prompt_tokens: int = 16000
    nominal_ttft_seconds: float = 0.3
    nominal_itl_seconds: float = 0.03
    class_name: str = "agent"
    tenants: int = 1

    def __post_init__(self) -> None:
        if len(self.fan_out_widths) != len(self.fan_out_weights) or not self.fan_out_widths:
            raise ValueError("fan_out_widths and fan_out_weights: one weight per width, at least one")
        if min(self.fan_out_widths) < 1 or min(self.fan_out_weights) < 0 or sum(self.fan_out_weights) <= 0:
            raise ValueError("fan_out_widths must be >= 1 and fan_out_weights non-negative, summing above 0")
        if self.mean_steps < 1 or self.max_steps < 1:
            raise ValueError("mean_steps and max_steps must be at least 1")
        for name in ("retry_rate", "best_of_n_rate"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1)")
        if self.best_of_n < 1 or self.max_retries < 0 or self.tenants < 1:
            raise ValueError("best_of_n and tenants must be at least 1, max_retries at least 0")

    @property
    def mean_fan_out(self) -> float:
        weights = np.asarray(self.fan_out_weights, dtype=np.float64)
        return float(np.dot(self.fan_out_widths, weights / weights.sum()))

    @property
    def max_depth(self) -> int:
        """The deepest a session's tree can be, in requests from root to leaf: every step and every
        branch followed by its retries, the final step's candidates beside it."""
        return self.max_steps * 2 * (1 + self.max_retries)


@dataclass(frozen=True, slots=True)
class AgenticTrace:
    """The workload (with its session columns) and, per request, its kind and its tool wait."""

    workload: Workload
    kind: np.ndarray
    tool_wait_seconds: np.ndarray
    """The tool's wait before a branch; 0 for every other request."""


@dataclass(slots=True)
class _Builder:
    """The requests of the trace as they are drawn, in session order."""

    spec: AgenticSpec
    rng: np.random.Generator
    arrival: list[float] = field(default_factory=list)
    prompt: list[int] = field(default_factory=list)
    output: list[int] = field(default_factory=list)
    session: list[int] = field(default_factory=list)
    parent: list[int] = field(default_factory=list)
    after_parent: list[float] = field(default_factory=list)
    kind: list[int] = field(default_factory=list)
    tool_wait: list[float] = field(default_factory=list)
    tenant: list[int] = field(default_factory=list)

    def length(self, median: float) -> int:
        return max(1, round(self.rng.lognormal(math.log(median), self.spec.length_sigma)))

    def end_of(self, index: int) -> float:
        """When request `index` would end on an idle fleet."""
        return (
            self.arrival[index]
            + self.spec.nominal_ttft_seconds
            + self.output[index] * (self.spec.nominal_itl_seconds)
        )

    def add(  # noqa: PLR0917 (one request's columns)
        self, session: int, parent: int, wait: float, prompt: int, output: int, kind: AgenticKind, tenant: int
    ) -> int:
        start = self.end_of(parent) + wait if parent >= 0 else wait
        self.arrival.append(start)
        self.prompt.append(min(prompt, self.spec.max_prompt_tokens))
        self.output.append(output)
        self.session.append(session)
        self.parent.append(parent)
        self.after_parent.append(wait if parent >= 0 else 0.0)
        self.kind.append(int(kind))
        self.tool_wait.append(wait if kind is AgenticKind.BRANCH else 0.0)
        self.tenant.append(tenant)
        return len(self.arrival) - 1

    def with_retries(self, index: int) -> int:
        """Repair an answer that did not parse, as often as it fails (bounded): the last request of
        the chain, whose answer the session continues from."""
        last = index
        for _ in range(self.spec.max_retries):
            if self.rng.random() >= self.spec.retry_rate:
                break
            repair = self.prompt[last] + self.output[last] + self.spec.repair_prompt_tokens
            out = self.length(float(self.output[index]))
            last = self.add(
                self.session[index], last, 0.0, repair, out, AgenticKind.RETRY, self.tenant[index]
            )
        return last


def _session_starts(spec: AgenticSpec, rng: np.random.Generator) -> np.ndarray:
    """Poisson session arrivals at the spec's rate, or piecewise from its rate trace."""
    if spec.rate_trace_per_second:
        pieces = []
        for slot, rate in enumerate(spec.rate_trace_per_second):
            start = slot * spec.rate_interval_seconds
            end = min(start + spec.rate_interval_seconds, spec.duration_seconds)
            if end > start and rate > 0:
                pieces.append(rng.uniform(start, end, rng.poisson(rate * (end - start))))
        return np.sort(np.concatenate(pieces)) if pieces else np.zeros(0)
    count = rng.poisson(spec.sessions_per_second * spec.duration_seconds)
    return np.sort(rng.uniform(0.0, spec.duration_seconds, count))


def _one_session(build: _Builder, session: int, start: float) -> None:
    """Draw one session's tree into the builder."""
    spec, rng = build.spec, build.rng
    tenant = int(rng.integers(0, spec.tenants))
    steps = min(int(rng.geometric(1.0 / spec.mean_steps)), spec.max_steps)
    weights = np.asarray(spec.fan_out_weights, dtype=np.float64)
    context = build.length(spec.root_prompt_median_tokens)
    parent, wait, kind = -1, start, AgenticKind.ROOT
    for step in range(steps):
        final = step == steps - 1
        output = build.length(spec.answer_output_median_tokens if final else spec.step_output_median_tokens)
        first = build.add(session, parent, wait, context, output, kind, tenant)
        if final and parent >= 0 and spec.best_of_n > 1 and rng.random() < spec.best_of_n_rate:
            for _ in range(spec.best_of_n - 1):
                candidate = build.length(spec.answer_output_median_tokens)
                build.with_retries(
                    build.add(session, parent, wait, context, candidate, AgenticKind.CANDIDATE, tenant)
                )
        answered = build.with_retries(first)
        if final:
            return
        context = build.prompt[answered] + build.output[answered]
        width = int(spec.fan_out_widths[rng.choice(len(weights), p=weights / weights.sum())])
        ends: list[int] = []
        for _ in range(width):
            tool_wait = min(
                float(rng.lognormal(math.log(spec.tool_wait_median_seconds), spec.tool_wait_sigma)),
                spec.max_tool_wait_seconds,
            )
            result = build.length(spec.tool_result_median_tokens)
            out = build.length(spec.branch_output_median_tokens)
            prompt = context + result
            branch = build.add(session, answered, tool_wait, prompt, out, AgenticKind.BRANCH, tenant)
            ends.append(build.with_retries(branch))
            context += result + build.output[ends[-1]]
        parent = max(ends, key=build.end_of)
        wait, kind = 0.0, AgenticKind.STEP


def agentic_sessions(spec: AgenticSpec, seed: int) -> AgenticTrace:
    """The sessions of `spec`, seeded: requests sorted by their idle-fleet arrival, each with its
    session, its parent (-1 for a root) and its delay after its parent's answer."""
    rng = np.random.default_rng([seed, 35])
    build = _Builder(spec, rng)
    starts = _session_starts(spec, rng)
    for session, start in enumerate(starts.tolist()):
        _one_session(build, session, start)
    arrival = np.asarray(build.arrival, dtype=np.float64)
    order = np.argsort(arrival, kind="stable")
    position = np.empty_like(order)
    position[order] = np.arange(order.size)
    parent = np.asarray(build.parent, dtype=np.int64)[order]
    parent = np.where(parent >= 0, position[np.maximum(parent, 0)], -1)
    kind = np.asarray(build.kind, dtype=np.int64)[order]
    workload = Workload(
        name="agentic-sessions",
        arrival_seconds=arrival[order],
        input_tokens=np.asarray(build.prompt, dtype=np.int64)[order],
        output_tokens=np.asarray(build.output, dtype=np.int64)[order],
        class_index=np.zeros(order.size, dtype=np.int64),
        tenant_index=np.asarray(build.tenant, dtype=np.int64)[order],
        class_names=(spec.class_name,),
        tenant_names=tuple(f"tenant-{i}" for i in range(spec.tenants)),
        session_index=np.asarray(build.session, dtype=np.int64)[order],
        parent_index=parent.astype(np.int64),
        after_parent_seconds=np.asarray(build.after_parent, dtype=np.float64)[order],
        notes=(_describe(spec, seed, starts.size, order.size),),
    )
    return AgenticTrace(workload, kind, np.asarray(build.tool_wait, dtype=np.float64)[order])


def tenants_together(traces: dict[str, Workload]) -> Workload:
    """Several tenants' session workloads as one, each tenant its own shapes (one fans out wider,
    one runs longer sessions): requests sorted by arrival, sessions renumbered apart, parents kept."""
    parts = list(traces.values())
    sessions = [part.session_index for part in parts]
    parents = [part.parent_index for part in parts]
    waits = [part.after_parent_seconds for part in parts]
    if not parts or any(column is None for column in (*sessions, *parents, *waits)):
        raise ValueError("tenants_together takes workloads of sessions (simulator.agentic)")
    if len({part.class_names for part in parts}) > 1:
        raise ValueError("tenants_together takes workloads with one list of classes")
    request_offset, session_offset = 0, 0
    parent_parts: list[np.ndarray] = []
    session_parts: list[np.ndarray] = []
    wait_parts: list[np.ndarray] = []
    for part, session, parent, wait in zip(parts, sessions, parents, waits, strict=True):
        assert session is not None and parent is not None and wait is not None
        wait_parts.append(wait)
        parent_parts.append(np.where(parent >= 0, parent + request_offset, -1))
        session_parts.append(session + session_offset)
        request_offset += len(part)
        session_offset += int(session.max()) + 1 if session.size else 0
    arrival = np.concatenate([part.arrival_seconds for part in parts])
    order = np.argsort(arrival, kind="stable")
    position = np.empty_like(order)
    position[order] = np.arange(order.size)
    parent_index = np.concatenate(parent_parts)[order]
    parent_index = np.where(parent_index >= 0, position[np.maximum(parent_index, 0)], -1)

    def column(values: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(values)[order]

    return Workload(
        name="agentic-sessions-" + "-".join(traces),
        arrival_seconds=arrival[order],
        input_tokens=column([part.input_tokens for part in parts]),
        output_tokens=column([part.output_tokens for part in parts]),
        class_index=column(
            [np.zeros(len(p), np.int64) if p.class_index is None else p.class_index for p in parts]
        ),
        tenant_index=column([np.full(len(part), t, np.int64) for t, part in enumerate(parts)]),
        class_names=parts[0].class_names,
        tenant_names=tuple(traces),
        session_index=column(session_parts),
        parent_index=parent_index.astype(np.int64),
        after_parent_seconds=column(wait_parts),
        notes=tuple(f"{name}: {part.notes[0] if part.notes else part.name}" for name, part in traces.items()),
    )


def _describe(spec: AgenticSpec, seed: int, sessions: int, requests: int) -> str:
    rate = (
        f"rate trace {len(spec.rate_trace_per_second)} x {spec.rate_interval_seconds:g} s"
        if spec.rate_trace_per_second
        else f"Poisson {spec.sessions_per_second:g} sessions/s"
    )
    return (
        f"agentic sessions: {sessions} sessions, {requests} requests over {spec.duration_seconds:g} s "
        f"({rate}); steps geometric mean {spec.mean_steps:g} (max {spec.max_steps}), fan-out mean "
        f"{spec.mean_fan_out:.2f}, tool wait log-normal median {spec.tool_wait_median_seconds:g} s "
        f"σ {spec.tool_wait_sigma:g}, retry rate {spec.retry_rate:g}, best-of-{spec.best_of_n} in "
        f"{spec.best_of_n_rate:.0%} of sessions; seed {seed}"
    )


def sessions_within_slo(
    workload: Workload, met: np.ndarray, finished_at: np.ndarray, wall_clock_seconds: float | None
) -> np.ndarray:
    """Per session, whether it completed within its SLO: every one of its requests was answered
    within its class's targets (`met`: a refused, unsent or late request fails its session) and its
    last answer came within `wall_clock_seconds` of its root's arrival."""
    if workload.session_index is None or workload.parent_index is None:
        raise ValueError("sessions_within_slo needs a workload of sessions")
    session = workload.session_index
    count = int(session.max()) + 1 if session.size else 0
    failed = np.zeros(count, dtype=bool)
    np.logical_or.at(failed, session, ~met)
    if wall_clock_seconds is not None:
        opened = np.full(count, np.inf)
        roots = workload.parent_index < 0
        opened[session[roots]] = workload.arrival_seconds[roots]
        last = np.full(count, -np.inf)
        np.maximum.at(last, session, np.where(np.isnan(finished_at), np.inf, finished_at))
        failed |= last - opened > wall_clock_seconds
    return ~failed
