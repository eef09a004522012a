"""What the benchmark's processes share: the no-op model, the loop, an address."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from collections.abc import Coroutine, Iterator
from typing import Any

from async_batcher import AsyncBatcher


class NoOp(AsyncBatcher[Any, Any]):
    """Answers each item with itself."""

    async def process_batch(self, batch: list[Any]) -> list[Any]:
        return batch


def noop() -> NoOp:
    return NoOp(max_batch_size=1024, max_queue_time=0)


def run(main: Coroutine[Any, Any, Any], loop: str) -> Any:
    if loop == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)


@contextlib.contextmanager
def address() -> Iterator[str]:
    """A socket path in a new private directory, removed afterwards."""
    directory = tempfile.mkdtemp(prefix="ab-bench-", dir="/tmp")
    os.chmod(directory, 0o700)
    try:
        yield os.path.join(directory, "b.sock")
    finally:
        shutil.rmtree(directory, ignore_errors=True)
