"""The adaptive wait: its cost model, its target size, and the batcher under it (on virtual time)."""

from __future__ import annotations

import asyncio
import math
import random
from typing import Any

import pytest

from async_batcher import AsyncBatcher
from async_batcher.adaptive import AdaptiveWait
from tests.batchers import Recording


def test_the_cost_model_is_fitted_from_observed_batches() -> None:
    policy = AdaptiveWait(0.05)
    assert policy.model() == (0.0, 0.0)
    for n in [1, 8, 32, 4, 64, 16] * 5:
        policy.observe(n, 0.005 + 0.0001 * n)
    a, b = policy.model()
    assert a == pytest.approx(0.0001, rel=1e-6) and b == pytest.approx(0.005, rel=1e-6)


def test_batches_of_one_size_charge_everything_per_batch() -> None:
    policy = AdaptiveWait(0.05)
    for _ in range(10):
        policy.observe(1, 0.004)
    assert policy.model() == pytest.approx((0.0, 0.004))


def test_a_free_slot_waits_for_the_size_that_keeps_up() -> None:
    policy = AdaptiveWait(0.05)
    for n in (1, 10, 100):
        policy.observe(n, 0.005 + 0.0001 * n)
    policy.rate = 1000.0
    # Batches formed while the slot is busy settle at n* = rate*b / (c - rate*a): no need to wait for them.
    assert policy.keeps_up_size(1) == pytest.approx(1000 * 0.005 / (1 - 1000 * 0.0001))
    assert policy.keeps_up_size(2) == pytest.approx(1000 * 0.005 / (2 - 1000 * 0.0001))
    assert policy.target_size(1) == policy.keeps_up_size(1)
    policy.rate = 20_000.0  # more than even infinite batches carry on one slot: only full batches
    assert policy.keeps_up_size(1) == math.inf and policy.target_size(1) == math.inf
    assert policy.keeps_up_size(-1) == 0.0 and policy.target_size(-1) == 0.0


def test_a_batch_waits_at_most_its_fixed_cost_and_never_past_the_budget() -> None:
    policy = AdaptiveWait(0.05)
    for n in (1, 10, 100):
        policy.observe(n, 0.005 + 0.0001 * n)
    assert policy.send_by(10.0, 20) == pytest.approx(10.005)  # b = 5 ms: waiting longer would not pay
    policy = AdaptiveWait(0.05)
    for n in (1, 10, 100):
        policy.observe(n, 0.030 + 0.0001 * n)
    assert policy.send_by(10.0, 100) == pytest.approx(10.0 + 0.05 - 0.040)  # the budget binds first


def test_the_arrival_rate_follows_the_submissions() -> None:
    policy = AdaptiveWait(0.05)
    submitted = 0
    for step in range(1, 2001):  # 2 s of 500 items/s, noted every millisecond
        submitted += 1 if step % 2 == 0 else 0
        policy.note_arrivals(submitted, step * 0.001)
    assert policy.rate == pytest.approx(500, rel=0.05)


@pytest.mark.parametrize("bad", [0, -1, float("inf"), float("nan"), "0.05", True])
def test_a_bad_budget_is_refused_naming_it(bad: Any) -> None:
    with pytest.raises(ValueError, match="max_latency") as info:
        Recording(max_latency=bad)
    assert repr(bad) in str(info.value)


class Model(AsyncBatcher[int, int]):
    """A batch costs 5 ms + 0.05 ms per item, one batch at a time."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sizes: list[int] = []

    async def process_batch(self, batch: list[int]) -> list[int]:
        self.sizes.append(len(batch))
        await asyncio.sleep(0.005 + 0.00005 * len(batch))
        return batch


async def open_loop(batcher: Model, rate: float, seconds: float) -> list[float]:
    """Poisson arrivals at ``rate`` per second; returns each item's latency."""
    loop = asyncio.get_running_loop()
    rng = random.Random(7)
    latencies: list[float] = []

    async def one(i: int) -> None:
        start = loop.time()
        assert await batcher.process(i) == i
        latencies.append(loop.time() - start)

    calls = []
    t = 0.0
    i = 0
    while t < seconds:
        gap = rng.expovariate(rate)
        t += gap
        await asyncio.sleep(gap)
        calls.append(asyncio.ensure_future(one(i)))
        i += 1
    await asyncio.gather(*calls)
    return sorted(latencies)


@pytest.mark.virtual_time
async def test_at_low_load_the_adaptive_wait_is_no_wait() -> None:
    fixed = Model(max_queue_time=0, max_batch_size=256)
    zero_wait = await open_loop(fixed, rate=20, seconds=5)
    await fixed.stop()
    b = Model(max_latency=0.05, max_batch_size=256)
    latencies = await open_loop(b, rate=20, seconds=5)
    assert latencies == pytest.approx(zero_wait)  # the same arrivals, the same latencies
    await b.stop()


