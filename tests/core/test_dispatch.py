"""Contract 1 (dispatch) and 4 (concurrency), on the loop's virtual clock: exact times, no wall time."""

from __future__ import annotations

import asyncio

import pytest

from async_batcher import testing
from tests.batchers import Recording, until
from tests.loops import VirtualClockLoop

pytestmark = pytest.mark.virtual_time


async def submit_at(batcher: Recording, delay: float, items: range) -> list[int]:
    await asyncio.sleep(delay)
    return list(await asyncio.gather(*(batcher.process(i) for i in items)))


async def test_a_full_batch_goes_at_once_and_the_rest_waits_for_the_oldest_deadline() -> None:
    loop = asyncio.get_running_loop()
    b = Recording(max_batch_size=4, max_queue_time=100)
    results = await asyncio.gather(*(b.process(i) for i in range(10)))
    assert results == [i * 2 for i in range(10)]
    assert b.batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert b.started_at == [0, 0, 100]
    assert loop.time() == 100
    await b.stop()


@pytest.mark.parametrize("size", [1, 4])
async def test_a_batch_of_exactly_max_batch_size_goes_at_once(size: int) -> None:
    b = Recording(max_batch_size=size, max_queue_time=100)
    assert await asyncio.gather(*(b.process(i) for i in range(size))) == [2 * i for i in range(size)]
    assert b.batches == [list(range(size))] and b.started_at == [0]  # not at 100: full is full
    one_short = [asyncio.ensure_future(b.process(i)) for i in range(size - 1)]
    await asyncio.gather(*one_short)
    assert b.started_at[1:] == ([100] if size > 1 else [])  # one item short of full waits for its deadline
    await b.stop()


async def test_a_batch_of_exactly_max_batch_weight_goes_at_once() -> None:
    class Heavy(Recording):
        def item_weight(self, item: int) -> float:
            return 2.5

    b = Heavy(max_batch_weight=5, max_queue_time=100)
    assert await asyncio.gather(b.process(1), b.process(2)) == [2, 4]
    assert b.started_at == [0]
    await b.stop()


async def test_the_wait_is_measured_from_the_oldest_items_arrival() -> None:
    b = Recording(max_batch_size=10, max_queue_time=1.0)
    first = asyncio.ensure_future(submit_at(b, 0.0, range(1)))
    second = asyncio.ensure_future(submit_at(b, 0.6, range(1, 2)))
    await asyncio.gather(first, second)
    assert b.batches == [[0, 1]]
    assert b.started_at == [1.0]  # 1.0 after the first item arrived, not after the second
    await b.stop()


async def test_a_free_slot_never_idles_while_the_oldest_item_is_overdue() -> None:
    # async-batcher 0.2.2 restarts the wait when it gets a slot and sends the last batch at 1.45, not 1.25.
    b = Recording(max_batch_size=10, max_queue_time=0.2, concurrency=2, delay=1.0)
    await asyncio.gather(submit_at(b, 0, range(5)), submit_at(b, 0.25, range(5, 20)), submit_at(b, 0.4, range(20, 30)))
    assert b.batches == [list(range(5)), list(range(5, 15)), list(range(15, 25)), list(range(25, 30))]
    assert b.started_at == pytest.approx([0.2, 0.25, 1.2, 1.25])
    await b.stop()


@pytest.mark.parametrize(
    ("concurrency", "starts", "end"),
    [
        (1, [0.2, 1.2, 2.2, 3.2], 4.2),
        (3, [0.2, 0.25, 0.4, 1.2], 2.2),
        (None, [0.2, 0.25, 0.4, 0.6], 1.6),
    ],
)
async def test_the_scenarios_of_async_batcher_0_2_2(concurrency: int | None, starts: list[float], end: float) -> None:
    loop = asyncio.get_running_loop()
    b = Recording(max_batch_size=10, max_queue_time=0.2, concurrency=concurrency, delay=1.0)
    results = await asyncio.gather(
        submit_at(b, 0, range(5)), submit_at(b, 0.25, range(5, 20)), submit_at(b, 0.4, range(20, 30))
    )
    assert results == [[i * 2 for i in r] for r in (range(5), range(5, 20), range(20, 30))]
    assert b.batches == [list(range(5)), list(range(5, 15)), list(range(15, 25)), list(range(25, 30))]
    assert b.started_at == pytest.approx(starts)
    assert loop.time() == pytest.approx(end)
    await b.stop()


