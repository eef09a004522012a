"""The overhead benchmark's pyperf script: one implementation, one shape, one event loop.

``python -I worker.py --impl ours --shape steady --event-loop asyncio -o ours.json`` runs pyperf's ``Runner``:
it spawns worker processes of this same script with the same interpreter, calibrates the loops, discards a warm-up
value per process, and writes pyperf's JSON. ``--help`` lists pyperf's own options too (``-p``, ``-n``, ``-l``,
``--append``, ...). The harness (``python -m benchmarks.overhead``) runs it once per implementation and round.

This file is standard library plus pyperf and the implementation under test, with the floors loaded from the file
next to it (by path: nothing on ``sys.path`` may stand in for it). The harness runs it by path with ``python -I``
inside each peer's own virtual environment, where this repository's ``async_batcher`` must not be importable
(async-batcher 0.2.2 has the same import name).

The executor shape is the model server's at low load: one caller at a time, each item a batch of one handed to a
one-thread executor (``ThreadPoolExecutor(1)``, which each process builds once) and back, the batch function a plain
``def``. Only the direct call (``loop.run_in_executor`` per call), the floor (:class:`floors.ExecutorFloor`), ours and
async-batcher 0.2.2 (both a subclass with a plain ``def process_batch`` and ``executor=``) have that path.

Each process builds one event loop and one implementation and keeps them for all its values. A value times
``loops`` runs of the shape; after each run, outside the timing, the worker checks that every caller got ``2 * x``
for its own ``x`` (a batcher that mixes results up fails the run instead of giving a fast number) and, with
``--record FILE``, appends a line of JSON per value: how many items and batches the batch function saw.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import concurrent.futures
import importlib.util
import json
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

import pyperf  # type: ignore[import-untyped,unused-ignore]


def _load_by_path(name: str) -> ModuleType:
    """A module of this folder, loaded from its file under a name that nothing else on sys.path can shadow."""
    spec = importlib.util.spec_from_file_location(f"_overhead_{name}", Path(__file__).with_name(f"{name}.py"))
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {name}.py next to {__file__}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


try:
    from benchmarks.overhead import floors
except ImportError:  # run by path, with -I, in a peer's environment
    floors = _load_by_path("floors")  # type: ignore[assignment,unused-ignore]

__all__ = [
    "IMPLS",
    "SHAPES",
    "VARIANTS",
    "Bench",
    "Counter",
    "Impl",
    "check",
    "main",
    "make_executor_impl",
    "make_impl",
    "parse",
    "run_shape",
]

# The implementations the report compares; the variants after them are for the study of the floor.
IMPLS = ("direct", "floor", "ours", "async-batcher-0.2.2", "batched", "aiodataloader")
VARIANTS = ("floor-async", "floor-task")
SHAPES = ("steady", "burst", "bulk", "latency", "executor")
# The implementations with a plain-function path through an executor (the executor shape).
EXECUTOR_IMPLS = ("direct", "floor", "ours", "async-batcher-0.2.2")
# The distribution each implementation must import, at this version: a wrong interpreter or a stray sys.path
# entry would otherwise benchmark the wrong async_batcher without a word.
DISTRIBUTIONS = {
    "ours": ("async-batcher", None),
    "async-batcher-0.2.2": ("async-batcher", "0.2.2"),
    "batched": ("batched", "0.1.5"),
    "aiodataloader": ("aiodataloader", "0.4.3"),
}


class Counter:
    """How many times the batch function ran, and on how many items in all."""

    def __init__(self) -> None:
        self.batches = 0
        self.items = 0


def make_batch_fn(counter: Counter) -> floors.BatchFn:
    # Next to no work on purpose: what is left to measure is the batcher's own cost.
    async def batch_fn(batch: list[int]) -> list[int]:
        counter.batches += 1
        counter.items += len(batch)
        return [x * 2 for x in batch]

    return batch_fn


def make_sync_batch_fn(counter: Counter) -> floors.SyncBatchFn:
    # The executor shape's: a plain function, run in the executor's one thread.
    def batch_fn(batch: list[int]) -> list[int]:
        counter.batches += 1
        counter.items += len(batch)
        return [x * 2 for x in batch]

    return batch_fn


class Impl:
    """What the shapes call: ``call(x)`` (awaitable), ``many(xs)`` (None without a bulk path), ``close()``."""

    def __init__(
        self,
        call: Callable[[int], Awaitable[int]],
        many: Callable[[list[int]], Awaitable[list[int]]] | None,
        close: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.call = call
        self.many = many
        self._close = close

    async def close(self) -> None:
        if self._close is not None:
            await self._close()


def _direct(fn: floors.BatchFn, max_batch_size: int) -> Impl:
    async def call(x: int) -> int:
        return (await fn([x]))[0]

    async def many(xs: list[int]) -> list[int]:
        out: list[int] = []
        for i in range(0, len(xs), max_batch_size):
            out += await fn(xs[i : i + max_batch_size])
        return out

    return Impl(call, many)


def _subclass(fn: floors.BatchFn) -> type[Any]:
    # Ours and async-batcher 0.2.2 share the import name and the README's way: subclass, implement process_batch.
    from async_batcher.batcher import AsyncBatcher

    class Doubler(AsyncBatcher[int, int]):
        async def process_batch(self, batch: list[int]) -> list[int]:
            return await fn(batch)

    return Doubler


def _sync_subclass(fn: floors.SyncBatchFn) -> type[Any]:
    from async_batcher.batcher import AsyncBatcher

    class SyncDoubler(AsyncBatcher[int, int]):
        def process_batch(self, batch: list[int]) -> list[int]:  # type: ignore[override]  # a plain def: the executor
            return fn(batch)

    return SyncDoubler


async def make_executor_impl(
    name: str, fn: floors.SyncBatchFn, executor: concurrent.futures.Executor, max_batch_size: int, wait: float
) -> Impl:
    """Implementation ``name`` for the executor shape: ``fn`` (a plain function) runs in ``executor``."""
    if name == "direct":
        loop = asyncio.get_running_loop()

        async def call(x: int) -> int:
            return (await loop.run_in_executor(executor, fn, [x]))[0]

        return Impl(call, None)
    if name == "floor":
        floor = floors.ExecutorFloor(fn, executor, max_batch_size, wait)
        return Impl(floor.process, None)
    if name in ("ours", "async-batcher-0.2.2"):
        batcher = _sync_subclass(fn)(max_batch_size=max_batch_size, max_queue_time=wait, executor=executor)
        if name == "ours":
            batcher.start()
            return Impl(batcher.process, None, batcher.stop)

        async def stop_old() -> None:
            await batcher.stop(force=True)

        return Impl(batcher.process, None, stop_old)
    raise ValueError(f"{name!r} has no executor path; the executor shape runs {', '.join(EXECUTOR_IMPLS)}")


async def make_impl(name: str, fn: floors.BatchFn, max_batch_size: int, wait: float) -> Impl:
    """Implementation ``name`` on the running loop, wired as its README shows: ``wait`` is the most seconds an item
    waits for its batch to fill."""
    if name == "direct":
        return _direct(fn, max_batch_size)
    if name in ("floor", "floor-async"):
        kind = floors.Floor if name == "floor" else floors.AsyncFloor
        floor = kind(fn, max_batch_size, wait)
        return Impl(floor.process, floor.process_many)
    if name == "floor-task":
        task_floor = floors.TaskFloor(fn, max_batch_size)
        return Impl(task_floor.process, task_floor.process_many)
    if name == "ours":
        ours = _subclass(fn)(max_batch_size=max_batch_size, max_queue_time=wait)
        ours.start()
        return Impl(ours.process, ours.process_many, ours.stop)
    if name == "async-batcher-0.2.2":
        # It starts on its first process() and has no bulk path; its stop() without force polls for up to 1 s.
        old = _subclass(fn)(max_batch_size=max_batch_size, max_queue_time=wait)

        async def stop_old() -> None:
            await old.stop(force=True)

        return Impl(old.process, None, stop_old)
    if name == "batched":
        from batched import aio  # type: ignore[import-not-found,unused-ignore]  # only in its own environment

        processor = aio.dynamically(batch_size=max_batch_size, timeout_ms=wait * 1000.0)(fn)
        return Impl(processor, processor)
    if name == "aiodataloader":
        from aiodataloader import DataLoader  # type: ignore[import-not-found,unused-ignore]  # its environment

        class Loader(DataLoader):  # type: ignore[misc,unused-ignore]
            async def batch_load_fn(self, keys: list[int]) -> list[int]:
                return await fn(keys)

        # It batches what arrives within one loop iteration (no timer). cache=False (documented): a batcher does
        # not memoise, and the benchmark sends the same keys again in every run.
        loader = Loader(max_batch_size=max_batch_size, cache=False)
        return Impl(loader.load, loader.load_many)
    raise ValueError(f"unknown implementation {name!r}; expected one of {', '.join(IMPLS + VARIANTS)}")


def check(got: Sequence[int], items: Sequence[int]) -> None:
    """Every caller got ``2 * x`` for its own ``x``."""
    if len(got) != len(items):
        raise AssertionError(f"{len(got)} results for {len(items)} items")
    for x, r in zip(items, got, strict=True):
        if r != 2 * x:
            raise AssertionError(f"item {x} got result {r!r}, expected {2 * x}")


async def _steady(call: Callable[[int], Awaitable[int]], items: int, callers: int) -> list[int]:
    per = items // callers

    async def caller(first: int) -> list[int]:
        return [await call(x) for x in range(first, first + per)]

    runs = await asyncio.gather(*[caller(c * per) for c in range(callers)])
    return [r for run in runs for r in run]


async def _burst(call: Callable[[int], Awaitable[int]], items: int) -> list[int]:
    async def caller(x: int) -> int:
        return await call(x)

    return list(await asyncio.gather(*[caller(x) for x in range(items)]))


async def run_shape(impl: Impl, shape: str, items: int, callers: int) -> tuple[float, list[int]]:
    """One run of ``shape``: the seconds it took and the results, in the order of the items ``range(items)``."""
    perf = time.perf_counter
    if shape == "steady":
        t0 = perf()
        got = await _steady(impl.call, items, callers)
    elif shape == "burst":
        t0 = perf()
        got = await _burst(impl.call, items)
    elif shape == "bulk":
        if impl.many is None:
            raise ValueError("this implementation has no bulk path")
        xs = list(range(items))
        t0 = perf()
        got = await impl.many(xs)
    elif shape in ("latency", "executor"):  # one caller, one item at a time
        call = impl.call
        got = []
        t0 = perf()
        for x in range(items):
            got.append(await call(x))
    else:
        raise ValueError(f"unknown shape {shape!r}; expected one of {', '.join(SHAPES)}")
    return perf() - t0, got


class Bench:
    """The event loop and the implementation of this process, built at the first value and kept."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.counter = Counter()
        self.runner: asyncio.Runner | None = None
        self.impl: Impl | None = None
        self.executor: concurrent.futures.ThreadPoolExecutor | None = None

    def time(self, loops: int) -> float:
        """pyperf's time function: ``loops`` runs of the shape, timed; each checked after its timing."""
        args = self.args
        if self.runner is None:
            self.runner = _runner(args.event_loop)
            if args.shape == "executor":
                self.executor = concurrent.futures.ThreadPoolExecutor(1)
                sync_fn = make_sync_batch_fn(self.counter)
                built = make_executor_impl(args.impl, sync_fn, self.executor, args.batch_size, args.wait)
            else:
                built = make_impl(args.impl, make_batch_fn(self.counter), args.batch_size, args.wait)
            self.impl = self.runner.run(built)
            atexit.register(self.close)
        self.counter.batches = self.counter.items = 0
        total = 0.0
        for _ in range(loops):
            seconds, got = self.runner.run(run_shape(self.impl, args.shape, args.items, args.callers))  # type: ignore[arg-type]
            check(got, range(args.items))
            total += seconds
        if args.record:
            line = {"impl": args.impl, "shape": args.shape, "event_loop": args.event_loop, "loops": loops}
            line |= {"items": self.counter.items, "batches": self.counter.batches, "checked": loops * args.items}
            with open(args.record, "a", encoding="utf-8") as f:
                f.write(json.dumps(line) + "\n")
        return total

    def close(self) -> None:
        if self.runner is not None:
            if self.impl is not None:
                self.runner.run(self.impl.close())
            self.runner.close()
            self.runner = None
        if self.executor is not None:
            self.executor.shutdown()
            self.executor = None


