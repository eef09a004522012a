"""Where a benchmark ran: the CPU and the repository's revision, for the reports."""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

__all__ = ["cpu_model", "revision"]

ROOT = Path(__file__).resolve().parents[1]


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def revision() -> str:
    """The commit of this checkout, with ``+changes`` when the working tree differs from it (reports aside)."""
    try:
        git = ["git", "-C", str(ROOT)]
        rev = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(
            [*git, "status", "--porcelain", "--untracked-files=no", "--", ".", ":!reports"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return rev.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")
