"""The decision's validation: ``python -m benchmarks.policy.validate [run]`` (``make bench-policy-validate``).

``run``: the paired real runs (:mod:`.pairs`) on this machine, once it is quiet (:mod:`.quiet`: it refuses a busy
one): the head-to-head with :data:`~.pairs.RIG_ARGS`, ``--rounds`` rounds (10: about 35 minutes), its report in
``--out-dir`` (``reports/turns/turns.md``), its steps kept as ``benchmarks/policy/measured/turns-closed.csv`` and
``turns-open.csv``, which ``make bench-policy`` reads. Without ``run``: the validation table (the real pairs of those
CSVs beside the simulator's ratios, :mod:`.validation`) and the verdict on the simulator, printed.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from . import costs as costs_file
from . import pairs, quiet, validation
from .runner import ROOT

__all__ = ["REAL_CLOSED", "REAL_OPEN", "default_policy", "main"]

HERE = Path(__file__).resolve().parent
REAL_CLOSED = HERE / "measured" / "turns-closed.csv"
REAL_OPEN = HERE / "measured" / "turns-open.csv"
ROUNDS = 10


def default_policy() -> tuple[str, int]:
    """The policy a batcher gets at the README's settings (the real rig's ``ours``), and its turns."""
    from async_batcher import AsyncBatcher

    class Probe(AsyncBatcher[int, int]):
        async def process_batch(self, batch: list[int]) -> list[int]:
            return batch

    policy = Probe(max_batch_size=256, max_queue_time=0, max_queue_size=4096).policy
    return repr(policy), int(policy.turns)


def _run(args: argparse.Namespace) -> int:
    from benchmarks.peers.__main__ import Defaults
    from benchmarks.peers.__main__ import main as rig

    seen = quiet.require_quiet("the paired real runs", allow_busy=args.allow_busy)
    defaults = Defaults(
        prog="python -m benchmarks.policy.validate run",
        target="bench-policy-validate",
        variable="VALIDATE_ARGS",
        modes="closed,open",
        shapes="poisson",
        report="turns",
        title="The loop's turns against the default: interleaved pairs on the real server",
    )
    argv = [*pairs.RIG_ARGS, "--rounds", str(args.rounds), "--out-dir", str(args.out_dir), *args.rig_args]
    code = rig(argv, defaults)
    if code:
        return code
    if args.keep:
        REAL_CLOSED.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(args.out_dir / "turns.csv", REAL_CLOSED)
        shutil.copyfile(args.out_dir / "turns-open.csv", REAL_OPEN)
        print(f"kept the steps as {REAL_CLOSED.relative_to(ROOT)} and {REAL_OPEN.relative_to(ROOT)}", file=sys.stderr)
    after = quiet.check()
    if after is not None and not after.ok:
        print(f"warning: the machine was busy after the runs: {after.describe()}", file=sys.stderr)
    elif seen is not None and not seen.ok:
        print("warning: the runs began on a busy machine (--allow-busy)", file=sys.stderr)
    closed, open_steps = pairs.read(args.out_dir / "turns.csv", args.out_dir / "turns-open.csv")
    _print_real(pairs.paired(closed, open_steps))
    return 0


def _print_real(real: list[pairs.Paired]) -> None:
    print("| cell | turns | metric | pairs | higher / lower | median ratio | p |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for p in real:
        print(f"| {p.cell.name} | {p.turns} | {p.metric} | {len(p.ratios)} | {p.higher} / {p.lower} | "
              f"{p.median:.3f} | {p.p:.3f}{' *' if p.significant else ''} |")  # fmt: skip


def _report(args: argparse.Namespace) -> int:
    costs = costs_file.load(args.costs)
    cores = args.cores or costs_file.fitted_cores(args.costs) or 1.0
    seeds = tuple(int(s) for s in args.seeds.split(","))
    real = pairs.paired(*pairs.read(args.closed, args.open))
    sims = validation.simulate(costs, cores, seeds, duration=args.duration, workers=args.workers, clock=args.clock)
    policy, turns = default_policy()
    lines, verdict = validation.render(real, sims, policy)
    print("\n".join([*lines, "", *validation.decision_lines(real, verdict, turns)]))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.policy.validate", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    run = sub.add_parser("run", help="the paired real runs (a quiet machine; about 35 minutes at 10 rounds)")
    run.add_argument("--rounds", type=int, default=ROUNDS, help=f"pairs per cell (default {ROUNDS}; at least 6)")
    run.add_argument("--out-dir", type=Path, default=ROOT / "reports" / "turns")
    run.add_argument("--allow-busy", action="store_true", help="run even where the machine is busy")
    run.add_argument("--no-keep", dest="keep", action="store_false", help="do not copy the steps to measured/")
    run.add_argument(
        "--rig-args",
        nargs=argparse.REMAINDER,
        default=[],
        help="more options for the head-to-head, last (e.g. --seconds 1 --warmup 0 for a smoke run)",
    )
    parser.add_argument("--closed", type=Path, default=REAL_CLOSED, help="the real runs' closed-loop steps")
    parser.add_argument("--open", type=Path, default=REAL_OPEN, help="the real runs' open-loop steps")
    parser.add_argument("--costs", type=Path, default=costs_file.COSTS)
    parser.add_argument("--cores", type=float, help="the simulation's cores (default: the fitted count, else 1)")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--duration", type=float, default=10.0, help="virtual seconds per simulation")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--clock", default="uvloop", choices=("uvloop", "asyncio"))
    args = parser.parse_args(argv)
    if args.command == "run":
        if args.rounds < 1:
            parser.error("--rounds must be 1 or more")
        return _run(args)
    return _report(args)


if __name__ == "__main__":
    sys.exit(main())
