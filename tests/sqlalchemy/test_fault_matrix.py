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
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Table, event, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import create_async_engine

from async_batcher import BatcherStoppedError, OutcomeUnknownError
from async_batcher.sqlalchemy import AsyncSqlalchemyWriteBatcher, CommitUnknownError
from tests.sqlalchemy.faults import Blocker, PostgresBlocker, SqliteBlocker, check_outcomes, fault_table, settled
from tests.sqlalchemy.helpers import POSTGRESQL, database, gather_bounded, kv_table, read_rows, until_sql
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
            (task,) = [t for t in asyncio.all_tasks() if t.get_coro().__qualname__ == "Runner.run_batch"]  # type: ignore[union-attr]
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


# ---------------------------------------------------------------------- stops at every step, locks held by others


@pytest.mark.timeout(180)
async def test_callers_cancelled_mid_bisection(postgres: Any) -> None:
    table = kv_table()
    async with database(postgres.url, table) as engine:
        other = await engine.connect()
        await other.begin()
        await other.execute(text(f"INSERT INTO {table.name} (id, v) VALUES (14, 'other')"))  # holds the 2nd half
        rows = [{"id": i, "v": "x" * 21 if i == 0 else f"v{i}"} for i in range(16)]  # row 0 too long: bisect
        batcher = AsyncSqlalchemyWriteBatcher(table, engine, max_batch_size=16, max_queue_time=1)
        try:
            async with batcher:
                calls = [asyncio.ensure_future(batcher.process(row)) for row in rows]
                await until_sql(engine, "SELECT count(*) > 0 FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
                for i in (1, 5, 9, 13):  # some of the half written, some of the half waiting
                    calls[i].cancel()
                await other.rollback()
                results = await gather_bounded(calls)
        finally:
            await other.close()
        stored = {row["id"] for row in await read_rows(engine, table)}
    assert [isinstance(results[i], asyncio.CancelledError) for i in (1, 5, 9, 13)] == [True] * 4
    kept = [i for i in range(16) if i not in (1, 5, 9, 13)]
    check_outcomes([rows[i] for i in kept], [results[i] for i in kept], stored)
    assert stored == set(range(1, 16))  # the cancelled callers' rows were written all the same: they left


class StopAt:
    """Stops ``batcher`` (force) as the ``step``-th statement, COMMIT or ROLLBACK of its engine goes out, while
    armed; ``seen`` lists the steps."""

    def __init__(self, engine: Any, step: int, batcher: AsyncSqlalchemyWriteBatcher) -> None:
        self.seen: list[str] = []
        self.armed = True
        self.step = step
        self.batcher = batcher
        sync_engine = engine.sync_engine
        event.listen(sync_engine, "before_cursor_execute", lambda *a: self._at(a[2].split()[0]))
        event.listen(sync_engine, "commit", lambda *a: self._at("COMMIT"))
        event.listen(sync_engine, "rollback", lambda *a: self._at("ROLLBACK"))

    def _at(self, name: str) -> None:
        if not self.armed:
            return
        self.seen.append(name)
        if len(self.seen) == self.step:
            asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(self.batcher.stop(force=True)))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("operation", ["insert", "update"])
async def test_a_forced_stop_at_every_step_of_a_bisected_batch(database_url: str, operation: str) -> None:
    rows = [{"id": i, "v": f"v{i}"} for i in range(8)]
    rows[5] = {"id": 2**63, "v": "a key beyond 64 bits"}  # the row's fault, on both: a bisection
    if operation == "update":
        rows[2] = {"id": 50, "v": "no such row"}  # (SQLite: the SELECT of the rows matched)
    steps = None
    step = 1
    answers: set[type] = set()
    while steps is None or step <= steps + 1:
        table = kv_table()
        async with database(database_url, table) as engine:
            async with engine.begin() as connection:
                await connection.execute(table.insert(), [{"id": i, "v": "old"} for i in range(10, 20)])
                if operation == "update":
                    await connection.execute(table.insert(), [{"id": i, "v": "old"} for i in range(8)])
            before = {row["id"]: row["v"] for row in await read_rows(engine, table)}
            batcher = AsyncSqlalchemyWriteBatcher(
                table,
                engine,
                operation=operation,
                max_batch_size=8,
                max_queue_time=0.01,  # type: ignore[arg-type]
            )
            stop_at = StopAt(engine, step, batcher)
            results = await gather_bounded([batcher.process(row) for row in rows])
            stop_at.armed = False
            await batcher.stop()
            await settled()
            after = {row["id"]: row["v"] for row in await read_rows(engine, table)}
            seen = stop_at.seen
            if step > len(seen):  # the stop came after the batch: its full run tells how many steps there are
                steps = len(seen)
                assert all(not isinstance(r, BatcherStoppedError | OutcomeUnknownError) for r in results)
            print("STEP", step, seen, [type(r).__name__ for r in results], flush=True)
            again = 10 if operation == "update" else 100
            async with batcher:  # it writes again, and nothing else changes
                assert await asyncio.wait_for(batcher.process({"id": again, "v": "again"}), 30) is None
            assert {row["id"]: row["v"] for row in await read_rows(engine, table)} == {**after, again: "again"}
        # "written": the row is there as given; failed (not unknown): it is as it was before
        written = {row["id"] for row in rows if row["id"] in after and after[row["id"]] == row["v"]}
        check_outcomes(rows, results, written)
        assert {k: v for k, v in after.items() if k not in written} == {
            k: v for k, v in before.items() if k not in written
        }
        kinds = {type(r) for r in results}
        answers |= kinds
        assert BatcherStoppedError not in kinds or not written, (step, seen, results, after)
        step += 1
    assert steps is not None and steps >= 6  # a bisection: several statements, commits and rollbacks
    assert answers >= {BatcherStoppedError, CommitUnknownError, type(None)}, answers  # each phase was hit


