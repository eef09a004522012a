"""The SQL snippet of the documentation runs as written, on SQLite (its default) and on PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.snippets import run_snippet
from tests.sqlalchemy.helpers import POSTGRESQL
from tools.postgres import PostgresServer


@pytest.mark.parametrize("dialect", ["sqlite", POSTGRESQL])
def test_the_sql_snippet_runs(dialect: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    env = {}
    if dialect == "postgresql":
        server: PostgresServer = request.getfixturevalue("postgres")
        env["DATABASE_URL"] = server.url
    output = run_snippet("docs/snippets/sql_write.py", tmp_path, env)
    assert "999 rows; row 0 now has amount 1000" in output
