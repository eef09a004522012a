"""A tiny HTTP/1.1 server for the load client's tests, in a thread of the test process with its own event loop: it
answers every request after ``delay`` seconds, holds every answer until ``stall_until`` (a ``perf_counter`` time;
the ``stall_after``-th request sets it ``stall_for`` seconds ahead) with ``status``, in two writes if ``split``,
and counts what it got."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

__all__ = ["TinyServer", "tiny_server"]

BODY = b"1.5"


@dataclass
class TinyServer:
    port: int = 0
    delay: float = 0.0
    stall_until: float = 0.0  # perf_counter: answers wait until then
    stall_after: int | None = None  # the request that starts a stall of stall_for seconds
    stall_for: float = 0.0
    stalled_at: float | None = None
    status: int = 200
    split: bool = False  # each answer in two writes, 1 ms apart, cut inside its head
    requests: int = 0
    connections: int = 0
    arrivals: list[float] = field(default_factory=list)  # perf_counter of each request's arrival

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class _Handler(asyncio.Protocol):
    def __init__(self, server: TinyServer) -> None:
        self.server = server
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.connections += 1

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            head = self.buf[:end].lower()
            length = 0
            if (at := head.find(b"content-length:")) >= 0:
                length = int(head[at + 15 :].split(b"\r\n", 1)[0])
            if len(self.buf) < end + 4 + length:
                return
            self.buf = self.buf[end + 4 + length :]
            now = time.perf_counter()
            self.server.requests += 1
            self.server.arrivals.append(now)
            if self.server.requests == self.server.stall_after:
                self.server.stalled_at = now
                self.server.stall_until = now + self.server.stall_for
            wait = max(self.server.delay, self.server.stall_until - now)
            loop = asyncio.get_running_loop()
            if wait > 0:
                loop.call_later(wait, self._answer)
            else:
                self._answer()

    def _answer(self) -> None:
        head = (
            f"HTTP/1.1 {self.server.status} X\r\ncontent-length: {len(BODY)}\r\ncontent-type: application/json\r\n\r\n"
        )
        answer = head.encode() + BODY
        if self.transport is None or self.transport.is_closing():
            return
        if self.server.split:
            self.transport.write(answer[:20])
            asyncio.get_running_loop().call_later(0.001, self._rest, answer[20:])
        else:
            self.transport.write(answer)

    def _rest(self, rest: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(rest)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


@contextmanager
def tiny_server(delay: float = 0.0) -> Iterator[TinyServer]:
    """Serve on 127.0.0.1 (a free port) until the block ends; the thread and its loop end with it."""
    state = TinyServer(delay=delay)
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    stopped: asyncio.Future[None] | None = None

    async def serve() -> None:
        nonlocal stopped
        stopped = loop.create_future()
        server = await loop.create_server(lambda: _Handler(state), "127.0.0.1", 0)
        state.port = server.sockets[0].getsockname()[1]
        ready.set()
        try:
            await stopped
        finally:
            server.close()
            await server.wait_closed()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), name="tiny-server", daemon=True)
    thread.start()
    if not ready.wait(10):
        raise RuntimeError("the tiny server did not start in 10 s")
    try:
        yield state
    finally:
        assert stopped is not None
        loop.call_soon_threadsafe(stopped.set_result, None)
        thread.join(10)
        loop.close()
