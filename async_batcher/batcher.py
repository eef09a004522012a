"""``AsyncBatcher``: many concurrent ``await batcher.process(item)`` become few ``process_batch(batch)`` calls."""

from __future__ import annotations

import abc
import asyncio
import concurrent.futures
import inspect
import logging
import math
import sys
import time
import warnings
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Iterable, Sequence
from functools import partial
from itertools import repeat
from operator import itemgetter, setitem
from threading import get_ident
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar, cast

from async_batcher._checks import finite_at_least, is_number
from async_batcher._queue import (
    ARRIVAL,
    INDEX,
    ITEM,
    LANE,
    QUEUED,
    SINK,
    WEIGHT,
    Bulk,
    Lane,
    consume,
    deliver,
    fail_sinks,
    future_done,
    without_departed,
)
from async_batcher.adaptive import AdaptiveWait, AdaptiveWaitState
from async_batcher.exceptions import (
    AsyncBatchException,
    BatcherStoppedError,
    BatchSizeMismatchError,
    ProcessBatchCancelledError,
    QueueFullException,
)
from async_batcher.stats import BatcherStats, _Recorder
from async_batcher.threads import LoopThread, call_blocking, refuse_on_loop_thread

if TYPE_CHECKING:
    from concurrent.futures import Executor
    from types import TracebackType
    from typing import Self

__all__ = ["AsyncBatcher"]

T = TypeVar("T")
R = TypeVar("R")

logger = logging.getLogger("async_batcher")

_NEW: Final = "new"
_RUNNING: Final = "running"
_STOPPING: Final = "stopping"
_STOPPED: Final = "stopped"

# "No limit" as a number the hot path can compare against without a branch.
_UNLIMITED: Final = sys.maxsize


# The key of every item when batch_key is not overridden.
_NO_KEY: Final = object()

_item_of = itemgetter(ITEM)
_sink_of = itemgetter(SINK)
_queued_of = itemgetter(QUEUED)
_popleft = deque.popleft


_InFlight = asyncio.Future[Any] | concurrent.futures.Future[Any]
# What the executor returns for a batch that a forced stop abandoned before it started.
_ABANDONED: Final = object()


class _Batch:
    """A batch on its way: its items, their callers, and what its statistics and its end need."""

    __slots__ = ("abandoned", "futures_only", "generation", "items", "sinks", "started", "waited")

    def __init__(
        self, items: list[Any], sinks: list[Any], futures_only: bool, started: float, waited: float, generation: int
    ) -> None:
        self.items = items
        self.sinks = sinks
        self.futures_only = futures_only  # every sink is a single caller's future (no bulk call)
        self.started = started  # on the loop's clock, when the batch was formed
        self.waited = waited  # how long its oldest item waited for it
        self.generation = generation  # the run it belongs to
        self.abandoned = False  # a forced stop answered its callers: if it has not started in its thread, it won't


def _succeeded(task: asyncio.Task[None]) -> bool:
    return task.done() and not task.cancelled() and task.exception() is None


def _call_soon_on(loop: asyncio.AbstractEventLoop, callback: Callable[[Any], None], future: Any) -> None:
    """An executor future's done-callback (in the executor's thread): hand ``future`` to ``callback`` on ``loop``."""
    try:
        loop.call_soon_threadsafe(callback, future)
    except RuntimeError:  # the loop is closed: the callers went with it
        pass


