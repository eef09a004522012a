"""A batcher's life: binding to a loop (start), the stop (drain, force, timeout), on_start / on_stop (private).

States (:class:`~async_batcher._run.State`): NEW, then RUNNING once bound to a loop (the first ``process()`` or
``start()`` in a loop), STOPPING from ``stop()`` until its drain ends and ``on_stop()`` has run, then STOPPED. A
stopped batcher starts again as a new run, in the same loop or another.

A hook that would wait for itself is refused at once (:class:`ReentrantCallError`): ``process()``,
``process_many()``, ``stream()`` or ``stop()`` from inside ``on_start()`` (the first batch waits for it), and
``stop()`` from inside ``on_stop()`` (the stop waits for it). "Inside" is the hook's task and the tasks it starts,
while the hook runs (:data:`in_hook`).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
from collections.abc import Awaitable
from functools import partial
from typing import TYPE_CHECKING, Any

from async_batcher import _dispatch, _execution, _room, _streaming
from async_batcher._queue import DEFAULT_KEY
from async_batcher._run import Run, State
from async_batcher.exceptions import BatcherStoppedError, ReentrantCallError

if TYPE_CHECKING:
    from async_batcher._base import Base
from async_batcher._checks import plural

__all__: list[str] = []

logger = logging.getLogger("async_batcher")

#: The hook whose task (or a task it started) this is, and its run.
in_hook: contextvars.ContextVar[tuple[Run, str] | None] = contextvars.ContextVar("async_batcher_hook", default=None)


# ---------------------------------------------------------------------- starting


def admit(b: Base, loop: asyncio.AbstractEventLoop, n: int) -> Run:
    """The run that ``n`` items submitted from ``loop`` join: the running one, or a new one; else refuse them."""
    run = b._run
    if run.loop is loop and run.state is State.RUNNING:
        startup = run.startup
        if startup is not None and not startup.done() and inside_hook(run, "on_start"):
            b._recorder.rejected += n
            raise ReentrantCallError(
                f"{b.name}: an item submitted from inside on_start() would wait for on_start() forever (the first "
                "batch waits for it); warm up by calling process_batch() directly"
            )
        return run
    if run.state is State.NEW or run.state is State.RUNNING:
        return bind(b, loop)  # (which refuses another loop that still runs)
    b._recorder.rejected += n
    raise BatcherStoppedError(f"{b.name} is {run.state.value}; start() it again to submit items")


def inside_hook(run: Run, hook: str) -> bool:
    """Whether the running code is ``hook`` of ``run`` (its task, or a task it started), while the hook runs."""
    if in_hook.get() != (run, hook):
        return False
    task = run.startup if hook == "on_start" else run.closing
    return task is not None and not task.done()


def bind(b: Base, loop: asyncio.AbstractEventLoop, context: contextvars.Context | None = None) -> Run:
    """Make the batcher run on ``loop``: start it, or start it again after a stop, as a new run.

    ``context``: the run's own (:attr:`Run.context`), a copy of :meth:`AsyncBatcher.start`'s; ``None`` when a
    caller's first call starts it, whose context must not be the batches': then an empty one.
    """
    old = b._run
    if old.loop is loop and old.state is State.RUNNING:
        return old
    if old.state in (State.RUNNING, State.STOPPING) and old.loop is not None:
        if old.loop is loop:
            raise BatcherStoppedError(f"{b.name} is stopping; it can be started again once stop() returns")
        if not old.loop.is_closed():
            raise RuntimeError(f"{b.name} is running on another event loop; stop it there before using it here")
        # Its loop was closed without a stop: whatever it held went with it, its callers too. Nothing to say when
        # nothing was lost (a @batch function used in one asyncio.run after another): a warning only for items
        # lost, or an on_stop() that never ran.
        lost = _account_abandoned(b, old)
        level = logging.WARNING if lost or "on_stop" in b._overridden else logging.DEBUG
        logger.log(
            level,
            "%s: its event loop was closed without stop(); starting afresh (%s lost)",
            b.name,
            plural(lost, "item"),
        )
    overridden = b._overridden
    run = Run(
        loop,
        b._recorder,
        state=State.RUNNING,
        default_key=DEFAULT_KEY,
        # The hooks cost a call per item: they are only called when overridden (or weights are limited).
        keyed="batch_key" in overridden,
        weighted="item_weight" in overridden or b._max_batch_weight is not None,
        by_keyword=_by_keyword(b.process_batch),
        is_coroutine=inspect.iscoroutinefunction(b.process_batch),
        is_stream=inspect.isasyncgenfunction(b.process_batch),
        context=context,
    )
    if context is not None:
        # start() called from inside another batcher's batch or hook: this run's batches are neither.
        context.run(_execution.current_batch.set, None)
        context.run(in_hook.set, None)
    run.batch_ended = partial(_dispatch.batch_ended, b, run)
    if "on_start" in overridden:
        started = _hook_call(b, "on_start")  # (before the run is the batcher's: refused, it stays as it was)
        run.startup = loop.create_task(_in_hook(run, "on_start", started), context=run.context.copy())
        run.startup.add_done_callback(partial(_startup_done, b, run))
    choose_fast_path(b, run)
    b._run = run
    return run


def settings_changed(b: Base, *, weights: bool, room: bool, stall: bool) -> None:
    """A setting changed on a live batcher: it applies from the next batch (the stall timeout, from now)."""
    run = b._run
    if run.state not in (State.RUNNING, State.STOPPING):
        return
    if weights and not run.queue.weighted:
        run.queue.keep_weights()
    choose_fast_path(b, run)
    if room and run.putters:
        _room.wake_putters(b, run)
    if stall and run.is_stream:
        _streaming.stall_changed(run)
    _dispatch.repump(b, run)


def choose_fast_path(b: Base, run: Run) -> None:
    """Whether :meth:`AsyncBatcher.process` may take its short path: running, no key, no weight, no default
    timeout, on_start() done (each of those needs the long path; a call from inside on_start() is refused there)."""
    plain = not run.keyed and not run.queue.weighted and b._default_timeout is None and not run.is_stream
    started = run.startup is None or run.startup.done()
    run.fast_loop = run.loop if plain and started and run.state is State.RUNNING else None


def _hook_call(b: Base, hook: str) -> Awaitable[None]:
    """Call ``on_start`` or ``on_stop``: what it returns must be awaitable (an ``async def``), else refuse it."""
    awaitable = getattr(b, hook)()
    if not inspect.isawaitable(awaitable):
        raise TypeError(f"{b.name}: {type(b).__name__}.{hook}() returned {awaitable!r}; it must be an async def")
    return awaitable


async def _in_hook(run: Run, hook: str, awaitable: Awaitable[None]) -> None:
    """Await a hook in its task, marked as the hook's (:func:`inside_hook`) for what it calls."""
    in_hook.set((run, hook))
    await awaitable


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


