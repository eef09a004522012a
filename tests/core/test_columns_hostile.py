"""The short path's columns (issue 52 §1) against a hostile user: departures at every moment, the long path's items
in the same level, live setting changes, re-entrant calls, stops and restarts, and columns so long that any look at
the rest of a column per departure, or per batch, would take minutes. Every wait is bounded (the virtual clock,
``asyncio.timeout``, and pytest-timeout as the backstop of the real clock); every step checks the run's invariants
(``testing.violations``) and every test ends idle with the counts adding up."""

from __future__ import annotations

import asyncio

import pytest

from async_batcher import QueueFullException, ReentrantCallError, testing
from tests.batchers import Recording, idle_and_clean, turns

# (a failed step inside a gated run would otherwise wait for a drain that never ends: pytest-timeout stops it)
pytestmark = [pytest.mark.virtual_time, pytest.mark.timeout(60)]


def clean(b: Recording) -> None:
    assert testing.violations(b) == []


@pytest.mark.timeout(20)
async def test_callers_leaving_many_columns_each_cost_no_look_at_the_other_columns() -> None:
    # The long path's items (a timeout) between the short path's cut the default level into 25 000 columns of one;
    # every short-path caller then leaves. A departure that looked through every column for its item would take
    # about a minute here (25 000 x 25 000 looks).
    n = 25_000
    b = Recording(max_batch_size=2 * n + 1, max_queue_time=100.0)
    async with b:
        tasks = []
        for x in range(n):
            tasks.append(asyncio.ensure_future(b.process(2 * x)))
            tasks.append(asyncio.ensure_future(b.process(2 * x + 1, timeout=1000.0)))
        await turns(2)
        assert b.stats.queued == 2 * n
        for i in range(0, 2 * n, 2):
            tasks[i].cancel()
        await turns(2)
        clean(b)
        assert (b.stats.queued, b.stats.cancelled) == (n, n)
        async with asyncio.timeout(200.0):
            done = await asyncio.gather(*tasks, return_exceptions=True)
        assert done[1::2] == [2 * x for x in range(1, 2 * n, 2)]
        assert all(isinstance(r, asyncio.CancelledError) for r in done[::2])
        assert b.batches == [list(range(1, 2 * n, 2))]
    idle_and_clean(b)


@pytest.mark.timeout(20)
async def test_a_departure_far_down_a_column_costs_no_look_at_the_rest_per_batch() -> None:
    # 80 000 callers in one column, the last one leaves: the column holds a departure until its head reaches it, and
    # 80 000 batches of one are taken from it meanwhile. A batch that looked through the rest of the column for
    # departed callers at its head would take about a minute here (80 000 x 40 000 looks).
    n = 80_000
    b = Recording(max_batch_size=1, max_queue_time=0.0, concurrency=4)
    async with b:
        tasks = [asyncio.ensure_future(b.process(x)) for x in range(n)]
        await turns(1)
        tasks[-1].cancel()
        await turns(1)
        clean(b)
        async with asyncio.timeout(1000.0):
            done = await asyncio.gather(*tasks, return_exceptions=True)
        assert done[:-1] == [2 * x for x in range(n - 1)]
        assert isinstance(done[-1], asyncio.CancelledError)
        assert len(b.batches) == n - 1
    idle_and_clean(b)


def calls(b: Recording, xs: range) -> list[asyncio.Future[int]]:
    """A caller per item: every third the long path (a timeout, or a priority of 0.0 given as a float: still the
    default level), the rest the short path, all into the same level."""
    out = []
    for x in xs:
        if x % 3 == 1:
            call = b.process(x, timeout=500.0)
        elif x % 6 == 2:
            call = b.process(x, priority=0.0)
        else:
            call = b.process(x)
        out.append(asyncio.ensure_future(call))
    return out


