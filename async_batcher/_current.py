"""The batch that ``process_batch`` is working on, as it may ask about it: :func:`current_batch` (public API, exported
from :mod:`async_batcher`).

``process_batch`` runs in a context of the batcher's own, never a caller's (contract point 13): what a caller set in
its :mod:`contextvars` (a request id, a tenant, the current OpenTelemetry span) is not there. Each caller's context
is kept with its item instead, so that per-item work can log or trace as its caller: :attr:`CurrentBatch.contexts`,
:meth:`CurrentBatch.run_as_caller`. And a long batch can ask which of its callers have left since it was formed
(cancelled, timed out) and skip their rows: :attr:`CurrentBatch.departed`, :meth:`CurrentBatch.is_live`.

A layer above execution: it reads the batch that :mod:`~async_batcher._execution` and
:mod:`~async_batcher._streaming` put in the batch's context; nothing in the core imports it.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, TypeVar

from async_batcher._checks import plural
from async_batcher._execution import current_batch as _batch_var
from async_batcher._queue import DEFAULT_KEY

if TYPE_CHECKING:
    from async_batcher._run import Batch

__all__ = ["CurrentBatch", "current_batch"]

R = TypeVar("R")


def current_batch() -> CurrentBatch:
    """The batch whose ``process_batch`` is running here: in ``process_batch`` itself (``async def``, plain ``def``
    in its thread, or an async generator), and in the tasks it starts.

    Raises:
        RuntimeError: called anywhere else.
    """
    batch = _batch_var.get()
    if batch is None:
        raise RuntimeError(
            "current_batch() is only available inside process_batch (or a task it starts, or a @batch function)"
        )
    return CurrentBatch(batch)


class CurrentBatch:
    """A batch as its ``process_batch`` sees it: its callers' contexts, who has left, its key and its wait.

    Item ``i`` is the item at index ``i`` of the list ``process_batch`` was given (for a streaming batch, whose list
    the batcher edits between steps, of the list as it is at this step). Cheap: nothing is computed before it is
    asked for.
    """

    __slots__ = ("_batch", "_owners")

    def __init__(self, batch: Batch) -> None:
        self._batch = batch
        self._owners: list[int] | None = None  # the caller of each item, when a process_many call is in the batch

    def _caller(self, i: int) -> int:
        """The index, among the batch's callers, of item ``i``'s."""
        owners: list[Any] = self._batch.sinks if self._batch.futures_only else self._owner_map()
        if not -len(owners) <= i < len(owners):
            raise IndexError(f"item {i} is not in this batch of {plural(len(owners), 'item')}")
        return i % len(owners) if self._batch.futures_only else int(owners[i])

    def _owner_map(self) -> list[int]:
        """The index of each item's caller, when a ``process_many`` call's run of items shares one."""
        if self._owners is None:
            sinks = self._batch.sinks
            self._owners = [k for k, sink in enumerate(sinks) for _ in range(sink[2] if sink.__class__ is tuple else 1)]
        return self._owners

    @property
    def size(self) -> int:
        """The number of items (for a streaming batch, at this step)."""
        return len(self._batch.sinks) if self._batch.futures_only else len(self._owner_map())

    @property
    def key(self) -> Hashable | None:
        """The batch's key (``batch_key``), or ``None`` when the batcher has no keys."""
        key = self._batch.lane.key
        return None if key is DEFAULT_KEY else key

    @property
    def waited(self) -> float:
        """Seconds its oldest item waited in the queue before the batch was formed (on the event loop's clock)."""
        return self._batch.waited

    # ------------------------------------------------------------------ the callers' contexts

    @property
    def contexts(self) -> tuple[contextvars.Context, ...]:
        """Each item's caller context, in the order of the batch: a snapshot taken when the caller submitted it.

        Read it (``contexts[i].get(request_id)``), or run code in it with :meth:`run_as_caller`; to run a coroutine
        as item ``i``'s caller, start it in a copy: ``asyncio.create_task(work(), context=contexts[i].copy())``.
        The items of one ``process_many`` call share their caller's.
        """
        batch = self._batch
        if batch.futures_only:
            return tuple(batch.contexts)
        contexts = batch.contexts
        return tuple(contexts[k] for k in self._owner_map())

    def run_as_caller(self, i: int, func: Callable[..., R], /, *args: Any, **kwargs: Any) -> R:
        """``func(*args, **kwargs)`` in a copy of item ``i``'s caller context: it logs or traces as that caller (its
        request id, its current span), and what it sets there stays there."""
        context: contextvars.Context = self._batch.contexts[self._caller(i)]
        return context.copy().run(func, *args, **kwargs)

    # ------------------------------------------------------------------ who has left

    def is_live(self, i: int) -> bool:
        """Whether item ``i``'s caller still waits for its result (for a stream, whether its stream is open).

        ``False`` is final: a caller who left (cancelled, timed out, a ``process_many`` call that failed, a forced
        stop) never comes back, so its row can be skipped (return anything in its place: nobody receives it).
        ``True`` holds at the moment of the call only: the caller may leave right after, and then its result is
        dropped.
        """
        batch = self._batch
        if batch.abandoned:
            return False
        sink = batch.sinks[self._caller(i)]
        return not (sink[0].future.done() if sink.__class__ is tuple else sink.done())

    @property
    def departed(self) -> tuple[int, ...]:
        """The indexes of the items whose callers have left, in order: :meth:`is_live` for every item, at once."""
        batch = self._batch
        if batch.abandoned:
            return tuple(range(self.size))
        if batch.futures_only:
            return tuple(i for i, sink in enumerate(batch.sinks) if sink.done())
        return tuple(i for i in range(self.size) if not self.is_live(i))

    def __repr__(self) -> str:
        return f"<CurrentBatch of {plural(self.size, 'item')}, {len(self.departed)} departed>"
