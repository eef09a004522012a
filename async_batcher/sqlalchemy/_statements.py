"""The statements of the SQL write batcher: one per operation and set of columns, built once and kept.

``insert`` is SQLAlchemy Core's ``insert(table)``, executed with a list of rows: the driver's bulk path
(asyncpg's pipelined ``executemany``; with ``RETURNING``, SQLAlchemy's ``insertmanyvalues``, several rows per
``INSERT``, its rows back in parameter order). ``update`` sets the given columns of the row with the given
primary key. An upsert is the dialect's ``INSERT ... ON CONFLICT`` (PostgreSQL and SQLite).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from sqlalchemy import Table, and_, bindparam, insert, update
from sqlalchemy.sql.dml import Insert, Update

Operation = Literal["insert", "update"]
OnConflict = Literal["nothing", "update"]

_KEY = "_key_"  # the update's WHERE parameters: the row's primary key
_SET = "_set_"  # its SET parameters


def dialect_insert(dialect: str) -> Any:
    """The ``insert`` of ``dialect`` that has ``on_conflict_do_*``; ValueError for another dialect."""
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as postgresql_insert

        return postgresql_insert
    if dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert
    raise ValueError(f"on_conflict is supported on PostgreSQL and SQLite, not on {dialect!r}")


class Statements:
    """Builds (and keeps) the statement for each set of columns the rows of a batch give."""

    def __init__(
        self,
        table: Table,
        operation: Operation,
        *,
        returning: Sequence[Any],
        on_conflict: OnConflict | None,
        conflict_columns: Sequence[str],
        dialect: str,
    ) -> None:
        self.table = table
        self.operation = operation
        self.returning = tuple(returning)
        self.on_conflict = on_conflict
        self.conflict_columns = tuple(conflict_columns)
        self.key_columns = tuple(column.key for column in table.primary_key.columns)
        self._insert: Any = dialect_insert(dialect) if on_conflict is not None else insert
        self._built: dict[frozenset[str], Insert | Update] = {}

    def statement(self, columns: frozenset[str]) -> Insert | Update:
        """The statement for rows that give exactly ``columns``."""
        built = self._built.get(columns)
        if built is None:
            built = self._built[columns] = (
                self._update(columns) if self.operation == "update" else self._upsert(columns)
            )
        return built

    def parameters(self, row: dict[str, Any]) -> dict[str, Any]:
        """The execution parameters of ``row`` (an update's columns are renamed apart from its key's)."""
        if self.operation != "update":
            return row
        return {(_KEY if name in self.key_columns else _SET) + name: value for name, value in row.items()}

    def _upsert(self, columns: frozenset[str]) -> Insert:
        statement: Any = self._insert(self.table)
        if self.on_conflict is not None:
            updates = sorted(columns - set(self.conflict_columns))
            if self.on_conflict == "nothing" or not updates:
                statement = statement.on_conflict_do_nothing(index_elements=list(self.conflict_columns))
            else:
                statement = statement.on_conflict_do_update(
                    index_elements=list(self.conflict_columns),
                    set_={name: statement.excluded[name] for name in updates},
                )
        if self.returning:
            statement = statement.returning(*self.returning, sort_by_parameter_order=True)
        built: Insert = statement
        return built

    def _update(self, columns: frozenset[str]) -> Update:
        table = self.table
        where = and_(*(table.c[name] == bindparam(_KEY + name) for name in self.key_columns))
        values: dict[str, Any] = {name: bindparam(_SET + name) for name in sorted(columns - set(self.key_columns))}
        return update(table).where(where).values(values)
