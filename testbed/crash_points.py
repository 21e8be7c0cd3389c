"""The operator killed at a named write of a drain: the crash stories
of issue 18 (`e2e/test_drain_killed.py`).

`python -m goodput.testbed.crash_points --kill-at STEP run ...` runs the operator exactly as
`goodput run ...` does, except that one write method of the group loop's `PlanWrites` is wrapped:
the process SIGKILLs itself the first time that write completes, so a story lands a kill exactly
between two writes. The operator package reads no test switch; only this module, which no image
ships, knows the crash points.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from goodput.controllers.groups.model import GroupDeletion
from goodput.operator import cli
from goodput.operator.handlers import PlanWrites


def _always(_writes: PlanWrites, _action: Any) -> bool:
    return True


def _drained(writes: PlanWrites, deletion: GroupDeletion) -> bool:
    """A deletion of a group whose drain ended (its outcome is on its ranks), not of a failed one."""
    return any(
        (view := writes.views.get(pod)) is not None and view.drain_outcome is not None
        for pod in deletion.pods
    )


@dataclass(frozen=True, slots=True)
class CrashPoint:
    """Kill right after `method` of `PlanWrites` returns, when `applies` to its action."""

    method: str
    applies: Callable[[PlanWrites, Any], bool]
    describe: str


CRASH_POINTS: Mapping[str, CrashPoint] = {
    # A victim's ranks marked draining-since; no gate changed yet, other victims untouched.
    "drain-marked": CrashPoint("mark_draining", _always, "after the drain mark on some victims only"),
    # A victim's readiness gates False (out of its Service); other victims possibly not started.
    "drain-gated": CrashPoint("start_drain", _always, "after a victim's readiness gate went False"),
    # A drain's outcome on its ranks, not yet in status; nothing deleted.
    "drain-outcome": CrashPoint("write_outcome", _always, "after a drain's outcome was written on its ranks"),
    # A drained group's pods deleted, the pass's status write not done.
    "drain-deleted": CrashPoint("delete", _drained, "after deleting a drained group's pods"),
}


def arm(step: str) -> None:
    """Wrap the write of `step` so that the process dies (SIGKILL: no clean-up, no flush) after it."""
    point = CRASH_POINTS[step]
    original: Callable[[PlanWrites, Any], Awaitable[None]] = getattr(PlanWrites, point.method)

    async def write_then_die(self: PlanWrites, action: Any) -> None:
        await original(self, action)
        if point.applies(self, action):
            _die()

    setattr(PlanWrites, point.method, write_then_die)


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="crash_points", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--kill-at", required=True, choices=sorted(CRASH_POINTS), help="the write to die after"
    )
    args, operator_argv = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    arm(args.kill_at)
    return cli.main(operator_argv)


if __name__ == "__main__":
    sys.exit(main())
