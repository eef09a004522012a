"""``refuse_late=True`` (issue 46): an item predicted to be answered after its deadline is refused at admission."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from typing import Any

import pytest

from async_batcher import AsyncBatcher, LateRefusalError, QueueFullException, RefuseLate
from tests.batchers import idle_and_clean, until

pytestmark = pytest.mark.virtual_time

# Batches measured before anything is refused (RefuseLate's warmup, which refuse_late=True takes).
WARMUP = RefuseLate().warmup


class Model(AsyncBatcher[int, int]):
    """A batch of ``n`` takes ``per_batch + per_item·n`` seconds on the loop's clock (``stall``: once, that long).
    Every call has a deadline, 60 s unless it gives a timeout (``refuse_late`` needs one)."""

    def __init__(self, *, per_batch: float = 0.010, per_item: float = 0.001, **kwargs: Any) -> None:
        kwargs.setdefault("default_timeout", 60.0)
        super().__init__(**kwargs)
        self.per_batch = per_batch
        self.per_item = per_item
        self.stall: float | None = None
        self.sizes: list[int] = []

    async def process_batch(self, batch: list[int]) -> list[int]:
        self.sizes.append(len(batch))
        took, self.stall = (self.stall, None) if self.stall is not None else (None, None)
        await asyncio.sleep(took if took is not None else self.per_batch + self.per_item * len(batch))
        return batch


async def warm_up(b: Model, sizes: tuple[int, ...] = (1, 2, 4, 8, 3, 5, 7, 6, 2, 1)) -> None:
    """Batches of several sizes (the fit learns both its terms), one after the other, none late."""
    for n in sizes:
        await asyncio.gather(*(b.process(i) for i in range(n)))
    assert len(b.sizes) >= WARMUP


async def open_loop(b: Model, rate: float, seconds: float, timeout: float, seed: int = 1) -> list[tuple[float, Any]]:
    """Poisson arrivals at ``rate`` for ``seconds``, each ``process(i, timeout=timeout)``: (arrival, outcome), the
    outcome being how long its answer took, or the exception."""
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    start = loop.time()

    async def one(i: int) -> tuple[float, Any]:
        sent = loop.time()
        try:
            await b.process(i, timeout=timeout)
        except Exception as exc:
            return sent - start, exc
        return sent - start, loop.time() - sent

    calls = []
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= seconds:
            break
        await asyncio.sleep(start + t - loop.time())
        calls.append(asyncio.ensure_future(one(len(calls))))
    return list(await asyncio.gather(*calls))


async def after_time(predicate: Any, step: float = 0.001) -> None:
    """Let the virtual clock run until ``predicate()`` holds (``until`` lets no time pass)."""
    for _ in range(1_000_000):
        if predicate():
            return
        await asyncio.sleep(step)
    raise AssertionError("never")


def tally(outcomes: list[tuple[float, Any]], after: float, deadline: float) -> Counter[str]:
    counts: Counter[str] = Counter()
    for sent, outcome in outcomes:
        if sent < after:
            continue
        if isinstance(outcome, LateRefusalError):
            counts["refused"] += 1
        elif isinstance(outcome, BaseException):
            counts[type(outcome).__name__] += 1
        else:
            counts["in time" if outcome <= deadline else "late"] += 1
    return counts


@pytest.mark.parametrize("load", [1.3, 2.0])
async def test_past_saturation_the_late_are_refused_and_the_admitted_answered_in_time(load: float) -> None:
    capacity = 64 / (0.010 + 0.064)  # full batches of 64, one at a time
    results = {}
    for refuse in (False, True):
        b = Model(refuse_late=refuse, max_batch_size=64, max_queue_time=0.002)
        results[refuse] = tally(await open_loop(b, load * capacity, 6.0, timeout=0.1), after=1.0, deadline=0.1)
        await b.stop()
        idle_and_clean(b)
        if refuse:
            assert b.stats.rejected == b.stats.rejected_reasons["late"] > 0
    without, with_refusal = results[False], results[True]
    # Without: the queue holds 100 ms of arrivals, and nearly everything times out behind it.
    assert without["TimeoutError"] > 10 * without["in time"]
    # With: what is admitted is answered in time (the warm-up's second aside), the rest refused at once.
    assert with_refusal["TimeoutError"] + with_refusal["late"] <= 0.01 * with_refusal["in time"]
    assert with_refusal["in time"] >= 1.5 * without["in time"] and with_refusal["refused"] > 0


async def test_a_refusal_says_why_and_when_to_retry_and_the_retry_is_admitted() -> None:
    b = Model(refuse_late=True, max_batch_size=64, max_queue_time=0)
    await warm_up(b)
    in_flight = asyncio.ensure_future(b.process(0))
    await after_time(lambda: b.stats.in_flight == 1)
    queued = [asyncio.ensure_future(b.process(i)) for i in range(1, 40)]  # 49 ms behind a 11 ms batch
    await until(lambda: b.stats.in_flight == 1 and b.stats.queued == 39)
    with pytest.raises(LateRefusalError) as info:
        await b.process(99, timeout=0.03)
    refusal = info.value
    assert isinstance(refusal, QueueFullException)
    assert refusal.predicted > refusal.budget == pytest.approx(0.03)
    assert 0 < refusal.retry_after < refusal.predicted
    assert "39 items queued ahead" in str(refusal) and f"retry after {refusal.retry_after:.3f} s" in str(refusal)
    assert dict(b.stats.rejected_reasons) == {"late": 1}
    await asyncio.sleep(refusal.retry_after + 0.001)  # nothing else came: the backlog has drained that much
    assert await b.process(99, timeout=0.03) == 99
    await asyncio.gather(in_flight, *queued)
    await b.stop()
    idle_and_clean(b)


async def test_nothing_is_refused_during_the_warm_up() -> None:
    b = Model(refuse_late=True, per_batch=1.0, per_item=0.0, max_queue_time=0)
    outcomes = await asyncio.gather(*(b.process(i, timeout=0.5) for i in range(3)), return_exceptions=True)
    assert all(isinstance(o, TimeoutError) for o in outcomes)  # late, but admitted: nothing measured yet
    assert b.stats.rejected == 0
    await b.stop()


async def test_a_call_without_a_deadline_is_an_error_naming_the_ways_to_give_one() -> None:
    # No timeout=, no default_timeout, no max_latency: the item could never be judged, and refuse_late silently did
    # nothing for it. A call that gives a timeout is judged; max_latency or default_timeout give every call one.
    b = Model(refuse_late=True, default_timeout=None, max_queue_time=0)
    for call in (lambda: b.process(1), lambda: b.process_many([1, 2]), lambda: anext(b.stream(1))):
        with pytest.raises(ValueError, match="refuse_late=True, but this call has no deadline") as info:
            await call()
        assert all(way in str(info.value) for way in ("timeout=", "default_timeout=", "max_latency="))
    assert b.stats.submitted == 0
    assert await b.process(1, timeout=5) == 1
    b.refuse_late = False
    assert await b.process(2) == 2
    await b.stop()
    assert await Model(refuse_late=True, default_timeout=None, max_latency=0.5).process(3) == 3


async def test_an_item_that_finds_the_batcher_idle_is_admitted_even_if_predicted_late() -> None:
    b = Model(refuse_late=True, per_batch=1.0, per_item=0.0, max_queue_time=0)
    for _ in range(WARMUP):
        await b.process(0)
    with pytest.raises(TimeoutError):  # not refused: the head of the queue is always served
        await b.process(1, timeout=0.5)
    await after_time(lambda: b.stats.in_flight == 0)
    busy = asyncio.ensure_future(b.process(2))
    await after_time(lambda: b.stats.in_flight == 1)
    with pytest.raises(LateRefusalError):  # a batch in flight ahead of it: judged, and refused
        await b.process(3, timeout=0.5)
    assert await busy == 2
    await b.stop()


async def test_a_later_item_that_would_make_an_earlier_one_late_is_refused_though_its_own_deadline_is_far() -> None:
    b = Model(refuse_late=True, per_batch=0.010, per_item=0.010, max_batch_size=64, max_queue_time=0)
    await warm_up(b)
    first = asyncio.ensure_future(b.process(0))  # in flight for 20 ms
    await after_time(lambda: b.stats.in_flight == 1)
    tight = asyncio.ensure_future(b.process(1, timeout=0.045))  # 20 ms + its batch of 1 (20 ms): in time
    await until(lambda: b.stats.queued == 1)
    with pytest.raises(LateRefusalError, match="past the deadline of the items ahead of it in its batch") as info:
        await b.process(2, timeout=10)  # its batch of 2 would take 30 ms: the tight one would be late
    # Its own deadline is far: what it waits for is the tight one's batch to go, when the first ends (20 ms). (It
    # was 0: "retry after 0.000 s", an invitation to be refused again at once.)
    assert 0.015 < info.value.retry_after <= 0.02
    with pytest.raises(LateRefusalError):
        await b.process(2, timeout=10)  # (as a retry at once is)
    await asyncio.sleep(info.value.retry_after + 0.001)
    assert await b.process(2, timeout=10) == 2  # its own batch now
    assert await asyncio.gather(first, tight) == [0, 1]
    await b.stop()
    idle_and_clean(b)


async def test_a_fit_gone_wild_does_not_refuse_for_long() -> None:
    b = Model(refuse_late=True, max_batch_size=64, max_queue_time=0.002)
    await warm_up(b)
    b.stall = 30.0  # one batch stalls for 30 s, the fit knows nothing of it until it ends
    stalled = asyncio.ensure_future(b.process(0))
    await after_time(lambda: b.stats.in_flight == 1)
    with pytest.raises(TimeoutError):
        await b.process(1, timeout=1.0)  # predicted in time: admitted, and late
    await stalled
    busy = asyncio.ensure_future(b.process(2))
    await after_time(lambda: b.stats.in_flight == 1)
    with pytest.raises(LateRefusalError):  # the fit has seen a batch of one take 30 s
        await b.process(3, timeout=1.0)
    await busy
    # Half the capacity, afterwards: the batches go on (an idle batcher admits), and the fit forgets the stall.
    outcomes = await open_loop(b, 0.5 * 64 / 0.074, 8.0, timeout=0.1)
    assert tally(outcomes, after=0.0, deadline=0.1)["refused"] > 0
    counts = tally(outcomes, after=4.0, deadline=0.1)
    assert counts["refused"] == 0 and counts["TimeoutError"] == 0 and counts["in time"] > 1000
    await b.stop()
    idle_and_clean(b)


async def test_max_latency_is_a_deadline_and_the_tightest_deadline_counts() -> None:
    b = Model(refuse_late=True, max_latency=0.025, max_batch_size=64)
    await warm_up(b)
    in_flight = asyncio.ensure_future(b.process(0))
    await after_time(lambda: b.stats.in_flight == 1)
    # Up to 11 ms in flight, then a batch of n takes 10 + n ms: within 25 ms, a few items (their timeouts are far).
    loop = asyncio.get_running_loop()
    start = loop.time()
    outcomes = await asyncio.gather(*(b.process(i, timeout=60) for i in range(1, 11)), return_exceptions=True)
    assert loop.time() - start <= 0.025
    answered = [o for o in outcomes if not isinstance(o, BaseException)]
    refused = [o for o in outcomes if isinstance(o, LateRefusalError)]
    assert answered == list(range(1, len(answered) + 1)) and 2 <= len(answered) <= 4
    assert len(refused) == 10 - len(answered)
    assert all(r.budget == pytest.approx(0.025) for r in refused)
    assert await in_flight == 0
    await b.stop()


async def test_process_many_is_refused_whole() -> None:
    b = Model(refuse_late=True, max_batch_size=8, max_queue_time=0)
    await warm_up(b)
    in_flight = asyncio.ensure_future(b.process(0))
    await after_time(lambda: b.stats.in_flight == 1)
    with pytest.raises(LateRefusalError):
        await b.process_many(range(40), timeout=0.03)  # five batches of 8: 90 ms
    assert b.stats.rejected_reasons["late"] == 40 and b.stats.queued == 0
    assert await b.process_many(range(4), timeout=0.1) == [0, 1, 2, 3]
    await in_flight
    await b.stop()


async def test_refused_after_waiting_for_room_counts_as_submitted_and_failed() -> None:
    gate = asyncio.Event()

    class Held(Model):
        async def process_batch(self, batch: list[int]) -> list[int]:
            if 100 in batch:
                await gate.wait()
            return await super().process_batch(batch)

    b = Held(refuse_late=True, max_batch_size=4, max_queue_size=4, wait_when_full=True, max_queue_time=0)
    await warm_up(b, (1, 2, 3, 4, 1, 2, 3, 4, 2))
    held = asyncio.ensure_future(b.process(100))
    await after_time(lambda: b.stats.in_flight == 1)
    queued = [asyncio.ensure_future(b.process(i)) for i in range(4)]
    await until(lambda: b.stats.queued == 4)
    waiting = asyncio.ensure_future(b.process(5, timeout=0.5))  # admitted to the line: the held batch has no end yet
    await until(lambda: b.stats.awaiting_room == 1)
    await asyncio.sleep(0.45)
    gate.set()  # room comes with 50 ms left: too little for the 4 items ahead and its own batch
    with pytest.raises(LateRefusalError):
        await waiting
    await asyncio.gather(held, *queued)
    await b.stop()
    s = b.stats
    assert s.rejected == 0 and s.failed == 1
    idle_and_clean(b)


async def test_turned_on_live_it_starts_measuring_and_the_short_path_closes() -> None:
    b = Model(max_batch_size=64, max_queue_time=0, default_timeout=None)
    await b.process(0)
    assert b._life.run.fast is not None
    b.refuse_late = True
    b.default_timeout = 60.0
    assert b._life.run.fast is None
    await warm_up(b)
    assert b._admission.late.lateness is not None and b._admission.late.lateness.fit.observations >= WARMUP
    with pytest.raises(TypeError, match="refuse_late must be True or False"):
        b.refuse_late = 1  # type: ignore[assignment]
    await b.stop()


def test_refuse_late_is_a_flag() -> None:
    with pytest.raises(TypeError, match="refuse_late must be True or False, got 'yes'"):
        Model(refuse_late="yes")  # type: ignore[arg-type]


# The deadline an arriving item is held to (that of the items ahead of it in its batch) follows the items that set it
# as they leave: cancelled, timed out, or sent in a batch cut to a preferred size. Before, it stayed, and an item
# that would have been answered well inside its timeout was refused "past the deadline of the items ahead of it in
# its batch", with "retry after 0.000 s".


async def tail_with_a_tight_item(
    b: Model, *, relaxed_first: int = 1, tight_first: bool = False
) -> tuple[list[asyncio.Future[int]], Any]:
    """A batch in flight (11 ms), then ``relaxed_first`` items with a far deadline, then one due in 30 ms (or that
    one first, ``tight_first``): the futures of the one in flight and the relaxed ones, in their order, and the
    tight one's."""
    await warm_up(b)
    first = asyncio.ensure_future(b.process(0))
    await after_time(lambda: b.stats.in_flight == 1)
    tight = asyncio.ensure_future(b.process(100, timeout=0.03)) if tight_first else None
    relaxed = [asyncio.ensure_future(b.process(i, timeout=10)) for i in range(1, relaxed_first + 1)]
    if tight is None:
        tight = asyncio.ensure_future(b.process(100, timeout=0.03))
    await until(lambda: b.stats.queued == relaxed_first + 1)
    return [first, *relaxed], tight


