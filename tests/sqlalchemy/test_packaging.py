"""The SQL integration's import paths, and the message of a missing extra."""

from __future__ import annotations

import subprocess
import sys


def test_the_0_2_2_path_and_the_package_name_the_same_class() -> None:
    from async_batcher.sqlalchemy import AsyncSqlalchemyWriteBatcher
    from async_batcher.sqlalchemy.write import AsyncSqlalchemyWriteBatcher as Original

    assert AsyncSqlalchemyWriteBatcher is Original


def test_a_missing_sqlalchemy_names_the_extra() -> None:
    code = "import sys; sys.modules['sqlalchemy'] = None; import async_batcher.sqlalchemy"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 1
    assert "ImportError: async_batcher.sqlalchemy needs SQLAlchemy 2" in done.stderr
    assert "pip install 'async-batcher[sqlalchemy]'" in done.stderr


def test_importing_async_batcher_does_not_import_sqlalchemy() -> None:
    code = "import sys, async_batcher; print('sqlalchemy' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
