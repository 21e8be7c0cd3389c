"""Open-loop request streams for the fleet simulator: public traces, synthetic bursts, and the
transforms that turn one trace into the load a comparison needs.

A workload is column-wise (numpy arrays), so a replay of hundreds of thousands of requests costs a few
megabytes and every transform is vectorised. Every transform is seeded and writes a sentence into
`notes`, which the report carries: a result must say how the offered load was made.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

MOONCAKE_PREFIX_BLOCK_TOKENS = 512
"""Mooncake's hash_ids name 512-token prompt blocks; equal ids mean a shared prefix."""


@dataclass(frozen=True, slots=True, eq=False)
class Workload:
    """Requests sorted by arrival; index i of every column is request i.

    prefix_blocks holds, per request, the ids of its prompt's prefix blocks (`prefix_block_tokens`
    each) when the trace has them (Mooncake); None for traces without prefix information.

    A workload of sessions (`simulator.agentic`) has three more columns: each request's session,
    its parent's index (-1 for the session's root, which opens it) and its delay after its parent's
    answer (the tool wait); the simulator sends a child only once its parent was answered.
    """

    name: str
    arrival_seconds: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    prefix_blocks: tuple[tuple[int, ...], ...] | None = None
    prefix_block_tokens: int = MOONCAKE_PREFIX_BLOCK_TOKENS
    class_index: np.ndarray | None = None
    tenant_index: np.ndarray | None = None
    class_names: tuple[str, ...] = ()
    tenant_names: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)
    session_index: np.ndarray | None = None
    parent_index: np.ndarray | None = None
    after_parent_seconds: np.ndarray | None = None

    @property
    def has_sessions(self) -> bool:
        return self.parent_index is not None

    def __len__(self) -> int:
        return int(self.arrival_seconds.shape[0])

    @property
    def span_seconds(self) -> float:
        return float(self.arrival_seconds[-1]) if len(self) else 0.0

    def take(self, indices: np.ndarray, note: str) -> Workload:
        """A sub- or re-sampled workload; indices need not be sorted, the result is."""
        order = np.argsort(self.arrival_seconds[indices], kind="stable")
        chosen = indices[order]
        return self._select(chosen, self.arrival_seconds[chosen], note)

    def placed(self, indices: np.ndarray, arrival_seconds: np.ndarray, note: str) -> Workload:
        """Requests `indices` (repeats allowed) at new arrival times, which must be sorted: a
        resampled workload keeps each request's lengths, class, tenant and prefix, not its time."""
        if arrival_seconds.shape != indices.shape or np.any(np.diff(arrival_seconds) < 0):
            raise ValueError("placed: one sorted arrival time per request index")
        return self._select(indices, arrival_seconds, note)

    def _select(self, chosen: np.ndarray, arrivals: np.ndarray, note: str) -> Workload:
        blocks = None if self.prefix_blocks is None else tuple(self.prefix_blocks[int(i)] for i in chosen)
        session, parent, after_parent = self._sessions_of(chosen)
        return replace(
            self,
            arrival_seconds=arrivals,
            input_tokens=self.input_tokens[chosen],
            output_tokens=self.output_tokens[chosen],
            prefix_blocks=blocks,
            class_index=None if self.class_index is None else self.class_index[chosen],
            tenant_index=None if self.tenant_index is None else self.tenant_index[chosen],
            notes=(*self.notes, note),
            session_index=session,
            parent_index=parent,
            after_parent_seconds=after_parent,
        )

    def _sessions_of(self, chosen: np.ndarray) -> tuple[np.ndarray | None, ...]:
        """The session columns of a selection, parents renumbered; a selection that repeats a request
        or keeps a child without its parent would break its sessions apart, and is refused."""
        if self.parent_index is None or self.session_index is None or self.after_parent_seconds is None:
            return None, None, None
        position = np.full(len(self), -1, dtype=np.int64)
        position[chosen] = np.arange(chosen.size)
        if np.unique(chosen).size != chosen.size:
            raise ValueError("a workload of sessions cannot repeat requests: copies would share a session")
        parents = self.parent_index[chosen]
        renumbered = np.where(parents >= 0, position[np.maximum(parents, 0)], -1)
        if np.any((parents >= 0) & (renumbered < 0)):
            raise ValueError("this selection keeps children without their parents: it cuts sessions apart")
        return self.session_index[chosen], renumbered, self.after_parent_seconds[chosen]