async def test_the_deadline_ahead_goes_with_an_item_that_is_cancelled() -> None:
    b = Model(refuse_late=True, max_batch_size=64, max_queue_time=0)
    others, tight = await tail_with_a_tight_item(b, relaxed_first=8)
    with pytest.raises(LateRefusalError, match="the deadline of the items ahead of it"):
        await b.process(200, timeout=10)  # 11 ms, then a batch of 10: 20 ms: the tight one would be late
    tight.cancel()
    await until(lambda: b.stats.queued == 8)
    # 11 ms, then a batch of 10 (as with the tight one, which would have been late), well within their 10 s.
    assert await asyncio.gather(b.process(200, timeout=10), b.process(201, timeout=10)) == [200, 201]
    assert await asyncio.gather(*others) == list(range(9))
    await b.stop()
    idle_and_clean(b)


async def test_the_deadline_ahead_goes_with_an_item_that_timed_out() -> None:
    b = Model(refuse_late=True, max_batch_size=64, max_queue_time=0)
    await warm_up(b)
    b.stall = 0.1  # the batch in flight takes 100 ms, where 11 ms are predicted: the tight one times out queued
    first = asyncio.ensure_future(b.process(0))
    await after_time(lambda: b.stats.in_flight == 1)
    relaxed = asyncio.ensure_future(b.process(1, timeout=10))
    tight = asyncio.ensure_future(b.process(100, timeout=0.03))
    with pytest.raises(TimeoutError):
        await tight
    assert b.stats.queued == 1 and b.stats.in_flight == 1
    # The batch in flight is past its predicted end: the next batch, 1 and this one, would be answered within 10 s.
    assert await b.process(200, timeout=10) == 200
    assert await asyncio.gather(first, relaxed) == [0, 1]
    await b.stop()
    idle_and_clean(b)


