"""Forming a batch: a lane's next batch taken from the queue, by priority, weight and arrival (private).

:func:`take` is the one way from the :class:`~async_batcher._core.queue.Queue` into a batch: the common case (one
level of single items whose callers all wait) in C-level passes, else entry by entry (priorities, weights, bulk
calls, departed callers). It keeps the queue's counts as the items leave
(:func:`~async_batcher._core.queue.violations`). Once items with deadlines (or items tried again) have come
(:attr:`Queue.tracked <async_batcher._core.queue.Queue.tracked>`), it also keeps each item's deadline and tries
(``Taken.deadlines``, ``attempts``, ``tries``), and an item whose deadline has passed is never sent: it leaves the
queue here, its caller failed with ``TimeoutError`` (:attr:`Queue.expire`).
"""

from __future__ import annotations

import math
from collections import deque
from itertools import repeat
from operator import attrgetter
from typing import Any

from async_batcher._core.lane import Column, Entry, Lane
from async_batcher._core.queue import Queue
from async_batcher._core.sinks import Bulk, consume, future_done

__all__: list[str] = []

_item_of = attrgetter("item")
_sink_of = attrgetter("sink")
_context_of = attrgetter("context")
_lane_of = attrgetter("lane")
_arrival_of = attrgetter("arrival")
_deadline_of = attrgetter("deadline")
_attempts_of = attrgetter("attempts")
_tries_of = attrgetter("tries")
_popleft = deque.popleft
_new = object.__new__


class Taken:
    """A batch just taken from the queue: its items, one sink per caller, their weight, its oldest arrival.

    ``contexts``, beside ``sinks``: each caller's context (a snapshot; a bulk call's is its
    :class:`~async_batcher._core.sinks.Bulk`'s). Only they are kept, not the entries: an entry kept alive for as long as
    its batch runs would be one more object for every garbage collection to look at, per item.
    """

    __slots__ = (
        "arrivals",
        "attempts",
        "contexts",
        "deadlines",
        "futures_only",
        "items",
        "newest",
        "oldest",
        "sinks",
        "tries",
        "weight",
        "weights",
    )

    def __init__(
        self,
        items: list[Any],
        sinks: list[Any],
        contexts: list[Any],
        *,
        oldest: float,
        newest: float,
        weight: float,
        futures_only: bool,
        weights: list[float] | None = None,
    ) -> None:
        self.items = items
        self.sinks = sinks
        self.contexts = contexts
        self.oldest = oldest
        self.newest = newest  # the arrival of its newest item (the hold's measure of how its items arrived)
        self.weight = weight
        self.weights = weights  # each item's, when weights are kept (None: each weighs 1)
        self.futures_only = futures_only  # every sink is a single caller's future (no bulk call)
        self.arrivals: list[float] | None = None  # each item's arrival, when asked for (take(arrivals=True))
        # Each item's deadline (inf: none), tries without progress and tries, once the queue is tracked.
        self.deadlines: list[float] | None = None
        self.attempts: list[int] | None = None
        self.tries: list[int] | None = None


def take(
    queue: Queue,
    lane: Lane,
    limit: int,
    weight_limit: float,
    *,
    now: float,
    max_priority_wait: float,
    overflow: bool = True,
    arrivals: bool = False,
) -> Taken | None:
    """Take the lane's next batch: at most ``limit`` items and ``weight_limit`` weight.

    The best priority goes first, unless the head of another level has waited ``max_priority_wait``; first
    come, first served within a level. ``overflow``: a first item heavier than ``weight_limit`` is taken all
    the same (a batch of one; what fills a running batch passes ``False``). ``arrivals``: keep each item's arrival
    (``Taken.arrivals``). ``None`` if nothing is taken. An item whose deadline is ``now`` or earlier is not taken: it
    leaves the queue, its caller failed (:attr:`Queue.expire`).
    """
    taken = None
    if not queue.weighted and len(lane.order) == 1:
        taken = _take_plain(queue, lane, limit, arrivals, now if queue.tracked else None)
    if taken is None:
        taken = _take_each(queue, lane, limit, weight_limit, now, now - max_priority_wait, overflow, arrivals)
        if taken is None:
            return None
    n = len(taken.items)
    lane.count -= n
    lane.left += n
    if queue.weighted:
        lane.weight -= taken.weight
    queue.waiting -= n
    queue.recorder.left(n)
    queue.changes += 1
    if not any(lane.order):
        lane.clean = True
    return taken


