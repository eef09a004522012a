"""Blocking calls from threads: :class:`~async_batcher.AsyncBatcher`'s methods for sync code, and which loop each goes
to, handed over under one lock (private; below the public class, which is a :class:`BlockingCalls`).

``process_sync``, ``process_many_sync`` and ``stop_sync`` (:class:`BlockingCalls`) choose the loop a call runs on
(:class:`Blocking`), and hand the call over to it, under the lock of the batcher's
:class:`~async_batcher._threads.Gate`; a ``stop_sync`` marks the gate first, so that a blocking call that comes while
it runs is refused at once instead of reaching a loop that is about to end. Together with
:class:`~async_batcher._threads.LoopThread`'s rule (a call handed to its loop runs, or is failed when the loop ends),
no thread is left waiting.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import weakref
from collections.abc import Coroutine, Iterable
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from async_batcher import _checks
from async_batcher._core.batch import thread_batch
from async_batcher._core.state import State
from async_batcher._threads import Gate, refuse_on_loop_thread, submit_to, wait_for
from async_batcher.exceptions import BatcherStoppedError, ReentrantCallError

if TYPE_CHECKING:
    from async_batcher._core.lifecycle import Lifecycle
    from async_batcher.stats import _Recorder

__all__: list[str] = []

S = TypeVar("S")
T = TypeVar("T")
R = TypeVar("R")


class Blocking:
    """A batcher's blocking calls: its :class:`~async_batcher._threads.Gate` (the lock, the mark of a stop, its own
    loop thread), and what they ask of the batcher's life (its run now, its stop) and statistics."""

    __slots__ = ("gate", "life", "owner", "recorder")

    def __init__(self, owner: object, life: Lifecycle, recorder: _Recorder) -> None:
        self.life = life
        self.recorder = recorder
        self.gate = Gate(life.name)
        # The batcher, weakly: its loop thread is asked to stop when it is garbage-collected.
        self.owner = weakref.ref(owner)

    @property
    def name(self) -> str:
        return self.life.name

    def has_other_thread(self) -> bool:
        """Blocking calls started a loop thread for the batcher, and this is not it: a stop runs there."""
        thread = self.gate.thread
        return thread.loop is not None and not thread.is_current()

    def call(self, coro: Coroutine[Any, Any, S], *, n: int, timeout: object, what: str) -> S:
        """Run ``coro`` (a call of ``n`` items) on the batcher's loop and block until its result, at most
        ``timeout``."""
        try:
            refuse_on_loop_thread(f"{self.name}: {what}")
            seconds = _checks.timeout(timeout)
            self._refuse_from_own_thread_batch()
            future = self._hand_over(coro, n)
        except BaseException:
            coro.close()
            raise
        return wait_for(future, seconds)

    def stop(self, *, force: bool, timeout: float | None) -> None:
        """:meth:`AsyncBatcher.stop_sync`: stop the batcher where it runs, then end its loop thread."""
        refuse_on_loop_thread(f"{self.name}: stop_sync()")
        gate = self.gate
        with gate.lock:
            gate.stopping = True  # blocking calls from now on are refused at once
        try:
            with gate.lock:
                future = self._hand_over_stop(force=force, timeout=timeout)
            if future is not None:
                wait_for(future, None)
            gate.thread.stop()
        finally:
            with gate.lock:
                gate.stopping = False

    def _hand_over(self, coro: Coroutine[Any, Any, S], n: int) -> concurrent.futures.Future[S]:
        """The loop a blocking call goes to: the batcher's, if it is alive; else the batcher's own loop thread."""
        gate = self.gate
        with gate.lock:
            run = self.life.run
            loop = run.loop
            if gate.stopping or run.state is State.STOPPED:
                self.recorder.rejected(n, "stopped")
                raise BatcherStoppedError(f"{self.name} is {'stopping' if gate.stopping else 'stopped'}")
            live = loop is not None and not loop.is_closed()
            if (
                live
                and loop is not None
                and (run.state is not State.NEW or loop.is_running())
                and loop is not gate.thread.loop
            ):
                # Bound to a live loop (an app's), or marked to start again on one that still runs.
                return submit_to(loop, coro, self.name)
            return gate.thread.submit(coro, owner=self.owner())

    def _hand_over_stop(self, *, force: bool, timeout: float | None) -> concurrent.futures.Future[None] | None:
        run, thread = self.life.run, self.gate.thread
        coro = self.life.stop(force=force, timeout=timeout)
        if thread.loop is not None and (run.loop is thread.loop or run.state is State.NEW):
            # After the calls handed over before it: those on their way are served (or refused), not lost.
            return thread.submit(coro)
        if run.state in (State.RUNNING, State.STOPPING) and run.loop is not None and not run.loop.is_closed():
            return submit_to(run.loop, coro, f"{self.name}: stop_sync()")
        coro.close()
        return None

    def _refuse_from_own_thread_batch(self) -> None:
        # A blocking call from inside this batcher's sync process_batch, with every slot taken, would wait for the
        # very batch its thread is running.
        inside = getattr(thread_batch, "batch", None)
        engine = self.life.run.engine
        if inside is not None and engine is not None and engine.blocks_itself(inside):
            raise ReentrantCallError(
                f"{self.name}: a blocking call from inside its own process_batch while every slot (concurrency="
                f"{engine.slots_named()}) is taken would wait for that batch forever"
            )


