"""Stopping only the processes the harness started, identified by PID, binary and start time."""

from __future__ import annotations

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

from goodput.testbed.cluster import processes

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

    assert not processes.is_running(stale)
    assert processes.stop(stale, grace_seconds=0.1) is False
    time.sleep(0.1)
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
        f"open({str(port_file)!r}, 'w').write(str(s.getsockname()[1]))\n"
        "signal.signal(signal.SIGTERM, lambda *_: (time.sleep(0.5), sys.exit(0)))\n"
        "while True: time.sleep(1)\n"
    )
    record = processes.spawn(
        "server", [sys.executable, "-c", server], log_path=tmp_path / "server.log", pid_dir=tmp_path / "pids"
    )
    deadline = time.monotonic() + 10
    while not port_file.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    port = int(port_file.read_text())

    assert processes.stop(record, grace_seconds=5) is True

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", port))  # raises EADDRINUSE if the old server still held it


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
