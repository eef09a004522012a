"""Contract 6, timeouts: every ``timeout=`` of a run shares one loop timer; each still fires at its own time."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from functools import partial
from typing import Any

import pytest

from async_batcher import AsyncBatcher
from async_batcher._core.deadlines import Deadlines
from tests.batchers import Recording
from tests.loops import VirtualClockLoop

pytestmark = pytest.mark.virtual_time


class Stuck(AsyncBatcher[int, int]):
    """Answers its items themselves at once, but a batch with a 1 in it never ends (until a forced stop)."""

    async def process_batch(self, batch: list[int]) -> list[int]:
        if 1 in batch:
            await asyncio.Event().wait()
        return batch


def _is_timeout(call: asyncio.Future[Any]) -> bool:
    return not call.cancelled() and isinstance(call.exception(), TimeoutError)


async def _timeouts(calls: Sequence[asyncio.Future[Any]]) -> list[float]:
    """When each call failed with TimeoutError, by the loop's clock (-1: it ended otherwise)."""
    loop = asyncio.get_running_loop()
    times: list[float] = [0.0] * len(calls)

    def ended(i: int, call: asyncio.Future[Any]) -> None:
        times[i] = loop.time() if _is_timeout(call) else -1.0

    for i, call in enumerate(calls):
        call.add_done_callback(partial(ended, i))
    await asyncio.gather(*calls, return_exceptions=True)
    return times


async def test_timeouts_of_different_lengths_each_expire_at_their_own_time() -> None:
    # The second call's deadline comes before the first's: the one timer must be brought forward for it.
    b = Recording(max_batch_size=100, max_queue_time=100)
    calls = [asyncio.ensure_future(b.process(i, timeout=t)) for i, t in enumerate((5.0, 1.0, 3.0, 1.0))]
    order: list[int] = []
    for i, call in enumerate(calls):
        call.add_done_callback(lambda _, i=i: order.append(i))  # type: ignore[misc]
    assert await _timeouts(calls) == [5.0, 1.0, 3.0, 1.0]
    assert order == [1, 3, 2, 0]  # equal deadlines fire in the order of their calls
    assert b.sent == []
    assert b.stats.timed_out == 4 and b.stats.queued == 0
    await b.stop()


async def test_calls_that_end_before_their_timeout_leave_no_wake_up_behind() -> None:
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualClockLoop)
    b = Recording(max_queue_time=0, default_timeout=50.0)
    assert await asyncio.gather(*(b.process(i) for i in range(100))) == [2 * i for i in range(100)]
    jumps = loop.jumps
    await asyncio.sleep(100)  # nothing of the batcher's is left to wake the loop before this sleep ends
    assert loop.jumps == jumps + 1
    assert loop.time() == 100
    await b.stop()


async def test_many_calls_ending_early_keep_the_later_timeouts_on_time() -> None:
    # Hundreds of calls end long before their timeout while one call's timeout is still to come: the deadlines that
    # ended are dropped (all at once, being the majority) without losing the one that has not.
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualClockLoop)
    b = Stuck(max_queue_time=0, concurrency=None)
    late = asyncio.ensure_future(b.process(1, timeout=5.0))
    await asyncio.sleep(1)
    for _ in range(3):
        assert await asyncio.gather(*(b.process(0, timeout=10.0) for _ in range(100))) == [0] * 100
    assert await _timeouts([late]) == [5.0]
    assert b.stats.timed_out == 1 and b.stats.succeeded == 300
    jumps = loop.jumps
    await asyncio.sleep(100)
    assert loop.jumps == jumps + 1  # the late call has ended too: no deadline is left
    await b.stop(force=True)


async def test_a_timeout_of_each_kind_shares_the_timer_with_the_others() -> None:
    # A single call, a bulk call and a caller waiting for room, each with its own timeout, on one batcher.
    gate = asyncio.Event()
    b = Recording(max_queue_size=3, max_queue_time=100, max_batch_size=10, wait_when_full=True, gate=gate)
    single = asyncio.ensure_future(b.process(1, timeout=2.0))
    bulk = asyncio.ensure_future(b.process_many([2, 3], timeout=4.0))
    waiting = asyncio.ensure_future(b.process(4, timeout=3.0))  # the queue holds 3 items: it waits for room
    assert await _timeouts([single, waiting, bulk]) == [2.0, 3.0, 4.0]
    assert b.sent == [] and b.stats.timed_out == 4
    gate.set()
    await b.stop()


def test_a_failing_timeout_callback_is_reported_and_the_later_deadlines_still_fire() -> None:
    loop = VirtualClockLoop()
    reported: list[tuple[str, BaseException]] = []
    loop.set_exception_handler(lambda _, context: reported.append((context["message"], context["exception"])))
    fired: list[tuple[str, float]] = []

    def fail() -> None:
        raise RuntimeError("a bug")

    async def main() -> None:
        deadlines = Deadlines(loop)
        deadlines.add(1.0, fail)
        deadlines.add(1.0, lambda: fired.append(("same time", loop.time())))
        deadlines.add(2.0, lambda: fired.append(("later", loop.time())))
        await asyncio.sleep(3)
        assert deadlines.heap == [] and deadlines.timer is None

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    assert fired == [("same time", 1.0), ("later", 2.0)]
    assert [(message, repr(exc)) for message, exc in reported] == [
        ("async_batcher: error in a timeout callback", "RuntimeError('a bug')")
    ]