def _take_plain(queue: Queue, lane: Lane, limit: int, arrivals: bool, tracked: float | None) -> Taken | None:
    """The common case in C-level passes: one level of single items whose callers all still wait (and, ``tracked``
    being the time now, none of whose deadlines has passed)."""
    fifo = lane.order[0]
    if not fifo:
        return None
    if fifo[0].__class__ is Column:
        return _take_column(queue, fifo, fifo[0], limit, arrivals, tracked)
    if len(fifo) == 1:
        return _take_one(fifo, arrivals, tracked)
    if limit >= len(fifo):
        entries = list(fifo)
        fifo.clear()
    else:
        entries = list(map(_popleft, repeat(fifo, limit)))
    sinks = list(map(_sink_of, entries)) if lane.clean or _regular(entries) else None
    deadlines = None if tracked is None else list(map(_deadline_of, entries))
    if sinks is None or any(map(future_done, sinks)) or (deadlines is not None and min(deadlines) <= tracked):
        fifo.extendleft(reversed(entries))  # a bulk call, a departed or late caller among them: the general way
        return None
    consume(map(setattr, entries, repeat("lane"), repeat(None)))  # entry.lane = None (it has left), in C
    n = len(entries)
    taken = Taken(
        list(map(_item_of, entries)),
        sinks,
        list(map(_context_of, entries)),
        oldest=entries[0].arrival,
        newest=entries[-1].arrival,
        weight=n,
        futures_only=True,
    )
    if arrivals:
        taken.arrivals = list(map(_arrival_of, entries))
    if deadlines is not None:
        taken.deadlines = deadlines
        taken.attempts = list(map(_attempts_of, entries))
        taken.tries = list(map(_tries_of, entries))
    return taken


def _take_column(
    queue: Queue, fifo: deque[Any], col: Column, limit: int, arrivals: bool, tracked: float | None
) -> Taken | None:
    """:func:`_take_plain` from a column at the head of the level: its lists handed over as they are (or their
    first ``limit`` items), when none of its callers has left and the batch does not reach past it."""
    start = col.start
    n = len(col.items) - start
    if col.gone is not None or not n or (n < limit and len(fifo) > 1):
        return None  # the general way
    if n > limit:
        n = limit
        if any(map(future_done, col.sinks[start : start + n])):
            return None
    elif n == 1:
        if col.sinks[start].done():
            return None
    elif any(map(future_done, col.sinks if not start else col.sinks[start:])):
        return None
    if not start and n == len(col.items) and col.index is None:  # all of it (the common case): its lists
        items, sinks, contexts, times = col.items, col.sinks, col.contexts, col.arrivals
        col.items, col.sinks, col.contexts, col.arrivals = [], [], [], []
        col.base += n
    else:
        items, sinks, contexts, times = col.drop_head(n)
    if col.start == len(col.items) and col is not queue.col:  # (the open column stays, empty, for its next items)
        fifo.popleft()
        queue.close_column(col)
    # Taken's fields set here, without a call of its __init__ (its keywords cost more than the rest of this path).
    taken = _new(Taken)
    taken.items, taken.sinks, taken.contexts = items, sinks, contexts
    taken.oldest, taken.newest = times[0], times[-1]
    taken.weight, taken.futures_only, taken.weights = n, True, None
    taken.arrivals = times if arrivals else None
    if tracked is None:
        taken.deadlines = taken.attempts = taken.tries = None
    else:  # (the short path's items have no deadline, and have not been tried)
        taken.deadlines, taken.attempts, taken.tries = [math.inf] * n, [0] * n, [0] * n
    return taken


