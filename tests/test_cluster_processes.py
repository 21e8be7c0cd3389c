"""Stopping only the processes the harness started, identified by PID, binary and start time."""

from __future__ import annotations

import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from waiting import wait_until

from goodput.testbed.cluster import cli, processes
from goodput.testbed.cluster.config import StatePaths

SLEEP = shutil.which("sleep") or "/bin/sleep"


@pytest.fixture
def sleeper(tmp_path: Path) -> Iterator[processes.ProcessRecord]:
    record = processes.spawn(
        "sleeper", [SLEEP, "60"], log_path=tmp_path / "sleeper.log", pid_dir=tmp_path / "pids"
    )
    yield record
    processes.stop(record, grace_seconds=1)


def test_spawn_records_the_process_in_a_pid_file(tmp_path: Path, sleeper: processes.ProcessRecord) -> None:
    assert processes.is_running(sleeper)
    assert processes.read_records(tmp_path / "pids") == {"sleeper": sleeper}
    assert Path(sleeper.executable).name == "sleep"


def test_stop_ends_the_recorded_process(sleeper: processes.ProcessRecord) -> None:
    assert processes.stop(sleeper, grace_seconds=5) is True
    assert not processes.is_running(sleeper)
    assert processes.stop(sleeper) is False  # a second stop finds nothing to do


@pytest.mark.parametrize(
    "mismatch",
    [{"start_ticks": 1}, {"executable": "/usr/bin/not-sleep"}],
    ids=["reused pid (other start time)", "other binary"],
)
def test_a_record_that_no_longer_matches_never_kills(
    sleeper: processes.ProcessRecord, mismatch: dict[str, object]
) -> None:
    stale = replace(sleeper, **mismatch)
    signalled: list[tuple[int, int]] = []

    assert not processes.is_running(stale)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "kill", lambda pid, sig: signalled.append((pid, sig)))
        assert processes.stop(stale, grace_seconds=0.1) is False
    assert signalled == [], "no signal sent on a record that no longer matches"
    assert processes.is_running(sleeper)


def test_unreadable_pid_files_are_ignored(tmp_path: Path) -> None:
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    (pid_dir / "broken.pid").write_text("not json")
    assert processes.read_records(pid_dir) == {}
    assert processes.read_records(tmp_path / "missing") == {}


def test_stop_returns_only_after_the_process_let_go_of_its_port(tmp_path: Path) -> None:
    # A server that takes half a second to shut down after SIGTERM, holding its port meanwhile: a
    # `down` followed at once by an `up` must find the port free.
    port_file = tmp_path / "port"
    server = (
        "import signal, socket, sys, time\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
        f"open({str(port_file)!r} + '.part', 'w').write(str(s.getsockname()[1]))\n"
        f"import os; os.replace({str(port_file)!r} + '.part', {str(port_file)!r})\n"
        "signal.signal(signal.SIGTERM, lambda *_: (time.sleep(0.5), sys.exit(0)))\n"
        "while True: time.sleep(1)\n"
    )
    record = processes.spawn(
        "server", [sys.executable, "-c", server], log_path=tmp_path / "server.log", pid_dir=tmp_path / "pids"
    )
    wait_until(port_file.exists, "the server wrote its port")
    port = int(port_file.read_text())

    assert processes.stop(record, grace_seconds=5) is True

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", port))  # raises EADDRINUSE if the old server still held it


# A server whose main thread ends first on SIGTERM (as a Go binary's may), while another thread
# holds its port for half a second more: /proc shows its main thread a zombie all that time. The
# raw exit system call ends only the calling thread (os._exit would end them all).
SYS_EXIT = {"x86_64": 60, "aarch64": 93}
MAIN_THREAD_EXITS_FIRST = """
import ctypes, os, signal, socket, sys, threading, time
s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()
def hold_then_exit():
    stopping.wait(); time.sleep(0.5); os._exit(0)
stopping = threading.Event()
threading.Thread(target=hold_then_exit).start()
def on_term(*_):
    stopping.set(); ctypes.CDLL(None).syscall({sys_exit}, 0)
signal.signal(signal.SIGTERM, on_term)
open({port_file!r} + '.part', 'w').write(str(s.getsockname()[1]))
os.replace({port_file!r} + '.part', {port_file!r})  # the port appears whole, never half-written
while True: time.sleep(1)
"""


def serving(tmp_path: Path, source: str) -> tuple[processes.ProcessRecord, int]:
    """`source` spawned as a recorded process, and the port it writes to `port_file` once listening."""
    port_file = tmp_path / "port"
    code = source.format(port_file=str(port_file), sys_exit=SYS_EXIT.get(os.uname().machine, 60))
    record = processes.spawn(
        "server", [sys.executable, "-c", code], log_path=tmp_path / "server.log", pid_dir=tmp_path / "pids"
    )
    wait_until(port_file.exists, "the server wrote its port")
    return record, int(port_file.read_text())


