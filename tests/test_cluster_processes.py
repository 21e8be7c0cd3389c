"""Stopping only the processes the harness started, identified by PID, binary and start time."""

from __future__ import annotations

import shutil
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
