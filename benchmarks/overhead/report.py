"""pyperf's results as the report: ratios to the floor and to each peer, the targets, the tables, CSV and chart.

A benchmark's value is pyperf's: seconds per item (the time of ``loops`` runs divided by loops x items). Ratios are
of the means, as ``pyperf compare_to`` takes them; the report also carries ``compare_to``'s own table, with its
significance test, and each target's ratio with a bootstrap 95 % interval over the values.
"""

from __future__ import annotations

import csv
import json
import random
import statistics
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "INSTRUCTIONS_BEGIN",
    "INSTRUCTIONS_END",
    "Cell",
    "Target",
    "earlier_goals",
    "evaluate_targets",
    "instructions_section",
    "load",
    "load_batches",
    "markdown",
    "ratio",
    "splice_instructions",
    "tables",
    "write_csv",
    "write_png",
]

THROUGHPUT_SHAPES = ("steady", "burst", "bulk")
PER_CALL_SHAPES = ("latency", "executor")  # one caller, one item at a time: charted in µs per call
PEERS = ("async-batcher-0.2.2", "batched", "aiodataloader")
Key = tuple[str, str, str]  # (implementation, shape, event loop)
# The executor shape's bound: ours may take at most this many times the floor's time (and instructions) per call.
EXECUTOR_BOUND = 1.15
# The section of overhead.md that the instruction counter writes (python -m benchmarks.overhead.instructions
# --write): kept as it is when the pyperf run writes the rest of the report, and the other way round.
INSTRUCTIONS_BEGIN = "<!-- instruction counts: begin -->"
INSTRUCTIONS_END = "<!-- instruction counts: end -->"


@dataclass(frozen=True)
class Cell:
    """One benchmark of one implementation: pyperf's values, in seconds per item."""

    values: tuple[float, ...]
    runs: int  # worker processes that gave values
    loops: int  # runs of the shape per value
    version: str

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def rate(self) -> float:
        """Items per second."""
        return 1.0 / self.mean

    @property
    def rsd(self) -> float:
        """Relative standard deviation of the values."""
        return statistics.stdev(self.values) / self.mean if len(self.values) > 1 else 0.0


def load(out_dir: Path, impls: Iterable[str]) -> dict[Key, Cell]:
    """The cells in ``out_dir/<impl>.json`` (pyperf's files), for every benchmark that has values."""
    import pyperf  # type: ignore[import-untyped,unused-ignore]

    cells: dict[Key, Cell] = {}
    for impl in impls:
        path = out_dir / f"{impl}.json"
        if not path.exists():
            continue
        for bench in pyperf.BenchmarkSuite.load(str(path)).get_benchmarks():
            runs = [run for run in bench.get_runs() if run.values]
            if not runs:
                continue
            meta = bench.get_metadata()
            key = (impl, str(meta["name"]).rsplit("-", 1)[0], str(meta["event_loop"]))
            version = str(meta.get("impl_version", ""))
            cells[key] = Cell(tuple(bench.get_values()), len(runs), runs[0].get_loops(), version)
    return cells


def load_batches(record: Path) -> dict[Key, float]:
    """Mean items per call of the batch function, from the workers' ``--record`` lines."""
    sums: dict[Key, list[int]] = {}
    if record.exists():
        for line in record.read_text(encoding="utf-8").splitlines():
            r = json.loads(line)
            acc = sums.setdefault((r["impl"], r["shape"], r["event_loop"]), [0, 0])
            acc[0] += r["items"]
            acc[1] += r["batches"]
    return {k: items / batches for k, (items, batches) in sums.items() if batches}


def ratio(cells: dict[Key, Cell], a: str, b: str, shape: str, loop: str) -> float | None:
    """How many times faster ``a`` is than ``b`` (ratio of the mean times per item); None if either is missing."""
    ca, cb = cells.get((a, shape, loop)), cells.get((b, shape, loop))
    return cb.mean / ca.mean if ca and cb else None


