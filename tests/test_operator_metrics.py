"""The operator's own series: GPUs held per group state, which the dashboard integrates to GPU-hours,
and the requests drains finished and aborted, with the drains whose counts are unknown kept apart."""

from __future__ import annotations

from datetime import UTC, datetime

from goodput.api.modelgroup import DrainRecord
from goodput.controllers.groups.model import DrainEnded
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


def drain(aborted: int | None, finished: int | None = 1) -> DrainEnded:
    record = DrainRecord(
        group="g1",
        outcome="TimedOut",
        started_at=datetime(2026, 3, 1, 12, 0, tzinfo=UTC),
        ended_at=datetime(2026, 3, 1, 12, 0, 20, tzinfo=UTC),
        duration_seconds=20.0,
        requests_finished=finished,
        requests_aborted=aborted,
    )
    return DrainEnded(record=record)


def test_a_drain_with_an_unknown_abort_count_is_counted_as_unknown_not_as_zero_aborted() -> None:
    metrics = OperatorMetrics()
    labels = {"namespace": "serving", "model_group": "llama-70b"}

    def sample(name: str, **more: str) -> float | None:
        return metrics.registry.get_sample_value(name, {**labels, **more})

    metrics.drain_ended("serving", "llama-70b", drain(aborted=3))
    metrics.drain_ended("serving", "llama-70b", drain(aborted=None, finished=None))
    assert sample("goodput_drain_requests_aborted_total") == 3
    assert sample("goodput_drain_requests_finished_total") == 1
    assert sample("goodput_drains_unknown_count_total", count="requests_aborted") == 1
    assert sample("goodput_drains_unknown_count_total", count="requests_finished") == 1
    assert sample("goodput_drains_total", outcome="TimedOut") == 2
    metrics.forget_model_group("serving", "llama-70b")
    assert sample("goodput_drains_unknown_count_total", count="requests_aborted") is None


def test_only_an_unknown_drain_leaves_the_aborted_counter_unset_rather_than_zero() -> None:
    metrics = OperatorMetrics()
    metrics.drain_ended("serving", "llama-70b", drain(aborted=None))
    labels = {"namespace": "serving", "model_group": "llama-70b"}
    assert metrics.registry.get_sample_value("goodput_drain_requests_aborted_total", labels) is None
