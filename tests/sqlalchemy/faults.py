"""The pieces of the SQL writer's fault matrix: another client that holds what the batcher's statement or COMMIT
waits for (so that a fault strikes at a known phase, without sleeping), and the invariant every cell checks from
the rows read back."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import Column, Integer, MetaData, String, Table, event, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from async_batcher import OutcomeUnknownError
from tests.loops import until
from tests.sqlalchemy.helpers import until_sql

APP = "fault-matrix-batcher"


def fault_table() -> Table:
    return Table(
        f"faults_{uuid.uuid4().hex[:10]}", MetaData(), Column("id", Integer, primary_key=True), Column("v", String(20))
    )


def check_outcomes(rows: Sequence[Mapping[str, Any]], outcomes: Sequence[object], stored: set[int]) -> None:
    """No caller told "written" for a row that is not there, none told "failed" for one that is; an
    :class:`OutcomeUnknownError` may be either."""
    for row, outcome in zip(rows, outcomes, strict=True):
        present = row["id"] in stored
        if isinstance(outcome, OutcomeUnknownError):
            continue
        if isinstance(outcome, BaseException):
            assert not present, f"row {row['id']} is in the table; its caller was told {outcome!r}"
        else:
            assert present, f"row {row['id']} is not in the table; its caller was told it was written"


async def settled(within: float = 30.0) -> None:
    """Wait until every other task of the loop has ended (a batch cut off by a stop cleans its connection up after
    its callers were answered)."""
    # Waited for, not polled: a loop that polls starves the driver's thread (aiosqlite) of the GIL on a busy machine.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    me = asyncio.current_task()
    while others := {task for task in asyncio.all_tasks() if task is not me}:
        _, pending = await asyncio.wait(others, timeout=max(0.0, deadline - loop.time()))
        if pending and loop.time() >= deadline:
            raise AssertionError(f"{len(pending)} task(s) still running after {within} s: {pending!r}")


class Blocker:
    """Another client of the database: holds what the batcher's statement (``hold_statement``) or ``COMMIT``
    (``hold_commit``) will wait for, says when the batcher waits (``wait_*``), and lets go (``release``)."""

    engine: AsyncEngine

    def batcher_engine(self) -> AsyncEngine:
        raise NotImplementedError

    async def prepare(self, table: Table) -> None:
        """Create ``table`` (and what the holds need)."""
        async with self.engine.begin() as connection:
            await connection.run_sync(table.metadata.create_all)

    async def hold_statement(self, table: Table, row_id: int) -> None:
        raise NotImplementedError

    async def hold_commit(self, table: Table) -> None:
        raise NotImplementedError

    async def wait_statement(self) -> None:
        raise NotImplementedError

    async def wait_commit(self) -> None:
        raise NotImplementedError

    async def release(self) -> None:
        raise NotImplementedError

    async def stored(self, table: Table) -> set[int]:
        async with self.engine.connect() as connection:
            return set((await connection.execute(text(f"SELECT id FROM {table.name}"))).scalars())

    async def assert_unlocked(self, table: Table) -> None:
        """No transaction is left open on ``table`` (in the pool or anywhere): another client locks it at once."""
        raise NotImplementedError

    async def close(self) -> None:
        await self.engine.dispose()


class PostgresBlocker(Blocker):
    """PostgreSQL: a statement waits for a row another transaction inserted and has not committed; a ``COMMIT``
    waits in a deferred constraint trigger for an advisory lock this client holds."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = create_async_engine(url)
        self.lock_key = uuid.uuid4().int % 2**31
        self._held: AsyncConnection | None = None

    def batcher_engine(self, settings: Mapping[str, str] | None = None, **options: Any) -> AsyncEngine:
        """An engine whose connections are named (to be found in ``pg_stat_activity``), with ``settings``."""
        server_settings = {"application_name": APP, **(settings or {})}
        return create_async_engine(self.url, connect_args={"server_settings": server_settings}, **options)

    async def prepare(self, table: Table) -> None:
        await super().prepare(table)
        async with self.engine.begin() as connection:
            await connection.execute(
                text(
                    # At COMMIT: wait while this client holds the advisory lock (hold_commit).
                    f"CREATE FUNCTION gate_{table.name}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                    f"PERFORM pg_advisory_xact_lock_shared({self.lock_key}); RETURN NULL; END $$"
                )
            )
            await connection.execute(
                text(
                    f"CREATE CONSTRAINT TRIGGER gate AFTER INSERT ON {table.name} DEFERRABLE INITIALLY DEFERRED "
                    f"FOR EACH ROW EXECUTE FUNCTION gate_{table.name}()"
                )
            )

    async def _begin(self) -> AsyncConnection:
        assert self._held is None
        self._held = await self.engine.connect()
        await self._held.begin()
        return self._held

    async def hold_statement(self, table: Table, row_id: int) -> None:
        held = await self._begin()
        await held.execute(text(f"INSERT INTO {table.name} (id, v) VALUES (:id, 'other')"), {"id": row_id})

    async def hold_commit(self, table: Table) -> None:
        held = await self._begin()
        await held.execute(text(f"SELECT pg_advisory_xact_lock({self.lock_key})"))

    async def wait_statement(self) -> None:
        await until_sql(self.engine, _waiting("NOT ILIKE 'COMMIT%'"))

    async def wait_commit(self) -> None:
        await until_sql(self.engine, _waiting("ILIKE 'COMMIT%'"))

    async def forget(self) -> None:
        """The server died, and what this client held with it: its connection is dropped, not closed."""
        if self._held is not None:
            await self._held.invalidate()
            await self._held.close()
            self._held = None

    async def release(self) -> None:
        if self._held is not None:
            await self._held.rollback()  # (the inserted row goes; the advisory lock is let go)
            await self._held.close()
            self._held = None

    async def terminate_batcher(self) -> None:
        """``pg_terminate_backend`` every connection of the batcher's engine."""
        async with self.engine.connect() as connection:
            await connection.execute(
                text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '{APP}'")
            )

    async def assert_unlocked(self, table: Table) -> None:
        async with self.engine.begin() as connection:
            await connection.execute(text("SET LOCAL lock_timeout = '5s'"))
            await connection.execute(text(f"LOCK TABLE {table.name} IN ACCESS EXCLUSIVE MODE"))
            idle = await connection.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = :app "
                    "AND state LIKE 'idle in transaction%'"
                ),
                {"app": APP},
            )
            assert idle.scalar() == 0, "a connection of the batcher was left in a transaction"


