"""How items get in: the long paths of submission (keys, weights, priorities, timeouts, a full queue, a batcher not
running yet), waiting for room, ``process_many`` and ``stream`` (private).

:meth:`AsyncBatcher.process` takes the short path (:meth:`Engine.put <async_batcher._core.engine.Engine.put>`)
when it can; everything else comes here. A blocking call is "wait, then the non-blocking call": the caller waits
for room (:meth:`~async_batcher._core.room.Room.wait`), then queues its items as if there had been room all along.

What is refused, and why, before anything is queued (:meth:`Admission.make_room`): an item heavier than
``max_queue_weight`` (it could never fit), an item predicted to miss its deadline (``refuse_late``,
:mod:`~async_batcher._core.refusal`), and, without ``wait_when_full``, an item for which there is no room. An admitted
item's weight is held until its call resolves (:meth:`Admission.hold`). With ``dedup_key`` overridden, a call whose
key matches a row waiting or in flight joins it (:mod:`~async_batcher._core.dedup`).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Hashable, Iterable
from contextvars import copy_context
from functools import partial
from typing import TYPE_CHECKING, Any

from async_batcher import _checks
from async_batcher._core.dedup import Rows, Shared
from async_batcher._core.engine import Engine
from async_batcher._core.lane import Entry, WeightedEntry
from async_batcher._core.queue import DEFAULT_KEY
from async_batcher._core.refusal import LateRefusal
from async_batcher._core.room import Room
from async_batcher._core.sinks import END, Bulk
from async_batcher._core.state import State
from async_batcher._core.streaming import StreamSink
from async_batcher.exceptions import (
    BatcherStoppedError,
    LateRefusalError,
    OversizedItemError,
    QueueFullException,
)

if TYPE_CHECKING:
    from async_batcher._core.lifecycle import Lifecycle
    from async_batcher._core.settings import Settings

__all__: list[str] = []


class Admission:
    """The long paths in, for one batcher (see the module's docstring)."""

    def __init__(self, life: Lifecycle, settings: Settings) -> None:
        self.life = life
        self.settings = settings
        self.hooks: Any = life.hooks  # (batch_key, item_weight, dedup_key: called only when overridden)
        self.recorder = life.recorder
        self.deduplicated = "dedup_key" in life.overridden
        self.rows: Rows | None = None  # the shared rows of the current run (dedup_key)
        self.late = LateRefusal(life, settings, self.recorder)  # refuse_late

    @property
    def name(self) -> str:
        return self.life.name

    def _admit(self, n: int, timeout: float | None, priority: float) -> tuple[Engine, float, float | None]:
        """The engine ``n`` items go to, their priority and deadline; or refuse them."""
        priority = _checks.priority(priority)
        timeout = self.settings.default_timeout if timeout is None else _checks.timeout(timeout)
        if timeout is None and self.settings.refuse_late:
            self.late.refuse_without_deadline()
        loop = asyncio.get_running_loop()
        engine = self.life.admit(loop, n).engine
        assert engine is not None
        return engine, priority, None if timeout is None else loop.time() + timeout

    async def submit(self, item: Any, *, timeout: float | None, priority: float) -> Any:
        """:meth:`AsyncBatcher.process` with a key, a weight, a priority, a timeout or a full queue; or not running."""
        engine, priority, deadline = self._admit(1, timeout, priority)
        if engine.runner.is_stream:
            raise TypeError(
                f"{self.name} streams its results (process_batch is an async generator): iterate stream(item)"
            )
        if self.deduplicated:
            return await self.submit_shared(engine, item, deadline, priority)
        entry = await self._entry(engine, item, deadline, engine.new_future())
        engine.put_entry(entry, priority)
        return await self._await_entry(engine, entry, deadline)

    async def _entry(
        self,
        engine: Engine,
        item: Any,
        deadline: float | None,
        sink: Any,
        key_weight: tuple[Hashable, float] | None = None,
    ) -> Entry:
        """A single item's entry, once it fits: its key and weight asked (unless given), a reentrant call refused,
        room made (or the item refused), its weight held until its call resolves."""
        key, weight = self.key_and_weight(engine, item, 1) if key_weight is None else key_weight
        self.refuse_if_reentrant(engine, 1)
        await self.make_room(engine, 1, weight, deadline)
        self.hold(engine.room, sink, weight)
        lane = engine.lane(key)
        if engine.queue.weighted or deadline is not None:  # (the deadline on the entry: a late item is never sent)
            return WeightedEntry(
                item, sink, engine.clock(), lane, copy_context(), weight=weight, deadline=_at(deadline)
            )
        return Entry(item, sink, engine.clock(), lane, copy_context())

    async def submit_many(
        self, items: Iterable[Any], *, timeout: float | None, priority: float, return_exceptions: bool
    ) -> list[Any]:
        """:meth:`AsyncBatcher.process_many`: admitted whole or not at all, one future for the whole call."""
        return_exceptions = _checks.flag("return_exceptions", return_exceptions)
        batch = list(items)
        n = len(batch)
        engine, priority, deadline = self._admit(n, timeout, priority)
        if engine.runner.is_stream:
            raise TypeError(
                f"{self.name} streams its results (process_batch is an async generator): iterate stream(item)"
            )
        if n == 0:
            return []
        keys_weights = (
            [self.key_and_weight(engine, x, n) for x in batch] if engine.keyed or engine.queue.weighted else None
        )
        if n > engine.room.limit:
            self.recorder.reject(n, "queue_full")
            raise QueueFullException(
                f"{self.name}: process_many of {_checks.plural(n, 'item')} can never fit in "
                f"max_queue_size={engine.room.size}"
            )
        weight = math.fsum(w for _, w in keys_weights) if keys_weights is not None else float(n)
        self.refuse_if_reentrant(engine, n)
        await self.make_room(engine, n, weight, deadline)
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
        expiry = None if deadline is None else engine.deadlines.add(deadline, self._expire_bulk, engine, bulk)
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.cancelled():
                self.recorder.cancelled += n
                engine.withdraw_bulk(bulk)
            raise
        except BaseException:
            engine.withdraw_bulk(bulk)  # an item failed: the rest of the call is not sent
            raise
        finally:
            if expiry is not None:
                engine.deadlines.discard(expiry)

    async def submit_stream(self, item: Any, *, timeout: float | None, priority: float) -> AsyncIterator[Any]:
        """The body of :meth:`AsyncBatcher.stream`: queue the item, then hand out its parts as they come."""
        engine, priority, deadline = self._admit(1, timeout, priority)
        if not engine.runner.is_stream:  # one result per item: a stream of one part
            yield await self.submit(item, timeout=timeout, priority=priority)
            return
        sink = StreamSink(engine.loop, self.settings.streaming.buffer, self.recorder)
        entry = await self._entry(engine, item, deadline, sink)
        engine.put_entry(entry, priority)
        expiry = (
            None
            if deadline is None
            else engine.deadlines.add(deadline, self._expire, engine, entry, "the stream did not end")
        )
        try:
            while (part := await sink.next()) is not END:
                yield part
        except (asyncio.CancelledError, GeneratorExit):  # the consumer left: cancelled, or it stopped iterating
            if not sink.done():
                self.recorder.cancelled += 1
                sink.cancel()
            engine.withdraw(entry)
            raise
        finally:
            if expiry is not None:
                engine.deadlines.discard(expiry)

    # ------------------------------------------------------------------ single flight (dedup_key)

    async def submit_shared(self, engine: Engine, item: Any, deadline: float | None, priority: float) -> Any:
        """:meth:`submit` with ``dedup_key``: join the row of an identical item waiting or in flight, else open one
        (admitted as any item is), and wait for its result on a future of this caller's own."""
        key, weight = self.key_and_weight(engine, item, 1)
        if weight > engine.room.weight_limit:  # refused as it would be alone, even if a twin is in flight
            self.recorder.reject(1, "oversized")
            raise engine.room.never_fits(1, weight)
        tag = self.dedup_tag(item)
        if tag is None:  # this item shares nothing: the plain long path
            entry = await self._entry(engine, item, deadline, engine.new_future(), (key, weight))
            engine.put_entry(entry, priority)
            return await self._await_entry(engine, entry, deadline)
        rows = self.rows_of(engine)
        shared_key = (key, tag)  # (a dedup key is shared within its batch_key only: never across tenants' lanes)
        if rows.cache is not None:
            hit, result = rows.cache.get(shared_key, engine.loop.time())
            if hit:
                answer = rows.copy(result)
                self.recorder.exited += 1
                self.recorder.succeeded += 1
                self.recorder.count("cache_hits")
                return answer
        row = rows.find(shared_key)
        if row is None:
            self.refuse_if_reentrant(engine, 1)
            await self.make_room(engine, 1, weight, deadline)
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
                return await self._await_row(engine, row, row.join(deadline), deadline)
        self.recorder.exited += 1  # (submitted: it never waits in the queue, its row does)
        self.recorder.count("deduplicated")
        fut = row.join(deadline)
        if row.entry is not None and row.entry.lane is None:  # its row is in a batch: this caller's item went too
            for joined in engine.joiners:
                joined(row.contexts[-1:])
        return await self._await_row(engine, row, fut, deadline)

    async def _await_row(self, engine: Engine, row: Shared, fut: asyncio.Future[Any], deadline: float | None) -> Any:
        """A caller's wait for its shared row's result: leaving (cancelled, timed out) leaves the row to the others."""
        expiry = None if deadline is None else engine.deadlines.add(deadline, self._expire_shared, row, fut)
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.cancelled():
                self.recorder.cancelled += 1
                row.leave()
            raise
        finally:
            if expiry is not None:
                engine.deadlines.discard(expiry)

    def _expire_shared(self, row: Shared, fut: asyncio.Future[Any]) -> None:
        if fut.done():
            return
        self.recorder.timed_out += 1
        fut.set_exception(TimeoutError(f"{self.name}: no result within the timeout"))
        row.leave()

    def rows_of(self, engine: Engine) -> Rows:
        """The shared rows of ``engine``'s run (a new run starts with none, and an empty cache)."""
        rows = self.rows
        if rows is None or rows.engine is not engine:
            rows = self.rows = Rows(engine, self.recorder, self.hooks.copy_result, self.settings.result_cache)
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

    def key_and_weight(self, engine: Engine, item: Any, n: int) -> tuple[Hashable, float]:
        """Call the ``batch_key`` / ``item_weight`` hooks once for an item, and check what they return."""
        hooks = self.hooks
        key = hooks.batch_key(item) if engine.keyed else DEFAULT_KEY
        if key is not DEFAULT_KEY:
            key = self._checked_key("batch_key", key)
        if not engine.queue.weighted:
            return key, 1.0
        weight = hooks.item_weight(item)
        if not _checks.is_real(weight) or not _checks.is_finite(weight) or weight < 0:
            raise ValueError(f"{self.name}: item_weight() must return a finite number >= 0, got {weight!r}")
        if weight > engine.weight_limit:
            self.recorder.reject(n, "oversized")
            if weight > engine.room.weight_limit:  # over max_queue_weight too: the limit of what gets in
                raise engine.room.never_fits(1, float(weight))
            raise OversizedItemError(
                f"{self.name}: an item of weight {weight!r} can never fit in "
                f"max_batch_weight={self.settings.limits.max_batch_weight!r}",
                weight=float(weight),
                limit=engine.weight_limit,
            )
        return key, float(weight)

    def refuse_if_reentrant(self, engine: Engine, n: int) -> None:
        """Every slot is taken: ``n`` items submitted from inside one of this engine's batches would wait for their
        own batch forever (so would a wait for room in the queue, which empties only as batches go). Refuse them.

        Checked before the items queue, or wait for room. Once they do, it is too late to look again, and there is
        no need: the last of the batches that took the slots finds them all taken, so they cannot all wait on
        themselves.
        """
        if engine.in_flight < engine.slot_limit or not engine.inside_own_batch():
            return
        self.recorder.exited += n
        self.recorder.failed += n
        raise engine.reentrant_error()

    async def make_room(self, engine: Engine, n: int, weight: float, deadline: float | None) -> None:
        """Admit ``n`` items of ``weight`` (a call's): refuse them if they can never fit, or are predicted to miss
        their deadline; wait for room (or refuse them, without ``wait_when_full``). On return they may be queued
        (and their weight :meth:`held <hold>`) without awaiting anything."""
        room = engine.room
        if weight > room.weight_limit:
            self.recorder.reject(n, "oversized")
            raise room.never_fits(n, weight)
        due = self.late.refuse_if_late(engine, n, deadline)
        if room.no_room(n, weight):
            await self.wait_for_room(engine, n, deadline, weight)
            if self.settings.refuse_late:  # time passed in line: still in time?
                try:
                    due = self.late.refuse_if_late(engine, n, deadline, waited=True)
                except LateRefusalError:
                    room.wake()  # the room it was given goes to the next in line
                    raise
        if due is not None:
            self.late.admitted(engine, n, due)

    def hold(self, room: Room, sink: asyncio.Future[Any], weight: float) -> None:
        """With ``max_queue_weight`` set: ``weight`` is held from now until ``sink`` (the call's future, or its
        stream) resolves, whatever the outcome."""
        if room.weight_limit < math.inf:
            room.take(weight)
            sink.add_done_callback(partial(_release, room, weight))

    async def wait_for_room(self, engine: Engine, n: int, deadline: float | None, weight: float = 0.0) -> None:
        """Wait, first come first served, until ``n`` items of ``weight`` fit in the queue; or refuse at once."""
        room = engine.room
        if not self.settings.wait_when_full:
            if room.queue.waiting + room.reserved + n > room.limit or room.putters:
                self.recorder.reject(n, "queue_full")
                raise QueueFullException(
                    f"{self.name}: the queue is full (max_queue_size={engine.room.size}); cannot process more items "
                    "at the moment"
                )
            self.recorder.reject(n, "queue_weight")
            raise QueueFullException(
                f"{self.name}: the queue's weight is full (max_queue_weight={room.weight_limit:g}, "
                f"{room.held:g} admitted and not yet answered); cannot admit {weight:g} more at the moment"
            )
        await room.wait(n, deadline, engine.deadlines, self.recorder, engine.room_wanted_now, weight)
        if engine.state is not State.RUNNING:  # woken, then a stop began before it could queue
            self.recorder.exited += n
            self.recorder.failed += n
            raise BatcherStoppedError(f"{self.name} is {engine.state.value}")

    # ------------------------------------------------------------------ timeouts

    def _expire(self, engine: Engine, entry: Entry, what: str = "no result") -> None:
        """A ``timeout=`` of :meth:`AsyncBatcher.process` (or of a stream) expired."""
        sink = entry.sink
        if sink.done():
            return
        self.recorder.timed_out += 1
        engine.withdraw(entry)
        sink.set_exception(TimeoutError(f"{self.name}: {what} within the timeout"))

    def _expire_bulk(self, engine: Engine, bulk: Bulk) -> None:
        """A ``timeout=`` of :meth:`AsyncBatcher.process_many` expired: the whole call times out."""
        if bulk.future.done():
            return
        self.recorder.timed_out += len(bulk.items)
        bulk.future.set_exception(TimeoutError(f"{self.name}: no results within the timeout"))
        engine.withdraw_bulk(bulk)

    async def _await_entry(self, engine: Engine, entry: Entry, deadline: float | None) -> Any:
        """A single item's wait for its result, once queued (:meth:`submit`'s)."""
        fut = entry.sink
        expiry = None if deadline is None else engine.deadlines.add(deadline, self._expire, engine, entry)
        try:
            return await fut
        except asyncio.CancelledError:
            engine.left(entry)
            raise
        finally:
            if expiry is not None:
                engine.deadlines.discard(expiry)


def _release(room: Room, weight: float, sink: asyncio.Future[Any]) -> None:
    room.release(weight)


def _at(deadline: float | None) -> float:
    return math.inf if deadline is None else deadline
