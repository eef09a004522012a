"""Timeouts: one event-loop timer for all the ``timeout=`` deadlines of a run, however many calls wait (private).

A call with a timeout could arm a loop timer of its own and cancel it when it ends. On asyncio that costs several
microseconds a call (a ``TimerHandle``, pushed on the loop's heap through comparisons written in Python, and
cancelled lazily), a quarter or more of a timed call's whole cost. Here a run keeps its deadlines on a heap of its
own, compared in C, and the loop holds one timer, for the earliest of them. A call that ends only marks its
deadline ended, in O(1): ended deadlines are dropped when the timer reaches them, or all at once when they are the
majority, and when every call with a deadline has ended the timer is cancelled (an idle batcher schedules no
wake-ups).
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Callable
from typing import Any

__all__: list[str] = []

# A deadline: [when, seq, callback, args, live]. ``seq`` makes every deadline unique, so that two never compare
# beyond it; ``live`` is False once its call has ended (or its callback has run).
WHEN, SEQ, CALLBACK, ARGS, LIVE = range(5)

# Below this many deadlines, ended ones wait for the timer to reach them rather than for a compaction.
_COMPACT_FROM = 64


class Deadlines:
    """The deadlines of one run's calls, and the one loop timer that fires their callbacks when they pass.

    Invariants (checked by the property test through :func:`violations`):

    - ``ended`` is the number of deadlines in ``heap`` whose ``live`` is False;
    - ``timer`` is armed (at ``timer_at``) while ``heap`` holds a deadline, and only then; it fires no later than
      the earliest deadline.
    """

    __slots__ = ("ended", "heap", "loop", "seq", "timer", "timer_at")

    def __init__(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self.loop = loop  # None only in a run never bound to a loop, which takes no calls
        self.heap: list[list[Any]] = []
        self.seq = 0  # deadlines added so far: the tie-break between equal times (first added, first fired)
        self.ended = 0
        self.timer: asyncio.Handle | None = None  # (uvloop's call_at gives a plain Handle for a time past)
        self.timer_at = 0.0

    def add(self, when: float, callback: Callable[..., None], *args: Any) -> list[Any]:
        """Call ``callback(*args)`` at ``when`` (on the loop's clock) unless :meth:`discard` comes first."""
        deadline = [when, self.seq, callback, args, True]
        self.seq += 1
        heapq.heappush(self.heap, deadline)
        if self.timer is None or when < self.timer_at:
            self._arm(when)
        return deadline

    def discard(self, deadline: list[Any]) -> None:
        """The call of ``deadline`` has ended: its callback must not run. A no-op if it has run already."""
        if not deadline[LIVE]:
            return
        deadline[LIVE] = False
        self.ended += 1
        heap = self.heap
        if self.ended == len(heap):  # every call with a deadline has ended: nothing left to wake up for
            self._forget_all()
        elif self.ended > len(heap) // 2 and len(heap) >= _COMPACT_FROM:
            # Mostly ended (calls that end long before their timeout): drop them, so that the heap stays the size
            # of the calls still waiting. The timer may now be early; when it fires it arms the next one.
            self.heap = [d for d in heap if d[LIVE]]
            heapq.heapify(self.heap)
            self.ended = 0

    def _forget_all(self) -> None:
        self.heap.clear()
        self.ended = 0
        self._disarm()

    def _arm(self, when: float) -> None:
        self._disarm()
        loop: Any = self.loop
        self.timer = loop.call_at(when, self._fire, when)
        self.timer_at = when

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _fire(self, when: float) -> None:
        self.timer = None
        loop: Any = self.loop
        # A timer may fire a hair before its time by the loop's clock resolution (and uvloop's clock is read once
        # per iteration): the deadline it was armed for is due.
        now = max(loop.time(), when)
        # (self.heap, not a local: a callback that ends a call may compact it into a new list.)
        while self.heap and self.heap[0][WHEN] <= now:
            deadline = heapq.heappop(self.heap)
            if not deadline[LIVE]:
                self.ended -= 1
                continue
            deadline[LIVE] = False
            try:
                deadline[CALLBACK](*deadline[ARGS])
            except Exception as exc:  # a bug in a callback must not keep the later deadlines from firing
                loop.call_exception_handler({"message": "async_batcher: error in a timeout callback", "exception": exc})
        if self.ended == len(self.heap):  # only ended calls are left (or none): nothing to wake up for
            self._forget_all()
        else:
            self._arm(self.heap[0][WHEN])


def violations(deadlines: Deadlines) -> list[str]:
    """The invariants of :class:`Deadlines` that do not hold now, described (for the tests)."""
    found: list[str] = []
    ended = sum(1 for d in deadlines.heap if not d[LIVE])
    if ended != deadlines.ended:
        found.append(f"deadlines: ended {deadlines.ended}, but {ended} ended deadlines on the heap")
    if (deadlines.timer is None) != (not deadlines.heap):
        found.append(f"deadlines: timer {deadlines.timer!r} with {len(deadlines.heap)} deadlines on the heap")
    elif deadlines.heap and deadlines.timer_at > min(d[WHEN] for d in deadlines.heap):
        found.append(f"deadlines: the timer fires at {deadlines.timer_at}, after the earliest deadline")
    return found
