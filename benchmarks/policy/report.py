"""The verdicts and the report of ``make bench-policy``: reports/policy.md and reports/policy.csv.

Targets (issue 44), per scenario: the default settings' p99 at most 1.1x the best p99 of the grid; in closed loops,
their throughput at least 0.97x the best of the grid; ours (the recommended settings) at least as good as every peer
(p99 no higher; in closed loops, throughput no lower). A setting of the grid "serves" a scenario where it meets the
first two against that scenario's best; the summary says which scenarios no single setting serves together.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .runner import Run
from .sim.traffic import Scenario
from .variants import Variant

__all__ = [
    "CSV_FIELDS",
    "P99_RATIO",
    "THROUGHPUT_RATIO",
    "Verdicts",
    "candidates_table",
    "judge",
    "leading",
    "met",
    "serves",
    "targets",
    "write_csv",
]

P99_RATIO = 1.1
THROUGHPUT_RATIO = 0.97
CSV_FIELDS = (
    "scenario", "kind", "variant", "role", "kwargs", "sent", "answered", "p50_ms", "p99_ms", "p999_ms", "mean_ms",
    "throughput", "items_per_call", "calls", "loop_busy", "open_p99_ms", "closed_throughput", "virtual_s", "wall_s",
    "wall_clock_reads",
)  # fmt: skip


def _closed(s: Scenario) -> bool:
    return s.kind == "closed"


@dataclass
class Verdicts:
    """One scenario's figures: the grid's best, and each target's verdict for a default (its name -> pass?)."""

    scenario: Scenario
    runs: dict[str, Run]  # by variant name
    best_p99: Run
    best_throughput: Run

    def p99_ratio(self, name: str) -> float:
        return self.runs[name].result["p99"] / self.best_p99.result["p99"]

    def throughput_ratio(self, name: str) -> float:
        return self.runs[name].result["throughput"] / self.best_throughput.result["throughput"]

    def meets(self, name: str) -> bool:
        """The first two targets for this variant (which may be of the grid itself)."""
        ok = self.p99_ratio(name) <= P99_RATIO
        return ok and (not _closed(self.scenario) or self.throughput_ratio(name) >= THROUGHPUT_RATIO)

    def beats(self, name: str, peer: str) -> bool:
        ours, theirs = self.runs[name].result, self.runs[peer].result
        ok = ours["p99"] <= theirs["p99"]
        return ok and (not _closed(self.scenario) or ours["throughput"] >= theirs["throughput"])


def judge(runs: Iterable[Run]) -> list[Verdicts]:
    by_scenario: dict[str, dict[str, Run]] = {}
    order: dict[str, Scenario] = {}
    for run in runs:
        by_scenario.setdefault(run.scenario.name, {})[run.variant.name] = run
        order.setdefault(run.scenario.name, run.scenario)
    out = []
    for name, scenario in order.items():
        named = by_scenario[name]
        grid = [r for r in named.values() if r.variant.role == "grid"]
        if not grid:
            raise ValueError(f"scenario {name}: no setting of the grid ran")
        # Ties go to the grid's first (its order: the least waiting first).
        best_p99 = min(grid, key=lambda r: r.result["p99"])
        best_thr = max(grid, key=lambda r: r.result["throughput"])
        out.append(Verdicts(scenario, named, best_p99, best_thr))
    return out


def serves(verdicts: list[Verdicts], grid: list[Variant]) -> dict[str, list[str]]:
    """For each setting of the grid, the scenarios it serves (meets the first two targets in)."""
    return {v.name: [x.scenario.name for x in verdicts if v.name in x.runs and x.meets(v.name)] for v in grid}


def row(run: Run) -> dict[str, Any]:
    r, s, v = run.result, run.scenario, run.variant

    def ms(x: float | None) -> float | str:
        return "" if x is None or (isinstance(x, float) and math.isnan(x)) else round(x * 1000, 4)

    return {
        "scenario": s.name, "kind": s.kind, "variant": v.name, "role": v.role, "kwargs": v.kwargs,
        "sent": r["sent"], "answered": r["answered"], "p50_ms": ms(r["p50"]), "p99_ms": ms(r["p99"]),
        "p999_ms": ms(r["p999"]), "mean_ms": ms(r["mean"]), "throughput": round(r["throughput"], 2),
        "items_per_call": round(r["items_per_call"], 3), "calls": r["calls"], "loop_busy": round(r["loop_busy"], 4),
        "open_p99_ms": ms(r.get("open_p99")),
        "closed_throughput": "" if r.get("closed_throughput") is None else round(r["closed_throughput"], 2),
        "virtual_s": round(r["virtual_s"], 4), "wall_s": round(r["wall_s"], 3),
        "wall_clock_reads": r["wall_clock_reads"],
    }  # fmt: skip