async def test_zero_queue_time_sends_what_is_waiting_as_soon_as_a_slot_is_free() -> None:
    loop = asyncio.get_running_loop()
    gate = asyncio.Event()
    b = Recording(max_queue_time=0, gate=gate)
    first = asyncio.ensure_future(b.process(0))
    await until(lambda: b.batches)
    assert b.batches == [[0]] and b.started_at == [0]
    # While the only slot is busy, items accumulate; they all go together the moment it frees.
    rest = asyncio.gather(*(b.process(i) for i in range(1, 6)))
    await until(lambda: b.stats.queued == 5)
    gate.set()
    assert await first == 0
    assert await rest == [2, 4, 6, 8, 10]
    assert b.batches == [[0], [1, 2, 3, 4, 5]]
    assert loop.time() == 0
    await b.stop()


async def test_items_submitted_in_one_loop_iteration_share_a_zero_wait_batch() -> None:
    b = Recording(max_queue_time=0, max_batch_size=None)
    await asyncio.gather(*(b.process(i) for i in range(50)))
    assert b.batches == [list(range(50))]
    await b.stop()


async def test_items_go_out_in_arrival_order_across_batches() -> None:
    b = Recording(max_batch_size=7, max_queue_time=0.5)
    tasks = []
    for i in range(40):
        tasks.append(asyncio.ensure_future(b.process(i)))
        if i % 3 == 0:
            await asyncio.sleep(0.1)
    await asyncio.gather(*tasks)
    assert b.sent == list(range(40))
    assert all(len(batch) <= 7 for batch in b.batches)
    await b.stop()


async def test_an_idle_batcher_schedules_no_wakeups() -> None:
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualClockLoop)
    b = Recording(max_batch_size=100, max_queue_time=0.05)
    await asyncio.gather(*(b.process(i) for i in range(3)))
    jumps = loop.jumps
    await asyncio.sleep(3600)  # an hour of idle virtual time: the clock jumps once, to this sleep's end
    assert loop.jumps == jumps + 1
    assert b.stats.batches == 1
    await b.stop()


async def test_an_item_cancelled_at_the_head_does_not_trigger_an_early_batch() -> None:
    b = Recording(max_batch_size=10, max_queue_time=1.0)
    early = asyncio.ensure_future(b.process(0))
    await asyncio.sleep(0.5)
    late = asyncio.ensure_future(b.process(1))
    await asyncio.sleep(0)
    early.cancel()
    assert await late == 2
    assert b.batches == [[1]]
    assert b.started_at == [1.5]  # the deadline of the oldest item still waiting
    await b.stop()


@pytest.mark.parametrize("concurrency", [1, 2, 3])
async def test_at_most_concurrency_batches_are_in_flight(concurrency: int) -> None:
    gate = asyncio.Event()
    b = Recording(max_batch_size=2, max_queue_time=0, concurrency=concurrency, gate=gate)
    calls = asyncio.gather(*(b.process(i) for i in range(20)))
    await until(lambda: len(b.batches) == concurrency)
    await asyncio.sleep(1)
    assert len(b.batches) == concurrency
    assert b.stats.in_flight == concurrency
    gate.set()
    assert await calls == [i * 2 for i in range(20)]
    assert b.max_in_flight == concurrency
    await b.stop()


async def test_unlimited_concurrency_sends_every_due_batch() -> None:
    gate = asyncio.Event()
    b = Recording(max_batch_size=2, max_queue_time=0, concurrency=None, gate=gate)
    calls = asyncio.gather(*(b.process(i) for i in range(20)))
    await until(lambda: len(b.batches) == 10)
    gate.set()
    await calls
    assert b.max_in_flight == 10
    await b.stop()


async def test_settings_changed_on_a_running_batcher_apply_to_the_next_batch() -> None:
    gate = asyncio.Event()
    b = Recording(max_batch_size=2, max_queue_time=10, gate=gate)
    calls = asyncio.gather(*(b.process(i) for i in range(9)))
    await until(lambda: len(b.batches) == 1)
    b.max_batch_size = 3
    b.concurrency = 3
    await until(lambda: len(b.batches) == 3)
    assert b.batches == [[0, 1], [2, 3, 4], [5, 6, 7]]
    b.max_queue_time = 0
    gate.set()
    await calls
    assert b.batches[-1] == [8]
    await b.stop()


