"""What a failed call leads to, for one run (private; owned by the engine, told by the runner).

The runner's recovery (:mod:`~async_batcher._core.recovery`) reports through the
:class:`~async_batcher._core.recovery.Feedback` protocol, which :class:`RunFeedback` implements: items to try
again after a backoff (:class:`~async_batcher._core.retrying.Backoffs`), the retry budget's balance
(:class:`~async_batcher._core.retrying.Budget`), and each lane's learned ceiling (:mod:`~async_batcher._core.ceiling`).
An item whose backoff is over goes back to the engine through the ``requeue`` callback it was given.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Protocol

from async_batcher._core import ceiling
from async_batcher._core.lane import Lane, WeightedEntry
from async_batcher._core.policy import UNLIMITED
from async_batcher._core.queue import Queue
from async_batcher._core.retrying import Backoffs, Budget

if TYPE_CHECKING:
    import asyncio

    from async_batcher._core.batch import Batch
    from async_batcher._core.failures import RetryPolicy, SplitOn

__all__ = ["Feedback", "RunFeedback"]


class Feedback(Protocol):
    """What the runner tells the engine of a batch's failures (:class:`RunFeedback` implements it)."""

    def retry_later(self, key: Hashable, entries: list[WeightedEntry], delay: float) -> None:
        """Queue ``entries`` again at the head of ``key``'s lane in ``delay`` seconds."""

    def retries_allowed(self, n: int) -> int:
        """How many of ``n`` retries the retry budget allows now (spent)."""

    def retries_earned(self, n: int) -> None:
        """``n`` items were answered: the retry budget earns its share."""

    def lowered(self, lane: Lane, size: int, weight: float) -> float:
        """A call of ``size`` items (``weight``) ran out of memory: lower the lane's ceiling; return it."""

    def held(self, lane: Lane, size: int, weight: float) -> None:
        """A call of ``size`` items (``weight``) of the lane succeeded."""

    def settled(self, lane: Lane, size: int, weight: float) -> None:
        """A batch's splits are over; the largest of its parts that succeeded was ``size`` items (``weight``)."""

    def calling(self, batch: Batch) -> None:
        """A part of a failed batch is about to be called, in the batch's slot (it goes, as a batch does)."""


class RunFeedback:
    """The retries and ceilings of one run, under the settings :meth:`configure` gave last."""

    __slots__ = ("backoffs", "budget", "calling", "loop", "queue", "requeue", "retry", "split")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        queue: Queue,
        requeue: Callable[[Hashable, Sequence[WeightedEntry]], None],
        calling: Callable[[Batch], None],
    ) -> None:
        self.loop = loop
        self.queue = queue
        self.requeue = requeue  # back to the head of the key's lane, or failed if the run no longer dispatches
        self.calling = calling  # a part of a failed batch goes: the engine's watchers see it (Feedback.calling)
        self.backoffs = Backoffs()  # items waiting out their backoff before they are tried again
        self.budget = Budget()  # the retry budget's balance
        self.retry: RetryPolicy | None = None
        self.split: SplitOn | None = None

    def configure(self, retry: RetryPolicy | None, split: SplitOn | None) -> None:
        self.retry, self.split = retry, split
        if split is not None:
            self.queue.ceilings.limit = split.keys_kept
        else:
            for lane in self.queue.lanes.values():  # split_on turned off: no ceiling left
                lane.ceiling, lane.weight_ceiling, lane.capacity = UNLIMITED, math.inf, None
            self.queue.ceilings.clear()

    def retry_later(self, key: Hashable, entries: list[WeightedEntry], delay: float) -> None:
        """Items that failed transiently go back to the head of ``key``'s lane (and join its next batch) once
        ``delay`` seconds have passed; meanwhile they wait out of the queue (a stop's drain waits for them)."""
        if delay <= 0:
            self.requeue(key, entries)
            return
        self.backoffs.add(self.loop, delay, entries, partial(self._backoff_over, key))

    def _backoff_over(self, key: Hashable, group: int) -> None:
        self.requeue(key, self.backoffs.take(group))

    def retries_allowed(self, n: int) -> int:
        policy = self.retry
        if policy is None or policy.budget is None:
            return n
        return self.budget.spend(policy.budget, n, self.loop.time())

    def retries_earned(self, n: int) -> None:
        policy = self.retry
        if policy is not None and policy.budget is not None:
            self.budget.earn(policy.budget, n, self.loop.time())

    def lowered(self, lane: Lane, size: int, weight: float) -> float:
        split = self.split
        if split is None:  # (split_on was turned off while the batch ran: its parts are halves, no ceiling is kept)
            return weight / 2 if self.queue.weighted else float(max(1, size // 2))
        return ceiling.lower(lane, size, weight, weighted=self.queue.weighted, grow_by=split.grow_by)

    def held(self, lane: Lane, size: int, weight: float) -> None:
        split = self.split
        if split is not None:
            ceiling.held(
                lane,
                size,
                weight,
                weighted=self.queue.weighted,
                grow_after=split.grow_after,
                full_share=split.full_share,
            )

    def settled(self, lane: Lane, size: int, weight: float) -> None:
        if self.split is not None:
            ceiling.settle(lane, size, weight, weighted=self.queue.weighted)

    def ceilings(self) -> dict[Hashable, float] | None:
        """The ceiling of each lane that has one, by key (``None``: the default lane's); None without split_on."""
        if self.split is None:
            return None
        found: dict[Hashable, float] = dict(self.queue.ceilings.ceilings(weighted=self.queue.weighted))
        for key, lane in self.queue.lanes.items():
            at = ceiling.ceiling_of(lane, weighted=self.queue.weighted)
            if at is not None:
                found[None if lane is self.queue.lane0 else key] = at
        return found
