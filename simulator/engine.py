"""One replica group's vLLM engine as a discrete-event model: continuous batching, chunked prefill,
KV blocks with preemption by recompute, and a prefix cache.

Scheduling follows vLLM V1's FCFS scheduler (perf-model §1.5): every step gives each decoding
sequence one token first, then spends what is left of `max_num_batched_tokens` on prefill chunks of
running requests and then of waiting ones, admitting a waiting request only when a seat
(`max_num_seqs`) and KV blocks for its whole prompt are free. When a decode needs a block and none is
free, the newest running request is preempted: its blocks are freed and it waits at the head of the
queue to recompute its prompt and the tokens it had produced. Step durations come from the shared
`StepCostModel`.

Speed: a run of pure decode steps changes nothing but context lengths, so it is planned as one
*macro-step* of k steps whose durations grow linearly (d_j = α + β·j) until the next finish or KV
limit; an arrival cuts it at the end of the step in flight. Per-sequence state is lazy: a decoding
sequence stores `base = context − clock`, so advancing k steps touches only group sums and a
residue count per block phase, never the sequences.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import OrderedDict, deque
from dataclasses import dataclass

from goodput.estimators.service_time import (
    GpuSpec,
    ModelShape,
    StepCostModel,
    default_batch_limits,
)
from goodput.simulator.metrics import (
    ITL_BUCKETS_SECONDS,
    REQUEST_LATENCY_BUCKETS_SECONDS,
    TTFT_BUCKETS_SECONDS,
    HistogramAccumulator,
)
from goodput.simulator.records import RequestExit, RequestLog

BLOCK_TOKENS = 16


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """The engine's shape: what one group of `tensor × pipeline` GPUs can batch and hold."""

    cost: StepCostModel
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_capacity_tokens: int
    block_tokens: int = BLOCK_TOKENS
    prefix_caching: bool = True
    step_noise_sigma: float = 0.0
    """σ of a multiplicative, mean-one lognormal factor on each step's duration (0 = deterministic)."""

    @property
    def kv_capacity_blocks(self) -> int:
        return self.kv_capacity_tokens // self.block_tokens

    @classmethod
    def for_hardware(
        cls,
        model: ModelShape,
        gpu: GpuSpec,
        tensor_parallel: int = 1,
        pipeline_parallel: int = 1,
        *,
        step_noise_sigma: float = 0.0,
        max_num_seqs: int | None = None,
        max_num_batched_tokens: int | None = None,
        kv_capacity_tokens: int | None = None,
    ) -> EngineConfig:
        """vLLM 0.33's batch defaults for the GPU and the cost model's KV capacity, unless overridden."""
        cost = StepCostModel.from_hardware(model, gpu, tensor_parallel, pipeline_parallel)
        default_seqs, default_tokens = default_batch_limits(gpu)
        return cls(
            cost=cost,
            max_num_seqs=max_num_seqs or default_seqs,
            max_num_batched_tokens=max_num_batched_tokens or default_tokens,
            kv_capacity_tokens=cost.kv_capacity_tokens if kv_capacity_tokens is None else kv_capacity_tokens,
            step_noise_sigma=step_noise_sigma,
        )


class PrefixCache:
    """Prefix blocks (by id) held in KV, least recently used evicted first.

    A request's hit is the run of its leading block ids that are cached; the bound (in prefix blocks)
    is passed in at each insertion.
    """

    __slots__ = ("_blocks",)

    def __init__(self) -> None:
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def leading_hits(self, block_ids: tuple[int, ...]) -> int:
        hits = 0
        blocks = self._blocks
        for block_id in block_ids:
            if block_id not in blocks:
                break
            blocks.move_to_end(block_id)
            hits += 1
        return hits

    def insert(self, block_ids: tuple[int, ...], capacity_blocks: int) -> None:
        blocks = self._blocks
        for block_id in block_ids:
            blocks[block_id] = None
            blocks.move_to_end(block_id)
        while len(blocks) > max(0, capacity_blocks):
            blocks.popitem(last=False)