@pytest.mark.parametrize("moment", range(7))
async def test_callers_leaving_at_each_turn_around_a_batch_leave_once(moment: int) -> None:
    # Cancelled before their first turn, between the take and the batch's task, while the batch runs: each one
    # resolves once (cancelled, or its result dropped), never in two batches, and the counts follow.
    gate = asyncio.Event()
    b = Recording(max_batch_size=4, max_queue_time=0.0, gate=gate, concurrency=2)
    async with b:
        tasks = calls(b, range(20))
        await turns(moment)
        for i in (0, 2, 5, 6, 11, 19):
            tasks[i].cancel()
        clean(b)
        await turns(1)
        clean(b)
        gate.set()
        async with asyncio.timeout(100.0):
            done = await asyncio.gather(*tasks, return_exceptions=True)
        sent = b.sent
        assert len(sent) == len(set(sent))
        for x, r in enumerate(done):
            assert r == 2 * x or isinstance(r, asyncio.CancelledError), (x, r)
        assert all(isinstance(done[x], asyncio.CancelledError) for x in (0, 2, 5, 6, 11, 19) if x not in sent)
        assert [x for x in range(20) if not isinstance(done[x], asyncio.CancelledError)] == [
            x for x in sent if done[x] == 2 * x
        ]
    idle_and_clean(b)


async def test_a_reentrant_call_with_every_slot_taken_fails_once() -> None:
    seen: list[BaseException] = []

    class Inner(Recording):
        async def process_batch(self, batch: list[int]) -> list[int]:
            if batch[0] == 0:
                try:
                    await self.process(100)
                except ReentrantCallError as exc:
                    seen.append(exc)
            return [2 * x for x in batch]

    b = Inner(max_batch_size=2, max_queue_time=0.0, concurrency=1)
    async with b:
        tasks = [asyncio.ensure_future(b.process(x)) for x in range(5)]
        async with asyncio.timeout(10.0):
            assert await asyncio.gather(*tasks) == [0, 2, 4, 6, 8]
        clean(b)
    assert len(seen) == 1
    assert b.stats.failed == 1
    idle_and_clean(b)


@pytest.mark.parametrize("wait_when_full", [False, True])
async def test_a_bound_set_live_closes_and_opens_the_short_path_while_callers_leave(wait_when_full: bool) -> None:
    gate = asyncio.Event()
    b = Recording(max_batch_size=3, max_queue_time=0.0, gate=gate, concurrency=1, wait_when_full=wait_when_full)
    async with b:
        first = [asyncio.ensure_future(b.process(x)) for x in range(10)]  # 3 in flight, 7 queued
        await turns(2)
        b.max_queue_size = 8
        more = [asyncio.ensure_future(b.process(x)) for x in range(10, 14)]  # 1 more fits; 3 refused, or in line
        await turns(2)
        clean(b)
        assert b.stats.queued == 8
        for t in (first[4], first[5], more[3], first[9]):  # queued short-path callers, and one refused or in line
            t.cancel()
        await turns(2)
        clean(b)
        assert b.stats.queued == (7 if wait_when_full else 5)  # (room for two in line)
        b.max_queue_size = 2  # below what waits: none is dropped, none more comes in
        late = asyncio.ensure_future(b.process(99))
        await turns(2)
        clean(b)
        b.max_queue_size = None  # the short path again
        after = asyncio.ensure_future(b.process(98))
        await turns(1)
        clean(b)
        gate.set()
        async with asyncio.timeout(100.0):
            done = await asyncio.gather(*first, *more, late, after, return_exceptions=True)
        xs = [*range(14), 99, 98]
        got = dict(zip(xs, done, strict=True))
        for x, r in got.items():
            if x in (4, 5, 9) or (x == 13 and wait_when_full):
                assert isinstance(r, asyncio.CancelledError), (x, r)
            elif x in (11, 12, 13, 99) and not wait_when_full:
                assert isinstance(r, QueueFullException), (x, r)
            else:
                assert r == 2 * x, (x, r)
        assert sorted(b.sent) == sorted(x for x, r in got.items() if isinstance(r, int))
        clean(b)
    idle_and_clean(b)


