"""The emulated DCGM exporter: each GPU of a rank reports the engine's busy share of the last sample
period, in percent, with the exporter's labels."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from goodput.testbed.emulator_dcgm import GPU_UTIL, GpuUtilisationCollector, gpu_uuid


@dataclass
class Clock:
    """(now, busy seconds) as the engine would report them, moved by hand."""

    now: float = 100.0
    busy_seconds: float = 0.0

    def read(self) -> tuple[float, float]:
        return self.now, self.busy_seconds

    def advance(self, seconds: float, busy_seconds: float) -> None:
        self.now += seconds
        self.busy_seconds += busy_seconds


@dataclass(frozen=True)
class Case:
    name: str
    elapsed_seconds: float
    busy_seconds: float
    percent: float


CASES = [
    Case("idle", 2.0, 0.0, 0.0),
    Case("every step computing", 2.0, 2.0, 100.0),
    Case("a third of the time", 3.0, 1.0, 33.0),
    Case("a step ending past the period counts at most the whole period", 1.0, 1.4, 100.0),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_utilisation_is_the_busy_share_of_the_sample_period(case: Case) -> None:
    clock = Clock()
    collector = GpuUtilisationCollector(
        clock.read, gpus=1, product="NVIDIA H100 80GB HBM3", rank_name="ns/p-g0-0"
    )
    clock.advance(case.elapsed_seconds, case.busy_seconds)
    assert collector.utilisation_percent() == case.percent


def test_a_read_within_the_sample_period_repeats_the_last_sample() -> None:
    clock = Clock()
    collector = GpuUtilisationCollector(clock.read, gpus=1, product="H100", rank_name="r")
    clock.advance(2.0, 1.0)
    assert collector.utilisation_percent() == 50.0
    clock.advance(0.5, 0.5)  # too soon for a new sample: the exporter's interval bounds it
    assert collector.utilisation_percent() == 50.0
    clock.advance(0.5, 0.5)  # one second since the last sample, all of it busy
    assert collector.utilisation_percent() == 100.0


def test_every_gpu_of_the_rank_is_a_series_with_the_exporters_labels() -> None:
    clock = Clock()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(
        GpuUtilisationCollector(clock.read, gpus=2, product="NVIDIA H100 80GB HBM3", rank_name="ns/p")
    )
    clock.advance(4.0, 3.0)
    (family,) = [
        f for f in text_string_to_metric_families(generate_latest(registry).decode()) if f.name == GPU_UTIL
    ]
    assert family.type == "gauge"
    series = {sample.labels["gpu"]: sample for sample in family.samples}
    assert set(series) == {"0", "1"}
    for index, sample in series.items():
        assert sample.value == 75.0
        assert sample.labels["device"] == f"nvidia{index}"
        assert sample.labels["modelName"] == "NVIDIA H100 80GB HBM3"
        assert sample.labels["UUID"] == gpu_uuid("ns/p", int(index))
    assert gpu_uuid("ns/p", 0) != gpu_uuid("ns/p", 1) != gpu_uuid("ns/q", 1)
