"""Streaming: an async generator ``process_batch``, ``stream(item)`` per caller, every guarantee per stream."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest

from async_batcher import (
    END,
    AsyncBatcher,
    BatcherStoppedError,
    BatchSizeMismatchError,
    OutcomeUnknownError,
    ProcessBatchCancelledError,
    QueueFullException,
    ReentrantCallError,
    batch,
)
from tests.batchers import settled, until

# Every wait of these tests is bounded on the loop's (virtual) clock: a batcher that hangs fails the test.
WAIT = 1000.0
# The tests on a real loop (real_loop): a hang fails them in seconds.
REAL_WAIT = 10.0

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
    b = Counter(max_queue_time=0, stream_buffer=2, stream_stall_timeout=60)
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


class Spelled(AsyncBatcher[str, str]):
    """Streams each text's letters, one per step of 1 s, batching continuously; records each step's batch."""

    continuous_batching = True

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.steps: list[list[str]] = []

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


class Letters(Spelled):
    """Each text weighs its length."""

    def item_weight(self, item: str) -> float:
        return len(item)


async def test_items_that_join_a_running_batch_stay_within_max_batch_weight() -> None:
    b = Letters(max_queue_time=0, max_batch_weight=10)
    first = asyncio.ensure_future(joined(b.stream("aaaaaa")))  # weight 6
    await until(lambda: b.steps)
    later = [asyncio.ensure_future(joined(b.stream(t))) for t in ("bbbb", "cccccc")]  # weights 4 and 6
    assert await asyncio.gather(first, *later) == ["aaaaaa", "bbbb", "cccccc"]
    weights = [sum(len(t) for t in step) for step in b.steps]
    assert max(weights) <= 10, b.steps
    assert b.stats.processed == 3  # each once, however many steps passed while "cccccc" could not join
    await b.stop()


async def joined(stream: AsyncIterator[str]) -> str:
    return "".join([p async for p in stream])


# ---------------------------------------------------------------------- hangs that were (issue 25)


class Endless(AsyncBatcher[int, int]):
    """Streams ``0, 1, 2, ...`` to every item, one part per step of 1 s, until its consumers leave."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.steps: list[list[int]] = []

    async def process_batch(self, batch: list[int]) -> AsyncIterator[list[int]]:
        k = 0
        while True:
            self.steps.append(list(batch))
            await asyncio.sleep(1)
            yield [k] * len(batch)
            k += 1


# A generator that ignores GeneratorExit stays suspended: Python reports it again as it is collected.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("how", ["finally_raises", "ignores_generator_exit"])
async def test_a_generator_that_fails_to_close_still_frees_its_slot(
    how: str, caplog: pytest.LogCaptureFixture, loop_errors: list[dict[str, Any]]
) -> None:
    class Unclosable(AsyncBatcher[int, int]):
        async def process_batch(self, batch: list[int]) -> AsyncIterator[list[Any]]:
            if how == "finally_raises":
                try:
                    while True:
                        yield [END] * len(batch)
                finally:
                    raise RuntimeError("cleanup failed")
            else:
                while True:
                    try:
                        yield [END] * len(batch)
                    except GeneratorExit:
                        pass  # and yields again

    b = Unclosable(max_queue_time=0)
    async with asyncio.timeout(WAIT):
        with caplog.at_level(logging.WARNING, logger="async_batcher"):
            assert await collect(b.stream(1)) == []
            assert b.stats.in_flight == 0  # its slot is free
            assert await collect(b.stream(2)) == []  # the next batch runs
        await b.stop()
    assert "Unclosable: process_batch's generator raised RuntimeError as it was closed" in caplog.messages
    assert b.stats.batches == 2 and b.stats.succeeded == 2 and settled(b)
    assert all("asynchronous generator" in str(error.get("message")) for error in loop_errors), loop_errors


async def test_stream_called_inside_its_own_streaming_batch_is_refused() -> None:
    class Nested(AsyncBatcher[int, Any]):
        async def process_batch(self, batch: list[int]) -> AsyncIterator[list[Any]]:
            yield [[p async for p in self.stream(0)] for _ in batch]

    b = Nested(max_queue_time=0)
    async with asyncio.timeout(WAIT):
        with pytest.raises(ReentrantCallError) as refused:
            await collect(b.stream(1))
        await b.stop()
    assert str(refused.value) == (
        "Nested: an item submitted (process(), process_many() or stream()) from inside its own process_batch while "
        "every slot (concurrency=1) is taken would wait for its own batch forever; raise concurrency, or do the work "
        "directly"
    )
    s = b.stats
    assert (s.submitted, s.failed, s.queued) == (2, 2, 0) and settled(b)  # the stream, and the one it refused


