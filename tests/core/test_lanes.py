"""Keyed lanes that keep their history (``Queue.drop_empty_lanes``, ``KEEP_IDLE``), on the loop's virtual clock.
Read through the public API, ``async_batcher.testing`` and the engine's objects (``engine_of(b).queue.lanes``, the
dispatch policy's memo of a lane).

The change: an idle ``batch_key`` lane (empty, no batch in flight) is no longer forgotten at the next
dispatch; the ``KEEP_IDLE`` (16) idle lanes whose last batch ended last stay, with their history, so that a keyed
cohort gets the regather's turns as the default lane's does. Checked from the outside: keys that misbehave once
kept, callers who leave a kept lane, priorities, weights turned on live, fairness with one slot, thousands of keys
churning with holds, ``process_many`` across keys, the adaptive wait, stops and restarts, a long idle spell.

Found by these tests, and mended in ``Queue.drop_empty_lanes`` (each now a test):

- A kept lane kept the queue entries of its callers who left (timed out, cancelled): a withdrawn entry stays in
  its lane's deque until the dispatcher reaches it, which for an idle kept lane was never. Each held the item, the
  caller's future and its context snapshot, any number of them. Now a lane kept idle lets go of its levels.
- A key whose hash changed after its call returned (a mutable key object, mutated: a contract breach, but the
  batcher used to have forgotten the lane by then) was still a dict key when its lane was evicted:
  ``del self.lanes[lane.key]`` raised ``KeyError`` inside the pump, which aborted the run and failed the in-flight
  callers of every other key; and if the same object was used again, evicting the old lane deleted the new one
  (found under the new hash): its queued caller was orphaned, never answered, and ``stop(force=True)`` hung. Now a
  lane is evicted only if its key still finds it; else it stays.
- A kept lane kept a priority level for every priority ever used in it, walked for each item taken. Now an idle
  kept lane lets go of them (the default lane still keeps its own: pre-existing, left).

Found on the way in the old core (pre-existing; a strict xfail then, a test now that holds on the engine): an
arrival on the keyed path did not wake the pump while a timer was armed, assuming the timer came no later than the
new item's deadline; a timer for another lane's hold does not, so a lane due at once waited for it with a slot free.

What held: the bound (the default lane, ``KEEP_IDLE`` idle lanes, and the lanes not idle) after every dispatch,
with thousands of keys churning under holds, two slots, priorities, ``process_many`` across keys, keys that are
the default key, and the adaptive wait; key objects beyond the kept ones are released; with one slot a fresh key
and the kept lanes back after an idle spell each count from when their item came (the engine's rule: the old core
kept a lane's place in the order served across an idle spell); a new run starts with no lane of the last one; a
kept lane's cohort regathers among fewer new keys than ``KEEP_IDLE``, and not after an idle spell longer than its
cycle; weights turned on live count right with kept lanes holding withdrawn entries. Invariants after each: every
accepted item resolved once, an idle batcher keeps no timer and no pump, ``violations()`` is empty, the counters
add up, the turns cost no virtual time. (Raising ``max_hold_time`` live revives a kept lane's expired hold, as it
does the default lane's: "as set now", by the documented rule; not pinned here.)

Every wait is bounded (``asyncio.timeout`` on the loop's clock, ``until``): a hang fails instead of blocking.
"""

from __future__ import annotations

import asyncio
import gc
import math
import weakref
from collections.abc import Hashable
from typing import Any

import pytest

from async_batcher import AsyncBatcher, BatcherStoppedError, testing
from async_batcher._core.lane import Lane
from async_batcher._core.queue import Queue
from async_batcher.policies import DispatchPolicy
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


# ---------------------------------------------------------------------- helpers


def lanes(b: AsyncBatcher[Any, Any]) -> dict[Hashable, Lane]:
    """The lanes ``b``'s engine keeps now, by key."""
    return engine_of(b).queue.lanes