@pytest.mark.parametrize(
    ("arrivals", "batches", "starts"),
    [
        ([(0, 10)], [8, 2], [0, 1.0]),  # 8 at once; the 2 left wait for 4 until their deadline
        ([(0, 5)], [4, 1], [0, 1.0]),  # the largest preferred size available goes, not all 5
        ([(0, 8)], [8], [0]),  # exactly the largest: one batch
        ([(0, 3), (0.5, 1)], [4], [0.5]),  # 3 wait for a preferred size; the 4th makes one
        ([(0, 3)], [3], [1.0]),  # none reached before the deadline: what there is goes
    ],
)
async def test_batches_go_at_the_preferred_sizes(
    arrivals: list[tuple[float, int]], batches: list[int], starts: list[float]
) -> None:
    b = Recording(max_batch_size=8, preferred_batch_sizes=(4, 8), max_queue_time=1.0)
    first = 0
    calls = []
    for at, n in arrivals:
        calls.append(asyncio.ensure_future(submit_at(b, at, range(first, first + n))))
        first += n
    await asyncio.gather(*calls)
    assert [len(x) for x in b.batches] == batches
    assert b.started_at == pytest.approx(starts)
    assert b.sent == list(range(first))
    await b.stop()


def test_preferred_sizes_are_checked_against_max_batch_size() -> None:
    with pytest.raises(ValueError, match="above max_batch_size=8"):
        Recording(max_batch_size=8, preferred_batch_sizes=(4, 16))
    b = Recording(max_batch_size=16, preferred_batch_sizes=[16, 4, 4])
    assert b.preferred_batch_sizes == (4, 16)
    with pytest.raises(ValueError, match="smaller than the preferred batch size 16"):
        b.max_batch_size = 8
    for bad in ([0], [-1], ["8"], 8):
        with pytest.raises((ValueError, TypeError)):
            b.preferred_batch_sizes = bad  # type: ignore[assignment]
    assert b.preferred_batch_sizes == (4, 16) and b.max_batch_size == 16


class Keyed(Recording):
    """One key for every item: the same batches as :class:`Recording`, through the keyed path (a lane per key, and
    the dispatcher woken by :func:`arrived` rather than ``process()``'s inline test)."""

    def batch_key(self, item: int) -> str:
        return "k"


# The hold's tests run on both ways an arrival wakes the dispatcher.
both_paths = pytest.mark.parametrize("cls", [Recording, Keyed], ids=["plain", "keyed"])


async def clients(b: Recording, n: int, requests: int, think: float, spread: float = 0.0) -> list[float]:
    """``n`` closed-loop clients: client ``c`` sends its next item ``think + c * spread`` seconds after it got its
    answer; returns each request's latency."""
    loop = asyncio.get_running_loop()
    latencies: list[float] = []

    async def client(c: int) -> None:
        for r in range(requests):
            sent = loop.time()
            await b.process(c * 1000 + r)
            latencies.append(loop.time() - sent)
            await asyncio.sleep(think + c * spread)

    await asyncio.gather(*(client(c) for c in range(n)))
    return latencies


@both_paths
async def test_a_hold_merges_the_clients_that_come_back_into_full_batches(cls: type[Recording]) -> None:
    # Without a hold, the first client back goes alone and the others gather behind it: the clients split into
    # cohorts that alternate. A free slot that waits for the callers it just answered gathers them all.
    sizes = {}
    for hold in (0.0, 0.05):
        b = cls(max_queue_time=0, max_hold_time=hold, delay=0.1)
        await clients(b, 8, 8, think=0.01, spread=0.004)
        sizes[hold] = [len(x) for x in b.batches]
        await b.stop()
    assert sizes[0.05] == [8] * 8  # every round one batch of all eight
    assert len(sizes[0.0]) > 12 and min(sizes[0.0][1:]) < 8


@both_paths
async def test_the_statistics_count_the_batches_a_hold_kept_back(cls: type[Recording]) -> None:
    # BatcherStats.held: each batch after the first of a closed loop that the hold gathers was kept back for its
    # callers; the first hold was a probe (from a cold start the gate opens once a probe has gathered them). With
    # the adaptive wait the hold keeps them back too (its deadline is far). Without a hold, none.
    counts = {}
    for name, settings in {
        "none": {"max_queue_time": 0, "max_hold_time": 0.0},
        "hold": {"max_queue_time": 0, "max_hold_time": 0.05},
        "adaptive": {"max_hold_time": 0.05, "max_latency": 5.0},
    }.items():
        b = cls(delay=0.1, **settings)
        await clients(b, 8, 8, think=0.01, spread=0.004)
        stats = b.stats
        counts[name] = (stats.batches, stats.held, stats.probes)
        await b.stop()
    assert counts["hold"] == counts["adaptive"] == (8, 7, 1)
    assert counts["none"][1:] == (0, 0)


@both_paths
async def test_a_hold_never_lasts_longer_than_max_hold_time_after_the_batch_ended(cls: type[Recording]) -> None:
    # Client c comes back 0.01 + 0.03 c after its answer: they keep coming back for 0.22, but the hold ends 0.05
    # after the batch that answered them, with the two back by then.
    b = cls(max_queue_time=0, max_hold_time=0.05, delay=0.1)
    await clients(b, 8, 2, think=0.01, spread=0.03)
    assert [len(x) for x in b.batches][:2] == [8, 2]
    assert b.started_at[:2] == pytest.approx([0, 0.15])
    await b.stop()


@both_paths
async def test_a_hold_waits_for_the_callers_answered_and_ends_when_its_time_is_up(cls: type[Recording]) -> None:
    b = cls(max_queue_time=0, max_hold_time=0.05, delay=0.1)
    loop = asyncio.get_running_loop()

    async def client(c: int) -> None:
        await b.process(c)  # all eight in the first batch, 0 to 0.1
        await asyncio.sleep(0.01 if c < 4 else 0.5)  # four come back at 0.11, four at 0.6
        await b.process(c)

    await asyncio.gather(*(client(c) for c in range(8)))
    # The four back at 0.11 wait for the others until 0.15, the hold's end: 0.05 after the batch that answered them.
    assert [len(x) for x in b.batches] == [8, 4, 4]
    assert b.started_at == pytest.approx([0, 0.15, 0.6])
    assert loop.time() == pytest.approx(0.7)
    await b.stop()


async def test_a_process_many_split_over_batches_does_not_wait_for_itself() -> None:
    # Its first ten items are answered in the first batch, but its caller is not: the hold owes it nothing, and
    # the last five go as soon as the slot is free.
    b = Recording(max_queue_time=0, max_batch_size=10, max_hold_time=0.1, delay=0.001)
    loop = asyncio.get_running_loop()
    assert await b.process_many(range(15)) == [x * 2 for x in range(15)]
    assert [len(x) for x in b.batches] == [10, 5] and b.started_at == pytest.approx([0, 0.001])
    assert loop.time() == pytest.approx(0.002)
    await b.stop()


@both_paths
async def test_a_lone_caller_after_an_idle_period_does_not_wait(cls: type[Recording]) -> None:
    # Ten callers answered long ago are owed no hold: it ended max_hold_time after their batch.
    b = cls(max_queue_time=0, max_hold_time=0.2, delay=0.001)
    loop = asyncio.get_running_loop()
    await asyncio.gather(*(b.process(i) for i in range(10)))
    await asyncio.sleep(0.5)
    sent = loop.time()
    assert await b.process(7) == 14
    assert loop.time() - sent == pytest.approx(0.001)
    await b.stop()


async def test_a_lane_does_not_wait_for_the_callers_of_another_lane() -> None:
    class TwoKeys(Recording):
        def batch_key(self, item: int) -> int:
            return item // 100

    b = TwoKeys(max_queue_time=0, max_hold_time=1.0, delay=0.1, concurrency=2)
    loop = asyncio.get_running_loop()
    assert await asyncio.gather(*(b.process(i) for i in range(4))) == [0, 2, 4, 6]  # lane 0 answers four at 0.1
    sent = loop.time()
    assert await asyncio.gather(b.process(100), b.process(101)) == [200, 202]  # lane 1: nothing owed
    assert loop.time() - sent == pytest.approx(0.1)
    await b.stop()


