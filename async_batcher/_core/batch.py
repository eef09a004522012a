"""A batch on its way (:class:`Batch`), the batch whose ``process_batch`` runs here (:data:`current_batch`), and what
the core calls of a batcher (:class:`Hooks`) (private; the bottom of the execution layer)."""

from __future__ import annotations

import asyncio
import contextvars
import math
import threading
from collections.abc import Callable, Hashable
from itertools import compress, repeat
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from async_batcher._core.sinks import SharedSink, without_departed

if TYPE_CHECKING:
    import concurrent.futures

    from async_batcher._core.forming import Taken
    from async_batcher._core.lane import Lane
    from async_batcher._core.policy import Reason

__all__: list[str] = []

# What Batch.returned holds until a call of process_batch in a thread has returned.
NOT_RETURNED: Any = object()

# The batch whose process_batch is running, in its task (and the tasks it starts) or its thread: a call from there
# that would wait for a slot its own batch holds is refused instead of waiting forever.
current_batch: contextvars.ContextVar[Batch | None] = contextvars.ContextVar("async_batcher_batch", default=None)
thread_batch = threading.local()
# The context of a batch not sent yet, or ended (no task or thread runs in it): one for all, as a new one per batch
# would cost an allocation twice a batch. (A batch's own is a fresh copy of its run's, made as it goes.)
_NO_CONTEXT = contextvars.Context()

#: Told of every batch as it goes (and of each call of a part of a failed batch) and as it ends: ``(sent, ended)``
#: (async_batcher.testing's).
Watcher: TypeAlias = "tuple[Callable[[Batch], None], Callable[[Batch], None]]"


class Hooks(Protocol):
    """What the core calls of a batcher: its ``process_batch`` and ``abandoned_error``, its name and executor."""

    name: str

    @property
    def continuous_batching(self) -> bool: ...

    def process_batch(self, batch: list[Any]) -> Any: ...

    def abandoned_error(self, batch: list[Any], error: BaseException) -> BaseException: ...

    @property
    def executor(self) -> concurrent.futures.Executor | None: ...


