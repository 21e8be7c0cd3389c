"""A fixed fleet advanced in ticks, every group at once: the engine for fleets too large for the
per-step event engine (`engine.py`), such as a thousand groups under thousands of requests a second.

The event engine pays a heap event per engine step and a routing scan per request, so its cost grows
with groups × steps; at 1,000 groups it runs slower than real time. Here every group's state is a
column of numpy arrays and one tick (default 0.1 s) advances all of them with a handful of array
operations, whatever the fleet's size.

Each group is a fluid form of the same vLLM scheduler, priced by the same `StepCostModel`. In a tick
it runs mixed steps (every decoding sequence one token; the rest of `max_num_batched_tokens` on the
waiting prompts, first come first served) until its waiting prompt tokens are done or the tick ends,
then decode-only steps. A request's first token comes when its group's prefill frontier passes the
end of its prompt in that group's queue; it finishes once the group's step count has grown by its
output tokens. Both instants are read from the group's step clock inside the tick, so requests are
timed finer than the tick, and never earlier than their own prefill on an idle group allows.

Left out, where the event engine keeps them: preemption (KV is taken token by token as prompts are
prefilled, and a full cache pauses prefill), the prefix cache, step noise, the share of token gaps
slower than the ITL target (a tick knows only its steps' mean duration, so the report leaves that
share out), the `max_num_seqs` limit on prefilling sequences, failures, the gateway, and scaling (the
fleet is the `fixed` policy's). Where the KV cache is full its TTFT comes out up to about a third
lower than the event engine's, which spends steps recomputing preempted requests; attainment and
TPOT still agree there.
`tests/test_sim_batched.py` holds it to the event engine's figures on a fleet both can run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from goodput.simulator.engine import EngineConfig
from goodput.simulator.fleet import FleetConfig, FleetCounts, GroupPhase
from goodput.simulator.records import RequestExit
from goodput.simulator.simulation import GroupRecord, SimulationResult
from goodput.simulator.workload import Workload

Floats = npt.NDArray[np.float64]
Indices = npt.NDArray[np.int64]

MAX_TICK_SECONDS = 1.0


def check_tick_seconds(tick_seconds: float, name: str = "tick_seconds") -> None:
    """A tick of at most a second: requests are timed within it, but a tick's arrivals share one
    prefill chunk, so a longer one would blur TTFT by its own length."""
    if not 0.0 < tick_seconds <= MAX_TICK_SECONDS:
        raise ValueError(f"{name}: must be in (0, {MAX_TICK_SECONDS:g}] s, got {tick_seconds:g}")


@dataclass(frozen=True, slots=True)
class BatchedRunSettings:
    """A fixed fleet's run: how many groups, how finely time is cut, and when it stops."""

    groups: int
    tick_seconds: float = 0.1
    horizon_seconds: float | None = None
    """End of the offered window (cost is counted over [0, horizon]); default: the last arrival."""
    tail_seconds: float = 900.0
    """After the last arrival, how long in-flight requests may still finish before the run stops."""

    def __post_init__(self) -> None:
        if self.groups < 1:
            raise ValueError(f"groups: a fixed fleet needs at least one group, got {self.groups}")
        check_tick_seconds(self.tick_seconds)


def simulate_batched(
    workload: Workload, fleet: FleetConfig, settings: BatchedRunSettings
) -> SimulationResult:
    """Replay `workload` through `settings.groups` groups ready from t=0 and never scaled, routed by
    the fleet's router (each of `fleet.ROUTERS`)."""
    return _BatchedRun(workload, fleet, settings).run()


