"""Blocking calls from threads: which loop each goes to, handed over under one lock (private).

``process_sync``, ``process_many_sync`` and ``stop_sync`` choose the loop a call runs on, and hand the call over to
it, under the lock of the batcher's :class:`~async_batcher._threads.Gate`; a ``stop_sync`` marks the gate first, so
that a blocking call that comes while it runs is refused at once instead of reaching a loop that is about to end.
Together with
:class:`~async_batcher._threads.LoopThread`'s rule (a call handed to its loop runs, or is failed when the loop
ends), no thread is left waiting.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from async_batcher import _checks
from async_batcher._core.batch import thread_batch
from async_batcher._core.state import State
from async_batcher._threads import refuse_on_loop_thread, submit_to, wait_for
from async_batcher.exceptions import BatcherStoppedError, ReentrantCallError

if TYPE_CHECKING:
    from async_batcher.batcher import AsyncBatcher

    Base = AsyncBatcher[Any, Any]

__all__: list[str] = []

S = TypeVar("S")


def call(b: Base, coro: Coroutine[Any, Any, S], *, n: int, timeout: object, what: str) -> S:
    """Run ``coro`` (a call of ``n`` items) on the batcher's loop and block until its result, at most ``timeout``."""
    try:
        refuse_on_loop_thread(f"{b.name}: {what}")
        seconds = _checks.timeout(timeout)
        _refuse_from_own_thread_batch(b)
        future = _hand_over(b, coro, n)
    except BaseException:
        coro.close()
        raise
    return wait_for(future, seconds)


def stop(b: Base, *, force: bool, timeout: float | None) -> None:
    """:meth:`AsyncBatcher.stop_sync`: stop the batcher where it runs, then end its loop thread."""
    refuse_on_loop_thread(f"{b.name}: stop_sync()")
    gate = b._sync
    with gate.lock:
        gate.stopping = True  # blocking calls from now on are refused at once
    try:
        with gate.lock:
            future = _hand_over_stop(b, force=force, timeout=timeout)
        if future is not None:
            wait_for(future, None)
        gate.thread.stop()
    finally:
        with gate.lock:
            gate.stopping = False


def _hand_over(b: Base, coro: Coroutine[Any, Any, S], n: int) -> concurrent.futures.Future[S]:
    """The loop a blocking call goes to: the batcher's, if it is alive; else the batcher's own loop thread."""
    gate = b._sync
    with gate.lock:
        run = b._life.run
        loop = run.loop
        if gate.stopping or run.state is State.STOPPED:
            b._recorder.rejected(n, "stopped")
            raise BatcherStoppedError(f"{b.name} is {'stopping' if gate.stopping else 'stopped'}")
        live = loop is not None and not loop.is_closed()
        if (
            live
            and loop is not None
            and (run.state is not State.NEW or loop.is_running())
            and loop is not gate.thread.loop
        ):
            # Bound to a live loop (an app's), or marked to start again on one that still runs.
            return submit_to(loop, coro, b.name)
        return gate.thread.submit(coro, owner=b)


def _hand_over_stop(b: Base, *, force: bool, timeout: float | None) -> concurrent.futures.Future[None] | None:
    run, thread_loop = b._life.run, b._sync.thread.loop
    coro = b._life.stop(force=force, timeout=timeout)
    if thread_loop is not None and (run.loop is thread_loop or run.state is State.NEW):
        # After the calls handed over before it: those on their way are served (or refused), not lost.
        return b._sync.thread.submit(coro)
    if run.state in (State.RUNNING, State.STOPPING) and run.loop is not None and not run.loop.is_closed():
        return submit_to(run.loop, coro, f"{b.name}: stop_sync()")
    coro.close()
    return None


def _refuse_from_own_thread_batch(b: Base) -> None:
    # A blocking call from inside this batcher's sync process_batch, with every slot taken, would wait for the
    # very batch its thread is running.
    inside = getattr(thread_batch, "batch", None)
    engine = b._life.run.engine
    if inside is not None and engine is not None and inside.owner is engine.dispatcher and engine.waits_for_itself():
        raise ReentrantCallError(
            f"{b.name}: a blocking call from inside its own process_batch while every slot (concurrency="
            f"{b.concurrency}) is taken would wait for that batch forever"
        )
