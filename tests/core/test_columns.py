"""The short path's items queue as a column (parallel lists, no object per item: issue 52 §1): what each caller
sees must be what an object per item gave. A caller who leaves is withdrawn at once (counts, room, the batch that
forms); batches cut a column anywhere; a column keeps its place among the long path's items; priorities compete
item by item; a stop and a flush see it whole. Every step checks the run's invariants (``testing.violations``)."""

from __future__ import annotations

import asyncio

import pytest

from async_batcher import BatcherStoppedError, testing
from async_batcher.testing import flush
from tests.batchers import Recording, idle_and_clean, turns

pytestmark = pytest.mark.virtual_time


def clean(b: Recording) -> None:
    assert testing.violations(b) == []


async def test_a_caller_who_leaves_is_withdrawn_at_once_and_never_sent() -> None:
    b = Recording(max_batch_size=10, max_queue_time=1.0)
    async with b:
        tasks = [asyncio.ensure_future(b.process(x)) for x in range(5)]
        await turns(1)
        assert b.stats.queued == 5
        tasks[2].cancel()
        await turns(1)
        clean(b)
        assert b.stats.queued == 4  # at once, not when the batch forms
        assert b.stats.cancelled == 1
        tasks += [asyncio.ensure_future(b.process(x)) for x in range(5, 8)]  # the same column, after a departure
        await turns(1)
        tasks[6].cancel()
        await turns(1)
        clean(b)
        assert (b.stats.queued, b.stats.cancelled) == (6, 2)
        assert await asyncio.gather(*(t for i, t in enumerate(tasks) if i not in (2, 6))) == [0, 2, 6, 8, 10, 14]
        assert b.batches == [[0, 1, 3, 4, 5, 7]]
    idle_and_clean(b)


async def test_batches_cut_a_column_anywhere_and_skip_those_who_left() -> None:
    gate = asyncio.Event()
    b = Recording(max_batch_size=3, max_queue_time=0.5, gate=gate)
    async with b:
        tasks = [asyncio.ensure_future(b.process(x)) for x in range(10)]
        await turns(2)
        assert b.stats.queued == 7  # [0, 1, 2] full: sent at once; the others wait for the one slot
        for i in (3, 4, 8):  # the head, the one after it, one further on
            tasks[i].cancel()
        await turns(1)
        clean(b)
        assert b.stats.queued == 4
        gate.set()
        done = await asyncio.gather(*tasks, return_exceptions=True)
        assert [r for r in done if not isinstance(r, asyncio.CancelledError)] == [
            2 * x for x in range(10) if x not in (3, 4, 8)
        ]
        assert b.batches == [[0, 1, 2], [5, 6, 7], [9]]
    idle_and_clean(b)


async def test_a_caller_who_leaves_after_its_batch_went_is_not_withdrawn_again() -> None:
    gate = asyncio.Event()
    b = Recording(max_batch_size=2, max_queue_time=0.0, gate=gate)
    async with b:
        tasks = [asyncio.ensure_future(b.process(x)) for x in range(3)]
        await turns(3)
        assert b.batches == [[0, 1]]
        tasks[0].cancel()  # sent already: its result is dropped, nothing leaves the queue twice
        await turns(1)
        clean(b)
        assert b.stats.queued == 1
        gate.set()
        done = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(done[0], asyncio.CancelledError) and done[1:] == [2, 4]
    idle_and_clean(b)


async def test_many_callers_leaving_at_once_cost_no_look_at_the_rest_of_the_column() -> None:
    # 20 000 queued, all but every hundredth cancelled at once: each withdrawal finds its item through the column's
    # index (a scan of the column per caller would take minutes here), and the counts follow each one.
    n = 20_000
    b = Recording(max_batch_size=n + 1, max_queue_time=1.0)
    async with b:
        tasks = [asyncio.ensure_future(b.process(x)) for x in range(n)]
        await turns(1)
        for i, task in enumerate(tasks):
            if i % 100:
                task.cancel()
        await turns(1)
        clean(b)
        assert b.stats.queued == n // 100
        kept = [t for i, t in enumerate(tasks) if not i % 100]
        assert await asyncio.wait_for(asyncio.gather(*kept), 10.0) == [2 * x for x in range(0, n, 100)]
        assert b.batches == [list(range(0, n, 100))]
    idle_and_clean(b)


async def test_the_long_paths_items_keep_their_place_among_the_columns() -> None:
    # A timeout sends an item the long path (an entry of its own) into the same level: first come, first served
    # across both, and a column after it is a column of its own.
    b = Recording(max_batch_size=100, max_queue_time=1.0)
    async with b:
        tasks = []
        for x in range(12):
            call = b.process(x, timeout=50.0) if x % 4 == 1 else b.process(x)
            tasks.append(asyncio.ensure_future(call))
            await turns(1)
            clean(b)
        tasks[3].cancel()
        tasks[5].cancel()
        await turns(1)
        clean(b)
        assert b.stats.queued == 10
        await asyncio.gather(*tasks, return_exceptions=True)
        assert b.batches == [[x for x in range(12) if x not in (3, 5)]]
    idle_and_clean(b)


