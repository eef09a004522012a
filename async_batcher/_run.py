"""One run of a batcher: everything that lives from its start on an event loop to the end of its stop (private).

A batcher is built outside any event loop and may run many times, in one loop or several; what belongs to one run
(the loop, the queue, the batches in flight, the timer, the stop in progress) is held in one :class:`Run`, built
when the batcher binds to a loop. A batch keeps a reference to its run, so a batch that ends after its run was
stopped (a thread cannot be interrupted) touches that run only, never the next one.
"""

from __future__ import annotations

import asyncio
import enum
import math
import sys
import time
from collections import deque
from collections.abc import Callable, Hashable
from functools import partial
from threading import get_ident
from typing import TYPE_CHECKING, Any, cast

from async_batcher._deadlines import Deadlines
from async_batcher._deadlines import violations as deadline_violations
from async_batcher._queue import Queue
from async_batcher._queue import violations as queue_violations

if TYPE_CHECKING:
    from async_batcher._execution import Batch
    from async_batcher.stats import _Recorder

__all__: list[str] = []


class State(enum.Enum):
    """Where a run is in its life. A batcher's state is its current run's."""

    NEW = "new"  # not bound to a loop: the first process() or start() in a loop starts it
    RUNNING = "running"
    STOPPING = "stopping"  # refuses new items; drains what it holds (or a forced stop fails it), then on_stop()
    STOPPED = "stopped"  # on_stop() has run: start() or the first process() starts a new run


class Run:
    """The state of one run, set in one place: here.

    Invariants (checked by the property test through :func:`violations`):

    - ``in_flight == len(batches)``: the slots taken (a batch takes one only while a slot is free, so
      ``in_flight <= concurrency`` as long as concurrency is not lowered under it);
    - ``0 <= reserved <= awaiting_room``: room promised to woken callers is room they still wait to take;
    - the queue's own (:class:`~async_batcher._queue.Queue`) and the deadlines' own
      (:class:`~async_batcher._deadlines.Deadlines`).
    """

    __slots__ = (
        "awaiting_room",
        "batches",
        "by_keyword",
        "clock",
        "closing",
        "deadlines",
        "dispatches",
        "drained",
        "fast_loop",
        "hold_graced",
        "hold_mark",
        "hold_seen",
        "hold_until",
        "ident",
        "in_flight",
        "is_coroutine",
        "is_stream",
        "keyed",
        "loop",
        "new_future",
        "owed_mark",
        "pump_handle",
        "putters",
        "queue",
        "reserved",
        "start_line",
        "startup",
        "state",
        "stop_waiters",
        "timer",
        "timer_at",
        "timer_when",
        "trigger",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop | None,
        recorder: _Recorder,
        *,
        state: State,
        default_key: Hashable,
        keyed: bool = False,
        weighted: bool = False,
        by_keyword: bool = False,
        is_coroutine: bool = False,
        is_stream: bool = False,
    ) -> None:
        # -- The loop: its thread, its clock and its futures. For the standard loop the clock is time.monotonic and
        #    a future is made by the C class directly, to spare a Python frame per item; a loop with a clock of its
        #    own (a test's virtual clock, uvloop) is asked as always.
        # None only in a run never bound to a loop (NEW): every path that reads it checks the state or the loop first.
        self.loop: asyncio.AbstractEventLoop = cast("asyncio.AbstractEventLoop", loop)
        self.ident = get_ident()  # a run is bound from a coroutine: this is the loop's thread
        self.clock: Callable[[], float] = time.monotonic
        self.new_future: Callable[[], asyncio.Future[Any]] = asyncio.Future
        if loop is not None:
            if type(loop).time is not asyncio.BaseEventLoop.time:
                self.clock = loop.time
            self.new_future = (
                partial(asyncio.Future, loop=loop)
                if type(loop).create_future is asyncio.BaseEventLoop.create_future
                else loop.create_future
            )
        # -- Lifecycle.
        self.state = state
        self.startup: asyncio.Task[None] | None = None  # on_start(): the first batch waits for it
        # The last batch in line for on_start(): set once it has passed, so that the batches formed after it,
        # which see on_start() done, still reach process_batch after it (in the order they were formed).
        self.start_line: asyncio.Future[None] | None = None
        self.drained: asyncio.Future[None] | None = None  # set by a stop once nothing is queued or in flight
        self.closing: asyncio.Task[None] | None = None  # on_stop(), once drained
        self.stop_waiters = 0  # stop() calls awaiting closing: a failing on_stop() is theirs to raise
        # -- The fast path of process(): the loop while it applies (running, no key, no weight), else None.
        self.fast_loop: asyncio.AbstractEventLoop | None = None
        # -- What waits: the queue, and the callers in line for room in a full queue (first come, first served).
        self.keyed = keyed  # batch_key is overridden: each item is asked its key
        self.queue = Queue(default_key, recorder, weighted=weighted)
        self.putters: deque[tuple[asyncio.Future[None], int]] = deque()  # (waiter, items)
        self.awaiting_room = 0  # items of the callers in line for room, woken or not
        self.reserved = 0  # room promised to woken callers that have not queued their items yet
        # -- The callers' timeouts (timeout=, default_timeout): one timer for all of them.
        self.deadlines = Deadlines(loop)
        # -- Dispatch: one pump scheduled at a time, one timer for the next deadline.
        self.pump_handle: asyncio.Handle | None = None
        # The timer's deadline is kept here, because for a time already past uvloop's call_at returns a plain
        # Handle, which cannot tell its time.
        self.timer: asyncio.Handle | None = None
        self.timer_at = 0.0
        self.timer_when = 0.0  # the deadline of the last timer that fired
        self.dispatches = 0  # batches formed so far: the clock of Lane.served
        # The hold (max_hold_time): when a batch ends, the callers it answered may come back with their next items
        # (closed-loop clients); a free slot then waits for them. owed_mark is the count of submitted items at
        # which they are all back; hold_until, when the hold of that mark (hold_mark) ends unless it is extended:
        # hold_seen is the count of submitted items when the hold last looked, hold_graced whether its last
        # extension was for a busy loop rather than for callers that came back.
        self.owed_mark = 0
        self.hold_mark = -1
        self.hold_until = -math.inf
        self.hold_seen = 0
        self.hold_graced = False
        # The size of the default lane at which an arrival on process()'s short path wakes the dispatcher: the
        # batcher's size trigger, or during a hold the size at which everyone is back. Read only while a timer is
        # armed; the pump, which arms it, sets it first.
        self.trigger = sys.maxsize
        # -- Execution: the batches in flight, and how process_batch is called.
        self.batches: dict[Batch, None] = {}
        self.in_flight = 0
        self.by_keyword = by_keyword  # process_batch is called as process_batch(batch=...): its parameter's name
        self.is_coroutine = is_coroutine  # process_batch is an async def: it runs as a task, else in the executor
        self.is_stream = is_stream  # process_batch is an async generator: its items are streamed (stream())


def violations(run: Run) -> list[str]:
    """The invariants of :class:`Run` (and of its queue and deadlines) that do not hold now, described (for the
    tests)."""
    found = queue_violations(run.queue) + deadline_violations(run.deadlines)
    if run.in_flight != len(run.batches):
        found.append(f"in_flight {run.in_flight}, but {len(run.batches)} batches in flight")
    if not 0 <= run.reserved <= run.awaiting_room:
        found.append(f"reserved {run.reserved} outside 0..awaiting_room={run.awaiting_room}")
    return found
