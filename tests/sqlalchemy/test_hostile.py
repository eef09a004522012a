"""The SQL writer attacked as a hostile user would: huge batches, malformed rows, hot keys from concurrent batches,
callers cancelled mid-bisection, a stop at every step of a batch, another process holding locks. Every wait is
bounded (a hang fails the test); every outcome is checked against the rows read back."""

from __future__ import annotations

import asyncio
import datetime
import enum
import random
import sqlite3
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, event, text
from sqlalchemy import Enum as SqlEnum
from sqlalchemy.dialects.postgresql import TIMESTAMP
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import create_async_engine

from async_batcher import BatcherStoppedError, OutcomeUnknownError
from async_batcher.sqlalchemy import AsyncSqlalchemyWriteBatcher, CommitUnknownError, RowNotFoundError
from tests.sqlalchemy.faults import check_outcomes, settled
from tests.sqlalchemy.helpers import database, read_rows, until_sql

pytestmark = [pytest.mark.single_loop, pytest.mark.timeout(180)]


def kv_table(*, composite: bool = False) -> Table:
    keys = [Column("id", Integer, primary_key=True)]
    if composite:
        keys.append(Column("part", String(10), primary_key=True))
    return Table(f"hostile_{uuid.uuid4().hex[:10]}", MetaData(), *keys, Column("v", String(20)))


async def gather_bounded(calls: list[Any], within: float = 60) -> list[object]:
    return list(await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), within))


