"""The suite's report names every test run that beat the searched oracle at equal attainment."""

from __future__ import annotations

from typing import Any

import pytest

from goodput.simulator.suite_report import POLICY_ORDER, policies_below_the_oracle


def _record(oracle: tuple[int, float], **runs: tuple[int, float]) -> dict[str, Any]:
    """A case record: (met, GPU-hours) for the oracle and each named policy (others far costlier)."""

    def outcome(met: int, gpu_hours: float) -> dict[str, Any]:
        return {"met": met, "gpu_hours": gpu_hours}

    policies = {name: {"test": outcome(*runs.get(name, (0, 99.0)))} for name in POLICY_ORDER}
    return {
        "model": "m",
        "trace": "t",
        "oracle": {"searched": outcome(*oracle)},
        "policies": policies,
    }


@pytest.mark.parametrize(
    ("name", "record", "beaten_by"),
    [
        ("cheaper and as many met", _record((100, 2.0), hpa=(100, 1.5)), ["hpa"]),
        ("cheaper and more met", _record((100, 2.0), keda=(101, 1.9)), ["keda"]),
        ("cheaper but fewer met", _record((100, 2.0), goodput=(99, 1.0)), []),
        ("as many met at the same cost: a tie", _record((100, 2.0), kpa=(100, 2.0)), []),
    ],
)
def test_a_policy_beats_the_oracle_only_by_meeting_as_many_for_less(
    name: str, record: dict[str, Any], beaten_by: list[str]
) -> None:
    beaten = policies_below_the_oracle([record, {"model": "m", "trace": "broken", "error": "x"}])
    assert all(line.startswith("m t: ") for line in beaten), name
    assert [line.split(": ")[1].split()[0] for line in beaten] == beaten_by, name