@pytest.mark.virtual_time
async def test_under_load_batches_grow_and_the_budget_holds() -> None:
    b = Model(max_latency=0.05, max_batch_size=256)
    latencies = await open_loop(b, rate=12_000, seconds=2)
    state = b.adaptive_state
    assert state is not None
    assert state.per_batch == pytest.approx(0.005, rel=0.05) and state.per_item == pytest.approx(0.00005, rel=0.05)
    assert state.arrival_rate == pytest.approx(12_000, rel=0.15)
    assert sum(b.sizes) / len(b.sizes) > 50
    p99 = latencies[int(0.99 * len(latencies))]
    assert p99 <= 0.05
    await b.stop()


@pytest.mark.virtual_time
@pytest.mark.parametrize(("preferred", "full"), [((), 32), ((8, 16), 16)])
async def test_when_no_batch_size_keeps_up_a_free_slot_waits_for_a_full_batch(
    preferred: tuple[int, ...], full: int
) -> None:
    class Slow(Model):  # 1 ms per item: one slot carries at most 1 000 items a second, whatever the batch size
        async def process_batch(self, batch: list[int]) -> list[int]:
            state = self.adaptive_state
            targets.append(math.nan if state is None else state.target_size)
            self.sizes.append(len(batch))
            await asyncio.sleep(0.001 + 0.001 * len(batch))
            return batch

    targets: list[float] = []  # what it aimed for as each batch went
    b = Slow(max_latency=10.0, max_batch_size=32, preferred_batch_sizes=preferred)
    await open_loop(b, rate=2_000, seconds=1)  # every caller gets its own item back (open_loop checks)
    overloaded = [size for size, target in zip(b.sizes, targets, strict=True) if target == math.inf]
    assert len(overloaded) > 20
    assert set(overloaded) == {full}  # the largest batch it may send
    await b.stop()


@pytest.mark.virtual_time
async def test_a_batch_that_does_not_fill_goes_after_its_fixed_cost() -> None:
    loop = asyncio.get_running_loop()

    class Costed(Recording):
        async def process_batch(self, batch: list[int]) -> Any:
            self.started_at.append(loop.time())
            await asyncio.sleep(0.004 + 0.0001 * len(batch))  # a batch of n costs 4 ms + 0.1 ms per item
            return [x * 2 for x in batch]

    b = Costed(max_latency=0.05, max_batch_size=100)
    for n in (1, 50, 100):  # it learns the cost from batches of three sizes
        await b.process_many(range(n))
    for budget in (0.05, 0.006):
        b.max_latency = budget
        await b.process_many(range(100))  # a burst: it believes more items arrive than a lone one
        state = b.adaptive_state
        assert state is not None
        assert (state.per_batch, state.per_item) == (pytest.approx(0.004), pytest.approx(0.0001))
        size = min(100, math.ceil(state.target_size))
        assert size > 1  # it waits for more than one
        arrival = loop.time()
        assert await b.process(1) == 2  # ...but only one comes
        # Sent once it has waited a batch's fixed cost (waiting longer would not pay), or sooner if the batch it
        # waits for could not end within the budget.
        expected = min(state.per_batch, budget - (state.per_item * size + state.per_batch))
        assert b.started_at[-1] - arrival == pytest.approx(expected, abs=1e-9)
    assert expected < 0.004  # the tight budget was the bound
    await b.stop()


async def test_max_latency_can_be_switched_on_and_off_live() -> None:
    b = Recording(max_queue_time=0)
    assert b.max_latency is None and b.adaptive_state is None
    b.max_latency = 0.02
    assert await asyncio.gather(*(b.process(i) for i in range(10))) == [i * 2 for i in range(10)]
    assert b.adaptive_state is not None and b.adaptive_state.observations >= 1
    b.max_latency = 0.03
    assert b.adaptive_state.observations >= 1  # what it learned is kept
    b.max_latency = None
    assert await b.process(3) == 6
    await b.stop()


@pytest.mark.virtual_time
@pytest.mark.parametrize(("target", "goes_at_once"), [(8.0, True), (8.5, False)])
async def test_with_preferred_sizes_the_smallest_that_reaches_the_target_goes_at_once(
    monkeypatch: pytest.MonkeyPatch, target: float, goes_at_once: bool
) -> None:
    loop = asyncio.get_running_loop()
    b = Recording(max_latency=10.0, max_batch_size=32, preferred_batch_sizes=(4, 8, 16), delay=0.004)
    await b.process_many(range(8))  # a first batch: a cost model of 4 ms per batch
    monkeypatch.setattr(AdaptiveWait, "target_size", lambda self, concurrency: target)
    arrival = loop.time()
    assert await asyncio.gather(*(b.process(i) for i in range(8))) == [i * 2 for i in range(8)]
    assert b.batches[-1] == list(range(8))
    # A target of exactly 8 is reached by 8 items: they go at once. Above it, the next preferred size (16) is the
    # one to wait for, and the 8 go when they have waited a batch's fixed cost.
    assert b.started_at[-1] - arrival == (0.0 if goes_at_once else pytest.approx(0.004))
    await b.stop()