def write_csv(path: Path, runs: Iterable[Run]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for run in runs:
            writer.writerow(row(run))


def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1000:.2f}"


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def targets(x: Verdicts, name: str, peers: list[str]) -> dict[str, bool]:
    """The targets ``name`` is judged on in scenario ``x``, and whether it meets each: ``p99`` (at most
    :data:`P99_RATIO` x the grid's best), ``throughput`` (closed loops: at least :data:`THROUGHPUT_RATIO` x the grid's
    best), ``peers`` (no peer better, where peers ran)."""
    out = {"p99": x.p99_ratio(name) <= P99_RATIO}
    if _closed(x.scenario):
        out["throughput"] = x.throughput_ratio(name) >= THROUGHPUT_RATIO
    ran = [p for p in peers if p in x.runs]
    if ran:
        out["peers"] = all(x.beats(name, p) for p in ran)
    return out


def met(verdicts: list[Verdicts], name: str, peers: list[str]) -> tuple[int, int]:
    """The targets ``name`` meets, and those it is judged on, over every scenario it ran in."""
    per = [targets(x, name, peers) for x in verdicts if name in x.runs]
    return sum(sum(t.values()) for t in per), sum(len(t) for t in per)


def leading(verdicts: list[Verdicts], names: list[str], peers: list[str], n: int) -> list[str]:
    """The ``n`` of ``names`` that meet the most targets (ties: in their order)."""
    return sorted(names, key=lambda name: -met(verdicts, name, peers)[0])[:n]


