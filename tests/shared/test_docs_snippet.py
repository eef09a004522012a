"""docs/snippets/shared_pool.py, the scaling guide's example, run whole in a process of its own."""

from __future__ import annotations

import subprocess
import sys

from tests.shared.procs import ROOT


def test_the_guides_pool_shares_one_batcher() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "snippets" / "shared_pool.py")],
        cwd="/tmp", capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == "[[0, 2, 4], [20, 22, 24], [40, 42, 44]]"
    assert "owner" in "".join(lines[:-1])
