"""What waits in a batcher: queue entries, lanes, and the queue that counts them (private); batches are formed from
it by :mod:`~async_batcher._forming`.

A queued single item is a small list, not an object: creating it is the one allocation per item besides its
future, and the hot path reads it by index::

    [item, sink, arrival, queued, weight, lane, index, context]

``sink`` is the caller's future, or the :class:`Bulk` of a ``process_many`` call (``index``: the item's place in
it). ``queued`` turns False when the item leaves the queue: sent in a batch, or withdrawn because its caller left
or a forced stop failed it. An entry leaves the queue exactly once; every count below changes with that step.
``context`` is a snapshot of its caller's :mod:`contextvars` context (``contextvars.copy_context()``, one C call):
the batch hands it to ``process_batch`` through :func:`async_batcher.current_batch`.

A plain ``process_many`` call (no keys, no weights) is one entry of its own, a :class:`~async_batcher._sinks.Bulk`,
sliced into batches as they go out: ``bulk.pos`` items of it have left the queue.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from async_batcher._lane import Lane
from async_batcher._sinks import Bulk

if TYPE_CHECKING:
    from async_batcher.stats import _Recorder
from async_batcher._checks import plural

__all__: list[str] = []

ITEM, SINK, ARRIVAL, QUEUED, WEIGHT, LANE, INDEX, CONTEXT = range(8)

# The key of every item when batch_key is not overridden.
DEFAULT_KEY: Hashable = object()

# The idle lanes (empty, no batch in flight, no hold) kept for their history when keys come and go: a service's
# keys (a model, a length bucket) are usually fewer; a stream of new keys (one a user) keeps no more than this.
KEEP_IDLE = 16

_ended = attrgetter("ended")


class Queue:
    """The items waiting for a batch, by lane (batch key) and, within a lane, by priority.

    Invariants, after every step (checked by the property test through :func:`violations`):

    - ``waiting == sum(lane.count for lane in lanes.values())``;
    - ``lane.count`` is the number of the lane's items still queued: its single entries whose ``queued`` is True
      plus ``len(bulk.items) - bulk.pos`` for each of its plain bulk entries;
    - ``lane.weight`` is their total weight, while ``weighted``;
    - ``recorder.exited`` grows by one for each item that leaves the queue (sent or withdrawn), once.
    """

    __slots__ = ("fifo0", "lane0", "lanes", "recorder", "waiting", "weighted")

    def __init__(self, default_key: Hashable, recorder: _Recorder, *, weighted: bool) -> None:
        self.lane0 = Lane(default_key)  # the lane of every item when batch_key is not overridden
        self.fifo0 = self.lane0.level(0)  # its priority-0 level: where the common case appends
        self.lanes: dict[Hashable, Lane] = {default_key: self.lane0}
        self.waiting = 0
        self.weighted = weighted  # lane.weight is kept (items have weights, or a weight limit is set)
        self.recorder = recorder

    # ------------------------------------------------------------------ entering

    def lane(self, key: Hashable) -> Lane:
        lane = self.lanes.get(key)
        if lane is None:
            lane = self.lanes[key] = Lane(key)
        return lane

    def push(self, entry: list[Any], priority: float) -> None:
        """Queue a single item's entry (its lane and weight are in it)."""
        lane = entry[LANE]
        lane.level(priority).append(entry)
        if entry[SINK].__class__ is Bulk:
            lane.clean = False
        lane.count += 1
        if self.weighted:
            lane.weight += entry[WEIGHT]
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

    def withdraw(self, entry: list[Any]) -> bool:
        """Take a queued item out: its caller left, or a stop failed it; it is never sent. False if already out."""
        if not entry[QUEUED]:
            return False
        entry[QUEUED] = False
        lane = entry[LANE]
        lane.clean = False  # the entry stays in its level until the dispatcher reaches it
        lane.count -= 1
        lane.left += 1
        if self.weighted:
            lane.weight -= entry[WEIGHT]
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
                if entry.__class__ is list:
                    sink = entry[SINK]
                    if self.withdraw(entry) and not sink.done():
                        sinks.append(sink if sink.__class__ is not Bulk else (sink, entry[INDEX], 1))
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
            if entry.__class__ is list:
                if entry[QUEUED]:
                    if not entry[SINK].done():
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
                oldest = min(oldest, head[ARRIVAL] if head.__class__ is list else head.arrival)
        return oldest

    def newest(self, lane: Lane) -> float:
        """Arrival time of the lane's newest queued entry (``-inf`` if none)."""
        newest = -math.inf
        for fifo in lane.order:
            if fifo:
                tail = fifo[-1]
                newest = max(newest, tail[ARRIVAL] if tail.__class__ is list else tail.arrival)
        return newest

    def drop_empty_lanes(self, held_since: float) -> None:
        """Keys come and go: forget the lanes that hold nothing, have no batch in flight and no hold waiting for
        their callers (one that began after ``held_since``), all but the :data:`KEEP_IDLE` whose last batch ended
        last; the default lane stays. A key used again finds its lane's history (when its last batch ended, the
        rate since: the hold's and the turns' evidence, :mod:`~async_batcher._policy`), as the default lane's
        callers do; a stream of new keys keeps at most that many idle lanes. A lane kept idle lets go of what its
        levels still hold (the entries of callers who left, which the dispatcher would drop on reaching them) and
        of the levels themselves."""
        if len(self.lanes) == 1:
            return
        idle: list[Lane] = []
        for lane in self.lanes.values():
            if lane.count or lane.in_flight or lane.hold_from > held_since or lane is self.lane0:
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
                if entry.__class__ is list:
                    lane.weight += entry[WEIGHT] if entry[QUEUED] else 0.0
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
            if entry.__class__ is list:
                if entry[QUEUED]:
                    count += 1
                    weight += entry[WEIGHT]
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
