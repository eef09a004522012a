"""Contract 8 (lifecycle), 9 (stop), 10 (statistics), 11 (validation), 12 (logging), and 0.2.2 compatibility."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import inspect
import json
import logging
import math
import re
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import async_batcher
from async_batcher import AsyncBatcher, BatcherStoppedError, BatchSizeMismatchError, Limits
from async_batcher.batcher import AsyncBatcher as AsyncBatcherFromModule
from async_batcher.exceptions import AsyncBatchException, QueueFullException
from tests.batchers import Recording, settled, until

ANOTHER_LOOP = r"^Recording is running on another event loop; stop it there before using it here$"


class FailingOnStop(Recording):
    """Its on_stop() fails with ``OSError("close failed")``, at once or ``close_after`` seconds in."""

    def __init__(self, *, close_after: float | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.close_after = close_after

    async def on_stop(self) -> None:
        if self.close_after is not None:
            await asyncio.sleep(self.close_after)
        raise OSError("close failed")


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What was logged, each message whole (a test of a message's text must see all of it)."""
    return [r.getMessage() for r in caplog.records]


def test_all_matches_what_the_package_exports() -> None:
    # Submodules become attributes of the package once anything imports them: they are not exports.
    public = {
        name
        for name, value in vars(async_batcher).items()
        if not name.startswith("_") and not inspect.ismodule(value) and name != "annotations"
    } | {"__version__"}
    assert set(async_batcher.__all__) == public
    for name in async_batcher.__all__:
        assert getattr(async_batcher, name) is not None


def test_the_import_paths_of_0_2_2_still_work() -> None:
    assert AsyncBatcherFromModule is AsyncBatcher
    assert issubclass(QueueFullException, AsyncBatchException)
    assert issubclass(BatcherStoppedError, RuntimeError)


def test_process_batch_is_required() -> None:
    with pytest.raises(TypeError):
        AsyncBatcher()  # type: ignore[abstract]


def test_construction_binds_no_loop_and_a_batcher_runs_again_in_a_new_loop() -> None:
    b = Recording(max_queue_time=0)  # built outside any loop

    async def use() -> int:
        result = await b.process(3)
        await b.stop()
        return result

    assert asyncio.run(use()) == 6
    b.start()  # outside a loop: only marks it to start at first use
    assert asyncio.run(use()) == 6
    assert b.stats.batches == 2


def test_a_batcher_left_running_in_a_closed_loop_starts_afresh_in_the_next() -> None:
    b = Recording(max_queue_time=0)
    assert asyncio.run(b.process(1)) == 2
    assert asyncio.run(b.process(2)) == 4


def test_the_items_lost_with_a_loop_closed_under_them_count_as_failed(caplog: pytest.LogCaptureFixture) -> None:
    def answer(batch: list[int]) -> list[Any]:
        return [ValueError(x) if x < 0 else 2 * x for x in batch]

    gate = asyncio.Event()
    b = Recording(max_queue_time=0, max_queue_size=3, max_batch_size=2, wait_when_full=True, answer=answer, gate=gate)
    gate.set()
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(lambda _loop, _context: None)  # ("Task was destroyed but it is pending": expected)
    with pytest.raises(ValueError):
        loop.run_until_complete(b.process(-1))  # failed before the loop closes: still counted once
    b.max_queue_time = 100
    gate.clear()
    # Two in a batch held in flight, three queued, one waiting for room.
    callers = [loop.create_task(b.process(i)) for i in range(6)]
    loop.run_until_complete(asyncio.sleep(0))
    assert (b.stats.in_flight, b.stats.queued, b.stats.failed) == (1, 3, 1)
    loop.close()  # with the callers still waiting: they are gone with it
    del callers
    b.gate = None  # (an Event of the closed loop)
    b.max_queue_time = 0
    with caplog.at_level(logging.WARNING, logger="async_batcher"):
        assert asyncio.run(b.process(5)) == 10
    assert "Recording: its event loop was closed without stop(); starting afresh (6 items lost)" in messages(caplog)
    s = b.stats
    assert (s.submitted, s.succeeded, s.failed, s.queued) == (8, 1, 7, 0)


