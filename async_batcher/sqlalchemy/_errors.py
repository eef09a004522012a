"""The errors the SQL write batcher gives a caller besides the driver's own: a row that may or may not have been
written (:class:`CommitUnknownError`), an update whose primary key names no row (:class:`RowNotFoundError`)."""

from __future__ import annotations

from typing import Any

from async_batcher.exceptions import AsyncBatchException, OutcomeUnknownError

__all__ = ["CommitUnknownError", "RowNotFoundError"]


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


# Named by the module users import them from, as they were before they moved here: tracebacks and pickles say
# ``async_batcher.sqlalchemy.write.RowNotFoundError``.
CommitUnknownError.__module__ = RowNotFoundError.__module__ = "async_batcher.sqlalchemy.write"