LOCK_HOLDER = textwrap.dedent(
    """
    import sqlite3, sys
    held = sqlite3.connect(sys.argv[1], isolation_level=None)
    held.execute("BEGIN IMMEDIATE")
    print("held", flush=True)
    sys.stdin.readline()  # until told
    held.execute("ROLLBACK")
    """
)


@pytest.mark.timeout(180)
async def test_sqlite_another_process_holding_the_write_lock(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    table = kv_table()
    async with database(f"sqlite+aiosqlite:///{path}", table, connect_args={"timeout": 0.3}) as engine:
        holder = await asyncio.create_subprocess_exec(
            sys.executable, "-c", LOCK_HOLDER, str(path), stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        try:
            assert holder.stdout is not None and holder.stdin is not None
            assert (await asyncio.wait_for(holder.stdout.readline(), 30)).strip() == b"held"
            async with AsyncSqlalchemyWriteBatcher(table, engine, max_batch_size=4, max_queue_time=1) as batcher:
                first = await gather_bounded([batcher.process({"id": i, "v": "a"}) for i in range(4)])
                holder.stdin.write(b"go\n")
                await holder.stdin.drain()
                assert await asyncio.wait_for(holder.wait(), 30) == 0
                second = await gather_bounded([batcher.process({"id": i, "v": "b"}) for i in range(2, 6)])
        finally:
            if holder.returncode is None:
                holder.kill()
                await asyncio.wait_for(holder.wait(), 30)
        stored = {row["id"]: row["v"] for row in await read_rows(engine, table)}
    assert all(isinstance(r, DBAPIError) and "locked" in str(r) for r in first), first
    assert second == [None] * 4
    assert stored == {2: "b", 3: "b", 4: "b", 5: "b"}  # nothing of the first batch, ever
    other = sqlite3.connect(path, timeout=0)
    try:
        other.execute("BEGIN EXCLUSIVE")
    finally:
        other.close()


@pytest.mark.timeout(180)
async def test_postgresql_a_lock_held_longer_than_lock_timeout(postgres: Any) -> None:
    table = kv_table()
    async with database(postgres.url, table, connect_args={"server_settings": {"lock_timeout": "200ms"}}) as engine:
        async with engine.begin() as connection:
            await connection.execute(table.insert(), [{"id": i, "v": "old"} for i in range(6)])
        other_engine = create_async_engine(postgres.url)
        other = await other_engine.connect()
        try:
            await other.begin()
            await other.execute(text(f"UPDATE {table.name} SET v = 'other' WHERE id = 3"))
            async with AsyncSqlalchemyWriteBatcher(
                table, engine, operation="update", max_batch_size=6, max_queue_time=1
            ) as batcher:
                first = await gather_bounded([batcher.process({"id": i, "v": "first"}) for i in range(6)])
                await other.commit()
                second = await gather_bounded([batcher.process({"id": i, "v": "second"}) for i in range(0, 6, 2)])
        finally:
            await other.close()
            await other_engine.dispose()
        stored = {row["id"]: row["v"] for row in await read_rows(engine, table)}
    # lock_not_available (55P03) is the batch's: every caller fails, nothing of the batch is written.
    assert all(isinstance(r, DBAPIError) and getattr(r.orig, "sqlstate", None) == "55P03" for r in first), first
    assert len({id(r) for r in first}) == 1
    assert second == [None] * 3
    assert stored == {0: "second", 1: "old", 2: "second", 3: "other", 4: "second", 5: "old"}