class _Seq:
    """A request inside one engine (mutable, engine-private)."""

    __slots__ = (
        "base",
        "computed",
        "generated",
        "index",
        "key",
        "output",
        "prefix_blocks",
        "prompt",
        "reserved_blocks",
        "slot",
        "slow_gaps",
        "slow_mark",
        "target",
    )

    def __init__(
        self, index: int, prompt: int, output: int, prefix_blocks: tuple[int, ...] | None, slot: int
    ) -> None:
        self.index = index
        self.prompt = prompt
        self.output = output
        self.prefix_blocks = prefix_blocks
        self.slot = slot
        """Which ITL target this request's token gaps are counted against (-1: none)."""
        self.slow_mark = 0
        self.slow_gaps = 0
        self.generated = 0
        self.target = prompt
        """Tokens to prefill at this admission: the prompt, plus produced tokens after a preemption."""
        self.computed = 0
        self.reserved_blocks = 0
        self.base = 0
        self.key = -1


_IDLE, _MIXED, _DECODE, _WAKE = 0, 1, 2, 3


class SimulatedEngine:
    """The scheduler and KV state of one group; the fleet drives it by time.

    Protocol with the event loop: `enqueue` and `complete_step` return nothing; afterwards
    `step_end` is the time the step (or macro-step) in flight ends, or None when idle, and
    `plan_version` changes whenever `step_end` was replanned, so stale heap entries can be skipped.
    """

    def __init__(
        self,
        config: EngineConfig,
        log: RequestLog,
        rng: random.Random,
        *,
        prefix_block_tokens: int = 512,
        started_at: float = 0.0,
        itl_targets_seconds: tuple[float, ...] = (),
    ) -> None:
        self.config = config
        # Per ITL target, how many steps so far took longer: a request's slow gaps are the difference
        # between the count when it finishes and when it started decoding (no per-token bookkeeping).
        self._itl_targets = itl_targets_seconds
        self._slow_steps = [0] * len(itl_targets_seconds)
        self._cost = config.cost
        self._log = log
        self._rng = rng
        self._bt = config.block_tokens
        self._capacity_blocks = config.kv_capacity_blocks
        self._prefix_block_tokens = prefix_block_tokens
        # vLLM's prefix cache spans the whole KV cache: blocks of running requests are cached too,
        # and freed ones stay until an allocation evicts them, least recently used first.
        self._prefix_capacity = config.kv_capacity_tokens // prefix_block_tokens
        self.prefix_cache = PrefixCache()

        self.waiting: deque[_Seq] = deque()
        self.running: dict[int, _Seq] = {}  # admission order; holds prefilling and decoding requests
        self._prefilling: dict[int, _Seq] = {}
        self._decoding: dict[int, _Seq] = {}
        self._next_key = 0
        self.waiting_prompt_tokens = 0

        # decode-set aggregates at the current clock (context of a decoder = base + clock)
        self.clock = 0
        self._base_sum = 0
        self._residues = [0] * self._bt
        self._finish_heap: list[tuple[int, int]] = []  # (finish clock, key)
        self.decode_blocks = 0
        self.prefill_blocks = 0

        # the plan in flight
        self._kind = _IDLE
        self.step_end: float | None = None
        self.plan_version = 0
        self._start = started_at
        self._steps = 0
        self._alpha = 0.0
        self._beta = 0.0
        self._noise = 1.0
        self._chunks: list[tuple[_Seq, int]] = []
        # Off unless a gateway in front reads them: requests whose first token streamed, and requests
        # that left the engine (finished or refused), since the gateway last looked.
        self.started_log: list[int] | None = None
        self.ended_log: list[int] | None = None

        self._reset_counters(started_at)

    def _reset_counters(self, started_at: float) -> None:
        """The counters and histograms, as vLLM exports them: zero at the engine's start."""
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.prefix_cache_queries_total = 0
        self.prefix_cache_hits_total = 0
        self.num_preemptions_total = 0
        self.request_success_total = 0
        self.request_prompt_tokens_sum = 0
        self.request_generation_tokens_sum = 0
        self.gpu_busy_seconds_total = 0.0
        self.steps_total = 0
        self._in_flight_area = 0.0
        self._in_flight_since = started_at
        self.ttft = HistogramAccumulator(TTFT_BUCKETS_SECONDS)
        self.itl = HistogramAccumulator(ITL_BUCKETS_SECONDS)
        self.queue_time = HistogramAccumulator(REQUEST_LATENCY_BUCKETS_SECONDS)
        self.e2e = HistogramAccumulator(REQUEST_LATENCY_BUCKETS_SECONDS)
        # vllm:request_time_per_output_token_seconds: per finished request, its decode time over its
        # tokens after the first.
        self.tpot = HistogramAccumulator(ITL_BUCKETS_SECONDS)

    # ------------------------------------------------------------------ observation
    @property
    def in_flight(self) -> int:
        return len(self.running) + len(self.waiting)

    @property
    def used_blocks(self) -> int:
        return self.decode_blocks + self.prefill_blocks

    @property
    def kv_usage(self) -> float:
        return min(1.0, self.used_blocks / self._capacity_blocks) if self._capacity_blocks else 1.0

    def in_flight_seconds(self, now: float) -> float:
        return self._in_flight_area + self.in_flight * (now - self._in_flight_since)

    def _count_in_flight(self, now: float) -> None:
        self._in_flight_area += self.in_flight * (now - self._in_flight_since)
        self._in_flight_since = now

    # ------------------------------------------------------------------ entry points
    def fits(self, prompt_tokens: int) -> bool:
        """Whether a prompt can ever be admitted (its blocks fit an empty cache)."""
        return -(-prompt_tokens // self._bt) <= self._capacity_blocks

    def enqueue(
        self,
        index: int,
        prompt: int,
        output: int,
        prefix_blocks: tuple[int, ...] | None,
        now: float,
        *,
        itl_slot: int = -1,
    ) -> None:
        """A routed request joins the waiting queue; it can start at the next step boundary.

        itl_slot: index into `itl_targets_seconds` of the target its token gaps are judged against.
        """
        self.advance_to(now)
        self._count_in_flight(now)
        seq = _Seq(index, prompt, output, prefix_blocks, itl_slot)
        self.waiting.append(seq)
        self.waiting_prompt_tokens += prompt
        if self._kind == _IDLE:
            # Wake at `now` rather than plan at once, so every request arriving at this instant is
            # queued before the step is composed (the scheduler loop picks up all of them).
            self._kind = _WAKE
            self._start = now
            self.step_end = now
            self.plan_version += 1
        elif self._kind == _DECODE and self._steps > 1:
            # finish the step in flight, then reschedule with the newcomer
            self._steps = 1
            self.step_end = self._start + self._noise * self._alpha
            self.plan_version += 1

    def complete_step(self, now: float) -> None:
        """The step (or macro-step) in flight has ended at `now`: apply it and plan the next one."""
        if self._kind == _MIXED:
            self._end_mixed_step(now)
        elif self._kind == _DECODE:
            self._commit_decode_steps(self._steps, now)
            self._finish_decoders(now)
        self._plan(now)

    def advance_to(self, now: float) -> None:
        """Commit the decode steps of the macro-step in flight that ended by `now` (for scrapes)."""
        if self._kind != _DECODE or self._steps <= 1:
            return
        done = min(self._steps - 1, self._steps_within((now - self._start) / self._noise))
        if done > 0:
            elapsed = self._noise * (done * self._alpha + self._beta * done * (done - 1) / 2.0)
            self._commit_decode_steps(done, self._start + elapsed)
            self._start += elapsed
            self._alpha += self._beta * done
            self._steps -= done

    def abort_all(self, now: float) -> list[int]:
        """The group failed: every request in it is lost. Returns their workload indices."""
        self.advance_to(now)
        self._count_in_flight(now)
        lost = [seq.index for seq in self.running.values()] + [seq.index for seq in self.waiting]
        self.running.clear()
        self._prefilling.clear()
        self._decoding.clear()
        self.waiting.clear()
        self._finish_heap.clear()
        self._residues = [0] * self._bt
        self._base_sum = 0
        self.decode_blocks = self.prefill_blocks = 0
        self.waiting_prompt_tokens = 0
        self._kind = _IDLE
        self.step_end = None
        self.plan_version += 1
        return lost

    # ------------------------------------------------------------------ decode-set bookkeeping
    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self._bt)

    def _new_decode_blocks(self, steps: int) -> int:
        """Blocks the decode set allocates over the next `steps` steps (exact).

        Every decoder crosses one block boundary per `block_tokens` steps; in the remaining m < bt
        steps, a decoder whose context sits at offset s in its last block needs a block when s == 0
        or s > bt − m: one cyclic range of m offsets, i.e. of residues, summed from the counts.
        """
        bt = self._bt
        cycles, remainder = divmod(steps, bt)
        total = len(self._decoding) * cycles
        if remainder:
            residues = self._residues
            start = (bt - remainder + 1 - self.clock) % bt
            end = start + remainder
            total += (
                sum(residues[start:end]) if end <= bt else sum(residues[start:]) + sum(residues[: end - bt])
            )
        return total

    def _next_step_blocks(self) -> int:
        """Blocks the next decode step allocates: one per decoder whose last block is full."""
        return self._residues[-self.clock % self._bt]

    def _steps_before_kv_full(self, free_blocks: int, wanted: int) -> int:
        """The most decode steps (≤ wanted) whose new blocks fit in `free_blocks`."""
        count = len(self._decoding)
        bt = self._bt
        if count == 0 or free_blocks >= count * -(-wanted // bt):
            return wanted
        cycles = free_blocks // count
        remainder = free_blocks - cycles * count
        steps = cycles * bt
        extra = 0
        for more in range(1, bt):
            if self._new_decode_blocks(more) > remainder:
                break
            extra = more
        return min(wanted, steps + extra)

    def _add_decoder(self, seq: _Seq) -> None:
        context = seq.prompt + seq.generated
        seq.base = context - self.clock
        self._decoding[seq.key] = seq
        self._base_sum += seq.base
        self._residues[seq.base % self._bt] += 1
        self.decode_blocks += self._blocks_for(context)
        if seq.slot >= 0:
            seq.slow_mark = self._slow_steps[seq.slot]
        heapq.heappush(self._finish_heap, (self.clock + seq.output - seq.generated, seq.key))

    def _remove_decoder(self, seq: _Seq) -> None:
        del self._decoding[seq.key]
        context = seq.base + self.clock
        seq.generated = context - seq.prompt
        self._base_sum -= seq.base
        self._residues[seq.base % self._bt] -= 1
        self.decode_blocks -= self._blocks_for(context)
        if seq.slot >= 0:
            seq.slow_gaps += self._slow_steps[seq.slot] - seq.slow_mark

    def _commit_decode_steps(self, steps: int, end: float) -> None:
        """`steps` decode steps of the current composition happened, the last ending at `end`."""
        decoders = len(self._decoding)
        elapsed = self._noise * (steps * self._alpha + self._beta * steps * (steps - 1) / 2.0)
        self.gpu_busy_seconds_total += elapsed
        self.steps_total += steps
        first, increment = self._noise * self._alpha, self._noise * self._beta
        self.itl.observe_linear(first, increment, steps, decoders)
        for slot, target in enumerate(self._itl_targets):
            self._slow_steps[slot] += _count_above(target, first, increment, steps)
        self.decode_blocks += self._new_decode_blocks(steps)
        self.clock += steps
        self.generation_tokens_total += decoders * steps

    def _finish_decoders(self, now: float) -> None:
        heap = self._finish_heap
        clock = self.clock
        log = self._log
        finished = False
        while heap and heap[0][0] <= clock:
            _, key = heapq.heappop(heap)
            seq = self._decoding.get(key)
            if seq is None:
                continue  # preempted since: a stale entry
            if not finished:
                self._count_in_flight(now)
                finished = True
            self._remove_decoder(seq)
            del self.running[key]
            self._finish(seq, now, log)

    def _finish(self, seq: _Seq, now: float, log: RequestLog) -> None:
        if self.ended_log is not None:
            self.ended_log.append(seq.index)
        log.finished_at[seq.index] = now
        log.outcome[seq.index] = RequestExit.FINISHED
        log.slow_gaps[seq.index] = seq.slow_gaps
        self.request_success_total += 1
        self.request_prompt_tokens_sum += seq.prompt
        self.request_generation_tokens_sum += seq.output
        self.e2e.observe(now - log.routed_at[seq.index])
        if seq.output > 1:
            self.tpot.observe((now - log.first_token_at[seq.index]) / (seq.output - 1))

    # ------------------------------------------------------------------ steps
    def _steps_within(self, elapsed: float) -> int:
        """How many decode steps of the plan fit in `elapsed` noise-free seconds: max k with T(k) ≤ e."""
        alpha, beta = self._alpha, self._beta
        if elapsed <= 0.0:
            return 0
        if beta <= 0.0:
            steps = int(elapsed / alpha)
        else:
            linear = alpha - beta / 2.0
            steps = int((-linear + math.sqrt(linear * linear + 2.0 * beta * elapsed)) / beta)
        while steps > 0 and steps * alpha + beta * steps * (steps - 1) / 2.0 > elapsed:
            steps -= 1
        while (steps + 1) * alpha + beta * (steps + 1) * steps / 2.0 <= elapsed:
            steps += 1
        return steps

    def _noise_factor(self, steps: int) -> float:
        """Mean-one lognormal factor for the mean of `steps` i.i.d. step factors (Fenton–Wilkinson)."""
        sigma = self.config.step_noise_sigma
        if sigma <= 0.0:
            return 1.0
        variance = math.log1p(math.expm1(sigma * sigma) / steps)
        return math.exp(self._rng.gauss(-variance / 2.0, math.sqrt(variance)))

    def _preempt_newest(self, now: float) -> None:
        key, seq = self.running.popitem()
        if key in self._decoding:
            self._remove_decoder(seq)
            seq.slow_gaps += 1  # the wait for recompute is one long gap in its token stream
        else:
            del self._prefilling[key]
            self.prefill_blocks -= seq.reserved_blocks
            self.waiting_prompt_tokens -= seq.target - seq.computed
        seq.reserved_blocks = 0
        seq.target = seq.prompt + seq.generated
        seq.computed = 0
        self.waiting.appendleft(seq)
        self.waiting_prompt_tokens += seq.target
        self.num_preemptions_total += 1
        self._log.preemptions[seq.index] += 1

    def _plan(self, now: float) -> None:
        """Compose the next step at a boundary, or go idle."""
        self._kind = _IDLE
        self.step_end = None
        self.plan_version += 1
        running, waiting, decoding, prefilling = self.running, self.waiting, self._decoding, self._prefilling
        if not running and not waiting:
            return
        capacity = self._capacity_blocks
        # Decodes first: each needs room for its next token, or the newest request is preempted.
        while decoding and self._next_step_blocks() > capacity - self.decode_blocks - self.prefill_blocks:
            self._preempt_newest(now)
        decoders = len(decoding)
        if not waiting and not prefilling:
            self._plan_decode(now, decoders)
            return
        budget = self.config.max_num_batched_tokens - decoders
        free = capacity - self.decode_blocks - self.prefill_blocks - self._next_step_blocks()
        chunks: list[tuple[_Seq, int]] = []
        tokens = decoders
        units = 0.0
        for seq in prefilling.values():
            if budget <= 0:
                break
            chunk = min(seq.target - seq.computed, budget)
            chunks.append((seq, chunk))
            units += chunk * (seq.computed + chunk / 2.0)
            tokens += chunk
            budget -= chunk
        max_seqs = self.config.max_num_seqs
        while waiting and budget > 0 and len(running) < max_seqs:
            seq = waiting[0]
            need = -(-seq.target // self._bt)
            if need > free:
                if not running and need > capacity:
                    self._reject_oversized(seq, now)
                    continue
                break
            free -= need
            cached = self._admit(need, now)
            chunk = min(seq.target - cached, budget)
            chunks.append((seq, chunk))
            units += chunk * (cached + chunk / 2.0)
            tokens += chunk
            budget -= chunk
        if chunks:
            self._plan_mixed(now, chunks, tokens, units, decoders)
        elif decoders:
            self._plan_decode(now, decoders)
        # else nothing is runnable: only after rejecting an oversized request at an empty engine

    def _admit(self, need: int, now: float) -> int:
        """The head of the waiting queue joins the running batch with `need` KV blocks reserved;
        returns the prompt tokens the prefix cache already holds (its first chunk starts after them)."""
        seq = self.waiting.popleft()
        seq.reserved_blocks = need
        self.prefill_blocks += need
        seq.key = key = self._next_key
        self._next_key += 1
        self.running[key] = seq
        self._prefilling[key] = seq
        cached = self._prefix_hit(seq)
        seq.computed = cached
        self.waiting_prompt_tokens -= cached
        log = self._log
        if math.isnan(log.scheduled_at[seq.index]):
            log.scheduled_at[seq.index] = now
            log.cached_tokens[seq.index] = cached
            self.queue_time.observe(now - log.routed_at[seq.index])
        return cached

    def _plan_mixed(
        self, now: float, chunks: list[tuple[_Seq, int]], tokens: int, units: float, decoders: int
    ) -> None:
        """One step of prefill chunks beside every decode, priced by the step-cost model."""
        context = self._base_sum + decoders * self.clock
        duration = self._cost.step_seconds(tokens, units, context, decoders + len(chunks))
        noise = self._noise_factor(1)
        self._kind = _MIXED
        self._chunks = chunks
        self._steps = 1
        self._alpha = duration
        self._beta = 0.0
        self._noise = noise
        self._start = now
        self.step_end = now + noise * duration

    def _plan_decode(self, now: float, decoders: int) -> None:
        """A macro-step of identical decode steps, until the first finish or the KV cache fills."""
        if not decoders:
            return
        heap = self._finish_heap
        decoding = self._decoding
        while heap[0][1] not in decoding:
            heapq.heappop(heap)
        clock = self.clock
        free = self._capacity_blocks - self.decode_blocks - self.prefill_blocks
        steps = self._steps_before_kv_full(free, heap[0][0] - clock)
        cost = self._cost
        alpha = cost.step_seconds(decoders, 0.0, self._base_sum + decoders * clock, decoders)
        beta = cost.context_read_seconds_per_token * decoders
        noise = self._noise_factor(steps)
        self._kind = _DECODE
        self._steps = steps
        self._alpha = alpha
        self._beta = beta
        self._noise = noise
        self._start = now
        self.step_end = now + noise * (steps * alpha + beta * steps * (steps - 1) / 2.0)

    def _prefix_hit(self, seq: _Seq) -> int:
        """Prompt tokens served from the prefix cache (at least one token is always computed)."""
        if not self.config.prefix_caching:
            return 0
        self.prefix_cache_queries_total += seq.target
        if not seq.prefix_blocks:
            return 0
        hits = self.prefix_cache.leading_hits(seq.prefix_blocks)
        cached = min(hits * self._prefix_block_tokens, seq.target - 1)
        self.prefix_cache_hits_total += cached
        return cached

    def _reject_oversized(self, seq: _Seq, now: float) -> None:
        self.waiting.popleft()
        self._count_in_flight(now)
        self.waiting_prompt_tokens -= seq.target
        self._log.outcome[seq.index] = RequestExit.REJECTED_TOO_LONG
        self._log.finished_at[seq.index] = now
        if self.ended_log is not None:
            self.ended_log.append(seq.index)

    def _end_mixed_step(self, now: float) -> None:
        decoders = len(self._decoding)
        duration = now - self._start
        self.gpu_busy_seconds_total += duration
        self.steps_total += 1
        for slot, target in enumerate(self._itl_targets):
            if duration > target:
                self._slow_steps[slot] += 1
        if decoders:
            self.itl.observe(duration, decoders)
            self.decode_blocks += self._new_decode_blocks(1)
            self.clock += 1
            self.generation_tokens_total += decoders
            self._finish_decoders(now)
        log = self._log
        for seq, chunk in self._chunks:
            seq.computed += chunk
            self.waiting_prompt_tokens -= chunk
            if seq.computed < seq.target:
                continue
            # prefill complete: this step sampled the request's next token
            del self._prefilling[seq.key]
            self.prefill_blocks -= seq.reserved_blocks
            seq.reserved_blocks = 0
            seq.generated += 1
            self.generation_tokens_total += 1
            if math.isnan(log.first_token_at[seq.index]):
                log.first_token_at[seq.index] = now
                if self.started_log is not None:
                    self.started_log.append(seq.index)
                self.ttft.observe(now - log.routed_at[seq.index])
                self.prompt_tokens_total += seq.prompt
                if seq.prefix_blocks and self.config.prefix_caching:
                    self.prefix_cache.insert(seq.prefix_blocks, self._prefix_capacity)
            if seq.generated >= seq.output:
                self._count_in_flight(now)
                del self.running[seq.key]
                self._finish(seq, now, log)
            else:
                self._add_decoder(seq)
        self._chunks = []


def _count_above(threshold: float, first: float, increment: float, steps: int) -> int:
    """How many of the durations first + increment·j (j < steps) exceed `threshold`."""
    if steps <= 0 or first + increment * (steps - 1) <= threshold:
        return 0
    if first > threshold or increment <= 0.0:
        return steps
    at_or_below = min(steps, int((threshold - first) // increment) + 1)
    # the division can land one off at an exact boundary: settle it on the durations themselves
    while at_or_below > 0 and first + increment * (at_or_below - 1) > threshold:
        at_or_below -= 1
    while at_or_below < steps and first + increment * at_or_below <= threshold:
        at_or_below += 1
    return steps - at_or_below
