"""The streaming benchmark's report: reports/streaming.md (table and provenance), streaming.csv, streaming.png."""

from __future__ import annotations

import contextlib
import csv
import os
import platform
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

from benchmarks.provenance import regenerated_by

__all__ = ["environment", "line", "write"]

FIELDS = [
    "mode",
    "streams",
    "tokens_per_s",
    "ttft_p50_ms",
    "ttft_p95_ms",
    "ttft_count",
    "completed",
    "errors",
    "rows_per_step",
    "server_cpu_s",
    "client_cpu_s",
    "seconds",
]
LABELS = {
    "continuous": "batched, continuous batching",
    "static": "batched, static batches",
    "single": "one generation per request",
}

NOTES = [
    "What to read in it: rows/step is the batch each model step computes; one generation per request steps one"
    " row at a time, so its tokens/s stays near what one row a step allows. Where tokens/s stops growing while"
    " rows/step still grows, the model no longer sets the pace: the server's event loop and its model thread share"
    " one GIL, and server, load generator and whatever else runs share the cores (the CPU columns). Static"
    " batches may then reach the tokens/s of continuous batching, but a request that arrives while a batch runs"
    " waits for the whole batch to end: their difference is in the time to first token.",
]


def environment(command: str) -> dict[str, Any]:
    versions = {}
    for package in ("numpy", "fastapi", "starlette", "uvicorn", "uvloop", "httptools", "aiohttp"):
        with contextlib.suppress(Exception):
            versions[package] = version(package)
    cpu = platform.processor() or "unknown CPU"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    return {
        "command": command,
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_average_before": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "versions": versions,
    }


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def line(row: dict[str, Any]) -> str:
    """One row, for the console."""
    return (
        f"{row['mode']:>10} {row['streams']:>4} streams: {row['tokens_per_s']:>8.0f} tokens/s,"
        f" TTFT p50 {_fmt(row['ttft_p50_ms'], '.1f')} ms p95 {_fmt(row['ttft_p95_ms'], '.1f')} ms,"
        f" {_fmt(row['rows_per_step'], '.1f')} rows/step, {row['errors']} errors"
    )


def write(out: Path, rows: list[dict[str, Any]], timing: dict[str, Any], env: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "streaming.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    drew = _plot(rows, out / "streaming.png")
    (out / "streaming.md").write_text(markdown(rows, timing, env, chart=drew))


def markdown(rows: list[dict[str, Any]], timing: dict[str, Any], env: dict[str, Any], *, chart: bool) -> str:
    steps = ", ".join(f"{n} row{'' if int(n) == 1 else 's'} {ms:.2f} ms" for n, ms in timing["step_ms"].items())
    prefill = timing["prefill_ms"]
    versions = ", ".join(f"{k} {v}" for k, v in env["versions"].items())
    seconds = rows[0]["seconds"] if rows else 0
    lines = [
        "# Token streaming: continuous batching, static batches, one generation per request",
        "",
        regenerated_by("bench-streaming", env["command"], "STREAMING_ARGS"),
        "",
        "The example of examples/streaming (a FastAPI app streaming server-sent events, one per token) under"
        " closed-loop load: each client posts a prompt of 8 to 32 bytes with `max_tokens` drawn from 16 to 64, reads"
        " its stream to the end and posts the next. Three servers, the same model and events:",
        "",
        "- **batched, continuous batching**: examples/streaming/app.py as it is (`continuous_batching = True`):"
        " a request that arrives joins the running batch at the next step;",
        "- **batched, static batches**: the same generator with `continuous_batching = False`: a batch runs until"
        " its last stream ends, the requests that arrive meanwhile wait for the next one;",
        "- **one generation per request**: each request runs its own loop (prefill, then steps of one row); the"
        " requests' steps take turns on the model thread.",
        "",
        f"Model (examples/streaming/model.py): {timing['layers']} recurrent layers of {timing['width']} units,"
        f" 256-byte vocabulary, float64, random weights. One step alone: {steps}; a prefill of"
        f" {prefill['bytes']} bytes: {prefill['ms']:.2f} ms. Every server runs numpy on one thread.",
        "",
        f"Command: `{env['command']}` ({seconds:g} s measured per row after a warm-up) — {env['date']}, {env['cpu']},"
        f" {env['cpus']} CPUs, Python {env['python']}, {versions}. Load average before the run:"
        f" {_fmt(env['load_average_before'], '.2f')}. Servers and load generator share the machine; figures from a"
        " shared machine are provisional: compare the rows of one run.",
        "",
        "tokens/s: tokens received by all clients in the measured window. TTFT: from sending a request to its first"
        " token. rows/step: generations advanced per model step (the batch size). CPU: seconds spent by the"
        " server and by the load generator during the row.",
        "",
        "| streams | server | tokens/s | TTFT p50 ms | TTFT p95 ms | rows/step | streams done | errors"
        " | server CPU s | client CPU s |",
        "| --: | --- | --: | --: | --: | --: | --: | --: | --: | --: |",
    ]
    for r in sorted(rows, key=lambda r: (r["streams"], list(LABELS).index(r["mode"]))):
        lines.append(
            f"| {r['streams']} | {LABELS[r['mode']]} | {r['tokens_per_s']:.0f} | {_fmt(r['ttft_p50_ms'], '.1f')}"
            f" | {_fmt(r['ttft_p95_ms'], '.1f')} | {_fmt(r['rows_per_step'], '.1f')} | {r['completed']}"
            f" | {r['errors']} | {_fmt(r['server_cpu_s'], '.1f')} | {_fmt(r['client_cpu_s'], '.1f')} |"
        )
    lines += ["", *_ratios(rows), "", *NOTES]
    if chart:
        lines += ["", "![tokens/s and time to first token against concurrent streams](streaming.png)"]
    return "\n".join(lines) + "\n"


def _ratios(rows: list[dict[str, Any]]) -> list[str]:
    by = {(r["mode"], r["streams"]): r for r in rows}
    out = []
    for streams in sorted({r["streams"] for r in rows}):
        single, cont = by.get(("single", streams)), by.get(("continuous", streams))
        if single and cont and single["tokens_per_s"]:
            ratio = cont["tokens_per_s"] / single["tokens_per_s"]
            out.append(
                f"- {streams} stream{'' if streams == 1 else 's'}: continuous batching gives {ratio:.1f}x the tokens/s"
                " of one generation per request."
            )
    return out


def _plot(rows: list[dict[str, Any]], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for mode, label in LABELS.items():
        mine = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["streams"])
        if not mine:
            continue
        streams = [r["streams"] for r in mine]
        (drawn,) = left.plot(streams, [r["tokens_per_s"] for r in mine], marker="o", label=label)
        right.plot(
            streams, [r["ttft_p50_ms"] for r in mine], marker="o", color=drawn.get_color(), label=f"{label}, p50"
        )
        right.plot(
            streams, [r["ttft_p95_ms"] for r in mine], linestyle="--", color=drawn.get_color(), label=f"{label}, p95"
        )
    left.set(xlabel="concurrent streams", ylabel="tokens/s", title="Throughput")
    right.set(xlabel="concurrent streams", ylabel="ms", title="Time to first token")
    right.set_yscale("log")
    for axis in (left, right):
        axis.set_xscale("log", base=2)
        axis.grid(alpha=0.3)
    left.legend(fontsize=8)
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