class _Groups:
    """Every group's state as columns. Token positions are cumulative per group: a request's prompt
    occupies [end − prompt, end) of its group's enqueued tokens, and the group has prefilled every
    token below `prefilled`."""

    def __init__(self, count: int) -> None:
        def zeros() -> Floats:
            return np.zeros(count, dtype=np.float64)

        self.enqueued_tokens = zeros()
        self.prefilled_tokens = zeros()
        self.waiting_prompt_sum = zeros()
        """Σ prompt tokens of requests without a first token (queued or partly prefilled)."""
        self.waiting_prompt_squares = zeros()
        """Σ prompt² of the same requests: their mean attention cost per prefilled token."""
        self.steps = zeros()
        """Engine steps run so far (fractional inside a tick's plan): the decoders' clock."""
        self.decoding = zeros()
        self.decoding_prompt_sum = zeros()
        self.decoding_start_steps_sum = zeros()
        self.in_flight = zeros()
        self.busy_seconds = zeros()

    def decode_context_tokens(self) -> Floats:
        """Σ context of the decoding sequences: prompt plus the tokens each produced so far."""
        return self.decoding_prompt_sum + self.decoding * self.steps - self.decoding_start_steps_sum


@dataclass(frozen=True, slots=True)
class _TickPlan:
    """One tick of every group: mixed steps first, then decode-only steps, each of fixed duration."""

    start: float
    steps_before: Floats
    mixed_step_seconds: Floats
    mixed_steps: Floats
    mixed_seconds: Floats
    decode_step_seconds: Floats
    decode_steps: Floats

    def steps_at(self, groups: Indices, at: Floats) -> Floats:
        """Each group's step count at instant `at` within the tick (clipped to the tick)."""
        offset = np.clip(at - self.start, 0.0, None)
        mixed_seconds = self.mixed_seconds[groups]
        mixed = np.minimum(offset, mixed_seconds)
        decode_total = self.decode_steps[groups] * self.decode_step_seconds[groups]
        decode = np.minimum(np.maximum(offset - mixed_seconds, 0.0), decode_total)
        return (
            self.steps_before[groups]
            + _divide(mixed, self.mixed_step_seconds[groups])
            + _divide(decode, self.decode_step_seconds[groups])
        )

    def time_of_step(self, groups: Indices, step: Floats) -> Floats:
        """The instant each group's step count reaches `step` (within this tick's steps)."""
        into = step - self.steps_before[groups]
        mixed_steps = self.mixed_steps[groups]
        in_mixed = np.minimum(into, mixed_steps) * self.mixed_step_seconds[groups]
        in_decode = np.maximum(into - mixed_steps, 0.0) * self.decode_step_seconds[groups]
        return self.start + in_mixed + in_decode


def _divide(numerator: Floats, denominator: Floats) -> Floats:
    return np.divide(numerator, denominator, out=np.zeros_like(numerator), where=denominator > 0)


def water_fill(work: Floats, weights: Floats) -> Indices:
    """The group of each request (in arrival order) when each goes where the least work waits.

    One by one, a least-work router raises the lowest groups to a common level; this finds that
    level for all the tick's requests at once and lays the requests, in order, along the shortfall of
    the groups below it, lowest first.
    """
    order = np.argsort(work, kind="stable")
    sorted_work = work[order]
    total = float(weights.sum())
    below = np.arange(1, len(work) + 1) * sorted_work - np.cumsum(sorted_work) <= total
    count = int(below.sum())
    level = (total + float(sorted_work[:count].sum())) / count
    shortfall_ends = np.cumsum(level - sorted_work[:count])
    starts = np.cumsum(weights) - weights
    slots = np.minimum(np.searchsorted(shortfall_ends, starts, side="right"), count - 1)
    return order[slots]


