"""``AsyncBatcher``: many concurrent ``await batcher.process(item)`` become few ``process_batch(batch)`` calls."""

from __future__ import annotations

import abc
import asyncio
import copy
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Iterable, Sequence
from contextvars import Context, copy_context
from threading import get_ident
from typing import TYPE_CHECKING, ClassVar, Final, Generic, TypeVar, cast

from async_batcher import _checks, _sync
from async_batcher._core.admission import Admission
from async_batcher._core.handoff import Handoff
from async_batcher._core.hooks import check_hooks, overridden
from async_batcher._core.lifecycle import Lifecycle, Running
from async_batcher._core.options import BatcherOptions, SettingsView, settings_from
from async_batcher._core.options import signature as options_signature
from async_batcher._core.queue import DEFAULT_KEY
from async_batcher._core.state import State
from async_batcher._sync import BlockingCalls
from async_batcher.stats import BatcherStats, _Recorder

if TYPE_CHECKING:
    from types import TracebackType
    from typing import Self, Unpack

    from async_batcher._core.batch import Batch, Watcher
    from async_batcher._core.engine import Engine
    from async_batcher.stats import BatchObserver

__all__ = ["AsyncBatcher"]

T = TypeVar("T")
R = TypeVar("R")

# The default priority, by identity: the common case's test costs no comparison of numbers.
_ZERO: Final = 0