class AsyncBatcher(abc.ABC, Generic[T, R]):
    """Collects the items of concurrent :meth:`process` calls and hands them to :meth:`process_batch` in batches.

    Subclass it and implement :meth:`process_batch`; then ``await batcher.process(item)`` from any number of
    tasks. The contract:

    1. **Dispatch.** A batch goes out as soon as a concurrency slot is free and either ``max_batch_size`` items
       are waiting or the oldest waiting item has waited ``max_queue_time`` seconds, measured from *its arrival*
       on the event loop's clock. A free slot never sits idle while one of those holds. ``max_queue_time=0``
       sends whatever is waiting the moment a slot is free (items that arrive in the same loop iteration share
       the batch). Items go out in arrival order. An idle batcher schedules no wake-ups.
    2. **Results.** ``process_batch`` returns a sequence of the same length and order as its batch, or ``None``
       (every caller gets ``None``). An element that is an ``Exception`` instance is raised to that caller only.
       A result of the wrong length gives every caller of the batch a :class:`BatchSizeMismatchError`. An
       exception raised by ``process_batch`` goes to every caller of the batch; a ``CancelledError`` raised by
       it becomes :class:`ProcessBatchCancelledError`, so a caller is never mistaken for cancelled. The batcher
       keeps serving after any of these.
    3. **Sync process_batch.** A plain ``def process_batch`` runs in ``executor`` (the loop's default executor
       if ``None``), never on the event loop.
    4. **Concurrency.** At most ``concurrency`` batches are in flight (``-1``: no limit).
    5. **Admission.** With ``max_queue_size`` set, :meth:`process` on a full queue raises
       :class:`QueueFullException` at once, or, with ``wait_when_full=True``, waits its turn for room (first
       come, first served).
    6. **Cancellation and timeouts.** A caller cancelled before its item is sent withdraws the item: it never
       reaches ``process_batch``. Cancelled after, its result is dropped and no other caller is affected.
       ``process(item, timeout=s)`` raises the built-in ``TimeoutError`` after ``s`` seconds under the same
       rules. Both are atomic with respect to the batch: an item is either sent with its caller still waiting,
       or not sent at all.
    7. **Bulk.** ``await process_many(items)`` submits many items at once and returns their results in order.
    8. **Lifecycle.** :meth:`start` is optional (the first :meth:`process` starts a never-started batcher) and
       idempotent. The batcher binds to the running event loop at first use, not at construction; after a stop
       it can be started again, in the same or a new event loop. ``async with batcher:`` starts and stops it.
    9. **Stop.** ``await stop()`` refuses new items (:class:`BatcherStoppedError`), processes everything already
       accepted, waits for the batches in flight, then returns. ``stop(timeout=s)`` returns after about ``s``
       seconds at most; whatever is unfinished then fails with :class:`BatcherStoppedError`.
       ``stop(force=True)`` fails every queued and in-flight caller at once with :class:`BatcherStoppedError`
       and cancels the batches in flight (a sync ``process_batch`` already running in a thread runs to its end,
       its result dropped; one still waiting for a thread never starts). Stop is idempotent. No path leaves a
       caller waiting.

    Every accepted item resolves exactly once: with its result, an exception, or its caller's cancellation.

    Args:
        max_batch_size: The most items in one batch; ``-1`` for no limit. ``batch_size`` is accepted as a
            synonym.
        max_queue_time: The most seconds an item waits for its batch to fill (from its arrival) once a slot is
            free; ``0`` sends at once.
        concurrency: The most batches processed at once; ``-1`` for no limit.
        max_queue_size: The most items waiting (not counting batches in flight); ``-1`` or ``0`` for no limit.
        executor: Where a synchronous ``process_batch`` runs; the loop's default executor if ``None``.
        wait_when_full: On a full queue, wait for room instead of raising :class:`QueueFullException`.
        name: A name for logs and statistics; the class name by default.
    """

    def __init__(
        self,
        *,
        max_batch_size: int = -1,
        max_queue_time: float = 0.01,
        concurrency: int = 1,
        max_queue_size: int = -1,
        executor: Executor | None = None,
        wait_when_full: bool = False,
        max_batch_weight: float | None = None,
        max_priority_wait: float = 1.0,
        max_latency: float | None = None,
        name: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        if "batch_size" in kwargs:
            # The name the original README used.
            if max_batch_size != -1:
                raise TypeError("pass max_batch_size or its synonym batch_size, not both")
            max_batch_size = kwargs.pop("batch_size")
        for deprecated in ("sleep_time", "buffering_time"):
            if deprecated in kwargs:
                kwargs.pop(deprecated)
                warnings.warn(
                    f"{deprecated!r} has no effect and is ignored: the batcher sleeps until there is work",
                    DeprecationWarning,
                    stacklevel=2,
                )
        if kwargs:
            raise TypeError(f"unexpected keyword argument(s): {', '.join(sorted(kwargs))}")

        self.name: str = name if name is not None else type(self).__name__
        self.executor = executor
        self.wait_when_full = bool(wait_when_full)
        self._state: str = _NEW
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lane0 = Lane(_NO_KEY)  # the lane of every item when batch_key is not overridden
        self._fifo0 = self._lane0.level(0)  # its priority-0 level: where the common case appends
        self._lanes: dict[Hashable, Lane] = {_NO_KEY: self._lane0}
        self._dispatches = 0  # batches sent so far: the clock of Lane.served
        self._n_waiting = 0  # items in the queue whose callers still wait
        self._putters: deque[tuple[asyncio.Future[None], int]] = deque()  # waiting for room: (future, n)
        self._reserved = 0  # room promised to woken putters that have not enqueued yet
        self._in_flight = 0
        # The batches in flight (tasks, or an executor's futures): strong references, and their callers.
        self._batches: dict[_InFlight, _Batch] = {}
        self._generation = 0  # bumped when a run's batches are abandoned, so late finishers touch nothing
        self._pump_handle: asyncio.Handle | None = None
        # The timer for the next deadline, and that deadline: kept here, because for a time already past uvloop's
        # call_at returns a plain Handle, which cannot tell its time.
        self._timer: asyncio.Handle | None = None
        self._timer_at = math.inf
        self._timer_when = -math.inf  # the deadline of the last timer that fired
        self._is_coroutine = True
        self._startup: asyncio.Task[None] | None = None
        self._drained: asyncio.Future[None] | None = None
        self._closing: asyncio.Task[None] | None = None
        self._stop_waiters = 0  # stop() calls awaiting self._closing
        self._aborted = False
        self._recorder = _Recorder()
        self._adaptive: AdaptiveWait | None = None
        # Whether items need the batch_key / item_weight hooks (set at each start from the class and the settings).
        # Lane.weight is kept only while weights are in play (not plain); _recount_weights sets it when they come.
        self._keyed = False
        self._weighted = False
        self._plain = True
        self._loop_ident = 0  # the thread the bound loop runs on
        self._loop_thread = LoopThread(f"async-batcher:{self.name}")  # started by a blocking call with no loop
        # The settings go through their property setters, which validate them.
        self.max_batch_size = max_batch_size
        self.max_queue_time = max_queue_time
        self.concurrency = concurrency
        self.max_queue_size = max_queue_size
        self.max_batch_weight = max_batch_weight
        self.max_priority_wait = max_priority_wait
        self.max_latency = max_latency

    # ------------------------------------------------------------------ the part users write

    @abc.abstractmethod
    def process_batch(
        self, batch: list[T]
    ) -> Awaitable[Sequence[R | Exception] | None] | Sequence[R | Exception] | None:
        """Process a batch; return one result per item, in order (an ``Exception`` element fails that item).

        Override with ``async def`` (called on the event loop as ``process_batch(batch=...)``) or with a plain
        ``def`` (run in ``executor``).
        """

    def batch_key(self, item: T) -> Hashable:
        """Overridable hook: items with different keys never share a batch (one table, queue, model, tenant...).

        Each key keeps its own pending batch and deadline; keys come and go at run time; when slots are scarce,
        keys are served in turn. Called once per item, at submission. The default puts every item under one key.
        """
        return _NO_KEY

    def item_weight(self, item: T) -> float:
        """Overridable hook: the weight of an item (bytes, tokens) against ``max_batch_weight``; 1 by default.

        Called once per item, at submission, when overridden or when ``max_batch_weight`` is set.
        """
        return 1.0

    async def on_start(self) -> None:
        """Overridable hook: runs once each time the batcher starts; the first batch waits for it.

        Open clients here. If it raises, the callers of that run's batches get the error.
        """

    async def on_stop(self) -> None:
        """Overridable hook: runs once at the end of :meth:`stop`, after the drain. Close clients here."""

    # ------------------------------------------------------------------ settings (live: next batch)

    @property
    def max_batch_size(self) -> int:
        return self._max_batch_size

    @max_batch_size.setter
    def max_batch_size(self, value: int) -> None:
        value = _check_limit("max_batch_size", value, allow_zero=False)
        self._max_batch_size = int(value)
        self._batch_limit = _UNLIMITED if value == -1 else value
        self._size_trigger = self._batch_limit  # the adaptive wait lowers it to the size it aims for
        self._repump()

    @property
    def max_queue_time(self) -> float:
        return self._max_queue_time

    @max_queue_time.setter
    def max_queue_time(self, value: float) -> None:
        if not finite_at_least(value, 0):
            raise ValueError(f"max_queue_time must be a finite number of seconds >= 0, got {value!r}")
        self._max_queue_time = float(value)
        self._repump()

    @property
    def concurrency(self) -> int:
        return self._concurrency

    @concurrency.setter
    def concurrency(self, value: int) -> None:
        value = _check_limit("concurrency", value, allow_zero=False)
        self._concurrency = value
        self._slot_limit = _UNLIMITED if value == -1 else value
        self._repump()

    @property
    def max_queue_size(self) -> int:
        return self._max_queue_size

    @max_queue_size.setter
    def max_queue_size(self, value: int) -> None:
        value = _check_limit("max_queue_size", value, allow_zero=True)
        self._max_queue_size = value
        self._room_limit = _UNLIMITED if value <= 0 else value
        self._update_fast()
        self._wake_putters()

    @property
    def max_batch_weight(self) -> float | None:
        return self._max_batch_weight

    @max_batch_weight.setter
    def max_batch_weight(self, value: float | None) -> None:
        if value is not None and not finite_at_least(value, 0, strictly=True):
            raise ValueError(f"max_batch_weight must be None or a finite number > 0, got {value!r}")
        self._max_batch_weight = value
        self._weight_limit = math.inf if value is None else float(value)
        if value is not None and self._plain:
            self._weighted = True
            self._plain = False
            self._recount_weights()  # not kept while no weight was in play
        self._update_fast()
        self._repump()

    @property
    def max_latency(self) -> float | None:
        """The latency budget of the adaptive wait (see :mod:`async_batcher.adaptive`); ``None``: fixed wait.

        When set, the batcher chooses how long batches wait from what it measures, and ``max_queue_time`` is not
        used.
        """
        return None if self._adaptive is None else self._adaptive.max_latency

    @max_latency.setter
    def max_latency(self, value: float | None) -> None:
        if value is None:
            self._adaptive = None
            self._size_trigger = self._batch_limit
        else:
            policy = AdaptiveWait(value)  # validates
            if self._adaptive is None:
                self._adaptive = policy
            else:
                self._adaptive.max_latency = policy.max_latency  # keep what it has learned
        self._repump()

    @property
    def adaptive_state(self) -> AdaptiveWaitState | None:
        """What the adaptive wait believes now (cost model, arrival rate, target size), or ``None`` when off."""
        return None if self._adaptive is None else self._adaptive.state(self._concurrency)

    def _recount_weights(self) -> None:
        for lane in self._lanes.values():
            lane.weight = 0.0
            for entry in lane.entries():
                if entry.__class__ is list:
                    lane.weight += entry[WEIGHT] if entry[QUEUED] else 0.0
                else:
                    lane.weight += len(entry.items) - entry.pos

    @property
    def max_priority_wait(self) -> float:
        return self._max_priority_wait

    @max_priority_wait.setter
    def max_priority_wait(self, value: float) -> None:
        if not finite_at_least(value, 0):
            raise ValueError(f"max_priority_wait must be a finite number of seconds >= 0, got {value!r}")
        self._max_priority_wait = float(value)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the batcher on the running event loop (optional: the first :meth:`process` does it).

        Idempotent. Called with no running loop, it only marks the batcher to start at first use.
        """
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            if self._state == _STOPPED:
                self._state = _NEW
            return
        self._bind(loop)

    async def is_running(self) -> bool:
        """Whether the batcher is started and not yet fully stopped (it is running while it drains)."""
        return self._state in (_RUNNING, _STOPPING) and self._loop is not None and not self._loop.is_closed()

    async def __aenter__(self) -> Self:
        self.start()
        if self._startup is not None:
            try:
                await asyncio.shield(self._startup)
            except BaseException:
                await self.stop()
                raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Make this batcher run on ``loop``: start it, or restart it after a stop."""
        if self._loop is loop and self._state == _RUNNING:
            return
        if self._state == _STOPPING and self._loop is loop:
            raise BatcherStoppedError(f"{self.name} is stopping; it can be started again once stop() returns")
        if self._loop is not None and self._loop is not loop and self._state in (_RUNNING, _STOPPING):
            if not self._loop.is_closed():
                raise RuntimeError(f"{self.name} is running on another event loop; stop it there before using it here")
            # Its loop was closed without a stop: whatever it held belonged to that loop and is gone with it.
            logger.warning("%s: its event loop was closed without stop(); starting afresh", self.name)
        self._reset_run(loop)
        self._state = _RUNNING
        self._loop_ident = get_ident()  # bound from a coroutine: this is the loop's thread
        self._update_fast()
        if type(self).on_start is not AsyncBatcher.on_start:
            self._startup = loop.create_task(self.on_start())
            self._startup.add_done_callback(self._startup_done)

    def _reset_run(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._recorder.dequeued += self._n_waiting  # abandoned with a closed loop, if any
        self._lane0 = Lane(_NO_KEY)
        self._fifo0 = self._lane0.level(0)
        self._lanes = {_NO_KEY: self._lane0}
        self._n_waiting = 0
        self._putters = deque()
        self._reserved = 0
        self._in_flight = 0
        self._batches = {}
        self._generation += 1
        self._pump_handle = None
        self._timer = None
        self._timer_when = -math.inf
        self._startup = None
        self._drained = None
        self._closing = None
        self._aborted = False
        self._is_coroutine = inspect.iscoroutinefunction(self.process_batch)
        # The hooks cost a call per item: only pay for them when they are overridden.
        self._keyed = type(self).batch_key is not AsyncBatcher.batch_key
        self._weighted = type(self).item_weight is not AsyncBatcher.item_weight or self._max_batch_weight is not None
        self._plain = not (self._keyed or self._weighted)
        # The loop's own clock; for the standard loop that is time.monotonic, called directly to spare a Python
        # frame per item (a loop with a clock of its own, like a test's virtual clock, is asked as always).
        self._clock = time.monotonic if type(loop).time is asyncio.BaseEventLoop.time else loop.time
        # Likewise the loop's futures: the standard loop's create_future() is a Python frame around the C class.
        self._new_future: Callable[[], asyncio.Future[Any]] = (
            partial(asyncio.Future, loop=loop)
            if type(loop).create_future is asyncio.BaseEventLoop.create_future
            else loop.create_future
        )

    def _update_fast(self) -> None:
        # process() takes its short path when the batcher runs on the caller's loop and there is no key or weight
        # to compute: one identity test stands for all of that (room in a bounded queue is checked per item).
        fast = self._plain and self._state == _RUNNING
        self._fast_loop = self._loop if fast else None

    def _startup_done(self, task: asyncio.Task[None]) -> None:
        # A failing on_start is reported to the callers of the batches; retrieve it here so that a run with no
        # batch does not end in "exception was never retrieved".
        if not task.cancelled() and task.exception() is not None:
            logger.warning("%s: on_start() failed: %s", self.name, type(task.exception()).__name__)

    async def stop(self, force: bool = False, timeout: float | None = None) -> None:
        """Stop: refuse new items, finish (or with ``force``, fail) the accepted ones, then run :meth:`on_stop`.

        Args:
            force: Fail every queued and in-flight caller at once with :class:`BatcherStoppedError` and cancel
                the batches in flight.
            timeout: Wait at most this many seconds for the drain; then act as ``force``.

        Idempotent and safe to call concurrently: every call returns once the batcher is stopped (or once its
        own ``timeout`` has forced it).
        """
        if timeout is not None:
            _check_timeout(timeout)
        thread = self._loop_thread
        if thread.loop is not None and not thread.is_current():
            # Blocking calls started a loop thread for this batcher: the stop runs there, then the thread ends.
            if self._loop is thread.loop:
                await asyncio.wrap_future(thread.submit(self.stop(force=force, timeout=timeout)))
            await asyncio.get_running_loop().run_in_executor(None, thread.stop)
        if self._state == _NEW or self._state == _STOPPED:
            return
        loop = self._loop
        assert loop is not None  # running or stopping implies bound
        if loop.is_closed():
            self._state = _STOPPED  # its loop is gone, and everything it held with it
            return
        if loop is not asyncio.get_running_loop():
            raise RuntimeError(f"{self.name} runs on another event loop; call stop() there")
        if self._state == _RUNNING:
            self._state = _STOPPING
            self._update_fast()
            self._drained = loop.create_future()
            self._fail_putters(BatcherStoppedError(f"{self.name} is stopping"))
            self._repump()
            self._check_drained()
        if force:
            self._abort(BatcherStoppedError(f"{self.name} was stopped with force=True"))
        drained = self._drained
        assert drained is not None
        if not drained.done():
            try:
                await asyncio.wait_for(asyncio.shield(drained), timeout)
            except TimeoutError:
                self._abort(BatcherStoppedError(f"{self.name} was stopped: stop(timeout={timeout}) expired"))
        closing = self._closing
        assert closing is not None
        self._stop_waiters += 1
        try:
            await asyncio.shield(closing)
        finally:
            self._stop_waiters -= 1

    def _check_drained(self) -> None:
        """During a stop: once nothing is queued or in flight, finish the stop (exactly once)."""
        if (
            self._state == _STOPPING
            and self._closing is None
            and self._n_waiting == 0
            and (self._in_flight == 0 or self._aborted)
        ):
            assert self._loop is not None and self._drained is not None
            if not self._drained.done():
                self._drained.set_result(None)
            self._closing = self._loop.create_task(self._finish_stop())
            self._closing.add_done_callback(self._closing_done)

    def _closing_done(self, task: asyncio.Task[None]) -> None:
        # stop() re-raises an on_stop() failure to whoever awaits it; retrieve it here so that a stop nobody
        # awaits still reports it, through the loop's exception handler.
        if not task.cancelled() and task.exception() is not None and not self._stop_waiters and self._loop is not None:
            self._loop.call_exception_handler(
                {"message": f"{self.name}: on_stop() failed", "exception": task.exception(), "task": task}
            )

    async def _finish_stop(self) -> None:
        try:
            if self._startup is not None and not self._startup.done():
                self._startup.cancel()
            await self.on_stop()
        finally:
            self._cancel_timer()
            self._state = _STOPPED
            self._update_fast()

    def _abort(self, exc: AsyncBatchException) -> None:
        """Fail every queued and in-flight caller with ``exc`` and cancel the batches in flight."""
        self._aborted = True
        rec = self._recorder
        for lane in self._lanes.values():
            for entry in lane.entries():
                if entry.__class__ is list:
                    if entry[QUEUED]:
                        entry[QUEUED] = False
                        sink = entry[SINK]
                        if not sink.done():
                            rec.failed += 1 if sink.__class__ is not Bulk else sink.left
                            if sink.__class__ is Bulk:
                                sink.fail(exc)
                            else:
                                sink.set_exception(exc)
                elif entry.pos < len(entry.items) and not entry.future.done():
                    rec.failed += entry.left
                    entry.pos = len(entry.items)
                    entry.fail(exc)
            lane.clear()
        self._lanes = {_NO_KEY: self._lane0}
        self._recorder.dequeued += self._n_waiting
        self._n_waiting = 0
        self._fail_putters(exc)
        for running, batch in list(self._batches.items()):
            rec.failed += fail_sinks(batch.sinks, exc)
            if isinstance(running, asyncio.Task):
                running.cancel()
            else:  # a thread cannot be interrupted; a batch still queued in the executor will not start
                batch.abandoned = True
        # The cancelled batches finish on their own; they must not count against a later run's slots.
        self._batches = {}
        self._in_flight = 0
        self._generation += 1
        self._cancel_timer()
        self._check_drained()

    # ------------------------------------------------------------------ submitting

    async def process(self, item: T, *, timeout: float | None = None, priority: float = 0) -> R:
        """Submit one item and wait for its result.

        Args:
            item: The item.
            timeout: Seconds to wait at most, from this call (including any wait for room in the queue).
            priority: Lower goes first; first come, first served within a priority. An item is never passed
                over for longer than ``max_priority_wait`` seconds.

        Raises:
            QueueFullException: ``max_queue_size`` items are waiting (and ``wait_when_full`` is off).
            BatcherStoppedError: the batcher is stopping or stopped, or the item was abandoned by a forced stop.
            TimeoutError: ``timeout`` seconds passed first; an item not yet sent is withdrawn.
            ValueError: the item alone weighs more than ``max_batch_weight``.
            BatchSizeMismatchError: ``process_batch`` returned the wrong number of results.
            Exception: whatever ``process_batch`` raised, or the ``Exception`` it returned for this item.
        """
        # Is this the batcher's loop, running, on this thread? (asyncio.get_running_loop() would tell, but on
        # Python 3.11 it makes a getpid() system call each time: too dear for every item. A thread runs one loop
        # at a time, so the loop the batcher is bound to, running on this thread, is the running loop.)
        loop = self._fast_loop
        if (
            loop is None
            or timeout is not None
            or priority != 0
            or get_ident() != self._loop_ident
            or not loop.is_running()
            # A full queue (or callers already waiting for room, who go first): refuse or wait, on the long path.
            or self._n_waiting + self._reserved >= self._room_limit
            or self._putters
        ):
            return await self._process(asyncio.get_running_loop(), item, timeout, priority)
        # The common case, kept short: running on this loop, no key, no weight (so lane.weight is not kept), no
        # priority, no timeout, room in the queue.
        fut: asyncio.Future[R] = self._new_future()
        lane = self._lane0
        entry = [item, fut, self._clock(), True, 1.0, lane, 0]
        self._fifo0.append(entry)
        lane.count += 1
        self._n_waiting += 1
        if (
            self._pump_handle is None
            and self._in_flight < self._slot_limit
            and (self._timer is None or lane.count >= self._size_trigger)
        ):
            self._pump_handle = loop.call_soon(self._scheduled_pump)
        try:
            return await fut
        except asyncio.CancelledError:
            self._left(entry, fut)
            raise

    async def _process(self, loop: asyncio.AbstractEventLoop, item: T, timeout: float | None, priority: float) -> R:
        """:meth:`process` with keys, weights, a priority, a timeout or a full queue; or not running yet."""
        if loop is not self._loop or self._state != _RUNNING:
            self._admit_slow(loop)
        if priority != 0:
            _check_priority(priority)
        deadline = None if timeout is None else loop.time() + _check_timeout(timeout)
        if self._plain:
            weight = 1.0
            key: Hashable = _NO_KEY
        else:
            key, weight = self._key_and_weight(item, 1)
        if self._n_waiting + self._reserved >= self._room_limit or self._putters:
            await self._wait_for_room(loop, 1, deadline)
        lane = self._lane0 if key is _NO_KEY else self._lane(key)
        fut: asyncio.Future[R] = loop.create_future()
        now = loop.time()
        entry = [item, fut, now, True, weight, lane, 0]
        lane.level(priority).append(entry)
        lane.count += 1
        if not self._plain:
            lane.weight += weight
        self._n_waiting += 1
        if self._pump_handle is None and self._in_flight < self._slot_limit:
            if self._timer is None or lane.count >= self._size_trigger or lane.weight >= self._weight_limit:
                self._pump_handle = loop.call_soon(self._scheduled_pump)
        expiry = None if deadline is None else loop.call_at(deadline, self._expire, entry)
        try:
            return await fut
        except asyncio.CancelledError:
            self._left(entry, fut)
            raise
        finally:
            if expiry is not None:
                expiry.cancel()

    def _left(self, entry: list[Any], fut: asyncio.Future[Any]) -> None:
        """A caller of :meth:`process` was cancelled (its future was, with it)."""
        if fut.cancelled():  # the caller's own cancellation, not an error of process_batch
            self._recorder.cancelled += 1
            if entry[QUEUED]:
                self._withdraw(entry)

    async def process_many(
        self,
        items: Iterable[T],
        *,
        timeout: float | None = None,
        priority: float = 0,
        return_exceptions: bool = False,
    ) -> list[R]:
        """Submit many items at once; return their results in order.

        The items go out in as many batches as the limits need, in order. On a bounded queue the call is admitted
        whole or not at all. With ``return_exceptions=False`` the first failing item's exception is raised and the
        items not yet sent are withdrawn; with ``True`` exceptions take their items' places in the list.
        Cancellation, ``timeout`` and ``priority`` work as in :meth:`process`, for all the items together.
        """
        loop = asyncio.get_running_loop()
        if loop is not self._loop or self._state != _RUNNING:
            self._admit_slow(loop)
        if priority != 0:
            _check_priority(priority)
        deadline = None if timeout is None else loop.time() + _check_timeout(timeout)
        batch = list(items)
        n = len(batch)
        if n == 0:
            return []
        keys_weights = None if self._plain else [self._key_and_weight(x, n) for x in batch]
        if n > self._room_limit:
            self._recorder.rejected += n
            raise QueueFullException(
                f"{self.name}: process_many of {n} items can never fit in max_queue_size={self._max_queue_size}"
            )
        if self._n_waiting + self._reserved + n > self._room_limit or self._putters:
            await self._wait_for_room(loop, n, deadline)
        fut: asyncio.Future[list[R]] = loop.create_future()
        now = loop.time()
        if keys_weights is None:
            # One queue entry for the whole call: it is sliced into batches as they go out.
            lane = self._lane0
            bulk = Bulk(batch, fut, now, return_exceptions, lane)
            lane.level(priority).append(bulk)
            lane.clean = False
            lane.count += n
        else:
            bulk = Bulk(batch, fut, now, return_exceptions, None)
            bulk.entries = []
            for index, (x, (key, weight)) in enumerate(zip(batch, keys_weights, strict=True)):
                lane = self._lane0 if key is _NO_KEY else self._lane(key)
                entry = [x, bulk, now, True, weight, lane, index]
                lane.level(priority).append(entry)
                lane.count += 1
                lane.weight += weight
                bulk.entries.append(entry)
        self._n_waiting += n
        if self._pump_handle is None and self._in_flight < self._slot_limit:
            self._pump_handle = loop.call_soon(self._scheduled_pump)
        expiry = None if deadline is None else loop.call_at(deadline, self._expire_bulk, bulk)
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.cancelled():
                self._recorder.cancelled += bulk.left
                self._withdraw_bulk(bulk)
            raise
        except BaseException:
            self._withdraw_bulk(bulk)  # a failed item: the rest of the call is not sent
            raise
        finally:
            if expiry is not None:
                expiry.cancel()

    def _key_and_weight(self, item: Any, n: int) -> tuple[Hashable, float]:
        """Call the ``batch_key`` / ``item_weight`` hooks once for an item, and check what they return."""
        key = self.batch_key(item) if self._keyed else _NO_KEY
        if key is not _NO_KEY:
            try:
                hash(key)
            except TypeError:
                raise TypeError(f"{self.name}: batch_key() returned an unhashable key: {key!r}") from None
        if not self._weighted:
            return key, 1.0
        weight = self.item_weight(item)
        if not finite_at_least(weight, 0):
            raise ValueError(f"{self.name}: item_weight() must return a finite number >= 0, got {weight!r}")
        if weight > self._weight_limit:
            self._recorder.rejected += n
            raise ValueError(
                f"{self.name}: an item of weight {weight!r} can never fit in "
                f"max_batch_weight={self._max_batch_weight!r}"
            )
        return key, float(weight)

    def _lane(self, key: Hashable) -> Lane:
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = Lane(key)
        return lane

    def _admit_slow(self, loop: asyncio.AbstractEventLoop) -> None:
        """The rare cases of admission: first use, another loop, stopping or stopped."""
        if self._state == _NEW or (self._state == _RUNNING and self._loop is not None and self._loop.is_closed()):
            self._bind(loop)
            return
        if self._state in (_STOPPING, _STOPPED):
            self._recorder.rejected += 1
            raise BatcherStoppedError(f"{self.name} is {self._state}; start() it again to submit items")
        raise RuntimeError(f"{self.name} is running on another event loop")

    async def _wait_for_room(self, loop: asyncio.AbstractEventLoop, n: int, deadline: float | None) -> None:
        """Wait, first come first served, until ``n`` items fit in the queue; or refuse at once."""
        if not self.wait_when_full:
            self._recorder.rejected += n
            raise QueueFullException(
                f"{self.name}: the queue is full (max_queue_size={self._max_queue_size}); "
                "cannot process more items at the moment"
            )
        waiter: asyncio.Future[None] = loop.create_future()
        self._putters.append((waiter, n))
        expiry = None if deadline is None else loop.call_at(deadline, _expire_waiter, waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            self._recorder.cancelled += n
            if not waiter.cancelled():
                # Woken (room was promised to it), then cancelled before it could enqueue: pass the room on.
                self._reserved -= n
            self._wake_putters()  # it may have been the head of the line, holding smaller requests back
            raise
        except TimeoutError:
            self._recorder.timed_out += n
            self._wake_putters()
            raise
        finally:
            if expiry is not None:
                expiry.cancel()
        self._reserved -= n
        if self._state != _RUNNING:
            self._recorder.rejected += n
            raise BatcherStoppedError(f"{self.name} is {self._state}")

    def _wake_putters(self) -> None:
        putters = self._putters
        while putters:
            waiter, n = putters[0]
            if waiter.done():  # cancelled or timed out while waiting: skip it
                putters.popleft()
                continue
            if self._n_waiting + self._reserved + n > self._room_limit:
                return  # head of the line does not fit yet; nobody may overtake it
            putters.popleft()
            self._reserved += n
            waiter.set_result(None)

    def _fail_putters(self, exc: BaseException) -> None:
        while self._putters:
            waiter, n = self._putters.popleft()
            if not waiter.done():
                waiter.set_exception(exc)
                self._recorder.rejected += n

    def _unqueue(self, entry: list[Any]) -> None:
        """Take a queued item out of the counts: its caller left, so it must never be sent."""
        entry[QUEUED] = False
        lane = entry[LANE]
        lane.clean = False  # the entry stays in its level until the dispatcher reaches it
        lane.count -= 1
        if not self._plain:
            lane.weight -= entry[WEIGHT]
        self._n_waiting -= 1
        self._recorder.dequeued += 1

    def _withdraw(self, entry: list[Any]) -> None:
        self._unqueue(entry)
        if self._putters:
            self._wake_putters()
        self._check_drained()

    def _withdraw_bulk(self, bulk: Bulk) -> None:
        if bulk.entries is not None:
            unsent = 0
            for entry in bulk.entries:
                if entry[QUEUED]:
                    self._unqueue(entry)
                    unsent += 1
        else:
            unsent = len(bulk.items) - bulk.pos
            if unsent:
                bulk.pos = len(bulk.items)
                assert bulk.lane is not None
                bulk.lane.clean = False
                bulk.lane.count -= unsent
                if not self._plain:
                    bulk.lane.weight -= unsent
                self._n_waiting -= unsent
                self._recorder.dequeued += unsent
        if unsent:
            if self._putters:
                self._wake_putters()
            self._check_drained()

    def _expire(self, entry: list[Any]) -> None:
        fut = entry[SINK]
        if fut.done():
            return
        self._recorder.timed_out += 1
        if entry[QUEUED]:
            self._withdraw(entry)
        fut.set_exception(TimeoutError(f"{self.name}: no result within the timeout"))

    def _expire_bulk(self, bulk: Bulk) -> None:
        if bulk.future.done():
            return
        self._recorder.timed_out += bulk.left
        bulk.fail(TimeoutError(f"{self.name}: no results within the timeout"))
        self._withdraw_bulk(bulk)

    # ------------------------------------------------------------------ dispatching

    def _repump(self) -> None:
        """A setting or the state changed: let the dispatcher look again (no-op when not running)."""
        loop = self._loop
        if loop is not None and self._pump_handle is None and not loop.is_closed():
            self._pump_handle = loop.call_soon(self._scheduled_pump)

    def _scheduled_pump(self) -> None:
        self._pump_handle = None
        self._pump_safely()

    def _pump_safely(self) -> None:
        """:meth:`_pump`, such that even a bug in it cannot leave a caller waiting."""
        try:
            self._pump()
        except Exception as exc:
            if self._loop is not None:
                self._loop.call_exception_handler(
                    {"message": f"{self.name}: internal error while dispatching batches", "exception": exc}
                )
            error = AsyncBatchException(f"{self.name}: internal error while dispatching batches: {exc!r}")
            self._abort(error)
            self._aborted = self._state == _STOPPING

    def _pump(self) -> None:
        """Send every batch that is due while slots are free; else arm one timer for the next deadline.

        Of the lanes that are due, the one served longest ago goes first, so that when slots are scarce keys
        take turns and none starves another.
        """
        if self._state not in (_RUNNING, _STOPPING):
            return
        loop = self._loop
        assert loop is not None
        lanes = self._lanes
        # A timer may fire a hair before its time by the loop's clock resolution: when it fired for a deadline,
        # that deadline is due.
        now = max(loop.time(), self._timer_when)
        adaptive = self._adaptive
        if adaptive is not None:
            adaptive.note_arrivals(self._recorder.dequeued + self._n_waiting, now)
            target = adaptive.target_size(self._concurrency)
            self._size_trigger = max(1, min(self._batch_limit, math.ceil(target) if target < math.inf else _UNLIMITED))
        next_deadline = math.inf
        while self._n_waiting and self._in_flight < self._slot_limit:
            chosen = None
            next_deadline = math.inf
            for lane in lanes.values():
                if not lane.count or (chosen is not None and lane.served >= chosen.served):
                    continue
                if self._state == _STOPPING or lane.count >= self._size_trigger or lane.weight >= self._weight_limit:
                    due = True
                else:
                    deadline = self._send_by(lane, now)
                    due = deadline <= now
                    if not due and lane.count:  # (its callers may all have left while it was looked at)
                        next_deadline = min(next_deadline, deadline)
                if due:
                    chosen = lane
                    if lane.served < 0:
                        break  # never served: nobody goes before it
            if chosen is None:
                break
            self._dispatches += 1
            chosen.served = self._dispatches
            self._dispatch(loop, chosen, now)
        if len(lanes) > 1:
            for key in [key for key, lane in lanes.items() if not lane.count and lane is not self._lane0]:
                del lanes[key]  # keys come and go
        if not self._n_waiting:
            self._cancel_timer()  # nothing waits: an idle batcher has no wake-ups
            self._check_drained()
        elif self._in_flight < self._slot_limit and next_deadline < math.inf:
            self._arm_timer(loop, next_deadline)

    def _arm_timer(self, loop: asyncio.AbstractEventLoop, deadline: float) -> None:
        timer = self._timer
        if timer is not None:
            if self._timer_at <= deadline:
                return  # it fires first and will look again
            timer.cancel()
        self._timer = loop.call_at(deadline, self._on_timer, deadline)
        self._timer_at = deadline

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_timer(self, when: float) -> None:
        self._timer = None
        self._timer_when = when
        self._pump_safely()

    def _live_head(self, fifo: deque[Any]) -> Any:
        """The first entry of a level still waiting; drops the entries before it whose callers left."""
        while fifo:
            entry = fifo[0]
            if entry.__class__ is list:
                if entry[QUEUED]:
                    if not entry[SINK].done():
                        return entry
                    # Its caller was cancelled and has not run since to withdraw it: it must not be sent.
                    self._unqueue(entry)
            else:
                if entry.future.done():  # cancelled, timed out, or one of its items failed
                    self._withdraw_bulk(entry)
                if entry.pos < len(entry.items):
                    return entry
            fifo.popleft()
        return None

    def _send_by(self, lane: Lane, now: float) -> float:
        """When the lane's pending batch must go, if it does not fill first."""
        oldest = self._oldest(lane)
        if self._adaptive is None:
            return oldest + self._max_queue_time
        return self._adaptive.send_by(oldest, max(lane.count, min(self._size_trigger, self._batch_limit)))

    def _oldest(self, lane: Lane) -> float:
        """Arrival time of the lane's oldest waiting item (``inf`` if its callers all left)."""
        oldest = math.inf
        for fifo in lane.order:
            head = self._live_head(fifo)
            if head is not None:
                arrival = head[ARRIVAL] if head.__class__ is list else head.arrival
                oldest = min(oldest, arrival)
        return oldest

    def _next_level(self, lane: Lane, now: float) -> tuple[deque[Any], Any] | None:
        """The level to take the next item from: the best priority, unless an item has waited too long."""
        order = lane.order
        if len(order) == 1:
            head = self._live_head(order[0])
            return None if head is None else (order[0], head)
        best = None
        overdue = None
        starved_before = now - self._max_priority_wait
        for fifo in order:
            head = self._live_head(fifo)
            if head is None:
                continue
            if best is None:
                best = (fifo, head)
            arrival = head[ARRIVAL] if head.__class__ is list else head.arrival
            if arrival <= starved_before and (overdue is None or arrival < overdue[2]):
                overdue = (fifo, head, arrival)
        if overdue is not None:
            return overdue[0], overdue[1]
        return best

    def _dispatch(self, loop: asyncio.AbstractEventLoop, lane: Lane, now: float) -> None:
        """Take one batch from a lane and start processing it."""
        limit = self._batch_limit
        weight_limit = self._weight_limit
        items: list[Any] = []
        sinks: list[Any] = []
        taken = 0
        weight = 0.0
        oldest = math.inf
        futures_only = True  # every caller is a process() call: the delivery can take its fast path
        single = len(lane.order) == 1
        fifo = lane.order[0]
        if single and self._plain and fifo:
            # The common case in C-level passes: single items, callers all still waiting.
            if limit >= len(fifo):
                entries = list(fifo)
                fifo.clear()
            else:
                entries = list(map(_popleft, repeat(fifo, limit)))
            regular = lane.clean or (set(map(type, entries)) == {list} and all(map(_queued_of, entries)))
            sinks = list(map(_sink_of, entries)) if regular else []
            if sinks and not any(map(future_done, sinks)):
                consume(map(setitem, entries, repeat(QUEUED), repeat(False)))  # entry[QUEUED] = False, in C
                items = list(map(_item_of, entries))
                taken = len(entries)
                weight = float(taken)
                oldest = entries[0][ARRIVAL]
            else:
                fifo.extendleft(reversed(entries))  # a bulk call or a departed caller among them: the general way
                sinks = []
        while taken < limit:
            if single:
                # One level (the common case): inline what _next_level / _live_head do.
                if not fifo:
                    break
                entry = fifo[0]
                if entry.__class__ is list:
                    if not entry[QUEUED] or entry[SINK].done():
                        if entry[QUEUED]:  # its caller was cancelled and has not run since to withdraw it
                            self._unqueue(entry)
                        fifo.popleft()
                        continue
                else:
                    if entry.future.done():  # cancelled, timed out, or one of its items failed
                        self._withdraw_bulk(entry)
                    if entry.pos >= len(entry.items):
                        fifo.popleft()
                        continue
            else:
                picked = self._next_level(lane, now)
                if picked is None:
                    break
                fifo, entry = picked
            if entry.__class__ is list:
                w = entry[WEIGHT]
                if taken and weight + w > weight_limit:
                    break  # the batch closes before an item that would overflow it
                fifo.popleft()
                entry[QUEUED] = False
                weight += w
                items.append(entry[ITEM])
                sink = entry[SINK]
                if sink.__class__ is Bulk:
                    sink = (sink, entry[INDEX], 1)
                    futures_only = False
                sinks.append(sink)
                taken += 1
                if entry[ARRIVAL] < oldest:
                    oldest = entry[ARRIVAL]
            else:
                start = entry.pos
                count = min(limit - taken, len(entry.items) - start)
                if weight_limit < math.inf:  # a weight limit set after this call was queued: its items weigh 1
                    room = int(weight_limit - weight)
                    if room < 1 and taken:
                        break
                    count = min(count, max(room, 1))
                chunk = entry.items[start : start + count]  # a copy: process_batch may keep or mutate it
                if taken:
                    items.extend(chunk)
                else:
                    items = chunk
                sinks.append((entry, start, count))
                futures_only = False
                entry.pos = start + count
                weight += count
                taken += count
                oldest = min(oldest, entry.arrival)
                if entry.pos == len(entry.items):
                    fifo.popleft()
        if not fifo and single:
            lane.clean = True
        if not taken:
            return
        lane.count -= taken
        if not self._plain:
            lane.weight -= weight
        self._n_waiting -= taken
        self._recorder.dequeued += taken
        self._in_flight += 1
        self._launch(loop, items, sinks, futures_only, now, now - oldest)
        if self._putters:
            self._wake_putters()

    def _launch(
        self,
        loop: asyncio.AbstractEventLoop,
        items: list[Any],
        sinks: list[Any],
        futures_only: bool,
        started: float,
        waited: float,
    ) -> None:
        """Send a batch just formed (its slot already taken) on its way."""
        batch = _Batch(items, sinks, futures_only, started, waited, self._generation)
        startup = self._startup
        if self._is_coroutine or (startup is not None and not _succeeded(startup)):
            task = loop.create_task(self._run_batch(batch))
            self._batches[task] = batch
            return
        # A plain process_batch goes to its executor from here, not from a task: a task would start an event-loop
        # iteration later, and a busy loop's iteration is long (2.3 ms of an 8 ms batch cycle, measured on the
        # Keras example under load), time in which the executor's thread sits idle. Its end comes back the same
        # way, straight to _executor_done.
        self._submit(loop, batch)

    def _submit(self, loop: asyncio.AbstractEventLoop, batch: _Batch) -> None:
        """Send a batch to the executor (a plain ``process_batch``); :meth:`_executor_done` takes its end."""
        future: _InFlight
        try:
            if self.executor is None:
                future = loop.run_in_executor(None, self._in_thread, batch)
                future.add_done_callback(partial(self._executor_done, batch))
            else:
                future = self.executor.submit(self._in_thread, batch)
                future.add_done_callback(partial(_call_soon_on, loop, partial(self._executor_done, batch)))
        except Exception as exc:  # the executor refused it (shut down, say): as if process_batch had raised
            # Answered from the next iteration: this may run inside _pump, which must not be re-entered.
            loop.call_soon(self._batch_ended, batch, None, exc, False)
            return
        self._batches[future] = batch

    def _in_thread(self, batch: _Batch) -> Any:
        """What the executor runs: ``process_batch``, unless a forced stop answered the callers before it started."""
        if batch.abandoned:
            return _ABANDONED
        return self.process_batch(batch.items)

    def _executor_done(self, batch: _Batch, future: _InFlight) -> None:
        """On the loop: a batch sent to the executor by :meth:`_launch` has ended."""
        # Not among the batches in flight: a forced stop answered its callers (in this run or an earlier one).
        answered = self._batches.pop(future, None) is None
        if future.cancelled():  # by the executor (shut down with cancel_futures=True) before it started
            n = len(batch.items)
            cancelled = ProcessBatchCancelledError(f"{self.name}: the executor cancelled a batch of {n} items")
            self._batch_ended(batch, None, cancelled, False, answered)
            return
        error = future.exception()
        results = None if error is not None else future.result()
        if results is _ABANDONED:  # it never reached process_batch
            self._batch_ended(batch, None, None, False, True)
            return
        if answered and inspect.iscoroutine(results):
            results.close()  # its callers have their answer: it will not run
        elif error is None and inspect.isawaitable(results):
            # A sync process_batch that returned an awaitable: it runs on the loop (a coroutine as a task of its
            # own, which a forced stop can cancel), and its outcome is the batch's.
            try:
                awaited = asyncio.ensure_future(results, loop=self._loop)
            except Exception as exc:  # a future of another loop, say
                self._batch_ended(batch, None, exc, True, answered)
                return
            self._batches[awaited] = batch
            awaited.add_done_callback(partial(self._awaited_done, batch))
            return
        self._batch_ended(batch, results, error, True, answered)

    def _awaited_done(self, batch: _Batch, future: asyncio.Future[Any]) -> None:
        """The awaitable a sync ``process_batch`` returned has ended."""
        answered = self._batches.pop(future, None) is None  # by a forced stop, which cancelled it
        if future.cancelled():  # (else the awaitable raised CancelledError itself)
            error: BaseException | None = asyncio.CancelledError()
        else:
            error = future.exception()
        results = None if error is not None else future.result()
        self._batch_ended(batch, results, error, True, answered)

    async def _run_batch(self, batch: _Batch) -> None:
        """A batch as a task: a coroutine ``process_batch``, or a plain one until ``on_start()`` has finished."""
        loop = self._loop
        assert loop is not None
        called = False
        results: Any = None
        error: BaseException | None = None
        try:
            if self._startup is not None:
                await asyncio.shield(self._startup)
            # A caller may have left since the batch was formed (this task starts an iteration later): its item
            # must not reach process_batch.
            batch.items, batch.sinks = without_departed(batch.items, batch.sinks, batch.futures_only)
            if not batch.items:
                self._batch_ended(batch, None, None, False)
                return
            if not self._is_coroutine:  # a plain process_batch that had to wait for on_start(): on to its executor
                self._batches.pop(asyncio.current_task(loop), None)  # type: ignore[arg-type]
                self._submit(loop, batch)
                return
            called = True
            results = await cast(Awaitable[Any], self.process_batch(batch=batch.items))  # 0.2.2: by keyword
        except asyncio.CancelledError as exc:
            task = asyncio.current_task(loop)
            if task is not None and task.cancelling():
                # Cancelled from outside (a forced stop, the loop shutting down): the callers must not be left
                # waiting.
                stopped = BatcherStoppedError(f"{self.name}: batch cancelled")
                self._recorder.failed += fail_sinks(batch.sinks, stopped)
                self._batches.pop(task, None)
                self._batch_ended(batch, None, None, called, True)
                raise
            error = exc
        except BaseException as exc:  # on_start() failed, or process_batch did: its callers get the error
            error = exc
        self._batches.pop(asyncio.current_task(loop), None)  # type: ignore[arg-type]
        self._batch_ended(batch, results, error, called)

    def _batch_ended(
        self, batch: _Batch, results: Any, error: BaseException | None, ran: bool, answered: bool = False
    ) -> None:
        """Answer the callers of a batch that has ended, with ``results`` or ``error``, and free its slot.

        ``ran``: the batch reached ``process_batch`` (it counts in the statistics). ``answered``: a forced stop
        has answered its callers already. A ``KeyboardInterrupt`` or ``SystemExit`` in ``error`` is raised on
        once the callers have their answer.
        """
        rec = self._recorder
        sinks = batch.sinks
        n = len(batch.items)
        try:
            if answered:
                pass
            elif error is None:
                if ran:
                    try:
                        if results is None:
                            results = [None] * n
                        elif not isinstance(results, list | tuple):
                            results = list(results)
                        if len(results) != n:
                            raise BatchSizeMismatchError(n, len(results))
                    except Exception as exc:
                        error = exc
                    else:
                        rec.processed += n
                        rec.failed += deliver(sinks, results, batch.futures_only)
            elif isinstance(error, asyncio.CancelledError):
                error = ProcessBatchCancelledError(
                    f"{self.name}: process_batch raised CancelledError on a batch of {n} items"
                )
            if error is not None and not answered:
                if isinstance(error, ProcessBatchCancelledError):
                    logger.warning("%s", error)  # its message names the batcher
                elif isinstance(error, BatchSizeMismatchError):
                    logger.warning("%s: %s", self.name, error)
                else:
                    logger.warning(
                        "%s: process_batch raised %s on a batch of %d items", self.name, type(error).__name__, n
                    )
                if isinstance(error, Exception):
                    rec.failed += fail_sinks(sinks, error)
                    if ran:
                        rec.processed += n
                else:  # KeyboardInterrupt, SystemExit: answer the callers, then let it go on
                    rec.failed += fail_sinks(sinks, BatcherStoppedError(f"{self.name}: batch interrupted"))
                    raise error
        finally:
            if ran:
                assert self._loop is not None
                elapsed = self._loop.time() - batch.started
                rec.record_batch(n, batch.waited, elapsed)
                if self._adaptive is not None:
                    self._adaptive.observe(n, elapsed)
            if batch.generation == self._generation:
                self._in_flight -= 1
                self._pump_or_drain()

    def _pump_or_drain(self) -> None:
        if self._n_waiting:
            self._pump_safely()
        else:
            self._check_drained()

    # ------------------------------------------------------------------ callers from threads

    def process_sync(self, item: T, *, timeout: float | None = None, priority: float = 0) -> R:
        """:meth:`process` for sync code: blocks the calling thread until the result (or ``timeout``).

        The item goes to the event loop the batcher runs on, in another thread; a batcher not bound to a live
        loop starts one on a daemon thread of its own, which :meth:`stop` or :meth:`stop_sync` ends. On timeout
        an item not yet sent is withdrawn and ``TimeoutError`` raised. Called from a thread that runs an event
        loop it raises ``RuntimeError`` (it would block that loop): await :meth:`process` there.
        """
        refuse_on_loop_thread(f"{self.name}: process_sync()")
        timeout, loop = _sync_timeout(timeout), self._sync_loop()
        return call_blocking(loop, self.process(item, priority=priority), timeout)

    def process_many_sync(
        self,
        items: Iterable[T],
        *,
        timeout: float | None = None,
        priority: float = 0,
        return_exceptions: bool = False,
    ) -> list[R]:
        """:meth:`process_many` for sync code, as :meth:`process_sync`."""
        refuse_on_loop_thread(f"{self.name}: process_many_sync()")
        timeout, loop = _sync_timeout(timeout), self._sync_loop()
        call = self.process_many(items, priority=priority, return_exceptions=return_exceptions)
        return call_blocking(loop, call, timeout)

    def stop_sync(self, force: bool = False, timeout: float | None = None) -> None:
        """:meth:`stop` for sync code: blocks until the batcher is stopped; ends the loop thread it started."""
        refuse_on_loop_thread(f"{self.name}: stop_sync()")
        loop = self._loop
        if loop is not None and not loop.is_closed() and self._state in (_RUNNING, _STOPPING):
            call_blocking(loop, self.stop(force=force, timeout=timeout), None)
        self._loop_thread.stop()

    def _sync_loop(self) -> asyncio.AbstractEventLoop:
        """The loop a blocking call goes to: the batcher's own, if it is alive; else the batcher's loop thread."""
        loop = self._loop
        if loop is not None and not loop.is_closed() and (self._state in (_RUNNING, _STOPPING) or loop.is_running()):
            return loop  # bound, or used before on a loop that still runs: the item goes there
        if self._state == _STOPPED:
            self._recorder.rejected += 1
            raise BatcherStoppedError(f"{self.name} is stopped; start() it again to submit items")
        return self._loop_thread.start(owner=self)

    # ------------------------------------------------------------------ statistics

    @property
    def stats(self) -> BatcherStats:
        """A frozen snapshot of the counters and recent latency percentiles."""
        return self._recorder.snapshot(self.name, self._n_waiting, self._in_flight)

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.name!r} {self._state} max_batch_size={self._max_batch_size} "
            f"max_queue_time={self._max_queue_time} concurrency={self._concurrency} "
            f"queued={self._n_waiting} in_flight={self._in_flight}>"
        )


def _check_limit(name: str, value: object, *, allow_zero: bool) -> int:
    """A count that is >= 1, or -1 for no limit (and 0 too where ``allow_zero``)."""
    ok = (
        isinstance(value, int)
        and not isinstance(value, bool)
        and (value >= 1 or value == -1 or (allow_zero and value == 0))
    )
    if not ok:
        zero = ", 0" if allow_zero else ""
        raise ValueError(f"{name} must be an int >= 1 or -1{zero} for no limit, got {value!r}")
    return cast(int, value)


def _check_priority(priority: object) -> None:
    if not is_number(priority) or math.isnan(priority):
        raise ValueError(f"priority must be a number, got {priority!r}")


def _check_timeout(timeout: object) -> float:
    if not finite_at_least(timeout, 0):
        raise ValueError(f"timeout must be None or a finite number of seconds >= 0, got {timeout!r}")
    return float(timeout)


def _sync_timeout(timeout: float | None) -> float | None:
    return None if timeout is None else _check_timeout(timeout)


def _expire_waiter(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError("no room in the queue within the timeout"))
