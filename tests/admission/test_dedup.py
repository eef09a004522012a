"""Single flight (issue 46): identical items waiting or in flight share one row of one batch and one result."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Hashable
from typing import Any

import pytest

from async_batcher import AsyncBatcher, BatcherStoppedError, ResultCache, batch, current_batch
from async_batcher.failures import Retry, RetryPolicy
from tests.batchers import idle_and_clean, until

pytestmark = pytest.mark.virtual_time


class Lookup(AsyncBatcher[Any, Any]):
    """Answers ``{"item": item}`` (a fresh, mutable dict) after ``delay``; a batch with ``"boom"`` in it raises; an
    item ``"bad"`` gets its own exception. Records each batch."""

    def __init__(self, *, delay: float = 0.01, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.delay = delay
        self.batches: list[list[Any]] = []
        self.gate: asyncio.Event | None = None

    def dedup_key(self, item: Any) -> Hashable | None:
        return item

    async def process_batch(self, batch: list[Any]) -> list[Any]:
        self.batches.append(list(batch))
        if self.gate is not None:
            await self.gate.wait()
        await asyncio.sleep(self.delay)
        if "boom" in batch:
            raise RuntimeError("boom")
        return [ValueError("bad") if x == "bad" else {"item": x} for x in batch]

    @property
    def rows(self) -> int:
        return sum(map(len, self.batches))


async def test_identical_items_waiting_share_one_row_and_each_caller_gets_its_own_copy() -> None:
    b = Lookup(max_queue_time=0.001)
    results = await asyncio.gather(*(b.process(x) for x in ["a", "b", "a", "a", "c", "b"]))
    assert b.batches == [["a", "b", "c"]]
    assert [r["item"] for r in results] == ["a", "b", "a", "a", "c", "b"]
    assert len({id(r) for r in results}) == 6  # each its own dict
    results[0]["item"] = "changed"
    assert results[2] == results[3] == {"item": "a"}
    s = b.stats
    assert (s.submitted, s.succeeded, s.deduplicated, s.processed) == (6, 6, 3, 3)
    await b.stop()
    idle_and_clean(b)


async def test_duplicates_do_not_count_toward_the_batch_size() -> None:
    b = Lookup(max_batch_size=2, max_queue_time=1.0)
    results = await asyncio.gather(*(b.process(x) for x in ["a", "a", "a", "b"]))
    assert b.batches == [["a", "b"]]  # full at 2 rows, though 4 callers
    assert [r["item"] for r in results] == ["a", "a", "a", "b"]
    await b.stop()


async def test_a_duplicate_of_an_item_in_flight_joins_its_result() -> None:
    b = Lookup(delay=1.0, max_queue_time=0)
    first = asyncio.ensure_future(b.process("a"))
    await until(lambda: b.stats.in_flight == 1)
    await asyncio.sleep(0.5)
    assert await b.process("a") == {"item": "a"}  # answered when the row in flight is, in half the time
    assert await first == {"item": "a"} and b.rows == 1
    await b.stop()
    idle_and_clean(b)


async def test_once_a_row_resolves_nothing_is_kept_an_error_least_of_all() -> None:
    b = Lookup(max_queue_time=0)
    raised = await asyncio.gather(b.process("boom"), b.process("boom"), return_exceptions=True)
    returned = await asyncio.gather(b.process("bad"), b.process("bad"), return_exceptions=True)
    assert [type(o).__name__ for o in raised + returned] == ["RuntimeError", "RuntimeError", "ValueError", "ValueError"]
    assert b.rows == 2
    with pytest.raises(RuntimeError):
        await b.process("boom")  # a row of its own, run again
    assert await b.process("a") == {"item": "a"}
    assert await b.process("a") == {"item": "a"}
    assert b.rows == 5
    assert (b.stats.failed, b.stats.succeeded) == (5, 2)
    await b.stop()
    idle_and_clean(b)


async def test_a_caller_that_leaves_leaves_alone_and_the_row_goes_when_all_have_left() -> None:
    gate = asyncio.Event()
    b = Lookup(max_queue_time=0)
    b.gate = gate
    blocker = asyncio.ensure_future(b.process("blocker"))
    await until(lambda: b.stats.in_flight == 1)
    leader = asyncio.ensure_future(b.process("a"))
    follower = asyncio.ensure_future(b.process("a"))
    left_alone = [asyncio.ensure_future(b.process("z")) for _ in range(2)]
    timed = asyncio.ensure_future(b.process("a", timeout=0.5))
    await until(lambda: b.stats.queued == 2 and b.stats.deduplicated == 3)
    leader.cancel()  # the first caller leaves: the row stays, for the others
    for call in left_alone:
        call.cancel()  # every caller of "z" leaves: its row is withdrawn
    await asyncio.sleep(0.6)  # the timed one times out
    assert b.stats.queued == 1
    gate.set()
    assert await follower == {"item": "a"}
    outcomes = await asyncio.gather(leader, timed, *left_alone, return_exceptions=True)
    kinds = [type(o).__name__ for o in outcomes]
    assert kinds == ["CancelledError", "TimeoutError", "CancelledError", "CancelledError"]
    assert b.batches == [["blocker"], ["a"]]  # "z" never reached process_batch
    await blocker
    s = b.stats
    assert (s.cancelled, s.timed_out, s.succeeded) == (3, 1, 2)
    await b.stop()
    idle_and_clean(b)


async def test_every_caller_of_a_row_in_flight_may_leave_and_the_batch_runs_on() -> None:
    b = Lookup(delay=1.0, max_queue_time=0)
    calls = [asyncio.ensure_future(b.process("a")) for _ in range(3)]
    await until(lambda: b.stats.in_flight == 1)
    for call in calls:
        call.cancel()
    await asyncio.gather(*calls, return_exceptions=True)
    await asyncio.sleep(1.0)
    assert b.stats.in_flight == 0
    assert await b.process("a") == {"item": "a"}  # a new row: the dropped one is not kept
    assert b.rows == 2 and b.stats.cancelled == 3
    await b.stop()
    idle_and_clean(b)


async def test_copy_result_is_the_users_choice_and_a_failing_copy_fails_its_caller_only() -> None:
    class Shared(Lookup):
        def copy_result(self, result: Any) -> Any:
            return result  # nobody mutates: no copy

    b = Shared(max_queue_time=0.001)
    first, second = await asyncio.gather(b.process("a"), b.process("a"))
    assert first is second
    await b.stop()

    class Deep(Lookup):
        def copy_result(self, result: Any) -> Any:
            if result["item"] == "x":
                raise RuntimeError("cannot copy")
            return copy.deepcopy(result)

    d = Deep(max_queue_time=0.001)
    outcomes = await asyncio.gather(d.process("x"), d.process("x"), d.process("x"), return_exceptions=True)
    assert outcomes[0] == {"item": "x"} and all(isinstance(o, RuntimeError) for o in outcomes[1:])
    assert (d.stats.succeeded, d.stats.failed) == (1, 2)
    await d.stop()
    idle_and_clean(d)


async def test_a_dedup_key_is_shared_within_its_batch_key_only() -> None:
    class Tenants(Lookup):
        def batch_key(self, item: Any) -> Hashable:
            return item[0]  # the tenant

        def dedup_key(self, item: Any) -> Hashable | None:
            return item[1]  # the same query, whoever asks

    b = Tenants(max_queue_time=0.001)
    await asyncio.gather(b.process(("t1", "q")), b.process(("t2", "q")), b.process(("t1", "q")))
    assert sorted(map(sorted, b.batches)) == [[("t1", "q")], [("t2", "q")]]
    await b.stop()


async def test_a_key_of_none_shares_nothing_and_bad_keys_are_refused_by_name() -> None:
    class Picky(Lookup):
        def dedup_key(self, item: Any) -> Hashable | None:
            if item == "raise":
                raise LookupError("no key for you")
            if item == "list":
                return ["unhashable"]  # type: ignore[return-value]
            return None if item == "none" else item

    b = Picky(max_queue_time=0.001)
    await asyncio.gather(b.process("none"), b.process("none"))
    assert b.rows == 2
    with pytest.raises(TypeError, match=r"dedup_key\(\) returned an unhashable key: \['unhashable'\]"):
        await b.process("list")
    with pytest.raises(LookupError, match="no key for you"):
        await b.process("raise")
    await b.stop()
    idle_and_clean(b)
    with pytest.raises(TypeError, match="dedup_key must be a plain def"):

        class Async(Lookup):
            async def dedup_key(self, item: Any) -> Hashable:  # type: ignore[override]
                return item


async def test_stops_reach_every_caller_of_a_shared_row() -> None:
    b = Lookup(delay=1.0, max_queue_time=0)
    drained = [asyncio.ensure_future(b.process("a")) for _ in range(3)]
    await until(lambda: b.stats.in_flight == 1)
    await b.stop()
    assert await asyncio.gather(*drained) == [{"item": "a"}] * 3
    idle_and_clean(b)
    c = Lookup(delay=1.0, max_queue_time=0)
    forced = [asyncio.ensure_future(c.process(x)) for x in ["a", "a", "b", "b"]]
    await until(lambda: c.stats.in_flight == 1)
    await c.stop(force=True)
    outcomes = await asyncio.gather(*forced, return_exceptions=True)
    assert all(isinstance(o, BatcherStoppedError) for o in outcomes)
    idle_and_clean(c)


async def test_the_result_cache_serves_within_its_ttl_never_an_error_and_keeps_to_its_bytes() -> None:
    b = Lookup(max_queue_time=0, result_cache=ResultCache(ttl=10.0, max_bytes=2, sizeof=lambda r: 1))
    first = await b.process("a")
    second = await b.process("a")
    assert second == first and second is not first and b.rows == 1  # a copy, from the cache
    assert b.stats.cache_hits == 1
    await b.process("b")
    await b.process("c")  # 3 results of 1 byte in 2: "a", used least recently, goes
    await b.process("b")
    await b.process("a")
    assert b.rows == 4 and b.stats.cache_hits == 2
    with pytest.raises(RuntimeError):
        await b.process("boom")
    with pytest.raises(RuntimeError):
        await b.process("boom")  # never cached
    await asyncio.sleep(10.0)
    await b.process("b")  # stale: computed again
    assert b.rows == 7
    s = b.stats
    assert s.submitted == s.succeeded + s.failed == 9
    await b.stop()
    idle_and_clean(b)


async def test_a_failing_sizeof_keeps_nothing_and_says_so(loop_errors: list[dict[str, Any]]) -> None:
    def sizeof(result: Any) -> int:
        raise ValueError("cannot size")

    b = Lookup(max_queue_time=0, result_cache=ResultCache(ttl=10.0, max_bytes=100, sizeof=sizeof))
    assert await b.process("a") == {"item": "a"}
    assert await b.process("a") == {"item": "a"}
    assert b.rows == 2
    assert loop_errors and "sizeof() failed" in loop_errors[0]["message"]
    await b.stop()


def test_result_cache_is_checked() -> None:
    with pytest.raises(ValueError, match="ttl"):
        ResultCache(ttl=0, max_bytes=10)
    with pytest.raises(ValueError, match="max_bytes"):
        ResultCache(ttl=1, max_bytes=0)
    with pytest.raises(TypeError, match="sizeof"):
        ResultCache(ttl=1, max_bytes=1, sizeof=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"result_cache must be an async_batcher\.ResultCache"):
        Lookup(result_cache={"ttl": 1})  # type: ignore[arg-type]


def test_a_result_cache_without_dedup_key_is_an_error_at_construction_and_live() -> None:
    # Nothing is shared without dedup_key: a cache of shared rows' results would keep nothing, silently.
    cache = ResultCache(ttl=1, max_bytes=100)

    class Plain(AsyncBatcher[int, int]):
        async def process_batch(self, batch: list[int]) -> list[int]:
            return batch

    needs = r"result_cache=ResultCache\(.*\) needs the dedup_key\(\) hook, which the batcher does not override"
    with pytest.raises(ValueError, match=needs) as info:
        Plain(result_cache=cache)
    assert "@batch: dedup=" in str(info.value)
    b = Plain()
    with pytest.raises(ValueError, match=needs):
        b.result_cache = cache
    assert b.result_cache is None
    b.result_cache = None  # (nothing to keep: fine)
    assert Lookup(result_cache=cache).result_cache is cache
    with pytest.raises(ValueError, match="dedup="):
        batch(result_cache=cache)(Plain.process_batch)


async def test_the_decorator_takes_dedup_and_copy_result() -> None:
    seen: list[list[str]] = []

    @batch(dedup=lambda text: text.strip().lower(), copy_result=list, max_queue_time=0.001)
    async def embed(texts: list[str]) -> list[list[float]]:
        seen.append(texts)
        return [[float(len(t))] for t in texts]

    results = await asyncio.gather(embed("Hi"), embed(" hi "), embed("yo"))
    assert seen == [["Hi", "yo"]]
    assert results == [[2.0], [2.0], [2.0]] and results[0] is not results[1]
    await embed.stop()


# A shared row carries its callers' deadlines: the latest of those still waiting (none if one of them has none), as
# they join and leave. Before, it carried none: current_batch().deadline was None, and a retry that would land after
# every caller's deadline was made, its callers timing out instead of getting the retry policy's error.


class Deadlines(Lookup):
    """Answers each item with the batch's deadline as ``process_batch`` sees it (after ``gate``, if set)."""

    async def process_batch(self, batch: list[Any]) -> list[Any]:
        self.batches.append(list(batch))
        if self.gate is not None:
            await self.gate.wait()
        return [current_batch().deadline] * len(batch)