async def test_the_deadline_ahead_goes_with_items_sent_in_a_batch_cut_to_a_preferred_size() -> None:
    b = Model(refuse_late=True, max_batch_size=64, max_queue_time=0, preferred_batch_sizes=(2, 64))
    await warm_up(b)
    first = asyncio.ensure_future(b.process(0))
    await after_time(lambda: b.stats.in_flight == 1)
    tight = asyncio.ensure_future(b.process(100, timeout=0.03))
    relaxed = [asyncio.ensure_future(b.process(i, timeout=10)) for i in range(1, 9)]
    await until(lambda: b.stats.queued == 9)
    assert await first == 0
    await until(lambda: b.sizes[-1] == 2)  # the tight one and the first relaxed one: a batch of the preferred 2
    assert b.stats.queued == 7
    # Behind that batch (12 ms), a batch of the 7 left and this one (18 ms): within their 10 s.
    assert await b.process(200, timeout=10) == 200
    assert await asyncio.gather(tight, *relaxed) == [100, *range(1, 9)]
    await b.stop()
    idle_and_clean(b)


async def test_a_shared_row_holds_the_items_behind_it_to_its_callers_deadline_as_they_join() -> None:
    class Shared(Model):
        def dedup_key(self, item: int) -> int:
            return item

    b = Shared(refuse_late=True, max_batch_size=64, max_queue_time=0)
    await warm_up(b)
    first = asyncio.ensure_future(b.process(0))
    await after_time(lambda: b.stats.in_flight == 1)
    tight = asyncio.ensure_future(b.process(100, timeout=0.03))  # a row due in 30 ms
    await until(lambda: b.stats.queued == 1)
    with pytest.raises(LateRefusalError, match="the deadline of the items ahead of it"):
        await b.process_many(range(1, 10), timeout=10)  # 11 ms, then a batch of 10 (20 ms): the row would be late
    relaxed = asyncio.ensure_future(b.process(100, timeout=10))  # joins the row: it is due in 10 s now
    await asyncio.sleep(0)
    assert await b.process_many(range(1, 10), timeout=10) == list(range(1, 10))
    assert await asyncio.gather(first, relaxed) == [0, 100]
    with pytest.raises(TimeoutError):  # (the row is answered for the caller who can wait: at 31 ms)
        await tight
    await b.stop()
    idle_and_clean(b)


