"""One end of a connection between an owner and a client: the handshake, frames in, records out gathered per loop turn
into one frame (private; above :mod:`~async_batcher.shared._wire`).

:class:`Connection` is an :class:`asyncio.BufferedProtocol` (the loop receives straight into its buffer); the owner's
and the client's ends subclass it (:meth:`Connection.received` for the records of each frame, :meth:`Connection.refused`
for a record that could not be sent). The handshake is a challenge both ways (the owner speaks first):

1. owner: hello (version, pid, the largest frame it accepts, its factory's load time) and a challenge;
2. client: its answer (the challenge's HMAC with the key), its hello, the path of its gone board
   (:mod:`~async_batcher.shared._board`), its own challenge;
3. owner: its answer, or ``DENY`` and the connection closed.

No pickle is read before both sides have proved they hold the key.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
from collections import deque
from typing import Any, Final

from async_batcher.shared import _wire
from async_batcher.shared._wire import TooLarge, Violation

__all__: list[str] = []

logger = logging.getLogger("async_batcher.shared")

DENY: Final = b"DENY"
#: How long a connection may take to pass the handshake.
HANDSHAKE_TIMEOUT: Final = 10.0
#: The largest frame before the handshake is over (a hello, a challenge, an answer and a board's path: a few
#: hundred bytes): a peer that has proved nothing gets no buffer of ``max_message_size`` for its frame.
HANDSHAKE_LIMIT: Final = 8 * 1024
_NO_VALUE: Final = object()
#: The slices large frames are written in (and the transport's buffer kept under).
_SLICE: Final = 1024 * 1024


class Connection(asyncio.BufferedProtocol):
    """Frames in and out of one connection (see the module's docstring)."""

    #: "owner" or "client": which side of the handshake this end plays.
    side = ""

    def __init__(self, key: bytes, limit: int) -> None:
        self.key = key
        self.limit = limit  # the largest frame this end accepts
        self.peer_limit = limit  # the largest the other end accepts (its hello says)
        self.peer_pid = 0
        self.peer_load = 0.0
        self.reader = _wire.Reader(HANDSHAKE_LIMIT, self._frame)  # (limit, once the handshake is over)
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()
        self.ready = False  # the handshake is over
        self.step = 0
        self.mine = _wire.challenge()
        self.control: list[Any] = []  # records to send at the end of this loop turn
        self.values: list[Any] = []
        self.flush_handle: asyncio.Handle | None = None
        self.frames_out = 0  # frames written (the tests count them)
        self.closed = False
        self.closing = False  # close() was called: the transport closes once the backlog is written
        # Large frames, in slices not yet handed to the transport: it gets a slice as it drains, so that its
        # buffer stays small (asyncio's, before Python 3.12, moves what is left of its buffer at every send).
        self.backlog: deque[memoryview] = deque()
        self.backlog_size = 0

    # ------------------------------------------------------------------ the protocol's callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.transport.set_write_buffer_limits(high=_SLICE)  # type: ignore[union-attr]  # (resume_writing: pump)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.reader.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        try:
            self.reader.updated(nbytes)
        except Violation as exc:
            self.violated(exc)

    def eof_received(self) -> bool | None:
        return None  # (close the transport: connection_lost follows)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.backlog.clear()
        self.backlog_size = 0
        if self.flush_handle is not None:
            self.flush_handle.cancel()
            self.flush_handle = None
        self.lost(exc)

    # ------------------------------------------------------------------ what the two ends do

    def lost(self, exc: Exception | None) -> None:
        """The connection is closed."""

    def established(self) -> None:
        """The handshake is over: records may flow, in frames as large as this end accepts."""
        self.ready = True
        self.reader.limit = self.limit

    def received(self, control: list[Any], values: list[Any] | BaseException) -> None:
        """The records of a frame, and their values (or why they could not be unpickled here)."""
        raise NotImplementedError

    def refused(self, record: Any, value: Any, error: BaseException) -> None:
        """``record`` (with ``value``) could not be sent: it does not pickle, or is over the peer's limit."""
        raise NotImplementedError

    def violated(self, error: Exception) -> None:
        """The peer broke the protocol: log it and close the connection."""
        logger.warning("shared batcher: closing a connection to pid %s: %s", self.peer_pid or "?", error)
        self.abort()

    def abort(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.abort()

    def close(self) -> None:
        """Send what is gathered, then close (once the backlog is written)."""
        if self.flush_handle is not None:
            self.flush()
        self.closing = True
        if self.transport is not None and not self.closed and not self.backlog:
            self.transport.close()

    def unsent(self) -> int:
        """Bytes written and not yet taken by the peer's end (the transport's buffer and the backlog)."""
        return self.backlog_size + (self.transport.get_write_buffer_size() if self.transport is not None else 0)

    def pause_writing(self) -> None:
        pass

    def resume_writing(self) -> None:
        self.pump()

    def pump(self) -> None:
        """Hand the transport the backlog's slices until its buffer is over its high-water mark (a slice's size):
        over it, not at it, since only then does it pause (and, drained, resume: the next pump)."""
        transport = self.transport
        backlog = self.backlog
        if transport is None or self.closed:
            return
        while backlog and transport.get_write_buffer_size() <= _SLICE:
            piece = backlog.popleft()
            self.backlog_size -= piece.nbytes
            transport.write(piece)
        if not backlog and self.closing:
            transport.close()

    # ------------------------------------------------------------------ the handshake

    def write_raw(self, payload: bytes) -> None:
        assert self.transport is not None
        self.transport.write(_wire.raw(payload))

    def _frame(self, body: memoryview, owned: bool) -> None:
        if self.closed:
            return
        if not self.ready:
            self.handshake(bytes(body))
            return
        control, values = _wire.decode(body, owned)  # (a Violation closes the connection)
        try:
            loaded: list[Any] | BaseException = values()
        except Exception as exc:  # (a payload of a class this process cannot build)
            loaded = exc
        self.received(control, loaded)

    def handshake(self, payload: bytes) -> None:
        """The next step of the handshake, from the peer's ``payload``."""
        raise NotImplementedError

    def _peer(self, hello: bytes) -> None:
        self.peer_pid, limit, self.peer_load = _wire.parse_hello(hello)
        self.peer_limit = min(limit, self.limit)

    # ------------------------------------------------------------------ sending

    def send(self, record: Any, value: Any = _NO_VALUE) -> None:
        """Gather ``record`` (and its value) into the frame this loop turn ends with."""
        self.control.append(record)
        if value is not _NO_VALUE:
            self.values.append(value)
        if self.flush_handle is None:
            self.flush_handle = self.loop.call_soon(self.flush)

    def flush_soon(self) -> None:
        """Write what is gathered at the end of this loop turn (at the latest)."""
        if self.flush_handle is None and not self.closed:
            self.flush_handle = self.loop.call_soon(self.flush)

    def send_now(self, control: list[Any]) -> None:
        """Write ``control`` (records without values) at once, in a frame of its own: it is in the kernel's buffers
        (unless the connection is backed up) before this returns."""
        if self.closed or self.transport is None:
            return
        self.write(_wire.encode(control, [], self.peer_limit))

    def write(self, chunks: list[bytes | memoryview]) -> None:
        transport = self.transport
        assert transport is not None
        self.frames_out += 1
        if len(chunks) == 1 and not self.backlog and len(chunks[0]) < _SLICE:
            transport.write(chunks[0])  # (the common case: a small frame, straight out)
            return
        for chunk in chunks:
            view = memoryview(chunk).cast("B")
            for start in range(0, view.nbytes, _SLICE):
                piece = view[start : start + _SLICE]
                self.backlog.append(piece)
                self.backlog_size += piece.nbytes
        self.pump()

    def flush(self) -> None:
        """Write what this turn gathered, in one frame. What does not pickle or is too large goes on its own:
        each record is tried alone, and those that fail are :meth:`refused`."""
        self.flush_handle = None
        control, values = self.control, self.values
        if not control or self.closed:
            return
        self.control, self.values = [], []
        try:
            chunks = _wire.encode(control, values, self.peer_limit)
        except Exception:  # (a payload that does not pickle, or a frame too large: find which)
            self._one_by_one(control, values)
            return
        self.write(chunks)

    def _one_by_one(self, control: list[Any], values: list[Any]) -> None:
        ok_control: list[Any] = []
        ok_values: list[Any] = []
        size = 0
        it = iter(values)
        for record in control:
            valued = record.__class__ is int or record[0] in _wire.VALUED
            value = next(it) if valued else _NO_VALUE
            try:
                chunks = _wire.encode([record], [value] if valued else [], self.peer_limit)
            except TooLarge as exc:
                self.refused(record, value, exc)
                continue
            except Exception as exc:
                self.refused(record, value, exc)
                continue
            length = sum(len(c) if isinstance(c, bytes) else c.nbytes for c in chunks)
            if size + length > self.peer_limit and ok_control:
                self.write(_wire.encode(ok_control, ok_values, self.peer_limit))
                ok_control, ok_values, size = [], [], 0
            ok_control.append(record)
            if valued:
                ok_values.append(value)
            size += length
        if ok_control:
            self.write(_wire.encode(ok_control, ok_values, self.peer_limit))


def describe(value: object, error: BaseException, what: str) -> str:
    """Why ``value`` could not cross: its type and the error."""
    kind = type(value)
    name = f"{kind.__module__}.{kind.__qualname__}" if kind.__module__ != "builtins" else kind.__qualname__
    if isinstance(error, TooLarge):
        return f"{what} of type {name} is {error.size} bytes pickled, over max_message_size={error.limit}"
    return f"{what} of type {name} cannot cross between processes: {type(error).__name__}: {error}"


def crosses(exc: BaseException) -> bool:
    """Whether an exception survives pickling (one whose ``__init__`` wants more than its ``args`` does not)."""
    if type(exc).__module__ in ("builtins", "async_batcher.exceptions"):
        return True
    try:
        pickle.loads(pickle.dumps(exc, 5))
    except Exception:
        return False
    return True


def pid() -> int:
    return os.getpid()
