"""Deadlines that reach the batch: an item whose caller's deadline has passed is never sent, and
``current_batch().deadline`` is the earliest deadline of the batch's live items (issue 45, part 5)."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import Any

import pytest

from async_batcher import AsyncBatcher, current_batch, testing
from async_batcher.policies import Deadline
from tests.batchers import Recording, idle_and_clean

pytestmark = pytest.mark.virtual_time


# The next batch forms the moment one ends (no turns of the loop first, in which the timeouts' timer would fire).
def no_turns() -> Deadline:
    """A plain greedy policy, the loop's turns off (a policy serves one batcher: a new one each)."""
    return Deadline(0.0, turns=0)


class Stalling(Recording):
    """Its first batch moves the (virtual) clock on by ``stall`` seconds without letting the loop run: the timers
    that fall due meanwhile (the callers' timeouts) fire only after the batch has ended and the next one formed
    (with :func:`no_turns`)."""

    def __init__(self, *, stall: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stall = stall

    async def process_batch(self, batch: list[int]) -> Any:
        if not self.batches:
            loop = asyncio.get_running_loop()
            assert isinstance(loop, testing.VirtualClockLoop)
            loop.advance(self.stall)
        return await super().process_batch(batch)


async def test_an_item_whose_deadline_passed_while_it_waited_is_never_sent() -> None:
    b = Stalling(stall=10.0, concurrency=1, policy=no_turns())
    first = asyncio.ensure_future(b.process(1))
    await asyncio.sleep(0)
    late = asyncio.ensure_future(b.process(2, timeout=1.0))
    on_time = asyncio.ensure_future(b.process(3, timeout=60.0))
    assert await first == 2
    with pytest.raises(TimeoutError):
        await late
    assert await on_time == 6
    assert b.batches == [[1], [3]]  # 2 was due back at t=1: the batch formed at t=10 left it out
    assert b.stats.timed_out == 1
    await b.stop()
    idle_and_clean(b)


async def test_a_process_many_call_past_its_deadline_is_never_sent() -> None:
    b = Stalling(stall=10.0, concurrency=1, policy=no_turns())
    first = asyncio.ensure_future(b.process(1))
    await asyncio.sleep(0)
    late = asyncio.ensure_future(b.process_many([2, 3], timeout=1.0))
    with pytest.raises(TimeoutError):
        await late
    assert await first == 2
    assert b.sent == [1]
    assert b.stats.timed_out == 2
    await b.stop()
    idle_and_clean(b)


class KeyedStalling(Stalling):
    def batch_key(self, item: int) -> Hashable:
        return item % 2


async def test_a_keyed_process_many_call_past_its_deadline_is_never_sent() -> None:
    b = KeyedStalling(stall=10.0, concurrency=1, policy=no_turns())
    first = asyncio.ensure_future(b.process(1))
    await asyncio.sleep(0)
    late = asyncio.ensure_future(b.process_many([2, 3, 4], timeout=1.0))
    with pytest.raises(TimeoutError):
        await late
    assert await first == 2
    await b.stop()
    assert b.sent == [1]
    assert b.stats.timed_out == 3
    idle_and_clean(b)


async def test_a_default_timeout_is_each_items_deadline() -> None:
    b = Stalling(stall=10.0, concurrency=1, policy=no_turns(), default_timeout=1.0)
    first = asyncio.ensure_future(b.process(1))
    await asyncio.sleep(0)
    late = asyncio.ensure_future(b.process(2))
    assert await first == 2
    with pytest.raises(TimeoutError):
        await late
    assert b.sent == [1]
    await b.stop()
    idle_and_clean(b)


class Deadlines(AsyncBatcher[int, Any]):
    """Answers each item with the batch's deadline as ``process_batch`` sees it, and the time then."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seen: list[tuple[float | None, float]] = []

    async def process_batch(self, batch: list[int]) -> list[Any]:
        seen = (current_batch().deadline, asyncio.get_running_loop().time())
        self.seen.append(seen)
        return [seen] * len(batch)


async def test_current_batch_deadline_is_the_earliest_of_its_items() -> None:
    async with Deadlines(max_queue_time=0.5) as b:
        results = await asyncio.gather(b.process(1, timeout=5.0), b.process(2, timeout=3.0), b.process(3))
        deadline, now = results[0]
        assert now == 0.5
        assert deadline == 3.0
        # Without a timeout among its items, a batch has no deadline.
        assert (await b.process(4))[0] is None


async def test_current_batch_deadline_leaves_out_the_callers_who_left() -> None:
    gate = asyncio.Event()
    seen: list[float | None] = []

    class Late(AsyncBatcher[int, int]):
        async def process_batch(self, batch: list[int]) -> list[int]:
            await gate.wait()
            seen.append(current_batch().deadline)
            return batch

    async with Late(max_queue_time=0.0) as b:
        soon = asyncio.ensure_future(b.process(1, timeout=2.0))
        later = asyncio.ensure_future(b.process(2, timeout=7.0))
        await asyncio.sleep(1.0)
        soon.cancel()
        await asyncio.sleep(0)
        gate.set()
        assert await later == 2
        with pytest.raises(asyncio.CancelledError):
            await soon
    assert seen == [7.0]


async def test_a_process_many_calls_deadline_is_its_items() -> None:
    async with Deadlines(max_queue_time=0.0) as b:
        results = await b.process_many([1, 2], timeout=4.0)
        assert [deadline for deadline, _ in results] == [4.0, 4.0]
