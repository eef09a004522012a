"""``python -m benchmarks.policy``: every scenario through every variant on the simulated server, at each seed; the
calibration, the validation of the decision against the paired real runs, and the sensitivity to each constant;
reports/policy.md and reports/policy.csv (``make bench-policy``; ``--quick`` for a smoke run)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from . import calibrate, document, pairs, report, sensitivity, validation
from . import costs as costs_file
from .pairs import REAL_CLOSED, REAL_OPEN
from .runner import ROOT, interpreters, run_all
from .scenarios import QUICK, scenarios
from .sim.vloop import CLOCKS
from .variants import CONSTRUCTOR, EXTRA, PEERS, RECOMMENDED, REGISTRY, Variant, candidates, grid, parse


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.policy", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: 3 scenarios of 2 s, a 2x2 grid, 2 seeds, the sensitivity "
        "to two constants"
    )  # fmt: skip
    parser.add_argument("--costs", type=Path, default=costs_file.COSTS, help="the cost constants (JSON)")
    parser.add_argument("--duration", type=float, help="virtual seconds per scenario (10; --quick: 2)")
    parser.add_argument("--warmup", type=float, help="virtual seconds not counted at the start (1; --quick: 0.5)")
    parser.add_argument("--seeds", help="the seeds every scenario runs at (default 1,2,3; --quick: 1,2)")
    parser.add_argument("--seed", type=int, help="one seed only (the same as --seeds N)")
    parser.add_argument(
        "--clock",
        default="uvloop",
        choices=CLOCKS,
        help="the batchers' clock: uvloop's milliseconds (the HTTP benchmark's server) or asyncio's exact one",
    )
    parser.add_argument(
        "--cores",
        type=float,
        help="processors the loop and the model share (default: the count fitted to the measured closed loops, "
        "python -m benchmarks.policy.fit; 1 where none was)",
    )
    parser.add_argument("--no-candidates", action="store_true", help="leave out the candidates for the default")
    parser.add_argument("--workers", type=int, default=2, help="processes at once")
    parser.add_argument("--scenarios", help="only these scenarios (comma-separated names)")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="another variant: NAME of the registry, or NAME:KWARGS for ours (e.g. "
        "'hold2ms:max_queue_time=0,max_hold_time=0.002'); repeatable",
    )
    parser.add_argument("--setup", default="", help="statements run before the --variant kwargs (imports)")
    parser.add_argument("--no-peers", action="store_true", help="leave the peers out")
    parser.add_argument("--peers-dir", type=Path, default=Path(".cache/peers"), help="the peers' environments")
    parser.add_argument(
        "--measured",
        type=Path,
        action="append",
        help="a head-to-head's CSV to calibrate against (repeatable; default: the rigs of benchmarks/policy/measured)",
    )
    parser.add_argument("--no-calibration", action="store_true")
    parser.add_argument("--no-validation", action="store_true", help="leave out the validation of the decision")
    parser.add_argument("--real-closed", type=Path, default=REAL_CLOSED, help="the paired real runs' closed loops")
    parser.add_argument("--real-open", type=Path, default=REAL_OPEN, help="the paired real runs' open loops")
    parser.add_argument("--no-sensitivity", action="store_true", help="leave out the sensitivity to the constants")
    parser.add_argument(
        "--sensitivity-constants",
        help=f"the constants scaled (comma-separated; default all: {','.join(sensitivity.CONSTANTS)})",
    )
    parser.add_argument("--out-dir", type=Path, default=ROOT / "reports")
    parser.add_argument("--name", default="policy", help="the report's file name, without extension")
    args = parser.parse_args(argv)
    if args.duration is None:
        args.duration = 2.0 if args.quick else 10.0
    if args.warmup is None:
        args.warmup = 0.5 if args.quick else 1.0
    if args.seed is not None:
        args.seeds = str(args.seed)
    try:
        args.seeds = tuple(int(s) for s in (args.seeds or ("1,2" if args.quick else "1,2,3")).split(","))
    except ValueError:
        parser.error(f"--seeds: expected comma-separated integers, got {args.seeds!r}")
    constants = args.sensitivity_constants or ("turn,cores" if args.quick else ",".join(sensitivity.CONSTANTS))
    args.constants = tuple(c.strip() for c in constants.split(",") if c.strip())
    unknown = sorted(set(args.constants) - set(sensitivity.CONSTANTS))
    if unknown:
        parser.error(f"--sensitivity-constants: unknown {unknown}; choose from {', '.join(sensitivity.CONSTANTS)}")
    return args


def _variants(args: argparse.Namespace, the_grid: list[Variant]) -> tuple[list[Variant], list[str]]:
    variants: list[Variant] = [RECOMMENDED, CONSTRUCTOR, *the_grid]
    if not args.no_peers:
        variants += PEERS
    candidate_names: list[str] = []
    if not args.no_candidates:
        candidate_names, candidate_variants = candidates(the_grid, (0, 32) if args.quick else (0, 1, 2, 8, 16, 32))
        if args.quick:  # the grid's candidates and the turns only
            candidate_variants = [v for v in candidate_variants if v.name in ("greedy-turns0", "greedy-turns32")]
            candidate_names = [n for n in candidate_names if n in {v.name for v in [*the_grid, *candidate_variants]}]
        variants += candidate_variants
    variants += [REGISTRY[name] for name in EXTRA]
    try:
        variants += [parse(spec, args.setup) for spec in args.variant]
    except ValueError as exc:
        raise SystemExit(str(exc)) from exc
    if len({v.name for v in variants}) != len(variants):
        raise SystemExit(f"two variants share a name: {[v.name for v in variants]}")
    return variants, candidate_names


def main(argv: list[str] | None = None) -> None:
    args = _args(argv)
    started = time.monotonic()
    costs = costs_file.load(args.costs)
    fitted = costs_file.fitted_cores(args.costs)
    cores = args.cores or fitted or 1.0
    chosen = [
        s
        for seed in args.seeds
        for s in scenarios(costs, duration=args.duration, warmup=args.warmup, seed=seed, cores=cores)
    ]
    names = args.scenarios.split(",") if args.scenarios else (list(QUICK) if args.quick else None)
    if names is not None:
        unknown = sorted(set(names) - {s.name for s in chosen})
        if unknown:
            raise SystemExit(f"unknown scenarios {unknown}; known: {sorted({s.name for s in chosen})}")
        chosen = [s for s in chosen if s.name in names]
    the_grid = grid((0.0, 0.002), (0.0, 0.002)) if args.quick else grid()
    variants, candidate_names = _variants(args, the_grid)
    todo = [(s, v) for s in chosen for v in variants]
    rigs: list[tuple[calibrate.Rig, list[calibrate.Point]]] = []
    if not args.no_calibration:
        rigs = calibrate.rigs_of(args.measured, [1, 8, 64], args.costs)
        if args.no_peers:
            rigs = [(rig, [p for p in pts if calibrate.SIM_OF[p.variant].kind == "ours"]) for rig, pts in rigs]
        rigs = [(rig, pts) for rig, pts in rigs if pts]
    modes = tuple(sorted({*calibrate.MODES, cores}))
    cal_pairs = calibrate.pairs([p for _, pts in rigs for p in pts], args.duration, args.warmup)
    every = todo + [pair for _ in modes for pair in cal_pairs]
    each_cores = [cores] * len(todo) + [c for c in modes for _ in cal_pairs]
    pythons, missing = interpreters({v.kind for _, v in every}, args.peers_dir)

    def progress(done: int, total: int) -> None:
        print(f"\r{done}/{total} runs", end="", file=sys.stderr, flush=True)

    runs = run_all(every, costs, pythons, args.workers, progress, args.clock, each_cores)
    print(file=sys.stderr)
    main_runs = [r for r in runs if not r.scenario.name.startswith("calibration-")]
    sims = {(r.cores, r.scenario.clients, r.variant.name): r.result
            for r in runs if r.scenario.name.startswith("calibration-")}  # fmt: skip
    rigs = [(rig, [p for p in pts if (cores, p.connections, calibrate.SIM_OF[p.variant].name) in sims])
            for rig, pts in rigs]  # fmt: skip
    real = pairs.paired(*pairs.read(args.real_closed, args.real_open))
    checked = None
    if not args.no_validation:
        print("the decision's cells, simulated", file=sys.stderr)
        checked = validation.simulate(costs, cores, args.seeds, duration=args.duration, workers=args.workers,
                                      clock=args.clock)  # fmt: skip
    swept = None
    if not args.no_sensitivity:
        seed = args.seeds[0]
        todo_constants = [c for c in sensitivity.CONSTANTS if c in args.constants]

        def step(what: str) -> None:
            print(f"\rsensitivity: {what}    ", end="", file=sys.stderr, flush=True)

        swept = sensitivity.sweep(costs, cores, seed, duration=args.duration, workers=args.workers, clock=args.clock,
                                  progress=step, constants=todo_constants)[1]  # fmt: skip
        print(file=sys.stderr)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    report.write_csv(args.out_dir / f"{args.name}.csv", main_runs)
    context = document.Context(
        args=args, argv=argv, costs=costs, cores=cores, fitted=fitted, runs=main_runs, grid=the_grid,
        candidates=candidate_names, missing=missing, rigs=rigs, sims=sims, modes=modes, real=real,
        checked=checked, swept=swept, took=time.monotonic() - started,
    )  # fmt: skip
    (args.out_dir / f"{args.name}.md").write_text("\n".join(document.render(context)) + "\n")
    print(f"wrote {args.out_dir / args.name}.md and .csv in {time.monotonic() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
