"""``python -m benchmarks.overhead.instructions``: instructions per item under valgrind, a count that noise cannot move.

On a shared machine the wall clock of a 40 ms run swings by tens of percent; the number of instructions the CPU
executes for it does not. Each implementation runs in its own interpreter under ``valgrind --tool=callgrind``,
once with 2 warm-up runs and once with 2 + ``--runs``; the difference, divided by the items, is what one item
costs. The wait is 0 (``call_soon`` everywhere), so that nothing depends on time: valgrind runs the code some 50
times slower, and a 1 ms timer would then change what a run does (async-batcher 0.2.2's cost is in its timers:
at a wait of 0 it takes another path). What the count leaves out: cache misses, branch
mispredictions, the time spent waiting on a timer; it is a cross-check of pyperf's ratios, not a substitute.
About a minute per (implementation, shape).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks.overhead.peers import interpreters
from benchmarks.overhead.runner import WORKER
from benchmarks.overhead.worker import IMPLS, VARIANTS

__all__ = ["count", "main", "per_item"]

ROOT = Path(__file__).resolve().parents[2]


def count(python: Path, impl: str, shape: str, items: int, runs: int, event_loop: str, wait: float) -> int:
    """Instructions executed by the whole worker process (start-up, warm-up and ``runs`` runs)."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise RuntimeError("valgrind is not installed (apt-get install -y valgrind)")
    cmd = [valgrind, "--tool=callgrind", "--callgrind-out-file=/dev/null", str(python), "-I", str(WORKER)]
    setarch = shutil.which("setarch")
    if setarch is not None:  # the same addresses every time (no ASLR): hashes of ids, and so counts, repeat
        cmd = [setarch, platform.machine(), "-R", *cmd]
    cmd += ["--impl", impl, "--shape", shape, "--event-loop", event_loop, "--items", str(items), "--wait", repr(wait)]
    cmd += ["--count-runs", str(runs)]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"{impl} {shape}: {done.stderr.strip().splitlines()[-1:] or 'no output'}")
    return int(found.group(1))


def per_item(python: Path, impl: str, shape: str, items: int, runs: int, event_loop: str, wait: float) -> float:
    counted = count(python, impl, shape, items, runs, event_loop, wait)
    return (counted - count(python, impl, shape, items, 0, event_loop, wait)) / (runs * items)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.overhead.instructions", description=__doc__.splitlines()[0])
    p.add_argument("--impls", default="direct,floor,ours,aiodataloader", help="comma-separated")
    p.add_argument("--shapes", default="steady,burst", help="comma-separated: steady, burst")
    p.add_argument("--event-loop", default="asyncio", choices=("asyncio", "uvloop"))
    p.add_argument("--items", type=int, default=20_000)
    p.add_argument("--runs", type=int, default=3, help="counted runs (after 2 warm-up runs)")
    p.add_argument(
        "--wait", type=float, default=0.0, help="seconds an item may wait (default 0: see above before changing it)"
    )
    p.add_argument("--peers-dir", type=Path, default=ROOT / ".cache" / "peers")
    args = p.parse_args(argv)
    impls = [i for i in args.impls.split(",") if i]
    shapes = [s for s in args.shapes.split(",") if s]
    bad = [i for i in impls if i not in IMPLS + VARIANTS] + [s for s in shapes if s not in ("steady", "burst")]
    if bad or args.runs < 1:
        p.error(f"unknown {bad}, or --runs < 1")
    pythons, missing = interpreters(impls, args.peers_dir)
    for name, why in missing.items():
        print(f"not counted: {name}: {why}", file=sys.stderr)
    counts = {
        (impl, shape): per_item(pythons[impl], impl, shape, args.items, args.runs, args.event_loop, args.wait)
        for shape in shapes
        for impl in impls
        if impl in pythons
    }
    print(f"Instructions per item ({args.event_loop}, {args.items} items, wait {args.wait:g} s; ours ÷ implementation:")
    print("ours is that many times as fast, by this count)\n")
    print("| implementation | " + " | ".join(f"{s} | ours ÷ it" for s in shapes) + " |")
    print("|---|" + "---:|---:|" * len(shapes))
    for impl in (i for i in impls if i in pythons):
        cells = []
        for s in shapes:
            mine, ours = counts[(impl, s)], counts.get(("ours", s))
            cells += [f"{mine:,.0f}".replace(",", " "), f"{mine / ours:.2f}" if ours else "n/a"]
        print(f"| {impl} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
