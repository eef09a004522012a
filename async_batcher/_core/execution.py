"""How a batch runs and ends: the coroutine path and the executor path side by side, then answer, fail, release
(private).

- An ``async def process_batch`` runs as a task of its own (:meth:`Runner.run_batch`); so does any batch formed
  before ``on_start()`` has finished, which waits for it first.
- A plain ``def process_batch`` goes to its executor straight from the dispatcher (:meth:`Runner.to_executor`), not
  from a task: a task would start an event-loop iteration later, and a busy loop's iteration is long (2.3 ms of an
  8 ms batch cycle, measured on the Keras example under load), time in which the executor's thread sits idle. Its
  end comes back the same way, straight to :meth:`Runner.executor_done`. If it returns an awaitable, that runs on
  the loop.

Every path ends in :meth:`Runner.end`: the callers get their results (:meth:`Runner.answer`) or the error
(:meth:`Runner.fail`), then the batch frees its slot (:meth:`Runner.release`), which tells the engine through the
callback it gave (``on_end``). One signal, :attr:`Batch.abandoned`, tells a batch that a forced stop (or an internal
error) has already answered its callers and freed its slot: whatever it does from then on reaches no one.

A :class:`Runner` is one run's way of running batches: its loop, its context, how ``process_batch`` is called, the
start line of ``on_start()``; the batcher (its hooks, name, executor) as :class:`Hooks`.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import threading
from collections.abc import Callable, Hashable
from functools import partial
from typing import TYPE_CHECKING, Any, Final, Protocol

from async_batcher._checks import plural
from async_batcher._core.policy import Reason
from async_batcher._core.sinks import as_results, deliver, fail_sinks, without_departed
from async_batcher.exceptions import AsyncBatchException, BatcherStoppedError, ProcessBatchCancelledError

if TYPE_CHECKING:
    import concurrent.futures

    from async_batcher._core.forming import Taken
    from async_batcher._core.queue import Lane
    from async_batcher.stats import _Recorder

__all__: list[str] = []

logger = logging.getLogger("async_batcher")

# The batch whose process_batch is running, in its task (and the tasks it starts) or its thread: a call from there
# that would wait for a slot its own batch holds is refused instead of waiting forever.
current_batch: contextvars.ContextVar[Batch | None] = contextvars.ContextVar("async_batcher_batch", default=None)
thread_batch = threading.local()

# What the executor returns for a batch that a forced stop abandoned before it started.
_ABANDONED: Final = object()


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


def _ignore(batch: Batch, callers: int) -> None:
    pass


class Runner:
    """One run's way of running batches (see the module's docstring)."""

    def __init__(
        self,
        hooks: Hooks,
        loop: asyncio.AbstractEventLoop,
        recorder: _Recorder,
        context: contextvars.Context,
    ) -> None:
        self.hooks = hooks
        self.name = hooks.name
        self.loop = loop
        self.recorder = recorder
        self.context = context  # the run's own: every batch runs in a copy of it
        process_batch = hooks.process_batch
        self.by_keyword = _by_keyword(process_batch)  # process_batch(batch=...): its parameter's name is batch
        self.is_coroutine = inspect.iscoroutinefunction(process_batch)  # a task, else the executor
        self.is_stream = False  # its items are streamed (a StreamRunner's)
        self.startup: asyncio.Task[None] | None = None  # on_start(): the first batch waits for it
        # The last batch in line for on_start(): set once it has passed, so that the batches formed after it,
        # which see on_start() done, still reach process_batch after it (in the order they were formed).
        self.start_line: asyncio.Future[None] | None = None
        # The engine's: a batch has freed its slot, having answered this many callers.
        self.on_end: Callable[[Batch, int], None] = _ignore
        # The engine's, for continuous batching: items of the batch's lane join it (how many).
        self.join: Callable[[Batch], int] = lambda batch: 0
        self.stall_limit = float("inf")  # stream_stall_timeout, or inf (a stream's wait for a slow consumer)

    def call(self, items: list[Any]) -> Any:
        """``process_batch(batch=items)`` where its parameter is named ``batch`` (as 0.2.2 called it), else by
        position."""
        return self.hooks.process_batch(batch=items) if self.by_keyword else self.hooks.process_batch(items)

    # ------------------------------------------------------------------ launching

    def launch(self, batch: Batch) -> None:
        """Send a batch on its way, on its ``process_batch``'s path. Its task runs in the batch's own context, never
        in the one that happens to run the dispatcher (a caller's, or the batch that just ended)."""
        batch.context = self.context.copy()
        startup = self.startup
        if self.is_coroutine or (startup is not None and (not _succeeded(startup) or self.start_line is not None)):
            batch.handle = self.loop.create_task(self.run_batch(batch), context=batch.context)
        else:
            self.to_executor(batch)

    async def wait_for_start(self, startup: asyncio.Task[None]) -> None:
        """Wait for ``on_start()``, and for the batches formed before this one that wait for it too: a batch formed
        as ``on_start()`` ends sees it done, but must not reach ``process_batch`` before the batches in line."""
        ahead = self.start_line
        if ahead is None and startup.done():
            startup.result()  # on_start() failed: this batch's callers get its error
            return
        passed = self.loop.create_future()
        self.start_line = passed
        try:
            await asyncio.shield(startup)
            if ahead is not None:
                await asyncio.shield(ahead)  # shielded: this batch's cancellation must not cancel the one ahead
        finally:
            if not passed.done():
                passed.set_result(None)
            if self.start_line is passed:
                self.start_line = None

    # ------------------------------------------------------------------ the coroutine path

    async def run_batch(self, batch: Batch) -> None:
        """A batch as a task: a coroutine ``process_batch``, or any batch formed before ``on_start()`` finished."""
        ran = False
        try:
            if self.startup is not None:
                await self.wait_for_start(self.startup)
            # A caller may have left since the batch was formed (this task starts an iteration later): its item
            # must not reach process_batch.
            batch.items, batch.sinks, batch.contexts = without_departed(
                batch.items, batch.sinks, batch.contexts, futures_only=batch.futures_only
            )
            batch.size = len(batch.items)
            if not batch.items:
                self.release(batch)
                return
            if not self.is_coroutine:  # a plain process_batch that had to wait for on_start(): to the executor
                batch.context = self.context.copy()  # (this task is in the batch's first one: the thread's own)
                self.to_executor(batch)
                return
            current_batch.set(batch)
            ran = batch.entered = True
            results = await self.call(batch.items)
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                # Cancelled from outside: a forced stop (which answered the callers already), or the loop shutting
                # down, whose callers must not be left waiting.
                stopped = BatcherStoppedError(f"{self.name}: batch cancelled")
                error = stopped if batch.abandoned else self.stopped_error(batch, stopped)
                self.end(batch, error=error, ran=ran, cut_off=True)
                raise
            self.end(batch, error=exc, ran=ran)
        except BaseException as exc:  # on_start() failed, or process_batch did: its callers get the error
            if self.loop.is_closed():
                raise  # (GeneratorExit) the task is destroyed with its closed loop: nobody is left to answer
            self.end(batch, error=exc, ran=ran)
        else:
            self.end(batch, results=results, ran=ran)

    # ------------------------------------------------------------------ the executor path

    def to_executor(self, batch: Batch) -> None:
        """Send a batch to the executor (a plain ``process_batch``); :meth:`executor_done` takes its end. The thread
        runs it in the batch's own context: nothing it sets stays in the thread for the next batch."""
        loop = self.loop
        executor = self.hooks.executor
        future: Any
        try:
            if executor is None:
                future = loop.run_in_executor(None, batch.context.run, self.in_thread, batch)
                future.add_done_callback(partial(self.executor_done, batch))
            else:
                future = executor.submit(batch.context.run, self.in_thread, batch)
                future.add_done_callback(partial(_call_soon_on, loop, partial(self.executor_done, batch)))
        except Exception as exc:  # the executor refused it (shut down, say): as if process_batch had raised
            # Answered from the next iteration: this may run inside the dispatcher, which must not be re-entered.
            loop.call_soon(partial(self.end, batch, error=exc, ran=False))
            return
        batch.handle = future

    def in_thread(self, batch: Batch) -> Any:
        """What the executor runs: ``process_batch``, unless a forced stop answered the callers before it started."""
        batch.entered = True  # (before abandoned is read: see Batch.entered)
        if batch.abandoned:
            return _ABANDONED
        thread_batch.batch = batch
        current_batch.set(batch)  # (in the batch's context, which this thread runs in)
        try:
            return self.call(batch.items)
        finally:
            thread_batch.batch = None

    def executor_done(self, batch: Batch, future: Any) -> None:
        """On the loop: a batch sent to the executor has ended."""
        if future.cancelled():  # by the executor (shut down with cancel_futures=True) before it started
            cancelled = ProcessBatchCancelledError(
                f"{self.name}: the executor cancelled a batch of {plural(batch.size, 'item')}"
            )
            self.end(batch, error=cancelled, ran=False)
            return
        error = future.exception()
        results = None if error is not None else future.result()
        if results is _ABANDONED:  # it never reached process_batch: the stop answered its callers, freed its slot
            return
        if error is None and inspect.isawaitable(results) and not batch.abandoned:
            # A sync process_batch that returned an awaitable: it runs on the loop (a coroutine as a task of its
            # own, which a forced stop can cancel), and its outcome is the batch's.
            try:
                awaited = (
                    self.loop.create_task(results, context=batch.context)
                    if inspect.iscoroutine(results)
                    else asyncio.ensure_future(results, loop=self.loop)
                )
            except Exception as exc:  # a future of another loop, say
                self.end(batch, error=exc, ran=True)
                return
            batch.handle = awaited
            awaited.add_done_callback(partial(self._awaited_done, batch))
            return
        self.end(batch, results=results, error=error, ran=True)

    def _awaited_done(self, batch: Batch, future: asyncio.Future[Any]) -> None:
        """The awaitable a sync ``process_batch`` returned has ended."""
        if future.cancelled():  # by a forced stop (the batch is abandoned), else the awaitable was cancelled itself
            self.end(batch, error=asyncio.CancelledError(), ran=True)
        elif future.exception() is not None:
            self.end(batch, error=future.exception(), ran=True)
        else:
            self.end(batch, results=future.result(), ran=True)

    # ------------------------------------------------------------------ the end of a batch

    def end(
        self,
        batch: Batch,
        *,
        results: Any = None,
        error: BaseException | None = None,
        ran: bool,
        cut_off: bool = False,
    ) -> None:
        """A batch has ended with ``results`` or ``error``: answer or fail its callers, then free its slot.

        ``ran``: the batch reached ``process_batch`` (the call counts in the statistics, however it ended).
        ``cut_off``: ``error`` is not ``process_batch``'s but the batcher's, as its task was cancelled from outside.
        A ``KeyboardInterrupt`` or ``SystemExit`` is raised on once the callers have their answer.
        """
        # The batch's task and its context hold the batch (current_batch): let go of them, or they would keep each
        # other, and the batch's items and callers, alive until the cyclic garbage collector runs.
        batch.let_go()
        try:
            if ran:
                self.record(batch)
            if batch.abandoned:
                _discard(results)
                return
            if ran:
                self.recorder.processed += batch.size
            if error is not None:
                batch.answered = self.fail(batch, error, cut_off=cut_off)
            else:
                batch.answered = self.answer(batch, results)
        finally:
            self.release(batch)

    def answer(self, batch: Batch, results: Any) -> int:
        """Hand each caller its result; if the results do not fit the batch, each caller gets why. Return how many
        calls that resolved."""
        try:
            checked = as_results(results, batch.size)
        except Exception as exc:  # the wrong number of results, or not a sequence
            logger.warning("%s: %s", self.name, exc)
            _discard(results)
            return fail_sinks(batch.sinks, exc, self.recorder)
        return deliver(batch.sinks, checked, self.recorder, futures_only=batch.futures_only)

    def fail(self, batch: Batch, error: BaseException, *, cut_off: bool) -> int:
        """Give every caller of the batch still waiting the error (a ``KeyboardInterrupt`` or ``SystemExit`` is
        raised on after); return how many calls that resolved.

        A ``CancelledError`` becomes :class:`ProcessBatchCancelledError`, so that a caller is never mistaken for
        cancelled; a ``BaseException`` that is not an ``Exception`` reaches the callers wrapped. ``cut_off``: the
        error is the batcher's, not ``process_batch``'s: the batch's task was cancelled from outside (the event loop
        shutting down), and the log says so.
        """
        name, items = self.name, plural(batch.size, "item")
        reported: BaseException = error
        if cut_off:
            logger.warning(
                "%s: a batch of %s was cut off, its task cancelled (the event loop shutting down); its callers get %s",
                name,
                items,
                type(error).__name__,
            )
            return fail_sinks(batch.sinks, error, self.recorder)
        if isinstance(error, asyncio.CancelledError):
            reported = ProcessBatchCancelledError(f"{name}: process_batch raised CancelledError on a batch of {items}")
        elif isinstance(error, KeyboardInterrupt | SystemExit):
            reported = BatcherStoppedError(f"{name}: batch interrupted by {type(error).__name__}")
        elif not isinstance(error, Exception):  # GeneratorExit, or a BaseException of the user's
            reported = AsyncBatchException(
                f"{name}: process_batch raised {type(error).__name__}, which is not an Exception, on a batch of {items}"
            )
            reported.__cause__ = error
        if not batch.entered:  # on_start() failed, or the executor refused the batch: not process_batch's doing
            logger.warning("%s: a batch of %s failed before process_batch: %s", name, items, type(error).__name__)
        elif reported is error:
            logger.warning("%s: process_batch raised %s on a batch of %s", name, type(error).__name__, items)
        else:
            logger.warning("%s", reported)  # its message names the batcher
        resolved = fail_sinks(batch.sinks, reported, self.recorder)
        if isinstance(error, KeyboardInterrupt | SystemExit):
            raise error
        return resolved

    def stopped_error(self, batch: Batch, error: BaseException) -> BaseException:
        """What the callers of a batch cut off by a stop get: ``error`` if ``process_batch`` never started on it,
        else what :meth:`AsyncBatcher.abandoned_error` says (its outcome may be unknown). A hook that fails is
        reported through the loop's exception handler, and ``error`` is used."""
        if not batch.entered:
            return error
        try:
            chosen = self.hooks.abandoned_error(batch.items, error)
            if not isinstance(chosen, BaseException):
                raise TypeError(f"abandoned_error() must return an exception instance, got {chosen!r}")
        except Exception as exc:
            self.loop.call_exception_handler(
                {
                    "message": f"{self.name}: {type(self.hooks).__name__}.abandoned_error() failed; its callers get "
                    f"{error!r}",
                    "exception": exc,
                }
            )
            return error
        if chosen is not error and chosen.__cause__ is None:
            chosen.__cause__ = error
        return chosen

    def release(self, batch: Batch) -> None:
        """Free the batch's slot (unless a stop already did): the engine looks again, so that a free slot never
        idles while a batch is due."""
        if batch.abandoned or batch.released:
            return
        batch.released = True
        self.on_end(batch, batch.answered)

    def record(self, batch: Batch) -> None:
        """The statistics of a call of ``process_batch`` that has ended."""
        self.recorder.record_batch(batch.size, batch.waited, self.loop.time() - batch.started, batch.reason)


def _succeeded(task: asyncio.Task[None]) -> bool:
    return task.done() and not task.cancelled() and task.exception() is None


def _call_soon_on(loop: asyncio.AbstractEventLoop, callback: Any, future: Any) -> None:
    """An executor future's done-callback (in the executor's thread): hand ``future`` to ``callback`` on ``loop``."""
    try:
        loop.call_soon_threadsafe(callback, future)
    except RuntimeError:  # the loop is closed: the callers went with it
        pass


def _discard(results: Any) -> None:
    """Results no one will read: a coroutine among them must not warn that it was never awaited."""
    if inspect.iscoroutine(results):
        results.close()


def _by_keyword(process_batch: Any) -> bool:
    """Call ``process_batch(batch=...)`` where its parameter is named ``batch`` (0.2.2's subclasses, keyword-only
    ones too) or it takes ``**kwargs``; by position otherwise (any other name)."""
    try:
        parameters = inspect.signature(process_batch).parameters
    except (TypeError, ValueError):
        return False
    named = parameters.get("batch")
    if named is not None and named.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
        return True
    positional = [p for p in parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    return takes_kwargs and all(p.kind is inspect.Parameter.VAR_POSITIONAL for p in positional)
