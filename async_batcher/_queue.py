"""What waits in a batcher: queue entries, bulk calls, per-key lanes, and how results reach the callers.

Private to the package. Kept apart from :mod:`async_batcher.batcher` so that the data layout (chosen for the hot
path) can be read on its own.

A queued single item is a small list, not an object: creating it is the one allocation per item besides its
future, and the hot path reads it by index::

    [item, sink, arrival, queued, weight, lane, index]

``sink`` is the caller's future, or the :class:`Bulk` of a ``process_many`` call (``index``: the item's place in
it). ``queued`` turns False when the item leaves the queue: sent in a batch, or withdrawn because its caller left.

A batch keeps, beside its items, one *sink* per caller: a future, or ``(bulk, start, count)`` for a run of a
bulk call's items.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

__all__: list[str] = []

future_done = asyncio.Future.done
_set_result = asyncio.Future.set_result
# Runs an iterator to its end without keeping anything: a loop in C.
consume: Callable[[Iterable[Any]], None] = deque[Any](maxlen=0).extend

ITEM, SINK, ARRIVAL, QUEUED, WEIGHT, LANE, INDEX = range(7)


class Bulk:
    """One ``process_many`` call.

    Without keys or weights its items stay one queue entry, sliced into batches as they go out (``pos``: how many
    have left the queue). Otherwise each item is a queue entry of its own (``entries``) whose sink is this bulk.
    """

    __slots__ = ("arrival", "entries", "future", "items", "lane", "left", "pos", "results", "return_exceptions")

    def __init__(
        self,
        items: list[Any],
        future: asyncio.Future[list[Any]],
        arrival: float,
        return_exceptions: bool,
        lane: Lane | None,
    ) -> None:
        self.items = items
        self.future = future
        self.arrival = arrival
        self.return_exceptions = return_exceptions
        self.lane = lane
        self.pos = 0
        self.left = len(items)  # results still to come
        self.results: list[Any] = [None] * len(items)
        self.entries: list[list[Any]] | None = None

    def done(self) -> bool:
        return self.future.done()

    def deliver(self, start: int, results: Sequence[Any], offset: int, count: int) -> int:
        """Take ``results[offset:offset+count]`` for ``items[start:start+count]``; return how many failed."""
        if self.future.done():
            return 0
        chunk = results[offset : offset + count]
        self.results[start : start + count] = chunk
        failed = 0
        for r in chunk:
            if isinstance(r, Exception):
                failed += 1
                if not self.return_exceptions:
                    self.future.set_exception(r)
                    return failed
        self.left -= count
        if self.left == 0:
            self.future.set_result(self.results)
        return failed

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)


class Lane:
    """The items of one batch key waiting for a batch: a FIFO deque per priority level."""

    __slots__ = ("clean", "count", "key", "levels", "order", "served", "weight")

    def __init__(self, key: Hashable) -> None:
        self.key = key
        # True while every entry of its levels is a single item still queued (no bulk call, nothing withdrawn
        # in place): batches can then be formed without looking at each entry.
        self.clean = True
        self.served = -1  # when its last batch went out (a dispatch count); -1: never
        self.levels: dict[float, deque[Any]] = {}
        self.order: list[deque[Any]] = []  # the levels, best (lowest) priority first
        self.count = 0  # items waiting
        self.weight = 0.0  # their total weight

    def level(self, priority: float) -> deque[Any]:
        fifo = self.levels.get(priority)
        if fifo is None:
            fifo = self.levels[priority] = deque()
            self.order = [self.levels[p] for p in sorted(self.levels)]
        return fifo

    def entries(self) -> list[Any]:
        return [entry for fifo in self.order for entry in fifo]

    def clear(self) -> None:
        for fifo in self.order:
            fifo.clear()
        self.count = 0
        self.weight = 0.0
        self.clean = True


def without_departed(items: list[Any], sinks: list[Any], futures_only: bool) -> tuple[list[Any], list[Any]]:
    """The batch without the items whose callers already left (the same lists when none did)."""
    if futures_only:
        if not any(map(future_done, sinks)):  # one pass in C: the common case costs next to nothing
            return items, sinks
    else:
        for sink in sinks:
            if sink[0].future.done() if sink.__class__ is tuple else sink.done():
                break
        else:
            return items, sinks
    kept_items: list[Any] = []
    kept_sinks: list[Any] = []
    i = 0
    for sink in sinks:
        if sink.__class__ is tuple:
            count = sink[2]
            if not sink[0].future.done():
                kept_items.extend(items[i : i + count])
                kept_sinks.append(sink)
            i += count
        else:
            if not sink.done():
                kept_items.append(items[i])
                kept_sinks.append(sink)
            i += 1
    return kept_items, kept_sinks


def fail_sinks(sinks: list[Any], exc: BaseException) -> int:
    """Give ``exc`` to every caller of a batch still waiting; return how many items that failed."""
    failed = 0
    for sink in sinks:
        if sink.__class__ is tuple:
            bulk = sink[0]
            if not bulk.future.done():
                failed += sink[2]
                bulk.fail(exc)
        elif not sink.done():
            sink.set_exception(exc)
            failed += 1
    return failed


def deliver(sinks: list[Any], results: Sequence[Any], futures_only: bool) -> int:
    """Hand each caller its result (an ``Exception`` element is raised to its caller); return how many failed."""
    failed = 0
    if futures_only and not any(issubclass(kind, Exception) for kind in set(map(type, results))):
        # No exception among the results (one look at their types, not one isinstance per item).
        if len(sinks) != len(results):
            raise ValueError(f"{len(results)} results for {len(sinks)} callers")
        if any(map(future_done, sinks)):
            for sink, result in zip(sinks, results, strict=True):
                if not sink.done():  # (else its caller left: the result is dropped)
                    sink.set_result(result)
        else:
            # Every caller still waits (the common case): set them all in one pass in C. Nothing can finish a
            # future meanwhile: set_result schedules its callbacks, it does not run them.
            consume(map(_set_result, sinks, results))
        return 0
    if futures_only:
        return sum(map(_settle, sinks, results))
    i = 0
    for sink in sinks:
        if sink.__class__ is tuple:
            bulk, start, count = sink
            failed += bulk.deliver(start, results, i, count)
            i += count
            continue
        failed += _settle(sink, results[i])
        i += 1
    return failed


def _settle(sink: asyncio.Future[Any], result: Any) -> int:
    """Give one caller its result, or raise to it the ``Exception`` the result is; 1 if that failed it."""
    if sink.done():
        return 0  # its caller left: the result is dropped
    if isinstance(result, Exception):
        sink.set_exception(result)
        return 1
    sink.set_result(result)
    return 0
