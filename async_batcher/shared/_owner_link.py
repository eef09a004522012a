"""The owner's end of one client's connection (private; under :mod:`~async_batcher.shared._owner`): the client's
items into the batcher without a task per item, their outcomes back, its ``process_many`` and ``stream`` calls as a
task each, and a client that does not read disconnected. See :mod:`~async_batcher.shared._owner`."""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import traceback
from contextvars import ContextVar, copy_context
from functools import partial
from typing import TYPE_CHECKING, Any, Final

from async_batcher.exceptions import (
    AsyncBatchException,
    BatcherStoppedError,
    MessageTooLargeError,
    NotPicklableError,
)
from async_batcher.shared import _wire
from async_batcher.shared._board import Board
from async_batcher.shared._link import DENY, HANDSHAKE_TIMEOUT, Connection, crosses, describe

if TYPE_CHECKING:
    from async_batcher.shared._owner import Owner

__all__: list[str] = []

logger = logging.getLogger("async_batcher.shared")

#: The ticket of a remote item, in the context it is submitted in: (its connection, its id).
_TICKET: ContextVar[tuple[OwnerLink, int] | None] = ContextVar("async_batcher_shared_ticket", default=None)
#: Parts of a stream sent ahead of its consumer, at most.
STREAM_WINDOW: Final = 16
#: Seconds a client may leave more than ``max_message_size`` unread before it is disconnected.
STALL: Final = 1.0


def _enter(link: OwnerLink, id: int, item: Any, timeout: float | None, priority: float, trace: Any) -> Any:
    # Run in the item's own context: its ticket, its caller's trace, then the batcher's short path (or a task).
    _TICKET.set((link, id))
    if trace is not None:
        _attach_trace(trace)
    return link.batcher._submit(item, timeout, priority)


def _attach_trace(trace: tuple[int, int, int]) -> None:
    """The caller's span (W3C trace and span ids, flags) as the current span of this context: the batch's span
    links to it as to a caller's of this process."""
    try:
        from opentelemetry import context as otel_context
        from opentelemetry import trace as otel_trace
    except ImportError:  # (no OpenTelemetry in the owner: nothing records spans here)
        return
    span = otel_trace.NonRecordingSpan(
        otel_trace.SpanContext(trace[0], trace[1], is_remote=True, trace_flags=otel_trace.TraceFlags(trace[2]))
    )
    otel_context.attach(otel_trace.set_span_in_context(span))