def test_a_batch_function_used_in_one_asyncio_run_after_another_warns_of_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Nothing was lost with the loops closed under it (no item, no on_stop() left to run): a DEBUG line, not a WARNING
    # at every run (under pytest-asyncio, every test).
    @async_batcher.batch(max_queue_time=0, name="double")
    async def double(items: list[int]) -> list[int]:
        return [x * 2 for x in items]

    class Closing(Recording):
        async def on_stop(self) -> None:
            pass

    closing = Closing(max_queue_time=0)
    with caplog.at_level(logging.DEBUG, logger="async_batcher"):
        assert [asyncio.run(double(i)) for i in range(3)] == [0, 2, 4]
        assert [asyncio.run(closing.process(i)) for i in range(2)] == [0, 2]
    logged = [(r.levelno, r.getMessage()) for r in caplog.records if "closed without stop()" in r.getMessage()]
    assert logged == [
        (logging.DEBUG, "double: its event loop was closed without stop(); starting afresh (0 items lost)")
    ] * 2 + [
        (logging.WARNING, "Closing: its event loop was closed without stop(); starting afresh (0 items lost)")
    ]  # (an on_stop() that never ran: what it should have closed is still open)


async def test_start_is_optional_and_idempotent() -> None:
    b = Recording(max_queue_time=0)
    assert not await b.is_running()
    assert await b.process(1) == 2
    assert await b.is_running()
    b.start()
    b.start()
    assert await b.process(2) == 4
    await b.stop()
    assert not await b.is_running()


async def test_async_with_starts_and_stops() -> None:
    async with Recording(max_queue_time=0) as b:
        assert await b.is_running()
        assert await b.process(5) == 10
    assert not await b.is_running()
    with pytest.raises(BatcherStoppedError):
        await b.process(1)


async def test_on_start_and_on_stop_run_once_per_run() -> None:
    events: list[str] = []

    class Hooked(Recording):
        async def on_start(self) -> None:
            await asyncio.sleep(0)
            events.append("start")

        async def on_stop(self) -> None:
            events.append("stop")

    b = Hooked(max_queue_time=0)
    assert await asyncio.gather(b.process(1), b.process(2)) == [2, 4]
    await b.stop()
    await b.stop()
    b.start()
    assert await b.process(3) == 6
    await b.stop()
    assert events == ["start", "stop", "start", "stop"]


@pytest.mark.virtual_time
@pytest.mark.parametrize("kind", ["async", "sync", "stream"])
async def test_batches_formed_while_on_start_runs_keep_their_order(kind: str) -> None:
    # The full batch [1, 2, 3] waits for on_start(); [4] is formed by its deadline as on_start() ends, and sees it
    # done: it must still reach process_batch second.
    order: list[int] = []

    class Starting(AsyncBatcher[int, int]):
        async def on_start(self) -> None:
            await asyncio.sleep(0.01)

    class Async(Starting):
        async def process_batch(self, batch: list[int]) -> list[int]:
            order.extend(batch)
            return batch

    class Sync(Starting):
        def process_batch(self, batch: list[int]) -> list[int]:  # type: ignore[override]
            order.extend(batch)
            return batch

    class Stream(Starting):
        async def process_batch(self, batch: list[int]) -> AsyncIterator[list[int]]:  # type: ignore[override]
            order.extend(batch)
            yield batch

    async def streamed(b: AsyncBatcher[int, int], item: int) -> int:
        (part,) = [part async for part in b.stream(item)]  # one step: one part
        return part

    # One thread: the batches run in the order they reach the executor.
    with concurrent.futures.ThreadPoolExecutor(1) as executor:
        cls = {"async": Async, "sync": Sync, "stream": Stream}[kind]
        b = cls(max_batch_size=3, max_queue_time=0.01, concurrency=2, executor=executor)
        if kind == "stream":
            assert await asyncio.gather(*(streamed(b, i) for i in [1, 2, 3, 4])) == [1, 2, 3, 4]
            assert await streamed(b, 5) == 5  # and the batches after them, once they have all passed
        else:
            assert await b.process_many([1, 2, 3, 4]) == [1, 2, 3, 4]
            assert await b.process_many([5]) == [5]
        assert order == [1, 2, 3, 4, 5]
        await b.stop()


