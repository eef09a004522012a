"""A batcher's life across its runs: binding to a loop (start), the stop (drain, force, timeout), ``on_start`` and
``on_stop`` (private).

States (:class:`~async_batcher._core.engine.State`): NEW, then RUNNING once bound to a loop (the first ``process()``
or ``start()`` in a loop), STOPPING from ``stop()`` until its drain ends and ``on_stop()`` has run, then STOPPED. A
stopped batcher starts again as a new :class:`Run`, in the same loop or another; a batch keeps its run's engine, so
a batch that ends after its run was stopped (a thread cannot be interrupted) touches that run only.

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
from threading import get_ident
from typing import TYPE_CHECKING, Any, Protocol, overload

from async_batcher._checks import plural
from async_batcher._core.batch import current_batch
from async_batcher._core.engine import Engine
from async_batcher._core.execution import Runner
from async_batcher._core.state import State
from async_batcher._core.stopping import Stopping, in_hook, run_hook
from async_batcher._core.streaming import StreamRunner
from async_batcher.exceptions import BatcherStoppedError, ReentrantCallError
from async_batcher.stats import FAILED

if TYPE_CHECKING:
    from collections.abc import Callable

    from async_batcher._core.batch import Batch, Hooks, Watcher
    from async_batcher._core.settings import Settings
    from async_batcher.stats import BatcherStats, _Recorder

__all__: list[str] = []

logger = logging.getLogger("async_batcher")


class Run:
    """One run: from a start on an event loop to the end of its stop. ``engine`` is ``None`` until it is bound to a
    loop (a NEW run); ``fast`` is the engine while :meth:`AsyncBatcher.process` may take its short path."""

    __slots__ = ("closing", "context", "drained", "engine", "fast", "ident", "loop", "startup", "stop_waiters")

    def __init__(self, loop: asyncio.AbstractEventLoop | None, engine: Engine | None = None) -> None:
        self.loop = loop  # (a NEW run keeps its stopped predecessor's, where blocking calls go)
        self.engine = engine
        self.ident = get_ident()  # a run is bound from a coroutine: this is its loop's thread
        # The run's own context: a copy of start()'s, or an empty one when a caller's first call started it.
        self.context = contextvars.Context()
        self.fast: Engine | None = None
        self.startup: asyncio.Task[None] | None = None  # on_start()
        self.drained: asyncio.Future[None] | None = None  # set by a stop once nothing is queued or in flight
        self.closing: asyncio.Task[None] | None = None  # on_stop(), once drained
        self.stop_waiters = 0  # stop() calls awaiting closing: a failing on_stop() is theirs to raise

    @property
    def state(self) -> State:
        return State.NEW if self.engine is None else self.engine.state


class RunningOwner(Protocol):
    """What :class:`Running` asks of the batcher it is read on."""

    def _running(self) -> bool: ...


class Running:
    """``batcher.running``: computed at each read. Not a property: a non-data descriptor, so that a subclass that
    sets an attribute of its own named ``running`` (a name 0.2.2's subclasses were free to use) keeps working."""

    @overload
    def __get__(self, batcher: None, owner: type[Any]) -> Running: ...

    @overload
    def __get__(self, batcher: RunningOwner, owner: type[Any]) -> bool: ...

    def __get__(self, batcher: RunningOwner | None, owner: type[Any]) -> bool | Running:
        return self if batcher is None else batcher._running()


class Lifecycle(Stopping):
    """A batcher's runs, one after the other: the current one (``run``), how it starts and how it stops."""

    __slots__ = ("calls", "hooks", "overridden", "recorder", "run", "settings", "watchers")

    def __init__(self, hooks: Hooks, settings: Settings, recorder: _Recorder, overridden: frozenset[str]) -> None:
        self.hooks = hooks
        self.settings = settings
        self.recorder = recorder
        self.overridden = overridden  # the hooks the batcher's class overrides: the others are never called
        self.run = Run(None)
        self.watchers: list[Watcher] = []  # told of the batches of every run (async_batcher.testing's)
        # Told of each call of process_batch of every run as it begins, with what it is handed (record_batches').
        self.calls: list[Callable[[Batch], None]] = []

    @property
    def name(self) -> str:
        return self.hooks.name

    def stats(self) -> BatcherStats:
        """A frozen snapshot of the counters (the batcher's, over its runs) and of the current run's state."""
        engine = self.run.engine
        if engine is None:
            return self.recorder.snapshot(self.name, queued=0, awaiting_room=0, in_flight=0)
        return self.recorder.snapshot(
            self.name,
            queued=engine.queue.waiting,
            awaiting_room=engine.room.awaiting,
            in_flight=engine.dispatcher.in_flight,
            ceilings=engine.feedback.ceilings(),
            queue_weight=engine.room.held,
        )

    # ------------------------------------------------------------------ starting

    def admit(self, loop: asyncio.AbstractEventLoop, n: int) -> Run:
        """The run that ``n`` items submitted from ``loop`` join: the running one, or a new one; else refuse them."""
        run = self.run
        if run.loop is loop and run.state is State.RUNNING:
            startup = run.startup
            if startup is not None and not startup.done() and self.inside_hook(run, "on_start"):
                self.recorder.rejected(n, "reentrant")
                raise ReentrantCallError(
                    f"{self.name}: an item submitted from inside on_start() would wait for on_start() forever (the "
                    "first batch waits for it); warm up by calling process_batch() directly"
                )
            return run
        if run.state is State.NEW or run.state is State.RUNNING:
            return self.bind(loop)  # (which refuses another loop that still runs)
        self.recorder.rejected(n, "stopped")
        raise BatcherStoppedError(f"{self.name} is {run.state.value}; start() it again to submit items")

    def inside_hook(self, run: Run, hook: str) -> bool:
        """Whether the running code is ``hook`` of ``run`` (its task, or a task it started), while the hook runs."""
        if in_hook.get() != (run, hook):
            return False
        task = run.startup if hook == "on_start" else run.closing
        return task is not None and not task.done()

    def mark_to_start(self) -> None:
        """start() with no running loop: a stopped batcher starts again at first use."""
        if self.run.state is State.STOPPED:
            self.run = Run(self.run.loop)

    def bind(self, loop: asyncio.AbstractEventLoop, context: contextvars.Context | None = None) -> Run:
        """Make the batcher run on ``loop``: start it, or start it again after a stop, as a new run.

        ``context``: the run's own, a copy of :meth:`AsyncBatcher.start`'s; ``None`` when a caller's first call
        starts it, whose context must not be the batches': then an empty one.
        """
        old = self.run
        if old.loop is loop and old.state is State.RUNNING:
            return old
        if old.state in (State.RUNNING, State.STOPPING) and old.loop is not None:
            if old.loop is loop:
                raise BatcherStoppedError(f"{self.name} is stopping; it can be started again once stop() returns")
            if not old.loop.is_closed():
                raise RuntimeError(f"{self.name} is running on another event loop; stop it there before using it here")
            # Its loop was closed without a stop: whatever it held went with it, its callers too. Nothing to say
            # when nothing was lost (a @batch function used in one asyncio.run after another): a warning only for
            # items lost, or an on_stop() that never ran.
            lost = self._account_abandoned(old)
            level = logging.WARNING if lost or "on_stop" in self.overridden else logging.DEBUG
            logger.log(
                level,
                "%s: its event loop was closed without stop(); starting afresh (%s lost)",
                self.name,
                plural(lost, "item"),
            )
        run = Run(loop)
        if context is not None:
            # start() called from inside another batcher's batch or hook: this run's batches are neither.
            context.run(current_batch.set, None)
            context.run(in_hook.set, None)
            run.context = context
        # on_start() first: refused (not an async def), the run stays as it was, and no engine takes the policy.
        started = self._hook_call("on_start") if "on_start" in self.overridden else None
        settings = self.settings
        cls = StreamRunner if inspect.isasyncgenfunction(self.hooks.process_batch) else Runner
        engine = Engine(
            loop,
            self.recorder,
            partial(cls, self.hooks, loop, self.recorder, run.context, calls=self.calls),
            settings.policy,
            name=self.name,
            # The hooks cost a call per item: they are only called when overridden (or weights are limited).
            keyed="batch_key" in self.overridden,
            weighted="item_weight" in self.overridden,  # (a weight limit needs the hook)
            watchers=self.watchers,
        )
        if started is not None:
            run.startup = loop.create_task(run_hook(run, "on_start", started), context=run.context.copy())
            engine.runner.start_after(run.startup)
            run.startup.add_done_callback(partial(self._startup_done, run))
        run.engine = engine
        self._configure(run)
        self.run = run
        return run

    def settings_changed(self, *, room: bool = False, stall: bool = False) -> None:
        """A setting changed on a live batcher: it applies from the next batch (the stall timeout, from now)."""
        run = self.run
        if run.state not in (State.RUNNING, State.STOPPING):
            return
        self._configure(run)
        assert run.engine is not None
        if stall:
            run.engine.stall_changed()
        run.engine.dispatcher.repump()

    def _configure(self, run: Run) -> None:
        engine = run.engine
        assert engine is not None
        settings = self.settings
        engine.configure(
            stall_limit=settings.stall_limit,
            batch_limit=settings.batch_limit,
            slot_limit=settings.slot_limit,
            room_limit=settings.room_limit,
            queue_size=settings.limits.max_queue_size,
            queue_weight_limit=settings.queue_weight_limit,
            weight_limit=settings.weight_limit,
            priority_wait=settings.max_priority_wait,
            policy=settings.policy,
            recovery=settings.recovery,
        )
        self.choose_fast_path(run)

    def choose_fast_path(self, run: Run) -> None:
        """Whether :meth:`AsyncBatcher.process` may take its short path: running, no key, no weight, no default
        timeout, no late refusal, no dedup, on_start() done (each of those needs the long path; a call from inside
        on_start() is refused there)."""
        engine = run.engine
        plain = (
            engine is not None
            and not engine.keyed
            and not engine.queue.weighted
            and self.settings.default_timeout is None
            and not self.settings.refuse_late
            and "dedup_key" not in self.overridden
            and not engine.runner.is_stream
        )
        started = run.startup is None or run.startup.done()
        run.fast = engine if plain and started and run.state is State.RUNNING else None

    def _hook_call(self, hook: str) -> Awaitable[None]:
        """Call ``on_start`` or ``on_stop``: what it returns must be awaitable (an ``async def``), else refuse it."""
        awaitable = getattr(self.hooks, hook)()
        if not inspect.isawaitable(awaitable):
            raise TypeError(
                f"{self.name}: {type(self.hooks).__name__}.{hook}() returned {awaitable!r}; it must be an async def"
            )
        return awaitable

    def _account_abandoned(self, run: Run) -> int:
        # The callers of a run whose loop closed are gone: their items end here, as failed. Returns how many.
        engine = run.engine
        assert engine is not None
        rec = self.recorder
        lost = engine.queue.waiting + engine.room.awaiting
        rec.left(lost)
        lost += sum(len(batch.items) for batch in engine.dispatcher.batches)
        rec.resolved(lost, FAILED)
        return lost

    def _startup_done(self, run: Run, task: asyncio.Task[None]) -> None:
        # A failing on_start is reported to the callers of the batches; retrieve it here so that a run with no batch
        # does not end in "exception was never retrieved".
        if not task.cancelled() and task.exception() is not None:
            logger.warning("%s: on_start() failed: %s", self.name, type(task.exception()).__name__)
        self.choose_fast_path(run)  # the short path opens once on_start() is over
