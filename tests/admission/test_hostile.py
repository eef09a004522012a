"""A hostile pass at what gets in (issue 46): weights that change, items over the limit, huge items in line, a
fit gone wild, bad dedup keys, a caller leaving at every moment, stops and restarts. Every wait here is bounded."""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Hashable
from typing import Any

import pytest

from async_batcher import (
    AsyncBatcher,
    BatcherStoppedError,
    LateRefusalError,
    OversizedItemError,
    QueueFullException,
)
from async_batcher.testing import violations
from tests.admission.test_refuse_late import Model, tail_with_a_tight_item
from tests.batchers import engine_of, idle_and_clean, until

pytestmark = pytest.mark.virtual_time


class Heavy(AsyncBatcher[float, float]):
    """An item weighs itself; a batch takes ``delay`` on the loop's clock; a duplicate is the same number. Every call
    has a deadline, 60 s unless it gives a timeout (``refuse_late`` needs one)."""

    def __init__(self, *, delay: float = 0.01, dedup: bool = False, **kwargs: Any) -> None:
        kwargs.setdefault("default_timeout", 60.0)
        super().__init__(**kwargs)
        self.delay = delay
        self.dedup = dedup
        self.rows: list[float] = []

    def item_weight(self, item: float) -> float:
        return item

    def dedup_key(self, item: float) -> Hashable | None:
        return item if self.dedup else None

    async def process_batch(self, batch: list[float]) -> list[float]:
        self.rows += batch
        await asyncio.sleep(self.delay)
        return batch


async def test_a_weight_that_changes_between_calls_is_taken_once_and_given_back_as_taken() -> None:
    weights = itertools.count(1)

    class Fickle(Heavy):
        def item_weight(self, item: float) -> float:
            return float(next(weights) % 5)  # never the same twice in a row

    b = Fickle(max_queue_weight=10, wait_when_full=True, max_batch_size=3, max_queue_time=0)
    results = await asyncio.gather(*(b.process(float(i)) for i in range(50)))
    assert results == [float(i) for i in range(50)]
    assert b.stats.queue_weight == 0.0 and engine_of(b).room.held == 0.0
    await b.stop()
    idle_and_clean(b)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0, "3", True, None])
async def test_a_bad_weight_is_refused_naming_the_hook_and_takes_nothing(bad: Any) -> None:
    class Bad(Heavy):
        def item_weight(self, item: float) -> float:
            return bad  # type: ignore[no-any-return]

    b = Bad(max_queue_weight=10)
    with pytest.raises(ValueError, match=r"item_weight\(\) must return a finite number >= 0"):
        await b.process(1.0)
    assert b.stats.queue_weight == 0.0
    await b.stop()


async def test_float_weights_add_up_to_nothing_at_rest_and_the_limit_itself_fits_after() -> None:
    b = Heavy(max_queue_weight=7.3, max_batch_size=7, max_queue_time=0, wait_when_full=True)
    await asyncio.gather(*(b.process(0.1) for _ in range(1000)))
    assert engine_of(b).room.held == 0.0
    assert await b.process(7.3) == 7.3  # no drift left to refuse it
    await b.stop()


async def test_a_huge_item_in_line_waits_for_everything_held_and_a_stop_refuses_the_line() -> None:
    b = Heavy(max_queue_weight=10, wait_when_full=True, max_queue_time=0, delay=1.0, max_batch_size=1)
    small = [asyncio.ensure_future(b.process(1.0)) for _ in range(5)]
    await until(lambda: b.stats.queue_weight == 5)
    huge = asyncio.ensure_future(b.process(9.99))  # waits until all five have resolved
    behind = [asyncio.ensure_future(b.process(0.01)) for _ in range(3)]  # would fit: may not overtake
    await until(lambda: b.stats.awaiting_room == 4)
    await asyncio.sleep(4.5)  # four of the five answered: 1 + 9.99 > 10 still
    assert not huge.done() and not any(call.done() for call in behind)
    await asyncio.sleep(1.0)
    assert b.stats.queue_weight == pytest.approx(9.99 + 0.01)  # the huge one, then one small behind it
    stopping = asyncio.ensure_future(b.stop())
    outcomes = await asyncio.gather(huge, *behind, return_exceptions=True)
    await stopping
    assert outcomes[0] == 9.99 and outcomes[1] == 0.01
    assert all(isinstance(o, BatcherStoppedError) for o in outcomes[2:])  # still in line when the stop came
    assert await asyncio.gather(*small) == [1.0] * 5
    assert engine_of(b).room.held == 0.0
    idle_and_clean(b)