def ratio_interval(a: Cell, b: Cell, rounds: int = 2000, seed: int = 0) -> tuple[float, float]:
    """A bootstrap 95 % interval of ``b.mean / a.mean``, resampling each cell's values."""
    rng = random.Random(seed)

    def resampled_mean(c: Cell) -> float:
        return statistics.fmean(rng.choices(c.values, k=len(c.values)))

    got = sorted(resampled_mean(b) / resampled_mean(a) for _ in range(rounds))
    return got[int(0.025 * rounds)], got[int(0.975 * rounds) - 1]


@dataclass(frozen=True)
class Target:
    what: str
    loop: str
    measured: float | None  # None: not measured in this run
    bound: float
    interval: tuple[float, float] | None = None
    strict: bool = False  # "ahead of": above the bound, not at it

    @property
    def verdict(self) -> str:
        if self.measured is None:
            return "not measured"
        ok = self.measured > self.bound if self.strict else self.measured >= self.bound
        return "PASS" if ok else "FAIL"


def _vs(
    cells: dict[Key, Cell], what: str, other: str, shape: str, loop: str, bound: float, *, strict: bool = False
) -> Target:
    ours, peer = cells.get(("ours", shape, loop)), cells.get((other, shape, loop))
    if ours is None or peer is None:
        return Target(what, loop, None, bound, strict=strict)
    return Target(what, loop, peer.mean / ours.mean, bound, ratio_interval(ours, peer), strict)


def evaluate_targets(cells: dict[Key, Cell], loops: Iterable[str]) -> list[Target]:
    """The overhead targets, on each event loop."""
    out: list[Target] = []
    for lp in loops:
        out += [
            _vs(cells, "steady ≥ 0.85x floor", "floor", "steady", lp, 0.85),
            _vs(cells, "burst ≥ 0.92x floor", "floor", "burst", lp, 0.92),
            _vs(cells, "steady ≥ 2.5x async-batcher 0.2.2", "async-batcher-0.2.2", "steady", lp, 2.5),
            _vs(cells, "steady: ahead of aiodataloader", "aiodataloader", "steady", lp, 1.0, strict=True),
            _vs(cells, "burst: ahead of aiodataloader", "aiodataloader", "burst", lp, 1.0, strict=True),
            # As a speed ratio, like the others: at most 1.15x the floor's time per call is at least 1/1.15 its speed.
            _vs(cells, "executor ≤ 1.15x floor's time per call", "floor", "executor", lp, 1 / EXECUTOR_BOUND),
        ]
    return out


def earlier_goals(cells: dict[Key, Cell], loops: Iterable[str]) -> list[str]:
    """Earlier goals, kept: process_many at 1 000 000 items/s or more; a lone caller (wait 0) adds 50 µs at most."""
    lines = []
    for lp in loops:
        bulk, lat = cells.get(("ours", "bulk", lp)), cells.get(("ours", "latency", lp))
        direct = cells.get(("direct", "latency", lp))
        if bulk is not None:
            verdict = "PASS" if bulk.rate >= 1e6 else "FAIL"
            lines.append(f"- {lp}: `process_many` at {_rate(bulk.rate)} items/s (≥ 1 000 000): {verdict}")
        if lat is not None and direct is not None:
            added = (lat.mean - direct.mean) * 1e6
            verdict = "PASS" if added <= 50 else "FAIL"
            lines.append(f"- {lp}: a lone caller, wait 0: {added:.1f} µs added per item (≤ 50): {verdict}")
    return lines


def _rate(v: float) -> str:
    return f"{v:,.0f}".replace(",", " ")


def _table(header: list[str], body: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in body]


def target_table(targets: list[Target]) -> list[str]:
    def measured(t: Target) -> str:
        if t.measured is None:
            return "—"
        ci = f" ({t.interval[0]:.2f}-{t.interval[1]:.2f})" if t.interval else ""
        return f"{t.measured:.2f}x{ci}"

    def note(t: Target) -> str:
        if t.interval is None or t.measured is None:
            return ""
        low, high = t.interval
        inside = low < t.bound < high or (low == t.bound or high == t.bound)
        return "within the noise" if inside else ""

    header = ["target", "loop", "ours ÷ other (95 % interval)", "verdict", ""]
    return _table(header, [[t.what, t.loop, measured(t), t.verdict, note(t)] for t in targets])