class ByHundreds(Recording):
    """Items below 100 go to the default lane; 100-199 to key 1, 200-299 to key 2..."""

    def batch_key(self, item: int) -> Hashable:
        return super().batch_key(item) if item < 100 else item // 100


class Box:
    """An item that can be watched (weakref): its key and its number."""

    def __init__(self, key: Hashable, n: int) -> None:
        self.key, self.n = key, n


class Boxes(Recording):
    """Items are :class:`Box` es, keyed by their ``key``; each answers twice its number."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(answer=lambda batch: [x.n * 2 for x in batch], **kwargs)

    def batch_key(self, item: Box) -> Hashable:
        return item.key


class MutableKey:
    """A key whose hash follows a field that the caller changes after its call (a contract breach)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __hash__(self) -> int:
        return hash(("key", self.n))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MutableKey) and other.n == self.n


# ---------------------------------------------------------------------- what a kept lane keeps


async def test_a_kept_lane_lets_go_of_the_items_of_callers_who_left() -> None:
    b = Boxes(delay=1.0, max_queue_time=0, concurrency=1)
    refs: list[weakref.ref[Box]] = []
    async with asyncio.timeout(100):
        assert await b.process(Box(1, 1)) == 2  # key 1 has a history
        busy = asyncio.ensure_future(b.process(Box(0, 5)))  # the one slot, for a second
        await turns(2)
        for n in range(3):
            gone = Box(1, n)
            refs.append(weakref.ref(gone))
            with pytest.raises(TimeoutError):
                await b.process(gone, timeout=0.1)
        many = [Box(1, 7), Box(2, 8)]
        refs += [weakref.ref(x) for x in many]
        with pytest.raises(TimeoutError):
            await b.process_many(many, timeout=0.1)
        del gone, many
        assert await busy == 10
        for n in range(3):  # the batcher serves on (other keys): the dispatcher runs
            assert await b.process(Box(3, n)) == 2 * n
    gc.collect()
    assert [ref() for ref in refs] == [None] * len(refs), "a kept lane keeps items whose callers left"
    idle_and_clean(b)
    await b.stop()


async def test_a_kept_lane_does_not_keep_a_priority_level_for_every_priority_it_saw() -> None:
    b = ByHundreds(max_queue_time=0)
    async with asyncio.timeout(100):
        for p in range(200):
            assert await b.process(100 + p % 50, priority=p) == 2 * (100 + p % 50)
    lane = lanes(b)[1]
    assert not lane.count
    assert len(lane.levels) < 10, f"an empty lane keeps {len(lane.levels)} priority levels"
    idle_and_clean(b)
    await b.stop()


# ---------------------------------------------------------------------- keys that change once kept


async def test_a_key_mutated_after_its_call_does_not_fail_the_other_keys(loop_errors: list[dict[str, Any]]) -> None:
    b = Boxes(delay=1.0, max_queue_time=0, concurrency=None)
    key = MutableKey(1000)
    async with asyncio.timeout(100):
        assert await b.process(Box(key, 1)) == 2
        key.n = 2000  # the caller reuses its key object for something else
        got = await asyncio.gather(
            *(b.process(Box(MutableKey(i), i)) for i in range(KEEP_IDLE + 3)), return_exceptions=True
        )
    assert got == [2 * i for i in range(KEEP_IDLE + 3)]
    assert loop_errors == []
    idle_and_clean(b)
    await b.stop()


async def test_a_mutated_key_used_again_is_served(loop_errors: list[dict[str, Any]]) -> None:
    b = Boxes(delay=0.1, max_queue_time=10, max_batch_size=2, concurrency=None)
    key = MutableKey(1000)
    mine: asyncio.Future[int] | None = None
    try:
        async with asyncio.timeout(100):
            assert await asyncio.gather(b.process(Box(key, 1)), b.process(Box(key, 2))) == [2, 4]
            key.n = 2000
            mine = asyncio.ensure_future(b.process(Box(key, 7)))  # alone: it waits max_queue_time
            await turns(2)
            for i in range(KEEP_IDLE + 1):  # full batches of new keys, one after another: the old lane is evicted
                assert await asyncio.gather(b.process(Box(i, i)), b.process(Box(i, 50))) == [2 * i, 100]
                assert testing.violations(b) == []
            assert await mine == 14
        assert loop_errors == []
        idle_and_clean(b)
    finally:  # (an orphaned caller is not failed by a forced stop, and its count keeps the drain from ending)
        if mine is not None and not mine.done():
            mine.cancel()
            await asyncio.gather(mine, return_exceptions=True)
        async with asyncio.timeout(100):
            await b.stop(timeout=1)


