"""Per-key batches, weighted batches, priorities (on the loop's virtual clock)."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Hashable
from typing import Any

import pytest

from async_batcher import Limits
from async_batcher import batch as batched
from async_batcher.policies import DispatchPolicy
from tests.batchers import Recording, Sleepy, Tens, outcome, settled, until

# The idle lanes a batcher keeps for their history (the policy's keep_idle).
KEEP_IDLE = DispatchPolicy.keep_idle

pytestmark = pytest.mark.virtual_time


class ByKey(Recording):
    """Batches by ``item // 100`` (so 1, 2 share a key; 101 is another)."""

    def batch_key(self, item: int) -> Hashable:
        return item // 100


class ByWeight(Recording):
    """An item weighs its value modulo 100."""

    def item_weight(self, item: int) -> float:
        return item % 100


async def test_items_with_different_keys_never_share_a_batch() -> None:
    b = ByKey(max_batch_size=10, max_queue_time=1.0)
    results = await asyncio.gather(*(b.process(i) for i in (1, 101, 2, 201, 102, 3)))
    assert results == [2, 202, 4, 402, 204, 6]
    assert sorted(b.batches) == [[1, 2, 3], [101, 102], [201]]
    await b.stop()


async def test_each_key_keeps_its_own_deadline_and_size_trigger() -> None:
    b = ByKey(max_batch_size=3, max_queue_time=1.0)
    a = asyncio.ensure_future(b.process(1))
    await asyncio.sleep(0.5)
    others = asyncio.gather(*(b.process(i) for i in (101, 102, 103)))  # key 1 fills at once
    await until(lambda: len(b.batches) == 1)
    assert b.batches == [[101, 102, 103]] and b.started_at == [0.5]
    await others
    assert await a == 2
    assert b.batches[1] == [1] and b.started_at[1] == 1.0  # key 0's own deadline
    await b.stop()


class Key:
    """A batch key that can be referred to weakly: whether the batcher still holds it can be seen from outside."""

    def __init__(self, n: int) -> None:
        self.n = n


async def test_keys_come_and_go() -> None:
    class ByKeyObject(Recording):
        def batch_key(self, item: Any) -> Hashable:
            return item[0]

        async def process_batch(self, batch: list[Any]) -> Any:  # type: ignore[override]
            return [n for _, n in batch]

    b = ByKeyObject(max_queue_time=0)
    seen: list[weakref.ref[Key]] = []
    rounds = 5 + KEEP_IDLE // 3
    for round_ in range(rounds):
        keys = [Key(round_ * 10 + i) for i in range(3)]
        seen += [weakref.ref(k) for k in keys]
        assert await asyncio.gather(*(b.process((k, k.n)) for k in keys)) == [k.n for k in keys]
        del keys
    gc.collect()
    # The batcher keeps the idle lanes that ended last (their history), KEEP_IDLE of them, and no lane for a key
    # that is gone before them.
    alive = [ref() is not None for ref in seen]
    assert alive == [False] * (len(seen) - KEEP_IDLE) + [True] * KEEP_IDLE
    assert b.stats.batches == 3 * rounds
    await b.stop()


async def test_when_slots_are_scarce_keys_take_turns() -> None:
    gate = asyncio.Event()
    b = ByKey(max_batch_size=2, max_queue_time=0, gate=gate)
    flood = asyncio.gather(*(b.process(i) for i in range(20)))  # key 0: ten batches' worth
    await until(lambda: len(b.batches) == 1)
    single = asyncio.ensure_future(b.process(150))  # key 1 arrives late
    await asyncio.sleep(0)
    gate.set()
    await flood
    await single
    assert b.batches[:3] == [[0, 1], [150], [2, 3]]
    await b.stop()


async def test_an_unhashable_key_is_refused_naming_it() -> None:
    class Bad(Recording):
        def batch_key(self, item: int) -> Hashable:
            return [item]  # type: ignore[return-value]

    b = Bad()
    with pytest.raises(TypeError, match=r"unhashable key: \[7\]"):
        await b.process(7)
    await b.stop()