def _account_abandoned(b: Base, run: Run) -> int:
    # The callers of a run whose loop closed are gone: their items end here, as failed. Returns how many.
    rec = b._recorder
    lost = run.queue.waiting + run.awaiting_room
    rec.exited += lost
    lost += sum(len(batch.items) for batch in run.batches)
    rec.failed += lost
    return lost


def _startup_done(b: Base, run: Run, task: asyncio.Task[None]) -> None:
    # A failing on_start is reported to the callers of the batches; retrieve it here so that a run with no batch
    # does not end in "exception was never retrieved".
    if not task.cancelled() and task.exception() is not None:
        logger.warning("%s: on_start() failed: %s", b.name, type(task.exception()).__name__)
    choose_fast_path(b, run)  # the short path opens once on_start() is over


# ---------------------------------------------------------------------- stopping


async def stop(b: Base, *, force: bool, timeout: float | None) -> None:
    """The body of :meth:`AsyncBatcher.stop` on the batcher's own loop. ``timeout`` bounds all of it: the drain may
    take it all, or half of it when the batcher overrides ``on_stop()``, which has the rest."""
    run = b._run
    if run.state is State.NEW or run.state is State.STOPPED:
        return
    loop = run.loop
    if loop.is_closed():
        run.state = State.STOPPED  # its loop is gone, and everything it held with it
        return
    if loop is not asyncio.get_running_loop():
        raise RuntimeError(f"{b.name} runs on another event loop; call stop() there")
    task = asyncio.current_task()
    if any(batch.handle is task for batch in run.batches):
        raise ReentrantCallError(
            f"{b.name}: stop() awaited inside its own process_batch would wait for that batch forever; "
            "stop it from outside the batch"
        )
    for hook, waits in (("on_start", "the batches, which wait for on_start()"), ("on_stop", "on_stop()")):
        if inside_hook(run, hook):
            raise ReentrantCallError(f"{b.name}: stop() awaited inside {hook}() would wait for {waits} forever")
    hooked = "on_stop" in b._overridden
    began = loop.time()
    deadline = None if timeout is None else began + timeout
    drain_deadline = None if timeout is None else began + (timeout / 2 if hooked else timeout)
    if run.state is State.RUNNING:
        begin_stop(b, run)
    if force:
        _dispatch.abort(b, run, BatcherStoppedError(f"{b.name} was stopped with force=True"))
    drained = run.drained
    if drained is not None:  # (awaiting it done costs nothing)
        try:
            await asyncio.wait_for(asyncio.shield(drained), _left(loop, drain_deadline))
        except TimeoutError:
            logger.warning(
                "%s: stop(timeout=%s) cut the drain off after %.3g s: %s in flight, %s queued",
                b.name,
                timeout,
                loop.time() - began,
                plural(run.in_flight, "batch", "batches"),
                plural(run.queue.waiting, "item"),
            )
            _dispatch.abort(b, run, BatcherStoppedError(f"{b.name} was stopped: stop(timeout={timeout}) expired"))
    closing = run.closing
    if closing is None:  # (an abort always ends the drain, so this is not reached)
        return
    run.stop_waiters += 1
    given = _left(loop, deadline) if hooked else None  # (without an on_stop() of its own, it ends at once)
    try:
        await asyncio.wait_for(asyncio.shield(closing), given)
    except TimeoutError:
        logger.warning(
            "%s: on_stop() did not finish within the %.3g s left of stop(timeout=%s) after the drain; it is cancelled",
            b.name,
            given,
            timeout,
        )
        closing.cancel()
        finish(run)
    except asyncio.CancelledError:
        # A concurrent stop(timeout=...) gave up on on_stop() and cancelled it (the shield passes that on): the
        # batcher is stopped, and this stop returns. Its own cancellation is raised.
        task = asyncio.current_task()
        if not closing.cancelled() or (task is not None and task.cancelling()):
            raise
    finally:
        run.stop_waiters -= 1


