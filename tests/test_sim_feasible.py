"""Feasibility of a workload's requests against their classes: long prompts that no idle group can
prefill within the TTFT target are infeasible, and a class with no feasible request is an error that
names the class and its targets."""

from __future__ import annotations

import numpy as np
import pytest

from goodput.estimators.service_time import H100_80G, LLAMA_3_1_8B
from goodput.simulator.engine import EngineConfig
from goodput.simulator.feasible import NoFeasibleRequestsError, assess, require_feasible_requests
from goodput.simulator.report import ClassTargets
from goodput.simulator.workload import Workload

ENGINE = EngineConfig.for_hardware(LLAMA_3_1_8B, H100_80G)
CHAT = ClassTargets("chat", ttft_seconds=1.0, itl_seconds=0.075)
LONG = ClassTargets("long", ttft_seconds=30.0, itl_seconds=0.2)


def workload(prompts: list[int], classes: list[int]) -> Workload:
    return Workload(
        name="t",
        arrival_seconds=np.arange(len(prompts), dtype=np.float64),
        input_tokens=np.array(prompts, dtype=np.int64),
        output_tokens=np.full(len(prompts), 50, dtype=np.int64),
        class_index=np.array(classes, dtype=np.int64),
        class_names=("chat", "long"),
    )


def test_a_prompt_past_the_threshold_is_infeasible_in_its_class_only() -> None:
    result = assess(workload([500, 120_000, 120_000], [0, 0, 1]), ENGINE, (CHAT, LONG))
    threshold = result.classes[0].longest_feasible_prompt_tokens
    assert 500 < threshold < 120_000
    assert result.feasible.tolist() == [True, False, True]
    assert result.classes[0].infeasible == 1 and result.classes[0].unmet_counts["ttft"] == 1
    assert result.classes[1].infeasible == 0


def test_the_threshold_separates_feasible_from_infeasible_prompts() -> None:
    threshold = assess(workload([1], [0]), ENGINE, (CHAT, LONG)).classes[0].longest_feasible_prompt_tokens
    result = assess(workload([threshold, threshold + 1], [0, 0]), ENGINE, (CHAT, LONG))
    assert result.feasible.tolist() == [True, False]


def test_a_class_that_no_request_can_meet_is_named() -> None:
    impossible = ClassTargets("instant", ttft_seconds=0.001, itl_seconds=0.075)
    result = assess(workload([500, 800], [0, 0]), ENGINE, (impossible, LONG))
    with pytest.raises(
        NoFeasibleRequestsError, match=r"'instant'.*none of its 2 requests.*ttftSeconds=0\.001"
    ):
        require_feasible_requests(result, (impossible, LONG))


def test_an_empty_class_is_not_an_error() -> None:
    result = assess(workload([500], [0]), ENGINE, (CHAT, LONG))
    require_feasible_requests(result, (CHAT, LONG))
    assert result.classes[1].requests == 0