async def test_a_consumer_that_stops_reading_without_leaving_is_dropped_after_the_stall_timeout() -> None:
    loop = asyncio.get_running_loop()
    b = Endless(max_queue_time=0, stream_buffer=3, stream_stall_timeout=5)
    kept = b.stream(1)
    other = b.stream(2)
    async with asyncio.timeout(WAIT):
        reader = asyncio.ensure_future(anext(other))
        async for part in kept:  # a break does not close an async generator still referenced: it stays open
            assert part == 0
            break
        await reader
        got = []
        async for part in other:
            got.append(part)
            if part == 12:
                break
        # Its buffer was full at 4.0 (parts 1 to 3); the step waited for it until 9.0, then went on without it.
        assert loop.time() == 18.0 and 1 not in b.steps[-1]
        assert b.stats.timed_out == 1
        await other.aclose()
        await b.stop()  # nothing is held back
        with pytest.raises(TimeoutError, match="stream_stall_timeout=5"):
            async for part in kept:  # its buffered parts, then the error
                got.append(part)
    assert got[-3:] == [1, 2, 3]
    assert settled(b)


async def test_a_stall_timeout_of_zero_never_waits_and_none_waits_as_long_as_it_takes() -> None:
    never = Endless(max_queue_time=0, stream_buffer=1, stream_stall_timeout=0)
    patient = Endless(max_queue_time=0, stream_buffer=1, stream_stall_timeout=None)
    async with asyncio.timeout(WAIT):
        for b in (never, patient):
            stalled = b.stream(1)
            assert await anext(stalled) == 0
            await asyncio.sleep(20)  # it reads nothing for a while
            if b is never:
                with pytest.raises(TimeoutError):
                    await anext(stalled)  # its one buffered part, then the error
                    await anext(stalled)
            else:
                assert [await anext(stalled) for _ in range(3)] == [1, 2, 3]
                await stalled.aclose()
            await b.stop()
    assert (never.stats.timed_out, patient.stats.timed_out) == (1, 0)
    assert len(never.steps) == 2 and len(patient.steps) == 4


@pytest.mark.parametrize("value", [-1, float("nan"), float("inf"), "5"])
def test_a_bad_stall_timeout_is_refused_naming_it(value: Any) -> None:
    with pytest.raises(ValueError, match=r"stream_stall_timeout.*" + str(value)):
        Endless(stream_stall_timeout=value)
    b = Endless(stream_stall_timeout=None)
    assert b.stream_stall_timeout is None and Endless().stream_stall_timeout == 10.0
    b.stream_stall_timeout = 0
    assert b.stream_stall_timeout == 0.0


async def test_aclosing_leaves_a_stream_at_once() -> None:
    b = Endless(max_queue_time=0, stream_buffer=1)
    other = b.stream(2)  # kept open: the batch goes on
    async with asyncio.timeout(WAIT):
        reader = asyncio.ensure_future(anext(other))
        async with contextlib.aclosing(b.stream(1)) as parts:
            async for part in parts:
                assert part == 0
                break
        assert await reader == 0 and await anext(other) == 1
        assert b.steps[:2] == [[1, 2], [2]] and b.stats.cancelled == 1  # gone at the next step, no stall
        await other.aclose()
        await b.stop()
    assert settled(b)


async def test_a_stop_does_not_wait_for_a_stalled_consumer_longer_than_the_stall_timeout() -> None:
    loop = asyncio.get_running_loop()
    b = Endless(max_queue_time=0, stream_buffer=2, stream_stall_timeout=3)
    kept = b.stream(1)
    async with asyncio.timeout(WAIT):
        assert await anext(kept) == 0
        await b.stop()  # no other consumer: the batch ends as its only stream is dropped
    assert loop.time() == 6.0 and b.stats.timed_out == 1
    await kept.aclose()
    assert settled(b)


# ---------------------------------------------------------------------- statistics of a stream batch


async def test_a_continuous_batch_counts_every_item_and_its_size_is_the_most_it_held_at_once() -> None:
    class Continuous(Counter):
        continuous_batching = True

    sizes: list[int] = []
    b = Continuous(max_queue_time=0, max_batch_size=2)
    b._recorder.add_observer(lambda size, waited, elapsed: sizes.append(size))
    async with asyncio.timeout(WAIT):
        assert [len(r) for r in await asyncio.gather(*(collect(b.stream(n)) for n in (1, 2, 3, 4, 5, 6)))] == [
            1,
            2,
            3,
            4,
            5,
            6,
        ]
    s = b.stats
    assert s.processed == 6 and s.succeeded == 6  # the items that joined it included
    assert s.batches == 1 and sizes == [2] and s.mean_batch_size == 2.0
    await b.stop()


