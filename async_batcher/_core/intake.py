"""The long paths in for one run (private; the admission layer's, above the engine): keys, weights, priorities,
timeouts, a full queue, ``process_many``, ``stream`` and single flight, once :class:`~async_batcher._core.admission.
Admission` has found the run the items go to.

A blocking call is "wait, then the non-blocking call": the caller waits for room
(:meth:`~async_batcher._core.room.Room.wait`), then queues its items as if there had been room all along. What is
refused, and why, before anything is queued (:meth:`Intake.make_room`): an item heavier than ``max_queue_weight``
(it could never fit), an item predicted to miss its deadline (``refuse_late``, :mod:`~async_batcher._core.refusal`),
and, without ``wait_when_full``, an item for which there is no room. An admitted item's weight is held until its call
resolves (:meth:`Intake.hold`). With ``dedup_key`` overridden, a call whose key matches a row waiting or in flight
joins it (:mod:`~async_batcher._core.dedup`).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncGenerator, Hashable
from contextvars import copy_context
from functools import partial
from typing import TYPE_CHECKING, Any

from async_batcher import _checks
from async_batcher._core.dedup import Rows, Shared
from async_batcher._core.lane import Entry, WeightedEntry
from async_batcher._core.queue import DEFAULT_KEY
from async_batcher._core.room import Room
from async_batcher._core.sinks import END, Bulk
from async_batcher._core.state import State
from async_batcher._core.streaming import StreamSink
from async_batcher.exceptions import BatcherStoppedError, LateRefusalError, OversizedItemError, QueueFullException
from async_batcher.stats import CANCELLED, FAILED, SUCCEEDED, TIMED_OUT

if TYPE_CHECKING:
    from async_batcher._core.engine import Engine
    from async_batcher._core.refusal import LateRefusal
    from async_batcher._core.settings import Settings
    from async_batcher.stats import _Recorder

__all__: list[str] = []


class Intake:
    """The long paths in of one run (its engine), under the batcher's settings, hooks, statistics and late refusal
    (see the module's docstring)."""

    def __init__(
        self,
        engine: Engine,
        *,
        name: str,
        settings: Settings,
        hooks: Any,
        recorder: _Recorder,
        late: LateRefusal,
        deduplicated: bool,
    ) -> None:
        self.engine = engine
        self.name = name
        self.settings = settings
        self.hooks = hooks  # (batch_key, item_weight, dedup_key: called only when overridden)
        self.recorder = recorder
        self.late = late  # refuse_late
        self.deduplicated = deduplicated  # dedup_key is overridden
        self.rows: Rows | None = None  # the shared rows of this run (dedup_key)

    @property
    def streams(self) -> bool:
        """Its ``process_batch`` streams its results (an async generator)."""
        return self.engine.runner.is_stream

    async def submit(self, item: Any, deadline: float | None, priority: float) -> Any:
        """A single item that takes the long path: a key, a weight, a priority, a timeout, a full queue, dedup."""
        engine = self.engine
        if self.deduplicated:
            return await self.submit_shared(item, deadline, priority)
        entry = await self._entry(item, deadline, engine.new_future())
        engine.put_entry(entry, priority)
        return await self._await_entry(entry, deadline)

    async def _entry(
        self,
        item: Any,
        deadline: float | None,
        sink: Any,
        key_weight: tuple[Hashable, float] | None = None,
    ) -> Entry:
        """A single item's entry, once it fits: its key and weight asked (unless given), a reentrant call refused,
        room made (or the item refused), its weight held until its call resolves."""
        engine = self.engine
        key, weight = self.key_and_weight(item, 1) if key_weight is None else key_weight
        self.refuse_if_reentrant(1)
        await self.make_room(1, weight, deadline)
        self.hold(engine.room, sink, weight)
        lane = engine.lane(key)
        if engine.queue.weighted or deadline is not None:  # (the deadline on the entry: a late item is never sent)
            return WeightedEntry(
                item, sink, engine.clock(), lane, copy_context(), weight=weight, deadline=_at(deadline)
            )
        return Entry(item, sink, engine.clock(), lane, copy_context())

    # ------------------------------------------------------------------ single flight (dedup_key)

    async def submit_shared(self, item: Any, deadline: float | None, priority: float) -> Any:
        """:meth:`submit` with ``dedup_key``: join the row of an identical item waiting or in flight, else open one
        (admitted as any item is), and wait for its result on a future of this caller's own."""
        engine = self.engine
        key, weight = self.key_and_weight(item, 1)
        if weight > engine.room.weight_limit:  # refused as it would be alone, even if a twin is in flight
            self.recorder.rejected(1, "oversized")
            raise engine.room.never_fits(1, weight)
        tag = self.dedup_tag(item)
        if tag is None:  # this item shares nothing: the plain long path
            entry = await self._entry(item, deadline, engine.new_future(), (key, weight))
            engine.put_entry(entry, priority)
            return await self._await_entry(entry, deadline)
        rows = self.rows_of()
        shared_key = (key, tag)  # (a dedup key is shared within its batch_key only: never across tenants' lanes)
        if rows.cache is not None:
            hit, result = rows.cache.get(shared_key, engine.loop.time())
            if hit:
                answer = rows.copy(result)
                self.recorder.admitted(1)
                self.recorder.resolved(1, SUCCEEDED)
                self.recorder.count("cache_hits")
                return answer
        row = rows.find(shared_key)
        if row is None:
            self.refuse_if_reentrant(1)
            await self.make_room(1, weight, deadline)
            row = rows.find(shared_key)  # (one may have opened while this call waited for room)
            if row is not None:
                engine.room.wake()  # the room it was given goes to the next in line
            else:
                row = rows.open(shared_key)
                self.hold(engine.room, row, weight)
                lane = engine.lane(key)
                context = copy_context()
                if engine.queue.weighted:
                    row.entry = WeightedEntry(item, row, engine.clock(), lane, context, weight=weight)
                else:
                    row.entry = Entry(item, row, engine.clock(), lane, context)
                engine.put_entry(row.entry, priority)
                return await self._await_row(row, row.join(deadline), deadline)
        self.recorder.admitted(1)  # (submitted: it never waits in the queue, its row does)
        self.recorder.count("deduplicated")
        fut = row.join(deadline)
        if row.entry is not None and row.entry.lane is None:  # its row is in a batch: this caller's item went too
            for joined in engine.dispatcher.joiners:
                joined(row.contexts[-1:])
        return await self._await_row(row, fut, deadline)

    async def _await_row(self, row: Shared, fut: asyncio.Future[Any], deadline: float | None) -> Any:
        """A caller's wait for its shared row's result: leaving (cancelled, timed out) leaves the row to the others."""
        engine = self.engine
        expiry = None if deadline is None else engine.deadlines.add(deadline, self._expire_shared, row, fut)
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.cancelled():
                self.recorder.resolved(1, CANCELLED)
                row.leave()
            raise
        finally:
            if expiry is not None:
                engine.deadlines.discard(expiry)

    def _expire_shared(self, row: Shared, fut: asyncio.Future[Any]) -> None:
        if fut.done():
            return
        self.recorder.resolved(1, TIMED_OUT)
        fut.set_exception(TimeoutError(f"{self.name}: no result within the timeout"))
        row.leave()

    def rows_of(self) -> Rows:
        """The shared rows of this run (a new run starts with none, and an empty cache)."""
        rows = self.rows
        if rows is None:
            rows = self.rows = Rows(self.engine, self.recorder, self.hooks.copy_result, self.settings.result_cache)
        elif rows.cache_settings is not self.settings.result_cache:
            rows.use_cache(self.settings.result_cache)  # (set anew on a live batcher: empty)
        return rows

    def dedup_tag(self, item: Any) -> Hashable | None:
        """Call the ``dedup_key`` hook for an item and check what it returns (``None``: not shared)."""
        tag: Hashable | None = self.hooks.dedup_key(item)
        if tag is None:
            return None
        return self._checked_key("dedup_key", tag, " (a tuple of the item's fields, a string or bytes, say)")

    def _checked_key(self, hook: str, key: Hashable, hint: str = "") -> Hashable:
        """What ``hook`` (``batch_key``, ``dedup_key``) returned, refused if it is an awaitable (an async def behind a
        wrapper that the check at class definition could not see through: its coroutine is hashable, and every item
        would silently get a key of its own) or unhashable."""
        if getattr(type(key), "__await__", None) is not None:
            close = getattr(key, "close", None)
            if close is not None:
                close()
            raise TypeError(
                f"{self.name}: {type(self.hooks).__name__}.{hook}() returned {key!r}, an awaitable: it must be a "
                "plain def that returns the key, not an async def"
            )
        try:
            hash(key)
        except TypeError:
            raise TypeError(f"{self.name}: {hook}() returned an unhashable key: {key!r}{hint}") from None
        return key

    # ------------------------------------------------------------------ checks

    def key_and_weight(self, item: Any, n: int) -> tuple[Hashable, float]:
        """Call the ``batch_key`` / ``item_weight`` hooks once for an item, and check what they return."""
        engine = self.engine
        hooks = self.hooks
        key = hooks.batch_key(item) if engine.keyed else DEFAULT_KEY
        if key is not DEFAULT_KEY:
            key = self._checked_key("batch_key", key)
        if not engine.queue.weighted:
            return key, 1.0
        weight = hooks.item_weight(item)
        if not _checks.is_real(weight) or not _checks.is_finite(weight) or weight < 0:
            raise ValueError(f"{self.name}: item_weight() must return a finite number >= 0, got {weight!r}")
        if weight > engine.dispatcher.weight_limit:
            self.recorder.rejected(n, "oversized")
            if weight > engine.room.weight_limit:  # over max_queue_weight too: the limit of what gets in
                raise engine.room.never_fits(1, float(weight))
            raise OversizedItemError(
                f"{self.name}: an item of weight {weight!r} can never fit in "
                f"max_batch_weight={self.settings.limits.max_batch_weight!r}",
                weight=float(weight),
                limit=engine.dispatcher.weight_limit,
            )
        return key, float(weight)

    def refuse_if_reentrant(self, n: int) -> None:
        """Every slot is taken: ``n`` items submitted from inside one of this engine's batches would wait for their
        own batch forever (so would a wait for room in the queue, which empties only as batches go). Refuse them.

        Checked before the items queue, or wait for room. Once they do, it is too late to look again, and there is
        no need: the last of the batches that took the slots finds them all taken, so they cannot all wait on
        themselves.
        """
        engine = self.engine
        if not engine.waits_for_itself():
            return
        self.recorder.left(n)
        self.recorder.resolved(n, FAILED)
        raise engine.reentrant_error()

    async def make_room(self, n: int, weight: float, deadline: float | None) -> None:
        """Admit ``n`` items of ``weight`` (a call's): refuse them if they can never fit, or are predicted to miss
        their deadline; wait for room (or refuse them, without ``wait_when_full``). On return they may be queued
        (and their weight :meth:`held <hold>`) without awaiting anything."""
        engine = self.engine
        room = engine.room
        if weight > room.weight_limit:
            self.recorder.rejected(n, "oversized")
            raise room.never_fits(n, weight)
        due = self.late.refuse_if_late(engine.dispatcher, n, deadline)
        if room.no_room(n, weight):
            await self.wait_for_room(n, deadline, weight)
            if self.settings.refuse_late:  # time passed in line: still in time?
                try:
                    due = self.late.refuse_if_late(engine.dispatcher, n, deadline, waited=True)
                except LateRefusalError:
                    room.wake()  # the room it was given goes to the next in line
                    raise
        if due is not None:
            self.late.admitted(engine.dispatcher, n, due)

    def hold(self, room: Room, sink: asyncio.Future[Any], weight: float) -> None:
        """With ``max_queue_weight`` set: ``weight`` is held from now until ``sink`` (the call's future, or its
        stream) resolves, whatever the outcome."""
        if room.weight_limit < math.inf:
            room.take(weight)
            sink.add_done_callback(partial(_release, room, weight))

    async def wait_for_room(self, n: int, deadline: float | None, weight: float = 0.0) -> None:
        """Wait, first come first served, until ``n`` items of ``weight`` fit in the queue; or refuse at once."""
        engine = self.engine
        room = engine.room
        if not self.settings.wait_when_full:
            if room.queue.waiting + room.reserved + n > room.limit or room.putters:
                self.recorder.rejected(n, "queue_full")
                raise QueueFullException(
                    f"{self.name}: the queue is full (max_queue_size={engine.room.size}); cannot process more items "
                    "at the moment"
                )
            self.recorder.rejected(n, "queue_weight")
            raise QueueFullException(
                f"{self.name}: the queue's weight is full (max_queue_weight={room.weight_limit:g}, "
                f"{room.held:g} admitted and not yet answered); cannot admit {weight:g} more at the moment"
            )
        await room.wait(n, deadline, engine.deadlines, self.recorder, engine.dispatcher.room_wanted_now, weight)
        if engine.state is not State.RUNNING:  # woken, then a stop began before it could queue
            self.recorder.left(n)
            self.recorder.resolved(n, FAILED)
            raise BatcherStoppedError(f"{self.name} is {engine.state.value}")

    # ------------------------------------------------------------------ timeouts

    def _expire(self, entry: Entry, what: str = "no result") -> None:
        """A ``timeout=`` of :meth:`AsyncBatcher.process` (or of a stream) expired."""
        sink = entry.sink
        if sink.done():
            return
        self.recorder.resolved(1, TIMED_OUT)
        self.engine.withdraw(entry)
        sink.set_exception(TimeoutError(f"{self.name}: {what} within the timeout"))

    def _expire_bulk(self, bulk: Bulk) -> None:
        """A ``timeout=`` of :meth:`AsyncBatcher.process_many` expired: the whole call times out."""
        if bulk.future.done():
            return
        self.recorder.resolved(len(bulk.items), TIMED_OUT)
        bulk.future.set_exception(TimeoutError(f"{self.name}: no results within the timeout"))
        self.engine.withdraw_bulk(bulk)

    async def _await_entry(self, entry: Entry, deadline: float | None) -> Any:
        """A single item's wait for its result, once queued (:meth:`submit`'s)."""
        engine = self.engine
        fut = entry.sink
        expiry = None if deadline is None else engine.deadlines.add(deadline, self._expire, entry)
        try:
            return await fut
        except asyncio.CancelledError:
            engine.left(entry)
            raise
        finally:
            if expiry is not None:
                engine.deadlines.discard(expiry)

    async def submit_many(
        self, batch: list[Any], deadline: float | None, priority: float, *, return_exceptions: bool
    ) -> list[Any]:
        """A ``process_many`` call of ``batch`` (not empty): admitted whole or not at all, one future for the whole
        call."""
        engine = self.engine
        n = len(batch)
        keys_weights = [self.key_and_weight(x, n) for x in batch] if engine.keyed or engine.queue.weighted else None
        if n > engine.room.limit:
            self.recorder.rejected(n, "queue_full")
            raise QueueFullException(
                f"{self.name}: process_many of {_checks.plural(n, 'item')} can never fit in "
                f"max_queue_size={engine.room.size}"
            )
        weight = math.fsum(w for _, w in keys_weights) if keys_weights is not None else float(n)
        self.refuse_if_reentrant(n)
        await self.make_room(n, weight, deadline)
        fut: asyncio.Future[list[Any]] = engine.loop.create_future()
        self.hold(engine.room, fut, weight)
        now = engine.clock()
        context = copy_context()
        # Without keys or weights, one queue entry for the whole call, sliced into batches as they go out; else an
        # entry per item, in its key's lane.
        lane = engine.queue.lane0 if keys_weights is None else None
        bulk = Bulk(
            batch, fut, now, return_exceptions=return_exceptions, lane=lane, recorder=self.recorder, context=context
        )
        bulk.deadline = _at(deadline)
        if keys_weights is not None:
            bulk.entries = [
                WeightedEntry(x, bulk, now, engine.lane(key), context, weight=weight, index=i, deadline=bulk.deadline)
                for i, (x, (key, weight)) in enumerate(zip(batch, keys_weights, strict=True))
            ]
        engine.put_bulk(bulk, priority)
        expiry = None if deadline is None else engine.deadlines.add(deadline, self._expire_bulk, bulk)
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.cancelled():
                self.recorder.resolved(n, CANCELLED)
                engine.withdraw_bulk(bulk)
            raise
        except BaseException:
            engine.withdraw_bulk(bulk)  # an item failed: the rest of the call is not sent
            raise
        finally:
            if expiry is not None:
                engine.deadlines.discard(expiry)

    async def stream(self, item: Any, deadline: float | None, priority: float) -> AsyncGenerator[Any, None]:
        """A streaming ``process_batch``'s item: queue it, then hand out its parts as they come."""
        engine = self.engine
        sink = StreamSink(engine.loop, self.settings.streaming.buffer, self.recorder)
        entry = await self._entry(item, deadline, sink)
        engine.put_entry(entry, priority)
        expiry = (
            None if deadline is None else engine.deadlines.add(deadline, self._expire, entry, "the stream did not end")
        )
        try:
            while (part := await sink.next()) is not END:
                yield part
        except (asyncio.CancelledError, GeneratorExit):  # the consumer left: cancelled, or it stopped iterating
            if not sink.done():
                self.recorder.resolved(1, CANCELLED)
                sink.cancel()
            engine.withdraw(entry)
            raise
        finally:
            if expiry is not None:
                engine.deadlines.discard(expiry)


def _release(room: Room, weight: float, sink: asyncio.Future[Any]) -> None:
    room.release(weight)


def _at(deadline: float | None) -> float:
    return math.inf if deadline is None else deadline
