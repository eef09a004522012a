"""Attacks on the fixes of issue 25, as a hostile user would make them, kept as tests.

Hooks that call back into their batcher or into other batchers (from their tasks, the tasks they start, batchers
started inside them), stops at every moment of a run's life (during ``on_start()``, during ``on_stop()``, from both
at once, with budgets of nothing), ``max_queue_size`` and ``max_batch_weight`` lowered and raised under callers
waiting for room, and streams whose consumers stall, resume, leave and come back while items join the batch and the
stall timeout changes under them. Each test states what holds; every wait is bounded on the loop's (virtual) clock,
so that a hang is a failure, and the statistics must add up after each.
"""

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
    ReentrantCallError,
)
from tests.batchers import Recording

pytestmark = pytest.mark.virtual_time

WAIT = 1000.0


def settled(b: AsyncBatcher[Any, Any]) -> bool:
    """Every submitted item ended once, and nothing waits or runs."""
    s = b.stats
    return s.submitted == s.succeeded + s.failed + s.cancelled + s.timed_out and s.queued == s.in_flight == 0


def outcome(result: object) -> object:
    """A result as the tests compare it: an exception by its type's name."""
    return type(result).__name__ if isinstance(result, BaseException) else result


# ---------------------------------------------------------------------- hooks that call back


