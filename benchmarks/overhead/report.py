"""Medians, ratios and targets from the raw runs; the Markdown report, the CSV and the bar chart."""

from __future__ import annotations

import csv
import os
import platform
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "CSV_FIELDS",
    "Cell",
    "Target",
    "aggregate",
    "evaluate_targets",
    "markdown",
    "write_csv",
    "write_png",
]

THROUGHPUT_SHAPES = ("burst", "steady", "bulk")
# How the implementations that live in the benchmark's own interpreter are driven (peers: peers.PEERS).
LOCAL_WIRING = {
    "direct": "each caller awaits the batch function on its own one-item list (no batching): the cost of "
    "the callers themselves. Bulk: the list cut into 256-item calls.",
    "floor": "the least an asyncio batcher can do, written in the benchmark (`worker.Floor`): a list of "
    "(item, future) pairs, a flush scheduled for the next loop iteration by the first item or started at "
    "once by the 256th, one call per batch, results set on the futures; no timer, no statistics, no limits. "
    "Bulk: every item through the same path, then each future awaited.",
    "ours": "`async_batcher.AsyncBatcher` from this repository; bulk: `process_many`.",
}
CSV_FIELDS = (
    "repeat",
    "impl",
    "version",
    "shape",
    "loop",
    "items",
    "inner",
    "seconds",
    "items_per_s",
    "cpu_seconds",
    "batches",
    "mean_batch",
    "direct_us",
    "through_us",
    "added_us",
    "python",
    "uvloop",
    "skipped",
    "error",
)


@dataclass(frozen=True)
class Cell:
    """The median of the successful repeats of one (implementation, shape, loop), and their spread."""

    median: float
    low: float
    high: float
    n: int

    @property
    def spread(self) -> float:
        return (self.high - self.low) / self.median if self.median else 0.0


Key = tuple[str, str, str]  # (impl, shape, loop)


def aggregate(rows: Iterable[dict[str, Any]], *, per_cpu: bool = False) -> dict[Key, Cell]:
    """items/s for the throughput shapes, added µs per item for latency.

    ``per_cpu``: items per second of the worker's own CPU time instead (throughput shapes only). On a shared
    machine the wall clock also counts the time other processes held the CPU; the CPU clock does not (but it
    does not count a batcher's deliberate waits on its timer either).
    """
    values: dict[Key, list[float]] = {}
    for row in rows:
        if "error" in row or "skipped" in row or (per_cpu and row["shape"] == "latency"):
            continue
        if row["shape"] == "latency":
            value = float(row["added_us"])
        elif per_cpu:
            value = float(row["items"]) / float(row["cpu_seconds"])
        else:
            value = float(row["items_per_s"])
        values.setdefault((row["impl"], row["shape"], row["loop"]), []).append(value)
    return {k: Cell(statistics.median(v), min(v), max(v), len(v)) for k, v in values.items()}


@dataclass(frozen=True)
class Target:
    what: str
    loop: str
    measured: float | None  # None: could not be measured in this run
    bound: float
    higher_is_better: bool
    unit: str

    @property
    def verdict(self) -> str:
        if self.measured is None:
            return "not measured"
        ok = self.measured >= self.bound if self.higher_is_better else self.measured <= self.bound
        return "PASS" if ok else "FAIL"


def _ratio(cells: dict[Key, Cell], a: str, b: str, shape: str, loop: str) -> float | None:
    ca, cb = cells.get((a, shape, loop)), cells.get((b, shape, loop))
    return ca.median / cb.median if ca and cb and cb.median else None


def evaluate_targets(cells: dict[Key, Cell], loops: list[str]) -> list[Target]:
    """The targets the overhead benchmark checks our batcher against."""
    out: list[Target] = []
    for loop in loops:
        out.append(Target("steady ≥ 0.8 x floor", loop, _ratio(cells, "ours", "floor", "steady", loop), 0.8, True, "x"))
        old = _ratio(cells, "ours", "async-batcher-0.2.2", "steady", loop)
        out.append(Target("steady ≥ 2.5 x async-batcher 0.2.2", loop, old, 2.5, True, "x"))
        out.append(Target("burst ≥ 0.9 x floor", loop, _ratio(cells, "ours", "floor", "burst", loop), 0.9, True, "x"))
    bulk = cells.get(("ours", "bulk", "asyncio"))
    out.append(
        Target("process_many ≥ 1 000 000 items/s", "asyncio", bulk.median if bulk else None, 1e6, True, "items/s")
    )
    for loop in loops:
        lat = cells.get(("ours", "latency", loop))
        out.append(
            Target(
                "single caller, max_queue_time=0: added latency ≤ 50 µs",
                loop,
                lat.median if lat else None,
                50.0,
                False,
                "µs",
            )
        )
    return out


def _fmt_rate(v: float) -> str:
    return f"{v:,.0f}".replace(",", " ")


