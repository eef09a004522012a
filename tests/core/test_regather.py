"""Contract point 1, the first arrival after a cohort's batch: when a batch that answered two callers or more ends
with nothing waiting, the first caller to come back lets the loop's four turns pass before its batch forms, so that
the others, whose next calls the loop already holds, join it (a closed loop's cohort comes back one request at a
time; without the turns the first one back goes alone, and the cohort splits for good). After a lone caller's
batch, after an idle spell (longer than the lane's last cycle) and for a full batch, no turns; a stop during them
resolves every caller once. Turns, not time: the clock does not move for them. Every wait is bounded.

The callers come back as tasks that, once answered, let ``lag`` turns of the loop pass before calling again, as the
handlers of requests read one after another reach the batcher some turns apart.
"""

from __future__ import annotations

import asyncio

import pytest

from async_batcher import BatcherStoppedError
from tests.batchers import Recording, turns, warm

pytestmark = pytest.mark.virtual_time


async def _client(b: Recording, x: int, lag: int, rounds: int) -> list[int]:
    """A closed loop's client: call, and once answered call again ``lag`` turns later."""
    got = []
    for r in range(rounds):
        got.append(await b.process(x + 100 * r))
        await turns(lag)
    return got


async def _cohort(b: Recording, lags: list[int], rounds: int) -> list[list[int]]:
    async with asyncio.timeout(100):
        return list(await asyncio.gather(*(_client(b, i, lag, rounds) for i, lag in enumerate(lags))))


@pytest.mark.parametrize("regather", [True, False])
async def test_a_cohort_that_comes_back_over_a_few_turns_stays_whole(regather: bool) -> None:
    # Eight clients come back 0 to 3 turns after their answers. The first batch tells nothing of the lane's rate, so
    # the first one back goes with those of its turn (two here), and the others follow; from then on, with the
    # regather, every batch holds all eight (the last, those that had a round left). Without it (the rule before),
    # the cohort stays split: more model calls for the same items.
    b = Recording(delay=1.0, max_queue_time=0, max_hold_time=0)
    b._regather = regather
    lags = [0, 1, 2, 3] * 2
    results = await _cohort(b, lags, rounds=6)
    assert results == [[2 * (i + 100 * r) for r in range(6)] for i in range(8)]
    sizes = [len(batch) for batch in b.batches]
    if regather:
        assert sizes[:2] == [8, 2] and sizes[2:-1] == [8] * 4 and sum(sizes) == 48
    else:
        assert sizes[:3] == [8, 2, 8] and len(sizes) > 8 and min(sizes[3:]) < 8
    assert all(t == int(t) for t in b.started_at)  # turns take no time: every batch starts on a whole second
    run = b._run
    assert run.timer is None and run.pump_handle is None  # an idle batcher keeps nothing scheduled
    await b.stop()


async def test_a_lone_callers_batch_lets_no_turns_pass() -> None:
    # One client alone: its batch answered one caller, so its next call goes at once; a second task ready one turn
    # after it does not join (it would, after a cohort's batch).
    b = Recording(delay=1.0, max_queue_time=0, max_hold_time=0)
    async with asyncio.timeout(10):
        await warm(b, range(1))

        async def late() -> int:
            await asyncio.sleep(0)
            return await b.process(2)

        assert await asyncio.gather(b.process(3), late()) == [6, 4]
    assert b.batches[2:] == [[3], [2]]
    await b.stop()


async def test_a_caller_after_an_idle_spell_goes_at_once() -> None:
    # Ten callers answered by a batch, then the batcher idles for longer than the lane's cycle: the next caller
    # goes at once (a task ready one turn later follows in the next batch), where within the cycle it lets the
    # turns pass and the task joins it.
    loop = asyncio.get_running_loop()

    async def pair() -> list[int]:
        async def late() -> int:
            await asyncio.sleep(0)
            return await b.process(2)

        return list(await asyncio.gather(b.process(1), late()))

    for idle, batches in [(0.5, [[1], [2]]), (0.0, [[1, 2]])]:
        b = Recording(delay=0.25, max_queue_time=0, max_hold_time=0)
        async with asyncio.timeout(10):
            await warm(b, range(10))  # the second batch's cycle is 0.25 s, and ten items came in it
            ended = loop.time()
            await asyncio.sleep(idle)
            assert await pair() == [2, 4]
        assert b.batches[2:] == batches, idle
        assert b.started_at[2] == ended + idle
        await b.stop()


async def test_a_full_batch_goes_at_once() -> None:
    # The first arrival after a cohort's batch is a process_many as large as the largest batch: it is in flight
    # before the task ready one turn later calls (after turns, it would not be yet), and that task follows alone.
    b = Recording(delay=1.0, max_queue_time=0, max_hold_time=0, max_batch_size=3)
    seen: list[int] = []
    async with asyncio.timeout(10):
        await warm(b, range(3))

        async def late() -> int:
            await asyncio.sleep(0)
            seen.append(b.stats.in_flight)
            return await b.process(9)

        assert await asyncio.gather(b.process_many([4, 5, 6]), late()) == [[8, 10, 12], 18]
    assert seen == [1]
    assert b.batches[2:] == [[4, 5, 6], [9]]
    await b.stop()


@pytest.mark.parametrize("force", [False, True])
async def test_a_stop_during_the_regathers_turns_resolves_every_caller_once(force: bool) -> None:
    # The first caller back after a cohort's batch waits for its turns; a stop comes in the first of them. A drain
    # sends its batch at once (no turn is waited for once stopping) and refuses the caller that comes later; a
    # forced stop fails the waiting caller. Nothing hangs, nothing stays scheduled.
    b = Recording(delay=1.0, max_queue_time=0, max_hold_time=0)
    async with asyncio.timeout(10):
        await warm(b, range(2))

        async def stopper() -> None:
            await asyncio.sleep(0)
            await b.stop(force=force)

        async def late() -> int:
            await turns(2)
            return await b.process(4)

        outcomes = await asyncio.gather(b.process(3), stopper(), late(), return_exceptions=True)
    assert isinstance(outcomes[2], BatcherStoppedError)
    if force:
        assert isinstance(outcomes[0], BatcherStoppedError)
        assert b.batches[2:] == []
    else:
        assert outcomes[0] == 6
        assert b.batches[2:] == [[3]]
    stats = b.stats
    assert stats.in_flight == 0 and stats.queued == 0
    assert b._run.timer is None
    assert b._run.pump_handle is None or b._run.pump_handle.cancelled()


@pytest.mark.parametrize(("turns", "batches"), [(4, [[0, 1], [100, 101]]), (0, [[0, 1], [100], [101]])])
async def test_no_turns_no_regather(turns: int, batches: list[list[int]]) -> None:
    # _turns = 0 (the benchmarks' plain greedy reference): the first caller back goes alone.
    b = Recording(delay=1.0, max_queue_time=0, max_hold_time=0)
    b._turns = turns
    async with asyncio.timeout(10):
        await warm(b, range(2))
    await _cohort(b, [0, 1], rounds=2)
    assert b.batches[2:] == batches
    await b.stop()
