"""The NCCL check: an all-reduce across every GPU of the group, bounded in time, judged against
what the topology should give.

Each pod runs one process per local GPU (NCCL's model: one rank per device); global rank
`pod_rank * gpus_per_pod + local`, rank 0 (the leader pod's first GPU) hosts the rendezvous. Each
process meets the others, runs a warm-up, then times a tiny all-reduce (latency) and a larger one
(bus bandwidth), checks the sum and reports. The parent waits a bounded time and kills what is
left: a hung collective cannot be interrupted from inside, and a killed process returns its GPU
memory to the driver, so nothing is held once the check is done.

Bus bandwidth follows nccl-tests (doc/PERFORMANCE.md): algbw = bytes / time, and for an all-reduce
busbw = algbw * 2(n-1)/n, the figure comparable with a link's speed whatever the rank count.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import statistics
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from goodput.api.reasons import Reason

# Expected all-reduce bus bandwidth, GB/s (1e9 bytes/s), for the message size the check uses
# (NCCL_CHECK_BYTES). Both are a reachable fraction of the links' nominal one-direction rate; a
# cluster of other hardware sets its own through the agent's flags.
NVLINK_BUSBW_GB_PER_S = 360.0
"""Within one node over NVLink 4 (H100/H200 SXM, NVSwitch): 450 GB/s per direction per GPU
(NVIDIA H100 datasheet: 900 GB/s bidirectional); nccl-tests' all_reduce_perf reaches about that for
large messages, roughly 80% of it at tens of MiB."""
FABRIC_BUSBW_GB_PER_S = 40.0
"""Across nodes over the GPU fabric: one 400 Gb/s NDR InfiniBand (or RoCE) NIC per GPU, 50 GB/s
per direction (NVIDIA DGX H100 user guide: 8 ConnectX-7 at 400 Gb/s); all_reduce_perf across nodes
reaches about 80% of it."""
FAR_BELOW_FRACTION = 0.25
"""Bandwidth under this share of the expectation fails the check (a link degraded to PCIe or TCP,
a NIC down); anything above is a pass, with the figures in the message."""
NCCL_CHECK_BYTES = 64 * 2**20
LATENCY_CHECK_BYTES = 8
ITERATIONS = 5


@dataclass(frozen=True, slots=True)
class NcclExpectation:
    busbw_gb_per_s: float
    path: str
    """What the figure is for, named in the message ("NVLink within one node")."""
    min_fraction: float = FAR_BELOW_FRACTION


def expectation_for(pods_per_group: int) -> NcclExpectation:
    """A group of one pod talks over NVLink inside its node; a multi-pod group crosses the fabric."""
    if pods_per_group > 1:
        return NcclExpectation(FABRIC_BUSBW_GB_PER_S, "the inter-node fabric")
    return NcclExpectation(NVLINK_BUSBW_GB_PER_S, "NVLink within one node")


def bus_bandwidth_gb_per_s(size_bytes: int, seconds: float, ranks: int) -> float:
    """nccl-tests' all-reduce busbw: algbw * 2(n-1)/n (0 for a single rank, which moves nothing)."""
    if seconds <= 0 or ranks < 2:
        return 0.0
    return size_bytes / seconds * 2 * (ranks - 1) / ranks / 1e9


@dataclass(frozen=True, slots=True)
class RankMeasurement:
    rank: int
    latency_seconds: float
    """Median time of the tiny all-reduce."""
    bandwidth_seconds: float
    """Median time of the NCCL_CHECK_BYTES all-reduce."""
    size_bytes: int
    world_size: int

    @property
    def busbw_gb_per_s(self) -> float:
        return bus_bandwidth_gb_per_s(self.size_bytes, self.bandwidth_seconds, self.world_size)


@dataclass(frozen=True, slots=True)
class CheckOutcome:
    """What this pod's local ranks did: every measurement, or what failed or timed out."""

    measurements: tuple[RankMeasurement, ...] = ()
    errors: tuple[str, ...] = ()
    timed_out_ranks: tuple[int, ...] = ()
    timeout_seconds: float = 0.0
    rendezvous_failures: tuple[str, ...] = ()
    """Ranks that gave up waiting for their peers (a leader that never answered, a missing rank)."""


