"""A plain ``def process_batch`` runs in an executor: every outcome still reaches every caller exactly once.

The batch goes to the executor straight from the dispatcher and comes back through the executor future's
callback (no task per batch), so these tests walk that path's every end: results and errors, a forced stop
while the thread runs or before it starts, a restart with an old batch still in its thread, an executor that
refuses or cancels work, an awaitable returned from the thread, and a loop closed under a running batch.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from async_batcher import (
    AsyncBatcher,
    BatcherStoppedError,
    BatchSizeMismatchError,
    ProcessBatchCancelledError,
)
from tests.batchers import until


class Scripted(AsyncBatcher[int, Any]):
    """``process_batch`` (sync) answers with ``answer(batch)``; with a ``gate`` it first waits for it to open."""

    def __init__(
        self,
        *,
        answer: Callable[[list[int]], Any] = lambda batch: [x * 2 for x in batch],
        gate: threading.Event | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.answer = answer
        self.gate = gate
        self.batches: list[list[int]] = []
        self.threads: list[int] = []
        self.running = threading.Event()

    def process_batch(self, batch: list[int]) -> Any:
        self.threads.append(threading.get_ident())
        self.batches.append(list(batch))
        self.running.set()
        if self.gate is not None and not self.gate.wait(timeout=60):
            raise RuntimeError("the test never opened the gate")
        return self.answer(batch)


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    """An event the test opens; opened at the end in any case, so that no thread is left waiting on it."""
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture
def pool(gate: threading.Event) -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="test-executor") as executor:
        yield executor
        gate.set()


def _raise(exc: BaseException) -> Any:
    raise exc


def _generator(batch: list[int]) -> Any:
    return (x + 1 for x in batch)


@pytest.mark.parametrize("explicit", [True, False], ids=["own-executor", "default-executor"])
@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (lambda batch: [x * 2 for x in batch], [0, 2, 4]),
        (lambda batch: None, [None, None, None]),
        (_generator, [1, 2, 3]),
        (lambda batch: [ValueError(f"item {x}") if x == 1 else x for x in batch], [0, ValueError, 2]),
        (lambda batch: _raise(KeyError("boom")), [KeyError] * 3),
        (lambda batch: batch[:-1], [BatchSizeMismatchError] * 3),
        (lambda batch: _raise(asyncio.CancelledError()), [ProcessBatchCancelledError] * 3),
    ],
    ids=["results", "none", "generator", "item-error", "raises", "wrong-length", "cancelled-error"],
)
async def test_every_outcome_of_a_thread_batch_reaches_its_callers(
    pool: Any, explicit: bool, answer: Callable[[list[int]], Any], expected: list[Any]
) -> None:
    b = Scripted(answer=answer, executor=pool if explicit else None, max_queue_time=0)
    got = await asyncio.gather(*(b.process(i) for i in range(3)), return_exceptions=True)
    for value, want in zip(got, expected, strict=True):
        if isinstance(want, type):
            assert isinstance(value, want), value
        else:
            assert value == want
    assert b.batches == [[0, 1, 2]]
    stats = b.stats
    assert (stats.batches, stats.processed, stats.in_flight) == (1, 3, 0)
    assert stats.failed == sum(isinstance(w, type) for w in expected)
    # The batcher keeps serving after any of these.
    b.answer = lambda batch: [-x for x in batch]
    assert await b.process(5) == -5
    await b.stop()


async def test_a_forced_stop_answers_the_callers_while_the_thread_still_runs(pool: Any, gate: threading.Event) -> None:
    b = Scripted(gate=gate, executor=pool, max_queue_time=0)
    calls = [asyncio.ensure_future(b.process(i)) for i in range(3)]
    await until(b.running.is_set)
    await b.stop(force=True)
    for call in calls:
        with pytest.raises(BatcherStoppedError):
            await call
    # The thread cannot be interrupted: it runs on, no longer counted against the batcher's slots, and its
    # result is dropped when it returns.
    assert b.stats.in_flight == 0
    assert b.stats.batches == 0
    gate.set()
    await until(lambda: b.stats.batches == 1)
    stats = b.stats
    assert (stats.processed, stats.failed, stats.in_flight) == (0, 3, 0)


async def test_a_batch_still_waiting_for_a_thread_never_starts_after_a_forced_stop(gate: threading.Event) -> None:
    busy = gate
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as one:
        one.submit(busy.wait, 60)  # the only thread is taken: the batch waits in the executor's queue
        b = Scripted(executor=one, max_queue_time=0)
        call = asyncio.ensure_future(b.process(1))
        await until(lambda: b.stats.in_flight == 1)
        await b.stop(force=True)
        with pytest.raises(BatcherStoppedError):
            await call
        await until(lambda: b.stats.in_flight == 0)
        busy.set()
    assert b.batches == []  # it never ran
    assert (b.stats.batches, b.stats.failed) == (0, 1)


async def test_a_restart_is_not_disturbed_by_a_batch_of_the_last_run_still_in_its_thread(
    pool: Any, gate: threading.Event
) -> None:
    b = Scripted(gate=gate, executor=pool, max_queue_time=0, concurrency=1)
    old = asyncio.ensure_future(b.process(1))
    await until(b.running.is_set)
    await b.stop(force=True)
    with pytest.raises(BatcherStoppedError):
        await old
    b.start()
    b.gate = None  # the new run's batches do not wait
    assert await b.process(2) == 4  # the new run has its own slot
    gate.set()
    # The old batch ends in the new run: its result is dropped and the new run's slot count is untouched.
    await until(lambda: len(b.batches) == 2 and b.stats.batches == 2)
    assert b.stats.in_flight == 0
    assert await asyncio.gather(b.process(3), b.process(4)) == [6, 8]
    await b.stop()


async def test_an_executor_that_refuses_the_batch_fails_its_callers() -> None:
    closed = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    closed.shutdown()
    b = Scripted(executor=closed, max_queue_time=0)
    with pytest.raises(RuntimeError, match="shutdown"):
        await b.process(1)
    assert (b.stats.in_flight, b.stats.batches, b.stats.failed) == (0, 0, 1)
    await b.stop()


async def test_an_executor_that_cancels_a_queued_batch_fails_its_callers(gate: threading.Event) -> None:
    busy = gate
    one = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    try:
        one.submit(busy.wait, 60)
        b = Scripted(executor=one, max_queue_time=0)
        call = asyncio.ensure_future(b.process(1))
        await until(lambda: b.stats.in_flight == 1)
        one.shutdown(wait=False, cancel_futures=True)
        with pytest.raises(ProcessBatchCancelledError, match="executor cancelled"):
            await call
        assert b.batches == []
        assert (b.stats.in_flight, b.stats.batches, b.stats.failed) == (0, 0, 1)  # it never ran: no batch counted
    finally:
        busy.set()
        one.shutdown()
    await b.stop()


@pytest.mark.parametrize("explicit", [True, False], ids=["own-executor", "default-executor"])
async def test_an_awaitable_returned_from_the_thread_is_awaited_on_the_loop(pool: Any, explicit: bool) -> None:
    release = asyncio.Event()
    awaited = 0

    async def later(batch: list[int]) -> list[int]:
        nonlocal awaited
        awaited += 1
        await release.wait()
        return [x * 3 for x in batch]

    b = Scripted(answer=later, executor=pool if explicit else None, max_queue_time=0)
    calls = [asyncio.ensure_future(b.process(i)) for i in range(2)]
    await until(lambda: b.batches != [])
    release.set()
    assert await asyncio.gather(*calls) == [0, 3]

    release.clear()
    call = asyncio.ensure_future(b.process(7))
    await until(lambda: awaited == 2)
    await b.stop(force=True)  # the awaitable is cancelled with its batch
    with pytest.raises(BatcherStoppedError):
        await call
    assert b.stats.in_flight == 0


async def test_a_sync_batch_formed_before_on_start_finishes_runs_in_the_executor_after_it(pool: Any) -> None:
    started = asyncio.Event()

    class SlowStart(Scripted):
        async def on_start(self) -> None:
            await started.wait()

    b = SlowStart(executor=pool, max_queue_time=0)
    calls = [asyncio.ensure_future(b.process(i)) for i in range(3)]
    await until(lambda: b.stats.in_flight == 1)
    assert b.batches == []  # formed, held until on_start() returns
    started.set()
    assert await asyncio.gather(*calls) == [0, 2, 4]
    assert b.threads and threading.get_ident() not in b.threads  # not on the loop's thread
    assert (b.stats.batches, b.stats.processed, b.stats.in_flight) == (1, 3, 0)
    await b.stop()


async def test_a_sync_batch_waits_for_on_start_and_gets_its_failure(pool: Any) -> None:
    class FailingStart(Scripted):
        async def on_start(self) -> None:
            await asyncio.sleep(0)
            raise OSError("no model")

    b = FailingStart(executor=pool, max_queue_time=0)
    with pytest.raises(OSError, match="no model"):
        await b.process(1)
    assert b.batches == []  # it never reached process_batch
    assert b.stats.in_flight == 0
    await b.stop()


def test_a_loop_closed_under_a_running_batch_leaves_the_thread_quiet(
    pool: Any, gate: threading.Event, caplog: pytest.LogCaptureFixture
) -> None:
    b = Scripted(gate=gate, executor=pool, max_queue_time=0)
    loop = asyncio.new_event_loop()
    call = loop.create_task(b.process(1))
    loop.run_until_complete(until(b.running.is_set))
    call.cancel()
    loop.run_until_complete(asyncio.gather(call, return_exceptions=True))
    loop.close()
    with caplog.at_level(logging.DEBUG, logger="concurrent.futures"):
        gate.set()
        pool.shutdown(wait=True)  # the batch's thread has returned and its callback has run
    assert not [r for r in caplog.records if r.name == "concurrent.futures"]


def test_a_keyboard_interrupt_in_process_batch_answers_the_callers_then_goes_on() -> None:
    b = Scripted(answer=lambda batch: _raise(KeyboardInterrupt()), max_queue_time=0)
    loop = asyncio.new_event_loop()
    try:
        call = loop.create_task(b.process(1))
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(call)
        with pytest.raises(BatcherStoppedError) as stopped:
            loop.run_until_complete(call)
        assert str(stopped.value) == "Scripted: batch interrupted by KeyboardInterrupt"
        assert b.stats.in_flight == 0
        loop.run_until_complete(b.stop())
    finally:
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()


async def test_an_awaitable_the_loop_cannot_await_fails_its_callers() -> None:
    other = asyncio.new_event_loop()
    try:
        foreign = other.create_future()  # a future of another event loop
        b = Scripted(answer=lambda batch: foreign, max_queue_time=0)
        with pytest.raises(ValueError, match="loop"):
            await b.process(1)
        assert (b.stats.in_flight, b.stats.failed, b.stats.batches) == (0, 1, 1)  # process_batch did run
        b.answer = lambda batch: [x * 2 for x in batch]
        assert await b.process(2) == 4  # it serves on
        await b.stop()
    finally:
        other.close()


async def test_every_outcome_of_an_awaitable_returned_from_the_thread_reaches_the_callers_and_the_statistics(
    pool: Any,
) -> None:
    async def fails(batch: list[int]) -> list[int]:
        raise KeyError("no such row")

    async def cancels(batch: list[int]) -> list[int]:
        raise asyncio.CancelledError  # the awaitable cancels itself: no caller may look cancelled

    async def answers(batch: list[int]) -> list[int]:
        return [x * 3 for x in batch]

    b = Scripted(executor=pool, max_queue_time=0)
    outcomes: list[Any] = []
    for answer in (fails, cancels, answers):
        b.answer = answer
        outcomes.append(await asyncio.gather(b.process(1), b.process(2), return_exceptions=True))
    assert [type(r) for r in outcomes[0]] == [KeyError, KeyError]
    assert [type(r) for r in outcomes[1]] == [ProcessBatchCancelledError] * 2
    assert outcomes[2] == [3, 6]
    s = b.stats
    assert (s.batches, s.processed, s.failed, s.succeeded) == (3, 6, 4, 2)  # each reached process_batch
    await b.stop()


async def test_a_thread_that_ran_a_batch_may_make_a_blocking_call_afterwards() -> None:
    one = concurrent.futures.ThreadPoolExecutor(max_workers=1)  # the batch's thread, and the caller's after it
    try:
        b = Scripted(executor=one, max_queue_time=0)
        assert await b.process(1) == 2
        b.executor = None  # the next batches run in the loop's default executor
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(one, functools.partial(b.process_sync, 3, timeout=10)) == 6
        assert len(set(b.threads)) == 2
    finally:
        one.shutdown()
    await b.stop()


async def test_a_batch_goes_straight_to_the_batchers_own_executor_and_back_on_a_standard_loop(pool: Any) -> None:
    # The standard loop's run_in_executor chains an asyncio future to the executor's: one more turn of the loop per
    # batch, for nothing a batch needs. The batcher's own executor is handed the batch directly; the loop's default
    # executor (None) still goes through the loop.
    loop = asyncio.get_running_loop()
    if type(loop).run_in_executor is not asyncio.BaseEventLoop.run_in_executor:
        pytest.skip("a loop with a run_in_executor of its own is always gone through")
    through_loop: list[Any] = []
    run_in_executor = loop.run_in_executor

    def counted(executor: Any, *args: Any) -> Any:
        through_loop.append(executor)
        return run_in_executor(executor, *args)

    loop.run_in_executor = counted  # type: ignore[method-assign]
    try:
        own = Scripted(executor=pool, max_queue_time=0)
        assert await asyncio.gather(own.process(1), own.process(2)) == [2, 4]
        assert await own.process(3) == 6
        assert through_loop == []
        default = Scripted(max_queue_time=0)
        assert await default.process(4) == 8
        assert through_loop == [None]
    finally:
        del loop.run_in_executor
    assert (own.stats.batches, own.stats.succeeded, own.stats.in_flight) == (2, 3, 0)
    await own.stop()
    await default.stop()
