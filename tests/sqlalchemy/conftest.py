"""A throwaway PostgreSQL cluster (session-scoped: started once, stopped and deleted at the end) and SQLite
files; each test makes its own tables, so tests sharing the server do not see each other's rows."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tools.postgres import PostgresServer


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    with PostgresServer() as server:
        yield server


@pytest.fixture(params=["postgresql", "sqlite"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of a PostgreSQL database (asyncpg) or of a fresh SQLite file (aiosqlite)."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'test.db'}"
    server: PostgresServer = request.getfixturevalue("postgres")
    return server.url
