"""The NCCL check: bus bandwidth as nccl-tests defines it, the verdict rules, and the emulated
collective doing a real all-reduce across 2-4 processes on loopback, with a slow link, a hung rank
and a missing rank, each bounded in time."""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, replace

import pytest

from goodput.agent import nccl, report
from goodput.agent.nccl import CheckOutcome, NcclExpectation, RankMeasurement, RankSpec
from goodput.api import labels
from goodput.api.reasons import Reason
from goodput.testbed.cluster.controlplane import free_port

SMALL_BYTES = 64 * 1024


def tcp_ranks(
    world: int, *, pod_rank: int = 0, pods: int = 1, port: int, timeout: float = 20
) -> tuple[RankSpec, ...]:
    return nccl.local_ranks(
        kind="tcp",
        leader_host="127.0.0.1",
        port=port,
        pod_rank=pod_rank,
        pods=pods,
        gpus_per_pod=world // pods,
        rendezvous_timeout_seconds=timeout,
    )


@pytest.mark.parametrize(
    ("size_bytes", "seconds", "ranks", "busbw"),
    [
        (1_000_000_000, 1.0, 2, 1.0),  # 2(n-1)/n = 1 for two ranks
        (1_000_000_000, 1.0, 8, 1.75),
        (1_000_000_000, 0.5, 4, 3.0),
        (1_000_000_000, 1.0, 1, 0.0),  # a single rank moves nothing
    ],
)
def test_bus_bandwidth_is_nccl_tests_algbw_times_2_n_minus_1_over_n(
    size_bytes: int, seconds: float, ranks: int, busbw: float
) -> None:
    assert math.isclose(nccl.bus_bandwidth_gb_per_s(size_bytes, seconds, ranks), busbw)


def test_the_expectation_follows_the_topology() -> None:
    assert nccl.expectation_for(1).busbw_gb_per_s == nccl.NVLINK_BUSBW_GB_PER_S
    assert nccl.expectation_for(2).busbw_gb_per_s == nccl.FABRIC_BUSBW_GB_PER_S
    assert nccl.FABRIC_BUSBW_GB_PER_S < nccl.NVLINK_BUSBW_GB_PER_S


def measured(busbw_gb_per_s: float, world: int = 4, latency: float = 20e-6) -> tuple[RankMeasurement, ...]:
    size = 64 * 2**20
    seconds = size * 2 * (world - 1) / world / (busbw_gb_per_s * 1e9)
    return tuple(RankMeasurement(rank, latency, seconds, size, world) for rank in range(world))


@dataclass(frozen=True)
class VerdictCase:
    name: str
    outcome: CheckOutcome
    healthy: bool
    reason: str
    words: tuple[str, ...]


EXPECT = NcclExpectation(40.0, "the inter-node fabric")
VERDICTS = [
    VerdictCase(
        "at expectation", CheckOutcome(measured(38.0)), True, Reason.ALL_REDUCE_PASSED, ("38.00 GB/s", "20us")
    ),
    VerdictCase(
        "below expectation, above the floor", CheckOutcome(measured(12.0)), True, Reason.ALL_REDUCE_PASSED, ()
    ),
    VerdictCase(
        "far below expectation",
        CheckOutcome(measured(3.0)),
        False,
        Reason.ALL_REDUCE_SLOW,
        ("3.00 GB/s", "expected 40 GB/s over the inter-node fabric", "10 GB/s floor"),
    ),
    VerdictCase(
        "the slowest rank decides",
        CheckOutcome((*measured(40.0)[:3], measured(2.0)[3])),
        False,
        Reason.ALL_REDUCE_SLOW,
        ("2.00 GB/s",),
    ),
    VerdictCase(
        "a hang",
        CheckOutcome(timed_out_ranks=(2, 3), timeout_seconds=60),
        False,
        Reason.ALL_REDUCE_TIMEOUT,
        ("rank 2, 3", "60s"),
    ),
    VerdictCase(
        "a leader that never answered",
        CheckOutcome(rendezvous_failures=("rank 1: rendezvous: the leader did not answer",)),
        False,
        Reason.ALL_REDUCE_TIMEOUT,
        ("leader did not answer",),
    ),
    VerdictCase(
        "an error",
        CheckOutcome(errors=("rank 1: CollectiveError: wrong sum",)),
        False,
        Reason.ALL_REDUCE_FAILED,
        ("wrong sum",),
    ),
    VerdictCase("nothing reported", CheckOutcome(), False, Reason.ALL_REDUCE_FAILED, ("no rank",)),
    VerdictCase(
        "a single GPU passes on latency alone, with no link figure",
        CheckOutcome(measured(1e-9, world=1)),
        True,
        Reason.ALL_REDUCE_PASSED,
        ("one GPU", "no link to measure", "20us"),
    ),
]


