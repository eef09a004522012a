"""How items get in and how they get out without a batch: the slow paths of submission, waiting for room in a full
queue, timeouts, and withdrawal when a caller leaves (private).

:meth:`AsyncBatcher.process` keeps the common case inline (running on its loop, no key, no weight, no timeout, no
priority, room in the queue); everything else comes here. A blocking call is "wait, then the non-blocking call":
:func:`wait_for_room` waits its turn, then the caller queues its items as if there had been room all along.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Hashable, Iterable
from contextvars import copy_context
from typing import TYPE_CHECKING, Any

from async_batcher import _checks, _dispatch, _execution, _lifecycle, _room, _sinks, _streaming
from async_batcher._queue import DEFAULT_KEY, LANE, SINK, Queue
from async_batcher._run import Run, State
from async_batcher._sinks import Bulk
from async_batcher.exceptions import BatcherStoppedError, QueueFullException, ReentrantCallError

if TYPE_CHECKING:
    from async_batcher._base import Base

__all__: list[str] = []


async def submit(b: Base, item: Any, *, timeout: float | None, priority: float) -> Any:
    """:meth:`AsyncBatcher.process` with a key, a weight, a priority, a timeout or a full queue; or not running."""
    priority = _checks.priority(priority)
    timeout = b._default_timeout if timeout is None else _checks.timeout(timeout)
    loop = asyncio.get_running_loop()
    run = _lifecycle.admit(b, loop, 1)
    if run.is_stream:
        raise TypeError(f"{b.name} streams its results (process_batch is an async generator): iterate stream(item)")
    deadline = None if timeout is None else loop.time() + timeout
    key, weight = key_and_weight(b, run, item, 1)
    refuse_if_reentrant(b, run, 1)
    if _room.no_room(b, run, 1):
        await wait_for_room(b, run, 1, deadline)
    queue = run.queue
    lane = queue.lane(key)
    fut: asyncio.Future[Any] = loop.create_future()
    entry = [item, fut, loop.time(), True, weight, lane, 0, copy_context()]
    queue.push(entry, priority)
    _dispatch.arrived(b, run, lane)
    expiry = None if deadline is None else run.deadlines.add(deadline, expire, b, run, entry)
    try:
        return await fut
    except asyncio.CancelledError:
        left(b, run, entry, fut)
        raise
    finally:
        if expiry is not None:
            run.deadlines.discard(expiry)


async def submit_many(
    b: Base, items: Iterable[Any], *, timeout: float | None, priority: float, return_exceptions: bool
) -> list[Any]:
    """:meth:`AsyncBatcher.process_many`: admitted whole or not at all, one future for the whole call."""
    priority = _checks.priority(priority)
    timeout = b._default_timeout if timeout is None else _checks.timeout(timeout)
    return_exceptions = _checks.flag("return_exceptions", return_exceptions)
    loop = asyncio.get_running_loop()
    batch = list(items)
    n = len(batch)
    run = _lifecycle.admit(b, loop, n)
    if run.is_stream:
        raise TypeError(f"{b.name} streams its results (process_batch is an async generator): iterate stream(item)")
    if n == 0:
        return []
    deadline = None if timeout is None else loop.time() + timeout
    keys_weights = [key_and_weight(b, run, x, n) for x in batch] if run.keyed or run.queue.weighted else None
    if n > b._room_limit:
        b._recorder.rejected += n
        raise QueueFullException(
            f"{b.name}: process_many of {_checks.plural(n, 'item')} can never fit in max_queue_size={b._max_queue_size}"
        )
    refuse_if_reentrant(b, run, n)
    if _room.no_room(b, run, n):
        await wait_for_room(b, run, n, deadline)
    queue = run.queue
    fut: asyncio.Future[list[Any]] = loop.create_future()
    bulk = _enqueue_bulk(queue, batch, keys_weights, fut, loop.time(), priority, return_exceptions, b)
    lanes = [queue.lane0] if bulk.entries is None else dict.fromkeys(entry[LANE] for entry in bulk.entries)
    for lane in lanes:
        _dispatch.arrived(b, run, lane)
    expiry = None if deadline is None else run.deadlines.add(deadline, expire_bulk, b, run, bulk)
    try:
        return await fut
    except asyncio.CancelledError:
        if fut.cancelled():
            b._recorder.cancelled += n
            withdraw_bulk(b, run, bulk)
        raise
    except BaseException:
        withdraw_bulk(b, run, bulk)  # an item failed: the rest of the call is not sent
        raise
    finally:
        if expiry is not None:
            run.deadlines.discard(expiry)


def _enqueue_bulk(
    queue: Queue,
    items: list[Any],
    keys_weights: list[tuple[Hashable, float]] | None,
    fut: asyncio.Future[list[Any]],
    now: float,
    priority: float,
    return_exceptions: bool,
    b: Base,
) -> Bulk:
    # Without keys or weights, one queue entry for the whole call, sliced into batches as they go out; else an
    # entry per item, in its key's lane.
    lane = queue.lane0 if keys_weights is None else None
    context = copy_context()
    bulk = Bulk(items, fut, now, return_exceptions=return_exceptions, lane=lane, recorder=b._recorder, context=context)
    if keys_weights is None:
        queue.push_bulk(bulk, priority)
        return bulk
    bulk.entries = []
    for index, (key, weight) in enumerate(keys_weights):
        entry = [items[index], bulk, now, True, weight, queue.lane(key), index, context]
        queue.push(entry, priority)
        bulk.entries.append(entry)
    return bulk


def key_and_weight(b: Base, run: Run, item: Any, n: int) -> tuple[Hashable, float]:
    """Call the ``batch_key`` / ``item_weight`` hooks once for an item, and check what they return."""
    key = b.batch_key(item) if run.keyed else DEFAULT_KEY
    if key is not DEFAULT_KEY:
        if getattr(type(key), "__await__", None) is not None:
            # An async def behind a wrapper that the check at class definition could not see through: its coroutine
            # is hashable, and every item would silently get a batch of its own.
            close = getattr(key, "close", None)
            if close is not None:
                close()
            raise TypeError(
                f"{b.name}: {type(b).__name__}.batch_key() returned {key!r}, an awaitable: it must be a plain def "
                "that returns the key, not an async def"
            )
        try:
            hash(key)
        except TypeError:
            raise TypeError(f"{b.name}: batch_key() returned an unhashable key: {key!r}") from None
    if not run.queue.weighted:
        return key, 1.0
    weight = b.item_weight(item)
    if not _checks.is_real(weight) or not _checks.is_finite(weight) or weight < 0:
        raise ValueError(f"{b.name}: item_weight() must return a finite number >= 0, got {weight!r}")
    if weight > b._weight_limit:
        b._recorder.rejected += n
        raise ValueError(
            f"{b.name}: an item of weight {weight!r} can never fit in max_batch_weight={b._max_batch_weight!r}"
        )
    return key, float(weight)


def refuse_if_reentrant(b: Base, run: Run, n: int) -> None:
    """Every slot is taken: ``n`` items submitted from inside one of this run's batches would wait for their own
    batch forever (so would a wait for room in the queue, which empties only as batches go). Refuse them.

    Checked before the items queue, or wait for room. Once they do, it is too late to look again, and there is no
    need: the last of the batches that took the slots finds them all taken, so they cannot all wait on themselves.
    """
    if run.in_flight < b._slot_limit or not _inside_own_batch(run):
        return
    b._recorder.exited += n
    b._recorder.failed += n
    raise _reentrant_error(b)


def refuse_queued_if_reentrant(b: Base, run: Run, entry: list[Any]) -> None:
    """:func:`refuse_if_reentrant` for :meth:`AsyncBatcher.process`'s short path, which queues its item before it
    looks (and only looks when every slot is taken): take the item back and fail it, its one outcome. Nobody waits
    for room on the short path, and the batcher runs: there is nothing else to undo."""
    if not _inside_own_batch(run):
        return
    run.queue.withdraw(entry)
    b._recorder.failed += 1
    entry[SINK].set_exception(_reentrant_error(b))


def _inside_own_batch(run: Run) -> bool:
    inside = _execution.current_batch.get()
    return inside is not None and inside.run is run and inside.is_live()


def _reentrant_error(b: Base) -> ReentrantCallError:
    return ReentrantCallError(
        f"{b.name}: an item submitted (process(), process_many() or stream()) from inside its own process_batch "
        f"while every slot (concurrency={b._concurrency}) is taken would wait for its own batch forever; raise "
        "concurrency, or do the work directly"
    )


# ---------------------------------------------------------------------- a stream's consumer


async def submit_stream(b: Base, item: Any, *, timeout: float | None, priority: float) -> AsyncIterator[Any]:
    """The body of :meth:`AsyncBatcher.stream`: queue the item, then hand out its parts as they come."""
    priority = _checks.priority(priority)
    timeout = b._default_timeout if timeout is None else _checks.timeout(timeout)
    loop = asyncio.get_running_loop()
    run = _lifecycle.admit(b, loop, 1)
    if not run.is_stream:  # one result per item: a stream of one part
        yield await submit(b, item, timeout=timeout, priority=priority)
        return
    deadline = None if timeout is None else loop.time() + timeout
    key, weight = key_and_weight(b, run, item, 1)
    refuse_if_reentrant(b, run, 1)
    if _room.no_room(b, run, 1):
        await wait_for_room(b, run, 1, deadline)
    queue = run.queue
    lane = queue.lane(key)
    sink = _streaming.StreamSink(loop, b._stream_buffer, b._recorder)
    entry = [item, sink, loop.time(), True, weight, lane, 0, copy_context()]
    queue.push(entry, priority)
    _dispatch.arrived(b, run, lane)
    expiry = None if deadline is None else run.deadlines.add(deadline, _expire_stream, b, run, entry)
    try:
        while (part := await sink.next()) is not _sinks.END:
            yield part
    except (asyncio.CancelledError, GeneratorExit):  # the consumer left: cancelled, or it stopped iterating
        if not sink.done():
            b._recorder.cancelled += 1
            sink.cancel()
        withdraw(b, run, entry)
        raise
    finally:
        if expiry is not None:
            run.deadlines.discard(expiry)


def _expire_stream(b: Base, run: Run, entry: list[Any]) -> None:
    sink = entry[1]
    if sink.done():
        return
    b._recorder.timed_out += 1
    withdraw(b, run, entry)
    sink.set_exception(TimeoutError(f"{b.name}: the stream did not end within the timeout"))


# ---------------------------------------------------------------------- room in a full queue


async def wait_for_room(b: Base, run: Run, n: int, deadline: float | None) -> None:
    """Wait, first come first served, until ``n`` items fit in the queue; or refuse at once.

    On return, room for the ``n`` items is the caller's: it queues them without awaiting anything.
    """
    rec = b._recorder
    if not b._wait_when_full:
        rec.rejected += n
        raise QueueFullException(
            f"{b.name}: the queue is full (max_queue_size={b._max_queue_size}); cannot process more items at the moment"
        )
    loop = run.loop
    waiter: asyncio.Future[None] = loop.create_future()
    run.putters.append((waiter, n))
    run.awaiting_room += n
    _dispatch.room_wanted(b, run)
    expiry = None if deadline is None else run.deadlines.add(deadline, _expire_waiter, b, waiter)
    try:
        await waiter
    except BaseException as exc:  # it gives up: cancelled, timed out, or refused by a stop
        # (The waiter is pending when the caller's coroutine was closed: GeneratorExit.)
        if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
            run.reserved -= n  # woken, then cancelled before it could queue: the room goes to the next in line
        run.awaiting_room -= n
        rec.exited += n
        if isinstance(exc, asyncio.CancelledError):
            rec.cancelled += n
        elif isinstance(exc, TimeoutError):
            rec.timed_out += n
        else:
            rec.failed += n
        _room.wake_putters(b, run)  # it may have been the head of the line, holding smaller requests back
        raise
    finally:
        if expiry is not None:
            run.deadlines.discard(expiry)
    run.reserved -= n
    run.awaiting_room -= n
    if run.state is not State.RUNNING:  # woken, then a stop began before it could queue
        rec.exited += n
        rec.failed += n
        raise BatcherStoppedError(f"{b.name} is {run.state.value}")


def _expire_waiter(b: Base, waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError(f"{b.name}: no room in the queue within the timeout"))


# ---------------------------------------------------------------------- leaving: cancellation, timeout, failure


def left(b: Base, run: Run, entry: list[Any], fut: asyncio.Future[Any]) -> None:
    """A caller of :meth:`AsyncBatcher.process` was cancelled (its future was, with it)."""
    if fut.cancelled():  # the caller's own cancellation, not an error of process_batch
        b._recorder.cancelled += 1
        withdraw(b, run, entry)


def expire(b: Base, run: Run, entry: list[Any]) -> None:
    """A ``timeout=`` of :meth:`AsyncBatcher.process` expired."""
    fut = entry[SINK]
    if fut.done():
        return
    b._recorder.timed_out += 1
    withdraw(b, run, entry)
    fut.set_exception(TimeoutError(f"{b.name}: no result within the timeout"))


def expire_bulk(b: Base, run: Run, bulk: Bulk) -> None:
    """A ``timeout=`` of :meth:`AsyncBatcher.process_many` expired: the whole call times out."""
    if bulk.future.done():
        return
    b._recorder.timed_out += len(bulk.items)
    bulk.future.set_exception(TimeoutError(f"{b.name}: no results within the timeout"))
    withdraw_bulk(b, run, bulk)


def withdraw(b: Base, run: Run, entry: list[Any]) -> None:
    """Take an item out of the queue if it is still there: it will never be sent."""
    if run.queue.withdraw(entry):
        _withdrawn(b, run)


def withdraw_bulk(b: Base, run: Run, bulk: Bulk) -> None:
    """Take what is still queued of a ``process_many`` call out of the queue."""
    if run.queue.withdraw_bulk(bulk):
        _withdrawn(b, run)


def unsubmit(b: Base, run: Run, entry: list[Any]) -> None:
    """Take back an item :meth:`AsyncBatcher.process` queued on a loop that turned out not to be the running one:
    as if it had never been submitted (it is submitted again, on the long path)."""
    if run.queue.withdraw(entry):
        b._recorder.exited -= 1


def _withdrawn(b: Base, run: Run) -> None:
    # Items left without a batch: room for those in line, and perhaps the end of a drain.
    if run.putters:
        _room.wake_putters(b, run)
    if not run.queue.waiting:
        _dispatch.cancel_timer(run)  # nothing waits: an idle batcher keeps no wake-up
    elif run.timer is not None:
        _dispatch.repump(b, run)  # a hold's wake-up count (Run.trigger) counts the items left: look again
    run.check_drained()
