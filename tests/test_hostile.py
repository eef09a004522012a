"""Hostile use through the public API: each defect and trap found by adversarial testing, with its regression test.

Every test bounds its waits (``asyncio.wait_for``, thread timeouts), so that a batcher that hangs fails the test
instead of hanging the suite.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import re
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from async_batcher import (
    END,
    AsyncBatcher,
    AsyncBatchException,
    BatcherStoppedError,
    BatchSizeMismatchError,
    ReentrantCallError,
)
from tests.batchers import Recording, until

WAIT = 10.0


class Echo(AsyncBatcher[int, int]):
    async def process_batch(self, batch: list[int]) -> list[int]:
        return batch


class Hanging(Recording):
    """An ``on_stop()`` that never finishes; ``when_cancelled`` is called if it is cancelled."""

    def __init__(self, *, when_cancelled: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.when_cancelled = when_cancelled

    async def on_stop(self) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            if self.when_cancelled is not None:
                self.when_cancelled()
            raise


def settled(b: AsyncBatcher[Any, Any]) -> bool:
    """The counters add up, with no caller left waiting."""
    s = b.stats
    return s.submitted == s.succeeded + s.failed + s.cancelled + s.timed_out and s.queued == 0 and s.in_flight == 0


# ---------------------------------------------------------------------- defects that left callers or the loop stuck


async def test_a_bulk_call_cancelled_while_queued_then_a_forced_stop_neither_spins_nor_miscounts() -> None:
    for pause in (0.01, 0):  # (a pause let the loop spin forever; none left queued == -3)
        b = Echo(max_queue_time=10)
        task = asyncio.ensure_future(b.process_many([1, 2, 3]))
        await asyncio.sleep(pause)
        task.cancel()
        await asyncio.wait_for(b.stop(force=True), WAIT)
        with pytest.raises(asyncio.CancelledError):
            await task
        assert b.stats.queued == 0 and settled(b)


@pytest.mark.parametrize("trial", range(8))
def test_stop_sync_racing_the_first_blocking_calls_answers_every_thread(trial: int) -> None:
    b = Recording(max_queue_time=0.001, name=f"race-{trial}")
    start = threading.Barrier(31)
    outcomes: list[object] = []

    def call(i: int) -> None:
        start.wait()
        try:
            outcomes.append(b.process_sync(i, timeout=WAIT))
        except BatcherStoppedError as exc:
            outcomes.append(exc)
        except BaseException as exc:  # anything else is a defect: kept to be reported
            outcomes.append(("unexpected", exc))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(30)]
    for t in threads:
        t.start()
    start.wait()
    b.stop_sync()
    for t in threads:
        t.join(WAIT)
    assert not any(t.is_alive() for t in threads), "a thread was left blocked"
    assert len(outcomes) == 30
    assert all(isinstance(o, int | BatcherStoppedError) for o in outcomes), outcomes
    b.stop_sync()
    assert not [t for t in threading.enumerate() if t.name == f"async-batcher:race-{trial}"]


@pytest.mark.virtual_time
@pytest.mark.parametrize("force", [False, True])
async def test_a_stop_with_a_timeout_returns_in_time_when_on_stop_hangs(
    force: bool, caplog: pytest.LogCaptureFixture
) -> None:
    loop = asyncio.get_running_loop()
    b = Hanging(max_queue_time=0)
    assert await b.process(1) == 2
    with caplog.at_level(logging.WARNING, logger="async_batcher"):
        await b.stop(force=force, timeout=0.2)
    assert loop.time() == pytest.approx(0.2)
    assert [r.getMessage() for r in caplog.records] == [
        "Hanging: on_stop() did not finish within the 0.2 s left of stop(timeout=0.2) after the drain; it is cancelled"
    ]
    assert not await b.is_running()
    with pytest.raises(BatcherStoppedError):
        await b.process(2)


@pytest.mark.virtual_time
async def test_a_stop_whose_timeout_cancels_a_hanging_on_stop_lets_the_other_stops_return() -> None:
    loop = asyncio.get_running_loop()
    b = Hanging(max_queue_time=0)
    assert await b.process(1) == 2
    patient = asyncio.ensure_future(b.stop())  # no timeout: it waits for on_stop()
    await asyncio.sleep(0)
    await b.stop(timeout=0.2)  # gives up on on_stop() at 0.2 and cancels it: the batcher is stopped
    await asyncio.wait_for(patient, WAIT)  # returns too (it raised CancelledError, not its own)
    assert loop.time() == pytest.approx(0.2) and not await b.is_running()


@pytest.mark.virtual_time
async def test_a_stop_cancelled_as_a_concurrent_stop_cancels_on_stop_raises_its_own_cancellation() -> None:
    leaving: list[asyncio.Future[None]] = []
    # As the stop with a timeout gives up on on_stop(), the other stop's caller leaves too.
    b = Hanging(max_queue_time=0, when_cancelled=lambda: leaving[0].cancel())
    assert await b.process(1) == 2
    leaving.append(asyncio.ensure_future(b.stop()))
    await asyncio.sleep(0)
    await b.stop(timeout=0.2)
    with pytest.raises(asyncio.CancelledError):
        await leaving[0]  # its caller's cancellation is not swallowed with on_stop()'s
    assert leaving[0].cancelled() and not await b.is_running()


def test_a_blocking_call_into_a_loop_that_is_open_but_not_running_is_refused() -> None:
    b = Recording(max_queue_time=0)
    loop = asyncio.new_event_loop()
    try:
        assert loop.run_until_complete(b.process(1)) == 2  # bound to this loop, which then stops running
        with pytest.raises(RuntimeError, match="not running"):
            b.process_sync(2)  # no timeout: it must not wait forever
        loop.run_until_complete(b.stop())
    finally:
        loop.close()


# ---------------------------------------------------------------------- what process_batch may do and return


@pytest.mark.parametrize("mutate", ["clear", "pad"])
async def test_process_batch_may_change_its_batch_list(mutate: str) -> None:
    class Mutating(AsyncBatcher[int, int]):
        async def process_batch(self, batch: list[int]) -> list[int]:
            results = [x * 2 for x in batch]
            if mutate == "clear":
                batch.clear()
            else:
                batch.extend([0] * (8 - len(batch)))  # padded in place to a bucket size
            return results

    b = Mutating(max_batch_size=8, max_queue_time=0)
    assert await asyncio.gather(*(b.process(i) for i in range(5))) == [0, 2, 4, 6, 8]
    await b.stop()


async def test_return_exceptions_puts_a_failed_batchs_error_in_its_items_places() -> None:
    def answer(batch: list[int]) -> Any:
        if 4 in batch:
            raise ValueError("this batch failed")
        if 7 in batch:
            return batch[:-1]  # the wrong number of results
        return [x * 2 for x in batch]

    b = Recording(max_batch_size=3, max_queue_time=0, answer=answer)
    results = await b.process_many(range(9), return_exceptions=True)
    assert results[:3] == [0, 2, 4]
    assert all(isinstance(r, ValueError) for r in results[3:6])
    assert all(isinstance(r, BatchSizeMismatchError) for r in results[6:9])
    assert settled(b) and b.stats.failed == 6 and b.stats.succeeded == 3
    await b.stop()


@pytest.mark.parametrize(
    ("returned", "named"),
    [
        (lambda batch: {x: x for x in batch}, "dict"),
        (lambda batch: set(batch), "set"),
        (lambda batch: 3, "int"),
        (lambda batch: "abc", "str"),
    ],
    ids=["dict", "set", "int", "str"],
)
async def test_results_with_no_order_or_no_items_are_refused_naming_what_was_returned(
    returned: Any, named: str
) -> None:
    b = Recording(max_queue_time=0, answer=returned)
    calls = await asyncio.gather(*(b.process(i) for i in range(3)), return_exceptions=True)
    for call in calls:
        assert isinstance(call, TypeError)
        assert str(call) == (
            f"process_batch returned {named}; expected a sequence of 3 results in the order of the batch (a list, a "
            "tuple, a numpy array, a generator), or None"
        )
    assert settled(b)
    await b.stop()


async def test_a_forgotten_await_is_named_and_the_coroutine_closed() -> None:
    async def real(batch: list[int]) -> list[int]:
        return batch

    class Forgetful(AsyncBatcher[int, int]):
        async def process_batch(self, batch: list[int]) -> Any:
            return real(batch)  # not awaited

    b = Forgetful(max_queue_time=0)
    with pytest.raises(TypeError) as info:
        await b.process(1)
    assert str(info.value) == (
        "process_batch returned coroutine (an async process_batch must await what it returns); expected a sequence "
        "of 1 result in the order of the batch (a list, a tuple, a numpy array, a generator), or None"
    )
    await b.stop()  # (a coroutine left unclosed would warn, and warnings fail the suite)


async def test_ordered_iterables_are_taken_and_an_endless_one_does_not_freeze_the_loop() -> None:
    def endless(batch: list[int]) -> Iterator[int]:
        while True:
            yield 1

    b = Recording(max_queue_time=0, answer=lambda batch: np.array(batch) * 3)
    assert await asyncio.gather(*(b.process(i) for i in range(3))) == [0, 3, 6]
    b.answer = lambda batch: (x for x in batch)
    assert await b.process(5) == 5
    b.answer = endless
    calls = await asyncio.wait_for(asyncio.gather(*(b.process(i) for i in range(3)), return_exceptions=True), WAIT)
    assert all(isinstance(c, BatchSizeMismatchError) and "more than 3" in str(c) for c in calls), calls
    await b.stop()


@pytest.mark.parametrize("kind", [GeneratorExit, type("Custom", (BaseException,), {})])
async def test_a_base_exception_from_process_batch_reaches_the_callers_and_nothing_else(kind: type) -> None:
    class Raising(AsyncBatcher[int, int]):
        async def process_batch(self, batch: list[int]) -> list[int]:
            raise kind()

    b = Raising(max_queue_time=0)
    with pytest.raises(AsyncBatchException, match=kind.__name__) as info:
        await b.process(1)
    assert isinstance(info.value.__cause__, kind) and not isinstance(info.value, BatcherStoppedError)
    assert await b.is_running()  # it serves on; the harness fails the test on "exception never retrieved"
    await b.stop()


# ---------------------------------------------------------------------- re-entrant use


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


# ---------------------------------------------------------------------- statistics and validation


async def test_the_items_withdrawn_when_a_bulk_call_fails_are_counted() -> None:
    b = Recording(max_batch_size=1, max_queue_time=0, answer=lambda batch: [ValueError("first")])
    with pytest.raises(ValueError, match="first"):
        await b.process_many(range(5))
    await until(lambda: b.stats.queued == 0)
    assert b.stats.submitted == 5 and b.stats.failed == 5 and settled(b)
    await b.stop()


@pytest.mark.parametrize(
    ("kwargs", "error", "named"),
    [
        ({"wait_when_full": "no"}, TypeError, "'no'"),
        ({"wait_when_full": float("nan")}, TypeError, "nan"),
        ({"executor": "3"}, TypeError, "'3'"),
        ({"executor": object()}, TypeError, "object"),
        ({"name": 123}, TypeError, "123"),
        ({"max_batch_size": 2.5}, ValueError, "2.5"),
        ({"max_queue_time": float("inf")}, ValueError, "inf"),
    ],
)
def test_bad_settings_are_refused_naming_the_value(kwargs: dict[str, Any], error: type, named: str) -> None:
    with pytest.raises(error, match=named):
        Recording(**kwargs)


async def test_numpy_numbers_are_numbers_and_bools_are_not_priorities() -> None:
    b = Recording(max_batch_size=np.int64(8), max_queue_size=np.int32(100), concurrency=np.int64(2), max_queue_time=0)
    assert (b.max_batch_size, b.max_queue_size, b.concurrency) == (8, 100, 2)
    assert await b.process(1, priority=np.int64(-1)) == 2
    assert await b.process(2, priority=np.float32(0.5)) == 4
    for flag in (True, False):
        with pytest.raises(ValueError, match=str(flag)):
            await b.process(3, priority=flag)
    await b.stop()


# ---------------------------------------------------------------------- traps for users


async def test_process_batch_may_name_its_parameter_anything() -> None:
    class Items(AsyncBatcher[int, int]):
        async def process_batch(self, items: list[int]) -> list[int]:  # not "batch": passed by position
            return [x + 1 for x in items]

    class KeywordOnly(AsyncBatcher[int, int]):
        async def process_batch(self, *, batch: list[int]) -> list[int]:  # type: ignore[override]
            return [x + 2 for x in batch]

    class SyncItems(AsyncBatcher[int, int]):
        def process_batch(self, rows: list[int]) -> list[int]:
            return [x + 3 for x in rows]

    for cls, offset in ((Items, 1), (KeywordOnly, 2), (SyncItems, 3)):
        b = cls(max_queue_time=0)
        assert await b.process(1) == 1 + offset
        await b.stop()


def test_a_blocking_call_from_a_thread_pool_to_the_apps_loop_gets_its_answer() -> None:
    # The common deployment: an app's loop in one thread, sync code in a pool calling into it.
    ready = threading.Event()
    holder: dict[str, Any] = {}

    def serve() -> None:
        async def main() -> None:
            holder["loop"] = asyncio.get_running_loop()
            holder["b"] = b = Recording(max_batch_size=16, max_queue_time=0.01)
            b.start()
            holder["stop"] = stop = asyncio.Event()
            ready.set()
            await stop.wait()
            await b.stop()

        asyncio.run(main())

    server = threading.Thread(target=serve)
    server.start()
    assert ready.wait(WAIT)
    b = holder["b"]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert list(pool.map(lambda i: b.process_sync(i, timeout=WAIT), range(16))) == [2 * i for i in range(16)]
    holder["loop"].call_soon_threadsafe(holder["stop"].set)
    server.join(WAIT)
    assert not server.is_alive() and settled(b)


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


async def test_return_exceptions_must_be_a_flag() -> None:
    b = Recording(max_queue_time=0)
    with pytest.raises(TypeError, match="return_exceptions must be True or False, got 'yes'"):
        await b.process_many([1], return_exceptions="yes")  # type: ignore[arg-type]
    await b.stop()


async def test_the_errors_a_caller_gets_say_what_happened_and_name_the_batcher() -> None:
    gate = asyncio.Event()
    b = Recording(max_queue_time=0, max_queue_size=2, wait_when_full=True, gate=gate, name="namer")
    first = asyncio.ensure_future(b.process(0))
    await until(lambda: b.batches)
    queued = asyncio.ensure_future(b.process_many([1, 11]))
    await until(lambda: b.stats.queued == 2)
    with pytest.raises(TimeoutError, match="no room in the queue within the timeout"):
        await b.process(2, timeout=0.01)
    with pytest.raises(TimeoutError, match="no room in the queue within the timeout"):
        await b.process_many([3, 4], timeout=0.01)  # the timeout covers process_many's wait for room too
    b.max_queue_size = 10
    with pytest.raises(TimeoutError, match="namer: no result within the timeout"):
        await b.process(5, timeout=0.01)
    with pytest.raises(TimeoutError, match="namer: no results within the timeout"):
        await b.process_many([6, 7], timeout=0.01)
    assert b.stats.timed_out == 6
    stopping = asyncio.ensure_future(b.stop(force=True))
    with pytest.raises(BatcherStoppedError, match="namer was stopped with force=True"):
        await first
    with pytest.raises(BatcherStoppedError, match="namer was stopped with force=True"):
        await queued
    await stopping
    with pytest.raises(BatcherStoppedError, match="namer is stopped; start"):
        await b.process(8)
    for _ in range(2):
        with pytest.raises(BatcherStoppedError):
            await b.process_many([9, 10])
    assert b.stats.rejected == 5  # every refused item, counted once


async def test_a_caller_leaving_during_a_stop_lets_the_stop_finish() -> None:
    b = Recording(max_queue_time=100, max_batch_size=10, delay=0.05)
    held = asyncio.ensure_future(b.process_many(range(10)))  # in flight
    await until(lambda: b.batches)
    queued = asyncio.ensure_future(b.process(50, timeout=0.01))  # leaves while the stop drains
    many = asyncio.ensure_future(b.process_many([60, 61]))
    await asyncio.sleep(0)
    stopping = asyncio.ensure_future(b.stop())
    many.cancel()
    with pytest.raises(TimeoutError):
        await queued
    await asyncio.wait_for(stopping, WAIT)
    assert await held == [2 * i for i in range(10)] and settled(b)


# ---------------------------------------------------------------------- attacks on the fixes of issue 25


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


async def test_consumers_that_keep_up_are_never_dropped_even_with_a_stall_timeout_of_zero() -> None:
    b = Lockstep(max_queue_time=0, stream_buffer=1, stream_stall_timeout=0, max_batch_size=8)

    async def read(x: int) -> list[int]:
        return [p async for p in b.stream(x)]

    results = await asyncio.wait_for(asyncio.gather(*(read(x) for x in range(20))), WAIT)
    assert all(r == list(range(50)) for r in results)
    assert b.stats.timed_out == 0 and b.stats.succeeded == 20
    await asyncio.wait_for(b.stop(), WAIT)


async def test_a_consumer_that_stops_reading_on_a_real_loop_is_dropped_and_the_others_finish() -> None:
    b = Lockstep(max_queue_time=0, stream_buffer=2, stream_stall_timeout=0.05, max_batch_size=8)
    stuck = b.stream(0)
    assert await asyncio.wait_for(anext(stuck), WAIT) == 0  # then it reads no more, and is kept

    async def read(x: int) -> list[int]:
        return [p async for p in b.stream(x)]

    assert await asyncio.wait_for(asyncio.gather(*(read(x) for x in range(1, 5))), WAIT) == [list(range(50))] * 4
    await asyncio.wait_for(b.stop(), WAIT)
    assert b.stats.timed_out == 1
    got = []
    with pytest.raises(TimeoutError, match="stream_stall_timeout"):
        async for p in stuck:
            got.append(p)
    assert got == [1, 2]  # its buffered parts, then the error


async def test_a_count_of_one_is_singular_in_the_messages(caplog: pytest.LogCaptureFixture) -> None:
    class Raising(AsyncBatcher[int, int]):
        async def process_batch(self, batch: list[int]) -> list[int]:
            raise KeyError("down")

    b = Raising(name="raising", max_queue_time=0)
    with caplog.at_level(logging.WARNING, logger="async_batcher"), pytest.raises(KeyError):
        await b.process(1)
    await b.stop()
    assert [r.getMessage() for r in caplog.records] == ["raising: process_batch raised KeyError on a batch of 1 item"]
    assert str(BatchSizeMismatchError(1, 2)) == "process_batch returned 2 results for a batch of 1 item"
    assert str(BatchSizeMismatchError(2, 1)) == "process_batch returned 1 result for a batch of 2 items"
    assert (
        str(BatchSizeMismatchError(1, 2, at_least=True))
        == "process_batch returned more than 1 result for a batch of 1 item"
    )


def test_no_message_of_the_package_writes_a_count_before_a_fixed_plural() -> None:
    # "a batch of %d items" reads "a batch of 1 items" for the commonest batch there is: each count goes through
    # _checks.plural (a number before a plural noun in a message string is one that does not).
    root = Path(__file__).resolve().parent.parent / "async_batcher"
    nouns = "items|results|rows|batches|elements|outputs|keys|calls|records|messages|callers"
    count = re.compile(rf"""(\{{[^{{}}"']+\}}|%d|%s) ({nouns})\b""")
    found = [
        f"{path.relative_to(root)}:{number}: {line.strip()}"
        for path in sorted(root.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if count.search(line) and not line.lstrip().startswith("#")
    ]
    assert not found, "\n".join(found)
