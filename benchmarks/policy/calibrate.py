"""The simulation beside the HTTP head-to-head: ``python -m benchmarks.policy.calibrate [--measured CSV]``.

At each point (a closed loop of 1, 8 or 64 connections, wrk's, without think time), the simulated server with the
measured constants (``benchmarks/policy/costs.json``), on one core and on two (:mod:`.sim.vloop`'s ``cores``),
against the rounds of ``make bench-peers`` on each rig (:data:`RIGS`, or ``--measured`` for a local run's
``peers.csv``): throughput and p50 pass where the simulation falls within the spread of the measured rounds or
within ±20 % of their median, whichever is wider. Compared: this package at the settings of the head-to-head's app
(the README's), at ``max_queue_time=0`` without turns (the head-to-head's ``ours-greedy``, where a rig has it), and
the peers.

The rigs' rounds are kept in ``benchmarks/policy/measured/`` (the figures the simulator is held to; ``reports/``
keeps no CSV): the rows of these variants from the head-to-head's CSVs committed at a34e792 (``git show
a34e792:reports/peers.csv`` and ``a34e792:reports/pinned/peers.csv``).
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from .sim.traffic import Scenario
from .variants import PEERS, RECOMMENDED, TURNS0, Variant

__all__ = ["MEASURED", "MODES", "RIGS", "Point", "Rig", "load_measured", "pairs", "points", "render"]

HERE = Path(__file__).resolve().parent
# The CSV's variant -> the simulator's: the head-to-head's app runs ours at the README's settings (at a34e792's
# revisions, four turns; the unpinned rig's core had no regather yet, which changes nothing in a closed loop without
# think time on the simulator), ``ours-greedy`` without turns.
SIM_OF = {"ours": RECOMMENDED, "ours-greedy": TURNS0, **{p.name: p for p in PEERS}}
TOLERANCE = 0.2
#: The simulator's modes compared besides the report's (the fitted core count): the model on the loop's core, and
#: beside it on a core of its own.
MODES = (1.0, 2.0)


@dataclass(frozen=True)
class Rig:
    """A run of the head-to-head: where its rounds are, and what it was."""

    name: str
    path: Path
    what: str


RIGS = (
    Rig(
        "pinned",
        HERE / "measured" / "peers-pinned.csv",
        "the server on one core, wrk on the other (`--taskset-server 1 --taskset-load 0`), 3 rounds, revision "
        "01455ff, 2026-11-29",
    ),
    Rig(
        "unpinned",
        HERE / "measured" / "peers-unpinned.csv",
        "the server and wrk on both cores (no taskset), 3 rounds, revision 01455ff, 2026-11-29",
    ),
)
MEASURED = RIGS[0].path


@dataclass(frozen=True)
class Point:
    variant: str  # the CSV's name
    connections: int
    rps: list[float]  # the rounds'
    p50: list[float]  # seconds
    items_per_call: list[float]

    def scenario(self, duration: float, warmup: float) -> Scenario:
        return Scenario(f"calibration-closed-{self.connections}", "closed", clients=self.connections,
                        duration=duration, warmup=warmup)  # fmt: skip


def load_measured(path: Path) -> dict[tuple[str, int], Point]:
    rows: dict[tuple[str, int], list[dict[str, str]]] = {}
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            rows.setdefault((row["variant"], int(row["connections"])), []).append(row)
    return {
        key: Point(
            key[0],
            key[1],
            [float(r["rps"]) for r in rs],
            [float(r["p50_ms"]) / 1000 for r in rs],
            [float(r["items_per_call"]) for r in rs if r.get("items_per_call")],
        )
        for key, rs in rows.items()
    }


def points(measured: dict[tuple[str, int], Point], connections: list[int]) -> list[Point]:
    """The points to compare: every variant the simulator has, at each connection count the CSV has."""
    return [measured[(v, c)] for v in SIM_OF for c in connections if (v, c) in measured]


def pairs(pts: list[Point], duration: float, warmup: float) -> list[tuple[Scenario, Variant]]:
    """The simulation runs the points need (one per variant and connection count, whatever the rigs)."""
    todo = {(p.connections, SIM_OF[p.variant].name): (p.scenario(duration, warmup), SIM_OF[p.variant]) for p in pts}
    return list(todo.values())


def band(values: list[float]) -> tuple[float, float]:
    mid = statistics.median(values)
    return min(min(values), mid * (1 - TOLERANCE)), max(max(values), mid * (1 + TOLERANCE))


def within(value: float, values: list[float]) -> bool:
    low, high = band(values)
    return low <= value <= high


Sims = dict[tuple[float, int, str], dict[str, float]]  # (cores, connections, the simulator's variant) -> result


def _mode(cores: float) -> str:
    return f"{cores:g} core" + ("" if cores == 1 else "s")


def render(
    rigs: list[tuple[Rig, list[Point]]], sims: Sims, modes: tuple[float, ...], chosen: float
) -> tuple[list[str], bool]:
    """A table per rig (each mode's figure and its ratio to the rounds' median), a summary of the errors per rig
    and mode, and whether every figure of the ``chosen`` mode passed on every rig."""
    lines = [
        "Measured: the head-to-head's closed loop (wrk, `make bench-peers`), every round; simulated: the same closed "
        f"loop with the constants above, in each mode ({', '.join(map(_mode, modes))}: the model on the loop's core, "
        "or on a core of its own). "
        f"Each figure: the simulation's, and its ratio to the rounds' median; ✓ within the rounds' spread or "
        f"±{TOLERANCE:.0%} of their median, whichever is wider.",
    ]
    ok = True
    summary = ["", "| rig | mode | req/s within | p50 within | req/s error (rms) | p50 error (rms) |",
               "|---|---|---:|---:|---:|---:|"]  # fmt: skip
    for rig, pts in rigs:
        lines += ["", f"**{rig.name}** ({rig.what}; `{_short(rig.path)}`):", ""]
        head = "| variant | conns | req/s measured (rounds) | " + " | ".join(f"{_mode(c)}" for c in modes)
        head += " | p50 measured (rounds) | " + " | ".join(f"{_mode(c)}" for c in modes)
        head += " | items/call measured | " + " | ".join(f"{_mode(c)}" for c in modes) + " |"
        lines += [head, "|---|---:|---:|" + "---:|" * len(modes) + "---:|" + "---:|" * len(modes) + "---:|"
                  + "---:|" * len(modes)]  # fmt: skip
        errors: dict[float, tuple[list[float], list[float], int, int]] = {c: ([], [], 0, 0) for c in modes}
        for p in pts:
            name = SIM_OF[p.variant].name
            rps_cells, p50_cells, ipc_cells = [], [], []
            for c in modes:
                sim = sims[(c, p.connections, name)]
                rps_ok, p50_ok = within(sim["throughput"], p.rps), within(sim["p50"], p.p50)
                rps_err, p50_err, n_rps, n_p50 = errors[c]
                rps_err.append(math.log(sim["throughput"] / statistics.median(p.rps)))
                p50_err.append(math.log(sim["p50"] / statistics.median(p.p50)))
                errors[c] = (rps_err, p50_err, n_rps + rps_ok, n_p50 + p50_ok)
                if c == chosen:
                    ok &= rps_ok and p50_ok
                rps_cells.append(f"{sim['throughput']:.0f} ({sim['throughput'] / statistics.median(p.rps):.2f}) "
                                 f"{'✓' if rps_ok else '✗'}")  # fmt: skip
                p50_cells.append(f"{sim['p50'] * 1e3:.2f} ({sim['p50'] / statistics.median(p.p50):.2f}) "
                                 f"{'✓' if p50_ok else '✗'}")  # fmt: skip
                ipc_cells.append(f"{sim['items_per_call']:.1f}")
            ipc = f"{statistics.median(p.items_per_call):.1f}" if p.items_per_call else "-"
            lines.append(
                f"| {p.variant} | {p.connections} | {_spread(p.rps, '{:.0f}')} | {' | '.join(rps_cells)} | "
                f"{_spread([v * 1e3 for v in p.p50], '{:.2f}')} ms | {' | '.join(p50_cells)} | {ipc} | "
                f"{' | '.join(ipc_cells)} |"
            )
        for c in modes:
            rps_err, p50_err, n_rps, n_p50 = errors[c]
            summary.append(
                f"| {rig.name} | {_mode(c)}{' (chosen)' if c == chosen else ''} | {n_rps} of {len(rps_err)} | "
                f"{n_p50} of {len(p50_err)} | {_rms(rps_err):.0%} | {_rms(p50_err):.0%} |"
            )
    lines += summary
    lines += [
        "",
        "Errors: the root mean square of the logarithm of the simulation's ratio to the rounds' median, as a "
        "percentage (10 %: a typical figure 1.10x or 0.91x the median).",
    ]
    return lines, ok


def _rms(logs: list[float]) -> float:
    return math.expm1(math.sqrt(math.fsum(v * v for v in logs) / len(logs))) if logs else math.nan


def _spread(values: list[float], fmt: str) -> str:
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def _short(path: Path) -> str:
    root = HERE.parents[1]
    try:
        return str(path.resolve().relative_to(root))
    except ValueError:
        return str(path)


def rigs_of(
    measured: list[Path] | None, connections: list[int], costs: Path | None = None
) -> list[tuple[Rig, list[Point]]]:
    """The rigs to compare against (``measured``: local runs' CSVs instead of :data:`RIGS`), with their points; first,
    where ``costs`` (a ``costs.json``) holds the closed loops its measurement drove, those (``this machine``: the
    same run as the constants, which the core count is fitted to)."""
    chosen = list(RIGS) if not measured else [Rig(p.stem, p, "a local run of `make bench-peers`") for p in measured]
    out = [(rig, points(load_measured(rig.path), connections)) for rig in chosen if rig.path.is_file()]
    if costs is not None:
        from .costs import provenance

        steps = provenance(costs)["measured"].get("steps") or []
        own = [Point("ours", int(s["connections"]), [float(s["rps"])], [float(s["p50_ms"]) / 1000],
                     [float(s["items_per_call"])] if s.get("items_per_call") else [])
               for s in steps if int(s["connections"]) in connections and s["rps"] > 0]  # fmt: skip
        if own:
            rig = Rig("this machine", costs, "the closed loops of the constants' own measurement, one round each")
            out.insert(0, (rig, own))
    return out


def main(argv: list[str] | None = None) -> None:
    from . import costs as costs_file
    from .runner import interpreters, run_all

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--measured", type=Path, action="append", help="a peers.csv of make bench-peers (repeatable; default: RIGS)"
    )
    parser.add_argument("--connections", default="1,8,64", help="the points: closed loops of these connections")
    parser.add_argument("--costs", type=Path, default=costs_file.COSTS)
    parser.add_argument("--cores", type=float, help="the mode the verdict is on (default: the fitted count, else 1)")
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--peers-dir", type=Path, default=Path(".cache/peers"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--clock", default="uvloop", choices=("uvloop", "asyncio"))
    args = parser.parse_args(argv)
    costs = costs_file.load(args.costs)
    args.cores = args.cores or costs_file.fitted_cores(args.costs) or 1.0
    rigs = rigs_of(args.measured, [int(c) for c in args.connections.split(",")], args.costs)
    if not any(pts for _, pts in rigs):
        parser.error(f"no CSV has any of the variants {sorted(SIM_OF)} at {args.connections} connections")
    todo = pairs([p for _, pts in rigs for p in pts], args.duration, 1.0)
    pythons, missing = interpreters({v.kind for _, v in todo}, args.peers_dir)
    kinds = {v.name: v.kind for _, v in todo}
    rigs = [(rig, [p for p in pts if kinds[SIM_OF[p.variant].name] in pythons]) for rig, pts in rigs]
    modes = tuple(sorted({*MODES, args.cores}))
    sims: Sims = {}
    for cores in modes:
        for run in run_all(todo, costs, pythons, args.workers, clock=args.clock, cores=cores):
            sims[(cores, run.scenario.clients, run.variant.name)] = run.result
    lines, ok = render(rigs, sims, modes, args.cores)
    print("\n".join(lines))
    for kind, why in missing.items():
        print(f"\n{kind}: not run ({why})")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