async def test_a_stream_batch_whose_consumers_left_before_it_started_counts_only_the_others() -> None:
    class Starting(Counter):
        async def on_start(self) -> None:
            await asyncio.sleep(1)  # the batch is formed, and waits for it

    b = Starting(max_queue_time=0)
    leaving = asyncio.ensure_future(collect(b.stream(3)))
    staying = asyncio.ensure_future(collect(b.stream(2)))
    await asyncio.sleep(0.5)
    assert b.stats.in_flight == 1
    leaving.cancel()
    async with asyncio.timeout(WAIT):
        assert await staying == ["2.0", "2.1"]
        with pytest.raises(asyncio.CancelledError):
            await leaving
    assert (b.stats.processed, b.stats.mean_batch_size, b.steps[0]) == (1, 1.0, [2])
    await b.stop()


# ---------------------------------------------------------------------- what a mutation spot-check let through


async def test_an_exception_for_a_consumer_who_left_during_the_step_is_dropped_and_the_others_get_theirs() -> None:
    step = asyncio.Event()

    class Failing(AsyncBatcher[int, Any]):
        async def process_batch(self, batch: list[int]) -> AsyncIterator[list[Any]]:
            yield [f"{n}.0" for n in batch]
            await step.wait()  # the first consumer leaves meanwhile
            yield [ValueError(f"bad {n}") for n in batch]

    b = Failing(max_queue_time=0)
    first, second = b.stream(1), b.stream(2)
    async with asyncio.timeout(WAIT):
        assert await asyncio.gather(anext(first), anext(second)) == ["1.0", "2.0"]
        await first.aclose()
        step.set()
        with pytest.raises(ValueError, match="bad 2"):
            await anext(second)
        await b.stop()
    assert (b.stats.cancelled, b.stats.failed) == (1, 1) and settled(b)


@pytest.mark.parametrize("buffer", [1, 2, 5])
async def test_the_generator_runs_ahead_of_a_consumer_by_exactly_its_buffer(buffer: int) -> None:
    b = Endless(max_queue_time=0, stream_buffer=buffer)
    stream = b.stream(1)
    async with asyncio.timeout(WAIT):
        assert await anext(stream) == 0
        await asyncio.sleep(buffer + 3)  # (less than the stall timeout)
        # One part taken, `buffer` more waiting: the generator is suspended after yielding the last of them.
        assert len(b.steps) == buffer + 1
        assert [await anext(stream) for _ in range(buffer)] == list(range(1, buffer + 1))
        await stream.aclose()
        await b.stop()


async def test_a_stream_that_leaves_while_queued_gives_its_room_back() -> None:
    b = Counter(max_queue_time=0, max_queue_size=1, wait_when_full=True)
    async with asyncio.timeout(WAIT):
        running = asyncio.ensure_future(collect(b.stream(3)))
        await until(lambda: b.steps)
        queued = asyncio.ensure_future(collect(b.stream(2)))  # the queue is full
        await until(lambda: b.stats.queued == 1)
        waiting = asyncio.ensure_future(collect(b.stream(1)))  # waits for room
        await until(lambda: b.stats.submitted == 3)
        queued.cancel()
        await until(lambda: b.stats.queued == 1 and b.stats.submitted == 3 and not b.stats.awaiting_room)
        assert b.stats.queued == 1  # the one that waited took its room at once
        assert await waiting == ["1.0"] and await running == ["3.0", "3.1", "3.2"]
        with pytest.raises(asyncio.CancelledError):
            await queued
        await b.stop()
    assert settled(b)


async def test_items_that_join_a_running_batch_make_room_for_the_callers_waiting_for_it() -> None:
    class Continuous(Counter):
        continuous_batching = True

    b = Continuous(max_queue_time=0, max_queue_size=1, wait_when_full=True, max_batch_size=4)
    async with asyncio.timeout(WAIT):
        first = asyncio.ensure_future(collect(b.stream(5)))
        await until(lambda: b.steps)
        later = [asyncio.ensure_future(collect(b.stream(n))) for n in (2, 1)]  # one queued, one waiting for room
        assert [len(r) for r in await asyncio.gather(first, *later)] == [5, 2, 1]
    assert b.stats.batches == 1  # both joined the running batch: the first to join made room for the second
    await b.stop()


async def test_a_forced_stop_asks_abandoned_error_once_for_a_stream_batch() -> None:
    asked: list[list[int]] = []

    class Writer(Endless):
        def abandoned_error(self, batch: list[int], error: BaseException) -> BaseException:
            asked.append(list(batch))
            return OutcomeUnknownError("may have been sent")

    b = Writer(max_queue_time=0)
    streams = [asyncio.ensure_future(collect(b.stream(n))) for n in (1, 2)]
    async with asyncio.timeout(WAIT):
        await asyncio.sleep(1.5)
        assert len(b.steps) == 2
        await b.stop(force=True)
        for stream in streams:
            with pytest.raises(OutcomeUnknownError):
                await stream
    assert asked == [[1, 2]] and b.stats.failed == 2 and settled(b)


