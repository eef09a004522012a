"""``python -m benchmarks.policy``: every scenario through every variant on the simulated server; reports/policy.md
and reports/policy.csv (``make bench-policy``; ``--quick`` for a smoke run)."""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from benchmarks.provenance import regenerated_by

from . import calibrate, report
from . import costs as costs_file
from .runner import ROOT, Run, interpreters, run_all
from .scenarios import MAX_BATCH_SIZE, QUICK, scenarios
from .sim.server import Costs
from .sim.traffic import Scenario
from .sim.vloop import CLOCKS
from .variants import CONSTRUCTOR, EXTRA, PEERS, RECOMMENDED, REGISTRY, Variant, candidates, grid, parse

DEFAULTS = [RECOMMENDED.name, CONSTRUCTOR.name]


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.policy", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: 3 scenarios of 2 s, a 2x2 grid")
    parser.add_argument("--costs", type=Path, default=costs_file.COSTS, help="the cost constants (JSON)")
    parser.add_argument("--duration", type=float, help="virtual seconds per scenario (10; --quick: 2)")
    parser.add_argument("--warmup", type=float, help="virtual seconds not counted at the start (1; --quick: 0.5)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--clock",
        default="uvloop",
        choices=CLOCKS,
        help="the batchers' clock: uvloop's milliseconds (the HTTP benchmark's server) or asyncio's exact one",
    )
    parser.add_argument(
        "--cores",
        type=float,
        default=1.0,
        help="processors the loop and the model share: 1 (the calibrated mode: they take turns on one core) or 2 "
        "(the model beside the loop); between: partial contention",
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
    parser.add_argument("--out-dir", type=Path, default=ROOT / "reports")
    parser.add_argument("--name", default="policy", help="the report's file name, without extension")
    args = parser.parse_args(argv)
    if args.duration is None:
        args.duration = 2.0 if args.quick else 10.0
    if args.warmup is None:
        args.warmup = 0.5 if args.quick else 1.0
    return args


def main(argv: list[str] | None = None) -> None:
    args = _args(argv)
    started = time.monotonic()
    costs = costs_file.load(args.costs)
    chosen = scenarios(costs, duration=args.duration, warmup=args.warmup, seed=args.seed, cores=args.cores)
    names = args.scenarios.split(",") if args.scenarios else (list(QUICK) if args.quick else None)
    if names is not None:
        unknown = sorted(set(names) - {s.name for s in chosen})
        if unknown:
            raise SystemExit(f"unknown scenarios {unknown}; known: {[s.name for s in chosen]}")
        chosen = [s for s in chosen if s.name in names]
    the_grid = grid((0.0, 0.002), (0.0, 0.002), (0,)) if args.quick else grid()
    variants: list[Variant] = [RECOMMENDED, CONSTRUCTOR, *the_grid]
    if not args.no_peers:
        variants += PEERS
    candidate_names: list[str] = []
    if not args.no_candidates:
        candidate_names, candidate_variants = candidates(the_grid)
        if args.quick:  # the grid's candidates only
            candidate_names = [n for n in candidate_names if n in {v.name for v in the_grid}]
        else:
            variants += candidate_variants
    variants += [REGISTRY[name] for name in EXTRA]
    try:
        variants += [parse(spec, args.setup) for spec in args.variant]
    except ValueError as exc:
        raise SystemExit(str(exc)) from exc
    if len({v.name for v in variants}) != len(variants):
        raise SystemExit(f"two variants share a name: {[v.name for v in variants]}")
    pairs = [(s, v) for s in chosen for v in variants]
    rigs: list[tuple[calibrate.Rig, list[calibrate.Point]]] = []
    if not args.no_calibration:
        rigs = calibrate.rigs_of(args.measured, [1, 8, 64])
        if args.no_peers:
            rigs = [(rig, [p for p in pts if calibrate.SIM_OF[p.variant].kind == "ours"]) for rig, pts in rigs]
        rigs = [(rig, pts) for rig, pts in rigs if pts]
    modes = tuple(sorted({*calibrate.MODES, args.cores}))
    cal_pairs = calibrate.pairs([p for _, pts in rigs for p in pts], args.duration, args.warmup)
    every = pairs + [pair for _ in modes for pair in cal_pairs]
    cores = [args.cores] * len(pairs) + [c for c in modes for _ in cal_pairs]
    pythons, missing = interpreters({v.kind for _, v in every}, args.peers_dir)

    def progress(done: int, total: int) -> None:
        print(f"\r{done}/{total} runs", end="", file=sys.stderr, flush=True)

    runs = run_all(every, costs, pythons, args.workers, progress, args.clock, cores)
    print(file=sys.stderr)
    main_runs = [r for r in runs if not r.scenario.name.startswith("calibration-")]
    sims = {(r.cores, r.scenario.clients, r.variant.name): r.result
            for r in runs if r.scenario.name.startswith("calibration-")}  # fmt: skip
    rigs = [(rig, [p for p in pts if (args.cores, p.connections, calibrate.SIM_OF[p.variant].name) in sims])
            for rig, pts in rigs]  # fmt: skip
    args.out_dir.mkdir(parents=True, exist_ok=True)
    report.write_csv(args.out_dir / f"{args.name}.csv", main_runs)
    lines = render(args, argv, costs, main_runs, the_grid, candidate_names, missing, rigs, sims, modes,
                   time.monotonic() - started)  # fmt: skip
    (args.out_dir / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out_dir / args.name}.md and .csv in {time.monotonic() - started:.0f} s", file=sys.stderr)


def render(
    args: argparse.Namespace,
    argv: list[str] | None,
    costs: Costs,
    runs: list[Run],
    the_grid: list[Variant],
    candidate_names: list[str],
    missing: dict[str, str],
    rigs: list[tuple[calibrate.Rig, list[calibrate.Point]]],
    sims: calibrate.Sims,
    modes: tuple[float, ...],
    took: float,
) -> list[str]:
    verdicts = report.judge(runs)
    peers = [p.name for p in PEERS if any(r.variant.name == p.name for r in runs)]
    revision = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    prov = costs_file.provenance(args.costs)
    measured = prov["measured"]
    virtual = sum(r.result["virtual_s"] for r in runs)
    wall = sum(r.result["wall_s"] for r in runs)
    ratios = sorted(r.result["virtual_s"] / r.result["wall_s"] for r in runs)
    slowest = min(runs, key=lambda r: r.result["virtual_s"] / r.result["wall_s"])
    reads = {r.variant.name: r.result["wall_clock_reads"] for r in runs if r.result["wall_clock_reads"]}
    versions = {r.variant.kind: r.result["version"] for r in runs}
    command = "python -m benchmarks.policy" + (
        "" if not (argv or sys.argv[1:]) else " " + " ".join(argv or sys.argv[1:])
    )
    lines = [
        "# Dispatch policy on a simulated server (`make bench-policy`)",
        "",
        regenerated_by("bench-policy", command, "POLICY_ARGS"),
        "",
        f"- Command: `{command}`; {len(runs)} runs in {took:.0f} s on {args.workers} worker process(es)",
        f"- Date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; revision {revision.stdout.strip()}; "
        f"{platform.machine()}, Python {platform.python_version()}",
        f"- Batchers: ours {versions.get('ours', '-')}"
        + "".join(f", {k} {v}" for k, v in versions.items() if k != "ours")
        + " (each peer in its own environment, as its README shows it: `benchmarks/policy/sim/batchers.py`)",
        f"- Scenarios: {len(verdicts)}, {args.duration:g} virtual seconds each (the first {args.warmup:g} s not "
        f"counted), seed {args.seed}: the same seed gives the same numbers",
        f"- Speed: {virtual:.0f} virtual seconds in {wall:.1f} s of wall time, {virtual / wall:.0f}x faster than real "
        f"time over all runs (per run: median {statistics.median(ratios):.0f}x, slowest {ratios[0]:.0f}x: "
        f"{slowest.variant.name} on {slowest.scenario.name})",
        "- Clocks: every batcher times itself by the event loop's clock (none patched); wall-clock reads during the "
        "runs: " + ("none" if not reads else ", ".join(f"{k} {v}" for k, v in sorted(reads.items()))),
    ]
    for kind, why in sorted(missing.items()):
        lines.append(f"- Not run: {kind} ({why})")
    lines += [
        "",
        "## The simulated server",
        "",
        "This package's batcher, and each peer, run unchanged on an asyncio event loop whose clock is virtual "
        "(`benchmarks/policy/sim/vloop.py`): it jumps to the next timer when the loop is idle, and the server's own "
        "CPU "
        "moves it while nothing else runs, so timers fire late and the requests that arrived meanwhile are read "
        "together, as on a busy server. Each request costs the loop `read` when it arrives (a callback that then "
        "creates the handler's task), `pre` when its handler runs up to `await process(item)`, `post` once the result "
        "is back; the model is the batcher's plain `def process_batch` in a one-thread executor that runs no thread: "
        "`submit` of the loop's CPU per batch, then `model_a + model_b * n` seconds of CPU in the model's thread "
        "(times a seeded lognormal factor of spread `jitter`), as the model's thread in the HTTP benchmark. Half of "
        "`net` before a request reaches the server, half before its answer reaches its client. Latency: from the "
        "send (an open loop's intended send time) to the answer; throughput: answers a second within the counted "
        "time.",
        "",
        f"Cores: {args.cores:g}. The loop and the model's thread share the processors as an OS scheduler shares "
        "runnable threads: while both have work, each gets `min(1, cores / 2)` of one. On one core (`--cores 1`) "
        "they take turns: a batch the model runs while the loop works ends later by the loop's CPU meanwhile, and "
        "the loop's work takes longer by the model's; on two (`--cores 2`) the model runs beside the loop and "
        "neither waits for the other. One core is the calibrated mode, on both rigs of the head-to-head (the next "
        "section): there, the server never used much more than one core even where it had two (its CPU at 8 and 64 "
        "connections: 97-108 % of a core unpinned, 98-99 % pinned), as the model's Python holds the interpreter's "
        "lock the loop needs; and splitting a closed loop's clients into two cohorts that alternate (no turns) cost "
        "throughput on both rigs, as on one simulated core, where on two it pays.",
        "",
        "| constant | value | what |",
        "|---|---:|---|",
        f"| read | {costs.read * 1e6:.1f} µs | loop CPU to read a request (uvicorn's `data_received`) |",
        f"| pre | {costs.pre * 1e6:.1f} µs | loop CPU of the handler before the batcher |",
        f"| post | {costs.post * 1e6:.1f} µs | loop CPU from the result to the response written |",
        f"| submit | {costs.submit * 1e6:.1f} µs | loop CPU per batch (the batcher, the hand-over to the model's "
        "thread "
        "and back) |",
        f"| model_a | {costs.model_a * 1e3:.3f} ms | the model call's fixed time, with the hand-over's latency |",
        f"| model_b | {costs.model_b * 1e6:.2f} µs | the model call's time per item |",
        f"| net | {costs.net * 1e6:.0f} µs | outside the server: the client and the network, both ways |",
        f"| jitter | {costs.jitter:.3f} | the model's times' spread about `a + b·n` (standard deviation of their "
        "logarithm) |",
        "",
        f"Capacity (the rates' 100 %): {costs.capacity(MAX_BATCH_SIZE, args.cores):.0f} requests a second on "
        f"{args.cores:g} core{'s' if args.cores != 1 else ''} (at full batches of {MAX_BATCH_SIZE}: the loop's CPU "
        f"alone would allow {1 / (costs.request_cpu + costs.submit / MAX_BATCH_SIZE):.0f}/s, the model's alone "
        f"{MAX_BATCH_SIZE / (costs.model_a + costs.model_b * MAX_BATCH_SIZE):.0f}/s).",
        "",
        f"Measured by `{measured.get('command', 'python -m benchmarks.policy.measure')}` on "
        f"{measured.get('date', '?')} "
        f"(revision {measured.get('revision', '?')}; {measured.get('machine', '?')}): the head-to-head's server for "
        "this package, instrumented, under wrk (`benchmarks/policy/measure.py` says how each constant is derived; "
        "`benchmarks/policy/costs.json` holds the figures).",
    ]
    if measured.get("steps"):
        lines += ["", "| wrk connections | req/s | p50 (ms) | items/call | server CPU | machine busy |",
                  "|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
        for st in measured["steps"]:
            lines.append(
                f"| {st['connections']} | {st['rps']:.0f} | {st['p50_ms']:.2f} | {st['items_per_call'] or 0:.1f} | "
                f"{st['server_cpu'] or 0:.0f} % | {st['machine_busy'] or 0:.0f} % |"
            )
    lines += ["", "## Calibration: the simulation beside the HTTP head-to-head", ""]
    if any(pts for _, pts in rigs):
        cal_lines, ok = calibrate.render(rigs, sims, modes, args.cores)
        lines += cal_lines
        lines += ["", f"Verdict on the report's mode ({args.cores:g} core{'s' if args.cores != 1 else ''}): "
                      f"{'PASS' if ok else 'FAIL'} (`python -m benchmarks.policy.calibrate` reruns it; "
                      "`--measured CSV` against another run's rounds)."]  # fmt: skip
    else:
        lines.append("Not run (`--no-calibration`, or no rounds of the head-to-head to compare with).")
    lines += ["", "## Targets (issue 44)", ""]
    lines += [
        f"Per scenario: the default settings' p99 at most {report.P99_RATIO}x the best of the grid (fixed settings: "
        f"`max_queue_time` in {_values(the_grid, 'max_queue_time')} s by "
        f"`max_hold_time` in {_values(the_grid, 'max_hold_time')} s, "
        "`max_batch_size=256`, `max_queue_size=4096`, the policies' four turns; `greedy` is `max_queue_time=0` "
        "without a hold; and `greedy` at other turns, `greedy-turnsT`: `policy=Deadline(0, turns=T)`); in closed "
        "loops, their throughput at least "
        f"{report.THROUGHPUT_RATIO}x the grid's best; and no peer better (p99 no higher; in closed loops, req/s no "
        "lower).",
        "",
    ]
    totals = []
    for default, kwargs in ((RECOMMENDED.name, RECOMMENDED.kwargs), (CONSTRUCTOR.name, CONSTRUCTOR.kwargs or "none")):
        table, met, judged = report.targets_table(verdicts, default, peers)
        totals.append(f"{default}: {met} of {judged} met")
        lines += [f"### {default} (`{kwargs}`)", "", *table, "", f"{met} of {judged} targets met.", ""]
    if candidate_names:
        lines += ["## Candidates for the default", ""]
        lines += [
            "The same targets for each setting considered for the default (their `policy=` in the CSV): the grid's "
            "`greedy` points, the same without the regather (`-noregather`), latency budgets (`budgetXms`: "
            "`LatencyBudget(X ms)`, four turns unless `-turns1`) and closed-loop holds over them (`holdXms-...`: "
            "`ClosedLoopHold(X ms, ...)`; `wait0ms+holdXms`: over `greedy`). Misses: the scenario, and which target "
            "(p: p99, t: req/s, v: a peer better).",
            "",
            *report.candidates_table(verdicts, candidate_names, peers),
            "",
        ]
    lines += ["## Which setting serves which traffic", ""]
    lines += [
        f"A setting serves a scenario where its p99 is at most {report.P99_RATIO}x the grid's best and, in a closed "
        f"loop, its throughput at least {report.THROUGHPUT_RATIO}x the grid's best.",
        "",
        *report.conflicts(verdicts, the_grid),
        "",
        *report.serves_table(verdicts, the_grid, DEFAULTS),
        "",
        "## Per scenario",
        "",
        "The defaults, the peers, the grid's best, `greedy` and the three candidates that meet the most targets; every "
        "variant's figures are in the CSV.",
        "",
    ]
    leading = report.leading(verdicts, candidate_names, peers, 3)
    for x in verdicts:
        shown = [*DEFAULTS, *peers, x.best_p99.variant.name, x.best_throughput.variant.name, "greedy", *leading]
        shown += [v.name for v in (x.runs[n].variant for n in x.runs) if v.role == "extra"]
        s = x.scenario
        lines += [f"### {s.name}: {describe(s)}", "", *report.scenario_table(x, list(dict.fromkeys(shown))), ""]
    lines.append("Totals: " + "; ".join(totals) + ".")
    return lines


def describe(s: Scenario) -> str:
    if s.kind == "open":
        what = f"{s.shape}, {s.rate:.0f} req/s"
        if s.shape == "onoff":
            what += f" ({s.on * 1e3:g} ms on in every {(s.on + s.off) * 1e3:g})"
    elif s.kind == "closed":
        what = f"{s.clients} clients, think " + (f"exponential {s.think * 1e3:g} ms" if s.think else "0")
    else:
        what = f"Poisson {s.rate:.0f} req/s + {s.clients} clients, think 0"
    return what + (f"; {s.keys} keys, Zipf {s.zipf}" if s.keys else "")


def _values(variants: list[Variant], name: str) -> list[float]:
    """The values the variants give keyword ``name`` (those that give it)."""
    return sorted({x for x in (_kw(v, name) for v in variants) if not math.isnan(x)})


def _kw(v: Variant, name: str) -> float:
    for part in v.kwargs.split(","):
        key, _, value = part.partition("=")
        if key.strip() == name:
            return float(value)
    return math.nan


if __name__ == "__main__":
    main()