# ---------------------------------------------------------------------- another lane's timer


@pytest.mark.parametrize("served_before", [False, True], ids=["new_key", "kept_lane"])
async def test_a_lane_due_at_once_does_not_wait_for_another_lanes_hold_timer(served_before: bool) -> None:
    # The default lane's hold keeps one of its callers with a timer; key 1 (new, or a lane kept from a batch before)
    # owes nobody and both slots are free: its item goes at once, not at the hold's timer. (The old core's strict
    # xfail: its arrival did not wake the pump while a timer was armed; the new engine wakes for an arrival into an
    # empty lane.)
    b = ByHundreds(max_queue_time=0, max_hold_time=1.0, delay=0.1, concurrency=2)
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(100):
        if served_before:
            assert await b.process(160) == 320
            assert 1 in lanes(b)
        assert await asyncio.gather(*(b.process(i) for i in range(4))) == [0, 2, 4, 6]  # the default lane's four
        back = asyncio.ensure_future(b.process(5))  # one of them back: the hold keeps it, with a timer
        await turns(3)
        assert engine_of(b).dispatcher.wakeup.handle is not None and not b.stats.in_flight
        sent = loop.time()
        assert await b.process(150) == 300  # key 1 owes nobody, and both slots are free
        assert b.started_at[b.batches.index([150])] == sent
        assert await back == 10
    idle_and_clean(b)
    await b.stop()


# ---------------------------------------------------------------------- what held


async def test_with_one_slot_kept_lanes_back_after_an_idle_spell_count_from_when_they_came() -> None:
    # One slot, batches of one item taking 1 s. Keys 1 and 2 are kept lanes, served long ago; key 7 is new. Each
    # key counts from when its item came, whatever its history: 100, come while [700] ran, goes before 701 (its lane
    # just served); 701, waiting since [900] ran, goes before 200, come later, though key 2 was last served before
    # key 7 ever came. (The old core kept a lane's place in the order it was served across an idle spell: 200 went
    # before 701. The rule changed with the engine: a key back after an idle spell does not overtake a key already
    # waiting, tests/core/test_engine.py.)
    b = AllKeyed(delay=1.0, max_queue_time=0, concurrency=1, max_batch_size=1)
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(100):
        for key in (1, 2, 3):
            assert await b.process(100 * key) == 200 * key
        assert {1, 2, 3} <= set(lanes(b)) and loop.time() == 3.0  # kept, with their history
        busy = asyncio.ensure_future(b.process(900))
        await turns(2)
        calls = [asyncio.ensure_future(b.process(x)) for x in (700, 701)]
        await asyncio.sleep(1.5)
        assert b.batches[-1] == [700]
        calls.append(asyncio.ensure_future(b.process(100)))
        await asyncio.sleep(1.0)
        assert b.batches[-1] == [100]
        calls.append(asyncio.ensure_future(b.process(200)))
        assert await busy == 1800
        assert await asyncio.gather(*calls) == [1400, 1402, 200, 400]
    assert b.batches[3:] == [[900], [700], [100], [701], [200]]
    assert b.started_at[3:] == [3.0, 4.0, 5.0, 6.0, 7.0]
    idle_and_clean(b)
    await b.stop()


