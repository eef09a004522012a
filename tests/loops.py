"""The event loops the tests run on: asyncio's, uvloop, and a loop on virtual time.

:class:`~async_batcher.testing.VirtualClockLoop` (the package's testing kit) jumps its clock straight to the next
timer whenever nothing else can run, so behaviour that depends on time is tested exactly and instantly, with no wall
time involved. While an executor thread works, the clock stands still and the loop waits for the thread for real.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

# uvloop is part of the test environment: every async test runs on it too, and none may vanish for want of it.
import uvloop

from async_batcher.testing import VirtualClockLoop

__all__ = ["LOOP_FACTORIES", "VirtualClockLoop", "until"]


LOOP_FACTORIES: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.SelectorEventLoop,
    "uvloop": uvloop.new_event_loop,
    "virtual": VirtualClockLoop,
}

# On the virtual clock a busy loop spends no time: there, a wait is bounded by loop iterations instead (not counting
# those spent waiting for a thread, whose end wakes the loop).
_VIRTUAL_ITERATIONS = 100_000


async def until(predicate: Callable[[], object], *, within: float = 30.0) -> None:
    """Let the loop run until ``predicate()`` holds; fail after ``within`` seconds by the loop's clock."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    iterations = 0
    while not predicate():
        if isinstance(loop, VirtualClockLoop):
            iterations += 0 if loop.busy_threads else 1
            if iterations > _VIRTUAL_ITERATIONS:
                raise AssertionError(f"condition not reached in {_VIRTUAL_ITERATIONS} idle iterations")
        elif loop.time() > deadline:
            raise AssertionError(f"condition not reached within {within} s")
        await asyncio.sleep(0)
