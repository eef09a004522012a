"""The owner's way in (async_batcher.shared): ``_submit`` (process() without its coroutine: the item's future) and
``_watch_sent`` (the callers' contexts of each batch as it goes)."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator, Hashable
from typing import Any

import pytest

from async_batcher import AsyncBatcher, QueueFullException
from tests.batchers import Recording, idle_and_clean, turns

pytestmark = pytest.mark.virtual_time

TAG: contextvars.ContextVar[str] = contextvars.ContextVar("tag", default="")


def tagged(b: AsyncBatcher[Any, Any], tag: str, item: Any, **kwargs: Any) -> asyncio.Future[Any]:
    """``b._submit(item)`` from a context whose TAG is ``tag``."""

    def submit() -> asyncio.Future[Any]:
        TAG.set(tag)
        return b._submit(item, **kwargs)

    return contextvars.copy_context().run(submit)


async def test_submitted_items_are_batched_and_answered_through_their_futures() -> None:
    async with Recording(max_batch_size=10, max_queue_time=0.01) as b:
        futures = [b._submit(i) for i in range(3)]
        assert not any(f.done() for f in futures)
        assert await asyncio.gather(*futures) == [0, 2, 4]
        assert b.batches == [[0, 1, 2]]
        idle_and_clean(b)


async def test_cancelling_the_future_withdraws_an_item_not_yet_sent() -> None:
    async with Recording(max_batch_size=10, max_queue_time=0.01) as b:
        kept, dropped = b._submit(1), b._submit(2)
        dropped.cancel()
        assert await kept == 2
        assert b.sent == [1]
        assert b.stats.cancelled == 1
        idle_and_clean(b)


async def test_the_long_paths_honour_timeouts_and_priorities() -> None:
    gate = asyncio.Event()
    async with Recording(max_batch_size=2, max_queue_time=0, concurrency=1, gate=gate) as b:
        first = b._submit(0)
        await turns(2)  # the first batch is in flight, holding the one slot
        late = b._submit(1, timeout=0.5)
        low, high = b._submit(2, priority=5), b._submit(3, priority=-5)
        with pytest.raises(TimeoutError):
            await late
        gate.set()
        assert list(await asyncio.gather(first, low, high)) == [0, 4, 6]
        assert b.batches == [[0], [3, 2]]  # the timed-out item never went; the higher priority first
        assert b.stats.timed_out == 1
        idle_and_clean(b)


async def test_a_full_queue_refuses_or_waits_as_process_does() -> None:
    gate = asyncio.Event()
    async with Recording(max_batch_size=1, max_queue_size=1, concurrency=1, gate=gate, max_queue_time=0) as b:
        sent = b._submit(0)
        await turns(2)
        queued = b._submit(1)
        refused = b._submit(2)
        with pytest.raises(QueueFullException):
            await refused
        b.wait_when_full = True
        waiting = b._submit(3)
        await turns(3)
        assert not waiting.done()
        gate.set()
        assert list(await asyncio.gather(sent, queued, waiting)) == [0, 2, 6]
        idle_and_clean(b)


class Keyed(Recording):
    def batch_key(self, item: int) -> Hashable:
        return item % 2

    def dedup_key(self, item: int) -> Hashable | None:
        return item


async def test_keys_and_dedup_apply_and_each_caller_context_is_watched() -> None:
    seen: list[list[str]] = []
    async with Keyed(max_batch_size=10, max_queue_time=0.01) as b:
        b._watch_sent(lambda contexts: seen.append(sorted(c.get(TAG, "") for c in contexts)))
        futures = [tagged(b, tag, item) for tag, item in [("a", 1), ("b", 2), ("c", 1), ("d", 3)]]
        assert await asyncio.gather(*futures) == [2, 4, 2, 6]
        assert sorted(b.batches) == [[1, 3], [2]]  # by key; the second 1 shared the first's row
        assert sorted(seen) == [["a", "c", "d"], ["b"]]  # the caller that shared a row is watched too
        idle_and_clean(b)


async def test_the_end_of_each_batch_is_watched_after_its_futures_resolve() -> None:
    ended: list[tuple[list[str], bool]] = []
    async with Recording(max_batch_size=10, max_queue_time=0.01) as b:
        futures = [tagged(b, tag, item) for tag, item in [("a", 1), ("b", 2)]]
        b._watch_sent(
            lambda contexts: None,
            lambda contexts: ended.append((sorted(c.get(TAG, "") for c in contexts), all(f.done() for f in futures))),
        )
        assert list(await asyncio.gather(*futures)) == [2, 4]
    assert ended == [(["a", "b"], True)]


async def test_watching_stops_and_needs_a_started_batcher() -> None:
    b = Recording(max_batch_size=10, max_queue_time=0.01)
    with pytest.raises(RuntimeError, match="not started"):
        b._watch_sent(lambda contexts: None)
    seen: list[int] = []
    async with b:
        stop = b._watch_sent(lambda contexts: seen.append(len(contexts)))
        await b._submit(1)
        stop()
        stop()  # (idempotent)
        await b._submit(2)
    assert seen == [1]


class Steps(AsyncBatcher[int, int]):
    """Streams three steps; items waiting join between them."""

    continuous_batching = True

    async def process_batch(self, batch: list[int]) -> AsyncIterator[list[int]]:
        for _ in range(3):
            yield list(batch)
            await asyncio.sleep(0.1)


async def test_items_that_join_a_running_stream_are_watched() -> None:
    seen: list[list[str]] = []
    async with Steps(max_batch_size=10, max_queue_time=0) as b:
        b._watch_sent(lambda contexts: seen.append([c.get(TAG, "") for c in contexts]))

        async def consume(tag: str, item: int) -> list[int]:
            TAG.set(tag)
            return [part async for part in b.stream(item)]

        first = asyncio.create_task(consume("a", 1))
        await asyncio.sleep(0.05)  # the batch runs
        second = asyncio.create_task(consume("b", 2))
        assert await first == [1, 1, 1]
        assert (await second)[:1] == [2]  # (it joined for the steps left)
        assert seen == [["a"], ["b"]]
