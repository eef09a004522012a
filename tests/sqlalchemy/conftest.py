"""A throwaway PostgreSQL cluster (session-scoped: started once, stopped and deleted at the end) and SQLite
files; each test makes its own tables, so tests sharing the server do not see each other's rows.

PostgreSQL is a server beyond Python: the tests on it are the full tier's (tests/conftest.py), those on SQLite the
fast tier's too.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sqlalchemy.helpers import POSTGRESQL
from tools.postgres import PostgresServer, postgres_bin


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    with PostgresServer() as server:
        yield server


@pytest.fixture(scope="session")
def postgres_binaries() -> Path:
    """PostgreSQL's server binaries: for the tests that start a cluster of their own."""
    return postgres_bin()


@pytest.fixture(params=[POSTGRESQL, "sqlite"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of a PostgreSQL database (asyncpg) or of a fresh SQLite file (aiosqlite)."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'test.db'}"
    server: PostgresServer = request.getfixturevalue("postgres")
    return server.url