def _runner(event_loop: str) -> asyncio.Runner:
    if event_loop == "uvloop":
        import uvloop

        return asyncio.Runner(loop_factory=uvloop.new_event_loop)
    return asyncio.Runner()


def versions(impl: str, event_loop: str) -> dict[str, str]:
    """What ran, for pyperf's metadata; refuses a wrong ``async_batcher`` for ``ours`` and for 0.2.2."""
    found = {"impl": impl, "event_loop": event_loop}
    if impl in DISTRIBUTIONS:
        dist, expected = DISTRIBUTIONS[impl]
        version = metadata.version(dist)
        if expected is not None and version != expected:
            raise RuntimeError(f"{impl}: found {dist} {version}, expected {expected} (wrong interpreter?)")
        if impl == "ours" and version == "0.2.2":
            raise RuntimeError("ours: found async-batcher 0.2.2 from PyPI instead of this repository")
        found["impl_version"] = version
    if event_loop == "uvloop":
        found["uvloop_version"] = metadata.version("uvloop")
    return found


def _own_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--impl", required=True, choices=IMPLS + VARIANTS)
    parser.add_argument("--shape", required=True, choices=SHAPES)
    parser.add_argument("--event-loop", default="asyncio", choices=("asyncio", "uvloop"))
    parser.add_argument("--items", type=int, default=20_000, help="items per run (latency, executor: per value)")
    parser.add_argument("--callers", type=int, default=1000, help="steady: callers, each awaiting items/callers")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--wait", type=float, default=0.001, help="seconds an item may wait for its batch")
    parser.add_argument("--record", help="append one line of JSON per value to this file")
    parser.add_argument(
        "--count-runs",
        type=int,
        help="no pyperf: build, warm up (2 runs), then this many runs, for an instruction counter (instructions.py)",
    )


