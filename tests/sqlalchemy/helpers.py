"""Tables, engines and read-backs for the SQL batcher's tests."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

from sqlalchemy import CheckConstraint, String, event, select
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


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
