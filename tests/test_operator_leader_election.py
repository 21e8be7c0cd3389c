"""The operator's elector over a Lease kept in memory: one of two candidates acts, the other takes
over only after the lease ran out or was released, and a holder that cannot renew ends itself."""

from __future__ import annotations

import argparse
import asyncio
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import kopf
import pytest
from waiting import wait_until

from goodput.controllers.leader_election import ElectionTiming, LeaseRecord
from goodput.operator import main
from goodput.operator.kube import KubeApi, KubeError
from goodput.operator.leader_election import EXIT_LEADERSHIP_LOST, Elector, lease_namespace
from goodput.operator.settings import Settings, add_arguments, settings_from_args

TIMING = ElectionTiming()


@dataclass
class MemoryLeases:
    """One Lease with the API server's optimistic concurrency: a stale resourceVersion is a 409."""

    namespace: str = "ops"
    name: str = "goodput"
    record: LeaseRecord | None = None
    version: int = 0
    down: bool = False
    writes: list[str] = field(default_factory=list)

    def read(self) -> tuple[LeaseRecord, str] | None:
        if self.down:
            raise OSError("connection refused")
        return None if self.record is None else (self.record, str(self.version))

    def create(self, record: LeaseRecord) -> str | None:
        if self.record is not None:
            return None
        return self._write(record)

    def replace(self, record: LeaseRecord, resource_version: str) -> str | None:
        if self.down:
            raise OSError("connection refused")
        if resource_version != str(self.version):
            return None
        return self._write(record)

    def _write(self, record: LeaseRecord) -> str:
        self.record, self.version = record, self.version + 1
        self.writes.append(record.holder_identity)
        return str(self.version)


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


def candidate(name: str, leases: MemoryLeases, clock: Clock, lost: list[int] | None = None) -> Elector:
    return Elector(
        name,
        leases,
        TIMING,
        clock=clock,
        wall_clock=lambda: datetime.fromtimestamp(clock.now, UTC),
        on_lost=(lost if lost is not None else []).append,
    )


def test_of_two_candidates_one_holds_and_the_other_takes_over_only_after_the_lease() -> None:
    leases, clock = MemoryLeases(), Clock()
    a, b = candidate("a", leases, clock), candidate("b", leases, clock)
    assert a.try_acquire_or_renew() and a.leading
    assert not b.try_acquire_or_renew() and not b.leading
    # a renews; b's clock restarts at every change it sees.
    clock.now += 10
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    # a dies: b waits out a whole lease from when it last saw a change, not from a's renewTime.
    clock.now += TIMING.lease_duration_seconds - 0.1
    assert not b.try_acquire_or_renew()
    clock.now += 0.1
    assert b.try_acquire_or_renew() and b.leading
    assert leases.record is not None and (leases.record.holder_identity, leases.record.lease_transitions) == (
        "b",
        1,
    )
    # By then a, had it lived, was past its renew deadline: it may not act.
    assert not a.leading


def test_a_holder_that_cannot_renew_stops_at_its_deadline() -> None:
    leases, clock, lost = MemoryLeases(), Clock(), []
    a = candidate("a", leases, clock, lost)
    assert a.try_acquire_or_renew()
    leases.down = True
    clock.now += 2
    assert not a.try_acquire_or_renew()
    a.check()
    assert lost == [], "within the deadline it still acts"
    clock.now += TIMING.renew_deadline_seconds - 2
    a.check()
    assert lost == [EXIT_LEADERSHIP_LOST]


def test_a_clean_stop_releases_the_lease_and_the_next_candidate_takes_it_at_once() -> None:
    leases, clock = MemoryLeases(), Clock()
    a, b = candidate("a", leases, clock), candidate("b", leases, clock)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    a.release()
    assert leases.record is not None and leases.record.holder_identity == ""
    assert b.try_acquire_or_renew()


def test_a_late_write_loses_the_race_on_the_resource_version() -> None:
    """Two candidates that read the same expired Lease: only the first write wins."""
    leases, clock = MemoryLeases(), Clock()
    leases.record = LeaseRecord("dead", 15, None, None)
    a, b = candidate("a", leases, clock), candidate("b", leases, clock)
    assert not a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    clock.now += 15
    read_by_b = leases.read()
    assert a.try_acquire_or_renew()
    assert read_by_b is not None
    assert leases.replace(LeaseRecord("b", 15), read_by_b[1]) is None
    assert not b.try_acquire_or_renew()


