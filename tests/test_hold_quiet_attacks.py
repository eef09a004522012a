"""The hold's quiet end and the four turns under attack, on the loop's virtual clock.

The rules (``_policy.hold_until``, ``_dispatch.batch_ended``): a hold lets its items go once its lane has had no
arrival for half the time the batch it follows took (:data:`~async_batcher._policy.QUIET`), counted from that
batch's end or the newest arrival (over every priority level, withdrawn entries included), and never later than
``max_hold_time`` after that batch ended; a batch of the lane that ends during the hold, with callers or none,
moves neither; when a batch ends while items wait, the next forms ``_turns`` (4) turns of the loop later. Attacked
here: zero-time batches, batches that raise, callers that time out at the fifo's tail, priorities, two slots,
settings changed during a hold, stops during the turns and a restart, ``process_many`` across batches, and
random schedules checked against both bounds. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Hashable
from typing import Any

import pytest
from async_batcher._run import State

from async_batcher import BatcherStoppedError, _policy
from tests.batchers import Recording, stop_as
from tests.loops import VirtualClockLoop
from tests.test_hold_attacks import Keyed, clean, held, idle_without_timer

pytestmark = pytest.mark.virtual_time

EPS = 1e-9


async def settle(b: Any, within: float = 60.0) -> None:
    """Let the clock run (in steps of 1 ms) until nothing is queued, in flight or about to pump; bounded."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while b._run.queue.waiting or b._run.in_flight or b._run.pump_handle is not None:
        assert loop.time() < deadline, "never settled"
        await asyncio.sleep(0.001)


class Marked(Recording):
    """Two durations: a batch with item 100 in it takes ``marked`` seconds, any other ``delay``."""

    def __init__(self, *, marked: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.marked, self.usual = marked, self.delay

    async def process_batch(self, batch: list[int]) -> Any:
        self.delay = self.marked if 100 in batch else self.usual  # (read before the batch's first await)
        return await super().process_batch(batch)


both_paths = pytest.mark.parametrize("cls", [Recording, Keyed], ids=["plain", "keyed"])


@both_paths
async def test_zero_time_batches_never_hold(cls: type[Recording]) -> None:
    # delay=0: the batch took no time, so the quiet gap is 0: nobody ever waits (no spin, no hang, no timer left).
    loop = asyncio.get_running_loop()
    b = cls(max_queue_time=0, max_hold_time=1.0, delay=0)
    lat: list[float] = []

    async def client(c: int) -> None:
        for r in range(20):
            sent = loop.time()
            await b.process(c * 100 + r)
            lat.append(loop.time() - sent)
            await asyncio.sleep(0.001 * (c % 3))

    await asyncio.wait_for(asyncio.gather(*(client(c) for c in range(6))), 10)
    assert max(lat) == 0.0, max(lat)
    await settle(b)
    idle_without_timer(b)
    clean(b)
    await b.stop()


@both_paths
async def test_a_raising_zero_time_batch_with_waiting_items_does_not_hold(cls: type[Recording]) -> None:
    def answer(batch: list[int]) -> list[int]:
        if 0 in batch:
            raise RuntimeError("boom")
        return [x * 2 for x in batch]

    loop = asyncio.get_running_loop()
    b = cls(max_queue_time=0, max_hold_time=5.0, delay=0, answer=answer, max_batch_size=4)
    calls = [asyncio.ensure_future(b.process(i)) for i in range(9)]
    out = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 10)
    assert [isinstance(o, RuntimeError) for o in out] == [True] * 4 + [False] * 5
    assert loop.time() == 0.0
    await b.stop()


