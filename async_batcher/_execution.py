"""How a batch runs and ends: the coroutine path and the executor path side by side, then answer, fail, release
(private).

- An ``async def process_batch`` runs as a task of its own (:func:`run_batch`); so does any batch formed before
  ``on_start()`` has finished, which waits for it first.
- A plain ``def process_batch`` goes to its executor straight from the dispatcher (:func:`to_executor`), not from a
  task: a task would start an event-loop iteration later, and a busy loop's iteration is long (2.3 ms of an 8 ms
  batch cycle, measured on the Keras example under load), time in which the executor's thread sits idle. Its end
  comes back the same way, straight to :func:`executor_done`. If it returns an awaitable, that runs on the loop.

Every path ends in :func:`end`: the callers get their results (:func:`answer`) or the error (:func:`fail`), then
the batch frees its slot (:func:`release`), which tells the dispatcher through the run
(:attr:`~async_batcher._run.Run.batch_ended`). One signal, :attr:`~async_batcher._run.Batch.abandoned`, tells a
batch that a forced stop (or an internal error) has already answered its callers and freed its slot: whatever it
does from then on reaches no one.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import threading
from functools import partial
from typing import TYPE_CHECKING, Any, Final

from async_batcher._checks import plural
from async_batcher._sinks import as_results, deliver, fail_sinks, without_departed
from async_batcher.exceptions import AsyncBatchException, BatcherStoppedError, ProcessBatchCancelledError

if TYPE_CHECKING:
    from async_batcher._base import Base
    from async_batcher._run import Batch, Run

__all__: list[str] = []

logger = logging.getLogger("async_batcher")

# The batch whose process_batch is running, in its task (and the tasks it starts) or its thread: a call from there
# that would wait for a slot its own batch holds is refused instead of waiting forever.
current_batch: contextvars.ContextVar[Batch | None] = contextvars.ContextVar("async_batcher_batch", default=None)
thread_batch = threading.local()

# What the executor returns for a batch that a forced stop abandoned before it started.
_ABANDONED: Final = object()


def call_process_batch(b: Base, run: Run, items: list[Any]) -> Any:
    """``process_batch(batch=items)`` where its parameter is named ``batch`` (as 0.2.2 called it), else by position."""
    return b.process_batch(batch=items) if run.by_keyword else b.process_batch(items)


# ---------------------------------------------------------------------- the coroutine path


async def wait_for_start(run: Run, startup: asyncio.Task[None]) -> None:
    """Wait for ``on_start()`` (``startup``), and for the batches formed before this one that wait for it too: a
    batch formed as ``on_start()`` ends sees it done, but must not reach ``process_batch`` before the batches
    already in line."""
    ahead = run.start_line
    if ahead is None and startup.done():
        startup.result()  # on_start() failed: this batch's callers get its error
        return
    passed = run.loop.create_future()
    run.start_line = passed
    try:
        await asyncio.shield(startup)
        if ahead is not None:
            await asyncio.shield(ahead)  # shielded: this batch's cancellation must not cancel the one ahead
    finally:
        if not passed.done():
            passed.set_result(None)
        if run.start_line is passed:
            run.start_line = None


async def run_batch(b: Base, batch: Batch) -> None:
    """A batch as a task: a coroutine ``process_batch``, or any batch formed before ``on_start()`` finished."""
    run = batch.run
    ran = False
    try:
        if run.startup is not None:
            await wait_for_start(run, run.startup)
        # A caller may have left since the batch was formed (this task starts an iteration later): its item must
        # not reach process_batch.
        batch.items, batch.sinks, batch.contexts = without_departed(
            batch.items, batch.sinks, batch.contexts, futures_only=batch.futures_only
        )
        batch.size = len(batch.items)
        if not batch.items:
            release(batch)
            return
        if not run.is_coroutine:  # a plain process_batch that had to wait for on_start(): on to the executor
            batch.context = run.context.copy()  # (this task is in the batch's first one: the thread gets its own)
            to_executor(b, batch)
            return
        current_batch.set(batch)
        ran = batch.entered = True
        results = await call_process_batch(b, run, batch.items)
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            # Cancelled from outside: a forced stop (which answered the callers already), or the loop shutting
            # down, whose callers must not be left waiting.
            stopped = BatcherStoppedError(f"{b.name}: batch cancelled")
            error = stopped if batch.abandoned else stopped_error(b, batch, stopped)
            end(b, batch, error=error, ran=ran, cut_off=True)
            raise
        end(b, batch, error=exc, ran=ran)
    except BaseException as exc:  # on_start() failed, or process_batch did: its callers get the error
        if run.loop.is_closed():
            raise  # (GeneratorExit) the task is destroyed with its closed loop: nobody is left to answer
        end(b, batch, error=exc, ran=ran)
    else:
        end(b, batch, results=results, ran=ran)


# ---------------------------------------------------------------------- the executor path


def to_executor(b: Base, batch: Batch) -> None:
    """Send a batch to the executor (a plain ``process_batch``); :func:`executor_done` takes its end. The thread
    runs it in the batch's own context: nothing it sets stays in the thread for the next batch."""
    loop = batch.run.loop
    future: Any
    try:
        if b.executor is None:
            future = loop.run_in_executor(None, batch.context.run, in_thread, b, batch)
            future.add_done_callback(partial(executor_done, b, batch))
        else:
            future = b.executor.submit(batch.context.run, in_thread, b, batch)
            future.add_done_callback(partial(_call_soon_on, loop, partial(executor_done, b, batch)))
    except Exception as exc:  # the executor refused it (shut down, say): as if process_batch had raised
        # Answered from the next iteration: this may run inside the pump, which must not be re-entered.
        loop.call_soon(partial(end, b, batch, error=exc, ran=False))
        return
    batch.handle = future


