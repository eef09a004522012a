"""Run a documentation snippet (docs/snippets/<name>.py) as its reader would: ``python docs/snippets/<name>.py``."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

SNIPPETS = Path(__file__).resolve().parent.parent / "docs" / "snippets"


def run_snippet(name: str, cwd: Path, env: Mapping[str, str] | None = None) -> str:
    """Run the snippet in ``cwd`` with ``env`` added to the environment; returns its output, fails on an error."""
    done = subprocess.run(
        [sys.executable, str(SNIPPETS / f"{name}.py")],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"{name}.py failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout
