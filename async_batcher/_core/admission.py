"""How items get in: the long paths of submission (keys, weights, priorities, timeouts, a full queue, a batcher not
running yet), waiting for room, ``process_many`` and ``stream`` (private).

:meth:`AsyncBatcher.process` takes the short path (:meth:`Engine.put <async_batcher._core.engine.Engine.put>`)
when it can; everything else comes here. A blocking call is "wait, then the non-blocking call": the caller waits
for room (:meth:`~async_batcher._core.room.Room.wait`), then queues its items as if there had been room all along.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Hashable, Iterable
from contextvars import copy_context
from typing import TYPE_CHECKING, Any

from async_batcher import _checks
from async_batcher._core.engine import Engine
from async_batcher._core.lane import Entry, WeightedEntry
from async_batcher._core.queue import DEFAULT_KEY
from async_batcher._core.sinks import END, Bulk
from async_batcher._core.state import State
from async_batcher._core.streaming import StreamSink
from async_batcher.exceptions import BatcherStoppedError, QueueFullException

if TYPE_CHECKING:
    from async_batcher._core.lifecycle import Lifecycle
    from async_batcher._core.settings import Settings

__all__: list[str] = []


class Admission:
    """The long paths in, for one batcher (see the module's docstring)."""

    def __init__(self, life: Lifecycle, settings: Settings) -> None:
        self.life = life
        self.settings = settings
        self.hooks: Any = life.hooks  # (batch_key, item_weight: called only when overridden)
        self.recorder = life.recorder

    @property
    def name(self) -> str:
        return self.life.name

    def _admit(self, n: int, timeout: float | None, priority: float) -> tuple[Engine, float, float | None]:
        """The engine ``n`` items go to, their priority and deadline; or refuse them."""
        priority = _checks.priority(priority)
        timeout = self.settings.default_timeout if timeout is None else _checks.timeout(timeout)
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
        entry = await self._entry(engine, item, deadline, engine.new_future())
        engine.put_entry(entry, priority)
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

    async def _entry(self, engine: Engine, item: Any, deadline: float | None, sink: Any) -> Entry:
        """A single item's entry, once it fits: its key and weight asked, a reentrant call refused, room waited for."""
        key, weight = self.key_and_weight(engine, item, 1)
        self.refuse_if_reentrant(engine, 1)
        if engine.room.no_room(1):
            await self.wait_for_room(engine, 1, deadline)
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
            self.recorder.rejected += n
            raise QueueFullException(
                f"{self.name}: process_many of {_checks.plural(n, 'item')} can never fit in "
                f"max_queue_size={engine.room.size}"
            )
        self.refuse_if_reentrant(engine, n)
        if engine.room.no_room(n):
            await self.wait_for_room(engine, n, deadline)
        fut: asyncio.Future[list[Any]] = engine.loop.create_future()
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

    # ------------------------------------------------------------------ checks

    def key_and_weight(self, engine: Engine, item: Any, n: int) -> tuple[Hashable, float]:
        """Call the ``batch_key`` / ``item_weight`` hooks once for an item, and check what they return."""
        hooks = self.hooks
        key = hooks.batch_key(item) if engine.keyed else DEFAULT_KEY
        if key is not DEFAULT_KEY:
            if getattr(type(key), "__await__", None) is not None:
                # An async def behind a wrapper that the check at class definition could not see through: its
                # coroutine is hashable, and every item would silently get a batch of its own.
                close = getattr(key, "close", None)
                if close is not None:
                    close()
                raise TypeError(
                    f"{self.name}: {type(hooks).__name__}.batch_key() returned {key!r}, an awaitable: it must be a "
                    "plain def that returns the key, not an async def"
                )
            try:
                hash(key)
            except TypeError:
                raise TypeError(f"{self.name}: batch_key() returned an unhashable key: {key!r}") from None
        if not engine.queue.weighted:
            return key, 1.0
        weight = hooks.item_weight(item)
        if not _checks.is_real(weight) or not _checks.is_finite(weight) or weight < 0:
            raise ValueError(f"{self.name}: item_weight() must return a finite number >= 0, got {weight!r}")
        if weight > engine.weight_limit:
            self.recorder.rejected += n
            raise ValueError(
                f"{self.name}: an item of weight {weight!r} can never fit in "
                f"max_batch_weight={self.settings.limits.max_batch_weight!r}"
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

    async def wait_for_room(self, engine: Engine, n: int, deadline: float | None) -> None:
        """Wait, first come first served, until ``n`` items fit in the queue; or refuse at once."""
        if not self.settings.wait_when_full:
            self.recorder.rejected += n
            raise QueueFullException(
                f"{self.name}: the queue is full (max_queue_size={engine.room.size}); cannot process more items at "
                "the moment"
            )
        await engine.room.wait(n, deadline, engine.deadlines, self.recorder, engine.room_wanted_now)
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


def _at(deadline: float | None) -> float:
    return math.inf if deadline is None else deadline
