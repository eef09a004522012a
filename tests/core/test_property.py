"""Random schedules: every caller resolves exactly once, and everything the contract promises holds on the way.

Each example draws a batcher (the default configuration, or with ``batch_key`` / ``item_weight`` hooks; an
``async def``, a plain ``def`` run in a thread, or a plain ``def`` returning an awaitable; with or without
``on_start`` / ``on_stop``), settings, and a schedule of submissions (single, bulk with and without
``return_exceptions``, priorities, timeouts, calls from threads), cancellations, live setting changes, stops
(draining, forced, timed out, from a thread with ``stop_sync``) and restarts, against batches that succeed, fail,
return the wrong number of results, ``None`` or per-item errors, raise ``CancelledError`` or take long. It checks:

- after every step, the internal invariants of the queue and the run (``violations``) and that the counters never
  count more outcomes than items;
- every caller resolves; no item is sent twice, or after its caller left; a caller gets a result only from a batch
  that gave one, of the right value;
- no batch larger than ``max_batch_size``, heavier than ``max_batch_weight`` or mixing keys; never more batches in
  flight than ``concurrency``; first come, first served within a key and a priority; no batch outside a run
  (before ``on_start`` ends or after ``on_stop``);
- at the end, ``submitted == succeeded + failed + cancelled + timed_out``.

Setting a future twice would raise inside the batcher and reach the loop's exception handler, which fails the
example.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from async_batcher import (
    END,
    AsyncBatcher,
    AsyncBatchException,
    BatcherStoppedError,
    BatchSizeMismatchError,
    ProcessBatchCancelledError,
    QueueFullException,
    ReentrantCallError,
)
from async_batcher.testing import violations
from tests.loops import LOOP_FACTORIES, VirtualClockLoop

# The Hypothesis profile's examples (tests/conftest.py: a few hundred, 1000 in make test-all), or PROPERTY_EXAMPLES.
EXAMPLES = int(os.environ.get("PROPERTY_EXAMPLES") or settings().max_examples)
# Every wait of a schedule is bounded on the loop's clock, so that a hang fails the example instead of the suite:
# the whole schedule (HANG), and, before the final stop, the callers' wait for their outcomes on a running batcher
# (SETTLE: every batch ends within a second, every deadline comes, so each caller has its outcome by then).
HANG = 600.0
SETTLE = 60.0


class Injected(Exception):
    pass


BEHAVIOURS = ["ok", "ok", "none", "raise", "wrong_length", "item_errors", "cancelled"]
FAILING = {"raise", "wrong_length", "cancelled"}  # no caller of such a batch may get a result


@dataclass
class World:
    """What the batch functions saw, shared by the schedule's checks."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    clock: itertools.count[int] = field(default_factory=itertools.count)
    sent: dict[int, tuple[int, float, str]] = field(default_factory=dict)  # item -> (seq, time, behaviour)
    order: list[int] = field(default_factory=list)  # items in the order batches took them
    duplicates: list[int] = field(default_factory=list)
    left: dict[int, int] = field(default_factory=dict)  # item -> seq at which its caller was cancelled
    problems: list[str] = field(default_factory=list)
    in_flight: int = 0
    limits: dict[str, list[Any]] = field(default_factory=dict)  # every value each setting had
    running: bool = False  # between on_start's end and on_stop's start (with hooks)
    keys: int = 1  # items' keys are item % keys (1: every item has the same)
    ordered: bool = True  # whether the order of process_batch calls is the order the batches were formed in

    def key_of(self, item: int) -> int:
        return item % self.keys

    def tick(self) -> int:
        with self.lock:
            return next(self.clock)


