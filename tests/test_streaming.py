"""Streaming: an async generator ``process_batch``, ``stream(item)`` per caller, every guarantee per stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from async_batcher import END, AsyncBatcher, BatcherStoppedError, BatchSizeMismatchError, batch
from tests.batchers import until

pytestmark = pytest.mark.virtual_time


class Counter(AsyncBatcher[int, str]):
    """Item ``n`` streams ``n`` parts (``"n.0"``, ``"n.1"``, ...), one per step of 1 s; records each step's batch."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.steps: list[list[int]] = []
        self.closed = 0
        self.step_delay = 1.0

    async def process_batch(self, batch: list[int]) -> AsyncIterator[list[Any]]:
        done: dict[int, int] = {}
        try:
            while batch:
                self.steps.append(list(batch))
                await asyncio.sleep(self.step_delay)
                parts: list[Any] = []
                for n in batch:
                    k = done.get(n, 0)
                    parts.append(f"{n}.{k}" if k < n else END)
                    done[n] = k + 1
                yield parts
        finally:
            self.closed += 1


async def collect(stream: AsyncIterator[Any]) -> list[Any]:
    return [part async for part in stream]


def settled(b: AsyncBatcher[Any, Any]) -> bool:
    s = b.stats
    return s.submitted == s.succeeded + s.failed + s.cancelled + s.timed_out and s.queued == s.in_flight == 0


async def test_each_caller_gets_its_own_parts_in_order_and_its_stream_ends() -> None:
    b = Counter(max_queue_time=0)
    results = await asyncio.gather(*(collect(b.stream(n)) for n in (1, 3, 2)))
    assert results == [["1.0"], ["3.0", "3.1", "3.2"], ["2.0", "2.1"]]
    # One batch; an item whose stream ended leaves the batch before the next step.
    assert b.steps == [[1, 3, 2], [1, 3, 2], [3, 2], [3]] and b.closed == 1
    assert b.stats.batches == 1 and b.stats.succeeded == 3 and settled(b)
    await b.stop()


async def test_a_consumer_that_stops_early_drops_out_and_the_others_go_on() -> None:
    b = Counter(max_queue_time=0)

    async def first_two(n: int) -> list[str]:
        got = []
        async for part in b.stream(n):
            got.append(part)
            if len(got) == 2:
                break
        return got

    results = await asyncio.gather(first_two(5), collect(b.stream(4)))
    assert results == [["5.0", "5.1"], ["4.0", "4.1", "4.2", "4.3"]]
    assert 5 not in b.steps[3]  # gone from the batch once its consumer left
    assert b.stats.cancelled == 1 and settled(b)
    await b.stop()


async def test_a_cancelled_consumer_drops_out_and_one_not_yet_sent_never_reaches_the_batch() -> None:
    b = Counter(max_queue_time=0, max_batch_size=2)
    running = [asyncio.ensure_future(collect(b.stream(n))) for n in (4, 3)]
    waiting = asyncio.ensure_future(collect(b.stream(9)))
    await until(lambda: b.steps)
    running[0].cancel()
    waiting.cancel()
    assert await running[1] == ["3.0", "3.1", "3.2"]
    for task in (running[0], waiting):
        with pytest.raises(asyncio.CancelledError):
            await task
    assert all(9 not in step for step in b.steps) and len(b.steps[1]) == 1
    assert b.stats.cancelled == 2 and settled(b)
    await b.stop()


async def test_an_error_for_one_item_ends_only_its_stream() -> None:
    class Failing(Counter):
        async def process_batch(self, batch: list[int]) -> AsyncIterator[list[Any]]:
            yield [f"{n}.0" for n in batch]
            yield [ValueError(f"bad {n}") if n == 2 else f"{n}.1" for n in batch]

    b = Failing(max_queue_time=0)
    one, two = b.stream(1), b.stream(2)
    first = asyncio.ensure_future(collect(one))
    got: list[str] = []
    with pytest.raises(ValueError, match="bad 2"):
        async for part in two:
            got.append(part)
    assert got == ["2.0"]  # the parts before the error first
    assert await first == ["1.0", "1.1"]
    assert (b.stats.failed, b.stats.succeeded) == (1, 1) and settled(b)
    await b.stop()


@pytest.mark.parametrize("what", ["raise", "wrong_length", "not_a_sequence"])
async def test_a_failing_generator_ends_every_open_stream_with_its_error(what: str) -> None:
    class Broken(Counter):
        async def process_batch(self, batch: list[int]) -> AsyncIterator[Any]:
            yield [f"{n}.0" for n in batch]
            if what == "raise":
                raise KeyError("model died")
            yield [f"{n}.1" for n in batch][:-1] if what == "wrong_length" else 7

    b = Broken(max_queue_time=0)
    results = await asyncio.gather(*(collect(b.stream(n)) for n in (1, 2)), return_exceptions=True)
    expected = {"raise": KeyError, "wrong_length": BatchSizeMismatchError, "not_a_sequence": TypeError}[what]
    assert all(isinstance(r, expected) for r in results), results
    assert b.stats.failed == 2 and settled(b)
    assert await collect(Counter(max_queue_time=0).stream(1)) == ["1.0"]  # (and a new batcher serves on)
    await b.stop()


