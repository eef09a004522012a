"""The tables of ``make bench-policy``'s report (reports/policy.md) and its CSV (reports/policy.csv), from the
verdicts of :mod:`.verdicts` (targets, seeds, UNDECIDED)."""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .runner import Run
from .variants import Variant
from .verdicts import P99_RATIO, PASS, SERVED_RATIO, UNDECIDED, Judged, Verdicts, kept_up, tally

__all__ = [
    "CSV_FIELDS",
    "candidates_table",
    "conflicts",
    "leading",
    "row",
    "scenario_table",
    "serves_table",
    "targets_table",
    "write_csv",
]

CSV_FIELDS = (
    "scenario", "seed", "kind", "variant", "role", "kwargs", "sent", "answered", "p50_ms", "p99_ms", "p999_ms",
    "mean_ms", "throughput", "offered", "items_per_call", "calls", "loop_busy", "open_p99_ms", "closed_throughput",
    "virtual_s", "wall_s", "wall_clock_reads",
)  # fmt: skip


def row(run: Run) -> dict[str, Any]:
    r, s, v = run.result, run.scenario, run.variant

    def ms(x: float | None) -> float | str:
        return "" if x is None or (isinstance(x, float) and math.isnan(x)) else round(x * 1000, 4)

    return {
        "scenario": s.name, "seed": s.seed, "kind": s.kind, "variant": v.name, "role": v.role, "kwargs": v.kwargs,
        "sent": r["sent"], "answered": r["answered"], "p50_ms": ms(r["p50"]), "p99_ms": ms(r["p99"]),
        "p999_ms": ms(r["p999"]), "mean_ms": ms(r["mean"]), "throughput": round(r["throughput"], 2),
        "offered": round(r["offered"], 2), "items_per_call": round(r["items_per_call"], 3), "calls": r["calls"],
        "loop_busy": round(r["loop_busy"], 4), "open_p99_ms": ms(r.get("open_p99")),
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


def _ratio(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def leading(judged: list[Judged], names: list[str], peers: list[str], n: int) -> list[str]:
    """The ``n`` of ``names`` that meet the most targets (ties: in their order)."""
    return sorted(names, key=lambda name: -tally(judged, name, peers)[0])[:n]


def _misses(found: dict[str, str]) -> str:
    """The targets not met: p (p99), s (served), v (a peer better), each with ? where undecided."""
    letters = {"p99": "p", "served": "s", "peers": "v"}
    return "".join(letters[k] + ("?" if v == UNDECIDED else "") for k, v in found.items() if v != PASS)


def candidates_table(judged: list[Judged], names: list[str], peers: list[str]) -> list[str]:
    """Each candidate default: the targets it meets, misses and leaves undecided, by kind, its worst p99 ratio, and
    the scenarios where it misses one (p: p99, s: served throughput, v: a peer better; ? where undecided); the most
    targets met first."""
    lines = [
        f"| candidate | met | missed | undecided | p99 ≤ {P99_RATIO}x | served ≥ {SERVED_RATIO}x | ≥ peers | worst p99 "
        "ratio (scenario) | misses |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    rows = []
    for name in names:
        mine = [j for j in judged if j.has(name)]
        if not mine:
            continue
        per = [(j, j.verdicts(name, peers)) for j in mine]
        cells = []
        for kind in ("p99", "served", "peers"):
            found = [t[kind] for _, t in per if kind in t]
            cells.append(f"{found.count(PASS)}/{len(found)}" if found else "-")
        met, missed, undecided = tally(judged, name, peers)
        ratios = [(j.median("p99_ratio", name), j) for j in mine]
        judged_ratios = [(r, j) for r, j in ratios if r is not None]
        worst = max(judged_ratios, key=lambda t: t[0]) if judged_ratios else None
        worst_cell = "-" if worst is None else f"{worst[0]:.2f} ({worst[1].scenario.name})"
        misses = [f"{j.scenario.name} ({_misses(t)})" for j, t in per if any(v != PASS for v in t.values())]
        line = (f"| {name} | {met} | {missed} | {undecided} | {' | '.join(cells)} | {worst_cell} | "
                f"{', '.join(misses) or '-'} |")  # fmt: skip
        rows.append((-met, missed, line))
    lines += [line for _, _, line in sorted(rows, key=lambda r: (r[0], r[1]))]
    return lines


def targets_table(judged: list[Judged], default: str, peers: list[str]) -> tuple[list[str], tuple[int, int, int]]:
    """The targets' table for ``default``: the first seed's figures, the median ratio over the seeds, and each
    target's verdict over them; and (met, missed, undecided)."""
    lines = [
        f"| scenario | p99 {default} / best of grid (ms) | ratio | ≤ {P99_RATIO}x | served {default} / best of grid "
        f"(req/s) | ratio | ≥ {SERVED_RATIO}x | vs peers | ≥ peers |",
        "|---|---:|---:|:---:|---:|---:|:---:|---|:---:|",
    ]
    for j in judged:
        if not j.has(default):
            continue
        first = j.first
        found = j.verdicts(default, peers)
        r = first.runs[default].result
        best = first.best_p99(default)
        if "p99" in found:
            p99 = f"{_ms(r['p99'])} / {_ms(best.result['p99'])} ({best.variant.name})" if best else "-"
            cells = [p99, _ratio(j.median("p99_ratio", default)), found["p99"]]
        else:
            cells = [f"{_ms(r['p99'])} (past capacity)", "-", "-"]
        served = first.best_served(default)
        cells += [
            f"{r['throughput']:.0f} / {served.result['throughput']:.0f} ({served.variant.name})",
            _ratio(j.median("served_ratio", default), 3),
            found["served"],
        ]
        ran = [p for p in peers if p in first.runs]
        if ran:
            shown = "; ".join(f"{p} {_ms(first.runs[p].result['p99'])} ms, {first.runs[p].result['throughput']:.0f}/s"
                              for p in ran)  # fmt: skip
            cells += [shown, found.get("peers", "-")]
        else:
            cells += ["-", "-"]
        lines.append(f"| {j.scenario.name} | " + " | ".join(cells) + " |")
    return lines, tally(judged, default, peers)


def serves_table(judged: list[Judged], grid: list[Variant], defaults: list[str]) -> list[str]:
    """Each default and setting of the grid: the scenarios it serves (its p99 and served targets PASS), those left
    undecided, and its worst ratios."""
    lines = [
        "| setting | serves | undecided | of | worst p99 ratio (scenario) | worst served ratio (scenario) |",
        "|---|---:|---:|---:|---|---|",
    ]
    rows = []
    for name in [*defaults, *(v.name for v in grid)]:
        mine = [j for j in judged if j.has(name)]
        if not mine:
            continue
        states = [j.serves(name) for j in mine]
        p99s = [(r, j) for j in mine if (r := j.median("p99_ratio", name)) is not None]
        served = [(r, j) for j in mine if (r := j.median("served_ratio", name)) is not None]
        worst_p99 = max(p99s, key=lambda t: t[0]) if p99s else None
        worst_served = min(served, key=lambda t: t[0]) if served else None
        cell = f"**{name}**" if name in defaults else name
        p99_cell = "-" if worst_p99 is None else f"{worst_p99[0]:.2f} ({worst_p99[1].scenario.name})"
        served_cell = "-" if worst_served is None else f"{worst_served[0]:.3f} ({worst_served[1].scenario.name})"
        rows.append((name not in defaults, -states.count(PASS),
                     f"| {cell} | {states.count(PASS)} | {states.count(UNDECIDED)} | {len(mine)} | {p99_cell} | "
                     f"{served_cell} |"))  # fmt: skip
    rows.sort(key=lambda t: (t[0], t[1]))
    return lines + [line for _, _, line in rows]


def conflicts(judged: list[Judged], grid: list[Variant]) -> list[str]:
    """Whether one setting of the grid serves every scenario; if not, which scenarios no setting serves together."""
    served = {v.name: {j.scenario.name for j in judged if j.has(v.name) and j.serves(v.name) == PASS} for v in grid}
    everything = {j.scenario.name for j in judged}
    universal = [name for name, s in served.items() if s == everything]
    if universal:
        return [f"One setting of the grid serves every scenario: {', '.join(universal)}."]
    lines = ["No single setting of the grid serves every scenario (or its seeds leave one undecided)."]
    best = max(served, key=lambda name: len(served[name]))
    misses = [f"{j.scenario.name} ({j.serves(best)})" for j in judged if j.scenario.name not in served[best]]
    lines.append(f"The one that serves the most, **{best}** ({len(served[best])} of {len(everything)}), misses: "
                 + "; ".join(misses) + ".")  # fmt: skip
    by_scenario = {j.scenario.name: {name for name, s in served.items() if j.scenario.name in s} for j in judged}
    names = list(by_scenario)
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]
             if by_scenario[a] and by_scenario[b] and not by_scenario[a] & by_scenario[b]]  # fmt: skip
    if pairs:
        shown = ", ".join(f"{a} / {b}" for a, b in pairs[:12])
        more = f" (and {len(pairs) - 12} more)" if len(pairs) > 12 else ""
        lines.append(f"Pairs of scenarios that no setting serves together: {shown}{more}.")
    unserved = [name for name, s in by_scenario.items() if not s]
    if unserved:
        lines.append(f"Scenarios no setting of the grid serves at every seed: {', '.join(unserved)}.")
    return lines


def scenario_table(x: Verdicts, shown: list[str]) -> list[str]:
    """One scenario at one seed: each shown variant's figures (``kept up``: it served what was sent)."""
    lines = [
        "| variant | p50 (ms) | p99 (ms) | p99.9 (ms) | served req/s | kept up | items/call | loop busy |",
        "|---|---:|---:|---:|---:|:---:|---:|---:|",
    ]
    best_p99, best_served = x.best_p99(), x.best_served()
    for name in shown:
        if name not in x.runs:
            continue
        r = x.runs[name].result
        mark = []
        if best_p99 is not None and x.runs[name] is best_p99:
            mark.append("best p99")
        if x.runs[name] is best_served:
            mark.append("best served")
        label = name + (f" ({', '.join(mark)})" if mark else "")
        lines.append(
            f"| {label} | {_ms(r['p50'])} | {_ms(r['p99'])} | {_ms(r['p999'])} | {r['throughput']:.0f} | "
            f"{'yes' if kept_up(r) else 'no'} | {r['items_per_call']:.1f} | {r['loop_busy']:.0%} |"
        )
    return lines