async def test_a_stream_refused_by_a_full_queue_is_never_sent() -> None:
    b = Counter(max_queue_time=0, max_queue_size=1)
    async with asyncio.timeout(WAIT):
        running = asyncio.ensure_future(collect(b.stream(2)))
        await until(lambda: b.steps)
        queued = asyncio.ensure_future(collect(b.stream(1)))
        await until(lambda: b.stats.queued == 1)
        with pytest.raises(QueueFullException):
            await collect(b.stream(9))
        assert await running == ["2.0", "2.1"] and await queued == ["1.0"]
    assert all(9 not in step for step in b.steps)
    await b.stop()


# ---------------------------------------------------------------------- what mutation testing let through


async def test_a_stream_batch_that_never_reached_process_batch_counts_no_batch_and_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Unstartable(Counter):
        async def on_start(self) -> None:
            raise ConnectionRefusedError("no model")

    b = Unstartable(max_queue_time=0)
    async with asyncio.timeout(WAIT):
        with caplog.at_level(logging.WARNING, logger="async_batcher"):
            results = await asyncio.gather(collect(b.stream(1)), collect(b.stream(2)), return_exceptions=True)
            await b.stop()
    assert all(isinstance(r, ConnectionRefusedError) for r in results), results
    assert caplog.messages == [
        "Unstartable: on_start() failed: ConnectionRefusedError",
        "Unstartable: a batch of 2 items failed before process_batch: ConnectionRefusedError",
    ]
    s = b.stats
    assert (s.batches, s.processed, s.failed, s.mean_batch_size) == (0, 0, 2, 0.0) and b.steps == [] and settled(b)


async def test_a_generator_that_raises_is_logged_as_such_and_one_that_raises_cancelled_error_cancels_no_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Raising(Counter):
        async def process_batch(self, batch: list[int]) -> AsyncIterator[list[Any]]:
            yield [f"{n}.0" for n in batch]
            raise asyncio.CancelledError if 0 in batch else KeyError("model died")

    b = Raising(max_queue_time=0)
    async with asyncio.timeout(WAIT):
        with caplog.at_level(logging.WARNING, logger="async_batcher"):
            raised = await asyncio.gather(collect(b.stream(1)), collect(b.stream(2)), return_exceptions=True)
            cancelled = await asyncio.gather(collect(b.stream(0)), return_exceptions=True)
        await b.stop()
    assert all(isinstance(r, KeyError) for r in raised), raised
    assert isinstance(cancelled[0], ProcessBatchCancelledError), cancelled  # not mistaken for a cancelled caller
    assert caplog.messages == [
        "Raising: process_batch raised KeyError on a batch of 2 items",
        "Raising: process_batch raised CancelledError on a batch of 1 item",
    ]
    assert b.stats.failed == 3 and settled(b)


async def test_a_stream_batch_whose_task_is_cancelled_from_outside_fails_its_open_streams_and_frees_its_slot(
    caplog: pytest.LogCaptureFixture,
) -> None:
    asked: list[list[int]] = []

    class Writer(Endless):
        def abandoned_error(self, batch: list[int], error: BaseException) -> BaseException:
            asked.append(list(batch))
            assert isinstance(error, BatcherStoppedError) and "stream batch cancelled" in str(error)
            return OutcomeUnknownError("may have been sent")

    b = Writer(max_queue_time=0)
    streams = [asyncio.ensure_future(collect(b.stream(n))) for n in (1, 2)]
    async with asyncio.timeout(WAIT):
        await asyncio.sleep(1.5)
        (task,) = asyncio.all_tasks() - {*streams, asyncio.current_task()}  # the batch's
        with caplog.at_level(logging.WARNING, logger="async_batcher"):
            task.cancel()  # as the event loop's shutdown would: its task cancelled, no stop
            for stream in streams:
                with pytest.raises(OutcomeUnknownError):
                    await stream
        assert b.stats.in_flight == 0 and asked == [[1, 2]]
        assert caplog.messages == [
            "Writer: a batch of 2 items was cut off, its task cancelled (the event loop shutting down); its callers "
            "get OutcomeUnknownError"
        ]
        nxt = b.stream(3)
        assert await anext(nxt) == 0  # it serves on
        await nxt.aclose()
        await b.stop()
    assert b.stats.failed == 2 and settled(b)


