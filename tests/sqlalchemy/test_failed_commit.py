"""A COMMIT the server refuses: nothing of that transaction is written, ever, and the connection goes back clean.

SQLite keeps a transaction open when its COMMIT fails (the file is locked, a deferred foreign key is violated); a
pooled connection that kept it would commit those rows with the next batch, and hold the file's lock meanwhile.
"""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Column, ForeignKey, Integer, MetaData, String, Table, event, text
from sqlalchemy.exc import DBAPIError, IntegrityError

from async_batcher.sqlalchemy import AsyncSqlalchemyWriteBatcher
from tests.sqlalchemy.helpers import database, read_rows

pytestmark = pytest.mark.single_loop


def plain_table() -> Table:
    return Table(
        f"plain_{uuid.uuid4().hex[:10]}", MetaData(), Column("id", Integer, primary_key=True), Column("v", String(20))
    )


async def test_sqlite_a_commit_refused_by_a_lock_writes_nothing_then_or_later(tmp_path: Path) -> None:
    path = tmp_path / "locked.db"
    table = plain_table()
    # A short busy timeout: the COMMIT gives up on the reader's lock quickly.
    async with database(f"sqlite+aiosqlite:///{path}", table, connect_args={"timeout": 0.2}) as engine:
        reader = sqlite3.connect(path, isolation_level=None)
        try:
            reader.execute("BEGIN")
            reader.execute(f"SELECT * FROM {table.name}").fetchall()  # a SHARED lock: no COMMIT can take the file
            async with AsyncSqlalchemyWriteBatcher(table, engine, max_batch_size=3, max_queue_time=1) as batcher:
                first = await asyncio.wait_for(
                    asyncio.gather(*(batcher.process({"id": i, "v": "a"}) for i in range(3)), return_exceptions=True),
                    30,
                )
                reader.execute("ROLLBACK")
                # No lock is left behind: another writer takes the file at once.
                other = sqlite3.connect(path, isolation_level=None, timeout=0)
                try:
                    other.execute("BEGIN IMMEDIATE")
                    other.execute("ROLLBACK")
                finally:
                    other.close()
                assert await asyncio.wait_for(batcher.process({"id": 100, "v": "b"}), 30) is None
        finally:
            reader.close()
        stored = await read_rows(engine, table)
    assert all(isinstance(r, DBAPIError) and "locked" in str(r) for r in first), first
    assert stored == [{"id": 100, "v": "b"}]  # the failed batch's rows never arrive


def _foreign_keys_on(engine: Any) -> None:
    @event.listens_for(engine.sync_engine, "connect")
    def _on(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.execute("PRAGMA foreign_keys = ON")  # aiosqlite's adapted connection runs it


async def test_a_deferred_foreign_key_violated_at_commit_fails_only_its_row(database_url: str) -> None:
    metadata = MetaData()
    suffix = uuid.uuid4().hex[:10]
    parent = Table(f"parent_{suffix}", metadata, Column("id", Integer, primary_key=True))
    child = Table(
        f"child_{suffix}",
        metadata,
        Column("id", Integer, primary_key=True),
        Column(
            "parent_id",
            Integer,
            ForeignKey(parent.c.id, deferrable=True, initially="DEFERRED"),
            nullable=False,
        ),
    )
    async with database(database_url, child) as engine:  # (both tables: one MetaData)
        if database_url.startswith("sqlite"):
            _foreign_keys_on(engine)
            await engine.dispose()  # reconnect with the pragma
        async with engine.begin() as connection:
            await connection.execute(parent.insert(), [{"id": 1}, {"id": 2}])
        rows = [{"id": i, "parent_id": 1 + i % 2} for i in range(8)]
        rows[5] = {"id": 5, "parent_id": 99}  # no such parent: refused at COMMIT, not at the INSERT
        async with AsyncSqlalchemyWriteBatcher(child, engine, max_batch_size=8, max_queue_time=1) as batcher:
            results = await asyncio.wait_for(
                asyncio.gather(*(batcher.process(row) for row in rows), return_exceptions=True), 30
            )
        stored = await read_rows(engine, child)
        async with engine.begin() as connection:
            await connection.execute(text(f"DELETE FROM {child.name}"))
    assert [row["id"] for row in stored] == [0, 1, 2, 3, 4, 6, 7]
    assert results[:5] + results[6:] == [None] * 7
    assert isinstance(results[5], IntegrityError)


async def test_sqlite_in_memory_a_refused_commit_keeps_the_database() -> None:
    # An in-memory database lives as long as its one connection (a StaticPool): the refused COMMIT must be rolled
    # back on that connection, not end it.
    metadata = MetaData()
    parent = Table("parent", metadata, Column("id", Integer, primary_key=True))
    child = Table(
        "child",
        metadata,
        Column("id", Integer, primary_key=True),
        Column("parent_id", Integer, ForeignKey(parent.c.id, deferrable=True, initially="DEFERRED"), nullable=False),
    )
    async with database("sqlite+aiosqlite://", child) as engine:
        _foreign_keys_on(engine)
        async with engine.begin() as connection:
            await connection.exec_driver_sql("PRAGMA foreign_keys = ON")
            await connection.execute(parent.insert(), [{"id": 1}])
        async with AsyncSqlalchemyWriteBatcher(child, engine, max_batch_size=4, max_queue_time=1) as batcher:
            results = await asyncio.wait_for(
                asyncio.gather(
                    *(batcher.process({"id": i, "parent_id": 99 if i == 2 else 1}) for i in range(4)),
                    return_exceptions=True,
                ),
                30,
            )
        stored = await read_rows(engine, child)
        parents = await read_rows(engine, parent)
    assert parents == [{"id": 1}]  # the database is still there
    assert [row["id"] for row in stored] == [0, 1, 3]
    assert results[:2] + results[3:] == [None] * 3 and isinstance(results[2], IntegrityError)
