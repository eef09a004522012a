"""Attacks on issue 50's core fixes, as a hostile user would make them: priorities that tie past
``max_priority_wait``, policies replaced from inside their own hooks, flushes and records at awkward moments. Every
wait here is bounded; every caller resolves once."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from async_batcher import testing
from async_batcher.policies import BatchFacts, ClosedLoopHold, Deadline, DispatchPolicy, LaneView, PreferredSizes
from tests.batchers import Recording, idle_and_clean

pytestmark = pytest.mark.virtual_time


async def test_max_priority_wait_holds_when_three_priorities_tie() -> None:
    # Ten items of each of three priorities come together (one time on the virtual clock). Past 0.35 s every head
    # has waited too long: the worst priority, passed over by both others, goes first. (Of a tie, the second best
    # won: the worst waited for it to drain, and its first item went at 1.4 s.)
    b = Recording(max_batch_size=1, max_queue_time=0.0, delay=0.1, max_priority_wait=0.35)
    calls = [asyncio.ensure_future(b.process(p * 100 + i, priority=p)) for i in range(10) for p in range(3)]
    await asyncio.gather(*calls)
    first_sent = {
        p: min(t for batch, t in zip(b.batches, b.started_at, strict=True) if batch[0] // 100 == p) for p in range(3)
    }
    assert first_sent[2] <= 0.35 + 0.1 + 1e-9, first_sent
    await b.stop()
    idle_and_clean(b)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    calls=st.lists(st.tuples(st.sampled_from([0.0, 0.0, 0.05, 0.1, 0.3]), st.integers(-2, 2)), min_size=1, max_size=30),
    wait=st.sampled_from([0.0, 0.05, 0.15, 0.35]),
    size=st.integers(1, 3),
)
def test_no_item_is_passed_over_past_max_priority_wait_for_a_better_one_that_came_no_sooner(
    calls: list[tuple[float, int]], wait: float, size: int
) -> None:
    # Whatever the arrivals (many of them equal: the virtual clock's common case) and priorities: when a batch takes
    # an item, no item of a worse priority queued then that waited max_priority_wait, and came no later, is left
    # waiting.
    async def main() -> None:
        loop = asyncio.get_running_loop()
        arrived: dict[int, tuple[float, int]] = {}  # each item as its call submits it: when, at what priority
        queued_at_dispatch: list[set[int]] = []  # as each batch went: the items submitted by then

        class Watching(Deadline):
            def dispatched(self, lane: LaneView, batch: BatchFacts, now: float) -> None:
                super().dispatched(lane, batch, now)
                queued_at_dispatch.append(set(arrived))

        b = Recording(policy=Watching(0.0), max_batch_size=size, delay=0.1, max_priority_wait=wait)

        async def call(x: int, at: float, priority: int) -> None:
            await asyncio.sleep(at)
            arrived[x] = (loop.time(), priority)
            assert await b.process(x, priority=priority) == 2 * x  # (submitted in this step: no await before)

        await asyncio.gather(*(call(x, at, p) for x, (at, p) in enumerate(calls)))
        sent_at = {x: t for batch, t in zip(b.batches, b.started_at, strict=True) for x in batch}
        for batch, t, present in zip(b.batches, b.started_at, queued_at_dispatch, strict=True):
            for x in batch:
                came, priority = arrived[x]
                for y in present:
                    y_came, y_priority = arrived[y]
                    passed_over = t < sent_at[y] and y_priority > priority and y_came <= came
                    assert not (passed_over and y_came <= t - wait - 1e-9), (y, arrived[y], t, batch)
        await b.stop()
        idle_and_clean(b)

    testing.run(main())


async def test_a_policy_that_sets_another_from_its_replaced_hook() -> None:
    # Replaced by `middle`, the policy puts `final` in place from its own replaced() hook: `final` serves, and
    # `middle`, which served for no batch, is free for another batcher (it was left marked as serving this one).
    final = Deadline(0.1)
    middle = Deadline(0.3)

    class Swapper(Deadline):
        def replaced(self, by: DispatchPolicy, lanes: Iterable[LaneView], now: float) -> None:
            b.policy = final

    b = Recording(policy=Swapper(0.2))
    calls = [asyncio.ensure_future(b.process(x)) for x in range(3)]
    await asyncio.sleep(0)
    b.policy = middle
    assert b.policy is final
    assert await asyncio.gather(*calls) == [0, 2, 4]
    assert b.started_at == [0.1]  # final's wait, not middle's
    other = Recording(policy=middle)
    assert await other.process(5) == 10
    with pytest.raises(ValueError, match="already serves another batcher"):
        Recording(policy=final)
    await b.stop()
    await other.stop()
    idle_and_clean(b)


async def test_a_replaced_hook_that_submits_to_its_batcher() -> None:
    parked: list[asyncio.Task[int]] = []

    class Submits(Deadline):
        def replaced(self, by: DispatchPolicy, lanes: Iterable[LaneView], now: float) -> None:
            parked.append(asyncio.ensure_future(b.process(7)))

    b = Recording(policy=Submits(5.0))
    calls = [asyncio.ensure_future(b.process(x)) for x in range(3)]
    await asyncio.sleep(0)
    b.policy = Deadline(0.3)
    assert await asyncio.gather(*calls) == [0, 2, 4]
    assert await parked[0] == 14
    assert b.batches == [[0, 1, 2, 7]]
    await b.stop()
    idle_and_clean(b)


async def test_a_priority_too_large_for_a_float_is_still_a_priority() -> None:
    # An int past a float's range is a real number, and orders as one (it raised OverflowError, naming nothing).
    b = Recording(max_batch_size=1, max_queue_time=0.0, delay=0.1)
    calls = [asyncio.ensure_future(b.process(x, priority=p)) for x, p in ((0, 10**400), (1, 0), (2, -(10**400)))]
    assert await asyncio.gather(*calls) == [0, 2, 4]
    assert b.batches == [[2], [1], [0]]
    assert await b.process_many([3, 4], priority=10**400) == [6, 8]
    await b.stop()
    idle_and_clean(b)


def test_layers_that_wrap_one_another_in_a_circle_are_refused() -> None:
    # A policy whose layers came back on themselves made every walk down them endless: the batcher given it hung at
    # construction, piling up memory. (wrap() refuses first: with it undone, the second half would hang.)
    preferred = PreferredSizes((2,), Deadline())
    hold = ClosedLoopHold(0.1, preferred)
    with pytest.raises(ValueError, match="PreferredSizes cannot wrap ClosedLoopHold"):
        preferred.wrap(hold)
    with pytest.raises(ValueError, match="cannot wrap"):
        preferred.wrap(preferred)
    preferred.inner = hold  # by hand, past wrap()
    with pytest.raises(ValueError, match="in a circle"):
        Recording(policy=hold)
    b = Recording()
    with pytest.raises(ValueError, match="in a circle"):
        b.policy = hold
    assert isinstance(b.policy, Deadline)
