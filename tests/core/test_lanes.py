"""Keyed lanes that keep their history (``Queue.drop_empty_lanes``, ``KEEP_IDLE``), on the loop's virtual clock.

The change: an idle ``batch_key`` lane (empty, no batch in flight, no hold) is no longer forgotten at the next
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

Left, as a strict xfail (pre-existing, not the change's, found on the way): on the keyed path,
``_dispatch.arrived`` does not wake the pump while a timer is armed, assuming the timer comes no later than the new
item's deadline; a timer for another lane's hold does not, so a lane due at once waits for it with a slot free.

What held: the bound (the default lane, ``KEEP_IDLE`` idle lanes, and the lanes not idle) after every dispatch,
with thousands of keys churning under holds, two slots, priorities, ``process_many`` across keys, keys that are
the default key, and the adaptive wait; key objects beyond the kept ones are released; with one slot a fresh key
goes first, then the kept lanes in the order they were served; a new run starts with no lane of the last one; a
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
from async_batcher._queue import DEFAULT_KEY, KEEP_IDLE, Queue
from async_batcher._run import violations

from async_batcher import BatcherStoppedError
from tests.batchers import AllKeyed, Recording, idle_and_clean, later, stop_as, turns, until, warm

pytestmark = pytest.mark.virtual_time


# ---------------------------------------------------------------------- helpers


class ByHundreds(Recording):
    """Items below 100 go to the default lane; 100-199 to key 1, 200-299 to key 2..."""

    def batch_key(self, item: int) -> Hashable:
        return DEFAULT_KEY if item < 100 else item // 100


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
    lane = b._run.queue.lanes[1]
    assert not lane.count
    assert len(lane.levels) < 10, f"an empty lane keeps {len(lane.levels)} priority levels"
    idle_and_clean(b)
    await b.stop()


# ---------------------------------------------------------------------- keys that change once kept


async def test_a_key_mutated_after_its_call_does_not_fail_the_other_keys(loop_errors: list[dict[str, Any]]) -> None:
    b = Boxes(delay=1.0, max_queue_time=0, concurrency=-1)
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
    b = Boxes(delay=0.1, max_queue_time=10, max_batch_size=2, concurrency=-1)
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
                assert violations(b._run) == []
            assert await mine == 14
        assert loop_errors == []
        idle_and_clean(b)
    finally:  # (an orphaned caller is not failed by a forced stop, and its count keeps the drain from ending)
        if mine is not None and not mine.done():
            mine.cancel()
            await asyncio.gather(mine, return_exceptions=True)
        async with asyncio.timeout(100):
            await b.stop(timeout=1)


# ---------------------------------------------------------------------- another lane's timer (pre-existing)


@pytest.mark.xfail(
    strict=True,
    reason="pre-existing, not this change's: _dispatch.arrived does not wake the pump while a timer is armed "
    "unless the lane is full or its own hold's callers are back, taking the timer to come no later than the new "
    "item's deadline; another lane's hold timer comes later, so a keyed item due at once (max_queue_time=0) waits "
    "for it with both slots free (0.05 s here)",
)
async def test_a_lane_due_at_once_does_not_wait_for_another_lanes_hold_timer() -> None:
    b = ByHundreds(max_queue_time=0, max_hold_time=1.0, delay=0.1, concurrency=2)
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(100):
        assert await asyncio.gather(*(b.process(i) for i in range(4))) == [0, 2, 4, 6]  # the default lane's four
        back = asyncio.ensure_future(b.process(5))  # one of them back: the hold keeps it, with a timer
        await turns(3)
        assert b._run.timer is not None and not b._run.in_flight
        sent = loop.time()
        assert await b.process(150) == 300  # key 1 owes nobody, and both slots are free
        assert b.started_at[b.batches.index([150])] == sent
        assert await back == 10
    idle_and_clean(b)
    await b.stop()


# ---------------------------------------------------------------------- what held


async def test_with_one_slot_a_fresh_key_goes_first_then_the_kept_lanes_in_the_order_they_were_served() -> None:
    b = AllKeyed(delay=1.0, max_queue_time=0, concurrency=1)
    async with asyncio.timeout(100):
        for key in (1, 2, 3):
            assert await b.process(100 * key) == 200 * key
        assert {1, 2, 3} <= set(b._run.queue.lanes)  # kept, with their turns served
        busy = asyncio.ensure_future(b.process(900))
        await turns(2)
        calls = [asyncio.ensure_future(b.process(x)) for x in (300, 301, 100, 700, 200)]
        await turns(2)
        calls.append(asyncio.ensure_future(b.process(302)))
        assert await busy == 1800
        assert await asyncio.gather(*calls) == [600, 602, 200, 1400, 400, 604]
    assert b.batches[4:] == [[700], [100], [200], [300, 301, 302]]
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
            return DEFAULT_KEY
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
    drop = Queue.drop_empty_lanes

    def checked(queue: Queue, held_since: float) -> None:
        drop(queue, held_since)
        idle = [
            lane
            for lane in queue.lanes.values()
            if not lane.count and not lane.in_flight and lane.hold_from <= held_since and lane is not queue.lane0
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
    assert over == []
    lanes = b._run.queue.lanes
    assert lanes[DEFAULT_KEY] is b._run.queue.lane0
    assert len(lanes) <= 1 + KEEP_IDLE, len(lanes)
    gc.collect()
    alive = [key for key in (ref() for ref in b.keys) if key is not None]
    assert len(b.keys) > 1000
    assert all(key in lanes for key in alive) and len(alive) <= KEEP_IDLE, len(alive)
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
        assert b._run.queue.lanes[0].regather_until > asyncio.get_running_loop().time()
        for key in range(1, 6):
            assert await b.process(100 * key) == 200 * key
        b.gate = gate
        flying = asyncio.ensure_future(b.process(950))
        await until(lambda: b._run.in_flight == 1)
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
    assert set(b._run.queue.lanes) == {DEFAULT_KEY, 0}
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
        assert 0 in b._run.queue.lanes and len(b._run.queue.lanes) == 1 + KEEP_IDLE
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
        lane = b._run.queue.lanes[0]
        assert lane.regather_until > loop.time()
        await asyncio.sleep(1.5)
        assert lane is b._run.queue.lanes[0] and lane.regather_until  # kept, its regather (stale) too
        del b.batches[:]
        assert await asyncio.gather(b.process(3), later(1, lambda: b.process(4))) == [6, 8]
    assert b.batches == [[3], [4]]
    assert lane.regather_until == 0.0
    idle_and_clean(b)
    await b.stop()


async def test_weights_turned_on_live_count_right_with_kept_lanes_holding_callers_who_left() -> None:
    # Kept lanes hold withdrawn entries (callers timed out: single and process_many across keys); items wait in
    # two lanes; max_batch_weight comes on live (Queue.keep_weights walks every lane): the counts stay right, and
    # the batches keep the limit.
    b = ByHundreds(delay=1.0, max_queue_time=0, concurrency=1)
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
        assert violations(b._run) == []
        assert math.isclose(b._run.queue.lanes[3].weight, 3) and math.isclose(b._run.queue.lane0.weight, 2)
        assert await busy == 800
        assert await asyncio.gather(*waiting) == [602, 604, 606, 12, 14]
        assert await b.process(103) == 206
    assert all(len(batch) <= 2 for batch in b.batches[4:]), b.batches
    assert sorted(x for batch in b.batches[4:] for x in batch) == [6, 7, 103, 301, 302, 303]
    idle_and_clean(b)
    await b.stop()