@pytest.mark.parametrize("case", VERDICTS, ids=lambda case: case.name)
def test_verdicts(case: VerdictCase) -> None:
    verdict = nccl.evaluate(case.outcome, EXPECT)
    condition = report.nccl_condition(verdict)

    assert (verdict.healthy, verdict.reason) == (case.healthy, case.reason)
    assert condition.type == labels.CONDITION_NCCL_HEALTHY
    assert condition.status == ("True" if case.healthy else "False")
    for word in case.words:
        assert word in verdict.message


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 4])
def test_a_real_all_reduce_across_processes_sums_and_measures(world: int) -> None:
    specs = tcp_ranks(world, port=free_port())

    outcome = nccl.run_check(specs, timeout_seconds=60, size_bytes=SMALL_BYTES, iterations=2)

    assert outcome.errors == () and outcome.timed_out_ranks == ()
    assert sorted(m.rank for m in outcome.measurements) == list(range(world))
    assert all(m.world_size == world and m.bandwidth_seconds > 0 for m in outcome.measurements)
    assert nccl.evaluate(outcome, NcclExpectation(1e-6, "loopback")).healthy


@pytest.mark.timeout(120)
def test_two_pods_meet_at_the_leader_as_one_group() -> None:
    port = free_port()
    outcomes: dict[int, CheckOutcome] = {}

    def pod(rank: int) -> None:
        outcomes[rank] = nccl.run_check(
            tcp_ranks(4, pod_rank=rank, pods=2, port=port),
            timeout_seconds=60,
            size_bytes=SMALL_BYTES,
            iterations=2,
        )

    threads = [threading.Thread(target=pod, args=(rank,)) for rank in (1, 0)]  # a follower first
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)

    assert sorted(m.rank for m in outcomes[0].measurements) == [0, 1]
    assert sorted(m.rank for m in outcomes[1].measurements) == [2, 3]
    assert all(m.world_size == 4 for o in outcomes.values() for m in o.measurements)


@pytest.mark.timeout(120)
def test_a_slow_link_lowers_the_measured_bandwidth_and_fails_against_expectation() -> None:
    delay = 0.3
    specs = tuple(replace(spec, delay_seconds=delay) for spec in tcp_ranks(2, port=free_port()))

    outcome = nccl.run_check(specs, timeout_seconds=60, size_bytes=SMALL_BYTES, iterations=2)
    # What the same buffer would reach in a tenth of the injected delay.
    fast = nccl.bus_bandwidth_gb_per_s(SMALL_BYTES, delay / 10, 2)
    verdict = nccl.evaluate(outcome, NcclExpectation(fast, "loopback"))

    assert all(m.bandwidth_seconds >= delay for m in outcome.measurements)
    assert (verdict.healthy, verdict.reason) == (False, Reason.ALL_REDUCE_SLOW)
    assert "bus bandwidth" in verdict.message


@pytest.mark.timeout(120)
def test_a_hung_rank_is_bounded_and_reported_as_a_timeout() -> None:
    specs = tcp_ranks(2, port=free_port())
    specs = (specs[0], replace(specs[1], hang=True))

    started = time.monotonic()
    outcome = nccl.run_check(specs, timeout_seconds=8, size_bytes=SMALL_BYTES, iterations=2)
    elapsed = time.monotonic() - started

    assert outcome.timed_out_ranks == (0, 1)
    assert elapsed < 8 + 20  # the bound, plus stopping the processes
    assert nccl.evaluate(outcome, EXPECT).reason == Reason.ALL_REDUCE_TIMEOUT


@pytest.mark.timeout(120)
def test_a_missing_rank_fails_the_rendezvous_within_its_bound() -> None:
    """Three ranks expected, two started: the leader gives up after the rendezvous timeout."""
    specs = tcp_ranks(3, port=free_port(), timeout=4)[:2]

    outcome = nccl.run_check(specs, timeout_seconds=40, size_bytes=SMALL_BYTES, iterations=2)
    verdict = nccl.evaluate(outcome, EXPECT)

    assert outcome.measurements == ()
    assert verdict.reason == Reason.ALL_REDUCE_TIMEOUT
    assert "2 of 3 ranks joined" in verdict.message


@pytest.mark.timeout(60)
def test_a_follower_whose_leader_never_answers_gives_up() -> None:
    spec = tcp_ranks(2, port=free_port(), timeout=3)[1]

    outcome = nccl.run_check((spec,), timeout_seconds=30, size_bytes=SMALL_BYTES, iterations=2)

    assert outcome.rendezvous_failures and "did not answer" in outcome.rendezvous_failures[0]
