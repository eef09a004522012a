"""The statements of the SQL write batcher: one per operation and set of columns, built once and kept.

``insert`` is SQLAlchemy Core's ``insert(table)``, executed with a list of rows: the driver's bulk path
(asyncpg's pipelined ``executemany``; with ``RETURNING``, SQLAlchemy's ``insertmanyvalues``, several rows per
``INSERT``, its rows back in parameter order). ``update`` sets the given columns of the row with the given
primary key. An upsert is the dialect's ``INSERT ... ON CONFLICT`` (PostgreSQL and SQLite).

:meth:`Statements.locking` (PostgreSQL) and :meth:`Statements.sqlite_matching` find which rows of an update have a
row to update (PostgreSQL: and lock those, in key order), comparing on the server as the ``UPDATE``'s ``WHERE`` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from sqlalchemy import Integer, Select, Table, and_, bindparam, column, func, insert, select, update
from sqlalchemy.sql.dml import Insert, Update
from sqlalchemy.types import UserDefinedType

Operation = Literal["insert", "update"]
OnConflict = Literal["nothing", "update"]

_KEY = "_key_"  # the update's WHERE parameters: the row's primary key
_SET = "_set_"  # its SET parameters
_POSITION = "_position_"  # the column of :meth:`Statements.matching`'s rows that says whose row it is
# Bind parameters per statement: SQLite takes at most 32766 (since 3.32).
MAX_PARAMETERS = 30_000


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
        self._locking: Select[Any] | None = None

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
            if not updates and self.on_conflict == "update" and self.returning:
                # A row that gives only its key: left as it is, but a row skipped by DO NOTHING would return
                # nothing, so it is "updated" to its own key, which returns it.
                statement = statement.on_conflict_do_update(
                    index_elements=list(self.conflict_columns),
                    set_={name: statement.excluded[name] for name in self.conflict_columns},
                )
            elif self.on_conflict == "nothing" or not updates:
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

    def locking(self, dialect: Any) -> Select[Any]:
        """PostgreSQL: a ``SELECT`` of the positions of the given keys that name a row of the table, those rows
        locked (``FOR UPDATE``) in primary key order, so that no other transaction deletes them before the
        update, and two batches lock their common rows in the same order. The keys are compared on the server,
        as the update's ``WHERE`` does. Its parameters (see :meth:`locking_parameters`) are arrays: one
        statement, prepared once, for batches of any size."""
        if self._locking is None:
            from sqlalchemy.dialects.postgresql import ARRAY

            table = self.table
            types = [table.c[name].type for name in self.key_columns]
            arrays = [bindparam(_POSITION, type_=ARRAY(Integer))]
            arrays += [bindparam(f"{_KEY}{i}", type_=_key_array(type_, dialect)) for i, type_ in enumerate(types)]
            given = (
                func.unnest(*arrays)
                .table_valued(column(_POSITION, Integer), *(column(f"{_KEY}{i}", t) for i, t in enumerate(types)))
                .render_derived(name="given")
            )
            on = and_(*(table.c[name] == given.c[f"{_KEY}{i}"] for i, name in enumerate(self.key_columns)))
            order = [table.c[name] for name in self.key_columns]
            self._locking = (
                select(given.c[_POSITION]).select_from(table.join(given, on)).order_by(*order).with_for_update(of=table)
            )
        return self._locking

    def locking_parameters(self, keys: Sequence[tuple[Any, ...]]) -> dict[str, list[Any]]:
        """The parameters of :meth:`locking` for ``keys``: a position's row comes back if its key names a row."""
        parameters: dict[str, list[Any]] = {_POSITION: list(range(len(keys)))}
        for i in range(len(self.key_columns)):
            parameters[f"{_KEY}{i}"] = [key[i] for key in keys]
        return parameters

    def sqlite_matching(self, dialect: Any, count: int) -> str:
        """SQLite: a ``SELECT`` of the positions of ``count`` given keys (``?`` parameters: position, then the
        key's values, per key) that name a row of the table, compared as the update's ``WHERE`` does: a value of
        ``VALUES`` has no affinity, as a parameter has none, and the table's column, on the left, gives the
        collation. Plain SQL, not compiled by SQLAlchemy: a compiled ``VALUES`` of thousands of rows takes seconds.
        """
        quote = dialect.identifier_preparer.quote
        names = [_POSITION, *(f"{_KEY}{i}" for i in range(len(self.key_columns)))]
        row = "(" + ", ".join("?" for _ in names) + ")"
        target = dialect.identifier_preparer.format_table(self.table)
        on = " AND ".join(
            f"{target}.{quote(self.table.c[name].name)} = given.{quote(f'{_KEY}{i}')}"
            for i, name in enumerate(self.key_columns)
        )
        return (
            f"WITH given({', '.join(quote(name) for name in names)}) AS (VALUES {', '.join([row] * count)}) "
            f"SELECT given.{quote(_POSITION)} FROM given JOIN {target} ON {on}"
        )

    def key_of(self, parameters: dict[str, Any]) -> dict[str, Any]:
        """The primary key of an update's parameters, as the row gave it (column key to value)."""
        return {name: parameters[_KEY + name] for name in self.key_columns}


class _KeyArray(UserDefinedType[Any]):
    """An array of a key column's values whose SQL cast is ``spec`` (the cast the ``UPDATE`` gives one value), its
    values converted as ``ARRAY(element)`` converts them."""

    cache_ok = True
    render_bind_cast = True

    def __init__(self, spec: str, element: Any) -> None:
        self.spec = spec
        self.element = element

    def get_col_spec(self, **_kw: Any) -> str:
        return self.spec

    def bind_processor(self, dialect: Any) -> Any:
        from sqlalchemy.dialects.postgresql import ARRAY

        return ARRAY(self.element).dialect_impl(dialect).bind_processor(dialect)


def _key_array(type_: Any, dialect: Any) -> Any:
    """The type of the array of a key column's values in :meth:`Statements.locking`: cast as the ``UPDATE`` casts
    one value (asyncpg's dialect casts a ``VARCHAR(5)`` parameter to ``VARCHAR``, a ``TIMESTAMP(3)`` one to
    ``TIMESTAMP``, but an array's elements with their length or precision, which would turn a key into another
    that names a row: its caller would be told "written" for a row the ``UPDATE`` does not touch)."""
    from sqlalchemy.dialects.postgresql import ARRAY

    probe = str((column("k", type_) == bindparam("k", type_=type_)).compile(dialect=dialect))
    _, cast, spec = probe.partition("::")
    return _KeyArray(f"{spec.strip()}[]", type_) if cast else ARRAY(type_)


def sort_key(key: tuple[Any, ...]) -> tuple[Any, ...]:
    """The order rows are written in: by their key's values, ``None`` first (see :func:`in_key_order`)."""
    return tuple((value is not None, value) for value in key)


def in_key_order(rows: list[Any], key: Any) -> list[Any]:
    """``rows`` sorted by ``key(row)`` (a tuple of a key's values), so that two batches writing common rows take
    their locks in the same order and cannot deadlock each other; in their order if their keys do not compare
    (values of mixed types), which only loses that guarantee."""
    try:
        return sorted(rows, key=lambda row: sort_key(key(row)))
    except TypeError:
        return list(rows)
