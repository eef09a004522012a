"""The closed loop's paired rounds of one or more runs, pooled: ``python -m benchmarks.peers.paired CSV [CSV ...]``.

Each CSV is a head-to-head's closed-loop steps (``reports/peers.csv``, ``reports/ceiling.csv``, or the
``--out-dir`` of an A/B run). Within each run, every round pairs the variants at each connection count; across
runs the rounds add up, pairing only within a run. It prints, for each variant of this package against every other
variant of the same runs and each connection count: this package's requests/s over the other's (median and range
of the rounds), in how many rounds it was the higher, the sign test's two-sided probability of a split at least
that uneven between two alike variants, and in how many rounds it reached issue 24's factor against a peer.
Pool only runs whose package code is the same (``git diff REV1 REV2 -- async_batcher`` empty): the tool cannot
tell.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks.openloop.paired import read_runs
from benchmarks.peers.report import PAIRED_HEAD, paired_rows, read_csv

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.peers.paired", description=__doc__.splitlines()[0])
    p.add_argument("csv", nargs="+", type=Path, help="a head-to-head's closed-loop steps (its CSV)")
    args = p.parse_args(argv)
    runs = read_runs(p, args.csv, read_csv, "a head-to-head's closed-loop steps")
    try:
        rows = paired_rows(runs)
    except ValueError as exc:  # two runs' steps in one CSV
        p.error(str(exc))
    print("| " + " | ".join(PAIRED_HEAD) + " |")
    print("|" + "---|" * len(PAIRED_HEAD))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
