"""The head-to-head's report: medians over the rounds per variant and connection count, the targets, the
CSV of every step and the chart (requests/s and p99 against connections)."""

from __future__ import annotations

import csv
import dataclasses
import statistics
from collections.abc import Iterable
from pathlib import Path

from benchmarks.peers.load import Step

__all__ = ["DESCRIPTIONS", "PEER_NAMES", "Summary", "markdown", "summarise", "targets", "write_csv", "write_png"]

PEER_NAMES = ("async-batcher-0.2.2", "batched", "fast-dynamic-batcher")
# How each kind of variant is wired (benchmarks/peers/apps/); the settings come from the running server.
DESCRIPTIONS = {
    "none": "No batching: one model call per request in a thread (Starlette's `run_in_threadpool`, where FastAPI "
    "runs a plain `def` endpoint).",
    "ours": "This package: `KerasAsyncBatcher(model, predict_fn=..., dtype=float32)`, the model in one thread of its "
    "own (`executor`), started in the app's lifespan.",
    "async-batcher-0.2.2": "async-batcher 0.2.2 from PyPI: an `AsyncBatcher` subclass whose plain-`def` "
    "`process_batch` stacks the rows and calls the model (in a one-thread executor, as ours).",
    "batched": "batched 0.1.5 from PyPI: `batched.aio.dynamically` on a plain `def` of a list of rows (it runs it "
    "with `asyncio.to_thread`).",
    "fast-dynamic-batcher": "fast-dynamic-batcher 1.1.0 from PyPI: `DynBatcher` with an `InferenceModel`; the "
    "model runs in the process it spawns, each request waits in a thread (`process_batched`); `infer` returns "
    "nothing for the empty batches its loop sends when its delay runs out with nothing queued.",
}


@dataclasses.dataclass(frozen=True)
class Summary:
    """One variant at one connection count: the median of each figure over the rounds."""

    variant: str
    connections: int
    rounds: int
    rps: float
    rps_low: float
    rps_high: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    errors: int  # summed over the rounds
    timeouts: int
    items_per_call: float | None
    server_cpu: float | None
    wrk_cpu: float
    machine_busy: float | None
    others_cpu: float | None


def _median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def summarise(steps: list[Step]) -> dict[tuple[str, int], Summary]:
    groups: dict[tuple[str, int], list[Step]] = {}
    for s in steps:
        groups.setdefault((s.variant, s.connections), []).append(s)
    out = {}
    for (variant, conns), group in groups.items():
        rps = [s.rps for s in group]
        out[(variant, conns)] = Summary(
            variant=variant,
            connections=conns,
            rounds=len(group),
            rps=statistics.median(rps),
            rps_low=min(rps),
            rps_high=max(rps),
            p50_ms=statistics.median(s.p50_ms for s in group),
            p95_ms=statistics.median(s.p95_ms for s in group),
            p99_ms=statistics.median(s.p99_ms for s in group),
            errors=sum(s.errors for s in group),
            timeouts=sum(s.timeouts for s in group),
            items_per_call=_median(s.items_per_call for s in group),
            server_cpu=_median(s.server_cpu for s in group),
            wrk_cpu=statistics.median(s.wrk_cpu for s in group),
            machine_busy=_median(s.machine_busy for s in group),
            others_cpu=_median(s.others_cpu for s in group),
        )
    return out