async def test_a_failing_on_start_fails_the_callers_and_async_with() -> None:
    class Broken(Recording):
        async def on_start(self) -> None:
            raise ConnectionError("no backend")

    b = Broken(max_queue_time=0)
    with pytest.raises(ConnectionError):
        await b.process(1)
    await b.stop()
    with pytest.raises(ConnectionError):
        async with Broken():
            pass


@pytest.mark.virtual_time
async def test_stop_refuses_new_items_and_drains_the_queue_and_batches_in_flight() -> None:
    loop = asyncio.get_running_loop()
    b = Recording(max_batch_size=3, max_queue_time=100, delay=1.0)
    calls = [asyncio.ensure_future(b.process(i)) for i in range(7)]
    await asyncio.sleep(0)
    stopping = asyncio.ensure_future(b.stop())
    await asyncio.sleep(0)
    with pytest.raises(BatcherStoppedError) as info:
        await b.process(99)
    assert isinstance(info.value, RuntimeError)
    await stopping
    # Nothing waited for max_queue_time: stop sends what is queued at once.
    assert [c.result() for c in calls] == [i * 2 for i in range(7)]
    assert b.batches == [[0, 1, 2], [3, 4, 5], [6]]
    assert loop.time() == 3.0
    assert b.stats.rejected == 1


@pytest.mark.virtual_time
async def test_stop_with_a_timeout_fails_what_is_unfinished_when_it_expires() -> None:
    loop = asyncio.get_running_loop()
    b = Recording(max_batch_size=2, max_queue_time=0, delay=10.0)
    calls = [asyncio.ensure_future(b.process(i)) for i in range(4)]
    await until(lambda: b.batches)
    await b.stop(timeout=2.0)
    assert loop.time() == 2.0
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert all(isinstance(r, BatcherStoppedError) for r in results)
    assert {str(r) for r in results} == {"Recording was stopped: stop(timeout=2.0) expired"}
    assert b.sent == [0, 1]
    assert not await b.is_running()


@pytest.mark.virtual_time
async def test_force_stop_fails_everyone_at_once_and_cancels_batches_in_flight() -> None:
    loop = asyncio.get_running_loop()
    cancelled = asyncio.Event()

    class Slow(Recording):
        async def process_batch(self, batch: list[int]) -> Any:
            try:
                return await super().process_batch(batch)
            except asyncio.CancelledError:
                cancelled.set()
                raise

    b = Slow(max_batch_size=2, max_queue_time=0, delay=10.0)
    calls = [asyncio.ensure_future(b.process(i)) for i in range(5)]
    await until(lambda: b.batches)
    await b.stop(force=True)
    assert loop.time() == 0
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert all(isinstance(r, BatcherStoppedError) for r in results)
    await asyncio.wait_for(cancelled.wait(), 1)
    assert b.sent == [0, 1]
    assert b.stats.failed == 5


@pytest.mark.virtual_time
async def test_stop_is_idempotent_and_concurrent_stops_escalate() -> None:
    b = Recording(max_queue_time=0, delay=10.0)
    call = asyncio.ensure_future(b.process(1))
    await until(lambda: b.batches)
    gentle = asyncio.ensure_future(b.stop())
    await asyncio.sleep(1)
    assert not gentle.done()
    await b.stop(force=True)
    await gentle
    await b.stop()
    with pytest.raises(BatcherStoppedError):
        await call


async def test_a_stop_on_a_never_started_batcher_does_nothing() -> None:
    b = Recording()
    await b.stop()
    await b.stop(force=True)
    assert await b.process(1) == 2  # never started, so the first process starts it
    await b.stop()


async def test_an_on_stop_failure_reaches_the_caller_of_stop() -> None:
    b = FailingOnStop(max_queue_time=0)
    await b.process(1)
    with pytest.raises(OSError, match="close failed"):
        await b.stop()
    assert not await b.is_running()


