"""Deadlocks and serialization failures on PostgreSQL: the batcher's own batches take their row locks in key order
(so they never deadlock each other), and a transaction the server aborts for a conflict with another (SQLSTATE
40P01, 40001) is tried again, a bounded number of times, counted and logged. Every test reads the table back."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import Column, Integer, MetaData, Table, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from async_batcher.sqlalchemy import AsyncSqlalchemyWriteBatcher
from tests.sqlalchemy.helpers import blocked_on_a_lock, database, read_rows, until_sql
from tools.postgres import PostgresServer

pytestmark = [pytest.mark.single_loop, pytest.mark.timeout(120)]

APP = "deadlock-batcher"


def counters() -> Table:
    return Table(
        f"counters_{uuid.uuid4().hex[:10]}",
        MetaData(),
        Column("id", Integer, primary_key=True),
        Column("a", Integer),
        Column("b", Integer),
    )


def batcher_engine(postgres: PostgresServer) -> AsyncEngine:
    """An engine whose sessions are named, to be found, and detect a deadlock sooner than the other client's (so
    they are its victims). PostgreSQL checks once, ``deadlock_timeout`` after a wait began: 1 s leaves the test
    time to close the cycle after the batcher's transaction began to wait."""
    settings = {"deadlock_timeout": "1s", "application_name": APP}
    return create_async_engine(postgres.url, connect_args={"server_settings": settings})


@pytest.fixture
async def table(postgres: PostgresServer) -> AsyncIterator[Table]:
    table = counters()
    async with database(postgres.url, table) as engine:
        async with engine.begin() as connection:
            await connection.execute(table.insert(), [{"id": i, "a": 0, "b": 0} for i in range(20)])
        yield table


async def outside_transaction(engine: AsyncEngine) -> AsyncConnection:
    """A connection of another client, in a transaction, slow to detect deadlocks (so never their victim)."""
    connection = await engine.connect()
    await connection.begin()
    await connection.execute(text("SET LOCAL deadlock_timeout = '20s'"))
    return connection


async def test_concurrent_batches_in_opposite_orders_do_not_deadlock(postgres: PostgresServer, table: Table) -> None:
    engine = batcher_engine(postgres)
    try:
        async with engine.begin() as connection:  # each row's update takes a while: the two batches overlap
            await connection.execute(
                text(
                    f"CREATE FUNCTION slow_{table.name}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                    "PERFORM pg_sleep(0.005); RETURN NEW; END $$"
                )
            )
            await connection.execute(
                text(
                    f"CREATE TRIGGER slow BEFORE UPDATE ON {table.name} "
                    f"FOR EACH ROW EXECUTE FUNCTION slow_{table.name}()"
                )
            )
        batcher = AsyncSqlalchemyWriteBatcher(
            table, engine, operation="update", max_batch_size=20, max_queue_time=5, concurrency=2
        )
        forward = [{"id": i, "a": 1} for i in range(20)]
        backward = [{"id": i, "b": 2} for i in reversed(range(20))]
        async with batcher:
            results = await asyncio.wait_for(
                asyncio.gather(*(batcher.process(row) for row in forward + backward), return_exceptions=True), 60
            )
        stored = await read_rows(engine, table)
    finally:
        await engine.dispose()
    assert stored == [{"id": i, "a": 1, "b": 2} for i in range(20)]  # both batches wrote every row
    assert results == [None] * 40
    assert batcher.stats.batches == 2
    assert batcher.conflict_retries == 0  # no deadlock to retry: the locks were taken in one order


@pytest.mark.parametrize("retries", [3, 0])
async def test_a_batch_aborted_by_a_deadlock_is_tried_again(
    postgres: PostgresServer, table: Table, retries: int, caplog: pytest.LogCaptureFixture
) -> None:
    engine = batcher_engine(postgres)
    other_engine = create_async_engine(postgres.url)
    other = await outside_transaction(other_engine)
    try:
        await other.execute(text(f"UPDATE {table.name} SET a = -1 WHERE id = 10"))
        batcher = AsyncSqlalchemyWriteBatcher(
            table, engine, operation="update", max_batch_size=2, max_queue_time=5, max_conflict_retries=retries
        )
        async with batcher:
            calls = [asyncio.ensure_future(batcher.process({"id": i, "a": 7})) for i in (10, 5)]
            await until_sql(other_engine, blocked_on_a_lock(APP))  # it holds row 5 and waits for row 10
            with caplog.at_level(logging.WARNING, logger="async_batcher.sqlalchemy"):
                # The other client now waits for row 5: a deadlock, whose victim is the batcher's transaction.
                await asyncio.wait_for(other.execute(text(f"UPDATE {table.name} SET b = -1 WHERE id = 5")), 30)
                await other.commit()
                results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 30)
        stored = {row["id"]: (row["a"], row["b"]) for row in await read_rows(engine, table)}
    finally:
        await other.close()  # (a rollback, if it is still open: the table can be dropped)
        await engine.dispose()
        await other_engine.dispose()
    if retries:
        assert results == [None, None]
        assert (stored[5], stored[10]) == ((7, -1), (7, 0))  # the batcher's update on top of the other's
        assert batcher.conflict_retries == 1
        assert "deadlock" in caplog.text.lower() and "40P01" in caplog.text and "trying again" in caplog.text
    else:
        assert all(isinstance(r, DBAPIError) and getattr(r.orig, "sqlstate", None) == "40P01" for r in results)
        assert (stored[5], stored[10]) == ((0, -1), (-1, 0))  # only the other's
        assert batcher.conflict_retries == 0


async def test_a_batch_aborted_by_a_serialization_failure_is_tried_again(
    postgres: PostgresServer, table: Table
) -> None:
    base = batcher_engine(postgres)
    engine = base.execution_options(isolation_level="REPEATABLE READ")
    other_engine = create_async_engine(postgres.url)
    other = await outside_transaction(other_engine)
    try:
        await other.execute(text(f"UPDATE {table.name} SET a = -1 WHERE id = 3"))
        batcher = AsyncSqlalchemyWriteBatcher(table, engine, operation="update", max_batch_size=2, max_queue_time=5)
        async with batcher:
            calls = [asyncio.ensure_future(batcher.process({"id": i, "b": 9})) for i in (3, 4)]
            await until_sql(other_engine, blocked_on_a_lock(APP))
            # Its snapshot predates the other's commit: "could not serialize access due to concurrent update".
            await other.commit()
            results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 30)
        stored = {row["id"]: (row["a"], row["b"]) for row in await read_rows(engine, table)}
    finally:
        await other.close()
        await base.dispose()
        await other_engine.dispose()
    assert results == [None, None]
    assert (stored[3], stored[4]) == ((-1, 9), (0, 9))  # the other's write kept, the batcher's on top
    assert batcher.conflict_retries == 1