async def test_huge_batches_of_updates_with_missing_keys(database_url: str) -> None:
    table = kv_table()
    n = 20_000  # SQLite: more keys than one statement's bind parameters (the SELECT of the missing goes in two)
    async with database(database_url, table) as engine:
        async with engine.begin() as connection:
            await connection.execute(table.insert(), [{"id": i, "v": "old"} for i in range(0, n, 2)])
        updater = AsyncSqlalchemyWriteBatcher(table, engine, operation="update", max_batch_size=-1, max_queue_time=1)
        async with updater:
            results = await updater.process_many([{"id": i, "v": "new"} for i in range(n)], return_exceptions=True)
        stored = {row["id"]: row["v"] for row in await read_rows(engine, table)}
    assert stored == dict.fromkeys(range(0, n, 2), "new")
    assert results[0::2] == [None] * (n // 2)
    assert all(isinstance(r, RowNotFoundError) for r in results[1::2])
    assert updater.stats.batches == 1


async def test_an_update_by_a_composite_key(database_url: str) -> None:
    table = kv_table(composite=True)
    async with database(database_url, table) as engine:
        async with engine.begin() as connection:
            await connection.execute(
                table.insert(), [{"id": 1, "part": "a", "v": "old"}, {"id": 1, "part": "b", "v": "old"}]
            )
        async with AsyncSqlalchemyWriteBatcher(table, engine, operation="update", max_queue_time=0.05) as updater:
            results = await gather_bounded(
                [
                    updater.process({"id": 1, "part": "b", "v": "new"}),
                    updater.process({"id": 1, "part": "c", "v": "new"}),
                    updater.process({"id": 2, "part": "a", "v": "new"}),
                ]
            )
        stored = await read_rows(engine, table)
    assert results[0] is None
    assert [r.key for r in results[1:]] == [{"id": 1, "part": "c"}, {"id": 2, "part": "a"}]  # type: ignore[union-attr]
    assert stored == [{"id": 1, "part": "a", "v": "old"}, {"id": 1, "part": "b", "v": "new"}]


class ExplodingMapping(Mapping[str, Any]):
    """A mapping that fails when read: the batcher must fail its caller only."""

    def __getitem__(self, key: str) -> Any:
        raise RuntimeError("boom")

    def __iter__(self) -> Any:
        raise RuntimeError("boom")

    def __len__(self) -> int:
        return 1


@pytest.mark.parametrize("operation", ["insert", "update", "upsert"])
async def test_malformed_rows_fail_alone(database_url: str, operation: str) -> None:
    table = kv_table()
    bad: dict[int, Any] = {
        1: None,
        2: "id=2",
        3: [("id", 3)],
        4: {"id": 4, 5: "int key"},
        5: {"id": 5, "v": {"nested": "dict"}},
        6: {"id": 6, "v": ["a", "list"]},
        7: {"id": [7], "v": "unhashable key"},
        8: {"id": "eight", "v": "a string key for an int column"},
        9: ExplodingMapping(),
        10: {"id": 10, "v": b"\xff\xfe bytes"},
        11: {"id": 11, "v": float("nan")},
        12: {"id": 2**70, "v": "key beyond 64 bits"},
        13: {"id": None, "v": "a null key"},
    }
    rows = [bad.get(i, {"id": i, "v": f"v{i}"}) for i in range(20)]
    options: dict[str, Any] = {"operation": "update"} if operation == "update" else {}
    if operation == "upsert":
        options = {"on_conflict": "update", "returning": [table.c.id]}
    async with database(database_url, table) as engine:
        if operation == "update":
            async with engine.begin() as connection:
                await connection.execute(table.insert(), [{"id": i, "v": "old"} for i in range(20)])
        async with AsyncSqlalchemyWriteBatcher(table, engine, max_batch_size=20, max_queue_time=1, **options) as b:
            results = await gather_bounded([b.process(row) for row in rows])
        stored = {row["id"]: row["v"] for row in await read_rows(engine, table)}
    good = [i for i in range(20) if i not in bad]
    for i in good:
        assert results[i] in (None, (i,)), (i, results[i])
        assert stored[i] == f"v{i}"
    for i in (1, 2, 3, 9):
        assert isinstance(results[i], TypeError | RuntimeError), (i, results[i])
    assert isinstance(results[4], ValueError)
    stored_values = set(stored.values())
    for i, row in bad.items():  # told "written": its row is there, as given; told "failed": it is not (or unchanged)
        if not isinstance(row, dict) or not isinstance(row.get("id", ""), int | None):
            assert isinstance(results[i], BaseException), (i, results[i])
            continue
        written = not isinstance(results[i], BaseException)
        if row["id"] is None:  # (SQLite numbers a NULL integer key itself; PostgreSQL refuses it)
            assert (row["v"] in stored_values) == written, (i, results[i])
        elif operation == "update":
            assert (stored.get(row["id"], "old") != "old") == written, (i, results[i], stored.get(row["id"]))
        else:
            assert (row["id"] in stored) == written, (i, results[i])
        if written and isinstance(row["v"], str) and row["id"] is not None:
            assert stored[row["id"]] == row["v"]


async def test_hot_keys_from_concurrent_batches_never_fail(database_url: str) -> None:
    table = kv_table()
    keys = 20
    async with database(database_url, table, pool_size=8) as engine:
        async with engine.begin() as connection:
            await connection.execute(table.insert(), [{"id": i, "v": "0"} for i in range(keys)])
        concurrency = 4 if database_url.startswith("postgresql") else 1
        shuffle = random.Random(26)
        updates = [{"id": shuffle.randrange(keys), "v": str(n)} for n in range(1000)]
        upserts = [{"id": shuffle.randrange(keys * 2), "v": f"u{n}"} for n in range(1000)]
        updater = AsyncSqlalchemyWriteBatcher(
            table, engine, operation="update", max_batch_size=50, max_queue_time=0.01, concurrency=concurrency
        )
        upserter = AsyncSqlalchemyWriteBatcher(
            table, engine, on_conflict="update", max_batch_size=50, max_queue_time=0.01, concurrency=concurrency
        )
        async with updater, upserter:
            results = await gather_bounded(
                [updater.process(row) for row in updates] + [upserter.process(row) for row in upserts], within=120
            )
        stored = {row["id"]: row["v"] for row in await read_rows(engine, table)}
    assert results == [None] * 2000, {type(r).__name__ for r in results}
    assert set(stored) == set(range(keys)) | {row["id"] for row in upserts}
    given = {}
    for row in updates + upserts:
        given.setdefault(row["id"], set()).add(row["v"])
    assert all(stored[key] in given.get(key, {"0"}) | {"0"} for key in stored)


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


async def test_sqlite_an_update_matches_keys_as_sqlite_compares_them(tmp_path: Path) -> None:
    # A key given as "4" for an INTEGER key, or "ABC" for a NOCASE one, names the row ("WHERE id = '4'"): its
    # caller must hear "written", not "not found" (which a comparison in Python would say).
    table = Table(
        f"nocase_{uuid.uuid4().hex[:10]}",
        MetaData(),
        Column("k", String(10, collation="NOCASE"), primary_key=True),
        Column("v", String(10)),
    )
    numbered = kv_table()
    async with database(f"sqlite+aiosqlite:///{tmp_path / 'affinity.db'}", table) as engine:
        async with engine.begin() as connection:
            await connection.run_sync(numbered.create, checkfirst=False)
            await connection.execute(table.insert(), [{"k": "abc", "v": "old"}, {"k": "def", "v": "old"}])
            await connection.execute(numbered.insert(), [{"id": 4, "v": "old"}])
        async with (
            AsyncSqlalchemyWriteBatcher(table, engine, operation="update", max_queue_time=0.05) as by_text,
            AsyncSqlalchemyWriteBatcher(numbered, engine, operation="update", max_queue_time=0.05) as by_number,
        ):
            results = await gather_bounded(
                [
                    by_text.process({"k": "ABC", "v": "new"}),
                    by_text.process({"k": "xyz", "v": "new"}),  # missing: the server is asked which matched
                    by_number.process({"id": "4", "v": "new"}),
                    by_number.process({"id": "5", "v": "new"}),
                ]
            )
        texts = {row["k"]: row["v"] for row in await read_rows(engine, table)}
        numbers = {row["id"]: row["v"] for row in await read_rows(engine, numbered)}
    assert texts == {"abc": "new", "def": "old"} and numbers == {4: "new"}
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], RowNotFoundError) and isinstance(results[3], RowNotFoundError)


