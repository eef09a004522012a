"""A lane: the items of one batch key waiting for a batch, a FIFO per priority level (private).

The bottom of the queue's state: :mod:`~async_batcher._queue` counts and forms batches over lanes, and a plain
``process_many`` call (:class:`~async_batcher._sinks.Bulk`) remembers the lane of its one entry.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterator
from typing import Any

__all__: list[str] = []


class Lane:
    """The items of one batch key waiting for a batch: a FIFO deque per priority level.

    ``count`` is the number of its items still queued; ``weight`` their total weight while weights are kept
    (:attr:`Queue.weighted`).
    """

    __slots__ = ("clean", "count", "key", "levels", "order", "served", "weight")

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

    def level(self, priority: float) -> deque[Any]:
        fifo = self.levels.get(priority)
        if fifo is None:
            fifo = self.levels[priority] = deque()
            self.order = [self.levels[p] for p in sorted(self.levels)]
        return fifo

    def entries(self) -> Iterator[Any]:
        return (entry for fifo in self.order for entry in fifo)