class Tens(AsyncBatcher[int, int]):
    """Multiplies by ten; records its batches."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.batches: list[list[int]] = []

    async def process_batch(self, batch: list[int]) -> list[int]:
        self.batches.append(list(batch))
        return [x * 10 for x in batch]


async def test_on_start_may_await_another_batcher_which_starts_on_first_use() -> None:
    other = Tens(max_queue_time=0)

    class Warm(Recording):
        async def on_start(self) -> None:
            self.warm = await asyncio.gather(other.process(1), other.process(2))

    b = Warm(max_queue_time=0)
    async with asyncio.timeout(WAIT):
        assert await b.process(3) == 6
        await b.stop()
        await other.stop()
    assert b.warm == [10, 20] and other.batches == [[1, 2]]
    assert settled(b) and settled(other)


async def test_a_batch_calling_a_batcher_whose_on_start_runs_waits_for_it_and_is_served() -> None:
    loop = asyncio.get_running_loop()

    class Loading(Tens):
        async def on_start(self) -> None:
            await asyncio.sleep(3)

    model = Loading(max_queue_time=0)

    class Front(Recording):
        async def process_batch(self, batch: list[int]) -> Any:
            return await model.process_many(batch)

    front = Front(max_queue_time=0)
    model.start()
    async with asyncio.timeout(WAIT):
        assert await front.process(2) == 20
        assert loop.time() == 3.0  # it waited for model.on_start(), nothing more
        await front.stop()
        await model.stop()
    assert settled(front) and settled(model)


async def test_a_task_on_start_starts_is_refused_while_on_start_runs_and_served_after() -> None:
    """'Inside on_start()' is its task and the tasks it starts while it runs: a task it does not await is refused
    then (at once, not left hanging), and served once on_start() is over."""

    class Spawning(Recording):
        async def on_start(self) -> None:
            self.early = asyncio.ensure_future(self.process(1))
            self.late = asyncio.ensure_future(self.later())
            await asyncio.sleep(2)

        async def later(self) -> int:
            await asyncio.sleep(5)
            return await self.process(2)

    b = Spawning(max_queue_time=0)
    b.start()
    await asyncio.sleep(0)
    async with asyncio.timeout(WAIT):
        with pytest.raises(ReentrantCallError, match="on_start"):
            await b.early
        assert await b.late == 4
        assert await b.process(3) == 6
        await b.stop()
    assert b.batches == [[2], [3]] and settled(b) and b.stats.rejected == 1


async def test_a_task_of_an_earlier_run_s_on_start_is_not_inside_the_next_run_s_on_start() -> None:
    class Restarting(Recording):
        runs = 0

        async def on_start(self) -> None:
            self.runs += 1
            if self.runs == 1:
                self.worker = asyncio.ensure_future(self.work())
            else:
                await asyncio.sleep(3)

        async def work(self) -> int:
            await asyncio.sleep(10)  # by then the batcher was stopped and started again: run 2's on_start runs
            return await self.process(7)

    b = Restarting(max_queue_time=0)
    async with asyncio.timeout(WAIT):
        b.start()
        await asyncio.sleep(1)
        await b.stop()
        await asyncio.sleep(8)
        b.start()  # its on_start() runs from 9 to 12; the worker calls at 10 and waits for it
        assert await b.worker == 14
        assert asyncio.get_running_loop().time() == 12.0
        await b.stop()
    assert settled(b)


# ---------------------------------------------------------------------- stops at every moment


class Hooked(Recording):
    """An ``on_stop()`` that does what ``how`` says, and records what it saw."""

    def __init__(self, how: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.how = how
        self.seen: list[Any] = []

    async def on_stop(self) -> None:
        self.seen.append(("on_stop", asyncio.get_running_loop().time()))
        if self.how == "slow":
            await asyncio.sleep(100)
        elif self.how == "raises":
            raise RuntimeError("on_stop failed")
        elif self.how == "calls":  # every call into a stopping batcher is refused, none waits
            for call in (lambda: self.process(1), lambda: self.process_many([1]), lambda: anext(self.stream(1))):
                try:
                    await call()
                except BatcherStoppedError as error:
                    self.seen.append(type(error).__name__)
        elif self.how == "stops_from_a_task":
            try:
                await asyncio.ensure_future(self.stop())
            except ReentrantCallError as error:
                self.seen.append(type(error).__name__)


@pytest.mark.parametrize(
    ("how", "timeouts", "ends", "seen"),
    [
        # stop(timeout=10): the drain until 6 (half), on_stop() from 6 until 11, then cancelled.
        ("slow", [10.0], [11.0], [("on_stop", 6.0)]),
        # Two stops: the smaller budget cuts the drain at 3 and on_stop() at 5; the other returns with it.
        ("slow", [10.0, 4.0], [5.0, 5.0], [("on_stop", 3.0)]),
        ("slow", [None, 4.0], [5.0, 5.0], [("on_stop", 3.0)]),
        # Nothing: the drain and on_stop() are cut off at once, the stop returns at once.
        ("slow", [0.0], [1.0], [("on_stop", 1.0)]),
        ("slow", [1e-9, None], [1 + 1e-9, 1 + 1e-9], [("on_stop", 1.0)]),
        ("raises", [10.0, None], ["RuntimeError", "RuntimeError"], [("on_stop", 6.0)]),
        ("calls", [None], [100.0], [("on_stop", 100.0)] + ["BatcherStoppedError"] * 3),
        ("stops_from_a_task", [None], [100.0], [("on_stop", 100.0), "ReentrantCallError"]),
    ],
)
async def test_stops_with_any_budget_end_on_time_whatever_on_stop_does(
    how: str, timeouts: list[float | None], ends: list[Any], seen: list[Any]
) -> None:
    loop = asyncio.get_running_loop()
    b = Hooked(how, max_queue_time=0, delay=100)
    call = asyncio.ensure_future(b.process(1))
    await asyncio.sleep(1)  # its batch runs from 0 until 100
    stops = [asyncio.ensure_future(b.stop(timeout=t)) for t in timeouts]
    got = []
    async with asyncio.timeout(WAIT):
        for stop in stops:
            try:
                await stop
                got.append(loop.time())
            except RuntimeError as error:
                got.append(type(error).__name__)
        result = outcome((await asyncio.gather(call, return_exceptions=True))[0])
    assert got == ends and b.seen == seen
    assert result == (2 if timeouts == [None] else "BatcherStoppedError")  # drained, or cut off
    assert not await b.is_running() and settled(b)


async def test_a_stop_during_on_start_with_items_waiting_serves_them_once_it_is_over() -> None:
    loop = asyncio.get_running_loop()

    class Slow(Hooked):
        async def on_start(self) -> None:
            await asyncio.sleep(5)

    b = Slow(max_queue_time=0)
    b.start()
    call = asyncio.ensure_future(b.process(1))
    await asyncio.sleep(1)
    async with asyncio.timeout(WAIT):
        await b.stop()
        assert await call == 2 and loop.time() == 5.0
    assert b.seen == [("on_stop", 5.0)] and settled(b)


# ---------------------------------------------------------------------- room in the queue, changed live


class Sleepy(AsyncBatcher[int, int]):
    """Each batch takes 1 s; records its batches."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.batches: list[list[int]] = []

    async def process_batch(self, batch: list[int]) -> list[int]:
        self.batches.append(list(batch))
        await asyncio.sleep(1)
        return batch


