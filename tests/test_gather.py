"""The gather (``max_gather_time``) on the loop's virtual clock.

The rule (``_policy.gather``): while a lane's items arrive independently of their answers (during its recent
batches, at least half the items its rate would bring arrived), a batch a slot is free for waits for more, from its
oldest item's arrival, at most ``max_gather_time`` and at most as long as the lane's recent batches took, if the
lane's rate now makes an arrival within that time more likely than not. Proved here: independent arrivals gather
(fewer, larger batches, each wait within its bound); a closed loop never waits, of one caller or of many; a low rate
and a lone caller after an idle spell never wait; a stop, a caller waiting for room, a setting turned off live and a
caller who leaves end a gather at once; an idle batcher keeps no timer. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from async_batcher import _policy
from tests.batchers import Recording
from tests.test_hold_attacks import clean, idle_without_timer

pytestmark = pytest.mark.virtual_time

EPS = 1e-9
D = 0.002  # each batch's time: the model's fixed cost


class Logged(Recording):
    """Records, beside each batch, when each of its items arrived (``arrived[item]``) and when it ended."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(delay=D, **kwargs)
        self.arrived: dict[int, float] = {}
        self.ended: list[float] = []

    async def process_batch(self, batch: list[int]) -> Any:
        try:
            return await super().process_batch(batch)
        finally:
            self.ended.append(asyncio.get_running_loop().time())

    async def call(self, item: int) -> float:
        """Submit ``item``; its latency on the loop's clock."""
        loop = asyncio.get_running_loop()
        self.arrived[item] = loop.time()
        assert await self.process(item) == item * 2
        return loop.time() - self.arrived[item]


async def poisson(b: Logged, rate: float, n: int, seed: int = 1, first: int = 0) -> list[float]:
    """``n`` independent callers arriving at ``rate`` a second (exponential gaps); their latencies."""
    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        tasks.append(asyncio.ensure_future(b.call(first + i)))
        await asyncio.sleep(rng.expovariate(rate))
    return list(await asyncio.wait_for(asyncio.gather(*tasks), 60))


def waits(b: Logged) -> list[float]:
    """For each batch whose slot was free when its oldest item arrived: how long that item waited for it."""
    out = []
    for i, (batch, start) in enumerate(zip(b.batches, b.started_at, strict=True)):
        oldest = min(b.arrived[x] for x in batch)
        free_since = b.ended[i - 1] if i else -1.0
        out.append(start - max(oldest, free_since))
    return out


async def test_independent_arrivals_gather_within_the_bound() -> None:
    # Poisson arrivals at 800/s, each batch 2 ms: 1.6 items a batch's time, 0.8 within the gather's 1 ms (an arrival
    # within it more likely than not: 1 - exp(-0.8) = 0.55).
    b = Logged(max_queue_time=0, max_gather_time=0.001)
    await poisson(b, 800, 600)
    w = waits(b)
    assert max(w) <= 0.001 + EPS, max(w)  # never beyond max_gather_time from the oldest item (slot free)
    assert sum(1 for x in w if x > EPS) >= 50, "the gather never waited"
    assert b.stats.gathered == sum(1 for x in w if x > EPS)  # each batch it kept back, counted once
    greedy = Logged(max_queue_time=0)
    await poisson(greedy, 800, 600)
    assert max(waits(greedy)) <= EPS
    assert len(b.batches) < 0.9 * len(greedy.batches), (len(b.batches), len(greedy.batches))
    assert sorted(b.sent) == list(range(600))
    idle_without_timer(b)
    clean(b)
    await b.stop()
    await greedy.stop()


async def test_the_wait_is_no_longer_than_the_batches_take() -> None:
    # max_gather_time=0.1 but batches take 2 ms: no item waits for a batch more than 2 ms past a free slot.
    b = Logged(max_queue_time=0, max_gather_time=0.1)
    await poisson(b, 400, 400)
    w = waits(b)
    assert max(w) <= D + EPS, max(w)
    assert any(x > 0.001 for x in w)
    await b.stop()


@pytest.mark.parametrize("callers", [1, 8])
async def test_a_closed_loop_never_gathers(callers: int) -> None:
    # Each caller sends its next item once it has its answer: nothing arrives while a batch runs, so a wait would
    # only delay them. Every latency is exactly one batch's time, though the rate (500/s and more) would pass.
    b = Logged(max_queue_time=0, max_gather_time=0.005)
    lat: list[float] = []

    async def client(c: int) -> None:
        for r in range(200):
            lat.append(await b.call(c * 1000 + r))

    await asyncio.wait_for(asyncio.gather(*(client(c) for c in range(callers))), 60)
    assert max(lat) <= D + EPS, max(lat)
    assert b.stats.gathered == 0
    assert b._run.queue.lane0.expected > 0  # the lane had the evidence, and judged it a closed loop
    idle_without_timer(b)
    await b.stop()