async def test_process_many_over_the_limit_is_refused_at_once_even_when_callers_wait() -> None:
    b = Heavy(max_queue_weight=10, wait_when_full=True)
    with pytest.raises(OversizedItemError, match="a call of 3 items of weight 12"):
        await b.process_many([4.0, 4.0, 4.0])
    assert await b.process_many([4.0, 4.0]) == [4.0, 4.0]
    await b.stop()


async def test_the_limit_turned_on_and_off_live_gives_back_exactly_what_it_took() -> None:
    b = Heavy(delay=1.0, max_queue_time=0, concurrency=None)
    before = asyncio.ensure_future(b.process(3.0))  # admitted without a limit: nothing taken
    await until(lambda: b.stats.in_flight == 1)
    b.max_queue_weight = 5
    during = asyncio.ensure_future(b.process(4.0))
    await until(lambda: b.stats.queue_weight == 4)
    b.max_queue_weight = None
    after = asyncio.ensure_future(b.process(100.0))  # no limit: nothing taken
    assert await asyncio.gather(before, during, after) == [3.0, 4.0, 100.0]
    assert engine_of(b).room.held == 0.0
    await b.stop()


async def test_weight_held_by_a_stopped_run_does_not_leak_into_the_next() -> None:
    b = Heavy(max_queue_weight=10, delay=5.0, max_queue_time=0)
    stuck = asyncio.ensure_future(b.process(8.0))
    await until(lambda: b.stats.in_flight == 1)
    await b.stop(force=True)
    with pytest.raises(BatcherStoppedError):
        await stuck
    b.start()
    assert b.stats.queue_weight == 0.0
    assert await b.process(10.0) == 10.0
    await b.stop()


@pytest.mark.parametrize("turns", range(8))
@pytest.mark.parametrize("what", ["weight line", "shared leader", "shared follower", "late"])
async def test_a_caller_leaving_at_any_moment_leaves_everything_whole(what: str, turns: int) -> None:
    b = Heavy(
        max_queue_weight=10, wait_when_full=True, max_queue_time=0, dedup=what.startswith("shared"), refuse_late=True
    )
    for size in (1, 2, 3, 1, 2, 3, 1, 2, 3):  # measured: refusals may come
        await asyncio.gather(*(b.process(0.001 * (size + i)) for i in range(size)))
    first = asyncio.ensure_future(b.process(6.0))
    await until(lambda: b.stats.in_flight == 1)
    if what == "weight line":
        leaving = asyncio.ensure_future(b.process(5.0))  # 6 + 5 > 10: in line
        staying = asyncio.ensure_future(b.process(4.0))
    elif what == "late":
        leaving = asyncio.ensure_future(b.process(2.0, timeout=0.5))
        staying = asyncio.ensure_future(b.process(2.5))
    else:
        leader = asyncio.ensure_future(b.process(2.0))
        follower = asyncio.ensure_future(b.process(2.0))
        leaving, staying = (leader, follower) if what == "shared leader" else (follower, leader)
    for _ in range(turns):
        await asyncio.sleep(0)
        assert violations(b) == []
    leaving.cancel()
    outcomes = await asyncio.gather(first, leaving, staying, return_exceptions=True)
    assert outcomes[0] == 6.0
    assert isinstance(outcomes[1], asyncio.CancelledError | LateRefusalError) or outcomes[1] in (2.0, 5.0)
    assert outcomes[2] in (2.0, 2.5, 4.0) or isinstance(outcomes[2], LateRefusalError)
    await asyncio.sleep(0.1)
    assert engine_of(b).room.held == 0.0
    await b.stop()
    idle_and_clean(b)


