"""Contract point 1, the first arrival after a cohort's batch: when a batch that answered two callers or more ends
with nothing waiting, the first caller to come back lets the loop's four turns pass before its batch forms, so that
the others, whose next calls the loop already holds, join it (a closed loop's cohort comes back one request at a
time; without the turns the first one back goes alone, and the cohort splits for good). After a lone caller's
batch, after an idle spell (longer than the lane's last cycle) and for a full batch, no turns; a stop during them
resolves every caller once. Turns, not time: the clock does not move for them. Every wait is bounded.

The callers come back as tasks that, once answered, let ``lag`` turns of the loop pass before calling again, as the
handlers of requests read one after another reach the batcher some turns apart.

The rule (``Deadline``'s ``ended`` and ``arrival``, ``async_batcher/_core/waits.py``; ``Dispatcher.batch_ended`` and
``Dispatcher._wake``): when a batch ends with nothing of its lane waiting and it answered a cohort (two callers or more,
nothing arrived in the lane while it ran, and the lane's rate would have brought an item), the policy records in its
memo of the lane that the regather lasts one lane cycle, and asks to see the lane's next arrival; that arrival, into a
free slot before then, schedules the pump after the policy's ``turns`` (4) turns of the loop instead of at once
(unless its lane holds a full batch); a batch that goes ends it. The tests after the first few check it from the
outside: other lanes, several slots, ``process_many``, callers leaving or timing out during the turns, callers
waiting for room, stops and restarts, live settings, re-entrant calls, ``max_queue_time``, the hold and streams.
Invariants checked: every accepted item resolves once and never reaches ``process_batch`` after its caller left; an
idle batcher keeps no timer and no pump scheduled (``testing.idle``); the counters add up; the turns cost no virtual
time.

Found by these tests and mended: the regather's state was the run's, so an arrival in another lane used up (and
paid) a cohort's turns; it is the lane's now (the policy's memo of the lane). And a keyed lane (other than the default
one) was forgotten once empty without a hold, so its batches never answered a cohort and the regather never applied
to it: the idle lanes that ended last are kept now (``KEEP_IDLE``), and a lane pushed out by newer keys starts
afresh. A streaming batch counts no callers answered, so the regather never follows one (by design, undocumented).

Every wait is bounded (``asyncio.timeout`` on the loop's clock, ``until``): a hang fails instead of blocking.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Hashable
from typing import Any

import pytest

from async_batcher import END, AsyncBatcher, BatcherStoppedError, testing
from async_batcher._core.engine import Engine
from async_batcher.policies import ClosedLoopHold, Deadline, DispatchPolicy
from tests.batchers import (
    AllKeyed,
    Recording,
    engine_of,
    idle_and_clean,
    later,
    regather_until,
    stop_as,
    turns,
    until,
    warm,
)

# The idle lanes a batcher keeps for their history (the policy's keep_idle).
KEEP_IDLE = DispatchPolicy.keep_idle

pytestmark = pytest.mark.virtual_time


def turn_pending(engine: Engine) -> bool:
    """A pump is scheduled (the regather's turns, while no batch has formed): ``testing.idle`` lists it too."""
    return engine.dispatcher.pump_handle is not None and not engine.dispatcher.pump_handle.cancelled()


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
    b = Recording(delay=1.0, policy=Deadline(0, regather=regather))
    lags = [0, 1, 2, 3] * 2
    results = await _cohort(b, lags, rounds=6)
    assert results == [[2 * (i + 100 * r) for r in range(6)] for i in range(8)]
    sizes = [len(batch) for batch in b.batches]
    if regather:
        assert sizes[:2] == [8, 2] and sizes[2:-1] == [8] * 4 and sum(sizes) == 48
    else:
        assert sizes[:3] == [8, 2, 8] and len(sizes) > 8 and min(sizes[3:]) < 8
    assert all(t == int(t) for t in b.started_at)  # turns take no time: every batch starts on a whole second
    assert testing.idle(b) == []  # an idle batcher keeps nothing scheduled
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
    assert testing.idle(b) == []


@pytest.mark.parametrize(("turns", "batches"), [(4, [[0, 1], [100, 101]]), (0, [[0, 1], [100], [101]])])
async def test_no_turns_no_regather(turns: int, batches: list[list[int]]) -> None:
    # turns=0 (the benchmarks' plain greedy reference): the first caller back goes alone. (4 is the default.)
    assert Deadline().turns == 4
    b = Recording(delay=1.0, policy=Deadline(0, turns=turns))
    async with asyncio.timeout(10):
        await warm(b, range(2))
    await _cohort(b, [0, 1], rounds=2)
    assert b.batches[2:] == batches
    await b.stop()


# ====================================================================== the regather on every path

# ---------------------------------------------------------------------- helpers


class Keyed(Recording):
    """Items below 100 go to the default lane (it is never forgotten); 100-199 to key 1, 200-299 to key 2..."""

    def batch_key(self, item: int) -> Hashable:
        return super().batch_key(item) if item < 100 else item // 100


# ---------------------------------------------------------------------- lanes


async def _two_lanes(other_lane_first: bool) -> Keyed:
    # Two slots. Lane B (key 1) has had lone callers; the default lane's last batch answered a cohort of two. The
    # cohort's callers come back 5 and 6 turns later (the first one back lets the turns pass, the second joins
    # it); with ``other_lane_first`` a lone caller of lane B (and another one turn later) arrives first.
    b = Keyed(delay=1.0, max_queue_time=0, max_hold_time=0, concurrency=2)
    async with asyncio.timeout(100):
        for _ in range(2):
            await b.process(100)
        await warm(b, [0, 1])
        assert regather_until(b) > asyncio.get_running_loop().time()
        del b.batches[:]
        calls = [later(5, lambda: b.process(10)), later(6, lambda: b.process(11))]
        if other_lane_first:
            calls += [later(0, lambda: b.process(150)), later(1, lambda: b.process(151))]
        await asyncio.gather(*calls)
    idle_and_clean(b)
    await b.stop()
    return b


async def test_a_cohort_on_the_default_lane_regathers_with_two_slots() -> None:
    # The rule as meant, with two slots: the cohort's first caller back waits for the turns; the second joins.
    b = await _two_lanes(other_lane_first=False)
    assert b.batches == [[10, 11]]


async def test_an_arrival_in_another_lane_does_not_use_up_the_cohorts_regather() -> None:
    b = await _two_lanes(other_lane_first=True)
    assert [10, 11] in b.batches, b.batches  # (each lane its own regather: mended)


async def test_a_lone_caller_in_another_lane_goes_at_once() -> None:
    b = await _two_lanes(other_lane_first=True)
    assert [150] in b.batches and [151] in b.batches, b.batches  # (each lane its own regather: mended)


async def test_a_full_batch_of_another_lane_in_the_first_arrival_waits_out_the_turns() -> None:
    # The first arrival after the default lane's cohort is a process_many of one default-lane item and a full
    # batch of lane B (three items, max_batch_size 3): the turns are judged by the first lane only, so B's full
    # batch waits them out too (two turns in, nothing is in flight), then both go at once, with the default-lane
    # caller one turn later. No time passes. (A full batch goes without turns when its own lane's arrival schedules
    # the pump; here the first lane's turns are already pending: turns only, no time.)
    async with asyncio.timeout(100):
        b = Keyed(delay=1.0, max_queue_time=0, max_hold_time=0, max_batch_size=3, concurrency=2)
        await warm(b, [1, 2])
        now = asyncio.get_running_loop().time()
        assert regather_until(b) > now
        del b.batches[:], b.started_at[:]
        seen: list[int] = []

        async def look() -> None:
            await turns(2)
            seen.append(b.stats.in_flight)

        got = await asyncio.gather(b.process_many([4, 150, 151, 152]), later(1, lambda: b.process(5)), look())
    assert got[:2] == [[8, 300, 302, 304], 10]
    assert seen == [0]
    assert sorted(b.batches) == [[4, 5], [150, 151, 152]] and b.started_at == [now, now]
    idle_and_clean(b)
    await b.stop()


async def _keyed_pair(cls: type[Recording]) -> list[list[int]]:
    # A cohort of two callers, twice; then its first caller back, and a task of the same lane one turn later.
    b = cls(delay=1.0, max_queue_time=0, max_hold_time=0)
    async with asyncio.timeout(100):
        await warm(b, [1, 2])
        del b.batches[:]
        assert await asyncio.gather(b.process(3), later(1, lambda: b.process(4))) == [6, 8]
    idle_and_clean(b)
    await b.stop()
    return b.batches


async def test_the_default_lanes_cohort_regathers() -> None:
    assert await _keyed_pair(Recording) == [[3, 4]]


async def test_a_keyed_lanes_cohort_regathers() -> None:
    # (Found here: a keyed lane was forgotten once empty, so it never had a history and stayed split, [[3], [4]].
    # Mended: the idle lanes that ended last are kept, KEEP_IDLE of them.)
    assert await _keyed_pair(AllKeyed) == [[3, 4]]


async def test_a_stream_of_new_keys_keeps_only_the_idle_lanes_that_ended_last() -> None:
    # Forty keys, one batch each, one after another: the idle lanes kept are bounded, and they are the latest.
    b = AllKeyed(delay=1.0, max_queue_time=0, max_hold_time=0)
    async with asyncio.timeout(1000):
        for key in range(40):
            await b.process(key * 100)
        queue = engine_of(b).queue
        lanes = queue.lanes
        assert len(lanes) <= 2 + KEEP_IDLE, len(lanes)  # the default lane, the bound, the last one (not pumped since)
        assert set(range(40 - KEEP_IDLE, 40)) <= set(lanes), sorted(k for k in lanes if k is not queue.lane0.key)
    idle_and_clean(b)
    await b.stop()


async def test_a_keyed_lane_pushed_out_by_newer_keys_starts_afresh() -> None:
    # A keyed cohort's lane, then more new keys than are kept, all while its cycle lasts (their batches take no
    # time): its history is gone, so its first caller back goes at once, as a new key's does.
    b = AllKeyed(delay=1.0, max_queue_time=0, max_hold_time=0)
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(1000):
        await warm(b, [1, 2])
        assert regather_until(b, engine_of(b).queue.lanes[0]) > loop.time()
        b.delay, now = 0.0, loop.time()
        for key in range(1, KEEP_IDLE + 3):
            await b.process(100 * key)
        assert loop.time() == now and 0 not in engine_of(b).queue.lanes
        b.delay = 1.0
        del b.batches[:]
        assert await asyncio.gather(b.process(3), later(1, lambda: b.process(4))) == [6, 8]
    assert b.batches == [[3], [4]]
    idle_and_clean(b)
    await b.stop()


# ---------------------------------------------------------------------- the first arrival: its shape, its leaving


async def _cohort_batcher(**kwargs: Any) -> Recording:
    b = Recording(delay=1.0, max_queue_time=0, max_hold_time=0, **kwargs)
    await warm(b, [1, 2])
    assert regather_until(b) > asyncio.get_running_loop().time()
    del b.batches[:], b.started_at[:]
    return b


async def test_a_process_many_smaller_than_a_batch_lets_the_turns_pass() -> None:
    # The first arrival is a process_many of two (the largest batch is three): it waits for the turns, and a
    # caller ready one turn later joins it. No virtual time passes for the turns.
    async with asyncio.timeout(100):
        b = await _cohort_batcher(max_batch_size=3)
        now = asyncio.get_running_loop().time()
        got = await asyncio.gather(b.process_many([4, 5]), later(1, lambda: b.process(9)))
    assert got == [[8, 10], 18]
    assert b.batches == [[4, 5, 9]] and b.started_at == [now]
    idle_and_clean(b)
    await b.stop()


async def test_the_long_path_first_arrival_with_a_priority_and_a_timeout() -> None:
    # The first arrival takes the long path (a timeout, a priority): it too waits for the turns, the caller one
    # turn later joins and, of a better priority, goes first in the batch; its timeout does not run out (the turns
    # take no time).
    async with asyncio.timeout(100):
        b = await _cohort_batcher()
        got = await asyncio.gather(
            b.process(4, timeout=1.5, priority=1), later(1, lambda: b.process(5, priority=0, timeout=1.5))
        )
    assert got == [8, 10]
    assert b.batches == [[5, 4]]
    assert b.stats.timed_out == 0
    idle_and_clean(b)
    await b.stop()


@pytest.mark.parametrize("how", ["cancel", "timeout"])
async def test_the_first_arrival_leaves_during_the_turns(how: str) -> None:
    # The first caller back leaves in the second turn (cancelled, or a timeout of 0 that runs out at once); a caller
    # that came in the first turn still goes, four turns after the first arrival (no time passes), alone; the one
    # that left never reaches process_batch; nothing stays scheduled.
    async with asyncio.timeout(100):
        b = await _cohort_batcher()
        now = asyncio.get_running_loop().time()
        first = asyncio.ensure_future(b.process(4) if how == "cancel" else b.process(4, timeout=0))
        second = asyncio.ensure_future(later(1, lambda: b.process(5)))
        await turns(2)
        assert b.batches == [] and turn_pending(engine_of(b))  # the turns are pending
        if how == "cancel":
            first.cancel()
        outcomes = await asyncio.gather(first, second, return_exceptions=True)
    expected = asyncio.CancelledError if how == "cancel" else TimeoutError
    assert isinstance(outcomes[0], expected) and outcomes[1] == 10
    assert b.batches == [[5]] and b.started_at == [now]
    s = b.stats
    assert (s.cancelled, s.timed_out) == ((1, 0) if how == "cancel" else (0, 1))
    idle_and_clean(b)
    await b.stop()


async def test_the_only_arrival_leaves_during_the_turns() -> None:
    # The first caller back is cancelled during the turns and nobody else comes: the turns run out on an empty
    # queue, and the batcher is idle: no timer, no pump, no batch. The next caller (in the same instant) goes at
    # once (the regather was used up).
    async with asyncio.timeout(100):
        b = await _cohort_batcher()
        first = asyncio.ensure_future(b.process(4))
        await turns(1)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        await turns(6)
        assert testing.idle(b) == []
        assert regather_until(b) == 0.0
        got = await asyncio.gather(b.process(6), later(1, lambda: b.process(7)))
    assert got == [12, 14]
    assert b.batches == [[6], [7]]
    idle_and_clean(b)
    await b.stop()


# ---------------------------------------------------------------------- settings, room, slots during the turns


@pytest.mark.parametrize("change", ["max_batch_size", "concurrency", "max_queue_time"])
async def test_a_setting_changed_during_the_regathers_turns(change: str) -> None:
    # The first caller back (4) waits for the turns; 5 came in the same turn, 6 comes in the third. In the second
    # turn (the turns pending: the change's own repump is a no-op) a setting changes; it applies to the batches the
    # turns form, and nothing is lost or sent twice:
    # - max_batch_size 3 -> 2 (4 and 5 are a full batch now: they still wait out the turns, as arrivals into
    #   pending turns always do, then go together; 6, come meanwhile, follows when they end, 1 s later);
    # - concurrency 1 -> 3 with max_batch_size -> 1: [4], [5], [6] at once;
    # - max_queue_time 0 -> 5: the batch waits for its oldest item's new deadline, 5 s later, and takes all three.
    async with asyncio.timeout(100):
        b = await _cohort_batcher(max_batch_size=10 if change == "max_queue_time" else 3)
        now = asyncio.get_running_loop().time()
        waiting: list[tuple[int, int]] = []

        async def change_it() -> None:
            await turns(2)
            assert turn_pending(engine_of(b)), "no turn pending"
            if change == "max_batch_size":
                b.max_batch_size = 2
            elif change == "concurrency":
                b.concurrency = 3
                b.max_batch_size = 1
            else:
                b.max_queue_time = 5
            await turns(1)
            waiting.append((b.stats.queued, len(b.batches)))

        got = await asyncio.gather(
            b.process(4), b.process(5), later(3, lambda: b.process(6)), change_it(), return_exceptions=True
        )
    assert got[:3] == [8, 10, 12]
    assert waiting == [(3, 0)]  # a full batch or not, they wait out the turns (6 came meanwhile)
    assert sorted(b.sent) == [4, 5, 6]
    if change == "max_batch_size":
        assert b.batches == [[4, 5], [6]] and b.started_at == [now, now + 1]
    elif change == "concurrency":
        assert b.batches == [[4], [5], [6]] and b.started_at == [now] * 3
    else:
        assert b.batches == [[4, 5, 6]] and b.started_at == [now + 5]
    idle_and_clean(b)
    await b.stop()


async def test_a_caller_waiting_for_room_during_the_turns() -> None:
    # The queue holds one item: the first caller back takes it and waits for the turns; a caller one turn later
    # waits for room (wait_when_full). The turns run out (four turns, no time), the batch [4] makes room, and the
    # waiting caller goes next, when [4] ends. Nobody waits longer than the batches take; nothing stays scheduled.
    async with asyncio.timeout(100):
        b = await _cohort_batcher()
        b.max_queue_size = 1
        b.wait_when_full = True
        now = asyncio.get_running_loop().time()
        room: list[int] = []

        async def second() -> int:
            await turns(1)
            call = asyncio.ensure_future(b.process(5))
            await turns(1)
            room.append(b.stats.awaiting_room)
            return await call

        got = await asyncio.gather(b.process(4), second())
    assert got == [8, 10] and room == [1]
    assert b.batches == [[4], [5]] and b.started_at == [now, now + 1]
    idle_and_clean(b)
    await b.stop()


class Gated90(Recording):
    """Recording whose batch holding item 90 waits for ``gate90`` and answers at once, unrecorded (the others
    sleep ``delay``)."""

    gate90: asyncio.Event

    async def process_batch(self, batch: list[int]) -> Any:
        if 90 in batch:
            await self.gate90.wait()
            return [x * 2 for x in batch]
        return await super().process_batch(batch)


async def test_a_batch_ending_during_the_regathers_turns_with_two_slots() -> None:
    # Two slots: a batch [90] runs beside the cohort's until its gate opens. The cohort's batch ends with nothing
    # waiting (the regather is set); its first caller back (4) waits for the turns, and in the second of them [90]
    # is let go: its end starts the count again, and its caller, calling again at once (91), joins, as does 5, a
    # turn after 4. One batch [4, 5, 91], at the instant 4 came: the turns took no time.
    async with asyncio.timeout(100):
        b = Gated90(max_queue_time=0, max_hold_time=0, concurrency=2)
        b.gate90 = asyncio.Event()

        async def long_caller() -> list[int]:
            first = await b.process(90)
            return [first, await b.process(91)]

        long_one = asyncio.ensure_future(long_caller())
        b.delay = 1.0
        await until(lambda: b.stats.in_flight == 1)
        await warm(b, [1, 2])  # t=0..1 and 1..2, beside [90]
        loop = asyncio.get_running_loop()
        assert regather_until(b) > loop.time()
        now = loop.time()
        del b.batches[:], b.started_at[:]

        async def open_gate() -> None:
            await turns(2)
            assert turn_pending(engine_of(b)) and b.batches == []  # the regather's turns are pending
            b.gate90.set()

        got = await asyncio.gather(b.process(4), later(1, lambda: b.process(5)), long_one, open_gate())
    assert got[:3] == [8, 10, [180, 182]]
    assert b.batches == [[4, 5, 91]] and b.started_at == [now]
    idle_and_clean(b)
    await b.stop()


# ---------------------------------------------------------------------- stops and restarts


@pytest.mark.parametrize("how", ["drain", "force", "timeout"])
async def test_a_stop_during_the_turns_then_a_restart(how: str) -> None:
    # A stop in the second of the regather's turns (a drain, a forced stop, a stop with a timeout shorter than the
    # batch): every caller resolves once, nothing is left scheduled on the stopped run, and a restart at the same
    # instant starts afresh: its first caller goes at once (a task one turn later follows in a batch of its own).
    async with asyncio.timeout(100):
        b = await _cohort_batcher()
        old = engine_of(b)
        first = asyncio.ensure_future(b.process(4))
        await turns(2)
        assert turn_pending(old) and b.batches == []
        await stop_as(b, how, timeout=0.5)
        outcome = (await asyncio.gather(first, return_exceptions=True))[0]
        assert old.dispatcher.wakeup.handle is None and not turn_pending(old)  # nothing left scheduled: the run stopped
        assert not old.queue.waiting and not old.dispatcher.in_flight and not await b.is_running()
        if how == "drain":
            assert outcome == 8 and b.batches == [[4]]
        else:
            assert isinstance(outcome, BatcherStoppedError), outcome
            assert b.batches == ([] if how == "force" else [[4]])  # (a forced stop fails it before it goes)
        del b.batches[:]
        b.start()
        got = await asyncio.gather(b.process(6), later(1, lambda: b.process(7)))
    assert engine_of(b) is not old
    assert got == [12, 14] and b.batches == [[6], [7]]
    idle_and_clean(b)
    await b.stop()


async def test_a_cohort_ending_during_a_drain_leaves_nothing_to_the_next_run() -> None:
    # The cohort's batch is still running when a drain begins: it ends during the drain, with nothing waiting, and
    # sets the regather on the stopping run (whose arrivals are all refused). A restart right after the stop starts
    # afresh: its first caller goes at once.
    async with asyncio.timeout(100):
        b = Recording(delay=1.0, max_queue_time=0, max_hold_time=0)
        await asyncio.gather(b.process(1), b.process(2))
        calls = asyncio.gather(b.process(1), b.process(2))
        await until(lambda: b.stats.in_flight == 1)
        old = engine_of(b)
        await b.stop()
        assert await calls == [2, 4]
        assert regather_until(b, old.queue.lane0) > 0  # (set during the drain: harmless, the run is over)
        with pytest.raises(BatcherStoppedError):
            await b.process(9)
        del b.batches[:]
        b.start()
        got = await asyncio.gather(b.process(6), later(1, lambda: b.process(7)))
    assert got == [12, 14] and b.batches == [[6], [7]]
    idle_and_clean(b)
    await b.stop()


# ---------------------------------------------------------------------- with the other rules


@pytest.mark.parametrize("regather", [True, False])
async def test_max_queue_time_with_the_regather_costs_no_time(regather: bool) -> None:
    # max_queue_time 0.5: the cohort's batches form 0.5 s after their callers come. The first caller back after a
    # cohort's batch waits for the turns, then for its deadline (a timer), exactly as without the regather: its
    # batch, with the caller one turn later, goes 0.5 s after it came; no timer is left.
    async with asyncio.timeout(100):
        b = Recording(delay=1.0, policy=Deadline(0.5, regather=regather))
        await warm(b, [1, 2])
        loop = asyncio.get_running_loop()
        assert (regather_until(b) > loop.time()) is regather
        now = loop.time()
        del b.batches[:], b.started_at[:]
        got = await asyncio.gather(b.process(4), later(1, lambda: b.process(5)))
    assert got == [8, 10]
    assert b.batches == [[4, 5]] and b.started_at == [now + 0.5]
    idle_and_clean(b)
    await b.stop()


@pytest.mark.parametrize("regather", [True, False])
@pytest.mark.parametrize("back", [1, 2])
async def test_the_hold_with_the_regather(regather: bool, back: int) -> None:
    # max_hold_time 0.5: the cohort's batch held all its callers, so a hold waits for them. With both back (the
    # second a turn after the first) their batch goes as they are all back; with one back, once the lane has had no
    # arrival for half the time the batch took (0.5 s). The same with the regather as without: the turns take no
    # time, and nothing stays scheduled.
    async with asyncio.timeout(100):
        # (What max_queue_time=0, max_hold_time=0.5 build, with the regather on or off.)
        b = Recording(delay=1.0, policy=ClosedLoopHold(0.5, Deadline(0, regather=regather)))
        await warm(b, [1, 2])
        assert (regather_until(b) > asyncio.get_running_loop().time()) is regather
        now = asyncio.get_running_loop().time()
        del b.batches[:], b.started_at[:]
        calls = [b.process(4)] + ([later(1, lambda: b.process(5))] if back == 2 else [])
        got = await asyncio.gather(*calls)
    assert got == [8, 10][:back]
    assert b.batches == [[4, 5][:back]] and b.started_at == [now + (0 if back == 2 else 0.5)]
    idle_and_clean(b)
    await b.stop()


class Reentrant(Recording):
    """Item 7's batch sleeps 2.5 s, then submits 70 to the batcher itself and answers with its result."""

    async def process_batch(self, batch: list[int]) -> Any:
        if 7 in batch:
            await asyncio.sleep(2.5)
            inner = await self.process(70)
            return [inner] * len(batch)
        return await super().process_batch(batch)


async def test_a_reentrant_call_is_the_first_arrival_after_the_cohort() -> None:
    # Two slots: [7] runs beside the cohort's batches; the cohort's last batch ends at 2 s with nothing waiting, and
    # at 2.5 s (within the cycle) [7] calls process(70) from inside: the first arrival into a free slot, it waits
    # for the turns, a caller one turn later joins, and [7] gets its result when [70, 71] ends. Nothing hangs.
    async with asyncio.timeout(100):
        b = Reentrant(delay=1.0, max_queue_time=0, max_hold_time=0, concurrency=2)
        outer = asyncio.ensure_future(b.process(7))
        await until(lambda: b.stats.in_flight == 1)
        await warm(b, [1, 2])
        loop = asyncio.get_running_loop()
        assert regather_until(b) == 3.0 and loop.time() == 2.0
        del b.batches[:], b.started_at[:]

        async def outside() -> int:
            await asyncio.sleep(0.5)
            await until(lambda: b.stats.queued == 1)  # 70 has come
            await turns(1)
            return await b.process(71)

        got = await asyncio.gather(outer, outside())
    assert got == [140, 142]
    assert b.batches == [[70, 71]] and b.started_at == [2.5]
    idle_and_clean(b)
    await b.stop()


class Streams(AsyncBatcher[int, int]):
    """Streams each item's double after ``delay`` seconds; records its batches."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.batches: list[list[int]] = []

    async def process_batch(self, batch: list[int]) -> AsyncIterator[list[Any]]:
        self.batches.append(list(batch))
        await asyncio.sleep(1.0)
        yield [x * 2 for x in batch]
        yield [END] * len(batch)


async def test_a_streaming_batch_sets_no_regather() -> None:
    # Streams: a streaming batch counts no callers answered (_streaming._end: a consumer comes back on its own, the
    # hold is not for it), so it never answers a cohort: after two consumers served together, twice, the first
    # back goes at once and one a turn later follows alone. (By design; the regather's docs do not say so.)
    b = Streams(max_queue_time=0, max_hold_time=0)

    async def consume(x: int) -> list[int]:
        return [part async for part in b.stream(x)]

    async with asyncio.timeout(100):
        for _ in range(2):
            await asyncio.gather(consume(1), consume(2))
        assert regather_until(b) == 0.0
        del b.batches[:]
        got = await asyncio.gather(consume(4), later(1, lambda: consume(5)))
    assert got == [[8], [10]]
    assert b.batches == [[4], [5]]
    idle_and_clean(b)
    await b.stop()
