"""Tables, engines and read-backs for the SQL batcher's tests."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import CheckConstraint, Column, Integer, MetaData, String, Table, event, select, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# The parameter that picks PostgreSQL, a server beyond Python: the tests on it are the full tier's
# (tests/conftest.py); those on SQLite are the fast tier's too.
POSTGRESQL = pytest.param("postgresql", marks=pytest.mark.integration)


def person_model(*, generated_ids: bool = False) -> Any:
    """A fresh declarative class ``Person(id, name, age)`` on a table of its own (0.2.2's test model, with a
    length limit and a check constraint). ``generated_ids``: the server numbers the rows."""

    class Base(DeclarativeBase):
        pass

    class Person(Base):
        __tablename__ = f"person_{uuid.uuid4().hex[:10]}"

        id: Mapped[int] = mapped_column(primary_key=True, autoincrement=generated_ids)
        name: Mapped[str] = mapped_column(String(30))
        age: Mapped[int] = mapped_column(CheckConstraint("age >= 0"))

    return Person


@contextlib.asynccontextmanager
async def database(url: str, model: Any, **engine_options: Any) -> AsyncIterator[AsyncEngine]:
    """An engine on ``url`` with ``model``'s table created; the table is dropped and the engine disposed after."""
    engine = create_async_engine(url, **engine_options)
    try:
        async with engine.begin() as connection:
            await connection.run_sync(model.metadata.create_all)
        yield engine
        async with engine.begin() as connection:
            await connection.run_sync(model.metadata.drop_all)
    finally:
        await engine.dispose()


async def read_table(engine: AsyncEngine, model: Any) -> dict[int, tuple[str, int]]:
    """Every row of ``model``'s table: id -> (name, age)."""
    async with engine.connect() as connection:
        rows = (await connection.execute(select(model.__table__))).all()
    return {row.id: (row.name, row.age) for row in rows}


class StatementLog:
    """The statements an engine sends to the database (one entry per cursor execution, executemany included)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.statements: list[str] = []
        event.listen(engine.sync_engine, "before_cursor_execute", self._record)

    def _record(self, conn: Any, cursor: Any, statement: str, params: Any, context: Any, executemany: bool) -> None:
        self.statements.append(statement.split(None, 1)[0].upper())

    def count(self, verb: str) -> int:
        return self.statements.count(verb)


async def read_rows(engine: AsyncEngine, table: Any) -> list[dict[str, Any]]:
    """Every row of ``table`` (a ``Table`` or a declarative class), as dicts, in primary key order."""
    table = getattr(table, "__table__", table)
    async with engine.connect() as connection:
        rows = (await connection.execute(select(table).order_by(*table.primary_key.columns))).mappings().all()
    return [dict(row) for row in rows]


async def until_sql(engine: AsyncEngine, query: str, *, within: float = 20.0, **params: Any) -> None:
    """Poll ``query`` (its first column of its first row) until it is true; AssertionError after ``within`` s.

    For waiting on the server's state (a backend blocked on a lock, a connection gone): each poll is a query.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        async with engine.connect() as connection:
            if (await connection.execute(text(query), params)).scalar():
                return
        if loop.time() > deadline:
            raise AssertionError(f"not reached within {within} s: {query}")
        await asyncio.sleep(0.02)


def blocked_on_a_lock(application_name: str) -> str:
    """A query for :func:`until_sql`: a backend of ``application_name`` waits for a lock."""
    return (
        "SELECT count(*) > 0 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        f"AND application_name = '{application_name}'"
    )


def kv_table(*, composite: bool = False) -> Table:
    """A fresh table ``(id, v)`` (``composite``: keyed by ``(id, part)``)."""
    keys = [Column("id", Integer, primary_key=True)]
    if composite:
        keys.append(Column("part", String(10), primary_key=True))
    return Table(f"kv_{uuid.uuid4().hex[:10]}", MetaData(), *keys, Column("v", String(20)))


async def gather_bounded(calls: list[Any], within: float = 60) -> list[object]:
    """The calls' outcomes (results or exceptions), failing after ``within`` seconds."""
    return list(await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), within))