def _from_column(queue: Queue, col: Column, room: int) -> tuple[list[Any], list[Any], list[Any], list[float]]:
    """Up to ``room`` items from the head of ``col`` whose callers wait (its items, sinks, contexts and arrivals);
    those before them whose callers have left are dropped (withdrawn, if they were not)."""
    gone = col.gone
    sinks = col.sinks
    start = col.start
    keep: list[int] = []  # (places after its head)
    i = 0
    while start + i < len(sinks) and len(keep) < room:
        if gone is not None and col.base + start + i in gone:
            pass
        elif sinks[start + i].done():
            queue.withdrew(queue.lane0, 1.0)
        else:
            keep.append(i)
        i += 1
    items, sinks, contexts, times = col.drop_head(i)
    if len(keep) == i:
        return items, sinks, contexts, times
    return [items[k] for k in keep], [sinks[k] for k in keep], [contexts[k] for k in keep], [times[k] for k in keep]


def _explode(queue: Queue, fifo: deque[Any], col: Column, room: int) -> None:
    """Turn up to ``room`` items at the head of ``col`` (the head of ``fifo``) into entries of their own before it."""
    items, sinks, contexts, times = _from_column(queue, col, room)
    if col.start == len(col.items) and col is not queue.col:
        fifo.popleft()
        queue.close_column(col)
    lane = queue.lane0
    fifo.extendleft(reversed(list(map(Entry, items, sinks, times, repeat(lane), contexts))))


def _take_one(fifo: deque[Any], arrivals: bool, tracked: float | None) -> Taken | None:
    """:func:`_take_plain` for a level of one entry (a lone caller's, the common case at low load): its checks
    written out, without the passes."""
    entry = fifo[0]
    if entry.__class__ is Bulk or entry.lane is None:
        return None  # a bulk call, or a caller who left: the general way
    sink = entry.sink
    if sink.__class__ is Bulk or sink.done() or (tracked is not None and entry.deadline <= tracked):
        return None
    fifo.clear()
    entry.lane = None  # (it has left)
    # Taken's fields set here, without a call of its __init__ (its keywords cost more than the rest of this path).
    taken = _new(Taken)
    taken.items, taken.sinks, taken.contexts = [entry.item], [sink], [entry.context]
    taken.oldest = taken.newest = arrival = entry.arrival
    taken.weight, taken.futures_only, taken.weights = 1, True, None
    taken.arrivals = [arrival] if arrivals else None
    if tracked is None:
        taken.deadlines = taken.attempts = taken.tries = None
    else:
        taken.deadlines, taken.attempts, taken.tries = [entry.deadline], [entry.attempts], [entry.tries]
    return taken


