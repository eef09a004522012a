"""This process's seat at a shared batcher's address: owner or client, the election, the hand-over (private; above
:mod:`~async_batcher.shared._owner` and :mod:`~async_batcher.shared._client`).

:meth:`Seat.take` (the start) takes the lock if it can (``role`` allowing): this process becomes the owner (the
factory is called here, the batcher started, the socket bound); else it is a client, and a supervisor task keeps it
connected to the owner: when the connection drops it races for the lock (``role="auto"``, unless this process is
stopping) and takes over if it wins (what it held goes to its own batcher), or connects again, with a bounded backoff,
to whoever won. :meth:`Seat.leave` (the stop) hands over: as owner, it tells its clients it is leaving, drains, then
gives the lock up and closes; as client, it waits for its calls to be answered, then closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from typing import TYPE_CHECKING, Any, Final

from async_batcher.batcher import AsyncBatcher
from async_batcher.exceptions import BatcherStoppedError, OwnerUnavailableError
from async_batcher.shared import _paths
from async_batcher.shared._client import Client
from async_batcher.shared._client_link import ClientLink
from async_batcher.shared._link import HANDSHAKE_TIMEOUT
from async_batcher.shared._owner import Owner

if TYPE_CHECKING:
    from collections.abc import Callable

    from async_batcher.shared._sharing import Sharing

__all__: list[str] = []

logger = logging.getLogger("async_batcher.shared")

_FIRST_BACKOFF: Final = 0.005
_MAX_BACKOFF: Final = 0.5
#: After its factory failed, a process does not try to own the batcher again for this long.
_FAILED_FACTORY_PAUSE: Final = 1.0


class _Denied(Exception):
    """The handshake refused a key (this process's, or the owner's): its ``__cause__`` says which."""


class Seat:
    """Owner or client at one address, for one run of a :class:`~async_batcher.shared.SharedBatcher`."""

    def __init__(
        self,
        factory: Callable[[], Any],
        sharing: Sharing,
        name: str,
        address: str,
        on_local: Callable[[AsyncBatcher[Any, Any] | None], None],
    ) -> None:
        self.factory = factory
        self.on_local = on_local  # told the batcher as this process starts owning it, None once it stopped owning
        self.sharing = sharing
        self.name = name
        self.address = address
        self.election = _paths.Election(address)
        self.loop = asyncio.get_running_loop()
        self.local: AsyncBatcher[Any, Any] | None = None  # the batcher, while this process owns it
        self.owner: Owner | None = None
        self.wake = asyncio.Event()
        self.client = Client(name, address, sharing.owner_wait)
        self.client.on_detached = self.wake.set
        self.supervisor: asyncio.Task[None] | None = None
        self.stopping = False
        self.denied = 0
        self.no_own_until = 0.0

    # ------------------------------------------------------------------ taking the seat

    async def take(self) -> None:
        """Own the batcher if this process may and nobody does; else be a client (connecting in the background)."""
        if self.sharing.role != "client" and self.election.try_acquire():
            await self._own()
        elif self.sharing.role == "owner":
            holder = self.election.holder()
            raise RuntimeError(
                f"{self.name}: role='owner', but process {holder if holder else '(unknown)'} owns {self.address}"
            )
        else:
            logger.debug("%s: a client of %s", self.name, self.address)
        if self.local is None:
            self.supervisor = self.loop.create_task(self._supervise())

    async def _own(self) -> None:
        """The lock is this process's: make the batcher, start it, serve it (or give the lock up and raise)."""
        try:
            started = self.loop.time()
            batcher = await self._make()
            load = self.loop.time() - started
            await batcher.__aenter__()
            try:
                key = self.sharing.authkey or _paths.write_key(self.address)
                owner = Owner(batcher, self.address, key, self.sharing.max_message_size, load)
                await owner.open()
            except BaseException:
                await batcher.stop()
                raise
        except BaseException:
            self.election.release()
            raise
        self.local, self.owner = batcher, owner
        self.on_local(batcher)  # (before its first batch: what watches it misses none)
        self.client.adopt(batcher)
        logger.info("%s: owner at %s (its factory took %.3fs)", self.name, self.address, load)

    async def _make(self) -> AsyncBatcher[Any, Any]:
        factory = self.factory
        if inspect.iscoroutinefunction(factory):
            made = await factory()
        else:  # (a model takes seconds to load: off the event loop)
            made = await self.loop.run_in_executor(None, factory)
            if inspect.isawaitable(made):
                made = await made
        if not isinstance(made, AsyncBatcher):
            raise TypeError(f"{self.name}: the factory {factory!r} returned {made!r}, not an AsyncBatcher")
        return made

    # ------------------------------------------------------------------ the client's supervisor

    async def _supervise(self) -> None:
        """Keep this client connected to an owner; take over (``role="auto"``) when there is none."""
        backoff = _FIRST_BACKOFF
        client = self.client
        while self.local is None:
            link = client.link
            if link is not None and not link.closed:
                self.wake.clear()
                await self.wake.wait()  # (the connection dropped)
                continue
            if self._may_own() and self._acquire():
                try:
                    await self._own()
                except Exception as exc:
                    logger.error("%s: taking over %s failed: %r", self.name, self.address, exc)
                    client.takeover_error = exc  # (what the items held say, not the socket missing meanwhile)
                    self.no_own_until = self.loop.time() + _FAILED_FACTORY_PAUSE
                    continue
                return
            try:
                key = self.sharing.authkey or _paths.read_key(self.address)
                await self._connect(key)
            except _Denied as exc:  # the key was refused (or the owner's was)
                client.last_error = exc.__cause__
                self.denied += 1
                if self.denied >= 2:  # (not a key the owner was rewriting: it will not do)
                    client.fail_held(OwnerUnavailableError(f"{self.name}: {exc.__cause__} (address {self.address})"))
            except Exception as exc:  # no socket yet, refused; no key file yet, or one of an earlier run that is not
                client.last_error = exc  # this user's alone, or half written; not an owner's socket
                logger.debug("%s: no owner at %s yet: %r", self.name, self.address, exc)
            else:
                backoff = _FIRST_BACKOFF
                self.denied = 0
                continue
            await asyncio.sleep(backoff)
            backoff = min(2 * backoff, _MAX_BACKOFF)

    def _acquire(self) -> bool:
        """Take the lock if nobody holds it; False, and the error kept, if its file cannot be opened (EMFILE, or
        refused): the search goes on (an error here must not end it, leaving the items held for nobody)."""
        try:
            return self.election.try_acquire()
        except OSError as exc:
            if repr(exc) != repr(self.client.takeover_error):  # (once, not at every try)
                logger.warning("%s: cannot take the lock of %s: %r", self.name, self.address, exc)
            self.client.takeover_error = exc
            return False

    def _may_own(self) -> bool:
        return self.sharing.role == "auto" and not self.stopping and self.loop.time() >= self.no_own_until

    async def _connect(self, key: bytes) -> None:
        limit = self.sharing.max_message_size
        _, link = await self.loop.create_unix_connection(lambda: ClientLink(key, limit, self.client), self.address)
        try:
            async with asyncio.timeout(HANDSHAKE_TIMEOUT):
                await link.done
        except BaseException as exc:
            link.abort()
            link.close_board()  # (now: the loop may end before the connection's loss is told)
            if isinstance(exc, PermissionError):  # (the handshake's: a key refused)
                raise _Denied() from exc
            raise
        logger.debug("%s: connected to the owner of %s (pid %d)", self.name, self.address, link.peer_pid)
        self.client.attach(link)

    # ------------------------------------------------------------------ leaving

    async def leave(self, force: bool, timeout: float | None) -> None:
        """Stop: hand over as owner (drain, then give the lock up), or wait for this client's calls."""
        self.stopping = True
        deadline = None if timeout is None else self.loop.time() + timeout
        try:
            if self.local is None:
                await self._leave_as_client(force, timeout)
                await self._end_supervisor()  # (a take-over under way is abandoned; one done made this the owner)
            if self.local is not None:
                left = None if deadline is None else max(0.0, deadline - self.loop.time())
                await self._leave_as_owner(self.local, force, left)
        finally:
            await self._end_supervisor()
            link = self.client.link
            if link is not None:
                link.close()

    async def _end_supervisor(self) -> None:
        if self.supervisor is not None:
            self.supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.supervisor

    async def _leave_as_owner(self, batcher: AsyncBatcher[Any, Any], force: bool, timeout: float | None) -> None:
        owner = self.owner
        assert owner is not None
        owner.leave()  # clients hold what comes from now on; new connections find no socket
        try:
            await batcher.stop(force=force, timeout=timeout)
        finally:
            self.on_local(None)  # (its counts are final)
            await owner.answered(1.0)  # (the done callbacks of the last outcomes: a few turns)
            self.election.release()  # (first: a client that sees the connection close finds the lock free)
            owner.close()
            await owner.closed(1.0)
            logger.info("%s: left %s", self.name, self.address)

    async def _leave_as_client(self, force: bool, timeout: float | None) -> None:
        client = self.client
        if not force:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await client.drained()
        if client.calls:
            what = "a forced stop" if force else "an expired stop(timeout=...)"
            client.fail_all(BatcherStoppedError(f"{self.name}: the call was abandoned by {what}"))
