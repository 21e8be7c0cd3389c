"""A hung engine: requests held with no token progress past the bound; anything else is not a hang."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from goodput.agent import engine, report
from goodput.agent.engine import EngineSample
from goodput.api import labels
from goodput.api.reasons import Reason


def series(*points: tuple[float, float, float, float]) -> list[EngineSample]:
    return [EngineSample(*point) for point in points]


@dataclass(frozen=True)
class Case:
    name: str
    samples: list[EngineSample]
    hung: bool
    reason: str


BOUND = 60.0
CASES = [
    Case("no samples yet", [], False, Reason.ENGINE_METRICS_UNAVAILABLE),
    Case(
        "tokens flowing",
        series((0, 4, 100, 50), (30, 4, 180, 50), (70, 4, 260, 50), (100, 4, 300, 50)),
        False,
        Reason.ENGINE_PROGRESSING,
    ),
    Case(
        "running, nothing moves past the bound",
        series((0, 4, 100, 50), (30, 4, 100, 50), (61, 4, 100, 50)),
        True,
        Reason.ENGINE_HUNG,
    ),
    Case(
        "running, nothing moves, within the bound",
        series((0, 4, 100, 50), (30, 4, 100, 50), (59, 4, 100, 50)),
        False,
        Reason.ENGINE_PROGRESSING,
    ),
    Case(
        "idle is not hung",
        series((0, 0, 100, 50), (100, 0, 100, 50), (200, 0, 100, 50)),
        False,
        Reason.ENGINE_PROGRESSING,
    ),
    Case(
        "a long prefill moves prompt tokens",
        series((0, 1, 100, 50), (50, 1, 100, 4000), (100, 1, 100, 8000)),
        False,
        Reason.ENGINE_PROGRESSING,
    ),
    Case(
        "the stall clock starts after the last progress",
        series((0, 4, 100, 50), (50, 4, 150, 50), (100, 4, 150, 50)),
        False,
        Reason.ENGINE_PROGRESSING,
    ),
    Case(
        "a stall after progress, past the bound",
        series((0, 4, 100, 50), (50, 4, 150, 50), (100, 4, 150, 50), (111, 4, 150, 50)),
        True,
        Reason.ENGINE_HUNG,
    ),
    Case(
        "an idle moment resets the clock",
        series((0, 4, 100, 50), (40, 0, 100, 50), (50, 2, 100, 50), (100, 2, 100, 50)),
        False,
        Reason.ENGINE_PROGRESSING,
    ),
    Case(
        "a restarted engine (counters went down) is progress",
        series((0, 4, 100, 50), (40, 4, 100, 50), (70, 4, 0, 0)),
        False,
        Reason.ENGINE_PROGRESSING,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_hang_verdicts(case: Case) -> None:
    verdict = engine.judge(case.samples, BOUND)

    assert (verdict.hung, verdict.reason) == (case.hung, case.reason)


def test_a_hang_names_its_evidence_and_makes_the_condition_false() -> None:
    verdict = engine.judge(series((0, 3, 42, 7), (90, 3, 42, 7)), BOUND)
    condition = report.engine_condition(verdict)

    assert "3 request(s) running" in verdict.message and "90s" in verdict.message and "42" in verdict.message
    assert (condition.type, condition.status) == (labels.CONDITION_ENGINE_HEALTHY, "False")
    assert report.engine_condition(engine.judge([], BOUND)).status == "Unknown"


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3), st.integers(0, 3)), min_size=1, max_size=30))
def test_an_engine_whose_counters_move_every_sample_is_never_hung(steps: list[tuple[int, int, int]]) -> None:
    samples, generated, prompted = [], 0.0, 0.0
    for index, (running, new_tokens, new_prompt) in enumerate(steps):
        generated += new_tokens + 1  # at least one token per sample
        prompted += new_prompt
        samples.append(EngineSample(index * 1000.0, running, generated, prompted))

    assert not engine.judge(samples, BOUND).hung


EXPOSITION = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 120.0
vllm:generation_tokens_total{engine="1",model_name="m"} 30.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 500.0
"""


def test_a_sample_sums_the_series_over_engines() -> None:
    assert engine.parse_sample(EXPOSITION, 7.0) == EngineSample(7.0, 4.0, 150.0, 500.0)


def test_an_exposition_without_the_series_is_refused_naming_them() -> None:
    with pytest.raises(ValueError, match="vllm:generation_tokens_total, vllm:prompt_tokens_total"):
        engine.parse_sample(EXPOSITION.split("# HELP vllm:generation", maxsplit=1)[0], 0.0)


def test_the_window_keeps_twice_the_bound() -> None:
    samples = series((0, 1, 1, 1), (100, 1, 1, 1), (150, 1, 1, 1))

    assert [s.at_seconds for s in engine.keep_window(samples, 200.0, 50.0)] == [100, 150]
