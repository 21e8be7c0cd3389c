"""The operator's own series: GPUs held per group state, which the dashboard integrates to GPU-hours."""

from __future__ import annotations

from goodput.operator.metrics import OperatorMetrics


def test_gpus_held_follow_the_group_counts_and_leave_with_the_model_group() -> None:
    metrics = OperatorMetrics()
    metrics.set_group_counts("serving", "llama-70b", 3, {"Ready": 2, "Warming": 1}, gpus_per_group=16)

    def gpus(state: str) -> float | None:
        return metrics.registry.get_sample_value(
            "goodput_group_gpus", {"namespace": "serving", "model_group": "llama-70b", "state": state}
        )

    assert (gpus("Ready"), gpus("Warming"), gpus("Draining")) == (32.0, 16.0, 0.0)
    metrics.set_group_counts("serving", "llama-70b", 1, {"Ready": 1}, gpus_per_group=16)
    assert (gpus("Ready"), gpus("Warming")) == (16.0, 0.0)
    metrics.forget_model_group("serving", "llama-70b")
    assert gpus("Ready") is None