async def test_a_stop_drains_the_streams_and_a_forced_stop_ends_them() -> None:
    b = Counter(max_queue_time=0)
    drained = asyncio.ensure_future(collect(b.stream(3)))
    await until(lambda: b.steps)
    await b.stop()
    assert await drained == ["3.0", "3.1", "3.2"]
    b.start()
    forced = asyncio.ensure_future(collect(b.stream(100)))
    await asyncio.sleep(5.5)  # (virtual time) five steps in
    await b.stop(force=True)
    with pytest.raises(BatcherStoppedError):
        await forced
    assert b.closed == 2  # the generator was closed (its finally ran), not left suspended
    assert settled(b)


async def test_a_slow_consumer_holds_its_batch_within_its_buffer() -> None:
    b = Counter(max_queue_time=0, stream_buffer=2)
    b.step_delay = 0.0
    slow = b.stream(50)
    first = await anext(slow)  # then it stops reading for a while
    fast = asyncio.ensure_future(collect(b.stream(50)))
    await asyncio.sleep(10)
    assert first == "50.0" and len(b.steps) <= 4  # the buffer fills, the generator waits: no unbounded buffering
    assert not fast.done()
    rest = await collect(slow)
    assert len(rest) == 49 and len(await fast) == 50
    await b.stop()


async def test_continuous_batching_lets_waiting_items_join_a_running_batch() -> None:
    class Continuous(Counter):
        continuous_batching = True

    b = Continuous(max_queue_time=0, max_batch_size=3)
    first = asyncio.ensure_future(collect(b.stream(4)))
    await until(lambda: b.steps)
    later = [asyncio.ensure_future(collect(b.stream(n))) for n in (2, 3, 1)]
    assert await first == ["4.0", "4.1", "4.2", "4.3"]
    assert [len(r) for r in await asyncio.gather(*later)] == [2, 3, 1]
    # Two joined at the next step (three at most); the third when the first of them ended.
    assert b.steps[:4] == [[4], [4, 2, 3], [4, 2, 3], [4, 2, 3]] and b.steps[4] == [4, 3, 1]
    assert b.stats.batches == 1 and max(len(step) for step in b.steps) == 3 and settled(b)
    await b.stop()


async def test_a_stream_times_out_as_a_whole() -> None:
    loop = asyncio.get_running_loop()
    b = Counter(max_queue_time=0)
    got: list[str] = []
    with pytest.raises(TimeoutError):
        async for part in b.stream(10, timeout=3.5):
            got.append(part)
    assert loop.time() == 3.5 and got == ["10.0", "10.1", "10.2"]
    assert b.stats.timed_out == 1
    await b.stop()
    assert settled(b)


async def test_process_on_a_streaming_batcher_says_to_stream_and_stream_on_a_plain_one_has_one_part() -> None:
    b = Counter(max_queue_time=0)
    with pytest.raises(TypeError, match="stream"):
        await b.process(1)
    with pytest.raises(TypeError, match="stream"):
        await b.process_many([1])

    class Plain(AsyncBatcher[int, int]):
        async def process_batch(self, batch: list[int]) -> list[int]:
            return [x * 2 for x in batch]

    p = Plain(max_queue_time=0)
    assert await collect(p.stream(4)) == [8]
    await b.stop()
    await p.stop()


async def test_a_decorated_async_generator_streams_and_can_batch_continuously() -> None:
    @batch(max_queue_time=0, continuous=True)
    async def echo(texts: list[str]) -> AsyncIterator[list[Any]]:
        sent: dict[str, int] = {}
        while texts:
            parts: list[Any] = []
            for t in texts:
                k = sent.get(t, 0)
                parts.append(t[k] if k < len(t) else END)
                sent[t] = k + 1
            await asyncio.sleep(0.1)
            yield parts

    assert await asyncio.gather(collect(echo.stream("abc")), collect(echo.stream("de"))) == [list("abc"), list("de")]
    with pytest.raises(TypeError, match="stream"):
        await echo("abc")
    await echo.stop()
    with pytest.raises(TypeError, match="async generator"):
        batch(continuous=True)(lambda xs: xs)


class Letters(AsyncBatcher[str, str]):
    continuous_batching = True

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.steps: list[list[str]] = []

    def item_weight(self, item: str) -> float:
        return len(item)

    async def process_batch(self, batch: list[str]) -> AsyncIterator[list[Any]]:
        sent: dict[str, int] = {}
        while batch:
            self.steps.append(list(batch))
            await asyncio.sleep(1)
            parts: list[Any] = []
            for t in batch:
                k = sent.get(t, 0)
                parts.append(t[k] if k < len(t) else END)
                sent[t] = k + 1
            yield parts


async def test_items_that_join_a_running_batch_stay_within_max_batch_weight() -> None:
    b = Letters(max_queue_time=0, max_batch_weight=10)
    first = asyncio.ensure_future(joined(b.stream("aaaaaa")))  # weight 6
    await until(lambda: b.steps)
    later = [asyncio.ensure_future(joined(b.stream(t))) for t in ("bbbb", "cccccc")]  # weights 4 and 6
    assert await asyncio.gather(first, *later) == ["aaaaaa", "bbbb", "cccccc"]
    weights = [sum(len(t) for t in step) for step in b.steps]
    assert max(weights) <= 10, b.steps
    await b.stop()


async def joined(stream: AsyncIterator[str]) -> str:
    return "".join([p async for p in stream])