async def test_each_error_and_each_stall_is_counted() -> None:
    class Failing(Counter):
        async def process_batch(self, batch: list[int]) -> AsyncIterator[list[Any]]:
            yield [ValueError(n) if n % 2 else f"{n}.0" for n in batch]
            yield [END] * len(batch)

    b = Failing(max_queue_time=0)
    async with asyncio.timeout(WAIT):
        for _ in range(2):
            results = await asyncio.gather(*(collect(b.stream(n)) for n in (1, 2, 3)), return_exceptions=True)
            assert [type(r) for r in results] == [ValueError, list, ValueError]
        assert (b.stats.failed, b.stats.succeeded, b.stats.processed) == (4, 2, 6)
        stalled = Endless(max_queue_time=0, stream_buffer=1, stream_stall_timeout=1)
        kept = [stalled.stream(n) for n in (1, 2)]
        assert await asyncio.gather(*(anext(k) for k in kept)) == [0, 0]
        await stalled.stop()  # both stall, and are dropped in the same step
        assert stalled.stats.timed_out == 2
        for k in kept:
            await k.aclose()
    assert settled(b) and settled(stalled)


async def test_weights_come_into_play_on_a_running_continuous_batch() -> None:
    class Ones(Spelled):
        def item_weight(self, item: str) -> float:
            return 1.0

    b = Ones(max_queue_time=0)  # each item weighs 1; no weight limit until one is set
    async with asyncio.timeout(WAIT):
        first = asyncio.ensure_future(joined(b.stream("aaaa")))
        await asyncio.sleep(1.5)
        b.max_batch_weight = 2  # the running batch was formed without weights: each of its items weighs 1
        later = [asyncio.ensure_future(joined(b.stream(t))) for t in ("bb", "c")]
        assert await asyncio.gather(first, *later) == ["aaaa", "bb", "c"]
    assert max(len(step) for step in b.steps) == 2  # "c" waited for room within the weight limit
    await b.stop()


async def test_joined_items_count_their_weights_for_the_next_to_join() -> None:
    b = Letters(max_queue_time=0, max_batch_weight=10)
    async with asyncio.timeout(WAIT):
        first = asyncio.ensure_future(joined(b.stream("aaaaaa")))  # weight 6
        await asyncio.sleep(0.5)
        second = asyncio.ensure_future(joined(b.stream("bb")))  # weight 2: joins (8)
        await asyncio.sleep(1)
        third = asyncio.ensure_future(joined(b.stream("ccc")))  # weight 3: would make 11, waits
        assert await asyncio.gather(first, second, third) == ["aaaaaa", "bb", "ccc"]
    assert max(sum(len(t) for t in step) for step in b.steps) <= 10, b.steps
    assert b.stats.processed == 3
    await b.stop()


# ---------------------------------------------------------------------- a stream's admission and timeouts


def test_end_says_what_it_is() -> None:
    assert repr(END) == "async_batcher.END"


async def test_default_timeout_bounds_streams_and_each_timeout_is_counted() -> None:
    loop = asyncio.get_running_loop()
    b = Counter(max_queue_time=0, default_timeout=2.5)
    got: list[list[str]] = [[], []]

    async def read(n: int, into: list[str]) -> None:
        async for part in b.stream(n):
            into.append(part)

    async with asyncio.timeout(WAIT):
        results = await asyncio.gather(read(10, got[0]), read(9, got[1]), return_exceptions=True)
    assert [str(r) for r in results] == ["Counter: the stream did not end within the timeout"] * 2
    assert all(isinstance(r, TimeoutError) for r in results)
    assert loop.time() == 2.5 and got == [["10.0", "10.1"], ["9.0", "9.1"]]
    await b.stop()
    assert b.stats.timed_out == 2 and settled(b)


async def test_a_stream_from_a_batcher_with_one_result_per_item_keeps_its_timeout() -> None:
    loop = asyncio.get_running_loop()

    class Slow(AsyncBatcher[int, int]):
        async def process_batch(self, batch: list[int]) -> list[int]:
            await asyncio.sleep(10)
            return batch

    b = Slow(max_queue_time=0)
    async with asyncio.timeout(WAIT):
        with pytest.raises(TimeoutError):
            await collect(b.stream(1, timeout=1))
    assert loop.time() == 1.0
    await b.stop()


async def test_a_stream_item_too_heavy_for_any_batch_is_refused_and_counted_once() -> None:
    b = Letters(max_queue_time=0, max_batch_weight=3)
    with pytest.raises(ValueError, match="weight 4"):
        await collect(b.stream("abcd"))
    s = b.stats
    assert (s.rejected, s.submitted) == (1, 0)
    await b.stop()


