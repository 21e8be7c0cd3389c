"""Start long-running component processes and stop exactly those, never another process by name.

Each start writes a PID file holding the PID, the executable path and the kernel's start time of
the process; a later stop signals the PID only while all three still match, so a reused PID is
left alone.

Children a caller holds as a `subprocess.Popen` (the operator, the emulator, the load generator, a
bench's server) are stopped with `stop_child`, the one bounded SIGTERM-then-SIGKILL of the test bed,
and their log files read with `log_tail`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

# Popen objects of the processes started here: held so Python neither warns about nor forgets them.
_children: dict[int, subprocess.Popen[bytes]] = {}


@dataclass(frozen=True, slots=True)
class ProcessRecord:
    """Identity of a process this package started."""

    name: str
    pid: int
    executable: str
    start_ticks: int

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ProcessRecord:
        data = json.loads(text)
        return cls(
            name=str(data["name"]),
            pid=int(data["pid"]),
            executable=str(data["executable"]),
            start_ticks=int(data["start_ticks"]),
        )


def start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat: when the process started, in clock ticks since boot; None once
    it is gone or its main thread has ended (a zombie or dead task runs nothing of its own)."""
    stat = _stat(f"/proc/{pid}/stat")
    if stat is None or stat[0] in EXITED_STATES:
        return None
    return stat[1]


EXITED_STATES = ("Z", "X")
# After SIGKILL, how long a process may take to exit before `stop` reports it as still exiting.
KILL_WAIT_SECONDS = 5.0
StopOutcome = Literal["not running", "exited", "killed", "still exiting"]
"""How `stop_process` left a process: it was not running; it exited after SIGTERM; it exited only
after SIGKILL; or it had not exited even `KILL_WAIT_SECONDS` after SIGKILL (it may hold its ports)."""


def _stat(path: str) -> tuple[str, int] | None:
    """The state and the start time (clock ticks since boot) in a /proc stat file."""
    try:
        stat = Path(path).read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may contain spaces; fields after it are plain.
    after_name = stat[stat.rfind(")") + 2 :].split()
    return after_name[0], int(after_name[19])


def has_exited(pid: int, started: int | None = None) -> bool:
    """Whether nothing of process `pid` (started at `started` ticks, if given) runs any more: gone,
    its PID reused, or every one of its threads a zombie or dead.

    Its main thread alone being a zombie is not enough: a multi-threaded server whose main thread
    ended first still holds its files and ports until its last thread has exited."""
    stat = _stat(f"/proc/{pid}/stat")
    if stat is None or (started is not None and stat[1] != started):
        return True
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    for thread in threads:
        state = _stat(f"/proc/{pid}/task/{thread}/stat")
        if state is not None and state[0] not in EXITED_STATES:
            return False
    return True


def executable_of(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")
    except OSError:
        return None


def spawn(
    name: str,
    argv: Sequence[str],
    *,
    log_path: Path,
    pid_dir: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> ProcessRecord:
    """Start `argv` detached (own session, stdin closed, output appended to `log_path`) and record it."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    pid_dir.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=dict(env) if env is not None else None,
            cwd=cwd,
        )
    _children[process.pid] = process
    ticks = None
    for _ in range(50):  # the exec may not have happened yet; wait until /proc shows the binary
        ticks = start_ticks(process.pid)
        if ticks is not None and executable_of(process.pid) == os.path.realpath(argv[0]):
            break
        if process.poll() is not None:
            break
        time.sleep(0.01)
    record = ProcessRecord(
        name=name, pid=process.pid, executable=os.path.realpath(argv[0]), start_ticks=ticks or -1
    )
    (pid_dir / f"{name}.pid").write_text(record.to_json() + "\n")
    return record


def read_records(pid_dir: Path) -> dict[str, ProcessRecord]:
    records: dict[str, ProcessRecord] = {}
    if not pid_dir.is_dir():
        return records
    for path in sorted(pid_dir.glob("*.pid")):
        with contextlib.suppress(ValueError, KeyError, OSError):
            record = ProcessRecord.from_json(path.read_text())
            records[record.name] = record
    return records


def is_running(record: ProcessRecord) -> bool:
    """True while the recorded process (same PID, binary and start time) is alive and not a zombie."""
    _reap(record.pid)
    return start_ticks(record.pid) == record.start_ticks and executable_of(record.pid) == record.executable


def stop(record: ProcessRecord, *, grace_seconds: float = 10.0) -> bool:
    """`stop_process`; whether the process had been running."""
    return stop_process(record, grace_seconds=grace_seconds) != "not running"


def stop_process(record: ProcessRecord, *, grace_seconds: float = 10.0) -> StopOutcome:
    """SIGTERM, then SIGKILL after `grace_seconds`, then at most `KILL_WAIT_SECONDS` more.

    Returns once the process has exited whole (`has_exited`: every thread ended, every file and port
    closed), so a `down` followed at once by an `up` never races the old processes, or, past those
    bounds, says that it had not ("still exiting"). A process whose main thread has already ended
    while others still run is exiting: it is waited for (and killed) like one signalled here. Its
    binary is not checked while waiting: /proc/<pid>/exe stops resolving part-way through an exit,
    before the process has let go of its ports; its PID and start time still name it.
    """
    if is_running(record):
        _signal(record, signal.SIGTERM)
    elif not _exiting(record):
        return "not running"
    if _wait_exited(record, grace_seconds):
        return "exited"
    _signal(record, signal.SIGKILL)
    return "killed" if _wait_exited(record, KILL_WAIT_SECONDS) else "still exiting"


def _exiting(record: ProcessRecord) -> bool:
    """Its main thread has ended (a zombie) while another of its threads still runs."""
    stat = _stat(f"/proc/{record.pid}/stat")
    exiting = stat is not None and stat[0] in EXITED_STATES and stat[1] == record.start_ticks
    return exiting and not has_exited(record.pid, record.start_ticks)


def _wait_exited(record: ProcessRecord, timeout_seconds: float) -> bool:
    deadline = time.monotonic() + timeout_seconds
    while True:
        _reap(record.pid)
        if has_exited(record.pid, record.start_ticks):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def _signal(record: ProcessRecord, sig: signal.Signals) -> None:
    # Re-checked right before signalling, by PID and start time: never hit a reused PID.
    if not has_exited(record.pid, record.start_ticks):
        with contextlib.suppress(ProcessLookupError):
            os.kill(record.pid, sig)


def _reap(pid: int) -> None:
    """Collect the exit status if the process is our own child, so it does not linger as a zombie."""
    child = _children.get(pid)
    if child is not None:
        if child.poll() is not None:
            del _children[pid]
        return
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def stop_child(
    process: subprocess.Popen[Any] | None, *, grace_seconds: float, kill: bool = False
) -> int | None:
    """Stop a child this process holds: SIGTERM (SIGKILL at once with `kill`, to crash it mid-work),
    then SIGKILL once `grace_seconds` pass. Returns its exit status, None if it never started.

    Bounded: at most `grace_seconds` plus 5 s. A child that already exited is only reaped.
    """
    if process is None:
        return None
    if process.poll() is None:
        process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
    try:
        return process.wait(timeout=grace_seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait(timeout=5)


def log_tail(log_path: Path, lines: int = 15) -> str:
    """The last lines of a child's log, for an error message; empty while there is no log."""
    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    return "\n".join(text.splitlines()[-lines:])