async def test_an_on_stop_failure_nobody_awaits_goes_to_the_loops_exception_handler(
    loop_errors: list[dict[str, Any]],
) -> None:
    b = FailingOnStop(max_queue_time=0)
    await b.process(1)
    stopping = asyncio.ensure_future(b.stop())
    await asyncio.sleep(0)
    stopping.cancel()
    await until(lambda: loop_errors)
    assert isinstance(loop_errors[0]["exception"], OSError)


@pytest.mark.virtual_time
async def test_stats_count_every_outcome() -> None:
    gate = asyncio.Event()
    b = Recording(max_batch_size=2, max_queue_time=1.0, max_queue_size=3, gate=gate)
    ok = [asyncio.ensure_future(b.process(i)) for i in range(2)]  # full batch: goes at once, held by the gate
    await until(lambda: b.batches)
    waiting = [asyncio.ensure_future(b.process(i)) for i in range(10, 13)]
    await until(lambda: b.stats.queued == 3)
    with pytest.raises(QueueFullException):
        await b.process(99)
    waiting[0].cancel()
    timed_out = asyncio.ensure_future(b.process(50, timeout=0.5))
    await asyncio.sleep(0.6)
    with pytest.raises(TimeoutError):
        await timed_out
    s = b.stats
    assert (s.submitted, s.batches, s.queued, s.in_flight, s.rejected, s.cancelled, s.timed_out) == (
        6,
        0,
        2,
        1,
        1,
        1,
        1,
    )
    gate.set()
    await asyncio.gather(*ok, *waiting[1:])
    s = b.stats
    assert (s.batches, s.processed, s.failed, s.queued, s.in_flight) == (2, 4, 0, 0, 0)
    assert s.mean_batch_size == 2.0
    assert s.queue_wait.count == 2 and s.queue_wait.p50 == 0.0 and s.queue_wait.p99 == pytest.approx(0.6)
    assert s.process_time.p50 == 0.0 and s.process_time.p99 == pytest.approx(0.6)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.batches = 0  # type: ignore[misc]
    # A snapshot converts as a dataclass does, to JSON too (a /stats endpoint): its mappings are plain dicts, copies.
    as_dict = dataclasses.asdict(s)
    assert as_dict["reasons"] == {"full": 2} and as_dict["rejected_reasons"] == {"queue_full": 1}
    assert json.loads(json.dumps(as_dict).replace("NaN", "null"))["submitted"] == 6
    s.reasons["full"] = 99  # type: ignore[index]
    assert b.stats.reasons["full"] == 2
    await b.stop()


def test_stats_before_any_batch() -> None:
    s = Recording(name="fresh").stats
    assert s.name == "fresh" and s.batches == 0 and s.mean_batch_size == 0.0
    assert math.isnan(s.queue_wait.p50) and s.queue_wait.count == 0


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"max_batch_size": 0}, "0"),
        ({"max_batch_size": -2}, "-2"),
        ({"max_batch_size": 2.5}, "2.5"),
        ({"max_batch_size": True}, "True"),
        ({"concurrency": 0}, "0"),
        ({"concurrency": -5}, "-5"),
        ({"max_queue_size": -3}, "-3"),
        ({"max_queue_size": "10"}, "'10'"),
        ({"max_queue_time": -0.1}, "-0.1"),
        ({"max_queue_time": float("inf")}, "inf"),
        ({"max_queue_time": float("nan")}, "nan"),
        ({"max_queue_time": None}, "None"),
    ],
)
def test_bad_settings_are_refused_naming_the_value(kwargs: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))) as info:
        Recording(**kwargs)
    assert named in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"preferred_batch_sizes": [0]}, "[0]"),
        ({"preferred_batch_sizes": (4, -1)}, "-1"),
        ({"preferred_batch_sizes": [2.5]}, "2.5"),
        ({"stream_buffer": 0}, "0"),
        ({"stream_buffer": -1}, "-1"),
    ],
)
def test_a_size_with_no_unlimited_value_is_refused_without_offering_one(kwargs: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))) as info:
        Recording(max_batch_size=8, **kwargs)
    assert named in str(info.value) and "no limit" not in str(info.value) and ">= 1" in str(info.value)


