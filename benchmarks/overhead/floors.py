"""The floor of the overhead benchmark: a batcher as simple and fast as a competent hand-written one.

Standard library only: the benchmark's worker loads this file inside every implementation's own environment.

:class:`Floor` is what the ratios are taken against: a list of ``(item, future)`` pairs, one ``call_later``
(``call_soon`` for a wait of 0) armed by the first item of a batch, a flush at once when the list reaches
``max_batch_size``, one task per batch that awaits the batch function and sets the futures. ``process`` is a plain
function returning the future (as ``aiodataloader``'s ``load`` is): no coroutine per item. No statistics, no queue
limit, no concurrency limit, no cancellation handling. Anything that does less is not a batcher.

The executor shape (a plain ``def`` batch function in a one-thread executor, one caller at a time) has its own floor,
:class:`ExecutorFloor`: the same batcher, whose flush hands the batch to the executor (``executor.submit``) and whose
batch's end comes back to the loop by ``call_soon_threadsafe``, which sets the futures.

Two variants show what the choice of floor does to the ratios (``--impls floor-async,floor-task``):
:class:`AsyncFloor` is the same batcher behind an ``async def process`` (one coroutine per item, as every batcher
with timeouts or cancellation needs), and :class:`TaskFloor` is the floor of the benchmark's first version (a task
per flush, and a second, mostly empty flush task per full batch).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable, Sequence
from functools import partial

__all__ = ["AsyncFloor", "BatchFn", "ExecutorFloor", "Floor", "SyncBatchFn", "TaskFloor"]

BatchFn = Callable[[list[int]], Awaitable[list[int]]]
SyncBatchFn = Callable[[list[int]], list[int]]


class Floor:
    """One future per item, one timer and one task per batch."""

    def __init__(self, fn: BatchFn, max_batch_size: int, max_wait: float) -> None:
        self._fn = fn
        self._max = max_batch_size
        self._wait = max_wait
        self._loop = asyncio.get_running_loop()
        self._items: list[int] = []
        self._futures: list[asyncio.Future[int]] = []
        self._timer: asyncio.TimerHandle | asyncio.Handle | None = None

    def process(self, item: int) -> asyncio.Future[int]:
        fut = self._loop.create_future()
        self._items.append(item)
        self._futures.append(fut)
        if len(self._items) >= self._max:
            self._flush()
        elif self._timer is None:
            if self._wait > 0:
                self._timer = self._loop.call_later(self._wait, self._flush)
            else:
                self._timer = self._loop.call_soon(self._flush)
        return fut

    async def process_many(self, items: Sequence[int]) -> list[int]:
        futures = [self.process(x) for x in items]
        return [await f for f in futures]

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        items, futures = self._items, self._futures
        if items:
            self._items, self._futures = [], []
            self._loop.create_task(self._run(items, futures))

    async def _run(self, items: list[int], futures: list[asyncio.Future[int]]) -> None:
        try:
            results = await self._fn(items)
        except Exception as exc:
            for fut in futures:
                if not fut.done():
                    fut.set_exception(exc)
            return
        for fut, result in zip(futures, results, strict=True):
            if not fut.done():
                fut.set_result(result)


class ExecutorFloor(Floor):
    """:class:`Floor` for a plain ``def`` batch function run in ``executor``: the flush submits the batch, the
    executor's done-callback hands its end to the loop (``call_soon_threadsafe``), where the futures are set."""

    def __init__(
        self, fn: SyncBatchFn, executor: concurrent.futures.Executor, max_batch_size: int, max_wait: float
    ) -> None:
        super().__init__(_no_async_fn, max_batch_size, max_wait)
        self._sync_fn = fn
        self._executor = executor

    # _flush and _settle repeat Floor's _flush and _run on purpose: a floor takes no call it can do without (a shared
    # helper costs two Python calls a batch, 1 % of this floor's count per call).
    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        items, futures = self._items, self._futures
        if items:
            self._items, self._futures = [], []
            done = self._executor.submit(self._sync_fn, items)
            done.add_done_callback(partial(self._loop.call_soon_threadsafe, self._settle, futures))

    def _settle(self, futures: list[asyncio.Future[int]], done: concurrent.futures.Future[list[int]]) -> None:
        try:
            results = done.result()
        except Exception as exc:
            for fut in futures:
                if not fut.done():
                    fut.set_exception(exc)
            return
        for fut, result in zip(futures, results, strict=True):
            if not fut.done():
                fut.set_result(result)


async def _no_async_fn(items: list[int]) -> list[int]:
    raise AssertionError("ExecutorFloor calls its plain function in the executor")


class AsyncFloor(Floor):
    """:class:`Floor` behind ``async def process``: the cost of one coroutine per item."""

    async def process(self, item: int) -> int:  # type: ignore[override]  # a coroutine instead of a future
        return await Floor.process(self, item)

    async def process_many(self, items: Sequence[int]) -> list[int]:
        futures = [Floor.process(self, x) for x in items]
        return [await f for f in futures]


class TaskFloor:
    """The floor of the benchmark's first version: a task per flush (no timer), another per full batch."""

    def __init__(self, fn: BatchFn, max_batch_size: int) -> None:
        self._fn = fn
        self._max = max_batch_size
        self._loop = asyncio.get_running_loop()
        self._pending: list[tuple[int, asyncio.Future[int]]] = []

    def submit(self, item: int) -> asyncio.Future[int]:
        fut = self._loop.create_future()
        pending = self._pending
        pending.append((item, fut))
        if len(pending) >= self._max:
            self._pending = []
            self._loop.create_task(self._run(pending))
        elif len(pending) == 1:
            self._loop.create_task(self._flush())
        return fut

    async def process(self, item: int) -> int:
        return await self.submit(item)

    async def process_many(self, items: Sequence[int]) -> list[int]:
        futures = [self.submit(x) for x in items]
        return [await f for f in futures]

    async def _flush(self) -> None:
        batch = self._pending
        if batch:
            self._pending = []
            await self._run(batch)

    async def _run(self, batch: list[tuple[int, asyncio.Future[int]]]) -> None:
        try:
            results = await self._fn([item for item, _ in batch])
        except Exception as exc:
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
            return
        for (_, fut), result in zip(batch, results, strict=True):
            if not fut.done():
                fut.set_result(result)