class AsyncBatcher(SettingsView, BlockingCalls[T, R], abc.ABC, Generic[T, R]):
    """Collects the items of concurrent :meth:`process` calls and hands them to :meth:`process_batch` in batches.

    Subclass it and implement :meth:`process_batch`; then ``await batcher.process(item)`` from any number of
    tasks. Every accepted item resolves **exactly once** (with its result, an exception, or its caller's
    cancellation) on every path; no caller is ever left waiting. The contract:

    1. **Dispatch.** A batch goes out as soon as a concurrency slot is free and either it is full
       (``max_batch_size`` items, ``max_batch_weight``, or the largest of ``preferred_batch_sizes`` available) or
       its oldest item has waited ``max_queue_time`` seconds, measured from *its arrival* on the event loop's
       clock (the rule of the default policy, :class:`~async_batcher.policies.Deadline`; ``policy=`` takes
       another). A free slot never sits idle while one of those holds, but for ``max_hold_time``: a slot freed by a
       batch may wait, at most that long after the batch ended, for the callers it answered to come back (only
       while they come back together, as a closed loop's clients do; never while a caller waits for room or the
       batcher stops; details in the guarantees). ``max_queue_time=0`` sends whatever is waiting the moment a
       slot is free (items that arrive in the same loop iteration share the batch). Items go out in arrival
       order. When slots are scarce, the due key served longest ago goes first (a key never served counts from
       when it came). An idle batcher schedules no wake-ups.
    2. **Results.** ``process_batch`` returns one result per item, in order (any ordered iterable), or ``None``
       (``None`` for each). An ``Exception`` element is raised to its caller only; results of the wrong length
       or kind give every caller of the batch a :class:`BatchSizeMismatchError` or a ``TypeError``; an exception
       raised goes to every caller of the batch (a ``CancelledError`` as :class:`ProcessBatchCancelledError`).
       The batcher serves on. A :class:`~async_batcher.failures.Retry` element asks for its item to be tried again
       (with ``retry``; without, its caller gets its error); ``retry``, ``on_batch_error`` and ``split_on`` decide
       what a raised error leads to (:mod:`async_batcher.failures`). An async generator ``process_batch`` streams
       (:meth:`stream`): each step gives every item a part, :data:`END` or an ``Exception``, under these rules per
       stream.
    3. **Sync process_batch.** A plain ``def process_batch`` runs in ``executor`` (the loop's default executor
       if ``None``), never on the event loop.
    4. **Concurrency.** At most ``concurrency`` batches are in flight (``None``: no limit). A call that would wait
       for itself raises :class:`ReentrantCallError` at once: from inside ``process_batch``, an item that would
       wait for its own batch's slot (or for room in the queue); from inside :meth:`on_start`, any item or a
       stop; from inside :meth:`on_stop`, a stop.
    5. **Admission.** With ``max_queue_size`` set, :meth:`process` on a full queue raises
       :class:`QueueFullException` at once, or, with ``wait_when_full=True``, waits its turn for room (first
       come, first served); ``max_queue_weight`` bounds the weight admitted and not yet answered alike, and an
       item heavier than it alone is refused at once (:class:`OversizedItemError`). With ``refuse_late=True``, an
       item predicted to miss its deadline is refused at admission (:class:`LateRefusalError`), unless it finds
       the batcher idle. With :meth:`dedup_key`, identical items waiting or in flight share one row and one
       result.
    6. **Cancellation and timeouts.** A caller cancelled before its item is sent withdraws the item: it never
       reaches ``process_batch``. Cancelled after, its result is dropped and no other caller is affected.
       ``process(item, timeout=s)`` raises the built-in ``TimeoutError`` after ``s`` seconds (waiting for room
       included) under the same rules; ``default_timeout`` applies to every call without its own. Both are
       atomic with respect to the batch: an item is either sent with its caller still waiting, or not sent at
       all (a batch already sent runs on; its late caller's result is dropped). The timeout is the item's deadline:
       past it, it is never sent (nor tried again), and :func:`~async_batcher.current_batch` tells a batch its
       earliest.
    7. **Bulk.** ``await process_many(items)`` submits many items at once (admitted whole or not at all) and
       returns their results in order; the first failure is raised and the rest withdrawn, or, with
       ``return_exceptions=True``, exceptions take their items' places, a failed batch's included.
    8. **Lifecycle.** :meth:`start` is optional (the first :meth:`process` starts a never-started batcher) and
       idempotent. The batcher binds to the running event loop at first use, not at construction; after a stop
       it can be started again, in the same or a new event loop. ``async with batcher:`` starts and stops it.
       :meth:`on_start` and :meth:`on_stop` open and close what it needs.
    9. **Stop.** ``await stop()`` refuses new items (:class:`BatcherStoppedError`), processes everything already
       accepted without waiting for ``max_queue_time``, waits for the batches in flight, runs :meth:`on_stop`,
       then returns. ``stop(timeout=s)`` returns within about ``s`` seconds: the drain has them all, or half when
       the batcher overrides :meth:`on_stop`, which has the rest; what is unfinished fails with
       :class:`BatcherStoppedError`. ``stop(force=True)`` fails every queued and in-flight caller at once and
       cancels the batches in flight; a caller whose batch was cut off inside ``process_batch`` gets what
       :meth:`abandoned_error` returns. Idempotent and safe to call concurrently.
    10. **Statistics.** :attr:`stats` is a frozen :class:`BatcherStats` snapshot; recording costs one tuple per
        batch, nothing per item. Its counters add up: every submitted item is counted once as succeeded,
        failed, cancelled or timed out. A streaming batch's size is the most items it held at once.
    11. **Validation.** Bad settings and arguments raise ``ValueError`` or ``TypeError`` naming the value, at
        construction (or when changed live, the old value kept).
    12. **Logging.** Through ``logging.getLogger("async_batcher")`` only; item payloads are never logged.
    13. **Context.** ``process_batch`` runs in a fresh copy, per batch, of the context :meth:`start` ran in (an empty
        one if a caller's first call started it), never a caller's: nothing set in it reaches a caller or the next
        batch. :meth:`on_start` and :meth:`on_stop` run in copies of it too. Each item's caller context, and
        whether its caller has left, are the batch's to ask: :func:`~async_batcher.current_batch`.

    Args:
        **options: The settings (:class:`~async_batcher.BatcherOptions`), all keyword-only and optional; the
            signature lists them with their defaults. A group (``limits``, ``streaming``) or its fields one by one
            (``max_batch_size=64``), as in earlier versions; the dispatch keywords (``max_queue_time``,
            ``max_latency``, ``max_hold_time``, ``preferred_batch_sizes``) build the ``policy``. What a failed batch
            leads to (``retry``, ``on_batch_error``, ``split_on``) is off by default (:mod:`async_batcher.failures`).
            async-batcher 0.2.2's ``batch_size`` (``max_batch_size``), ``sleep_time`` and ``buffering_time``
            (ignored) warn.
    """

    def __init__(self, **options: Unpack[BatcherOptions]) -> None:
        super().__init__()
        cls = type(self)
        self._settings, name = settings_from(dict(options), f"{cls.__name__}()", cls._overridden)
        if inspect.isasyncgenfunction(self.process_batch):
            self._settings.streams_its_results(cls.__name__)
        self.name: str = _checks.name(name, cls.__name__)
        self._recorder = _Recorder()
        self._life = Lifecycle(self, self._settings, self._recorder, cls._overridden)
        self._admission = Admission(self._life, self._settings)
        self._handoff = Handoff(self._life, self._admission)  # (async_batcher.shared's owner)
        self._settings.changed = self._life.settings_changed
        self._sync = _sync.Blocking(self, self._life, self._recorder)  # blocking calls from threads

    #: The hooks of the class that override :class:`AsyncBatcher`'s (set as each subclass is defined): a hook left
    #: alone costs nothing, it is never called.
    _overridden: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls._overridden = overridden(cls, AsyncBatcher)
        check_hooks(cls, cls._overridden)

    # ------------------------------------------------------------------ the part users write

    #: Streaming only: items waiting in the queue join a running batch between two steps of its generator
    #: (continuous batching, up to ``max_batch_size`` items at once). Set it on the subclass.
    continuous_batching: ClassVar[bool] = False

    @abc.abstractmethod
    def process_batch(
        self, batch: list[T]
    ) -> (
        Awaitable[Sequence[R | Exception] | None]
        | Sequence[R | Exception]
        | AsyncIterator[Sequence[R | Exception]]
        | None
    ):
        r"""Process a batch; return one result per item, in order (an ``Exception`` element fails that item).

        An ``async def`` (awaited on the event loop) or a plain ``def`` (run in ``executor``); or an async generator
        that streams (each step one element per item of the batch as it is then: a part, :data:`END`, or an
        ``Exception``; callers iterate :meth:`stream`). A parameter named ``batch`` (or ``**kwargs`` alone) is
        passed by keyword, as in 0.2.2; any other name, by position. Keep or change the list at will.
        """

    def batch_key(self, item: T) -> Hashable:
        """Overridable hook: items with different keys never share a batch (one table, queue, model, tenant...).

        Each key keeps its own pending batch and deadline; keys come and go at run time (the idle keys whose last
        batch ended last are remembered, for their history: the policy's ``keep_idle``); when slots are scarce,
        keys are served in turn.
        Called once per item, at submission. The default puts every item under one key.
        """
        return DEFAULT_KEY

    def item_weight(self, item: T) -> float:
        """Overridable hook: the weight of an item (bytes, tokens) against ``max_batch_weight`` and
        ``max_queue_weight``, which need it.

        Called once per item, at submission, when overridden (else never).
        """
        return 1.0

    def dedup_key(self, item: T) -> Hashable | None:
        """Overridable hook: single flight. Items with the same key (under the same ``batch_key``) share one row of
        one batch and one result while the first of them waits or is in flight: the next ones do not take a row, do
        not count toward ``max_batch_size``, and their callers get the row's result (each a copy, but the first:
        :meth:`copy_result`) or its exception. A caller that leaves does not take the row from the others; the
        row goes only when all have left. Nothing is kept once the row resolves (an exception never is), unless
        ``result_cache`` is set.

        The key must say everything the result depends on: every parameter of the item, and its tenant when
        results differ by tenant (``batch_key`` already separates keys). ``None``: this item shares nothing. Called
        once per item, at submission (``process`` and ``process_sync``; ``process_many`` and ``stream`` calls are
        not shared). Not overridden: never called, every item takes its own row.
        """
        return None

    def copy_result(self, result: R) -> R:
        """Overridable hook: the copy of a shared row's result (:meth:`dedup_key`) that each of its callers but the
        first gets, so that a caller that mutates its result does not change another's. ``copy.copy`` by default
        (shallow: a list, a dict, a numpy array are copied, their elements are not); return ``result`` itself for
        results nobody mutates (no copy at all), or ``copy.deepcopy(result)`` for nested ones. Called on the event
        loop: it must be quick."""
        return copy.copy(result)

    async def on_start(self) -> None:
        """Overridable hook (an ``async def``): runs once each time the batcher starts; the first batch waits for it.

        Open clients here; warm a model up with ``process_batch`` itself (an item submitted from here would wait
        for this hook: it raises :class:`ReentrantCallError`). If it raises, that run's callers get the error.
        """

    async def on_stop(self) -> None:
        """Overridable hook (an ``async def``): runs once at the end of :meth:`stop`, after the drain. Close clients
        here."""

    def abandoned_error(self, batch: list[T], error: BaseException) -> BaseException:
        """Overridable hook: what the callers of a batch get when a stop (forced, timed out, the loop shutting down)
        cuts it off while ``process_batch`` works on it; ``batch`` is the list it was given.

        By default ``error``, the stop's :class:`BatcherStoppedError`: right without effects (a model). One that
        writes or sends returns :class:`~async_batcher.OutcomeUnknownError`, so that nobody retries blindly.
        Called on the event loop, once per batch; it must not block.
        """
        return error

    # ------------------------------------------------------------------ submitting

    async def process(self, item: T, *, timeout: float | None = None, priority: float = 0) -> R:
        """Submit one item and wait for its result.

        Args:
            item: The item.
            timeout: Seconds to wait at most, from this call (including any wait for room in the queue).
            priority: Lower goes first; first come, first served within a priority. An item is never passed
                over for longer than ``max_priority_wait`` seconds.

        Raises:
            QueueFullException: ``max_queue_size`` items are waiting, or ``max_queue_weight`` is admitted (and
                ``wait_when_full`` is off); :class:`LateRefusalError` (one): ``refuse_late`` predicts it late.
            OversizedItemError: the item alone weighs more than ``max_queue_weight`` or ``max_batch_weight``.
            BatcherStoppedError: the batcher is stopping or stopped, or the item was abandoned by a forced stop.
            TimeoutError: ``timeout`` seconds passed first; an item not yet sent is withdrawn.
            ValueError: a bad ``timeout``/``priority``; with ``refuse_late``, a call that has no deadline (no
                ``timeout``, ``default_timeout`` or ``max_latency``).
            ReentrantCallError: called from inside this batcher's ``process_batch`` with every slot taken.
            BatchSizeMismatchError: ``process_batch`` returned the wrong number of results.
            Exception: whatever ``process_batch`` raised, or the ``Exception`` it returned for this item.
        """
        # Submit, then await. The common case (bound to this loop, on its thread, no key, no weight, no timeout, no
        # priority, room in the queue) is the engine's put(); the rest is admission's. (asyncio.get_running_loop()
        # would tell the loop, but on Python 3.11 it makes a getpid() system call each time: too dear for every
        # item. A thread runs one loop at a time: the bound loop, if it is not the one running, cannot schedule
        # (closed) or the await below fails (another loop's task), and either way the call takes the long path.)
        run = self._life.run
        engine = run.fast
        fut: asyncio.Future[R] | None  # (an annotation: no cost at run time)
        if (
            engine is None
            or timeout is not None
            or priority is not _ZERO  # (not == 0: False == 0, and a bool is no priority; any other zero is checked)
            or get_ident() != run.ident
            or (fut := engine.put(item)) is None  # a full queue: refuse or wait, on the long path
        ):
            return cast(R, await self._admission.submit(item, timeout=timeout, priority=priority))
        try:
            return await fut
        except asyncio.CancelledError:
            engine.left_sink(fut)
            raise
        except RuntimeError:
            if fut.done():
                raise  # this item's own outcome
            # The bound loop is not the running one (it is closed, or another runs on this thread): take the item
            # back, as if it had never come, and go the long path, which starts afresh or refuses.
            engine.unsubmit(fut)
            return cast(R, await self._admission.submit(item, timeout=timeout, priority=priority))

    async def process_many(
        self,
        items: Iterable[T],
        *,
        timeout: float | None = None,
        priority: float = 0,
        return_exceptions: bool = False,
    ) -> list[R]:
        """Submit many items at once; return their results in order.

        The items go out in as many batches as the limits need, in order. On a bounded queue the call is admitted
        whole or not at all. With ``return_exceptions=False`` the first failing item's exception is raised and the
        items not yet sent are withdrawn; with ``True`` exceptions take their items' places in the list (a failed
        batch's too). Cancellation, ``timeout`` and ``priority`` work as in :meth:`process`, for all the items
        together.
        """
        return await self._admission.submit_many(
            items, timeout=timeout, priority=priority, return_exceptions=return_exceptions
        )

    def stream(self, item: T, *, timeout: float | None = None, priority: float = 0) -> AsyncIterator[R]:
        """Submit one item and iterate its results as a streaming ``process_batch`` yields them.

        ``async for part in batcher.stream(item)``: this item's parts, in order, until its stream is complete; an
        ``Exception`` for it is raised after the parts before it. It is left (its item drops out of the batch at
        the next step) when closed (``contextlib.aclosing``), cancelled, or let go (a ``break`` out of ``async
        for`` over ``stream()`` itself); a consumer that stops reading is dropped after ``stream_stall_timeout``.
        ``timeout`` bounds the whole stream. The item is submitted at the first iteration. Without a streaming
        ``process_batch``, the stream has one part.
        """
        return self._admission.submit_stream(item, timeout=timeout, priority=priority)

    def _submit(self, item: T, timeout: float | None = None, priority: float = 0) -> asyncio.Future[R]:
        """Private (:mod:`async_batcher.shared`'s owner): :meth:`process` without its coroutine, from the loop the
        batcher runs on; the future of the item's outcome. Cancelling it withdraws the item, as cancelling a caller
        of :meth:`process` does."""
        return self._handoff.submit(item, timeout, priority)

    def _watch_sent(
        self, sent: Callable[[list[Context]], None], ended: Callable[[list[Context]], None] | None = None
    ) -> Callable[[], None]:
        """Private (:mod:`async_batcher.shared`'s owner): call ``sent`` with the contexts of each batch's callers as
        it goes, before ``process_batch`` is called (and ``ended`` as it ends); return what stops it. The batcher
        must be started."""
        return self._handoff.watch(sent, ended)

    def _in_own_batch(self) -> bool:
        """Private (:mod:`async_batcher.shared`'s owner): whether the running task is one of this batcher's batches
        (a stop awaited there would wait for itself)."""
        return self._handoff.in_own_batch()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the batcher on the running event loop (optional: the first :meth:`process` does it); idempotent.
        Called with no running loop, it only marks a stopped batcher to start at first use."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._life.mark_to_start()
            return
        self._life.bind(loop, copy_context())

    running: Running = Running()
    """Whether the batcher is started and not yet fully stopped (it is running while it drains): a plain attribute,
    for ``if batcher.running:``. (Read only; a subclass that keeps an attribute of its own by that name keeps it.)"""

    async def is_running(self) -> bool:
        """:attr:`running`, as a coroutine (async-batcher 0.2.2's): ``await batcher.is_running()``. Without
        ``await`` it is a coroutine object, always true: ``if batcher.is_running():`` is a bug; read
        :attr:`running` there."""
        return self._running()

    def _running(self) -> bool:
        run = self._life.run
        return run.state in (State.RUNNING, State.STOPPING) and run.loop is not None and not run.loop.is_closed()

    async def stop(self, force: bool = False, timeout: float | None = None) -> None:
        """Stop: refuse new items, finish (or with ``force``, fail) the accepted ones, then run :meth:`on_stop`.

        Args:
            force: Fail every queued and in-flight caller at once with :class:`BatcherStoppedError` and cancel
                the batches in flight.
            timeout: Return after this many seconds at most: the drain has them all (half if ``on_stop()`` is
                overridden), then what is left is failed as by ``force``; ``on_stop()`` has the rest, then is
                cancelled.

        Idempotent and safe to call concurrently: every call returns once the batcher is stopped (or once its
        own ``timeout`` has expired).
        """
        force = _checks.flag("force", force)
        timeout = _checks.timeout(timeout)
        await self._stop_loop_thread(force, timeout)
        await self._life.stop(force=force, timeout=timeout)

    async def __aenter__(self) -> Self:
        self.start()
        startup = self._life.run.startup
        if startup is not None:
            try:
                await asyncio.shield(startup)
            except BaseException:
                await self.stop()
                raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # ------------------------------------------------------------------ statistics

    @property
    def stats(self) -> BatcherStats:
        """A frozen snapshot of the counters and recent latency percentiles."""
        return self._life.stats()

    def _watchers(self) -> tuple[list[Watcher], list[Callable[[Batch], None]]]:
        """:mod:`async_batcher.testing`'s: told of every batch of every run as it goes and ends, and of every call
        of ``process_batch`` as it begins, with what it is handed."""
        return self._life.watchers, self._life.calls

    def _engine(self) -> Engine | None:
        """The engine of the current run (``None`` before the first start): :mod:`async_batcher.testing`'s."""
        return self._life.run.engine

    def _observe(self, observer: BatchObserver, *, stop: bool = False) -> None:
        """Feed ``observer`` every batch from now on, or ``stop``: :mod:`async_batcher.metrics`'s histograms."""
        (self._recorder.remove_observer if stop else self._recorder.add_observer)(observer)

    def __repr__(self) -> str:
        stats = self.stats
        return (
            f"<{type(self).__name__} {self.name!r} {self._life.run.state.value} limits={self.limits!r} "
            f"policy={self.policy!r} queued={stats.queued} in_flight={stats.in_flight}>"
        )


# What help() and inspect.signature() show of AsyncBatcher(...): its keywords with their defaults, not **options.
AsyncBatcher.__init__.__signature__ = options_signature()  # type: ignore[attr-defined]