@pytest.mark.parametrize(
    ("changes", "served"),
    [
        ([5], {"eight": "QueueFullException", "one": 99, "stream": [66], "three": 3}),
        ([8], {"eight": 8, "one": 99, "stream": [66], "three": 3}),
        ([1], {"eight": "QueueFullException", "one": 99, "stream": [66], "three": "QueueFullException"}),
        ([0], {"eight": 8, "one": 99, "stream": [66], "three": 3}),
        ([-1], {"eight": 8, "one": 99, "stream": [66], "three": 3}),
        # Refused as the limit was lowered: raising it again does not bring it back; the others are served.
        ([5, 100], {"eight": "QueueFullException", "one": 99, "stream": [66], "three": 3}),
        ([100, 5], {"eight": 8, "one": 99, "stream": [66], "three": 3}),
    ],
)
async def test_max_queue_size_changed_under_callers_waiting_for_room(
    changes: list[int], served: dict[str, Any]
) -> None:
    b = Sleepy(max_queue_size=10, wait_when_full=True, max_batch_size=10, max_queue_time=0)
    running = asyncio.ensure_future(b.process_many(range(10)))
    await asyncio.sleep(0.01)
    queued = asyncio.ensure_future(b.process_many(range(10, 20)))
    await asyncio.sleep(0.01)
    waiting = {
        "eight": asyncio.ensure_future(b.process_many(range(20, 28), return_exceptions=True)),
        "one": asyncio.ensure_future(b.process(99, timeout=50)),
        "stream": asyncio.ensure_future(_collect(b.stream(66))),
        "three": asyncio.ensure_future(b.process_many(range(30, 33))),
    }
    await asyncio.sleep(0.01)
    assert b._run.awaiting_room == 13
    for size in changes:
        b.max_queue_size = size
        await asyncio.sleep(0)
    async with asyncio.timeout(WAIT):
        got = await asyncio.gather(running, queued, *waiting.values(), return_exceptions=True)
        await b.stop()

    def shown(name: str, result: Any) -> Any:  # a process_many's results by their number
        return len(result) if isinstance(result, list) and name != "stream" else outcome(result)

    assert [shown("", r) for r in got[:2]] == [10, 10]
    assert {name: shown(name, r) for name, r in zip(waiting, got[2:], strict=True)} == served
    refused = [name for name, value in served.items() if value == "QueueFullException"]
    s = b.stats
    assert s.failed == sum({"eight": 8, "three": 3}[name] for name in refused) and settled(b)
    sent = [x for batch in b.batches for x in batch]
    assert len(sent) == len(set(sent)) == s.processed == 33 - s.failed  # each item sent once, the refused never


async def _collect(stream: AsyncIterator[Any]) -> list[Any]:
    return [part async for part in stream]


async def test_max_batch_weight_lowered_under_queued_items_sends_each_too_heavy_one_alone() -> None:
    class Weighed(Sleepy):
        def item_weight(self, item: int) -> float:
            return item % 4 + 1

    b = Weighed(max_queue_size=4, wait_when_full=True, max_batch_size=4, max_queue_time=0, max_batch_weight=10)
    calls = [asyncio.ensure_future(b.process(x)) for x in range(12)]  # 1 batch in flight, 4 queued, 7 waiting
    await asyncio.sleep(0.5)
    b.max_batch_weight = 2
    async with asyncio.timeout(WAIT):
        assert await asyncio.gather(*calls) == list(range(12))
        await b.stop()
    assert all(len(batch) == 1 or sum(x % 4 + 1 for x in batch) <= 2 for batch in b.batches[1:])
    assert settled(b) and b.stats.processed == 12


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


# ---------------------------------------------------------------------- defects the attacks found


async def test_a_batcher_started_inside_another_s_on_start_may_call_it_from_its_batches() -> None:
    """A batcher started (``start()``, ``async with``) inside another's ``on_start()`` runs in a copy of that
    context: its batches, which serve their own callers, are not inside that ``on_start()``. A call from them
    waits for it, as any outside call does, instead of being refused."""
    loop = asyncio.get_running_loop()

    class Front(AsyncBatcher[int, int]):
        model: AsyncBatcher[int, int]

        async def process_batch(self, batch: list[int]) -> list[int]:
            return await self.model.process_many(batch)

    front = Front(max_queue_time=0)

    class Model(Tens):
        async def on_start(self) -> None:
            front.start()  # it serves the model's callers: started with it
            await asyncio.sleep(5)  # loading

    model = Model(max_queue_time=0)
    front.model = model
    model.start()
    await asyncio.sleep(1)
    async with asyncio.timeout(WAIT):
        assert await front.process(2) == 20  # waited for model.on_start()
        assert loop.time() == 5.0
        await front.stop()
        await model.stop()
    assert settled(front) and settled(model) and front.stats.failed == 0


