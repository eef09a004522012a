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
import random
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from async_batcher.batcher import AsyncBatcher
from async_batcher.exceptions import AsyncBatchException, OutcomeUnknownError

try:
    from sqlalchemy import event, inspect
    from sqlalchemy.exc import DBAPIError
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, async_sessionmaker
except ImportError as error:  # pragma: no cover - exercised in a subprocess by tests/sqlalchemy/test_packaging.py
    raise ImportError(
        f"async_batcher.sqlalchemy needs SQLAlchemy 2 ({error.name} is missing): "
        "pip install 'async-batcher[sqlalchemy]'"
    ) from error

from async_batcher.sqlalchemy._faults import is_conflict, is_row_fault, sqlstate
from async_batcher.sqlalchemy._statements import MAX_PARAMETERS, OnConflict, Operation, Statements, in_key_order

__all__ = ["AsyncSqlalchemyWriteBatcher", "CommitUnknownError", "RowNotFoundError", "is_row_fault"]

logger = logging.getLogger("async_batcher.sqlalchemy")

_T = TypeVar("_T")

# The first retry after a conflict waits up to this long (jittered, doubling per retry): the other transaction
# usually needs no more to commit.
_BACKOFF = 0.01


class CommitUnknownError(OutcomeUnknownError):
    """The row may or may not have been written: the connection was lost while its ``COMMIT`` was under way, or a
    stop (``stop(force=True)``, an expired ``stop(timeout=...)``, the event loop shutting down) cut its batch off
    after a ``COMMIT`` of the batch had been sent.

    ``__cause__`` is the driver's error, or the stop's :class:`~async_batcher.BatcherStoppedError`. Read the row back
    (once the server is back) to know; do not write it again blindly.
    """


class RowNotFoundError(AsyncBatchException, LookupError):
    """An update found no row with the primary key it gave: nothing was written for it (the other rows of its
    batch were written).

    ``key`` is that primary key, as the row gave it (a dict of column key to value).
    """

    def __init__(self, table: str, key: dict[str, Any]) -> None:
        named = ", ".join(f"{name}={value!r:.100}" for name, value in key.items())
        super().__init__(f"no row of table {table!r} has {named}: the update changed nothing")
        self.table = table
        self.key = key

    def __reduce__(self) -> tuple[Any, ...]:  # (pickled with its own arguments, not its message)
        return (type(self), (self.table, self.key))


@dataclass(eq=False)
class _Row:
    index: int
    columns: frozenset[str]
    parameters: dict[str, Any]
    key: tuple[Any, ...]  # what makes two rows of a batch the same row (see _rounds)
    order: tuple[Any, ...]  # the values it is written in order of: its key, or its primary key if it gives it


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


class _Unmatched(Exception):
    """Fewer rows were updated than given: which ones is found row by row, in a new transaction."""


