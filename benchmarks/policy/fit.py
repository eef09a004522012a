"""The simulation's core count, fitted: ``python -m benchmarks.policy.fit [--costs PATH]``.

How much the event loop and the model's thread run at once on the real server is not a constant one can measure
apart: the model's own threads, the interpreter's lock beyond the share measured, the kernel's work for the sockets.
Rather than assert it ("one core"), the fit runs the simulated server, at the constants of ``costs.json``, through
the closed loops that :mod:`~benchmarks.policy.measure` drove the real one with (this package at the README's
settings, wrk at each connection count), at every core count of :data:`CORES`, and keeps the one whose requests/s
and p50 are nearest the measured ones (the least root mean square of the logarithms of their ratios; a tie goes to
the fewer cores). It writes the count (``cores``) and the table it chose from (``fit``) into ``costs.json``; the
report's simulations run on it unless ``--cores`` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from . import costs as costs_file
from .runner import interpreters, run_all
from .sim.server import Costs
from .sim.traffic import Scenario
from .variants import RECOMMENDED

__all__ = ["CORES", "Target", "choose", "error", "fit", "main", "targets"]

#: The core counts tried: one to two, by eighths.
CORES = tuple(1 + i / 8 for i in range(9))

Target = tuple[int, float, float]  # (connections, requests/s, p50 in seconds)


def targets(data: dict[str, Any]) -> list[Target]:
    """The measured closed loops of a ``costs.json`` (its ``measured.steps``)."""
    steps = data.get("measured", {}).get("steps") or []
    return [(int(s["connections"]), float(s["rps"]), float(s["p50_ms"]) / 1000) for s in steps if s["rps"] > 0]


def error(sims: dict[int, dict[str, float]], points: list[Target]) -> float:
    """The root mean square of the logarithm of each simulated figure's ratio to the measured one (requests/s and
    p50 at each connection count); infinite where a figure is missing or not positive."""
    logs = []
    for connections, rps, p50 in points:
        sim = sims.get(connections)
        if sim is None or not (sim["throughput"] > 0 and sim["p50"] > 0):
            return math.inf
        logs += [math.log(sim["throughput"] / rps), math.log(sim["p50"] / p50)]
    return math.sqrt(math.fsum(v * v for v in logs) / len(logs)) if logs else math.inf


def choose(errors: dict[float, float]) -> float:
    """The core count of the least error; a tie (within a part in a million) goes to the fewer cores."""
    if not errors or all(math.isinf(e) for e in errors.values()):
        raise ValueError("no core count gave a finite error")
    least = min(errors.values())
    return min(c for c, e in errors.items() if e <= least * (1 + 1e-6))


def fit(
    costs: Costs,
    points: list[Target],
    *,
    cores: tuple[float, ...] = CORES,
    duration: float = 10.0,
    workers: int = 2,
    clock: str = "uvloop",
) -> tuple[float, list[dict[str, Any]]]:
    """The fitted core count, and per count tried: its error and each point's simulated figures (each simulation
    ``duration`` virtual seconds, its first tenth not counted)."""
    warmup = duration / 10
    scenarios = [
        Scenario(f"fit-closed-{c}", "closed", clients=c, duration=duration, warmup=warmup) for c, _, _ in points
    ]
    pairs = [(s, RECOMMENDED) for _ in cores for s in scenarios]
    each = [c for c in cores for _ in scenarios]
    pythons, _ = interpreters({"ours"}, Path(".cache/peers"))
    runs = run_all(pairs, costs, pythons, workers, clock=clock, cores=each)
    by_cores: dict[float, dict[int, dict[str, float]]] = {c: {} for c in cores}
    for run in runs:
        by_cores[run.cores][run.scenario.clients] = run.result
    errors = {c: error(by_cores[c], points) for c in cores}
    table = [
        {"cores": c, "error": errors[c],
         "points": {str(n): {"rps": by_cores[c][n]["throughput"], "p50": by_cores[c][n]["p50"]} for n in by_cores[c]}}
        for c in cores
    ]  # fmt: skip
    return choose(errors), table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--costs", type=Path, default=costs_file.COSTS)
    parser.add_argument("--duration", type=float, default=10.0, help="virtual seconds of each simulation")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--clock", default="uvloop", choices=("uvloop", "asyncio"))
    args = parser.parse_args(argv)
    data = json.loads(args.costs.read_text())
    points = targets(data)
    if not points:
        raise SystemExit(f"{args.costs}: no measured steps to fit to (python -m benchmarks.policy.measure)")
    best, table = fit(Costs.from_dict(data), points, duration=args.duration, workers=args.workers,
                      clock=args.clock)  # fmt: skip
    data["cores"] = best
    data["fit"] = {"points": [{"connections": c, "rps": r, "p50": p} for c, r, p in points], "clock": args.clock,
                   "duration": args.duration, "table": table}  # fmt: skip
    args.costs.write_text(json.dumps(data, indent=2) + "\n")
    for row in table:
        mark = " <- fitted" if row["cores"] == best else ""
        print(f"cores {row['cores']:.3f}: error {row['error']:.1%}{mark}", file=sys.stderr)


if __name__ == "__main__":
    main()