def _f(value: float | None, fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def _rate(v: float) -> str:
    return f"{v:,.0f}".replace(",", " ")


def _table(header: list[str], body: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" if i else "---" for i in range(len(header))) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in body]


def _busy_rows(summary: dict[tuple[str, int], Summary], v: str, peers: list[str], conns: list[int]) -> list[list[str]]:
    rows = []
    for c in (n for n in (64, 256) if n in conns):
        mine = summary.get((v, c))
        others = [summary[(p, c)] for p in peers if (p, c) in summary]
        if mine is None or not others:
            continue
        best = max(others, key=lambda s: s.rps)
        ratio = mine.rps / best.rps
        ok = ratio >= 1.1 and mine.p99_ms <= best.p99_ms
        detail = f"{ratio:.2f}x {best.variant}; p99 {mine.p99_ms:.1f} vs {best.p99_ms:.1f} ms"
        rows.append([v, str(c), "≥ 1.1x the best peer's req/s, p99 no higher", detail, "PASS" if ok else "FAIL"])
    return rows


def _quiet_rows(summary: dict[tuple[str, int], Summary], v: str, conns: list[int]) -> list[list[str]]:
    """At 1 and 8 connections, ``ours`` (the README's settings) against the variant ``v``: a p50 no higher."""
    rows = []
    for c in (n for n in (1, 8) if n in conns):
        mine, other = summary.get(("ours", c)), summary.get((v, c))
        if mine is None or other is None:
            continue
        ok = mine.p50_ms <= other.p50_ms
        detail = f"p50 {mine.p50_ms:.2f} vs {other.p50_ms:.2f} ms"
        rows.append(["ours", str(c), f"p50 no higher than `{v}`'s", detail, "PASS" if ok else "FAIL"])
    return rows


def targets(summary: dict[tuple[str, int], Summary], variants: list[str], connections: list[int]) -> list[str]:
    """The targets for each variant of ours: at 64 and 256 connections, >= 1.1x the best peer's requests/s
    with a p99 no higher than that peer's; at 1 and 8, ``ours`` (the settings the README recommends) with a p50
    no higher than each variant given with ``--ours`` (``--ours no-hold:max_hold_time=0``: the settings before)."""
    peers = [v for v in variants if v in PEER_NAMES]
    rows = []
    for v in variants:
        if v == "ours" or v.startswith("ours-"):
            rows += _busy_rows(summary, v, peers, connections)
            if v != "ours":
                rows += _quiet_rows(summary, v, connections)
    if not rows:
        return []
    return _table(["variant", "connections", "target", "measured", "verdict"], rows)


def markdown(
    *,
    steps: list[Step],
    variants: list[str],
    connections: list[int],
    header: list[str],
    settings: dict[str, str],
    agreement: list[str],
) -> str:
    summary = summarise(steps)
    rounds = max((s.rounds for s in summary.values()), default=0)
    lines = ["# Head-to-head: one Keras model, one FastAPI app, one batcher per variant", ""]
    lines += [f"- {h}" for h in header] + ["", "## Variants", ""]
    lines += [f"- **{v}**: {settings[v]}" for v in variants] + ["", "## Predictions agree", "", *agreement, ""]
    lines += ["## Summary: requests/s, p99 and items per model call (median of the rounds)", ""]
    body = []
    for v in variants:
        cells = []
        for c in connections:
            s = summary.get((v, c))
            cells.append(
                "n/a"
                if s is None
                else f"{_rate(s.rps)}, p99 {s.p99_ms:.1f} ms, {_f(s.items_per_call, '.1f')}/call"
                + (f", {s.timeouts} timeouts" if s.timeouts else "")
                + (f", {s.errors} errors" if s.errors else "")
            )
        body.append([v, *cells])
    lines += [*_table(["variant", *[f"{c} connections" for c in connections]], body), ""]
    target_lines = targets(summary, variants, connections)
    if target_lines:
        lines += ["## Targets: ahead of the best peer, no worse tail", "", *target_lines, ""]
    lines += [f"## Every figure, per connection count (median of {rounds} rounds; req/s range: min-max)", ""]
    lines += [
        "CPU over the step: the server's (its child processes included) and wrk's in % of one core; the whole "
        "machine's busy share of all its cores (other processes included); the other variants' servers' in % of "
        "one core (they are paused, SIGSTOP, while another is measured: this shows it).",
        "",
    ]
    head = ["variant", "req/s", "range", "p50 ms", "p95 ms", "p99 ms", "errors", "timeouts", "items/call"]
    head += ["server CPU %", "wrk CPU %", "machine busy %", "paused servers CPU %"]
    for c in connections:
        lines += [f"### {c} connections", ""]
        rows = []
        for v in variants:
            s = summary.get((v, c))
            if s is None:
                continue
            rows.append(
                [
                    v,
                    _rate(s.rps),
                    f"{_rate(s.rps_low)}-{_rate(s.rps_high)}",
                    f"{s.p50_ms:.2f}",
                    f"{s.p95_ms:.2f}",
                    f"{s.p99_ms:.2f}",
                    str(s.errors),
                    str(s.timeouts),
                    _f(s.items_per_call, ".1f"),
                    _f(s.server_cpu, ".0f"),
                    f"{s.wrk_cpu:.0f}",
                    _f(s.machine_busy, ".0f"),
                    _f(s.others_cpu, ".1f"),
                ]
            )
        lines += [*_table(head, rows), ""]
    lines += ["Every step of every round: `peers.csv`; chart: `peers.png`.", ""]
    return "\n".join(lines)


def write_csv(path: Path, steps: list[Step]) -> None:
    fields = [f.name for f in dataclasses.fields(Step)]
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for s in steps:
            w.writerow({k: (round(v, 4) if isinstance(v, float) else v) for k, v in dataclasses.asdict(s).items()})


def write_png(path: Path, steps: list[Step], variants: list[str], connections: list[int]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = summarise(steps)
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    for v in variants:
        points = [(c, summary[(v, c)]) for c in connections if (v, c) in summary]
        if not points:
            continue
        xs = [c for c, _ in points]
        left.plot(xs, [s.rps for _, s in points], marker="o", label=v)
        right.plot(xs, [s.p99_ms for _, s in points], marker="o", label=v)
    for ax, title in ((left, "requests/s (higher is better)"), (right, "p99 latency, ms (log; lower is better)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(connections, [str(c) for c in connections])
        ax.set_xlabel("connections")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    right.set_yscale("log")
    left.legend(fontsize=8)
    fig.suptitle("One Keras model behind one FastAPI app, per batcher (wrk; median of the rounds)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