def _forward(cmd: list[str], args: argparse.Namespace) -> None:
    """pyperf's hook: the worker processes get this script's own arguments."""
    cmd += ["--impl", args.impl, "--shape", args.shape, "--event-loop", args.event_loop]
    cmd += ["--items", str(args.items), "--callers", str(args.callers), "--batch-size", str(args.batch_size)]
    cmd += ["--wait", repr(args.wait)]
    if args.record:
        cmd += ["--record", args.record]


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """The worker's own arguments alone, without pyperf (the profiler drives :class:`Bench` directly)."""
    parser = argparse.ArgumentParser()
    _own_arguments(parser)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    # -I: the worker processes, like this one, see neither the script's folder nor PYTHONPATH nor user site.
    runner = pyperf.Runner(add_cmdline_args=_forward, program_args=("-I", __file__))
    parser = runner.argparser
    parser.description = __doc__.splitlines()[0]
    _own_arguments(parser)
    args = runner.parse_args(argv)
    for name in ("items", "callers", "batch_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.shape == "steady" and args.items % args.callers:
        parser.error(f"steady: --items {args.items} is not a multiple of --callers {args.callers}")
    if args.count_runs is not None:
        versions(args.impl, args.event_loop)  # the right package, or no count
        bench = Bench(args)
        bench.time(2)
        if args.count_runs > 0:
            bench.time(args.count_runs)
        bench.close()
        return
    runner.metadata.update(versions(args.impl, args.event_loop))
    runner.metadata.update(items=args.items, batch_size=args.batch_size, wait=args.wait)
    if args.shape == "steady":
        runner.metadata["callers"] = args.callers
    # Each value is the time of `loops` runs; pyperf divides by loops * inner_loops: seconds per item.
    runner.bench_time_func(f"{args.shape}-{args.event_loop}", Bench(args).time, inner_loops=args.items)


if __name__ == "__main__":
    main()
