"""The stop of a run: the drain (or a forced stop, or one that times out), then ``on_stop()`` (private). The half of
the :class:`~async_batcher._core.lifecycle.Lifecycle` that ends runs; ``stop()`` from inside ``on_start()`` or
``on_stop()`` would wait for itself and is refused (:class:`~async_batcher.ReentrantCallError`).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable
from functools import partial
from typing import TYPE_CHECKING, Any

from async_batcher._checks import plural
from async_batcher._core.state import State
from async_batcher.exceptions import BatcherStoppedError, ReentrantCallError

if TYPE_CHECKING:
    from async_batcher._core.engine import Engine
    from async_batcher._core.lifecycle import Run

__all__: list[str] = []

logger = logging.getLogger("async_batcher")

#: The hook whose task (or a task it started) this is, and its run.
in_hook: contextvars.ContextVar[tuple[Run, str] | None] = contextvars.ContextVar("async_batcher_hook", default=None)


async def run_hook(run: Run, hook: str, awaitable: Awaitable[Any]) -> None:
    """Await a hook in its task, marked as the hook's (:meth:`Lifecycle.inside_hook`) for what it calls."""
    in_hook.set((run, hook))
    await awaitable


class Stopping:
    """How a run stops (see the module's docstring)."""

    # No __dict__ for the Lifecycle, whose slots hold it all (the type checker sees the annotations).
    if not TYPE_CHECKING:
        __slots__ = ()

    # The lifecycle's, which it reads.
    run: Run
    overridden: frozenset[str]

    @property
    def name(self) -> str:
        raise NotImplementedError

    def inside_hook(self, run: Run, hook: str) -> bool:
        raise NotImplementedError

    def _hook_call(self, hook: str) -> Awaitable[None]:
        raise NotImplementedError

    async def stop(self, *, force: bool, timeout: float | None) -> None:
        """The body of :meth:`AsyncBatcher.stop` on the batcher's own loop. ``timeout`` bounds all of it: the drain
        may take it all, or half of it when the batcher overrides ``on_stop()``, which has the rest."""
        run = self.run
        engine = run.engine
        if engine is None or run.state is State.STOPPED:
            return
        loop = engine.loop
        if loop.is_closed():
            engine.finish()  # its loop is gone, and everything it held with it
            return
        if loop is not asyncio.get_running_loop():
            raise RuntimeError(f"{self.name} runs on another event loop; call stop() there")
        task = asyncio.current_task()
        if any(batch.handle is task for batch in engine.dispatcher.batches):
            raise ReentrantCallError(
                f"{self.name}: stop() awaited inside its own process_batch would wait for that batch forever; "
                "stop it from outside the batch"
            )
        for hook, waits in (("on_start", "the batches, which wait for on_start()"), ("on_stop", "on_stop()")):
            if self.inside_hook(run, hook):
                raise ReentrantCallError(f"{self.name}: stop() awaited inside {hook}() would wait for {waits} forever")
        hooked = "on_stop" in self.overridden
        began = loop.time()
        deadline = None if timeout is None else began + timeout
        drain_deadline = None if timeout is None else began + (timeout / 2 if hooked else timeout)
        if run.state is State.RUNNING:
            self._begin_stop(run, engine)
        if force:
            engine.abort(BatcherStoppedError(f"{self.name} was stopped with force=True"))
        drained = run.drained
        if drained is not None:  # (awaiting it done costs nothing)
            try:
                await asyncio.wait_for(asyncio.shield(drained), _left(loop, drain_deadline))
            except TimeoutError:
                logger.warning(
                    "%s: stop(timeout=%s) cut the drain off after %.3g s: %s in flight, %s queued",
                    self.name,
                    timeout,
                    loop.time() - began,
                    plural(engine.dispatcher.in_flight, "batch", "batches"),
                    plural(engine.queue.waiting, "item"),
                )
                engine.abort(BatcherStoppedError(f"{self.name} was stopped: stop(timeout={timeout}) expired"))
        closing = run.closing
        if closing is None:  # (an abort always ends the drain, so this is not reached)
            return
        run.stop_waiters += 1
        given = _left(loop, deadline) if hooked else None  # (without an on_stop() of its own, it ends at once)
        try:
            await asyncio.wait_for(asyncio.shield(closing), given)
        except TimeoutError:
            logger.warning(
                "%s: on_stop() did not finish within the %.3g s left of stop(timeout=%s) after the drain; it is "
                "cancelled",
                self.name,
                given,
                timeout,
            )
            closing.cancel()
            self._finish(run)
        except asyncio.CancelledError:
            # A concurrent stop(timeout=...) gave up on on_stop() and cancelled it (the shield passes that on): the
            # batcher is stopped, and this stop returns. Its own cancellation is raised.
            task = asyncio.current_task()
            if not closing.cancelled() or (task is not None and task.cancelling()):
                raise
        finally:
            run.stop_waiters -= 1

    def _begin_stop(self, run: Run, engine: Engine) -> None:
        """Refuse new items, refuse the callers in line for room, and send what waits without waiting for
        deadlines."""
        run.fast = None
        run.drained = engine.loop.create_future()
        engine.begin_stop(BatcherStoppedError(f"{self.name} is stopping"), partial(self._drained, run, engine))

    def _drained(self, run: Run, engine: Engine) -> None:
        """The drain is over (once): run ``on_stop()``."""
        if run.drained is not None and not run.drained.done():
            run.drained.set_result(None)
        run.closing = engine.loop.create_task(self._finish_stop(run), context=run.context.copy())
        run.closing.add_done_callback(partial(self._closing_done, run))

    async def _finish_stop(self, run: Run) -> None:
        try:
            startup = run.startup
            if startup is not None and not startup.done():
                # on_stop() closes what on_start() opened: only once on_start() has ended, its own cleanup included,
                # and nothing of it runs on after the stop.
                startup.cancel()
                await asyncio.wait([startup])
            if "on_stop" in self.overridden:
                await run_hook(run, "on_stop", self._hook_call("on_stop"))
        finally:
            self._finish(run)

    def _finish(self, run: Run) -> None:
        """The end of a run: no wake-up left, and the state says so."""
        run.fast = None
        if run.engine is not None:
            run.engine.finish()

    def _closing_done(self, run: Run, task: asyncio.Task[None]) -> None:
        # stop() re-raises an on_stop() failure to whoever awaits it; retrieve it here so that a stop nobody awaits
        # still reports it, through the loop's exception handler.
        if not task.cancelled() and task.exception() is not None and not run.stop_waiters:
            assert run.loop is not None
            run.loop.call_exception_handler(
                {"message": f"{self.name}: on_stop() failed", "exception": task.exception(), "task": task}
            )


def _left(loop: asyncio.AbstractEventLoop, deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - loop.time())
