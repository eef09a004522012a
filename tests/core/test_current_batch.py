"""``current_batch()``: each caller's context, and who has left, as ``process_batch`` may ask (contract point 13)."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest

from async_batcher import END, AsyncBatcher, CurrentBatch, batch, current_batch
from tests.batchers import until

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")


class PerCaller(AsyncBatcher[int, str]):
    """Answers each item with its caller's request id, read as that caller (``run_as_caller``)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.views: list[CurrentBatch] = []

    async def process_batch(self, batch: list[int]) -> list[str]:
        view = current_batch()
        self.views.append(view)
        assert view.size == len(batch) and request_id.get() == "-"
        from_contexts = [context.get(request_id) for context in view.contexts]
        as_callers = [view.run_as_caller(i, request_id.get) for i in range(len(batch))]
        assert from_contexts == as_callers
        return [f"{x}:{rid}" for x, rid in zip(batch, as_callers, strict=True)]


async def call(b: AsyncBatcher[int, str], i: int, rid: str | None = None) -> str:
    request_id.set(rid or f"request-{i}")
    return await b.process(i)


async def test_each_item_gets_its_callers_context_in_the_order_of_the_batch() -> None:
    b = PerCaller(max_batch_size=8, max_queue_time=0.01)
    assert await asyncio.gather(*(call(b, i) for i in range(5))) == [f"{i}:request-{i}" for i in range(5)]
    assert [view.size for view in b.views] == [5]
    await b.stop()


async def test_a_process_many_calls_items_share_its_callers_context_beside_single_callers() -> None:
    b = PerCaller(max_batch_size=8, max_queue_time=0.01)

    async def many() -> list[str]:
        request_id.set("bulk")
        return await b.process_many([10, 11, 12])

    single, bulk, other = await asyncio.gather(call(b, 1), many(), call(b, 2))
    assert (single, bulk, other) == ("1:request-1", ["10:bulk", "11:bulk", "12:bulk"], "2:request-2")
    assert [view.size for view in b.views] == [5]
    await b.stop()


async def test_keyed_and_weighted_items_keep_their_contexts_too() -> None:
    class Keyed(PerCaller):
        def batch_key(self, item: int) -> int:
            return item % 2

        def item_weight(self, item: int) -> float:
            return 1.0

    b = Keyed(max_batch_size=8, max_queue_time=0.01, max_batch_weight=100)

    async def many() -> list[str]:
        request_id.set("bulk")
        return await b.process_many([10, 11])

    results = await asyncio.gather(call(b, 1), many(), call(b, 2))
    assert results == ["1:request-1", ["10:bulk", "11:bulk"], "2:request-2"]
    assert sorted(view.key for view in b.views) == [0, 1]  # type: ignore[type-var]
    await b.stop()


async def test_run_as_caller_runs_in_a_copy_what_it_sets_stays_there() -> None:
    seen: list[str] = []

    class Setting(AsyncBatcher[int, int]):
        async def process_batch(self, batch: list[int]) -> list[int]:
            view = current_batch()
            view.run_as_caller(0, request_id.set, "changed")
            seen.append(view.run_as_caller(0, request_id.get))
            seen.append(view.contexts[0].get(request_id, "?"))
            return batch

    b = Setting(max_queue_time=0)
    request_id.set("mine")
    assert await b.process(1) == 1
    assert request_id.get() == "mine" and seen == ["mine", "mine"]
    await b.stop()


async def test_the_tasks_of_a_batch_see_it_and_can_run_as_a_caller() -> None:
    class Spawning(AsyncBatcher[int, str]):
        async def process_batch(self, batch: list[int]) -> list[str]:
            view = current_batch()

            async def one(i: int) -> str:
                return f"{batch[i]}:{request_id.get()}"

            async def size() -> int:
                return current_batch().size

            # A task it starts sees the batch (the batch's context); one started in a caller's, that caller's.
            assert await asyncio.create_task(size()) == len(batch)
            tasks = [asyncio.create_task(one(i), context=view.contexts[i].copy()) for i in range(len(batch))]
            return list(await asyncio.gather(*tasks))

    b = Spawning(max_queue_time=0.01)
    assert await asyncio.gather(*(call(b, i) for i in range(3))) == [f"{i}:request-{i}" for i in range(3)]
    await b.stop()


