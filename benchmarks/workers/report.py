"""reports/workers.md from a run's results: the steps, the memory, and issue 51's targets, each met or not."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from benchmarks.provenance import regenerated_by

__all__ = ["targets", "write"]

#: Issue 51: with 2 workers sharing, items per call at least this share of 1 worker's, at the same users ...
ITEMS_SHARE = 0.9
#: ... and requests/s at least this many times those of 2 workers batching alone, at these users.
RPS_GAIN = 1.3
RPS_USERS = (32, 64)
CLOSED = ("locust", "wrk")
#: ... and those of the micro-benchmark (benchmarks/shared), by their key in its results.
MICRO_TARGETS = (
    ("hop", "the hop adds <= 100 µs to p50 at 1 caller"),
    ("throughput", ">= 40,000 items/s through one owner (no-op model)"),
)
NOTES = [
    "What to read in it: with 2 workers batching alone, each batcher sees only the requests of the connections its"
    " worker accepted, so its batches are smaller (items/call) and the model's fixed cost per call is paid more"
    " often; with 2 workers sharing one batcher (`--shared`), both workers' requests go into the batches of one"
    " batcher, in the worker that started first and loaded the model (the other loads no TensorFlow: the memory"
    " table). A second worker helps where one process's event loop (HTTP parsing, JSON, the GIL) is the bottleneck"
    " and a core is idle; on a 2-core machine the load generator takes a core too. Items per call are read from"
    " `/metrics` before and after each step (every worker's histograms added up; the shared batcher's written by"
    " its owner alone), warm-up included. Open loop: Poisson arrivals at a fixed rate, latency from each request's"
    " intended send time; a step whose generator could not keep to its schedule is marked. Memory: the resident"
    " memory of the server's processes summed (uvicorn's supervisor, the workers, multiprocessing's resource"
    " tracker), RSS counting shared pages in each process, PSS dividing them. Figures from a shared machine (see"
    " the load average) move by tens of percent between runs: compare rows of one run only. Sizing and the shared"
    " batcher: docs/guides/scaling.md.",
]


def _fmt(value: float | None, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if math.isinf(value):
        return "∞"
    return f"{value:.{digits}f}"


def _find(rows: list[dict[str, Any]], variant: str, generator: str, users: int) -> dict[str, Any] | None:
    return next(
        (r for r in rows if r["variant"] == variant and r["generator"] == generator and r["users"] == users), None
    )


def targets(results: dict[str, Any], shared: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Issue 51's four targets: what was measured, and ``met``: True, False, or None (not measured here)."""
    rows = results["steps"]
    out = []
    # 1. Items per call: 2 sharing against 1 worker, at the same users, each closed-loop generator.
    pairs = []
    for generator in CLOSED:
        for users in sorted({r["users"] for r in rows if r["generator"] == generator}):
            one, shared_row = _find(rows, "1", generator, users), _find(rows, "2s", generator, users)
            if one and shared_row and one["items_per_call"] and shared_row["items_per_call"]:
                ratio = shared_row["items_per_call"] / one["items_per_call"]
                pairs.append((generator, users, shared_row["items_per_call"], one["items_per_call"], ratio))
    text = "; ".join(f"{g} {u} users: {s:.1f} against {o:.1f} ({r:.2f}x)" for g, u, s, o, r in pairs)
    out.append(
        {
            "target": f"items per call, 2 workers sharing >= {ITEMS_SHARE}x 1 worker's, at the same users",
            "measured": text or "not measured (variants 1 and 2s, a closed-loop generator)",
            "met": all(r >= ITEMS_SHARE for *_, r in pairs) if pairs else None,
        }
    )
    # 2. Requests/s: 2 sharing against 2 batching alone, at 32 and 64 users.
    pairs = []
    for generator in CLOSED:
        for users in RPS_USERS:
            alone, shared_row = _find(rows, "2", generator, users), _find(rows, "2s", generator, users)
            if alone and shared_row and alone["rps"] > 0:
                pairs.append((generator, users, shared_row["rps"], alone["rps"], shared_row["rps"] / alone["rps"]))
    text = "; ".join(f"{g} {u} users: {s:.0f} against {a:.0f} ({r:.2f}x)" for g, u, s, a, r in pairs)
    at = " and ".join(map(str, RPS_USERS))
    complete = {(g, u) for g, u, *_ in pairs} >= {(g, u) for g in CLOSED for u in RPS_USERS if _ran(rows, g)}
    out.append(
        {
            "target": f"requests/s, 2 workers sharing >= {RPS_GAIN}x 2 batching alone, at {at} users",
            "measured": text or "not measured (variants 2 and 2s at 32 and 64 users)",
            "met": (all(r >= RPS_GAIN for *_, r in pairs) if complete else None) if pairs else None,
        }
    )
    # 3 and 4: the micro-benchmark's (make bench-shared), quoted from its last run.
    measured = {v.get("key"): v for v in (shared or {}).get("verdicts", [])}
    for key, target in MICRO_TARGETS:
        v = measured.get(key)
        if v is None:
            out.append(
                {"target": target, "measured": "not measured: run make bench-shared (reports/shared.md)", "met": None}
            )
        else:
            where = f"{v['loop']}; reports/shared.md, {shared['environment']['date'] if shared else '?'}"
            out.append({"target": v["target"], "measured": f"{v['measured']} ({where})", "met": v["met"]})
    return out


