"""The dispatcher's timer on every loop, real time included (uvloop's clock is cached per loop iteration)."""

from __future__ import annotations

import asyncio
import time

from tests.batchers import Recording


async def test_a_deadline_already_past_when_the_timer_is_armed_still_fires() -> None:
    # The loop is held up between an item's arrival and its dispatch, so that its deadline has passed (by the
    # clock; uvloop's clock is cached per iteration and can lag) when the dispatcher arms its timer. uvloop's call_at
    # returns a plain Handle for a time already past: the dispatcher must cope.
    b = Recording(max_batch_size=100, max_queue_time=0.001)
    for i in range(20):
        call = asyncio.ensure_future(b.process(i))
        await asyncio.sleep(0)  # the item is queued, a timer armed for its deadline
        time.sleep(0.002)  # noqa: ASYNC251 - the loop is blocked on purpose, past that deadline
        assert await asyncio.wait_for(call, 5) == 2 * i
    assert b.stats.batches == 20
    await b.stop()


async def test_items_waiting_for_their_deadline_go_in_real_time_too() -> None:
    b = Recording(max_batch_size=1000, max_queue_time=0.002)
    for _ in range(20):
        assert await asyncio.wait_for(asyncio.gather(*(b.process(i) for i in range(5))), 5) == [0, 2, 4, 6, 8]
    assert b.stats.batches == 20
    await b.stop()


async def test_timeouts_expire_on_every_loop_among_calls_that_end_in_time() -> None:
    # The calls' timeouts share one timer: those of items that cannot be sent (the batch is never full and its wait
    # is long) expire, the answered calls keep their results, and nothing is left waiting.
    waiting = Recording(max_batch_size=1000, max_queue_time=60)
    answering = Recording(max_queue_time=0)
    doomed = [asyncio.ensure_future(waiting.process(i, timeout=0.001 * (i % 5))) for i in range(50)]
    answered = [asyncio.ensure_future(answering.process(i, timeout=5.0)) for i in range(50)]
    outcomes = await asyncio.wait_for(asyncio.gather(*doomed, *answered, return_exceptions=True), 5)
    assert all(isinstance(outcome, TimeoutError) for outcome in outcomes[:50])
    assert outcomes[50:] == [2 * i for i in range(50)]
    assert waiting.sent == [] and waiting.stats.timed_out == 50 and waiting.stats.queued == 0
    await waiting.stop()
    await answering.stop()
