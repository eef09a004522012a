"""The hooks: of the right kind or refused, calls back into the batcher that would wait for themselves refused at
once, and the share of ``stop(timeout=...)`` that ``on_stop()`` gets.

Every wait is bounded on the loop's (virtual) clock: a batcher that hangs fails the test.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import pytest

from async_batcher import (
    AsyncBatcher,
    BatcherStoppedError,
    ReentrantCallError,
)
from tests.batchers import Recording, Tens, outcome, settled
from tests.core.test_short_paths import calls
from tests.loops import VirtualClockLoop

pytestmark = pytest.mark.virtual_time

WAIT = 1000.0


# ---------------------------------------------------------------------- calls from inside on_start() and on_stop()


class WarmingUp(Recording):
    """An ``on_start()`` that calls back into the batcher, as ``how`` says."""

    def __init__(self, how: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.how = how
        self.warm: Any = None

    async def on_start(self) -> None:
        if self.how == "process":
            await self.process(0)
        elif self.how == "process_many":
            await self.process_many([0, 1])
        elif self.how == "stream":
            await anext(self.stream(0))
        elif self.how == "gather":  # from tasks it starts, which it waits for
            await asyncio.gather(self.process(0), self.process(1))
        elif self.how == "stop":
            await self.stop()
        elif self.how == "process_batch":  # the warm-up that works: the model itself, on a batch of its choice
            self.warm = await self.process_batch([0, 1])


@pytest.mark.parametrize("how", ["process", "process_many", "stream", "gather", "stop"])
async def test_a_call_from_inside_on_start_that_would_wait_for_it_is_refused_at_once(how: str) -> None:
    b = WarmingUp(how, max_queue_time=0)
    async with asyncio.timeout(WAIT):
        with pytest.raises(ReentrantCallError, match="on_start"):
            await b.process(1)  # its batch waited for on_start(), which failed with the refusal
        await b.stop()
    assert b.batches == [] and settled(b)
    assert b.stats.rejected == {"process_many": 2, "gather": 2, "stop": 0}.get(how, 1)


async def test_on_start_warms_up_with_process_batch_and_the_first_call_is_served() -> None:
    b = WarmingUp("process_batch", max_queue_time=0)
    async with asyncio.timeout(WAIT):
        assert await b.process(1) == 2
        await b.stop()
    assert b.warm == [0, 2] and b.batches == [[0, 1], [1]]


async def test_a_task_on_start_leaves_behind_is_served_once_on_start_is_over() -> None:
    class Background(Recording):
        async def on_start(self) -> None:
            self.later = asyncio.ensure_future(self.after_start())

        async def after_start(self) -> int:
            await asyncio.sleep(1)  # on_start() is over by then
            return await self.process(5)

    b = Background(max_queue_time=0)
    b.start()
    await asyncio.sleep(0)  # on_start() runs
    async with asyncio.timeout(WAIT):
        assert await b.later == 10
        await b.stop()


async def test_the_short_path_opens_once_on_start_is_over() -> None:
    class Slow(Recording):
        async def on_start(self) -> None:
            await asyncio.sleep(1)

    b = Slow(max_queue_time=0)
    b.start()
    with calls() as counted:  # a call from on_start() must reach the long path, which refuses it
        assert await b.process(1) == 2
    assert counted["Admission.submit"] >= 1
    async with asyncio.timeout(WAIT):
        with calls() as counted:
            assert await b.process(1) == 2
        assert (counted["Engine.put"], counted["Admission.submit"]) == (1, 0)
        await b.stop()


async def test_stop_from_inside_on_stop_is_refused_at_once_and_the_batcher_stops() -> None:
    class Stopping(Recording):
        async def on_stop(self) -> None:
            await self.stop()

    b = Stopping(max_queue_time=0)
    async with asyncio.timeout(WAIT):
        assert await b.process(1) == 2
        with pytest.raises(ReentrantCallError, match="on_stop"):
            await b.stop()
    assert not await b.is_running()
    with pytest.raises(BatcherStoppedError):
        await b.process(2)


# ---------------------------------------------------------------------- hooks of the wrong kind


async def _none(self: Any) -> None:
    pass


@pytest.mark.parametrize("hook", ["on_start", "on_stop"])
def test_a_plain_def_on_start_or_on_stop_is_refused_as_the_class_is_defined(hook: str) -> None:
    def plain(self: Any) -> None:
        pass

    async def generator(self: Any) -> AsyncIterator[None]:
        yield None

    with pytest.raises(TypeError, match=rf"Bad\.{hook} must be an async def.*got a plain def"):
        type("Bad", (Recording,), {hook: plain})
    with pytest.raises(TypeError, match=rf"Bad\.{hook} must be an async def.*got an async generator function"):
        type("Bad", (Recording,), {hook: generator})
    with pytest.raises(TypeError, match=rf"Bad\.{hook} must be a method, got None"):
        type("Bad", (Recording,), {hook: None})


@pytest.mark.parametrize("hook", ["batch_key", "item_weight", "abandoned_error"])
def test_an_async_def_batch_key_item_weight_or_abandoned_error_is_refused_as_the_class_is_defined(hook: str) -> None:
    async def awaited(self: Any, *args: Any) -> Any:
        pass

    with pytest.raises(TypeError, match=rf"Bad\.{hook} must be a plain def.*got an async def"):
        type("Bad", (Recording,), {hook: awaited})


def test_a_hook_wrapped_by_a_decorator_is_judged_by_what_it_wraps() -> None:
    def traced(hook: Callable[[Any], Coroutine[Any, Any, None]]) -> Callable[[Any], Coroutine[Any, Any, None]]:
        @functools.wraps(hook)
        def wrapper(self: Any) -> Coroutine[Any, Any, None]:  # a plain def returning the coroutine
            return hook(self)

        return wrapper

    class Traced(Recording):
        on_start = traced(_none)

    assert "on_start" in Traced._overridden


class Returns:
    """A hook that is no function (so not checked at class definition) and returns ``value``."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __call__(self) -> Any:
        return self.value