async def test_an_idle_batcher_keeps_no_timer_after_a_caller_leaves() -> None:
    # The dispatcher's timer was armed for the caller's deadline (max_queue_time=10); the caller leaves: nothing
    # waits, so nothing may wake the loop in ten seconds.
    b = Recording(max_queue_time=10)
    b.start()
    call = asyncio.ensure_future(b.process(1))
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualClockLoop)
    await until(lambda: loop.timers() == 1)  # its deadline's
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert testing.idle(b) == [] and b.stats.queued == 0
    await b.stop()


async def test_a_hold_arms_no_timer_while_nothing_waits() -> None:
    b = Recording(max_queue_time=0, max_hold_time=5.0, delay=0.001)
    await asyncio.gather(*(b.process(i) for i in range(3)))  # three answered: a hold may wait for them for 5 s
    assert testing.idle(b) == []  # but nothing waits: nothing to hold, no wake-up


async def test_independent_arrivals_keep_the_hold_off_and_a_closed_loop_turns_it_on() -> None:
    # Items arriving at a steady pace, whatever the answers, keep coming while each batch runs: its batches never
    # hold all their callers, and the hold stays off (but for one probe, for the first cohort of four or more: the
    # next would come a second later, and the stream lasts less).
    b = Recording(max_queue_time=0, max_hold_time=0.05, delay=0.1)
    calls = []
    for i in range(60):
        calls.append(asyncio.ensure_future(b.process(i)))
        await asyncio.sleep(0.013)  # a steady stream, never waiting for answers
    await asyncio.gather(*calls)
    ends = [start + 0.1 for start in b.started_at]
    late = [start - end for start, end in zip(b.started_at[1:], ends[:-1], strict=True) if start > end + 1e-9]
    assert len(late) <= 1 and max(late, default=0) <= 0.05 + 1e-9
    # A closed loop that follows: its first batch holds all its callers (nothing arrives while it runs), and the
    # hold is on.
    b.batches.clear()
    await clients(b, 8, 10, think=0.005, spread=0.002)
    assert [len(x) for x in b.batches] == [8] * 10
    await b.stop()


async def test_a_probe_gathers_a_closed_loop_that_split_but_not_before_the_next_probe() -> None:
    # Eight clients that start one after another split into cohorts that alternate: no batch holds all its callers,
    # and the hold is off. A probe holds a cohort's slot once, at most every second: the first went to a lone burst
    # of callers who never came back, so the clients stay split until the next one, which gathers them; that batch
    # holds all eight, and the hold stays on.
    loop = asyncio.get_running_loop()
    b = Recording(max_queue_time=0, max_hold_time=0.05, delay=0.1)
    assert await asyncio.gather(*(b.process(i) for i in range(4))) == [0, 2, 4, 6]  # the probe's cohort
    probed_at = loop.time()  # 0.1; nobody comes back: the probe is spent

    async def late_client(c: int) -> None:
        await asyncio.sleep(0.05 if c % 2 else 0)  # the odd ones 0.05 later
        for r in range(40):
            await b.process(c * 1000 + r)
            await asyncio.sleep(0.005)

    await asyncio.gather(*(late_client(c) for c in range(8)))
    sizes = [len(x) for x in b.batches][1:]
    merged = [start for start, size in zip(b.started_at[1:], sizes, strict=True) if size == 8]
    assert sizes[:3] == [4, 4, 4]  # split
    assert merged and merged[0] >= probed_at + 1.0  # gathered by the next probe, not before
    assert sizes[-11:-1] == [8] * 10  # and kept together (the last batch: the clients that had a round left)
    await b.stop()


@both_paths
async def test_a_hold_adds_no_wait_for_a_lone_client(cls: type[Recording]) -> None:
    b = cls(max_queue_time=0, max_hold_time=1.0, delay=0.1)
    latencies = await clients(b, 1, 5, think=0.3)
    assert latencies == [pytest.approx(0.1)] * 5  # each request goes as it comes: the one caller owed is back
    await b.stop()


@both_paths
async def test_a_hold_ends_after_max_hold_time_when_the_callers_do_not_come_back(cls: type[Recording]) -> None:
    b = cls(max_queue_time=0, max_hold_time=0.05, delay=1.0)
    first = [asyncio.ensure_future(b.process(i)) for i in range(4)]  # four callers: a probe may hold for them
    await asyncio.sleep(0.5)
    waiting = asyncio.ensure_future(b.process(9))  # arrives while the first batch runs; no caller comes back
    assert await asyncio.gather(*first, waiting) == [0, 2, 4, 6, 18]
    assert b.started_at == pytest.approx([0, 1.05])  # the slot freed at 1.0, held 0.05 for the callers answered
    await b.stop()


