"""How results reach the callers: bulk calls, delivery, failure, and the check of what ``process_batch`` returned.

Private to the package. A batch keeps one *sink* per caller: the caller's future, or ``(bulk, start, count)`` for a
run of a ``process_many`` call's items. Every function here counts the outcomes it settles in the statistics, once
per item (a bulk call's items when the call resolves).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from itertools import islice
from typing import TYPE_CHECKING, Any, Final

from async_batcher._core.failures import Retry
from async_batcher.exceptions import BatchSizeMismatchError
from async_batcher.stats import FAILED, SUCCEEDED

if TYPE_CHECKING:
    from async_batcher._core.lane import Lane, WeightedEntry
    from async_batcher.stats import _Recorder
from async_batcher._checks import plural

__all__: list[str] = []

future_done = asyncio.Future.done
_set_result = asyncio.Future.set_result
# Runs an iterator to its end without keeping anything: a loop in C.
consume: Callable[[Iterable[Any]], None] = deque[Any](maxlen=0).extend
# A bulk call's result slot that has no result yet.
PENDING: Any = object()


class _End:
    """The marker a streaming ``process_batch`` yields for an item whose stream is complete."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "async_batcher.END"


#: Yielded by a streaming ``process_batch`` in an item's place: that item's stream is complete.
END: Final[Any] = _End()


class SharedSink(asyncio.Future[Any]):
    """The sink of a row that several callers share (single flight, ``dedup_key``: :mod:`~async_batcher._core.dedup`):
    its deadline is theirs as they come and go, not the one recorded when it was queued."""

    def deadline(self) -> float:
        """The latest deadline of its callers still waiting, on the loop's clock (``inf``: one of them has none)."""
        raise NotImplementedError


def deadline_of(sink: Any, recorded: float) -> float:
    """An item's deadline (``inf``: none): the one ``recorded`` as it was queued (its caller's), or, for a shared
    row, its callers' now."""
    return sink.deadline() if isinstance(sink, SharedSink) else recorded


class Bulk:
    """One ``process_many`` call: its items, its future, and the results gathered for it so far.

    Without keys or weights its items stay one queue entry, sliced into batches as they go out (``pos``: how many
    have left the queue). Otherwise each item is a queue entry of its own (``entries``) whose sink is this bulk.
    Each item's outcome is counted in the statistics once, when the call resolves.
    """

    __slots__ = (
        "arrival",
        "context",
        "deadline",
        "entries",
        "future",
        "items",
        "lane",
        "left",
        "pos",
        "recorder",
        "results",
        "return_exceptions",
    )

    def __init__(
        self,
        items: list[Any],
        future: asyncio.Future[list[Any]],
        arrival: float,
        *,
        return_exceptions: bool,
        lane: Lane | None,
        recorder: _Recorder,
        context: contextvars.Context,
    ) -> None:
        self.items = items
        self.future = future
        self.arrival = arrival
        self.context = context  # its caller's (a snapshot), as a single item's entry keeps it
        self.return_exceptions = return_exceptions
        self.lane = lane  # the lane of its single entry; None when each item is an entry of its own
        self.recorder = recorder
        self.pos = 0  # items that have left the queue (plain bulk only)
        self.left = len(items)  # results still to come
        self.results: list[Any] = [PENDING] * len(items)
        self.entries: list[WeightedEntry] | None = None
        self.deadline = math.inf  # when its caller's timeout expires (on the loop's clock)

    def done(self) -> bool:
        return self.future.done()

    def deliver(self, start: int, results: Any, offset: int, count: int) -> None:
        """Take ``results[offset:offset+count]`` for ``items[start:start+count]``."""
        if self.future.done():
            return
        chunk = results[offset : offset + count]
        if any(r.__class__ is Retry for r in chunk):  # (not tried again: the batcher has no retry policy)
            chunk = [r.outcome() if r.__class__ is Retry else r for r in chunk]
        if not self.return_exceptions:
            for r in chunk:
                if isinstance(r, Exception):
                    self.fail(r)
                    return
        self.results[start : start + count] = chunk
        self.left -= count
        if self.left == 0:
            self._succeed()

    def fail_chunk(self, start: int, count: int, exc: BaseException) -> None:
        """``items[start:start+count]`` failed with ``exc``: in their places, or the whole call. (Those among them
        that have their result already keep it.)"""
        if self.future.done():
            return
        if not self.return_exceptions:
            self.fail(exc)
            return
        results = self.results
        pending = [i for i in range(start, start + count) if results[i] is PENDING]
        for i in pending:
            results[i] = exc
        self.left -= len(pending)
        if self.left == 0:
            self._succeed()

    def fail(self, exc: BaseException) -> None:
        """The whole call fails with ``exc`` (without ``return_exceptions``: with it, a failure takes its items'
        places, :meth:`fail_chunk`)."""
        if self.future.done():
            return
        self.recorder.resolved(len(self.items), FAILED)
        self.future.set_exception(exc)

    def _succeed(self) -> None:
        failed = sum(1 for r in self.results if isinstance(r, BaseException))
        self.recorder.resolved(failed, FAILED)
        self.recorder.resolved(len(self.items) - failed, SUCCEEDED)
        self.future.set_result(self.results)


