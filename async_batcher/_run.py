"""One run of a batcher: everything that lives from its start on an event loop to the end of its stop (private).

A batcher is built outside any event loop and may run many times, in one loop or several; what belongs to one run
(the loop, the queue, the batches in flight, the timer, the stop in progress) is held in one :class:`Run`, built
when the batcher binds to a loop. A batch keeps a reference to its run, so a batch that ends after its run was
stopped (a thread cannot be interrupted) touches that run only, never the next one.

The run is the bottom of the core's layers (state, then policy, execution, dispatch, lifecycle, admission, and the
public class): it imports none of them. Where it must wake a layer above, it calls what that layer gave it:
:attr:`Run.batch_ended` (the dispatcher's, set when the run is built) and :attr:`Run.on_drained` (the stop's).
"""

from __future__ import annotations

import asyncio
import contextvars
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
    from async_batcher._forming import Taken
    from async_batcher._lane import Lane
    from async_batcher.stats import _Recorder
from async_batcher._checks import plural

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
        "batch_ended",
        "batches",
        "by_keyword",
        "clock",
        "closing",
        "context",
        "deadlines",
        "dispatches",
        "drained",
        "fast_loop",
        "ident",
        "in_flight",
        "is_coroutine",
        "is_stream",
        "keyed",
        "loop",
        "new_future",
        "on_drained",
        "probe_at",
        "probe_wait",
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
        context: contextvars.Context | None = None,
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
        # The run's own context: a copy of start()'s, or an empty one when a caller's first process() started it.
        # Every batch, on_start() and on_stop() run in a copy of it of their own, never in a caller's.
        self.context = contextvars.Context() if context is None else context
        self.startup: asyncio.Task[None] | None = None  # on_start(): the first batch waits for it
        # The last batch in line for on_start(): set once it has passed, so that the batches formed after it,
        # which see on_start() done, still reach process_batch after it (in the order they were formed).
        self.start_line: asyncio.Future[None] | None = None
        self.drained: asyncio.Future[None] | None = None  # set by a stop once nothing is queued or in flight
        # The stop's: called once, as the drain ends (it starts on_stop()). Set with drained.
        self.on_drained: Callable[[], None] | None = None
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
        # When the hold may next be tried while it is off, to see whether it gathers a batch of all its lane's
        # callers (a probe).
        self.probe_at = -math.inf
        self.probe_wait = 1.0  # the wait before the next probe (it doubles after each that did not gather them)
        # The size of the default lane at which an arrival on process()'s short path wakes the dispatcher: the
        # batcher's size trigger, or during a hold the size at which everyone is back. Read only while a timer is
        # armed; the pump, which arms it, sets it first.
        self.trigger = sys.maxsize
        # -- Execution: the batches in flight, and how process_batch is called.
        self.batches: dict[Batch, None] = {}
        self.in_flight = 0
        # The dispatcher's: a batch has ended and freed its slot, having answered this many callers (the
        # dispatcher looks again). A run that never dispatches keeps the no-op.
        self.batch_ended: Callable[[Batch, int], None] = _ignore
        self.by_keyword = by_keyword  # process_batch is called as process_batch(batch=...): its parameter's name
        self.is_coroutine = is_coroutine  # process_batch is an async def: it runs as a task, else in the executor
        self.is_stream = is_stream  # process_batch is an async generator: its items are streamed (stream())

    def check_drained(self) -> None:
        """During a stop: once nothing is queued or in flight, the drain is over (at most once): ``drained`` is
        set and the stop's :attr:`on_drained` called. The callers in line for room were refused when the stop
        began."""
        if self.state is State.STOPPING and self.closing is None and not self.queue.waiting and not self.in_flight:
            if self.drained is not None:  # (set as the stop began; resolved here only, as on_drained sets closing)
                self.drained.set_result(None)
            if self.on_drained is not None:
                self.on_drained()


def _ignore(batch: Batch, callers: int) -> None:
    pass


class Batch:
    """A batch on its way: its items, one sink per caller, and what its statistics and its end need.

    ``contexts`` goes with ``sinks``: each caller's context, a snapshot taken when it submitted. ``context`` is the
    batch's own, a fresh copy of its run's: its task or its thread runs in it.
    """

    __slots__ = (
        "abandoned",
        "answered",
        "arrived_before",
        "context",
        "contexts",
        "entered",
        "futures_only",
        "handle",
        "items",
        "lane",
        "probe",
        "run",
        "sinks",
        "size",
        "started",
        "waited",
        "weights",
    )

    def __init__(self, run: Run, taken: Taken, started: float, lane: Lane) -> None:
        self.run = run
        self.lane = lane  # the lane it was taken from (a streaming batch takes more from it as it runs)
        self.items = taken.items
        self.sinks = taken.sinks
        self.contexts = taken.contexts
        self.context = run.context.copy()
        self.futures_only = taken.futures_only  # every sink is a single caller's future (no bulk call)
        # As handed to process_batch, which may keep or mutate the list (a streaming batch: the most items it held
        # at once, as items join and leave it).
        self.size = len(taken.items)
        self.started = started  # on the loop's clock, when the batch was formed
        self.waited = started - taken.oldest  # how long its oldest item waited for it
        self.handle: asyncio.Future[Any] | Any = None  # its task, or its executor's future
        self.arrived_before = lane.arrived  # the lane's arrivals before it went (the hold counts those after)
        self.answered = 0  # the calls it resolved when it ended (a caller who had left is not one; 0 for streams)
        self.probe = False  # formed by a probe of the hold (set by the dispatcher)
        self.weights = taken.weights  # each item's weight, when weights are kept (a streaming batch's budget)
        # A forced stop (or an internal error) answered its callers and freed its slot: it has no one to answer
        # now, and if it has not started in its thread, it will not.
        self.abandoned = False
        # process_batch was called (or is about to be, in its thread): what it did for the items is unknown until
        # it returns. In a thread it is set before abandoned is read, and a stop sets abandoned before it reads
        # this: whichever comes first, a batch that runs is never reported as not run.
        self.entered = False

    def is_live(self) -> bool:
        """Still in flight in its run: its slot is taken."""
        return not self.abandoned and self in self.run.batches

    def let_go(self) -> None:
        """The batch has ended: drop its task and its context, which hold it (the context's ``current_batch``), so
        that it, its items and its callers are freed at once, not when the cyclic garbage collector runs."""
        self.handle = None
        self.context = contextvars.Context()


def violations(run: Run) -> list[str]:
    """The invariants of :class:`Run` (and of its queue and deadlines) that do not hold now, described (for the
    tests)."""
    found = queue_violations(run.queue) + deadline_violations(run.deadlines)
    if run.in_flight != len(run.batches):
        found.append(f"in_flight {run.in_flight}, but {plural(len(run.batches), 'batch', 'batches')} in flight")
    if not 0 <= run.reserved <= run.awaiting_room:
        found.append(f"reserved {run.reserved} outside 0..awaiting_room={run.awaiting_room}")
    return found
