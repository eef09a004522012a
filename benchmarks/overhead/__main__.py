"""``python -m benchmarks.overhead``: the batcher's own cost next to a floor, the direct call and the peers, on pyperf.

Writes ``reports/overhead.md``, ``reports/overhead.csv``, ``reports/overhead.png`` and pyperf's JSON per
implementation in ``reports/overhead/``. ``--quick`` is a smoke run with tiny sizes; ``--profile IMPL SHAPE``
profiles one shape instead.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import platform
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path

from benchmarks.overhead import profiling, report
from benchmarks.overhead.peers import LOCAL_IMPLS, PEERS, interpreters
from benchmarks.overhead.runner import FULL, NOT_APPLICABLE, QUICK, Plan, Sizes, run_all
from benchmarks.overhead.worker import IMPLS, SHAPES, VARIANTS
from benchmarks.provenance import cpu_model, regenerated_by, revision

__all__ = ["main", "parse_args"]

ROOT = Path(__file__).resolve().parents[2]


def _csv(choices: Sequence[str]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",") if n.strip()]
        bad = [n for n in names if n not in choices]
        if bad or not names:
            raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(choices)}")
        return names

    return parse


def _positive(kind: Callable[[str], float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be above 0, got {text!r}")
        return value

    return parse


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.overhead", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smoke run: tiny sizes, 2 rounds of 1 process, 1 value each")
    p.add_argument("--impls", type=_csv(IMPLS + VARIANTS), default=list(IMPLS), help="comma-separated subset")
    p.add_argument("--shapes", type=_csv(SHAPES), default=list(SHAPES), help="comma-separated subset")
    p.add_argument("--event-loops", type=_csv(("asyncio", "uvloop")), default=["asyncio", "uvloop"])
    p.add_argument("--rounds", type=_positive(int), help="rounds over the implementations (default 3; quick: 2)")
    p.add_argument("--processes", type=_positive(int), help="pyperf processes per benchmark and round (default 2)")
    p.add_argument("--values", type=_positive(int), help="pyperf values per process (default 2; quick: 1)")
    p.add_argument("--min-time", type=_positive(float), help="pyperf's seconds per value to calibrate for (0.1)")
    p.add_argument("--items", type=_positive(int), help="steady and burst: items per run (default 20 000)")
    p.add_argument("--callers", type=_positive(int), help="steady: callers (default 1000)")
    p.add_argument("--bulk", type=_positive(int), help="bulk: items in the process_many list (default 20 000)")
    p.add_argument("--latency", type=_positive(int), help="latency: items awaited one at a time (default 5000)")
    p.add_argument(
        "--executor", type=_positive(int), help="executor: batches of one through a thread, one at a time (5000)"
    )
    p.add_argument("--no-peers", action="store_true", help="skip the published peers (no pip, no network)")
    p.add_argument("--peers-dir", type=Path, default=ROOT / ".cache" / "peers")
    p.add_argument("--out-dir", type=Path, default=ROOT / "reports")
    profiling.add_arguments(p)
    args = p.parse_args(argv)
    base = QUICK if args.quick else FULL
    sizes = Sizes(
        items=args.items or base.items,
        callers=args.callers or base.callers,
        bulk=args.bulk or base.bulk,
        latency=args.latency or base.latency,
        executor=args.executor or base.executor,
    )
    if "steady" in args.shapes and sizes.items % sizes.callers:
        p.error(f"steady: --items {sizes.items} is not a multiple of --callers {sizes.callers}")
    if args.no_peers:
        args.impls = [i for i in args.impls if i in LOCAL_IMPLS]
    args.plan = Plan(
        impls=args.impls,
        shapes=args.shapes,
        event_loops=args.event_loops,
        sizes=sizes,
        rounds=args.rounds or (2 if args.quick else 3),
        processes=args.processes or (1 if args.quick else 2),
        values=args.values or (1 if args.quick else 2),
        min_time=args.min_time or (0.005 if args.quick else 0.1),
    )
    return args


def _workload(plan: Plan) -> str:
    s = plan.sizes

    def n(v: int) -> str:
        return f"{v:,}".replace(",", " ")

    return (
        "The batch function does next to nothing (`[x * 2 for x in batch]`, async), so what is measured is the "
        f"batcher's own cost. max_batch_size={plan.batch_size}, a wait of {plan.wait * 1000:g} ms "
        "(max_queue_time and its equivalents). "
        f"**Steady**: {n(s.callers)} callers, each awaiting {n(s.items // s.callers)} items one after another "
        f"({n(s.items)} items). **Burst**: {n(s.items)} callers started at once with `gather`, one item each. "
        f"**Bulk**: one list of {n(s.bulk)} items through the bulk path. **Latency**: {n(s.latency)} items awaited "
        f"one at a time by one caller, with a wait of 0. **Executor**: {n(s.executor)} items awaited one at a time by "
        "one caller, with a wait of 0, each a batch of one that a plain `def` batch function handles in a "
        "`ThreadPoolExecutor(1)` (the direct call: `loop.run_in_executor` per item). Every implementation runs in "
        "its own interpreter; each process builds one event loop and one batcher and keeps them; a value times "
        "`loops` runs of the shape "
        "(pyperf calibrates `loops` in the first round); after each run, outside the timing, the worker checks that "
        "every caller got `2 * x` for its own `x`. "
        f"pyperf: {plan.rounds} rounds x {plan.processes} processes x ({plan.warmups} warm-up + {plan.values} "
        f"values) per benchmark, the implementations alternating, their order rotating each round."
    )


def _header(command: str, seconds: float, load: tuple[float, float], cells: dict[report.Key, report.Cell]) -> list[str]:
    versions = sorted({f"{impl} {c.version}" for (impl, _, _), c in cells.items() if c.version})
    return [
        f"Command: `{command}`",
        f"Date: {datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M UTC')}; the run took {seconds:.0f} s",
        f"Machine: {cpu_model()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}",
        f"Python {platform.python_version()} for all, each peer in a venv of its own; pyperf "
        f"{metadata.version('pyperf')}; uvloop {metadata.version('uvloop')}",
        "Versions: " + ", ".join(versions),
        f"Revision of this repository: {revision()}",
        f"Load average (1 min) before / after: {load[0]:.1f} / {load[1]:.1f} (the run keeps about one core busy)",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    plan: Plan = args.plan
    if args.profile:
        impl, shape = args.profile
        html = ROOT / ".cache" / "profiles" / f"{impl}-{shape}-{args.profile_loop}.html"
        print(profiling.profile(impl, shape, args.profile_loop, plan, args.profile_rounds, html))
        print(f"HTML profile: {html}")
        return 0
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    pythons, missing = interpreters(plan.impls, args.peers_dir)
    for name, why in missing.items():
        print(f"not measured: {name}: {why}", file=sys.stderr)
    raw = args.out_dir / "overhead"
    shutil.rmtree(raw, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        record = Path(tmp) / "record.jsonl"
        failed = run_all(plan, pythons, raw, record, progress=lambda m: print(m, file=sys.stderr, flush=True))
        batches = report.load_batches(record)
    impls = [i for i in plan.impls if i in pythons]
    cells = report.load(raw, impls)
    command = shlex.join(["python", "-m", "benchmarks.overhead", *(sys.argv[1:] if argv is None else argv)])
    failures = [f"{name}: {why}" for name, why in missing.items()]
    failures += [f"{i} {s} {lp}: {why}" for (i, s, lp), why in failed.items()]
    failures += [f"{i} {s}: not applicable" for i, s in sorted(NOT_APPLICABLE) if i in impls and s in plan.shapes]
    old_report = args.out_dir / "overhead.md"
    kept = report.instructions_section(old_report.read_text(encoding="utf-8")) if old_report.exists() else ""
    text = report.markdown(
        cells=cells,
        batches=batches,
        impls=impls,
        loops=plan.event_loops,
        out_dir=raw,
        regenerated=regenerated_by("bench-overhead", command, "OVERHEAD_ARGS"),
        header=_header(command, time.monotonic() - started, (load_before, os.getloadavg()[0]), cells),
        workload=_workload(plan),
        wiring={p.name: p.note for p in PEERS},
        failures=failures,
        instructions=kept,  # the instruction counter's section (make bench-overhead-instructions), as it was
    )
    (args.out_dir / "overhead.md").write_text(text, encoding="utf-8")
    report.write_csv(args.out_dir / "overhead.csv", cells, batches)
    report.write_png(args.out_dir / "overhead.png", cells, impls, plan.event_loops)
    targets = report.evaluate_targets(cells, plan.event_loops)
    print("\n".join(report.target_table(targets)))
    print(f"\nwrote {args.out_dir / 'overhead.md'}, overhead.csv, overhead.png, {raw}/", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
