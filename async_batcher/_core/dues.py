"""When queued items are due, for a late refusal (``refuse_late``) (private; below the
:class:`~async_batcher._core.queue.Queue`, which keeps the heap and asks).

An item is due by its caller's deadline (a shared row's: its callers' now) or ``latency`` seconds after its
arrival, whichever comes first (:func:`due_of`); an item whose caller has left has no deadline of its own.
:func:`earliest_due` is the earliest of the last items queued, looked up in the levels; :class:`Dues` is the earliest
of the whole queue, kept as items come (a heap) so that departures cost no look at the rest of the queue.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from operator import itemgetter
from typing import Any

from async_batcher._core.lane import Column, Lane
from async_batcher._core.sinks import Bulk, deadline_of

__all__: list[str] = []

_first = itemgetter(0)


class Dues:
    """Each queued item's due, ``(due, seq, entry)`` in a heap, for the latency budget it was made for (``seq``: the
    tie-break; entries are never compared). Entries that left, or whose due moved, are dropped or moved as they reach
    its top (:meth:`earliest`)."""

    __slots__ = ("heap", "latency", "seq")

    def __init__(self, latency: float) -> None:
        self.heap: list[tuple[float, int, Any]] = []
        self.latency = latency
        self.seq = 0

    @classmethod
    def made(cls, lanes: Iterable[Lane], latency: float) -> Dues:
        """The dues of every entry queued in ``lanes``."""
        dues = cls(latency)
        for lane in lanes:
            if lane.count:
                for entry in lane.entries():
                    dues.note(entry)
        heapq.heapify(dues.heap)
        return dues

    def note(self, entry: Any) -> None:
        """An entry queued, or whose due moved."""
        due, n = due_of(entry, self.latency)
        if n:
            self.seq += 1
            heapq.heappush(self.heap, (due, self.seq, entry))

    def earliest(self) -> float:
        """The earliest due of the entries still queued (``inf``: none)."""
        heap = self.heap
        while heap:
            due, _, entry = heap[0]
            now_due, n = due_of(entry, self.latency)
            if not n:  # it left (sent, withdrawn)
                heapq.heappop(heap)
            elif now_due != due:  # its caller left, or a shared row's deadline moved
                self.seq += 1
                heapq.heapreplace(heap, (now_due, self.seq, entry))
            else:
                return due
        return math.inf


def earliest_due(lanes: Iterable[Lane], count: int, latency: float) -> float:
    """The earliest due (:func:`due_of`) of the last ``count`` items queued in ``lanes`` (by arrival, the whole queue
    seen as one line); an item whose caller has left is due never. ``inf``: none is due."""
    found: list[tuple[float, float, int]] = []  # (arrival, due, items) of the last entries of each level
    for lane in lanes:
        if not lane.count:
            continue
        for fifo in lane.order:
            seen = 0
            for entry in reversed(fifo):
                if seen >= count:
                    break
                if entry.__class__ is Column:
                    seen += _column_dues(entry, latency, count - seen, found)
                    continue
                due, n = due_of(entry, latency)
                if n:
                    found.append((entry.arrival, due, n))
                    seen += n
    found.sort(key=_first, reverse=True)  # (stable: of equal arrivals, the later in its level first)
    due = math.inf
    for _, deadline, n in found:
        if count <= 0:
            break
        due = min(due, deadline)
        count -= n
    return due


def _column_dues(col: Column, latency: float, count: int, found: list[tuple[float, float, int]]) -> int:
    """:func:`earliest_due` of a column's last ``count`` items still queued: (arrival, due, 1) of each into
    ``found``; how many."""
    gone = col.gone or ()
    seen = 0
    for i in range(len(col.items) - 1, col.start - 1, -1):
        if seen >= count:
            break
        if col.base + i not in gone:
            arrival = col.arrivals[i]
            found.append((arrival, arrival + latency, 1))
            seen += 1
    return seen


def due_of(entry: Any, latency: float) -> tuple[float, int]:
    """A queued entry's due (its caller's deadline, a shared row's callers' now, or ``latency`` seconds after its
    arrival, whichever comes first; a caller that has left has no deadline) and how many items of it are queued (0:
    it left). A column's: its first queued item's (its items have no deadline of their own)."""
    if entry.__class__ is Column:
        gone = entry.gone or ()
        start = entry.start
        n = len(entry.items) - start - len(gone) if entry.lane is not None else 0
        first = next((a for i, a in enumerate(entry.arrivals[start:], entry.base + start) if i not in gone), math.inf)
        return (first + latency if n else math.inf), n
    if entry.__class__ is Bulk:
        n = len(entry.items) - entry.pos if entry.lane is not None else 0
        deadline = math.inf if entry.future.done() else entry.deadline
    else:
        n = 0 if entry.lane is None else 1
        sink = entry.sink
        deadline = math.inf if sink.done() else deadline_of(sink, entry.deadline)
    return min(deadline, entry.arrival + latency), n