@both_paths
async def test_withdrawn_arrivals_extend_a_hold_only_up_to_max_hold_time(cls: type[Recording]) -> None:
    # 100 callers answered at 0.1 (0.1 s batch: quiet gap 0.05, max_hold_time 0.5). One caller back at 0.11, then
    # every 0.04 a caller arrives and times out 0.001 later (a withdrawn entry at the fifo tail). Those are
    # arrivals; the hold may last while they come, but never past 0.6.
    loop = asyncio.get_running_loop()
    b = cls(max_queue_time=0, max_hold_time=0.5, delay=0.1)
    await asyncio.wait_for(asyncio.gather(*(b.process(i) for i in range(100))), 5)
    await asyncio.sleep(0.01)
    x = asyncio.ensure_future(b.process(7))
    await asyncio.sleep(0)
    assert held(b)
    flickers = []
    while loop.time() < 2.0:
        await asyncio.sleep(0.04)
        flickers.append(asyncio.ensure_future(b.process(1000, timeout=0.001)))
    assert x.done() and x.result() == 14
    res = await asyncio.wait_for(asyncio.gather(*flickers, return_exceptions=True), 5)
    assert all(isinstance(r, TimeoutError | int) for r in res)
    assert b.batches[1][0] == 7 and b.started_at[1] <= 0.6 + EPS, b.started_at[1]
    await settle(b)
    idle_without_timer(b)
    clean(b)
    await b.stop()


async def test_newest_is_over_all_priority_levels() -> None:
    # Held for four; one back at 0.11 at priority 5, one at 0.14 at priority 0: the quiet gap runs from 0.14, the
    # two go together at 0.19 (not 0.16, by the older level's tail only; never past 0.19).
    b = Recording(max_queue_time=0, max_hold_time=1.0, delay=0.1)
    await asyncio.gather(*(b.process(i) for i in range(4)))
    await asyncio.sleep(0.01)
    low = asyncio.ensure_future(b.process(1, priority=5))
    await asyncio.sleep(0.03)
    high = asyncio.ensure_future(b.process(2, priority=0))
    assert await asyncio.wait_for(asyncio.gather(low, high), 5) == [2, 4]
    assert b.batches[1] == [2, 1] and b.started_at[1] == pytest.approx(0.19)
    await b.stop()


async def test_a_callerless_batch_ending_during_a_hold_does_not_prolong_it() -> None:
    # Two slots. Batch C (item 100, 0.15 s) and batch A (four items, 0.1 s) both start at 0. C's caller leaves at
    # 0.05: C answers nobody. A ends at 0.1: a probe holds the free slot for its four (quiet gap 0.05). X arrives at
    # 0.11. C ends at 0.15, answering nobody. Rule: X goes once the lane had no arrival for half of A's time,
    # from max(A's end, 0.11) = 0.16. C neither adds callers nor is the batch the hold follows.
    b = Marked(marked=0.15, delay=0.1, max_queue_time=0, max_hold_time=1.0, concurrency=2)
    c = asyncio.ensure_future(b.process(100))
    await asyncio.sleep(0)
    a = [asyncio.ensure_future(b.process(i)) for i in range(4)]
    await asyncio.sleep(0.05)
    assert len(b.batches) == 2
    c.cancel()
    assert await asyncio.wait_for(asyncio.gather(*a), 5) == [0, 2, 4, 6]
    await asyncio.sleep(0.01)
    x = asyncio.ensure_future(b.process(9))
    await asyncio.sleep(0)
    assert held(b)
    assert await asyncio.wait_for(x, 5) == 18
    with pytest.raises(asyncio.CancelledError):
        await c
    assert b.started_at[2] <= 0.16 + EPS, f"X held until {b.started_at[2]} (quiet bound 0.16)"
    await b.stop()


@both_paths
async def test_max_hold_time_raised_during_a_hold_does_not_outlast_the_quiet_gap(cls: type[Recording]) -> None:
    b = cls(max_queue_time=0, max_hold_time=0.05, delay=0.1)
    await asyncio.gather(*(b.process(i) for i in range(4)))
    await asyncio.sleep(0.01)
    x = asyncio.ensure_future(b.process(3))
    await asyncio.sleep(0)
    assert held(b)
    b.max_hold_time = 100.0
    assert await asyncio.wait_for(x, 5) == 6
    assert b.started_at[1] == pytest.approx(0.16)
    await b.stop()


@both_paths
async def test_max_batch_size_lowered_to_the_waiting_count_during_a_hold_sends_at_once(cls: type[Recording]) -> None:
    b = cls(max_queue_time=0, max_hold_time=5.0, delay=0.1)
    await asyncio.gather(*(b.process(i) for i in range(8)))
    await asyncio.sleep(0.01)
    xs = [asyncio.ensure_future(b.process(i)) for i in range(2)]
    await asyncio.sleep(0.001)
    assert held(b)
    b.max_batch_size = 2
    assert await asyncio.wait_for(asyncio.gather(*xs), 5) == [0, 2]
    assert b.started_at[1] == pytest.approx(0.111)
    await b.stop()