@dataclass(frozen=True, slots=True)
class NcclVerdict:
    healthy: bool
    reason: str
    message: str
    latency_seconds: float | None = None
    busbw_gb_per_s: float | None = None
    ran: bool = True
    """False: the check was not run, so there is no evidence either way (the condition is Unknown)."""


def not_run(why: str) -> NcclVerdict:
    """No check: the pod's own GPUs cannot be told apart, so none is touched."""
    return NcclVerdict(False, Reason.NCCL_CHECK_NOT_RUN, f"not run: {why}", ran=False)


def evaluate(outcome: CheckOutcome, expectation: NcclExpectation) -> NcclVerdict:
    """Timeout first (a hang says most), then errors, then the slowest rank against expectation."""
    if outcome.timed_out_ranks or outcome.rendezvous_failures:
        parts = list(outcome.rendezvous_failures)
        if outcome.timed_out_ranks:
            ranks = ", ".join(str(rank) for rank in outcome.timed_out_ranks)
            bound = f"{outcome.timeout_seconds:g}s"
            parts.append(f"rank {ranks} did not finish the rendezvous and all-reduce within {bound}")
        return NcclVerdict(False, Reason.ALL_REDUCE_TIMEOUT, "; ".join(parts))
    if outcome.errors:
        return NcclVerdict(False, Reason.ALL_REDUCE_FAILED, "; ".join(outcome.errors))
    if not outcome.measurements:
        return NcclVerdict(False, Reason.ALL_REDUCE_FAILED, "no rank reported a measurement")
    latency = max(m.latency_seconds for m in outcome.measurements)
    busbw = min(m.busbw_gb_per_s for m in outcome.measurements)
    world = outcome.measurements[0].world_size
    if world == 1:
        message = (
            f"one GPU: no peer to all-reduce with and no link to measure; its buffer was filled, "
            f"synchronised and checked on the device in {latency * 1e6:.0f}us"
        )
        return NcclVerdict(True, Reason.ALL_REDUCE_PASSED, message, latency)
    figures = (
        f"all-reduce over {world} GPU(s): latency {latency * 1e6:.0f}us, bus bandwidth {busbw:.2f} GB/s "
        f"(expected {expectation.busbw_gb_per_s:g} GB/s over {expectation.path})"
    )
    if busbw < expectation.busbw_gb_per_s * expectation.min_fraction:
        floor = expectation.busbw_gb_per_s * expectation.min_fraction
        return NcclVerdict(
            False, Reason.ALL_REDUCE_SLOW, f"{figures}, below the {floor:g} GB/s floor", latency, busbw
        )
    return NcclVerdict(True, Reason.ALL_REDUCE_PASSED, figures, latency, busbw)


class CollectiveError(Exception):
    """The collective ran but failed: a wrong sum, a peer that closed, a library error."""


class Collective(Protocol):
    """One rank's membership of the group, after the rendezvous."""

    def all_reduce(self, size_bytes: int) -> float:
        """Sums a buffer of `size_bytes` over all ranks (each contributes rank + 1 everywhere), checks
        the result and returns the seconds it took; raises CollectiveError on a wrong result."""
        ...

    def close(self) -> None:
        """Leaves the group and releases every buffer and device resource."""
        ...


@dataclass(frozen=True, slots=True)
class RankSpec:
    """How one local process joins the group (picklable: it crosses into the rank's process)."""

    kind: Literal["tcp", "vllm"]
    leader_host: str
    port: int
    rank: int
    world_size: int
    device: int = 0
    rendezvous_timeout_seconds: float = 60.0
    delay_seconds: float = 0.0
    """Emulated only: added before each send (a slow link)."""
    hang: bool = False
    """Emulated only: join, then never send (a hung collective)."""


