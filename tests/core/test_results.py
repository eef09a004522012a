"""Contract 2 (results), 3 (sync process_batch) and 7 (bulk)."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from async_batcher import (
    AsyncBatcher,
    AsyncBatchException,
    BatcherStoppedError,
    BatchSizeMismatchError,
    OutcomeUnknownError,
    ProcessBatchCancelledError,
)
from async_batcher._core import forming as _forming
from async_batcher._core.queue import Queue
from tests.batchers import Recording, SyncRecording, settled, until


async def test_none_gives_every_caller_none() -> None:
    b = Recording(max_queue_time=0, answer=lambda batch: None)
    assert await asyncio.gather(*(b.process(i) for i in range(4))) == [None] * 4
    await b.stop()


async def test_an_exception_element_fails_only_its_caller() -> None:
    boom = KeyError("three")
    b = Recording(max_queue_time=0, answer=lambda batch: [boom if x == 3 else x for x in batch])
    results = await asyncio.gather(*(b.process(i) for i in range(6)), return_exceptions=True)
    assert results == [0, 1, 2, boom, 4, 5]
    assert b.stats.failed == 1
    await b.stop()


@pytest.mark.parametrize("returned", [[1], [1, 2, 3, 4, 5]])
async def test_a_wrong_number_of_results_fails_every_caller_naming_both_lengths(returned: list[int]) -> None:
    b = Recording(max_queue_time=0, answer=lambda batch: returned)
    results = await asyncio.gather(*(b.process(i) for i in range(3)), return_exceptions=True)
    assert all(isinstance(r, BatchSizeMismatchError) for r in results)
    err = results[0]
    assert isinstance(err, ValueError) and isinstance(err, AsyncBatchException)
    assert (err.expected, err.got) == (3, len(returned))
    assert "3" in str(err) and str(len(returned)) in str(err)
    # The batcher keeps serving.
    b.answer = None
    assert await b.process(5) == 10
    await b.stop()


async def test_an_exception_raised_by_process_batch_goes_to_every_caller_of_that_batch() -> None:
    class Boom(Exception):
        pass

    def fail(batch: list[int]) -> Any:
        raise Boom("nope")

    b = Recording(max_queue_time=0, answer=fail)
    results = await asyncio.gather(*(b.process(i) for i in range(3)), return_exceptions=True)
    assert [type(r) for r in results] == [Boom] * 3
    b.answer = None
    assert await b.process(1) == 2
    stats = b.stats
    assert (stats.failed, stats.processed, stats.batches) == (3, 4, 2)
    await b.stop()


async def test_cancelled_error_raised_by_process_batch_does_not_look_like_the_caller_was_cancelled() -> None:
    class Cancelling(AsyncBatcher[int, int]):
        async def process_batch(self, batch: list[int]) -> list[int]:
            raise asyncio.CancelledError

    b = Cancelling(max_queue_time=0)
    task = asyncio.ensure_future(b.process(1))
    with pytest.raises(ProcessBatchCancelledError):
        await task
    assert not task.cancelled()
    await b.stop()


async def test_results_may_be_any_sequence_or_iterable() -> None:
    b = Recording(max_queue_time=0, answer=lambda batch: (x + 1 for x in batch))
    assert await asyncio.gather(*(b.process(i) for i in range(3))) == [1, 2, 3]
    b.answer = lambda batch: tuple(batch)
    assert await b.process(7) == 7
    await b.stop()


async def test_process_batch_is_called_with_the_keyword_batch() -> None:
    seen: list[dict[str, Any]] = []

    class KeywordOnly(AsyncBatcher[int, int]):
        async def process_batch(self, *args: Any, **kwargs: Any) -> list[int]:
            seen.append({"args": args, "kwargs": kwargs})
            return [x * 2 for x in kwargs["batch"]]

    b = KeywordOnly(max_batch_size=10, max_queue_time=0.01)
    assert await asyncio.gather(*(b.process(item=i) for i in range(10))) == [i * 2 for i in range(10)]
    assert seen == [{"args": (), "kwargs": {"batch": list(range(10))}}]
    await b.stop()


@pytest.mark.single_loop
async def test_a_sync_process_batch_runs_in_the_executor_and_never_blocks_the_loop(thread_pool: Any) -> None:
    block = threading.Event()
    b = SyncRecording(max_queue_time=0, executor=thread_pool, block=block)
    call = asyncio.ensure_future(b.process(4))
    await until(lambda: b.batches)
    # process_batch is blocked in its thread; the loop still runs this coroutine, which releases it.
    assert not call.done()
    block.set()
    assert await call == 8
    assert b.threads and b.threads[0] != threading.get_ident()
    await b.stop()


async def test_a_sync_process_batch_uses_the_loops_default_executor_without_one() -> None:
    b = SyncRecording(max_queue_time=0)
    assert await asyncio.gather(*(b.process(i) for i in range(5))) == [0, 2, 4, 6, 8]
    assert threading.get_ident() not in b.threads
    await b.stop()


async def test_process_many_returns_results_in_order_across_batches() -> None:
    b = Recording(max_batch_size=64, max_queue_time=0)
    assert await b.process_many(range(1000)) == [i * 2 for i in range(1000)]
    assert b.sent == list(range(1000))
    assert max(len(x) for x in b.batches) == 64
    assert await b.process_many([]) == []
    await b.stop()


async def test_process_many_shares_batches_with_single_callers_in_arrival_order() -> None:
    b = Recording(max_batch_size=5, max_queue_time=0)
    results = await asyncio.gather(b.process(100), b.process_many(range(7)), b.process(200))
    assert results == [200, [i * 2 for i in range(7)], 400]
    assert b.batches == [[100, 0, 1, 2, 3], [4, 5, 6, 200]]
    await b.stop()


@pytest.mark.virtual_time
async def test_process_many_raises_the_first_failure_and_withdraws_what_was_not_sent() -> None:
    boom = ValueError("bad item")
    b = Recording(max_batch_size=2, max_queue_time=0, answer=lambda batch: [boom if x == 1 else x for x in batch])
    with pytest.raises(ValueError, match="bad item"):
        await b.process_many(range(10))
    await asyncio.sleep(1)
    assert b.sent == [0, 1]
    assert b.stats.queued == 0
    await b.stop()


async def test_process_many_can_return_exceptions_in_place() -> None:
    boom = ValueError("bad item")
    b = Recording(max_batch_size=3, max_queue_time=0, answer=lambda batch: [boom if x == 4 else x for x in batch])
    assert await b.process_many(range(6), return_exceptions=True) == [0, 1, 2, 3, boom, 5]
    await b.stop()


async def test_a_bug_in_the_dispatcher_fails_the_callers_instead_of_hanging_them(
    loop_errors: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Fault injection: forming a batch (an internal step, no public hook reaches it) fails once.
    original = _forming.take
    calls = 0

    def broken_once(queue: Queue, *args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("a bug")
        return original(queue, *args, **kwargs)

    monkeypatch.setattr(_forming, "take", broken_once)
    b = Recording(max_queue_time=0, max_queue_size=2, wait_when_full=True)
    # Two queued, one in line for room: all three hear of it.
    everyone = asyncio.gather(*(b.process(i) for i in range(3)), return_exceptions=True)
    results = await asyncio.wait_for(everyone, 10)
    assert all(isinstance(r, AsyncBatchException) and "a bug" in str(r) for r in results), results
    assert [type(e["exception"]) for e in loop_errors] == [RuntimeError]
    assert loop_errors[0]["message"] == "Recording: internal error while dispatching batches"
    assert await b.process(4) == 8  # and it serves again
    await b.stop()


# ---------------------------------------------------------------------- what mutation testing let through


class SlowStart(Recording):
    """Its on_start() takes 1 s: the batches formed meanwhile wait for it, their callers free to leave."""

    async def on_start(self) -> None:
        await asyncio.sleep(1)


@pytest.mark.virtual_time
async def test_a_batch_whose_callers_all_left_before_it_started_frees_its_slot_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    b = SlowStart(max_queue_time=0)
    with caplog.at_level(logging.WARNING, logger="async_batcher"):
        calls = [asyncio.ensure_future(b.process(i)) for i in range(3)]
        await asyncio.sleep(0.5)
        assert b.stats.in_flight == 1  # formed, waiting for on_start()
        for call in calls:
            call.cancel()
        await asyncio.sleep(1)
        assert b.stats.in_flight == 0 and b.batches == []
        assert await b.process(7) == 14  # it serves on
        await b.stop()
    assert caplog.messages == []
    s = b.stats
    assert (s.batches, s.processed, s.cancelled, s.succeeded) == (1, 1, 3, 1)


@pytest.mark.virtual_time
async def test_a_caller_leaving_before_its_batch_starts_takes_out_its_item_only_among_bulk_calls() -> None:
    b = SlowStart(max_queue_time=0)
    bulk = asyncio.ensure_future(b.process_many([1, 2]))
    singles = [asyncio.ensure_future(b.process(x)) for x in (3, 4, 5, 6)]
    await asyncio.sleep(0.5)
    singles[1].cancel()
    assert await bulk == [2, 4]
    assert [await singles[i] for i in (0, 2, 3)] == [6, 10, 12]
    assert b.batches == [[1, 2, 3, 5, 6]]
    await b.stop()


async def test_each_call_of_process_batch_counts_one_batch_however_it_ends() -> None:
    def answer(batch: list[int]) -> Any:
        if 0 in batch:
            raise KeyError("no zero")
        if 1 in batch:
            raise asyncio.CancelledError  # of its own: its callers are not cancelled
        return [x * 2 for x in batch]

    b = Recording(max_queue_time=0, answer=answer)
    for x in (0, 1, 2):
        await asyncio.gather(b.process(x), return_exceptions=True)
    s = b.stats
    assert (s.batches, s.processed, s.failed, s.succeeded) == (3, 3, 2, 1)
    await b.stop()

    class Unstartable(Recording):
        async def on_start(self) -> None:
            raise ConnectionError("no model")

    u = Unstartable(max_queue_time=0)
    with pytest.raises(ConnectionError):
        await u.process(1)
    assert (u.stats.batches, u.stats.processed, u.batches) == (0, 0, [])  # it never reached process_batch
    await u.stop()


@pytest.mark.virtual_time
async def test_the_callers_who_stay_while_one_leaves_a_running_batch_are_each_counted() -> None:
    b = Recording(max_queue_time=0, delay=1.0)
    calls = [asyncio.ensure_future(b.process(i)) for i in range(4)]
    await asyncio.sleep(0.5)
    calls[1].cancel()
    assert [await calls[i] for i in (0, 2, 3)] == [0, 4, 6]
    s = b.stats
    assert (s.succeeded, s.cancelled, s.submitted) == (3, 1, 4)
    await b.stop()


@pytest.mark.virtual_time
@pytest.mark.parametrize("hook", [False, True], ids=["default", "abandoned_error"])
async def test_a_batch_whose_task_is_cancelled_from_outside_answers_its_callers_and_says_so(
    hook: bool, caplog: pytest.LogCaptureFixture
) -> None:
    class Writer(Recording):
        def abandoned_error(self, batch: list[int], error: BaseException) -> BaseException:
            return OutcomeUnknownError("may have been written") if hook else error

    b = Writer(max_queue_time=0, delay=10.0)
    calls = [asyncio.ensure_future(b.process(i)) for i in range(2)]
    await asyncio.sleep(1)
    (task,) = asyncio.all_tasks() - {*calls, asyncio.current_task()}  # the batch's
    with caplog.at_level(logging.WARNING, logger="async_batcher"):
        task.cancel()  # as the event loop's shutdown would: its task cancelled, no stop
        results = await asyncio.gather(*calls, return_exceptions=True)
    expected = "may have been written" if hook else "Writer: batch cancelled"
    assert [str(r) for r in results] == [expected] * 2
    assert caplog.messages == [
        f"Writer: a batch of 2 items was cut off, its task cancelled (the event loop shutting down); its callers get "
        f"{'OutcomeUnknownError' if hook else 'BatcherStoppedError'}"
    ]
    assert (b.stats.batches, b.stats.in_flight, b.stats.failed) == (1, 0, 2)
    assert await b.process(5) == 10
    await b.stop()


# ---------------------------------------------------------------------- what process_batch may do and return


WAIT = 10.0


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


async def test_return_exceptions_must_be_a_flag() -> None:
    b = Recording(max_queue_time=0)
    with pytest.raises(TypeError, match="return_exceptions must be True or False, got 'yes'"):
        await b.process_many([1], return_exceptions="yes")  # type: ignore[arg-type]
    await b.stop()
