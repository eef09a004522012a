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
import concurrent.futures
import contextvars
import inspect
import logging
import math
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, Final

from async_batcher._checks import plural
from async_batcher._core.batch import NOT_RETURNED, Batch, Hooks, current_batch, thread_batch
from async_batcher._core.ending import Ending
from async_batcher._core.outcomes import Outcomes
from async_batcher.exceptions import BatcherStoppedError, ProcessBatchCancelledError

if TYPE_CHECKING:
    from async_batcher._core.feedback import Feedback
    from async_batcher._core.recovery import Recovery
    from async_batcher.stats import _Recorder

__all__: list[str] = []

logger = logging.getLogger("async_batcher")

# What the executor returns for a batch that a forced stop abandoned before it started.
_ABANDONED: Final = object()


class Runner(Ending):
    """One run's way of running batches (see the module's docstring)."""

    def __init__(
        self,
        hooks: Hooks,
        loop: asyncio.AbstractEventLoop,
        recorder: _Recorder,
        context: contextvars.Context,
        *,
        on_end: Callable[[Batch, int], None],
        join: Callable[[Batch], int],
        feedback: Feedback,
        calls: list[Callable[[Batch], None]] | None = None,
    ) -> None:
        self.hooks = hooks
        self.name = hooks.name
        self.loop = loop
        self.clock: Callable[[], float] = loop.time  # the loop's clock (the engine's, in C where it can be)
        self.recorder = recorder
        self.context = context  # the run's own: every batch runs in a copy of it
        process_batch = hooks.process_batch
        self.by_keyword = _by_keyword(process_batch)  # process_batch(batch=...): its parameter's name is batch
        self.is_coroutine = inspect.iscoroutinefunction(process_batch)  # a task, else the executor
        self.is_stream = False  # its items are streamed (a StreamRunner's)
        # The standard loop's run_in_executor adds nothing the batch needs (a loop that must know of its threads, as
        # the testing kit's virtual clock does, has its own): a batch goes straight to a batcher's own executor.
        self.direct = type(loop).run_in_executor is asyncio.BaseEventLoop.run_in_executor
        self.startup: asyncio.Task[None] | None = None  # on_start(): the first batch waits for it
        # The last batch in line for on_start(): set once it has passed, so that the batches formed after it,
        # which see on_start() done, still reach process_batch after it (in the order they were formed).
        self.start_line: asyncio.Future[None] | None = None
        # The engine's: a batch has freed its slot, having answered this many callers.
        self.on_end = on_end
        # The engine's, for continuous batching: items of the batch's lane join it (how many).
        self.join = join
        self.stall_limit = math.inf  # stream_stall_timeout, or inf (a stream's wait for a slow consumer)
        # on_batch_error, retry, split_on: what a failed call leads to (None: its callers get the error); and what
        # the engine is told of it.
        self.recovery: Recovery | None = None
        self.feedback = feedback
        self.outcomes = Outcomes(self.name, recorder)  # how the callers of its batches get their outcomes
        # Told of each call of process_batch as it begins, with what it is handed (async_batcher.testing's).
        self.calls: list[Callable[[Batch], None]] = [] if calls is None else calls

    def recover_with(self, recovery: Recovery | None) -> None:
        """The failure settings as they are now (``None``: off; a streaming batch handles its failures itself),
        bound to this runner's outcomes, feedback and loop."""
        self.recovery = (
            None if recovery is None or self.is_stream else recovery.bound(self.outcomes, self.feedback, self.loop)
        )

    def start_after(self, startup: asyncio.Task[None]) -> None:
        """``on_start()`` runs as ``startup``: the batches formed before it ends wait for it, in order."""
        self.startup = startup

    def calling(self, batch: Batch) -> None:
        """A call of ``process_batch`` begins, on ``batch.items`` (those of its callers still waiting, or of a part of
        it): tell who watches the calls."""
        for called in self.calls:
            called(batch)

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
            batch.drop_departed()
            if not batch.items:
                self.end(batch, results=(), ran=False)
                return
            if not self.is_coroutine:  # a plain process_batch that had to wait for on_start(): to the executor
                batch.context = self.context.copy()  # (this task is in the batch's first one: the thread's own)
                self.to_executor(batch)
                return
            current_batch.set(batch)
            if self.recovery is not None:
                batch.kept = batch.items.copy()  # (process_batch may change its list: a failure needs the items)
            if self.calls:
                self.calling(batch)
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
        if self.recovery is not None:
            batch.kept = batch.items.copy()  # (process_batch may change its list: a failure needs the items)
        batch.returned = NOT_RETURNED  # (a part of a failed batch goes again: not what the call before returned)
        try:
            if executor is not None and self.direct and not loop.is_closed():
                # What the standard loop's run_in_executor does, without its asyncio future chained to the
                # executor's (one more turn of the loop per batch): the end comes back through call_soon_threadsafe.
                future: Any = executor.submit(batch.context.run, self.in_thread, batch)
                future.add_done_callback(partial(_back, loop, self.executor_done, batch))
            else:
                # Through the loop: the loop's default executor, or a loop that must know when its threads work
                # (the testing kit's virtual clock, which must not jump ahead of one) sees every batch's thread.
                future = loop.run_in_executor(executor, batch.context.run, self.in_thread, batch)
                future.add_done_callback(partial(self.executor_done, batch))
        except Exception as exc:  # the executor refused it (shut down, say): as if process_batch had raised
            # Answered from the next iteration: this may run inside the dispatcher, which must not be re-entered.
            loop.call_soon(partial(self.end, batch, error=exc, ran=False))
            return
        batch.handle = future
        if self.calls:
            self.calling(batch)

    def in_thread(self, batch: Batch) -> Any:
        """What the executor runs: ``process_batch``, unless a forced stop answered the callers before it started."""
        batch.entered = True  # (before abandoned is read: see Batch.entered)
        if batch.abandoned:
            return _ABANDONED
        thread_batch.batch = batch
        current_batch.set(batch)  # (in the batch's context, which this thread runs in)
        try:
            returned = batch.returned = self.call(batch.items)
            return returned
        finally:
            thread_batch.batch = None

    def executor_done(self, batch: Batch, future: Any) -> None:
        """On the loop: a batch sent to the executor has ended (``future``: the executor's own, or the loop's
        asyncio future of it)."""
        results = batch.returned
        if results is NOT_RETURNED:  # it raised, or never reached process_batch: the future says which
            try:
                error = future.exception()  # (each question to the executor's future takes its lock: one fewer)
            except (asyncio.CancelledError, concurrent.futures.CancelledError):
                # By the executor (shut down with cancel_futures=True) before it started.
                cancelled = ProcessBatchCancelledError(
                    f"{self.name}: the executor cancelled a batch of {plural(batch.size, 'item')}"
                )
                self.end(batch, error=cancelled, ran=False)
                return
            if error is not None:
                self.end(batch, error=error, ran=True)
                return
            results = future.result()
        else:  # process_batch returned (the common case): its future is not asked
            batch.returned = NOT_RETURNED
        # (A list, a tuple or None, the common answers, is neither the marker nor an awaitable: no look needed.)
        kind = results.__class__
        if kind is list or kind is tuple or results is None:
            self.end(batch, results=results, ran=True)
            return
        self.returned(batch, results)

    def returned(self, batch: Batch, results: Any) -> None:
        """:meth:`executor_done` of what is not a list, a tuple or ``None``: the marker of a batch a stop abandoned,
        an awaitable to run on the loop, or results of another kind."""
        if results is _ABANDONED:  # it never reached process_batch: the stop answered its callers, freed its slot
            return
        if inspect.isawaitable(results) and not batch.abandoned:
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
        self.end(batch, results=results, ran=True)

    def _awaited_done(self, batch: Batch, future: asyncio.Future[Any]) -> None:
        """The awaitable a sync ``process_batch`` returned has ended."""
        if future.cancelled():  # by a forced stop (the batch is abandoned), else the awaitable was cancelled itself
            self.end(batch, error=asyncio.CancelledError(), ran=True)
        elif future.exception() is not None:
            self.end(batch, error=future.exception(), ran=True)
        else:
            self.end(batch, results=future.result(), ran=True)


def _back(loop: asyncio.AbstractEventLoop, done: Callable[[Batch, Any], None], batch: Batch, future: Any) -> None:
    """In the executor's thread, as a batch ends there: its end to the loop (as the standard loop's asyncio future of
    it would be), unless the loop has closed meanwhile: no one is left to answer."""
    if not loop.is_closed():
        loop.call_soon_threadsafe(done, batch, future)


def _succeeded(task: asyncio.Task[None]) -> bool:
    return task.done() and not task.cancelled() and task.exception() is None


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