def _waiting(query: str) -> str:
    return (
        "SELECT count(*) > 0 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        f"AND application_name = '{APP}' AND query {query}"
    )


class SqliteBlocker(Blocker):
    """SQLite: a statement waits for the write lock another connection holds (``BEGIN IMMEDIATE``); a ``COMMIT``
    waits for a reader's shared lock to go. The batcher's engine waits up to 30 s for a lock (its busy timeout)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.url = f"sqlite+aiosqlite:///{path}"
        self.engine = create_async_engine(self.url)
        self._held: sqlite3.Connection | None = None
        self._sent = {"statement": threading.Event(), "commit": threading.Event()}

    def batcher_engine(self, **options: Any) -> AsyncEngine:
        engine = create_async_engine(self.url, connect_args={"timeout": 30}, **options)

        @event.listens_for(engine.sync_engine, "before_cursor_execute")
        def _statement(*_args: Any) -> None:
            self._sent["statement"].set()

        @event.listens_for(engine.sync_engine, "commit")
        def _commit(*_args: Any) -> None:
            self._sent["commit"].set()

        return engine

    def _connect(self) -> sqlite3.Connection:
        assert self._held is None
        self._held = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        return self._held

    async def hold_statement(self, table: Table, row_id: int) -> None:
        self._connect().execute("BEGIN IMMEDIATE")

    async def hold_commit(self, table: Table) -> None:
        held = self._connect()
        held.execute("BEGIN")
        held.execute(f"SELECT * FROM {table.name}").fetchall()

    async def wait_statement(self) -> None:
        await until(self._sent["statement"].is_set)

    async def wait_commit(self) -> None:
        await until(self._sent["commit"].is_set)

    async def release(self) -> None:
        if self._held is not None:
            self._held.execute("ROLLBACK")
            self._held.close()
            self._held = None

    async def assert_unlocked(self, table: Table) -> None:
        other = sqlite3.connect(self.path, isolation_level=None, timeout=5)
        try:
            other.execute("BEGIN EXCLUSIVE")
            other.execute("ROLLBACK")
        finally:
            other.close()

    async def close(self) -> None:
        await self.release()
        await super().close()