def in_thread(b: Base, batch: Batch) -> Any:
    """What the executor runs: ``process_batch``, unless a forced stop answered the callers before it started."""
    batch.entered = True  # (before abandoned is read: see _run.Batch.entered)
    if batch.abandoned:
        return _ABANDONED
    thread_batch.batch = batch
    current_batch.set(batch)  # (in the batch's context, which this thread runs in)
    try:
        return call_process_batch(b, batch.run, batch.items)
    finally:
        thread_batch.batch = None


def _call_soon_on(loop: asyncio.AbstractEventLoop, callback: Any, future: Any) -> None:
    """An executor future's done-callback (in the executor's thread): hand ``future`` to ``callback`` on ``loop``."""
    try:
        loop.call_soon_threadsafe(callback, future)
    except RuntimeError:  # the loop is closed: the callers went with it
        pass


def executor_done(b: Base, batch: Batch, future: Any) -> None:
    """On the loop: a batch sent to the executor has ended."""
    if future.cancelled():  # by the executor (shut down with cancel_futures=True) before it started
        cancelled = ProcessBatchCancelledError(
            f"{b.name}: the executor cancelled a batch of {plural(batch.size, 'item')}"
        )
        end(b, batch, error=cancelled, ran=False)
        return
    error = future.exception()
    results = None if error is not None else future.result()
    if results is _ABANDONED:  # it never reached process_batch: the stop answered its callers, freed its slot
        return
    if error is None and inspect.isawaitable(results) and not batch.abandoned:
        # A sync process_batch that returned an awaitable: it runs on the loop (a coroutine as a task of its own,
        # which a forced stop can cancel), and its outcome is the batch's.
        try:
            awaited = (
                batch.run.loop.create_task(results, context=batch.context)
                if inspect.iscoroutine(results)
                else asyncio.ensure_future(results, loop=batch.run.loop)
            )
        except Exception as exc:  # a future of another loop, say
            end(b, batch, error=exc, ran=True)
            return
        batch.handle = awaited
        awaited.add_done_callback(partial(_awaited_done, b, batch))
        return
    end(b, batch, results=results, error=error, ran=True)


def _awaited_done(b: Base, batch: Batch, future: asyncio.Future[Any]) -> None:
    """The awaitable a sync ``process_batch`` returned has ended."""
    if future.cancelled():  # by a forced stop (the batch is abandoned), else the awaitable was cancelled itself
        end(b, batch, error=asyncio.CancelledError(), ran=True)
    elif future.exception() is not None:
        end(b, batch, error=future.exception(), ran=True)
    else:
        end(b, batch, results=future.result(), ran=True)


# ---------------------------------------------------------------------- the end of a batch


def end(
    b: Base,
    batch: Batch,
    *,
    results: Any = None,
    error: BaseException | None = None,
    ran: bool,
    cut_off: bool = False,
) -> None:
    """A batch has ended with ``results`` or ``error``: answer or fail its callers, then free its slot.

    ``ran``: the batch reached ``process_batch`` (the call counts in the statistics, however it ended).
    ``cut_off``: ``error`` is not ``process_batch``'s but the batcher's, as its task was cancelled from outside. A
    ``KeyboardInterrupt`` or ``SystemExit`` is raised on once the callers have their answer.
    """
    # The batch's task and its context hold the batch (current_batch): let go of them, or they would keep each
    # other, and the batch's items and callers, alive until the cyclic garbage collector runs.
    batch.let_go()
    try:
        if ran:
            record(b, batch)
        if batch.abandoned:
            _discard(results)
            return
        if ran:
            b._recorder.processed += batch.size
        if error is not None:
            batch.answered = fail(b, batch, error, cut_off=cut_off)
        else:
            batch.answered = answer(b, batch, results)
    finally:
        release(batch)