def test_the_background_renewal_keeps_the_lease_and_the_watchdog_ends_a_partitioned_holder() -> None:
    fast = ElectionTiming(lease_duration_seconds=10, renew_deadline_seconds=2.0, retry_period_seconds=0.1)
    leases, ended = MemoryLeases(), threading.Event()
    codes: list[int] = []

    def lost(code: int) -> None:
        codes.append(code)
        ended.set()

    elector = Elector("a", leases, fast, on_lost=lost)
    previous = signal.getsignal(signal.SIGCONT)
    try:
        elector.acquire()
        elector.keep()
        wait_until(
            lambda: leases.writes.count("a") >= 3,
            "renewed every retry period, well within the renew deadline",
            timeout_seconds=fast.renew_deadline_seconds,
        )
        assert not codes, "a holder that renews is not ended"
        leases.down = True
        assert ended.wait(8), "the watchdog ended the holder"
        assert codes[0] == EXIT_LEADERSHIP_LOST
    finally:
        elector.release()
        signal.signal(signal.SIGCONT, previous)


class RecordingClient:
    """The two calls KubeApi makes on the `kubernetes` package's ApiClient."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def param_serialize(self, method: str, **_: object) -> tuple[str, str, dict[str, str], None, None]:
        return method, "https://api/x", {}, None, None

    def call_api(self, method: str, url: str, **_: object) -> object:
        self.sent.append(method)

        class Answer:
            status, reason = 200, "OK"

            def read(self) -> bytes:
                return b"{}"

        return Answer()


def test_every_write_but_no_read_is_checked_before_it_is_sent() -> None:
    client, checked = RecordingClient(), []

    def refuse() -> None:
        checked.append(True)
        raise KubeError(0, "NotLeader", "lost the Lease")

    kube = KubeApi(client, before_write=refuse)  # type: ignore[arg-type]
    kube.request("GET", "pods", "/api/v1/pods")
    for verb in ("POST", "PATCH", "PUT", "DELETE"):
        with pytest.raises(KubeError):
            kube.request(verb, "pods", "/api/v1/namespaces/a/pods")
    assert client.sent == ["GET"] and len(checked) == 4


def parse(*argv: str, environ: dict[str, str] | None = None) -> Settings:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return settings_from_args(parser.parse_args(argv), environ or {})


def test_election_settings_come_from_flags_or_the_environment_and_bad_timing_names_the_setting() -> None:
    assert parse().leader_election is False
    environ = {
        "GOODPUT_LEADER_ELECTION": "true",
        "GOODPUT_LEADER_ELECTION_NAMESPACE": "goodput-system",
        "GOODPUT_LEASE_DURATION_SECONDS": "30",
    }
    settings = parse("--renew-deadline", "20", "--leader-election-name", "ha", environ=environ)
    assert (settings.leader_election, settings.leader_election_namespace) == (True, "goodput-system")
    assert (settings.leader_election_name, settings.election_timing()) == (
        "ha",
        ElectionTiming(lease_duration_seconds=30, renew_deadline_seconds=20.0, retry_period_seconds=2.0),
    )
    with pytest.raises(ValueError, match=r"lease_duration_seconds .* must exceed renew_deadline_seconds"):
        parse("--lease-duration", "10").election_timing()


def test_outside_a_pod_the_lease_namespace_must_be_given() -> None:
    assert lease_namespace("ops") == "ops"
    with pytest.raises(ValueError, match="leader_election_namespace"):
        lease_namespace("")


# --- `goodput run`: a clean stop hands the Lease back, whenever it comes ---------------------------


def test_a_stop_requested_while_following_ends_the_wait_without_taking_the_lease() -> None:
    leases, clock = MemoryLeases(), Clock()
    assert candidate("a", leases, clock).try_acquire_or_renew()
    b = candidate("b", leases, clock)
    asked: list[bool] = []

    def stopping() -> bool:
        asked.append(True)
        return len(asked) > 1  # the stop comes during b's first round

    started = time.monotonic()
    assert b.acquire(until=stopping) is False
    assert time.monotonic() - started < TIMING.retry_period_seconds, "not held a retry period"
    assert leases.writes == ["a"] and not b.leading


@dataclass
class RecordingElector:
    """What `run` does with the elector: checks before writes, and the release at the end."""

    released: int = 0
    on_release: Callable[[], None] = lambda: None

    def check(self) -> None:
        pass

    def release(self) -> None:
        self.on_release()
        self.released += 1


@dataclass
class Operator:
    """`goodput.operator.main.run` with the Lease, the API server and kopf stood in for."""

    elector: RecordingElector = field(default_factory=RecordingElector)
    kopf_runs: int = 0
    on_elected: Callable[[], None] = lambda: None
    kopf_run: Callable[[], None] = lambda: None

    def run(self, monkeypatch: pytest.MonkeyPatch) -> int:
        def elected(settings: Settings, *_: object) -> RecordingElector:
            self.on_elected()
            return self.elector

        def run_kopf(**_: Any) -> None:
            self.kopf_runs += 1
            self.kopf_run()

        monkeypatch.setattr(main, "elected", elected)
        monkeypatch.setattr(kopf, "run", run_kopf)
        monkeypatch.setattr(kopf, "configure", lambda **_: None)
        monkeypatch.setattr(main.KubeApi, "from_environment", classmethod(lambda cls, *a, **k: object()))
        parser = argparse.ArgumentParser()
        main.add_arguments(parser)
        args = parser.parse_args(
            ["--leader-elect", "--leader-election-namespace", "ops", "--metrics-port", "0", "--liveness", ""]
        )
        return main.run(args)


@pytest.fixture
def signals_restored() -> Iterator[None]:
    """`run` takes SIGTERM and SIGINT over and may block them: the test process gets its own back."""
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def sigterm_if_caught(missed: list[str], when: str) -> None:
    """SIGTERM to this process, as the kubelet sends it, if something other than the default action
    (exit at once, as the operator holding the Lease would) would receive it; else note it missed."""
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        missed.append(when)
        return
    signal.raise_signal(signal.SIGTERM)


def test_the_lease_is_released_when_kopf_ends_with_an_exception(
    monkeypatch: pytest.MonkeyPatch, signals_restored: None
) -> None:
    def shutdown_fails() -> None:
        raise RuntimeError("cannot schedule new futures after shutdown")

    operator = Operator(kopf_run=shutdown_fails)
    with pytest.raises(RuntimeError, match="after shutdown"):
        operator.run(monkeypatch)
    assert operator.elector.released == 1


def test_a_sigterm_between_winning_the_lease_and_kopf_starts_nothing_and_releases_the_lease(
    monkeypatch: pytest.MonkeyPatch, signals_restored: None
) -> None:
    missed: list[str] = []
    operator = Operator(on_elected=lambda: sigterm_if_caught(missed, "just after winning the Lease"))
    assert operator.run(monkeypatch) == 0
    assert missed == []
    assert (operator.kopf_runs, operator.elector.released) == (0, 1)


def test_a_second_sigterm_while_the_lease_is_released_lets_the_release_finish(
    monkeypatch: pytest.MonkeyPatch, signals_restored: None
) -> None:
    missed: list[str] = []

    def kopf_stops() -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as kopf's event loop leaves it when it closes

    operator = Operator(kopf_run=kopf_stops)
    operator.elector.on_release = lambda: sigterm_if_caught(missed, "during the release")
    assert operator.run(monkeypatch) == 0
    assert missed == []
    assert (operator.kopf_runs, operator.elector.released) == (1, 1)
    # Handed back: a later signal cannot make the exit a death by signal as the interpreter ends.
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN


def test_kopfs_cleanup_takes_the_stop_signals_back_so_its_closing_loop_leaves_them_caught(
    signals_restored: None,
) -> None:
    stop = main.StopRequest()

    async def kopf_stopping() -> None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, lambda: None)  # kopf's own
        await stop.take_back_from_kopf()

    asyncio.run(kopf_stopping())  # the loop closes, as kopf.run's does
    # The stop flag raised: kopf does not wait out the task that watches it before it returns.
    assert stop.event.is_set() and not stop.requested
    missed: list[str] = []
    sigterm_if_caught(missed, "after kopf's event loop closed")
    assert missed == [] and stop.requested