@both_paths
@pytest.mark.parametrize("how", ["drain", "force", "timeout"])
@pytest.mark.parametrize("turns", [0, 1, 2, 3])
async def test_a_stop_during_the_turns_then_a_restart(cls: type[Recording], how: str, turns: int) -> None:
    # A batch ends with items waiting: the next forms 4 turns later. The caller it answered stops the batcher
    # `turns` loop turns later (its continuation runs before the first turn); every caller resolves once; no timer;
    # then a restart serves at once, with no leftover hold or turn from the old run. (One first caller: no probe.)
    loop = asyncio.get_running_loop()
    b = cls(max_queue_time=0, max_hold_time=5.0, delay=0.1)
    seen: list[Any] = []

    async def first_then_stop() -> None:
        assert await b.process(0) == 0
        for _ in range(turns):
            await asyncio.sleep(0)
        seen.append((b._run.pump_handle is not None, b._run.queue.waiting, b._run.in_flight))
        await stop_as(b, how, timeout=0.05)

    first = asyncio.ensure_future(first_then_stop())
    await asyncio.sleep(0)
    late = [asyncio.ensure_future(b.process(10 + i)) for i in range(2)]  # queued behind the running batch
    began = 0.1
    await asyncio.wait_for(first, 5)
    assert seen == [(True, 2, 0)], seen  # stopped during the turns
    out = await asyncio.wait_for(asyncio.gather(*late, return_exceptions=True), 5)
    if how == "drain":
        assert out == [20, 22] and loop.time() - began <= 0.1 + EPS
    elif how == "force":
        assert all(isinstance(o, BatcherStoppedError) for o in out), out
    else:
        assert all(isinstance(o, int | BatcherStoppedError) for o in out), out
    assert b._run.state is State.STOPPED and b._run.timer is None
    s = b.stats
    assert s.submitted == s.succeeded + s.failed + s.cancelled + s.timed_out
    b.start()
    sent = loop.time()
    assert await asyncio.wait_for(b.process(5), 5) == 10
    assert loop.time() - sent == pytest.approx(0.1)
    await settle(b)
    idle_without_timer(b)
    await b.stop()


async def test_process_many_spanning_batches_during_a_hold_is_bounded() -> None:
    # Held for four (quiet 0.05, hold 1.0): a process_many of 10 arrives at 0.11 with max_batch_size 4: the full
    # batches go at once; the last 2 may be held by the quiet gap, at most until 0.11 + 0.05 after the batch
    # before... but never past hold end, and all of it resolves.
    b = Recording(max_queue_time=0, max_hold_time=1.0, delay=0.1, max_batch_size=4)
    await asyncio.gather(*(b.process(i) for i in range(4)))
    await asyncio.sleep(0.01)
    res = await asyncio.wait_for(b.process_many(range(10)), 5)
    assert res == [2 * i for i in range(10)]
    assert [len(x) for x in b.batches[1:]] == [4, 4, 2]
    assert b.started_at[1] == pytest.approx(0.11)
    for end, start in zip([s + 0.1 for s in b.started_at[1:]], b.started_at[2:], strict=False):
        assert start <= end + 0.05 + EPS, b.started_at
    await settle(b)
    idle_without_timer(b)
    await b.stop()


class Varied(Recording):
    """Each batch takes a duration drawn from ``durations`` (0 included); items of 666 make the batch raise."""

    rng: random.Random

    def batch_key(self, item: int) -> Hashable:
        return item % self.keys

    async def process_batch(self, batch: list[int]) -> Any:
        loop = asyncio.get_running_loop()
        start = loop.time()
        self.batches.append(list(batch))
        self.started_at.append(start)
        try:
            await asyncio.sleep(self.rng.choice([0.0, 0.0, 0.003, 0.02, 0.1, 0.3]))
            if any(v % 97 == 0 for v in batch):
                raise RuntimeError("bad batch")
            return [v * 2 for v in batch]
        finally:
            self.spans.append((start, loop.time(), batch[0] % self.keys, list(batch)))