def answer(b: Base, batch: Batch, results: Any) -> int:
    """Hand each caller its result; if the results do not fit the batch, each caller gets why. Return how many
    calls that resolved."""
    try:
        checked = as_results(results, batch.size)
    except Exception as exc:  # the wrong number of results, or not a sequence
        logger.warning("%s: %s", b.name, exc)
        _discard(results)
        return fail_sinks(batch.sinks, exc, b._recorder)
    return deliver(batch.sinks, checked, b._recorder, futures_only=batch.futures_only)


def fail(b: Base, batch: Batch, error: BaseException, *, cut_off: bool) -> int:
    """Give every caller of the batch still waiting the error (a ``KeyboardInterrupt`` or ``SystemExit`` is raised
    on after); return how many calls that resolved.

    A ``CancelledError`` becomes :class:`ProcessBatchCancelledError`, so that a caller is never mistaken for
    cancelled; a ``BaseException`` that is not an ``Exception`` reaches the callers wrapped. ``cut_off``: the error
    is the batcher's, not ``process_batch``'s: the batch's task was cancelled from outside (the event loop shutting
    down), and the log says so.
    """
    n = batch.size
    reported: BaseException = error
    if cut_off:
        logger.warning(
            "%s: a batch of %s was cut off, its task cancelled (the event loop shutting down); its callers get %s",
            b.name,
            plural(n, "item"),
            type(error).__name__,
        )
        return fail_sinks(batch.sinks, error, b._recorder)
    if isinstance(error, asyncio.CancelledError):
        reported = ProcessBatchCancelledError(
            f"{b.name}: process_batch raised CancelledError on a batch of {plural(n, 'item')}"
        )
    elif isinstance(error, KeyboardInterrupt | SystemExit):
        reported = BatcherStoppedError(f"{b.name}: batch interrupted by {type(error).__name__}")
    elif not isinstance(error, Exception):  # GeneratorExit, or a BaseException of the user's
        reported = AsyncBatchException(
            f"{b.name}: process_batch raised {type(error).__name__}, which is not an Exception, on a batch of "
            f"{plural(n, 'item')}"
        )
        reported.__cause__ = error
    if not batch.entered:  # on_start() failed, or the executor refused the batch: not process_batch's doing
        logger.warning(
            "%s: a batch of %s failed before process_batch: %s", b.name, plural(n, "item"), type(error).__name__
        )
    elif reported is error:
        logger.warning("%s: process_batch raised %s on a batch of %s", b.name, type(error).__name__, plural(n, "item"))
    else:
        logger.warning("%s", reported)  # its message names the batcher
    resolved = fail_sinks(batch.sinks, reported, b._recorder)
    if isinstance(error, KeyboardInterrupt | SystemExit):
        raise error
    return resolved


def stopped_error(b: Base, batch: Batch, error: BaseException) -> BaseException:
    """What the callers of a batch cut off by a stop get: ``error`` if ``process_batch`` never started on it, else
    what :meth:`AsyncBatcher.abandoned_error` says (its outcome may be unknown). A hook that fails is reported
    through the loop's exception handler, and ``error`` is used."""
    if not batch.entered:
        return error
    try:
        chosen = b.abandoned_error(batch.items, error)
        if not isinstance(chosen, BaseException):
            raise TypeError(f"abandoned_error() must return an exception instance, got {chosen!r}")
    except Exception as exc:
        batch.run.loop.call_exception_handler(
            {
                "message": f"{b.name}: {type(b).__name__}.abandoned_error() failed; its callers get {error!r}",
                "exception": exc,
            }
        )
        return error
    if chosen is not error and chosen.__cause__ is None:
        chosen.__cause__ = error
    return chosen


def release(batch: Batch) -> None:
    """Free the batch's slot (unless a stop already did) and let the dispatcher look again: a free slot never idles
    while a batch is due."""
    if batch.abandoned:
        return
    run = batch.run
    del run.batches[batch]
    run.in_flight -= 1
    run.batch_ended(batch, batch.answered)


def record(b: Base, batch: Batch) -> None:
    """The statistics of a call of ``process_batch`` that has ended."""
    loop = batch.run.loop
    elapsed = loop.time() - batch.started
    b._recorder.record_batch(batch.size, batch.waited, elapsed)
    if b._adaptive is not None:
        b._adaptive.observe(batch.size, elapsed)


def _discard(results: Any) -> None:
    """Results no one will read: a coroutine among them must not warn that it was never awaited."""
    if inspect.iscoroutine(results):
        results.close()