async def test_an_on_start_that_returns_no_awaitable_is_refused_at_start_naming_it_and_the_batcher_stays_stopped() -> (
    None
):
    class Odd(Recording):
        on_start = Returns(None)

    b = Odd(max_queue_time=0)
    with pytest.raises(TypeError, match=r"Odd\.on_start\(\) returned None; it must be an async def"):
        b.start()
    assert not await b.is_running()
    with pytest.raises(TypeError, match="on_start"):
        await b.process(1)
    assert not await b.is_running()
    await b.stop()  # nothing to stop


async def test_an_on_stop_that_returns_no_awaitable_fails_the_stop_naming_it_and_the_batcher_stops() -> None:
    class Odd(Recording):
        on_stop = Returns(3)

    b = Odd(max_queue_time=0)
    async with asyncio.timeout(WAIT):
        assert await b.process(1) == 2
        with pytest.raises(TypeError, match=r"Odd\.on_stop\(\) returned 3; it must be an async def"):
            await b.stop()
    assert not await b.is_running()
    await b.stop()


# ---------------------------------------------------------------------- what stop(timeout=...) spends, and on what


class Closing(Recording):
    """An ``on_stop()`` that takes 0.3 s."""

    closed = False

    async def on_stop(self) -> None:
        await asyncio.sleep(0.3)
        self.closed = True


@pytest.mark.parametrize("cls", [Recording, Closing], ids=["no_on_stop", "on_stop"])
async def test_stop_timeout_gives_an_on_stop_of_its_own_half_and_blames_only_what_used_it(
    cls: type[Recording], caplog: pytest.LogCaptureFixture
) -> None:
    loop = asyncio.get_running_loop()
    b = cls(max_queue_time=0, gate=asyncio.Event())  # its batches never end on their own
    caller = asyncio.ensure_future(b.process(1))
    await asyncio.sleep(0)
    async with asyncio.timeout(WAIT):
        with caplog.at_level(logging.WARNING, logger="async_batcher"):
            await b.stop(timeout=1.0)
        with pytest.raises(BatcherStoppedError):
            await caller
    if cls is Closing:
        # The drain had half the second; on_stop() the rest, of which it took 0.3 s, and it finished.
        assert loop.time() == pytest.approx(0.8) and b.closed
        cut = 0.5
    else:
        assert loop.time() == pytest.approx(1.0)  # the drain had all of it
        cut = 1.0
    assert caplog.messages == [
        f"{b.name}: stop(timeout=1.0) cut the drain off after {cut:.3g} s: 1 batch in flight, 0 items queued"
    ]
    assert settled(b)


# ---------------------------------------------------------------------- what the log says of a batch cut off


class Endless(AsyncBatcher[int, int]):
    async def process_batch(self, batch: list[int]) -> AsyncIterator[list[Any]]:
        while True:
            await asyncio.sleep(1)
            yield list(batch)


@pytest.mark.parametrize("kind", ["plain", "stream"])
@pytest.mark.parametrize("how", ["force", "loop_shutdown"])
def test_a_batch_cut_off_is_never_logged_as_raised_by_process_batch(
    kind: str, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    b: AsyncBatcher[int, Any] = Recording(max_queue_time=0, gate=asyncio.Event()) if kind == "plain" else Endless()

    async def consume() -> Any:
        if kind == "plain":
            return await b.process(1)
        return [part async for part in b.stream(1)]

    async def main() -> None:
        caller = asyncio.ensure_future(consume())
        await asyncio.sleep(1.5)
        if how == "force":
            await b.stop(force=True)
            with pytest.raises(BatcherStoppedError):
                await caller
        # else: the loop shuts down with the batch in flight (asyncio.run cancels what is left)

    with caplog.at_level(logging.WARNING, logger="async_batcher"), asyncio.Runner(loop_factory=VirtualClockLoop) as r:
        r.run(main())
    assert not [m for m in caplog.messages if "process_batch raised" in m], caplog.messages
    if how == "loop_shutdown":
        assert [m for m in caplog.messages if "was cut off, its task cancelled" in m], caplog.messages


# ---------------------------------------------------------------------- hooks that call back, and stops at every moment


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


class Hooked(Recording):
    """An ``on_stop()`` that does what ``how`` says, and records what it saw."""

    def __init__(self, how: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.how = how
        self.seen: list[Any] = []
        self.startup: asyncio.Task[Any] | None = None  # on_start()'s task, where a test's on_start() keeps it

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
            self.startup = asyncio.current_task()
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
        assert b.startup is not None and b.startup.done()
        assert loop.time() == began + 1 and settled(b)


async def test_a_stop_with_a_timeout_is_not_held_by_an_on_start_that_ignores_its_cancellation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = asyncio.get_running_loop()

    class Stubborn(Hooked):
        async def on_start(self) -> None:
            self.startup = asyncio.current_task()
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
        startup = b.startup
        assert startup is not None and not startup.done()
        startup.cancel()  # (the test's own cleanup)
        await asyncio.wait([startup])


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


# ---------------------------------------------------------------------- an on_stop() that hangs


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
