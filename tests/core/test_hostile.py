"""Attacks on issue 50's core fixes, as a hostile user would make them: priorities that tie past
``max_priority_wait``, policies replaced from inside their own hooks, flushes and records at awkward moments. Every
wait here is bounded; every caller resolves once."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from async_batcher import testing
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
    # an item, no item of a worse priority that waited max_priority_wait, and came no later, is left waiting.
    async def main() -> None:
        b = Recording(max_batch_size=size, max_queue_time=0.0, delay=0.1, max_priority_wait=wait)
        loop = asyncio.get_running_loop()
        arrived: dict[int, tuple[float, int]] = {}

        async def call(x: int, at: float, priority: int) -> None:
            await asyncio.sleep(at)
            arrived[x] = (loop.time(), priority)
            assert await b.process(x, priority=priority) == 2 * x

        await asyncio.gather(*(call(x, at, p) for x, (at, p) in enumerate(calls)))
        sent_at = {x: t for batch, t in zip(b.batches, b.started_at, strict=True) for x in batch}
        for batch, t in zip(b.batches, b.started_at, strict=True):
            for x in batch:
                came, priority = arrived[x]
                for y, (y_came, y_priority) in arrived.items():
                    passed_over = y_came <= t < sent_at[y] and y_priority > priority and y_came <= came
                    assert not (passed_over and y_came <= t - wait + 1e-9), (y, arrived[y], t, batch)
        await b.stop()
        idle_and_clean(b)

    testing.run(main())