def _from_columns(
    name: str,
    arrivals: np.ndarray,
    inputs: np.ndarray,
    outputs: np.ndarray,
    *,
    blocks: tuple[tuple[int, ...], ...] | None,
    note: str,
) -> Workload:
    """Sort by arrival, start the clock at the first request, and keep at least one token each way."""
    order = np.argsort(arrivals, kind="stable")
    arrivals = arrivals[order] - (arrivals[order][0] if arrivals.size else 0.0)
    return Workload(
        name=name,
        arrival_seconds=arrivals.astype(np.float64),
        input_tokens=np.maximum(inputs[order], 1).astype(np.int64),
        output_tokens=np.maximum(outputs[order], 1).astype(np.int64),
        prefix_blocks=None if blocks is None else tuple(blocks[int(i)] for i in order),
        notes=(note,),
    )


def load_azure_csv(path: Path, limit: int | None = None) -> Workload:
    """Azure LLM inference trace 2023 (TIMESTAMP, ContextTokens, GeneratedTokens); CC-BY-4.0, Splitwise."""
    stamps: list[str] = []
    inputs: list[int] = []
    outputs: list[int] = []
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            stamps.append(row["TIMESTAMP"].strip().replace(" ", "T"))
            inputs.append(int(row["ContextTokens"]))
            outputs.append(int(row["GeneratedTokens"]))
            if limit is not None and len(stamps) >= limit:
                break
    times = np.array(stamps, dtype="datetime64[ns]")
    seconds = (times - times.min()).astype(np.int64) / 1e9 if times.size else np.zeros(0)
    return _from_columns(
        path.stem,
        seconds,
        np.array(inputs, dtype=np.int64),
        np.array(outputs, dtype=np.int64),
        blocks=None,
        note=f"trace {path.name}: {len(stamps)} requests (Azure LLM inference 2023, CC-BY-4.0)",
    )


def load_mooncake_jsonl(path: Path, limit: int | None = None) -> Workload:
    """Mooncake trace (timestamp ms, input_length, output_length, hash_ids); Apache-2.0, Mooncake FAST'25."""
    arrivals: list[float] = []
    inputs: list[int] = []
    outputs: list[int] = []
    blocks: list[tuple[int, ...]] = []
    with path.open() as handle:
        for line in handle:
            if not line.strip():
                continue
            record = json.loads(line)
            arrivals.append(float(record["timestamp"]) / 1000.0)
            inputs.append(int(record["input_length"]))
            outputs.append(int(record["output_length"]))
            blocks.append(tuple(int(block) for block in record.get("hash_ids", ())))
            if limit is not None and len(arrivals) >= limit:
                break
    return _from_columns(
        path.stem,
        np.array(arrivals, dtype=np.float64),
        np.array(inputs, dtype=np.int64),
        np.array(outputs, dtype=np.int64),
        blocks=tuple(blocks),
        note=f"trace {path.name}: {len(arrivals)} requests with {MOONCAKE_PREFIX_BLOCK_TOKENS}-token prefix "
        "block ids (Mooncake, Apache-2.0)",
    )


@dataclass(frozen=True, slots=True)
class BurstSpec:
    """Poisson arrivals at a base rate, multiplied inside one burst window; lognormal token lengths."""

    duration_seconds: float = 1800.0
    base_rate_per_second: float = 5.0
    burst_start_seconds: float = 600.0
    burst_seconds: float = 120.0
    burst_multiplier: float = 4.0
    input_median_tokens: float = 1000.0
    input_sigma: float = 0.8
    output_median_tokens: float = 150.0
    output_sigma: float = 0.8
    max_tokens: int = 32768

    @classmethod
    def parse(cls, text: str) -> BurstSpec:
        """`synthetic:rate=5,burst_start=600,burst_seconds=120,burst_multiplier=4,duration=1800`."""
        aliases = {
            "rate": "base_rate_per_second",
            "duration": "duration_seconds",
            "burst_start": "burst_start_seconds",
            "burst_seconds": "burst_seconds",
            "burst_multiplier": "burst_multiplier",
            "input_median": "input_median_tokens",
            "input_sigma": "input_sigma",
            "output_median": "output_median_tokens",
            "output_sigma": "output_sigma",
        }
        body = text.partition(":")[2]
        values: dict[str, float] = {}
        for item in filter(None, (part.strip() for part in body.split(","))):
            key, _, value = item.partition("=")
            if key not in aliases:
                raise ValueError(f"unknown synthetic workload key {key!r}; known: {', '.join(aliases)}")
            values[aliases[key]] = float(value)
        return cls(**values)  # type: ignore[arg-type]


