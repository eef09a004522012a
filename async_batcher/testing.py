"""Tools for testing code that uses a batcher: an event loop on virtual time, a flush, a log of every batch, and the
batcher's own checks.

Batching is about time (how long an item waits, which items share a batch), and tests that sleep on the wall clock
are slow and flaky. On :class:`VirtualClockLoop` the clock jumps straight to the next timer whenever nothing else
can run: ``await asyncio.sleep(10)`` takes no time, and a batch's ``max_queue_time`` passes exactly.

.. code-block:: python

    import asyncio

    from async_batcher import AsyncBatcher
    from async_batcher.testing import flush, record_batches, run

    class Doubler(AsyncBatcher[int, int]):
        async def process_batch(self, batch: list[int]) -> list[int]:
            return [x * 2 for x in batch]

    async def main() -> None:
        async with Doubler(max_queue_time=5.0) as b:
            with record_batches(b) as log:
                calls = [asyncio.ensure_future(b.process(i)) for i in range(3)]
                await asyncio.sleep(0)  # the calls submit their items
                await flush(b)  # sent now, whatever max_queue_time says
            assert [r.items for r in log] == [[0, 1, 2]] and log[0].reason == "flush"
            assert await asyncio.gather(*calls) == [0, 2, 4]

    run(main())  # or, with pytest-asyncio, its loop factories hook (see the testing guide)

What it reads of a batcher is the package's own; none of it is needed in production.
"""

from __future__ import annotations

import asyncio
import contextlib
import selectors
import threading
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from async_batcher._checks import plural
from async_batcher._core.batch import Batch
from async_batcher._core.engine import Engine
from async_batcher._core.engine import violations as _violations
from async_batcher._core.marks import still_queued, waiting_now
from async_batcher._core.policy import Reason
from async_batcher._core.queue import DEFAULT_KEY
from async_batcher.exceptions import ReentrantCallError

if TYPE_CHECKING:
    from collections.abc import Hashable

    from async_batcher.batcher import AsyncBatcher

__all__ = [
    "BatchRecord",
    "VirtualClockLoop",
    "VirtualClockPolicy",
    "flush",
    "idle",
    "record_batches",
    "run",
    "violations",
]

T = TypeVar("T")


