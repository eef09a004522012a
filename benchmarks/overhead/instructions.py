"""``python -m benchmarks.overhead.instructions``: instructions per item under valgrind: noise moves it little.

On a shared machine the wall clock of a 40 ms run swings by tens of percent; the number of instructions the CPU
executes for it does not. Each implementation runs in its own interpreter under ``valgrind --tool=callgrind``,
once with 2 warm-up runs and once with 2 + ``--runs``; the difference, divided by the items, is what one item
costs. The wait is 0 (``call_soon`` everywhere), so that nothing depends on time: valgrind runs the code some 50
times slower, and a 1 ms timer would then change what a run does (async-batcher 0.2.2's cost is in its timers:
at a wait of 0 it takes another path). What the count leaves out: cache misses, branch
mispredictions, the time spent waiting on a timer; it is a cross-check of pyperf's ratios, not a substitute.
Even at a wait of 0 ours reads the loop's clock (arrivals, the dispatch policy's turns): on a quiet machine its
steady count repeats within about 1 %, on a busy one it moves by up to 7 % (a count of 24 600 read 26 400 beside
the test suite), so count on a quiet machine, and more than once. About a minute per (implementation, shape).

The executor shape (one caller at a time, each item a batch of one that a plain ``def`` handles in a
``ThreadPoolExecutor(1)``) counts per call, over ``--calls`` calls a run: the loop's thread and the executor's
together, so the hand-over both ways is in the count.

``--write reports/overhead.md`` puts the table and the targets into that report, as its section of instruction
counts (``make bench-overhead-instructions``); the pyperf run that writes the rest of the report keeps the section.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks.overhead import report
from benchmarks.overhead.peers import interpreters
from benchmarks.overhead.runner import WORKER
from benchmarks.overhead.worker import EXECUTOR_IMPLS, IMPLS, VARIANTS
from benchmarks.provenance import cpu_model, regenerated_by, revision

__all__ = ["count", "main", "per_item", "section", "targets"]

ROOT = Path(__file__).resolve().parents[2]
COUNTED_SHAPES = ("steady", "burst", "executor")


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


# The targets on this counter: (shape, what, bound on the floor's count over ours). Steady and burst as speed
# ratios (ours at least that fraction of the floor's speed); the executor shape as a cost: at most 1.15x the floor's
# instructions per call, that is the floor's count at least 1/1.15 of ours.
TARGETS = (
    ("steady", "steady: at least 0.85x the floor", 0.85),
    ("burst", "burst: at least 0.92x the floor", 0.92),
    (
        "executor",
        f"executor: at most {report.EXECUTOR_BOUND:g}x the floor's instructions per call",
        1 / report.EXECUTOR_BOUND,
    ),
)


def _n(v: float) -> str:
    return f"{v:,.0f}".replace(",", " ")


def targets(counts: dict[tuple[str, str], float]) -> list[tuple[str, str, str]]:
    """Each target measured in ``counts`` ((implementation, shape) -> instructions): (what, measured, verdict)."""
    out = []
    for shape, what, bound in TARGETS:
        ours, floor = counts.get(("ours", shape)), counts.get(("floor", shape))
        if ours is None or floor is None:
            continue
        if shape == "executor":
            measured = f"{ours / floor:.2f}x the floor's count"
        else:
            measured = f"{floor / ours:.2f}x the floor"
        # (A ratio at the bound passes: "at least", up to the float division's last bit.)
        out.append((what, measured, "PASS" if floor / ours >= bound - 1e-12 else "FAIL"))
    return out


def section(
    counts: dict[tuple[str, str], float],
    impls: list[str],
    shapes: list[str],
    sizes: dict[str, int],
    runs: int,
    header: list[str],
) -> str:
    """The report's section of instruction counts: how they were counted, the table, the targets (with markers)."""
    lines = [report.INSTRUCTIONS_BEGIN, "## Instruction counts (valgrind)", "", *header, ""]
    lines += [
        "Instructions per item under `valgrind --tool=callgrind` (both threads of the executor shape counted), a wait "
        "of 0: a count the machine's load moves little (ours reads the loop's clock: count on a quiet machine), "
        "though it leaves out cache misses and time spent waiting. "
        + ", ".join(f"{s}: {_n(sizes[s])} {'calls' if s == 'executor' else 'items'} a run" for s in shapes)
        + f"; the difference between a process with 2 warm-up runs and one with {runs} more, over the items. "
        "÷ floor: the floor's count over the implementation's (above 1: fewer instructions than the floor).",
        "",
    ]
    head = ["implementation"] + [f"{s}{' (per call)' if s == 'executor' else ''} | ÷ floor" for s in shapes]
    lines += ["| " + " | ".join(head) + " |", "|---|" + "---:|---:|" * len(shapes)]
    for impl in impls:
        cells = []
        for s in shapes:
            mine, floor = counts.get((impl, s)), counts.get(("floor", s))
            cells += [_n(mine) if mine else "n/a", f"{floor / mine:.2f}" if mine and floor else "n/a"]
        lines.append(f"| {impl} | " + " | ".join(cells) + " |")
    met = targets(counts)
    if met:
        lines += ["", "| target (this counter) | ours | verdict |", "|---|---|---|"]
        lines += [f"| {what} | {measured} | {verdict} |" for what, measured, verdict in met]
    lines.append(report.INSTRUCTIONS_END)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.overhead.instructions", description=__doc__.splitlines()[0])
    p.add_argument("--impls", default="direct,floor,ours,aiodataloader", help="comma-separated")
    p.add_argument("--shapes", default="steady,burst,executor", help="comma-separated: steady, burst, executor")
    p.add_argument("--event-loop", default="asyncio", choices=("asyncio", "uvloop"))
    p.add_argument("--items", type=int, default=20_000, help="steady and burst: items per run")
    p.add_argument("--calls", type=int, default=2000, help="executor: calls per run")
    p.add_argument("--runs", type=int, default=3, help="counted runs (after 2 warm-up runs)")
    p.add_argument(
        "--wait", type=float, default=0.0, help="seconds an item may wait (default 0: see above before changing it)"
    )
    p.add_argument("--peers-dir", type=Path, default=ROOT / ".cache" / "peers")
    p.add_argument("--write", type=Path, help="put the counts into this report (its section of instruction counts)")
    args = p.parse_args(argv)
    impls = [i for i in args.impls.split(",") if i]
    shapes = [s for s in args.shapes.split(",") if s]
    bad = [i for i in impls if i not in IMPLS + VARIANTS] + [s for s in shapes if s not in COUNTED_SHAPES]
    if bad or args.runs < 1 or args.items < 1 or args.calls < 1:
        p.error(f"unknown {bad}, or --runs, --items or --calls < 1")
    pythons, missing = interpreters(impls, args.peers_dir)
    for name, why in missing.items():
        print(f"not counted: {name}: {why}", file=sys.stderr)
    sizes = {"steady": args.items, "burst": args.items, "executor": args.calls}
    counts = {
        (impl, shape): per_item(pythons[impl], impl, shape, sizes[shape], args.runs, args.event_loop, args.wait)
        for shape in shapes
        for impl in impls
        if impl in pythons and (shape != "executor" or impl in EXECUTOR_IMPLS)
    }
    given = list(sys.argv[1:] if argv is None else argv)
    command = shlex.join(["python", "-m", "benchmarks.overhead.instructions", *given])
    # The make target passes --write itself; the rest goes through its variable.
    passed = [a for i, a in enumerate(given) if a != "--write" and (i == 0 or given[i - 1] != "--write")]
    passed = [a for a in passed if not a.startswith("--write=")]
    header = [
        regenerated_by(
            "bench-overhead-instructions",
            shlex.join(["python", "-m", "benchmarks.overhead.instructions", *passed]),
            "INSTRUCTIONS_ARGS",
        ),
        "",
        f"- Command: `{command}`",
        f"- Date: {datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- Machine: {cpu_model()}; Python {platform.python_version()}; {args.event_loop}; {_valgrind_version()}",
        f"- Revision of this repository: {revision()}",
    ]
    text = section(counts, [i for i in impls if i in pythons], shapes, sizes, args.runs, header)
    print(text.removeprefix(report.INSTRUCTIONS_BEGIN + "\n").removesuffix("\n" + report.INSTRUCTIONS_END))
    if args.write is not None:
        old = args.write.read_text(encoding="utf-8") if args.write.exists() else ""
        args.write.write_text(report.splice_instructions(old, text), encoding="utf-8")
        print(f"\nwrote its section of {args.write}", file=sys.stderr)
    return 0


def _valgrind_version() -> str:
    try:
        done = subprocess.run(["valgrind", "--version"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "valgrind (version unknown)"
    return done.stdout.strip()


if __name__ == "__main__":
    sys.exit(main())
