"""Callers from threads: a blocking call into an event loop, and an event loop on a thread of its own (private).

A batcher lives on one event loop. Sync code (a Flask or Django view, a worker thread) reaches it with a blocking
call that hands a coroutine to that loop and waits on a :class:`concurrent.futures.Future`. A program with no event
loop at all gets one: a :class:`LoopThread` that the batcher starts at the first blocking call and ends at
``stop()``.

The rule that keeps threads from waiting forever: a coroutine handed to a :class:`LoopThread` either runs on its
loop, or, if the loop ends first, its future fails with :class:`~async_batcher.BatcherStoppedError`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import threading
import weakref
from collections.abc import Coroutine
from functools import partial
from typing import Any, TypeVar

from async_batcher.exceptions import BatcherStoppedError

__all__: list[str] = []

R = TypeVar("R")

logger = logging.getLogger("async_batcher.threads")

# Rounds of "cancel what is left, let it finish" when a loop thread ends: what a cancelled task starts is cancelled in
# the next round.
_SHUTDOWN_ROUNDS = 10


class LoopThread:
    """An event loop running on a daemon thread: started at first use, stopped and joined by :meth:`stop`.

    Thread-safe; it can be started again after a stop (on a new thread, with a new loop).
    """

    def __init__(self, name: str = "async-batcher") -> None:
        self.name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        # Coroutines handed over whose futures are not done yet: failed by the thread when its loop ends.
        self._pending: dict[concurrent.futures.Future[Any], Coroutine[Any, Any, Any]] = {}

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The loop while the thread runs, else ``None``."""
        return self._loop

    def is_current(self) -> bool:
        """Whether the calling thread is this loop's thread."""
        return self._thread is not None and self._thread is threading.current_thread()

    def start(self, owner: object = None) -> asyncio.AbstractEventLoop:
        """Start the thread unless it runs; return its loop, once it is running.

        With an ``owner`` (the batcher), the thread is also asked to stop when the owner is garbage-collected.
        """
        with self._lock:
            if self._loop is not None:
                return self._loop
            if owner is not None and self._finalizer is None:
                self._finalizer = weakref.finalize(owner, self.stop_soon)
            loop = asyncio.new_event_loop()
            running = threading.Event()
            self._pending = {}  # this thread's own: an older thread ending late fails only what was handed to it
            thread = threading.Thread(
                target=self._run, args=(loop, running, self._pending), name=self.name, daemon=True
            )
            thread.start()
            running.wait()
            self._loop, self._thread = loop, thread
            logger.debug("%s: event loop thread started", self.name)
            return loop

    def submit(self, coro: Coroutine[Any, Any, R], *, owner: object = None) -> concurrent.futures.Future[R]:
        """Run ``coro`` on the thread's loop, starting the thread if need be; its future always resolves."""
        self.start(owner)
        with self._lock:
            loop = self._loop
            if loop is None:  # stopped by another thread meanwhile
                coro.close()
                raise BatcherStoppedError(f"{self.name}: the event loop thread was stopped")
            try:
                future: concurrent.futures.Future[R] = asyncio.run_coroutine_threadsafe(coro, loop)
            except RuntimeError:  # its loop ended on its own (an exception out of a callback)
                coro.close()
                raise BatcherStoppedError(f"{self.name}: the event loop thread has ended") from None
            pending = self._pending
            pending[future] = coro
        future.add_done_callback(partial(self._forget, pending))
        return future

    def _forget(self, pending: dict[Any, Any], future: concurrent.futures.Future[Any]) -> None:
        with self._lock:
            pending.pop(future, None)

    def stop(self, timeout: float | None = None) -> None:
        """Stop the loop and wait (at most ``timeout`` seconds) for the thread to end; a no-op if not running.

        Whatever still runs on the loop is cancelled first, so a thread blocked on it is released.
        """
        with self._lock:
            loop, thread = self._loop, self._thread
            if loop is None or thread is None:
                return
            if thread is threading.current_thread():
                raise RuntimeError(f"{self.name}: the event loop thread cannot stop itself")
            self._loop = self._thread = None
        _request_stop(loop)
        thread.join(timeout)
        logger.debug("%s: event loop thread stopped", self.name)

    def stop_soon(self) -> None:
        """Ask the loop to stop, without waiting (a finalizer's way: it may run on any thread)."""
        with self._lock:
            loop, self._loop, self._thread = self._loop, None, None
        if loop is not None:
            _request_stop(loop)

    def _run(
        self,
        loop: asyncio.AbstractEventLoop,
        running: threading.Event,
        pending: dict[concurrent.futures.Future[Any], Coroutine[Any, Any, Any]],
    ) -> None:
        asyncio.set_event_loop(loop)
        loop.call_soon(running.set)
        try:
            loop.run_forever()
            # As asyncio.run does: what is left is cancelled and given the chance to finish.
            for _ in range(_SHUTDOWN_ROUNDS):
                tasks = asyncio.all_tasks(loop)
                if not tasks:
                    break
                for task in tasks:
                    task.cancel()
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            asyncio.set_event_loop(None)
            loop.close()
            self._fail_pending(loop, pending)

    def _fail_pending(
        self,
        loop: asyncio.AbstractEventLoop,
        pending: dict[concurrent.futures.Future[Any], Coroutine[Any, Any, Any]],
    ) -> None:
        # Handed over, but the loop ended before running them: their callers get an answer all the same.
        with self._lock:
            if self._loop is loop:  # it ended on its own, not through stop()
                self._loop = self._thread = None
            left = list(pending.items())
            pending.clear()
        for future, coro in left:
            if inspect.getcoroutinestate(coro) == inspect.CORO_CREATED:
                coro.close()  # it never ran: no "coroutine was never awaited" warning
            if not future.done():
                try:
                    future.set_exception(BatcherStoppedError(f"{self.name}: the event loop thread was stopped"))
                except concurrent.futures.InvalidStateError:  # (cancelled meanwhile by its waiting thread)
                    pass

    def __repr__(self) -> str:
        return f"<LoopThread {self.name!r} {'running' if self._loop is not None else 'stopped'}>"