async def test_a_batch_closes_before_an_item_that_would_overflow_its_weight() -> None:
    b = ByWeight(max_batch_weight=10, max_queue_time=1.0)
    results = await asyncio.gather(*(b.process(i) for i in (4, 4, 4, 2, 9, 1)))
    assert results == [8, 8, 8, 4, 18, 2]
    assert b.batches == [[4, 4], [4, 2], [9, 1]]
    # Full by weight means full: none of them waited for max_queue_time.
    assert b.started_at == [0, 0, 0]
    await b.stop()


async def test_an_item_heavier_than_the_limit_fails_alone_and_blocks_nothing() -> None:
    b = ByWeight(max_batch_weight=10, max_queue_time=0)
    results = await asyncio.gather(b.process(3), b.process(11), b.process(5), return_exceptions=True)
    assert results[0] == 6 and results[2] == 10
    assert isinstance(results[1], ValueError) and "11" in str(results[1]) and "max_batch_weight=10" in str(results[1])
    assert b.sent == [3, 5]
    assert b.stats.rejected == 1
    await b.stop()


def test_max_batch_weight_without_item_weight_is_an_error_naming_the_hook_at_construction_and_live() -> None:
    # Every item would weigh 1: a second max_batch_size, silently (it was taken so: batches of 3 for
    # max_batch_weight=3). As max_queue_weight without the hook, refused, naming the fix.
    needs = r"max_batch_weight=3\.0 needs the item_weight\(\) hook, which the batcher does not override"
    with pytest.raises(ValueError, match=needs) as info:
        Recording(max_batch_weight=3, max_queue_time=0)
    assert "max_batch_size" in str(info.value) and "@batch: weight=" in str(info.value)
    with pytest.raises(ValueError, match=needs):
        Recording(limits=Limits(max_batch_weight=3))
    b = Recording(max_batch_size=4)
    with pytest.raises(ValueError, match=needs):
        b.max_batch_weight = 3
    with pytest.raises(ValueError, match=needs):
        b.limits = Limits(max_batch_size=4, max_batch_weight=3)
    assert b.limits == Limits(max_batch_size=4)  # the old value kept
    with pytest.raises(ValueError, match="weight="):
        batched(max_batch_weight=3)(_double)
    assert batched(max_batch_weight=3, weight=len)(_double).batcher.max_batch_weight == 3.0


async def _double(items: list[int]) -> list[int]:
    return [x * 2 for x in items]


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "2"])
async def test_a_bad_weight_is_refused_naming_it(bad: Any) -> None:
    class Bad(Recording):
        def item_weight(self, item: int) -> float:
            return bad  # type: ignore[no-any-return]

    b = Bad(max_batch_weight=10)
    with pytest.raises(ValueError, match="item_weight"):
        await b.process(1)
    await b.stop()


@pytest.mark.parametrize("bad", [0, -1, float("inf"), "5", True])
def test_a_bad_max_batch_weight_is_refused_naming_it(bad: Any) -> None:
    with pytest.raises(ValueError, match="max_batch_weight") as info:
        Recording(max_batch_weight=bad)
    assert repr(bad) in str(info.value)


async def test_lower_priority_values_go_first_and_fifo_within_a_priority() -> None:
    gate = asyncio.Event()
    b = Recording(max_batch_size=3, max_queue_time=0, gate=gate)
    first = asyncio.ensure_future(b.process(0))
    await until(lambda: b.batches)
    calls = [asyncio.ensure_future(b.process(i, priority=p)) for i, p in [(1, 5), (2, 5), (3, 0), (4, 1), (5, 0)]]
    await asyncio.sleep(0)
    gate.set()
    await asyncio.gather(first, *calls)
    assert b.batches == [[0], [3, 5, 4], [1, 2]]
    await b.stop()


