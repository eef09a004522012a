"""The client's side: the calls of this process, sent to the owner, held for the next one, or handed to a batcher of
this process that took over (private; above :mod:`~async_batcher.shared._link`).

Each call (:class:`~async_batcher.shared._call.Call`) resolves exactly once. Its route:

- **held** while there is no owner to send it to (none yet, the owner leaving, or gone): sent when one comes, in
  order; failed with :class:`~async_batcher.OwnerUnavailableError` if none comes within ``owner_wait``;
- **sent**: answered by the owner, which marks it on the connection's gone board as it goes into a batch
  (:mod:`~async_batcher.shared._board`). If the connection drops without an answer, a call that had gone fails with
  :class:`~async_batcher.OutcomeUnknownError` (it may have been processed), and the others are held again, for the
  next owner;
- **local**: this process took over (:meth:`Client.adopt`): the call goes to its batcher.

A caller that leaves (cancelled) or times out withdraws its call wherever it is. A timeout is enforced here too, a
little after the owner's (:data:`GRACE`): the owner, which got the seconds left, answers first when it can.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, Final, cast

from async_batcher._core.deadlines import Deadlines
from async_batcher.exceptions import (
    MessageTooLargeError,
    NotPicklableError,
    OutcomeUnknownError,
    OwnerUnavailableError,
)
from async_batcher.shared import _board, _wire
from async_batcher.shared._call import END, HELD, ITEM, LOCAL, MANY, SENT, STREAM, Call
from async_batcher.shared._link import describe

if TYPE_CHECKING:
    from async_batcher.batcher import AsyncBatcher
    from async_batcher.shared._client_link import ClientLink

__all__: list[str] = []

#: How long after its deadline a call times out here, when the owner has not said so first.
GRACE: Final = 0.02


class Client:
    """The calls of this process to a shared batcher, and the connection to its owner (see the module's docstring)."""

    def __init__(self, name: str, address: str, owner_wait: float | None) -> None:
        self.name = name
        self.address = address
        self.loop = asyncio.get_running_loop()
        self.on_detached: Callable[[], None] = _nothing  # the connection dropped: the supervisor looks for an owner
        self.owner_wait = owner_wait
        self.idle: asyncio.Future[None] | None = None  # drained()'s
        self.calls: dict[int, Call] = {}  # unresolved
        self.held: dict[int, Call] = {}
        self.ids = itertools.count(1)
        self.slots: dict[int, int] = {}  # the gone board's slots of the unresolved calls: slot -> id
        self.crowded: set[int] = set()  # unresolved calls that shared a slot (_new_id): taken as gone
        self.deadlines = Deadlines(self.loop)
        self.link: ClientLink | None = None
        self.leaving = False  # the owner said it is leaving: hold what comes
        self.local: AsyncBatcher[Any, Any] | None = None
        self.give_up: asyncio.TimerHandle | None = None
        self.last_error: BaseException | None = None  # the last error met looking for an owner
        self.takeover_error: BaseException | None = None  # why this process could not take over, when it last tried
        self.last_load = 0.0  # how long the last owner's factory took

    # ------------------------------------------------------------------ calls in

    def submit(self, kind: int, item: Any, timeout: float | None, priority: float, extra: Any = None) -> Call:
        deadline = None if timeout is None else self.loop.time() + timeout
        call = Call(self._new_id(), kind, item, deadline, priority, extra, self.loop.create_future())
        self.calls[call.id] = call
        if deadline is not None:
            call.expiry = self.deadlines.add(deadline + GRACE, self._expire, call)
        self._route(call)
        return call

    def _new_id(self) -> int:
        """The next id whose slot on a gone board no unresolved call holds: a mark on the board is then its call's
        alone, however long a call stays unresolved (a stream, a backoff) while others come and go. With every slot
        held (more unresolved calls than slots), an id shares its slot: both calls are *crowded*, taken as gone if the
        connection drops before they resolve (an outcome unknown, never an item sent twice)."""
        ids, slots = self.ids, self.slots
        mask = _board.SLOTS - 1
        id = next(ids)
        if len(slots) < _board.SLOTS:
            while (id & mask) in slots:
                id = next(ids)
        else:
            self.crowded.update((slots[id & mask], id))
        slots[id & mask] = id
        return id

    def _route(self, call: Call) -> None:
        if self.local is not None:
            self._to_local(call)
            return
        link = self.link
        if link is None or self.leaving or link.closed:
            self._hold(call)
            return
        call.state = SENT
        kind = call.kind
        if kind == ITEM:
            if call.deadline is None and call.priority == 0 and call.trace is None:
                link.send(call.id, call.item)
            else:
                link.send((_wire.SUBMIT, call.id, self._left(call), call.priority, call.trace), call.item)
        elif kind == MANY:
            link.send((_wire.MANY, call.id, self._left(call), call.priority, call.extra), call.item)
        elif kind == STREAM:
            link.send((_wire.STREAM, call.id, self._left(call), call.priority, call.trace), call.item)
        else:
            link.send((_wire.ASK_STATS, call.id))

    def _left(self, call: Call) -> float | None:
        return None if call.deadline is None else max(0.0, call.deadline - self.loop.time())

    def _hold(self, call: Call) -> None:
        call.state = HELD
        call.since = self.loop.time()
        self.held[call.id] = call
        if self.give_up is None:
            self.give_up = self.loop.call_at(call.since + self.wait, self._give_up)

    @property
    def wait(self) -> float:
        """How long a call is held for an owner: ``owner_wait``, or 10 s beyond the last owner's factory's time."""
        return self.owner_wait if self.owner_wait is not None else 10.0 + self.last_load

    def _give_up(self) -> None:
        self.give_up = None
        now = self.loop.time()
        wait = self.wait
        for call in [c for c in self.held.values() if c.since + wait <= now]:
            cause, takeover = self.last_error, self.takeover_error
            error = OwnerUnavailableError(
                f"{self.name}: no owner at {self.address} took the item within owner_wait={wait:g}s"
                + (f" (last error: {_said(cause)})" if cause is not None else "")
                + (f"; this process could not take it over: {_said(takeover)}" if takeover is not None else "")
            )
            error.__cause__ = takeover if takeover is not None else cause
            self._fail(call, error)
        if self.held:
            self.give_up = self.loop.call_at(min(c.since for c in self.held.values()) + wait, self._give_up)

    # ------------------------------------------------------------------ leaving: cancelled, timed out

    def _pop(self, call: Call) -> bool:
        """Take ``call`` out of the unresolved (False if it was not there: resolved already)."""
        if self.calls.pop(call.id, None) is None:
            return False
        slot = call.id & (_board.SLOTS - 1)
        if self.slots.get(slot) == call.id:
            del self.slots[slot]
        if self.crowded:
            self.crowded.discard(call.id)
        if not self.calls and self.idle is not None and not self.idle.done():
            self.idle.set_result(None)
        return True

    async def drained(self) -> None:
        """Return once every call has resolved."""
        while self.calls:
            self.idle = self.loop.create_future()
            await self.idle

    def cancel(self, call: Call) -> None:
        """The caller left: withdraw the call wherever it is."""
        if not self._pop(call):
            return
        self._withdraw(call)
        if not call.fut.done():
            call.fut.cancel()

    def _withdraw(self, call: Call) -> None:
        if call.expiry is not None:
            self.deadlines.discard(call.expiry)
        state = call.state
        if state == HELD:
            self.held.pop(call.id, None)
        elif state == SENT:
            link = self.link
            if link is not None and not link.closed:
                link.send((_wire.CANCEL, call.id))
        elif call.local is not None:
            call.local.cancel()

    def _expire(self, call: Call) -> None:
        if not self._pop(call):
            return
        call.expiry = None
        self._withdraw(call)
        self._settle(call, TimeoutError(f"{self.name}: no result within the timeout"))

    # ------------------------------------------------------------------ outcomes

    def _resolve(self, call: Call, value: Any) -> None:
        if not self._pop(call):
            return
        if call.expiry is not None:
            self.deadlines.discard(call.expiry)
        if call.kind == STREAM:
            self._part(call, END)
        elif not call.fut.done():
            call.fut.set_result(value)

    def _fail(self, call: Call, error: BaseException) -> None:
        if not self._pop(call):
            return
        self.held.pop(call.id, None)
        if call.expiry is not None:
            self.deadlines.discard(call.expiry)
        self._settle(call, error)

    def _settle(self, call: Call, error: BaseException) -> None:
        if call.kind == STREAM:
            self._part(call, error)
        elif not call.fut.done():
            call.fut.set_exception(error)

    def _part(self, call: Call, part: Any) -> None:
        call.parts.append(part)
        waiter = call.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def next_part(self, call: Call) -> Any:
        """A stream's next part, :data:`END`, or its error raised."""
        while not call.parts:
            call.waiter = self.loop.create_future()
            await call.waiter
        part = call.parts.popleft()
        if isinstance(part, BaseException):
            raise part
        if part is not END and call.state == SENT and self.link is not None and not self.link.closed:
            self.link.send((_wire.ACK, call.id, 1))
        return part

    def received(self, control: list[Any], values: list[Any] | BaseException) -> None:
        """A frame from the owner."""
        failed = values if isinstance(values, BaseException) else None
        calls = self.calls
        i = 0
        for record in control:
            if record.__class__ is int:
                call = calls.get(record)
                if failed is not None:
                    if call is not None:
                        self._fail(call, self._unpicklable(failed))
                    continue
                value = values[i]  # type: ignore[index]
                i += 1
                if call is not None:
                    if value.__class__ is _wire.Broken:
                        self._fail(call, self._unpicklable(value.error))
                    else:
                        self._resolve(call, value)
                continue
            op, id = record[0], record[1] if len(record) > 1 else 0
            call = calls.get(id)
            if op in _wire.VALUED:
                value = failed if failed is not None else values[i]  # type: ignore[index]
                i += failed is None
                if call is None:
                    continue
                if failed is not None or value.__class__ is _wire.Broken:
                    error = failed if failed is not None else cast(_wire.Broken, value).error
                    self._withdraw(call)  # (a stream's: the owner's side of it ends too, never waits for its reader)
                    self._fail(call, self._unpicklable(error))
                elif op == _wire.ERROR:
                    if record[2] and record[2] not in getattr(value, "__notes__", ()):
                        value.add_note(record[2])  # (once: a frame may give the same exception to several calls)
                    self._fail(call, value)
                elif op == _wire.PART:
                    call.gone = True
                    self._part(call, value)
                else:  # STATS
                    self._resolve(call, value)
            elif op == _wire.END:
                if call is not None:
                    self._resolve(call, None)
            elif op == _wire.BOUNCE:
                if call is not None and call.state == SENT:
                    self._hold(call)
            elif op == _wire.LEAVING:
                self.leaving = True
        if self.leaving:
            self._let_go()

    def _let_go(self) -> None:
        """The owner is leaving: once it has answered every call sent to it, close this end (the owner closes its
        own too; this one does not wait for it) and look for the next owner."""
        link = self.link
        if link is not None and not link.closed and not any(c.state == SENT for c in self.calls.values()):
            link.close()

    def _unpicklable(self, error: BaseException) -> NotPicklableError:
        return NotPicklableError(f"{self.name}: an answer of the owner does not unpickle in this process: {error}")

    def refused(self, record: Any, value: Any, error: BaseException) -> None:
        """An item that does not pickle (or is too large) fails its caller, before anything is sent."""
        id = record if record.__class__ is int else record[1]
        call = self.calls.get(id)
        if call is None:
            return
        what = "the item" if call.kind != MANY else "the items"
        if isinstance(error, _wire.TooLarge):
            self._fail(call, MessageTooLargeError(describe(value, error, what), size=error.size, limit=error.limit))
        else:
            self._fail(call, NotPicklableError(describe(value, error, what)))

    # ------------------------------------------------------------------ the owner: attached, lost, taken over

    def attach(self, link: ClientLink) -> None:
        """Connected to an owner: send it what is held, in order."""
        self.link = link
        self.leaving = False
        self.last_error = self.takeover_error = None
        self.last_load = link.peer_load
        self._release_held()

    def _release_held(self) -> None:
        held = sorted(self.held.values(), key=_by_id)
        self.held.clear()
        if self.give_up is not None:
            self.give_up.cancel()
            self.give_up = None
        for call in held:
            self._route(call)

    def detached(self, link: ClientLink, exc: BaseException | None) -> None:
        """The connection to the owner is closed: what had gone has an unknown outcome; the rest is held."""
        if link is not self.link:
            return
        self.link = None
        graceful = self.leaving
        self.leaving = False
        cause = ConnectionError(
            f"the owner of {self.address} (pid {link.peer_pid}) "
            + ("left" if graceful else "closed the connection without leaving (it died?)")
        )
        if exc is not None:
            cause.__cause__ = exc
        self.last_error = cause
        self.on_detached()
        sent = sorted((c for c in self.calls.values() if c.state == SENT), key=_by_id)
        gone = link.board.gone([c.id for c in sent]) if link.board is not None else set()
        link.close_board()
        for call in sent:
            if call.gone or call.id in gone or call.id in self.crowded:
                error = OutcomeUnknownError(
                    f"{self.name}: the owner (pid {link.peer_pid}) stopped while the item was in a batch: it may "
                    "have been processed"
                )
                error.__cause__ = cause
                self._fail(call, error)
            else:
                self._hold(call)

    def adopt(self, batcher: AsyncBatcher[Any, Any]) -> None:
        """This process took over: what is held goes to its batcher, and so does every call from now on."""
        self.local = batcher
        self._release_held()

    def _to_local(self, call: Call) -> None:
        batcher = self.local
        assert batcher is not None
        call.state = LOCAL
        left = self._left(call)
        if call.kind == ITEM:
            fut = batcher._submit(call.item, left, call.priority)
        elif call.kind == MANY:
            fut = asyncio.ensure_future(
                batcher.process_many(call.item, timeout=left, priority=call.priority, return_exceptions=call.extra)
            )
        elif call.kind == STREAM:
            fut = asyncio.ensure_future(self._local_stream(batcher, call, left))
        else:
            fut = self.loop.create_future()
            fut.set_result(batcher.stats)
        call.local = fut
        fut.add_done_callback(partial(self._local_done, call))

    async def _local_stream(self, batcher: AsyncBatcher[Any, Any], call: Call, left: float | None) -> None:
        async for part in batcher.stream(call.item, timeout=left, priority=call.priority):
            self._part(call, part)

    def _local_done(self, call: Call, fut: asyncio.Future[Any]) -> None:
        if fut.cancelled():
            return  # (the caller left, or timed out: settled already)
        exc = fut.exception()
        if exc is not None:
            self._fail(call, exc)
        else:
            self._resolve(call, fut.result())

    def fail_all(self, error: BaseException) -> None:
        """Fail every call left (a forced or timed-out stop), withdrawing each."""
        for call in list(self.calls.values()):
            self._withdraw(call)
            self._fail(call, error)

    def fail_held(self, error: BaseException) -> None:
        """Fail the calls held for an owner (none will take them: the key is refused)."""
        for call in list(self.held.values()):
            self._fail(call, error)


def _said(error: BaseException) -> str:
    """An error as a message says it (its type too, when its text alone would say nothing)."""
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _by_id(call: Call) -> int:
    return call.id


def _nothing() -> None:
    pass
