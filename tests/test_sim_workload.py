"""Trace loaders and the seeded transforms that shape offered load."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from goodput.simulator.workload import (
    BurstSpec,
    ClassRule,
    Workload,
    assign_classes,
    compress_time,
    load_trace,
    multiply_rate,
    prepare,
    synthetic_bursts,
    truncate,
    window,
)


def write_azure(path: Path, rows: list[tuple[str, int, int]]) -> Path:
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens", *(f"{t},{i},{o}" for t, i, o in rows)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_azure_csv_is_read_relative_to_its_first_request_and_sorted(tmp_path: Path) -> None:
    trace = write_azure(
        tmp_path / "AzureLLMInferenceTrace_conv.csv",
        [
            ("2023-11-16 18:15:50.5000000", 396, 109),
            ("2023-11-16 18:15:46.2500000", 374, 44),
            ("2023-11-16 18:16:46.2500001", 0, 0),
        ],
    )
    workload = load_trace(str(trace))
    assert workload.arrival_seconds.tolist() == pytest.approx([0.0, 4.25, 60.0000001])
    assert workload.input_tokens.tolist() == [374, 396, 1]  # at least one token each way
    assert workload.output_tokens.tolist() == [44, 109, 1]
    assert workload.prefix_blocks is None


def test_mooncake_jsonl_keeps_prefix_blocks_and_converts_milliseconds(tmp_path: Path) -> None:
    trace = tmp_path / "mooncake.jsonl"
    records = [
        {"timestamp": 0, "input_length": 1200, "output_length": 6, "hash_ids": [0, 1, 2]},
        {"timestamp": 2500, "input_length": 600, "output_length": 9, "hash_ids": [0, 5]},
    ]
    trace.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    workload = load_trace(str(trace))
    assert workload.arrival_seconds.tolist() == [0.0, 2.5]
    assert workload.prefix_blocks == ((0, 1, 2), (0, 5))
    assert workload.prefix_block_tokens == 512


def test_an_unknown_trace_format_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown trace format"):
        load_trace(str(tmp_path / "trace.parquet"))


def uniform(count: int, span: float) -> Workload:
    return Workload("uniform", np.linspace(0.0, span, count), np.full(count, 100), np.full(count, 10))


@pytest.mark.parametrize(
    ("multiplier", "expected_ratio"),
    [
        pytest.param(0.25, 0.25, id="thinning"),
        pytest.param(3.0, 3.0, id="whole-copies"),
        pytest.param(2.5, 2.5, id="fractional-copies"),
    ],
)
def test_rate_multiplier_scales_the_request_count_and_keeps_the_time_span(
    multiplier: float, expected_ratio: float
) -> None:
    # twice as busy in the first half as in the second
    times = np.concatenate(
        (np.linspace(0.0, 500.0, 20_000, endpoint=False), np.linspace(500.0, 1000.0, 10_000))
    )
    base = Workload("two-level", times, np.full(times.size, 100), np.full(times.size, 10))
    scaled = multiply_rate(base, multiplier, seed=3)
    assert len(scaled) / len(base) == pytest.approx(expected_ratio, rel=0.03)
    assert np.all(np.diff(scaled.arrival_seconds) >= 0)
    assert scaled.arrival_seconds[-1] <= base.span_seconds + base.span_seconds / (len(base) - 1)
    first_half = np.count_nonzero(scaled.arrival_seconds < 500.0)
    assert first_half / (len(scaled) - first_half) == pytest.approx(2.0, rel=0.1)


def test_the_same_seed_gives_the_same_copies() -> None:
    base = uniform(1000, 100.0)
    first, second = multiply_rate(base, 2.7, seed=9), multiply_rate(base, 2.7, seed=9)
    assert np.array_equal(first.arrival_seconds, second.arrival_seconds)
    assert not np.array_equal(first.arrival_seconds, multiply_rate(base, 2.7, seed=10).arrival_seconds)


def test_time_compression_and_truncation() -> None:
    base = uniform(101, 1000.0)
    compressed = compress_time(base, 4.0)
    assert compressed.span_seconds == pytest.approx(250.0)
    assert len(truncate(compressed, 125.0)) == 50  # arrivals at 0, 2.5, …, 122.5
    with pytest.raises(ValueError):
        compress_time(base, 0.0)


@pytest.mark.parametrize(
    ("start", "duration", "kept", "first", "last"),
    [
        (250.0, 100.0, 10, 0.0, 90.0),  # arrivals every 10 s: 250, 260, ..., 340
        (255.0, 100.0, 10, 5.0, 95.0),
        (950.0, None, 6, 0.0, 50.0),
        (2000.0, 10.0, 0, None, None),
    ],
    ids=[
        "a window on an arrival keeps it, and drops the one at its end",
        "the clock restarts at the window's edge, not at its first request",
        "without a duration the window runs to the end",
        "a window past the trace is empty",
    ],
)
def test_a_window_replays_a_slice_of_the_trace_from_zero(
    start: float, duration: float | None, kept: int, first: float | None, last: float | None
) -> None:
    base = uniform(101, 1000.0)  # 0, 10, ..., 1000 s
    sliced = window(base, start, duration)
    assert len(sliced) == kept
    if kept:
        assert sliced.arrival_seconds[0] == pytest.approx(first)
        assert sliced.arrival_seconds[-1] == pytest.approx(last)
    assert sliced.notes[-1].startswith(f"window [{start:g}, ")


def test_a_window_refuses_a_negative_start_or_an_empty_span() -> None:
    with pytest.raises(ValueError, match="before the trace"):
        window(uniform(10, 10.0), -1.0)
    with pytest.raises(ValueError, match="positive duration"):
        window(uniform(10, 10.0), 0.0, 0.0)


def test_prepare_cuts_the_window_before_it_multiplies_the_rate() -> None:
    """Minutes 20-40 of an hour at 8x: only the window's requests are copied, and the copies'
    jitter is the window's own gap, so none falls outside [0, duration)."""
    base = uniform(3601, 3600.0)  # one request a second
    prepared = prepare(
        base,
        ClassRule(("chat",), (1.0,)),
        seed=4,
        rate_multiplier=8.0,
        duration_seconds=1200.0,
        start_seconds=1200.0,
    )
    assert len(prepared) == 8 * 1200
    assert prepared.arrival_seconds.min() >= 0.0
    assert prepared.arrival_seconds.max() < 1200.0
    assert any(note.startswith("window [1200, 2400)") for note in prepared.notes)


