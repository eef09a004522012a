"""A queued item (:class:`Entry`) and the lane of one batch key (:class:`Lane`): the bottom of the core's state
(private). The :class:`~async_batcher._core.queue.Queue` counts over lanes.

A single item waits as an :class:`Entry`: its item, its *sink* (the caller's future, or the
:class:`~async_batcher._core.sinks.Bulk` of a ``process_many`` call), its arrival on the loop's clock, its lane while
it is queued (``None`` once it has left: sent in a batch, or withdrawn because its caller left or a stop failed it),
and a snapshot of its caller's :mod:`contextvars` context, which ``process_batch`` reads through
:func:`async_batcher.current_batch`. An entry leaves the queue exactly once. An item with a weight of its own, or one
item of a ``process_many`` call with keys or weights, is a :class:`WeightedEntry`, which also keeps its weight and its
place in its call; so is an item with a deadline (its caller's ``timeout``), or one that is tried again
(:mod:`~async_batcher._core.recovery`), which keeps its tries so far. The short path's items (no key, no weight,
no timeout, priority 0) wait in a :class:`Column` instead: parallel lists of many callers' items, sinks, contexts
and arrivals, which forming hands to a batch as they are (no object per item: the one hot path).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable, Iterator
from itertools import repeat
from typing import TYPE_CHECKING, Any

from async_batcher._core.state import UNLIMITED

if TYPE_CHECKING:
    from async_batcher._core.queue import Queue

__all__: list[str] = []


class Entry:
    """One item waiting for a batch (see the module's docstring). Its weight is 1."""

    __slots__ = ("arrival", "context", "item", "lane", "sink")
    weight = 1.0  # (a WeightedEntry keeps its own)
    index = 0  # its place in its process_many call (a WeightedEntry's); a single call's item is alone
    deadline = math.inf  # when its caller's timeout expires, on the loop's clock (a WeightedEntry's)
    attempts = 0  # its tries that made no progress so far (an item tried again: a WeightedEntry)
    tries = 0  # its tries so far, progress or not

    def __init__(self, item: Any, sink: Any, arrival: float, lane: Lane, context: Any) -> None:
        self.item = item
        self.sink = sink
        self.arrival = arrival
        self.lane: Lane | None = lane  # None once it has left the queue
        self.context = context


class WeightedEntry(Entry):
    """An entry with a weight of its own, or one item of a ``process_many`` call (``index``: its place in it), or an
    item with a deadline, or one tried again (its ``attempts`` and ``tries`` so far)."""

    __slots__ = ("attempts", "deadline", "index", "tries", "weight")

    def __init__(
        self,
        item: Any,
        sink: Any,
        arrival: float,
        lane: Lane,
        context: Any,
        *,
        weight: float = 1.0,
        index: int = 0,
        deadline: float = math.inf,
        attempts: int = 0,
        tries: int = 0,
    ) -> None:
        super().__init__(item, sink, arrival, lane, context)
        self.weight = weight
        self.index = index
        self.deadline = deadline
        self.attempts = attempts
        self.tries = tries


class Column:
    """Single items of the default lane at priority 0 queued one after the other by the short path
    (:meth:`Engine.put <async_batcher._core.engine.Engine.put>`), kept as parallel lists instead of an :class:`Entry`
    each: forming hands the lists to a batch as they are.

    The lists hold, in arrival order, the items of global indices ``base`` onwards; those before ``start`` (a place
    in the lists) have left from its head (sent, or dropped as their callers had left; their places hold ``None``), and
    the lists are cut once that head is more than half of them (a batch taken from a long column costs no move of the
    rest). A caller who
    leaves while its item is queued is withdrawn in place: its global index goes into ``gone`` (the counts change
    then), and its item stays in the lists until the head reaches it. A caller's column and index are found through
    ``index``, the queue's (sink to column and global index, one for all its columns: a departure looks at no other
    column), made the first time a caller leaves and extended as items come (``indexed``: the global index the
    column's items reach in it; :meth:`indexed_in`). ``lane``: the lane while the column is in it (``None`` once it
    has left).
    """

    __slots__ = ("arrivals", "base", "contexts", "gone", "index", "indexed", "items", "lane", "sinks", "start")
    deadline = math.inf  # (its items have none: the short path takes no timeout)

    def __init__(self, lane: Lane) -> None:
        self.items: list[Any] = []
        self.sinks: list[Any] = []
        self.contexts: list[Any] = []
        self.arrivals: list[float] = []
        self.base = 0
        self.start = 0
        self.lane: Lane | None = lane
        self.gone: set[int] | None = None
        self.index: dict[Any, tuple[Column, int]] | None = None
        self.indexed = 0

    @property
    def arrival(self) -> float:
        """The arrival of its head (``inf`` if it is empty)."""
        return self.arrivals[self.start] if self.start < len(self.arrivals) else math.inf

    def indexed_in(self, index: dict[Any, tuple[Column, int]]) -> bool:
        """Put its items not yet in ``index`` (the queue's) into it; whether they were all in it already."""
        base = self.base
        end = base + len(self.sinks)
        if self.index is not index:
            self.index = index
            self.indexed = base + self.start
            known = False
        else:
            known = self.indexed >= end
        if self.indexed < end:
            start = self.indexed
            index.update(zip(self.sinks[start - base :], zip(repeat(self), range(start, end)), strict=True))
            self.indexed = end
        return known

    def drop_head(self, n: int) -> tuple[list[Any], list[Any], list[Any], list[float]]:
        """Take the first ``n`` items out of the column (all of them from the lists' start: the lists themselves);
        return their items, sinks, contexts and arrivals. What ``gone`` and ``index`` knew of them is forgotten."""
        start = self.start
        end = min(start + n, len(self.items))
        first = self.base + start
        if start == 0 and end == len(self.items):
            taken = self.items, self.sinks, self.contexts, self.arrivals
        else:
            taken = self.items[start:end], self.sinks[start:end], self.contexts[start:end], self.arrivals[start:end]
        if end == len(self.items):  # all of it has left: new lists
            self.items, self.sinks, self.contexts, self.arrivals = [], [], [], []
            self.base += end
            self.start = 0
        elif 2 * end > len(self.items):  # the head is more than half the lists: cut them
            del self.items[:end], self.sinks[:end], self.contexts[:end], self.arrivals[:end]
            self.base += end
            self.start = 0
        else:  # (what has left is let go at once: a caller's future and context do not outlive its batch)
            gap = [None] * (end - start)
            self.items[start:end] = self.sinks[start:end] = self.contexts[start:end] = gap
            self.start = end
        gone = self.gone
        if gone is not None:
            gone.difference_update(range(first, first + end - start))
            if not gone:
                self.gone = None
        if self.index is not None:
            for sink in taken[1]:
                self.index.pop(sink, None)
            self.indexed = max(self.indexed, self.base + self.start)
        return taken


class Lane:
    """The items of one batch key waiting for a batch, a FIFO deque per priority level, and what the engine and the
    dispatch policy know of the lane.

    Counts: ``count``, its items still queued; ``weight``, their total weight while weights are kept
    (:attr:`Queue.weighted`); ``left``, how many have left it so far (sent or withdrawn), so that ``arrived`` counts
    every item that ever arrived in it. The engine's: ``served``, the dispatch count of its last batch (never
    served: just before the count when it came): the due lane served longest ago goes first; ``in_flight``, its
    batches in flight;
    ``ended`` and ``arrived_at_end``, when its last batch ended and its arrivals then; ``trigger`` and
    ``trigger_weight``, the count and the weight at which an arrival makes it due at once (as the dispatcher's last
    decision for it found them: :meth:`~async_batcher._core.decision.Decision.decide`); ``watch``, whether the
    policy asked to see its next arrival. ``memo`` is the dispatch policy's own record of the lane, opaque here.

    ``ceiling`` and ``weight_ceiling``: the most items, and weight, its batches take while an out-of-memory split has
    lowered them (``split_on``; :data:`~async_batcher._core.state.UNLIMITED` and ``inf`` otherwise); ``capacity``,
    what the split learned (:class:`~async_batcher._core.ceiling.Capacity`), or ``None``.
    """

    __slots__ = (
        "arrived_at_end",
        "capacity",
        "ceiling",
        "clean",
        "count",
        "ended",
        "in_flight",
        "key",
        "left",
        "levels",
        "memo",
        "order",
        "queue",
        "served",
        "trigger",
        "trigger_weight",
        "watch",
        "weight",
        "weight_ceiling",
    )

    def __init__(self, key: Hashable, queue: Queue, served: float) -> None:
        self.key = key
        self.queue = queue
        # True while every entry of its levels is a single item still queued, its own caller's (no bulk call,
        # nothing withdrawn in place): a batch can then be formed without looking at each entry.
        self.clean = True
        self.levels: dict[float, deque[Any]] = {}
        self.order: list[deque[Any]] = []  # the levels, best (lowest) priority first
        self.count = 0
        self.weight = 0.0
        self.left = 0
        self.served = served
        self.in_flight = 0
        self.ended = -math.inf
        self.arrived_at_end = 0
        self.trigger = 1
        self.trigger_weight = math.inf
        self.watch = False
        self.memo: Any = None
        self.ceiling = UNLIMITED
        self.weight_ceiling = math.inf
        self.capacity: Any = None

    def level(self, priority: float) -> deque[Any]:
        fifo = self.levels.get(priority)
        if fifo is None:
            fifo = self.levels[priority] = deque()
            self.order = [self.levels[p] for p in sorted(self.levels)]
        return fifo

    def entries(self) -> Iterator[Any]:
        return (entry for fifo in self.order for entry in fifo)

    @property
    def arrived(self) -> int:
        """How many items have arrived in the lane so far."""
        return self.count + self.left

    def oldest(self) -> float:
        """Arrival time of its oldest waiting item (``inf`` if its callers all left)."""
        return self.queue.oldest(self)

    def newest(self) -> float:
        """Arrival time of its newest queued entry (``-inf`` if none)."""
        newest = -math.inf
        for fifo in self.order:
            if fifo:
                last = fifo[-1]
                if last.__class__ is Column:
                    if len(last.arrivals) > last.start:
                        newest = max(newest, last.arrivals[-1])
                else:
                    newest = max(newest, last.arrival)
        return newest