def _take_each(
    queue: Queue,
    lane: Lane,
    limit: int,
    weight_limit: float,
    now: float,
    starved_before: float,
    overflow: bool,
    arrivals: bool,
) -> Taken | None:
    """Entry by entry: priorities, weights, bulk calls, departed and late callers."""
    times: list[float] | None = [] if arrivals else None
    tracked = queue.tracked
    deadlines: list[float] | None = [] if tracked else None
    attempts: list[int] = []
    tries: list[int] = []
    items: list[Any] = []
    sinks: list[Any] = []
    contexts: list[Any] = []
    weights: list[float] | None = [] if queue.weighted else None
    weight = 0.0
    oldest = math.inf
    newest = -math.inf
    futures_only = True
    while len(items) < limit:
        picked = _next_level(queue, lane, starved_before)
        if picked is None:
            break
        fifo, entry = picked
        if tracked and entry.deadline <= now:  # its caller's deadline has passed: it is never sent
            _expire(queue, fifo, entry)
            continue
        if entry.__class__ is Column:
            if len(lane.order) > 1:  # levels compete item by item (max_priority_wait): its next items become entries
                _explode(queue, fifo, entry, limit - len(items))
                continue
            room = limit - len(items)
            if weight_limit < math.inf:  # (its items weigh 1)
                free = int(weight_limit - weight)
                if free < 1 and (items or not overflow):
                    break
                room = min(room, max(free, 1))
            got, got_sinks, got_contexts, got_times = _from_column(queue, entry, room)
            if entry.start == len(entry.items):
                fifo.popleft()
                queue.close_column(entry)
            if not got:
                continue
            k = len(got)
            items.extend(got)
            sinks.extend(got_sinks)
            contexts.extend(got_contexts)
            weight += k
            if weights is not None:
                weights.extend([1.0] * k)
            oldest = min(oldest, got_times[0])
            newest = max(newest, got_times[-1])
            if times is not None:
                times.extend(got_times)
            if deadlines is not None:
                deadlines.extend([math.inf] * k)
                attempts.extend([0] * k)
                tries.extend([0] * k)
            continue
        if entry.__class__ is not Bulk:
            w = entry.weight
            if weight + w > weight_limit and (items or not overflow):
                break  # the batch closes before an item that would overflow it
            fifo.popleft()
            entry.lane = None
            weight += w
            items.append(entry.item)
            if weights is not None:
                weights.append(w)
            sink = entry.sink
            if sink.__class__ is Bulk:
                sink = (sink, entry.index, 1)
                futures_only = False
            sinks.append(sink)
            contexts.append(entry.context)
            oldest = min(oldest, entry.arrival)
            newest = max(newest, entry.arrival)
            if times is not None:
                times.append(entry.arrival)
            if deadlines is not None:
                deadlines.append(entry.deadline)
                attempts.append(entry.attempts)
                tries.append(entry.tries)
            continue
        start = entry.pos
        count = min(limit - len(items), len(entry.items) - start)
        if weight_limit < math.inf:  # a weight limit set after this call was queued: its items weigh 1
            room = int(weight_limit - weight)
            if room < 1 and (items or not overflow):
                break
            count = min(count, max(room, 1))
        chunk = entry.items[start : start + count]  # a copy: process_batch may keep or mutate it
        if items:
            items.extend(chunk)
        else:
            items = chunk
        sinks.append((entry, start, count))
        contexts.append(entry.context)
        futures_only = False
        entry.pos = start + count
        weight += count
        if weights is not None:
            weights.extend([1.0] * count)
        oldest = min(oldest, entry.arrival)
        newest = max(newest, entry.arrival)
        if times is not None:
            times.extend([entry.arrival] * count)
        if deadlines is not None:
            deadlines.extend([entry.deadline] * count)
            attempts.extend([0] * count)
            tries.extend([0] * count)
        if entry.pos == len(entry.items):
            fifo.popleft()
    if not items:
        return None
    taken = Taken(
        items, sinks, contexts, oldest=oldest, newest=newest, weight=weight, futures_only=futures_only, weights=weights
    )
    taken.arrivals = times
    if deadlines is not None:
        taken.deadlines, taken.attempts, taken.tries = deadlines, attempts, tries
    return taken


def _expire(queue: Queue, fifo: deque[Any], entry: Any) -> None:
    """An entry (a single item, or a plain ``process_many`` call's) whose deadline has passed leaves the queue, its
    caller failed with ``TimeoutError``."""
    if entry.__class__ is Bulk:
        queue.withdraw_bulk(entry)
    else:
        queue.withdraw(entry)
    fifo.popleft()
    queue.expire(entry)


def _next_level(queue: Queue, lane: Lane, starved_before: float) -> tuple[deque[Any], Any] | None:
    """The level to take the next item from: the best priority, unless a head arrived by ``starved_before``: then
    the head that arrived first. Of heads that arrived together (the same time on the loop's clock: the common case
    on a coarse or a virtual clock), the worst priority's, passed over by all the others: a better one would win
    every tie, and keep an item that waited ``max_priority_wait`` waiting as long as items of a better priority
    came with it (the second best of three tied levels, say, until it drained)."""
    order = lane.order
    if len(order) == 1:
        head = queue.live_head(order[0])
        return None if head is None else (order[0], head)
    best = None
    overdue = None
    overdue_at = math.inf
    for fifo in order:
        head = queue.live_head(fifo)
        if head is None:
            continue
        if best is None:
            best = (fifo, head)
        arrival = head.arrival
        if arrival <= starved_before and arrival <= overdue_at:  # (of a tie, the later level: the worse priority)
            overdue, overdue_at = (fifo, head), arrival
    return overdue if overdue is not None else best


def _regular(entries: list[Any]) -> bool:
    """Single items, all still queued, each its own caller's (no bulk call): what a clean lane holds."""
    types = set(map(type, entries))
    return (
        Bulk not in types
        and Column not in types
        and all(map(_lane_of, entries))
        and Bulk not in set(map(type, map(_sink_of, entries)))
    )
