"""Retrying only what failed (issue 45, parts 1 and 3): ``Retry`` result elements and ``retry=RetryPolicy(...)``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable
from typing import Any

import pytest

from async_batcher import AsyncBatcher, BatcherStoppedError, TransientError, batch, testing
from async_batcher.failures import Isolate, Retry, RetryBudget, RetryPolicy
from tests.batchers import idle_and_clean, until

pytestmark = pytest.mark.virtual_time

NO_JITTER = {"jitter": False}


class Flaky(AsyncBatcher[int, Any]):
    """Answers ``x * 2``, but ``outcome(x, call)`` may replace an item's result (a :class:`Retry`, an exception);
    records each call's items and the loop time it started."""

    def __init__(self, outcome: Callable[[int, int], Any] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.outcome = outcome or (lambda x, call: None)
        self.calls: list[list[int]] = []
        self.times: list[float] = []

    async def process_batch(self, batch: list[int]) -> list[Any]:
        self.calls.append(list(batch))
        self.times.append(asyncio.get_running_loop().time())
        call = len(self.calls)
        return [self.outcome(x, call) or x * 2 for x in batch]


async def gather(b: AsyncBatcher[int, Any], items: list[int]) -> list[Any]:
    return await asyncio.gather(*(b.process(x) for x in items), return_exceptions=True)


async def test_only_the_items_answered_with_retry_are_tried_again() -> None:
    b = Flaky(
        lambda x, call: Retry(ConnectionError("throttled")) if x % 2 and call == 1 else None,
        retry=RetryPolicy(**NO_JITTER),
        max_queue_time=0.0,
    )
    assert await gather(b, [0, 1, 2, 3]) == [0, 2, 4, 6]
    assert b.calls == [[0, 1, 2, 3], [1, 3]]
    assert b.stats.retried == 2
    await b.stop()
    idle_and_clean(b)


async def test_retried_items_join_the_next_batch_of_their_lane() -> None:
    b = Flaky(
        lambda x, call: Retry() if x == 1 and call == 1 else None,
        retry=RetryPolicy(backoff=0.5, **NO_JITTER),
        max_queue_time=1.0,
        max_batch_size=3,
    )
    first = [asyncio.ensure_future(b.process(x)) for x in (0, 1, 2)]
    await until(lambda: len(b.calls) == 1)
    later = [asyncio.ensure_future(b.process(x)) for x in (10, 11)]
    assert await asyncio.gather(*first, *later) == [0, 2, 4, 20, 22]
    # Back at the head of the lane after its backoff, it went with the items that came meanwhile, at once.
    assert b.calls == [[0, 1, 2], [1, 10, 11]]
    assert b.times[1] == b.times[0] + 0.5
    await b.stop()


async def test_the_backoff_grows_with_each_attempt_up_to_the_cap() -> None:
    b = Flaky(
        lambda x, call: Retry() if call < 5 else None,
        retry=RetryPolicy(attempts=5, backoff=1.0, multiplier=3.0, cap=5.0, **NO_JITTER),
        max_queue_time=0.0,
    )
    assert await b.process(7) == 14
    gaps = [later - earlier for earlier, later in zip(b.times, b.times[1:], strict=False)]
    assert gaps == [1.0, 3.0, 5.0, 5.0]
    await b.stop()


async def test_full_jitter_draws_each_wait_within_its_bound() -> None:
    b = Flaky(
        lambda x, call: Retry() if call < 3 else None,
        retry=RetryPolicy(attempts=3, backoff=2.0, jitter=lambda: 0.25),
        max_queue_time=0.0,
    )
    assert await b.process(1) == 2
    assert [later - earlier for earlier, later in zip(b.times, b.times[1:], strict=False)] == [0.5, 1.0]
    await b.stop()


async def test_retry_after_is_the_least_wait() -> None:
    b = Flaky(
        lambda x, call: Retry(after=7.0) if call == 1 else None,
        retry=RetryPolicy(backoff=0.1, **NO_JITTER),
        max_queue_time=0.0,
    )
    assert await b.process(1) == 2
    assert b.times[1] - b.times[0] == 7.0
    await b.stop()


async def test_an_item_whose_attempts_run_out_gets_its_error() -> None:
    refused = ConnectionError("still throttled")
    b = Flaky(lambda x, call: Retry(refused), retry=RetryPolicy(attempts=3, **NO_JITTER), max_queue_time=0.0)
    with pytest.raises(ConnectionError) as caught:
        await b.process(1)
    assert caught.value is refused
    assert len(b.calls) == 3
    await b.stop()
    idle_and_clean(b)


async def test_a_retry_without_an_error_ends_in_transient_error_saying_why() -> None:
    b = Flaky(lambda x, call: Retry(), retry=RetryPolicy(attempts=2, **NO_JITTER), max_queue_time=0.0)
    with pytest.raises(TransientError, match="tried 2 times"):
        await b.process(1)
    await b.stop()


async def test_without_a_retry_policy_a_retry_element_fails_its_item() -> None:
    refused = ConnectionError("throttled")
    b = Flaky(lambda x, call: Retry(refused) if x == 1 else Retry() if x == 2 else None, max_queue_time=0.0)
    results = await gather(b, [0, 1, 2])
    assert results[0] == 0 and results[1] is refused
    assert isinstance(results[2], TransientError) and "no retry policy" in str(results[2])
    assert len(b.calls) == 1
    await b.stop()
    idle_and_clean(b)


async def test_a_retry_element_with_on_batch_error_alone_fails_its_item() -> None:
    b = Flaky(lambda x, call: Retry() if x == 1 else None, max_queue_time=0.0, on_batch_error=Isolate())
    results = await gather(b, [0, 1])
    assert results[0] == 0 and isinstance(results[1], TransientError)
    await b.stop()


async def test_an_attempt_counts_only_when_nothing_progressed() -> None:
    # Each call answers one item and asks for the others again (DynamoDB's UnprocessedItems under throttling):
    # with attempts=2, the last of five items still gets through, in five calls.
    def one_at_a_time(x: int, call: int) -> Any:
        return None if x == call - 1 else Retry()

    b = Flaky(one_at_a_time, retry=RetryPolicy(attempts=2, **NO_JITTER), max_queue_time=0.0, max_batch_size=5)
    assert await gather(b, [0, 1, 2, 3, 4]) == [0, 2, 4, 6, 8]
    assert [len(call) for call in b.calls] == [5, 4, 3, 2, 1]
    await b.stop()


@pytest.mark.parametrize("others", [0, 1])
async def test_attempts_1_never_tries_again_even_when_the_call_answered_other_items(others: int) -> None:
    # "1: none again": the first try always counts, whether or not its call answered other items.
    refused = ConnectionError("throttled")
    b = Flaky(lambda x, call: Retry(refused) if x == 1 else None, retry=RetryPolicy(attempts=1, **NO_JITTER))
    results = await gather(b, [1, *range(10, 10 + others)])
    assert results == [refused, *(2 * x for x in range(10, 10 + others))]
    assert len(b.calls) == 1 and b.stats.retried == 0
    await b.stop()
    idle_and_clean(b)


async def test_the_first_try_counts_even_when_its_call_answered_other_items() -> None:
    # attempts=2: item 1's first try counts (its call answered item 10), its second (alone, no progress) too: it
    # gets its error after two tries, not three.
    b = Flaky(lambda x, call: Retry() if x == 1 else None, retry=RetryPolicy(attempts=2, **NO_JITTER))
    results = await gather(b, [1, 10])
    assert isinstance(results[0], TransientError) and "tried 2 times" in str(results[0]) and results[1] == 20
    assert b.calls == [[1, 10], [1]]
    await b.stop()


async def test_max_tries_bounds_an_item_tried_again_while_others_progress() -> None:
    # Item 0 is asked again forever while a new item succeeds with it each time: it progresses, but not forever.
    b = Flaky(lambda x, call: Retry() if x == 0 else None, retry=RetryPolicy(attempts=10, max_tries=4, **NO_JITTER))
    first = asyncio.ensure_future(b.process(0))
    n = 100
    while not first.done():
        await b.process(n)
        n += 1
    with pytest.raises(TransientError, match="tried 4 times"):
        await first
    await b.stop()


async def test_errors_of_retry_on_retry_every_item_of_the_call() -> None:
    failing = {"left": 2}

    class Throttled(Flaky):
        async def process_batch(self, batch: list[int]) -> list[Any]:
            self.calls.append(list(batch))
            if failing["left"]:
                failing["left"] -= 1
                raise TimeoutError("read timeout")
            return [x * 2 for x in batch]

    b = Throttled(retry=RetryPolicy(attempts=3, retry_on=(TimeoutError,), **NO_JITTER), max_queue_time=0.0)
    assert await gather(b, [1, 2]) == [2, 4]
    assert b.calls == [[1, 2]] * 3
    await b.stop()


async def test_an_error_that_retry_on_does_not_name_is_not_retried() -> None:
    class Broken(Flaky):
        async def process_batch(self, batch: list[int]) -> list[Any]:
            self.calls.append(list(batch))
            raise ValueError("bad")

    b = Broken(retry=RetryPolicy(retry_on=(TimeoutError,)), max_queue_time=0.0)
    results = await gather(b, [1, 2])
    assert all(isinstance(r, ValueError) for r in results)
    assert len(b.calls) == 1
    await b.stop()


async def test_retry_on_takes_a_function_of_the_error() -> None:
    class Http(Exception):
        def __init__(self, status: int) -> None:
            super().__init__(status)
            self.status = status

    failing = {"left": 1}

    class Api(Flaky):
        async def process_batch(self, batch: list[int]) -> list[Any]:
            self.calls.append(list(batch))
            if failing["left"]:
                failing["left"] -= 1
                raise Http(503)
            return batch

    transient = RetryPolicy(retry_on=(lambda error: getattr(error, "status", 0) >= 500,), **NO_JITTER)
    b = Api(retry=transient, max_queue_time=0.0)
    assert await b.process(4) == 4
    assert len(b.calls) == 2
    await b.stop()


async def test_nothing_is_retried_past_its_deadline() -> None:
    b = Flaky(
        lambda x, call: Retry(ConnectionError("throttled")),
        retry=RetryPolicy(attempts=10, backoff=1.0, **NO_JITTER),
        max_queue_time=0.0,
    )
    with pytest.raises(ConnectionError):
        await b.process(1, timeout=3.5)
    # Tries at 0, 1 and 3: the next (at 7) would come after its deadline, so it failed at 3 with its own error.
    assert b.times == [0.0, 1.0, 3.0]
    assert asyncio.get_running_loop().time() == 3.0
    await b.stop()
    idle_and_clean(b)


async def test_the_retry_budget_stops_a_retry_storm() -> None:
    budget = RetryBudget(ratio=0.0, floor=0.5, window=4.0)  # two retries in the bank, earned back slowly
    b = Flaky(lambda x, call: Retry(), retry=RetryPolicy(attempts=5, budget=budget, **NO_JITTER), max_queue_time=0.0)
    results = await gather(b, list(range(6)))
    assert all(isinstance(r, TransientError) for r in results)
    s = b.stats
    assert s.retries_refused >= 4
    assert s.retried == 2
    await b.stop()
    idle_and_clean(b)


async def test_answered_items_earn_retries() -> None:
    budget = RetryBudget(ratio=1.0, floor=0.0, window=1000.0)
    b = Flaky(
        lambda x, call: Retry() if x < 0 and call < 3 else None,
        retry=RetryPolicy(attempts=5, budget=budget, **NO_JITTER),
        max_queue_time=0.0,
    )
    with pytest.raises(TransientError, match="budget"):
        await b.process(-1)  # nothing earned yet
    await gather(b, list(range(10)))  # ten answered: ten retries earned
    assert await b.process(-2) == -4
    await b.stop()


async def test_process_many_items_are_retried_one_by_one() -> None:
    b = Flaky(lambda x, call: Retry() if x in (2, 5) and call == 1 else None, retry=RetryPolicy(**NO_JITTER))
    assert await b.process_many(list(range(8))) == [2 * x for x in range(8)]
    assert b.calls[1] == [2, 5]
    await b.stop()
    idle_and_clean(b)


async def test_a_keyed_item_goes_back_to_its_own_lane() -> None:
    class Keyed(Flaky):
        def batch_key(self, item: int) -> Hashable:
            return item % 2

    b = Keyed(lambda x, call: Retry() if x == 3 and call <= 2 else None, retry=RetryPolicy(**NO_JITTER))
    assert await gather(b, [0, 1, 2, 3]) == [0, 2, 4, 6]
    assert all(len({x % 2 for x in call}) == 1 for call in b.calls)
    await b.stop()
    idle_and_clean(b)


async def test_a_caller_who_leaves_during_its_backoff_is_not_tried_again() -> None:
    b = Flaky(lambda x, call: Retry(), retry=RetryPolicy(backoff=5.0, **NO_JITTER), max_queue_time=0.0)
    call = asyncio.ensure_future(b.process(1))
    await until(lambda: len(b.calls) == 1)
    await asyncio.sleep(1.0)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await asyncio.sleep(10.0)
    assert len(b.calls) == 1
    await b.stop()
    idle_and_clean(b)


@pytest.mark.parametrize("how", ["process", "process_many"])
async def test_a_backoff_whose_callers_all_left_keeps_no_timer_and_no_stop_waits_for_it(how: str) -> None:
    loop = asyncio.get_running_loop()
    b = Flaky(lambda x, call: Retry(), retry=RetryPolicy(backoff=5.0, **NO_JITTER), max_queue_time=0.0)
    if how == "process":
        calls = [asyncio.ensure_future(b.process(x)) for x in (1, 2)]
    else:
        calls = [asyncio.ensure_future(b.process_many([1, 2]))]
    await until(lambda: len(b.calls) == 1)
    assert testing.idle(b) != [] and loop.timers() == 1  # the backoff's
    calls[0].cancel()
    await asyncio.gather(*calls[:1], return_exceptions=True)
    if len(calls) > 1:  # another caller still waits: the timer stays
        assert loop.timers() == 1
        calls[1].cancel()
        await asyncio.gather(*calls[1:], return_exceptions=True)
    await asyncio.sleep(0)
    assert loop.timers() == 0 and testing.idle(b) == []  # an idle batcher keeps no timer
    began = loop.time()
    await b.stop()
    assert loop.time() == began  # nothing left to wait for
    assert len(b.calls) == 1
    idle_and_clean(b)


async def test_a_stop_waits_for_the_items_in_their_backoff() -> None:
    b = Flaky(
        lambda x, call: Retry() if call == 1 else None, retry=RetryPolicy(backoff=5.0, **NO_JITTER), max_queue_time=0.0
    )
    call = asyncio.ensure_future(b.process(1))
    await until(lambda: len(b.calls) == 1)
    await b.stop()
    assert await call == 2
    assert asyncio.get_running_loop().time() >= 5.0
    idle_and_clean(b)


@pytest.mark.parametrize("force", [True, False])
async def test_a_forced_or_timed_out_stop_fails_the_items_in_their_backoff(force: bool) -> None:
    b = Flaky(lambda x, call: Retry(), retry=RetryPolicy(backoff=60.0, **NO_JITTER), max_queue_time=0.0)
    calls = [asyncio.ensure_future(b.process(x)) for x in range(3)]
    await until(lambda: len(b.calls) == 1)
    if force:
        await b.stop(force=True)
    else:
        await b.stop(timeout=1.0)
    for call in calls:
        with pytest.raises(BatcherStoppedError):
            await call
    assert asyncio.get_running_loop().time() <= 1.0
    idle_and_clean(b)


async def test_retry_elements_from_a_batch_function() -> None:
    seen: list[list[int]] = []

    @batch(max_queue_time=0.0, retry=RetryPolicy(**NO_JITTER))
    async def double(items: list[int]) -> list[Any]:
        seen.append(list(items))
        return [Retry() if len(seen) == 1 else x * 2 for x in items]

    assert await asyncio.gather(double(1), double(2)) == [2, 4]
    assert seen == [[1, 2], [1, 2]]
    await double.stop()


async def test_a_plain_def_process_batch_retries_too() -> None:
    class Sync(AsyncBatcher[int, int]):
        calls = 0

        def process_batch(self, batch: list[int]) -> list[Any]:
            Sync.calls += 1
            return [Retry() if Sync.calls == 1 else x for x in batch]

    b = Sync(retry=RetryPolicy(**NO_JITTER), max_queue_time=0.0)
    assert await b.process(3) == 3
    assert Sync.calls == 2
    await b.stop()


def test_the_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="attempts"):
        RetryPolicy(attempts=0)
    with pytest.raises(ValueError, match="multiplier"):
        RetryPolicy(multiplier=0.5)
    with pytest.raises(TypeError, match="retry_on"):
        RetryPolicy(retry_on=("TimeoutError",))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="retry must be"):
        Flaky(retry=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="after"):
        Retry(after=-1)
    with pytest.raises(TypeError, match="Exception instance"):
        Retry("throttled")  # type: ignore[arg-type]


async def test_the_policy_can_be_changed_live() -> None:
    b = Flaky(lambda x, call: Retry() if call == 1 else None, max_queue_time=0.0)
    assert b.retry is None
    b.retry = RetryPolicy(**NO_JITTER)
    assert await b.process(5) == 10
    b.retry = None
    await b.stop()
