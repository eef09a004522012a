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
import itertools
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from async_batcher import (
    AsyncBatcher,
    AsyncBatchException,
    BatcherStoppedError,
    BatchSizeMismatchError,
    ProcessBatchCancelledError,
    QueueFullException,
)
from async_batcher._run import violations
from tests.loops import LOOP_FACTORIES

EXAMPLES = int(os.environ.get("PROPERTY_EXAMPLES", "1000"))


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
            if -1 not in concurrency and world.in_flight > max(concurrency):
                world.problems.append(f"{world.in_flight} batches in flight, concurrency {concurrency}")
            sizes = world.limits["max_batch_size"]
            if -1 not in sizes and len(batch) > max(sizes):
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
    """With ``on_start`` and ``on_stop``, which take a while (the first batch waits for on_start)."""

    hooks = True

    async def on_start(self) -> None:
        await asyncio.sleep(0.01)
        self.world.running = True

    async def on_stop(self) -> None:
        self.world.running = False
        await asyncio.sleep(0.01)


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
        "max_batch_size": st.sampled_from([1, 2, 3, 5, -1]),
        "max_queue_time": st.sampled_from([0.0, 0.01, 0.1]),
        "concurrency": st.sampled_from([1, 2, -1]),
        "max_queue_size": st.sampled_from([-1, 3, 10]),
        "wait_when_full": st.booleans(),
        "keys": st.sampled_from([1, 2, 3]),
        "max_batch_weight": st.sampled_from([None, None, 4, 6]),
        "max_priority_wait": st.sampled_from([0.0, 0.05, 1.0]),
        "max_latency": st.sampled_from([None, None, None, 0.05]),
        "preferred_batch_sizes": st.sampled_from([(), (), (), (1, 3), (2,)]),
        "default_timeout": st.sampled_from([None, None, None, 0.05, 0.3]),
        "max_hold_time": st.sampled_from([0.0, 0.0, 0.01, 0.1]),
    }
).filter(lambda c: c["max_batch_size"] == -1 or max(c["preferred_batch_sizes"], default=0) <= c["max_batch_size"])
# The values a live change draws from, by index.
LIVE = {
    "max_batch_size": [3, 4, -1],
    "max_queue_time": [0.0, 0.01, 0.1],
    "concurrency": [1, 2, -1],
    "max_queue_size": [-1, 3, 10],
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
    found = violations(b._run)
    s = b.stats
    if s.submitted < s.succeeded + s.failed + s.cancelled + s.timed_out:
        found.append(f"more outcomes than items: {s}")
    if s.queued < 0 or s.in_flight < 0:
        found.append(f"negative counts: {s}")
    world.problems += found


async def drive(cfg: dict[str, Any], ops: list[Any], kinds: list[tuple[str, float]], exact_time: bool) -> None:
    world = World()
    cfg = dict(cfg)
    variant, keyed = cfg.pop("kind"), cfg.pop("keyed")
    cls = KINDS[variant, keyed]
    keys = cfg.pop("keys")
    world.keys = keys if keyed else 1
    # Batches whose function runs in the loop's default executor (several threads) may reach it in another order
    # than they were formed in; and an item woken for room in a full queue arrives when it queues, not when called.
    world.ordered = variant != "awaitable" and not (cfg["wait_when_full"] and cfg["max_queue_size"] != -1)
    executor = concurrent.futures.ThreadPoolExecutor(max_workers=1) if cls.__name__.endswith("InThread") else None
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
            setattr(b, a, value)
            world.limits.setdefault(a, []).append(value)
            if a == "max_queue_size" and value != -1 and cfg["wait_when_full"]:
                world.ordered = False
            continue
        calls.append(call)
        check_step(b, world)
    await asyncio.gather(*background, return_exceptions=True)
    await wait_for_threads(threads)
    await asyncio.sleep(0)  # every caller task has started (a stop before the first use is a no-op)
    check_step(b, world)
    await b.stop(timeout=1.0)
    await wait_for_threads(threads)
    if executor is not None:
        await loop.run_in_executor(None, executor.shutdown)
    # A batch whose function runs in a thread (or returns an awaitable from one) is recorded when that thread gets
    # to it, after the batch was sent: the order of sending and leaving is checked by the loop-side kinds.
    check(b, world, calls, exact_time=exact_time, in_thread=variant in ("thread", "awaitable"))


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
