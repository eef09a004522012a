"""Contract point 13: ``process_batch`` runs in a context of the batcher's own, never a caller's.

On every path (``async def``, a plain ``def`` in its executor, an async generator, ``@batch``), a batch sees the
context of the ``start()`` that started its run (an empty one when a caller's first call started it), in a fresh
copy: nothing a caller set is there, and nothing it sets reaches a caller or the next batch. ``on_start`` and
``on_stop`` run in a copy of that context too. (What each caller's context held is the batch's through
``current_batch()``: tests/core/test_current_batch.py.)
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import threading
import weakref
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from async_batcher import END, AsyncBatcher, batch
from tests.batchers import until

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")
app: contextvars.ContextVar[str] = contextvars.ContextVar("app", default="-")


class Seeing(AsyncBatcher[int, int]):
    """Records what each batch sees of the context, then sets a value of its own in it."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seen: list[tuple[list[int], str, str]] = []
        self.hooks: list[tuple[str, str, str]] = []

    def look(self, batch: list[int]) -> None:
        self.seen.append((list(batch), request_id.get(), app.get()))
        request_id.set(f"set by the batch of {batch}")

    async def process_batch(self, batch: list[int]) -> list[int]:
        self.look(batch)
        await asyncio.sleep(0)
        return batch


class SyncSeeing(Seeing):
    def process_batch(self, batch: list[int]) -> list[int]:  # type: ignore[override]
        self.look(batch)
        return batch


class StreamSeeing(Seeing):
    async def process_batch(self, batch: list[int]) -> AsyncIterator[list[Any]]:  # type: ignore[override]
        self.look(batch)
        yield [x * 10 for x in batch]
        yield [END] * len(batch)


class Hooked(Seeing):
    async def on_start(self) -> None:
        self.hooks.append(("on_start", request_id.get(), app.get()))
        request_id.set("set by on_start")

    async def on_stop(self) -> None:
        self.hooks.append(("on_stop", request_id.get(), app.get()))


async def caller(b: AsyncBatcher[int, int], i: int) -> int:
    request_id.set(f"request-{i}")
    result = await b.process(i)
    assert request_id.get() == f"request-{i}"  # nothing the batch set reached its caller
    return result


async def stream_caller(b: AsyncBatcher[int, int], i: int) -> list[int]:
    request_id.set(f"request-{i}")
    parts = [part async for part in b.stream(i)]
    assert request_id.get() == f"request-{i}"
    return parts


def batches_saw_no_caller(b: Seeing) -> None:
    assert b.seen, "no batch ran"
    assert [(rid, a) for _, rid, a in b.seen] == [("-", "-")] * len(b.seen), b.seen


async def test_a_batch_sees_no_callers_request_id_and_leaves_none_to_the_next_batch() -> None:
    # The example: five callers at once, then two more while nothing runs, then two behind a running batch
    # (launched as it ends, from its task).
    b = Seeing(max_batch_size=8, max_queue_time=0.01)
    assert await asyncio.gather(*(caller(b, i) for i in range(5))) == list(range(5))
    assert await asyncio.gather(*(caller(b, i) for i in range(5, 7))) == [5, 6]
    b.max_queue_time = 0
    b.max_batch_size = 1
    assert await asyncio.gather(*(caller(b, i) for i in range(7, 10))) == [7, 8, 9]
    assert [items for items, _, _ in b.seen] == [[0, 1, 2, 3, 4], [5, 6], [7], [8], [9]]
    batches_saw_no_caller(b)
    await b.stop()


async def test_a_plain_def_on_a_one_thread_executor_sees_nothing_of_the_batch_before() -> None:
    with ThreadPoolExecutor(max_workers=1) as pool:
        b = SyncSeeing(max_batch_size=1, max_queue_time=0, executor=pool)
        assert await asyncio.gather(*(caller(b, i) for i in range(4))) == list(range(4))
        assert len(b.seen) == 4
        batches_saw_no_caller(b)
        await b.stop()
    thread_default = SyncSeeing(max_batch_size=1, max_queue_time=0)  # the loop's default executor
    assert await asyncio.gather(*(caller(thread_default, i) for i in range(4))) == list(range(4))
    batches_saw_no_caller(thread_default)
    await thread_default.stop()


async def test_a_streaming_batch_sees_no_callers_context() -> None:
    b = StreamSeeing(max_batch_size=2, max_queue_time=0)
    assert await asyncio.gather(*(stream_caller(b, i) for i in range(5))) == [[i * 10] for i in range(5)]
    assert len(b.seen) >= 3
    batches_saw_no_caller(b)
    await b.stop()


