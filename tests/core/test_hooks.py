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

from async_batcher import AsyncBatcher, BatcherStoppedError, ReentrantCallError
from tests.batchers import Recording
from tests.loops import VirtualClockLoop

pytestmark = pytest.mark.virtual_time

WAIT = 1000.0


def settled(b: AsyncBatcher[Any, Any]) -> bool:
    s = b.stats
    return s.submitted == s.succeeded + s.failed + s.cancelled + s.timed_out and s.queued == s.in_flight == 0


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
    assert b._run.fast_loop is None  # a call from on_start() must reach the long path, which refuses it
    async with asyncio.timeout(WAIT):
        assert await b.process(1) == 2
        assert b._run.fast_loop is asyncio.get_running_loop()
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
        f"{b.name}: stop(timeout=1.0) cut the drain off after {cut:.3g} s: 1 batches in flight, 0 items queued"
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
