"""An event loop on a virtual clock: the injected clock of tests that run asyncio code.

The loop jumps its clock to the next timer whenever nothing is ready to run, instead of sleeping, so
an `asyncio.sleep(30)` or a timeout in the code under test costs no wall time and every run is exact
and instant, however busy the machine is. Sockets still work (a loopback peer's bytes are ready at
once); a test that waits on a thread must not run on it, as the clock would jump past the wait.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock jumps to the next timer whenever nothing is ready to run."""

    def __init__(self) -> None:
        super().__init__(selectors.DefaultSelector())
        self._virtual_now = 1000.0
        select = self._selector.select  # type: ignore[attr-defined]

        def virtual_select(timeout: float | None = None) -> list[Any]:
            events = select(0)
            if not events and timeout:
                self._virtual_now += timeout
            return events  # type: ignore[no-any-return]

        self._selector.select = virtual_select  # type: ignore[attr-defined]

    def time(self) -> float:
        return self._virtual_now


def run_virtual(main: Callable[[], Awaitable[T]]) -> T:
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()