class Gate:
    """What a batcher's blocking calls share."""

    __slots__ = ("lock", "stopping", "thread")

    def __init__(self, name: str) -> None:
        self.lock = threading.Lock()  # choosing a call's loop and handing the call over happen under it
        self.stopping = False  # a stop_sync() is under way: blocking calls are refused
        self.thread = LoopThread(f"async-batcher:{name}")  # the batcher's own loop, started by a blocking call


def _request_stop(loop: asyncio.AbstractEventLoop) -> None:
    try:
        loop.call_soon_threadsafe(loop.stop)
    except RuntimeError:  # already closed
        pass


def refuse_on_loop_thread(what: str) -> None:
    """Raise ``RuntimeError`` if the calling thread runs an event loop: blocking it could deadlock."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(
        f"{what} blocks the calling thread, and this thread runs an event loop: await the async method instead"
    )


def submit_to(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, R], what: str) -> concurrent.futures.Future[R]:
    """Hand ``coro`` to another thread's running ``loop``; refuse a loop that is not running (it would never run)."""
    if not loop.is_running():
        coro.close()
        raise RuntimeError(
            f"{what}: the batcher is bound to an event loop that is not running, so the call would wait forever; "
            "run that loop, or stop() the batcher there first"
        )
    try:
        return asyncio.run_coroutine_threadsafe(coro, loop)
    except RuntimeError:  # the loop closed meanwhile
        coro.close()
        raise BatcherStoppedError(f"{what}: the event loop is closed") from None


def wait_for(future: concurrent.futures.Future[R], timeout: float | None) -> R:
    """Block until ``future`` (a coroutine running on another thread's loop) resolves, at most ``timeout`` seconds.

    On timeout the coroutine is cancelled, which withdraws an item not yet sent, and ``TimeoutError`` raised.
    """
    try:
        return future.result(timeout)
    except concurrent.futures.TimeoutError:
        if not future.cancel():  # it finished meanwhile (or its own TimeoutError is what it raised)
            return future.result()
        raise TimeoutError(f"no result within {timeout} s") from None
    except concurrent.futures.CancelledError:
        # Cancelled on the loop's side: the loop is shutting down.
        raise BatcherStoppedError("the event loop stopped before the result came") from None
    except BaseException:
        future.cancel()  # KeyboardInterrupt in the waiting thread: the caller leaves (a no-op if it is done)
        raise
