"""The core's isolation (``on_batch_error=Isolate()``, issue 45) on a plain ``AsyncBatcher`` that writes its batch to
PostgreSQL in one statement and one transaction per call, with one row that violates a constraint: the server refuses
the whole statement; bisected, every other row is written, each half in its own transaction, and only the bad row's
caller gets the server's ``IntegrityError``, with its dead letter kept. (The SQL batcher,
:class:`~async_batcher.sqlalchemy.AsyncSqlalchemyWriteBatcher`, bisects on its own: see test_row_faults.py.)
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from sqlalchemy import CheckConstraint, Column, Integer, MetaData, String, Table, insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from async_batcher import AsyncBatcher
from async_batcher.failures import Isolate
from tests.sqlalchemy.helpers import database, read_rows
from tools.postgres import PostgresServer

pytestmark = pytest.mark.single_loop


class Insert(AsyncBatcher[dict[str, Any], None]):
    """``INSERT`` of the batch's rows, one statement in one transaction per call: all of them, or none."""

    def __init__(self, engine: AsyncEngine, table: Table, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.engine, self.table = engine, table
        self.statements = 0

    async def process_batch(self, batch: list[dict[str, Any]]) -> None:
        self.statements += 1
        async with self.engine.begin() as connection:
            await connection.execute(insert(self.table), batch)


async def test_one_constraint_violating_row_fails_alone(postgres: PostgresServer) -> None:
    table = Table(
        f"isolated_{uuid.uuid4().hex[:10]}",
        MetaData(),
        Column("id", Integer, primary_key=True),
        Column("name", String(20)),
        Column("age", Integer, CheckConstraint("age >= 0", name="age_not_negative")),
    )
    rows = [{"id": i, "name": f"n{i}", "age": -1 if i == 37 else i} for i in range(64)]
    dead: list[dict[str, Any]] = []
    async with database(postgres.url, table) as engine:
        batcher = Insert(
            engine,
            table,
            max_batch_size=64,
            max_queue_time=0.05,
            on_batch_error=Isolate(on_poison=lambda row, error: dead.append(row)),
        )
        async with batcher:
            results = await asyncio.gather(*(batcher.process(row) for row in rows), return_exceptions=True)
        written = await read_rows(engine, table)
    assert isinstance(results[37], IntegrityError) and "age_not_negative" in str(results[37])
    assert [r for i, r in enumerate(results) if i != 37] == [None] * 63
    assert written == [row for row in rows if row["id"] != 37]
    assert dead == [rows[37]]
    assert batcher.statements - 1 <= 2 * 6  # 2·log2(64) extra statements at most
