"""Whose fault an error of a write is: a row's (bisect the batch to find it), a conflict with another transaction
(try the transaction again), or the batch's and the connection's (fail the batch).

The rule comes from the SQLSTATE's class where the driver gives one (PostgreSQL's drivers do): the classes listed in
:data:`BATCH_CLASSES` do not depend on the rows (the connection, the server, the statement, the transaction); every
other class, and the ``54000`` "program limit" (an index row too large for one row's value), does: integrity
(``23``), data (``22``), cardinality (``21``), a trigger's ``RAISE EXCEPTION`` (``P0001``) or its own SQLSTATE, a
view's ``WITH CHECK OPTION`` (``44``), ... A misread batch error costs at most the bisection's statements (every
row then fails alone, with the same error); a misread row error would fail innocent rows, so an unknown class is
the row's.
"""

from __future__ import annotations

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, StatementError

__all__ = ["BATCH_CLASSES", "CONFLICT_STATES", "is_conflict", "is_row_fault", "sqlstate"]

#: SQLSTATE classes whatever the rows: the connection (08), features (0A, 0B), the transaction's state (25, 2D,
#: 3B), statement names (26), authorization (28), catalog and schema (3D, 3F), transaction rollback (40: conflicts
#: are tried again), syntax and access (42), resources (53), limits of the statement (54, but 54000), object state
#: and locks (55), operator intervention (57: a cancel, a shutdown), system (58), snapshot (72), configuration
#: (F0), foreign data wrappers (HV), internal (XX).
BATCH_CLASSES = frozenset(
    {"08", "0A", "0B", "25", "26", "28", "2D", "3B", "3D", "3F", "40", "42", "53", "54", "55", "57", "58", "72"}
    | {"F0", "HV", "XX"}
)
#: A row's value over a limit (``index row size ... exceeds maximum``): the row's fault, though its class is not.
_ROW_STATES = frozenset({"54000"})
#: A deadlock (``40P01``) or a serialization failure (``40001``): the server rolled the transaction back because of
#: another one; the same transaction, tried again, usually goes through.
CONFLICT_STATES = frozenset({"40001", "40P01"})


def sqlstate(error: BaseException) -> str | None:
    """The SQLSTATE of a driver's error wrapped by SQLAlchemy (asyncpg's and psycopg's ``sqlstate``, psycopg2's
    ``pgcode``), or None."""
    orig = getattr(error, "orig", None)
    state = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    return state if isinstance(state, str) and state else None


def is_row_fault(error: BaseException) -> bool:
    """Whether ``error`` is the fault of the rows' data (bisect to find the row) rather than of the batch.

    The rows': SQLAlchemy refusing a row's parameters; an error whose SQLSTATE is not of :data:`BATCH_CLASSES`;
    a driver's error without a SQLSTATE that is not about the connection (SQLite's ``IntegrityError``,
    ``ProgrammingError`` for a value it cannot bind, ...); and the errors a driver raises unwrapped for a value
    it cannot convert (sqlite3's ``OverflowError`` for an integer beyond 64 bits, ``UnicodeEncodeError`` for a
    lone surrogate: ``ValueError``, ``TypeError``, ``ArithmeticError``). The batch's: a lost connection (whatever
    its SQLSTATE), ``OperationalError`` and ``InterfaceError`` without one (SQLite's "database is locked", "no
    such table"), ``OSError``, and anything else.
    """
    if not isinstance(error, StatementError):
        return isinstance(error, ValueError | TypeError | ArithmeticError)
    if not isinstance(error, DBAPIError):
        return True  # SQLAlchemy refused a row's parameters before sending them
    if error.connection_invalidated:
        return False
    state = sqlstate(error)
    if state is not None:
        return state in _ROW_STATES or state[:2] not in BATCH_CLASSES
    return not isinstance(error, OperationalError | InterfaceError)


def is_conflict(error: BaseException) -> bool:
    """Whether the server aborted the transaction for a conflict with another one (:data:`CONFLICT_STATES`), on a
    connection still usable: the same transaction may be tried again."""
    return isinstance(error, DBAPIError) and not error.connection_invalidated and sqlstate(error) in CONFLICT_STATES
