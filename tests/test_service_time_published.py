"""The service-time model against published vLLM throughput and latency (goodput.simulator.published).

Each point is replayed at its published settings on the simulator's engine priced by the model, with
no figure fitted to any point (accelerators from their datasheets, the H100's measured efficiencies
everywhere else). The sources and the settings replayed:

- Llama-3.1-70B-Instruct-FP8 on 1xH100 SXM: LambdaLabsML/vllm-benchmark
  results/prompt_10/1xH100-80GB-SXM/Meta-Llama-3.1-70B-Instruct-FP8_tp1_len2000.json; 10 ShareGPT
  prompts at request rate inf, the 7 that produced tokens replayed with their recorded lengths.
  100 output tok/s, TPOT 33.1 ms.
- Qwen3-30B-A3B (BF16) on 1xH100: vllm-project/vllm PR #23151; random 2048 -> 1024 tokens, 10
  concurrent clients, 100 prompts. 740 output tok/s, TPOT 13.2 ms.
- Llama-3.1-8B-Instruct-FP8 on 1xH100 and on 1xL40S: Red Hat, "Efficient and reproducible LLM
  inference: Red Hat MLPerf Inference v5.1 results" (vLLM 0.10.0); Offline, 13,368 samples at once,
  ~1,000 input [estimate] and 114 output tokens. 5,777 and 1,642 output tok/s.
- Llama-3-8B-Instruct on 1xH100 under light load: vllm-project.github.io
  _posts/2024-09-05-perf-update.md; one request at a time. 13 ms per output token. Not reproduced.
- Qwen3-30B-A3B-FP8 on 1xMI300X: vllm-project/vllm PR #17530; offline, 200 prompts of 1000 -> 2000,
  5000 -> 1000 and 10000 -> 500 tokens. 4,337, 1,925 and 679 output tok/s. Not reproduced.
- Llama-3.1-405B-Instruct (FP16) on 8xMI300X: vllm-project.github.io
  _posts/2024-10-23-vllm-serving-amd.md; 1,000 ShareGPT prompts at 1000 QPS. 5.76 req/s. Not
  reproduced.

A point marked reproduced must stay within 25 % on every figure it compares; one marked not
reproduced must stay outside, so that the account in docs/benchmarks.md of where the model misses changes
when the model does.
"""

from __future__ import annotations

import pytest

from goodput.simulator.published import (
    POINTS,
    TOLERANCE,
    PublishedPoint,
    error,
    model_figures,
    worst_error,
)

REPRODUCED = [point for point in POINTS if point.reproduced]
MISSED = [point for point in POINTS if not point.reproduced]


@pytest.mark.parametrize("point", REPRODUCED, ids=[point.key for point in REPRODUCED])
def test_the_model_is_within_a_quarter_of_the_published_figure(point: PublishedPoint) -> None:
    result = model_figures(point)
    for figure in point.compared:
        assert abs(error(point, result, figure)) <= TOLERANCE, (
            f"{point.key}: {figure} off by {error(point, result, figure):+.1%} ({point.source})"
        )


@pytest.mark.parametrize("point", MISSED, ids=[point.key for point in MISSED])
def test_a_point_reported_as_missed_is_still_missed_and_says_why(point: PublishedPoint) -> None:
    assert point.why_not
    assert abs(worst_error(point, model_figures(point))) > TOLERANCE, (
        f"{point.key} is now within {TOLERANCE:.0%}: mark it reproduced and update docs/benchmarks.md"
    )


def test_the_table_covers_six_model_accelerator_pairs_each_with_its_source_and_settings() -> None:
    pairs = {(point.model, point.gpu, point.tensor_parallel) for point in POINTS}
    assert len(pairs) >= 6
    assert {point.gpu for point in POINTS} >= {"h100-80g", "l40s", "mi300x"}
    for point in POINTS:
        assert point.source and point.settings and point.compared
        assert all(getattr(point.published, figure) is not None for figure in point.compared)
    assert len({point.key for point in POINTS}) == len(POINTS)