class OwnerLink(Connection):
    """The owner's end of one client's connection: its items in, their outcomes and their tickets out."""

    side = "owner"

    def __init__(self, owner: Owner) -> None:
        super().__init__(owner.key, owner.limit)
        self.owner = owner
        self.batcher = owner.batcher
        self.pending: dict[int, asyncio.Future[Any]] = {}  # its items submitted, not yet answered
        self.tasks: dict[int, asyncio.Task[Any]] = {}  # its process_many and stream calls
        self.windows: dict[int, _Window] = {}
        self.board: Board | None = None  # the client's gone board, mapped (left to the garbage collector)
        self.noted: tuple[BaseException | None, str] = (None, "")
        self.timer: asyncio.TimerHandle | None = None
        self.stalled: asyncio.TimerHandle | None = None  # the client has a frame's worth unread: since when

    # ------------------------------------------------------------------ the connection

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if self.owner.leaving:  # (accepted as the socket closed: nothing to serve it)
            self.abort()
            return
        self.owner.links.add(self)  # (from now: a close of the owner closes it, ready or not)
        self.write_raw(_wire.hello(os.getpid(), self.limit, self.owner.load_seconds) + self.mine)
        self.timer = self.loop.call_later(HANDSHAKE_TIMEOUT, self.abort)

    def handshake(self, payload: bytes) -> None:
        n, h = _wire.DIGEST_SIZE, _wire.HELLO_SIZE
        given, hello, path, theirs = payload[:n], payload[n : n + h], payload[n + h : -32], payload[-32:]
        if len(payload) < n + h + 32 or not _wire.verify(self.key, self.mine, b"client", given):
            logger.warning("%s: a connection that does not know the key was refused", self.batcher.name)
            self.write_raw(DENY)
            self.close()
            return
        try:
            self._peer(hello)
            self.board = Board.attach(os.fsdecode(path))
            self.board.unlink()  # (mapped by both now; the client does too, unless it dies before it hears back)
        except (_wire.Violation, OSError) as exc:
            self.violated(exc if isinstance(exc, _wire.Violation) else _wire.Violation(f"its gone board: {exc}"))
            return
        self.write_raw(_wire.answer(self.key, theirs, b"owner"))
        self.established()
        if self.timer is not None:
            self.timer.cancel()
        if self.owner.leaving:
            self.send_now([(_wire.LEAVING,)])

    def lost(self, exc: Exception | None) -> None:
        """The client is gone: its items are cancelled (withdrawn if they wait), their results dropped."""
        for timer in (self.timer, self.stalled):
            if timer is not None:
                timer.cancel()
        self.owner.links.discard(self)
        self.owner.poke()
        pending, self.pending = self.pending, {}
        for fut in pending.values():
            fut.cancel()
        tasks, self.tasks = self.tasks, {}
        for task in tasks.values():
            task.cancel()
        if pending or tasks:
            logger.info(
                "%s: client pid %s left; %d of its calls cancelled", self.batcher.name, self.peer_pid, len(pending)
            )

    def flush(self) -> None:
        if not self.closed and self.unsent() > 2 * self.peer_limit:
            self.control, self.values = [], []
            self.flush_handle = None
            self.unread()
            return
        super().flush()

    def pause_writing(self) -> None:
        # The transport's buffer is full: the client has STALL seconds to read some of it.
        if self.stalled is None:
            self.stalled = self.loop.call_later(STALL, self.unread)

    def resume_writing(self) -> None:
        if self.stalled is not None:
            self.stalled.cancel()
            self.stalled = None
        super().resume_writing()

    def unread(self) -> None:
        """The client does not read what it is sent: disconnect it (its items are cancelled)."""
        size = self.unsent()
        logger.warning(
            "%s: client pid %s does not read its results (%d bytes unread): disconnected",
            self.batcher.name,
            self.peer_pid,
            size,
        )
        self.abort()

    # ------------------------------------------------------------------ records in

    def received(self, control: list[Any], values: list[Any] | BaseException) -> None:
        failed = values if isinstance(values, BaseException) else None
        i = 0
        for record in control:
            if record.__class__ is int:  # a plain item
                if failed is None:
                    value = values[i]  # type: ignore[index]
                    i += 1
                    if value.__class__ is _wire.Broken:
                        self.unpicklable(record, value.error)
                    else:
                        self.submit(record, value, None, 0, None)
                else:
                    self.unpicklable(record, failed)
                continue
            op = record[0]
            if op in _wire.VALUED:
                if failed is not None:
                    self.unpicklable(record[1], failed)
                    continue
                value = values[i]  # type: ignore[index]
                i += 1
                if value.__class__ is _wire.Broken:
                    self.unpicklable(record[1], value.error)
                elif op == _wire.SUBMIT:
                    self.submit(record[1], value, record[2], record[3], record[4])
                elif op == _wire.MANY:
                    self.call(record[1], self._many(value, record[2], record[3], record[4]), None)
                elif op == _wire.STREAM:
                    self.windows[record[1]] = _Window(self.loop)
                    self.call(record[1], self._stream(record[1], value, record[2], record[3]), record[4])
            elif op == _wire.CANCEL:
                self.cancel(record[1])
            elif op == _wire.ACK:
                window = self.windows.get(record[1])
                if window is not None:
                    window.give(record[2])
            elif op == _wire.ASK_STATS:
                self.send((_wire.STATS, record[1]), self.batcher.stats)
            else:
                self.violated(_wire.Violation(f"unknown record {record!r}"))
                return

    def unpicklable(self, id: int, error: BaseException) -> None:
        message = f"an item sent by pid {self.peer_pid} does not unpickle in the owner: {error}"
        self.error(id, NotPicklableError(message))

    def submit(self, id: int, item: Any, timeout: float | None, priority: float, trace: Any) -> None:
        """An item: into the batcher, its outcome sent back from a done callback."""
        if self.owner.leaving:
            self.send((_wire.BOUNCE, id))
            return
        try:
            fut = copy_context().run(_enter, self, id, item, timeout, priority, trace)
        except Exception as exc:  # (_submit does not raise; a bad trace from the wire might)
            self.error(id, exc)
            return
        self.pending[id] = fut
        fut.add_done_callback(partial(self.answer, id))

    def cancel(self, id: int) -> None:
        fut = self.pending.pop(id, None)
        if fut is not None:
            fut.cancel()
            return
        task = self.tasks.pop(id, None)
        if task is not None:
            self.windows.pop(id, None)
            task.cancel()

    def call(self, id: int, coro: Any, trace: Any) -> None:
        """A process_many or stream call: a task of its own, in a context with its ticket (and its caller's trace)."""
        if self.owner.leaving:
            coro.close()
            self.windows.pop(id, None)
            self.send((_wire.BOUNCE, id))
            return
        context = copy_context()
        context.run(_TICKET.set, (self, id))
        if trace is not None:
            context.run(_attach_trace, trace)
        task = self.loop.create_task(coro, context=context)
        self.tasks[id] = task
        task.add_done_callback(partial(self.answer, id))

    async def _many(self, items: list[Any], timeout: float | None, priority: float, return_exceptions: bool) -> Any:
        return await self.batcher.process_many(
            items, timeout=timeout, priority=priority, return_exceptions=return_exceptions
        )

    async def _stream(self, id: int, item: Any, timeout: float | None, priority: float) -> Any:
        window = self.windows[id]
        parts = self.batcher.stream(item, timeout=timeout, priority=priority)
        try:
            async for part in parts:
                self.send((_wire.PART, id), part)
                await window.take()
        finally:
            await parts.aclose()  # type: ignore[attr-defined]  # (an async generator: left if cancelled)
        return _END

    # ------------------------------------------------------------------ outcomes out

    def answer(self, id: int, fut: asyncio.Future[Any]) -> None:
        """An item's (or a call's) outcome, to its client: unless the client cancelled it, or is gone."""
        if self.pending.pop(id, None) is None and self.tasks.pop(id, None) is None:
            return
        if not self.pending and not self.tasks:
            self.owner.poke()
        if fut.cancelled():  # (not the client's doing: it would have been popped)
            self.error(id, BatcherStoppedError(f"{self.batcher.name}: the call was cancelled in the owner"))
            return
        exc = fut.exception()
        if exc is not None:
            self.windows.pop(id, None)
            self.error(id, exc)
            return
        result = fut.result()
        if result is _END:
            self.windows.pop(id, None)
            self.send((_wire.END, id))
        else:
            self.send(id, result)

    def error(self, id: int, exc: BaseException) -> None:
        note = self._note(exc)
        if not crosses(exc):
            exc = NotPicklableError(f"{describe(exc, _pickle_error(exc), 'the exception')}; its message: {exc}")
        self.send((_wire.ERROR, id, note), exc)

    def _note(self, exc: BaseException) -> str:
        """The owner's traceback of ``exc`` (not of async-batcher's own errors, whose messages say it all)."""
        if exc.__traceback__ is None or isinstance(exc, AsyncBatchException):
            return ""
        if self.noted[0] is not exc:  # (a failed batch gives every caller the same exception: formatted once)
            text = "".join(traceback.format_exception(exc)).rstrip()
            self.noted = (exc, f"Traceback in the owner (pid {os.getpid()}):\n{text}")
        return self.noted[1]

    def refused(self, record: Any, value: Any, error: BaseException) -> None:
        """A result, exception, part or snapshot that does not pickle (or is too large): its caller gets why."""
        if record.__class__ is int:
            self.send((_wire.ERROR, record, ""), _refusal(value, error, "the result"))
        elif record[0] == _wire.ERROR:
            self.send((_wire.ERROR, record[1], record[2]), _refusal(value, error, "the exception"))
        elif record[0] in (_wire.PART, _wire.STATS):
            self.cancel(record[1])
            self.send((_wire.ERROR, record[1], ""), _refusal(value, error, "a part of the stream"))


class _Window:
    """A stream's parts sent ahead of its consumer: at most :data:`STREAM_WINDOW` unacknowledged."""

    __slots__ = ("credit", "loop", "waiter")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.credit = STREAM_WINDOW
        self.waiter: asyncio.Future[None] | None = None

    async def take(self) -> None:
        self.credit -= 1
        while self.credit <= 0:
            self.waiter = self.loop.create_future()
            await self.waiter

    def give(self, n: int) -> None:
        self.credit += n
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


_END: Final = object()


def _refusal(value: Any, error: BaseException, what: str) -> Exception:
    if isinstance(error, _wire.TooLarge):
        return MessageTooLargeError(describe(value, error, what), size=error.size, limit=error.limit)
    return NotPicklableError(describe(value, error, what))


def _pickle_error(exc: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(exc, 5))
    except Exception as error:
        return error
    return RuntimeError("unknown")
