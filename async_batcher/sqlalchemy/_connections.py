"""A batch's connection after a failure: rolled back, or closed and never given back to the pool, so that no later
transaction can commit the batch's rows; each clean-up run to its end even through a stop's cancellation."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

__all__ = ["_discard", "_end_refused", "_invalidate", "_roll_back_before_close", "_to_completion"]

logger = logging.getLogger("async_batcher.sqlalchemy")

_T = TypeVar("_T")


async def _to_completion(work: Awaitable[_T]) -> _T:
    """Await ``work`` to its end even if this task is cancelled meanwhile (a stop while it runs); then raise that
    cancellation. A connection half cleaned up must not go back to the pool; a SQLite ``SELECT`` cut off between
    its first row and the rest keeps a read lock on the file until its cursor is garbage-collected."""
    task = asyncio.ensure_future(work)
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError as error:
            cancelled = error
    result = task.result()
    if cancelled is not None:
        raise cancelled
    return result


async def _discard(connection: AsyncConnection, error: BaseException) -> None:
    """After a failed statement: roll back. After a cancellation (a stop) or a failed rollback, the connection's
    state is unknown (asyncpg may still be cancelling the statement; aiosqlite's thread may still run it): close
    it instead (the server, or SQLite, rolls its transaction back), never returning it to the pool."""
    if isinstance(error, Exception):
        try:
            await connection.rollback()
            return
        except Exception as rollback_error:  # the statement's error is the one that matters
            logger.debug("rollback after a failed statement failed too: %s", type(rollback_error).__name__)
    await _invalidate(connection)


async def _end_refused(connection: AsyncConnection) -> None:
    """After a refused ``COMMIT``: roll the driver's connection back (SQLite's transaction is still open), or close
    it if that fails. Not closed first: an in-memory SQLite database lives as long as its one connection."""
    try:
        await connection.run_sync(_roll_back_driver)
    except Exception as error:
        logger.debug("rollback after a refused COMMIT failed: %s", type(error).__name__)
        await _invalidate(connection)


def _roll_back_driver(sync_connection: Any) -> None:
    sync_connection.connection.dbapi_connection.rollback()


async def _invalidate(connection: AsyncConnection) -> None:
    """Close the connection's DB-API connection (its transaction, if any, dies with it); the pool opens another."""
    try:
        await connection.invalidate()
    except Exception as error:  # already broken: nothing left to roll back
        logger.debug("closing a connection after a failed transaction failed: %s", type(error).__name__)


def _roll_back_before_close(engine: AsyncEngine) -> None:
    """On SQLite, roll a connection back before the pool closes it as invalid (once per engine).

    SQLAlchemy closes the connection of a statement cut off by a cancellation (a stop); sqlite3 then keeps the
    connection's transaction, and the file's lock, for as long as a cursor of it lives (the cancelled statement's,
    held by its traceback until the garbage collector runs): every other writer would wait. A rollback first ends
    the transaction at once (after the statement, which aiosqlite's thread runs to its end)."""
    sync_engine = engine.sync_engine
    if sync_engine.dialect.name == "sqlite" and not event.contains(sync_engine, "invalidate", _roll_back):
        event.listen(sync_engine, "invalidate", _roll_back)


def _roll_back(dbapi_connection: Any, _record: Any, _exception: BaseException | None) -> None:
    from sqlalchemy.util.concurrency import in_greenlet

    if not in_greenlet():
        return  # (outside SQLAlchemy's async bridge, aiosqlite cannot be awaited: the close goes on alone)
    try:
        dbapi_connection.rollback()
    except Exception as error:  # closed already: the close goes on
        logger.debug("rollback before closing an invalidated connection failed: %s", type(error).__name__)