class _BatchedRun:
    """One replay: the requests' columns, the groups' columns, and the queues as index arrays."""

    def __init__(self, workload: Workload, fleet: FleetConfig, settings: BatchedRunSettings) -> None:
        self.started = time.perf_counter()
        self.workload, self.fleet, self.settings = workload, fleet, settings
        self.engine: EngineConfig = fleet.engine
        count = len(workload)
        self.arrival = workload.arrival_seconds.astype(np.float64)
        self.prompt = workload.input_tokens.astype(np.float64)
        self.output = workload.output_tokens.astype(np.float64)
        self.group = np.full(count, -1, dtype=np.int64)
        self.outcome = np.full(count, int(RequestExit.PENDING), dtype=np.int64)
        self.routed_at, self.scheduled_at, self.first_token_at, self.finished_at = (
            np.full(count, np.nan) for _ in range(4)
        )
        self.state = _Groups(settings.groups)
        # The queues, each as parallel columns so a tick reads them without gathering from the
        # requests' columns: waiting for a first token, and decoding.
        self.pending = np.zeros(0, dtype=np.int64)
        self.pending_groups = np.zeros(0, dtype=np.int64)
        self.pending_ends = np.zeros(0, dtype=np.float64)
        self.decoders = np.zeros(0, dtype=np.int64)
        self.decoder_groups = np.zeros(0, dtype=np.int64)
        self.decoder_start_steps = np.zeros(0, dtype=np.float64)
        self.decoder_finish_steps = np.zeros(0, dtype=np.float64)
        self.next_arrival = 0
        self.round_robin = 0
        last_arrival = float(self.arrival[-1]) if count else 0.0
        self.horizon = settings.horizon_seconds if settings.horizon_seconds is not None else last_arrival
        self.stop_at = max(self.horizon, last_arrival) + settings.tail_seconds
        self.ticks = 0

    def run(self) -> SimulationResult:
        tick = self.settings.tick_seconds
        index, now = 0, 0.0
        while now < self.stop_at:
            if not self.pending.size and not self.decoders.size:
                if self.next_arrival >= len(self.arrival):
                    break
                index = max(index, int(self.arrival[self.next_arrival] // tick))  # skip idle time
            now = index * tick
            self.route(now, now + tick)
            self.advance(now, tick)
            index += 1
            self.ticks += 1
        return self.result(min(now, self.stop_at))

    # ------------------------------------------------------------------ routing
    def route(self, start: float, end: float) -> None:
        """The tick's arrivals join their groups' queues, in arrival order, as the router sends them."""
        first = self.next_arrival
        last = int(np.searchsorted(self.arrival, end, side="left"))
        if last <= first:
            return
        self.next_arrival = last
        arrivals = np.arange(first, last)
        blocks = np.ceil(self.prompt[arrivals] / self.engine.block_tokens)
        too_long = arrivals[blocks > self.engine.kv_capacity_blocks]
        self.outcome[too_long] = int(RequestExit.REJECTED_TOO_LONG)
        self.finished_at[too_long] = self.arrival[too_long]
        routed = arrivals[blocks <= self.engine.kv_capacity_blocks]
        if not routed.size:
            return
        groups = self._choose_groups(routed)
        self.group[routed] = groups
        self.routed_at[routed] = self.arrival[routed]
        ends = self._enqueue(routed, groups)
        self.pending = np.concatenate((self.pending, routed))
        self.pending_groups = np.concatenate((self.pending_groups, groups))
        self.pending_ends = np.concatenate((self.pending_ends, ends))

    def _choose_groups(self, routed: Indices) -> Indices:
        state, router = self.state, self.fleet.router
        if router == "round-robin":
            groups = (self.round_robin + np.arange(routed.size)) % self.settings.groups
            self.round_robin = int(groups[-1]) + 1
            return groups
        if router == "least-requests":
            return water_fill(state.in_flight, np.ones(routed.size))
        expected = float(self.fleet.expected_output_tokens)
        work = state.enqueued_tokens - state.prefilled_tokens + state.in_flight * expected
        return water_fill(work, self.prompt[routed] + expected)

    def _enqueue(self, routed: Indices, groups: Indices) -> Floats:
        """Each request's prompt takes the next positions of its group's queue; returns where each
        prompt ends."""
        state, size = self.state, self.settings.groups
        prompts = self.prompt[routed]
        order = np.argsort(groups, kind="stable")
        sorted_groups, sorted_prompts = groups[order], prompts[order]
        before = np.cumsum(sorted_prompts) - sorted_prompts
        segment_start = np.searchsorted(sorted_groups, sorted_groups, side="left")
        ends = np.empty_like(before)
        ends[order] = state.enqueued_tokens[sorted_groups] + before - before[segment_start] + sorted_prompts
        state.enqueued_tokens += np.bincount(groups, prompts, size)
        state.waiting_prompt_sum += np.bincount(groups, prompts, size)
        state.waiting_prompt_squares += np.bincount(groups, prompts * prompts, size)
        state.in_flight += np.bincount(groups, minlength=size)
        return ends

    # ------------------------------------------------------------------ one tick of every group
    def advance(self, now: float, tick: float) -> None:
        """Mixed steps, the first tokens they produce, decode-only steps, then the finishes."""
        state = self.state
        context_before = state.decode_context_tokens()
        mixed_step, mixed_steps, chunk = self._plan_mixed(context_before, tick)
        joined, joined_groups, first = self._first_tokens(now, mixed_step, chunk, mixed_steps)
        decoders = state.decoding + np.bincount(joined_groups, minlength=self.settings.groups)
        context = (
            context_before
            + state.decoding * mixed_steps
            + np.bincount(joined_groups, self.prompt[joined], self.settings.groups)
        )
        cost = self.engine.cost
        mixed_seconds = mixed_steps * mixed_step
        decode_step = cost.step_seconds_array(decoders, np.zeros_like(context), context, decoders)
        decode_steps = _divide(np.maximum(tick - mixed_seconds, 0.0), decode_step)
        plan = _TickPlan(
            now, state.steps.copy(), mixed_step, mixed_steps, mixed_seconds, decode_step, decode_steps
        )
        self._start_decoding(plan, joined, joined_groups, first)
        state.steps += mixed_steps + decode_steps
        state.busy_seconds += mixed_seconds + decode_steps * decode_step
        self._finish(plan)

    def _plan_mixed(self, context: Floats, tick: float) -> tuple[Floats, Floats, Floats]:
        """Per group: the mixed step's duration, how many fit the tick, and its prefill chunk."""
        state, engine = self.state, self.engine
        waiting = state.enqueued_tokens - state.prefilled_tokens
        partly_prefilled = state.prefilled_tokens - (state.enqueued_tokens - state.waiting_prompt_sum)
        kv_free = np.maximum(engine.kv_capacity_tokens - context - partly_prefilled, 0.0)
        prefillable = np.where(state.decoding < engine.max_num_seqs, np.minimum(waiting, kv_free), 0.0)
        chunk = np.clip(np.minimum(engine.max_num_batched_tokens - state.decoding, prefillable), 0.0, None)
        units_per_token = _divide(state.waiting_prompt_squares, 2.0 * state.waiting_prompt_sum)
        has_chunk = (chunk > 0).astype(np.float64)
        step = engine.cost.step_seconds_array(
            state.decoding + chunk, chunk * units_per_token, context, state.decoding + has_chunk
        )
        steps = np.minimum(_divide(np.full_like(step, tick), step), _divide(prefillable, chunk))
        return step, steps, chunk

    def _first_tokens(
        self, now: float, mixed_step: Floats, chunk: Floats, mixed_steps: Floats
    ) -> tuple[Indices, Indices, Floats]:
        """The queued requests whose prompts the tick's prefill finished, and when each finished."""
        state, groups, ends = self.state, self.pending_groups, self.pending_ends
        prefilled_after = state.prefilled_tokens + mixed_steps * chunk
        done = ends <= prefilled_after[groups] + 1e-6
        waiting = ~done
        joined, joined_groups, joined_ends = self.pending[done], groups[done], ends[done]
        self.pending, self.pending_groups, self.pending_ends = (
            self.pending[waiting],
            groups[waiting],
            ends[waiting],
        )
        step, tokens_per_step = mixed_step[joined_groups], chunk[joined_groups]
        frontier = (joined_ends - state.prefilled_tokens[joined_groups]) / tokens_per_step * step
        prompt = self.prompt[joined]
        budget = np.maximum(self.engine.max_num_batched_tokens - state.decoding[joined_groups], 1.0)
        alone = np.ceil(prompt / budget) * step  # its own prefill's steps, had it come to an empty queue
        first = np.maximum(now + frontier, self.arrival[joined] + alone)
        self.first_token_at[joined] = first
        self.scheduled_at[joined] = np.maximum(self.arrival[joined], first - alone)
        state.prefilled_tokens = prefilled_after
        size = self.settings.groups
        state.waiting_prompt_sum -= np.bincount(joined_groups, prompt, size)
        state.waiting_prompt_squares -= np.bincount(joined_groups, prompt * prompt, size)
        return joined, joined_groups, first

    def _start_decoding(
        self, plan: _TickPlan, joined: Indices, joined_groups: Indices, first: Floats
    ) -> None:
        """Requests with a first token decode from the step they got it at."""
        state, size = self.state, self.settings.groups
        start = plan.steps_at(joined_groups, first)
        finish = start + self.output[joined] - 1.0
        state.decoding += np.bincount(joined_groups, minlength=size)
        state.decoding_prompt_sum += np.bincount(joined_groups, self.prompt[joined], size)
        state.decoding_start_steps_sum += np.bincount(joined_groups, start, size)
        self.decoders = np.concatenate((self.decoders, joined))
        self.decoder_groups = np.concatenate((self.decoder_groups, joined_groups))
        self.decoder_start_steps = np.concatenate((self.decoder_start_steps, start))
        self.decoder_finish_steps = np.concatenate((self.decoder_finish_steps, finish))

    def _finish(self, plan: _TickPlan) -> None:
        """Decoders whose last token came in this tick leave their group."""
        state, size = self.state, self.settings.groups
        groups, finish = self.decoder_groups, self.decoder_finish_steps
        done = finish <= state.steps[groups] + 1e-9
        decoding = ~done
        finished, finished_groups, finish_steps = self.decoders[done], groups[done], finish[done]
        start_steps = self.decoder_start_steps[done]
        self.decoders, self.decoder_groups = self.decoders[decoding], groups[decoding]
        self.decoder_start_steps = self.decoder_start_steps[decoding]
        self.decoder_finish_steps = finish[decoding]
        at = plan.time_of_step(finished_groups, finish_steps)
        self.finished_at[finished] = np.maximum(at, self.first_token_at[finished])
        self.outcome[finished] = int(RequestExit.FINISHED)
        state.decoding -= np.bincount(finished_groups, minlength=size)
        state.decoding_prompt_sum -= np.bincount(finished_groups, self.prompt[finished], size)
        state.decoding_start_steps_sum -= np.bincount(finished_groups, start_steps, size)
        state.in_flight -= np.bincount(finished_groups, minlength=size)

    # ------------------------------------------------------------------ the result
    def result(self, end: float) -> SimulationResult:
        self.outcome[self.outcome == int(RequestExit.PENDING)] = int(RequestExit.UNFINISHED)
        groups, gpus = self.settings.groups, self.fleet.gpus_per_group
        count = len(self.arrival)
        requests = {
            "arrival": self.arrival,
            "group": self.group,
            "routed_at": self.routed_at,
            "scheduled_at": self.scheduled_at,
            "first_token_at": self.first_token_at,
            "finished_at": self.finished_at,
            "outcome": self.outcome,
            "preemptions": np.zeros(count, dtype=np.int64),
            "cached_tokens": np.zeros(count, dtype=np.int64),
        }
        finished = self.outcome == int(RequestExit.FINISHED)
        return SimulationResult(
            workload=self.workload,
            requests=requests,
            horizon_seconds=self.horizon,
            end_seconds=end,
            gpu_seconds=groups * gpus * self.horizon,
            timeline=(FleetCounts(0.0, groups, 0, 0, groups, 0), FleetCounts(end, groups, 0, 0, groups, 0)),
            scale_events=(),
            decisions=0,
            groups=tuple(
                GroupRecord(f"g{index}", 0.0, 0.0, None, GroupPhase.READY.value) for index in range(groups)
            ),
            engine_totals={
                "steps": float(self.state.steps.sum()),
                "gpu_busy_seconds": float(self.state.busy_seconds.sum()),
                "generation_tokens": float(self.output[finished].sum()),
                "groups_created": float(groups),
                "ticks": float(self.ticks),
            },
            wall_seconds=time.perf_counter() - self.started,
            events_processed=self.ticks,
        )
