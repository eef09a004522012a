"""What waits for a batch: the :class:`Queue` of the lanes (:mod:`~async_batcher._core.lane`), which counts their
entries as they come and leave (private). Every count changes with the one step in which an entry leaves.

A plain ``process_many`` call (no keys, no weights) is one entry of its own, a
:class:`~async_batcher._core.sinks.Bulk`, sliced into batches as they go out: ``bulk.pos`` items of it have left.
Batches are formed from the queue by :mod:`~async_batcher._core.forming`.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING, Any

from async_batcher._core.ceiling import Kept
from async_batcher._core.lane import Entry, Lane
from async_batcher._core.sinks import Bulk, deadline_of

if TYPE_CHECKING:
    from async_batcher.stats import _Recorder
from async_batcher._checks import plural

__all__: list[str] = []

# The key of every item when batch_key is not overridden.
DEFAULT_KEY: Hashable = object()

_ended = attrgetter("ended")
_first = itemgetter(0)


def _ignore(entry: Any) -> None:
    pass


class Queue:
    """The items waiting for a batch, by lane (batch key) and, within a lane, by priority.

    Invariants, after every step (checked by the property test through :func:`violations`):

    - ``waiting == sum(lane.count for lane in lanes.values())``;
    - ``lane.count`` is the number of the lane's items still queued: its single entries whose ``lane`` is set plus
      ``len(bulk.items) - bulk.pos`` for each of its plain bulk entries;
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
        "dispatches",
        "dues",
        "dues_latency",
        "dues_seq",
        "expire",
        "fifo0",
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
        # Each queued item's due, (due, seq, entry), from the first time the whole queue's earliest is asked (a late
        # refusal's), with the latency budget it was computed for; seq: the tie-break (entries are never compared).
        self.dues: list[tuple[float, int, Any]] | None = None
        self.dues_latency = math.inf
        self.dues_seq = 0

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

    def push(self, entry: Entry, priority: float) -> None:
        """Queue a single item's entry (its lane and weight are in it)."""
        lane: Any = entry.lane
        lane.level(priority).append(entry)
        if entry.sink.__class__ is Bulk:
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
            self._note_due(entry)

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
                self._note_due(entry)

    def push_bulk(self, bulk: Bulk, priority: float) -> None:
        """Queue a plain ``process_many`` call as one entry of the default lane."""
        lane = self.lane0
        lane.level(priority).append(bulk)
        lane.clean = False
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
            self._note_due(bulk)

    # ------------------------------------------------------------------ leaving without a batch

    def withdraw(self, entry: Entry) -> bool:
        """Take a queued item out: its caller left, or a stop failed it; it is never sent. False if already out."""
        lane = entry.lane
        if lane is None:
            return False
        entry.lane = None
        lane.clean = False  # the entry stays in its level until the dispatcher reaches it
        lane.count -= 1
        lane.left += 1
        if self.weighted:
            lane.weight -= entry.weight
        self.waiting -= 1
        self.recorder.left(1)
        self.changes += 1
        return True

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
                if entry.__class__ is not Bulk:
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
        self.changes += 1
        if self.dues is not None:
            self.dues.clear()
        return sinks

    def deadline_moved(self, entry: Entry) -> None:
        """A queued item's deadline moved (a shared row's callers came or left)."""
        self.changes += 1
        if self.dues is not None:
            self._note_due(entry)

    # ------------------------------------------------------------------ looking

    def live_head(self, fifo: deque[Any]) -> Any:
        """The first entry of a level still waiting; drops the entries before it that have left."""
        while fifo:
            entry = fifo[0]
            if entry.__class__ is not Bulk:
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

    def waiting_now(self) -> list[Any]:
        """The entries queued now (a plain ``process_many`` call's one entry): what a flush sends
        (:meth:`still_queued`)."""
        return [entry for lane in self.lanes.values() for entry in lane.entries() if entry.lane is not None]

    def still_queued(self, entries: list[Any]) -> dict[Lane, int]:
        """Of ``entries`` (:meth:`waiting_now`), the items still queued whose callers wait, by lane."""
        found: dict[Lane, int] = {}
        for entry in entries:
            lane = entry.lane
            if lane is None:
                continue
            if entry.__class__ is Bulk:
                n = 0 if entry.future.done() else len(entry.items) - entry.pos
            else:
                n = 0 if entry.sink.done() else 1
            if n > 0:
                found[lane] = found.get(lane, 0) + n
        return found

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
        as items come: entries that left, or whose due moved, are dropped as they reach its top, so that departures
        cost no look at the rest of the queue. The heap is made (again) at the first call, for a new latency budget,
        and when it holds more than twice what is queued."""
        dues = self.dues
        if dues is None or latency != self.dues_latency or len(dues) > 2 * self.waiting + 64:
            dues = self._dues_made(latency)
        while dues:
            due, _, entry = dues[0]
            now_due, n = due_of(entry, latency)
            if not n:  # it left (sent, withdrawn)
                heapq.heappop(dues)
            elif now_due != due:  # its caller left, or a shared row's deadline moved
                self.dues_seq += 1
                heapq.heapreplace(dues, (now_due, self.dues_seq, entry))
            else:
                return due
        return math.inf

    def _dues_made(self, latency: float) -> list[tuple[float, int, Any]]:
        self.dues, self.dues_latency = [], latency
        for lane in self.lanes.values():
            if lane.count:
                for entry in lane.entries():
                    self._note_due(entry)
        heapq.heapify(self.dues)
        return self.dues

    def _note_due(self, entry: Any) -> None:
        due, n = due_of(entry, self.dues_latency)
        if n and self.dues is not None:
            self.dues_seq += 1
            heapq.heappush(self.dues, (due, self.dues_seq, entry))

    def earliest_due(self, count: int, latency: float) -> float:
        """The earliest deadline of the last ``count`` items queued (by arrival, the whole queue seen as one line),
        each item due by its caller's deadline (a shared row's: its callers' now) or ``latency`` seconds after its
        arrival, whichever comes first; an item whose caller has left is due never. ``inf``: none is due."""
        found: list[tuple[float, float, int]] = []  # (arrival, due, items) of the last entries of each level
        for lane in self.lanes.values():
            if not lane.count:
                continue
            for fifo in lane.order:
                seen = 0
                for entry in reversed(fifo):
                    if seen >= count:
                        break
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


def due_of(entry: Any, latency: float) -> tuple[float, int]:
    """A queued entry's due (its caller's deadline, a shared row's callers' now, or ``latency`` seconds after its
    arrival, whichever comes first; a caller that has left has no deadline) and how many items of it are queued (0:
    it left)."""
    if entry.__class__ is Bulk:
        n = len(entry.items) - entry.pos if entry.lane is not None else 0
        deadline = math.inf if entry.future.done() else entry.deadline
    else:
        n = 0 if entry.lane is None else 1
        sink = entry.sink
        deadline = math.inf if sink.done() else deadline_of(sink, entry.deadline)
    return min(deadline, entry.arrival + latency), n


def violations(queue: Queue) -> list[str]:
    """The invariants of :class:`Queue` that do not hold now, described (for the tests)."""
    found: list[str] = []
    total = 0
    for key, lane in queue.lanes.items():
        count = 0
        weight = 0.0
        for entry in lane.entries():
            if entry.__class__ is not Bulk:
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
    return found