async def test_an_update_by_a_string_key_longer_than_its_column(database_url: str) -> None:
    # "abcdefg" names no row of a VARCHAR(5) key, though cast to VARCHAR(5) it would be "abcde", which exists.
    table = Table(
        f"short_{uuid.uuid4().hex[:10]}", MetaData(), Column("k", String(5), primary_key=True), Column("v", String(10))
    )
    async with database(database_url, table) as engine:
        async with engine.begin() as connection:
            await connection.execute(table.insert(), [{"k": "abcde", "v": "old"}, {"k": "xy", "v": "old"}])
        async with AsyncSqlalchemyWriteBatcher(table, engine, operation="update", max_queue_time=0.05) as updater:
            results = await gather_bounded(
                [updater.process({"k": "abcdefg", "v": "new"}), updater.process({"k": "xy", "v": "new"})]
            )
        stored = {row["k"]: row["v"] for row in await read_rows(engine, table)}
    assert stored == {"abcde": "old", "xy": "new"}
    assert isinstance(results[0], RowNotFoundError) and results[1] is None


class Color(enum.Enum):
    RED = "r"
    BLUE = "b"


async def test_postgresql_an_update_by_keys_whose_type_has_a_precision_or_a_python_form(postgres: Any) -> None:
    # A TIMESTAMP(3) key given with microseconds names no row (the UPDATE compares it as given), though rounded to
    # milliseconds it would; an Enum key is given as the Python enum (SQLAlchemy converts it, in arrays too).
    metadata = MetaData()
    stamped = Table(
        f"stamped_{uuid.uuid4().hex[:10]}",
        metadata,
        Column("at", TIMESTAMP(precision=3), primary_key=True),
        Column("v", String(10)),
    )
    colored = Table(
        f"colored_{uuid.uuid4().hex[:10]}",
        metadata,
        Column("color", SqlEnum(Color, name=f"color_{uuid.uuid4().hex[:6]}"), primary_key=True),
        Column("v", String(10)),
    )
    at = datetime.datetime(2024, 1, 1, 0, 0, 0, 123000)
    async with database(postgres.url, stamped) as engine:  # (both tables: one MetaData)
        async with engine.begin() as connection:
            await connection.execute(stamped.insert(), [{"at": at, "v": "old"}])
            await connection.execute(colored.insert(), [{"color": Color.RED, "v": "old"}])
        async with (
            AsyncSqlalchemyWriteBatcher(stamped, engine, operation="update", max_queue_time=0.05) as by_time,
            AsyncSqlalchemyWriteBatcher(colored, engine, operation="update", max_queue_time=0.05) as by_color,
        ):
            results = await gather_bounded(
                [
                    by_time.process({"at": at.replace(microsecond=123400), "v": "new"}),
                    by_color.process({"color": Color.RED, "v": "new"}),
                    by_color.process({"color": Color.BLUE, "v": "new"}),
                ]
            )
        stamps = {row["at"]: row["v"] for row in await read_rows(engine, stamped)}
        colors = {row["color"]: row["v"] for row in await read_rows(engine, colored)}
    assert stamps == {at: "old"} and colors == {Color.RED: "new"}
    assert isinstance(results[0], RowNotFoundError), results[0]
    assert results[1] is None and isinstance(results[2], RowNotFoundError)
