"""Contract point 1, a batch's end: while items wait, the next batch forms four turns of the event loop later, so
that the callers the loop already holds join it (a request read from its socket whose handler has yet to run; here,
tasks that the batch's end made ready). Turns, not time: the clock does not move for them. A full batch, a stop and
a caller waiting for room go at once; ``_turns = 0`` (not a setting: the benchmarks' plain greedy reference) forms
the batch at once.

The callers "the loop holds" are tasks waiting on an event that ``process_batch`` sets as it returns: they are ready
to run when the batch ends, as the handlers of requests the loop read in the same turn are. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from async_batcher import BatcherStoppedError
from tests.batchers import Recording

pytestmark = pytest.mark.virtual_time


class EndsWithCallers(Recording):
    """Each batch takes ``delay`` seconds; as its first batch returns, ``callers`` tasks become ready to call
    :meth:`process` (each notes the batches in flight as it runs)."""

    def __init__(self, callers: range, **kwargs: Any) -> None:
        super().__init__(delay=1.0, answer=self._answer, **kwargs)
        self.ready = asyncio.Event()
        self.in_flight_seen: list[int] = []
        self.waiters = [asyncio.ensure_future(self._caller(x)) for x in callers]

    def _answer(self, batch: list[int]) -> list[int]:
        self.ready.set()
        return [x * 2 for x in batch]

    async def _caller(self, x: int) -> int:
        await self.ready.wait()
        self.in_flight_seen.append(self.stats.in_flight)
        return await self.process(x)


async def _later(b: Recording, delay: float, items: range) -> list[int]:
    await asyncio.sleep(delay)
    return list(await asyncio.gather(*(b.process(x) for x in items)))


@pytest.mark.parametrize(
    ("turns", "batches", "started_at"),
    [
        (2, [[0], [1, 10, 11, 12, 13]], [0.0, 1.0]),  # they join the batch, which starts when the first ended
        (0, [[0], [1], [10, 11, 12, 13]], [0.0, 1.0, 2.0]),  # plain greedy: [1] goes alone, they follow
    ],
)
async def test_callers_the_loop_holds_at_a_batchs_end_join_the_next_batch(
    turns: int, batches: list[list[int]], started_at: list[float]
) -> None:
    loop = asyncio.get_running_loop()
    b = EndsWithCallers(range(10, 14), max_queue_time=0, max_hold_time=0)
    b._turns = turns
    async with asyncio.timeout(10):
        assert await asyncio.gather(b.process(0), _later(b, 0.5, range(1, 2))) == [0, [2]]
        assert await asyncio.gather(*b.waiters) == [20, 22, 24, 26]
    assert b.batches == batches
    assert b.started_at == started_at
    assert loop.time() == started_at[-1] + 1.0
    assert b._run.timer is None and b._run.pump_handle is None  # nothing left scheduled
    await b.stop()


async def test_the_turns_wait_for_the_callers_behind_a_hold_too() -> None:
    # With the hold on (its default), the turns come first and the hold's own rules after them: here a single
    # caller was answered (fewer than a probe's four), so the hold does not act, and the turns alone merge them.
    b = EndsWithCallers(range(10, 14), max_queue_time=0, max_hold_time=0.02)
    async with asyncio.timeout(10):
        await asyncio.gather(b.process(0), _later(b, 0.5, range(1, 2)), *b.waiters)
    assert b.batches == [[0], [1, 10, 11, 12, 13]]
    assert b.started_at == [0.0, 1.0]
    await b.stop()


@pytest.mark.parametrize("why", ["full", "room"])
async def test_a_full_batch_or_a_caller_waiting_for_room_goes_at_once(why: str) -> None:
    # The next batch is already full, or a caller waits for the room it makes: it is launched before the callers
    # the loop holds run (they see it in flight), and they form the batch after it.
    size, room = (2, 100) if why == "full" else (100, 2)
    b = EndsWithCallers(
        range(10, 12), max_queue_time=0, max_hold_time=0, max_batch_size=size, max_queue_size=room, wait_when_full=True
    )
    async with asyncio.timeout(10):
        await asyncio.gather(b.process(0), _later(b, 0.5, range(1, 3 if why == "full" else 4)), *b.waiters)
    assert b.in_flight_seen == [1, 1]
    assert b.batches[:2] == [[0], [1, 2]]
    b2 = EndsWithCallers(range(10, 12), max_queue_time=0, max_hold_time=0)  # the same, with neither: they join
    async with asyncio.timeout(10):
        await asyncio.gather(b2.process(0), _later(b2, 0.5, range(1, 3)), *b2.waiters)
    assert b2.in_flight_seen == [0, 0]
    assert b2.batches == [[0], [1, 2, 10, 11]]
    await b.stop()
    await b2.stop()


@pytest.mark.parametrize("force", [False, True])
async def test_a_stop_during_the_turns_resolves_every_caller_once(force: bool) -> None:
    # The stop comes in the turn after the batch's end (from a task the end made ready), while the next batch waits
    # for its turns: a drain sends it (no turn is waited for once stopping), a forced stop fails it; nothing hangs.
    b = EndsWithCallers(range(0), max_queue_time=0, max_hold_time=0)

    async def stopper() -> None:
        await b.ready.wait()
        await b.stop(force=force)

    async with asyncio.timeout(10):
        stopping = asyncio.ensure_future(stopper())
        outcomes = await asyncio.gather(b.process(0), _later(b, 0.5, range(1, 4)), return_exceptions=True)
        await stopping
    assert outcomes[0] == 0
    if force:
        assert isinstance(outcomes[1], BatcherStoppedError)
        assert b.batches == [[0]]
    else:
        assert outcomes[1] == [2, 4, 6]
        assert b.batches == [[0], [1, 2, 3]]
    stats = b.stats
    assert stats.in_flight == 0 and stats.queued == 0
    assert b._run.pump_handle is None or b._run.pump_handle.cancelled()


async def test_a_batch_that_ends_while_the_batcher_stops_sends_the_rest_at_once() -> None:
    # A drain waits for no turn: the batch of what is left is in flight before the tasks the end made ready run
    # (the caller among them is refused: the batcher stops).
    b = EndsWithCallers(range(10, 11), max_queue_time=0, max_hold_time=0)

    async def stopper() -> None:
        await asyncio.sleep(0.75)  # the first batch runs, the next items wait
        await b.stop()

    async with asyncio.timeout(10):
        stopping = asyncio.ensure_future(stopper())
        assert await asyncio.gather(b.process(0), _later(b, 0.5, range(1, 4))) == [0, [2, 4, 6]]
        (refused,) = await asyncio.gather(*b.waiters, return_exceptions=True)
        await stopping
    assert isinstance(refused, BatcherStoppedError)
    assert b.in_flight_seen == [1]
    assert b.batches == [[0], [1, 2, 3]]
