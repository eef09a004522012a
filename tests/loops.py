"""The event loops the tests run on: asyncio's, uvloop, and a loop on virtual time.

:class:`VirtualClockLoop`'s clock jumps straight to the next timer whenever nothing else can run, so behaviour that
depends on time is tested exactly and instantly, with no wall time involved. While an executor thread works, the
clock stands still and the loop waits for the thread for real.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable
from typing import Any

# uvloop is part of the test environment: every async test runs on it too, and none may vanish for want of it.
import uvloop

__all__ = ["LOOP_FACTORIES", "VirtualClockLoop", "until"]


class _JumpSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """Polls for real; when nothing is ready and a timer is pending, advances the virtual clock to it."""

    def __init__(self, loop: VirtualClockLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[Any]:
        events = super().select(0)
        if events or timeout == 0:
            return events
        if timeout is None or self._loop.busy_threads:
            # Nothing scheduled, or a thread is working: wait for real (the thread wakes the loop).
            return super().select(timeout if timeout is None else None)
        self._loop.advance(timeout)
        return []


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time: ``time()`` only moves when the loop would otherwise sleep."""

    def __init__(self) -> None:
        self._now = 0.0
        self.jumps = 0  # how many times the clock jumped to a timer: each is a wake-up of an idle loop
        self.busy_threads = 0
        super().__init__(selector=_JumpSelector(self))

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds
        self.jumps += 1

    def run_in_executor(self, executor: Any, func: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        # While a thread works, time must not jump ahead of it.
        self.busy_threads += 1
        fut = super().run_in_executor(executor, func, *args)
        fut.add_done_callback(self._thread_done)
        return fut

    def _thread_done(self, _: asyncio.Future[Any]) -> None:
        self.busy_threads -= 1

    async def shutdown_default_executor(self, *args: Any, **kwargs: Any) -> None:
        # Joining the executor's threads happens in a thread, under a timeout (Python 3.12+): the clock must not
        # jump to that timeout while they finish.
        self.busy_threads += 1
        try:
            await super().shutdown_default_executor(*args, **kwargs)
        finally:
            self.busy_threads -= 1


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
