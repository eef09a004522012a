"""How much the decision hangs on each constant: every constant at half and at twice its value, one at a time.

The decision's simulation (:func:`.validation.simulate`) runs again with one constant scaled (the core count: kept at
one at least), at one seed; in each cell the four settings (the default and each of :data:`~.pairs.TURNS`) are
ranked on the cell's measure (served throughput in a closed loop, or where a setting did not keep up; else the p99),
and each setting's ratio to the default falls on one side of 1 or the other. Figures within :data:`TIE` of each other
(1 %) count as alike: a ranking or a side that moves by less tells nothing a measurement could settle. A constant
the decision is sensitive to flips a ranking, or a ratio's side, when it is halved or doubled: the measurement of
that constant then decides, and its error must be smaller than that.
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
SIDE = {1: "> 1", -1: "< 1"}
#: Figures closer than this (relatively) count as alike.
TIE = 0.01


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
        # Settings that score alike (within TIE of the place's first) share a place: "16 turns = 32 turns".
        places: list[list[int | None]] = []
        for t in ordered:
            if places and abs(score[t] - score[places[-1][0]]) <= TIE * abs(score[places[-1][0]]):
                places[-1].append(t)
            else:
                places.append([t])
        out[cell] = tuple(" = ".join(_name(t) for t in sorted(place, key=names.index)) for place in places)
    return out


def _sides(sims: SimCells) -> dict[tuple[Cell, int, str], int]:
    """Each ratio's side of 1 (0: within :data:`TIE` of it at some seed, or undecided)."""
    out = {}
    for key, sim in simulated(sims).items():
        near = any(abs(r - 1) <= TIE for r in sim.ratios)
        out[key] = 0 if near else sim.sign
    return out


@dataclass(frozen=True)
class Row:
    """One constant at one factor: the value it ran at, the cells whose ranking flipped (old -> new), and the
    ratios whose side of 1 flipped."""

    constant: str
    factor: float
    value: float
    rankings: list[str]
    sides: list[str]


def _reversed(before: tuple[str, ...], after: tuple[str, ...]) -> bool:
    """Whether two settings are in strictly one order in ``before`` and strictly the other in ``after`` (a setting
    that joins or leaves a tie is no reversal)."""

    def places(ranking: tuple[str, ...]) -> dict[str, int]:
        return {name: i for i, place in enumerate(ranking) for name in place.split(" = ")}

    a, b = places(before), places(after)
    return any((a[x] - a[y]) * (b[x] - b[y]) < 0 for x in a for y in a if x < y)


def flips(base: SimCells, other: SimCells) -> tuple[list[str], list[str]]:
    """The rankings in which two settings swap places, and the ratios that move from one side of 1 to the other,
    between two simulations of the decision."""
    before, after = rankings(base), rankings(other)
    ranked = [f"{c.name}: {' > '.join(before[c])} -> {' > '.join(after[c])}" for c in CELLS
              if _reversed(before[c], after[c])]  # fmt: skip
    old, new = _sides(base), _sides(other)
    sides = [
        f"{t} turns' {metric} in {cell.name} ({SIDE[old[(cell, t, metric)]]} -> {SIDE[new[(cell, t, metric)]]})"
        for (cell, t, metric) in old
        if old[(cell, t, metric)] * new[(cell, t, metric)] < 0
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
        f"in a cell, best first (`=`: within {TIE:.0%} of each other), flipped where two settings swap places; a "
        f"side: a setting's ratio to the default above 1 or below it by more than {TIE:.0%}, flipped where it "
        "crosses to the other. A constant of 0 scales to 0: nothing to see. The core count stays one at least.",
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
