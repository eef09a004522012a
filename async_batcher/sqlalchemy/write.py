"""Batch SQL writes through SQLAlchemy 2's asyncio API: one statement and one transaction per batch.

``await batcher.process({"id": 1, "name": "a"})`` inserts (or updates, or upserts) that row and returns None, or
with ``returning`` the caller's own row of the ``RETURNING`` columns (a ``Row``: it compares equal to a tuple).
It raises:

* the driver's error (``IntegrityError``, ``DataError``, ...) when this row is at fault (a constraint it
  violates, a value of the wrong type): the batch's statement failed, and the batch was split in halves, each
  written in its own transaction, down to the rows at fault (bisection: about ``2 * log2(n)`` more statements
  per bad row); every other row of the batch is written;
* ``ValueError`` / ``TypeError`` naming the bad key, before any SQL, for a row that is not a dict of the
  table's columns (an update without its primary key, say);
* the driver's error when the batch could not be written for a reason of its own (the connection was lost, the
  server refused the statement or the commit): nothing of the transaction was written;
* :class:`CommitUnknownError` when the connection was lost during ``COMMIT``: the server may or may not have
  committed the rows, and cannot be asked.

A row is reported written only after its transaction committed. The batcher keeps serving after any of these;
the engine's pool replaces the connections a lost server broke.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from async_batcher.batcher import AsyncBatcher
from async_batcher.exceptions import AsyncBatchException

try:
    from sqlalchemy import inspect
    from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, StatementError
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, async_sessionmaker
except ImportError as error:  # pragma: no cover - exercised in a subprocess by tests/sqlalchemy/test_packaging.py
    raise ImportError(
        f"async_batcher.sqlalchemy needs SQLAlchemy 2 ({error.name} is missing): "
        "pip install 'async-batcher[sqlalchemy]'"
    ) from error

from async_batcher.sqlalchemy._statements import OnConflict, Operation, Statements

__all__ = ["AsyncSqlalchemyWriteBatcher", "CommitUnknownError"]

logger = logging.getLogger("async_batcher.sqlalchemy")

# SQLSTATE classes of errors caused by the data of a row: cardinality (21), data (22), integrity (23).
_ROW_FAULT_STATES = frozenset({"21", "22", "23"})


class CommitUnknownError(AsyncBatchException):
    """The connection was lost while ``COMMIT`` was under way: the row may or may not have been written.

    ``__cause__`` is the driver's error. Read the row back (once the server is back) to know.
    """


@dataclass(eq=False)
class _Row:
    index: int
    columns: frozenset[str]
    parameters: dict[str, Any]
    key: tuple[Any, ...]


class _Failed(Exception):
    """The batch cannot go on: ``error`` for every row without an outcome (``unknown``: those whose commit was
    cut off get a :class:`CommitUnknownError`)."""

    def __init__(self, error: Exception, unknown: Sequence[_Row] = ()) -> None:
        super().__init__()
        self.error = error
        self.unknown = list(unknown)


def is_row_fault(error: BaseException) -> bool:
    """Whether ``error`` is the fault of the rows' data (bisect to find the row) rather than of the batch.

    SQLAlchemy refusing a row's parameters, a constraint or data error of the server (SQLSTATE classes 21, 22,
    23), or a driver refusing a value (no SQLSTATE, not a connection error) are the rows'; a lost connection,
    or a statement the server refuses whatever the rows (a missing table, a syntax error) are the batch's.
    """
    if not isinstance(error, StatementError):
        return False
    if not isinstance(error, DBAPIError):
        return True  # SQLAlchemy refused a row's parameters before sending them
    if error.connection_invalidated:
        return False
    state = getattr(error.orig, "sqlstate", None) or getattr(error.orig, "pgcode", None)
    if isinstance(state, str) and state:
        return state[:2] in _ROW_FAULT_STATES
    return not isinstance(error, OperationalError | InterfaceError)


class AsyncSqlalchemyWriteBatcher(AsyncBatcher[Mapping[str, Any], Any]):
    """Writes the rows of concurrent callers to ``model``'s table in one statement per batch (see the module).

    The path and the first four arguments are async-batcher 0.2.2's.

    Args:
        model: A declarative ORM class (or a ``Table``); a row is a dict of its column keys to values.
        async_engine: The ``AsyncEngine`` to write through (``create_async_engine(...)``).
        operation: ``"insert"`` rows, or ``"update"`` the row with each row's primary key (a row gives its
            primary key and the columns to set).
        returning: A column (``Model.id``) or a list of them: each caller of an insert gets its own row of
            them back, matched by position.
        on_conflict: For an insert on PostgreSQL or SQLite: ``"nothing"`` leaves an existing row as it is
            (``ON CONFLICT DO NOTHING``), ``"update"`` sets the row's other given columns
            (``ON CONFLICT DO UPDATE``): an upsert. ``returning`` does not go with ``"nothing"`` (a skipped
            row returns nothing to match).
        conflict_columns: The unique columns of the conflict (default: the primary key).
        max_batch_size: The most rows per batch, so per transaction (default 1000).
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
        **kwargs: Any,
    ) -> None:
        super().__init__(max_batch_size=max_batch_size, **kwargs)
        if operation not in ("insert", "update"):
            raise ValueError(f"operation must be 'insert' or 'update', got {operation!r}")
        if not isinstance(async_engine, AsyncEngine):
            raise TypeError(f"async_engine must be an AsyncEngine, got {type(async_engine).__name__}")
        self.model = model
        self.table = _table_of(model)
        self.async_engine = async_engine
        self.operation: Operation = operation
        self.returning = returning
        self.on_conflict: OnConflict | None = on_conflict
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

    async def process_batch(self, batch: list[Mapping[str, Any]]) -> list[Any]:
        outcomes: list[Any] = [None] * len(batch)
        pending = self._prepare(batch, outcomes)
        try:
            for round_ in _rounds(pending):
                await self._write(round_, outcomes)
        except _Failed as failed:
            logger.warning("%s: batch of %d rows failed: %s", self.name, len(batch), type(failed.error).__name__)
            for row in failed.unknown:
                unknown = CommitUnknownError("the connection was lost during COMMIT: the row may have been written")
                unknown.__cause__ = failed.error
                outcomes[row.index] = unknown
            for row in pending:
                if outcomes[row.index] is _PENDING:
                    outcomes[row.index] = failed.error
        return outcomes

    def _prepare(self, batch: list[Mapping[str, Any]], outcomes: list[Any]) -> list[_Row]:
        """A :class:`_Row` per valid item (its outcome pending); a ``ValueError``/``TypeError`` for the others."""
        rows: list[_Row] = []
        for index, item in enumerate(batch):
            try:
                rows.append(self._row(index, item))
            except (TypeError, ValueError) as error:
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
        return _Row(index, columns, self._statements.parameters(dict(item)), key)

    async def _write(self, rows: list[_Row], outcomes: list[Any]) -> None:
        """Write ``rows`` in one transaction; on a row's fault, each half in its own, down to the rows at fault."""
        try:
            results = await self._transaction(rows)
        except _Failed:
            raise
        except Exception as error:
            if not is_row_fault(error):
                raise _Failed(error) from None
            if len(rows) == 1:
                outcomes[rows[0].index] = error
                return
            middle = len(rows) // 2
            await self._write(rows[:middle], outcomes)
            await self._write(rows[middle:], outcomes)
            return
        for row, result in zip(rows, results, strict=True):
            outcomes[row.index] = result

    async def _transaction(self, rows: list[_Row]) -> list[Any]:
        """Execute and commit ``rows``; returns each row's result (its returned row, or None)."""
        async with self.async_engine.connect() as connection:
            transaction = await connection.begin()
            try:
                results = await self._execute(connection, rows)
            except BaseException:
                await _rollback_quietly(connection)
                raise
            try:
                await transaction.commit()
            except DBAPIError as error:
                if not error.connection_invalidated:
                    raise  # the server answered: nothing was committed
                raise _Failed(error, unknown=rows) from None
            except OSError as error:
                raise _Failed(error, unknown=rows) from None
        return results

    async def _execute(self, connection: AsyncConnection, rows: list[_Row]) -> list[Any]:
        """One statement per set of columns the rows give (usually one), in the rows' order of appearance."""
        groups: dict[frozenset[str], list[int]] = {}
        for position, row in enumerate(rows):
            groups.setdefault(row.columns, []).append(position)
        results: list[Any] = [None] * len(rows)
        for columns, positions in groups.items():
            statement = self._statements.statement(columns)
            result = await connection.execute(statement, [rows[p].parameters for p in positions])
            if self._statements.returning:
                returned = result.all()
                if len(returned) != len(positions):
                    raise RuntimeError(f"{len(returned)} rows came back from RETURNING for {len(positions)} rows")
                for position, value in zip(positions, returned, strict=True):
                    results[position] = value
        return results


_PENDING: Any = object()


async def _rollback_quietly(connection: AsyncConnection) -> None:
    """Roll back after a failed statement; a connection that is gone has nothing to roll back."""
    try:
        await connection.rollback()
    except Exception as error:  # the statement's error is the one that matters
        logger.debug("rollback after a failed statement failed too: %s", type(error).__name__)


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
