"""Fixtures of the shared batcher's tests: an address of their own, in a fresh private directory."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest


@pytest.fixture
def address() -> Iterator[str]:
    """A socket path in a new directory (mode 0700) under /tmp: short, as a Unix socket's must be."""
    directory = tempfile.mkdtemp(prefix="ab-shared-", dir="/tmp")
    os.chmod(directory, 0o700)
    try:
        yield os.path.join(directory, "b.sock")
    finally:
        shutil.rmtree(directory, ignore_errors=True)
