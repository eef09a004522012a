"""The paired rounds of one or more runs, pooled: ``python -m benchmarks.openloop.paired CSV [CSV ...]``.

Each CSV is an open-loop report's steps (``reports/open-loop.csv``, ``peers-open.csv``, or the ``--out-dir`` of
an A/B run). Within each run, every round pairs the variants at each rate; across runs the counts add up, pairing
only within a run. It prints, for each variant of this package against every other variant the runs share, and
each arrival shape: in how many pairs it had the lower p99 (10 to 90 % of the saturation), and the sign test's
two-sided probability of a split at least that uneven between two alike variants.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from benchmarks.openloop.report import is_ours, p_text, paired_counts, read_csv, sign_test
from benchmarks.openloop.steps import OpenStep

__all__ = ["main", "pooled", "read_runs"]

_Run = TypeVar("_Run")


def pooled(runs: Sequence[Sequence[OpenStep]]) -> list[tuple[str, str, str, int, int]]:
    """(variant, against, shape, lower, pairs) over ``runs`` (each a list of steps), every variant of ours against
    every other variant, pairs counted within each run and added up."""
    totals: dict[tuple[str, str, str], list[int]] = {}
    for steps in runs:
        names = sorted({s.variant for s in steps})
        shapes = sorted({s.shape for s in steps if s.scenario == "sweep"})
        for a in (n for n in names if is_ours(n)):
            for b in (n for n in names if n != a):
                for shape in shapes:
                    lower, pairs = paired_counts(steps, a, b, shape)
                    if pairs:
                        total = totals.setdefault((a, b, shape), [0, 0])
                        total[0] += lower
                        total[1] += pairs
    return [(a, b, shape, lower, pairs) for (a, b, shape), (lower, pairs) in sorted(totals.items())]


def read_runs(p: argparse.ArgumentParser, paths: Sequence[Path], read: Callable[[Path], _Run], what: str) -> list[_Run]:
    """Each of ``paths`` read by ``read``; a file that is missing or not ``what`` (another report's CSV has other
    columns) ends the command with an error naming it, not a traceback."""
    runs = []
    for path in paths:
        try:
            runs.append(read(path))
        except (OSError, KeyError, TypeError, ValueError) as exc:
            p.error(f"{path}: not {what} ({type(exc).__name__}: {exc})")
    return runs


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.openloop.paired", description=__doc__.splitlines()[0])
    p.add_argument("csv", nargs="+", type=Path, help="an open-loop run's steps (its CSV)")
    args = p.parse_args(argv)
    runs = read_runs(p, args.csv, read_csv, "an open-loop report's steps")
    print("| variant | against | arrivals | lower p99 in | p (sign test) |")
    print("|---|---|---|---|---|")
    for a, b, shape, lower, pairs in pooled(runs):
        print(f"| {a} | {b} | {shape} | {lower} of {pairs} | {p_text(sign_test(lower, pairs))} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
