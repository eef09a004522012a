"""Single flight: identical items waiting or in flight share one row of one batch and one result (private).

When a batcher overrides ``dedup_key``, an item whose key (within its ``batch_key``'s lane) matches an item still
waiting or in flight does not take a row of its own: its caller joins that item's row (:class:`Shared`). The row's
sink is the batcher's own future, which no caller holds: each caller awaits a future of its own, so that

- a caller that leaves (cancelled, timed out) leaves alone; the row is withdrawn (if still queued), or its result
  dropped, only when every one of its callers has left;
- the row's result reaches every caller still waiting, each its own copy but the first (``copy_result``); its
  exception reaches every one of them, and is never kept: the row is forgotten the moment it resolves, so the next
  item of that key takes a row of its own;
- each caller's outcome is counted in the statistics once, as its own (the row itself counts as its first caller's
  item);
- the row's deadline is the latest of its callers' still waiting (none if one of them has none), as they come and
  go: what ``current_batch().deadline`` reads, and what a retry must not pass.

:class:`Rows` holds the rows of one run by key, and the optional :class:`Cache` of results.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

from async_batcher._core.sinks import SharedSink
from async_batcher.stats import FAILED, SUCCEEDED

if TYPE_CHECKING:
    from async_batcher._core.engine import Engine
    from async_batcher._core.lane import Entry
    from async_batcher._core.settings import ResultCache
    from async_batcher.stats import _Recorder

__all__: list[str] = []


class Shared(SharedSink):
    """The sink of a row its callers share: the batcher's future; each caller awaits one of its own (``callers``),
    answered from it once it resolves."""

    def __init__(self, rows: Rows, key: Hashable) -> None:
        super().__init__(loop=rows.engine.loop)
        self.rows = rows
        self.key = key
        self.callers: list[asyncio.Future[Any]] = []
        self.deadlines: list[float] = []  # each caller's, on the loop's clock (inf: none)
        # Each caller's context (a snapshot, as an entry keeps its caller's): the first is the row's entry's, the
        # others are the callers that joined it, which a batch's trace links too (async_batcher.opentelemetry).
        self.contexts: list[contextvars.Context] = []
        self.entry: Entry | None = None  # its row in the queue, once queued
        self.add_done_callback(rows.answer)

    def join(self, deadline: float | None) -> asyncio.Future[Any]:
        """A caller's own future for this row's result; ``deadline``: the caller's (``None``: none)."""
        fut: asyncio.Future[Any] = self.rows.engine.new_future()
        self.callers.append(fut)
        self.contexts.append(contextvars.copy_context())
        self.deadlines.append(math.inf if deadline is None else deadline)
        self._moved()
        return fut

    def deadline(self) -> float:
        return max((d for fut, d in zip(self.callers, self.deadlines, strict=True) if not fut.done()), default=math.inf)

    def leave(self) -> None:
        """A caller has left (its future is done): once every caller has, the row goes (withdrawn from the queue if
        it is still there, its result dropped if it is in flight)."""
        if self.done():
            return
        if not all(fut.done() for fut in self.callers):
            self._moved()
            return
        self.cancel()
        if self.entry is not None:
            self.rows.engine.withdraw(self.entry)

    def _moved(self) -> None:
        # Its deadline may have moved: a queued row's is what refuse_late holds the items behind it to.
        if self.entry is not None and self.entry.lane is not None:
            self.rows.engine.queue.deadline_moved(self.entry)


class Cache:
    """Results of resolved rows by key, for ``ttl`` seconds, at most ``max_bytes`` of them (least recently used out
    first). Never an exception."""

    __slots__ = ("bytes", "entries", "settings")

    def __init__(self, settings: ResultCache) -> None:
        self.settings = settings
        self.entries: OrderedDict[Hashable, tuple[float, int, Any]] = OrderedDict()  # key: (expiry, size, result)
        self.bytes = 0

    def get(self, key: Hashable, now: float) -> tuple[bool, Any]:
        found = self.entries.get(key)
        if found is None:
            return False, None
        expiry, size, result = found
        if expiry <= now:
            del self.entries[key]
            self.bytes -= size
            return False, None
        self.entries.move_to_end(key)
        return True, result

    def put(self, key: Hashable, result: Any, now: float) -> None:
        size = int(self.settings.sizeof(result))
        limit = self.settings.max_bytes
        old = self.entries.pop(key, None)
        if old is not None:
            self.bytes -= old[1]
        if not 0 <= size <= limit:
            return
        while self.entries and self.bytes + size > limit:
            _, (_, dropped, _) = self.entries.popitem(last=False)
            self.bytes -= dropped
        self.entries[key] = (now + self.settings.ttl, size, result)
        self.bytes += size


class Rows:
    """The shared rows of one run (one engine), by key: each waiting or in flight; and the cache, if any."""

    __slots__ = ("cache", "cache_settings", "copy", "engine", "recorder", "rows")

    def __init__(
        self, engine: Engine, recorder: _Recorder, copy: Callable[[Any], Any], cache: ResultCache | None
    ) -> None:
        self.engine = engine
        self.recorder = recorder
        self.copy = copy  # the batcher's copy_result
        self.rows: dict[Hashable, Shared] = {}
        self.cache: Cache | None = None
        self.cache_settings: ResultCache | None = None
        self.use_cache(cache)

    def use_cache(self, settings: ResultCache | None) -> None:
        """Cache results as ``settings`` say (``None``: not at all), starting empty."""
        self.cache_settings = settings
        self.cache = None if settings is None else Cache(settings)

    def find(self, key: Hashable) -> Shared | None:
        """The row of ``key`` still waiting or in flight, if any."""
        row = self.rows.get(key)
        return row if row is not None and not row.done() else None

    def open(self, key: Hashable) -> Shared:
        """A new row for ``key``: the next items of that key join it until it resolves."""
        row = self.rows[key] = Shared(self, key)
        return row

    def answer(self, row: Shared) -> None:
        """A row resolved: its callers still waiting get its outcome (a copy of its result each, but the first);
        each is counted as its own item, the row's own count (by the batch that answered it) taken back."""
        try:
            if self.rows.get(row.key) is row:
                del self.rows[row.key]  # never kept: the next item of this key takes a row of its own
        except Exception:  # a key whose hash or comparison fails now: the callers are answered all the same
            self.rows = {key: other for key, other in self.rows.items() if other is not row}
        if row.cancelled():
            return  # every caller had left, each counted as it left
        waiting = [fut for fut in row.callers if not fut.done()]
        rec = self.recorder
        error = row.exception()
        if error is not None:
            rec.resolved(len(waiting) - 1, FAILED)
            for fut in waiting:
                fut.set_exception(error)
            return
        result = row.result()
        failed = 0
        for i, fut in enumerate(waiting):
            if not i:
                fut.set_result(result)
                continue
            try:
                fut.set_result(self.copy(result))
            except Exception as exc:  # copy_result failed: this caller gets why
                failed += 1
                fut.set_exception(exc)
        rec.resolved(len(waiting) - 1 - failed, SUCCEEDED)
        if failed:
            rec.resolved(failed, FAILED)
        if self.cache is not None:
            try:
                self.cache.put(row.key, result, self.engine.loop.time())
            except Exception as exc:  # sizeof failed: not kept, and said once per result
                self.engine.loop.call_exception_handler(
                    {"message": f"{self.engine.name}: the result cache's sizeof() failed; not cached", "exception": exc}
                )