def synthetic_bursts(spec: BurstSpec, seed: int) -> Workload:
    """Piecewise-constant-rate Poisson arrivals: base rate, then base × multiplier in the burst window."""
    rng = np.random.default_rng(seed)
    burst_end = spec.burst_start_seconds + spec.burst_seconds
    pieces = [
        (0.0, min(spec.burst_start_seconds, spec.duration_seconds), spec.base_rate_per_second),
        (
            spec.burst_start_seconds,
            min(burst_end, spec.duration_seconds),
            spec.base_rate_per_second * spec.burst_multiplier,
        ),
        (burst_end, spec.duration_seconds, spec.base_rate_per_second),
    ]
    arrivals = []
    for start, end, rate in pieces:
        if end <= start or rate <= 0:
            continue
        count = rng.poisson(rate * (end - start))
        arrivals.append(rng.uniform(start, end, size=count))
    times = np.sort(np.concatenate(arrivals)) if arrivals else np.zeros(0)
    inputs = np.clip(
        np.rint(rng.lognormal(math.log(spec.input_median_tokens), spec.input_sigma, times.size)),
        1,
        spec.max_tokens,
    )
    outputs = np.clip(
        np.rint(rng.lognormal(math.log(spec.output_median_tokens), spec.output_sigma, times.size)),
        1,
        spec.max_tokens,
    )
    workload = Workload(
        name="synthetic-burst",
        arrival_seconds=times,
        input_tokens=inputs.astype(np.int64),
        output_tokens=outputs.astype(np.int64),
        notes=(
            f"synthetic: Poisson {spec.base_rate_per_second:g}/s for {spec.duration_seconds:g} s, "
            f"x{spec.burst_multiplier:g} during [{spec.burst_start_seconds:g}, {burst_end:g}) s; "
            f"lognormal lengths (input median {spec.input_median_tokens:g} σ {spec.input_sigma:g}, "
            f"output median {spec.output_median_tokens:g} σ {spec.output_sigma:g}); seed {seed}",
        ),
    )
    return workload


def load_trace(source: str, seed: int = 0, limit: int | None = None) -> Workload:
    """A trace file (Azure CSV or Mooncake JSONL, by extension) or a `synthetic:...` specification."""
    if source.startswith("synthetic"):
        return synthetic_bursts(BurstSpec.parse(source), seed)
    path = Path(source)
    if path.suffix not in (".jsonl", ".csv"):
        raise ValueError(
            f"unknown trace format {path.name!r}: expected .csv (Azure 2023) or .jsonl (Mooncake)"
        )
    if not path.is_file():
        raise ValueError(f"{path}: no such trace file")
    try:
        return load_mooncake_jsonl(path, limit) if path.suffix == ".jsonl" else load_azure_csv(path, limit)
    except KeyError as error:
        raise ValueError(f"{path}: a record lacks the field {error.args[0]!r}") from error
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not a text trace ({error.reason})") from error
    except ValueError as error:
        raise ValueError(f"{path}: unreadable trace: {error}") from error


def compress_time(workload: Workload, factor: float) -> Workload:
    """Divide every arrival time by `factor`: the same requests, `factor` times as fast."""
    if factor <= 0:
        raise ValueError("time compression must be positive")
    if factor == 1.0:
        return workload
    return replace(
        workload,
        arrival_seconds=workload.arrival_seconds / factor,
        notes=(*workload.notes, f"time compressed x{factor:g}"),
    )


def multiply_rate(workload: Workload, multiplier: float, seed: int) -> Workload:
    """Thin (multiplier < 1) or replicate (> 1) arrivals, keeping the trace's time profile.

    Each request is kept floor(m) times plus once more with probability frac(m). The original keeps its
    timestamp; each copy is shifted by a uniform offset within one mean inter-arrival gap, so copies
    do not arrive in lock-step and the per-minute profile of the trace is preserved.
    """
    if multiplier <= 0:
        raise ValueError("rate multiplier must be positive")
    if multiplier == 1.0 or len(workload) == 0:
        return workload
    rng = np.random.default_rng(seed)
    whole = math.floor(multiplier)
    copies = np.full(len(workload), whole, dtype=np.int64)
    copies += rng.random(len(workload)) < (multiplier - whole)
    source = np.repeat(np.arange(len(workload)), copies)
    # copy number of each repeated row: 0 for the first occurrence of a request
    first_of_run = np.concatenate(([0], np.cumsum(copies)[:-1]))
    ordinal = np.arange(source.size) - np.repeat(first_of_run, copies)
    mean_gap = workload.span_seconds / max(1, len(workload) - 1)
    jitter = np.where(ordinal > 0, rng.uniform(0.0, mean_gap, size=source.size), 0.0)
    arrivals = workload.arrival_seconds[source] + jitter
    order = np.argsort(arrivals, kind="stable")
    note = (
        f"rate x{multiplier:g}: each request kept floor(x) times plus once with probability frac(x); "
        f"copies shifted by U(0, {mean_gap:.3f} s); seed {seed}"
    )
    return workload._select(source[order], arrivals[order], note)


