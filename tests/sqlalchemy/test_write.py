"""AsyncSqlalchemyWriteBatcher against a real PostgreSQL (asyncpg) and SQLite (aiosqlite): every test reads the
table back and counts its rows."""

from __future__ import annotations

import asyncio
import datetime
import enum
import pickle
import random
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, select, text
from sqlalchemy import Enum as SqlEnum
from sqlalchemy.dialects.postgresql import TIMESTAMP
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import create_async_engine

from async_batcher.sqlalchemy import AsyncSqlalchemyWriteBatcher, RowNotFoundError
from async_batcher.sqlalchemy._statements import dialect_insert
from tests.sqlalchemy.helpers import (
    StatementLog,
    database,
    gather_bounded,
    kv_table,
    person_model,
    read_rows,
    read_table,
)

pytestmark = pytest.mark.single_loop


async def test_0_2_2_usage_insert_with_returning_then_update(database_url: str) -> None:
    model = person_model()
    async with database(database_url, model) as engine:
        inserter = AsyncSqlalchemyWriteBatcher(
            model=model, async_engine=engine, operation="insert", returning=[model.name, model.age]
        )
        updater = AsyncSqlalchemyWriteBatcher(model, engine, "update")  # 0.2.2's positional form
        returned = await asyncio.gather(
            *(inserter.process({"id": i, "name": f"Name {i}", "age": i}) for i in range(10))
        )
        assert returned == [(f"Name {i}", i) for i in range(10)]
        async with inserter.async_session_maker() as session:  # 0.2.2's read-back
            assert len((await session.scalars(select(model))).all()) == 10
        assert await asyncio.gather(*(updater.process({"id": i, "age": i * 2}) for i in range(10))) == [None] * 10
        assert await read_table(engine, model) == {i: (f"Name {i}", i * 2) for i in range(10)}
        await inserter.stop()
        await updater.stop()


async def test_one_insert_statement_and_one_transaction_per_batch(database_url: str) -> None:
    model = person_model()
    async with database(database_url, model) as engine:
        log = StatementLog(engine)
        async with AsyncSqlalchemyWriteBatcher(model, engine, max_batch_size=250, max_queue_time=5) as batcher:
            results = await asyncio.gather(
                *(batcher.process({"id": i, "name": f"n{i}", "age": i % 90}) for i in range(1000))
            )
        assert results == [None] * 1000
        assert log.count("INSERT") == 4  # one executemany per batch of 250
        assert batcher.stats.batches == 4
        assert await read_table(engine, model) == {i: (f"n{i}", i % 90) for i in range(1000)}


async def test_each_caller_gets_its_own_returned_row(database_url: str) -> None:
    model = person_model(generated_ids=True)
    async with database(database_url, model) as engine:
        batcher = AsyncSqlalchemyWriteBatcher(model, engine, returning=[model.id, model.name], max_batch_size=50)
        async with batcher:
            rows = await asyncio.gather(*(batcher.process({"name": f"n{i}", "age": i}) for i in range(120)))
        assert [row.name for row in rows] == [f"n{i}" for i in range(120)]
        stored = await read_table(engine, model)
    assert len(stored) == 120
    assert {row.id: (row.name, int(row.name[1:])) for row in rows} == stored


async def test_a_bad_row_fails_only_its_caller(database_url: str) -> None:
    model = person_model()
    bad = {
        3: {"id": 0, "name": "again", "age": 1},  # duplicate primary key (row 0 of this batch)
        7: {"id": 7, "name": "negative", "age": -1},  # check constraint
        11: {"id": 11, "name": None, "age": 1},  # NOT NULL
        15: {"id": 15, "name": "x", "age": 1, "height": 2},  # not a column: refused before any SQL
        19: ["not", "a", "dict"],
    }
    if database_url.startswith("postgresql"):
        bad[23] = {"id": 23, "name": "y" * 31, "age": 1}  # too long for VARCHAR(30) (SQLite does not check)
        bad[27] = {"id": 27, "name": "z", "age": "old"}  # not an integer (SQLite stores it)
    rows: list[Any] = [bad.get(i, {"id": i, "name": f"n{i}", "age": i}) for i in range(30)]
    async with database(database_url, model) as engine:
        log = StatementLog(engine)
        batcher = AsyncSqlalchemyWriteBatcher(model, engine, returning=model.id, max_batch_size=30)
        async with batcher:
            results = await asyncio.gather(*(batcher.process(row) for row in rows), return_exceptions=True)
        stored = await read_table(engine, model)
    assert isinstance(results[3], IntegrityError)
    assert isinstance(results[7], IntegrityError)
    assert isinstance(results[11], IntegrityError)
    assert isinstance(results[15], ValueError) and "has no column(s) ['height']" in str(results[15])
    assert isinstance(results[19], TypeError) and "a row must be a dict" in str(results[19])
    for index in set(bad) - {3, 7, 11, 15, 19}:
        assert isinstance(results[index], DBAPIError), (index, results[index])
    good = [i for i in range(30) if i not in bad]
    assert [results[i] for i in good] == [(i,) for i in good]  # each caller's own row
    assert stored == {i: (f"n{i}", i) for i in good}
    assert log.count("INSERT") < 30  # bisection: far fewer statements than one per row