async def test_departures_do_not_make_each_arrival_look_at_the_whole_queue_again() -> None:
    # With no max_batch_size the items ahead of an arrival are the whole queue. Each departure (a cancellation here)
    # used to make the next arrival compute their earliest deadline again from every queued item: 8000 arrivals with
    # a cancellation every other one took 9 s against 0.5 s without. Counted in items looked at, not in seconds.
    from async_batcher._core import dues as dues_module

    looked = Counter[str]()
    deadline_of = dues_module.deadline_of

    def counting(sink: Any, recorded: float) -> float:
        looked["items"] += 1
        return deadline_of(sink, recorded)

    b = Model(refuse_late=True, max_queue_time=0)
    await warm_up(b)
    gate = asyncio.ensure_future(b.process(-1))  # a batch in flight: what comes meanwhile waits in the queue
    await after_time(lambda: b.stats.in_flight == 1)
    n = 2000
    dues_module.deadline_of = counting  # type: ignore[assignment]
    try:
        calls = []
        for i in range(n):
            calls.append(asyncio.ensure_future(b.process(i, timeout=100 + i)))
            await asyncio.sleep(0)
            if i % 2:
                calls[i - 1].cancel()
                await asyncio.sleep(0)
    finally:
        dues_module.deadline_of = deadline_of  # type: ignore[assignment]
    assert b.stats.queued == n // 2 and b.stats.rejected == 0
    assert looked["items"] <= 20 * n, looked  # (each arrival looking again at the whole queue: about n * n / 4)
    assert await gate == -1
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert [r for r in results if not isinstance(r, asyncio.CancelledError)] == list(range(1, n, 2))
    await b.stop()
    idle_and_clean(b)


