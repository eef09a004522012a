"""Attacks on the failure handling (issue 45): what a hostile or careless ``process_batch``, hook or caller can do to
a bisection, a retry, a split or a deadline. Every wait here is bounded; every caller resolves once."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from async_batcher import (
    AsyncBatcher,
    AsyncBatchException,
    BatcherStoppedError,
    BatchSizeMismatchError,
    TransientError,
    testing,
)
from async_batcher.failures import Isolate, Retry, RetryPolicy, SplitOn
from tests.batchers import engine_of, idle_and_clean, until

pytestmark = pytest.mark.virtual_time

NO_JITTER = {"jitter": False}


class Scripted(AsyncBatcher[int, Any]):
    """``process_batch`` is ``script(batch, call number)``; records every call."""

    def __init__(self, script: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.script = script
        self.calls: list[list[int]] = []

    async def process_batch(self, batch: list[int]) -> Any:
        self.calls.append(list(batch))
        return await self.script(batch, len(self.calls))


async def test_a_process_batch_that_answers_retry_for_everything_forever_ends() -> None:
    async def forever(batch: list[int], call: int) -> list[Any]:
        return [Retry() for _ in batch]

    b = Scripted(forever, retry=RetryPolicy(attempts=4, budget=None, **NO_JITTER), max_queue_time=0.0)
    results = await asyncio.gather(*(b.process(x) for x in range(50)), return_exceptions=True)
    assert all(isinstance(r, TransientError) for r in results)
    assert len(b.calls) == 4
    await b.stop()
    idle_and_clean(b)


async def test_a_process_batch_that_raises_a_transient_error_forever_ends() -> None:
    async def down(batch: list[int], call: int) -> list[Any]:
        raise ConnectionError("down")

    b = Scripted(down, retry=RetryPolicy(attempts=3, retry_on=(ConnectionError,), **NO_JITTER), max_queue_time=0.0)
    with pytest.raises(ConnectionError):
        await b.process(1)
    assert len(b.calls) == 3
    await b.stop()


async def test_a_deadline_of_zero_is_never_sent() -> None:
    async def double(batch: list[int], call: int) -> list[int]:
        return [x * 2 for x in batch]

    b = Scripted(double, max_queue_time=0.0)
    with pytest.raises(TimeoutError):
        await b.process(1, timeout=0)
    with pytest.raises(TimeoutError):
        await b.process_many([1, 2], timeout=0)
    assert b.calls == []
    assert b.stats.timed_out == 3
    await b.stop()
    idle_and_clean(b)


async def test_process_batch_that_empties_its_list_before_failing_is_still_bisected() -> None:
    async def spiteful(batch: list[int], call: int) -> list[int]:
        bad = 3 in batch
        kept = list(batch)
        batch.clear()
        if bad:
            raise ValueError("bad 3")
        return [x * 2 for x in kept]

    b = Scripted(spiteful, max_batch_size=8, max_queue_time=1.0, on_batch_error=Isolate())
    results = await asyncio.gather(*(b.process(x) for x in range(8)), return_exceptions=True)
    assert [isinstance(r, ValueError) for r in results] == [x == 3 for x in range(8)]
    assert [r for x, r in enumerate(results) if x != 3] == [2 * x for x in range(8) if x != 3]
    await b.stop()


async def test_process_batch_that_reorders_its_list_and_asks_for_retries() -> None:
    async def reorder(batch: list[int], call: int) -> list[Any]:
        answer: list[Any] = [Retry() if call == 1 and x % 2 else x * 2 for x in batch]
        batch.reverse()
        return answer

    b = Scripted(reorder, retry=RetryPolicy(**NO_JITTER), max_batch_size=6, max_queue_time=1.0)
    assert await asyncio.gather(*(b.process(x) for x in range(6))) == [2 * x for x in range(6)]
    assert b.calls[1] == [1, 3, 5]
    await b.stop()


async def test_a_part_with_the_wrong_number_of_results_fails_that_part_only() -> None:
    async def short(batch: list[int], call: int) -> list[int]:
        if 0 in batch and len(batch) > 1:
            raise ValueError("bad 0")
        if batch == [2, 3]:
            return [1]  # one result for two items
        return [x * 2 for x in batch]

    b = Scripted(short, max_batch_size=4, max_queue_time=1.0, on_batch_error=Isolate())
    results = await asyncio.gather(*(b.process(x) for x in range(4)), return_exceptions=True)
    assert results[0] == 0 and results[1] == 2
    assert all(isinstance(r, BatchSizeMismatchError) for r in results[2:])
    await b.stop()
    idle_and_clean(b)


async def test_out_of_memory_on_a_single_item_fails_it_alone_and_keeps_the_ceiling() -> None:
    async def tiny(batch: list[int], call: int) -> list[int]:
        raise MemoryError("nothing fits")

    b = Scripted(tiny, max_queue_time=0.0, split_on=SplitOn(MemoryError))
    with pytest.raises(MemoryError):
        await b.process(1)
    assert b.calls == [[1]]
    assert b.stats.ceilings == {}  # one item alone says nothing of the batch size
    await b.stop()


async def test_out_of_memory_at_every_size_ends_with_every_item_failed_alone() -> None:
    async def nothing_fits(batch: list[int], call: int) -> list[int]:
        raise MemoryError("nothing fits")

    b = Scripted(nothing_fits, max_batch_size=16, max_queue_time=1.0, split_on=SplitOn(MemoryError))
    results = await asyncio.gather(*(b.process(x) for x in range(16)), return_exceptions=True)
    assert all(isinstance(r, MemoryError) for r in results)
    assert len(b.calls) <= 2 * 16
    assert b.stats.ceilings == {None: 1.0}
    await b.stop()
    idle_and_clean(b)


async def test_a_huge_batch_with_one_bad_item_costs_a_few_calls() -> None:
    n = 10_000

    async def one_bad(batch: list[int], call: int) -> list[int]:
        if 4321 in batch:
            raise ValueError("bad 4321")
        return batch

    b = Scripted(one_bad, max_batch_size=n, max_queue_time=1.0, on_batch_error=Isolate())
    results = await b.process_many(list(range(n)), return_exceptions=True)
    assert isinstance(results[4321], ValueError)
    assert sum(isinstance(r, ValueError) for r in results) == 1
    assert len(b.calls) - 1 <= 2 * math.ceil(math.log2(n))
    await b.stop()


async def test_on_poison_that_submits_to_the_same_batcher_is_not_refused() -> None:
    parked: list[asyncio.Task[Any]] = []

    async def bad_once(batch: list[int], call: int) -> list[int]:
        if 1 in batch:
            raise ValueError("bad 1")
        return batch

    def park(item: int, error: BaseException) -> None:
        parked.append(asyncio.ensure_future(b.process(item + 100)))  # every slot is taken: its own batch's

    b = Scripted(bad_once, max_batch_size=2, concurrency=1, max_queue_time=0.0, on_batch_error=Isolate(on_poison=park))
    results = await asyncio.gather(b.process(0), b.process(1), return_exceptions=True)
    assert results[0] == 0 and isinstance(results[1], ValueError)
    assert await parked[0] == 101
    await b.stop()
    idle_and_clean(b)


async def test_on_poison_that_stops_the_batcher() -> None:
    stops: list[asyncio.Task[None]] = []

    async def bad(batch: list[int], call: int) -> list[int]:
        if 1 in batch:
            raise ValueError("bad 1")
        return batch

    def stop(item: int, error: BaseException) -> None:
        stops.append(asyncio.ensure_future(b.stop()))

    b = Scripted(bad, max_batch_size=4, max_queue_time=1.0, on_batch_error=Isolate(on_poison=stop))
    results = await asyncio.gather(*(b.process(x) for x in range(4)), return_exceptions=True)
    await stops[0]
    assert [isinstance(r, ValueError) for r in results] == [False, True, False, False]
    idle_and_clean(b)


async def test_turning_split_on_off_during_a_split_leaves_no_ceiling() -> None:
    gate = asyncio.Event()

    async def oom(batch: list[int], call: int) -> list[int]:
        if call == 2:
            await gate.wait()
        if len(batch) > 2:
            raise MemoryError
        return batch

    b = Scripted(oom, max_batch_size=8, max_queue_time=0.0, split_on=SplitOn(MemoryError))
    calls = [asyncio.ensure_future(b.process(x)) for x in range(8)]
    await until(lambda: len(b.calls) == 2)
    b.split_on = None
    gate.set()
    assert await asyncio.gather(*calls) == list(range(8))
    assert b.stats.ceilings == {}
    assert testing.violations(b) == []
    await b.stop()


async def test_a_retry_policy_removed_while_items_wait_in_their_backoff() -> None:
    async def once(batch: list[int], call: int) -> list[Any]:
        return [Retry() if call == 1 else x for x in batch]

    b = Scripted(once, retry=RetryPolicy(backoff=1.0, **NO_JITTER), max_queue_time=0.0)
    call = asyncio.ensure_future(b.process(5))
    await until(lambda: len(b.calls) == 1)
    b.retry = None
    assert await call == 5  # what was handed back is tried again; what fails from now on is not
    await b.stop()
    idle_and_clean(b)


async def slow_oom(batch: list[int], call: int) -> list[int]:
    """A second a call; more than one item runs out of memory."""
    await asyncio.sleep(1.0)
    if len(batch) > 1:
        raise MemoryError
    return batch


async def test_a_stop_during_a_split_waits_for_its_parts() -> None:
    b = Scripted(slow_oom, max_batch_size=4, max_queue_time=0.0, split_on=SplitOn(MemoryError))
    calls = [asyncio.ensure_future(b.process(x)) for x in range(4)]
    await asyncio.sleep(0.5)
    await b.stop()
    assert await asyncio.gather(*calls) == [0, 1, 2, 3]
    idle_and_clean(b)


async def test_a_forced_stop_during_a_split_fails_every_part_once() -> None:
    b = Scripted(slow_oom, max_batch_size=8, max_queue_time=0.0, split_on=SplitOn(MemoryError))
    calls = [asyncio.ensure_future(b.process(x)) for x in range(8)]
    await asyncio.sleep(3.5)  # 8 -> 4 -> 2 -> the first 1 under way
    await b.stop(force=True)
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert any(isinstance(r, BatcherStoppedError) for r in results)
    assert all(isinstance(r, BatcherStoppedError) or r == x for x, r in enumerate(results))
    idle_and_clean(b)


async def test_cancelling_every_caller_of_a_batch_in_its_backoff_ends_the_drain() -> None:
    async def throttled(batch: list[int], call: int) -> list[Any]:
        return [Retry() for _ in batch]

    b = Scripted(throttled, retry=RetryPolicy(backoff=30.0, **NO_JITTER), max_queue_time=0.0)
    calls = [asyncio.ensure_future(b.process(x)) for x in range(3)]
    await until(lambda: len(b.calls) == 1)
    for call in calls:
        call.cancel()
    await asyncio.gather(*calls, return_exceptions=True)
    began = asyncio.get_running_loop().time()
    await b.stop()
    # The backoff ended as its last caller left: the drain has nothing to wait for.
    assert asyncio.get_running_loop().time() == began
    assert len(b.calls) == 1
    idle_and_clean(b)


async def test_a_bug_in_the_failure_handling_fails_the_batch_not_the_batcher(
    loop_errors: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from async_batcher._core.recovery import Recovery

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("bug")

    async def bad(batch: list[int], call: int) -> list[int]:
        if call == 1:
            raise ValueError("bad")
        return batch

    b = Scripted(bad, max_batch_size=2, max_queue_time=1.0, on_batch_error=Isolate())
    monkeypatch.setattr(Recovery, "_halves", broken)
    results = await asyncio.gather(b.process(1), b.process(2), return_exceptions=True)
    assert all(isinstance(r, AsyncBatchException) and "internal error" in str(r) for r in results)
    assert [c["message"] for c in loop_errors] == ["Scripted: internal error while handling a failed batch"]
    monkeypatch.undo()
    assert await b.process(3) == 3  # it serves on
    await b.stop()
    idle_and_clean(b)


async def test_an_item_in_its_backoff_whose_lane_was_let_go_comes_back_to_its_key() -> None:
    class Keyed(Scripted):
        def batch_key(self, item: int) -> int:
            return item

    async def first_try_fails_for_0(batch: list[int], call: int) -> list[Any]:
        return [Retry() if x == 0 and call == 1 else x for x in batch]

    b = Keyed(first_try_fails_for_0, retry=RetryPolicy(backoff=10.0, **NO_JITTER), max_queue_time=0.0)
    zero = asyncio.ensure_future(b.process(0))
    await until(lambda: len(b.calls) == 1)
    # Forty other keys come and go meanwhile: the idle lanes past sixteen are let go, key 0's among them.
    for x in range(1, 41):
        assert await b.process(x) == x
    assert 0 not in engine_of(b).queue.lanes and not zero.done()
    assert await zero == 0
    assert b.calls[-1] == [0]
    await b.stop()
    idle_and_clean(b)


async def test_splits_in_many_slots_at_once_keep_the_engine_consistent() -> None:
    async def oom(batch: list[int], call: int) -> list[int]:
        await asyncio.sleep(0.01 * (call % 3))
        if len(batch) > 3:
            raise MemoryError
        return batch

    b = Scripted(oom, max_batch_size=16, concurrency=None, max_queue_time=0.0, split_on=SplitOn(MemoryError))
    for _ in range(5):
        calls = [asyncio.ensure_future(b.process(x)) for x in range(64)]
        assert await asyncio.gather(*calls) == list(range(64))
        assert testing.violations(b) == []
    assert b.stats.ceilings == {None: 3.0}
    await b.stop()
    idle_and_clean(b)