async def test_update_sets_the_given_columns_of_each_row(database_url: str) -> None:
    model = person_model()
    async with database(database_url, model) as engine:
        async with AsyncSqlalchemyWriteBatcher(model, engine) as inserter:
            await inserter.process_many([{"id": i, "name": f"n{i}", "age": i} for i in range(6)])
        updater = AsyncSqlalchemyWriteBatcher(model, engine, operation="update", max_batch_size=20)
        updates: list[dict[str, Any]] = [
            {"id": 0, "age": 50},
            {"id": 1, "name": "renamed"},
            {"id": 0, "age": 51},  # the same row twice: in order, the last one stays
            {"id": 99, "age": 1},  # no such row: nothing changes, nothing is created, its caller is told
            {"name": "no key", "age": 2},
            {"id": 2},
            {"id": 3, "age": -5},
        ]
        async with updater:
            results = await asyncio.gather(*(updater.process(u) for u in updates), return_exceptions=True)
        stored = await read_table(engine, model)
    assert results[:3] == [None] * 3
    assert isinstance(results[3], RowNotFoundError) and results[3].key == {"id": 99}
    assert "no row of table" in str(results[3]) and "id=99" in str(results[3])
    assert isinstance(results[4], ValueError) and "lacks ['id']" in str(results[4])
    assert isinstance(results[5], ValueError) and "at least one column to set" in str(results[5])
    assert isinstance(results[6], IntegrityError)
    assert stored == {0: ("n0", 51), 1: ("renamed", 1), 2: ("n2", 2), 3: ("n3", 3), 4: ("n4", 4), 5: ("n5", 5)}


async def test_upsert_inserts_or_updates_and_returns_each_callers_row(database_url: str) -> None:
    model = person_model()
    async with database(database_url, model) as engine:
        async with AsyncSqlalchemyWriteBatcher(model, engine) as inserter:
            await inserter.process_many([{"id": i, "name": f"old{i}", "age": i} for i in range(3)])
        upserter = AsyncSqlalchemyWriteBatcher(
            model, engine, on_conflict="update", returning=[model.id, model.name], max_batch_size=20
        )
        rows = [{"id": 1, "name": "new1", "age": 10}, {"id": 5, "name": "new5", "age": 5},
                {"id": 1, "name": "newer1", "age": 11}, {"id": 2, "name": "new2", "age": 20}]  # fmt: skip
        async with upserter:
            results = await asyncio.gather(*(upserter.process(row) for row in rows))
        keeper = AsyncSqlalchemyWriteBatcher(model, engine, on_conflict="nothing")
        async with keeper:
            kept = await keeper.process_many(
                [{"id": 0, "name": "ignored", "age": 9}, {"id": 6, "name": "n6", "age": 6}]
            )
        assert kept == [None, None]
        stored = await read_table(engine, model)
    assert results == [(1, "new1"), (5, "new5"), (1, "newer1"), (2, "new2")]
    assert stored == {0: ("old0", 0), 1: ("newer1", 11), 2: ("new2", 20), 5: ("new5", 5), 6: ("n6", 6)}


async def test_a_statement_the_server_refuses_fails_every_caller_without_bisection(database_url: str) -> None:
    model = person_model()
    async with database(database_url, model) as engine:
        log = StatementLog(engine)
        async with engine.begin() as connection:
            await connection.execute(text(f"ALTER TABLE {model.__tablename__} RENAME TO gone_{model.__tablename__}"))
        async with AsyncSqlalchemyWriteBatcher(model, engine, max_batch_size=16) as batcher:
            results = await asyncio.gather(
                *(batcher.process({"id": i, "name": "n", "age": 1}) for i in range(16)), return_exceptions=True
            )
        async with engine.begin() as connection:
            await connection.execute(text(f"ALTER TABLE gone_{model.__tablename__} RENAME TO {model.__tablename__}"))
    assert all(isinstance(r, DBAPIError) and "gone" not in str(r) for r in results)
    assert len({id(r) for r in results}) == 1  # the batch's error, once
    assert log.count("INSERT") == 1


