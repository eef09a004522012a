"""What the AWS benchmark's runs share (benchmarks/aws/run.py, and benchmarks/sql's ``drive``): how to drive N items
from concurrent callers, what one run measured, the table of the report."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

__all__ = [
    "MODES",
    "NO_WAIT",
    "ONE_CALL_PER_ITEM",
    "Measure",
    "Measurement",
    "drive",
    "markdown_table",
    "mode_wait",
]


async def drive(n: int, callers: int, submit: Callable[[int], Awaitable[object]]) -> float:
    """``callers`` concurrent tasks submit items 0..n-1 (each waits for its result before taking the next);
    returns the seconds it took. Any failure propagates: the examples count nothing that did not succeed."""
    if n < 1 or callers < 1:
        raise ValueError(f"n and callers must be >= 1, got {n} and {callers}")
    next_item = iter(range(n))

    async def caller() -> None:
        for index in next_item:
            await submit(index)

    start = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for _ in range(min(callers, n)):
            group.create_task(caller())
    return time.perf_counter() - start


@dataclass(frozen=True)
class Measurement:
    """One run: ``items`` items through ``mode`` ("batched" or "one call per item") with ``callers`` callers."""

    service: str
    mode: str
    items: int
    callers: int
    seconds: float
    api_calls: int

    @property
    def items_per_second(self) -> float:
        return self.items / self.seconds

    @property
    def calls_per_item(self) -> float:
        return self.api_calls / self.items


def markdown_table(measurements: list[Measurement]) -> str:
    lines = [
        "| service | mode | callers | items | seconds | items/s | API calls | calls/item |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for m in measurements:
        lines.append(
            f"| {m.service} | {m.mode} | {m.callers} | {m.items} | {m.seconds:.2f} | {m.items_per_second:,.0f} "
            f"| {m.api_calls} | {m.calls_per_item:.3f} |"
        )
    return "\n".join(lines)


ONE_CALL_PER_ITEM = "one call per item"
NO_WAIT = "batched, max_queue_time=0"
MODES = ("batched", ONE_CALL_PER_ITEM)
"""Batched with the default wait, one call per item; the benchmark adds NO_WAIT (batches leave as soon as a slot is
free)."""


def mode_wait(mode: str) -> float:
    """The batcher's ``max_queue_time`` in a batched mode: the default 10 ms, or 0 for NO_WAIT."""
    return 0.0 if mode == NO_WAIT else 0.01


Measure = Callable[[str | None, str, int, int, int], Awaitable[Measurement]]
"""(endpoint, mode, n, callers, concurrency) -> the measurement of one run, checked against a read-back."""
