"""Which errors are a row's fault (bisect: only that caller fails) and which are the batch's, on the real servers.

Each test writes a batch with one row the server or the driver refuses, then reads the table back: every other
row is there, the refused one is not, and only its caller failed.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from typing import Any

import pytest
from sqlalchemy import BigInteger, Column, Integer, MetaData, String, Table, text
from sqlalchemy.exc import DBAPIError, StatementError

from async_batcher.sqlalchemy import AsyncSqlalchemyWriteBatcher
from async_batcher.sqlalchemy.write import is_row_fault
from tests.sqlalchemy.helpers import database, gather_bounded, kv_table, read_rows

pytestmark = pytest.mark.single_loop


def values_table() -> Table:
    return Table(
        f"values_{uuid.uuid4().hex[:10]}",
        MetaData(),
        Column("id", Integer, primary_key=True),
        Column("big", BigInteger),
        Column("word", String(30)),
    )


@pytest.mark.parametrize(
    ("bad", "raw"),
    [
        pytest.param({"big": 2**63}, OverflowError, id="int64-overflow"),
        pytest.param({"word": "lone \ud800 surrogate"}, UnicodeEncodeError, id="lone-surrogate"),
    ],
)
async def test_a_value_the_driver_refuses_fails_only_its_row(
    database_url: str, bad: dict[str, Any], raw: type[BaseException]
) -> None:
    # sqlite3 raises these raw (not as a DB-API error); asyncpg raises a DB-API error: both are the row's fault.
    table = values_table()
    rows = [{"id": i, "big": i, "word": f"w{i}"} for i in range(10)]
    rows[5] = {**rows[5], **bad}
    async with database(database_url, table) as engine:
        async with AsyncSqlalchemyWriteBatcher(table, engine, max_batch_size=10, max_queue_time=1) as batcher:
            results = await asyncio.wait_for(
                asyncio.gather(*(batcher.process(row) for row in rows), return_exceptions=True), 30
            )
        stored = await read_rows(engine, table)
    assert {row["id"] for row in stored} == set(range(10)) - {5}
    assert results[:5] + results[6:] == [None] * 9
    assert isinstance(results[5], raw | DBAPIError), results[5]
    if database_url.startswith("sqlite"):
        assert isinstance(results[5], raw)  # the driver's own error, as it raised it


async def test_a_row_refused_by_a_trigger_fails_only_its_caller(database_url: str) -> None:
    table = values_table()
    async with database(database_url, table) as engine:
        async with engine.begin() as connection:
            if database_url.startswith("postgresql"):
                # RAISE EXCEPTION: SQLSTATE P0001 (raise_exception), the row's fault though not a constraint.
                await connection.execute(
                    text(
                        f"CREATE FUNCTION refuse_{table.name}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                        "IF NEW.word = 'refused' THEN RAISE EXCEPTION 'word % is refused', NEW.word; END IF; "
                        "RETURN NEW; END $$"
                    )
                )
                await connection.execute(
                    text(
                        f"CREATE TRIGGER refuse BEFORE INSERT ON {table.name} "
                        f"FOR EACH ROW EXECUTE FUNCTION refuse_{table.name}()"
                    )
                )
            else:
                await connection.execute(
                    text(
                        f"CREATE TRIGGER refuse BEFORE INSERT ON {table.name} WHEN NEW.word = 'refused' "
                        "BEGIN SELECT RAISE(ABORT, 'refused'); END"
                    )
                )
        rows = [{"id": i, "big": i, "word": "refused" if i == 4 else f"w{i}"} for i in range(6)]
        async with AsyncSqlalchemyWriteBatcher(table, engine, max_batch_size=6, max_queue_time=1) as batcher:
            results = await asyncio.wait_for(
                asyncio.gather(*(batcher.process(row) for row in rows), return_exceptions=True), 30
            )
        stored = await read_rows(engine, table)
    assert {row["id"] for row in stored} == {0, 1, 2, 3, 5}
    assert results[:4] + results[5:] == [None] * 5
    assert isinstance(results[4], DBAPIError) and "refused" in str(results[4])


class _Orig(Exception):
    def __init__(self, sqlstate: str | None) -> None:
        super().__init__("x")
        self.sqlstate = sqlstate


def _error(sqlstate: str | None, *, invalidated: bool = False) -> DBAPIError:
    return DBAPIError("INSERT", {}, _Orig(sqlstate), connection_invalidated=invalidated)


@pytest.mark.parametrize(
    "state",
    [
        "21000",  # cardinality_violation
        "22001",  # string_data_right_truncation
        "22003",  # numeric_value_out_of_range
        "22P02",  # invalid_text_representation
        "23503",  # foreign_key_violation
        "23505",  # unique_violation
        "23514",  # check_violation
        "P0001",  # raise_exception (a trigger's RAISE EXCEPTION)
        "P0004",  # assert_failure (a trigger's ASSERT)
        "44000",  # with_check_option_violation (a view's WITH CHECK OPTION)
        "27000",  # triggered_data_change_violation
        "09000",  # triggered_action_exception
        "38001",  # an external routine (a PL/Python trigger, say) refused the row's data
        "39P01",  # trigger_protocol_violated
        "54000",  # program_limit_exceeded: "index row size ... exceeds maximum" for one row's value
    ],
)
def test_sqlstates_of_a_rows_data_are_the_rows_fault(state: str) -> None:
    assert is_row_fault(_error(state))


@pytest.mark.parametrize(
    "state",
    [
        "08006",  # connection_failure
        "25P02",  # in_failed_sql_transaction
        "28000",  # invalid_authorization_specification
        "40001",  # serialization_failure: retried, never bisected
        "40P01",  # deadlock_detected: retried, never bisected
        "42P01",  # undefined_table
        "42501",  # insufficient_privilege
        "53300",  # too_many_connections
        "55P03",  # lock_not_available
        "57014",  # query_canceled (statement_timeout)
        "57P01",  # admin_shutdown
        "58030",  # io_error
        "XX000",  # internal_error
        "0A000",  # feature_not_supported
    ],
)
def test_sqlstates_of_the_batch_or_the_connection_are_not(state: str) -> None:
    assert not is_row_fault(_error(state))


def test_errors_without_a_sqlstate() -> None:
    assert not is_row_fault(_error("23505", invalidated=True))  # whatever the state: the connection is gone
    assert is_row_fault(_error(None))  # a driver refusing a value, no SQLSTATE
    assert is_row_fault(StatementError("A value is required for bind parameter 'age'", "INSERT", {}, None))
    assert is_row_fault(OverflowError("Python int too large to convert to SQLite INTEGER"))
    assert is_row_fault(UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed"))
    assert not is_row_fault(OSError("connection refused"))
    assert not is_row_fault(ConnectionResetError())
    assert not is_row_fault(RuntimeError("a bug"))


# ---------------------------------------------------------------------- malformed rows


class ExplodingMapping(Mapping[str, Any]):
    """A mapping that fails when read: the batcher must fail its caller only."""

    def __getitem__(self, key: str) -> Any:
        raise RuntimeError("boom")

    def __iter__(self) -> Any:
        raise RuntimeError("boom")

    def __len__(self) -> int:
        return 1


@pytest.mark.timeout(180)
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