def test_a_bad_setting_on_a_running_batcher_is_refused_and_the_old_one_kept() -> None:
    b = Recording(max_batch_size=4)
    with pytest.raises(ValueError, match="max_batch_size"):
        b.max_batch_size = 0
    assert b.max_batch_size == 4


def test_edge_settings_are_accepted() -> None:
    assert Recording(max_batch_size=1).max_batch_size == 1


def test_the_defaults_are_those_of_0_2_2_with_none_for_no_limit() -> None:
    b = Recording()
    assert (b.max_batch_size, b.max_queue_time, b.concurrency, b.max_queue_size, b.executor) == (
        None,
        0.01,
        1,
        None,
        None,
    )


def test_no_limit_is_none() -> None:
    b = Recording(max_batch_size=None, concurrency=None, max_queue_size=None)
    assert (b.max_batch_size, b.concurrency, b.max_queue_size) == (None, None, None)
    assert b.limits == Limits(max_batch_size=None, concurrency=None, max_queue_size=None)


@pytest.mark.parametrize(("name", "old"), [("max_batch_size", -1), ("concurrency", -1), ("max_queue_size", -1)])
def test_the_old_spellings_of_no_limit_still_work_and_warn_pointing_at_none(name: str, old: int) -> None:
    # async-batcher 0.2.2's "no limit" (-1; and 0 for max_queue_size, an asyncio.Queue's maxsize) read back as None,
    # with a DeprecationWarning that names None and points at the caller's line: at construction, in Limits, live.

    class Plain(AsyncBatcher[int, int]):
        async def process_batch(self, batch: list[int]) -> list[int]:
            return batch

    with pytest.warns(DeprecationWarning, match=rf"{name}={old} for no limit is deprecated: use {name}=None") as w:
        b = Plain(**{name: old})
    assert w[0].filename == __file__
    assert getattr(b, name) is None and getattr(b.limits, name) is None
    with pytest.warns(DeprecationWarning, match=f"use {name}=None") as w:
        assert getattr(Limits(**{name: old}), name) is None
    assert w[0].filename == __file__
    setattr(b, name, 4)
    with pytest.warns(DeprecationWarning, match=f"use {name}=None") as w:
        setattr(b, name, old)
    assert w[0].filename == __file__ and getattr(b, name) is None


def test_max_queue_size_0_is_the_old_no_limit_too() -> None:
    with pytest.warns(DeprecationWarning, match="max_queue_size=0 for no limit is deprecated: use max_queue_size=None"):
        assert Recording(max_queue_size=0).max_queue_size is None


@pytest.mark.parametrize("name", ["max_batch_size", "concurrency", "max_queue_size"])
def test_below_the_old_spellings_a_limit_is_an_error_at_construction_and_live(name: str) -> None:
    with pytest.raises(ValueError, match=f"{name} must be an int >= 1, or None for no limit; got -2"):
        Recording(**{name: -2})
    b = Recording(**{name: 3})
    with pytest.raises(ValueError, match=f"{name} must be an int >= 1, or None for no limit; got -2"):
        setattr(b, name, -2)
    assert getattr(b, name) == 3


def test_batch_size_is_a_deprecated_synonym_of_max_batch_size_but_not_both() -> None:
    with pytest.warns(DeprecationWarning, match="max_batch_size"):
        assert Recording(batch_size=20).max_batch_size == 20
    with pytest.raises(TypeError, match="both"):
        Recording(batch_size=20, max_batch_size=10)


@pytest.mark.parametrize("name", ["sleep_time", "buffering_time"])
def test_deprecated_keywords_warn_and_are_ignored(name: str) -> None:
    with pytest.warns(DeprecationWarning, match=name):
        Recording(**{name: 0.5})


def test_unknown_keywords_are_refused() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(TypeError, match="max_batch_sise"):
            Recording(max_batch_sise=3)


