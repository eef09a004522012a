"""The SQL writer's fault matrix: each fault strikes at a known phase of a batch (its statement, or its COMMIT,
held up by another client, never by sleeping), and each cell reads the table back after: no caller was told
"written" for a row that is not there, none "failed" for one that is, and those whose row may be either were told
"unknown" (:class:`~async_batcher.OutcomeUnknownError`). No transaction or lock is left behind, and the batcher
writes again after.

| fault | statement in flight | COMMIT in flight |
|---|---|---|
| ``stop(force=True)`` (PostgreSQL, SQLite) | ``BatcherStoppedError``, nothing written | ``CommitUnknownError`` |
| ``stop(timeout=...)`` expired (both) | ``BatcherStoppedError``, nothing written | ``CommitUnknownError`` |
| the batch's task cancelled (the loop shutting down; both) | ``BatcherStoppedError``, nothing written | unknown |
| ``pg_terminate_backend`` | the driver's error, nothing written | ``CommitUnknownError`` |
| the server killed (SIGKILL), restarted | the driver's error, nothing written | ``CommitUnknownError`` |
| COMMIT refused (a deferred trigger) | | the driver's error, nothing written, then or later |

Elsewhere: a forced stop after half a bisected batch committed (here); a server restarted between batches (here);
a COMMIT SQLite refuses (``test_failed_commit.py``); deadlock and serialization failure, tried again and given up
(``test_deadlocks.py``); the server killed at a random moment of a long run (``test_server_killed.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Table, text
from sqlalchemy.exc import DBAPIError

from async_batcher import BatcherStoppedError, OutcomeUnknownError
from async_batcher.sqlalchemy import AsyncSqlalchemyWriteBatcher, CommitUnknownError
from tests.sqlalchemy.faults import Blocker, PostgresBlocker, SqliteBlocker, check_outcomes, fault_table, settled
from tests.sqlalchemy.helpers import POSTGRESQL
from tools.postgres import PostgresServer

pytestmark = [pytest.mark.single_loop, pytest.mark.timeout(120)]

ROWS = [{"id": i, "v": f"v{i}"} for i in range(4)]
# The rows of a test are submitted in one loop iteration: one batch (max_batch_size=len(rows)) goes at once.
QUICK = 0.05


@pytest.fixture(params=[POSTGRESQL, "sqlite"])
async def blocker(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Blocker]:
    made: Blocker
    if request.param == "postgresql":
        server: PostgresServer = request.getfixturevalue("postgres")
        made = PostgresBlocker(server.url)
    else:
        made = SqliteBlocker(tmp_path / "faults.db")
    try:
        yield made
    finally:
        await made.release()
        await made.close()


@pytest.fixture
async def pg(postgres: PostgresServer) -> AsyncIterator[PostgresBlocker]:
    made = PostgresBlocker(postgres.url)
    try:
        yield made
    finally:
        await made.release()
        await made.close()


@pytest.fixture(scope="module")
def killable(postgres_binaries: Path) -> Iterator[PostgresServer]:
    """A server of its own, to kill and restart."""
    with PostgresServer() as server:
        yield server


def start_batch(batcher: AsyncSqlalchemyWriteBatcher, rows: list[dict[str, Any]]) -> list[asyncio.Task[Any]]:
    return [asyncio.ensure_future(batcher.process(row)) for row in rows]


async def outcomes_of(calls: list[asyncio.Task[Any]]) -> list[object]:
    return list(await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 30))


async def after(blocker: Blocker, table: Table, batcher: AsyncSqlalchemyWriteBatcher) -> set[int]:
    """Let go, let the cut-off batch clean up, check that nothing is left locked, write one more row through the
    same batcher, and return the ids in the table (that row's excepted)."""
    await blocker.release()
    await settled()
    await blocker.assert_unlocked(table)
    async with batcher:
        assert await asyncio.wait_for(batcher.process({"id": 100, "v": "after"}), 30) is None
    stored = await blocker.stored(table)
    assert 100 in stored
    return stored - {100}


@pytest.mark.parametrize("stop", ["force", "timeout"])
async def test_a_stop_while_the_statement_runs_writes_nothing(blocker: Blocker, stop: str) -> None:
    table = fault_table()
    await blocker.prepare(table)
    engine = blocker.batcher_engine()
    try:
        batcher = AsyncSqlalchemyWriteBatcher(table, engine, max_batch_size=4, max_queue_time=QUICK)
        await blocker.hold_statement(table, row_id=2)
        calls = start_batch(batcher, ROWS)
        await blocker.wait_statement()
        await (batcher.stop(force=True) if stop == "force" else batcher.stop(timeout=0.2))
        outcomes = await outcomes_of(calls)
        stored = await after(blocker, table, batcher)
    finally:
        await engine.dispose()
    assert all(type(o) is BatcherStoppedError for o in outcomes), outcomes  # certainly not committed: a plain stop
    assert stored == set()
    check_outcomes(ROWS, outcomes, stored)


@pytest.mark.parametrize("stop", ["force", "timeout"])
async def test_a_stop_while_the_commit_runs_says_unknown(blocker: Blocker, stop: str) -> None:
    table = fault_table()
    await blocker.prepare(table)
    engine = blocker.batcher_engine()
    try:
        batcher = AsyncSqlalchemyWriteBatcher(table, engine, max_batch_size=4, max_queue_time=QUICK)
        await blocker.hold_commit(table)
        calls = start_batch(batcher, ROWS)
        await blocker.wait_commit()
        await (batcher.stop(force=True) if stop == "force" else batcher.stop(timeout=0.2))
        outcomes = await outcomes_of(calls)
        stored = await after(blocker, table, batcher)
    finally:
        await engine.dispose()
    assert all(type(o) is CommitUnknownError for o in outcomes), outcomes
    assert isinstance(outcomes[0], OutcomeUnknownError) and not isinstance(outcomes[0], BatcherStoppedError)
    assert isinstance(outcomes[0].__cause__, BatcherStoppedError)
    assert stored in (set(), {0, 1, 2, 3})  # one transaction: all or nothing
    if isinstance(blocker, SqliteBlocker):
        # The COMMIT went on in aiosqlite's thread and succeeded once the reader let go: the callers were cut
        # off from rows that *are* written. A plain "stopped" would have had them written twice.
        assert stored == {0, 1, 2, 3}
    check_outcomes(ROWS, outcomes, stored)


@pytest.mark.parametrize("phase", ["statement", "commit"])
async def test_the_batch_task_cancelled_as_by_the_loop_shutting_down(blocker: Blocker, phase: str) -> None:
    # When the event loop shuts down, the batch's task is cancelled first and the hook is asked after (unlike a
    # stop, which asks first): what the batch did must still be known then.
    table = fault_table()
    await blocker.prepare(table)
    engine = blocker.batcher_engine()
    try:
        batcher = AsyncSqlalchemyWriteBatcher(table, engine, max_batch_size=4, max_queue_time=QUICK)
        async with batcher:
            if phase == "statement":
                await blocker.hold_statement(table, row_id=2)
                calls = start_batch(batcher, ROWS)
                await blocker.wait_statement()
            else:
                await blocker.hold_commit(table)
                calls = start_batch(batcher, ROWS)
                await blocker.wait_commit()
            (task,) = [t for t in asyncio.all_tasks() if t.get_coro().__qualname__ == "run_batch"]  # type: ignore[union-attr]
            task.cancel()
            # The callers are answered once process_batch has unwound, its connection cleaned up: after the
            # statement or COMMIT under way ends (SQLite's runs on in aiosqlite's thread).
            await blocker.release()
            outcomes = await outcomes_of(calls)
        stored = await after(blocker, table, batcher)
    finally:
        await engine.dispose()
    if phase == "statement":
        assert all(type(o) is BatcherStoppedError for o in outcomes), outcomes
        assert stored == set()
    else:
        assert all(type(o) is CommitUnknownError for o in outcomes), outcomes
        assert stored in (set(), {0, 1, 2, 3})
    check_outcomes(ROWS, outcomes, stored)


async def test_a_forced_stop_after_part_of_a_bisected_batch_committed_says_unknown(pg: PostgresBlocker) -> None:
    table = fault_table()
    await pg.prepare(table)
    engine = pg.batcher_engine()
    rows = [{"id": i, "v": "x" * 21 if i == 0 else f"v{i}"} for i in range(8)]  # row 0: too long, a row's fault
    try:
        batcher = AsyncSqlalchemyWriteBatcher(table, engine, max_batch_size=8, max_queue_time=QUICK)
        await pg.hold_statement(table, row_id=6)  # the second half waits for it, after the first half committed
        calls = start_batch(batcher, rows)
        await pg.wait_statement()
        await batcher.stop(force=True)
        outcomes = await outcomes_of(calls)
        stored = await after(pg, table, batcher)
    finally:
        await engine.dispose()
    assert stored == {1, 2, 3}
    assert all(type(o) is CommitUnknownError for o in outcomes), outcomes  # some committed: one answer for all
    check_outcomes(rows, outcomes, stored)


async def test_a_connection_terminated_during_the_statement(pg: PostgresBlocker) -> None:
    table = fault_table()
    await pg.prepare(table)
    engine = pg.batcher_engine()
    try:
        batcher = AsyncSqlalchemyWriteBatcher(table, engine, max_batch_size=4, max_queue_time=QUICK)
        async with batcher:
            await pg.hold_statement(table, row_id=2)
            calls = start_batch(batcher, ROWS)
            await pg.wait_statement()
            await pg.terminate_batcher()
            outcomes = await outcomes_of(calls)
        stored = await after(pg, table, batcher)
    finally:
        await engine.dispose()
    assert all(isinstance(o, DBAPIError) and not isinstance(o, OutcomeUnknownError) for o in outcomes), outcomes
    assert stored == set()
    check_outcomes(ROWS, outcomes, stored)


async def test_a_connection_terminated_during_the_commit(pg: PostgresBlocker) -> None:
    table = fault_table()
    await pg.prepare(table)
    engine = pg.batcher_engine()
    try:
        batcher = AsyncSqlalchemyWriteBatcher(table, engine, max_batch_size=4, max_queue_time=QUICK)
        async with batcher:
            await pg.hold_commit(table)
            calls = start_batch(batcher, ROWS)
            await pg.wait_commit()
            await pg.terminate_batcher()
            outcomes = await outcomes_of(calls)
        stored = await after(pg, table, batcher)
    finally:
        await engine.dispose()
    assert all(type(o) is CommitUnknownError for o in outcomes), outcomes
    assert isinstance(outcomes[0].__cause__, DBAPIError)
    assert stored in (set(), {0, 1, 2, 3})
    check_outcomes(ROWS, outcomes, stored)


async def test_a_commit_refused_writes_nothing_then_or_later(pg: PostgresBlocker) -> None:
    table = fault_table()
    await pg.prepare(table)
    async with pg.engine.begin() as connection:  # a deferred check that refuses the whole transaction at COMMIT
        await connection.execute(
            text(
                f"CREATE FUNCTION refuse_{table.name}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                "IF current_setting('app.refuse', true) IS DISTINCT FROM 'no' "
                "THEN RAISE EXCEPTION 'refused' USING ERRCODE = 'object_not_in_prerequisite_state'; END IF; "
                "RETURN NULL; END $$"
            )
        )
        await connection.execute(
            text(
                f"CREATE CONSTRAINT TRIGGER refuse AFTER INSERT ON {table.name} DEFERRABLE INITIALLY DEFERRED "
                f"FOR EACH ROW EXECUTE FUNCTION refuse_{table.name}()"
            )
        )
    engine = pg.batcher_engine()
    try:
        async with AsyncSqlalchemyWriteBatcher(table, engine, max_batch_size=4, max_queue_time=QUICK) as batcher:
            outcomes = await outcomes_of(start_batch(batcher, ROWS))
        stored = await pg.stored(table)
        await pg.assert_unlocked(table)
        accepting = pg.batcher_engine({"app.refuse": "no"})
        try:
            async with AsyncSqlalchemyWriteBatcher(table, accepting, max_queue_time=0) as batcher:
                assert await batcher.process({"id": 100, "v": "after"}) is None
        finally:
            await accepting.dispose()
    finally:
        await engine.dispose()
    assert all(isinstance(o, DBAPIError) and "refused" in str(o) for o in outcomes), outcomes
    assert len({id(o) for o in outcomes}) == 1  # the batch's error (SQLSTATE 55000), not bisected
    assert stored == set()
    assert await pg.stored(table) == {100}
    check_outcomes(ROWS, outcomes, stored)


@pytest.mark.parametrize("phase", ["statement", "commit"])
async def test_the_server_killed_then_restarted(killable: PostgresServer, phase: str) -> None:
    blocker = PostgresBlocker(killable.url)
    table = fault_table()
    engine = blocker.batcher_engine()
    try:
        await blocker.prepare(table)
        batcher = AsyncSqlalchemyWriteBatcher(table, engine, max_batch_size=4, max_queue_time=QUICK)
        async with batcher:
            if phase == "statement":
                await blocker.hold_statement(table, row_id=2)
                calls = start_batch(batcher, ROWS)
                await blocker.wait_statement()
            else:
                await blocker.hold_commit(table)
                calls = start_batch(batcher, ROWS)
                await blocker.wait_commit()
            killable.kill()  # SIGKILL, its backends with it: a crash
            outcomes = await outcomes_of(calls)
            await blocker.engine.dispose()  # (its connections died with the server)
            await blocker.forget()
            killable.start(killable.last_port)  # crash recovery: what was committed is there
            await settled()
            stored = await blocker.stored(table)
            # The same batcher writes again through the same engine (its pool reconnects).
            assert await asyncio.wait_for(batcher.process({"id": 100, "v": "after"}), 30) is None
        assert await blocker.stored(table) == stored | {100}
    finally:
        await engine.dispose()
        await blocker.close()
    if phase == "statement":
        assert all(isinstance(o, DBAPIError) and not isinstance(o, OutcomeUnknownError) for o in outcomes)
        assert stored == set()
    else:
        assert all(type(o) is CommitUnknownError for o in outcomes), outcomes
        assert stored in (set(), {0, 1, 2, 3})
    check_outcomes(ROWS, outcomes, stored)


@pytest.mark.parametrize("pre_ping", [False, True])
async def test_the_server_restarted_between_batches(killable: PostgresServer, pre_ping: bool) -> None:
    blocker = PostgresBlocker(killable.url)
    table = fault_table()
    engine = blocker.batcher_engine(pool_pre_ping=pre_ping)
    try:
        await blocker.prepare(table)
        async with AsyncSqlalchemyWriteBatcher(table, engine, max_batch_size=4, max_queue_time=QUICK) as batcher:
            assert await outcomes_of(start_batch(batcher, ROWS)) == [None] * 4
            await blocker.engine.dispose()
            killable.stop()  # a clean shutdown: the pooled connections are closed by the server
            killable.start(killable.last_port)
            second = [{"id": i, "v": "second"} for i in range(10, 14)]
            outcomes = await outcomes_of(start_batch(batcher, second))
            third = await outcomes_of(start_batch(batcher, [{"id": 20, "v": "third"}]))
        stored = await blocker.stored(table)
    finally:
        await engine.dispose()
        await blocker.close()
    assert third == [None]
    if pre_ping:  # the pool tests each connection before use: the batch goes through
        assert outcomes == [None] * 4
    else:  # the batch meets a connection the server closed: it fails, nothing of it written
        assert all(isinstance(o, DBAPIError) for o in outcomes), outcomes
    check_outcomes([*ROWS, *second, {"id": 20}], [None] * 4 + outcomes + third, stored)
