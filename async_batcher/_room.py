"""Room in a bounded queue: who may queue now, and the line of callers waiting for room (private).

With ``max_queue_size`` set, a call whose items do not fit waits in line (``wait_when_full=True``), first come,
first served; :func:`wake_putters` promises room to the head of the line as far as it reaches, and the woken caller
queues its items without awaiting anything (``reserved`` counts the room promised meanwhile). The waiting itself is
admission's (:func:`async_batcher._admission.wait_for_room`); this is the bookkeeping every layer may need: the
dispatcher and a streaming batch make room as batches take items, a stop refuses the line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from async_batcher.exceptions import QueueFullException

if TYPE_CHECKING:
    from async_batcher._base import Base
    from async_batcher._run import Run
from async_batcher._checks import plural

__all__: list[str] = []


def no_room(b: Base, run: Run, n: int) -> bool:
    """Whether ``n`` items must wait for room: the queue is full, or others wait already (they go first)."""
    return run.queue.waiting + run.reserved + n > b._room_limit or bool(run.putters)


def wake_putters(b: Base, run: Run) -> None:
    """Promise room to the callers in line, in order, as long as the next one fits. One that can never fit
    (``max_queue_size`` was lowered under it) is refused: it would hold the line forever."""
    putters = run.putters
    while putters:
        waiter, n = putters[0]
        if waiter.done():  # it gave up while waiting: skip it
            putters.popleft()
            continue
        if n > b._room_limit:
            putters.popleft()
            waiter.set_exception(
                QueueFullException(
                    f"{b.name}: a call of {plural(n, 'item')} can never fit in max_queue_size={b._max_queue_size},"
                    " lowered while it waited for room"
                )
            )
            continue
        if run.queue.waiting + run.reserved + n > b._room_limit:
            return  # the head of the line does not fit yet; nobody may overtake it
        putters.popleft()
        run.reserved += n
        waiter.set_result(None)


def fail_putters(run: Run, exc: BaseException) -> None:
    """Refuse every caller in line for room (a stop): each counts itself out as it wakes."""
    while run.putters:
        waiter, _ = run.putters.popleft()
        if not waiter.done():
            waiter.set_exception(exc)