async def test_a_dedup_key_whose_comparison_raises_fails_its_own_caller_only() -> None:
    class Colliding:
        """Every key hashes alike; comparing two of them raises."""

        def __init__(self, n: int) -> None:
            self.n = n

        def __hash__(self) -> int:
            return 1

        def __eq__(self, other: object) -> bool:
            if other is self:
                return True
            raise RuntimeError("cannot compare")

    class Keys(Heavy):
        def dedup_key(self, item: float) -> Hashable | None:
            return Colliding(int(item))

    b = Keys(max_queue_time=0, delay=0.5)
    first = asyncio.ensure_future(b.process(1.0))
    await until(lambda: b.stats.in_flight == 1)
    with pytest.raises(RuntimeError, match="cannot compare"):
        await b.process(2.0)  # its lookup compares it with the first's key
    assert await first == 1.0
    assert await b.process(3.0) == 3.0  # the first's row was let go: nothing left to compare with
    await b.stop()
    idle_and_clean(b)


async def test_a_refusal_with_a_fit_gone_negative_or_nan_never_happens() -> None:
    b = Heavy(refuse_late=True, max_queue_time=0, delay=0.01)
    for size in range(1, 10):
        await asyncio.gather(*(b.process(float(i)) for i in range(size)))
    lateness = b._admission.late.lateness
    assert lateness is not None
    for bad in (-5.0, math.nan, math.inf):
        lateness.observe(3, 0.0, bad)  # ignored: what a clock gone wrong might report
    a, per_batch = lateness.model()
    assert a >= 0 and per_batch >= 0 and math.isfinite(a) and math.isfinite(per_batch)
    busy = asyncio.ensure_future(b.process(1.0))
    await until(lambda: b.stats.in_flight == 1)
    assert await b.process(2.0, timeout=1.0) == 2.0  # a second is plenty: not refused
    await busy
    await b.stop()


async def test_a_late_refusal_is_a_queue_full_exception_for_code_that_catches_those() -> None:
    b = Heavy(refuse_late=True, max_queue_time=0, delay=1.0)
    for _ in range(8):
        await b.process(1.0)
    busy = asyncio.ensure_future(b.process(1.0))
    await until(lambda: b.stats.in_flight == 1)
    with pytest.raises(QueueFullException) as info:
        await b.process(2.0, timeout=0.5)
    assert type(info.value) is LateRefusalError
    await busy
    await b.stop()


# max_batch_size set live decides which queued items make the last batch, the one an arriving item joins and whose
# earliest deadline it is held to. (It was computed for the old size until the queue changed otherwise: an item was
# refused for the deadline of an item no longer in its batch, or admitted into a batch that made one late.)


async def test_max_batch_size_lowered_live_an_item_is_not_held_to_a_deadline_no_longer_in_its_batch() -> None:
    b = Model(refuse_late=True, max_batch_size=64, max_queue_time=0)
    others, tight = await tail_with_a_tight_item(b, relaxed_first=8, tight_first=True)  # one due in 30 ms, 8 in 10 s
    with pytest.raises(LateRefusalError, match="the deadline of the items ahead of it"):
        await b.process(200, timeout=10)  # behind the batch in flight, a batch of 10 (20 ms): the tight one late
    b.max_batch_size = 4
    # Batches of 4: the tight one goes in the first (it ends at 25 ms); this one joins the last relaxed one in the
    # third (at 51 ms): within their 10 s, and the tight one is not in it.
    assert await b.process(200, timeout=10) == 200
    assert await asyncio.gather(tight, *others) == [100, *range(9)]
    await b.stop()
    idle_and_clean(b)


async def test_max_batch_size_raised_live_an_item_is_held_to_the_deadline_now_in_its_batch() -> None:
    b = Model(refuse_late=True, max_batch_size=4, max_queue_time=0)
    ahead, tight = await tail_with_a_tight_item(b, relaxed_first=3)  # in flight; 3 due in 10 s, then one in 30 ms
    more = [asyncio.ensure_future(b.process(i, timeout=10)) for i in range(4, 9)]
    await until(lambda: b.stats.queued == 9)
    b.max_batch_size = 64  # now the tight one is in the last batch: 9 queued, and a tenth would make it late
    with pytest.raises(LateRefusalError, match="the deadline of the items ahead of it"):
        await b.process(200, timeout=10)
    assert await asyncio.gather(*ahead, tight, *more) == [*range(4), 100, *range(4, 9)]
    await b.stop()
    idle_and_clean(b)
