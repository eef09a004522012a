"""The shared batcher's wire: frames on a Unix socket, what they carry, and the key's challenge (private; the bottom
layer of :mod:`async_batcher.shared`).

A frame is a length prefix and a body. After the handshake (raw frames: :func:`challenge`, :func:`answer`), a body
holds the pickles (protocol 5) of the control records and of their values, and the out-of-band buffers of these::

    <I size of the body> <I control> <I values> <I buffers> <I split> <Q length of each buffer>...
    <I pickle, I buffers of each value, if split>... control values [pad buffer]...

``control`` is a list of records: an ``int`` (an item's id: a plain submission, or a plain result) or a tuple whose
first element is an opcode (below). The values are the payloads those records carry (items, results, exceptions,
parts), in the same order, unpickled apart from the records, so that a value that does not unpickle in this process
(its class cannot be imported here, its ``__setstate__`` raises) fails the records that carry it, and only those
(:class:`~async_batcher.NotPicklableError`), never the connection nor its neighbours: values of the built-in scalar
types (which always unpickle) travel as one pickle of their list; a frame with any other value has each value
pickled apart (``split``: the table says each one's pickle and buffers), and one that fails to unpickle becomes a
:class:`Broken` in its place. A buffer of 64 KiB or more (a numpy array's data) travels out of band: written as it
is, after the pickles, aligned to 64 bytes; the receiver reads a frame that large into a buffer of its own and
unpickles the arrays as views of it, without copying them again.

A frame over the receiver's ``max_message_size`` is a protocol violation (the connection is closed): senders check
the size first (:func:`encode` raises :class:`TooLarge`), and refuse what is over it to its caller alone.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import pickle
import struct
from collections.abc import Callable
from typing import Any, Final

__all__: list[str] = []

#: The protocol's version, checked at the handshake: both sides must speak the same.
VERSION: Final = 1
MAGIC: Final = b"async-batcher/shared"

# Opcodes: the first element of a tuple record. Client to owner:
SUBMIT: Final = 1  # (SUBMIT, id, timeout, priority, trace) + item; a plain item is its id alone
CANCEL: Final = 2  # (CANCEL, id): the caller left; withdraw the item if it is not sent
MANY: Final = 3  # (MANY, id, timeout, priority, return_exceptions) + list of items: a process_many call
STREAM: Final = 4  # (STREAM, id, timeout, priority, trace) + item: a stream() call
ACK: Final = 5  # (ACK, id, n): the stream's consumer took n more parts (the owner sends a window ahead)
ASK_STATS: Final = 6  # (ASK_STATS, id): a snapshot of the owner's statistics, please
# Owner to client (a plain result is the item's id alone, its result the value):
ERROR: Final = 10  # (ERROR, id, note) + exception; note: the owner's traceback, or ""
PART: Final = 12  # (PART, id) + part: a stream's next part
END: Final = 13  # (END, id): the stream is complete
LEAVING: Final = 14  # (LEAVING,): the owner stops: send nothing more; what was sent is answered
BOUNCE: Final = 15  # (BOUNCE, id): not accepted (the owner is leaving): hold it for the next owner
STATS: Final = 16  # (STATS, id) + snapshot: the owner's statistics (BatcherStats)
#: The opcodes whose records carry a value (besides plain ids, which always do).
VALUED: Final = frozenset({SUBMIT, MANY, STREAM, STATS, ERROR, PART})

_PREFIX = struct.Struct("<I")
_HEAD = struct.Struct("<IIIII")  # body size, control, values, buffers, split values
_LENGTH = struct.Struct("<Q")
#: The types of values that always unpickle: a frame of these alone pickles their list whole.
_PLAIN: Final = frozenset({int, float, str, bytes, bool, type(None)})
#: The largest frame the prefix can say.
MAX_FRAME: Final = 2**32 - 1
#: Buffers this large or larger travel out of band; frames this large or larger are read into a buffer of their own.
OUT_OF_BAND: Final = 64 * 1024
_ALIGN = 64
_CHUNK = 256 * 1024  # a connection's receive buffer, for the frames under OUT_OF_BAND


class TooLarge(Exception):
    """A frame would be larger than the peer accepts (``size`` bytes, ``limit``)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"{size} bytes, over the limit of {limit}")
        self.size = size
        self.limit = limit


class Violation(Exception):
    """The peer broke the protocol (a frame over the limit, a body that does not parse): close the connection."""


def _out_of_band(buffers: list[memoryview], buffer: pickle.PickleBuffer) -> bool:
    # pickle's buffer_callback: a false value sends the buffer out of band, a true one keeps it in the pickle.
    try:
        raw = buffer.raw()
    except BufferError:  # (not contiguous: in band)
        return True
    if raw.nbytes < OUT_OF_BAND:
        return True
    buffers.append(raw)
    return False


