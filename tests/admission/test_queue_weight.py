"""``max_queue_weight`` (issue 46): the weight admitted and not yet answered, held until each call resolves."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from async_batcher import (
    AsyncBatcher,
    Limits,
    OversizedItemError,
    QueueFullException,
    batch,
)
from tests.batchers import Recording, engine_of, idle_and_clean, until

pytestmark = pytest.mark.virtual_time


class Weighed(Recording):
    """Doubles its items; an item weighs itself."""

    def item_weight(self, item: int) -> float:
        return float(item)


async def held(b: Recording, *items: int) -> list[asyncio.Future[int]]:
    """``items`` in a batch held in flight (the batcher's gate is closed)."""
    calls = [asyncio.ensure_future(b.process(x)) for x in items]
    await until(lambda: b.batches and b.stats.in_flight == 1)
    return calls


async def test_an_item_heavier_than_the_limit_is_refused_at_once_even_when_callers_may_wait() -> None:
    b = Weighed(max_queue_weight=10, wait_when_full=True)
    with pytest.raises(OversizedItemError, match="weight 11 can never fit in max_queue_weight=10") as info:
        await b.process(11)
    assert isinstance(info.value, ValueError) and not isinstance(info.value, QueueFullException)
    assert (info.value.weight, info.value.limit) == (11, 10)
    with pytest.raises(OversizedItemError, match="a call of 2 items of weight 12"):
        await b.process_many([6, 6])
    assert b.stats.rejected == 3 and dict(b.stats.rejected_reasons) == {"oversized": 3}
    assert await b.process(10) == 20  # the limit itself fits
    await b.stop()
    idle_and_clean(b)


async def test_the_weight_is_held_until_the_call_resolves_not_until_it_is_sent() -> None:
    gate = asyncio.Event()
    b = Weighed(max_queue_weight=10, max_queue_time=0, gate=gate)
    first = await held(b, 4, 4)
    assert b.stats.queued == 0 and b.stats.queue_weight == 8  # sent, not answered: still held
    with pytest.raises(QueueFullException, match=r"max_queue_weight=10, 8 admitted"):
        await b.process(3)
    assert dict(b.stats.rejected_reasons) == {"queue_weight": 1}
    two = asyncio.ensure_future(b.process(2))  # 8 + 2 = 10 fits
    await until(lambda: b.stats.queue_weight == 10)
    gate.set()
    assert await asyncio.gather(*first, two) == [8, 8, 4]
    await until(lambda: b.stats.queue_weight == 0)
    await b.stop()
    idle_and_clean(b)


async def test_every_outcome_gives_the_weight_back() -> None:
    class Failing(Weighed):
        async def process_batch(self, batch: list[int]) -> Any:
            await asyncio.sleep(1)
            if 7 in batch:
                raise RuntimeError("boom")
            return [ValueError("odd") if x % 2 else x for x in batch]

    # A batch per item, five at once: 2, 3, 7, 10 and 12 in flight, 8 queued.
    b = Failing(max_queue_weight=100, max_batch_size=1, concurrency=5, max_queue_time=0)
    ok = asyncio.ensure_future(b.process(2))
    per_item_error = asyncio.ensure_future(b.process(3))
    raised = asyncio.ensure_future(b.process(7))
    cancelled_in_flight = asyncio.ensure_future(b.process(10))
    timed_out = asyncio.ensure_future(b.process(12, timeout=0.5))
    cancelled_queued = asyncio.ensure_future(b.process(8))
    await until(lambda: b.stats.in_flight == 5 and b.stats.queue_weight == 42)
    cancelled_queued.cancel()
    await until(lambda: b.stats.queue_weight == 34)  # withdrawn from the queue: given back at once
    await asyncio.sleep(0.55)
    assert b.stats.queue_weight == 22  # 12 timed out in flight: given back then, not when its batch ends
    cancelled_in_flight.cancel()
    await until(lambda: b.stats.queue_weight == 12)
    results = await asyncio.gather(
        ok, per_item_error, raised, cancelled_queued, cancelled_in_flight, timed_out, return_exceptions=True
    )
    kinds = [type(r).__name__ if isinstance(r, BaseException) else r for r in results]
    assert kinds == [2, "ValueError", "RuntimeError", "CancelledError", "CancelledError", "TimeoutError"]
    await until(lambda: b.stats.queue_weight == 0)
    bulk = asyncio.ensure_future(b.process_many([2, 4]))
    await until(lambda: b.stats.queue_weight == 6)
    assert await bulk == [2, 4]
    await until(lambda: b.stats.queue_weight == 0)
    stuck = asyncio.ensure_future(b.process(20))
    await until(lambda: b.stats.in_flight == 1)
    await b.stop(force=True)
    with pytest.raises(Exception, match=r"stop|cancel"):
        await stuck
    assert engine_of(b).room.held == 0
    idle_and_clean(b)


async def test_a_large_item_at_the_head_of_the_line_is_not_overtaken_by_small_ones() -> None:
    gate = asyncio.Event()
    b = Weighed(max_queue_weight=10, max_queue_time=0, max_batch_size=1, wait_when_full=True, gate=gate)
    order: list[int] = []

    async def call(x: int) -> int:
        result = await b.process(x)
        order.append(x)
        return result

    first = await held(b, 6)
    big = asyncio.ensure_future(call(9))  # 6 + 9 > 10: waits
    await until(lambda: b.stats.awaiting_room == 1)
    small = [asyncio.ensure_future(call(1)) for _ in range(3)]  # 6 + 1 would fit, but 9 is first in line
    await until(lambda: b.stats.awaiting_room == 4)
    assert b.stats.queue_weight == 6
    gate.set()
    await asyncio.gather(*first, big, *small)
    assert order == [9, 1, 1, 1]  # the large one first: it was first in line
    assert b.batches == [[6], [9], [1], [1], [1]]
    await b.stop()
    idle_and_clean(b)


async def test_a_waiter_that_can_never_fit_once_the_limit_is_lowered_is_refused_then() -> None:
    gate = asyncio.Event()
    b = Weighed(max_queue_weight=10, max_queue_time=0, wait_when_full=True, gate=gate)
    first = await held(b, 5)
    waiting = asyncio.ensure_future(b.process(8))
    small = asyncio.ensure_future(b.process(2))
    await until(lambda: b.stats.awaiting_room == 2)
    b.max_queue_weight = 7
    with pytest.raises(OversizedItemError, match="lowered while it waited"):
        await waiting
    gate.set()  # the small one waited behind it, and now fits
    assert await asyncio.gather(*first, small) == [10, 4]
    b.max_queue_weight = 100  # raised: nothing to wake, nothing lost
    assert await b.process(50) == 100
    await b.stop()
    idle_and_clean(b)


async def test_raising_the_limit_wakes_the_line_and_a_timeout_in_line_gives_its_place_back() -> None:
    gate = asyncio.Event()
    b = Weighed(max_queue_weight=10, max_queue_time=0, wait_when_full=True, gate=gate)
    first = await held(b, 9)
    timed = asyncio.ensure_future(b.process(5, timeout=1.0))
    after = asyncio.ensure_future(b.process(4))
    await until(lambda: b.stats.awaiting_room == 2)
    with pytest.raises(TimeoutError):
        await timed
    assert b.stats.awaiting_room == 1 and b.stats.queue_weight == 9
    b.max_queue_weight = 20
    await until(lambda: b.stats.awaiting_room == 0)
    assert b.stats.queue_weight == 13
    gate.set()
    assert await asyncio.gather(*first, after) == [18, 8]
    await b.stop()
    idle_and_clean(b)


async def test_a_stream_holds_its_weight_until_it_ends() -> None:
    release = asyncio.Event()

    class Streamer(AsyncBatcher[int, int]):
        def item_weight(self, item: int) -> float:
            return float(item)

        async def process_batch(self, batch: list[int]) -> Any:
            yield batch
            await release.wait()
            yield [x + 1 for x in batch]

    b = Streamer(max_queue_weight=10, max_queue_time=0)
    parts: list[int] = []

    async def consume() -> None:
        async for part in b.stream(6):
            parts.append(part)

    task = asyncio.ensure_future(consume())
    await until(lambda: parts == [6])
    assert b.stats.queue_weight == 6
    with pytest.raises(QueueFullException):
        await anext(b.stream(5))
    release.set()
    await task
    assert parts == [6, 7]
    await until(lambda: b.stats.queue_weight == 0)
    await b.stop()


def test_without_item_weight_the_limit_is_an_error_naming_the_hook_at_construction_and_live() -> None:
    # Every item would weigh 1: a bound on their number, which max_queue_size is; accepted, it said something else.
    needs = r"max_queue_weight=2\.0 needs the item_weight\(\) hook, which the batcher does not override"
    with pytest.raises(ValueError, match=needs) as info:
        Recording(max_queue_weight=2)
    assert "max_queue_size" in str(info.value) and "@batch: weight=" in str(info.value)
    with pytest.raises(ValueError, match=needs):
        Recording(limits=Limits(max_queue_weight=2))
    b = Recording(max_batch_size=4)
    with pytest.raises(ValueError, match=needs):
        b.max_queue_weight = 2
    with pytest.raises(ValueError, match=needs):
        b.limits = Limits(max_batch_size=4, max_queue_weight=2)
    assert b.limits == Limits(max_batch_size=4)  # the old value kept
    with pytest.raises(ValueError, match="weight="):
        batch(max_queue_weight=2)(_double)
    assert batch(max_queue_weight=2, weight=len)(_double).batcher.max_queue_weight == 2.0


async def _double(items: list[str]) -> list[str]:
    return [x * 2 for x in items]


async def test_a_too_heavy_item_for_max_batch_weight_is_an_oversized_item_error_and_a_value_error() -> None:
    b = Weighed(max_batch_weight=5)
    with pytest.raises(ValueError, match=r"max_batch_weight=5\.0") as info:
        await b.process(6)
    assert isinstance(info.value, OversizedItemError) and info.value.limit == 5
    await b.stop()


async def test_an_item_heavier_than_both_limits_is_refused_naming_max_queue_weight() -> None:
    # The guide's example (max_queue_weight=1 000 000, max_batch_weight=800 000, an item of 1 200 000) was refused
    # naming max_batch_weight: the limit of a batch, not of what gets in, which the example is about.
    b = Weighed(max_queue_weight=10, max_batch_weight=8)
    with pytest.raises(OversizedItemError, match="weight 11 can never fit in max_queue_weight=10") as info:
        await b.process(11)
    assert (info.value.weight, info.value.limit) == (11, 10)
    with pytest.raises(OversizedItemError, match=r"weight 9\.0 can never fit in max_batch_weight=8\.0"):
        await b.process(9)  # over max_batch_weight alone: that one
    assert dict(b.stats.rejected_reasons) == {"oversized": 2}
    await b.stop()


@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf, True, "10"])
def test_the_limit_is_a_finite_number_above_zero(bad: object) -> None:
    with pytest.raises(ValueError, match=f"max_queue_weight must be None or a finite number > 0, got {bad!r}"):
        Limits(max_queue_weight=bad)  # type: ignore[arg-type]
    b = Recording()
    with pytest.raises(ValueError, match="max_queue_weight"):
        b.max_queue_weight = bad  # type: ignore[assignment]
    assert b.max_queue_weight is None


def test_the_limit_is_a_field_of_limits_and_a_keyword() -> None:
    assert Weighed(max_queue_weight=5).limits == Limits(max_queue_weight=5.0)
    assert Weighed(limits=Limits(max_queue_weight=5)).max_queue_weight == 5.0
    with pytest.raises(TypeError, match="not both"):
        Weighed(limits=Limits(), max_queue_weight=5)