def test_stop_waits_for_every_thread_when_the_main_thread_exits_first(tmp_path: Path) -> None:
    record, port = serving(tmp_path, MAIN_THREAD_EXITS_FIRST)

    assert processes.stop_process(record, grace_seconds=5) == "exited"

    assert processes.has_exited(record.pid, record.start_ticks)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", port))  # raises EADDRINUSE if a thread of the old server still held it


def test_a_process_whose_main_thread_already_ended_is_still_waited_for(tmp_path: Path) -> None:
    record, port = serving(tmp_path, MAIN_THREAD_EXITS_FIRST)
    os.kill(record.pid, signal.SIGTERM)  # someone else began its stop
    wait_until(
        lambda: not processes.is_running(record), "the main thread ended on SIGTERM", timeout_seconds=5
    )
    assert not processes.is_running(record) and not processes.has_exited(record.pid, record.start_ticks)

    assert processes.stop_process(record, grace_seconds=5) == "exited"

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", port))


def test_a_process_that_ignores_sigterm_is_reported_killed(tmp_path: Path) -> None:
    record = processes.spawn(
        "stubborn", [sys.executable, "-c", STUBBORN], log_path=tmp_path / "stubborn.log", pid_dir=tmp_path
    )
    wait_until(lambda: "ready" in (tmp_path / "stubborn.log").read_text(), "the child ignores SIGTERM")
    assert processes.stop_process(record, grace_seconds=0.3) == "killed"
    assert processes.has_exited(record.pid, record.start_ticks)
    assert processes.stop_process(record) == "not running"


# A child that ignores SIGTERM, says so once it does, and then sleeps: only SIGKILL ends it.
STUBBORN = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('ready', flush=True); time.sleep(60)"
)


@pytest.mark.parametrize(
    ("argv", "kill", "exit_status"),
    [
        pytest.param([SLEEP, "60"], False, -signal.SIGTERM, id="sigterm-first"),
        pytest.param([SLEEP, "60"], True, -signal.SIGKILL, id="kill-crashes-it-at-once"),
        pytest.param([sys.executable, "-c", STUBBORN], False, -signal.SIGKILL, id="sigkill-after-the-grace"),
        pytest.param([sys.executable, "-c", "raise SystemExit(3)"], False, 3, id="an-exited-child-is-reaped"),
    ],
)
def test_stop_child_ends_a_held_child_within_its_bound(argv: list[str], kill: bool, exit_status: int) -> None:
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    if argv[-1] == STUBBORN:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
    elif exit_status >= 0:
        child.wait(timeout=10)
    started = time.monotonic()
    try:
        assert processes.stop_child(child, grace_seconds=0.5, kill=kill) == exit_status
        assert time.monotonic() - started < 0.5 + 5
        assert child.poll() is not None
    finally:
        if child.poll() is None:  # only when stop_child is broken: never leave the child behind
            child.kill()
            child.wait(timeout=5)


def test_stop_child_of_nothing_started_is_none() -> None:
    assert processes.stop_child(None, grace_seconds=1) is None


def test_log_tail_is_the_last_lines_or_nothing(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    assert processes.log_tail(log) == ""
    log.write_text("".join(f"line {i}\n" for i in range(20)))
    assert processes.log_tail(log, 2) == "line 18\nline 19"


def test_cluster_down_returns_once_every_process_it_stopped_has_exited_and_says_which_needed_sigkill(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state_dir = tmp_path / "cluster"
    pids = StatePaths(state_dir).pids
    record, port = serving(state_dir, MAIN_THREAD_EXITS_FIRST)
    stubborn = processes.spawn(
        "stubborn", [sys.executable, "-c", STUBBORN], log_path=state_dir / "stubborn.log", pid_dir=pids
    )
    wait_until(lambda: "ready" in (state_dir / "stubborn.log").read_text(), "the child ignores SIGTERM")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(processes, "stop_process", functools.partial(processes.stop_process, grace_seconds=1))
        assert cli._down(state_dir, keep_logs=False) == 0

    assert all(processes.has_exited(r.pid, r.start_ticks) for r in (record, stubborn))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", port))
    printed = capsys.readouterr().out
    assert "stopped: server, stubborn" in printed
    assert "killed (SIGKILL after the SIGTERM grace): stubborn" in printed
    assert "every process stopped has exited" in printed and not state_dir.exists()