async def test_a_low_rate_never_gathers() -> None:
    # 100/s, a 2 ms wait: 0.2 items within it, an arrival unlikely: every item goes at once (though its arrivals
    # are independent) the moment the slot is free.
    b = Logged(max_queue_time=0, max_gather_time=0.002)
    await poisson(b, 100, 300)
    assert max(waits(b)) <= EPS, max(waits(b))
    assert b.stats.gathered == 0
    assert b._run.queue.lane0.during >= _policy.GATHER_SHARE * b._run.queue.lane0.expected > 0
    await b.stop()


async def test_a_lone_caller_after_an_idle_spell_goes_at_once() -> None:
    b = Logged(max_queue_time=0, max_gather_time=0.001)
    await poisson(b, 800, 300)
    assert any(x > EPS for x in waits(b))  # it was gathering
    await asyncio.sleep(0.5)
    assert await b.call(10_000) == pytest.approx(D)
    idle_without_timer(b)
    await b.stop()


async def test_max_queue_time_longer_than_the_gather_wins() -> None:
    # The gather only ever lengthens a wait: with max_queue_time above it, every batch waits max_queue_time.
    b = Logged(max_queue_time=0.003, max_gather_time=0.001, max_batch_size=1000)
    await poisson(b, 800, 200)
    for batch, start in zip(b.batches, b.started_at, strict=True):
        assert start >= min(b.arrived[x] for x in batch) + 0.003 - EPS
    assert b.stats.gathered == 0  # max_queue_time kept them: the gather added nothing
    await b.stop()


async def gathering(b: Logged) -> asyncio.Future[float]:
    """Traffic that gathers, then one item left gathering (its wait's timer armed); its caller's task."""
    await poisson(b, 800, 300)
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(b.call(20_000))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert b._run.queue.waiting == 1 and b._run.timer is not None and b._run.in_flight == 0
    assert _policy.gather(b, b._run, b._run.queue.lane0, loop.time()) > 0
    return task


async def test_a_stop_ends_a_gather_at_once() -> None:
    loop = asyncio.get_running_loop()
    b = Logged(max_queue_time=0, max_gather_time=0.001)
    task = await gathering(b)
    t0 = loop.time()
    await asyncio.wait_for(b.stop(), 1)
    assert await task == pytest.approx(D)  # sent at the stop, not after the wait
    assert b.started_at[-1] == t0
    clean(b)


async def test_turning_the_setting_off_live_sends_a_gathering_batch() -> None:
    loop = asyncio.get_running_loop()
    b = Logged(max_queue_time=0, max_gather_time=0.001)
    task = await gathering(b)
    t0 = loop.time()
    b.max_gather_time = 0
    assert await asyncio.wait_for(task, 1) == pytest.approx(D)
    assert b.started_at[-1] == t0
    idle_without_timer(b)
    await b.stop()


async def test_a_caller_who_leaves_a_gather_leaves_no_timer() -> None:
    b = Logged(max_queue_time=0, max_gather_time=0.001)
    task = await gathering(b)
    n = len(b.batches)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.01)
    assert len(b.batches) == n and 20_000 not in b.sent  # withdrawn: never sent
    assert b.stats.gathered == sum(1 for x in waits(b) if x > EPS)  # the withdrawn item's wait is not a batch's
    idle_without_timer(b)
    assert b.stats.cancelled == 1
    await b.stop()


async def test_a_caller_waiting_for_room_ends_a_gather() -> None:
    # A full queue: the batch the gather would keep back makes room, so it goes the moment a caller waits for room.
    b = Logged(max_queue_time=0, max_gather_time=0.001, max_queue_size=2, wait_when_full=True)
    task = await gathering(b)
    loop = asyncio.get_running_loop()
    second = asyncio.ensure_future(b.call(20_001))
    await asyncio.sleep(0)
    assert b._run.queue.waiting == 2 and b._run.in_flight == 0  # full, still gathering
    t0 = loop.time()
    third = asyncio.ensure_future(b.call(20_002))  # waits for room
    assert await asyncio.wait_for(task, 1) == pytest.approx(D)
    assert b.batches[-1] == [20_000, 20_001] and b.started_at[-1] == t0
    await asyncio.wait_for(asyncio.gather(second, third), 1)
    clean(b)
    await b.stop()


@pytest.mark.parametrize("value", [-0.001, float("nan"), float("inf"), "0.001", None])
def test_bad_max_gather_time_is_refused_by_name(value: Any) -> None:
    with pytest.raises((ValueError, TypeError), match="max_gather_time"):
        Recording(max_gather_time=value)
    b = Recording(max_gather_time=0.001)
    with pytest.raises((ValueError, TypeError), match="max_gather_time"):
        b.max_gather_time = value
    assert b.max_gather_time == 0.001