class Chaos(AsyncBatcher[int, int]):
    """An ``async def process_batch`` that acts as drawn; its checks write into the world."""

    def __init__(self, world: World, behaviours: list[tuple[str, float]], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.world = world
        self.behaviours = behaviours
        self.count = 0

    def behaviour(self) -> tuple[str, float]:
        with self.world.lock:
            kind = self.behaviours[self.count % len(self.behaviours)]
            self.count += 1
        return kind

    def record(self, batch: list[int], kind: str, now: float, *, hooks: bool) -> None:
        world = self.world
        seq = world.tick()
        with world.lock:
            world.in_flight += 1
            concurrency = world.limits["concurrency"]
            if None not in concurrency and world.in_flight > max(concurrency):
                world.problems.append(f"{world.in_flight} batches in flight, concurrency {concurrency}")
            sizes = world.limits["max_batch_size"]
            if None not in sizes and len(batch) > max(sizes):
                world.problems.append(f"a batch of {len(batch)}, max_batch_size {sizes}")
            if hooks and not world.running:
                world.problems.append(f"a batch outside a run (on_start not done, or on_stop begun): {batch}")
            for x in batch:
                if x in world.sent:
                    world.duplicates.append(x)
                world.sent[x] = (seq, now, kind)
                world.order.append(x)

    def check_keys_and_weights(self, batch: list[int]) -> None:
        pass

    def answer(self, batch: list[int], kind: str) -> Any:
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

    async def process_batch(self, batch: list[int]) -> Any:
        kind, delay = self.behaviour()
        self.check_keys_and_weights(batch)
        self.record(batch, kind, asyncio.get_running_loop().time(), hooks=self.hooks)
        try:
            if delay:
                await asyncio.sleep(delay)
            return self.answer(batch, kind)
        finally:
            with self.world.lock:
                self.world.in_flight -= 1

    hooks = False


class Hooked(Chaos):
    """With ``on_start`` and ``on_stop``, which take a while (the first batch waits for on_start), and call back
    into the batcher: what would wait for the hook itself must be refused at once."""

    hooks = True

    async def on_start(self) -> None:
        await refused(self.world, "on_start", self.process(-1), self.process_many([-2, -3]), self.stop())
        await asyncio.sleep(0.01)
        self.world.running = True

    async def on_stop(self) -> None:
        self.world.running = False
        await refused(self.world, "on_stop", self.stop())
        await asyncio.sleep(0.01)


async def refused(world: World, hook: str, *calls: Any) -> None:
    """Each call, made from inside ``hook``, raises ReentrantCallError at once (a wait would be for the hook), or
    BatcherStoppedError if a stop has begun meanwhile."""
    for call in calls:
        try:
            async with asyncio.timeout(0):  # at once: not a single wait on the loop
                await call
        except (ReentrantCallError, BatcherStoppedError):
            continue
        except BaseException as exc:
            world.problems.append(f"a call from inside {hook} was not refused at once: {exc!r}")
        else:
            world.problems.append(f"a call from inside {hook} was served")


class InThread(Chaos):
    """A plain ``def process_batch``: it runs in a one-thread executor, so that batches also wait there for it
    (and a forced stop finds some that never start)."""

    def process_batch(self, batch: list[int]) -> Any:  # type: ignore[override]
        kind, delay = self.behaviour()
        self.check_keys_and_weights(batch)
        self.record(batch, kind, -1.0, hooks=False)
        try:
            if delay:
                time.sleep(min(delay, 0.002))  # real time in a thread: kept short
            return self.answer(batch, kind)
        finally:
            with self.world.lock:
                self.world.in_flight -= 1


class Awaitable(Chaos):
    """A plain ``def process_batch`` returning an awaitable: the executor path, then the awaitable on the loop."""

    def process_batch(self, batch: list[int]) -> Any:  # type: ignore[override]
        return Chaos.process_batch(self, batch)


class Keyed:
    """Mixed in: items have keys (``item % keys``) and weights (``1 + item % 3``)."""

    world: World
    keys: int

    def batch_key(self, item: int) -> int:
        return item % self.keys

    def item_weight(self, item: int) -> float:
        return 1 + item % 3

    def check_keys_and_weights(self, batch: list[int]) -> None:
        weights = self.world.limits["max_batch_weight"]
        too_heavy = None not in weights and sum(map(self.item_weight, batch)) > max(weights)
        if len({self.batch_key(x) for x in batch}) > 1 or too_heavy:
            self.world.problems.append(f"a batch mixing keys or over the weight limit: {batch}")


KINDS: dict[tuple[str, bool], type[Chaos]] = {}
for name, base in (("async", Chaos), ("hooked", Hooked), ("thread", InThread), ("awaitable", Awaitable)):
    KINDS[name, False] = base
    KINDS[name, True] = type(f"Keyed{base.__name__}", (Keyed, base), {})


op = st.one_of(
    st.tuples(
        st.just("one"),
        st.sampled_from([None, None, 0.0, 0.05, 0.3]),  # timeout
        st.sampled_from([None, None, None, 0.0, 0.02, 0.2]),  # cancel after
        st.sampled_from([0, 0, 0, 1, -1]),  # priority
    ),
    st.tuples(
        st.just("many"),
        st.integers(1, 7),
        st.sampled_from([None, None, 0.1]),  # timeout
        st.tuples(st.sampled_from([None, None, 0.0, 0.1]), st.booleans()),  # cancel after, return_exceptions
    ),
    st.tuples(st.just("sync"), st.sampled_from([None, 0.05]), st.just(None), st.just(None)),
    st.tuples(st.just("stop"), st.sampled_from(["drain", "force", "timeout", "sync"]), st.just(None), st.just(None)),
    st.tuples(st.just("start"), st.just(None), st.just(None), st.just(None)),
    st.tuples(
        st.just("set"),
        st.sampled_from(
            [
                "max_batch_size",
                "max_queue_time",
                "concurrency",
                "max_queue_size",
                "max_latency",
                "max_batch_weight",
                "max_hold_time",
            ]
        ),
        st.integers(0, 2),
        st.just(None),
    ),
)
schedule = st.lists(st.tuples(st.sampled_from([0.0, 0.0, 0.01, 0.1]), op), min_size=1, max_size=25)
behaviours = st.lists(st.tuples(st.sampled_from(BEHAVIOURS), st.sampled_from([0.0, 0.0, 0.02, 0.5])), min_size=1)
config = st.fixed_dictionaries(
    {
        "kind": st.sampled_from(["async", "async", "hooked", "thread", "awaitable"]),
        "keyed": st.booleans(),
        "max_batch_size": st.sampled_from([1, 2, 3, 5, None]),
        "max_queue_time": st.sampled_from([0.0, 0.01, 0.1]),
        "concurrency": st.sampled_from([1, 2, None]),
        "max_queue_size": st.sampled_from([None, 3, 10]),
        "wait_when_full": st.booleans(),
        "keys": st.sampled_from([1, 2, 3]),
        "max_batch_weight": st.sampled_from([None, None, 4, 6]),
        "max_priority_wait": st.sampled_from([0.0, 0.05, 1.0]),
        "max_latency": st.sampled_from([None, None, None, 0.05]),
        "preferred_batch_sizes": st.sampled_from([(), (), (), (1, 3), (2,)]),
        "default_timeout": st.sampled_from([None, None, None, 0.05, 0.3]),
        "max_hold_time": st.sampled_from([0.0, 0.0, 0.01, 0.1]),
    }
).filter(lambda c: c["max_batch_size"] is None or max(c["preferred_batch_sizes"], default=0) <= c["max_batch_size"])
# The values a live change draws from, by index.
LIVE = {
    "max_batch_size": [3, 4, None],
    "max_queue_time": [0.0, 0.01, 0.1],
    "concurrency": [1, 2, None],
    "max_queue_size": [None, 3, 10],
    "max_latency": [None, 0.02, 0.1],
    "max_batch_weight": [None, 4, 8],
    "max_hold_time": [0.0, 0.01, 0.1],
}
EXPECTED_ERRORS = (
    Injected,
    BatchSizeMismatchError,
    ProcessBatchCancelledError,
    TimeoutError,
    BatcherStoppedError,
    QueueFullException,
)


@dataclass
class Call:
    items: list[int]
    deadline: float | None
    bulk: bool
    priority: float = 0
    from_thread: bool = False
    task: asyncio.Future[Any] | None = None
    outcome: Any = None  # a thread caller's result or exception


def check_step(b: AsyncBatcher[Any, Any], world: World) -> None:
    found = violations(b)
    s = b.stats
    if s.submitted < s.succeeded + s.failed + s.cancelled + s.timed_out:
        found.append(f"more outcomes than items: {s}")
    if s.queued < 0 or s.in_flight < 0:
        found.append(f"negative counts: {s}")
    world.problems += found


async def drive(
    cfg: dict[str, Any], ops: list[Any], kinds: list[tuple[str, float]], exact_time: bool, scale: float = 1.0
) -> None:
    world = World()
    cfg = dict(cfg)
    variant, keyed = cfg.pop("kind"), cfg.pop("keyed")
    cls = KINDS[variant, keyed]
    keys = cfg.pop("keys")
    if cfg["max_latency"] is not None:
        del cfg["max_queue_time"]  # (the latency budget chooses the wait: both together are a TypeError)
    world.keys = keys if keyed else 1
    # Batches whose function runs in the loop's default executor (several threads) may reach it in another order
    # than they were formed in; and an item woken for room in a full queue arrives when it queues, not when called.
    world.ordered = variant != "awaitable" and not (cfg["wait_when_full"] and cfg["max_queue_size"] is not None)
    executor = Watched(asyncio.get_running_loop()) if cls.__name__.endswith("InThread") else None
    if not keyed:
        cfg["max_batch_weight"] = None  # (a weight limit needs item_weight, which only the keyed classes override)
    for name in ("max_batch_size", "concurrency", "max_batch_weight"):
        world.limits[name] = [cfg[name]]
    b = cls(world, kinds, executor=executor, **cfg)
    b.keys = keys  # type: ignore[attr-defined]
    b.start()  # on this loop: the calls from threads come here too (else they would start a loop of its own)
    loop = asyncio.get_running_loop()
    ids = itertools.count()
    calls: list[Call] = []
    background: list[asyncio.Future[Any]] = []
    threads: list[threading.Thread] = []

    async def cancel_later(task: asyncio.Future[Any], items: list[int], after: float) -> None:
        await asyncio.sleep(after)
        if not task.done():
            task.cancel()
            seq = world.tick()
            for x in items:
                world.left.setdefault(x, seq)

    def in_thread(call: Call, timeout: float | None) -> None:
        try:
            call.outcome = b.process_sync(call.items[0], timeout=timeout)
        except BaseException as exc:
            call.outcome = exc

    def stop_in_thread() -> None:
        b.stop_sync(timeout=0.05)

    for pause, (kind, a, c, d) in ops:
        if pause:
            await asyncio.sleep(pause)
        if kind == "one":
            timeout = a if a is not None else cfg["default_timeout"]
            call = Call([next(ids)], None if timeout is None else loop.time() + timeout, False, priority=d)
            call.task = asyncio.ensure_future(b.process(call.items[0], timeout=a, priority=d))
            if c is not None:
                background.append(asyncio.ensure_future(cancel_later(call.task, call.items, c)))
        elif kind == "many":
            cancel_after, return_exceptions = d
            timeout = c if c is not None else cfg["default_timeout"]
            call = Call([next(ids) for _ in range(a)], None if timeout is None else loop.time() + timeout, True)
            many = b.process_many(call.items, timeout=c, return_exceptions=return_exceptions)
            call.task = asyncio.ensure_future(many)
            if cancel_after is not None:
                background.append(asyncio.ensure_future(cancel_later(call.task, call.items, cancel_after)))
        elif kind == "sync":
            call = Call([next(ids)], None, False, from_thread=True)
            threads.append(threading.Thread(target=in_thread, args=(call, a), daemon=True))
            threads[-1].start()
        elif kind == "stop":
            if a == "drain":
                background.append(asyncio.ensure_future(b.stop()))
            elif a == "force":
                background.append(asyncio.ensure_future(b.stop(force=True)))
            elif a == "timeout":
                background.append(asyncio.ensure_future(b.stop(timeout=0.05)))
            else:
                threads.append(threading.Thread(target=stop_in_thread, daemon=True))
                threads[-1].start()
            continue
        elif kind == "start":
            try:
                b.start()
            except BatcherStoppedError:
                pass  # a stop is in progress: refused, as documented
            continue
        else:
            value = LIVE[a][c]
            if a == "max_queue_time" and b.max_latency is not None:
                with pytest.raises(TypeError, match="does nothing while max_latency"):
                    setattr(b, a, value)
                continue
            if a == "max_batch_weight" and value is not None and not keyed:
                with pytest.raises(ValueError, match="needs the item_weight"):
                    setattr(b, a, value)
                continue
            setattr(b, a, value)
            world.limits.setdefault(a, []).append(value)
            if a == "max_queue_size" and value is not None and cfg["wait_when_full"]:
                world.ordered = False
            continue
        calls.append(call)
        check_step(b, world)
    await asyncio.gather(*background, return_exceptions=True)
    await wait_for_threads(threads)
    await asyncio.sleep(0)  # every caller task has started (a stop before the first use is a no-op)
    check_step(b, world)
    await settle(world, [call.task for call in calls if call.task is not None], SETTLE * scale)
    await b.stop(timeout=1.0)
    await wait_for_threads(threads)
    if executor is not None:
        await loop.run_in_executor(None, executor.shutdown)
    # A batch whose function runs in a thread (or returns an awaitable from one) is recorded when that thread gets
    # to it, after the batch was sent: the order of sending and leaving is checked by the loop-side kinds.
    check(b, world, calls, exact_time=exact_time, in_thread=variant in ("thread", "awaitable"))


class Watched(concurrent.futures.ThreadPoolExecutor):
    """A one-thread executor whose work a virtual clock waits for, as it waits for the loop's default executor's:
    else the clock would jump over a batch at work in the thread, and a bounded wait (SETTLE) expire under it.

    The clock may move again only once the batcher has heard of the end: the future handed out completes (running
    the batcher's callback, which schedules its end on the loop) before the clock is told the thread is idle."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(max_workers=1)
        self.loop = loop if isinstance(loop, VirtualClockLoop) else None

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        loop = self.loop
        if loop is None:
            return super().submit(fn, *args, **kwargs)
        handed: concurrent.futures.Future[Any] = concurrent.futures.Future()
        loop.busy_threads += 1

        def ended(inner: concurrent.futures.Future[Any]) -> None:
            if inner.cancelled():
                handed.cancel()
            elif inner.exception() is not None:
                handed.set_exception(inner.exception())
            else:
                handed.set_result(inner.result())
            loop.call_soon_threadsafe(self._idle)

        super().submit(fn, *args, **kwargs).add_done_callback(ended)
        return handed

    def _idle(self) -> None:
        assert self.loop is not None
        self.loop.busy_threads -= 1


async def wait_for_threads(threads: list[threading.Thread]) -> None:
    """Let the loop run (its timers too: a thread's call may wait for one) until the threads have ended."""
    for _ in range(200_000):
        if not any(t.is_alive() for t in threads):
            return
        await asyncio.sleep(0.001)
    raise AssertionError("a thread was left blocked")


def check(b: AsyncBatcher[Any, Any], world: World, calls: list[Call], *, exact_time: bool, in_thread: bool) -> None:
    pending = [call for call in calls if call.task is not None and not call.task.done()]
    assert not pending, "a caller was left waiting"
    assert not any(t.is_alive() for t in threading.enumerate() if t.name.startswith("async-batcher:"))
    assert not world.duplicates, f"items sent twice: {world.duplicates}"
    assert not world.problems, world.problems
    s = b.stats
    assert s.queued == 0 and s.in_flight == 0
    assert s.submitted == s.succeeded + s.failed + s.cancelled + s.timed_out, s
    if world.ordered:
        check_order(world, calls)
    for call in calls:
        check_call(world, call, exact_time=exact_time, in_thread=in_thread)


def check_order(world: World, calls: list[Call]) -> None:
    """First come, first served among the items of one key and one priority (callers from threads aside)."""
    position = {x: i for i, x in enumerate(world.order)}
    classes: dict[tuple[int, float], list[int]] = {}
    for call in calls:
        if not call.from_thread:
            for x in call.items:
                if x in position:
                    classes.setdefault((world.key_of(x), call.priority), []).append(x)
    for members in classes.values():
        by_sending = sorted(members, key=position.__getitem__)
        assert by_sending == sorted(members), f"items sent out of their order: {by_sending}"


def check_call(world: World, call: Call, *, exact_time: bool, in_thread: bool) -> None:
    if call.task is not None and call.task.cancelled():
        for x in call.items:
            if x in world.sent and not in_thread:
                assert world.sent[x][0] < world.left[x], f"item {x} was sent after its caller left"
        return
    if call.task is not None:
        exc = call.task.exception()
        results = None if exc is not None else (call.task.result() if call.bulk else [call.task.result()])
    else:
        exc = call.outcome if isinstance(call.outcome, BaseException) else None
        results = None if exc is not None else [call.outcome]
    if results is not None:
        for x, r in zip(call.items, results, strict=True):
            if isinstance(r, BaseException):  # return_exceptions: in its place
                assert isinstance(r, EXPECTED_ERRORS), repr(r)
                continue
            assert x in world.sent, f"item {x} got a result without being processed"
            kind = world.sent[x][2]
            assert kind not in FAILING and not (kind == "item_errors" and x % 3 == 0), (x, r, kind)
            assert r == (None if kind == "none" else x * 2), (x, r, kind)
        return
    assert isinstance(exc, EXPECTED_ERRORS) or isinstance(exc, AsyncBatchException), repr(exc)
    if isinstance(exc, Injected | BatchSizeMismatchError | ProcessBatchCancelledError):
        assert any(x in world.sent for x in call.items)
    if isinstance(exc, TimeoutError) and exact_time and call.deadline is not None and not in_thread:
        for x in call.items:
            if x in world.sent:
                assert world.sent[x][1] <= call.deadline, f"item {x} was sent after its timeout"
    if isinstance(exc, QueueFullException):
        assert not any(x in world.sent for x in call.items)


async def settle(world: World | StreamWorld, tasks: list[asyncio.Future[Any]], within: float) -> None:
    """Wait, at most ``within`` seconds of the loop's clock, for every caller to have its outcome."""
    pending = [task for task in tasks if not task.done()]
    if pending:
        _, still = await asyncio.wait(pending, timeout=within)
        if still:
            world.problems.append(f"{len(still)} callers still without an outcome {within} s after the schedule")


async def bounded(schedule: Any, scale: float) -> None:
    """The whole schedule, bounded on the loop's clock: a hang fails the example."""
    try:
        async with asyncio.timeout(HANG * scale):
            await schedule
    except TimeoutError:
        raise AssertionError(f"the schedule did not end within {HANG * scale} s: something hangs") from None


def run(kind: str, cfg: dict[str, Any], ops: list[Any], kinds: list[tuple[str, float]]) -> None:
    errors: list[dict[str, Any]] = []
    scale = 1.0 if kind == "virtual" else 1 / 20
    with asyncio.Runner(loop_factory=LOOP_FACTORIES[kind]) as runner:
        runner.get_loop().set_exception_handler(lambda _loop, context: errors.append(context))
        runner.run(bounded(drive(cfg, ops, kinds, exact_time=kind == "virtual", scale=scale), scale))
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


# ---------------------------------------------------------------------- streaming batches
#
# A streaming process_batch (an async generator, static or continuous batches) that acts as drawn: parts for each
# item, an Exception for some items, raising, a step of the wrong length, a generator that fails to close (its
# finally raises, or it ignores GeneratorExit); consumers that read everything, read slowly, leave by aclose(), by
# a break out of a stream nobody else holds, by raising in their loop, by being cancelled, or stop reading with
# the stream kept in a variable (dropped after stream_stall_timeout); hooks that call back into the batcher; live
# setting changes; stops and restarts. It checks, after every step, the invariants of the run; at each step of a
# generator, that the batch holds no item whose stream ended, no item of another batch, no more items than
# max_batch_size, and that no stream buffers more than its stream_buffer; that no more generators run than
# concurrency allows; that each consumer got its own parts, in order, none skipped, and a complete stream only
# from the generator's end; that every consumer ends, the batcher running, within SETTLE; and that the counters
# add up.

STREAM_BEHAVIOURS = ["ok", "ok", "ok", "item_errors", "raise", "wrong_length", "close_raises", "ignores_exit"]
STREAM_FAILING = (Injected, BatchSizeMismatchError, BatcherStoppedError, QueueFullException)


class Left(Exception):
    """A consumer that leaves by raising in its loop."""


def length(x: int) -> int:
    """How many parts item ``x`` streams (0: its stream ends at the first step)."""
    return x % 5


def part(x: int, k: int) -> int:
    return x * 100 + k


@dataclass
class StreamWorld:
    problems: list[str] = field(default_factory=list)
    numbers: itertools.count[int] = field(default_factory=itertools.count)  # batches, numbered
    seen: dict[int, int] = field(default_factory=dict)  # item -> the number of the batch it went into
    yielded: dict[int, int] = field(default_factory=dict)  # item -> parts the generator yielded for it
    taken: dict[int, int] = field(default_factory=dict)  # item -> parts its consumer took
    buffer: dict[int, int] = field(default_factory=dict)  # item -> stream_buffer when it was submitted
    limits: dict[str, list[Any]] = field(default_factory=dict)  # every value each setting had
    kept: list[tuple[Any, Consumer]] = field(default_factory=list)  # streams kept in a variable, and their readers
    in_flight: int = 0
    running: bool = False


class Streamer(AsyncBatcher[int, int]):
    """A streaming ``process_batch`` that acts as drawn; its checks write into the world."""

    hooks = False

    def __init__(self, world: StreamWorld, behaviours: list[tuple[str, float]], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.world = world
        self.behaviours = behaviours
        self.count = 0

    async def process_batch(self, batch: list[int]) -> Any:
        world = self.world
        kind, delay = self.behaviours[self.count % len(self.behaviours)]
        self.count += 1
        number = next(world.numbers)
        world.in_flight += 1
        concurrency = world.limits["concurrency"]
        if None not in concurrency and world.in_flight > max(concurrency):
            world.problems.append(f"{world.in_flight} stream batches at once, concurrency {concurrency}")
        if self.hooks and not world.running:
            world.problems.append(f"a stream batch outside a run: {batch}")
        done: dict[int, int] = {}
        over: set[int] = set()  # the items this generator ended (END, or an exception)
        counted_out = False
        step = 0
        try:
            while batch:
                sizes = world.limits["max_batch_size"]
                if None not in sizes and len(batch) > max(sizes):
                    world.problems.append(f"a stream batch of {len(batch)}, max_batch_size {sizes}")
                for x in batch:
                    if x in over:
                        world.problems.append(f"item {x} still in its batch after its stream ended")
                    if world.seen.setdefault(x, number) != number:
                        world.problems.append(f"item {x} in two batches")
                if delay:
                    await asyncio.sleep(delay)
                if kind == "raise" and step == 1:
                    raise Injected
                parts: list[Any] = []
                for x in batch:
                    k = done.get(x, 0)
                    done[x] = k + 1
                    buffered = world.yielded.get(x, 0) - world.taken.get(x, 0)
                    if buffered >= world.buffer[x]:
                        world.problems.append(f"item {x}: {buffered} parts buffered, stream_buffer {world.buffer[x]}")
                    if kind == "item_errors" and x % 3 == 0 and k == 1:
                        parts.append(Injected())
                        over.add(x)
                    elif k < length(x):
                        parts.append(part(x, k))
                        world.yielded[x] = world.yielded.get(x, 0) + 1
                    else:
                        parts.append(END)
                        over.add(x)
                if kind == "wrong_length" and step == 1:
                    parts.append(0)
                step += 1
                try:
                    yield parts
                except GeneratorExit:
                    if kind == "ignores_exit":
                        world.in_flight -= 1
                        counted_out = True
                        yield []  # Python raises RuntimeError in aclose(): the generator is left suspended
                    raise
        finally:
            if not counted_out:
                world.in_flight -= 1
            if kind == "close_raises":
                raise RuntimeError("cleanup failed")


class HookedStreamer(Streamer):
    """With hooks that call back into the batcher: what would wait for the hook itself is refused at once."""

    hooks = True

    async def on_start(self) -> None:
        await refused(self.world, "on_start", anext(self.stream(-1)), self.stop())  # type: ignore[arg-type]
        await asyncio.sleep(0.01)
        self.world.running = True

    async def on_stop(self) -> None:
        self.world.running = False
        await refused(self.world, "on_stop", self.stop())  # type: ignore[arg-type]


class KeyedStreamer(Streamer):
    def batch_key(self, item: int) -> int:
        return item % 2


STREAM_LIVE = {
    "max_batch_size": [1, 3, None],
    "concurrency": [1, 2, None],
    "max_queue_size": [None, 2, 5],
    "stream_buffer": [1, 2, 16],
    "stream_stall_timeout": [0.0, 0.05, None],
    "max_queue_time": [0.0, 0.01, 0.1],
}
STREAM_KINDS = {"plain": Streamer, "hooked": HookedStreamer, "keyed": KeyedStreamer}
stream_op = st.one_of(
    st.tuples(
        st.just("stream"),
        st.sampled_from(["all", "all", "aclose", "break", "kept", "raise", "slow", "cancel"]),
        st.integers(0, 3),  # parts read before leaving (or before the cancellation, in tenths of a second)
        st.sampled_from([None, None, None, 0.05, 0.5]),  # timeout
    ),
    st.tuples(st.just("stop"), st.sampled_from(["drain", "force", "timeout"]), st.just(0), st.just(None)),
    st.tuples(st.just("start"), st.just(None), st.just(0), st.just(None)),
    st.tuples(
        st.just("set"),
        st.sampled_from(
            [
                "max_batch_size",
                "concurrency",
                "max_queue_size",
                "stream_buffer",
                "stream_stall_timeout",
                "max_queue_time",
            ]
        ),
        st.integers(0, 2),
        st.just(None),
    ),
)
stream_schedule = st.lists(st.tuples(st.sampled_from([0.0, 0.0, 0.01, 0.1]), stream_op), min_size=1, max_size=20)
stream_behaviours = st.lists(
    st.tuples(st.sampled_from(STREAM_BEHAVIOURS), st.sampled_from([0.0, 0.0, 0.01, 0.1])), min_size=1
)
stream_config = st.fixed_dictionaries(
    {
        "kind": st.sampled_from(["plain", "plain", "hooked", "keyed"]),
        "continuous": st.booleans(),
        "max_batch_size": st.sampled_from([1, 2, 4, None]),
        "max_queue_time": st.sampled_from([0.0, 0.01, 0.1]),
        "concurrency": st.sampled_from([1, 2, None]),
        "max_queue_size": st.sampled_from([None, 2, 5]),
        "wait_when_full": st.booleans(),
        "stream_buffer": st.sampled_from([1, 2, 16]),
        "stream_stall_timeout": st.sampled_from([0.0, 0.05, 0.5, None]),
    }
)


@dataclass
class Consumer:
    item: int
    how: str
    timeout: float | None
    got: list[int] = field(default_factory=list)
    task: asyncio.Future[Any] | None = None


async def consume(b: Streamer, world: StreamWorld, c: Consumer, n: int) -> None:
    """Read ``c.item``'s stream as ``c.how`` says; ``c.got`` keeps what was read."""
    world.buffer[c.item] = b.stream_buffer  # (its stream's, read as it is submitted: no await in between)

    def took(p: int) -> None:
        c.got.append(p)
        world.taken[c.item] = world.taken.get(c.item, 0) + 1

    try:
        if c.how in ("all", "slow", "cancel"):
            async for p in b.stream(c.item, timeout=c.timeout):
                took(p)
                if c.how == "slow":
                    await asyncio.sleep(0.03)
        elif c.how == "aclose":
            async with contextlib.aclosing(b.stream(c.item, timeout=c.timeout)) as parts:
                async for p in parts:
                    took(p)
                    if len(c.got) >= n:
                        break
        elif c.how == "kept":
            kept = b.stream(c.item, timeout=c.timeout)
            world.kept.append((kept, c))
            async for p in kept:
                took(p)
                if len(c.got) >= n:
                    break
        else:  # break or raise, out of a stream nobody else holds
            async for p in b.stream(c.item, timeout=c.timeout):
                took(p)
                if len(c.got) >= n:
                    if c.how == "raise":
                        raise Left
                    break
    except Left:
        pass


async def stream_drive(cfg: dict[str, Any], ops: list[Any], kinds: list[tuple[str, float]], scale: float = 1.0) -> None:
    world = StreamWorld()
    cfg = dict(cfg)
    base = STREAM_KINDS[cfg.pop("kind")]
    cls = type(base.__name__, (base,), {"continuous_batching": cfg.pop("continuous")})
    for name in ("max_batch_size", "concurrency"):
        world.limits[name] = [cfg[name]]
    b = cls(world, kinds, **cfg)
    b.start()
    ids = itertools.count(1)
    consumers: list[Consumer] = []
    background: list[asyncio.Future[Any]] = []

    async def cancel_later(task: asyncio.Future[Any], after: float) -> None:
        await asyncio.sleep(after)
        task.cancel()

    for pause, (kind, a, n, timeout) in ops:
        if pause:
            await asyncio.sleep(pause * scale)
        if kind == "stream":
            c = Consumer(next(ids), a, timeout)
            c.task = asyncio.ensure_future(consume(b, world, c, n))
            consumers.append(c)
            if a == "cancel":
                background.append(asyncio.ensure_future(cancel_later(c.task, n / 10 * scale)))
        elif kind == "stop":
            stop = {"drain": b.stop(), "force": b.stop(force=True), "timeout": b.stop(timeout=0.05 * scale)}[a]
            background.append(asyncio.ensure_future(stop))
        elif kind == "start":
            try:
                b.start()
            except BatcherStoppedError:
                pass  # a stop is in progress: refused, as documented
        else:
            value = STREAM_LIVE[a][n]
            setattr(b, a, value)
            world.limits.setdefault(a, []).append(value)
        world.problems += violations(b)
    # The consumers, and the stops (a drain waits for the streams), each end within SETTLE.
    await settle_streams(b, world, [c.task for c in consumers if c.task is not None] + background, SETTLE * scale)
    await asyncio.gather(*background, return_exceptions=True)
    world.problems += violations(b)
    await b.stop(timeout=1.0 * scale)
    for kept, _ in world.kept:
        await kept.aclose()
    check_streams(b, world, consumers)


async def settle_streams(b: Streamer, world: StreamWorld, tasks: list[asyncio.Future[Any]], within: float) -> None:
    """:func:`settle` for the consumers. With no stall timeout a stream kept and no longer read holds its batch (and
    those behind it) until it leaves, as documented: each leaves (is closed) once its reader has stopped reading."""
    loop = asyncio.get_running_loop()
    end = loop.time() + within
    while (pending := [task for task in tasks if not task.done()]) and loop.time() < end:
        if b.stream_stall_timeout is None:
            for kept, reader in world.kept:
                if reader.task is not None and reader.task.done():
                    await kept.aclose()
        await asyncio.wait(pending, timeout=within / 100)
    await settle(world, tasks, 0)


def check_streams(b: Streamer, world: StreamWorld, consumers: list[Consumer]) -> None:
    assert not world.problems, world.problems
    s = b.stats
    assert s.queued == 0 and s.in_flight == 0
    assert s.submitted == s.succeeded + s.failed + s.cancelled + s.timed_out, s
    for c in consumers:
        assert c.task is not None and c.task.done(), "a consumer was left waiting"
        expected = [part(c.item, k) for k in range(length(c.item))]
        assert c.got == expected[: len(c.got)], f"item {c.item} got {c.got}, not a prefix of {expected}"
        if c.task.cancelled():
            continue
        error = c.task.exception()
        if error is None:
            if c.how in ("all", "slow"):
                assert c.got == expected, f"item {c.item}: a complete stream of {c.got}, expected {expected}"
                assert c.item in world.seen, f"item {c.item}: a complete stream without a batch"
            continue
        assert isinstance(error, (*STREAM_FAILING, TimeoutError)), repr(error)
        if isinstance(error, TimeoutError):  # its own timeout=, or dropped for not reading while its batch waited
            assert c.timeout is not None or c.how == "slow", f"item {c.item}, read at once, timed out: {error!r}"
        if isinstance(error, Injected | BatchSizeMismatchError):
            assert c.item in world.seen


def run_streams(kind: str, cfg: dict[str, Any], ops: list[Any], kinds: list[tuple[str, float]]) -> None:
    errors: list[dict[str, Any]] = []
    scale = 1.0 if kind == "virtual" else 1 / 20
    with asyncio.Runner(loop_factory=LOOP_FACTORIES[kind]) as runner:
        runner.get_loop().set_exception_handler(lambda _loop, context: errors.append(context))
        runner.run(bounded(stream_drive(cfg, ops, kinds, scale=scale), scale))
    # A generator that ignores GeneratorExit is left suspended: Python closes it again as it is collected, and the
    # loop reports that. Nothing else may reach the loop's handler.
    unexpected = [e for e in errors if "asynchronous generator" not in str(e.get("message"))]
    assert not unexpected, unexpected


# (A generator that ignores GeneratorExit is reported by Python as it is collected: not a failure here.)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@settings(max_examples=max(EXAMPLES // 2, 10), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=stream_config, ops=stream_schedule, kinds=stream_behaviours)
def test_every_stream_ends_exactly_once_with_its_own_parts_on_virtual_time(
    cfg: dict[str, Any], ops: list[Any], kinds: list[tuple[str, float]]
) -> None:
    run_streams("virtual", cfg, ops, kinds)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@settings(max_examples=max(EXAMPLES // 40, 5), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=stream_config, ops=stream_schedule, kinds=stream_behaviours)
def test_every_stream_ends_exactly_once_with_its_own_parts_on_uvloop(
    cfg: dict[str, Any], ops: list[Any], kinds: list[tuple[str, float]]
) -> None:
    run_streams("uvloop", cfg, ops, [(k, d / 20) for k, d in kinds])
