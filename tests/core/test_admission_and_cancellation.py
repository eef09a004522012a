"""Contract 5 (admission) and 6 (cancellation and timeouts)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from async_batcher import (
    BatcherStoppedError,
    QueueFullException,
)
from async_batcher.exceptions import AsyncBatchException
from tests.batchers import Recording, Sleepy, outcome, settled, until

pytestmark = pytest.mark.virtual_time


async def fill(b: Recording, gate: asyncio.Event, queued: int) -> tuple[asyncio.Future[int], list[asyncio.Future[int]]]:
    """One batch held in flight, then ``queued`` items waiting behind it."""
    first = asyncio.ensure_future(b.process(-1))
    await until(lambda: b.batches)
    waiting = [asyncio.ensure_future(b.process(i)) for i in range(queued)]
    await until(lambda: b.stats.queued == queued)
    return first, waiting


async def test_a_full_queue_refuses_at_once() -> None:
    gate = asyncio.Event()
    b = Recording(max_queue_size=3, max_queue_time=0, gate=gate)
    first, waiting = await fill(b, gate, 3)
    with pytest.raises(QueueFullException) as info:
        await b.process(99)
    assert isinstance(info.value, AsyncBatchException)
    assert "max_queue_size=3" in str(info.value)
    assert b.stats.rejected == 1
    with pytest.raises(QueueFullException):
        await b.process_many([100, 101])
    assert b.stats.rejected == 3  # refusals add up, an item each
    gate.set()
    assert await first == -2 and await asyncio.gather(*waiting) == [0, 2, 4]
    assert 99 not in b.sent
    await b.stop()


async def test_in_flight_items_do_not_count_against_the_queue_size() -> None:
    # async-batcher 0.2.2's scenario: 10 in flight, 15 may wait, the next 5 are refused.
    b = Recording(max_batch_size=10, max_queue_time=0.2, max_queue_size=15, delay=1.0)

    async def at(delay: float, items: range) -> list[object]:
        await asyncio.sleep(delay)
        return await asyncio.gather(*(b.process(i) for i in items), return_exceptions=True)

    r1, r2, r3 = await asyncio.gather(at(0, range(10)), at(0.25, range(10, 20)), at(0.4, range(20, 30)))
    assert r1 == [i * 2 for i in range(10)] and r2 == [i * 2 for i in range(10, 20)]
    assert r3[:5] == [i * 2 for i in range(20, 25)]
    assert all(isinstance(e, QueueFullException) for e in r3[5:])
    assert len(b.batches) == 3
    await b.stop()


async def test_process_many_is_admitted_whole_or_not_at_all() -> None:
    gate = asyncio.Event()
    b = Recording(max_queue_size=4, max_queue_time=0, gate=gate)
    first, waiting = await fill(b, gate, 2)
    with pytest.raises(QueueFullException):
        await b.process_many(range(3))
    with pytest.raises(QueueFullException, match="never fit"):
        await b.process_many(range(5))
    assert b.stats.queued == 2
    gate.set()
    await asyncio.gather(first, *waiting)
    await b.stop()


async def test_wait_when_full_waits_for_room_first_come_first_served() -> None:
    gate = asyncio.Event()
    b = Recording(max_queue_size=2, max_queue_time=0, max_batch_size=1, gate=gate, wait_when_full=True)
    first, waiting = await fill(b, gate, 2)
    late = [asyncio.ensure_future(b.process(i)) for i in (10, 11, 12)]
    await asyncio.sleep(1)
    assert not any(t.done() for t in late)
    assert b.stats.queued == 2
    gate.set()
    assert await asyncio.gather(*late) == [20, 22, 24]
    assert await asyncio.gather(first, *waiting) == [-2, 0, 2]
    assert b.sent == [-1, 0, 1, 10, 11, 12]
    await b.stop()


async def test_room_promised_to_a_waiting_caller_is_not_taken_by_a_newcomer() -> None:
    # The newcomer arrives in the step in which room appears: that room is promised to the caller already
    # waiting for it, so the newcomer waits behind (on process()'s short path too, which a plain item takes).
    gate = asyncio.Event()
    b = Recording(max_queue_size=1, max_queue_time=0, max_batch_size=1, gate=gate, wait_when_full=True)
    first, waiting = await fill(b, gate, 1)
    early = asyncio.ensure_future(b.process(10))
    await asyncio.sleep(0)
    gate.set()
    late = asyncio.ensure_future(b.process(11))
    assert await asyncio.gather(first, *waiting, early, late) == [-2, 0, 20, 22]
    assert b.sent == [-1, 0, 10, 11]
    await b.stop()


async def test_a_newcomer_waits_behind_a_bulk_call_that_waits_for_room() -> None:
    # Room for one, but the head of the line needs three: the newcomer does not jump the line.
    gate = asyncio.Event()
    b = Recording(max_queue_size=3, max_queue_time=0, max_batch_size=1, gate=gate, wait_when_full=True)
    first, waiting = await fill(b, gate, 3)
    bulk = asyncio.ensure_future(b.process_many([10, 11, 12]))
    await asyncio.sleep(0)
    gate.set()
    await until(lambda: b.stats.queued == 2)  # one left the queue: room for one item
    late = asyncio.ensure_future(b.process(50))
    assert await asyncio.gather(first, *waiting) == [-2, 0, 2, 4]
    assert await bulk == [20, 22, 24] and await late == 100
    assert b.sent[-4:] == [10, 11, 12, 50]
    await b.stop()


async def test_a_cancelled_waiter_for_room_passes_its_turn_on() -> None:
    gate = asyncio.Event()
    b = Recording(max_queue_size=1, max_queue_time=0, max_batch_size=1, gate=gate, wait_when_full=True)
    first, waiting = await fill(b, gate, 1)
    a = asyncio.ensure_future(b.process(10))
    c = asyncio.ensure_future(b.process(11))
    await asyncio.sleep(0)
    a.cancel()
    gate.set()
    assert await c == 22
    assert await asyncio.gather(first, *waiting) == [-2, 0]
    assert 10 not in b.sent
    assert b.stats.cancelled == 1
    await b.stop()


async def test_a_timeout_covers_the_wait_for_room() -> None:
    loop = asyncio.get_running_loop()
    gate = asyncio.Event()
    b = Recording(max_queue_size=1, max_queue_time=0, gate=gate, wait_when_full=True)
    first, waiting = await fill(b, gate, 1)
    with pytest.raises(TimeoutError):
        await b.process(10, timeout=2.5)
    assert loop.time() == 2.5
    assert b.stats.timed_out == 1
    gate.set()
    await asyncio.gather(first, *waiting)
    assert 10 not in b.sent
    await b.stop()


async def test_a_caller_cancelled_before_its_item_is_sent_withdraws_it() -> None:
    b = Recording(max_batch_size=10, max_queue_time=1.0)
    calls = [asyncio.ensure_future(b.process(i)) for i in range(5)]
    await asyncio.sleep(0.5)
    calls[2].cancel()
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(results[2], asyncio.CancelledError)
    assert results[:2] + results[3:] == [0, 2, 6, 8]
    assert b.sent == [0, 1, 3, 4]
    assert b.stats.cancelled == 1 and b.stats.queued == 0
    await b.stop()


async def test_a_caller_cancelled_after_its_item_is_sent_loses_only_its_own_result() -> None:
    gate = asyncio.Event()
    b = Recording(max_queue_time=0, gate=gate)
    calls = [asyncio.ensure_future(b.process(i)) for i in range(3)]
    await until(lambda: b.batches)
    calls[1].cancel()
    gate.set()
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert results[0] == 0 and results[2] == 4
    assert isinstance(results[1], asyncio.CancelledError)
    assert b.sent == [0, 1, 2]
    await b.stop()


async def test_a_timeout_before_sending_withdraws_the_item() -> None:
    loop = asyncio.get_running_loop()
    b = Recording(max_batch_size=10, max_queue_time=5.0)
    with pytest.raises(TimeoutError):
        await b.process(1, timeout=2.0)
    assert loop.time() == 2.0
    assert await b.process(2) == 4
    assert b.sent == [2]
    assert b.stats.timed_out == 1
    await b.stop()


async def test_a_timeout_after_sending_drops_the_result_and_spares_the_others() -> None:
    loop = asyncio.get_running_loop()
    b = Recording(max_queue_time=0, delay=10.0)
    slow = asyncio.ensure_future(b.process(1, timeout=3.0))
    other = asyncio.ensure_future(b.process(2))
    with pytest.raises(TimeoutError):
        await slow
    assert loop.time() == 3.0
    assert await other == 4
    assert b.sent == [1, 2]
    await b.stop()


async def test_process_many_cancelled_withdraws_its_unsent_items() -> None:
    gate = asyncio.Event()
    b = Recording(max_batch_size=3, max_queue_time=0, gate=gate)
    call = asyncio.ensure_future(b.process_many(range(9)))
    await until(lambda: b.batches)
    call.cancel()
    gate.set()
    with pytest.raises(asyncio.CancelledError):
        await call
    await asyncio.sleep(1)
    assert b.sent == [0, 1, 2]
    assert b.stats.queued == 0
    await b.stop()


async def test_process_many_times_out_as_a_whole() -> None:
    b = Recording(max_batch_size=2, max_queue_time=0, delay=1.0)
    with pytest.raises(TimeoutError):
        await b.process_many(range(10), timeout=2.5)
    await asyncio.sleep(10)
    assert b.sent == [0, 1, 2, 3, 4, 5]
    await b.stop()


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "1", True])
async def test_a_bad_timeout_is_refused_naming_it(bad: object) -> None:
    b = Recording()
    with pytest.raises(ValueError, match="timeout"):
        await b.process(1, timeout=bad)  # type: ignore[arg-type]
    await b.stop()


def counted(b: Recording) -> bool:
    """Every submitted item counted once, as succeeded, failed, cancelled or timed out."""
    s = b.stats
    return s.submitted == s.succeeded + s.failed + s.cancelled + s.timed_out


async def test_callers_in_line_for_room_are_counted_submitted_and_each_outcome_once() -> None:
    gate = asyncio.Event()
    b = Recording(max_queue_size=1, max_queue_time=0, max_batch_size=1, gate=gate, wait_when_full=True)
    first, waiting = await fill(b, gate, 1)
    in_line = [asyncio.ensure_future(b.process(i, timeout=t)) for i, t in ((10, None), (11, 5.0), (12, None))]
    await asyncio.sleep(0)
    assert b.stats.submitted == 5 and b.stats.queued == 1  # three in line for room count as submitted
    in_line[2].cancel()
    with pytest.raises(TimeoutError, match="no room in the queue"):
        await in_line[1]
    gate.set()
    assert await in_line[0] == 20 and await asyncio.gather(first, *waiting) == [-2, 0]
    s = b.stats
    assert (s.submitted, s.succeeded, s.cancelled, s.timed_out) == (5, 3, 1, 1) and counted(b)
    for _ in range(3):  # refusals add up
        with pytest.raises(QueueFullException):
            await b.process_many(range(2))
    assert b.stats.rejected == 6
    await b.stop()


async def test_a_caller_woken_for_room_then_cancelled_passes_the_room_on() -> None:
    gate = asyncio.Event()
    b = Recording(max_queue_size=1, max_queue_time=0, max_batch_size=1, gate=gate, wait_when_full=True)
    first, waiting = await fill(b, gate, 1)
    a = asyncio.ensure_future(b.process(10))
    c = asyncio.ensure_future(b.process(11))
    await asyncio.sleep(0)
    b.max_queue_size = 2  # room for one more: promised to a, the head of the line
    a.cancel()  # before a could take it
    await until(lambda: b.stats.queued == 2)  # the room went to c
    gate.set()
    assert await c == 22 and await asyncio.gather(first, *waiting) == [-2, 0]
    assert 10 not in b.sent and counted(b)
    await b.stop()


async def test_a_cancelled_bulk_call_at_the_head_of_the_line_lets_the_next_one_in_at_once() -> None:
    gate = asyncio.Event()
    b = Recording(max_queue_size=2, max_queue_time=0, max_batch_size=1, gate=gate, wait_when_full=True)
    first, waiting = await fill(b, gate, 1)
    bulk = asyncio.ensure_future(b.process_many([10, 11]))  # needs two: does not fit beside the one queued
    single = asyncio.ensure_future(b.process(12))  # would fit, but waits behind the head of the line
    await asyncio.sleep(0)
    assert b.stats.queued == 1
    bulk.cancel()
    await until(lambda: b.stats.queued == 2)  # in as soon as the head leaves, with no other event
    gate.set()
    assert await single == 24 and await asyncio.gather(first, *waiting) == [-2, 0]
    await b.stop()


async def test_a_default_timeout_applies_to_calls_without_their_own() -> None:
    loop = asyncio.get_running_loop()
    b = Recording(max_batch_size=10, max_queue_time=100, default_timeout=2.0)
    b.start()  # (bound first: process() then takes its short path wherever it may)
    plain = asyncio.ensure_future(b.process(1))
    own = asyncio.ensure_future(b.process(2, timeout=5.0))  # overrides the default
    many = asyncio.ensure_future(b.process_many([3, 4]))
    with pytest.raises(TimeoutError):
        await plain
    assert loop.time() == 2.0
    with pytest.raises(TimeoutError):
        await many
    with pytest.raises(TimeoutError):
        await own
    assert loop.time() == 5.0 and b.sent == []  # each was withdrawn before its batch went
    s = b.stats
    assert s.timed_out == 4 and counted(b)
    b.default_timeout = None
    b.max_queue_time = 0
    assert await b.process(5) == 10  # (and the short path of process() is back)
    with pytest.raises(ValueError, match="default_timeout"):
        b.default_timeout = -1
    await b.stop()


async def test_a_default_timeout_does_not_recall_a_batch_already_sent() -> None:
    loop = asyncio.get_running_loop()
    b = Recording(max_queue_time=0, default_timeout=1.0, delay=3.0)
    with pytest.raises(TimeoutError):
        await b.process(1)
    assert loop.time() == 1.0
    await asyncio.sleep(5)
    assert b.batches == [[1]]  # it ran to its end; its result went to no one
    assert b.stats.timed_out == 1 and counted(b)
    await b.stop()


async def test_a_caller_leaving_the_queue_makes_room_for_the_one_in_line() -> None:
    gate = asyncio.Event()
    b = Recording(max_queue_size=2, max_queue_time=0, max_batch_size=1, gate=gate, wait_when_full=True)
    first, waiting = await fill(b, gate, 2)
    in_line = asyncio.ensure_future(b.process(10))
    await asyncio.sleep(0)
    assert b.stats.queued == 2
    waiting[0].cancel()  # queued callers leave (the short path's cancellation)
    waiting[1].cancel()
    await until(lambda: b.stats.cancelled == 2)
    await until(lambda: b.stats.queued == 1)  # their room went to the caller in line, with no other event
    gate.set()
    assert await in_line == 20 and await first == -2
    assert counted(b)
    await b.stop()


@pytest.mark.parametrize("bulk", [False, True], ids=["process", "process_many"])
async def test_a_queued_caller_timing_out_makes_room_for_the_one_in_line(bulk: bool) -> None:
    gate = asyncio.Event()
    b = Recording(max_queue_size=1, max_queue_time=0, max_batch_size=1, gate=gate, wait_when_full=True)
    first, _ = await fill(b, gate, 0)
    leaving = asyncio.ensure_future(b.process_many([0], timeout=1.0) if bulk else b.process(0, timeout=1.0))
    await until(lambda: b.stats.queued == 1)
    in_line = asyncio.ensure_future(b.process(10))
    await asyncio.wait([leaving], timeout=10)
    assert isinstance(leaving.exception(), TimeoutError) and b.stats.timed_out == 1
    await until(lambda: b.stats.queued == 1)  # the one in line took its place, with no batch ending
    gate.set()
    assert await in_line == 20 and await first == -2
    assert b.sent == [-1, 10] and counted(b)
    await b.stop()


async def test_queued_process_many_calls_cancelled_make_room_and_are_each_counted() -> None:
    gate = asyncio.Event()
    b = Recording(max_queue_size=4, max_queue_time=0, max_batch_size=1, gate=gate, wait_when_full=True)
    first, _ = await fill(b, gate, 0)
    leaving = [asyncio.ensure_future(b.process_many([i, i + 1])) for i in (0, 2)]
    await until(lambda: b.stats.queued == 4)
    in_line = asyncio.ensure_future(b.process_many([10, 11]))
    await asyncio.sleep(0)
    for call in leaving:
        call.cancel()
    await until(lambda: b.stats.cancelled == 4)  # both calls' items, on top of each other
    await until(lambda: b.stats.queued == 2)  # the call in line took their room, with no batch ending
    gate.set()
    assert await in_line == [20, 22] and await first == -2
    assert b.sent == [-1, 10, 11] and counted(b)
    await b.stop()


async def test_the_rest_of_a_failed_process_many_makes_room_for_the_one_in_line() -> None:
    gate = asyncio.Event()
    b = Recording(
        max_queue_size=3,
        max_queue_time=0,
        max_batch_size=1,
        gate=gate,
        wait_when_full=True,
        answer=lambda batch: [ValueError("no") if x == 0 else x * 2 for x in batch],
    )
    first, _ = await fill(b, gate, 0)
    failing = asyncio.ensure_future(b.process_many([0, 1, 2]))
    await until(lambda: b.stats.queued == 3)
    in_line = asyncio.ensure_future(b.process_many([10, 11]))
    await asyncio.sleep(0)
    gate.set()
    with pytest.raises(ValueError, match="no"):
        await failing
    assert await in_line == [20, 22] and await first == -2
    assert b.stats.failed == 3 and counted(b)
    await b.stop()


async def test_the_caller_of_a_failed_process_many_withdraws_what_the_dispatcher_has_not_seen() -> None:
    # Keys 1 and 0 in lanes of their own, one slot: as the failing batch ends, the dispatcher serves key 0 (never
    # served) and does not look at key 1, where the rest of the failed call still counts. Its caller's withdrawal
    # is what makes room for the call in line.
    class Keyed(Recording):
        def batch_key(self, item: int) -> int:
            return item // 100

    b = Keyed(
        max_queue_size=3,
        max_queue_time=0,
        max_batch_size=1,
        concurrency=1,
        delay=1.0,
        wait_when_full=True,
        answer=lambda batch: [ValueError("no") if x == 100 else x * 2 for x in batch],
    )
    first = asyncio.ensure_future(b.process(-1))
    await until(lambda: b.batches)
    failing = asyncio.ensure_future(b.process_many([100, 101, 102]))
    await until(lambda: b.stats.queued == 3)
    one = asyncio.ensure_future(b.process(0))  # room for it once 100 goes
    two = asyncio.ensure_future(b.process_many([1, 2]))  # room for it once the rest of the failed call is out
    with pytest.raises(ValueError, match="no"):
        await failing
    assert b.batches[-1] == [0] and b.stats.queued == 2  # 0 in flight; the call in line let in as 101 and 102 left
    assert await one == 0 and await two == [2, 4] and await first == -2
    assert b.sent == [-1, 100, 0, 1, 2] and b.stats.failed == 3 and counted(b)
    await b.stop()


async def test_room_goes_to_the_callers_in_line_in_order_as_far_as_it_reaches() -> None:
    # Room for four, in line 2 + 1 + 1 + 1: the first three get it; the last waits for the next batch to go.
    b = Recording(max_queue_size=4, max_batch_size=8, max_queue_time=1, wait_when_full=True)
    head = asyncio.ensure_future(b.process_many([1, 2, 3, 4]))
    await until(lambda: b.stats.queued == 4)
    in_line = [asyncio.ensure_future(b.process_many([5, 6]))] + [asyncio.ensure_future(b.process(i)) for i in (7, 8, 9)]
    await asyncio.gather(head, *in_line)
    assert b.batches == [[1, 2, 3, 4], [5, 6, 7, 8], [9]]
    assert b.started_at == [1.0, 2.0, 3.0]
    await b.stop()


async def test_room_for_two_goes_to_the_two_in_line_not_to_a_newcomer() -> None:
    gate = asyncio.Event()
    b = Recording(max_queue_size=2, max_queue_time=0, max_batch_size=2, gate=gate, wait_when_full=True)
    first, waiting = await fill(b, gate, 2)
    in_line = [asyncio.ensure_future(b.process(i)) for i in (10, 11)]
    await asyncio.sleep(0)
    gate.set()  # the batch in flight ends; the two queued go: room for two, promised to the two in line
    await until(lambda: len(b.batches) == 2)
    newcomer = asyncio.ensure_future(b.process(12))
    assert await asyncio.gather(*in_line) == [20, 22] and await newcomer == 24
    assert b.sent == [-1, 0, 1, 10, 11, 12]  # the newcomer after them
    await asyncio.gather(first, *waiting)
    await b.stop()


async def test_callers_in_line_that_give_up_are_each_counted() -> None:
    gate = asyncio.Event()
    b = Recording(max_queue_size=2, max_queue_time=0, max_batch_size=1, gate=gate, wait_when_full=True)
    first, waiting = await fill(b, gate, 2)
    leaving = [asyncio.ensure_future(b.process_many([10 + i, 20 + i])) for i in range(2)]
    await asyncio.sleep(0)
    for call in leaving:
        call.cancel()
    await asyncio.sleep(0)
    assert b.stats.cancelled == 4  # both calls' items, each counted once
    gate.set()
    await asyncio.gather(first, *waiting)
    assert counted(b)
    await b.stop()


async def test_a_caller_woken_for_room_as_a_stop_begins_is_refused_and_counted() -> None:
    gate = asyncio.Event()
    b = Recording(
        max_queue_size=2,
        max_queue_time=0,
        max_batch_size=1,
        gate=gate,
        wait_when_full=True,
        answer=lambda batch: [ValueError("no") if x == 99 else x * 2 for x in batch],
    )
    gate.set()
    with pytest.raises(ValueError):
        await b.process(99)  # an earlier failure, that the ones below add to
    gate.clear()
    first, waiting = await fill(b, gate, 2)
    in_line = asyncio.ensure_future(b.process_many([10, 11]))
    await asyncio.sleep(0)
    # In one loop iteration: room appears, the caller in line is woken, and a stop begins before it runs again.
    asyncio.get_running_loop().call_soon(setattr, b, "max_queue_size", 4)
    stopping = asyncio.ensure_future(b.stop())
    with pytest.raises(BatcherStoppedError, match="Recording is stopping"):
        await in_line
    gate.set()
    await stopping
    await asyncio.gather(first, *waiting)
    s = b.stats
    assert (s.submitted, s.failed) == (6, 3) and counted(b)


async def test_lowering_max_queue_size_refuses_the_callers_in_line_that_can_never_fit_and_serves_the_rest() -> None:
    b = Recording(max_queue_size=10, wait_when_full=True, max_batch_size=10, max_queue_time=0, delay=0.1)
    async with asyncio.timeout(100):
        first = asyncio.ensure_future(b.process_many(range(10)))  # in flight
        await asyncio.sleep(0.01)
        second = asyncio.ensure_future(b.process_many(range(10, 20)))  # queued: the queue is full
        await asyncio.sleep(0.01)
        third = asyncio.ensure_future(b.process_many(range(20, 28)))  # in line for room
        fourth = asyncio.ensure_future(b.process(99))  # in line behind it
        await asyncio.sleep(0.01)
        b.max_queue_size = 5
        with pytest.raises(QueueFullException) as refused:
            await third  # at once
        assert str(refused.value) == (
            "Recording: a call of 8 items can never fit in max_queue_size=5, lowered while it waited for room"
        )
        assert b.stats.awaiting_room == 1 and not fourth.done()
        assert await fourth == 198 and await second == [x * 2 for x in range(10, 20)] and len(await first) == 10
    assert not set(range(20, 28)) & set(b.sent)
    s = b.stats
    assert (s.failed, s.succeeded, s.rejected) == (8, 21, 0) and s.submitted == s.succeeded + s.failed
    await b.stop()


async def test_the_callers_behind_one_that_can_never_fit_get_the_room_there_is_at_once() -> None:
    gate = asyncio.Event()
    b = Recording(max_queue_size=4, wait_when_full=True, max_queue_time=0, max_batch_size=1, gate=gate)
    async with asyncio.timeout(100):
        first, waiting = await fill(b, gate, 2)  # one in flight, held; two queued
        big = asyncio.ensure_future(b.process_many(range(10, 14)))  # does not fit yet: in line
        small = asyncio.ensure_future(b.process(20))  # behind it
        await until(lambda: b.stats.awaiting_room == 5)
        b.max_queue_size = 3  # the call of 4 can never fit; the one behind it fits now: it queues at once
        with pytest.raises(QueueFullException):
            await big
        await until(lambda: b.stats.queued == 3)
        assert b.stats.awaiting_room == 0 and not gate.is_set()  # (no batch ended meanwhile)
        gate.set()
        assert await small == 40 and await first == -2 and await asyncio.gather(*waiting) == [0, 2]
    await b.stop()


# ---------------------------------------------------------------------- room in the queue, changed live


WAIT = 1000.0


@pytest.mark.parametrize(
    ("changes", "served"),
    [
        ([5], {"eight": "QueueFullException", "one": 99, "stream": [66], "three": 3}),
        ([8], {"eight": 8, "one": 99, "stream": [66], "three": 3}),
        ([1], {"eight": "QueueFullException", "one": 99, "stream": [66], "three": "QueueFullException"}),
        ([None], {"eight": 8, "one": 99, "stream": [66], "three": 3}),
        # Refused as the limit was lowered: raising it again does not bring it back; the others are served.
        ([5, 100], {"eight": "QueueFullException", "one": 99, "stream": [66], "three": 3}),
        ([100, 5], {"eight": 8, "one": 99, "stream": [66], "three": 3}),
    ],
)
async def test_max_queue_size_changed_under_callers_waiting_for_room(
    changes: list[int | None], served: dict[str, Any]
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
    assert b.stats.awaiting_room == 13
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
