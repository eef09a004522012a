"""What waits for a batch: the queued item (:class:`Entry`), the lane of one batch key (:class:`Lane`), and the
:class:`Queue` that counts them (private; the bottom of the core's state).

A single item waits as an :class:`Entry`: its item, its *sink* (the caller's future, or the
:class:`~async_batcher._core.sinks.Bulk` of a ``process_many`` call), its arrival on the loop's clock, its lane while
it is queued (``None`` once it has left: sent in a batch, or withdrawn because its caller left or a stop failed it),
and a snapshot of its caller's :mod:`contextvars` context, which ``process_batch`` reads through
:func:`async_batcher.current_batch`. An entry leaves the queue exactly once; every count below changes with that step.
An item with a weight of its own, or one item of a ``process_many`` call with keys or weights, is a
:class:`WeightedEntry`, which also keeps its weight and its place in its call.

A plain ``process_many`` call (no keys, no weights) is one entry of its own, a
:class:`~async_batcher._core.sinks.Bulk`, sliced into batches as they go out: ``bulk.pos`` items of it have left.
Batches are formed from the queue by :mod:`~async_batcher._core.forming`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable, Iterator
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from async_batcher._core.sinks import Bulk

if TYPE_CHECKING:
    from async_batcher.stats import _Recorder

__all__: list[str] = []

# The key of every item when batch_key is not overridden.
DEFAULT_KEY: Hashable = object()

# The idle lanes (empty, no batch in flight) kept for their history when keys come and go: a service's keys (a
# model, a length bucket) are usually fewer; a stream of new keys (one a user) keeps no more than this.
KEEP_IDLE = 16

_ended = attrgetter("ended")


class Entry:
    """One item waiting for a batch (see the module's docstring). Its weight is 1."""

    __slots__ = ("arrival", "context", "item", "lane", "sink")
    weight = 1.0  # (a WeightedEntry keeps its own)
    index = 0  # its place in its process_many call (a WeightedEntry's); a single call's item is alone

    def __init__(self, item: Any, sink: Any, arrival: float, lane: Lane, context: Any) -> None:
        self.item = item
        self.sink = sink
        self.arrival = arrival
        self.lane: Lane | None = lane  # None once it has left the queue
        self.context = context


class WeightedEntry(Entry):
    """An entry with a weight of its own, or one item of a ``process_many`` call (``index``: its place in it)."""

    __slots__ = ("index", "weight")

    def __init__(
        self, item: Any, sink: Any, arrival: float, lane: Lane, context: Any, *, weight: float, index: int = 0
    ) -> None:
        super().__init__(item, sink, arrival, lane, context)
        self.weight = weight
        self.index = index


class Lane:
    """The items of one batch key waiting for a batch, a FIFO deque per priority level, and what the engine and the
    dispatch policy know of the lane.

    Counts: ``count``, its items still queued; ``weight``, their total weight while weights are kept
    (:attr:`Queue.weighted`); ``left``, how many have left it so far (sent or withdrawn), so that ``arrived`` counts
    every item that ever arrived in it. The engine's: ``served``, the dispatch count of its last batch (never
    served: just before the count when it came): the due lane served longest ago goes first; ``in_flight``, its
    batches in flight;
    ``ended`` and ``arrived_at_end``, when its last batch ended and its arrivals then; ``trigger``, the count at
    which an arrival makes it due at once (the policy's, as the dispatcher last asked it); ``watch``, whether the
    policy asked to see its next arrival. ``memo`` is the dispatch policy's own record of the lane, opaque here.
    """

    __slots__ = (
        "arrived_at_end",
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
        "watch",
        "weight",
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
        self.watch = False
        self.memo: Any = None

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
                newest = max(newest, fifo[-1].arrival)
        return newest


class Queue:
    """The items waiting for a batch, by lane (batch key) and, within a lane, by priority.

    Invariants, after every step (checked by the property test through :func:`violations`):

    - ``waiting == sum(lane.count for lane in lanes.values())``;
    - ``lane.count`` is the number of the lane's items still queued: its single entries whose ``lane`` is set plus
      ``len(bulk.items) - bulk.pos`` for each of its plain bulk entries;
    - ``lane.weight`` is their total weight, while ``weighted``;
    - ``recorder.exited`` grows by one for each item that leaves the queue (sent or withdrawn), once.
    """

    __slots__ = ("dispatches", "fifo0", "lane0", "lanes", "recorder", "waiting", "weighted")

    def __init__(self, recorder: _Recorder, *, weighted: bool) -> None:
        self.dispatches = 0  # batches formed so far: the clock of Lane.served
        self.lane0 = Lane(DEFAULT_KEY, self, 0)  # the lane of every item when batch_key is not overridden
        self.fifo0 = self.lane0.level(0)  # its priority-0 level: where the common case appends
        self.lanes: dict[Hashable, Lane] = {DEFAULT_KEY: self.lane0}
        self.waiting = 0
        self.weighted = weighted  # lane.weight is kept (items have weights, or a weight limit is set)
        self.recorder = recorder

    # ------------------------------------------------------------------ entering

    def lane(self, key: Hashable) -> Lane:
        lane = self.lanes.get(key)
        if lane is None:
            # Never served: it counts as served just before the batch formed last, so that it goes before the lanes
            # served since, and after those that have waited longer.
            lane = self.lanes[key] = Lane(key, self, self.dispatches - 0.5)
        return lane

    def push(self, entry: Entry, priority: float) -> None:
        """Queue a single item's entry (its lane and weight are in it)."""
        lane: Any = entry.lane
        lane.level(priority).append(entry)
        if entry.sink.__class__ is Bulk:
            lane.clean = False
        lane.count += 1
        if self.weighted:
            lane.weight += entry.weight
        self.waiting += 1

    def push_bulk(self, bulk: Bulk, priority: float) -> None:
        """Queue a plain ``process_many`` call as one entry of the default lane."""
        lane = self.lane0
        lane.level(priority).append(bulk)
        lane.clean = False
        n = len(bulk.items)
        lane.count += n
        if self.weighted:
            lane.weight += n
        self.waiting += n

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
        self.recorder.exited += 1
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
            self.recorder.exited += unsent
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
        return sinks

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

    def oldest(self, lane: Lane) -> float:
        """Arrival time of the lane's oldest waiting item (``inf`` if its callers all left)."""
        oldest = math.inf
        for fifo in lane.order:
            head = self.live_head(fifo)
            if head is not None:
                oldest = min(oldest, head.arrival)
        return oldest

    def drop_empty_lanes(self) -> None:
        """Keys come and go: forget the lanes that hold nothing and have no batch in flight, all but the
        :data:`KEEP_IDLE` whose last batch ended last; the default lane stays. A key used again finds its lane's
        history (when its last batch ended, the rate since, the policy's memo), as the default lane's callers do; a
        stream of new keys keeps at most that many idle lanes. A lane kept idle lets go of what its levels still
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
        if len(idle) > KEEP_IDLE:
            idle.sort(key=_ended)
            for lane in idle[: len(idle) - KEEP_IDLE]:
                # (A key whose hash changed since its call, against the contract of a dict key, no longer finds its
                # lane, or finds another: that lane stays, rather than failing the pump or dropping the other.)
                if self.lanes.get(lane.key) is lane:
                    del self.lanes[lane.key]

    def keep_weights(self) -> None:
        """Weights come into play on a running batcher: count the queued items' weights from now on."""
        self.weighted = True
        for lane in self.lanes.values():
            lane.weight = 0.0
            for entry in lane.entries():
                if entry.__class__ is not Bulk:
                    lane.weight += entry.weight if entry.lane is not None else 0.0
                elif entry.lane is not None:
                    lane.weight += len(entry.items) - entry.pos


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
            found.append(f"lane {key!r}: count {lane.count}, but {count} items queued")
        if queue.weighted and not math.isclose(weight, lane.weight, abs_tol=1e-6):
            found.append(f"lane {key!r}: weight {lane.weight}, but {weight} queued")
        if lane.count < 0:
            found.append(f"lane {key!r}: negative count {lane.count}")
        total += lane.count
    if total != queue.waiting:
        found.append(f"waiting {queue.waiting}, but the lanes hold {total}")
    return found
