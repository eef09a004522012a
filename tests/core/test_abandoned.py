"""Contract 9, the callers of a batch cut off by a stop: ``abandoned_error`` says what they get.

A batch whose ``process_batch`` never started was not processed: its callers get the stop's
:class:`BatcherStoppedError` (retrying is safe). A batch cut off while ``process_batch`` worked on it may have done
its work: the hook decides, so that a batcher that writes or sends can answer :class:`OutcomeUnknownError`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any

import pytest

from async_batcher import AsyncBatcher, BatcherStoppedError, OutcomeUnknownError
from tests.batchers import Recording, SyncRecording, until


class Unknown:
    """Mixed in: callers of an abandoned batch hear 'unknown'; the batches the hook was asked about are kept."""

    asked: list[list[int]]

    def abandoned_error(self, batch: list[int], error: BaseException) -> BaseException:
        self.asked = [*getattr(self, "asked", []), list(batch)]
        return OutcomeUnknownError(f"{len(batch)} items may have been written")


class UnknownRecording(Unknown, Recording):
    pass


class UnknownSync(Unknown, SyncRecording):
    pass


@pytest.mark.virtual_time
async def test_by_default_a_forced_stop_gives_the_stop_error() -> None:
    b = Recording(max_batch_size=2, max_queue_time=0, delay=10.0)
    calls = [asyncio.ensure_future(b.process(i)) for i in range(3)]
    await until(lambda: b.batches)
    await b.stop(force=True)
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert [type(r) for r in results] == [BatcherStoppedError] * 3


@pytest.mark.virtual_time
async def test_a_batch_cut_off_in_process_batch_gets_what_the_hook_says_the_queued_items_the_stop() -> None:
    b = UnknownRecording(max_batch_size=2, max_queue_time=0, delay=10.0)
    calls = [asyncio.ensure_future(b.process(i)) for i in range(3)]
    await until(lambda: b.batches)
    await b.stop(force=True)
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert [type(r) for r in results] == [OutcomeUnknownError, OutcomeUnknownError, BatcherStoppedError]
    assert b.asked == [[0, 1]]  # once, for the batch in process_batch; never for the item still queued
    assert isinstance(results[0].__cause__, BatcherStoppedError)
    assert "force=True" in str(results[0].__cause__)
    assert b.stats.failed == 3


@pytest.mark.virtual_time
async def test_an_expired_stop_timeout_asks_the_hook_too() -> None:
    b = UnknownRecording(max_queue_time=0, delay=10.0)
    call = asyncio.ensure_future(b.process(1))
    await until(lambda: b.batches)
    await b.stop(timeout=1.0)
    with pytest.raises(OutcomeUnknownError) as raised:
        await call
    assert "stop(timeout=1.0) expired" in str(raised.value.__cause__)


@pytest.mark.virtual_time
async def test_a_batch_still_waiting_for_on_start_was_not_processed() -> None:
    started = asyncio.Event()

    class SlowStart(UnknownRecording):
        async def on_start(self) -> None:
            started.set()
            await asyncio.sleep(10)

    b = SlowStart(max_queue_time=0)
    call = asyncio.ensure_future(b.process(1))
    await started.wait()
    await asyncio.sleep(1)  # the batch is formed and waits for on_start()
    assert b.stats.in_flight == 1
    await b.stop(force=True)
    with pytest.raises(BatcherStoppedError):
        await call
    assert not hasattr(b, "asked") and b.batches == []


async def test_a_sync_batch_running_in_its_thread_is_unknown_one_waiting_for_a_thread_is_not() -> None:
    block = threading.Event()
    pool = concurrent.futures.ThreadPoolExecutor(1)
    b = UnknownSync(max_batch_size=1, max_queue_time=0, concurrency=2, executor=pool, block=block)
    try:
        first = asyncio.ensure_future(b.process(1))
        await until(lambda: b.batches)  # in the pool's one thread
        second = asyncio.ensure_future(b.process(2))  # its batch waits for the thread
        await until(lambda: b.stats.in_flight == 2)
        await b.stop(force=True)
        with pytest.raises(OutcomeUnknownError):
            await first
        with pytest.raises(BatcherStoppedError):
            await second
        assert b.asked == [[1]]
    finally:
        block.set()
        pool.shutdown(wait=True)
    assert b.batches == [[1]]  # the second batch never reached process_batch


@pytest.mark.virtual_time
async def test_a_streaming_batch_cut_off_is_asked_about() -> None:
    from async_batcher import END

    asked: list[list[int]] = []

    class Streams(AsyncBatcher[int, int]):
        async def process_batch(self, batch: list[int]) -> Any:
            yield list(batch)
            await asyncio.sleep(10)
            yield [END] * len(batch)

        def abandoned_error(self, batch: list[int], error: BaseException) -> BaseException:
            asked.append(list(batch))
            return OutcomeUnknownError("sent")

    b = Streams(max_queue_time=0)
    parts: list[int] = []

    async def consume() -> None:
        async for part in b.stream(7):
            parts.append(part)

    consumer = asyncio.ensure_future(consume())
    await until(lambda: parts)
    await b.stop(force=True)
    with pytest.raises(OutcomeUnknownError):
        await consumer
    assert parts == [7] and asked == [[7]]


@pytest.mark.virtual_time
@pytest.mark.parametrize("hook", ["raises", "returns a string"])
async def test_a_failing_hook_is_reported_and_the_callers_get_the_stop_error(
    hook: str, loop_errors: list[dict[str, Any]]
) -> None:
    class Broken(Recording):
        def abandoned_error(self, batch: list[int], error: BaseException) -> Any:
            if hook == "raises":
                raise KeyError("oops")
            return "unknown"

    b = Broken(max_queue_time=0, delay=10.0)
    call = asyncio.ensure_future(b.process(1))
    await until(lambda: b.batches)
    await b.stop(force=True)
    with pytest.raises(BatcherStoppedError):
        await call
    assert len(loop_errors) == 1
    assert "Broken.abandoned_error() failed" in loop_errors[0]["message"]
    expected = KeyError if hook == "raises" else TypeError
    assert isinstance(loop_errors[0]["exception"], expected)
    loop_errors.clear()


@pytest.mark.virtual_time
async def test_what_a_hook_returning_no_exception_reports_names_the_hook_and_what_it_returned(
    loop_errors: list[dict[str, Any]],
) -> None:
    class Broken(Recording):
        def abandoned_error(self, batch: list[int], error: BaseException) -> Any:
            return 42

    b = Broken(max_queue_time=0, delay=10.0)
    call = asyncio.ensure_future(b.process(1))
    await until(lambda: b.batches)
    await b.stop(force=True)
    with pytest.raises(BatcherStoppedError) as stopped:
        await call
    (report,) = loop_errors
    assert report["message"] == f"Broken: Broken.abandoned_error() failed; its callers get {stopped.value!r}"
    assert str(report["exception"]) == "abandoned_error() must return an exception instance, got 42"
    loop_errors.clear()


@pytest.mark.virtual_time
@pytest.mark.parametrize("returns", ["the_stop_error", "its_own_cause", "a_new_error"])
async def test_the_error_a_hook_returns_is_chained_to_the_stop_unless_it_is_the_stop_or_has_a_cause(
    returns: str,
) -> None:
    own = OSError("the disk")

    class Chaining(Recording):
        def abandoned_error(self, batch: list[int], error: BaseException) -> BaseException:
            if returns == "the_stop_error":
                return error
            unknown = OutcomeUnknownError("may have been written")
            if returns == "its_own_cause":
                unknown.__cause__ = own
            return unknown

    b = Chaining(max_queue_time=0, delay=10.0)
    call = asyncio.ensure_future(b.process(1))
    await until(lambda: b.batches)
    await b.stop(force=True)
    with pytest.raises((BatcherStoppedError, OutcomeUnknownError)) as got:
        await call
    cause = got.value.__cause__
    if returns == "the_stop_error":
        assert isinstance(got.value, BatcherStoppedError) and cause is None  # not its own cause
    elif returns == "its_own_cause":
        assert cause is own
    else:
        assert isinstance(cause, BatcherStoppedError) and "force=True" in str(cause)
