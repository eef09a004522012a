"""What waits for a batch: the :class:`Queue` of the lanes (:mod:`~async_batcher._core.lane`), which counts their
entries as they come and leave (private). Every count changes with the one step in which an entry leaves.

A plain ``process_many`` call (no keys, no weights) is one entry of its own, a
:class:`~async_batcher._core.sinks.Bulk`, sliced into batches as they go out: ``bulk.pos`` items of it have left.
The short path's single items (:meth:`Engine.put <async_batcher._core.engine.Engine.put>`) join a
:class:`~async_batcher._core.lane.Column` at the end of the default level instead of an entry each; a caller who
leaves is withdrawn from it in place (:meth:`Queue.withdraw_sink`).
Batches are formed from the queue by :mod:`~async_batcher._core.forming`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from async_batcher._core.ceiling import Kept
from async_batcher._core.dues import Dues, earliest_due
from async_batcher._core.lane import Column, Entry, Lane
from async_batcher._core.sinks import Bulk

if TYPE_CHECKING:
    from async_batcher.stats import _Recorder
from async_batcher._checks import plural

__all__: list[str] = []

# The key of every item when batch_key is not overridden.
DEFAULT_KEY: Hashable = object()

_ended = attrgetter("ended")


def _ignore(entry: Any) -> None:
    pass


class Queue:
    """The items waiting for a batch, by lane (batch key) and, within a lane, by priority.

    Invariants, after every step (checked by the property test through :func:`violations`):

    - ``waiting == sum(lane.count for lane in lanes.values())``;
    - ``lane.count`` is the number of the lane's items still queued: its single entries whose ``lane`` is set plus
      ``len(bulk.items) - bulk.pos`` for each of its plain bulk entries plus, for each of its columns (the short
      path's items, :class:`~async_batcher._core.lane.Column`), the items in its lists not withdrawn in place;
    - ``col``, the column the short path appends to, is the last entry of the default level (or ``None``);
    - ``lane.weight`` is their total weight, while ``weighted``;
    - ``recorder.exited`` grows by one for each item that leaves the queue (sent or withdrawn), once.

    ``changes`` counts the changes of the queued items other than arrivals at the ends of their levels (items that
    left, items put back at the head, a queued item's deadline that moved): what is computed over the queued items
    in their order (the deadline of the last batch, :meth:`earliest_due`) is computed again when it has changed.
    Over the whole queue it is kept as items come and go instead (:meth:`earliest_due_of_all`): a heap of each
    item's due, whose entries that left, or whose due moved, are dropped as they reach its top.
    """

    __slots__ = (
        "ceilings",
        "changes",
        "col",
        "columns",
        "dispatches",
        "dues",
        "expire",
        "fifo0",
        "index",
        "lane0",
        "lanes",
        "recorder",
        "tracked",
        "waiting",
        "weighted",
    )

    def __init__(self, recorder: _Recorder, *, weighted: bool) -> None:
        self.dispatches = 0  # batches formed so far: the clock of Lane.served
        self.changes = 0
        self.lane0 = Lane(DEFAULT_KEY, self, 0)  # the lane of every item when batch_key is not overridden
        self.fifo0 = self.lane0.level(0)  # its priority-0 level: where the common case appends
        # The columns of the short path's items in fifo0, in order (usually one), and the one it appends to: the
        # last entry of fifo0, or None (the next item opens one).
        self.columns: list[Column] = []
        self.col: Column | None = None
        # Where a caller's item is in the columns (sink to column and global index): made the first time a caller
        # leaves, extended as they do (Column.indexed_in); an item's entry goes as it leaves its column's head.
        self.index: dict[Any, tuple[Column, int]] | None = None
        self.lanes: dict[Hashable, Lane] = {DEFAULT_KEY: self.lane0}
        self.waiting = 0
        self.weighted = weighted  # lane.weight is kept (items have weights, or a weight limit is set)
        # Entries with a deadline, or tried again, have come: a batch keeps each item's deadline and tries.
        self.tracked = False
        self.recorder = recorder
        # The engine's: an entry (or a plain bulk call) whose deadline passed has left the queue: fail its caller.
        self.expire: Callable[[Any], None] = _ignore
        # The out-of-memory ceilings (split_on) of keys whose idle lanes were let go: kept beyond the idle lanes.
        self.ceilings = Kept()
        # Each queued item's due, from the first time the whole queue's earliest is asked (a late refusal's).
        self.dues: Dues | None = None

    # ------------------------------------------------------------------ entering

    def lane(self, key: Hashable) -> Lane:
        lane = self.lanes.get(key)
        if lane is None:
            # Never served: it counts as served just before the batch formed last, so that it goes before the lanes
            # served since, and after those that have waited longer.
            lane = self.lanes[key] = Lane(key, self, self.dispatches - 0.5)
            if self.ceilings.by_key:
                self.ceilings.restore(lane)
        return lane

    def open_column(self) -> Column:
        """A column at the end of the default lane's priority-0 level, for the short path's next items."""
        lane = self.lane0
        col = self.col = Column(lane)
        if self.fifo0:
            lane.clean = False  # (a column behind other entries: batches are formed entry by entry)
        self.fifo0.append(col)
        self.columns.append(col)
        return col

    def close_column(self, col: Column) -> None:
        """A column has left its level (emptied)."""
        col.lane = None
        self.columns.remove(col)
        if self.col is col:
            self.col = None

    def push(self, entry: Entry, priority: float) -> None:
        """Queue a single item's entry (its lane and weight are in it)."""
        lane: Any = entry.lane
        fifo = lane.level(priority)
        fifo.append(entry)
        if entry.sink.__class__ is Bulk:
            lane.clean = False
        if fifo is self.fifo0 and self.columns:
            self.col = None  # (the short path's next items queue behind this one)
            lane.clean = False
        lane.count += 1
        if lane.count == 1 and lane.served < self.dispatches:  # back after an idle spell: it counts from now
            lane.served = self.dispatches - 0.5
        if self.weighted:
            lane.weight += entry.weight
        self.waiting += 1
        if entry.deadline < math.inf:
            self.tracked = True
        if self.dues is not None:
            self.dues.note(entry)

    def push_front(self, lane: Lane, entries: Sequence[Entry]) -> None:
        """Put items tried again back at the head of their lane (its best priority, in their order): they join its
        next batch. They left the queue once already: they count as back in it."""
        fifo = lane.order[0] if lane.order else lane.level(0)
        fifo.extendleft(reversed(entries))
        lane.clean = False
        n = len(entries)
        lane.count += n
        if self.weighted:
            lane.weight += sum(entry.weight for entry in entries)
        self.waiting += n
        self.recorder.returned(n)
        self.tracked = True
        self.changes += 1
        if self.dues is not None:
            for entry in entries:
                self.dues.note(entry)

    def push_bulk(self, bulk: Bulk, priority: float) -> None:
        """Queue a plain ``process_many`` call as one entry of the default lane."""
        lane = self.lane0
        fifo = lane.level(priority)
        fifo.append(bulk)
        lane.clean = False
        if fifo is self.fifo0:
            self.col = None  # (the short path's next items queue behind this call)
        if not lane.count and lane.served < self.dispatches:  # back after an idle spell: it counts from now
            lane.served = self.dispatches - 0.5
        n = len(bulk.items)
        lane.count += n
        if self.weighted:
            lane.weight += n
        self.waiting += n
        if bulk.deadline < math.inf:
            self.tracked = True
        if self.dues is not None:
            self.dues.note(bulk)

    # ------------------------------------------------------------------ leaving without a batch

    def withdraw(self, entry: Entry) -> bool:
        """Take a queued item out: its caller left, or a stop failed it; it is never sent. False if already out."""
        lane = entry.lane
        if lane is None:
            return False
        entry.lane = None
        lane.clean = False  # the entry stays in its level until the dispatcher reaches it
        self.withdrew(lane, entry.weight)
        return True

    def withdraw_sink(self, sink: Any) -> bool:
        """Take the short path's item of ``sink`` out of its column if it is still queued (withdrawn in place: it
        stays in the column's lists until the column's head reaches it). False if it is not queued."""
        index = self.index
        if index is None:
            index = self.index = {}
        for col in reversed(self.columns):  # (items come only to the last: the columns before one known are known)
            if col.indexed_in(index) and col is not self.col:
                break
        found = index.get(sink)
        if found is None:
            return False
        col, i = found
        if col.lane is None or i < col.base + col.start:
            return False
        if col.gone is None:
            col.gone = set()
        elif i in col.gone:
            return False
        col.gone.add(i)
        self.withdrew(self.lane0, 1.0)
        return True

    def withdrew(self, lane: Lane, weight: float) -> None:
        """One item left the queue without a batch (withdrawn): the counts."""
        lane.count -= 1
        lane.left += 1
        if self.weighted:
            lane.weight -= weight
        self.waiting -= 1
        self.recorder.left(1)
        self.changes += 1

    def withdraw_bulk(self, bulk: Bulk) -> int:
        """Take every item of a bulk call still queued out; return how many there were."""
        if bulk.entries is not None:
            return sum(map(self.withdraw, bulk.entries))
        unsent = len(bulk.items) - bulk.pos
        if unsent and bulk.lane is not None:
            bulk.pos = len(bulk.items)
            lane = bulk.lane
            lane.clean = False
            lane.count -= unsent
            lane.left += unsent
            if self.weighted:
                lane.weight -= unsent
            self.waiting -= unsent
            self.recorder.left(unsent)
            self.changes += 1
        return unsent

    def clear(self) -> list[Any]:
        """Take every item out (a forced stop); return the sinks of those whose callers still wait."""
        sinks: list[Any] = []
        for lane in self.lanes.values():
            for entry in lane.entries():
                if entry.__class__ is Column:
                    gone = entry.gone or ()
                    start = entry.start
                    for i, sink in enumerate(entry.sinks[start:], entry.base + start):
                        if i not in gone:
                            self.withdrew(lane, 1.0)
                            if not sink.done():
                                sinks.append(sink)
                    entry.lane = None
                elif entry.__class__ is not Bulk:
                    sink = entry.sink
                    if self.withdraw(entry) and not sink.done():
                        sinks.append(sink if sink.__class__ is not Bulk else (sink, entry.index, 1))
                else:
                    start = entry.pos
                    unsent = self.withdraw_bulk(entry)
                    if unsent and not entry.future.done():
                        sinks.append((entry, start, unsent))
            for fifo in lane.order:
                fifo.clear()
            lane.clean = True
        self.lanes = {self.lane0.key: self.lane0}
        self.columns.clear()
        self.col = None
        self.index = None
        self.changes += 1
        if self.dues is not None:
            self.dues.heap.clear()
        return sinks

    def deadline_moved(self, entry: Entry) -> None:
        """A queued item's deadline moved (a shared row's callers came or left)."""
        self.changes += 1
        if self.dues is not None:
            self.dues.note(entry)

    # ------------------------------------------------------------------ looking

    def live_head(self, fifo: deque[Any]) -> Any:
        """The first entry of a level still waiting; drops the entries before it that have left."""
        while fifo:
            entry = fifo[0]
            if entry.__class__ is Column:
                sinks, start = entry.sinks, entry.start
                if (start < len(sinks) and entry.gone is None and not sinks[start].done()) or self.drop_dead(entry):
                    return entry  # (its head waits: the common case, told without a call)
                self.close_column(entry)
            elif entry.__class__ is not Bulk:
                if entry.lane is not None:
                    if not entry.sink.done():
                        return entry
                    # Its caller was cancelled and has not run since to withdraw it: it must not be sent.
                    self.withdraw(entry)
            else:
                if entry.future.done():  # cancelled, timed out, or one of its items failed
                    self.withdraw_bulk(entry)
                if entry.pos < len(entry.items):
                    return entry
            fifo.popleft()
        return None

    def drop_dead(self, col: Column) -> bool:
        """Drop the items at the head of ``col`` whose callers have left (withdrawing those not yet withdrawn);
        whether an item whose caller waits remains."""
        gone = col.gone
        sinks = col.sinks
        start = col.start
        end = len(sinks)
        base = col.base
        at = start  # (a place, not a slice of the rest: a departure far down the column costs no look at the rest)
        while at < end:
            if gone is not None and base + at in gone:
                pass
            elif sinks[at].done():  # its caller was cancelled and has not run since to withdraw it: it must not be sent
                self.withdrew(self.lane0, 1.0)
            else:
                break
            at += 1
        if at > start:
            col.drop_head(at - start)
        return at < end

    def oldest(self, lane: Lane) -> float:
        """Arrival time of the lane's oldest waiting item (``inf`` if its callers all left)."""
        oldest = math.inf
        for fifo in lane.order:
            head = self.live_head(fifo)
            if head is not None:
                oldest = min(oldest, head.arrival)
        return oldest

    def earliest_due_of_all(self, latency: float) -> float:
        """The earliest deadline of every item queued (:meth:`earliest_due` of them all), from the heap of dues kept
        as items come (:class:`~async_batcher._core.dues.Dues`), made (again) at the first call, for a new latency
        budget, and when it holds more than twice what is queued."""
        dues = self.dues
        if dues is None or latency != dues.latency or len(dues.heap) > 2 * self.waiting + 64:
            dues = self.dues = Dues.made(self.lanes.values(), latency)
        return dues.earliest()

    def earliest_due(self, count: int, latency: float) -> float:
        """The earliest deadline of the last ``count`` items queued (:func:`~async_batcher._core.dues.earliest_due`)."""
        return earliest_due(self.lanes.values(), count, latency)

    def drop_empty_lanes(self, keep: int) -> None:
        """Keys come and go: forget the lanes that hold nothing and have no batch in flight, all but the
        ``keep`` (:attr:`DispatchPolicy.keep_idle <async_batcher.policies.DispatchPolicy.keep_idle>`) whose last
        batch ended last; the default lane stays. A key used again finds its lane's
        history (when its last batch ended, the rate since, the policy's memo), as the default lane's callers do; a
        stream of new keys keeps at most that many idle lanes. A lane's out-of-memory ceiling is kept longer, in
        :attr:`ceilings` (:class:`~async_batcher._core.ceiling.Kept`): a key used again finds it, however many keys
        came between. A lane kept idle lets go of what its levels still
        hold (the entries of callers who left, which the dispatcher would drop on reaching them) and of the levels
        themselves."""
        if len(self.lanes) == 1:
            return
        idle: list[Lane] = []
        for lane in self.lanes.values():
            if lane.count or lane.in_flight or lane is self.lane0:
                continue
            if lane.order:
                lane.levels.clear()
                lane.order = []
                lane.clean = True
            idle.append(lane)
        if len(idle) > keep:
            idle.sort(key=_ended)
            lanes = self.lanes
            for lane in idle[: len(idle) - keep]:
                # (A key whose hash changes, against the contract of a dict key, may find its lane, another or none,
                # at each look: a lane found that is not this one goes back, so that the pump never fails and no
                # lane that holds items is lost.)
                if lanes.get(lane.key) is lane:
                    found = lanes.pop(lane.key, None)
                    if found is not None and found is not lane:
                        lanes[found.key] = found
                    elif lane.capacity is not None:
                        self.ceilings.park(lane)  # (its ceiling outlives it: Kept)


def violations(queue: Queue) -> list[str]:
    """The invariants of :class:`Queue` that do not hold now, described (for the tests)."""
    found: list[str] = []
    total = 0
    for key, lane in queue.lanes.items():
        count = 0
        weight = 0.0
        for entry in lane.entries():
            if entry.__class__ is Column:
                gone = entry.gone or set()
                if entry.lane is not lane or entry not in queue.columns:
                    held = plural(len(entry.items) - entry.start, "item")
                    found.append(f"lane {key!r}: a column out of place (lane {entry.lane!r}, holding {held})")
                if any(i < entry.base + entry.start or i >= entry.base + len(entry.items) for i in gone):
                    found.append(f"lane {key!r}: a column's withdrawn index out of its lists")
                if not 0 <= entry.start <= len(entry.items):
                    found.append(f"lane {key!r}: a column's head {entry.start} out of its lists")
                count += len(entry.items) - entry.start - len(gone)
                weight += len(entry.items) - entry.start - len(gone)
            elif entry.__class__ is not Bulk:
                if entry.lane is not None:
                    count += 1
                    weight += entry.weight
            elif entry.lane is not None:
                count += len(entry.items) - entry.pos
                weight += len(entry.items) - entry.pos
        if count != lane.count:
            found.append(f"lane {key!r}: count {lane.count}, but {plural(count, 'item')} queued")
        if queue.weighted and not math.isclose(weight, lane.weight, abs_tol=1e-6):
            found.append(f"lane {key!r}: weight {lane.weight}, but {weight} queued")
        if lane.count < 0:
            found.append(f"lane {key!r}: negative count {lane.count}")
        total += lane.count
    if total != queue.waiting:
        found.append(f"waiting {queue.waiting}, but the lanes hold {total}")
    if queue.col is not None and (not queue.fifo0 or queue.fifo0[-1] is not queue.col):
        found.append("the open column is not the last entry of the default level")
    return found