class AsyncSqlalchemyWriteBatcher(AsyncBatcher[Mapping[str, Any], Any]):
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
                "%s: batch of %d rows failed: %s%s",
                self.name,
                len(batch),
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

    def _prepare(self, batch: list[Mapping[str, Any]], outcomes: list[Any]) -> list[_Row]:
        """A :class:`_Row` per valid item (its outcome pending); for the others, why (``ValueError``,
        ``TypeError``, or what reading the item raised)."""
        rows: list[_Row] = []
        for index, item in enumerate(batch):
            try:
                rows.append(self._row(index, item))
            except Exception as error:  # (a mapping that fails when read: its caller's error, no one else's)
                outcomes[index] = error
                continue
            outcomes[index] = _PENDING
        return rows

    def _row(self, index: int, item: Mapping[str, Any]) -> _Row:
        if not isinstance(item, Mapping):
            raise TypeError(f"a row must be a dict of column keys to values, got {type(item).__name__}")
        columns = frozenset(item)
        unknown = sorted(str(name) for name in columns if not isinstance(name, str) or name not in self.table.c)
        if unknown:
            raise ValueError(f"table {self.table.name!r} has no column(s) {unknown}")
        required = self._statements.key_columns if self.operation == "update" else ()
        if self.on_conflict is not None:
            required = self.conflict_columns
        missing = [name for name in required if name not in columns]
        if missing:
            raise ValueError(f"the row lacks {missing}, which the {self.operation} needs to find its row")
        if self.operation == "update" and columns <= set(required):
            raise ValueError("an update row needs at least one column to set besides its primary key")
        key = tuple(item[name] for name in required) if required else (index,)
        primary = self._statements.key_columns
        if required:
            order = key
        elif primary and columns.issuperset(primary):
            order = tuple(item[name] for name in primary)
        else:
            order = ()  # a key the server generates: in the callers' order
        return _Row(index, columns, self._statements.parameters(dict(item)), key, order)

    # ------------------------------------------------------------------ transactions

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
                    "%s: the server aborted a transaction of %d rows (%s, SQLSTATE %s); trying again (%d of %d)",
                    self.name,
                    len(rows),
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

    async def _execute(self, connection: AsyncConnection, rows: list[_Row], *, row_by_row: bool) -> list[Any]:
        """The statements of ``rows``, in key order (see :func:`in_key_order`); each row's result."""
        if self.operation == "update":
            return await self._update(connection, rows, row_by_row=row_by_row)
        results: list[Any] = [None] * len(rows)
        await self._execute_groups(connection, rows, results)
        return results

    async def _execute_groups(
        self, connection: AsyncConnection, rows: list[_Row], results: list[Any] | None = None
    ) -> int:
        """One statement per set of columns the rows give (usually one), each in key order; ``results`` gets
        the returned rows. Returns the number of rows the statements matched (where the dialect can count)."""
        position = {id(row): p for p, row in enumerate(rows)}
        groups: dict[frozenset[str], list[_Row]] = {}
        for row in in_key_order(rows, key=lambda row: row.order):
            groups.setdefault(row.columns, []).append(row)
        matched = 0
        for columns, group in groups.items():
            statement = self._statements.statement(columns)
            result = await connection.execute(statement, [row.parameters for row in group])
            if self._statements.returning and results is not None:
                returned = result.all()
                if len(returned) != len(group):
                    raise RuntimeError(f"{len(returned)} rows came back from RETURNING for {len(group)} rows")
                for row, value in zip(group, returned, strict=True):
                    results[position[id(row)]] = value
            elif self.operation == "update":
                matched += result.rowcount
        return matched

    async def _update(self, connection: AsyncConnection, rows: list[_Row], *, row_by_row: bool) -> list[Any]:
        """Update ``rows``; each gets None, or :class:`RowNotFoundError` if its key names no row.

        Which keys name a row is asked of the server, comparing as the ``UPDATE``'s ``WHERE`` does (a key given
        as ``"5"`` for an integer column, a case-insensitive collation). PostgreSQL: first
        ``SELECT ... FOR UPDATE`` those rows, in key order, then update them: found and locked, they are the rows
        updated (a row inserted meanwhile by another transaction is not: as if this update came first). SQLite:
        the ``UPDATE`` s, then, if they matched fewer rows than given, the ``SELECT``: the file's write lock, taken
        by the first ``UPDATE``, keeps the table as it was. Elsewhere: the ``UPDATE`` s and their count of rows
        matched (each key names at most one row: it is the primary key); if short, again in a new transaction,
        one statement per row, each with its own count.
        """
        statements = self._statements
        dialect = connection.dialect.name
        if dialect == "postgresql":
            found = await self._locked(connection, rows)
            await self._execute_groups(connection, [row for row in rows if row.index in found])
        elif dialect == "sqlite":
            if await self._execute_groups(connection, rows) == len(rows):
                return [None] * len(rows)
            # Shielded: quick (this transaction holds the write lock: nothing can make it wait) and read to its end.
            found = await _to_completion(self._sqlite_matching(connection, rows))
        elif row_by_row or not connection.dialect.supports_sane_multi_rowcount:
            found = set()
            for row in in_key_order(rows, key=lambda row: row.order):
                result = await connection.execute(statements.statement(row.columns), row.parameters)
                if result.rowcount:
                    found.add(row.index)
        else:
            if await self._execute_groups(connection, rows) != len(rows):
                raise _Unmatched
            return [None] * len(rows)
        return [
            None if row.index in found else RowNotFoundError(self.table.name, statements.key_of(row.parameters))
            for row in rows
        ]

    async def _locked(self, connection: AsyncConnection, rows: list[_Row]) -> set[int]:
        """PostgreSQL: the indexes of ``rows`` whose key names a row of the table, now locked, in key order."""
        ordered = in_key_order(rows, key=lambda row: row.key)
        parameters = self._statements.locking_parameters([row.key for row in ordered])
        found = await connection.execute(self._statements.locking(connection.dialect), parameters)
        return {ordered[position].index for position in found.scalars()}

    async def _sqlite_matching(self, connection: AsyncConnection, rows: list[_Row]) -> set[int]:
        """SQLite: the indexes of ``rows`` whose key names a row of the table (in chunks: SQLite takes at most
        32766 parameters a statement)."""
        per_statement = max(1, MAX_PARAMETERS // (1 + len(self._statements.key_columns)))
        found: set[int] = set()
        for start in range(0, len(rows), per_statement):
            chunk = rows[start : start + per_statement]
            sql = self._statements.sqlite_matching(connection.dialect, len(chunk))
            parameters = tuple(value for position, row in enumerate(chunk) for value in (position, *row.key))
            result = await connection.exec_driver_sql(sql, parameters)
            found.update(chunk[position].index for position in result.scalars())
        return found


_PENDING: Any = object()


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


def _state_of(error: BaseException) -> str:
    state = sqlstate(error)
    return f" (SQLSTATE {state})" if state else ""


def _rounds(rows: list[_Row]) -> list[list[_Row]]:
    """The n-th row of each key in round n: a statement never names one key twice (an upsert cannot), and the
    rows of a key are written in their callers' order."""
    rounds: list[list[_Row]] = []
    seen: dict[tuple[Any, ...], int] = {}
    for row in rows:
        try:
            n = seen.get(row.key, 0)
            seen[row.key] = n + 1
        except TypeError:  # an unhashable key value: the server will refuse it, in a round of its own
            n = len(rounds)
        if n == len(rounds):
            rounds.append([])
        rounds[n].append(row)
    return rounds


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