async def test_logs_go_to_the_async_batcher_logger_without_payloads(caplog: pytest.LogCaptureFixture) -> None:
    secret = "payload-7f3a9"

    def fail(batch: list[Any]) -> Any:
        raise RuntimeError(f"cannot handle {batch}")

    b = Recording(max_queue_time=0, answer=fail)
    root_handlers = list(logging.getLogger().handlers)
    with caplog.at_level(logging.DEBUG):
        with pytest.raises(RuntimeError):
            await b.process(secret)  # type: ignore[arg-type]
    await b.stop()
    assert caplog.records, "a failing batch is logged"
    assert {r.name for r in caplog.records} <= {"async_batcher"} | {
        n for n in (r.name for r in caplog.records) if n.startswith("async_batcher.")
    }
    assert all(secret not in r.getMessage() and not r.exc_info for r in caplog.records)
    assert logging.getLogger().handlers == root_handlers


async def test_a_batcher_bound_to_a_running_loop_refuses_another() -> None:
    b = Recording(max_queue_time=0)
    await b.process(1)

    def use_elsewhere() -> None:
        with pytest.raises(RuntimeError, match=ANOTHER_LOOP):
            asyncio.run(b.process(2))

    await asyncio.get_running_loop().run_in_executor(None, use_elsewhere)
    await b.stop()


@pytest.mark.virtual_time
async def test_a_stop_refuses_the_callers_waiting_for_room_each_counted_once() -> None:
    gate = asyncio.Event()
    b = Recording(max_queue_size=1, max_queue_time=0, max_batch_size=1, gate=gate, wait_when_full=True)
    first = asyncio.ensure_future(b.process(0))
    await until(lambda: b.batches)
    queued = asyncio.ensure_future(b.process(1))
    in_line = [asyncio.ensure_future(b.process(i)) for i in (2, 3)]
    await asyncio.sleep(0)
    stopping = asyncio.ensure_future(b.stop())
    for call in in_line:
        with pytest.raises(BatcherStoppedError, match="is stopping"):
            await call
    gate.set()
    await stopping
    assert await first == 0 and await queued == 2
    s = b.stats
    assert (s.submitted, s.succeeded, s.failed) == (4, 2, 2)


@pytest.mark.virtual_time
async def test_a_stop_cancels_an_on_start_still_running() -> None:
    started = asyncio.Event()
    cancelled = []

    class SlowStart(Recording):
        async def on_start(self) -> None:
            started.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.append(True)
                raise

    b = SlowStart(max_queue_time=0)
    b.start()
    await started.wait()
    await b.stop()
    assert cancelled == [True] and not await b.is_running()


async def test_concurrent_stops_all_get_a_failing_on_stop_and_the_loop_reports_nothing() -> None:
    b = FailingOnStop(max_queue_time=0, close_after=0)
    await b.process(1)
    results = await asyncio.gather(b.stop(), b.stop(), b.stop(), return_exceptions=True)
    assert all(isinstance(r, OSError) for r in results)  # (the harness fails the test on a loop report)


async def test_a_stop_that_leaves_does_not_make_the_others_failure_unawaited() -> None:
    b = FailingOnStop(max_queue_time=0, close_after=0.01)
    await b.process(1)
    leaving, staying = asyncio.ensure_future(b.stop()), asyncio.ensure_future(b.stop())
    await asyncio.sleep(0)
    leaving.cancel()  # one caller of stop() leaves while on_stop() runs; the other still gets its failure
    with pytest.raises(OSError, match="close failed"):
        await staying
    assert leaving.cancelled()  # (the harness fails the test on a loop report)


async def test_the_loops_report_of_an_unawaited_on_stop_failure_names_the_batcher(
    loop_errors: list[dict[str, Any]],
) -> None:
    b = FailingOnStop(max_queue_time=0, name="closer")
    await b.process(1)
    stopping = asyncio.ensure_future(b.stop())
    await asyncio.sleep(0)
    stopping.cancel()
    await until(lambda: loop_errors)
    assert loop_errors[0]["message"] == "closer: on_stop() failed" and "task" in loop_errors[0]


def test_a_stop_of_a_batcher_whose_loop_closed_marks_it_stopped_and_it_starts_again() -> None:
    b = Recording(max_queue_time=0)
    loop = asyncio.new_event_loop()
    assert loop.run_until_complete(b.process(1)) == 2
    loop.close()

    async def stop_then_use() -> int:
        await b.stop()
        assert not await b.is_running()
        with pytest.raises(BatcherStoppedError, match=r"^Recording is stopped; start\(\) it again to submit items$"):
            await b.process(2)
        b.start()
        return await b.process(2)

    assert asyncio.run(stop_then_use()) == 4