def test_classes_and_tenants_follow_the_seeded_rule_and_the_rule_is_recorded() -> None:
    base = uniform(10_000, 100.0)
    rule = ClassRule(("chat", "batch"), (3.0, 1.0), tenants=4)
    assigned = assign_classes(base, rule, seed=5)
    assert assigned.class_index is not None and assigned.tenant_index is not None
    assert np.mean(assigned.class_index == 0) == pytest.approx(0.75, abs=0.02)
    assert set(assigned.tenant_index.tolist()) == {0, 1, 2, 3}
    assert "chat 75%" in assigned.notes[-1] and "seed=5" in assigned.notes[-1]
    again = assign_classes(base, rule, seed=5)
    assert again.class_index is not None and np.array_equal(assigned.class_index, again.class_index)


def test_prepare_applies_the_transforms_in_order() -> None:
    base = uniform(1001, 1000.0)
    prepared = prepare(
        base,
        ClassRule(("chat",), (1.0,)),
        seed=1,
        rate_multiplier=2.0,
        time_compression=2.0,
        duration_seconds=100.0,
    )
    # compressed to 500 s, doubled, first 100 s kept: about 2 × 200 requests
    assert len(prepared) == pytest.approx(400, rel=0.05)
    assert prepared.arrival_seconds.max() < 100.0
    assert any("compressed" in note for note in prepared.notes)


def test_synthetic_bursts_multiply_the_rate_inside_the_window() -> None:
    spec = BurstSpec.parse(
        "synthetic:rate=4,duration=600,burst_start=200,burst_seconds=100,burst_multiplier=5"
    )
    workload = synthetic_bursts(spec, seed=2)
    inside = np.mean((workload.arrival_seconds >= 200) & (workload.arrival_seconds < 300)) * len(workload)
    outside = len(workload) - inside
    assert inside / 100.0 == pytest.approx(20.0, rel=0.2)
    assert outside / 500.0 == pytest.approx(4.0, rel=0.2)
    assert np.array_equal(workload.arrival_seconds, synthetic_bursts(spec, seed=2).arrival_seconds)
    with pytest.raises(ValueError, match="unknown synthetic workload key"):
        BurstSpec.parse("synthetic:speed=3")
