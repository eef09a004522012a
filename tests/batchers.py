"""Batchers the tests drive: they record what ``process_batch`` saw and can be held at a gate."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Hashable, Iterable
from typing import Any

from async_batcher import AsyncBatcher, testing
from async_batcher._core.engine import Engine
from async_batcher._core.lane import Lane
from async_batcher.policies import Deadline, Layer
from tests.loops import until

__all__ = [
    "AllKeyed",
    "Recording",
    "Sleepy",
    "SyncRecording",
    "Tens",
    "idle_and_clean",
    "later",
    "outcome",
    "regather_until",
    "settled",
    "stop_as",
    "turns",
    "until",
    "warm",
]


class Recording(AsyncBatcher[int, int]):
    """Doubles its items; records each batch and the loop time it started; can be held or slowed.

    ``gate``: when set, each batch waits for it (an ``asyncio.Event``) before answering.
    ``delay``: each batch sleeps this long (on the loop's clock).
    ``answer``: replaces the doubling: called with the batch, its return value is returned.
    """

    def __init__(
        self,
        *,
        gate: asyncio.Event | None = None,
        delay: float = 0.0,
        answer: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.gate = gate
        self.delay = delay
        self.answer = answer
        self.batches: list[list[int]] = []
        self.started_at: list[float] = []
        self.in_flight = 0
        self.max_in_flight = 0

    async def process_batch(self, batch: list[int]) -> Any:
        self.batches.append(list(batch))
        self.started_at.append(asyncio.get_running_loop().time())
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.gate is not None:
                await self.gate.wait()
            if self.delay:
                await asyncio.sleep(self.delay)
            if self.answer is not None:
                return self.answer(batch)
            return [x * 2 for x in batch]
        finally:
            self.in_flight -= 1

    @property
    def sent(self) -> list[int]:
        return [x for b in self.batches for x in b]


class SyncRecording(AsyncBatcher[int, int]):
    """A plain ``def process_batch``: records the thread it ran on; can block on a ``threading.Event``."""

    def __init__(self, *, block: threading.Event | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.block = block
        self.threads: list[int] = []
        self.batches: list[list[int]] = []

    def process_batch(self, batch: list[int]) -> list[int]:
        self.threads.append(threading.get_ident())
        self.batches.append(list(batch))
        if self.block is not None and not self.block.wait(timeout=60):
            raise RuntimeError("the test never released the batch")
        return [x * 2 for x in batch]


async def turns(n: int) -> None:
    """Let ``n`` turns of the event loop pass."""
    for _ in range(n):
        await asyncio.sleep(0)


async def warm(b: AsyncBatcher[int, Any], items: Iterable[int]) -> None:
    """Two batches of ``items``' callers: after the second, the lane has a rate and its batch answered a cohort."""
    items = list(items)
    for _ in range(2):
        await asyncio.gather(*(b.process(x) for x in items))


async def stop_as(b: AsyncBatcher[Any, Any], how: str, *, timeout: float) -> None:
    """Stop ``b`` as ``how`` says: ``"drain"`` (``stop()``), ``"force"`` (``stop(force=True)``), else
    ``stop(timeout=timeout)``."""
    if how == "drain":
        await b.stop()
    elif how == "force":
        await b.stop(force=True)
    else:
        await b.stop(timeout=timeout)


async def later(n: int, call: Callable[[], Awaitable[Any]]) -> Any:
    """``call()`` ``n`` turns of the loop from now."""
    await turns(n)
    return await call()


def engine_of(b: AsyncBatcher[Any, Any]) -> Engine:
    """The engine of ``b``'s current run (started)."""
    engine = b._life.run.engine
    assert engine is not None
    return engine


def regather_until(b: AsyncBatcher[Any, Any], lane: Lane | None = None) -> float:
    """Until when ``lane``'s next arrival (the default lane's by default) lets the regather's turns pass: what
    ``b``'s :class:`~async_batcher.policies.Deadline` recorded of the lane in its memo, while the engine asks it about
    that arrival (``lane.watch``); 0.0 when it does not."""
    if lane is None:
        lane = engine_of(b).queue.lane0
    policy = b.policy
    while isinstance(policy, Layer):
        policy = policy.inner
    assert isinstance(policy, Deadline), policy
    record = (lane.memo or {}).get(policy)
    return float(record.until) if record is not None and lane.watch else 0.0


def idle_and_clean(b: AsyncBatcher[Any, Any]) -> None:
    """Nothing queued, nothing in flight: no timer, no pending turn, no deadline timer, the run's invariants hold,
    and the counters add up (every submitted item counted once as succeeded, failed, cancelled or timed out)."""
    assert testing.idle(b) == []
    s = b.stats
    assert s.submitted == s.succeeded + s.failed + s.cancelled + s.timed_out, s


class AllKeyed(Recording):
    """Every item has a keyed lane: 0-99 key 0, 100-199 key 1..."""

    def batch_key(self, item: int) -> Hashable:
        return item // 100


class Tens(AsyncBatcher[int, int]):
    """Multiplies by ten; records its batches."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.batches: list[list[int]] = []

    async def process_batch(self, batch: list[int]) -> list[int]:
        self.batches.append(list(batch))
        return [x * 10 for x in batch]


class Sleepy(AsyncBatcher[int, int]):
    """Each batch takes 1 s; records its batches."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.batches: list[list[int]] = []

    async def process_batch(self, batch: list[int]) -> list[int]:
        self.batches.append(list(batch))
        await asyncio.sleep(1)
        return batch


def settled(b: AsyncBatcher[Any, Any]) -> bool:
    """Every submitted item ended once, and nothing waits or runs."""
    s = b.stats
    return s.submitted == s.succeeded + s.failed + s.cancelled + s.timed_out and s.queued == s.in_flight == 0


def outcome(result: object) -> object:
    """A result as the tests compare it: an exception by its type's name."""
    return type(result).__name__ if isinstance(result, BaseException) else result