def _ran(rows: list[dict[str, Any]], generator: str) -> bool:
    return any(r["generator"] == generator for r in rows)


def write(results: dict[str, Any], out: Path) -> str:
    """Write workers.md into ``out`` (and read its shared/results.json, if there); return the report's text."""
    env = results["environment"]
    rows = results["steps"]
    memory = results["memory"]
    labels = {key: m["label"] for key, m in memory.items()}
    shared_path = out / "shared" / "results.json"
    shared = json.loads(shared_path.read_text()) if shared_path.exists() else None
    verdict = {True: "yes", False: "**no**", None: "not measured"}
    lines = [
        "# The Keras example server: 1 worker, 2 workers batching alone, 2 workers sharing one batcher",
        "",
        regenerated_by("benchmark-workers", env["command"], "WORKERS_ARGS"),
        "",
        f"Generated by `{env['command']}` on {env['date']} ({env['cpus']} CPUs, load average"
        f" {env.get('load_average_before', '?')} before it and {env.get('load_average_after', '?')} after, Python"
        f" {env['python']}, {env.get('minutes', '?')} minutes); server options `{env['server_args'] or '(defaults)'}`"
        f" besides each variant's; {env['step_seconds']} s a step; locust, wrk ({env.get('wrk_threads', 1)} thread)"
        " and the open-loop generator on the same machine, on `/optimized_predict`.",
        "",
        "## Targets (issue 51)",
        "",
        "| target | measured | met |",
        "|---|---|---|",
        *(f"| {t['target']} | {t['measured']} | {verdict[t['met']]} |" for t in targets(results, shared)),
        "",
        "## Closed loop",
        "",
        "| generator | users | variant | req/s | p50 ms | p99 ms | items/call | failures |",
        "|---|---|---|---|---|---|---|---|",
    ]
    order = {key: i for i, key in enumerate(memory)}
    closed = [r for r in rows if r["generator"] != "open"]
    for r in sorted(closed, key=lambda r: (r["generator"], r["users"], order.get(r["variant"], 99))):
        lines.append(
            f"| {r['generator']} | {r['users']} | {labels.get(r['variant'], r['variant'])} | {_fmt(r['rps'])} |"
            f" {_fmt(r['p50_ms'], 1)} | {_fmt(r['p99_ms'], 1)} | {_fmt(r['items_per_call'], 1)} | {r['failures']} |"
        )
    opened = [r for r in rows if r["generator"] == "open"]
    if opened:
        lines += [
            "",
            "## Open loop (Poisson arrivals)",
            "",
            "| offered/s | variant | answered/s | p50 ms | p99 ms | items/call | failures | schedule kept |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in sorted(opened, key=lambda r: (r["rate"], order.get(r["variant"], 99))):
            lines.append(
                f"| {_fmt(r['rate'])} | {labels.get(r['variant'], r['variant'])} | {_fmt(r['rps'])} |"
                f" {_fmt(r['p50_ms'], 1)} | {_fmt(r['p99_ms'], 1)} | {_fmt(r['items_per_call'], 1)} | {r['failures']} |"
                f" {'yes' if r['held'] else 'no'} |"
            )
    lines += [
        "",
        "## Memory: all the server's processes, summed",
        "",
        "| variant | processes | RSS MiB, loaded and idle | RSS MiB, the most after a step | PSS MiB, the most |",
        "|---|---|---|---|---|",
    ]
    for m in memory.values():
        lines.append(
            f"| {m['label']} | {m['most']['processes']} | {_fmt(m['idle']['rss_mib'])} | {_fmt(m['most']['rss_mib'])}"
            f" | {_fmt(m['most']['pss_mib'])} |"
        )
    lines += ["", *NOTES]
    text = "\n".join(lines) + "\n"
    (out / "workers.md").write_text(text)
    return text
