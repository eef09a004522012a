"""A batch on its way (:class:`Batch`), the batch whose ``process_batch`` runs here (:data:`current_batch`), and what
the core calls of a batcher (:class:`Hooks`) (private; the bottom of the execution layer)."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import concurrent.futures

    from async_batcher._core.forming import Taken
    from async_batcher._core.lane import Lane
    from async_batcher._core.policy import Reason

__all__: list[str] = []

# The batch whose process_batch is running, in its task (and the tasks it starts) or its thread: a call from there
# that would wait for a slot its own batch holds is refused instead of waiting forever.
current_batch: contextvars.ContextVar[Batch | None] = contextvars.ContextVar("async_batcher_batch", default=None)
thread_batch = threading.local()


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
        "context",
        "contexts",
        "entered",
        "futures_only",
        "handle",
        "items",
        "lane",
        "oldest",
        "owner",
        "reason",
        "released",
        "sinks",
        "size",
        "started",
        "tag",
        "weights",
    )

    def __init__(self, owner: object, taken: Taken, started: float, lane: Lane, reason: Reason) -> None:
        self.owner = owner  # the engine that sent it: a call from inside it to that engine is its own
        self.lane = lane  # the lane it was taken from (a streaming batch takes more from it as it runs)
        self.items = taken.items
        self.sinks = taken.sinks
        self.contexts = taken.contexts
        self.context: contextvars.Context = contextvars.Context()  # its own: set by the runner as it goes
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

    @property
    def waited(self) -> float:
        """How long its oldest item waited for it."""
        return self.started - self.oldest

    @property
    def key(self) -> Hashable:
        return self.lane.key

    def is_live(self) -> bool:
        """Still in flight: its slot is taken."""
        return not self.abandoned and not self.released

    def let_go(self) -> None:
        """The batch has ended: drop its task and its context, which hold it (the context's ``current_batch``), so
        that it, its items and its callers are freed at once, not when the cyclic garbage collector runs."""
        self.handle = None
        self.context = contextvars.Context()
