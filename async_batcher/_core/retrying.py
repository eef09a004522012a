"""Items waiting out their backoff before they are tried again, and the retry budget's balance (private; state, owned
by the engine).

A retried item has left the queue with its batch; it waits here, out of the queue and out of any batch, for its
backoff (:class:`Backoffs`), then goes back to the head of its lane (:meth:`Queue.push_front
<async_batcher._core.queue.Queue.push_front>`). A stop's drain waits for it; a forced stop fails it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from async_batcher._core.sinks import Bulk

if TYPE_CHECKING:
    import asyncio

    from async_batcher._core.failures import RetryBudget
    from async_batcher._core.lane import Entry

__all__: list[str] = []


class Backoffs:
    """The groups of items waiting for their next try, each with its loop timer. ``waiting``: their items."""

    __slots__ = ("groups", "waiting")

    def __init__(self) -> None:
        self.groups: dict[int, tuple[asyncio.TimerHandle, Sequence[Any]]] = {}
        self.waiting = 0

    def add(
        self,
        loop: asyncio.AbstractEventLoop,
        delay: float,
        entries: Sequence[Entry],
        due: Callable[[int], None],
    ) -> None:
        """Call ``due(key)`` in ``delay`` seconds for ``entries`` (the key :meth:`take` gives them back for)."""
        key = id(entries)
        self.groups[key] = (loop.call_later(delay, due, key), entries)
        self.waiting += len(entries)

    def take(self, key: int) -> Sequence[Any]:
        """The entries of a group whose backoff is over (none if a stop took them already)."""
        group = self.groups.pop(key, None)
        if group is None:
            return []
        self.waiting -= len(group[1])
        return group[1]

    def clear(self) -> list[Any]:
        """Every entry waiting (a forced stop): their timers cancelled."""
        entries: list[Any] = []
        for handle, group in self.groups.values():
            handle.cancel()
            entries.extend(group)
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
