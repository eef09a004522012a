"""The statements of one transaction, run on its connection: one per set of columns the rows give, in key order;
and for an update, which of its rows name a row of the table (the others get :class:`RowNotFoundError`)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from async_batcher._checks import plural
from async_batcher.sqlalchemy._connections import _to_completion
from async_batcher.sqlalchemy._errors import RowNotFoundError
from async_batcher.sqlalchemy._rows import _Row
from async_batcher.sqlalchemy._statements import MAX_PARAMETERS, Operation, Statements, in_key_order

__all__ = ["Execution", "_Unmatched"]


class _Unmatched(Exception):
    """Fewer rows were updated than given: which ones is found row by row, in a new transaction."""


class Execution:
    """The batcher's statements: a mixin of :class:`~async_batcher.sqlalchemy.AsyncSqlalchemyWriteBatcher`, which
    sets the attributes named here."""

    table: Any
    operation: Operation
    _statements: Statements

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
                    raise RuntimeError(
                        f"{plural(len(returned), 'row')} came back from RETURNING for {plural(len(group), 'row')}"
                    )
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
