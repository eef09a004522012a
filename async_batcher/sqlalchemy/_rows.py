"""The rows of a batch: each item checked against the table before any SQL (a dict of its column keys, with the
key the operation needs to find its row), and the rounds they are written in (a key at most once a statement)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from async_batcher.sqlalchemy._statements import OnConflict, Operation, Statements

__all__ = ["RowChecks", "_PENDING", "_Row", "_rounds"]


@dataclass(eq=False)
class _Row:
    index: int
    columns: frozenset[str]
    parameters: dict[str, Any]
    key: tuple[Any, ...]  # what makes two rows of a batch the same row (see _rounds)
    order: tuple[Any, ...]  # the values it is written in order of: its key, or its primary key if it gives it


_PENDING: Any = object()


class RowChecks:
    """The batcher's checks of its items: a mixin of :class:`~async_batcher.sqlalchemy.AsyncSqlalchemyWriteBatcher`,
    which sets the attributes named here."""

    table: Any
    operation: Operation
    on_conflict: OnConflict | None
    conflict_columns: tuple[str, ...]
    _statements: Statements

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