def candidates_table(verdicts: list[Verdicts], names: list[str], peers: list[str]) -> list[str]:
    """Each candidate default: the targets it meets of those judged, by kind, and the scenarios where it misses one
    (p: p99, t: req/s, v: a peer better); the most targets met first."""
    lines = [
        f"| candidate | targets met | p99 ≤ {P99_RATIO}x | req/s ≥ {THROUGHPUT_RATIO}x | ≥ peers | worst p99 ratio "
        "(scenario) | misses |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    rows = []
    for name in names:
        judged = [x for x in verdicts if name in x.runs]
        if not judged:
            continue
        per = [(x, targets(x, name, peers)) for x in judged]
        kinds = {k: [t[k] for _, t in per if k in t] for k in ("p99", "throughput", "peers")}
        met = sum(sum(v) for v in kinds.values())
        total = sum(len(v) for v in kinds.values())
        worst = max(judged, key=lambda x: x.p99_ratio(name))
        misses = [
            f"{x.scenario.name} ({''.join(k[0] if k != 'peers' else 'v' for k, ok in t.items() if not ok)})"
            for x, t in per
            if not all(t.values())
        ]
        cells = [f"{sum(v)}/{len(v)}" if v else "-" for v in kinds.values()]
        worst_cell = f"{worst.p99_ratio(name):.2f} ({worst.scenario.name})"
        line = f"| {name} | {met} of {total} | {' | '.join(cells)} | {worst_cell} | {', '.join(misses) or '-'} |"
        rows.append((-met, line))
    lines += [line for _, line in sorted(rows, key=lambda r: r[0])]
    return lines


def targets_table(verdicts: list[Verdicts], default: str, peers: list[str]) -> tuple[list[str], int, int]:
    """The targets' table for ``default``; (lines, targets met, targets judged)."""
    lines = [
        f"| scenario | p99 {default} / best of grid (ms) | ratio | ≤ {P99_RATIO}x | req/s {default} / best of grid "
        f"| ratio | ≥ {THROUGHPUT_RATIO}x | vs peers (p99{'; req/s in closed loops' if peers else ''}) | ≥ peers |",
        "|---|---:|---:|:---:|---:|---:|:---:|---|:---:|",
    ]
    met = judged = 0
    for x in verdicts:
        if default not in x.runs:
            continue
        r = x.runs[default].result
        p99_ok = x.p99_ratio(default) <= P99_RATIO
        met, judged = met + p99_ok, judged + 1
        cells = [
            x.scenario.name,
            f"{_ms(r['p99'])} / {_ms(x.best_p99.result['p99'])} ({x.best_p99.variant.name})",
            f"{x.p99_ratio(default):.2f}",
            _verdict(p99_ok),
        ]
        if _closed(x.scenario):
            thr_ok = x.throughput_ratio(default) >= THROUGHPUT_RATIO
            met, judged = met + thr_ok, judged + 1
            cells += [
                f"{r['throughput']:.0f} / {x.best_throughput.result['throughput']:.0f} "
                f"({x.best_throughput.variant.name})",
                f"{x.throughput_ratio(default):.3f}",
                _verdict(thr_ok),
            ]
        else:
            cells += ["-", "-", "-"]
        ran = [p for p in peers if p in x.runs]
        if ran:
            parts = []
            for p in ran:
                pr = x.runs[p].result
                part = f"{p} {_ms(pr['p99'])} ms"
                if _closed(x.scenario):
                    part += f", {pr['throughput']:.0f}/s"
                parts.append(part)
            beats = all(x.beats(default, p) for p in ran)
            met, judged = met + beats, judged + 1
            cells += ["; ".join(parts), _verdict(beats)]
        else:
            cells += ["-", "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines, met, judged


def serves_table(verdicts: list[Verdicts], grid: list[Variant], defaults: list[str]) -> list[str]:
    """Each setting of the grid (and each default): the scenarios it serves, and its worst miss."""
    lines = [
        "| setting | serves | of | worst p99 ratio (scenario) | worst req/s ratio, closed loops (scenario) |",
        "|---|---:|---:|---|---|",
    ]
    rows = []
    for name in [*defaults, *(v.name for v in grid)]:
        judged = [x for x in verdicts if name in x.runs]
        if not judged:
            continue
        served = sum(x.meets(name) for x in judged)
        worst_p99 = max(judged, key=lambda x: x.p99_ratio(name))
        closed = [x for x in judged if _closed(x.scenario)]
        worst_thr = min(closed, key=lambda x: x.throughput_ratio(name)) if closed else None
        thr = "-" if worst_thr is None else f"{worst_thr.throughput_ratio(name):.3f} ({worst_thr.scenario.name})"
        cell = f"**{name}**" if name in defaults else name
        rows.append((name not in defaults, -served, name, cell, served, len(judged), worst_p99, thr))
    rows.sort(key=lambda t: (t[0], t[1]))
    for _, _, name, cell, served, total, worst, thr in rows:
        lines.append(f"| {cell} | {served} | {total} | {worst.p99_ratio(name):.2f} ({worst.scenario.name}) | {thr} |")
    return lines


def conflicts(verdicts: list[Verdicts], grid: list[Variant]) -> list[str]:
    """Whether one setting of the grid serves every scenario; if not, which scenarios no setting serves together."""
    served = serves(verdicts, grid)
    everything = {x.scenario.name for x in verdicts}
    universal = [name for name, s in served.items() if set(s) == everything]
    if universal:
        return [f"One setting of the grid serves every scenario: {', '.join(universal)}."]
    lines = ["No single setting of the grid serves every scenario."]
    best = max(served, key=lambda name: len(served[name]))
    missed = [x for x in verdicts if not x.meets(best)]
    misses = []
    for x in missed:
        miss = f"{x.scenario.name} (p99 {x.p99_ratio(best):.2f}x the best, {x.best_p99.variant.name}"
        if _closed(x.scenario):
            miss += f"; req/s {x.throughput_ratio(best):.3f}x, {x.best_throughput.variant.name}"
        misses.append(miss + ")")
    lines.append(
        f"The one that serves the most, **{best}** ({len(served[best])} of {len(everything)}), misses: "
        + "; ".join(misses)
        + "."
    )
    by_scenario = {x.scenario.name: {name for name, s in served.items() if x.scenario.name in s} for x in verdicts}
    pairs = [
        (a, b)
        for i, a in enumerate(by_scenario)
        for b in list(by_scenario)[i + 1 :]
        if by_scenario[a] and by_scenario[b] and not by_scenario[a] & by_scenario[b]
    ]
    if pairs:
        shown = ", ".join(f"{a} / {b}" for a, b in pairs[:12])
        more = f" (and {len(pairs) - 12} more)" if len(pairs) > 12 else ""
        lines.append(f"Pairs of scenarios that no setting serves together: {shown}{more}.")
    unserved = [name for name, s in by_scenario.items() if not s]
    if unserved:
        lines.append(f"Scenarios no setting of the grid serves (the best p99 and the best req/s from two settings "
                     f"that each miss the other): {', '.join(unserved)}.")  # fmt: skip
    return lines


def scenario_table(x: Verdicts, shown: list[str]) -> list[str]:
    lines = [
        "| variant | p50 (ms) | p99 (ms) | p99.9 (ms) | req/s | items/call | loop busy |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name in shown:
        if name not in x.runs:
            continue
        r = x.runs[name].result
        mark = []
        if x.runs[name] is x.best_p99:
            mark.append("best p99")
        if _closed(x.scenario) and x.runs[name] is x.best_throughput:
            mark.append("best req/s")
        label = name + (f" ({', '.join(mark)})" if mark else "")
        lines.append(
            f"| {label} | {_ms(r['p50'])} | {_ms(r['p99'])} | {_ms(r['p999'])} | {r['throughput']:.0f} | "
            f"{r['items_per_call']:.1f} | {r['loop_busy']:.0%} |"
        )
    return lines
