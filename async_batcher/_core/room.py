"""Room in a bounded queue: who may queue now, and the line of callers waiting for room (private).

With ``max_queue_size`` set, a call whose items do not fit waits in line (``wait_when_full=True``), first come,
first served; :meth:`Room.wake` promises room to the head of the line as far as it reaches, and the woken caller
queues its items without awaiting anything (``reserved`` counts the room promised meanwhile). A blocking call is
"wait, then the non-blocking call": :meth:`Room.wait` waits its turn, then the caller queues its items as if there
had been room all along. The engine owns one :class:`Room` per run, beside its queue.
"""

from __future__ import annotations

import asyncio
import sys
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from async_batcher._checks import plural
from async_batcher.exceptions import QueueFullException

if TYPE_CHECKING:
    from async_batcher._core.deadlines import Deadlines
    from async_batcher._core.queue import Queue
    from async_batcher.stats import _Recorder

__all__: list[str] = []


class Room:
    """The line of callers waiting for room in one run's queue, and the room promised to those woken.

    Invariant: ``0 <= reserved <= awaiting`` (room promised to woken callers is room they still wait to take).
    """

    __slots__ = ("awaiting", "limit", "name", "putters", "queue", "reserved", "size")

    def __init__(self, queue: Queue, name: str) -> None:
        self.queue = queue
        self.name = name
        self.limit = sys.maxsize  # max_queue_size as the queue compares it (sys.maxsize: none)
        self.size: int | None = None  # max_queue_size as the user gave it (for messages)
        self.putters: deque[tuple[asyncio.Future[None], int]] = deque()  # (waiter, items)
        self.awaiting = 0  # items of the callers in line for room, woken or not
        self.reserved = 0  # room promised to woken callers that have not queued their items yet

    def set_limit(self, limit: int, size: int | None) -> None:
        """``max_queue_size`` as it is now: ``limit`` to compare against, ``size`` as given (``None``: no limit)."""
        self.limit, self.size = limit, size

    def no_room(self, n: int) -> bool:
        """Whether ``n`` items must wait for room: the queue is full, or others wait already (they go first)."""
        return self.queue.waiting + self.reserved + n > self.limit or bool(self.putters)

    def wake(self) -> None:
        """Promise room to the callers in line, in order, as long as the next one fits. One that can never fit
        (``max_queue_size`` was lowered under it) is refused: it would hold the line forever."""
        putters = self.putters
        while putters:
            waiter, n = putters[0]
            if waiter.done():  # it gave up while waiting: skip it
                putters.popleft()
                continue
            if n > self.limit:
                putters.popleft()
                waiter.set_exception(
                    QueueFullException(
                        f"{self.name}: a call of {plural(n, 'item')} can never fit in max_queue_size={self.size}, "
                        "lowered while it waited for room"
                    )
                )
                continue
            if self.queue.waiting + self.reserved + n > self.limit:
                return  # the head of the line does not fit yet; nobody may overtake it
            putters.popleft()
            self.reserved += n
            waiter.set_result(None)

    def fail(self, exc: BaseException) -> None:
        """Refuse every caller in line (a stop): each counts itself out as it wakes."""
        while self.putters:
            waiter, _ = self.putters.popleft()
            if not waiter.done():
                waiter.set_exception(exc)

    async def wait(
        self,
        n: int,
        deadline: float | None,
        deadlines: Deadlines,
        recorder: _Recorder,
        wanted: Callable[[], None],
    ) -> None:
        """Wait, first come first served, until ``n`` items fit; on return, room for them is the caller's: it queues
        them without awaiting anything. ``wanted`` is told that a caller waits (a hold must not keep it waiting)."""
        loop = deadlines.loop
        assert loop is not None
        waiter: asyncio.Future[None] = loop.create_future()
        self.putters.append((waiter, n))
        self.awaiting += n
        wanted()
        expiry = None if deadline is None else deadlines.add(deadline, _expire, self.name, waiter)
        try:
            await waiter
        except BaseException as exc:  # it gives up: cancelled, timed out, or refused by a stop
            # (The waiter is pending when the caller's coroutine was closed: GeneratorExit.)
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self.reserved -= n  # woken, then cancelled before it could queue: the room goes to the next in line
            self.awaiting -= n
            recorder.exited += n
            if isinstance(exc, asyncio.CancelledError):
                recorder.cancelled += n
            elif isinstance(exc, TimeoutError):
                recorder.timed_out += n
            else:
                recorder.failed += n
            self.wake()  # it may have been the head of the line, holding smaller requests back
            raise
        finally:
            if expiry is not None:
                deadlines.discard(expiry)
        self.reserved -= n
        self.awaiting -= n


def _expire(name: str, waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError(f"{name}: no room in the queue within the timeout"))