async def test_stops_and_restarts_leave_no_column_behind() -> None:
    gate = asyncio.Event()
    b = Recording(max_batch_size=4, max_queue_time=1.0, gate=gate)
    for cycle in range(4):
        b.start()
        tasks = calls(b, range(cycle * 100, cycle * 100 + 30))
        await turns(2)
        tasks[3].cancel()
        tasks[17].cancel()
        if cycle % 2:
            stopping = asyncio.ensure_future(b.stop())  # a drain: cancellations while it waits
            await turns(1)
            tasks[20].cancel()
            tasks[5].cancel()
            gate.set()
            async with asyncio.timeout(100.0):
                await stopping
        else:
            async with asyncio.timeout(100.0):
                await b.stop(timeout=0.5)
        done = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, (int, BaseException)) for r in done)
        gate.clear()
        s = b.stats
        assert s.submitted == s.succeeded + s.failed + s.cancelled + s.timed_out, s
    b.start()
    clean(b)
    assert b.stats.queued == 0
    gate.set()
    async with asyncio.timeout(10.0):
        assert await asyncio.gather(*(b.process(x) for x in range(5))) == [0, 2, 4, 6, 8]
    await b.stop()
    idle_and_clean(b)


async def test_a_submitted_future_cancelled_at_each_moment_is_withdrawn_once() -> None:
    gate = asyncio.Event()
    b = Recording(max_batch_size=3, max_queue_time=0.0, gate=gate, concurrency=1)
    async with b:
        futs = [b._submit(x) for x in range(12)]
        futs[7].cancel()  # before the loop turned
        await turns(1)
        futs[1].cancel()  # in flight
        futs[4].cancel()  # queued
        await turns(1)
        clean(b)
        futs[8].cancel()
        gate.set()
        async with asyncio.timeout(10.0):
            done = await asyncio.gather(*futs, return_exceptions=True)
        for x, r in enumerate(done):
            assert isinstance(r, asyncio.CancelledError) if x in (1, 4, 7, 8) else r == 2 * x, (x, r)
        assert not {4, 7, 8} & set(b.sent)
    idle_and_clean(b)


async def test_priorities_competing_with_columns_while_callers_leave() -> None:
    b = Recording(max_batch_size=3, max_queue_time=0.0, delay=0.1, max_priority_wait=0.05, concurrency=1)
    async with b:
        tasks = [asyncio.ensure_future(b.process(x)) for x in range(30)]
        tasks += [asyncio.ensure_future(b.process(x, priority=1)) for x in range(30, 40)]
        await turns(1)
        for i in range(0, 40, 4):
            tasks[i].cancel()
        await asyncio.sleep(0.15)
        for i in range(1, 40, 7):
            tasks[i].cancel()
            await turns(1)
            clean(b)
        b.max_batch_size = 1
        await asyncio.sleep(0.25)
        b.max_batch_size = 5
        async with asyncio.timeout(100.0):
            done = await asyncio.gather(*tasks, return_exceptions=True)
        assert len(b.sent) == len(set(b.sent))
        for x, r in enumerate(done):
            assert r == 2 * x or isinstance(r, asyncio.CancelledError)
        assert max(map(len, b.batches)) <= 5
    idle_and_clean(b)


async def test_flush_while_callers_leave_and_come() -> None:
    b = Recording(max_batch_size=4, max_queue_time=100.0, concurrency=1, delay=0.1)
    async with b:
        tasks = calls(b, range(20))
        await turns(1)
        flushed = asyncio.ensure_future(testing.flush(b))
        await turns(1)
        for i in (2, 9, 15):
            tasks[i].cancel()
        tasks += calls(b, range(20, 26))
        await asyncio.sleep(0.15)
        tasks[22].cancel()
        async with asyncio.timeout(10.0):
            await flushed
        clean(b)
        assert set(range(20)) - {2, 9, 15} <= set(b.sent)
        async with asyncio.timeout(10.0):
            await testing.flush(b)
        done = await asyncio.gather(*tasks, return_exceptions=True)
        for x, r in enumerate(done):
            assert r == 2 * x or (isinstance(r, asyncio.CancelledError) and x in (2, 9, 15, 22)), (x, r)
    idle_and_clean(b)