def truncate(workload: Workload, duration_seconds: float) -> Workload:
    """Keep the requests that arrive before `duration_seconds`."""
    keep = np.flatnonzero(workload.arrival_seconds < duration_seconds)
    if keep.size == len(workload):
        return workload
    return workload._select(keep, workload.arrival_seconds[keep], f"first {duration_seconds:g} s")


def window(workload: Workload, start_seconds: float, duration_seconds: float | None = None) -> Workload:
    """The requests arriving in [start, start + duration) (to the end without a duration), with the
    clock restarted at `start`: a slice of a long trace replayed as a run of its own.

    The clock starts at the window's edge, not at its first request, so a quiet opening stays quiet
    and the offered window is exactly `duration_seconds` long.
    """
    if start_seconds < 0:
        raise ValueError("a window cannot start before the trace")
    if duration_seconds is not None and duration_seconds <= 0:
        raise ValueError("a window needs a positive duration")
    end = math.inf if duration_seconds is None else start_seconds + duration_seconds
    arrivals = workload.arrival_seconds
    keep = np.flatnonzero((arrivals >= start_seconds) & (arrivals < end))
    span = "to the end" if duration_seconds is None else f"{end:g}"
    return workload._select(
        keep, arrivals[keep] - start_seconds, f"window [{start_seconds:g}, {span}) s, restarted at 0"
    )


@dataclass(frozen=True, slots=True)
class ClassRule:
    """How requests get an SLO class and a tenant when the trace has neither (seeded, reported)."""

    class_names: tuple[str, ...]
    class_weights: tuple[float, ...]
    tenants: int = 4

    def describe(self, seed: int) -> str:
        shares = ", ".join(
            f"{name} {weight / sum(self.class_weights):.0%}"
            for name, weight in zip(self.class_names, self.class_weights, strict=True)
        )
        return (
            f"classes drawn per request with probabilities ({shares}); tenants tenant-0..tenant-"
            f"{self.tenants - 1} uniformly; numpy default_rng(seed={seed}) over arrival order"
        )


def assign_classes(workload: Workload, rule: ClassRule, seed: int) -> Workload:
    """Give every request an SLO class and a tenant by the seeded rule; the rule goes into the notes."""
    if not rule.class_names:
        raise ValueError("at least one SLO class is needed")
    rng = np.random.default_rng([seed, 7])
    weights = np.asarray(rule.class_weights, dtype=np.float64)
    classes = rng.choice(len(rule.class_names), size=len(workload), p=weights / weights.sum())
    tenants = rng.integers(0, rule.tenants, size=len(workload))
    return replace(
        workload,
        class_index=classes.astype(np.int64),
        tenant_index=tenants.astype(np.int64),
        class_names=rule.class_names,
        tenant_names=tuple(f"tenant-{i}" for i in range(rule.tenants)),
        notes=(*workload.notes, rule.describe(seed)),
    )


def prepare(
    workload: Workload,
    rule: ClassRule,
    seed: int,
    *,
    rate_multiplier: float = 1.0,
    time_compression: float = 1.0,
    duration_seconds: float | None = None,
    start_seconds: float | None = None,
) -> Workload:
    """The transforms in their fixed order: compress time, cut the window, multiply rate, truncate,
    assign classes.

    start_seconds / duration_seconds are on the compressed clock. With a start, the window
    [start, start + duration) is cut before the rate is multiplied, so copies are spread by the
    window's own inter-arrival gap; the truncation after it trims copies jittered past the end.
    """
    shaped = compress_time(workload, time_compression)
    if start_seconds is not None:
        shaped = window(shaped, start_seconds, duration_seconds)
    shaped = multiply_rate(shaped, rate_multiplier, seed)
    if duration_seconds is not None:
        shaped = truncate(shaped, duration_seconds)
    return assign_classes(shaped, rule, seed)


def describe_lengths(workload: Workload) -> dict[str, float]:
    """Mean and tail token lengths, for the report's workload section."""
    if len(workload) == 0:
        return {}
    stats: dict[str, float] = {}
    for label, column in (("input", workload.input_tokens), ("output", workload.output_tokens)):
        stats[f"{label}_mean_tokens"] = float(column.mean())
        for quantile in (50, 90, 99):
            stats[f"{label}_p{quantile}_tokens"] = float(np.percentile(column, quantile))
    return stats


def class_weights_from(names: Sequence[str], weights: Sequence[float] | None) -> tuple[float, ...]:
    """Weights per class; equal shares when none are given."""
    if weights is None:
        return tuple(1.0 for _ in names)
    if len(weights) != len(names) or any(weight < 0 for weight in weights) or sum(weights) <= 0:
        raise ValueError(f"need {len(names)} non-negative class weights with a positive sum")
    return tuple(float(weight) for weight in weights)
