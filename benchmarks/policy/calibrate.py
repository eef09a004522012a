"""The simulation beside the HTTP head-to-head: ``python -m benchmarks.policy.calibrate [--measured CSV]``.

At each point (a closed loop of ``--connections`` connections, wrk's, without think time), the simulated server
with the measured constants (``benchmarks/policy/costs.json``) against the rounds of ``make bench-peers`` in a CSV
of its closed loop (``reports/peers.csv`` by default; any run's ``peers.csv``): throughput and p50 pass where the
simulation falls within the spread of the measured rounds or within ±20 % of their median, whichever is wider.
Compared: this package at the settings of the head-to-head's app (the README's) and the peers the CSV holds.
"""

from __future__ import annotations

import argparse
import csv
import statistics
from dataclasses import dataclass
from pathlib import Path

from .sim.server import Costs
from .sim.traffic import Scenario
from .variants import PEERS, RECOMMENDED, Variant

__all__ = ["MEASURED", "Point", "load_measured", "pairs", "points", "render"]

MEASURED = Path(__file__).resolve().parents[2] / "reports" / "peers.csv"
# The CSV's variant -> the simulator's: the head-to-head's app runs ours at the README's settings.
SIM_OF = {"ours": RECOMMENDED, **{p.name: p for p in PEERS}}
TOLERANCE = 0.2


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
    return [(p.scenario(duration, warmup), SIM_OF[p.variant]) for p in pts]


def band(values: list[float]) -> tuple[float, float]:
    mid = statistics.median(values)
    return min(min(values), mid * (1 - TOLERANCE)), max(max(values), mid * (1 + TOLERANCE))


def within(value: float, values: list[float]) -> bool:
    low, high = band(values)
    return low <= value <= high


def render(pts: list[Point], sims: list[dict[str, float]], source: Path, costs: Costs) -> tuple[list[str], bool]:
    """The side-by-side table, and whether every figure passed."""
    lines = [
        f"Measured: `{_short(source)}` (wrk, closed loop, every round); simulated: the same closed loop on the "
        f"simulator with the constants above. A figure passes within the rounds' spread or ±{TOLERANCE:.0%} of their "
        "median, whichever is wider.",
        "",
        "| variant | connections | req/s measured (rounds) | req/s simulated | | p50 measured (rounds) | p50 simulated "
        "| | items/call measured | simulated |",
        "|---|---:|---:|---:|:---:|---:|---:|:---:|---:|---:|",
    ]
    ok = True
    for p, sim in zip(pts, sims, strict=True):
        rps_ok = within(sim["throughput"], p.rps)
        p50_ok = within(sim["p50"], p.p50)
        ok &= rps_ok and p50_ok
        ipc = f"{statistics.median(p.items_per_call):.1f}" if p.items_per_call else "-"
        lines.append(
            f"| {p.variant} | {p.connections} | {_spread(p.rps, '{:.0f}')} | {sim['throughput']:.0f} | "
            f"{'PASS' if rps_ok else 'FAIL'} | {_spread([v * 1e3 for v in p.p50], '{:.2f}')} ms | "
            f"{sim['p50'] * 1e3:.2f} ms | {'PASS' if p50_ok else 'FAIL'} | {ipc} | {sim['items_per_call']:.1f} |"
        )
    return lines, ok


def _spread(values: list[float], fmt: str) -> str:
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def _short(path: Path) -> str:
    root = Path(__file__).resolve().parents[2]
    try:
        return str(path.resolve().relative_to(root))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> None:
    from . import costs as costs_file
    from .runner import interpreters, run_all

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measured", type=Path, default=MEASURED, help="a peers.csv of make bench-peers")
    parser.add_argument("--connections", default="1,8,64", help="the points: closed loops of these connections")
    parser.add_argument("--costs", type=Path, default=costs_file.COSTS)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--peers-dir", type=Path, default=Path(".cache/peers"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--clock", default="uvloop", choices=("uvloop", "asyncio"))
    args = parser.parse_args(argv)
    costs = costs_file.load(args.costs)
    pts = points(load_measured(args.measured), [int(c) for c in args.connections.split(",")])
    if not pts:
        parser.error(f"{args.measured} has none of the variants {sorted(SIM_OF)} at {args.connections} connections")
    todo = pairs(pts, args.duration, 1.0)
    pythons, missing = interpreters({v.kind for _, v in todo}, args.peers_dir)
    kept = [(p, pair) for p, pair in zip(pts, todo, strict=True) if pair[1].kind in pythons]
    runs = run_all([pair for _, pair in kept], costs, pythons, args.workers, clock=args.clock)
    lines, ok = render([p for p, _ in kept], [r.result for r in runs], args.measured, costs)
    print("\n".join(lines))
    for kind, why in missing.items():
        print(f"\n{kind}: not run ({why})")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