async def test_batch_functions_see_no_callers_context() -> None:
    seen: list[str] = []

    @batch(max_queue_time=0, max_batch_size=2)
    async def double(items: list[int]) -> list[int]:
        seen.append(request_id.get())
        request_id.set("set by double")
        return [x * 2 for x in items]

    @batch(max_queue_time=0, max_batch_size=2)
    def triple(items: list[int]) -> list[int]:
        seen.append(request_id.get())
        request_id.set("set by triple")
        return [x * 3 for x in items]

    for f, factor in ((double, 2), (triple, 3)):

        async def call(i: int, f: Any = f) -> int:
            request_id.set(f"request-{i}")
            result: int = await f(i)
            assert request_id.get() == f"request-{i}"
            return result

        assert await asyncio.gather(*(call(i) for i in range(5))) == [i * factor for i in range(5)]
        await f.stop()
    assert len(seen) >= 6 and set(seen) == {"-"}, seen


async def test_the_first_caller_does_not_lend_its_context_to_on_start_or_to_the_run() -> None:
    b = Hooked(max_queue_time=0)
    app.set("the caller's app")  # (a caller's, like its request id: not the batcher's)
    assert await caller(b, 1) == 1
    await b.stop()
    assert b.hooks == [("on_start", "-", "-"), ("on_stop", "-", "-")]
    batches_saw_no_caller(b)


async def test_start_gives_the_run_its_context_and_every_batch_a_fresh_copy() -> None:
    # What the code that starts the batcher set (an application's context, around a lifespan) is every batch's.
    async def lifespan() -> Hooked:
        app.set("my app")
        b = Hooked(max_queue_time=0, max_batch_size=2)
        async with b:
            assert await asyncio.gather(*(caller(b, i) for i in range(5))) == list(range(5))
        return b

    b = await asyncio.create_task(lifespan())
    assert app.get() == "-"
    assert [(rid, a) for _, rid, a in b.seen] == [("-", "my app")] * len(b.seen) and len(b.seen) >= 3
    # Neither the callers' request ids nor what on_start or an earlier batch set.
    assert b.hooks == [("on_start", "-", "my app"), ("on_stop", "-", "my app")]


async def test_callers_from_threads_do_not_lend_their_context_either() -> None:
    b = Seeing(max_queue_time=0.01, max_batch_size=8)
    b.start()
    loop = asyncio.get_running_loop()

    def call_from_thread(i: int) -> int:
        request_id.set(f"thread-{i}")
        return b.process_sync(i, timeout=30)

    results = await asyncio.gather(*(loop.run_in_executor(None, call_from_thread, i) for i in range(4)))
    assert results == list(range(4))
    batches_saw_no_caller(b)
    await b.stop()


def test_a_loop_thread_started_by_a_blocking_call_serves_batches_in_an_empty_context() -> None:
    b = Hooked(max_queue_time=0)
    request_id.set("the main thread's")
    seen_in: list[str] = []

    def call(i: int) -> None:
        request_id.set(f"thread-{i}")
        assert b.process_sync(i, timeout=30) == i
        seen_in.append(request_id.get())

    threads = [threading.Thread(target=call, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    b.stop_sync()
    assert sorted(seen_in) == ["thread-0", "thread-1", "thread-2"]
    batches_saw_no_caller(b)
    assert [(hook, rid) for hook, rid, _ in b.hooks] == [("on_start", "-"), ("on_stop", "-")]


class Item:
    """An item that can be watched with a weak reference."""


async def test_a_batch_its_context_and_its_items_are_freed_as_it_ends_without_the_cyclic_collector() -> None:
    # A batch's context holds the batch (for current_batch()), and the batch its context: the end breaks the cycle.
    class Async(AsyncBatcher[Item, int]):
        async def process_batch(self, batch: list[Item]) -> list[int]:
            return [1] * len(batch)

    class Sync(AsyncBatcher[Item, int]):
        def process_batch(self, batch: list[Item]) -> list[int]:  # type: ignore[override]
            return [1] * len(batch)

    class Stream(AsyncBatcher[Item, int]):
        async def process_batch(self, batch: list[Item]) -> AsyncIterator[list[Any]]:  # type: ignore[override]
            yield [END] * len(batch)

    for cls in (Async, Sync, Stream):
        b = cls(max_queue_time=0)
        b.start()
        gc.collect()
        gc.disable()
        try:
            item = Item()
            ref = weakref.ref(item)
            if cls is Stream:
                assert [part async for part in b.stream(item)] == []
            else:
                assert await b.process(item) == 1
            del item
            await until(lambda b=b: b.stats.in_flight == 0)
            for _ in range(3):  # (the batch's task finishes its last step)
                await asyncio.sleep(0)
            assert ref() is None, f"{cls.__name__}: the batch's item outlived it"
        finally:
            gc.enable()
        await b.stop()
