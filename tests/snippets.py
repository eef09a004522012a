"""Run a documentation snippet as its reader would: ``python docs/snippets/<name>.py``.

A test names the snippet by its path from the repository's root, the path its page includes, so that
tests/docs/test_pages.py can tell that every snippet has a test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_snippet(path: str, cwd: Path, env: Mapping[str, str] | None = None) -> str:
    """Run the snippet at ``path`` (``docs/snippets/<name>.py``) in ``cwd`` with ``env`` added to the environment;
    returns its output, fails on an error."""
    if not path.startswith("docs/snippets/") or not (ROOT / path).is_file():
        raise ValueError(f"not a snippet file: {path!r} (expected docs/snippets/<name>.py)")
    done = subprocess.run(
        [sys.executable, str(ROOT / path)],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"{path} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout
