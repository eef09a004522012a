"""How much the decision hangs on each constant: every constant at half and at twice its value, one at a time.

The decision's simulation (:func:`.validation.simulate`) runs again with one constant scaled (the core count: kept at
one at least), at one seed; in each cell the four settings (the default and each of :data:`~.pairs.TURNS`) are
ranked on the cell's measure (served throughput in a closed loop, or where a setting did not keep up; else the p99),
and each setting's ratio to the default falls on one side of 1 or the other. A constant the decision is sensitive to
flips a ranking, or a ratio's side, when it is halved or doubled: the measurement of that constant then decides, and
its error must be smaller than that.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from .pairs import CELLS, TURNS, Cell
from .sim.server import Costs
from .validation import SimCells, simulate, simulated
from .verdicts import kept_up

__all__ = ["CONSTANTS", "FACTORS", "Row", "flips", "rankings", "render", "sweep"]

CONSTANTS = ("read", "pre", "post", "submit", "model_a", "model_b", "net", "jitter", "turn", "gil", "cores")
FACTORS = (0.5, 2.0)
SIDE = {1: "> 1", -1: "< 1", 0: "undecided"}


def _name(turns: int | None) -> str:
    return "default" if turns is None else f"{turns} turns"


def rankings(sims: SimCells) -> dict[Cell, tuple[str, ...]]:
    """Each cell's settings, best first (ties: in the order default, then fewer turns first), on the median over the
    seeds of the cell's measure."""
    out = {}
    names: list[int | None] = [None, *TURNS]
    for cell in CELLS:
        runs = {t: [sims.results[(cell, t, s)] for s in sims.seeds] for t in names}
        by_p99 = cell.kind == "poisson" and all(kept_up(r) for rs in runs.values() for r in rs)
        # The p99 (lower is better), or the served throughput (higher is better), each setting's median.
        score = {
            t: statistics.median(r["p99"] for r in rs) if by_p99 else -statistics.median(r["throughput"] for r in rs)
            for t, rs in runs.items()
        }
        ordered = sorted(names, key=lambda t: (score[t], names.index(t)))
        # Settings that score alike share a place: "16 turns = 32 turns".
        places: list[list[int | None]] = []
        for t in ordered:
            if places and score[places[-1][0]] == score[t]:
                places[-1].append(t)
            else:
                places.append([t])
        out[cell] = tuple(" = ".join(_name(t) for t in place) for place in places)
    return out


def _sides(sims: SimCells) -> dict[tuple[Cell, int, str], int]:
    return {key: sim.sign for key, sim in simulated(sims).items()}


@dataclass(frozen=True)
class Row:
    """One constant at one factor: the value it ran at, the cells whose ranking flipped (old -> new), and the
    ratios whose side of 1 flipped."""

    constant: str
    factor: float
    value: float
    rankings: list[str]
    sides: list[str]


def flips(base: SimCells, other: SimCells) -> tuple[list[str], list[str]]:
    """The rankings and the ratios' sides that differ between two simulations of the decision."""
    before, after = rankings(base), rankings(other)
    ranked = [f"{c.name}: {' > '.join(before[c])} -> {' > '.join(after[c])}" for c in CELLS if before[c] != after[c]]
    old, new = _sides(base), _sides(other)
    sides = [
        f"{t} turns' {metric} in {cell.name} ({SIDE[old[(cell, t, metric)]]} -> {SIDE[new[(cell, t, metric)]]})"
        for (cell, t, metric) in old
        if old[(cell, t, metric)] != new[(cell, t, metric)]
    ]
    return ranked, sides


def sweep(
    costs: Costs,
    cores: float,
    seed: int,
    *,
    duration: float,
    workers: int,
    clock: str,
    progress: Callable[[str], None] | None = None,
    constants: tuple[str, ...] | list[str] = CONSTANTS,
) -> tuple[SimCells, list[Row]]:
    """The decision's simulation at the constants, then with each of ``constants`` (of :data:`CONSTANTS`) at each of
    :data:`FACTORS`."""

    def sim(c: Costs, n: float) -> SimCells:
        return simulate(c, n, (seed,), duration=duration, workers=workers, clock=clock)

    base = sim(costs, cores)
    rows = []
    for name in constants:
        for factor in FACTORS:
            if name == "cores":
                value = max(1.0, cores * factor)
                other = sim(costs, value) if value != cores else base
            else:
                scaled = costs.scaled(name, factor)
                value = getattr(scaled, name)
                other = sim(scaled, cores) if value != getattr(costs, name) else base
            ranked, sides = flips(base, other)
            rows.append(Row(name, factor, value, ranked, sides))
            if progress is not None:
                progress(f"{name} x{factor:g}")
    return base, rows


def render(rows: list[Row], seed: int) -> list[str]:
    lines = [
        f"Each constant at half and at twice its value, the others kept (seed {seed}); a ranking: the four settings "
        "in a cell, best first (`=`: alike); a side: a setting's ratio to the default above 1 or below, or "
        "undecided (a p99 past capacity, or a tie). A constant of 0 scales to 0: nothing to see. The core count "
        "stays one at least.",
        "",
        "| constant | x | value | rankings flipped | sides flipped |",
        "|---|---:|---:|---|---|",
    ]
    for r in rows:
        value = f"{r.value:.3g}" if r.constant in ("cores", "gil", "jitter") else f"{r.value * 1e6:.3g} µs"
        lines.append(f"| {r.constant} | {r.factor:g} | {value} | {'; '.join(r.rankings) or 'none'} | "
                     f"{'; '.join(r.sides) or 'none'} |")  # fmt: skip
    sensitive = sorted({r.constant for r in rows if r.rankings or r.sides}, key=CONSTANTS.index)
    lines += [
        "",
        "Constants whose halving or doubling flips a ranking or a side: "
        + (", ".join(sensitive) if sensitive else "none")
        + ".",
    ]
    return lines