def _fmt_target(t: Target) -> str:
    if t.measured is None:
        return "—"
    if t.unit == "x":
        return f"{t.measured:.2f} x"
    if t.unit == "µs":
        return f"{t.measured:.1f} µs"
    return f"{_fmt_rate(t.measured)} {t.unit}"


def _table(header: list[str], body: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return lines


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def tables(
    cells: dict[Key, Cell], cpu_cells: dict[Key, Cell], impls: list[str], loops: list[str], repeats: int
) -> list[str]:
    """The tables the report and the console share."""
    cols = [(s, lp) for s in THROUGHPUT_SHAPES for lp in loops]
    head = ["implementation", *[f"{s} · {lp}" for s, lp in cols]]
    out = [f"### Throughput, items/s (median of {repeats} runs, each in a fresh process)", ""]

    def cell(impl: str, s: str, lp: str) -> str:
        c = cells.get((impl, s, lp))
        return _fmt_rate(c.median) if c else "n/a"

    out += _table(head, [[impl, *[cell(impl, s, lp) for s, lp in cols]] for impl in impls])
    out += [
        "",
        "### Throughput per CPU second, items/s (cross-check: the worker's own CPU time, which other processes",
        "on a shared machine do not inflate, but which leaves out waiting on a timer)",
        "",
    ]
    out += _table(
        head,
        [
            [impl, *[_fmt_rate(c.median) if (c := cpu_cells.get((impl, s, lp))) else "n/a" for s, lp in cols]]
            for impl in impls
        ],
    )
    out += ["", "### Relative to the floor (implementation ÷ floor; above 1 is faster than the floor)", ""]

    def rel(a: str, b: str, s: str, lp: str) -> str:
        r = _ratio(cells, a, b, s, lp)
        return f"{r:.2f}" if r is not None else "n/a"

    out += _table(head, [[impl, *[rel(impl, "floor", s, lp) for s, lp in cols]] for impl in impls])
    peers = [i for i in impls if i not in ("direct", "floor", "ours")]
    if "ours" in impls and peers:
        out += ["", "### Ours relative to each peer (ours ÷ peer; above 1: ours is faster)", ""]
        out += _table(["peer", *head[1:]], [[p, *[rel("ours", p, s, lp) for s, lp in cols]] for p in peers])
    lat_impls = [i for i in impls if i != "direct"]
    if any((i, "latency", lp) in cells for i in lat_impls for lp in loops):
        out += [
            "",
            "### Added latency, one caller awaiting one item at a time, max_queue_time=0",
            "",
            "Median per item of (time through the batcher - time of a direct `await process_batch([x])`),",
            "in µs.",
            "",
        ]
        body = []
        for impl in lat_impls:
            row = [impl]
            for lp in loops:
                c = cells.get((impl, "latency", lp))
                row.append(f"{c.median:.1f}" if c else "n/a")
            body.append(row)
        out += _table(["implementation", *[f"added µs · {lp}" for lp in loops]], body)
    out += ["", "### Spread ((max - min) ÷ median over the repeats)", ""]
    shapes_all = [*THROUGHPUT_SHAPES, "latency"]
    scols = [(s, lp) for s in shapes_all for lp in loops]

    def spread(impl: str, s: str, lp: str) -> str:
        c = cells.get((impl, s, lp))
        return f"{c.spread:.0%}" if c and s != "latency" else (f"{c.low:.1f}-{c.high:.1f}" if c else "n/a")

    out += _table(
        ["implementation", *[f"{s} · {lp}" for s, lp in scols]],
        [[impl, *[spread(impl, s, lp) for s, lp in scols]] for impl in impls],
    )
    out += ["", "(latency columns give the min-max of the per-run medians, µs)"]
    return out


def target_table(targets: list[Target], by_cpu: list[Target]) -> list[str]:
    """The verdict goes by the wall clock; ``by_cpu`` (the same targets on CPU-time medians) is a cross-check."""
    cpu = {(t.what, t.loop): t for t in by_cpu}

    def cross(t: Target) -> str:
        c = cpu.get((t.what, t.loop))
        return f"{_fmt_target(c)} ({c.verdict})" if c is not None and c.measured is not None else "—"

    return _table(
        ["target", "loop", "measured (wall clock)", "verdict", "cross-check: by CPU time"],
        [[t.what, t.loop, _fmt_target(t), t.verdict, cross(t)] for t in targets],
    )


def _floor_reference(cells: dict[Key, Cell], loops: list[str]) -> list[str]:
    """How far the floor itself is from async-batcher 0.2.2: the most any batcher can reach on that target."""
    parts = [
        f"{r:.2f} x ({lp})"
        for lp in loops
        if (r := _ratio(cells, "floor", "async-batcher-0.2.2", "steady", lp)) is not None
    ]
    if not parts:
        return []
    return [f"For scale: in steady, the floor itself is {', '.join(parts)} async-batcher 0.2.2.", ""]


def summary(rows: list[dict[str, Any]], impls: list[str], loops: list[str], repeats: int) -> list[str]:
    """The targets and every table: what the console shows and the heart of the report."""
    cells = aggregate(rows)
    targets = evaluate_targets(cells, loops)
    met = sum(t.verdict == "PASS" for t in targets)
    return [
        "## Targets",
        "",
        *target_table(targets, evaluate_targets(aggregate(rows, per_cpu=True), loops)),
        "",
        f"**{met} of {len(targets)} targets met** (verdicts by the wall-clock medians).",
        "",
        *_floor_reference(cells, loops),
        "## Results",
        "",
        *tables(cells, aggregate(rows, per_cpu=True), impls, loops, repeats),
    ]


def markdown(
    *,
    rows: list[dict[str, Any]],
    impls: list[str],
    loops: list[str],
    repeats: int,
    sizes_text: str,
    command: str,
    date: str,
    wiring: dict[str, str],
    missing: dict[str, str],
    context: Sequence[str] = (),
) -> str:
    versions: dict[str, str] = {}
    uvloop = python = "?"
    for row in rows:
        if "version" in row:
            versions[row["impl"]] = row["version"]
        uvloop = row.get("uvloop", uvloop)
        python = row.get("python", python)
    lines = [
        "# Overhead benchmark: the batcher's own cost",
        "",
        f"- Command: `{command}`",
        f"- Date: {date}",
        f"- Machine: {cpu_model()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}",
        f"- Python {python} for all, each peer in a venv of its own; uvloop {uvloop}",
        "- Versions: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())),
        *[f"- {line}" for line in context],
        "",
        "Numbers taken on a shared machine are noisy (see the spread table); compare ratios within one run, "
        "not absolute numbers across runs.",
        "",
        "## Workload",
        "",
        "The batch function does next to nothing (`[x * 2 for x in batch]`, async), so what is measured is "
        "the batcher's own cost. max_batch_size=256, max_queue_time=0.001 s. " + sizes_text,
        "Each worker checks that every caller got `2 * x` for its own `x`; a run that mixes results fails.",
        "",
        *[f"- **{name}**: {note}" for name, note in LOCAL_WIRING.items() if name in impls],
        *[f"- **{name}**: {note}" for name, note in wiring.items()],
        "",
        "Every implementation runs in a fresh process per (implementation, shape, loop, repeat), round-robin "
        "over the implementations with the order rotating each repeat. In its process, after an untimed "
        "warm-up, a worker times burst and steady 3 times (fewer once 0.5 s is spent) and reports the "
        "median (bulk once); the tables give the median over the processes.",
        "",
        *summary(rows, impls, loops, repeats),
    ]
    errors = [r for r in rows if "error" in r]
    if missing or errors:
        lines += ["", "## Not measured", ""]
        lines += [f"- {name}: {why}" for name, why in missing.items()]
        lines += [f"- {r['impl']} {r['shape']} {r['loop']} repeat {r['repeat']}: {r['error']}" for r in errors]
    lines += ["", "Raw runs: `overhead.csv`; chart: `overhead.png`.", ""]
    return "\n".join(lines)


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def write_png(path: Path, cells: dict[Key, Cell], impls: list[str], loops: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(18, 4.8))
    colors = {impl: plt.get_cmap("tab10")(i) for i, impl in enumerate(impls)}
    width = 0.8 / max(1, len(impls))
    panels = [(s, f"{s}: thousand items/s (higher is better)", 1e-3) for s in THROUGHPUT_SHAPES]
    panels.append(("latency", "added latency, µs (lower is better)", 1.0))
    for ax, (shape, title, scale) in zip(axes, panels, strict=True):
        measured = False
        for i, impl in enumerate(impls):
            xs, ys = [], []
            for j, lp in enumerate(loops):
                c = cells.get((impl, shape, lp))
                if c is not None:
                    xs.append(j + (i - (len(impls) - 1) / 2) * width)
                    ys.append(c.median * scale)
            measured = measured or bool(ys)
            bars = ax.bar(xs, ys, width, label=impl, color=colors[impl])
            ax.bar_label(bars, fmt="%.0f" if shape != "latency" else "%.1f", fontsize=6, rotation=90, padding=2)
        if not measured:  # a run of some shapes only (--shapes): an empty panel, and no log scale of nothing
            title = f"{shape}: not measured in this run"
        elif shape == "bulk":
            ax.set_yscale("log")  # the direct call is some 30 times the rest: only a log scale shows both
            title = title.replace("(higher", "(log scale; higher")
        ax.margins(y=0.15)
        ax.set_xticks(range(len(loops)), loops)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("async-batcher overhead: no-op batch function, max_batch_size=256 (median of the repeats)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
