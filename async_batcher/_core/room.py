"""Room in a bounded queue: who may queue now, and the line of callers waiting for room (private).

With ``max_queue_size`` set, a call whose items do not fit waits in line (``wait_when_full=True``), first come,
first served; :meth:`Room.wake` promises room to the head of the line as far as it reaches, and the woken caller
queues its items without awaiting anything (``reserved`` counts the room promised meanwhile). A blocking call is
"wait, then the non-blocking call": :meth:`Room.wait` waits its turn, then the caller queues its items as if there
had been room all along. The engine owns one :class:`Room` per run, beside its queue.

With ``max_queue_weight`` set, the room is also a weight: ``held`` is the weight admitted and not yet resolved (an
item's weight is taken as it is admitted, :meth:`Room.take`, and given back when its call resolves, whatever the
outcome, :meth:`Room.release`: the memory an item holds is held until its caller has its answer, not only until it
is sent). The line is the same line: its head waits until both its items and its weight fit, and nobody overtakes
it, so that a large item is never starved by a stream of small ones. An item heavier than the limit can never fit:
it is refused before it waits (:class:`~async_batcher.OversizedItemError`), and one in line when the limit is
lowered under it is refused then.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from async_batcher._checks import plural
from async_batcher._core.state import UNLIMITED
from async_batcher.exceptions import OversizedItemError, QueueFullException
from async_batcher.stats import CANCELLED, FAILED, TIMED_OUT

if TYPE_CHECKING:
    from async_batcher._core.deadlines import Deadlines
    from async_batcher._core.queue import Queue
    from async_batcher.stats import _Recorder

__all__: list[str] = []


class Room:
    """The line of callers waiting for room in one run's queue, and the room promised to those woken.

    Invariants: ``0 <= reserved <= awaiting`` (room promised to woken callers is room they still wait to take);
    ``0 <= reserved_weight``; ``held >= 0`` (:func:`violations`).
    """

    __slots__ = (
        "awaiting",
        "held",
        "limit",
        "limited",
        "name",
        "putters",
        "queue",
        "reserved",
        "reserved_weight",
        "size",
        "weight_limit",
    )

    def __init__(self, queue: Queue, name: str) -> None:
        self.queue = queue
        self.name = name
        self.limit = UNLIMITED  # max_queue_size as the queue compares it
        self.limited = False  # whether it is below UNLIMITED
        self.size: int | None = None  # max_queue_size as the user gave it (for messages)
        self.weight_limit = math.inf  # max_queue_weight (inf: none); set by the engine
        self.putters: deque[tuple[asyncio.Future[None], int, float]] = deque()  # (waiter, items, weight)
        self.awaiting = 0  # items of the callers in line for room, woken or not
        self.reserved = 0  # room promised to woken callers that have not queued their items yet
        self.held = 0.0  # weight admitted and not yet resolved (kept while max_queue_weight is set)
        self.reserved_weight = 0.0  # weight promised to woken callers that have not taken it yet

    def set_limit(self, limit: int, size: int | None, weight_limit: float = math.inf) -> None:
        """``max_queue_size`` and ``max_queue_weight`` as they are now: ``limit`` to compare against, ``size`` as
        given (``None``: no limit), and the weight (``inf``: no limit)."""
        self.limit, self.size, self.weight_limit = limit, size, weight_limit
        self.limited = limit < UNLIMITED

    def no_room(self, n: int, weight: float = 0.0) -> bool:
        """Whether ``n`` items of ``weight`` must wait for room: the queue is full, its weight is, or others wait
        already (they go first)."""
        return (
            self.queue.waiting + self.reserved + n > self.limit
            or self.held + self.reserved_weight + weight > self.weight_limit
            or bool(self.putters)
        )

    def take(self, weight: float) -> None:
        """``weight`` is admitted: it is held until :meth:`release`."""
        self.held += weight

    def release(self, weight: float) -> None:
        """Weight admitted earlier has resolved: room for the callers in line."""
        held = self.held - weight
        self.held = held if held > 1e-9 * self.weight_limit else 0.0  # (no drift from float sums at rest)
        if self.putters:
            self.wake()

    def wake(self) -> None:
        """Promise room to the callers in line, in order, as long as the next one fits. One that can never fit
        (``max_queue_size`` or ``max_queue_weight`` was lowered under it) is refused: it would hold the line
        forever."""
        putters = self.putters
        while putters:
            waiter, n, weight = putters[0]
            if waiter.done():  # it gave up while waiting: skip it
                putters.popleft()
                continue
            if n > self.limit or weight > self.weight_limit:
                putters.popleft()
                waiter.set_exception(self.never_fits(n, weight, lowered=True))
                continue
            if (
                self.queue.waiting + self.reserved + n > self.limit
                or self.held + self.reserved_weight + weight > self.weight_limit
            ):
                return  # the head of the line does not fit yet; nobody may overtake it
            putters.popleft()
            self.reserved += n
            self.reserved_weight += weight
            waiter.set_result(None)

    def never_fits(self, n: int, weight: float, *, lowered: bool = False) -> Exception:
        """Why ``n`` items of ``weight`` can never be admitted (the count, else the weight)."""
        since = ", lowered while it waited for room" if lowered else ""
        if n > self.limit:
            return QueueFullException(
                f"{self.name}: a call of {plural(n, 'item')} can never fit in max_queue_size={self.size}{since}"
            )
        what = "an item" if n == 1 else f"a call of {plural(n, 'item')}"
        return OversizedItemError(
            f"{self.name}: {what} of weight {weight:g} can never fit in max_queue_weight={self.weight_limit:g}{since}",
            weight=weight,
            limit=self.weight_limit,
        )

    def fail(self, exc: BaseException) -> None:
        """Refuse every caller in line (a stop): each counts itself out as it wakes."""
        while self.putters:
            waiter, _, _ = self.putters.popleft()
            if not waiter.done():
                waiter.set_exception(exc)

    async def wait(
        self,
        n: int,
        deadline: float | None,
        deadlines: Deadlines,
        recorder: _Recorder,
        wanted: Callable[[], None],
        weight: float = 0.0,
    ) -> None:
        """Wait, first come first served, until ``n`` items of ``weight`` fit; on return, room for them is the
        caller's: it queues them (and :meth:`take` their weight) without awaiting anything. ``wanted`` is told that
        a caller waits (a hold must not keep it waiting)."""
        loop = deadlines.loop
        assert loop is not None
        waiter: asyncio.Future[None] = loop.create_future()
        self.putters.append((waiter, n, weight))
        self.awaiting += n
        wanted()
        expiry = None if deadline is None else deadlines.add(deadline, _expire, self.name, waiter)
        try:
            await waiter
        except BaseException as exc:  # it gives up: cancelled, timed out, or refused by a stop
            # (The waiter is pending when the caller's coroutine was closed: GeneratorExit.)
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                # Woken, then cancelled before it could queue: the room goes to the next in line.
                self.reserved -= n
                self.reserved_weight -= weight
            self.awaiting -= n
            recorder.left(n)
            if isinstance(exc, asyncio.CancelledError):
                recorder.resolved(n, CANCELLED)
            elif isinstance(exc, TimeoutError):
                recorder.resolved(n, TIMED_OUT)
            else:
                recorder.resolved(n, FAILED)
            self.wake()  # it may have been the head of the line, holding smaller requests back
            raise
        finally:
            if expiry is not None:
                deadlines.discard(expiry)
        self.reserved -= n
        self.reserved_weight -= weight
        self.awaiting -= n


def violations(room: Room) -> list[str]:
    """The invariants of :class:`Room` that do not hold now, described (for the tests)."""
    found: list[str] = []
    if not 0 <= room.reserved <= room.awaiting:
        found.append(f"reserved {room.reserved} outside 0..awaiting={room.awaiting}")
    if room.reserved_weight < -1e-6 or room.held < -1e-6:
        found.append(f"negative weight: held {room.held}, reserved {room.reserved_weight}")
    return found


def _expire(name: str, waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError(f"{name}: no room in the queue within the timeout"))