@both_paths
async def test_a_hold_ends_once_its_lane_is_quiet_for_half_the_time_its_batch_took(cls: type[Recording]) -> None:
    # Rule: callers that come back together come back close together. A probe holds the slot for the four callers
    # a 0.1 s batch answered (max_hold_time 1 s); three come back 0.01 apart, the fourth never does. Once the lane
    # has had no arrival for 0.05 (half the time that batch took), the three go: at 0.18, not at 1.1.
    b = cls(max_queue_time=0, max_hold_time=1.0, delay=0.1)
    assert await asyncio.gather(*(b.process(c) for c in range(4))) == [0, 2, 4, 6]  # answered at 0.1: four owed
    back = []
    for c in range(3):
        await asyncio.sleep(0.01)
        back.append(asyncio.ensure_future(b.process(c)))  # at 0.11, 0.12, 0.13
    assert await asyncio.gather(*back) == [0, 2, 4]
    assert [len(x) for x in b.batches] == [4, 3] and b.started_at == pytest.approx([0, 0.18])
    assert b.stats.held == 1  # the hold kept that batch back
    await b.stop()


@both_paths
async def test_a_hold_waits_on_while_its_callers_keep_coming_back(cls: type[Recording]) -> None:
    # The quiet gap runs from the latest arrival: callers back 0.04 apart (under the 0.05) keep the hold, and the
    # four go together once the last is back, 0.26 after the batch began, far past 0.05 after its end.
    b = cls(max_queue_time=0, max_hold_time=1.0, delay=0.1)
    assert await asyncio.gather(*(b.process(c) for c in range(4))) == [0, 2, 4, 6]
    back = []
    for c in range(4):
        await asyncio.sleep(0.04)
        back.append(asyncio.ensure_future(b.process(c)))  # at 0.14, 0.18, 0.22, 0.26
    assert await asyncio.gather(*back) == [0, 2, 4, 6]
    assert [len(x) for x in b.batches] == [4, 4] and b.started_at == pytest.approx([0, 0.26])
    await b.stop()


@both_paths
async def test_the_first_caller_back_after_a_quiet_gap_waits_at_most_that_gap_for_others(cls: type[Recording]) -> None:
    # Nobody back for 0.2 (longer than the gap): the slot is free and nothing waits, so nothing is kept. The first
    # caller back waits at most the gap, 0.05, for the three others, and goes alone at 0.35: the hold bounds a wait
    # by the batch's own time, not by max_hold_time.
    b = cls(max_queue_time=0, max_hold_time=1.0, delay=0.1)
    assert await asyncio.gather(*(b.process(c) for c in range(4))) == [0, 2, 4, 6]
    await asyncio.sleep(0.2)
    assert await b.process(7) == 14
    assert b.started_at == pytest.approx([0, 0.35])
    await b.stop()


async def test_a_failed_batch_counts_each_call_it_resolved_for_the_hold() -> None:
    # A batch of four calls (two process_many of two items, two single items) fails: the four callers are answered
    # (with its error), and a probe holds the freed slot for the four, as after a batch that succeeded.
    def answer(batch: list[int]) -> list[int]:
        if 0 in batch:
            raise RuntimeError("the model failed")
        return [x * 2 for x in batch]

    b = Recording(max_queue_time=0, max_hold_time=0.05, delay=1.0, answer=answer)
    first = [
        asyncio.ensure_future(b.process_many([0, 1])),
        asyncio.ensure_future(b.process_many([2, 3])),
        asyncio.ensure_future(b.process(4)),
        asyncio.ensure_future(b.process(5)),
    ]
    await asyncio.sleep(0.5)
    waiting = asyncio.ensure_future(b.process(9))  # arrives while the first batch runs; nobody comes back
    outcomes = await asyncio.gather(*first, return_exceptions=True)
    assert [type(o) for o in outcomes] == [RuntimeError] * 4
    assert await waiting == 18
    assert b.started_at == pytest.approx([0, 1.05])  # held 0.05 for the four calls answered, not three or none
    await b.stop()


