"""``SharedBatcher``: one batcher for the processes of a machine, with the caller interface of ``AsyncBatcher``
(private module; the class is :mod:`async_batcher.shared`'s)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar, cast

from async_batcher import _checks
from async_batcher._threads import refuse_on_loop_thread, submit_to, wait_for
from async_batcher.exceptions import BatcherStoppedError, ReentrantCallError
from async_batcher.shared._call import ASK_STATS, END, ITEM, MANY, STREAM
from async_batcher.shared._seat import Seat
from async_batcher.shared._sharing import DEFAULT_MAX_MESSAGE_SIZE, Role, Sharing, address_of, qualified_name
from async_batcher.stats import BatcherStats, _Recorder

if TYPE_CHECKING:
    from types import TracebackType
    from typing import Self

    from async_batcher.batcher import AsyncBatcher

__all__ = ["SharedBatcher"]

logger = logging.getLogger("async_batcher.shared")

T = TypeVar("T")
R = TypeVar("R")
S = TypeVar("S")

#: What :meth:`SharedBatcher.watch` calls: with the batcher as this process starts owning it, ``None`` as it stops.
Watcher = Callable[["AsyncBatcher[Any, Any] | None"], object]

_NEW, _STARTING, _RUNNING, _STOPPING, _STOPPED = "new", "starting", "running", "stopping", "stopped"
_ZERO: Final = 0


class SharedBatcher(Generic[T, R]):
    """One batcher shared by the processes of a machine (the workers of ``uvicorn --workers N``, gunicorn's, a
    ``multiprocessing`` pool), without a model server: one process owns the :class:`~async_batcher.AsyncBatcher` (and
    its model), the others send it their items over a Unix socket, so that every process's callers share its batches.

    .. code-block:: python

        def make_predictor() -> KerasAsyncBatcher:  # called in the owner only: the model loads there only
            import keras
            return KerasAsyncBatcher(model=keras.saving.load_model("m.keras"), max_batch_size=256)

        predictor = SharedBatcher(make_predictor, name="predictor")  # in every worker, at import: no I/O
        # in the app's lifespan: `async with predictor:`; in an endpoint: `await predictor.process(x, timeout=1.0)`

    The calls are :class:`~async_batcher.AsyncBatcher`'s (``process``, ``process_many``, ``stream``, ``start``,
    ``stop``, ``async with``, ``stats``): moving to a shared batcher is a change of construction. Keys, weights,
    dedup and the limits are the owner's batcher's, through its hooks (``batch_key``, ``item_weight``,
    ``dedup_key``), as the item arrives there; each item still resolves exactly once, with its result, its own
    exception (its type kept), or its caller's cancellation (which withdraws it from the owner's queue if it has not
    gone). The owner's own callers use its batcher directly.

    Args:
        factory: A callable of no argument that returns the :class:`~async_batcher.AsyncBatcher` (or an awaitable of
            one); called in the owner only, in a thread unless it is an ``async def`` (a model takes seconds to
            load).
        name: The batcher's name in this process (the FastAPI helpers find it by it); the factory's qualified name
            by default.
        address, role, authkey, max_message_size, owner_wait: how it is shared: see :class:`Sharing`.

    Faults: when the owner dies, an item it had put in a batch fails with :class:`~async_batcher.OutcomeUnknownError`
    (it may have been processed); the others are held and sent to the next owner (with ``role="auto"``, one of the
    clients takes over), or fail with :class:`~async_batcher.OwnerUnavailableError` after ``owner_wait``. When the
    owner stops (``stop()``, its process ending), it drains what it accepted first. When a client dies, its items
    leave the owner's queue. The guide: "Past one process" (docs/guides/scaling.md).
    """

    def __init__(
        self,
        factory: Callable[[], AsyncBatcher[T, R] | Awaitable[AsyncBatcher[T, R]]],
        *,
        name: str | None = None,
        address: str | None = None,
        role: Role = "auto",
        authkey: bytes | None = None,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        owner_wait: float | None = None,
    ) -> None:
        if not callable(factory):
            raise TypeError(f"SharedBatcher() takes a factory (a callable returning an AsyncBatcher), got {factory!r}")
        self.sharing = Sharing(
            address=address, role=role, authkey=authkey, max_message_size=max_message_size, owner_wait=owner_wait
        )
        self.factory = factory
        qualname = qualified_name(factory)
        if name is None and qualname is None:
            raise TypeError(f"SharedBatcher(): name this batcher (name=...): {factory!r} has no qualified name")
        self.name: str = _checks.name(name, (qualname or "").rpartition(".")[2])
        self._key = qualname if qualname is not None else self.name  # (what the default address is named after)
        self._address: str | None = None
        self._state = _NEW
        self._seat: Seat | None = None
        self._startup: asyncio.Task[None] | None = None
        self._stopping: asyncio.Task[None] | None = None
        self._snapshot: BatcherStats | None = None
        self._start_error: Exception | None = None  # why the last start failed (the factory's error)
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop it runs on (for blocking callers)
        self._owned: AsyncBatcher[T, R] | None = None  # the batcher while this process owns it (as watchers are told)
        self._watchers: dict[object, Watcher] = {}

    @property
    def address(self) -> str:
        """The socket's path (computed, and its directory checked, at first use)."""
        if self._address is None:
            self._address = address_of(self.sharing, self._key)
        return self._address

    @property
    def role(self) -> str | None:
        """``"owner"`` while this process owns the batcher, ``"client"`` while it sends to another; ``None`` when not
        started (or stopped)."""
        seat = self._seat
        if seat is None or self._state not in (_RUNNING, _STOPPING):
            return None
        return "owner" if seat.local is not None else "client"

    @property
    def batcher(self) -> AsyncBatcher[T, R] | None:
        """The batcher itself, in the process that owns it (``None`` elsewhere)."""
        seat = self._seat
        return None if seat is None else seat.local

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start on the running event loop (optional: the first call does it); idempotent. The owner's start
        (the factory, the socket) runs in a task that :meth:`process` and ``async with`` wait for."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # (started at first use)
        if self._state in (_STARTING, _RUNNING):
            return
        if self._state == _STOPPING:
            raise BatcherStoppedError(f"{self.name} is stopping; it can be started again once stop() returns")
        self._state = _STARTING
        self._loop = loop
        self._start_error = None
        self._startup = loop.create_task(self._take())
        self._startup.add_done_callback(_retrieve)

    async def _take(self) -> None:
        seat = self._seat = Seat(self.factory, self.sharing, self.name, self.address, self._on_local)
        try:
            await seat.take()
        except BaseException as exc:
            self._state = _STOPPED
            self._seat = None
            if isinstance(exc, Exception):
                self._start_error = exc
                logger.error("%s: the start failed: %r", self.name, exc)
            raise
        self._state = _RUNNING

    async def _started(self) -> Seat:
        """The seat, once started (starting a new batcher); refuse if stopping or stopped. A start that failed
        raises its error (the factory's); one that a stop ended, :class:`BatcherStoppedError`."""
        if self._state == _NEW:
            self.start()
        startup = self._startup
        if self._state == _STARTING and startup is not None:
            await asyncio.wait([startup])  # (the start is everyone's: a caller leaving does not cancel it)
            if not startup.cancelled() and startup.exception() is not None:
                raise cast(BaseException, startup.exception())
        seat = self._seat
        if self._state != _RUNNING or seat is None:
            failed = self._start_error
            why = "" if failed is None or self._state != _STOPPED else f" (its start failed: {failed!r})"
            raise BatcherStoppedError(f"{self.name} is {self._state}{why}; start() it again to submit items")
        return seat

    async def _started_within(self, timeout: float | None) -> tuple[Seat, float | None]:
        """:meth:`_started` within a caller's ``timeout`` (the owner's factory may take seconds to load); the seat,
        and what is left of the timeout."""
        timeout = _checks.timeout(timeout)
        if timeout is None:
            return await self._started(), None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        bound = asyncio.timeout(timeout)
        try:
            async with bound:
                seat = await self._started()
        except TimeoutError:
            if not bound.expired():
                raise  # (the factory's own)
            raise TimeoutError(
                f"{self.name}: no result within the timeout (the shared batcher was still starting)"
            ) from None
        return seat, max(0.0, deadline - loop.time())

    async def stop(self, force: bool = False, timeout: float | None = None) -> None:
        """Stop. The owner hands over: it tells its clients it is leaving (they hold their new items for the next
        owner), drains what it accepted (``force`` and ``timeout`` as :meth:`AsyncBatcher.stop
        <async_batcher.AsyncBatcher.stop>`), then gives the socket up; a client waits for the answers to its calls
        (``force``: fails them at once, with :class:`~async_batcher.BatcherStoppedError`; ``timeout``: after that
        long). Called while this process's factory still loads, it ends the start (an ``async def`` factory is
        cancelled; a thread's is left to finish, what it makes dropped): callers waiting for the start get
        :class:`~async_batcher.BatcherStoppedError`. Idempotent and safe to call concurrently."""
        force = _checks.flag("force", force)
        timeout = _checks.timeout(timeout)
        seat = self._seat
        if seat is not None and seat.local is not None and seat.local._in_own_batch():
            raise ReentrantCallError(
                f"{self.name}: stop() awaited inside its own process_batch would wait for that batch forever; "
                "stop it from outside the batch"
            )
        if self._state in (_NEW, _STOPPED):
            return
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._leave(force, timeout))
        await asyncio.shield(self._stopping)

    async def _leave(self, force: bool, timeout: float | None) -> None:
        startup = self._startup
        self._state = _STOPPING
        try:
            if startup is not None and not startup.done():  # (a factory still loading: its start is abandoned)
                startup.cancel()
                await asyncio.wait([startup])
            if self._seat is not None:
                await self._seat.leave(force, timeout)
        finally:
            self._state = _STOPPED
            self._seat = None
            self._stopping = None

    async def is_running(self) -> bool:
        """Whether it is started and not yet stopped (it is running while it stops)."""
        return self._state in (_RUNNING, _STOPPING)

    async def __aenter__(self) -> Self:
        self.start()
        try:
            await self._started()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # ------------------------------------------------------------------ following the batcher

    def watch(self, callback: Watcher) -> Callable[[], None]:
        """Call ``callback(batcher)`` whenever this process starts owning the batcher (before its first batch), and
        ``callback(None)`` whenever it stops owning it (once its batcher has stopped: its statistics are final); at
        once, with the batcher, if this process owns it now. The metrics and tracing integrations follow the batcher
        from owner to owner with it. Returns a function that stops watching. A callback that raises is logged."""
        if not callable(callback):
            raise TypeError(f"{self.name}: watch() takes a callable, got {callback!r}")
        token = object()
        self._watchers[token] = callback
        if self._owned is not None:
            self._tell(callback, self._owned)

        def unwatch() -> None:
            self._watchers.pop(token, None)

        return unwatch

    def _on_local(self, batcher: AsyncBatcher[T, R] | None) -> None:
        self._owned = batcher
        for callback in list(self._watchers.values()):
            self._tell(callback, batcher)

    def _tell(self, callback: Watcher, batcher: AsyncBatcher[T, R] | None) -> None:
        try:
            callback(batcher)
        except Exception:
            logger.exception("%s: a watcher, %r, raised (told %s)", self.name, callback, batcher)

    # ------------------------------------------------------------------ submitting

    async def process(self, item: T, *, timeout: float | None = None, priority: float = 0) -> R:
        """Submit one item and wait for its result, as :meth:`AsyncBatcher.process
        <async_batcher.AsyncBatcher.process>` (its exceptions, and these): :class:`~async_batcher.OutcomeUnknownError`
        (the owner died while the item was in a batch), :class:`~async_batcher.OwnerUnavailableError` (no owner
        within ``owner_wait``), :class:`~async_batcher.NotPicklableError` and
        :class:`~async_batcher.MessageTooLargeError` (the item, its result or its exception cannot cross). The
        ``timeout`` counts from the call, the owner's start included (its factory may take seconds to load)."""
        seat = self._seat
        if seat is None or self._state != _RUNNING:
            seat, timeout = await self._started_within(timeout)
        local = seat.local
        if local is not None:
            return cast(R, await local.process(item, timeout=timeout, priority=priority))
        if timeout is not None:
            timeout = _checks.timeout(timeout)
        if priority is not _ZERO:
            priority = _checks.priority(priority)
        client = seat.client
        call = client.submit(ITEM, item, timeout, priority)
        try:
            return cast(R, await call.fut)
        except asyncio.CancelledError:
            client.cancel(call)
            raise

    async def process_many(
        self,
        items: Iterable[T],
        *,
        timeout: float | None = None,
        priority: float = 0,
        return_exceptions: bool = False,
    ) -> list[R]:
        """Submit many items at once; their results in order, as :meth:`AsyncBatcher.process_many
        <async_batcher.AsyncBatcher.process_many>` (one message for the whole call)."""
        seat, timeout = await self._started_within(timeout)
        if seat.local is not None:
            return await seat.local.process_many(
                items, timeout=timeout, priority=priority, return_exceptions=return_exceptions
            )
        batch = list(items)
        flag = _checks.flag("return_exceptions", return_exceptions)
        call = seat.client.submit(MANY, batch, timeout, _checks.priority(priority), flag)
        try:
            return cast(list[R], await call.fut)
        except asyncio.CancelledError:
            seat.client.cancel(call)
            raise

    def stream(self, item: T, *, timeout: float | None = None, priority: float = 0) -> AsyncIterator[R]:
        """Submit one item and iterate its results as the owner's streaming ``process_batch`` yields them, as
        :meth:`AsyncBatcher.stream <async_batcher.AsyncBatcher.stream>`. Parts travel a window ahead of the
        consumer; one that stops reading holds the owner's stream as it would in one process."""
        return self._stream(item, timeout, priority)

    async def _stream(self, item: T, timeout: float | None, priority: float) -> AsyncIterator[R]:
        seat, timeout = await self._started_within(timeout)
        if seat.local is not None:
            parts = seat.local.stream(item, timeout=timeout, priority=priority)
            try:
                async for part in parts:
                    yield part
            finally:
                await parts.aclose()  # type: ignore[attr-defined]
            return
        client = seat.client
        call = client.submit(STREAM, item, timeout, _checks.priority(priority))
        try:
            while (part := await client.next_part(call)) is not END:
                yield part
        finally:
            client.cancel(call)  # (a no-op once it has ended)

    # ------------------------------------------------------------------ callers from threads

    def process_sync(self, item: T, *, timeout: float | None = None, priority: float = 0) -> R:
        """:meth:`process` for sync code in another thread: the shared batcher must run on an event loop (the
        app's); blocks until the result, at most ``timeout`` seconds."""
        return self._blocking(self.process(item, priority=priority), timeout, "process_sync()")

    def process_many_sync(
        self, items: Iterable[T], *, timeout: float | None = None, priority: float = 0, return_exceptions: bool = False
    ) -> list[R]:
        """:meth:`process_many` for sync code in another thread, as :meth:`process_sync`."""
        call = self.process_many(items, priority=priority, return_exceptions=return_exceptions)
        return self._blocking(call, timeout, "process_many_sync()")

    def stop_sync(self, force: bool = False, timeout: float | None = None) -> None:
        """:meth:`stop` for sync code in another thread."""
        self._blocking(self.stop(force=force, timeout=timeout), None, "stop_sync()")

    def _blocking(self, coro: Coroutine[Any, Any, S], timeout: float | None, what: str) -> S:
        try:
            refuse_on_loop_thread(f"{self.name}: {what}")
            seconds = _checks.timeout(timeout)
            loop = self._loop
            if loop is None or self._state in (_NEW, _STOPPED):
                raise BatcherStoppedError(
                    f"{self.name}: {what}: start the shared batcher on an event loop first (the app's)"
                )
            future = submit_to(loop, coro, f"{self.name}: {what}")
        except BaseException:
            coro.close()
            raise
        return wait_for(future, seconds)

    # ------------------------------------------------------------------ statistics

    @property
    def stats(self) -> BatcherStats:
        """The owner's statistics: live in the owner; in a client, the snapshot :meth:`fetch_stats` fetched last
        (empty before the first)."""
        seat = self._seat
        if seat is not None and seat.local is not None:
            return seat.local.stats
        if self._snapshot is not None:
            return self._snapshot
        return _Recorder().snapshot(self.name, queued=0, awaiting_room=0, in_flight=0)

    async def fetch_stats(self) -> BatcherStats:
        """The owner's statistics now (a round trip from a client), also kept as :attr:`stats`."""
        seat = await self._started()
        if seat.local is not None:
            return seat.local.stats
        call = seat.client.submit(ASK_STATS, None, None, 0)
        try:
            self._snapshot = cast(BatcherStats, await call.fut)
        except asyncio.CancelledError:
            seat.client.cancel(call)
            raise
        return self._snapshot

    def __repr__(self) -> str:
        return f"<SharedBatcher {self.name!r} {self._state} role={self.role!r} address={self._address!r}>"


def _retrieve(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()  # (a start's error is its callers' to raise, and logged: never reported as lost)
