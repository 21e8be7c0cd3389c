"""Stopping only the processes the harness started, identified by PID, binary and start time."""

from __future__ import annotations

import shutil
import socket
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