async def test_process_from_another_loop_while_running_is_refused_and_changes_nothing() -> None:
    b = Recording(max_queue_time=0)
    await b.process(1)

    def from_elsewhere() -> None:
        with pytest.raises(RuntimeError, match=ANOTHER_LOOP):
            asyncio.run(b.process(2))
        with pytest.raises(RuntimeError, match=ANOTHER_LOOP):
            asyncio.run(b.process(2, timeout=1.0))

    await asyncio.get_running_loop().run_in_executor(None, from_elsewhere)
    assert await b.process(3) == 6 and b.sent == [1, 3]
    await b.stop()


async def test_a_failing_on_start_is_logged_with_the_batchers_name(caplog: pytest.LogCaptureFixture) -> None:
    class Broken(Recording):
        async def on_start(self) -> None:
            raise ConnectionRefusedError("no backend")

    b = Broken(name="starter")
    with caplog.at_level(logging.WARNING, logger="async_batcher"):
        b.start()
        await b.stop()
    assert messages(caplog) == ["starter: on_start() failed: ConnectionRefusedError"]


async def test_stop_from_another_loop_and_start_during_a_stop_are_refused_saying_what_to_do() -> None:
    gate = asyncio.Event()
    b = Recording(max_queue_time=0, gate=gate)
    call = asyncio.ensure_future(b.process(1))
    await until(lambda: b.batches)

    def stop_elsewhere() -> None:
        with pytest.raises(RuntimeError, match=r"^Recording runs on another event loop; call stop\(\) there$"):
            asyncio.run(b.stop())

    await asyncio.get_running_loop().run_in_executor(None, stop_elsewhere)
    stopping = asyncio.ensure_future(b.stop())
    await asyncio.sleep(0)
    with pytest.raises(
        BatcherStoppedError, match=r"^Recording is stopping; it can be started again once stop\(\) returns$"
    ):
        b.start()
    gate.set()
    await stopping
    assert await call == 2
    b.start()  # and once it has returned, it can
    assert await b.process(3) == 6
    await b.stop()


@pytest.mark.virtual_time
async def test_a_drain_ended_by_a_caller_leaving_runs_on_stop() -> None:
    stopped = []

    class Closing(Recording):
        async def on_stop(self) -> None:
            stopped.append(True)

    b = Closing(max_queue_time=10)
    caller = asyncio.ensure_future(b.process(1))
    await until(lambda: b.stats.queued == 1)
    await asyncio.sleep(0)  # the dispatcher has looked (and armed its timer): the caller's leaving comes first now
    caller.cancel()  # it leaves as the stop begins: its withdrawal ends the drain, with nothing to send
    await b.stop()
    assert stopped == [True] and b.sent == [] and caller.cancelled()
    assert b.stats.cancelled == 1 and not await b.is_running()


class ByName(AsyncBatcher[int, str]):
    async def process_batch(self, items: list[int]) -> list[str]:
        return ["position"] * len(items)


class Batch_(AsyncBatcher[int, str]):
    async def process_batch(self, batch: list[int]) -> list[str]:
        return ["keyword?"] * len(batch)


class KeywordOnly(AsyncBatcher[int, str]):
    async def process_batch(self, *, batch: list[int]) -> list[str]:  # type: ignore[override]
        return ["keyword"] * len(batch)


class Star(AsyncBatcher[int, str]):
    async def process_batch(self, *args: Any) -> list[str]:
        return ["position"] * len(args[0])


class Kwargs(AsyncBatcher[int, str]):
    async def process_batch(self, **kwargs: Any) -> list[str]:  # type: ignore[override]
        return ["keyword"] * len(kwargs["batch"])


class NamedAndKwargs(AsyncBatcher[int, str]):
    async def process_batch(self, items: list[int], **kwargs: Any) -> list[str]:
        return ["position" if not kwargs else "keyword"] * len(items)


class StarAndKwargs(AsyncBatcher[int, str]):
    async def process_batch(self, *args: Any, **kwargs: Any) -> list[str]:
        return ["keyword" if "batch" in kwargs else "position"] * len((args or (kwargs["batch"],))[0])


