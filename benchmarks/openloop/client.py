"""A compact HTTP/1.1 load client on asyncio protocols: keep-alive connections, one request at a time on each.

Two drivers share it:

- :func:`open_loop`: requests go out on a schedule fixed beforehand (:mod:`benchmarks.openloop.schedule`), whether
  or not earlier ones were answered. A thread of its own keeps the time (``time.sleep`` has microsecond resolution,
  an event loop's timers a millisecond's) and hands each due request to the loop. The request takes an idle
  connection; when none is idle a new one is opened, up to ``max_connections``; beyond that it waits in the client,
  in arrival order. Its latency runs from its **intended** send time to its answer, so neither a busy connection
  nor a late client hides a slow server (no coordinated omission). A request not answered ``timeout`` seconds after
  its intended time is a timeout; its connection stays open (its late answer is read and dropped) as a user's
  browser would leave it. A connection idle for 4 s is closed, before the server's keep-alive limit closes it.
- :func:`closed_loop`: ``connections`` clients, each sending its next request when the last is answered (after
  ``think`` seconds): the shape of wrk, of a batch job, of a fixed client population.

Every scheduled request ends exactly once: answered (2xx), an error (another status, or its connection failed) or a
timeout. Responses are framed by ``Content-Length`` (what uvicorn sends for a JSON answer).
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["CONN_ERROR", "HTTP_ERROR", "OK", "TIMEOUT", "ClosedResult", "OpenResult", "closed_loop", "open_loop"]

OK, HTTP_ERROR, CONN_ERROR, TIMEOUT = 1, 2, 3, 4
IDLE_CLOSE = 4.0  # seconds an idle connection is kept
_perf = time.perf_counter


class _Conn(asyncio.Protocol):
    """One keep-alive connection; ``on_answer(conn, status)`` when a whole answer is in."""

    __slots__ = ("_buf", "_lost", "_on_answer", "idle_since", "req", "transport")

    def __init__(self, on_answer: Callable[[_Conn, int], None], lost: Callable[[_Conn], None]) -> None:
        self._on_answer = on_answer
        self._lost = lost
        self._buf = b""
        self.req = -1  # the request in flight on it, -1 when none
        self.idle_since = 0.0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport subclass

    def data_received(self, data: bytes) -> None:
        buf = self._buf + data if self._buf else data
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                break
            head = buf[:end].lower()
            at = head.find(b"\r\ncontent-length:")
            if not head.startswith(b"http/1.") or at < 0:
                self._buf = b""
                if self.transport is not None:
                    self.transport.abort()  # connection_lost reports the request as an error
                return
            stop = head.find(b"\r\n", at + 2)
            length = int(head[at + 17 : stop if stop >= 0 else len(head)])
            total = end + 4 + length
            if len(buf) < total:
                break
            status = int(buf[9:12])
            buf = buf[total:]
            self._on_answer(self, status)
        self._buf = buf

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._lost(self)


def _request(host: str, port: int, path: str, body: bytes) -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("ascii") + body


@dataclass
class OpenResult:
    """Per scheduled request (by index): its intended, dispatched (handed to a connection or queued), sent and
    answered times (``perf_counter`` seconds; 0 where it never happened) and its outcome."""

    intended: list[float]
    dispatched: list[float]
    sent: list[float]
    done: list[float]
    outcome: bytearray
    connections: int = 0  # opened in all
    connect_errors: int = 0
    max_waiting: int = 0  # the most requests that waited in the client for a connection at once
    waited: int = 0  # requests that found no idle connection


class _OpenPool:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        host: str,
        port: int,
        request: bytes,
        intended: list[float],
        max_connections: int,
        timeout: float,
    ) -> None:
        n = len(intended)
        self.loop, self.host, self.port, self.request = loop, host, port, request
        self.max_connections, self.timeout = max_connections, timeout
        self.r = OpenResult(intended, [0.0] * n, [0.0] * n, [0.0] * n, bytearray(n))
        self.idle: list[_Conn] = []  # LIFO: the warmest connection first
        self.busy: set[_Conn] = set()
        self.opening = 0
        self.waiting: collections.deque[int] = collections.deque()
        self.remaining = n
        self.finished = loop.create_future()
        if n == 0:
            self.finished.set_result(None)

    # -- called on the loop ------------------------------------------------------------------------------------
    def dispatch(self, start: int, end: int) -> None:
        """Requests ``start`` to ``end - 1`` are due (the clock thread's call)."""
        now = _perf()
        r = self.r
        for i in range(start, end):
            r.dispatched[i] = now
            if self.idle and not self.waiting:
                self._send(self.idle.pop(), i)
            else:
                self.waiting.append(i)
                r.waited += 1
        if self.waiting:
            r.max_waiting = max(r.max_waiting, len(self.waiting))
            self._grow()

    def _grow(self) -> None:
        room = self.max_connections - len(self.busy) - len(self.idle) - self.opening
        for _ in range(min(len(self.waiting) - self.opening, room)):
            self.opening += 1
            self.loop.create_task(self._open())

    async def _open(self) -> None:
        try:
            _, conn = await self.loop.create_connection(lambda: _Conn(self._answered, self._lost), self.host, self.port)
        except OSError:
            self.opening -= 1
            self.r.connect_errors += 1
            while self.waiting:  # the oldest waiting request gets the failure: a dead server shows as errors
                i = self.waiting.popleft()
                if not self.r.outcome[i]:
                    self._finish(i, CONN_ERROR, _perf())
                    break
            if self.waiting and not (self.busy or self.idle or self.opening):
                self.loop.call_later(0.01, self._grow)
            return
        self.opening -= 1
        self.r.connections += 1
        self._free(conn)

    def _free(self, conn: _Conn) -> None:
        while self.waiting:
            i = self.waiting.popleft()
            if not self.r.outcome[i]:  # not timed out while it waited
                self._send(conn, i)
                return
        conn.idle_since = _perf()
        self.idle.append(conn)

    def _send(self, conn: _Conn, i: int) -> None:
        conn.req = i
        self.busy.add(conn)
        self.r.sent[i] = _perf()
        conn.transport.write(self.request)  # type: ignore[union-attr]  # only open connections are idle

    def _finish(self, i: int, outcome: int, now: float) -> None:
        self.r.outcome[i] = outcome
        self.r.done[i] = now
        self.remaining -= 1
        if self.remaining == 0 and not self.finished.done():
            self.finished.set_result(None)

    def _answered(self, conn: _Conn, status: int) -> None:
        now = _perf()
        i, conn.req = conn.req, -1
        self.busy.discard(conn)
        if i >= 0 and not self.r.outcome[i]:
            self._finish(i, OK if 200 <= status < 300 else HTTP_ERROR, now)
        self._free(conn)

    def _lost(self, conn: _Conn) -> None:
        self.busy.discard(conn)
        if conn in self.idle:
            self.idle.remove(conn)
        if conn.req >= 0 and not self.r.outcome[conn.req]:
            self._finish(conn.req, CONN_ERROR, _perf())
        conn.req = -1
        if self.waiting:
            self._grow()

    def sweep(self) -> None:
        """Time out what has waited ``timeout`` past its intended time, in flight or in the client."""
        now = _perf()
        deadline = now - self.timeout
        intended, outcome = self.r.intended, self.r.outcome
        for conn in self.busy:
            i = conn.req
            if i >= 0 and not outcome[i] and intended[i] < deadline:
                self._finish(i, TIMEOUT, now)
        while self.waiting and intended[self.waiting[0]] < deadline:
            i = self.waiting.popleft()
            if not outcome[i]:
                self._finish(i, TIMEOUT, now)
        # Close what has idled nearly as long as uvicorn keeps an idle connection (5 s): a request sent on one the
        # server is closing at that moment would fail for the client's reason, not the server's.
        while self.idle and self.idle[0].idle_since < now - IDLE_CLOSE:
            conn = self.idle.pop(0)  # the oldest: the list is a stack
            if conn.transport is not None:
                conn.transport.close()

    def close(self) -> None:
        for conn in [*self.idle, *self.busy]:
            if conn.transport is not None:
                conn.transport.close()


def _clock(loop: asyncio.AbstractEventLoop, pool: _OpenPool, intended: list[float], stop: threading.Event) -> None:
    """The clock thread: sleep until the next request is due, hand every due one to the loop in one call."""
    i, n = 0, len(intended)
    while i < n and not stop.is_set():
        delay = intended[i] - _perf()
        if delay > 0:
            time.sleep(delay)
        j = bisect.bisect_right(intended, _perf(), i)
        try:
            loop.call_soon_threadsafe(pool.dispatch, i, j)
        except RuntimeError:  # the loop is closed: the step was abandoned
            return
        i = j


async def open_loop(
    *,
    host: str,
    port: int,
    path: str,
    body: bytes,
    offsets: list[float],
    start: float,
    max_connections: int,
    timeout: float,
    sweep_every: float = 0.05,
) -> OpenResult:
    """Send one request at each ``start + offset`` (``perf_counter`` seconds); return when every one has ended."""
    if max_connections < 1:
        raise ValueError(f"max_connections must be >= 1, got {max_connections}")
    loop = asyncio.get_running_loop()
    intended = [start + o for o in offsets]
    pool = _OpenPool(loop, host, port, _request(host, port, path, body), intended, max_connections, timeout)
    stop = threading.Event()
    clock = threading.Thread(target=_clock, args=(loop, pool, intended, stop), name="open-loop-clock", daemon=True)
    clock.start()
    try:
        while not pool.finished.done():
            await asyncio.wait([pool.finished], timeout=sweep_every)
            pool.sweep()
    finally:
        stop.set()
        pool.close()
        await asyncio.to_thread(clock.join)
    return pool.r


@dataclass
class ClosedResult:
    """Per answered (or failed) request: when it was sent and when it ended (``perf_counter``) and its outcome."""

    sent: list[float] = field(default_factory=list)
    done: list[float] = field(default_factory=list)
    outcome: bytearray = field(default_factory=bytearray)
    connect_errors: int = 0


async def closed_loop(
    *,
    host: str,
    port: int,
    path: str,
    body: bytes,
    connections: int,
    until: float,
    think: float = 0.0,
    timeout: float = 2.0,
) -> ClosedResult:
    """``connections`` clients, each sending a request, waiting for its answer (and ``think`` seconds), and again,
    until ``until`` (``perf_counter`` seconds). A request not answered in ``timeout`` is a timeout and its client
    reconnects."""
    if connections < 1:
        raise ValueError(f"connections must be >= 1, got {connections}")
    loop = asyncio.get_running_loop()
    request = _request(host, port, path, body)
    result = ClosedResult()

    async def client() -> None:
        waiter: list[asyncio.Future[int]] = []  # the answer awaited now, if any

        def on_answer(conn: _Conn, status: int) -> None:
            if waiter and not waiter[0].done():
                waiter[0].set_result(status)

        def on_lost(conn: _Conn) -> None:
            if waiter and not waiter[0].done():
                waiter[0].set_exception(ConnectionResetError())

        while _perf() < until:
            try:
                transport, conn = await loop.create_connection(lambda: _Conn(on_answer, on_lost), host, port)
            except OSError:
                result.connect_errors += 1
                await asyncio.sleep(0.01)
                continue
            try:
                while _perf() < until and conn.transport is not None:
                    waiter[:] = [loop.create_future()]
                    sent = _perf()
                    conn.transport.write(request)
                    try:
                        status = await asyncio.wait_for(waiter[0], timeout)
                        outcome = OK if 200 <= status < 300 else HTTP_ERROR
                    except TimeoutError:
                        outcome = TIMEOUT
                    except ConnectionResetError:
                        outcome = CONN_ERROR
                    result.sent.append(sent)
                    result.done.append(_perf())
                    result.outcome.append(outcome)
                    if outcome in (TIMEOUT, CONN_ERROR):
                        break  # a fresh connection: the late answer must not be taken for the next one's
                    if think > 0:
                        await asyncio.sleep(think)
            finally:
                waiter.clear()
                transport.close()

    await asyncio.gather(*(client() for _ in range(connections)))
    return result