async def test_a_shared_rows_deadline_is_the_latest_of_its_callers_still_waiting() -> None:
    b = Deadlines(max_queue_time=1.0)
    assert await asyncio.gather(b.process("a", timeout=5.0), b.process("a", timeout=3.0)) == [1.0 + 4.0] * 2
    # A caller without a timeout: the row has no deadline.
    assert await asyncio.gather(b.process("b", timeout=5.0), b.process("b")) == [None, None]
    # The caller that set it leaves: the row's deadline is the next one's.
    late = asyncio.ensure_future(b.process("c", timeout=7.0))
    soon = asyncio.ensure_future(b.process("c", timeout=4.0))
    await asyncio.sleep(0.5)
    late.cancel()
    assert await soon == 2.0 + 4.0
    # With a plain item in its batch, the earliest of the batch's items.
    rows = asyncio.gather(b.process("d", timeout=9.0), b.process("d", timeout=2.0), b.process("e", timeout=8.0))
    assert await rows == [3.0 + 8.0] * 3
    await b.stop()
    idle_and_clean(b)


async def test_a_caller_that_joins_a_row_in_flight_brings_its_deadline() -> None:
    b = Deadlines(max_queue_time=0)
    b.gate = asyncio.Event()
    first = asyncio.ensure_future(b.process("a", timeout=2.0))
    await until(lambda: b.stats.in_flight == 1)
    joined = asyncio.ensure_future(b.process("a", timeout=10.0))
    await asyncio.sleep(0.5)
    b.gate.set()  # the batch reads its deadline now: both callers wait, the later is 10
    assert await asyncio.gather(first, joined) == [10.0, 10.0]
    await b.stop()
    idle_and_clean(b)