def tables(cells: dict[Key, Cell], batches: dict[Key, float], impls: list[str], loops: list[str]) -> list[str]:
    """The result tables: throughput, ratios, latency, batch sizes, spread."""
    cols = [(s, lp) for s in THROUGHPUT_SHAPES for lp in loops if any((i, s, lp) in cells for i in impls)]
    head = [f"{s} · {lp}" for s, lp in cols]

    def cell_text(impl: str, s: str, lp: str, fmt: str) -> str:
        c = cells.get((impl, s, lp))
        if c is None:
            return "n/a"
        if fmt == "rate":
            return _rate(c.rate)
        if fmt == "rsd":
            return f"{c.rsd:.0%}"
        value = batches.get((impl, s, lp))
        return f"{value:.1f}" if value is not None else "n/a"

    def rel(a: str, b: str, s: str, lp: str) -> str:
        r = ratio(cells, a, b, s, lp)
        return f"{r:.2f}" if r is not None else "n/a"

    out = ["### Throughput, items/s (1 ÷ pyperf's mean time per item)", ""]
    out += _table(["implementation", *head], [[i, *[cell_text(i, s, lp, "rate") for s, lp in cols]] for i in impls])
    out += ["", "### Relative to the floor (implementation ÷ floor; above 1 is faster than the floor)", ""]
    out += _table(["implementation", *head], [[i, *[rel(i, "floor", s, lp) for s, lp in cols]] for i in impls])
    peers = [p for p in impls if p in PEERS]
    if "ours" in impls and peers:
        out += ["", "### Ours relative to each peer (ours ÷ peer; above 1: ours is faster)", ""]
        out += _table(["peer", *head], [[p, *[rel("ours", p, s, lp) for s, lp in cols]] for p in peers])
    lat = [i for i in impls if any((i, "latency", lp) in cells for lp in loops)]
    if lat:
        out += ["", "### Latency: one caller awaiting one item at a time, max_queue_time=0 (µs per item)", ""]
        out += ["Added: the implementation's time per item less the direct call's (`direct`).", ""]
        body = []
        for impl in lat:
            row = [impl]
            for lp in loops:
                c, d = cells.get((impl, "latency", lp)), cells.get(("direct", "latency", lp))
                row.append(f"{c.mean * 1e6:.1f}" if c else "n/a")
                row.append(f"{(c.mean - d.mean) * 1e6:.1f}" if c and d and impl != "direct" else "—")
            body.append(row)
        out += _table(["implementation", *[f"{k} · {lp}" for lp in loops for k in ("µs", "added µs")]], body)
    ex = [i for i in impls if any((i, "executor", lp) in cells for lp in loops)]
    if ex:
        out += ["", "### Executor: one caller, each item a batch of one through `ThreadPoolExecutor(1)`, wait 0", ""]
        out += ["µs per call; ÷ floor: the implementation's time per call over the floor's (ours' bound: 1.15).", ""]
        body = []
        for impl in ex:
            row = [impl]
            for lp in loops:
                c, f = cells.get((impl, "executor", lp)), cells.get(("floor", "executor", lp))
                row.append(f"{c.mean * 1e6:.1f}" if c else "n/a")
                row.append(f"{c.mean / f.mean:.2f}" if c and f else "n/a")
            body.append(row)
        out += _table(["implementation", *[f"{k} · {lp}" for lp in loops for k in ("µs", "÷ floor")]], body)
    out += ["", "### Items per call of the batch function (mean)", ""]
    out += _table(["implementation", *head], [[i, *[cell_text(i, s, lp, "batch") for s, lp in cols]] for i in impls])
    out += ["", "### Spread: standard deviation of the values ÷ their mean", ""]
    out += _table(["implementation", *head], [[i, *[cell_text(i, s, lp, "rsd") for s, lp in cols]] for i in impls])
    return out


def compare_to(out_dir: Path, impls: list[str]) -> list[str]:
    """``pyperf compare_to`` with ours as the reference: its Markdown table (significance by its t-test)."""
    files = [f"{i}.json" for i in ["ours", *[i for i in impls if i != "ours"]] if (out_dir / f"{i}.json").exists()]
    if len(files) < 2 or files[0] != "ours.json":
        return []
    cmd = [sys.executable, "-m", "pyperf", "compare_to", *files, "--table", "--table-format", "md"]
    proc = subprocess.run(cmd, cwd=out_dir, capture_output=True, text=True, check=False)
    text = proc.stdout.strip() if proc.returncode == 0 else f"compare_to failed: {proc.stderr.strip()}"
    return [
        '### `pyperf compare_to` (reference: ours; time per item; "faster" means faster than ours)',
        "",
        f"`cd {out_dir.name} && python -m pyperf compare_to {' '.join(files)} --table --table-format md`",
        "",
        text,
    ]


CSV_FIELDS = ("impl", "version", "shape", "event_loop", "items_per_s", "mean_s", "rsd", "values", "runs", "loops")


def write_csv(path: Path, cells: dict[Key, Cell], batches: dict[Key, float]) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow([*CSV_FIELDS, "mean_batch"])
        for (impl, shape, lp), c in sorted(cells.items()):
            batch = batches.get((impl, shape, lp))
            row = [impl, c.version, shape, lp, f"{c.rate:.0f}", f"{c.mean:.4e}", f"{c.rsd:.3f}", len(c.values)]
            w.writerow([*row, c.runs, c.loops, "" if batch is None else f"{batch:.2f}"])


