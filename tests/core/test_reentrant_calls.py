"""Calls back into a batcher from inside its own batch: refused at once where they would wait for that batch (every
slot taken, no room in the queue, ``stop()``, a blocking call from a plain ``def process_batch``), on every path
(timeouts, priorities, ``process_many``, keyed lanes); a call into another batcher busy with its own batch waits
its turn. (Calls back from the hooks: tests/core/test_hooks.py.)

Every test bounds its waits (``asyncio.wait_for``, thread timeouts), so that a batcher that hangs fails the test
instead of hanging the suite.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from async_batcher import (
    AsyncBatcher,
    ReentrantCallError,
)
from tests.batchers import Recording, settled, until

WAIT = 10.0


async def test_process_from_inside_process_batch_with_every_slot_taken_is_refused() -> None:
    class Reentrant(AsyncBatcher[int, Any]):
        async def process_batch(self, batch: list[int]) -> list[Any]:
            try:
                return [await self.process(x + 100) for x in batch]
            except ReentrantCallError as exc:
                return [exc] * len(batch)

    # (An Exception among the results is raised to its caller.)
    b = Reentrant(max_queue_time=0)
    for _ in range(2):
        with pytest.raises(ReentrantCallError, match="concurrency=1"):
            await asyncio.wait_for(b.process(1), WAIT)
    assert b.stats.failed == 4 and settled(b)  # each time the inner item and the outer one
    # With a second slot the inner item is served there; its own batch, one level down, finds every slot taken.
    b2 = Reentrant(max_queue_time=0, concurrency=2)
    with pytest.raises(ReentrantCallError, match="concurrency=2"):
        await asyncio.wait_for(b2.process(1), WAIT)
    assert b2.stats.batches == 2 and settled(b2)
    await b.stop()
    await b2.stop()


@pytest.mark.parametrize("bulk", [False, True])
async def test_process_from_inside_process_batch_that_would_wait_for_room_is_refused(bulk: bool) -> None:
    # Every slot taken by the batch that calls, the queue full, another caller in line: waiting for room would
    # wait for the calling batch to end.
    class Reentrant(AsyncBatcher[int, Any]):
        async def process_batch(self, batch: list[int]) -> list[Any]:
            if batch == [-1]:
                raise ValueError("an earlier failure")
            if batch != [1]:
                return batch
            await full.wait()
            try:
                inner = self.process_many([100]) if bulk else self.process(100)
                return [await inner]
            except ReentrantCallError as exc:
                return [exc]

    full = asyncio.Event()
    b = Reentrant(max_queue_time=0, max_queue_size=1, wait_when_full=True)
    with pytest.raises(ValueError):
        await b.process(-1)
    outer = asyncio.ensure_future(b.process(1))
    await until(lambda: b.stats.in_flight == 1)
    queued = asyncio.ensure_future(b.process(2))
    in_line = asyncio.ensure_future(b.process(3))
    await until(lambda: b.stats.queued == 1)
    full.set()
    with pytest.raises(ReentrantCallError, match="concurrency=1"):
        await asyncio.wait_for(outer, WAIT)
    assert await asyncio.wait_for(asyncio.gather(queued, in_line), WAIT) == [2, 3]
    assert b.stats.failed == 3 and settled(b)  # the earlier one, the outer item, and the inner one refused
    await b.stop()


async def test_stop_awaited_inside_process_batch_is_refused() -> None:
    class StopsItself(AsyncBatcher[int, Any]):
        async def process_batch(self, batch: list[int]) -> list[Any]:
            try:
                await self.stop()
            except ReentrantCallError as exc:
                return [exc] * len(batch)
            return batch

    b = StopsItself(max_queue_time=0)
    with pytest.raises(ReentrantCallError) as info:
        await asyncio.wait_for(b.process(1), WAIT)
    assert str(info.value) == (
        "StopsItself: stop() awaited inside its own process_batch would wait for that batch forever; "
        "stop it from outside the batch"
    )
    assert await b.is_running()
    await b.stop()


def test_a_blocking_call_from_inside_a_sync_process_batch_is_refused() -> None:
    class Blocking(AsyncBatcher[int, Any]):
        def process_batch(self, batch: list[int]) -> list[Any]:
            try:
                return [self.process_sync(x + 100, timeout=WAIT) for x in batch]
            except ReentrantCallError as exc:
                return [exc] * len(batch)

    b = Blocking(max_queue_time=0)
    with pytest.raises(ReentrantCallError, match="blocking call"):
        b.process_sync(1, timeout=WAIT)
    b.stop_sync()


@pytest.mark.parametrize("how", ["timeout", "priority", "many", "keyed"])
async def test_reentrant_calls_on_the_long_paths_are_refused_too(how: str) -> None:
    class Reentrant(AsyncBatcher[int, Any]):
        def batch_key(self, item: int) -> int:
            return 0  # one key: the keyed paths, on one lane

        async def process_batch(self, batch: list[int]) -> list[Any]:
            if batch[0] >= 100:
                return batch
            try:
                if how == "timeout":
                    await self.process(100, timeout=WAIT)
                elif how == "priority":
                    await self.process(100, priority=-1)
                else:
                    await self.process_many([100, 101])
            except ReentrantCallError as exc:
                return [exc] * len(batch)
            return batch

    cls = Reentrant if how == "keyed" else type("Plain", (Reentrant,), {"batch_key": AsyncBatcher.batch_key})
    b = cls(max_queue_time=0)
    with pytest.raises(ReentrantCallError, match="do the work directly"):
        await asyncio.wait_for(b.process(1), WAIT)
    assert settled(b) and b.stats.failed == (3 if how in ("many", "keyed") else 2)
    await b.stop()


async def test_a_nested_batcher_busy_with_its_own_batch_is_waited_for_not_refused() -> None:
    gate = asyncio.Event()
    inner = Recording(max_queue_time=0, gate=gate)

    class Outer(AsyncBatcher[int, int]):
        async def process_batch(self, batch: list[int]) -> list[int]:
            return [await inner.process(x) for x in batch]  # another batcher: no deadlock, it waits its turn

    outer = Outer(max_queue_time=0)
    busy = asyncio.ensure_future(inner.process(-1))  # the inner's only slot is taken
    await until(lambda: inner.batches)
    call = asyncio.ensure_future(outer.process(5))
    await asyncio.sleep(0.01)
    gate.set()
    assert await asyncio.wait_for(call, WAIT) == 10 and await busy == -2
    await outer.stop()
    await inner.stop()