async def test_a_low_priority_item_is_not_passed_over_for_longer_than_max_priority_wait() -> None:
    b = Recording(max_batch_size=1, max_queue_time=0, delay=0.1, max_priority_wait=0.35)

    urgent_calls: list[asyncio.Future[int]] = []

    async def stream_of_urgent_items() -> None:
        for i in range(100, 120):
            urgent_calls.append(asyncio.ensure_future(b.process(i, priority=-1)))
            await asyncio.sleep(0.05)

    urgent = asyncio.ensure_future(stream_of_urgent_items())
    await asyncio.sleep(0.01)
    low = asyncio.ensure_future(b.process(1, priority=10))
    assert await low == 2
    sent_at = b.started_at[b.sent.index(1)]
    # Passed over while it was young; sent by the first free slot after it waited max_priority_wait.
    assert 0.36 <= sent_at <= 0.36 + 0.1 + 1e-9
    await urgent
    assert await asyncio.gather(*urgent_calls) == [i * 2 for i in range(100, 120)]
    await b.stop()


async def test_max_priority_wait_holds_when_arrivals_tie() -> None:
    # On the virtual clock (and on a coarse clock) items that come together have equal arrival times: the better
    # priority won every tie among the items that had waited max_priority_wait, and the low one, passed over while
    # the eleven urgent ones that came with it went one by one, was sent at 1.1 s, past its 0.35 s.
    b = Recording(max_batch_size=1, max_queue_time=0, delay=0.1, max_priority_wait=0.35)
    first = asyncio.ensure_future(b.process(0))
    await until(lambda: b.batches)
    urgent = [asyncio.ensure_future(b.process(i, priority=-1)) for i in range(100, 111)]
    low = asyncio.ensure_future(b.process(1, priority=10))
    assert await low == 2
    sent_at = b.started_at[b.sent.index(1)]
    assert 0.35 <= sent_at <= 0.35 + 0.1 + 1e-9  # the first free slot once it has waited max_priority_wait
    assert await asyncio.gather(first, *urgent) == [0, *(i * 2 for i in range(100, 111))]
    # The others that tied with it kept their order among themselves: the urgent items, first come, first served.
    assert [x for x in b.sent if x >= 100] == list(range(100, 111))
    await b.stop()


async def test_past_max_priority_wait_the_oldest_goes_first_and_of_a_tie_the_one_passed_over() -> None:
    b = Recording(max_batch_size=1, max_queue_time=0, delay=0.1, max_priority_wait=0.05)
    first = asyncio.ensure_future(b.process(0))
    await until(lambda: b.batches)
    low = asyncio.ensure_future(b.process(1, priority=10))
    await asyncio.sleep(0.01)
    later = [asyncio.ensure_future(b.process(i, priority=p)) for i, p in ((2, -1), (3, 5))]
    await asyncio.gather(first, low, *later)
    # At 0.1 each has waited past 0.05: the oldest first (1, though its priority is the worst); then 2 and 3, which
    # came together: the one passed over for a better priority (3) first, or it could be passed over again.
    assert b.sent == [0, 1, 3, 2]
    await b.stop()


@pytest.mark.parametrize("bad", [float("nan"), "1", None])
async def test_a_bad_priority_is_refused(bad: Any) -> None:
    b = Recording()
    with pytest.raises(ValueError, match="priority"):
        await b.process(1, priority=bad)
    await b.stop()


