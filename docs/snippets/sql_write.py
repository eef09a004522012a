"""Insert the rows of many concurrent callers in one statement per batch.

Each caller gets its own row back. ``DATABASE_URL`` picks the database (default: a
SQLite file here), for instance
``DATABASE_URL=postgresql+asyncpg://postgres@127.0.0.1:5432/postgres``.
"""

import asyncio
import os

from sqlalchemy import String, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from async_batcher.sqlalchemy import AsyncSqlalchemyWriteBatcher, RowNotFoundError


class Base(DeclarativeBase):
    pass


class Event(Base):
    __tablename__ = "async_batcher_events"

    id: Mapped[int] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(String(20))
    amount: Mapped[int]


def event(i: int) -> dict[str, object]:
    return {"id": i, "kind": "click" if i % 2 else "view", "amount": i}


async def main() -> None:
    url = os.environ.get("DATABASE_URL", "sqlite+aiosqlite:///events.db")
    engine = create_async_engine(url)
    async with engine.begin() as connection:
        await connection.run_sync(Base.metadata.drop_all)
        await connection.run_sync(Base.metadata.create_all)

    returning = [Event.id, Event.kind]
    async with AsyncSqlalchemyWriteBatcher(Event, engine, returning=returning) as sql:
        rows = [event(i) for i in range(1000)]
        rows[500] = {"id": 1, "kind": "duplicate", "amount": 0}  # id 1 is taken
        results = await asyncio.gather(
            *(sql.process(row) for row in rows), return_exceptions=True
        )
    # Each caller got its own row back; the duplicate failed alone.
    print(results[0], type(results[500]).__name__)  # (0, 'view') IntegrityError
    assert isinstance(results[500], IntegrityError)

    # An upsert: insert, or update the row that has the same primary key.
    async with AsyncSqlalchemyWriteBatcher(Event, engine, on_conflict="update") as sql:
        await sql.process({"id": 0, "kind": "view", "amount": 1_000})

    # An update of a key that names no row writes nothing, and its caller is told.
    async with AsyncSqlalchemyWriteBatcher(Event, engine, operation="update") as sql:
        updated = await asyncio.gather(
            sql.process({"id": 2, "amount": 20}),
            sql.process({"id": 5_000, "amount": 1}),  # no such row
            return_exceptions=True,
        )
    print(updated)  # [None, RowNotFoundError("no row of table ... has id=5000 ...")]
    assert updated[0] is None and isinstance(updated[1], RowNotFoundError)

    async with engine.connect() as connection:
        count = len((await connection.execute(select(Event.id))).all())
        row_0 = select(Event.amount).where(Event.id == 0)
        amount = (await connection.execute(row_0)).scalar_one()
    # 999 rows; row 0 now has amount 1000
    print(count, "rows; row 0 now has amount", amount)
    assert (count, amount) == (999, 1_000)
    await engine.dispose()


if __name__ == "__main__":
    asyncio.run(main())
