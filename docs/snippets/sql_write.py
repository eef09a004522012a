"""Insert rows from many concurrent callers in one statement per batch, each caller getting its own row back.

``DATABASE_URL`` picks the database (default: a SQLite file here), for instance
``DATABASE_URL=postgresql+asyncpg://postgres@127.0.0.1:5432/postgres python docs/snippets/sql_write.py``.
"""

import asyncio
import os

from sqlalchemy import String, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from async_batcher.sqlalchemy import AsyncSqlalchemyWriteBatcher


class Base(DeclarativeBase):
    pass


class Event(Base):
    __tablename__ = "async_batcher_events"

    id: Mapped[int] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(String(20))
    amount: Mapped[int]


async def main() -> None:
    engine = create_async_engine(os.environ.get("DATABASE_URL", "sqlite+aiosqlite:///events.db"))
    async with engine.begin() as connection:
        await connection.run_sync(Base.metadata.drop_all)
        await connection.run_sync(Base.metadata.create_all)

    async with AsyncSqlalchemyWriteBatcher(Event, engine, returning=[Event.id, Event.kind]) as inserter:
        rows = [{"id": i, "kind": "click" if i % 2 else "view", "amount": i} for i in range(1000)]
        rows[500] = {"id": 1, "kind": "duplicate", "amount": 0}  # id 1 is taken: fails alone
        results = await asyncio.gather(*(inserter.process(row) for row in rows), return_exceptions=True)
    print(results[0], type(results[500]).__name__)  # (0, 'view') IntegrityError
    assert isinstance(results[500], IntegrityError)

    # An upsert: insert, or update the row that has the same primary key.
    async with AsyncSqlalchemyWriteBatcher(Event, engine, on_conflict="update") as upserter:
        await upserter.process({"id": 0, "kind": "view", "amount": 1_000})

    async with engine.connect() as connection:
        count = len((await connection.execute(select(Event.id))).all())
        amount = (await connection.execute(select(Event.amount).where(Event.id == 0))).scalar_one()
    print(count, "rows; row 0 now has amount", amount)  # 999 rows; row 0 now has amount 1000
    assert (count, amount) == (999, 1_000)
    await engine.dispose()


if __name__ == "__main__":
    asyncio.run(main())