async def test_priorities_compete_with_a_column_item_by_item() -> None:
    # max_priority_wait: an item of a worse priority that waited long enough goes before the column's later items.
    b = Recording(max_batch_size=2, max_queue_time=0.0, delay=0.1, max_priority_wait=0.0)
    async with b:
        first = [asyncio.ensure_future(b.process(x)) for x in range(5)]
        await asyncio.sleep(0.05)
        late = [asyncio.ensure_future(b.process(5)), asyncio.ensure_future(b.process(6, priority=1))]
        await asyncio.gather(*first, *late)
        order = [x for batch in b.batches for x in batch]
        assert order.index(6) < order.index(5), b.batches  # arrived together: the worse priority, passed over, first
        clean(b)
    idle_and_clean(b)


async def test_a_forced_stop_fails_every_queued_caller_of_a_column_once() -> None:
    gate = asyncio.Event()  # never set: the first batch is cut off, the rest are still queued
    b = Recording(max_batch_size=10, max_queue_time=10.0, gate=gate)
    b.start()
    tasks = [asyncio.ensure_future(b.process(x)) for x in range(50)]
    await turns(3)
    assert b.batches == [list(range(10))]
    tasks[17].cancel()
    await turns(1)
    clean(b)
    await b.stop(timeout=0)
    done = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(done[17], asyncio.CancelledError)
    assert all(isinstance(r, BatcherStoppedError) for i, r in enumerate(done) if i != 17), done
    s = b.stats
    assert (s.failed, s.cancelled, s.succeeded) == (49, 1, 0)
    assert s.submitted == s.succeeded + s.failed + s.cancelled + s.timed_out


async def test_flush_sends_what_waited_when_it_was_called() -> None:
    b = Recording(max_batch_size=100, max_queue_time=100.0)
    async with b:
        tasks = [asyncio.ensure_future(b.process(x)) for x in range(4)]
        await turns(1)
        flushed = asyncio.ensure_future(flush(b))
        tasks += [asyncio.ensure_future(b.process(x)) for x in range(4, 6)]
        await asyncio.wait_for(flushed, 1.0)
        assert {0, 1, 2, 3} <= {x for batch in b.batches for x in batch}
        await flush(b)
        assert await asyncio.gather(*tasks) == [0, 2, 4, 6, 8, 10]
        clean(b)
    idle_and_clean(b)


async def test_a_late_refusal_switched_on_live_counts_the_queued_columns() -> None:
    b = Recording(max_batch_size=4, max_queue_time=0.2, delay=0.5)
    async with b:
        tasks = [asyncio.ensure_future(b.process(x)) for x in range(10)]
        await turns(1)
        b.refuse_late = True  # the short path closes; the columns queued stay
        late = asyncio.ensure_future(b.process(99, timeout=0.6))
        await asyncio.gather(*tasks, late, return_exceptions=True)
        clean(b)
        assert [x for batch in b.batches for x in batch if x != 99] == list(range(10))
    idle_and_clean(b)


async def test_a_long_column_cut_by_many_batches_keeps_every_caller_in_its_place() -> None:
    # Batches take a long column's head a slice at a time (its lists are cut once the head passes half of them):
    # departures before and after a cut are found and skipped, and every batch is the next callers still waiting.
    n, size = 5000, 700
    b = Recording(max_batch_size=size, max_queue_time=0.0, delay=0.1)
    async with b:
        tasks = [asyncio.ensure_future(b.process(x)) for x in range(n)]
        await turns(2)
        early = set(range(1, n, 7))
        for i in early:
            tasks[i].cancel()
        await turns(1)
        clean(b)
        await asyncio.sleep(0.35)  # a few batches went: the column's lists have been cut
        clean(b)
        sent = {x for batch in b.batches for x in batch}
        late = {i for i in range(3, n, 11) if i not in sent and i not in early}
        assert late and len(sent) > n // 2  # (past half the column: its lists were cut)
        for i in late:
            tasks[i].cancel()
        await turns(1)
        clean(b)
        left = early | late
        assert b.stats.queued == n - len(sent) - len(left - sent)
        done = await asyncio.gather(*tasks, return_exceptions=True)
        assert [r for i, r in enumerate(done) if i not in left] == [2 * x for x in range(n) if x not in left]
        order = [x for batch in b.batches for x in batch]
        assert order == [x for x in range(n) if x not in left or x in sent]
        assert max(map(len, b.batches)) <= size
        assert sent.isdisjoint(early)
    idle_and_clean(b)