def local_ranks(
    *,
    kind: Literal["tcp", "vllm"],
    leader_host: str,
    port: int,
    pod_rank: int,
    pods: int,
    gpus_per_pod: int,
    rendezvous_timeout_seconds: float,
) -> tuple[RankSpec, ...]:
    """The ranks this pod runs: one per local GPU."""
    world = pods * gpus_per_pod
    return tuple(
        RankSpec(
            kind, leader_host, port, pod_rank * gpus_per_pod + local, world, local, rendezvous_timeout_seconds
        )
        for local in range(gpus_per_pod)
    )


def open_collective(spec: RankSpec) -> Collective:
    """Joins the group (the rendezvous). The vLLM collective is imported only here, in the rank's
    own process, so the agent itself never loads torch or CUDA."""
    if spec.kind == "vllm":
        from goodput.agent.vllm_collective import VllmCollective

        return VllmCollective(spec)
    from goodput.agent.tcp_collective import TcpCollective

    return TcpCollective(spec)


def measure_rank(spec: RankSpec, size_bytes: int, iterations: int) -> RankMeasurement:
    """One rank's share of the check: join, warm up, time the tiny and the large all-reduce."""
    collective = open_collective(spec)
    try:
        collective.all_reduce(LATENCY_CHECK_BYTES)
        collective.all_reduce(size_bytes)
        latency = statistics.median(collective.all_reduce(LATENCY_CHECK_BYTES) for _ in range(iterations))
        bandwidth = statistics.median(collective.all_reduce(size_bytes) for _ in range(iterations))
    finally:
        collective.close()
    return RankMeasurement(spec.rank, latency, bandwidth, size_bytes, spec.world_size)


@dataclass(frozen=True, slots=True)
class _RendezvousFailure:
    message: str


def _rank_process(
    spec: RankSpec, size_bytes: int, iterations: int, conn: multiprocessing.connection.Connection
) -> None:
    try:
        conn.send(measure_rank(spec, size_bytes, iterations))
    except TimeoutError as error:
        conn.send(_RendezvousFailure(f"rank {spec.rank}: {error}"))
    except Exception as error:
        detail = traceback.format_exception_only(error)[-1].strip()
        conn.send(f"rank {spec.rank}: {detail}")
    finally:
        conn.close()


def run_check(
    specs: Sequence[RankSpec],
    timeout_seconds: float,
    size_bytes: int = NCCL_CHECK_BYTES,
    iterations: int = ITERATIONS,
) -> CheckOutcome:
    """Runs this pod's ranks in their own processes and waits at most `timeout_seconds` for all of
    them (rendezvous included); a rank still running then is killed and reported as timed out."""
    context = multiprocessing.get_context("spawn")  # CUDA cannot live in a forked process
    running = []
    for spec in specs:
        receiver, sender = context.Pipe(duplex=False)
        process = context.Process(
            target=_rank_process,
            args=(spec, size_bytes, iterations, sender),
            daemon=True,
            name=f"nccl-check-rank-{spec.rank}",
        )
        process.start()
        sender.close()
        running.append((spec, process, receiver))
    deadline = time.monotonic() + timeout_seconds
    measurements: list[RankMeasurement] = []
    errors: list[str] = []
    rendezvous: list[str] = []
    timed_out: list[int] = []
    for spec, process, receiver in running:
        if receiver.poll(max(0.0, deadline - time.monotonic())):
            try:
                result = receiver.recv()
            except EOFError:
                result = (
                    f"rank {spec.rank}: its process ended without a result (exit code {process.exitcode})"
                )
            if isinstance(result, RankMeasurement):
                measurements.append(result)
            elif isinstance(result, _RendezvousFailure):
                rendezvous.append(result.message)
            else:
                errors.append(str(result))
        else:
            timed_out.append(spec.rank)
        _stop(process)
        receiver.close()
    return CheckOutcome(
        tuple(measurements), tuple(errors), tuple(timed_out), timeout_seconds, tuple(rendezvous)
    )


def _stop(process: multiprocessing.process.BaseProcess) -> None:
    process.join(timeout=5)
    if process.is_alive():
        process.kill()
        process.join(timeout=5)
