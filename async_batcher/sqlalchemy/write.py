"""Batch SQL writes through SQLAlchemy 2's asyncio API: one statement and one transaction per batch.

``await batcher.process({"id": 1, "name": "a"})`` inserts (or updates, or upserts) that row and returns None, or
with ``returning`` the caller's own row of the ``RETURNING`` columns (a ``Row``: it compares equal to a tuple).
A caller is told "written" only after its row's transaction committed. Otherwise it gets:

* the driver's error (``IntegrityError``, ``DataError``, a trigger's ``RAISE EXCEPTION``, sqlite3's
  ``OverflowError``, ...) when this row is at fault (see :func:`~async_batcher.sqlalchemy._faults.is_row_fault`):
  the batch was split in halves, each written in its own transaction, down to the rows at fault (bisection:
  about ``2 * log2(n)`` more statements per bad row); every other row of the batch is written; nothing of this one;
* :class:`RowNotFoundError` for an update whose primary key names no row: nothing was written for it;
* ``ValueError`` / ``TypeError`` naming the bad key, before any SQL, for a row that is not a dict of the
  table's columns (an update without its primary key, say);
* the driver's error when the batch could not be written for a reason of its own (the connection was lost, the
  server refused the statement or the ``COMMIT``): nothing of that transaction was written, and no connection goes
  back to the pool with it open (SQLite keeps a transaction open after a refused ``COMMIT``: it is rolled back). A
  transaction the server aborted for a deadlock or a serialization failure is tried again first
  (``max_conflict_retries`` times);
* :class:`CommitUnknownError` (an :class:`~async_batcher.OutcomeUnknownError`) when the row may or may not have
  been written: the connection was lost while its ``COMMIT`` was under way, or a stop cut the batch off after one
  of its ``COMMIT`` s was sent. Read the row back to know;
* the stop's :class:`~async_batcher.BatcherStoppedError` when a stop cut the batch off before any ``COMMIT`` of
  it was sent: nothing of it was written.

The batcher keeps serving after any of these; the engine's pool replaces the connections a lost server broke.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from async_batcher.batcher import AsyncBatcher

try:
    from sqlalchemy import inspect
    from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker
except ImportError as error:  # pragma: no cover - exercised in a subprocess by tests/sqlalchemy/test_packaging.py
    raise ImportError(
        f"async_batcher.sqlalchemy needs SQLAlchemy 2 ({error.name} is missing): "
        "pip install 'async-batcher[sqlalchemy]'"
    ) from error

from async_batcher._checks import plural
from async_batcher.sqlalchemy._connections import _roll_back_before_close
from async_batcher.sqlalchemy._errors import CommitUnknownError, RowNotFoundError
from async_batcher.sqlalchemy._faults import is_row_fault, sqlstate
from async_batcher.sqlalchemy._rows import _PENDING, RowChecks, _rounds
from async_batcher.sqlalchemy._statements import OnConflict, Operation, Statements
from async_batcher.sqlalchemy._transactions import Transactions, _Failed, _Progress

__all__ = ["AsyncSqlalchemyWriteBatcher", "CommitUnknownError", "RowNotFoundError", "is_row_fault"]

logger = logging.getLogger("async_batcher.sqlalchemy")


class AsyncSqlalchemyWriteBatcher(RowChecks, Transactions, AsyncBatcher[Mapping[str, Any], Any]):
    """Writes the rows of concurrent callers to ``model``'s table in one statement per batch (see the module).

    The path and the first four arguments are async-batcher 0.2.2's.

    Args:
        model: A declarative ORM class (or a ``Table``); a row is a dict of its column keys to values.
        async_engine: The ``AsyncEngine`` to write through (``create_async_engine(...)``).
        operation: ``"insert"`` rows, or ``"update"`` the row with each row's primary key (a row gives its
            primary key and the columns to set; a key that names no row gets :class:`RowNotFoundError`).
        returning: A column (``Model.id``) or a list of them: each caller of an insert gets its own row of
            them back, matched by position.
        on_conflict: For an insert on PostgreSQL or SQLite: ``"nothing"`` leaves an existing row as it is
            (``ON CONFLICT DO NOTHING``), ``"update"`` sets the row's other given columns
            (``ON CONFLICT DO UPDATE``): an upsert. ``returning`` does not go with ``"nothing"`` (a skipped
            row returns nothing to match).
        conflict_columns: The unique columns of the conflict (default: the primary key).
        max_batch_size: The most rows per batch, so per transaction (default 1000).
        max_conflict_retries: How many times a transaction the server aborted for a deadlock (SQLSTATE
            ``40P01``) or a serialization failure (``40001``) is tried again before its rows fail with that
            error (default 3; 0: never). Counted in :attr:`conflict_retries`, and logged.
        **kwargs: The :class:`~async_batcher.AsyncBatcher` settings (``max_queue_time``, ``concurrency``: give
            the engine's pool at least as many connections, ...).
    """

    def __init__(
        self,
        model: Any,
        async_engine: AsyncEngine,
        operation: Literal["insert", "update"] = "insert",
        returning: Any = None,
        *,
        on_conflict: Literal["nothing", "update"] | None = None,
        conflict_columns: Sequence[str] | None = None,
        max_batch_size: int = 1000,
        max_conflict_retries: int = 3,
        **kwargs: Any,
    ) -> None:
        super().__init__(max_batch_size=max_batch_size, **kwargs)
        if operation not in ("insert", "update"):
            raise ValueError(f"operation must be 'insert' or 'update', got {operation!r}")
        if not isinstance(async_engine, AsyncEngine):
            raise TypeError(f"async_engine must be an AsyncEngine, got {type(async_engine).__name__}")
        if isinstance(max_conflict_retries, bool) or not isinstance(max_conflict_retries, int):
            raise TypeError(f"max_conflict_retries must be an int, got {max_conflict_retries!r}")
        if max_conflict_retries < 0:
            raise ValueError(f"max_conflict_retries must be >= 0, got {max_conflict_retries}")
        self.model = model
        self.table = _table_of(model)
        self.async_engine = async_engine
        self.operation: Operation = operation
        self.returning = returning
        self.on_conflict: OnConflict | None = on_conflict
        self.max_conflict_retries = max_conflict_retries
        #: Transactions tried again after a deadlock or a serialization failure, since the batcher was made.
        self.conflict_retries = 0
        returned = _as_list(returning)
        self._check_options(returned, conflict_columns)
        keys = [column.key for column in self.table.primary_key.columns]
        self.conflict_columns = tuple(conflict_columns) if conflict_columns is not None else tuple(keys)
        self._statements = Statements(
            self.table,
            operation,
            returning=returned,
            on_conflict=on_conflict,
            conflict_columns=self.conflict_columns,
            dialect=async_engine.dialect.name,
        )
        self._progress: dict[int, _Progress] = {}  # by id() of the batch list
        _roll_back_before_close(async_engine)
        # 0.2.2's attribute, for reading back: ``async with batcher.async_session_maker() as session``.
        self.async_session_maker = async_sessionmaker(bind=async_engine, expire_on_commit=False)

    def _check_options(self, returned: list[Any], conflict_columns: Sequence[str] | None) -> None:
        if self.on_conflict not in (None, "nothing", "update"):
            raise ValueError(f"on_conflict must be None, 'nothing' or 'update', got {self.on_conflict!r}")
        if self.operation == "update" and (self.on_conflict is not None or returned):
            raise ValueError("operation='update' takes neither on_conflict nor returning (use an upsert)")
        if self.on_conflict == "nothing" and returned:
            raise ValueError("returning does not go with on_conflict='nothing': a skipped row returns nothing")
        if self.operation == "update" and not self.table.primary_key.columns:
            raise ValueError(f"operation='update' needs a primary key; table {self.table.name!r} has none")
        unknown = [name for name in conflict_columns or () if name not in self.table.c]
        if unknown:
            raise ValueError(f"conflict_columns {unknown} are not columns of table {self.table.name!r}")

    # ------------------------------------------------------------------ a batch

    async def process_batch(self, batch: list[Mapping[str, Any]]) -> list[Any]:
        progress = self._progress[id(batch)] = _Progress(batch)
        try:
            outcomes = await self._write_batch(batch, progress)
        except BaseException:
            task = asyncio.current_task()
            if task is None or not task.cancelling():
                self._progress.pop(id(batch), None)
            # else: cancelled from outside (the loop shutting down): abandoned_error reads the record, and drops it
            raise
        self._progress.pop(id(batch), None)
        return outcomes

    def abandoned_error(self, batch: list[Mapping[str, Any]], error: BaseException) -> BaseException:
        """A stop cut the batch off: :class:`CommitUnknownError` if a ``COMMIT`` of it was sent (under way, or
        answered: some of its rows are written), else the stop's error (nothing of it can have been committed:
        the transaction under way, if any, is rolled back and its connection closed)."""
        progress = self._progress.pop(id(batch), None)
        if progress is None or progress.batch is not batch or not (progress.committing or progress.committed):
            return error
        when = "during its COMMIT" if progress.committing else "after some of its rows were committed"
        return CommitUnknownError(
            f"{self.name}: the batch was cut off by a stop {when}: this row may or may not have been written"
        )

    async def _write_batch(self, batch: list[Mapping[str, Any]], progress: _Progress) -> list[Any]:
        outcomes: list[Any] = [None] * len(batch)
        pending = self._prepare(batch, outcomes)
        try:
            for round_ in _rounds(pending):
                await self._write(round_, outcomes, progress)
        except _Failed as failed:
            logger.warning(
                "%s: batch of %s failed: %s%s",
                self.name,
                plural(len(batch), "row"),
                type(failed.error).__name__,
                _state_of(failed.error),
            )
            for row in failed.unknown:
                unknown = CommitUnknownError("the connection was lost during COMMIT: the row may have been written")
                unknown.__cause__ = failed.error
                outcomes[row.index] = unknown
            for row in pending:
                if outcomes[row.index] is _PENDING:
                    outcomes[row.index] = failed.error
        return outcomes


def _state_of(error: BaseException) -> str:
    state = sqlstate(error)
    return f" (SQLSTATE {state})" if state else ""


def _as_list(returning: Any) -> list[Any]:
    if returning is None:
        return []
    if isinstance(returning, list | tuple):
        return list(returning)
    return [returning]


def _table_of(model: Any) -> Any:
    """The ``Table`` of a declarative class (or the ``Table`` itself)."""
    from sqlalchemy import Table

    if isinstance(model, Table):
        return model
    mapper = inspect(model, raiseerr=False)
    table = getattr(mapper, "local_table", None)
    if not isinstance(table, Table):
        raise TypeError(f"model must be a declarative ORM class or a Table, got {model!r:.200}")
    return table
