"""Random schedules: every caller ends resolved exactly once; no item is sent twice or after its caller left.

Each example runs a random mix of submissions (single and bulk), cancellations, timeouts, batches that succeed,
fail, return the wrong number of results, return ``None`` or per-item errors, raise ``CancelledError`` or take
long, and stops (draining, forced, with a timeout) and restarts, against random settings. Setting a future twice
would raise inside the batcher and reach the loop's exception handler, which fails the example.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from async_batcher import (
    AsyncBatcher,
    BatcherStoppedError,
    BatchSizeMismatchError,
    ProcessBatchCancelledError,
    QueueFullException,
)
from tests.loops import LOOP_FACTORIES

EXAMPLES = int(os.environ.get("PROPERTY_EXAMPLES", "1000"))


class Injected(Exception):
    pass


BEHAVIOURS = ["ok", "ok", "none", "raise", "wrong_length", "item_errors", "cancelled"]


@dataclass
class World:
    clock: itertools.count[int] = field(default_factory=itertools.count)
    sent: dict[int, tuple[int, float, str]] = field(default_factory=dict)  # item -> (seq, time, behaviour)
    duplicates: list[int] = field(default_factory=list)
    left: dict[int, int] = field(default_factory=dict)  # item -> seq at which its caller was cancelled
    bad_batches: list[list[int]] = field(default_factory=list)  # mixed keys, or over the weight limit


class Chaos(AsyncBatcher[int, int]):
    def __init__(self, world: World, behaviours: list[tuple[str, float]], keys: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.world = world
        self.behaviours = behaviours
        self.keys = keys
        self.count = 0

    def batch_key(self, item: int) -> int:
        return item % self.keys

    def item_weight(self, item: int) -> float:
        return 1 + item % 3

    async def process_batch(self, batch: list[int]) -> Any:
        kind, delay = self.behaviours[self.count % len(self.behaviours)]
        self.count += 1
        now = asyncio.get_running_loop().time()
        seq = next(self.world.clock)
        limit = self.max_batch_weight
        if len({self.batch_key(x) for x in batch}) > 1 or (
            limit is not None and sum(map(self.item_weight, batch)) > limit
        ):
            self.world.bad_batches.append(list(batch))
        for x in batch:
            if x in self.world.sent:
                self.world.duplicates.append(x)
            self.world.sent[x] = (seq, now, kind)
        if delay:
            await asyncio.sleep(delay)
        if kind == "none":
            return None
        if kind == "raise":
            raise Injected
        if kind == "wrong_length":
            return [x * 2 for x in batch] + [0]
        if kind == "item_errors":
            return [Injected() if x % 3 == 0 else x * 2 for x in batch]
        if kind == "cancelled":
            raise asyncio.CancelledError
        return [x * 2 for x in batch]


class ThreadChaos(Chaos):
    """The same batches through a plain ``def process_batch``: it runs in the loop's executor and returns the
    chaos as an awaitable, which the batcher awaits on the loop (the executor path, then the awaitable path)."""

    def process_batch(self, batch: list[int]) -> Any:  # type: ignore[override]
        return Chaos.process_batch(self, batch)


op = st.one_of(
    st.tuples(
        st.just("one"),
        st.sampled_from([None, None, 0.0, 0.05, 0.3]),  # timeout
        st.sampled_from([None, None, None, 0.0, 0.02, 0.2]),  # cancel after
        st.sampled_from([0, 0, 0, 1, -1]),  # priority
    ),
    st.tuples(st.just("many"), st.integers(1, 7), st.sampled_from([None, 0.1]), st.sampled_from([None, 0.0, 0.1])),
    st.tuples(st.just("stop"), st.sampled_from(["drain", "force", "timeout"]), st.just(None), st.just(None)),
    st.tuples(st.just("start"), st.just(None), st.just(None), st.just(None)),
)
schedule = st.lists(st.tuples(st.sampled_from([0.0, 0.0, 0.01, 0.1]), op), min_size=1, max_size=25)
behaviours = st.lists(st.tuples(st.sampled_from(BEHAVIOURS), st.sampled_from([0.0, 0.0, 0.02, 0.5])), min_size=1)
config = st.fixed_dictionaries(
    {
        "max_batch_size": st.sampled_from([1, 2, 3, 5, -1]),
        "max_queue_time": st.sampled_from([0.0, 0.01, 0.1]),
        "concurrency": st.sampled_from([1, 2, -1]),
        "max_queue_size": st.sampled_from([-1, 3, 10]),
        "wait_when_full": st.booleans(),
        "keys": st.sampled_from([1, 1, 2, 3]),
        "max_batch_weight": st.sampled_from([None, None, 4, 6]),
        "max_priority_wait": st.sampled_from([0.0, 0.05, 1.0]),
        "in_thread": st.booleans(),
    }
)
EXPECTED_ERRORS = (
    Injected,
    BatchSizeMismatchError,
    ProcessBatchCancelledError,
    TimeoutError,
    BatcherStoppedError,
    QueueFullException,
)


async def drive(cfg: dict[str, Any], ops: list[Any], kinds: list[tuple[str, float]], exact_time: bool) -> None:
    world = World()
    cfg = dict(cfg)
    in_thread = cfg.pop("in_thread", False)
    b = (ThreadChaos if in_thread else Chaos)(world, kinds, **cfg)
    loop = asyncio.get_running_loop()
    ids = itertools.count()
    calls: list[tuple[asyncio.Task[Any], list[int], float | None, bool]] = []  # task, items, deadline, bulk
    background: list[asyncio.Task[Any]] = []

    async def cancel_later(task: asyncio.Task[Any], items: list[int], after: float) -> None:
        await asyncio.sleep(after)
        if not task.done():
            task.cancel()
            seq = next(world.clock)
            for x in items:
                world.left.setdefault(x, seq)

    for pause, (kind, a, c, d) in ops:
        if pause:
            await asyncio.sleep(pause)
        if kind == "one":
            x = next(ids)
            task = asyncio.ensure_future(b.process(x, timeout=a, priority=d))
            calls.append((task, [x], None if a is None else loop.time() + a, False))
            if c is not None:
                background.append(asyncio.ensure_future(cancel_later(task, [x], c)))
        elif kind == "many":
            items = [next(ids) for _ in range(a)]
            task = asyncio.ensure_future(b.process_many(items, timeout=c))
            calls.append((task, items, None if c is None else loop.time() + c, True))
            if d is not None:
                background.append(asyncio.ensure_future(cancel_later(task, items, d)))
        elif kind == "stop":
            if a == "drain":
                background.append(asyncio.ensure_future(b.stop()))
            elif a == "force":
                background.append(asyncio.ensure_future(b.stop(force=True)))
            else:
                background.append(asyncio.ensure_future(b.stop(timeout=0.05)))
        elif kind == "start":
            try:
                b.start()
            except BatcherStoppedError:
                pass  # a stop is in progress: refused, as documented
    await asyncio.gather(*background, return_exceptions=True)
    await asyncio.sleep(0)  # every caller task has started (a stop before the first use is a no-op)
    await b.stop(timeout=1.0)

    # No caller is left waiting.
    pending = [t for t, *_ in calls if not t.done()]
    if pending:
        await asyncio.wait(pending, timeout=5.0)
    assert all(t.done() for t, *_ in calls), "a caller was left waiting"
    assert not world.duplicates, f"items sent twice: {world.duplicates}"
    assert not world.bad_batches, f"batches mixing keys or over the weight limit: {world.bad_batches}"
    assert b.stats.queued == 0 and b.stats.in_flight == 0

    for task, items, deadline, bulk in calls:
        if task.cancelled():
            for x in items:
                # (In a thread batch the chaos records its items only once the thread has handed it back, after
                # the batch was sent: the order of sending and leaving is checked by the loop-side runs.)
                if x in world.sent and not in_thread:
                    assert world.sent[x][0] < world.left[x], f"item {x} was sent after its caller left"
            continue
        exc = task.exception()
        if exc is None:
            results = task.result() if bulk else [task.result()]
            for x, r in zip(items, results, strict=True):
                assert x in world.sent, f"item {x} got a result without being processed"
                kind = world.sent[x][2]
                assert r == (None if kind == "none" else x * 2), (x, r, kind)
            continue
        assert isinstance(exc, EXPECTED_ERRORS), repr(exc)
        if isinstance(exc, Injected | BatchSizeMismatchError | ProcessBatchCancelledError):
            assert any(x in world.sent for x in items)
        if isinstance(exc, TimeoutError) and exact_time and deadline is not None:
            for x in items:
                if x in world.sent:
                    assert world.sent[x][1] <= deadline, f"item {x} was sent after its timeout"
        if isinstance(exc, QueueFullException):
            assert not any(x in world.sent for x in items)


def run(kind: str, cfg: dict[str, Any], ops: list[Any], kinds: list[tuple[str, float]]) -> None:
    errors: list[dict[str, Any]] = []
    with asyncio.Runner(loop_factory=LOOP_FACTORIES[kind]) as runner:
        runner.get_loop().set_exception_handler(lambda _loop, context: errors.append(context))
        runner.run(drive(cfg, ops, kinds, exact_time=kind == "virtual"))
    assert not errors, errors


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=config, ops=schedule, kinds=behaviours)
def test_every_caller_resolves_exactly_once_on_virtual_time(
    cfg: dict[str, Any], ops: list[Any], kinds: list[tuple[str, float]]
) -> None:
    run("virtual", cfg, ops, kinds)


@settings(max_examples=max(EXAMPLES // 20, 10), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=config, ops=schedule, kinds=behaviours)
def test_every_caller_resolves_exactly_once_on_uvloop(
    cfg: dict[str, Any], ops: list[Any], kinds: list[tuple[str, float]]
) -> None:
    # Real time here, so the schedule's pauses and delays are shrunk to keep the run short.
    fast_ops = [(p / 20, o) for p, o in ops]
    fast_kinds = [(k, d / 20) for k, d in kinds]
    run("uvloop", cfg, fast_ops, fast_kinds)