async def test_a_stream_waiting_for_room_times_out_and_one_timing_out_in_the_queue_gives_its_room_back() -> None:
    loop = asyncio.get_running_loop()
    b = Counter(max_queue_time=0, max_queue_size=1, wait_when_full=True)
    async with asyncio.timeout(WAIT):
        running = asyncio.ensure_future(collect(b.stream(3)))
        await asyncio.sleep(0)
        queued = asyncio.ensure_future(collect(b.stream(2, timeout=0.5)))  # times out in the queue
        await asyncio.sleep(0)
        waiting = asyncio.ensure_future(collect(b.stream(1)))  # in line for room
        await asyncio.sleep(0)
        impatient = asyncio.ensure_future(collect(b.stream(4, timeout=0.2)))  # in line too, and gives up
        await asyncio.sleep(0.3)
        with pytest.raises(TimeoutError, match="within the timeout"):
            await impatient
        await asyncio.sleep(0.3)
        with pytest.raises(TimeoutError):
            await queued
        assert loop.time() == 0.6 and b.stats.queued == 1 and b.stats.awaiting_room == 0  # the room went on
        assert await running == ["3.0", "3.1", "3.2"] and await waiting == ["1.0"]
    assert all(2 not in step and 4 not in step for step in b.steps)
    assert b.stats.timed_out == 2 and settled(b)
    await b.stop()


async def test_a_stream_arriving_while_the_dispatcher_waits_for_a_deadline_joins_its_batch() -> None:
    b = Counter(max_queue_time=1.0)
    async with asyncio.timeout(WAIT):
        first = asyncio.ensure_future(collect(b.stream(1)))
        await asyncio.sleep(0.5)  # a timer is armed for 1.0
        second = asyncio.ensure_future(collect(b.stream(2)))
        assert await asyncio.gather(first, second) == [["1.0"], ["2.0", "2.1"]]
    assert b.steps[0] == [1, 2]
    await b.stop()


async def test_a_streaming_batch_is_never_followed_by_a_hold() -> None:
    # Four streams end together, then one more arrives at once: it goes the moment the slot is free, never held for
    # the four (a probe of the hold would wait for a cohort of four or more; a stream's consumer is no such caller).
    class Once(AsyncBatcher[int, int]):
        async def process_batch(self, batch: list[int]) -> AsyncIterator[list[Any]]:
            await asyncio.sleep(1.0)
            yield list(batch)
            yield [END] * len(batch)

    b = Once(max_queue_time=0, max_hold_time=100.0)
    async with asyncio.timeout(WAIT):
        assert await asyncio.gather(*(collect(b.stream(i)) for i in range(4))) == [[0], [1], [2], [3]]
        loop = asyncio.get_running_loop()
        sent = loop.time()
        assert await collect(b.stream(4)) == [4]
        assert loop.time() - sent == pytest.approx(1.0)  # its one step, not the hold's 100 s on top
        await b.stop()


# ---------------------------------------------------------------------- streams that stall, resume, leave