class Key:
    """A key object to watch (weakref); keys of the same number are equal."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __hash__(self) -> int:
        return hash(self.n)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Key) and other.n == self.n


class Churn(Recording):
    """Item ``i`` has a key object of its own, ``Key(i)``, but multiples of 7 are the default key's."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.keys: list[weakref.ref[Key]] = []

    def batch_key(self, item: int) -> Hashable:
        if item % 7 == 0:
            return super().batch_key(item)
        key = Key(item)
        self.keys.append(weakref.ref(key))
        return key


@pytest.mark.parametrize("adaptive", [False, True], ids=["fixed", "max_latency"])
async def test_thousands_of_keys_churning_keep_the_bound_and_release_their_keys(
    adaptive: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Closed-loop clients, each on a new key every call (some on the default key), two slots, holds, priorities,
    # and process_many across keys: after every dispatch, at most KEEP_IDLE idle lanes are left besides the
    # default one; at the end, the key objects of the lanes pushed out are gone.
    over: list[int] = []
    looks = [0]
    drop = Queue.drop_empty_lanes

    def checked(queue: Queue, keep: int) -> None:
        drop(queue, keep)
        looks[0] += 1
        idle = [
            lane for lane in queue.lanes.values() if not lane.count and not lane.in_flight and lane is not queue.lane0
        ]
        if len(idle) > KEEP_IDLE:
            over.append(len(idle))

    monkeypatch.setattr(Queue, "drop_empty_lanes", checked)
    kwargs: dict[str, Any] = {"max_latency": 0.05} if adaptive else {"max_queue_time": 0.002}
    b = Churn(delay=0.01, max_hold_time=0.02, concurrency=2, **kwargs)
    loop = asyncio.get_running_loop()

    async def client(c: int) -> None:
        for r in range(40):
            x = 1000 * r + 10 * c
            if r % 5 == 4:
                assert await b.process_many([x, x + 1, x + 2], priority=r % 3) == [2 * x, 2 * x + 2, 2 * x + 4]
            else:
                assert await b.process(x, priority=c % 3) == 2 * x

    async with asyncio.timeout(1000):
        await asyncio.gather(*(client(c) for c in range(25)))
        await asyncio.sleep(1)
        sent = loop.time()
        assert await b.process(7) == 14  # (the default key's) one more dispatch after the holds are over
        assert loop.time() - sent <= 0.06
    assert over == [] and looks[0] > 100  # (checked after every dispatch pass: hundreds of them)
    queue = engine_of(b).queue
    kept = queue.lanes
    assert kept[queue.lane0.key] is queue.lane0
    assert len(kept) <= 1 + KEEP_IDLE, len(kept)
    gc.collect()
    alive = [key for key in (ref() for ref in b.keys) if key is not None]
    assert len(b.keys) > 1000
    assert all(key in kept for key in alive) and len(alive) <= KEEP_IDLE, len(alive)
    idle_and_clean(b)
    await b.stop()


@pytest.mark.parametrize("how", ["drain", "force", "timeout"])
async def test_a_new_run_keeps_no_lane_of_the_last_one(how: str) -> None:
    # A keyed cohort, kept lanes, and a keyed batch in flight when the stop comes; the next run starts afresh: no
    # lane of the last run, and the cohort's key has no history (its first caller back goes at once, as a new key's).
    gate = asyncio.Event()
    b = AllKeyed(delay=1.0, max_queue_time=0, max_hold_time=0.5)
    async with asyncio.timeout(100):
        await warm(b, [1, 2])
        assert regather_until(b, lanes(b)[0]) > asyncio.get_running_loop().time()
        for key in range(1, 6):
            assert await b.process(100 * key) == 200 * key
        b.gate = gate
        flying = asyncio.ensure_future(b.process(950))
        await until(lambda: b.stats.in_flight == 1)
        stopping = asyncio.ensure_future(stop_as(b, how, timeout=0.5))
        await turns(2)
        gate.set()
        await stopping
        outcome = await asyncio.gather(flying, return_exceptions=True)
        if how == "drain":
            assert outcome == [1900]
        else:
            assert isinstance(outcome[0], BatcherStoppedError), outcome
        b.gate = None
        del b.batches[:]
        b.start()
        assert await asyncio.gather(b.process(3), later(1, lambda: b.process(4))) == [6, 8]
    assert b.batches == [[3], [4]]
    assert set(lanes(b)) == {engine_of(b).queue.lane0.key, 0}
    idle_and_clean(b)
    await b.stop()


async def test_a_kept_lanes_cohort_regathers_among_fewer_new_keys_than_are_kept() -> None:
    # A keyed cohort, then KEEP_IDLE - 1 new keys (their batches take no time): its lane is still there, and the
    # cohort's first caller back lets the turns pass, at no cost in time.
    b = AllKeyed(delay=1.0, max_queue_time=0, max_hold_time=0)
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(100):
        await warm(b, [1, 2])
        b.delay = 0.0
        for key in range(1, KEEP_IDLE):
            assert await b.process(100 * key) == 200 * key
        assert 0 in lanes(b) and len(lanes(b)) == 1 + KEEP_IDLE
        b.delay = 1.0
        del b.batches[:], b.started_at[:]
        now = loop.time()
        assert await asyncio.gather(b.process(3), later(1, lambda: b.process(4))) == [6, 8]
    assert b.batches == [[3, 4]] and b.started_at == [now]
    idle_and_clean(b)
    await b.stop()


async def test_a_kept_lanes_lone_caller_after_an_idle_spell_goes_at_once() -> None:
    # A keyed cohort's lane is kept with its regather; its next caller comes after more than the lane's cycle
    # (1 s): an idle spell, so it goes at once (a caller one turn later does not join it).
    b = AllKeyed(delay=1.0, max_queue_time=0, max_hold_time=0)
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(100):
        await warm(b, [1, 2])
        lane = lanes(b)[0]
        assert regather_until(b, lane) > loop.time()
        await asyncio.sleep(1.5)
        assert lane is lanes(b)[0] and regather_until(b, lane)  # kept, its regather (stale) too
        del b.batches[:]
        assert await asyncio.gather(b.process(3), later(1, lambda: b.process(4))) == [6, 8]
    assert b.batches == [[3], [4]]
    assert regather_until(b, lane) == 0.0
    idle_and_clean(b)
    await b.stop()


async def test_weights_turned_on_live_count_right_with_kept_lanes_holding_callers_who_left() -> None:
    # Kept lanes hold withdrawn entries (callers timed out: single and process_many across keys); items wait in
    # two lanes; max_batch_weight comes on live (items weigh 1 each: item_weight is overridden, as a weight limit
    # needs): the counts stay right, and the batches keep the limit.
    class Weighed(ByHundreds):
        def item_weight(self, item: int) -> float:
            return 1.0

    b = Weighed(delay=1.0, max_queue_time=0, concurrency=1)
    async with asyncio.timeout(100):
        for x in (100, 200, 300):
            assert await b.process(x) == 2 * x
        busy = asyncio.ensure_future(b.process(400))
        await turns(2)
        with pytest.raises(TimeoutError):
            await b.process(101, timeout=0.1)
        with pytest.raises(TimeoutError):
            await b.process_many([102, 201, 5], timeout=0.1)
        waiting = [asyncio.ensure_future(b.process(x)) for x in (301, 302, 303, 6, 7)]
        await turns(2)
        b.max_batch_weight = 2
        assert testing.violations(b) == []
        queue = engine_of(b).queue
        assert math.isclose(queue.lanes[3].weight, 3) and math.isclose(queue.lane0.weight, 2)
        assert await busy == 800
        assert await asyncio.gather(*waiting) == [602, 604, 606, 12, 14]
        assert await b.process(103) == 206
    assert all(len(batch) <= 2 for batch in b.batches[4:]), b.batches
    assert sorted(x for batch in b.batches[4:] for x in batch) == [6, 7, 103, 301, 302, 303]
    idle_and_clean(b)
    await b.stop()