class BlockingCalls(Generic[T, R]):
    """:class:`~async_batcher.AsyncBatcher`'s calls for sync code (a private base: the reference shows them as the
    batcher's own). Each blocks its thread on a call of the batcher's async methods, handed to its loop by
    :class:`Blocking`."""

    _sync: Blocking

    if TYPE_CHECKING:  # (the batcher's)

        async def process(self, item: T, *, timeout: float | None = None, priority: float = 0) -> R: ...

        async def process_many(
            self,
            items: Iterable[T],
            *,
            timeout: float | None = None,
            priority: float = 0,
            return_exceptions: bool = False,
        ) -> list[R]: ...

    def process_sync(self, item: T, *, timeout: float | None = None, priority: float = 0) -> R:
        """:meth:`process` for sync code: blocks the calling thread until the result (or ``timeout``).

        The item goes to the event loop the batcher runs on, in another thread; a batcher not bound to a live
        loop starts one on a daemon thread of its own, which :meth:`stop` or :meth:`stop_sync` ends. On timeout
        an item not yet sent is withdrawn and ``TimeoutError`` raised. Called from a thread that runs an event
        loop it raises ``RuntimeError`` (it would block that loop): await :meth:`process` there.
        """
        return self._sync.call(self.process(item, priority=priority), n=1, timeout=timeout, what="process_sync()")

    def process_many_sync(
        self, items: Iterable[T], *, timeout: float | None = None, priority: float = 0, return_exceptions: bool = False
    ) -> list[R]:
        """:meth:`process_many` for sync code, as :meth:`process_sync`."""
        batch = list(items)
        call = self.process_many(batch, priority=priority, return_exceptions=return_exceptions)
        return self._sync.call(call, n=len(batch), timeout=timeout, what="process_many_sync()")

    def stop_sync(self, force: bool = False, timeout: float | None = None) -> None:
        """:meth:`stop` for sync code: blocks until the batcher is stopped; ends the loop thread it started."""
        self._sync.stop(force=_checks.flag("force", force), timeout=_checks.timeout(timeout))

    async def _stop_loop_thread(self, force: bool, timeout: float | None) -> None:
        """:meth:`stop`'s first step: where blocking calls started a loop thread for this batcher (and this is not
        it), the stop runs there (:meth:`stop_sync`), then the thread ends."""
        if self._sync.has_other_thread():
            await asyncio.get_running_loop().run_in_executor(None, partial(self.stop_sync, force, timeout))
