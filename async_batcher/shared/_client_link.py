"""The client's end of its connection to the owner (private; under :mod:`~async_batcher.shared._client`): the
handshake's client half, the gone board it makes for the owner (:mod:`~async_batcher.shared._board`), and the frames
it hands to its :class:`~async_batcher.shared._client.Client`."""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING, Any

from async_batcher.shared import _wire
from async_batcher.shared._board import Board
from async_batcher.shared._link import DENY, Connection

if TYPE_CHECKING:
    from async_batcher.shared._client import Client

__all__: list[str] = []


def _retrieve(fut: asyncio.Future[None]) -> None:
    if not fut.cancelled():
        fut.exception()  # (the handshake's error is the connect's to raise; nobody else must report it)


class ClientLink(Connection):
    """The client's end of its connection to the owner."""

    side = "client"

    def __init__(self, key: bytes, limit: int, client: Client) -> None:
        super().__init__(key, limit)
        self.client = client
        self.board: Board | None = None  # made as the handshake begins (not for a connection that never gets there)
        self.done: asyncio.Future[None] = self.loop.create_future()  # the handshake's outcome
        self.done.add_done_callback(_retrieve)

    def handshake(self, payload: bytes) -> None:
        if self.step == 0:
            try:
                self._peer(payload[:-32])
            except _wire.Violation as exc:
                self._refuse(exc)
                return
            self.step = 1
            hello = _wire.hello(os.getpid(), self.limit)
            try:
                self.board = Board.create(self.client.address)
            except OSError as exc:  # (/dev/shm full, say)
                self._refuse(exc)
                return
            path = os.fsencode(self.board.path)
            self.write_raw(_wire.answer(self.key, payload[-32:], b"client") + hello + path + self.mine)
        elif payload == DENY:
            self._refuse(PermissionError("the owner refused this process's key"))
        elif not _wire.verify(self.key, self.mine, b"owner", payload):
            self._refuse(PermissionError("the process at the socket does not know the key"))
        else:
            self.established()
            if self.board is not None:
                self.board.unlink()  # (mapped by both now: the name is no longer needed)
            self.done.set_result(None)

    def violated(self, error: Exception) -> None:
        if not self.done.done():  # (in the handshake: the error is the connect's, which says it)
            self._refuse(error)
            return
        super().violated(error)

    def _refuse(self, error: Exception) -> None:
        if not self.done.done():
            self.done.set_exception(error)
        self.abort()

    def received(self, control: list[Any], values: list[Any] | BaseException) -> None:
        self.client.received(control, values)

    def refused(self, record: Any, value: Any, error: BaseException) -> None:
        self.client.refused(record, value, error)

    def lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(ConnectionError("the connection closed during the handshake"))
        self.client.detached(self, exc)
        self.close_board()

    def close_board(self) -> None:
        """The board is read (or was never needed): unmap it, and remove its name if the handshake did not."""
        board = self.board
        if board is None or board.map.closed:
            return
        board.unlink()
        board.close()