class Batch:
    """A batch on its way: its items, one sink per caller, and what its statistics, its policy and its end need.

    ``contexts`` goes with ``sinks``: each caller's context, a snapshot taken when it submitted. ``context`` is the
    batch's own, a fresh copy of its run's: its task or its thread runs in it.
    """

    __slots__ = (
        "abandoned",
        "answered",
        "arrivals",
        "arrived_before",
        "attempts",
        "called",
        "context",
        "contexts",
        "deadlines",
        "entered",
        "futures_only",
        "handle",
        "items",
        "kept",
        "lane",
        "oldest",
        "owner",
        "reason",
        "released",
        "returned",
        "sinks",
        "size",
        "started",
        "tag",
        "tree",
        "tries",
        "weights",
    )

    def __init__(self, owner: object, taken: Taken, started: float, lane: Lane, reason: Reason) -> None:
        self.owner = owner  # the dispatcher that sent it: a call from inside it to that dispatcher's run is its own
        self.lane = lane  # the lane it was taken from (a streaming batch takes more from it as it runs)
        self.items = taken.items
        self.sinks = taken.sinks
        self.contexts = taken.contexts
        self.context: contextvars.Context = _NO_CONTEXT  # its own: set by the runner as it goes
        self.futures_only = taken.futures_only  # every sink is a single caller's future (no bulk call)
        # As handed to process_batch, which may keep or mutate the list (a streaming batch: the most items it held
        # at once, as items join and leave it).
        self.size = len(taken.items)
        self.started = started  # on the loop's clock, when the batch was formed
        self.oldest = taken.oldest
        self.arrivals = taken.arrivals  # each item's arrival, when the engine's watchers asked for them
        self.reason = reason  # why it went
        self.handle: asyncio.Future[Any] | Any = None  # its task, or its executor's future
        self.arrived_before = lane.arrived  # the lane's arrivals before it went (the policy counts those after)
        self.answered = 0  # the calls it resolved when it ended (a caller who had left is not one; 0 for streams)
        self.tag: Any = None  # the policy's (a hold's probe)
        self.weights = taken.weights  # each item's weight, when weights are kept (a streaming batch's budget)
        # A forced stop (or an internal error) answered its callers and freed its slot: it has no one to answer
        # now, and if it has not started in its thread, it will not.
        self.abandoned = False
        self.released = False  # it has freed its slot
        # process_batch was called (or is about to be, in its thread): what it did for the items is unknown until
        # it returns. In a thread it is set before abandoned is read, and a stop sets abandoned before it reads
        # this: whichever comes first, a batch that runs is never reported as not run.
        self.entered = False
        # Each item's deadline (inf: none), tries without progress and tries, when the queue tracks them (else None).
        self.deadlines = taken.deadlines
        self.attempts = taken.attempts
        self.tries = taken.tries
        self.called = started  # when its current call of process_batch began (a part's, after a failure)
        # With failure handling on: its items as process_batch was given them (it may change the list), and, once a
        # call of it has failed, what is left to do (:class:`~async_batcher._core.parts.Tree`).
        self.kept: list[Any] | None = None
        self.tree: Any = None
        # What process_batch returned in its thread (NOT_RETURNED: not yet, or it raised), set there before its
        # executor's future is: the loop reads it without asking the future (each question takes the future's lock).
        self.returned: Any = NOT_RETURNED

    @property
    def waited(self) -> float:
        """How long its oldest item waited for it."""
        return self.started - self.oldest

    @property
    def key(self) -> Hashable:
        return self.lane.key

    @property
    def deadline(self) -> float:
        """The earliest deadline of its items whose callers still wait (``inf``: none); a shared row's is its
        callers' now."""
        if self.abandoned:
            return math.inf
        deadlines = self.deadlines
        earliest = math.inf
        if deadlines:
            earliest = min((d for d, live in zip(deadlines, self.live_items(), strict=True) if live), default=earliest)
        rows = [sink.deadline() for sink in self.sinks if isinstance(sink, SharedSink) and not sink.done()]
        return min(earliest, *rows) if rows else earliest

    def live_items(self) -> list[bool]:
        """For each item, whether its caller still waits."""
        if self.abandoned:
            return [False] * len(self.items)
        if self.futures_only:
            return [not sink.done() for sink in self.sinks]
        return [
            alive
            for sink in self.sinks
            for alive in repeat(
                not (sink[0].future.done() if sink.__class__ is tuple else sink.done()),
                sink[2] if sink.__class__ is tuple else 1,
            )
        ]

    def drop_departed(self) -> None:
        """Leave out the items whose callers have left since the batch was formed (they must not reach
        ``process_batch``), with what is kept of each (weights, deadlines, tries; a part's places in its tree)."""
        items, sinks, contexts = without_departed(self.items, self.sinks, self.contexts, futures_only=self.futures_only)
        if items is self.items:
            return
        if self.weights is not None or self.deadlines is not None or self.tree is not None or self.arrivals is not None:
            live = self.live_items()
            for name in ("weights", "deadlines", "attempts", "tries", "arrivals"):
                values = getattr(self, name)
                if values is not None:
                    setattr(self, name, list(compress(values, live)))
            if self.tree is not None:
                self.tree.part.index = list(compress(self.tree.part.index, live))
        self.items, self.sinks, self.contexts = items, sinks, contexts
        self.size = len(items)

    def take_in(self, taken: Taken) -> None:
        """Continuous batching: items just taken from the queue join this (streaming) batch, with what is kept of
        each."""
        self.items.extend(taken.items)
        self.sinks.extend(taken.sinks)
        self.contexts.extend(taken.contexts)
        if self.weights is not None:
            self.weights.extend(taken.weights or ())  # (a list: the queue was weighted when the batch formed)
        if taken.deadlines is not None:
            if self.deadlines is None:  # (the first items with a deadline came as it ran)
                self.deadlines = [math.inf] * (len(self.items) - len(taken.items))
            self.deadlines.extend(taken.deadlines)
        self.size = max(self.size, len(self.items))

    def is_live(self) -> bool:
        """Still in flight: its slot is taken."""
        return not self.abandoned and not self.released

    def let_go(self) -> None:
        """The batch has ended: drop its task and its context, which hold it (the context's ``current_batch``), so
        that it, its items and its callers are freed at once, not when the cyclic garbage collector runs."""
        self.handle = None
        self.context = _NO_CONTEXT