def test_settings_are_validated_eagerly() -> None:

    model = person_model()
    engine = create_async_engine("sqlite+aiosqlite://")
    with pytest.raises(ValueError, match="operation must be 'insert' or 'update', got 'delete'"):
        AsyncSqlalchemyWriteBatcher(model, engine, operation="delete")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="returning does not go with on_conflict='nothing'"):
        AsyncSqlalchemyWriteBatcher(model, engine, returning=model.id, on_conflict="nothing")
    with pytest.raises(ValueError, match="operation='update' takes neither on_conflict nor returning"):
        AsyncSqlalchemyWriteBatcher(model, engine, operation="update", returning=model.id)
    with pytest.raises(ValueError, match=r"conflict_columns \['nope'\] are not columns"):
        AsyncSqlalchemyWriteBatcher(model, engine, on_conflict="update", conflict_columns=["nope"])
    with pytest.raises(TypeError, match="async_engine must be an AsyncEngine"):
        AsyncSqlalchemyWriteBatcher(model, "sqlite://")
    with pytest.raises(TypeError, match="model must be a declarative ORM class or a Table"):
        AsyncSqlalchemyWriteBatcher(object(), engine)
    with pytest.raises(ValueError, match="on_conflict is supported on PostgreSQL and SQLite, not on 'mysql'"):
        dialect_insert("mysql")


async def test_an_update_of_missing_rows_tells_their_callers_and_writes_the_others(database_url: str) -> None:
    model = person_model()
    async with database(database_url, model) as engine:
        async with AsyncSqlalchemyWriteBatcher(model, engine) as inserter:
            await inserter.process_many([{"id": i, "name": f"n{i}", "age": i} for i in range(0, 20, 2)])
        updater = AsyncSqlalchemyWriteBatcher(model, engine, operation="update", max_batch_size=20, max_queue_time=1)
        async with updater:
            results = await asyncio.wait_for(
                asyncio.gather(
                    *(updater.process({"id": i, "age": 100 + i}) for i in range(20)), return_exceptions=True
                ),
                30,
            )
        stored = await read_table(engine, model)
    assert stored == {i: (f"n{i}", 100 + i) for i in range(0, 20, 2)}  # the odd ids were never there, nor are now
    assert [results[i] for i in range(0, 20, 2)] == [None] * 10
    assert all(isinstance(results[i], RowNotFoundError) for i in range(1, 20, 2)), results
    assert [results[i].key for i in range(1, 20, 2)] == [{"id": i} for i in range(1, 20, 2)]


def key_value_table() -> Table:
    return Table(
        f"kv_{uuid.uuid4().hex[:10]}", MetaData(), Column("id", Integer, primary_key=True), Column("v", String(20))
    )


async def test_an_upsert_with_returning_of_a_row_that_gives_only_its_key(database_url: str) -> None:
    table = key_value_table()
    async with database(database_url, table) as engine:
        async with engine.begin() as connection:
            await connection.execute(table.insert(), [{"id": 1, "v": "old"}])
        upserter = AsyncSqlalchemyWriteBatcher(
            table, engine, on_conflict="update", returning=[table.c.id, table.c.v], max_batch_size=4, max_queue_time=1
        )
        rows = [{"id": 1}, {"id": 50, "v": "new"}, {"id": 51, "v": "new"}, {"id": 52}]
        async with upserter:
            results = await asyncio.wait_for(
                asyncio.gather(*(upserter.process(row) for row in rows), return_exceptions=True), 30
            )
        stored = await read_rows(engine, table)
    # A row that gives only its key: inserted if missing, left as it is if there, and its row comes back.
    assert results == [(1, "old"), (50, "new"), (51, "new"), (52, None)]
    assert stored == [{"id": 1, "v": "old"}, {"id": 50, "v": "new"}, {"id": 51, "v": "new"}, {"id": 52, "v": None}]


def test_row_not_found_error_says_which_key_and_survives_pickling() -> None:
    error = RowNotFoundError("person", {"id": 99, "part": "a"})
    assert str(error) == "no row of table 'person' has id=99, part='a': the update changed nothing"
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is RowNotFoundError and copy.key == {"id": 99, "part": "a"} and str(copy) == str(error)
    assert isinstance(error, LookupError)


# ---------------------------------------------------------------------- huge batches, hot keys, odd keys


@pytest.mark.timeout(180)
async def test_huge_batches_of_updates_with_missing_keys(database_url: str) -> None:
    table = kv_table()
    n = 20_000  # SQLite: more keys than one statement's bind parameters (the SELECT of the missing goes in two)
    async with database(database_url, table) as engine:
        async with engine.begin() as connection:
            await connection.execute(table.insert(), [{"id": i, "v": "old"} for i in range(0, n, 2)])
        updater = AsyncSqlalchemyWriteBatcher(table, engine, operation="update", max_batch_size=None, max_queue_time=1)
        async with updater:
            results = await updater.process_many([{"id": i, "v": "new"} for i in range(n)], return_exceptions=True)
        stored = {row["id"]: row["v"] for row in await read_rows(engine, table)}
    assert stored == dict.fromkeys(range(0, n, 2), "new")
    assert results[0::2] == [None] * (n // 2)
    assert all(isinstance(r, RowNotFoundError) for r in results[1::2])
    assert updater.stats.batches == 1


@pytest.mark.timeout(180)
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


@pytest.mark.timeout(180)
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


@pytest.mark.timeout(180)
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


@pytest.mark.timeout(180)
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


@pytest.mark.timeout(180)
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
