"""The owner's side: the Unix socket it serves, and its clients' connections (private; above
:mod:`~async_batcher.shared._owner_link`, one :class:`~async_batcher.shared._owner_link.OwnerLink` per client).

The hot path takes no task per item: each item is submitted with the batcher's ``_submit`` (the item's future), in a
copy of the context that carries its ticket (its connection and id) and its caller's trace context; its result goes
back from a done callback, gathered with the others of the loop turn into one frame per client (the frame is
scheduled as the batch ends, so that it goes in the very turn its callbacks run). As a batch goes (the batcher's
``_watch_sent``, before ``process_batch`` is called) the owner reads the tickets of its callers' contexts and marks
each item on its client's gone board (:mod:`~async_batcher.shared._board`): if the owner dies, those are the items
whose outcome is unknown, and the others are safe to send to the next owner. ``process_many`` and ``stream`` calls
take a task per call.

A client that leaves (its process ended, killed or not) has its items cancelled: withdrawn if they wait, their
results dropped. A client that does not read what it is sent is disconnected the same way, and never holds the
owner's loop up: when more than twice ``max_message_size`` is still unread as a new frame is due, or when it has read
nothing of a full buffer for :data:`~async_batcher.shared._owner_link.STALL` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import stat
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from async_batcher.shared import _wire
from async_batcher.shared._owner_link import _TICKET, OwnerLink

if TYPE_CHECKING:
    from contextvars import Context

    from async_batcher.batcher import AsyncBatcher

__all__: list[str] = []

logger = logging.getLogger("async_batcher.shared")

#: Connections accepted per wake-up of the socket, at most (the loop serves the rest of its work in between).
_ACCEPTS: Final = 64
#: Seconds without accepting after an error of accept() (EMFILE: out of descriptors), as asyncio's servers do.
_ACCEPT_PAUSE: Final = 1.0


class Owner:
    """The socket an owner serves its clients on, and their connections."""

    def __init__(
        self, batcher: AsyncBatcher[Any, Any], address: str, key: bytes, limit: int, load_seconds: float
    ) -> None:
        self.batcher = batcher
        self.address = address
        self.key = key
        self.limit = limit
        self.load_seconds = load_seconds
        self.links: set[OwnerLink] = set()
        self.leaving = False
        self.sock: socket.socket | None = None  # the listening socket, while it accepts
        self.paused: asyncio.TimerHandle | None = None
        self.accepting: set[asyncio.Task[Any]] = set()  # connections accepted, their transports being made
        self.inode: int | None = None
        self.unwatch: Any = None
        self.quiet: asyncio.Future[None] | None = None  # answered()'s: set when no call or connection is left

    def poke(self) -> None:
        """A call was answered, or a connection closed: wake :meth:`answered` or :meth:`closed` if it waits."""
        quiet = self.quiet
        if quiet is not None and not quiet.done():
            quiet.set_result(None)

    async def _until(self, condition: Callable[[], bool], timeout: float) -> bool:
        """Wait (at most ``timeout`` seconds) until ``condition()``; whether it came true."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while not condition():
                    self.quiet = asyncio.get_running_loop().create_future()
                    await self.quiet
                return True
        return False

    async def answered(self, timeout: float) -> None:
        """Wait (at most ``timeout`` seconds) until every call accepted has been answered."""
        await self._until(lambda: not any(link.pending or link.tasks for link in self.links), timeout)

    async def open(self) -> None:
        """Bind the socket (owner-only permissions; a file left there is stale: this process holds the lock) and
        watch the batcher's batches.

        The socket is this object's, not an asyncio server's: an asyncio server closed (as the owner leaves) between
        accepting a connection and making its transport drops that connection without closing it, and its client
        waits, connected to nobody, for the handshake's timeout. Here each connection accepted gets its transport,
        and is closed by it if the owner is leaving."""
        _remove_stale(self.address)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            umask = os.umask(0o077)
            try:
                sock.bind(self.address)
            finally:
                os.umask(umask)
            os.chmod(self.address, 0o600)
            self.inode = os.lstat(self.address).st_ino
            sock.listen(1024)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        asyncio.get_running_loop().add_reader(sock.fileno(), self._accept)
        self.unwatch = self.batcher._watch_sent(self.sent, self.ended)

    def _accept(self) -> None:
        """The socket has connections waiting: accept them (a few at a time), each made a connection of its own."""
        sock = self.sock
        if sock is None:
            return
        loop = asyncio.get_running_loop()
        for _ in range(_ACCEPTS):
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # (EMFILE, ENFILE, ENOBUFS: accept again in a while, as asyncio's servers do)
                logger.warning("%s: cannot accept a connection at %s: %r", self.batcher.name, self.address, exc)
                loop.remove_reader(sock.fileno())
                self.paused = loop.call_later(_ACCEPT_PAUSE, self._resume)
                return
            conn.setblocking(False)
            task = loop.create_task(self._connect(conn))
            self.accepting.add(task)
            task.add_done_callback(self.accepting.discard)

    def _resume(self) -> None:
        self.paused = None
        if self.sock is not None:
            asyncio.get_running_loop().add_reader(self.sock.fileno(), self._accept)

    async def _connect(self, conn: socket.socket) -> None:
        try:
            await asyncio.get_running_loop().connect_accepted_socket(lambda: OwnerLink(self), conn)
        except BaseException:
            conn.close()
            raise

    def _stop_accepting(self) -> None:
        """Close the socket: connections waiting to be accepted are refused (their clients see it at once)."""
        sock, self.sock = self.sock, None
        if self.paused is not None:
            self.paused.cancel()
            self.paused = None
        if sock is not None:
            asyncio.get_running_loop().remove_reader(sock.fileno())
            sock.close()

    def sent(self, contexts: list[Context]) -> None:
        """A batch goes: mark its clients' items on their boards, before ``process_batch`` is called."""
        for context in contexts:
            ticket = context.get(_TICKET)
            if ticket is not None:
                board = ticket[0].board
                if board is not None:
                    board.mark(ticket[1])

    def ended(self, contexts: list[Context]) -> None:
        """A batch ended: its outcomes go out in the next turn, in one frame per client, after their callbacks."""
        for context in contexts:
            ticket = context.get(_TICKET)
            if ticket is not None:
                ticket[0].flush_soon()

    def leave(self) -> None:
        """Stop taking items: tell every client, close the socket (new ones find none). What was accepted is still
        answered, until :meth:`close`."""
        if self.leaving:
            return
        self.leaving = True
        for link in list(self.links):
            if link.ready:
                link.send_now([(_wire.LEAVING,)])
            else:  # (in its handshake: it will find the next owner)
                link.abort()
        self._unlink()
        self._stop_accepting()

    def close(self) -> None:
        """Send what is gathered and close every connection."""
        self.leave()
        if self.unwatch is not None:
            self.unwatch()
            self.unwatch = None
        for link in list(self.links):
            link.close()

    async def closed(self, timeout: float) -> None:
        """Wait (at most ``timeout`` seconds) for the connections to be closed; abort those left."""
        await self._until(lambda: not self.links, timeout)
        for link in list(self.links):
            link.abort()

    def _unlink(self) -> None:
        with contextlib.suppress(OSError):
            if os.lstat(self.address).st_ino == self.inode:
                os.unlink(self.address)


def _remove_stale(address: str) -> None:
    try:
        info = os.lstat(address)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise FileExistsError(f"{address} exists and is not a socket: refusing to replace it (choose another address)")
    os.unlink(address)
