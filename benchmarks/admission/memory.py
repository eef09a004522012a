"""The memory of a server fed 10 MB items at twice its capacity, with and without ``max_queue_weight``.

A batcher whose ``process_batch`` holds its batch for ``per_batch + per_item·n`` seconds (``asyncio.sleep``: the
model's time) and answers each item's length; an open loop makes each item (``bytes`` of ``item_mb`` MB, written, so
that its pages are the process's) at twice the batcher's capacity and submits it, dropping it if refused. The
process's resident memory (``/proc/self/statm``) is sampled every 5 ms; the report is its peak above what it was
before the run, beside the limit and one batch's weight. Real time, a few seconds a run: the memory is what it
measures, not the time.
"""

from __future__ import annotations

import asyncio
import gc
import os
from dataclasses import dataclass
from typing import Any

__all__ = ["MemoryRun", "measure"]

MB = 1 << 20


@dataclass
class MemoryRun:
    label: str
    limit_mb: float | None
    batch_mb: float
    peak_mb: float  # resident memory's peak above its level before the run
    answered: int
    refused: int
    offered: int
    seconds: float


def _rss() -> int:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def _run(label: str, kwargs: dict[str, Any], *, item_mb: int, batch: int, seconds: float) -> MemoryRun:
    from async_batcher import AsyncBatcher, QueueFullException

    per_batch, per_item = 0.02, 0.02
    capacity = batch / (per_batch + per_item * batch)

    class Holder(AsyncBatcher[bytes, int]):
        def item_weight(self, item: bytes) -> float:
            return len(item)

        async def process_batch(self, items: list[bytes]) -> list[int]:
            await asyncio.sleep(per_batch + per_item * len(items))
            return [len(x) for x in items]

    gc.collect()
    base = _rss()
    peak = base
    b = Holder(max_batch_size=batch, max_queue_time=0, **kwargs)
    counts = {"answered": 0, "refused": 0, "offered": 0}
    stop = asyncio.Event()

    async def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, _rss())
            await asyncio.sleep(0.005)

    async def one() -> None:
        item = b"x" * (item_mb * MB)
        try:
            await b.process(item)
            counts["answered"] += 1
        except QueueFullException:
            counts["refused"] += 1

    sampler = asyncio.ensure_future(sample())
    loop = asyncio.get_running_loop()
    start = loop.time()
    tasks = []
    interval = 1 / (2 * capacity)
    while loop.time() - start < seconds:
        counts["offered"] += 1
        tasks.append(asyncio.ensure_future(one()))
        await asyncio.sleep(max(0.0, start + counts["offered"] * interval - loop.time()))  # (on schedule: open)
    await asyncio.gather(*tasks)
    await b.stop()
    stop.set()
    await sampler
    limit = kwargs.get("max_queue_weight")
    return MemoryRun(
        label, None if limit is None else limit / MB, batch * item_mb, (peak - base) / MB, seconds=seconds, **counts
    )


def measure(*, item_mb: int = 10, batch: int = 4, limit_mb: int = 200, seconds: float = 4.0) -> list[MemoryRun]:
    """Without a weight limit (``max_queue_size=4096``, the README's), then with ``max_queue_weight``."""
    runs = []
    for label, kwargs in (
        ("max_queue_size=4096", {"max_queue_size": 4096}),
        (f"max_queue_weight={limit_mb} MB", {"max_queue_weight": limit_mb * MB}),
    ):
        runs.append(asyncio.run(_run(label, kwargs, item_mb=item_mb, batch=batch, seconds=seconds)))
    return runs


if __name__ == "__main__":
    for r in measure():
        print(r)