class _NoSignature:
    """A callable whose signature cannot be read (its ``__signature__`` is not one)."""

    __signature__ = "unreadable"

    def __call__(self, items: list[int]) -> list[str]:
        return ["position"] * len(items)


class Unreadable(AsyncBatcher[int, str]):
    process_batch = _NoSignature()  # type: ignore[assignment]


@pytest.mark.parametrize(
    ("cls", "how"),
    [
        (ByName, "position"),
        (Unreadable, "position"),  # nothing tells it takes a keyword
        (Batch_, "keyword?"),  # named batch: by keyword (a positional call would work too)
        (KeywordOnly, "keyword"),
        (Star, "position"),
        (Kwargs, "keyword"),
        (NamedAndKwargs, "position"),
        (StarAndKwargs, "keyword"),
    ],
)
async def test_process_batch_gets_its_argument_by_keyword_only_where_it_takes_it_so(
    cls: type[AsyncBatcher[int, str]], how: str
) -> None:
    b = cls(max_queue_time=0)
    assert await b.process(1) == how
    await b.stop()


def test_a_loop_that_is_not_running_on_this_thread_never_gets_an_item_from_another() -> None:
    b = Recording(max_queue_time=0)
    first = asyncio.new_event_loop()
    try:
        assert first.run_until_complete(b.process_many([1, 3])) == [2, 6]  # bound to first, which now stands still
        with pytest.raises(RuntimeError, match="running on another event loop"):
            asyncio.run(b.process(2))  # another loop, same thread: refused, not queued where no one runs
        s = b.stats
        assert (s.submitted, s.queued, s.succeeded) == (2, 0, 2) and b.sent == [1, 3]  # as if it never came
        assert first.run_until_complete(b.process(4)) == 8  # its own loop serves it again
        first.run_until_complete(b.stop())
    finally:
        first.close()


# ---------------------------------------------------------------------- stops, statistics, validation, errors


WAIT = 10.0


class Echo(AsyncBatcher[int, int]):
    async def process_batch(self, batch: list[int]) -> list[int]:
        return batch


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
def test_bad_flags_executors_names_and_numbers_are_refused_naming_the_value(
    kwargs: dict[str, Any], error: type, named: str
) -> None:
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


# ---------------------------------------------------------------------- counts in the messages


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
    root = Path(__file__).resolve().parents[2] / "async_batcher"
    nouns = "items|results|rows|batches|elements|outputs|keys|calls|records|messages|callers"
    count = re.compile(rf"""(\{{[^{{}}"']+\}}|%d|%s) ({nouns})\b""")
    found = [
        f"{path.relative_to(root)}:{number}: {line.strip()}"
        for path in sorted(root.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if count.search(line) and not line.lstrip().startswith("#")
    ]
    assert not found, "\n".join(found)


async def test_running_is_a_plain_property_beside_0_2_2s_coroutine() -> None:
    # is_running() is a coroutine, as in 0.2.2: `if b.is_running():` tested a coroutine object, always true.
    gate = asyncio.Event()
    b = Recording(max_queue_time=0, gate=gate)
    assert b.running is False and await b.is_running() is False
    b.start()
    assert b.running is True and await b.is_running() is True
    call = asyncio.ensure_future(b.process(1))
    await asyncio.sleep(0)
    stopping = asyncio.ensure_future(b.stop())
    await asyncio.sleep(0)
    assert b.running is True  # draining: still running
    gate.set()
    await stopping
    assert await call == 2
    assert b.running is False and await b.is_running() is False
    coroutine = b.is_running()
    assert inspect.iscoroutine(coroutine)
    coroutine.close()


async def test_a_subclass_keeps_its_own_attribute_named_running() -> None:
    # A name 0.2.2's subclasses were free to use: theirs wins for their instances (not a property without setter).
    class Own(Recording):
        def __init__(self) -> None:
            super().__init__()
            self.running = "mine"  # type: ignore[assignment]

    b = Own()
    assert b.running == "mine" and await b.is_running() is False
    assert await b.process(1) == 2 and await b.is_running() is True
    await b.stop()