def _left(loop: asyncio.AbstractEventLoop, deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - loop.time())


def begin_stop(b: Base, run: Run) -> None:
    """Refuse new items, refuse the callers in line for room, and send what waits without waiting for deadlines."""
    run.state = State.STOPPING
    run.fast_loop = None
    run.drained = run.loop.create_future()
    run.on_drained = partial(_drained, b, run)
    _room.fail_putters(run, BatcherStoppedError(f"{b.name} is stopping"))
    _dispatch.repump(b, run)
    run.check_drained()


def _drained(b: Base, run: Run) -> None:
    """The drain is over (:meth:`Run.check_drained`, once): run ``on_stop()``."""
    run.closing = run.loop.create_task(_finish_stop(b, run), context=run.context.copy())
    run.closing.add_done_callback(partial(_closing_done, b, run))


async def _finish_stop(b: Base, run: Run) -> None:
    try:
        startup = run.startup
        if startup is not None and not startup.done():
            # on_stop() closes what on_start() opened: only once on_start() has ended, its own cleanup included,
            # and nothing of it runs on after the stop.
            startup.cancel()
            await asyncio.wait([startup])
        if "on_stop" in b._overridden:
            await _in_hook(run, "on_stop", _hook_call(b, "on_stop"))
    finally:
        finish(run)


def finish(run: Run) -> None:
    """The end of a run: no wake-up left, and the state says so."""
    _dispatch.cancel_timer(run)
    if run.pump_handle is not None:
        run.pump_handle.cancel()  # (a stopped run is never dispatched again: a new run starts afresh)
    run.state = State.STOPPED
    run.fast_loop = None


def _closing_done(b: Base, run: Run, task: asyncio.Task[None]) -> None:
    # stop() re-raises an on_stop() failure to whoever awaits it; retrieve it here so that a stop nobody awaits
    # still reports it, through the loop's exception handler.
    if not task.cancelled() and task.exception() is not None and not run.stop_waiters:
        run.loop.call_exception_handler(
            {"message": f"{b.name}: on_stop() failed", "exception": task.exception(), "task": task}
        )
