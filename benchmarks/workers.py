"""The Keras example server with 1 and with 2 uvicorn workers under the same load: reports/workers.md.

``python -m benchmarks.workers`` (``make benchmark-workers``) reuses benchmarks/run.py's machinery: the same
server (started as run.py starts it, with ``--workers N``), the same locust steps. For each worker count and
user count it records requests/s and latency percentiles, and the mean batch size read from the server's
``/metrics`` histograms (with several workers they add up every worker's batches: each worker forms its own
batches from the requests it happens to accept). Traffic to 127.0.0.1 only, each step bounded in time.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import platform
import sys
import time
import urllib.request
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks import run

__all__ = ["main"]

ROOT = Path(__file__).resolve().parents[1]
NOTES = [
    "What to read in it: with 2 workers each batcher sees only the requests of the connections its worker"
    " accepted, so its batches are smaller (items/batch) and the model's fixed cost per call is paid more often."
    " A second worker helps where one process's event loop (HTTP parsing, JSON, the GIL) is the bottleneck and"
    " a core is idle; on a 2-core machine the load generator takes a core too, so the two workers compete with"
    " it and with each other. Figures from a shared machine (see the load average above) move by tens of"
    " percent between runs: compare rows of one run only. Sizing: docs/guides/scaling.md.",
]
FIELDS = ["workers", "endpoint", "users", "rps", "p50_ms", "p95_ms", "p99_ms", "failures", "requests", "batch_size"]


def _batch_size_totals(port: int) -> tuple[float, float] | None:
    """(items, batches) so far, from the batch size histogram of ``/metrics`` (all workers added up)."""
    from prometheus_client.parser import text_string_to_metric_families

    with contextlib.suppress(OSError, ValueError):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics/", timeout=10) as response:
            text = response.read().decode()
        values = {
            s.name: s.value
            for f in text_string_to_metric_families(text)
            if f.name == "async_batcher_batch_size"
            for s in f.samples
            if s.name.endswith(("_sum", "_count"))
        }
        return values["async_batcher_batch_size_sum"], values["async_batcher_batch_size_count"]
    return None


def _measure(args: argparse.Namespace, workers: int, out: Path) -> list[dict[str, Any]]:
    step_args = argparse.Namespace(**{**vars(args), "workers": workers})
    port = run._free_port()
    rows = []
    with run._server(step_args, port, out / f"server_w{workers}.log") as server:
        for users in args.users:
            for endpoint in args.endpoints:
                before = _batch_size_totals(port)
                step = run._run_step(step_args, server, port, endpoint, users, out / f"w{workers}")
                after = _batch_size_totals(port)
                size = None
                if endpoint == "/optimized_predict" and before and after and after[1] > before[1]:
                    size = (after[0] - before[0]) / (after[1] - before[1])
                rows.append({**asdict(step), "workers": workers, "batch_size": size})
                print(
                    f"  {workers} worker(s) {endpoint:<18} {users:>4} users: {step.rps:>7.0f} req/s,"
                    f" p95 {step.p95_ms:.0f} ms, {step.failures} failures"
                    + (f", {size:.1f} items/batch" if size else ""),
                    flush=True,
                )
    return rows


def _plot(rows: list[dict[str, Any]], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for key in sorted({(r["workers"], r["endpoint"]) for r in rows}):
        steps = sorted((r for r in rows if (r["workers"], r["endpoint"]) == key), key=lambda r: r["users"])
        label = f"{key[0]} worker{'s' if key[0] > 1 else ''} {key[1]}"
        left.plot([r["users"] for r in steps], [r["rps"] for r in steps], marker="o", label=label)
        right.plot([r["users"] for r in steps], [r["p95_ms"] for r in steps], marker="o", label=label)
    left.set(xlabel="users (closed loop)", ylabel="requests/s", title="Throughput")
    right.set(xlabel="users (closed loop)", ylabel="p95 ms", title="p95 latency")
    for axis in (left, right):
        axis.set_xscale("log", base=2)
        axis.grid(alpha=0.3)
    left.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def write(results: dict[str, Any], out: Path) -> str:
    """Write workers.md, workers.csv and workers.png into ``out``; return the report's text."""
    rows = results["steps"]
    with open(out / "workers.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    plotted = _plot(rows, out / "workers.png")
    env = results["environment"]
    lines = [
        "# The Keras example server with 1 and 2 uvicorn workers",
        "",
        f"Generated by `{env['command']}` on {env['date']} ({env['cpus']} CPUs, load average"
        f" {env.get('load_average_before', '?')} before it, Python {env['python']}); server"
        f" options `{env['server_args'] or '(defaults)'}`; locust closed loop, {env['step_seconds']} s a step,"
        " on the same machine. Each worker is a process with its own model and batcher; the kernel hands each"
        " new connection to one of them.",
        "",
        "| workers | endpoint | users | req/s | p50 ms | p95 ms | p99 ms | failures | items/batch |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (r["endpoint"], r["users"], r["workers"])):
        size = "-" if r["batch_size"] is None else f"{r['batch_size']:.1f}"
        lines.append(
            f"| {r['workers']} | {r['endpoint']} | {r['users']} | {r['rps']:.0f} | {r['p50_ms']:.0f} |"
            f" {r['p95_ms']:.0f} | {r['p99_ms']:.0f} | {r['failures']} | {size} |"
        )
    lines += ["", *(["![throughput and p95](workers.png)", ""] if plotted else []), *NOTES]
    text = "\n".join(lines) + "\n"
    (out / "workers.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m benchmarks.workers", description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=run._parse_users, default=[1, 2], help="worker counts, comma-separated")
    parser.add_argument("--users", type=run._parse_users, default=[32, 128], help="locust user counts")
    parser.add_argument("--endpoints", default="/optimized_predict", help="endpoints, comma-separated")
    parser.add_argument("--step-seconds", type=int, default=10, help="seconds of load per step")
    parser.add_argument("--server-args", default="", help="more server options, e.g. '--max-batch-size 64'")
    parser.add_argument("--out", type=Path, default=ROOT / "reports")
    parser.add_argument("--report-only", action="store_true", help="render the last run's results again")
    args = parser.parse_args(argv)
    if args.report_only:
        print(write(json.loads((args.out / "workers" / "results.json").read_text()), args.out))
        return 0
    args.endpoints = [e if e.startswith("/") else "/" + e for e in args.endpoints.split(",")]
    if unknown := sorted(set(args.endpoints) - set(run.ENDPOINTS)):
        parser.error(f"unknown endpoints {unknown}; known: {list(run.ENDPOINTS)}")
    if args.step_seconds < 1:
        parser.error("--step-seconds must be positive")
    args.processes, args.wait = 1, 0.0  # what run._run_step reads besides
    data_dir = args.out / "workers"
    for workers in args.workers:
        (data_dir / f"w{workers}").mkdir(parents=True, exist_ok=True)
    environment = {
        "command": " ".join(["python -m benchmarks.workers", *argv]),
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "cpus": os.cpu_count(),
        "load_average_before": [round(x, 1) for x in os.getloadavg()],
        "python": platform.python_version(),
        "server_args": args.server_args,
        "step_seconds": args.step_seconds,
    }
    steps: list[dict[str, Any]] = []
    for workers in args.workers:
        print(f"{workers} worker(s):", flush=True)
        steps += _measure(args, workers, data_dir)
    results = {"environment": environment, "steps": steps}
    for page in data_dir.glob("*/*.html"):  # locust's HTML pages: a megabyte each; the CSVs hold the figures
        page.unlink()
    (data_dir / "results.json").write_text(json.dumps(results, indent=1))
    print(write(results, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