class Parts(AsyncBatcher[int, str]):
    """Item ``n`` streams ``"n.0"``, ``"n.1"``, ... one part a second, forever; records each step's batch."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.steps: list[list[int]] = []

    async def process_batch(self, batch: list[int]) -> AsyncIterator[list[str]]:
        sent: dict[int, int] = {}
        while True:
            self.steps.append(list(batch))
            await asyncio.sleep(1)
            parts = []
            for n in batch:
                k = sent.get(n, 0)
                sent[n] = k + 1
                parts.append(f"{n}.{k}")
            yield parts


@pytest.mark.parametrize(("idle", "dropped"), [(4.999, False), (5.0, False), (5.001, True), (6.0, True)])
async def test_a_consumer_is_dropped_only_after_the_stall_timeout_and_then_gets_exactly_its_buffered_parts(
    idle: float, dropped: bool
) -> None:
    b = Parts(max_queue_time=0, stream_buffer=2, stream_stall_timeout=5)
    stalled = b.stream(1)
    other = b.stream(2)
    async with asyncio.timeout(WAIT):
        got = [await anext(stalled)]  # at 1; 1.1 and 1.2 fill its buffer at 3: the step waits until 8
        mine = asyncio.ensure_future(_collect_until(other, 12))
        await asyncio.sleep(2 + idle)
        try:
            async for part in stalled:
                got.append(part)
                if len(got) == 6:
                    break
        except TimeoutError as error:
            got.append(type(error).__name__)
            assert "took none of its 2 buffered parts within stream_stall_timeout=5" in str(error)
        await stalled.aclose()  # type: ignore[attr-defined]
        assert await mine == [f"2.{k}" for k in range(12)]  # the other stream never waited longer, nor mixed
        await b.stop()
    assert got == (["1.0", "1.1", "1.2", "TimeoutError"] if dropped else [f"1.{k}" for k in range(6)])
    assert b.stats.timed_out == dropped and settled(b)


async def _collect_until(stream: AsyncIterator[Any], n: int) -> list[Any]:
    async with contextlib.aclosing(stream) as parts:  # type: ignore[type-var]
        got = []
        async for part in parts:
            got.append(part)
            if len(got) == n:
                break
        return got


async def test_a_dropped_stream_with_a_timeout_of_its_own_is_counted_once() -> None:
    b = Parts(max_queue_time=0, stream_buffer=1, stream_stall_timeout=2)
    stalled = b.stream(1, timeout=6)
    async with asyncio.timeout(WAIT):
        assert await anext(stalled) == "1.0"
        await asyncio.sleep(10)  # dropped at 4 (buffer full at 2), then its own timeout passes at 6
        assert await anext(stalled) == "1.1"
        with pytest.raises(TimeoutError, match="stream_stall_timeout"):
            await anext(stalled)
        await b.stop()
    s = b.stats
    assert (s.timed_out, s.cancelled, s.failed, s.succeeded) == (1, 0, 0, 0) and settled(b)


class Lengths(AsyncBatcher[tuple[int, int], str]):
    """Item ``(i, n)`` streams ``"i.0"`` ... ``"i.(n-1)"``, then ends; continuous; steps of random length."""

    continuous_batching = True

    def __init__(self, rng: random.Random, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.rng = rng
        self.sizes: list[int] = []

    async def process_batch(self, batch: list[tuple[int, int]]) -> AsyncIterator[list[Any]]:
        sent: dict[tuple[int, int], int] = {}
        while batch:
            self.sizes.append(len(batch))
            await asyncio.sleep(self.rng.choice([0, 0.5, 1]))
            parts: list[Any] = []
            for item in batch:
                k = sent.get(item, 0)
                sent[item] = k + 1
                parts.append(END if k >= item[1] else f"{item[0]}.{k}")
            yield parts


@pytest.mark.parametrize("seed", range(12))
async def test_continuous_streams_that_stall_break_leave_and_join_each_get_only_their_own_parts(seed: int) -> None:
    rng = random.Random(seed)
    b = Lengths(rng, max_queue_time=rng.choice([0, 0.5]), max_batch_size=4, stream_buffer=2, stream_stall_timeout=3)
    b.concurrency = 2
    kept: list[AsyncIterator[Any]] = []  # streams left by a break and still referenced: the stall timeout drops them

    async def consumer(i: int, kind: str) -> tuple[str, list[Any], str]:
        await asyncio.sleep(rng.uniform(0, 20))
        n = rng.randint(0, 12)
        stream = b.stream((i, n))
        got: list[Any] = []
        try:
            async for part in stream:
                got.append(part)
                if kind == "stall" and len(got) == 1:
                    await asyncio.sleep(rng.choice([1, 2.9, 3, 3.1, 10]))
                elif kind == "slow":
                    await asyncio.sleep(rng.uniform(0, 2))
                elif kind == "break" and len(got) == 2:
                    kept.append(stream)
                    return kind, got, "left"
                elif kind == "close" and len(got) == 2:
                    await stream.aclose()  # type: ignore[attr-defined]
                    return kind, got, "left"
            assert got == [f"{i}.{k}" for k in range(n)]  # a stream that ends has all its parts
            return kind, got, "ended"
        except TimeoutError:
            return kind, got, "dropped"

    kinds = [rng.choice(["fast", "slow", "stall", "break", "close"]) for _ in range(40)]
    async with asyncio.timeout(WAIT):
        ends = await asyncio.gather(*(consumer(i, kind) for i, kind in enumerate(kinds)))
        await b.stop()
        dropped_after_break = 0
        for stream in kept:  # the rest of what a consumer that broke off had buffered, then its end or its drop
            try:
                async for _ in stream:
                    pass
            except TimeoutError:
                dropped_after_break += 1
    for i, (kind, got, how) in enumerate(ends):
        assert got == [f"{i}.{k}" for k in range(len(got))], (kind, got)  # its own parts, in order, no gap
        assert how != "dropped" or kind in ("stall", "slow")
    s = b.stats
    assert s.timed_out == sum(how == "dropped" for _, _, how in ends) + dropped_after_break
    assert max(b.sizes) <= 4 and s.mean_batch_size <= 4 and settled(b)


@pytest.mark.parametrize("value", [True, False, -0.5, float("nan"), float("inf"), float("-inf"), "1", []])
def test_a_bad_stall_timeout_is_refused_naming_it_and_the_old_value_stays(value: Any) -> None:
    b = Parts(stream_stall_timeout=7)
    with pytest.raises((ValueError, TypeError)) as refused:
        b.stream_stall_timeout = value
    assert "stream_stall_timeout" in str(refused.value) and repr(value)[:20] in str(refused.value)
    assert b.stream_stall_timeout == 7.0


async def test_a_generator_that_never_ends_a_stream_is_ended_by_a_stop_with_a_timeout() -> None:
    loop = asyncio.get_running_loop()
    b = Parts(max_queue_time=0, stream_buffer=100)
    got: list[Any] = []

    async def read() -> None:
        try:
            async for part in b.stream(1):
                got.append(part)
        except BatcherStoppedError as error:
            got.append(type(error).__name__)

    reader = asyncio.ensure_future(read())
    await asyncio.sleep(3.5)
    async with asyncio.timeout(WAIT):
        await b.stop(timeout=5)
        await reader
    assert loop.time() == 8.5 and got == [f"1.{k}" for k in range(8)] + ["BatcherStoppedError"]
    assert settled(b) and b.stats.failed == 1


async def test_a_stall_timeout_lowered_live_reaches_the_step_already_waiting() -> None:
    """The stall timeout applies to the wait in progress: lowered (from ``None`` too) under a stalled consumer,
    the step waits only as long as the new value allows, counted from when it began to wait; a stop does not
    hang on it."""
    loop = asyncio.get_running_loop()
    for before, after, dropped_at in ((None, 5.0, 11.0), (None, 0.0, 11.0), (100.0, 20.0, 23.0)):
        b = Parts(max_queue_time=0, stream_buffer=2, stream_stall_timeout=before)
        began = loop.time()
        stalled = b.stream(1)
        async with asyncio.timeout(WAIT):
            assert await anext(stalled) == "1.0"  # at 1; its buffer is full at 3, where the step begins to wait
            await asyncio.sleep(10)
            b.stream_stall_timeout = after  # at 11
            await b.stop()  # it ends as its one stream is dropped
        assert loop.time() - began == dropped_at, (before, after)
        assert [part async for part in _until_error(stalled)] == ["1.1", "1.2", "TimeoutError"]
        assert b.stats.timed_out == 1 and settled(b)


async def _until_error(stream: AsyncIterator[Any]) -> AsyncIterator[Any]:
    try:
        async for part in stream:
            yield part
    except Exception as error:
        yield type(error).__name__


async def test_the_stall_error_says_how_many_parts_its_consumer_left_unread() -> None:
    b = Parts(max_queue_time=0, stream_buffer=2, stream_stall_timeout=3)
    stalled = b.stream(1)
    async with asyncio.timeout(WAIT):
        assert await anext(stalled) == "1.0"
        b.stream_buffer = 50  # for the streams to come: this one buffers 2
        await asyncio.sleep(10)
        await b.stop()
        assert await anext(stalled) == "1.1" and await anext(stalled) == "1.2"
        with pytest.raises(TimeoutError) as dropped:
            await anext(stalled)
    assert "took none of its 2 buffered parts within stream_stall_timeout=3" in str(dropped.value)


@pytest.mark.parametrize("setting", ["stream_stall_timeout", "max_queue_time", "max_hold_time", "default_timeout"])
def test_a_number_of_seconds_too_large_for_a_float_is_refused_naming_it(setting: str) -> None:
    b = Parts()
    with pytest.raises(ValueError, match=f"{setting} must be a finite number of seconds >= 0, got 1000000"):
        setattr(b, setting, 10**400)


# ---------------------------------------------------------------------- consumers on a real loop


class Lockstep(AsyncBatcher[int, int]):
    """Streams ``0..49`` to every item with no pause between steps: its consumers have only the loop's turns."""

    continuous_batching = True

    async def process_batch(self, batch: list[int]) -> AsyncIterator[list[Any]]:
        sent: dict[int, int] = {}
        while batch:
            parts: list[Any] = []
            for x in batch:
                k = sent.get(x, 0)
                sent[x] = k + 1
                parts.append(k if k < 50 else END)
            yield parts