@both_paths
async def test_a_hold_that_ended_is_not_taken_up_again_before_the_next_batch(cls: type[Recording]) -> None:
    b = cls(max_queue_time=0.5, max_hold_time=0.05, delay=1.0)
    first = [asyncio.ensure_future(b.process(i)) for i in range(4)]  # go at 0.5, end at 1.5; never come back
    await asyncio.sleep(1.4)
    late = asyncio.ensure_future(b.process(9))  # its own deadline: 1.9
    assert await asyncio.gather(*first, late) == [0, 2, 4, 6, 18]
    # The slot freed at 1.5 is held for the first callers until 1.55; then the item waits for its own deadline,
    # and goes at 1.9: the hold that ended is over, not started again.
    assert b.started_at == pytest.approx([0.5, 1.9])
    await b.stop()


@both_paths
async def test_a_hold_ends_once_as_many_items_are_back_as_callers_owed_even_in_one_call(cls: type[Recording]) -> None:
    b = cls(max_queue_time=0, max_hold_time=1.0, delay=0.1)
    assert await asyncio.gather(*(b.process(c) for c in range(4))) == [0, 2, 4, 6]  # answered at 0.1: four owed
    await asyncio.sleep(0.01)
    back = asyncio.ensure_future(b.process(0))  # one back at 0.11: the slot is held for the three others
    await asyncio.sleep(0.01)
    assert await b.process_many([5, 6, 7]) == [10, 12, 14]  # three more items at 0.12: as many as were owed
    assert await back == 0
    assert [len(x) for x in b.batches] == [4, 4] and b.started_at == pytest.approx([0, 0.12])
    await b.stop()


@both_paths
async def test_a_hold_ends_when_a_caller_waits_for_room(cls: type[Recording]) -> None:
    b = cls(max_queue_time=0, max_hold_time=1.0, delay=0.1, wait_when_full=True)
    assert await asyncio.gather(*(b.process(c) for c in range(4))) == [0, 2, 4, 6]  # answered at 0.1: four owed
    b.max_queue_size = 1
    await asyncio.sleep(0.01)
    back = [asyncio.ensure_future(b.process(0))]  # 0.11: queued; the slot is held for the others
    await asyncio.sleep(0.01)
    back.append(asyncio.ensure_future(b.process(1)))  # 0.12: back, but the queue is full: the batch goes, for room
    assert await asyncio.gather(*back) == [0, 2]
    assert b.batches == [[0, 1, 2, 3], [0], [1]] and b.started_at[:2] == pytest.approx([0, 0.12])
    await b.stop()


async def test_a_batch_sent_ends_the_hold_and_the_next_caller_on_a_free_slot_goes_at_once() -> None:
    b = Recording(max_queue_time=0, max_hold_time=0.05, delay=1.0, concurrency=2)

    async def back_once(c: int) -> None:
        await b.process(c)
        if c == 0:  # back at 1.01; the three others never come back
            await asyncio.sleep(0.01)
            await b.process(c)

    calls = asyncio.gather(*(back_once(c) for c in range(4)))
    await asyncio.sleep(1.2)
    assert await b.process(9) == 18  # a new caller at 1.2, while [0] runs in one slot and the other is free
    await calls
    # The hold for the callers who never came back ended 0.05 after their batch, and [0] went; the next arrival on
    # a free slot does not start it again.
    assert b.batches == [[0, 1, 2, 3], [0], [9]] and b.started_at == pytest.approx([0, 1.05, 1.2])
    await b.stop()


@both_paths
async def test_a_stop_does_not_wait_for_a_hold(cls: type[Recording]) -> None:
    loop = asyncio.get_running_loop()
    b = cls(max_queue_time=0, max_hold_time=10.0, delay=1.0)
    calls = [asyncio.ensure_future(b.process(i)) for i in range(4)]
    await asyncio.sleep(0.5)
    calls.append(asyncio.ensure_future(b.process(9)))
    await asyncio.sleep(0.6)  # the first batch has ended: the slot is held for its callers
    assert len(b.batches) == 1
    await b.stop()
    assert loop.time() == pytest.approx(2.1) and b.started_at == pytest.approx([0, 1.1])
    assert [c.result() for c in calls] == [0, 2, 4, 6, 18]
