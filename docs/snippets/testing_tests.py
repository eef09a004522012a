"""Tests of code that uses a batcher, on a virtual clock (with the conftest.py
above): a batcher's waits pass exactly, and take no time.

pytest test_batches.py
"""

import asyncio

import pytest

from async_batcher import AsyncBatcher
from async_batcher.testing import flush, idle, record_batches

# asyncio: needed in pytest-asyncio's strict mode (its default), harmless in auto.
pytestmark = [pytest.mark.asyncio, pytest.mark.virtual_time]


class Doubler(AsyncBatcher[int, int]):  # yours: the batcher your code uses
    async def process_batch(self, batch: list[int]) -> list[int]:
        return [x * 2 for x in batch]


async def test_a_lone_batch_waits_max_queue_time() -> None:
    async with Doubler(max_queue_time=5.0) as doubler:  # 5 s, in no time
        with record_batches(doubler) as batches:
            results = await asyncio.gather(*(doubler.process(i) for i in (1, 2)))
    assert results == [2, 4]
    [batch] = batches
    assert batch.items == [1, 2] and batch.reason == "deadline"
    assert batch.waited == (5.0, 5.0)  # exactly: the clock jumped to the deadline


async def test_full_batches_go_at_once() -> None:
    async with Doubler(max_batch_size=4, max_queue_time=5.0) as doubler:
        with record_batches(doubler) as batches:
            await asyncio.gather(*(doubler.process(i) for i in range(10)))
    assert [(b.size, b.reason, b.started) for b in batches] == [
        (4, "full", 0.0),
        (4, "full", 0.0),
        (2, "deadline", 5.0),
    ]


async def test_flush_sends_what_waits_now() -> None:
    loop = asyncio.get_running_loop()
    async with Doubler(max_queue_time=60.0) as doubler:
        calls = [asyncio.ensure_future(doubler.process(i)) for i in range(3)]
        await asyncio.sleep(0)  # the calls submit their items
        with record_batches(doubler) as batches:
            await flush(doubler)  # sent now, whatever max_queue_time says
        assert [(b.items, b.reason) for b in batches] == [([0, 1, 2], "flush")]
        assert await asyncio.gather(*calls) == [0, 2, 4]
        assert loop.time() == 0.0  # no time passed
        assert idle(doubler) == []  # nothing waits, no timer is armed
