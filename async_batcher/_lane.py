"""A lane: the items of one batch key waiting for a batch, a FIFO per priority level (private).

The bottom of the queue's state: :mod:`~async_batcher._queue` counts over lanes, :mod:`~async_batcher._forming`
forms batches from them, and a plain ``process_many`` call (:class:`~async_batcher._sinks.Bulk`) remembers the lane
of its one entry.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable, Iterator
from typing import Any

__all__: list[str] = []


class Lane:
    """The items of one batch key waiting for a batch: a FIFO deque per priority level.

    ``count`` is the number of its items still queued; ``weight`` their total weight while weights are kept
    (:attr:`Queue.weighted`); ``left``, how many have left it so far (sent or withdrawn): ``count + left`` counts
    every item that ever arrived in the lane, without a step per item.

    The rest is the lane's own history, for the hold and the turns (:mod:`~async_batcher._policy`): when its last
    batch ended (``ended``) and its arrivals then (``arrived_at_end``), whether that batch held all its callers
    (``alone``) or at least answered a cohort that may come back together (``cohort``), until when its first caller
    back lets the loop's turns pass (``regather_until``, :func:`~async_batcher._dispatch.wake`), and, while a hold
    for the callers it answered may apply, since when (``hold_from``: it ends ``max_hold_time`` later), how long it
    waits for an arrival (``quiet``), at which count of arrivals they are all back (``hold_mark``), whether the hold
    is a probe (``probing``), and until when a hold kept its items back (``kept``).
    """

    __slots__ = (
        "alone",
        "arrived_at_end",
        "clean",
        "cohort",
        "count",
        "ended",
        "hold_from",
        "hold_mark",
        "in_flight",
        "kept",
        "key",
        "left",
        "levels",
        "order",
        "probing",
        "quiet",
        "regather_until",
        "served",
        "weight",
    )

    def __init__(self, key: Hashable) -> None:
        self.key = key
        # True while every entry of its levels is a single item still queued, its own caller's (no bulk call,
        # nothing withdrawn in place): a batch can then be formed without looking at each entry.
        self.clean = True
        self.served = 0  # when its last batch went out (a dispatch count, from 1); 0: never
        self.levels: dict[float, deque[Any]] = {}
        self.order: list[deque[Any]] = []  # the levels, best (lowest) priority first
        self.count = 0
        self.weight = 0.0
        self.left = 0
        self.in_flight = 0  # its batches in flight: a lane is kept while it has some (their end is its history)
        self.ended = self.hold_from = -math.inf
        self.hold_mark = 0
        self.quiet = 0.0  # a hold's longest wait for an arrival: QUIET of the time the batch it follows took
        self.probing = False  # its hold is a probe (the hold is off: it is tried once)
        # Until when the hold that kept its items back would have lasted (-inf: none did): a batch with an item
        # that arrived before then counts as held (BatcherStats.held).
        self.kept = -math.inf
        self.alone = False  # its last batch held all its callers (nothing else arrived while it ran)
        self.cohort = False  # its last batch answered a cohort that may come back together (_policy.answered)
        # Until when its next arrival into a free slot lets the loop turn before its batch forms (0: it does not):
        # its last batch answered a cohort and left nothing of it waiting (_dispatch.batch_ended, _dispatch.wake).
        self.regather_until = 0.0
        self.arrived_at_end = 0  # its arrivals when its last batch ended

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