class _JumpSelector(selectors.DefaultSelector):
    """Polls for real; when nothing is ready and a timer is pending, advances the virtual clock to it."""

    def __init__(self, loop: VirtualClockLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[Any]:
        events = super().select(0)
        if events or timeout == 0:
            return events
        if timeout is None or self._loop.busy_threads:
            # Nothing scheduled, or a thread is working: wait for real (the thread wakes the loop).
            return super().select(timeout if timeout is None else None)
        self._loop.advance(timeout)
        return []


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time: ``time()`` starts at 0 and moves only when the loop would otherwise sleep, to
    the next timer. While an executor thread works (``run_in_executor``), the clock stands still and the loop waits
    for the thread for real; sockets and pipes work as on any selector loop."""

    def __init__(self) -> None:
        self._now = 0.0
        self.jumps = 0  # how many times the clock jumped to a timer: each is a wake-up of an idle loop
        self.busy_threads = 0
        super().__init__(selector=_JumpSelector(self))

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` forward (the loop does it whenever it would sleep)."""
        self._now += seconds
        self.jumps += 1

    def timers(self) -> int:
        """The timers scheduled and not cancelled: an idle batcher keeps none."""
        scheduled: list[asyncio.TimerHandle] = vars(self)["_scheduled"]  # (asyncio.BaseEventLoop's heap of timers)
        return sum(not handle.cancelled() for handle in scheduled)

    def run_in_executor(self, executor: Any, func: Callable[..., T], *args: Any) -> asyncio.Future[T]:  # type: ignore[override]
        # While a thread works, time must not jump ahead of it: until its future is done, and while its function
        # runs (a future cancelled leaves its thread running).
        work = _Work(self, func, args)
        self.busy_threads += 1
        try:
            fut = super().run_in_executor(executor, work)
        except BaseException:
            self.busy_threads -= 1
            raise
        fut.add_done_callback(work.future_done)
        return fut

    def _thread_done(self) -> None:
        self.busy_threads -= 1

    async def shutdown_default_executor(self, *args: Any, **kwargs: Any) -> None:
        # Joining the executor's threads happens in a thread, under a timeout (Python 3.12+): the clock must not
        # jump to that timeout while they finish.
        self.busy_threads += 1
        try:
            await super().shutdown_default_executor(*args, **kwargs)
        finally:
            self.busy_threads -= 1


class _Work:
    """A function run in an executor thread by :class:`VirtualClockLoop`, which counts it busy until its future is
    done (the loop has heard of its end: the clock must not jump between the two), or, for a future cancelled while
    the function runs, until the function returns."""

    __slots__ = ("args", "func", "lock", "loop", "state")

    def __init__(self, loop: VirtualClockLoop, func: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.loop = loop
        self.func = func
        self.args = args
        self.lock = threading.Lock()
        # "waiting", then "running" and "returned" in its thread; "dropped": its future was cancelled before it
        # started (it never runs); "orphaned": cancelled while it runs (its end is counted as it returns).
        self.state = "waiting"

    def __call__(self) -> Any:
        with self.lock:
            if self.state == "dropped":
                return None
            self.state = "running"
        try:
            return self.func(*self.args)
        finally:
            with self.lock:
                orphaned, self.state = self.state == "orphaned", "returned"
            if orphaned:
                with contextlib.suppress(RuntimeError):  # (its loop closed meanwhile)
                    self.loop.call_soon_threadsafe(self.loop._thread_done)

    def future_done(self, future: asyncio.Future[Any]) -> None:
        with self.lock:
            if self.state == "running":  # cancelled while it runs: counted busy until it returns
                self.state = "orphaned"
                return
            if self.state == "waiting":
                self.state = "dropped"
        self.loop._thread_done()


class VirtualClockPolicy(asyncio.DefaultEventLoopPolicy):
    """An event loop policy whose new loops are :class:`VirtualClockLoop`: for the ``event_loop_policy`` fixture of
    pytest-asyncio 0.23 to 1.3 (later versions take :class:`VirtualClockLoop` itself from their
    ``pytest_asyncio_loop_factories`` hook), and for any runner that takes a policy."""

    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        return VirtualClockLoop()


def run(main: Coroutine[Any, Any, T], *, debug: bool | None = None) -> T:
    """``asyncio.run(main)`` on a new :class:`VirtualClockLoop`."""
    with asyncio.Runner(debug=debug, loop_factory=VirtualClockLoop) as runner:
        return runner.run(main)


# ---------------------------------------------------------------------- a batcher's batches


async def flush(batcher: AsyncBatcher[Any, Any]) -> None:
    """Send what waits in ``batcher`` now, whatever its settings say (as slots come free: ``concurrency`` holds),
    and return once those batches have ended. The loop runs one turn first, so that tasks created just before the
    call (``asyncio.ensure_future(b.process(x))``) have queued their items; items that arrive later wait as usual,
    also while the flush waits for a busy slot. Of each batch key it sends as many items as waited, the first in line
    (one that came later with a better ``priority`` may take a place; those it kept out go at the next pass)."""
    await asyncio.sleep(0)
    engine = batcher._engine()
    if engine is None:
        return
    queue = engine.queue
    marked = waiting_now(queue.lanes.values())
    ended: asyncio.Future[None] = engine.loop.create_future()
    pending: set[Batch] = set()
    sending = True

    def sent(batch: Batch) -> None:
        if sending:
            pending.add(batch)

    def over(batch: Batch) -> None:
        pending.discard(batch)
        if not sending and not pending and not ended.done():
            ended.set_result(None)

    engine.dispatcher.watchers.append((sent, over))
    try:
        while quota := still_queued(marked):
            engine.dispatcher.flush(quota)
            await asyncio.sleep(0)
            if still_queued(marked) and engine.dispatcher.in_flight >= engine.dispatcher.slot_limit:
                if engine.inside_own_batch():
                    raise ReentrantCallError(
                        f"{batcher.name}: flush() inside its own process_batch with every slot taken would wait for "
                        "that batch forever"
                    )
                await _until_a_slot(engine)
        sending = False
        if pending:
            await ended
    finally:
        engine.dispatcher.watchers.remove((sent, over))


async def _until_a_slot(engine: Engine) -> None:
    freed: asyncio.Future[None] = engine.loop.create_future()

    def over(batch: Batch) -> None:
        if not freed.done():
            freed.set_result(None)

    watcher = (lambda batch: None, over)
    engine.dispatcher.watchers.append(watcher)
    try:
        await freed
    finally:
        engine.dispatcher.watchers.remove(watcher)


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """One batch as it went: its items (as handed to ``process_batch``), its key (``None`` without keys), why it
    went, when (``started``, on the loop's clock), how long each item had waited for it (``waited``, in the order of
    ``items``), and when it ended (``ended``: its slot freed, whether it answered its callers or a forced stop cut it
    off; ``None`` while it runs)."""

    items: list[Any]
    key: Hashable | None
    reason: Reason
    started: float
    waited: tuple[float, ...]
    ended: float | None = None

    @property
    def size(self) -> int:
        """Its number of items."""
        return len(self.items)


@contextmanager
def record_batches(batcher: AsyncBatcher[Any, Any]) -> Iterator[list[BatchRecord]]:
    """Record every call of ``process_batch`` that ``batcher`` makes while inside: a list of :class:`BatchRecord`, in
    the order the calls began, each with what ``process_batch`` was handed (not the items whose callers left before
    the call; a batch all of whose callers left is never called, nor recorded, as ``stats.batches`` counts it), and
    completed with its end. It needs no ``start()`` (the batches of a run started inside are recorded too). A part
    of a failed batch called on its own (bisected by ``on_batch_error``, split by ``split_on``) is a record, with the
    reason ``split``, as ``stats.reasons`` counts it."""
    watchers, calls = batcher._watchers()
    log: list[BatchRecord] = []
    index: dict[Batch, int] = {}

    def close(i: int) -> None:
        record = log[i]
        now = asyncio.get_running_loop().time()
        log[i] = BatchRecord(record.items, record.key, record.reason, record.started, record.waited, now)

    def called(batch: Batch) -> None:
        i = index.get(batch)
        if i is not None:  # a part of a failed batch: the call before it has ended
            close(i)
        key = batch.lane.key
        started = batch.called  # (a batch's first call: when it was formed; a part's: when it is called)
        waited = tuple(started - arrival for arrival in (batch.arrivals or ()))
        index[batch] = len(log)
        log.append(BatchRecord(list(batch.items), None if key is DEFAULT_KEY else key, batch.reason, started, waited))

    def over(batch: Batch) -> None:
        i = index.pop(batch, None)
        if i is not None:
            close(i)

    watcher = (_not_called_yet, over)  # (a batch's end; and its items' arrivals are kept while one watches)
    watchers.append(watcher)
    calls.append(called)
    try:
        yield log
    finally:
        watchers.remove(watcher)
        calls.remove(called)


def _not_called_yet(batch: Batch) -> None:
    pass


# ---------------------------------------------------------------------- the batcher's own checks


def violations(batcher: AsyncBatcher[Any, Any]) -> list[str]:
    """The batcher's internal invariants that do not hold now, described (none, always: a test that finds one has
    found a bug of this package)."""
    engine = batcher._engine()
    return [] if engine is None else _violations(engine)


def idle(batcher: AsyncBatcher[Any, Any]) -> list[str]:
    """Why ``batcher`` is not idle: items queued or in flight, a timer, a pending wake-up, a timeout timer, items
    waiting out a retry backoff; and :func:`violations`. Empty when nothing waits and nothing is scheduled: an idle
    batcher costs nothing."""
    engine = batcher._engine()
    if engine is None:
        return []
    found = []
    if engine.queue.waiting or engine.dispatcher.in_flight:
        queued, flying = plural(engine.queue.waiting, "item"), plural(engine.dispatcher.in_flight, "batch", "batches")
        found.append(f"{queued} queued, {flying} in flight")
    if engine.room.awaiting:
        found.append(f"{plural(engine.room.awaiting, 'item')} of callers in line for room")
    if engine.dispatcher.wakeup.handle is not None:
        found.append(f"a timer for {engine.dispatcher.wakeup.at}")
    if engine.dispatcher.pump_handle is not None and not engine.dispatcher.pump_handle.cancelled():
        found.append(f"a pending wake-up {engine.dispatcher.pump_handle!r}")
    if engine.deadlines.timer is not None:
        found.append("a timeout timer")
    backoffs = engine.feedback.backoffs
    if backoffs.groups:
        found.append(f"{plural(backoffs.waiting, 'item')} waiting out a retry backoff, with a timer")
    return found + _violations(engine)