async def test_a_plain_def_in_its_thread_and_a_batch_function_see_their_batch() -> None:
    threads: list[int] = []

    class Threaded(AsyncBatcher[int, str]):
        def process_batch(self, batch: list[int]) -> list[str]:
            threads.append(threading.get_ident())
            view = current_batch()
            return [f"{x}:{view.run_as_caller(i, request_id.get)}" for i, x in enumerate(batch)]

    @batch(max_queue_time=0.01)
    def tagged(items: list[int]) -> list[str]:
        return [f"{x}:{context.get(request_id)}" for x, context in zip(items, current_batch().contexts, strict=True)]

    b = Threaded(max_queue_time=0.01)
    assert await asyncio.gather(*(call(b, i) for i in range(3))) == [f"{i}:request-{i}" for i in range(3)]
    assert threads and threading.get_ident() not in threads

    async def call_tagged(i: int) -> str:
        request_id.set(f"request-{i}")
        result: str = await tagged(i)
        return result

    assert await asyncio.gather(*(call_tagged(i) for i in range(3))) == [f"{i}:request-{i}" for i in range(3)]
    await b.stop()
    await tagged.stop()


async def test_callers_from_threads_lend_their_thread_context_to_their_items() -> None:
    b = PerCaller(max_queue_time=0.01)
    b.start()
    loop = asyncio.get_running_loop()

    def from_thread(i: int) -> str:
        request_id.set(f"thread-{i}")
        return b.process_sync(i, timeout=30)

    results = await asyncio.gather(*(loop.run_in_executor(None, from_thread, i) for i in range(3)))
    assert results == [f"{i}:thread-{i}" for i in range(3)]
    await b.stop()


async def test_a_streaming_batch_sees_the_contexts_of_the_items_as_they_are_at_each_step() -> None:
    steps: list[list[str]] = []

    class Streaming(AsyncBatcher[int, str]):
        continuous_batching = True

        async def process_batch(self, batch: list[int]) -> AsyncIterator[list[Any]]:
            while batch:
                view = current_batch()
                ids = [context.get(request_id) for context in view.contexts]
                steps.append(ids)
                # Each item's stream ends after two parts; the first one alone ends at once.
                yield [END if x == 0 or ids.count(rid) > 1 else f"{x}:{rid}" for x, rid in zip(batch, ids, strict=True)]
                yield [END] * len(batch)

    b = Streaming(max_batch_size=4, max_queue_time=0)

    async def read(i: int) -> list[str]:
        request_id.set(f"request-{i}")
        return [part async for part in b.stream(i)]

    first = asyncio.create_task(read(0))
    await until(lambda: steps)
    rest = [asyncio.create_task(read(i)) for i in (1, 2)]
    assert [await first, *await asyncio.gather(*rest)] == [[], ["1:request-1"], ["2:request-2"]]
    assert steps[0] == ["request-0"] and ["request-1", "request-2"] in steps
    await b.stop()


def test_current_batch_outside_a_batch_says_where_it_works() -> None:
    with pytest.raises(RuntimeError, match=r"only available inside process_batch"):
        current_batch()


async def test_an_item_index_outside_the_batch_is_an_index_error() -> None:
    errors: list[str] = []

    class Probing(AsyncBatcher[int, int]):
        async def process_batch(self, batch: list[int]) -> list[int]:
            view = current_batch()
            for probe in (view.is_live, lambda i: view.run_as_caller(i, int)):
                with pytest.raises(IndexError) as caught:
                    probe(len(batch))
                errors.append(str(caught.value))
            assert view.is_live(-1)  # (from the end, as a list's)
            return batch

    b = Probing(max_queue_time=0.01)
    assert await b.process_many([1, 2]) == [1, 2] and await b.process(3) == 3
    assert errors == ["item 2 is not in this batch of 2 items"] * 2 + ["item 1 is not in this batch of 1 item"] * 2
    await b.stop()