@pytest.mark.real_loop
async def test_consumers_that_keep_up_are_never_dropped_even_with_a_stall_timeout_of_zero() -> None:
    b = Lockstep(max_queue_time=0, stream_buffer=1, stream_stall_timeout=0, max_batch_size=8)

    async def read(x: int) -> list[int]:
        return [p async for p in b.stream(x)]

    results = await asyncio.wait_for(asyncio.gather(*(read(x) for x in range(20))), REAL_WAIT)
    assert all(r == list(range(50)) for r in results)
    assert b.stats.timed_out == 0 and b.stats.succeeded == 20
    await asyncio.wait_for(b.stop(), REAL_WAIT)


@pytest.mark.real_loop
async def test_a_consumer_that_stops_reading_on_a_real_loop_is_dropped_and_the_others_finish() -> None:
    b = Lockstep(max_queue_time=0, stream_buffer=2, stream_stall_timeout=0.05, max_batch_size=8)
    stuck = b.stream(0)
    assert await asyncio.wait_for(anext(stuck), REAL_WAIT) == 0  # then it reads no more, and is kept

    async def read(x: int) -> list[int]:
        return [p async for p in b.stream(x)]

    assert await asyncio.wait_for(asyncio.gather(*(read(x) for x in range(1, 5))), REAL_WAIT) == [list(range(50))] * 4
    await asyncio.wait_for(b.stop(), REAL_WAIT)
    assert b.stats.timed_out == 1
    got = []
    with pytest.raises(TimeoutError, match="stream_stall_timeout"):
        async for p in stuck:
            got.append(p)
    assert got == [1, 2]  # its buffered parts, then the error