def write_png(path: Path, cells: dict[Key, Cell], impls: list[str], loops: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 5, figsize=(22, 4.8))
    colors = {impl: plt.get_cmap("tab10")(i) for i, impl in enumerate(impls)}
    width = 0.8 / max(1, len(impls))
    panels = [(s, f"{s}: thousand items/s (higher is better)") for s in THROUGHPUT_SHAPES]
    panels.append(("latency", "latency: µs per item (lower is better)"))
    panels.append(("executor", "executor: µs per call (lower is better)"))
    for ax, (shape, title) in zip(axes, panels, strict=True):
        measured = False
        for i, impl in enumerate(impls):
            xs, ys, errs = [], [], []
            for j, lp in enumerate(loops):
                c = cells.get((impl, shape, lp))
                if c is not None:
                    value = c.mean * 1e6 if shape in PER_CALL_SHAPES else c.rate * 1e-3
                    xs.append(j + (i - (len(impls) - 1) / 2) * width)
                    ys.append(value)
                    errs.append(value * c.rsd)
            measured = measured or bool(ys)
            bars = ax.bar(xs, ys, width, yerr=errs, label=impl, color=colors[impl], capsize=2)
            ax.bar_label(bars, fmt="%.1f" if shape in PER_CALL_SHAPES else "%.0f", fontsize=6, rotation=90, padding=2)
        if not measured:  # a run of some shapes only (--shapes): an empty panel, and no log scale of nothing
            title = f"{shape}: not measured in this run"
        elif shape == "bulk":
            ax.set_yscale("log")  # the direct call is some 20 times the rest: only a log scale shows both
            title = title.replace("(higher", "(log scale; higher")
        ax.margins(y=0.15)
        ax.set_xticks(range(len(loops)), loops)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("async-batcher overhead on pyperf: no-op batch function, max_batch_size=256 (mean ± std dev)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# How the implementations that live in this interpreter are driven (the peers': peers.PEERS).
LOCAL_WIRING = {
    "direct": "each caller awaits the batch function on its own one-item list (no batching): the cost of the callers "
    "themselves. Bulk: the list cut into 256-item calls. Executor: `await loop.run_in_executor(pool, fn, [x])`.",
    "floor": "`floors.Floor`: a competent hand-written batcher, the least one can do. A list of items and one of "
    "futures, one `call_later(0.001)` armed by a batch's first item, a flush at once at the 256th, one task per "
    "batch; `process` is a plain function returning the future (no coroutine per item). No statistics, no limits, "
    "no cancellation handling. Bulk: every item through `process`, then each future awaited. Executor: "
    "`floors.ExecutorFloor`, the same batcher whose flush submits the batch to the executor and whose batch's end "
    "comes back by `call_soon_threadsafe`, which sets the futures.",
    "ours": "`async_batcher.AsyncBatcher` subclass from this repository, as its README shows (`start()`, then "
    "`await batcher.process(x)`), max_batch_size=256, max_queue_time=0.001, the other settings at their defaults "
    "(concurrency 1); bulk: `process_many`; executor: a plain `def process_batch` and `executor=`.",
    "floor-async": "`floors.AsyncFloor`: the floor behind an `async def process` (a coroutine per item).",
    "floor-task": "`floors.TaskFloor`: the floor of the benchmark's first version (a task per flush, no timer).",
}


def markdown(
    *,
    cells: dict[Key, Cell],
    batches: dict[Key, float],
    impls: list[str],
    loops: list[str],
    out_dir: Path,
    regenerated: str,
    header: list[str],
    workload: str,
    wiring: dict[str, str],
    failures: list[str],
    instructions: str = "",
) -> str:
    """The whole report: how to run it again, provenance, workload, targets, tables, pyperf's own comparison, and
    ``instructions``, the instruction counter's section as the report had it (:func:`instructions_section`)."""
    targets = evaluate_targets(cells, loops)
    met = sum(t.verdict == "PASS" for t in targets)
    lines = ["# Overhead benchmark: the batcher's own cost (pyperf)", "", regenerated, ""]
    lines += [*[f"- {h}" for h in header], ""]
    lines += ["## Workload", "", workload, ""]
    lines += [f"- **{n}**: {w}" for n, w in LOCAL_WIRING.items() if n in impls]
    lines += [f"- **{n}**: {w}" for n, w in wiring.items() if n in impls]
    lines += ["", "## Targets", "", *target_table(targets), ""]
    lines += [
        f"**{met} of {len(targets)} targets met** (ratio of pyperf's means; the interval is a bootstrap over "
        "the values: a bound inside it is within this run's noise).",
        "",
    ]
    goals = earlier_goals(cells, loops)
    if goals:
        lines += ["Earlier goals, kept:", "", *goals, ""]
    lines += ["## Results", "", *tables(cells, batches, impls, loops), ""]
    lines += [*compare_to(out_dir, impls), ""]
    if failures:
        lines += ["## Not measured", "", *[f"- {f}" for f in failures], ""]
    if instructions:
        lines += [instructions, ""]
    lines += [
        "![items/s per implementation, shape and event loop](overhead.png)",
        "",
        f"Raw results, written beside this report and kept out of git: pyperf's JSON in `{out_dir.name}/`"
        " (`python -m pyperf show`, `stats`, `compare_to`); a summary: `overhead.csv`.",
        "",
    ]
    return "\n".join(lines)


def instructions_section(text: str) -> str:
    """The instruction counter's section of a report (its markers included), or ``""`` if it has none."""
    begin, end = text.find(INSTRUCTIONS_BEGIN), text.find(INSTRUCTIONS_END)
    if begin < 0 or end < begin:
        return ""
    return text[begin : end + len(INSTRUCTIONS_END)]


def splice_instructions(text: str, section: str) -> str:
    """``text`` with its instruction counter's section replaced by ``section`` (markers included); a report without
    one gets it before its chart, or at its end."""
    if not section.startswith(INSTRUCTIONS_BEGIN) or not section.endswith(INSTRUCTIONS_END):
        raise ValueError("an instruction counter's section opens and closes with its markers")
    old = instructions_section(text)
    if old:
        return text.replace(old, section, 1)
    chart = text.find("![")
    if chart < 0:
        return text.rstrip("\n") + "\n\n" + section + "\n"
    return text[:chart] + section + "\n\n" + text[chart:]