@pytest.mark.parametrize("seed", range(40))
async def test_random_holds_stay_within_both_bounds(seed: int) -> None:
    # One slot, one key, max_queue_time 0: a free slot with items waiting idles only for a hold. For each batch,
    # starting at s after the previous batch's end e (that batch ran r): s <= max(e + max_hold_time, the oldest
    # arrival in it) and s <= max(e, the latest arrival before s) + QUIET * r. Random durations (0 included),
    # batches that raise, process_many, timeouts, priorities, max_hold_time and max_batch_size; then idle.
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualClockLoop)
    rng = random.Random(seed)
    hold = rng.choice([0.01, 0.05, 0.2, 1.0])
    b = Varied(max_queue_time=0, max_hold_time=hold, max_batch_size=rng.choice([3, 8, -1]))
    b.rng, b.keys, b.spans = rng, 1, []
    arrivals: list[float] = []
    item_arrival: dict[int, float] = {}
    outcomes: list[Any] = []
    counter = iter(range(1, 10**6))

    async def client(c: int) -> None:
        for _ in range(rng.randint(5, 25)):
            kind = rng.random()
            n = next(counter)
            arrivals.append(loop.time())
            try:
                if kind < 0.15:
                    items = [next(counter) for _ in range(rng.randint(1, 6))]
                    for it in items:
                        item_arrival[it] = loop.time()
                    outcomes.append(await b.process_many(items, return_exceptions=True))
                elif kind < 0.3:
                    item_arrival[n] = loop.time()
                    outcomes.append(await b.process(n, timeout=rng.choice([0.001, 0.01, 0.05])))
                else:
                    item_arrival[n] = loop.time()
                    outcomes.append(await b.process(n, priority=rng.choice([0, 0, 1])))
            except (TimeoutError, RuntimeError) as exc:
                outcomes.append(exc)
            await asyncio.sleep(rng.choice([0.0, 0.0, 0.001, 0.004, 0.03, 0.2]))

    await asyncio.wait_for(asyncio.gather(*(client(c) for c in range(rng.randint(2, 10)))), 600)
    await settle(b)
    idle_without_timer(b)
    clean(b)
    jumps = loop.jumps
    await asyncio.sleep(50)
    assert loop.jumps == jumps + 1, "the idle batcher woke the loop"
    spans = sorted(b.spans)
    bad = []
    for (s0, e0, _, _), (s1, _, _, items) in itertools.pairwise(spans):
        r = e0 - s0
        oldest = min(item_arrival[v] for v in items)
        latest = max((a for a in arrivals if a <= s1), default=-1.0)
        if s1 > max(e0 + hold, oldest) + EPS:
            bad.append(("max_hold_time", e0, s1, hold))
        if s1 > max(e0, latest) + _policy.QUIET * r + EPS and s1 > oldest + EPS:
            bad.append(("quiet", e0, r, latest, s1))
    assert not bad, bad[:5]
    s = b.stats
    assert s.submitted == s.succeeded + s.failed + s.cancelled + s.timed_out
    await b.stop()


async def test_a_short_batch_ending_during_a_hold_does_not_cut_the_gap_for_the_long_batchs_callers() -> None:
    # Two slots. A (four items, 0.2 s) from 0 to 0.2: a probe holds for its four (gap 0.1). B (one item, 0.002 s)
    # starts at 0.199 and ends at 0.201, during the hold: it adds its caller. A's four come back 0.01 apart from
    # 0.21, well within A's gap: expected together, one batch. (The gap is taken from B's 0.002 s instead.)
    loop = asyncio.get_running_loop()
    b = Marked(marked=0.002, delay=0.2, max_queue_time=0, max_hold_time=1.0, concurrency=2)
    a = [asyncio.ensure_future(b.process(i)) for i in range(4)]
    await asyncio.sleep(0.199)
    bb = asyncio.ensure_future(b.process(100))
    assert await asyncio.wait_for(asyncio.gather(*a, bb), 5) == [0, 2, 4, 6, 200]
    back = []
    for i in range(4):
        await asyncio.sleep(max(0.0, 0.21 + 0.01 * i - loop.time()))
        back.append(asyncio.ensure_future(b.process(i)))
    assert await asyncio.wait_for(asyncio.gather(*back), 5) == [0, 2, 4, 6]
    assert [len(x) for x in b.batches[2:]] == [4], (b.batches, b.started_at)
    await b.stop()