# ---------------------------------------------------------------------- callers who left


class Skipping(AsyncBatcher[int, int]):
    """A long batch: it waits at a gate, then computes only the rows whose callers still wait."""

    def __init__(self, gate: asyncio.Event, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.gate = gate
        self.computed: list[int] = []
        self.departed: list[tuple[int, ...]] = []

    async def process_batch(self, batch: list[int]) -> list[int | None]:
        view = current_batch()
        await self.gate.wait()
        self.departed.append(view.departed)
        results: list[int | None] = []
        for i, x in enumerate(batch):
            if not view.is_live(i):
                results.append(None)  # nobody receives it
                continue
            self.computed.append(x)
            results.append(x * 2)
        return results


@pytest.mark.virtual_time
async def test_a_long_batch_skips_the_rows_of_callers_cancelled_or_timed_out_while_it_ran() -> None:
    gate = asyncio.Event()
    b = Skipping(gate, max_batch_size=10, max_queue_time=0.1)
    calls = {x: asyncio.ensure_future(b.process(x, timeout=5.0 if x == 3 else None)) for x in range(6)}
    bulk = asyncio.ensure_future(b.process_many([10, 11], timeout=5.0))
    await asyncio.sleep(0.5)  # (on the virtual clock: the batch went at 0.1)
    assert (b.stats.in_flight, b.stats.queued) == (1, 0)  # all eight in one batch, held at the gate
    calls[1].cancel()
    calls[4].cancel()
    await asyncio.sleep(6)  # (on the virtual clock) the timeouts of 3 and of the bulk call expire
    gate.set()
    done = await asyncio.gather(*calls.values(), bulk, return_exceptions=True)
    assert b.departed == [(1, 3, 4, 6, 7)]
    assert b.computed == [0, 2, 5]
    assert [type(r).__name__ if isinstance(r, BaseException) else r for r in done] == [
        0,
        "CancelledError",
        4,
        "TimeoutError",
        "CancelledError",
        10,
        "TimeoutError",
    ]
    await b.stop()


async def test_a_forced_stop_leaves_no_caller_live() -> None:
    gate = asyncio.Event()
    live: list[tuple[bool, ...]] = []

    class Cut(AsyncBatcher[int, int]):
        async def process_batch(self, batch: list[int]) -> list[int]:
            view = current_batch()
            entered.set()
            try:
                await gate.wait()
            finally:
                live.append(tuple(view.is_live(i) for i in range(len(batch))))
            return batch

    entered = asyncio.Event()
    b = Cut(max_queue_time=0.01)
    callers = [asyncio.ensure_future(b.process(x)) for x in range(3)]
    await entered.wait()
    await b.stop(force=True)
    assert [type(r).__name__ for r in await asyncio.gather(*callers, return_exceptions=True)] == [
        "BatcherStoppedError"
    ] * 3
    await until(lambda: live)  # (the batch's task runs its finally once its cancellation reaches it)
    assert live == [(False, False, False)]


async def test_a_stream_whose_consumer_left_is_departed_at_the_next_step() -> None:
    seen: list[tuple[int, ...]] = []
    left = asyncio.Event()

    class Streaming(AsyncBatcher[int, int]):
        async def process_batch(self, batch: list[int]) -> AsyncIterator[list[int]]:
            yield list(batch)
            await left.wait()
            seen.append(current_batch().departed)
            yield list(batch)

    b = Streaming(max_queue_time=0.01, max_batch_size=2)

    async def read(x: int, leave: bool) -> list[int]:
        parts = []
        async for part in b.stream(x):
            parts.append(part)
            if leave:
                break
        return parts

    leaving = asyncio.ensure_future(read(0, True))
    staying = asyncio.ensure_future(read(1, False))
    assert await leaving == [0]
    left.set()
    assert await staying == [1, 1]
    assert seen == [(0,)]
    await b.stop()
