"""PostgreSQL killed (SIGKILL, with its backends) while the batcher writes: every caller gets an answer, the rows
committed are the rows reported written (plus, at most, rows whose COMMIT the kill cut off: their callers got
CommitUnknownError), and the batcher writes again once the server is back."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import DBAPIError

from async_batcher.sqlalchemy import AsyncSqlalchemyWriteBatcher, CommitUnknownError
from tests.crash import kill_mid_run
from tests.sqlalchemy.helpers import database, person_model, read_table
from tools.postgres import PostgresServer

pytestmark = pytest.mark.single_loop


@pytest.mark.usefixtures("postgres_binaries")
async def test_a_server_killed_mid_run() -> None:
    model = person_model()
    with PostgresServer() as server:
        async with database(server.url, model) as engine:
            batcher = AsyncSqlalchemyWriteBatcher(model, engine, max_batch_size=50, concurrency=4, max_queue_time=0)
            rows = [{"id": i, "name": f"n{i}", "age": i % 100} for i in range(4000)]
            outcomes = await kill_mid_run(server, batcher, rows, {"id": -1, "name": "late", "age": 1})
            server.start(server.last_port)  # crash recovery: what was committed is there
            written = {row["id"] for row, outcome in zip(rows, outcomes, strict=True) if outcome is None}
            unknown = {row["id"] for row, o in zip(rows, outcomes, strict=True) if isinstance(o, CommitUnknownError)}
            failed = [o for o in outcomes if o is not None and not isinstance(o, CommitUnknownError)]
            assert all(isinstance(error, DBAPIError | OSError) for error in failed), {type(e) for e in failed}
            stored = await read_table(engine, model)
            assert written <= set(stored), "a row reported written is not in the table"
            assert set(stored) - written <= unknown, "a row is in the table whose caller was told it failed"
            assert all(stored[i] == (f"n{i}", i % 100) for i in stored)
            # The same batcher, started again, writes through the same engine (its pool reconnects).
            async with batcher:
                again = await batcher.process_many([{"id": 10_000 + i, "name": "after", "age": 1} for i in range(30)])
            assert again == [None] * 30
            assert len(await read_table(engine, model)) == len(stored) + 30