async def test_a_stop_during_on_start_lets_it_end_before_on_stop_runs_and_returns_after_both() -> None:
    """A stop that cancels a running ``on_start()`` waits for it to end (its own cleanup included) before
    ``on_stop()`` closes what it opened; no part of it runs on after ``stop()`` returned."""
    loop = asyncio.get_running_loop()

    class Opening(Hooked):
        async def on_start(self) -> None:
            self.seen.append("opening")
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                await asyncio.sleep(1)  # closes what it had half opened
                self.seen.append(("on_start ended", loop.time()))
                raise

    for kwargs in ({}, {"force": True}, {"timeout": 10.0}):
        b = Opening(max_queue_time=0)
        b.start()
        await asyncio.sleep(1)
        began = loop.time()
        async with asyncio.timeout(WAIT):
            await b.stop(**kwargs)
        assert b.seen == ["opening", ("on_start ended", began + 1), ("on_stop", began + 1)], kwargs
        assert b._run.startup is not None and b._run.startup.done()
        assert loop.time() == began + 1 and settled(b)


async def test_a_stop_with_a_timeout_is_not_held_by_an_on_start_that_ignores_its_cancellation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = asyncio.get_running_loop()

    class Stubborn(Hooked):
        async def on_start(self) -> None:
            try:
                await asyncio.sleep(100)
            except asyncio.CancelledError:
                await asyncio.sleep(100)  # it ignores its cancellation for a while

    b = Stubborn(max_queue_time=0)
    b.start()
    await asyncio.sleep(1)
    async with asyncio.timeout(WAIT):
        with caplog.at_level(logging.WARNING, logger="async_batcher"):
            await b.stop(timeout=4)
        assert loop.time() == 5.0 and b.seen == [] and not await b.is_running()
        assert any("on_stop() did not finish within the 4 s left" in m for m in caplog.messages)
        startup = b._run.startup
        assert startup is not None and not startup.done()
        startup.cancel()  # (the test's own cleanup)
        await asyncio.wait([startup])


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


def _plain_wrapper(hook: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:  # (no functools.wraps: nothing tells it wraps an async def)
        return hook(*args, **kwargs)

    return wrapper


async def test_an_async_batch_key_hidden_behind_a_plain_wrapper_is_refused_naming_it() -> None:
    """Where the class-definition check cannot see the ``async def`` (a decorator without ``functools.wraps``), the
    key it returns is a coroutine: hashable, so every item would get a batch of its own, silently. Refused."""

    class Keyed(Tens):
        @_plain_wrapper
        async def batch_key(self, item: int) -> int:
            return item % 2

    b = Keyed(max_queue_time=0.1)
    async with asyncio.timeout(WAIT):
        results = await asyncio.gather(*(b.process(x) for x in range(4)), return_exceptions=True)
        await b.stop()
    assert [outcome(r) for r in results] == ["TypeError"] * 4
    assert "Keyed.batch_key() returned <coroutine object" in str(results[0]) and b.batches == []
    assert settled(b) and b.stats.submitted == 0


@pytest.mark.parametrize("setting", ["stream_stall_timeout", "max_queue_time", "max_hold_time", "default_timeout"])
def test_a_number_of_seconds_too_large_for_a_float_is_refused_naming_it(setting: str) -> None:
    b = Parts()
    with pytest.raises(ValueError, match=f"{setting} must be a finite number of seconds >= 0, got 1000000"):
        setattr(b, setting, 10**400)


async def test_a_weight_too_large_for_a_float_is_refused_naming_it() -> None:
    class Heavy(Tens):
        def item_weight(self, item: int) -> float:
            return 10**400

    with pytest.raises(ValueError, match="max_batch_weight must be None or a finite number > 0, got 1000000"):
        Heavy(max_batch_weight=10**400)
    b = Heavy(max_queue_time=0)
    async with asyncio.timeout(WAIT):
        with pytest.raises(ValueError, match=r"item_weight\(\) must return a finite number >= 0, got 1000000"):
            await b.process(1)
        await b.stop()
    assert settled(b) and b.stats.submitted == 0


@pytest.mark.xfail(
    strict=True,
    reason=(
        "a blocking call (process_sync) from a thread on_start() runs through loop.run_in_executor, which does not "
        "copy the context: nothing marks it as inside on_start(), so it waits for on_start(), which waits for it: "
        "a hang (bounded here by the call's own timeout), not ReentrantCallError"
    ),
)
async def test_a_blocking_warm_up_in_an_executor_thread_is_refused_at_once() -> None:
    class SyncWarmUp(Recording):
        async def on_start(self) -> None:
            loop = asyncio.get_running_loop()
            # The thread blocks on the loop's future for real (the virtual clock stands still meanwhile): its own
            # timeout bounds it.
            await loop.run_in_executor(None, lambda: self.process_sync(0, timeout=0.5))

    b = SyncWarmUp(max_queue_time=0)
    try:
        async with asyncio.timeout(WAIT):
            with pytest.raises(ReentrantCallError):
                await b.process(1)
    finally:
        await b.stop()
