"""The paired real runs of the decision: ``python -m benchmarks.policy.validate`` (``make bench-policy-validate``).

On this machine, once it is quiet (:mod:`.quiet`: it refuses a busy one, saying what it saw): the head-to-head with
:data:`~.pairs.RIG_ARGS` (the default and 0, 4 (the control), 16 and 32 turns; closed loops of 8 and 64 connections,
Poisson at 50 and 90 % of the default's open-loop capacity; the server pinned on CPU 1, the load on CPU 0),
``--rounds`` rounds (10: about 35 minutes), each a pair per cell. Its report goes to ``--out-dir``
(``reports/turns/turns.md``), its steps are kept as ``benchmarks/policy/measured/turns-closed.csv`` and
``turns-open.csv`` (which ``make bench-policy`` and ``python -m benchmarks.policy.validation`` read), and the pairs'
table is printed.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from . import pairs, quiet
from .runner import ROOT

__all__ = ["ROUNDS", "main"]

ROUNDS = 10


def _print_real(real: list[pairs.Paired]) -> None:
    print("| cell | turns | metric | pairs | higher / lower | median ratio | p |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for p in real:
        print(f"| {p.cell.name} | {p.turns} | {p.metric} | {len(p.ratios)} | {p.higher} / {p.lower} | "
              f"{p.median:.3f} | {p.p:.3f}{' *' if p.significant else ''} |")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.policy.validate", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS, help=f"pairs per cell (default {ROUNDS}; 6 at least)")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "reports" / "turns")
    parser.add_argument("--allow-busy", action="store_true", help="run even where the machine is busy")
    parser.add_argument("--no-keep", dest="keep", action="store_false", help="do not copy the steps to measured/")
    parser.add_argument(
        "--rig-args",
        nargs=argparse.REMAINDER,
        default=[],
        help="more options for the head-to-head, last (e.g. --seconds 1 --warmup 0 for a smoke run)",
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be 1 or more")
    if args.rounds < pairs.MIN_PAIRS:
        print(f"warning: {args.rounds} rounds give fewer than the {pairs.MIN_PAIRS} pairs per cell the validation "
              "needs", file=sys.stderr)  # fmt: skip
    from benchmarks.peers.__main__ import Defaults
    from benchmarks.peers.__main__ import main as rig

    seen = quiet.require_quiet("the paired real runs", allow_busy=args.allow_busy)
    defaults = Defaults(
        prog="python -m benchmarks.policy.validate",
        target="bench-policy-validate",
        variable="VALIDATE_ARGS",
        modes="closed,open",
        shapes="poisson",
        report="turns",
        title="The loop's turns against the default: interleaved pairs on the real server",
    )
    code = rig([*pairs.RIG_ARGS, "--rounds", str(args.rounds), "--out-dir", str(args.out_dir), *args.rig_args],
               defaults)  # fmt: skip
    if code:
        return code
    if args.keep:
        pairs.REAL_CLOSED.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(args.out_dir / "turns.csv", pairs.REAL_CLOSED)
        shutil.copyfile(args.out_dir / "turns-open.csv", pairs.REAL_OPEN)
        print(f"kept the steps as {pairs.REAL_CLOSED.relative_to(ROOT)} and {pairs.REAL_OPEN.relative_to(ROOT)}",
              file=sys.stderr)  # fmt: skip
    after = quiet.check()
    if after is not None and not after.ok:
        print(f"warning: the machine was busy after the runs: {after.describe()}", file=sys.stderr)
    elif seen is not None and not seen.ok:
        print("warning: the runs began on a busy machine (--allow-busy)", file=sys.stderr)
    _print_real(pairs.paired(*pairs.read(args.out_dir / "turns.csv", args.out_dir / "turns-open.csv")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
