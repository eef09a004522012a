"""Profile one implementation on one shape under pyinstrument, in this process, to find hot spots.

Only the implementations that live in this interpreter (ours, the floors, the direct call) can be profiled;
the peers live in their own environments, without pyinstrument.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.overhead import worker
from benchmarks.overhead.peers import LOCAL_IMPLS
from benchmarks.overhead.runner import Plan, worker_args

__all__ = ["add_arguments", "profile"]


def profile(impl: str, shape: str, loop: str, plan: Plan, rounds: int, html: Path | None) -> str:
    """Run the shape ``rounds`` times on one loop under the profiler (after one run to warm up); the text profile."""
    if impl not in LOCAL_IMPLS:
        raise SystemExit(f"--profile: {impl!r} runs in its own environment; profile one of {LOCAL_IMPLS}")
    from pyinstrument import Profiler

    args = worker.parse(worker_args(impl, shape, loop, plan))
    bench = worker.Bench(args)
    bench.time(1)  # builds the loop and the batcher, and warms them up
    # async_mode="disabled": samples show the real stack (event loop -> callback -> batcher code), which is
    # where a batcher's overhead lives; attributing time to the awaiting coroutine would hide the loop.
    profiler = Profiler(interval=0.0001, async_mode="disabled")
    profiler.start()
    seconds = bench.time(rounds)
    profiler.stop()
    bench.close()
    if html is not None:
        html.parent.mkdir(parents=True, exist_ok=True)
        html.write_text(profiler.output_html(), encoding="utf-8")
    rate = rounds * args.items / seconds
    text: str = profiler.output_text(unicode=True, color=False)
    return f"{impl} {shape} {loop}, {rounds} runs under the profiler: {rate:,.0f} items/s\n\n{text}"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--profile",
        nargs=2,
        metavar=("IMPL", "SHAPE"),
        help=f"profile one shape instead of benchmarking: IMPL in {LOCAL_IMPLS}, SHAPE in {worker.SHAPES}",
    )
    p.add_argument("--profile-loop", default="asyncio", choices=("asyncio", "uvloop"))
    p.add_argument("--profile-rounds", type=int, default=5, help="runs of the shape under the profiler")