class Broken:
    """In a frame's values, one that did not unpickle here: ``error`` says why."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


def encode(control: list[Any], values: list[Any], limit: int) -> list[bytes | memoryview]:
    """A frame of ``control`` and ``values``, as the chunks to write; :class:`TooLarge` if it is over ``limit``.
    Pickling errors propagate (the caller finds the culprits one by one)."""
    ctl = pickle.dumps(control, 5)
    buffers: list[memoryview] = []
    split: list[int] = []  # (pickle's length, buffers) of each value, when pickled apart
    if not values:
        val = b""
    elif all(value.__class__ in _PLAIN for value in values):
        val = pickle.dumps(values, 5)
    else:
        parts = []
        for value in values:
            before = len(buffers)
            part = pickle.dumps(value, 5, buffer_callback=lambda b: _out_of_band(buffers, b))
            parts.append(part)
            split += (len(part), len(buffers) - before)
        val = b"".join(parts)
    n, m = len(buffers), len(split) // 2
    size = _HEAD.size - _PREFIX.size + 8 * n + 8 * m + len(ctl) + len(val)
    table = struct.pack(f"<{2 * m}I", *split) if m else b""
    if not n:
        if size + _PREFIX.size > limit:
            raise TooLarge(size + _PREFIX.size, limit)
        return [_HEAD.pack(size, len(ctl), len(val), 0, m) + table + ctl + val]
    chunks: list[bytes | memoryview] = [b"", ctl, val]
    lengths = []
    for raw in buffers:
        pad = -size % _ALIGN
        if pad:
            chunks.append(bytes(pad))
        chunks.append(raw)
        lengths.append(raw.nbytes)
        size += pad + raw.nbytes
    if size + _PREFIX.size > limit:
        raise TooLarge(size + _PREFIX.size, limit)
    chunks[0] = _HEAD.pack(size, len(ctl), len(val), n, m) + struct.pack(f"<{n}Q", *lengths) + table
    return chunks


def raw(payload: bytes) -> bytes:
    """A frame whose body is ``payload`` as it is (the handshake's)."""
    return _PREFIX.pack(len(payload)) + payload


def decode(body: memoryview, owned: bool) -> tuple[list[Any], Callable[[], list[Any]]]:
    """A frame's control records, and what unpickles its values: a :class:`Broken` in the place of a value pickled
    apart that does not unpickle; the error raised if their list, pickled whole, does not. ``owned``: the body is a
    buffer of the frame's own, which its arrays may keep as views; else its buffers are copied out of it."""
    try:
        ctl_len, val_len, n, m = struct.unpack_from("<IIII", body, 0)
        pos = 16 + 8 * n
        lengths = struct.unpack_from(f"<{n}Q", body, 16) if n else ()
        split = struct.unpack_from(f"<{2 * m}I", body, pos) if m else ()
        pos += 8 * m
        control = pickle.loads(body[pos : pos + ctl_len])
        if not isinstance(control, list):
            raise TypeError(f"control records in a {type(control).__name__}")
    except Exception as exc:
        raise Violation(f"a frame that does not parse: {exc!r}") from exc
    pos += ctl_len
    values_view = body[pos : pos + val_len]
    pos += val_len
    buffers: list[Any] = []
    for length in lengths:
        pos += -pos % _ALIGN  # (aligned from the body's start, as encode() laid it out)
        chunk = body[pos : pos + length]
        buffers.append(chunk if owned else bytearray(chunk))
        pos += length
    if not val_len:
        return control, list
    if split:
        if not owned:  # (the view goes with the receive buffer, reused for the next frame: unpickle it now)
            values = _load_apart(values_view, buffers, split)
            return control, lambda: values
        return control, lambda: _load_apart(values_view, buffers, split)
    if not owned:
        try:
            values = pickle.loads(values_view, buffers=buffers)
        except Exception as exc:
            error = exc
            return control, lambda: _raise(error)
        return control, lambda: values
    return control, lambda: pickle.loads(values_view, buffers=buffers)


def _load_apart(view: memoryview, buffers: list[Any], split: tuple[int, ...]) -> list[Any]:
    """Values pickled apart, each from its own pickle and buffers: a :class:`Broken` for one that fails."""
    values: list[Any] = []
    pos = first = 0
    for k in range(0, len(split), 2):
        length, count = split[k], split[k + 1]
        try:
            values.append(pickle.loads(view[pos : pos + length], buffers=buffers[first : first + count]))
        except Exception as exc:
            values.append(Broken(exc))
        pos += length
        first += count
    return values


def _raise(error: Exception) -> list[Any]:
    raise error


class Reader:
    """The frames of a byte stream, for an :class:`asyncio.BufferedProtocol`: the loop receives into
    :meth:`get_buffer`, and :meth:`updated` calls ``deliver(body, owned)`` for each frame complete (``owned``: the
    body is a buffer of its own, which the frame's values may keep; else it is valid during the call only)."""

    __slots__ = ("big", "buf", "deliver", "end", "got", "limit", "start")

    def __init__(self, limit: int, deliver: Callable[[memoryview, bool], None]) -> None:
        self.limit = limit
        self.deliver = deliver
        self.buf = bytearray(_CHUNK)
        self.start = self.end = 0  # the bytes received and not yet delivered: buf[start:end]
        self.big: bytearray | None = None  # a large frame's own buffer, being received
        self.got = 0

    def get_buffer(self) -> memoryview:
        big = self.big
        if big is not None:
            return memoryview(big)[self.got :]
        if self.end == len(self.buf):
            self._compact()
        return memoryview(self.buf)[self.end :]

    def _compact(self) -> None:
        pending = self.end - self.start
        if self.start:
            self.buf[:pending] = self.buf[self.start : self.end]  # (same size: allowed while views are out)
        else:  # a small frame larger than the buffer's free room from its start: a larger buffer
            buf = bytearray(max(2 * len(self.buf), _CHUNK))
            buf[:pending] = self.buf[: self.end]
            self.buf = buf
        self.start, self.end = 0, pending

    def updated(self, n: int) -> None:
        big = self.big
        if big is not None:
            self.got += n
            if self.got == len(big):
                self.big = None
                self.deliver(memoryview(big), True)
            return
        self.end += n
        buf, start, end = self.buf, self.start, self.end
        while end - start >= 4:
            (size,) = _PREFIX.unpack_from(buf, start)
            if size + 4 > self.limit:
                raise Violation(f"a frame of {size + 4} bytes, over the limit of {self.limit}")
            if size >= OUT_OF_BAND:  # into a buffer of its own (the loop receives the rest straight into it)
                big = bytearray(size)
                have = min(end - start - 4, size)
                big[:have] = buf[start + 4 : start + 4 + have]
                self.start = start = start + 4 + have
                if have < size:  # (everything received went into it)
                    self.start = self.end = 0
                    self.big, self.got = big, have
                    return
                self.deliver(memoryview(big), True)
                buf, start, end = self.buf, self.start, self.end
                continue
            if end - start - 4 < size:
                break
            view = memoryview(buf)[start + 4 : start + 4 + size]
            start += 4 + size
            self.start = start
            try:
                self.deliver(view, False)
            finally:
                view.release()
            buf, start, end = self.buf, self.start, self.end
        if start == end:
            self.start = self.end = 0


# ---------------------------------------------------------------------- the handshake: a challenge both ways

_DIGEST = hashlib.sha256().digest_size
_HELLO = struct.Struct("<HIQd")  # version, pid, max_message_size, seconds the owner's factory took


def challenge() -> bytes:
    return os.urandom(32)


def answer(key: bytes, challenge: bytes, side: bytes) -> bytes:
    """The HMAC of ``challenge`` with the key, by ``side`` (b"client" or b"owner": an answer is never valid for the
    other direction)."""
    return hmac.new(key, MAGIC + side + challenge, hashlib.sha256).digest()


def verify(key: bytes, challenge: bytes, side: bytes, given: bytes) -> bool:
    return hmac.compare_digest(answer(key, challenge, side), given)


def hello(pid: int, limit: int, load_seconds: float = 0.0) -> bytes:
    """What a side says of itself: the protocol's version, its process id, the largest frame it accepts, and (the
    owner) how long its factory took."""
    return MAGIC + _HELLO.pack(VERSION, pid, limit, load_seconds)


def parse_hello(payload: bytes) -> tuple[int, int, float]:
    """``(pid, limit, load_seconds)`` from a :func:`hello`; :class:`Violation` if it is not one of this version."""
    if not payload.startswith(MAGIC) or len(payload) != len(MAGIC) + _HELLO.size:
        raise Violation("not an async-batcher shared batcher at the other end")
    version, pid, limit, load_seconds = _HELLO.unpack_from(payload, len(MAGIC))
    if version != VERSION:
        raise Violation(f"the other end speaks version {version} of the protocol, this process {VERSION}")
    return pid, limit, load_seconds


DIGEST_SIZE: Final = _DIGEST
HELLO_SIZE: Final = len(MAGIC) + _HELLO.size
