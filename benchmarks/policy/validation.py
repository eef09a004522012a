"""The decision itself, simulated and checked against the real server: ``python -m benchmarks.policy.validation``
prints the table (the real pairs of ``benchmarks/policy/measured/turns-*.csv`` beside the simulator's ratios) and the
verdict; ``make bench-policy`` puts them in its report.

The simulator answers the same question as the real pairs (:mod:`.pairs`): at 0, 4, 16 and 32 turns, against the
default, in each :data:`~.pairs.CELLS` cell, the ratio of the served throughput and of the p99. The open loop's
rates are fractions of the simulated default's open-loop capacity, found as the real rig finds the real one (a ramp
of Poisson steps from a fifth of its closed-loop maximum, each 1.25x the last, up to a median latency 5x the lowest
before). Every cell runs at each seed; a ratio whose seeds disagree on its side of 1 is **undecided**, and so is a
p99 past capacity (a run that served less than :data:`~.verdicts.KEEP_UP` of what was sent: its p99 grows with the run's
length).

The simulator **agrees** where every real ratio that is significant has a simulated ratio, decided, on the same
side of 1. It is **decision-grade** where it agrees, each cell has at least :data:`~.pairs.MIN_PAIRS` real pairs and
at least one real ratio is significant (else nothing checks it); until then the report says "not decision-grade",
and the defaults are chosen from the paired real runs (:func:`real_verdicts`).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.openloop.report import p_text
from benchmarks.peers.__main__ import KNEE, RAMP_FROM, RAMP_STEP

from . import costs as costs_file
from .pairs import CELLS, METRICS, MIN_PAIRS, REAL_CLOSED, REAL_OPEN, TURNS, Cell, Paired, default_policy, paired, read
from .runner import Run, interpreters, run_all
from .sim.server import Costs
from .sim.traffic import Scenario
from .variants import RECOMMENDED, Variant, turns_variant
from .verdicts import kept_up

__all__ = [
    "Agreement",
    "SimCells",
    "Simulated",
    "agreement",
    "decision_lines",
    "main",
    "ramp_capacity",
    "real_verdicts",
    "render",
    "simulate",
]

#: Virtual seconds of each step of the simulated ramp (the real ramp's steps: 5 s, after 1 s of warm-up).
RAMP_SECONDS = 5.0
_PEERS_DIR = Path(".cache/peers")  # (ours only: no peer's environment is needed)


def _variant(turns: int | None) -> Variant:
    return RECOMMENDED if turns is None else turns_variant(turns)


@dataclass
class SimCells:
    """The simulator's runs of the decision: ``results[(cell, turns, seed)]`` (turns None: the default), the
    default's simulated open-loop capacity and the ramp that found it (rate, p50)."""

    results: dict[tuple[Cell, int | None, int], dict[str, Any]]
    seeds: tuple[int, ...]
    capacity: float
    ramp: list[tuple[float, float]] = field(default_factory=list)


def ramp_capacity(top: float, p50s: Sequence[float], rates: Sequence[float]) -> float:
    """The real rig's rule (``benchmarks.peers``): the last rate before the first step whose median latency passed
    ``KNEE`` times the lowest median before it; the last rate if none did. ``top`` is returned for an empty ramp."""
    if not rates:
        return top
    for i in range(1, len(rates)):
        if p50s[i] > KNEE * min(p50s[:i]):
            return rates[i - 1]
    return rates[-1]


def _ramp_rates(top: float) -> list[float]:
    rates, rate = [], RAMP_FROM * top
    while rate < top:
        rates.append(rate)
        rate *= RAMP_STEP
    return [*rates, top]


def simulate(
    costs: Costs,
    cores: float,
    seeds: tuple[int, ...],
    *,
    duration: float = 10.0,
    workers: int = 2,
    clock: str = "uvloop",
) -> SimCells:
    """Every cell at every seed for the default and each of :data:`~.pairs.TURNS`; the open loop's rates from the
    simulated ramp (module docstring)."""
    pythons, _ = interpreters({"ours"}, _PEERS_DIR)
    warmup = duration / 10
    names: list[int | None] = [None, *TURNS]

    def runs(pairs: list[tuple[Scenario, Variant]]) -> list[Run]:
        return run_all(pairs, costs, pythons, workers, clock=clock, cores=cores)

    results: dict[tuple[Cell, int | None, int], dict[str, Any]] = {}
    keys: list[tuple[Cell, int | None, int]] = []
    pairs: list[tuple[Scenario, Variant]] = []
    for cell in (c for c in CELLS if c.kind == "closed"):
        for seed in seeds:
            for t in names:
                scenario = Scenario(f"validation-closed-{cell.level:g}", "closed", clients=int(cell.level),
                                    duration=duration, warmup=warmup, seed=seed)  # fmt: skip
                keys.append((cell, t, seed))
                pairs.append((scenario, _variant(t)))
    for key, run in zip(keys, runs(pairs), strict=True):
        results[key] = run.result
    top = max(
        sorted(results[(c, None, s)]["throughput"] for s in seeds)[len(seeds) // 2] for c in CELLS if c.kind == "closed"
    )
    rates = _ramp_rates(top)
    ramp_runs = runs([
        (Scenario(f"validation-ramp-{i}", "open", rate=rate, duration=RAMP_SECONDS + 1, warmup=1.0, seed=9_000_000 + i),
         RECOMMENDED)
        for i, rate in enumerate(rates)
    ])  # fmt: skip
    p50s = [r.result["p50"] for r in ramp_runs]
    capacity = ramp_capacity(top, p50s, rates)
    keys, pairs = [], []
    for cell in (c for c in CELLS if c.kind == "poisson"):
        for seed in seeds:
            for t in names:
                scenario = Scenario(f"validation-poisson-{cell.level:.0%}", "open", rate=cell.level * capacity,
                                    duration=duration, warmup=warmup, seed=seed)  # fmt: skip
                keys.append((cell, t, seed))
                pairs.append((scenario, _variant(t)))
    for key, run in zip(keys, runs(pairs), strict=True):
        results[key] = run.result
    return SimCells(results, seeds, capacity, list(zip(rates, p50s, strict=True)))


@dataclass(frozen=True)
class Simulated:
    """One variant against the default in one cell, on one metric, at each seed: the ratios (NaN: a p99 past
    capacity), and their side of 1: +1 or -1 where every seed agrees, 0 (undecided) else."""

    cell: Cell
    turns: int
    metric: str
    ratios: list[float]

    @property
    def sign(self) -> int:
        if not self.ratios or any(math.isnan(r) for r in self.ratios):
            return 0
        if all(r > 1 for r in self.ratios):
            return 1
        if all(r < 1 for r in self.ratios):
            return -1
        return 0


def simulated(sims: SimCells) -> dict[tuple[Cell, int, str], Simulated]:
    out = {}
    for cell in CELLS:
        for t in TURNS:
            served, p99 = [], []
            for seed in sims.seeds:
                mine, ref = sims.results[(cell, t, seed)], sims.results[(cell, None, seed)]
                served.append(mine["throughput"] / ref["throughput"] if ref["throughput"] > 0 else math.nan)
                within = kept_up(mine) and kept_up(ref)
                p99.append(mine["p99"] / ref["p99"] if within and ref["p99"] > 0 else math.nan)
            out[(cell, t, "served")] = Simulated(cell, t, "served", served)
            out[(cell, t, "p99")] = Simulated(cell, t, "p99", p99)
    return out


@dataclass(frozen=True)
class Agreement:
    """The verdict on the simulator: decision-grade or not, and why."""

    decision_grade: bool
    reasons: list[str]
    checked: int  # significant real ratios
    agreed: int


def agreement(real: list[Paired], sims: dict[tuple[Cell, int, str], Simulated]) -> Agreement:
    reasons = []
    measured = any(p.ratios for p in real)
    if not measured:
        reasons.append("no paired real runs to check it against (`python -m benchmarks.policy.validate`)")
    short = [c.name for c in CELLS if min((len(p.ratios) for p in real if p.cell == c and p.metric == "served"),
                                          default=0) < MIN_PAIRS]  # fmt: skip
    if measured and short:
        reasons.append(f"fewer than {MIN_PAIRS} real pairs in {', '.join(short)}")
    significant = [p for p in real if p.significant]
    if measured and not significant:
        reasons.append("no real ratio is significant: nothing tells the simulator's right from wrong")
    wrong = [p for p in significant if sims[(p.cell, p.turns, p.metric)].sign != p.sign]
    if wrong:
        shown = ", ".join(f"{p.turns} turns' {p.metric} in {p.cell.name}" for p in wrong)
        reasons.append(f"it disagrees with {len(wrong)} of the {len(significant)} significant real ratios ({shown})")
    return Agreement(not reasons, reasons, len(significant), len(significant) - len(wrong))


def real_verdicts(real: list[Paired]) -> dict[int, tuple[list[str], list[str]]]:
    """For each of :data:`~.pairs.TURNS`: where the real pairs say it is significantly better than the default
    (served higher, p99 lower), and where significantly worse."""
    out: dict[int, tuple[list[str], list[str]]] = {}
    for t in TURNS:
        better: list[str] = []
        worse: list[str] = []
        for p in real:
            if p.turns != t or not p.significant:
                continue
            good = p.sign > 0 if p.metric == "served" else p.sign < 0
            (better if good else worse).append(f"{p.metric} in {p.cell.name}")
        out[t] = (better, worse)
    return out


def _side(sim: Simulated) -> str:
    """Where the simulated ratios lie: above 1, below, exactly 1 (the control runs as the default does), past
    capacity, or undecided (the seeds disagree)."""
    if sim.sign:
        return "> 1" if sim.sign > 0 else "< 1"
    if any(math.isnan(r) for r in sim.ratios):
        return "past capacity"
    return "= 1" if sim.ratios and all(r == 1 for r in sim.ratios) else "undecided"


def _ratios(values: list[float]) -> str:
    if not values:
        return "-"
    shown = sorted(v for v in values if not math.isnan(v))
    if not shown:
        return "past capacity"
    mid = shown[len(shown) // 2]
    return f"{mid:.3f} ({shown[0]:.3f}-{shown[-1]:.3f})" if len(shown) > 1 else f"{mid:.3f}"


def render(real: list[Paired], sims: SimCells, default_policy: str) -> tuple[list[str], Agreement]:
    """The validation table, the verdict on the simulator, and the real runs' verdict on the turns."""
    table = simulated(sims)
    verdict = agreement(real, table)
    by_key = {(p.cell, p.turns, p.metric): p for p in real}
    lines = [
        f"The default: `{default_policy}`. Each row: a number of turns against the default in one cell; real: the "
        "ratios of the interleaved pairs (median, range), in how many pairs it was higher and lower, and the sign "
        f"test's two-sided p (**bold**: below {0.05:g}, significant); simulated: the ratio at each seed "
        f"({', '.join(map(str, sims.seeds))}; median and range), and its side of 1 (undecided where the seeds "
        "disagree; a p99 past capacity is not compared); ✓ where a significant real ratio has a simulated one on "
        "its side, ✗ where not.",
        "",
        "| cell | turns | metric | real ratio | higher / lower | p | simulated ratio | side | agrees |",
        "|---|---:|---|---:|---:|---:|---:|---|:---:|",
    ]
    for cell in CELLS:
        for t in TURNS:
            for metric in METRICS:
                p = by_key.get((cell, t, metric))
                sim = table[(cell, t, metric)]
                if p is None or not (p.higher + p.lower):
                    real_cells = [_ratios(p.ratios) if p else "-", "-", "-"]
                    mark = ""
                else:
                    p_cell = p_text(p.p)
                    real_cells = [_ratios(p.ratios), f"{p.higher} / {p.lower} of {len(p.ratios)}",
                                  f"**{p_cell}**" if p.significant else p_cell]  # fmt: skip
                    mark = ("✓" if sim.sign == p.sign else "✗") if p.significant else ""
                lines.append(f"| {cell.name} | {t} | {metric} | {' | '.join(real_cells)} | {_ratios(sim.ratios)} | "
                             f"{_side(sim)} | {mark} |")  # fmt: skip
    ramp = ", ".join(f"{rate:.0f}/s p50 {p50 * 1e3:.2f} ms" for rate, p50 in sims.ramp)
    lines += ["", f"Simulated open-loop capacity of the default: {sims.capacity:.0f} requests a second (ramp: {ramp})."]
    return lines, verdict


def decision_lines(real: list[Paired], verdict: Agreement, default_turns: int) -> list[str]:
    """The report's prose on the decision, from the data: whether the simulator is decision-grade, and what the
    paired real runs say of each number of turns against the default."""
    if verdict.decision_grade:
        lines = [
            f"**Decision-grade**: the simulator agrees with all {verdict.checked} significant real ratios of the "
            "validation (each cell with enough pairs). Its verdicts on the turns hold where the real ones were "
            "measured."
        ]
    else:
        lines = [
            "**Not decision-grade**: " + "; ".join(verdict.reasons) + ". The simulator's verdicts are not "
            "evidence for a default; the defaults are chosen from the paired real runs."
        ]
    if not any(p.ratios for p in real):
        lines += ["", "No paired real runs yet: no default is decided by this report."]
        return lines
    lines += ["", f"What the paired real runs say against the default ({default_turns} turns):", ""]
    favoured = []
    for t, (better, worse) in real_verdicts(real).items():
        control = t == default_turns
        name = f"{t} turns" + (" (the default's own, on a server of its own: a control)" if control else "")
        if not better and not worse:
            lines.append(f"- {name}: no significant difference in any cell.")
            continue
        lines.append(f"- {name}: better in {', '.join(better) or 'no cell'}; worse in {', '.join(worse) or 'no cell'}.")
        if control:
            lines.append("  The control differs from the default: the rig, not the setting, made that difference, and "
                         "the other rows may hold as much of it.")  # fmt: skip
        elif better and not worse:
            favoured.append(t)
    lines.append("")
    if favoured:
        lines.append(
            f"The paired real runs favour {' or '.join(f'{t} turns' for t in favoured)} over the default: better "
            "somewhere, worse nowhere they measured."
        )
    else:
        lines.append(
            f"The paired real runs favour no other number of turns over the default's {default_turns}: none is "
            "better somewhere and worse nowhere."
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.policy.validation", description=__doc__.splitlines()[0])
    parser.add_argument("--closed", type=Path, default=REAL_CLOSED, help="the real runs' closed-loop steps")
    parser.add_argument("--open", type=Path, default=REAL_OPEN, help="the real runs' open-loop steps")
    parser.add_argument("--costs", type=Path, default=costs_file.COSTS)
    parser.add_argument("--cores", type=float, help="the simulation's cores (default: the fitted count, else 1)")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--duration", type=float, default=10.0, help="virtual seconds per simulation")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--clock", default="uvloop", choices=("uvloop", "asyncio"))
    args = parser.parse_args(argv)
    costs = costs_file.load(args.costs)
    cores = args.cores or costs_file.fitted_cores(args.costs) or 1.0
    seeds = tuple(int(s) for s in args.seeds.split(","))
    real = paired(*read(args.closed, args.open))
    sims = simulate(costs, cores, seeds, duration=args.duration, workers=args.workers, clock=args.clock)
    policy, turns = default_policy()
    lines, verdict = render(real, sims, policy)
    print("\n".join([*lines, "", *decision_lines(real, verdict, turns)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
