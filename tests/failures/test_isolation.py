"""Isolating the bad item (issue 45, part 2): ``on_batch_error=Isolate(...)`` bisects a batch whose
``process_batch`` raises, down to the items at fault; only their callers get the error."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import math
import sys
import textwrap
import threading
import traceback
import types
from typing import Any

import pytest

import async_batcher.failures
from async_batcher import AsyncBatcher, BatcherStoppedError, ProcessBatchCancelledError
from async_batcher.failures import Isolate, RetryPolicy, SplitOn
from async_batcher.testing import record_batches
from tests.batchers import idle_and_clean, until

pytestmark = pytest.mark.virtual_time


class Poisoned(AsyncBatcher[int, int]):
    """Doubles its items; a batch holding one of ``bad`` raises ``ValueError`` naming the first of them."""

    def __init__(self, bad: set[int], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.bad = bad
        self.calls: list[list[int]] = []

    async def process_batch(self, batch: list[int]) -> list[int]:
        self.calls.append(list(batch))
        found = [x for x in batch if x in self.bad]
        if found:
            raise ValueError(f"bad item {found[0]}")
        return [x * 2 for x in batch]


async def gather(b: AsyncBatcher[int, Any], items: list[int]) -> list[Any]:
    return await asyncio.gather(*(b.process(x) for x in items), return_exceptions=True)


async def test_one_bad_item_fails_alone_and_every_other_caller_gets_its_result() -> None:
    b = Poisoned({13}, max_batch_size=16, max_queue_time=1.0, on_batch_error=Isolate())
    results = await gather(b, list(range(16)))
    for x, result in enumerate(results):
        if x == 13:
            assert isinstance(result, ValueError) and str(result) == "bad item 13"
        else:
            assert result == 2 * x
    assert [13] in b.calls  # its own call raised what its caller got
    assert len(b.calls) - 1 <= 2 * math.log2(16)
    s = b.stats
    assert (s.isolated, s.extra_calls, s.failed, s.succeeded) == (1, len(b.calls) - 1, 1, 15)
    await b.stop()
    idle_and_clean(b)


async def test_the_error_is_the_one_its_own_call_raised_with_its_traceback() -> None:
    b = Poisoned({5}, max_batch_size=8, max_queue_time=1.0, on_batch_error=Isolate())
    results = await gather(b, list(range(8)))
    error = results[5]
    assert isinstance(error, ValueError)
    frames = [frame.name for frame in traceback.extract_tb(error.__traceback__)]
    assert "process_batch" in frames
    await b.stop()


@pytest.mark.parametrize("n", [2, 3, 5, 8, 13, 16, 31, 64])
async def test_one_bad_item_costs_at_most_2_log2_n_extra_calls_wherever_it_is(n: int) -> None:
    worst = 0
    for bad in range(n):
        b = Poisoned({bad}, max_batch_size=n, max_queue_time=1.0, on_batch_error=Isolate())
        results = await gather(b, list(range(n)))
        assert [isinstance(r, ValueError) for r in results] == [x == bad for x in range(n)]
        worst = max(worst, len(b.calls) - 1)
        await b.stop()
    assert worst <= 2 * math.ceil(math.log2(n))


async def test_retry_first_calls_the_whole_batch_again_before_bisecting() -> None:
    flaky = {"left": 1}

    class Flaky(Poisoned):
        async def process_batch(self, batch: list[int]) -> list[int]:
            if flaky["left"]:
                flaky["left"] -= 1
                self.calls.append(list(batch))
                raise ConnectionResetError("flaky")
            return await super().process_batch(batch)

    b = Flaky(set(), max_batch_size=8, max_queue_time=1.0, on_batch_error=Isolate(retry_first=1))
    assert await gather(b, list(range(8))) == [2 * x for x in range(8)]
    assert b.calls == [list(range(8))] * 2  # no bisection
    await b.stop()


async def test_the_extra_call_budget_bounds_a_batch_whose_every_item_fails() -> None:
    b = Poisoned(set(range(16)), max_batch_size=16, max_queue_time=1.0, on_batch_error=Isolate(max_extra_calls=3))
    results = await gather(b, list(range(16)))
    assert all(isinstance(r, ValueError) for r in results)
    assert len(b.calls) == 1 + 3
    await b.stop()
    idle_and_clean(b)


async def test_the_default_budget_stops_a_systematic_error() -> None:
    b = Poisoned(set(range(64)), max_batch_size=64, max_queue_time=1.0, on_batch_error=Isolate())
    results = await gather(b, list(range(64)))
    assert all(isinstance(r, ValueError) for r in results)
    assert len(b.calls) - 1 == 4 * 6  # 4 * ceil(log2(64))
    await b.stop()


async def test_on_poison_sees_each_bad_item_in_its_callers_context() -> None:
    request: contextvars.ContextVar[str] = contextvars.ContextVar("request", default="-")
    seen: list[tuple[int, str, str]] = []

    def dead_letter(item: int, error: BaseException) -> None:
        seen.append((item, str(error), request.get()))

    b = Poisoned({3, 6}, max_batch_size=8, max_queue_time=1.0, on_batch_error=Isolate(on_poison=dead_letter))

    async def call(x: int) -> Any:
        request.set(f"req-{x}")
        return await b.process(x)

    results = await asyncio.gather(*(call(x) for x in range(8)), return_exceptions=True)
    assert sorted(seen) == [(3, "bad item 3", "req-3"), (6, "bad item 6", "req-6")]
    assert [isinstance(r, ValueError) for r in results] == [x in (3, 6) for x in range(8)]
    await b.stop()


async def test_an_on_poison_that_raises_is_reported_and_the_caller_still_gets_its_error(
    loop_errors: list[dict[str, Any]],
) -> None:
    def broken(item: int, error: BaseException) -> None:
        raise RuntimeError("the dead-letter queue is down")

    b = Poisoned({1}, max_batch_size=4, max_queue_time=1.0, on_batch_error=Isolate(on_poison=broken))
    results = await gather(b, [0, 1, 2, 3])
    assert isinstance(results[1], ValueError)
    assert [context["message"] for context in loop_errors] == [
        "Poisoned: on_poison() failed; the item's caller gets its error"
    ]
    await b.stop()


async def test_on_poison_may_submit_the_item_elsewhere() -> None:
    class Sink(AsyncBatcher[int, int]):
        async def process_batch(self, batch: list[int]) -> list[int]:
            return batch

    sink = Sink()
    parked: list[asyncio.Task[int]] = []

    def park(item: int, error: BaseException) -> None:
        parked.append(asyncio.ensure_future(sink.process(item)))

    b = Poisoned({2}, max_batch_size=4, max_queue_time=1.0, on_batch_error=Isolate(on_poison=park))
    # A re-entrant submission too: the dead letter goes back to the same batcher, marked as harmless.
    await gather(b, [0, 1, 2, 3])
    assert [await task for task in parked] == [2]
    await b.stop()
    await sink.stop()


async def test_transient_and_capacity_errors_are_never_bisected() -> None:
    class Throttled(Poisoned):
        async def process_batch(self, batch: list[int]) -> list[int]:
            self.calls.append(list(batch))
            raise TimeoutError("throttled") if len(self.calls) == 1 else MemoryError("too big")

    b = Throttled(
        set(),
        max_batch_size=8,
        max_queue_time=1.0,
        on_batch_error=Isolate(),
        retry=RetryPolicy(attempts=2, retry_on=(TimeoutError,), jitter=False),
        split_on=SplitOn(MemoryError),
    )
    results = await gather(b, [0, 1])
    # The timeout: both tried again; the memory error: split in halves, each failing alone with it.
    assert b.calls == [[0, 1], [0, 1], [0], [1]]
    assert all(isinstance(r, MemoryError) for r in results)
    assert b.stats.isolated == 0
    await b.stop()


@pytest.mark.parametrize("sizes", [(1, 32), (2, 64), (4, 64)])
async def test_preferred_sizes_do_not_cut_the_halves_and_the_bound_holds(sizes: tuple[int, int]) -> None:
    # Halves cut at a preferred size (1, 2 or 4 of 32 or 64) made the search linear: the budget ran out and healthy
    # callers got the bad item's error. The halves are halves, whatever the preferred sizes.
    n = sizes[-1]
    worst = 0
    for bad in range(n):
        b = Poisoned({bad}, max_batch_size=n, max_queue_time=1.0, preferred_batch_sizes=sizes, on_batch_error=Isolate())
        results = await gather(b, list(range(n)))
        assert b.calls[0] == list(range(n))  # one batch of the preferred size
        assert [r if isinstance(r, int) else "error" for r in results] == [
            "error" if x == bad else 2 * x for x in range(n)
        ]
        assert b.stats.isolated == 1
        worst = max(worst, len(b.calls) - 1)
        await b.stop()
        idle_and_clean(b)
    assert worst <= 2 * math.ceil(math.log2(n))


async def test_the_parts_go_before_new_arrivals() -> None:
    b = Poisoned({0}, max_batch_size=4, max_queue_time=0.0, concurrency=1, on_batch_error=Isolate())
    first = [asyncio.ensure_future(b.process(x)) for x in range(4)]
    await asyncio.sleep(0)
    later = [asyncio.ensure_future(b.process(x)) for x in (10, 11)]
    await asyncio.gather(*first, *later, return_exceptions=True)
    # Every call of the first batch's bisection came before the batch of the later arrivals.
    assert b.calls[-1] == [10, 11]
    assert all(max(call) < 10 for call in b.calls[:-1])
    await b.stop()


async def test_process_many_with_return_exceptions_gets_the_bad_items_error_in_its_place() -> None:
    b = Poisoned({4}, max_batch_size=8, max_queue_time=1.0, on_batch_error=Isolate())
    results = await b.process_many(list(range(8)), return_exceptions=True)
    assert [isinstance(r, ValueError) for r in results] == [x == 4 for x in range(8)]
    assert [r for r in results if not isinstance(r, Exception)] == [2 * x for x in range(8) if x != 4]
    with pytest.raises(ValueError, match="bad item 4"):
        await b.process_many(list(range(8)))
    await b.stop()
    idle_and_clean(b)


async def test_a_plain_def_process_batch_is_isolated_too() -> None:
    class Sync(AsyncBatcher[int, int]):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.threads: set[int] = set()

        def process_batch(self, batch: list[int]) -> list[int]:
            self.threads.add(threading.get_ident())
            if 7 in batch:
                raise KeyError(7)
            return [x + 1 for x in batch]

    b = Sync(max_batch_size=8, max_queue_time=1.0, on_batch_error=Isolate())
    results = await gather(b, list(range(8)))
    assert [isinstance(r, KeyError) for r in results] == [x == 7 for x in range(8)]
    assert threading.get_ident() not in b.threads
    await b.stop()


async def test_a_caller_who_leaves_during_the_bisection_is_not_sent_again() -> None:
    gate = asyncio.Event()

    started: list[list[int]] = []

    class Slow(Poisoned):
        async def process_batch(self, batch: list[int]) -> list[int]:
            started.append(list(batch))
            if len(started) == 2:
                await gate.wait()
            return await super().process_batch(batch)

    b = Slow({0}, max_batch_size=4, max_queue_time=0.0, on_batch_error=Isolate())
    calls = [asyncio.ensure_future(b.process(x)) for x in range(4)]
    await until(lambda: len(started) == 2)
    calls[3].cancel()  # its item is in the half not called yet
    gate.set()
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(results[0], ValueError) and isinstance(results[3], asyncio.CancelledError)
    assert results[1:3] == [2, 4]
    assert all(3 not in call for call in b.calls[2:])
    await b.stop()
    idle_and_clean(b)


async def test_an_item_whose_deadline_passes_during_the_bisection_is_not_sent_again() -> None:
    class Slow(Poisoned):
        async def process_batch(self, batch: list[int]) -> list[int]:
            await asyncio.sleep(1.0)
            return await super().process_batch(batch)

    b = Slow({0}, max_batch_size=4, max_queue_time=0.0, on_batch_error=Isolate())
    calls = [asyncio.ensure_future(b.process(x, timeout=2.5 if x == 3 else None)) for x in range(4)]
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(results[0], ValueError) and isinstance(results[3], TimeoutError)
    assert all(3 not in call for call in b.calls[2:])  # its half came after its deadline
    assert b.stats.timed_out == 1
    await b.stop()
    idle_and_clean(b)


async def test_process_batch_raising_cancelled_error_is_not_bisected() -> None:
    class Cancels(Poisoned):
        async def process_batch(self, batch: list[int]) -> list[int]:
            self.calls.append(list(batch))
            raise asyncio.CancelledError

    b = Cancels(set(), max_batch_size=4, max_queue_time=1.0, on_batch_error=Isolate())
    results = await gather(b, [0, 1, 2, 3])
    assert all(isinstance(r, ProcessBatchCancelledError) for r in results)
    assert len(b.calls) == 1
    await b.stop()


@pytest.mark.parametrize("how", ["drain", "force", "timeout"])
async def test_a_stop_during_a_bisection_resolves_every_caller_once(how: str) -> None:
    class Slow(Poisoned):
        async def process_batch(self, batch: list[int]) -> list[int]:
            await asyncio.sleep(1.0)
            return await super().process_batch(batch)

    b = Slow({1}, max_batch_size=8, max_queue_time=0.0, on_batch_error=Isolate())
    calls = [asyncio.ensure_future(b.process(x)) for x in range(8)]
    await asyncio.sleep(1.5)  # the first call failed; the first half is under way
    if how == "drain":
        await b.stop()
    elif how == "force":
        await b.stop(force=True)
    else:
        await b.stop(timeout=2.0)
    results = await asyncio.gather(*calls, return_exceptions=True)
    if how == "drain":
        assert [isinstance(r, ValueError) for r in results] == [x == 1 for x in range(8)]
    else:
        assert all(isinstance(r, BatcherStoppedError | ValueError | int) for r in results)
        assert any(isinstance(r, BatcherStoppedError) for r in results)
    idle_and_clean(b)


async def test_the_batches_record_their_parts() -> None:
    async with Poisoned({0}, max_batch_size=2, max_queue_time=1.0, on_batch_error=Isolate()) as b:
        with record_batches(b) as log:
            await gather(b, [0, 1])
    # Each call is a record, as stats.reasons counts it.
    assert [(r.items, r.reason) for r in log] == [([0, 1], "full"), ([0], "split"), ([1], "split")]
    assert b.stats.reasons == {"full": 1, "split": 2}


def test_the_failures_modules_docstring_example_runs_and_its_hook_takes_item_and_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Its example passed on_poison=dead_letters.append, which the hook's call (item, error) cannot be made with, and
    # used names it never defined. Run as written, with stand-ins for the two frameworks it names.
    doc = inspect.getdoc(async_batcher.failures) or ""
    block = textwrap.dedent(doc.split(".. code-block:: python", 1)[1].split("\n\n", 1)[1].split("\nThe guide")[0])
    httpx, torch = types.ModuleType("httpx"), types.ModuleType("torch")
    httpx.ReadTimeout = type("ReadTimeout", (Exception,), {})  # type: ignore[attr-defined]
    torch.OutOfMemoryError = type("OutOfMemoryError", (RuntimeError,), {})  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "httpx", httpx)
    monkeypatch.setitem(sys.modules, "torch", torch)
    namespace: dict[str, Any] = {}
    exec(compile(block, "async_batcher/failures.py (docstring)", "exec"), namespace)
    isolate = namespace["embedder"].on_batch_error
    assert isinstance(isolate, Isolate) and isolate.on_poison is not None
    error = ValueError("bad")
    isolate.on_poison("x", error)
    assert namespace["dead_letters"] == [("x", error)]
