"""The batch's transactions: the rows of a round written in one, committed; split in halves, each in its own, down
to the rows at fault when a row is at fault (bisection); tried again after a conflict with another transaction; and
how far the batch got, for a stop."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from async_batcher._checks import plural
from async_batcher.sqlalchemy._connections import _discard, _end_refused, _invalidate, _to_completion
from async_batcher.sqlalchemy._execute import Execution, _Unmatched
from async_batcher.sqlalchemy._faults import is_conflict, is_row_fault, sqlstate
from async_batcher.sqlalchemy._rows import _Row

__all__ = ["Transactions", "_Failed", "_Progress"]

logger = logging.getLogger("async_batcher.sqlalchemy")

# The first retry after a conflict waits up to this long (jittered, doubling per retry): the other transaction
# usually needs no more to commit.
_BACKOFF = 0.01


@dataclass(eq=False)
class _Progress:
    """How far a batch got, for :meth:`AsyncSqlalchemyWriteBatcher.abandoned_error`."""

    batch: list[Any]  # (kept: while this record lives, no other list can take its id)
    committing: bool = False  # a COMMIT was sent and its answer has not come
    committed: bool = False  # a transaction of the batch committed, or may have (its COMMIT was cut off)


class _Failed(Exception):
    """The batch cannot go on: ``error`` for every row without an outcome (``unknown``: those whose commit was
    cut off get a :class:`CommitUnknownError`)."""

    def __init__(self, error: Exception, unknown: Sequence[_Row] = ()) -> None:
        super().__init__()
        self.error = error
        self.unknown = list(unknown)


class Transactions(Execution):
    """The batcher's transactions: a mixin of :class:`~async_batcher.sqlalchemy.AsyncSqlalchemyWriteBatcher`, which
    sets the attributes named here."""

    name: str
    async_engine: AsyncEngine
    max_conflict_retries: int
    conflict_retries: int

    async def _write(self, rows: list[_Row], outcomes: list[Any], progress: _Progress) -> None:
        """Write ``rows`` in one transaction; on a row's fault, each half in its own, down to the rows at fault."""
        try:
            results = await self._attempt(rows, progress)
        except _Failed:
            raise
        except Exception as error:
            if not is_row_fault(error):
                raise _Failed(error) from None
            if len(rows) == 1:
                outcomes[rows[0].index] = error
                return
            middle = len(rows) // 2
            await self._write(rows[:middle], outcomes, progress)
            await self._write(rows[middle:], outcomes, progress)
            return
        for row, result in zip(rows, results, strict=True):
            outcomes[row.index] = result

    async def _attempt(self, rows: list[_Row], progress: _Progress) -> list[Any]:
        """:meth:`_transaction`, tried again after a conflict (at most ``max_conflict_retries`` times), and row
        by row when an update's rows did not all match."""
        retries = 0
        row_by_row = False
        while True:
            try:
                return await self._transaction(rows, progress, row_by_row=row_by_row)
            except _Unmatched:
                row_by_row = True
            except DBAPIError as error:
                if not is_conflict(error) or retries >= self.max_conflict_retries:
                    raise
                retries += 1
                self.conflict_retries += 1
                state = sqlstate(error)
                logger.warning(
                    "%s: the server aborted a transaction of %s (%s, SQLSTATE %s); trying again (%d of %d)",
                    self.name,
                    plural(len(rows), "row"),
                    "deadlock" if state == "40P01" else "serialization failure",
                    state,
                    retries,
                    self.max_conflict_retries,
                )
                await asyncio.sleep(
                    random.uniform(0, _BACKOFF * 2 ** (retries - 1))
                )  # jitter: retries of several batches do not meet again

    async def _transaction(self, rows: list[_Row], progress: _Progress, *, row_by_row: bool) -> list[Any]:
        """Execute and commit ``rows``; returns each row's result (its returned row, None, or RowNotFoundError).

        A failed statement is rolled back. A ``COMMIT`` the server refused committed nothing, but SQLite keeps the
        transaction open (and the file locked) after it, and SQLAlchemy forgets it (its pool would not roll it
        back): the driver's connection is rolled back (or, failing that, closed). A connection whose ``COMMIT``
        was cut off is closed, never returned to the pool. Either way no later transaction can commit these rows.
        """
        async with self.async_engine.connect() as connection:
            try:
                transaction = await connection.begin()
                results = await self._execute(connection, rows, row_by_row=row_by_row)
            except BaseException as error:
                await _to_completion(_discard(connection, error))
                raise
            progress.committing = True
            try:
                await transaction.commit()
            except BaseException as error:
                answered = isinstance(error, DBAPIError) and not error.connection_invalidated
                if answered:
                    await _to_completion(_end_refused(connection))
                else:
                    progress.committed = True  # cut off: it may have committed
                    await _to_completion(_invalidate(connection))
                if answered or not isinstance(error, Exception):
                    raise  # refused: nothing was committed (or cancelled by a stop: abandoned_error answers)
                raise _Failed(error, unknown=rows) from None
            else:
                progress.committed = True
            finally:
                progress.committing = False
        return results