class Throttled(Lookup):
    """Every item is throttled (a ``Retry``); records when each call was made."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.times: list[float] = []

    async def process_batch(self, batch: list[Any]) -> list[Any]:
        self.times.append(asyncio.get_running_loop().time())
        return [Retry(ConnectionError("throttled")) for _ in batch]


async def test_a_shared_row_is_not_retried_past_the_deadline_of_its_last_caller() -> None:
    b = Throttled(retry=RetryPolicy(attempts=10, backoff=1.0, jitter=False), max_queue_time=0)
    first = asyncio.ensure_future(b.process("a", timeout=2.5))
    await asyncio.sleep(0)
    second = asyncio.ensure_future(b.process("a", timeout=3.5))
    # Tries at 0, 1 and 3 (the first caller timed out at 2.5); the next (at 7) would come after the last caller's
    # deadline: it fails at 3 with the retry policy's own error, as a plain item does.
    with pytest.raises(TimeoutError):
        await first
    with pytest.raises(ConnectionError):
        await second
    assert b.times == [0.0, 1.0, 3.0] and asyncio.get_running_loop().time() == 3.0
    s = b.stats
    assert (s.timed_out, s.failed, s.deduplicated) == (1, 1, 1)
    await b.stop()
    idle_and_clean(b)


async def test_a_shared_row_with_a_caller_without_timeout_is_retried_for_it() -> None:
    calls = {"n": 0}

    class Recovering(Throttled):
        async def process_batch(self, batch: list[Any]) -> list[Any]:
            calls["n"] += 1
            if calls["n"] < 5:
                return await super().process_batch(batch)
            return [{"item": x} for x in batch]

    b = Recovering(retry=RetryPolicy(attempts=10, backoff=1.0, jitter=False), max_queue_time=0)
    timed = asyncio.ensure_future(b.process("a", timeout=3.5))
    await asyncio.sleep(0)
    patient = asyncio.ensure_future(b.process("a"))
    with pytest.raises(TimeoutError):
        await timed
    assert await patient == {"item": "a"}  # tried at 0, 1, 3, 7 and 15
    await b.stop()
    idle_and_clean(b)
