"""A property test of issue 50's features as a hostile user drives them: every failure setting on, keys, priorities
(infinite ones too), preferred sizes, a hold, ``refuse_late`` and single flight, and the settings changed live at
random moments (the policy swapped, a hold turned off during a hold, ``split_on``, ``retry`` and ``on_batch_error``
turned off and on, ``max_priority_wait``, ``max_batch_size``, ``concurrency``), with ``flush()`` calls (two at once,
too), cancellations, timeouts and every kind of stop. Whatever happens:

- every call resolves exactly once, with its own result or an outcome it may have;
- the counters add up, the batcher ends idle (no timer, no backoff), its invariants hold;
- ``record_batches()`` agrees with ``process_batch``'s calls and with ``stats.reasons`` (where no caller left before
  a call: a record is made as a batch forms, tests/core/test_testing_kit.py's strict xfail).

It found two flushes at once keeping each other's pump from ever running (the loop spun, no time passing).

And a bisection (``Isolate``) whose callers leave at any moment and whose preferred sizes change as it runs keeps
the failures guide's bound of ``2·log2(n)`` extra calls for one bad item.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections import Counter
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from async_batcher import AsyncBatcher, BatcherStoppedError, LateRefusalError, TransientError, testing
from async_batcher.failures import Isolate, Retry, RetryPolicy, SplitOn
from async_batcher.policies import Deadline
from tests.batchers import stop_as
from tests.failures.test_property import Caller as PlainCaller

# The Hypothesis profile's examples are a few hundred: this test's half of them, or PROPERTY_EXAMPLES.
EXAMPLES = int(os.environ.get("PROPERTY_EXAMPLES") or settings().max_examples // 2)


class Bad(ValueError):
    def __init__(self, item: int) -> None:
        super().__init__(f"bad item {item}")


@dataclass
class World:
    bad: frozenset[int]
    flaky: dict[int, int]  # item -> how many of its tries answer Retry
    thresholds: list[int]  # the most items a call holds before it runs out of memory, call by call
    delays: list[float]
    keys: int
    dedup: bool


class Chaos(AsyncBatcher[int, int]):
    def __init__(self, world: World, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.world = world
        self.calls: list[list[int]] = []
        self.tries: dict[int, int] = {}

    def batch_key(self, item: int) -> int:
        return item % self.world.keys

    def dedup_key(self, item: int) -> int | None:
        return item if self.world.dedup else None

    async def process_batch(self, batch: list[int]) -> list[Any]:
        world = self.world
        n = len(self.calls)
        self.calls.append(list(batch))
        await asyncio.sleep(world.delays[n % len(world.delays)])
        if len(batch) > world.thresholds[n % len(world.thresholds)]:
            raise MemoryError(len(batch))
        found = [x for x in batch if x in world.bad]
        if found:
            raise Bad(found[0])
        results: list[Any] = []
        for x in batch:
            tries = self.tries[x] = self.tries.get(x, 0) + 1
            results.append(Retry() if tries <= world.flaky.get(x, 0) else x * 2)
        return results


# Settings changed live: (name, value); "flush" calls flush(), "policy" gives a policy of its own.
CHANGES = st.sampled_from(
    [
        ("max_hold_time", 0.0),
        ("max_hold_time", 0.05),
        ("preferred_batch_sizes", ()),
        ("preferred_batch_sizes", (1, 8)),
        ("preferred_batch_sizes", (2, 4)),
        ("max_priority_wait", 0.0),
        ("max_priority_wait", 0.05),
        ("max_priority_wait", 1.0),
        ("split_on", None),
        ("split_on", SplitOn(MemoryError)),
        ("retry", None),
        ("retry", RetryPolicy(attempts=2, backoff=0.1)),
        ("on_batch_error", None),
        ("on_batch_error", Isolate()),
        ("max_batch_size", 8),
        ("max_batch_size", 16),
        ("concurrency", 1),
        ("concurrency", 3),
        ("max_queue_time", 0.0),
        ("max_queue_time", 0.1),
        ("refuse_late", True),
        ("refuse_late", False),
        ("flush", None),
        ("policy", None),
    ]
)


@dataclass
class Caller(PlainCaller):
    priority: float = 0


@st.composite
def callers(draw: st.DrawFn) -> list[Caller]:
    found = []
    for _ in range(draw(st.integers(1, 14))):
        many = draw(st.booleans())
        size = draw(st.integers(1, 6)) if many else 1
        found.append(
            Caller(
                items=draw(st.lists(st.integers(0, 30), min_size=size, max_size=size)),  # duplicates too
                at=draw(st.sampled_from([0.0, 0.0, 0.005, 0.05, 0.3, 1.0])),
                timeout=draw(st.none() | st.sampled_from([0.0, 0.05, 0.2, 1.0, 3.0])),
                cancel_after=draw(st.none() | st.sampled_from([0.0, 0.02, 0.25, 0.8])),
                many=many,
                priority=draw(st.sampled_from([0, 0, 1, -1, math.inf, -math.inf])),
            )
        )
    return found


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    world=st.builds(
        World,
        bad=st.frozensets(st.integers(0, 30), max_size=4),
        flaky=st.dictionaries(st.integers(0, 30), st.integers(1, 3), max_size=8),
        thresholds=st.lists(st.integers(1, 16), min_size=1, max_size=3),
        delays=st.lists(st.sampled_from([0.0, 0.01, 0.1, 0.5]), min_size=1, max_size=3),
        keys=st.integers(1, 3),
        dedup=st.booleans(),
    ),
    calls=callers(),
    changes=st.lists(st.tuples(st.sampled_from([0.0, 0.001, 0.02, 0.1, 0.4, 1.2]), CHANGES), max_size=6),
    stop=st.sampled_from(["drain", "force", "timeout", "late"]),
    stop_at=st.sampled_from([0.0, 0.1, 0.6, 2.0]),
    start=st.fixed_dictionaries(
        {
            "max_batch_size": st.sampled_from([8, 16]),
            "concurrency": st.integers(1, 3),
            "preferred_batch_sizes": st.sampled_from([(), (1, 8), (2, 4)]),
            "max_hold_time": st.sampled_from([0.0, 0.05]),
            "max_priority_wait": st.sampled_from([0.0, 0.05, 1.0]),
        }
    ),
)
def test_every_call_resolves_once_whatever_is_changed_live(
    world: World,
    calls: list[Caller],
    changes: list[tuple[float, tuple[str, Any]]],
    stop: str,
    stop_at: float,
    start: dict[str, Any],
) -> None:
    async def main() -> None:
        b = Chaos(
            world,
            max_queue_time=0.01,
            default_timeout=30.0,  # (refuse_late turned on live needs a deadline)
            on_batch_error=Isolate(max_extra_calls=10_000),
            retry=RetryPolicy(attempts=3, backoff=0.05, cap=0.4),
            split_on=SplitOn(MemoryError, grow_after=2),
            **start,
        )
        flushes: list[asyncio.Task[None]] = []

        async def change(at: float, name: str, value: Any) -> None:
            await asyncio.sleep(at)
            try:
                if name == "flush":
                    flushes.append(asyncio.ensure_future(testing.flush(b)))
                elif name == "policy":
                    b.policy = Deadline(0.02)
                else:
                    setattr(b, name, value)
            except (TypeError, ValueError):
                pass  # (a dispatch keyword on a policy of its own; a batch size under a preferred one)
            assert testing.violations(b) == []

        async def call(c: Caller) -> list[Any]:
            await asyncio.sleep(c.at)
            if c.many:
                return await b.process_many(c.items, timeout=c.timeout, priority=c.priority, return_exceptions=True)
            return [await b.process(c.items[0], timeout=c.timeout, priority=c.priority)]

        async def cancel(task: asyncio.Task[Any], c: Caller) -> None:
            assert c.cancel_after is not None
            await asyncio.sleep(c.at + c.cancel_after)
            task.cancel()

        with testing.record_batches(b) as log:
            tasks = [asyncio.ensure_future(call(c)) for c in calls]
            others = [asyncio.ensure_future(cancel(t, c)) for t, c in zip(tasks, calls, strict=True) if c.cancel_after]
            others += [asyncio.ensure_future(change(at, *what)) for at, what in changes]
            await asyncio.sleep(stop_at)
            if stop == "late":  # once every call has its outcome
                await asyncio.gather(*tasks, return_exceptions=True)
            await stop_as(b, stop, timeout=0.5)
            async with asyncio.timeout(1000):
                outcomes = await asyncio.gather(*tasks, return_exceptions=True)
                await asyncio.gather(*others, *flushes, return_exceptions=True)
            await b.stop()  # (a stop before the first call found the batcher not started: the call started it)

        allowed = (
            TimeoutError,
            asyncio.CancelledError,
            BatcherStoppedError,
            TransientError,
            LateRefusalError,
            Bad,
            MemoryError,  # (split_on turned off live)
        )
        for c, outcome in zip(calls, outcomes, strict=True):
            results = [outcome] * len(c.items) if isinstance(outcome, BaseException) else outcome
            assert len(results) == len(c.items)
            for x, result in zip(c.items, results, strict=True):
                assert result == 2 * x or isinstance(result, allowed), (x, result)
        stats = b.stats
        assert stats.submitted == stats.succeeded + stats.failed + stats.cancelled + stats.timed_out, stats
        assert testing.idle(b) == []
        loop = asyncio.get_running_loop()
        assert isinstance(loop, testing.VirtualClockLoop) and loop.timers() == 0  # (none of anything's: all ended)
        assert stats.batches == len(b.calls)
        assert all(record.ended is not None for record in log)
        if stop != "force" and not any(c.cancel_after is not None or c.timeout is not None for c in calls):
            assert [record.items for record in log] == b.calls
            assert Counter(record.reason for record in log) == stats.reasons

    testing.run(main())


class SlowPoisoned(AsyncBatcher[int, int]):
    """A call takes a second; one holding an item of ``bad`` raises naming it."""

    def __init__(self, bad: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.bad = bad

    async def process_batch(self, batch: list[int]) -> list[int]:
        await asyncio.sleep(1.0)
        if self.bad in batch:
            raise Bad(self.bad)
        return [2 * x for x in batch]


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(2, 64),
    data=st.data(),
    sizes=st.sampled_from([(), (1, 64), (2, 64), (4, 64), (3, 5, 64), (1, 2, 4, 8, 16, 32, 64)]),
)
def test_a_bisection_with_callers_leaving_and_preferred_sizes_changed_live_keeps_its_bound(
    n: int, data: st.DataObject, sizes: tuple[int, ...]
) -> None:
    # One bad item among n; callers cancelled at any moment of the bisection, preferred sizes changed during it: the
    # healthy callers that stay get their results, the bad item's its error, and the bisection costs at most
    # 2·log2(n) extra calls.
    bad = data.draw(st.integers(0, n - 1))
    leaving = data.draw(st.lists(st.tuples(st.integers(0, n - 1), st.sampled_from([0.5, 1.5, 2.5, 3.5, 5.5]))))
    change = data.draw(st.none() | st.tuples(st.sampled_from([0.5, 1.5, 2.5]), st.sampled_from([(), (1, 64)])))

    async def main() -> None:
        b = SlowPoisoned(
            bad, max_batch_size=64, max_queue_time=1.0, preferred_batch_sizes=sizes, on_batch_error=Isolate()
        )
        calls = [asyncio.ensure_future(b.process(x)) for x in range(n)]

        async def cancel(x: int, at: float) -> None:
            await asyncio.sleep(at)
            calls[x].cancel()

        async def resize(at: float, value: tuple[int, ...]) -> None:
            await asyncio.sleep(at)
            b.preferred_batch_sizes = value

        others = [asyncio.ensure_future(cancel(x, at)) for x, at in leaving]
        if change is not None:
            others.append(asyncio.ensure_future(resize(*change)))
        results = await asyncio.gather(*calls, return_exceptions=True)
        await asyncio.gather(*others)
        for x, result in enumerate(results):
            if not isinstance(result, asyncio.CancelledError):
                assert isinstance(result, Bad) if x == bad else result == 2 * x, (x, result)
        assert b.stats.extra_calls <= 2 * math.ceil(math.log2(n))
        await b.stop()
        stats = b.stats
        assert stats.submitted == stats.succeeded + stats.failed + stats.cancelled + stats.timed_out, stats
        assert testing.idle(b) == []

    testing.run(main())
