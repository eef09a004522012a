"""SQL writes from 1000 concurrent callers: the batcher against one INSERT (and one transaction) per call.

Each run writes ``n`` rows into a fresh table from 1000 concurrent callers (each waits for its result before
taking the next row), on PostgreSQL 15 (a throwaway cluster on 127.0.0.1, through asyncpg) and on SQLite (a file,
through aiosqlite), in three ways:

* ``batched``: ``AsyncSqlalchemyWriteBatcher`` with its defaults (batches of up to 1000 rows, 10 ms wait) and
  ``concurrency=4`` on PostgreSQL (1 on SQLite, which has one writer at a time);
* ``batched, returning id``: the same, each caller getting its row's id back (``returning=Model.id``);
* ``one INSERT per call``: each caller runs ``INSERT`` in its own transaction on the same engine (a pool of 20
  connections on PostgreSQL, of 1 on SQLite, whose one writer at a time makes more connections fail on its lock).

Statements are the INSERTs SQLAlchemy sends (one ``executemany`` counts once: asyncpg pipelines its rows in one
round trip of one prepared statement); transactions are the COMMITs. Every run counts the table's rows after.

Run: ``python -m benchmarks.sql.run`` (``make bench-sql``; ``--quick`` for a smoke run). Writes ``reports/sql.md``,
``reports/sql.csv`` and ``reports/sql.png``. Bounded: well under two minutes on a 2-core machine.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import importlib.metadata
import os
import platform
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import event, func, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from async_batcher.sqlalchemy import AsyncSqlalchemyWriteBatcher
from benchmarks.aws.support import drive
from benchmarks.provenance import regenerated_by
from tests.sqlalchemy.helpers import person_model
from tools.postgres import PostgresServer

CALLERS = 1000
ROWS = {"PostgreSQL": 20_000, "SQLite": 10_000}
# One INSERT per call is 30 to 200 times slower (a commit, so an fsync on SQLite, per row): fewer rows keep the
# run short; rows/s and statements per row do not depend on the count.
UNBATCHED_SHARE = 5
UNBATCHED_SQLITE_SHARE = 10  # 1000 rows: one per caller
MODES = ("batched", "batched, returning id", "one INSERT per call")
REPORT = Path("reports")


@dataclass(frozen=True)
class Run:
    database: str
    mode: str
    rows: int
    callers: int
    seconds: float
    statements: int
    transactions: int

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds


class Counter:
    """INSERT statements and COMMITs an engine sends."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.statements = self.transactions = 0
        event.listen(engine.sync_engine, "before_cursor_execute", self._statement)
        event.listen(engine.sync_engine, "commit", self._commit)

    def _statement(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        self.statements += statement.lstrip().upper().startswith("INSERT")

    def _commit(self, conn: Any) -> None:
        self.transactions += 1


def row(index: int) -> dict[str, Any]:
    return {"id": index, "name": f"name {index}", "age": index % 100}


async def write(engine: AsyncEngine, model: Any, mode: str, n: int, database: str) -> float:
    """Write rows 0..n-1 in ``mode``; returns the seconds it took."""
    if mode == "one INSERT per call":

        async def insert_one(index: int) -> None:
            async with engine.begin() as connection:
                await connection.execute(insert(model.__table__), row(index))

        return await drive(n, CALLERS, insert_one)
    returning = model.id if "returning" in mode else None
    concurrency = 4 if database == "PostgreSQL" else 1
    async with AsyncSqlalchemyWriteBatcher(model, engine, returning=returning, concurrency=concurrency) as batcher:
        return await drive(n, CALLERS, lambda index: batcher.process(row(index)))


async def measure(url: str, database: str, mode: str, n: int) -> Run:
    model = person_model()
    # SQLite has one writer at a time: one connection, for which the callers queue (20 waiting on its lock fail).
    engine = create_async_engine(url, pool_size=20 if database == "PostgreSQL" else 1, max_overflow=0)
    try:
        async with engine.begin() as connection:
            await connection.run_sync(model.metadata.create_all)
        counter = Counter(engine)
        seconds = await write(engine, model, mode, n, database)
        async with engine.connect() as connection:
            stored = (await connection.execute(select(func.count()).select_from(model.__table__))).scalar_one()
        if stored != n:
            raise RuntimeError(f"{database}, {mode}: {stored} rows in the table, expected {n}")
        run = Run(database, mode, n, CALLERS, seconds, counter.statements, counter.transactions)
        async with engine.begin() as connection:
            await connection.run_sync(model.metadata.drop_all)
    finally:
        await engine.dispose()
    return run


def markdown_table(runs: list[Run]) -> str:
    lines = [
        "| database | mode | rows | callers | seconds | rows/s | INSERT statements | per row | transactions |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        lines.append(
            f"| {r.database} | {r.mode} | {r.rows} | {r.callers} | {r.seconds:.2f} | {r.rows_per_second:,.0f} "
            f"| {r.statements} | {r.statements / r.rows:.4f} | {r.transactions} |"
        )
    return "\n".join(lines)


def summary(runs: list[Run]) -> str:
    lines = ["What it shows:", ""]
    for database in dict.fromkeys(r.database for r in runs):
        by_mode = {r.mode: r for r in runs if r.database == database}
        batched, single = by_mode["batched"], by_mode["one INSERT per call"]
        lines.append(
            f"- {database}: the batcher writes {batched.rows_per_second / single.rows_per_second:.1f}x the rows/s of "
            f"one INSERT per call, with {batched.statements} statements and {batched.transactions} transactions "
            f"for {batched.rows} rows instead of {single.statements} and {single.transactions}."
        )
    lines.append(
        "- With `returning`, both still send one multi-row INSERT per batch (SQLAlchemy's insertmanyvalues, the "
        "rows back in parameter order), because the rows give their primary key. With a key the server generates, "
        "SQLAlchemy sends SQLite one INSERT per row (SQLite does not promise the order of RETURNING rows), still "
        "in one transaction per batch."
    )
    return "\n".join(lines)


def plot(runs: list[Run], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    databases = list(dict.fromkeys(r.database for r in runs))
    figure, axes = plt.subplots(1, len(databases), figsize=(5.5 * len(databases), 4), squeeze=False)
    for column, database in enumerate(databases):
        rows = [r for r in runs if r.database == database]
        axis = axes[0][column]
        axis.bar([r.mode.replace(", ", ",\n") for r in rows], [r.rows_per_second for r in rows], color="#4c72b0")
        axis.set_title(f"{database}: rows/s from {CALLERS} callers")
        axis.grid(True, axis="y", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def write_report(runs: list[Run], seconds: float, command: str) -> None:
    REPORT.mkdir(exist_ok=True)
    plot(runs, REPORT / "sql.png")
    with (REPORT / "sql.csv").open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=[*asdict(runs[0]), "rows_per_second"])
        writer.writeheader()
        for r in runs:
            writer.writerow({**asdict(r), "rows_per_second": round(r.rows_per_second, 1)})
    versions = ", ".join(
        f"{name} {importlib.metadata.version(name)}" for name in ("SQLAlchemy", "asyncpg", "aiosqlite")
    )
    intro = (__doc__ or "").split("\n\n", 1)[1].split("Run:")[0].strip()
    text = f"""# SQL writes: the batcher against one INSERT per call

{regenerated_by("bench-sql", command, "SQL_ARGS")}

{intro}

Machine: {platform.platform()}, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, shared with other work
(timings are noisy); PostgreSQL from `{PostgresServer().bin}` (fsync off: a test cluster), {versions}.
Command: `{command}`; took {seconds:.0f} s.

{markdown_table(runs)}

{summary(runs)}

![rows/s](sql.png)
"""
    (REPORT / "sql.md").write_text(text)


async def main(quick: bool) -> list[Run]:
    runs: list[Run] = []
    scale = 10 if quick else 1
    with PostgresServer() as postgres, tempfile.TemporaryDirectory(prefix="async-batcher-sqlite-") as folder:
        urls = {"PostgreSQL": postgres.url, "SQLite": f"sqlite+aiosqlite:///{Path(folder) / 'bench.db'}"}
        for database, url in urls.items():
            for mode in MODES:
                share = 1
                if mode == "one INSERT per call":
                    share = UNBATCHED_SQLITE_SHARE if database == "SQLite" else UNBATCHED_SHARE
                run = await measure(url, database, mode, ROWS[database] // scale // share)
                print(markdown_table([run]).splitlines()[-1], flush=True)
                runs.append(run)
    return runs


def cli() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="a tenth of the rows (a smoke run)")
    args = parser.parse_args()
    start = time.perf_counter()
    runs = asyncio.run(main(args.quick))
    write_report(runs, time.perf_counter() - start, "python -m benchmarks.sql.run" + (" --quick" if args.quick else ""))
    print(f"wrote {REPORT / 'sql.md'}, {REPORT / 'sql.csv'} and {REPORT / 'sql.png'}")


if __name__ == "__main__":
    cli()
