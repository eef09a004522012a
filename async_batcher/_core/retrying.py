"""Items waiting out their backoff before they are tried again, and the retry budget's balance (private; state, owned
by the engine).

A retried item has left the queue with its batch; it waits here, out of the queue and out of any batch, for its
backoff (:class:`Backoffs`), then goes back to the head of its lane (:meth:`Queue.push_front
<async_batcher._core.queue.Queue.push_front>`). A stop's drain waits for it; a forced stop fails it; once its caller
has left, nothing waits for it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from async_batcher._core.sinks import Bulk

if TYPE_CHECKING:
    import asyncio

    from async_batcher._core.failures import RetryBudget
    from async_batcher._core.lane import Entry

__all__: list[str] = []


class _Group:
    """Items that wait out one backoff together: their timer, and the futures of their callers (a ``process_many``
    call's once), of which ``live`` still wait."""

    __slots__ = ("entries", "futures", "handle", "left", "live")

    def __init__(self, handle: asyncio.TimerHandle, entries: Sequence[Any], left: Callable[[Any], None]) -> None:
        self.handle = handle
        self.entries = entries
        self.futures = list({id(future): future for future in map(_future_of, entries)}.values())
        self.left = left  # told when one of them is done: its caller left (or had its answer another way)
        self.live = len(self.futures)
        for future in self.futures:
            future.add_done_callback(left)

    def let_go(self) -> None:
        for future in self.futures:
            future.remove_done_callback(self.left)


class Backoffs:
    """The groups of items waiting for their next try, each with its loop timer. ``waiting``: their items.

    A group whose callers have all left ends at once, its timer cancelled: an idle batcher keeps no timer, and a
    stop's drain does not wait for a backoff no one waits for."""

    __slots__ = ("count", "groups", "waiting")

    def __init__(self) -> None:
        self.groups: dict[int, _Group] = {}
        self.waiting = 0
        self.count = 0  # the groups so far: each its own key (an id could be reused once a group is gone)

    def add(
        self,
        loop: asyncio.AbstractEventLoop,
        delay: float,
        entries: Sequence[Entry],
        due: Callable[[int], None],
    ) -> None:
        """Call ``due(key)`` in ``delay`` seconds for ``entries`` (the key :meth:`take` gives them back for), or as
        soon as their callers have all left."""
        self.count += 1
        key = self.count
        self.groups[key] = _Group(loop.call_later(delay, due, key), entries, partial(self._left, key, due))
        self.waiting += len(entries)

    def _left(self, key: int, due: Callable[[int], None], _: Any) -> None:
        group = self.groups.get(key)
        if group is None:
            return
        group.live -= 1
        if group.live <= 0:  # no one left to try again for: its backoff is over now
            group.handle.cancel()
            due(key)

    def take(self, key: int) -> Sequence[Any]:
        """The entries of a group whose backoff is over (none if a stop took them already)."""
        group = self.groups.pop(key, None)
        if group is None:
            return []
        group.let_go()
        self.waiting -= len(group.entries)
        return group.entries

    def clear(self) -> list[Any]:
        """Every entry waiting (a forced stop): their timers cancelled."""
        entries: list[Any] = []
        for group in self.groups.values():
            group.handle.cancel()
            group.let_go()
            entries.extend(group.entries)
        self.groups.clear()
        self.waiting = 0
        return entries


class Budget:
    """The retry budget's balance (:class:`~async_batcher.failures.RetryBudget`): earned by items answered and by
    the time passing, spent by retries, decaying over the budget's window. It starts with the floor's window."""

    __slots__ = ("balance", "last")

    def __init__(self) -> None:
        self.balance: float | None = None  # (None: full, set at the first use, when the budget is known)
        self.last = 0.0

    def _now(self, budget: RetryBudget, now: float) -> float:
        steady = budget.floor * budget.window
        if self.balance is None:
            self.balance, self.last = steady, now
            return steady
        elapsed = now - self.last
        if elapsed > 0:
            keep = math.exp(-elapsed / budget.window)
            self.balance = self.balance * keep + steady * (1 - keep)
            self.last = now
        return self.balance

    def earn(self, budget: RetryBudget, n: int, now: float) -> None:
        self.balance = self._now(budget, now) + n * budget.ratio

    def spend(self, budget: RetryBudget, n: int, now: float) -> int:
        """How many of ``n`` retries the balance allows (spent)."""
        allowed = min(n, max(0, int(self._now(budget, now))))
        self.balance = self._now(budget, now) - allowed
        return allowed


def sink_of(entry: Any) -> Any:
    """What a caller awaits for an entry, as a batch keeps it: its future, or ``(bulk, index, 1)``."""
    sink = entry.sink
    return (sink, entry.index, 1) if sink.__class__ is Bulk else sink


def _future_of(entry: Any) -> Any:
    """The future an entry's caller awaits: its own, or its ``process_many`` call's."""
    sink = entry.sink
    return sink.future if sink.__class__ is Bulk else sink