async def test_process_many_with_keys_and_weights_keeps_the_order_of_its_results() -> None:
    class Both(ByKey):
        def item_weight(self, item: int) -> float:
            return 1 + item % 3

    b = Both(max_batch_weight=4, max_queue_time=0)
    items = [1, 101, 2, 102, 3, 4, 201, 5]
    assert await b.process_many(items) == [x * 2 for x in items]
    for batch in b.batches:
        assert len({x // 100 for x in batch}) == 1
        assert sum(1 + x % 3 for x in batch) <= 4
    assert sorted(b.sent) == sorted(items)
    await b.stop()


async def test_process_many_with_keys_withdraws_everything_unsent_when_cancelled() -> None:
    gate = asyncio.Event()
    b = ByKey(max_batch_size=2, max_queue_time=0, gate=gate)
    call = asyncio.ensure_future(b.process_many([1, 2, 3, 101, 102, 103]))
    await until(lambda: b.batches)
    call.cancel()
    gate.set()
    with pytest.raises(asyncio.CancelledError):
        await call
    await asyncio.sleep(1)
    assert b.stats.queued == 0
    assert len(b.sent) == 2
    await b.stop()


async def test_a_default_priority_item_goes_before_items_of_a_worse_priority_queued_alone() -> None:
    gate = asyncio.Event()
    b = ByKey(max_batch_size=2, max_queue_time=0, gate=gate)  # items 100.. share a key lane
    first = asyncio.ensure_future(b.process(100))
    await until(lambda: b.batches)
    late = [asyncio.ensure_future(b.process(i, priority=5)) for i in (101, 102)]
    await asyncio.sleep(0)
    urgent = asyncio.ensure_future(b.process(103))
    await asyncio.sleep(0)
    gate.set()
    await asyncio.gather(first, *late, urgent)
    assert b.batches == [[100], [103, 101], [102]]
    await b.stop()


async def test_a_weight_limit_set_on_a_running_batcher_counts_the_items_already_queued() -> None:
    class Ones(Recording):
        def item_weight(self, item: int) -> float:
            return 1.0

    gate = asyncio.Event()
    b = Ones(max_queue_time=0, gate=gate)
    first = asyncio.ensure_future(b.process(0))
    await until(lambda: b.batches)
    queued = [asyncio.ensure_future(b.process(i)) for i in range(1, 8)]
    bulk = asyncio.ensure_future(b.process_many([8, 9, 10]))
    await until(lambda: b.stats.queued == 10)
    queued[0].cancel()  # withdrawn in place, before the switch
    await asyncio.sleep(0)
    b.max_batch_weight = 3  # every item weighs 1 now
    gate.set()
    assert await asyncio.gather(first, *queued[1:], bulk) == [0, 4, 6, 8, 10, 12, 14, [16, 18, 20]]
    assert b.batches[1:] == [[2, 3, 4], [5, 6, 7], [8, 9, 10]]
    await b.stop()


async def test_keys_are_served_in_turn_the_one_served_longest_ago_first() -> None:
    gate = asyncio.Event()
    b = ByKey(max_batch_size=1, max_queue_time=0, gate=gate)
    held = asyncio.ensure_future(b.process(900))  # key 9 holds the only slot
    await until(lambda: b.batches)
    # Three keys wait, queued in the order 2, 0, 1 (two batches' worth each).
    calls = [asyncio.ensure_future(b.process(k * 100 + i)) for i in range(2) for k in (2, 0, 1)]
    await asyncio.sleep(0)
    gate.set()
    await asyncio.gather(held, *calls)
    # Never-served keys first, in the order they were looked at; then each key in turn, longest ago first.
    assert [x // 100 for x in b.sent[1:]] == [2, 0, 1, 2, 0, 1]
    await b.stop()


async def test_a_lane_reaching_max_batch_weight_while_a_timer_waits_goes_at_once() -> None:
    class Heavy(Recording):
        def item_weight(self, item: int) -> float:
            return 2.5

    loop = asyncio.get_running_loop()
    b = Heavy(max_batch_weight=5, max_queue_time=100)
    first = asyncio.ensure_future(b.process(1))
    await asyncio.sleep(1)  # the first waits for its deadline (a timer is armed)
    assert await asyncio.gather(first, b.process(2)) == [2, 4]  # the second makes the weight exactly full
    assert b.started_at == [1] and loop.time() == 1
    await b.stop()


async def test_a_keyed_bulk_call_that_fills_a_lane_while_a_timer_waits_goes_at_once() -> None:
    b = ByKey(max_batch_size=3, max_queue_time=100)
    first = asyncio.ensure_future(b.process(1))
    await asyncio.sleep(1)
    assert await b.process_many([2, 3]) == [4, 6]
    assert await first == 2 and b.started_at == [1]  # full at 1, not at the deadline 100
    await b.stop()


async def test_weights_of_zero_and_of_exactly_the_limit_are_accepted_and_refusals_add_up() -> None:
    class Weighed(Recording):
        def item_weight(self, item: int) -> float:
            return float(item)

    b = Weighed(max_batch_weight=5, max_queue_time=0)
    assert await asyncio.gather(b.process(0), b.process(5)) == [0, 10]
    for _ in range(2):
        with pytest.raises(ValueError, match="weight 6"):
            await b.process_many([1, 6, 2])
    assert b.stats.rejected == 6  # every item of a refused call
    await b.stop()


async def test_a_keyed_bulk_call_can_return_exceptions_in_place() -> None:
    b = ByKey(max_batch_size=2, max_queue_time=0, answer=lambda xs: [ValueError(x) if x == 101 else x for x in xs])
    results = await b.process_many([1, 101, 2, 102], return_exceptions=True)
    assert results[0] == 1 and isinstance(results[1], ValueError) and results[2:] == [2, 102]
    await b.stop()


async def test_the_key_served_longest_ago_goes_first_whatever_order_the_keys_came_in() -> None:
    b = ByKey(max_batch_size=2, max_queue_time=100, delay=1.0)

    async def at(t: float, items: list[int]) -> list[int]:
        await asyncio.sleep(t)
        return list(await asyncio.gather(*(b.process(i) for i in items)))

    # (Each key keeps an item waiting after each of its batches, so that its lane, and its turn, live on.)
    await asyncio.gather(
        at(0, [900, 901]),  # key 9 holds the only slot from 0 to 1
        at(0, [100]),  # key 1 came first, but is not full
        at(0, [200, 201, 202]),  # key 2 is full: served at 1
        at(1.5, [101, 102, 203]),  # key 1 full, never served yet: served at 2
        at(2.5, [103, 204, 205]),
    )
    # At 3 both are full: key 2, served at 1, goes before key 1, served at 2 (and came first).
    assert b.batches[:4] == [[900, 901], [200, 201], [100, 101], [202, 203]]
    await b.stop()


class UserKeyed(Recording):
    """Batches by the item's first element (one key per user, as the keys guide suggests)."""

    def batch_key(self, item: Any) -> Hashable:
        return item[0]


async def test_a_stream_of_new_keys_does_not_starve_a_key_served_before() -> None:
    # One slot, each batch 10 ms; one new key every 10 ms for a second. Key "A", served once, must go at its next
    # turn: a lane never served counts from when it came, not from the beginning of time.
    b = UserKeyed(max_queue_time=0, concurrency=1, delay=0.01)
    assert await b.process(("A", 0)) == ("A", 0, "A", 0)
    loop = asyncio.get_running_loop()
    stop = loop.time() + 1.0

    calls: list[asyncio.Future[Any]] = []

    async def newcomers() -> None:
        n = 0
        while loop.time() < stop:
            calls.append(asyncio.ensure_future(b.process((f"user{n}", n))))
            n += 1
            await asyncio.sleep(0.01)

    flood = asyncio.ensure_future(newcomers())
    await asyncio.sleep(0.105)  # (ten newcomers in, a batch running)
    sent = loop.time()
    assert await b.process(("A", 1)) == ("A", 1, "A", 1)
    assert loop.time() - sent <= 0.02 + 1e-9  # the batch running, then A's: no newcomer goes first
    await flood
    await asyncio.gather(*calls)
    await b.stop()


async def test_another_lanes_hold_timer_does_not_delay_a_lane_that_is_due() -> None:
    # Lane "a" answered a cohort of four; its first caller back is held for the others (a timer up to max_hold_time).
    # Lane "b"'s item, due at once (max_queue_time=0) into the free slot, must not wait for "a"'s timer.
    b = UserKeyed(max_queue_time=0, max_hold_time=1.0, concurrency=1, delay=0.1)
    assert await asyncio.gather(*(b.process(("a", i)) for i in range(4))) == [("a", i, "a", i) for i in range(4)]
    back = asyncio.ensure_future(b.process(("a", 9)))  # held for its cohort
    for _ in range(5):
        await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    sent = loop.time()
    assert await b.process(("b", 1)) == ("b", 1, "b", 1)
    assert loop.time() - sent == pytest.approx(0.1)  # its own batch's time, not the hold's
    assert await back == ("a", 9, "a", 9)
    await b.stop()


async def test_process_many_into_a_due_lane_is_not_delayed_by_another_lanes_timer() -> None:
    b = UserKeyed(max_queue_time=0, max_hold_time=1.0, concurrency=1, delay=0.1)
    await asyncio.gather(*(b.process(("a", i)) for i in range(4)))
    back = asyncio.ensure_future(b.process(("a", 9)))
    for _ in range(5):
        await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    sent = loop.time()
    assert await b.process_many([("b", 1), ("b", 2)]) == [("b", 1, "b", 1), ("b", 2, "b", 2)]
    assert loop.time() - sent == pytest.approx(0.1)
    await back
    await b.stop()


# ---------------------------------------------------------------------- weights and keys that misbehave


WAIT = 1000.0


async def test_max_batch_weight_lowered_under_queued_items_sends_each_too_heavy_one_alone() -> None:
    class Weighed(Sleepy):
        def item_weight(self, item: int) -> float:
            return item % 4 + 1

    b = Weighed(max_queue_size=4, wait_when_full=True, max_batch_size=4, max_queue_time=0, max_batch_weight=10)
    calls = [asyncio.ensure_future(b.process(x)) for x in range(12)]  # 1 batch in flight, 4 queued, 7 waiting
    await asyncio.sleep(0.5)
    b.max_batch_weight = 2
    async with asyncio.timeout(WAIT):
        assert await asyncio.gather(*calls) == list(range(12))
        await b.stop()
    assert all(len(batch) == 1 or sum(x % 4 + 1 for x in batch) <= 2 for batch in b.batches[1:])
    assert settled(b) and b.stats.processed == 12


def _plain_wrapper(hook: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:  # (no functools.wraps: nothing tells it wraps an async def)
        return hook(*args, **kwargs)

    return wrapper


async def test_an_async_batch_key_hidden_behind_a_plain_wrapper_is_refused_naming_it() -> None:
    """Where the class-definition check cannot see the ``async def`` (a decorator without ``functools.wraps``), the
    key it returns is a coroutine: hashable, so every item would get a batch of its own, silently. Refused."""

    class Keyed(Tens):
        @_plain_wrapper
        async def batch_key(self, item: int) -> int:
            return item % 2

    b = Keyed(max_queue_time=0.1)
    async with asyncio.timeout(WAIT):
        results = await asyncio.gather(*(b.process(x) for x in range(4)), return_exceptions=True)
        await b.stop()
    assert [outcome(r) for r in results] == ["TypeError"] * 4
    assert "Keyed.batch_key() returned <coroutine object" in str(results[0]) and b.batches == []
    assert settled(b) and b.stats.submitted == 0


async def test_a_weight_too_large_for_a_float_is_refused_naming_it() -> None:
    class Heavy(Tens):
        def item_weight(self, item: int) -> float:
            return 10**400

    with pytest.raises(ValueError, match="max_batch_weight must be None or a finite number > 0, got 1000000"):
        Heavy(max_batch_weight=10**400)
    b = Heavy(max_queue_time=0)
    async with asyncio.timeout(WAIT):
        with pytest.raises(ValueError, match=r"item_weight\(\) must return a finite number >= 0, got 1000000"):
            await b.process(1)
        await b.stop()
    assert settled(b) and b.stats.submitted == 0