async def test_its_constants_are_a_refuse_late_value_of_their_own() -> None:
    # The warm-up, the margin, the recent batches and the spread's decay were module constants of the prediction,
    # unseen; they are RefuseLate's fields (refuse_late=True is RefuseLate()), read back as given and set live.
    assert RefuseLate() == RefuseLate(warmup=8, margin=3.0, recent=64, spread_decay=0.05)
    b = Model(refuse_late=RefuseLate(warmup=2), max_queue_time=0)
    for n in (1, 4):  # two batches measured: past this warm-up (not the default one)
        await asyncio.gather(*(b.process(i) for i in range(n)))
    assert b.refuse_late == RefuseLate(warmup=2)
    slow = asyncio.ensure_future(b.process(0))  # 11 ms in flight
    await after_time(lambda: b.stats.in_flight == 1)
    with pytest.raises(LateRefusalError):
        await b.process(1, timeout=0.005)
    b.refuse_late = True  # the default warm-up (8): the fit has seen 2 batches, nothing is refused
    assert b.refuse_late is True
    (late,) = await asyncio.gather(b.process(2, timeout=0.005), return_exceptions=True)
    assert isinstance(late, TimeoutError)  # (admitted, and late)
    assert await slow == 0
    await b.stop()
    for bad, message in (
        ({"warmup": 0}, "warmup"),
        ({"margin": -1.0}, "margin"),
        ({"recent": 0}, "recent"),
        ({"spread_decay": 0.0}, "spread_decay"),
    ):
        with pytest.raises(ValueError, match=message):
            RefuseLate(**bad)