def as_results(results: object, n: int) -> Sequence[Any]:
    """What ``process_batch`` returned for a batch of ``n``, as a sequence of ``n`` results; else raise.

    ``None`` means ``None`` for every item. Any ordered iterable is taken (a list, a tuple, a numpy array, a
    generator), reading at most ``n + 1`` of its elements; a mapping, a set or a string is refused, as is anything
    that is not iterable.
    """
    if results is None:
        return [None] * n
    if results.__class__ is list or results.__class__ is tuple:
        seq: Sequence[Any] = results
    elif isinstance(results, str | bytes | bytearray | Mapping | Set) or not isinstance(results, Iterable):
        raise TypeError(_wrong_type(results, n))
    elif hasattr(results, "__len__"):
        count = len(results)  # type: ignore[arg-type]
        if count != n:
            raise BatchSizeMismatchError(n, count)
        seq = list(results)
    else:
        seq = list(islice(results, n + 1))  # an endless iterator must not freeze the loop
        if len(seq) > n:
            raise BatchSizeMismatchError(n, n + 1, at_least=True)
    if len(seq) != n:
        raise BatchSizeMismatchError(n, len(seq))
    return seq


def _wrong_type(results: object, n: int) -> str:
    kind = type(results).__name__
    hint = " (an async process_batch must await what it returns)" if inspect.isawaitable(results) else ""
    return (
        f"process_batch returned {kind}{hint}; expected a sequence of {plural(n, 'result')} in the order of the batch "
        "(a list, a tuple, a numpy array, a generator), or None"
    )


def without_departed(
    items: list[Any], sinks: list[Any], contexts: list[Any], *, futures_only: bool
) -> tuple[list[Any], list[Any], list[Any]]:
    """The batch without the items whose callers already left (the same lists when none did): its items, its sinks,
    and its callers' contexts (one per sink)."""
    if futures_only:
        if not any(map(future_done, sinks)):  # one pass in C: the common case costs next to nothing
            return items, sinks, contexts
    elif not any(sink[0].future.done() if sink.__class__ is tuple else sink.done() for sink in sinks):
        return items, sinks, contexts
    kept_items: list[Any] = []
    kept_sinks: list[Any] = []
    kept_contexts: list[Any] = []
    i = 0
    for sink, context in zip(sinks, contexts, strict=True):
        if sink.__class__ is tuple:
            count = sink[2]
            if not sink[0].future.done():
                kept_items.extend(items[i : i + count])
                kept_sinks.append(sink)
                kept_contexts.append(context)
            i += count
        else:
            if not sink.done():
                kept_items.append(items[i])
                kept_sinks.append(sink)
                kept_contexts.append(context)
            i += 1
    return kept_items, kept_sinks, kept_contexts


def fail_sinks(sinks: list[Any], exc: BaseException, recorder: _Recorder) -> int:
    """Give ``exc`` to every caller of a batch still waiting; return how many calls that resolved."""
    failed = resolved = 0
    for sink in sinks:
        if sink.__class__ is tuple:
            bulk = sink[0]
            if not bulk.future.done():
                bulk.fail_chunk(sink[1], sink[2], exc)
                resolved += bulk.future.done()
        elif not sink.done():
            sink.set_exception(exc)
            failed += 1
    recorder.resolved(failed, FAILED)
    return failed + resolved


def deliver(sinks: list[Any], results: Sequence[Any], recorder: _Recorder, *, futures_only: bool) -> int:
    """Hand each caller its result; an ``Exception`` element is raised to its caller. A caller who left is skipped.
    Return how many calls that resolved (a ``process_many`` call once, with its last items)."""
    if futures_only and len(sinks) == 1:  # one caller (a batch of one, at low load): the same tests, written out
        kind = type(results[0])
        if kind is not Retry and not issubclass(kind, Exception):
            sink = sinks[0]
            if sink.done():
                return 0  # its caller left: the result is dropped
            sink.set_result(results[0])
            recorder.resolved(1, SUCCEEDED)
            return 1
    kinds = set(map(type, results)) if futures_only else None
    if kinds is not None and Retry not in kinds and not any(issubclass(kind, Exception) for kind in kinds):
        # No exception among the results (one look at their types, not one isinstance per item): set them all in
        # one pass in C. A caller who left (its future done) stops the pass at its place, which goes on after it.
        # Nothing can finish a future meanwhile: set_result schedules its callbacks, it does not run them.
        setting = map(_set_result, sinks, results)
        left = 0
        while True:
            try:
                consume(setting)
                break
            except asyncio.InvalidStateError:
                left += 1
        recorder.resolved(len(sinks) - left, SUCCEEDED)
        return len(sinks) - left
    i = resolved = 0
    for sink in sinks:
        if sink.__class__ is tuple:
            bulk, start, count = sink
            if not bulk.future.done():
                bulk.deliver(start, results, i, count)
                resolved += bulk.future.done()
            i += count
            continue
        result = results[i]
        i += 1
        if sink.done():
            continue  # its caller left: the result is dropped
        resolved += 1
        if result.__class__ is Retry:  # (not tried again: the batcher has no retry policy)
            result = result.outcome()
        if isinstance(result, BaseException):
            sink.set_exception(result)
            recorder.resolved(1, FAILED)
        else:
            sink.set_result(result)
            recorder.resolved(1, SUCCEEDED)
    return resolved
