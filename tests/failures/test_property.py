"""A property test of the failure handling (issue 45), every feature on at once: random bad items, random transient
failures (``Retry`` elements and raised throttles), an out-of-memory threshold that moves during the run,
deadlines, cancellations, ``process_many`` calls and stops. Whatever happens:

- every accepted item resolves exactly once (the counters add up, no caller is left waiting, the engine is clean);
- no healthy item gets another item's exception;
- nothing is sent past its deadline;
- the engine's invariants hold after the run.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from async_batcher import AsyncBatcher, BatcherStoppedError, TransientError, testing
from async_batcher.failures import Isolate, Retry, RetryBudget, RetryPolicy, SplitOn


class Bad(ValueError):
    """The error of a bad item: it names it."""

    def __init__(self, item: int) -> None:
        super().__init__(f"bad item {item}")
        self.item = item


class Throttled(Exception):
    """A transient error: of one item (in a Retry), or raised for a whole call (``item`` is None)."""

    def __init__(self, item: int | None) -> None:
        super().__init__(f"throttled {item}")
        self.item = item


@dataclass
class World:
    bad: frozenset[int]
    flaky: dict[int, int]  # item -> how many of its tries answer Retry
    throttled_calls: frozenset[int]  # numbers of the calls that raise Throttled
    thresholds: list[int]  # the out-of-memory threshold, moving every ``period`` calls
    period: int
    delays: list[float]


class Chaos(AsyncBatcher[int, int]):
    def __init__(self, world: World, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.world = world
        self.calls: list[tuple[float, list[int]]] = []
        self.tries: dict[int, int] = {}

    async def process_batch(self, batch: list[int]) -> list[Any]:
        world = self.world
        loop = asyncio.get_running_loop()
        n = len(self.calls)
        self.calls.append((loop.time(), list(batch)))
        await asyncio.sleep(world.delays[n % len(world.delays)])
        threshold = world.thresholds[(n // world.period) % len(world.thresholds)]
        if len(batch) > threshold:
            raise MemoryError(f"{len(batch)} > {threshold}")
        if n in world.throttled_calls:
            raise Throttled(None)
        found = [x for x in batch if x in world.bad]
        if found:
            raise Bad(found[0])
        results: list[Any] = []
        for x in batch:
            tries = self.tries[x] = self.tries.get(x, 0) + 1
            results.append(Retry(Throttled(x)) if tries <= world.flaky.get(x, 0) else x * 2)
        return results


@dataclass
class Caller:
    items: list[int]
    at: float
    timeout: float | None
    cancel_after: float | None
    many: bool


worlds = st.builds(
    World,
    bad=st.frozensets(st.integers(0, 59), max_size=6),
    flaky=st.dictionaries(st.integers(0, 59), st.integers(1, 4), max_size=15),
    throttled_calls=st.frozensets(st.integers(0, 40), max_size=6),
    thresholds=st.lists(st.integers(1, 16), min_size=1, max_size=4),
    period=st.integers(1, 8),
    delays=st.lists(st.sampled_from([0.0, 0.01, 0.1, 0.5]), min_size=1, max_size=4),
)


@st.composite
def callers(draw: st.DrawFn) -> list[Caller]:
    found: list[Caller] = []
    item = 0
    for _ in range(draw(st.integers(1, 12))):
        many = draw(st.booleans())
        size = draw(st.integers(1, 8)) if many else 1
        found.append(
            Caller(
                items=list(range(item, item + size)),
                at=draw(st.sampled_from([0.0, 0.0, 0.005, 0.05, 0.3, 1.0])),
                timeout=draw(st.none() | st.sampled_from([0.0, 0.05, 0.2, 1.0, 3.0])),
                cancel_after=draw(st.none() | st.sampled_from([0.0, 0.02, 0.25, 0.8])),
                many=many,
            )
        )
        item += size
    return found


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    world=worlds,
    calls=callers(),
    max_batch_size=st.integers(1, 16),
    concurrency=st.integers(1, 3),
    stop=st.sampled_from(["drain", "force", "timeout", "late"]),
    stop_at=st.sampled_from([0.0, 0.1, 0.6, 2.0]),
    budget=st.sampled_from([None, RetryBudget(ratio=0.2, floor=2.0, window=1.0)]),
)
def test_every_item_resolves_once_and_no_healthy_item_gets_anothers_error(
    world: World,
    calls: list[Caller],
    max_batch_size: int,
    concurrency: int,
    stop: str,
    stop_at: float,
    budget: RetryBudget | None,
) -> None:
    async def main() -> None:
        b = Chaos(
            world,
            max_batch_size=max_batch_size,
            concurrency=concurrency,
            max_queue_time=0.01,
            on_batch_error=Isolate(max_extra_calls=10_000),
            retry=RetryPolicy(attempts=3, backoff=0.05, cap=0.4, retry_on=(Throttled,), budget=budget),
            split_on=SplitOn(MemoryError, grow_after=2),
        )
        loop = asyncio.get_running_loop()
        deadlines: dict[int, float] = {}

        async def call(caller: Caller) -> Any:
            await asyncio.sleep(caller.at)
            if caller.timeout is not None:
                for x in caller.items:
                    deadlines[x] = loop.time() + caller.timeout
            if caller.many:
                return await b.process_many(caller.items, timeout=caller.timeout, return_exceptions=True)
            return [await b.process(caller.items[0], timeout=caller.timeout)]

        tasks = [asyncio.ensure_future(call(caller)) for caller in calls]

        async def cancel(task: asyncio.Future[Any], caller: Caller) -> None:
            assert caller.cancel_after is not None
            await asyncio.sleep(caller.at + caller.cancel_after)
            task.cancel()

        cancellers = [
            asyncio.ensure_future(cancel(task, caller))
            for task, caller in zip(tasks, calls, strict=True)
            if caller.cancel_after is not None
        ]
        await asyncio.sleep(stop_at)
        if stop == "drain":
            await b.stop()
        elif stop == "force":
            await b.stop(force=True)
        elif stop == "timeout":
            await b.stop(timeout=0.5)
        else:
            await asyncio.gather(*tasks, return_exceptions=True)
            await b.stop()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*cancellers, return_exceptions=True)
        await b.stop()  # (a stop before the first item came found the batcher not started: the item started it)

        # Every caller has its outcome, and each item its own.
        for caller, outcome in zip(calls, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                results = [outcome] * len(caller.items)
            else:
                results = outcome
            assert len(results) == len(caller.items)
            for x, result in zip(caller.items, results, strict=True):
                assert result == x * 2 or isinstance(result, BaseException), (x, result)
                if isinstance(result, Bad):
                    assert result.item == x or caller.many, (x, result)  # another item of its own call at most
                    if not caller.many:
                        assert x in world.bad
                elif isinstance(result, Throttled):
                    assert result.item in (None, x) or caller.many, (x, result)
                elif isinstance(result, MemoryError):
                    # Alone, an item fits unless the threshold of the moment is below one: never.
                    raise AssertionError(f"item {x} got {result!r}")
                elif isinstance(result, BaseException):
                    assert isinstance(
                        result, TimeoutError | asyncio.CancelledError | BatcherStoppedError | TransientError
                    ), (x, result)
        # Nothing was sent past its deadline.
        for at, items in b.calls:
            for x in items:
                assert at < deadlines.get(x, math.inf), (x, at, deadlines[x])
        stats = b.stats
        assert stats.submitted == stats.succeeded + stats.failed + stats.cancelled + stats.timed_out, stats
        assert testing.idle(b) == []

    testing.run(main())
