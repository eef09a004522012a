"""The padding ``preferred_batch_sizes`` saves: the Keras server with buckets, with and without preferred sizes.

``python -m benchmarks.padding`` (``make bench-padding``) reuses benchmarks/run.py's machinery: the Keras
benchmark server (started as run.py starts it) and its locust steps on ``/optimized_predict``. Two servers run
side by side, both padding every batch up to the smallest of ``--buckets`` that holds it
(``KerasAsyncBatcher(buckets=...)``, as a compiled model with a few fixed shapes needs):

- **buckets only**: a batch takes whatever waits (up to ``max_batch_size``), then is padded;
- **buckets + preferred sizes**: ``preferred_batch_sizes`` equal to the buckets, so a batch goes out at the largest
  bucket the queue fills; what is left waits for the next batch instead of being padded.

For each user count the two take turns (interleaved, so that load from elsewhere on a shared machine hits both
alike). From the server's ``/stats`` before and after each step: the real rows (items processed), the rows the
model computed (padding included), the batches. Writes reports/padding.md and reports/padding.csv. Traffic to
127.0.0.1 only, each step bounded in time.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks import run
from benchmarks.provenance import regenerated_by

__all__ = ["main", "padding_row"]

ROOT = Path(__file__).resolve().parents[1]
BUCKETS = "1,2,4,8,16,32,64,128,256"
FIELDS = [
    "config",
    "users",
    "rps",
    "p50_ms",
    "p95_ms",
    "p99_ms",
    "failures",
    "requests",
    "batches",
    "real_rows",
    "computed_rows",
    "padding",
    "mean_batch",
]

NOTES = [
    "What to read in it: the padding share is a property of the batches and holds from run to run; with the"
    " preferred sizes equal to the buckets (1 among them) every batch fills its bucket exactly, at the price of"
    " more, smaller batches when the queue holds a count between two sizes (the remainder goes next)."
    " Requests/s and p95 from a shared 2-core machine swing by tens of percent between runs: compare them only"
    " within a run. This model"
    " costs about the same for 1 row as for 256 (reports/keras.md): padding rows cost it little, so the saved rows"
    " show here as rows, not as time; a model whose cost grows with its rows saves that time too.",
]


def padding_row(config: str, step: run.Step, before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """One step's row: the locust figures, and the rows and batches between two ``/stats`` readings."""
    batches = after["batches"] - before["batches"]
    real = after["processed"] - before["processed"]
    computed = after["batch_rows"] - before["batch_rows"]
    return {
        **asdict(step),
        "config": config,
        "batches": batches,
        "real_rows": real,
        "computed_rows": computed,
        "padding": 1 - real / computed if computed else None,  # the share of computed rows that were padding
        "mean_batch": real / batches if batches else None,
    }


def _configs(buckets: str) -> dict[str, str]:
    common = f"--max-batch-size {buckets.split(',')[-1]} --buckets {buckets}"
    return {"buckets only": common, "buckets + preferred sizes": f"{common} --preferred-batch-sizes {buckets}"}


def _measure(args: argparse.Namespace, raw: Path) -> list[dict[str, Any]]:
    configs = _configs(args.buckets)
    rows = []
    with contextlib.ExitStack() as stack:
        servers = {}
        for i, (config, server_args) in enumerate(configs.items()):
            port = run._free_port()
            config_args = argparse.Namespace(**{**vars(args), "server_args": server_args})
            servers[config] = (stack.enter_context(run._server(config_args, port, raw / f"server{i}.log")), port)
        for users in args.users:
            for i, (config, (server, port)) in enumerate(servers.items()):
                before = run._get_json(f"http://127.0.0.1:{port}/stats")
                step = run._run_step(args, server, port, "/optimized_predict", users, raw / f"config{i}")
                row = padding_row(config, step, before, run._get_json(f"http://127.0.0.1:{port}/stats"))
                rows.append(row)
                print(
                    f"  {config:<26} {users:>4} users: {step.rps:>7.0f} req/s, p95 {step.p95_ms:.0f} ms,"
                    f" padding {_pct(row['padding'])}, {_num(row['mean_batch'])} items/batch",
                    flush=True,
                )
    return rows


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def write(results: dict[str, Any], out: Path) -> str:
    """Write padding.md and padding.csv into ``out``; return the report's text."""
    rows, env = results["steps"], results["environment"]
    with open(out / "padding.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    versions = ", ".join(f"{k} {v}" for k, v in env["versions"].items())
    lines = [
        "# Padding saved by preferred batch sizes (Keras example server)",
        "",
        regenerated_by("bench-padding", env["command"], "PADDING_ARGS"),
        "",
        f"Generated by `{env['command']}` on {env['date']}: {env['cpu']}, {env['cpus']} CPUs, Python"
        f" {env['python']}, {versions}; load average {env['load_average_before'][0]:.2f} before it. Locust closed"
        f" loop on `/optimized_predict`, {env['locust']['step_seconds']} s a step; server and load generator on the"
        " same machine. Both servers pad every batch up to the smallest bucket that holds it"
        f" (`--buckets {results['buckets']}`, `max_batch_size` the largest); the second also sends its batches at"
        " those sizes (`--preferred-batch-sizes`, the same list).",
        "",
        "padding: the share of the rows the model computed that were padding. real rows: the requests' rows.",
        "",
        "| users | server | req/s | p50 ms | p95 ms | batches | items/batch | real rows | computed rows | padding"
        " | failures |",
        "| --: | --- | --: | --: | --: | --: | --: | --: | --: | --: | --: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['users']} | {r['config']} | {r['rps']:.0f} | {r['p50_ms']:.0f} | {r['p95_ms']:.0f}"
            f" | {r['batches']} | {_num(r['mean_batch'])} | {r['real_rows']} | {r['computed_rows']}"
            f" | {_pct(r['padding'])} | {r['failures']} |"
        )
    lines += ["", *NOTES]
    text = "\n".join(lines) + "\n"
    (out / "padding.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m benchmarks.padding", description=__doc__.split("\n")[0])
    parser.add_argument("--users", type=run._parse_users, default=[32, 128, 256], help="locust user counts")
    parser.add_argument("--step-seconds", type=int, default=10, help="seconds of load per step")
    parser.add_argument("--buckets", default=BUCKETS, help=f"bucket sizes, comma-separated (default {BUCKETS})")
    parser.add_argument("--out", type=Path, default=ROOT / "reports")
    parser.add_argument("--report-only", action="store_true", help="render the last run's results again")
    args = parser.parse_args(argv)
    raw = args.out / "keras" / "raw" / "padding"  # locust's files and the servers' logs (git ignores raw/)
    if args.report_only:
        print(write(json.loads((raw / "results.json").read_text()), args.out))
        return 0
    if args.step_seconds < 1:
        parser.error("--step-seconds must be positive")
    args.workers, args.processes, args.wait, args.server_args = 1, 1, 0.0, ""  # what run.py reads besides
    for i in range(2):
        (raw / f"config{i}").mkdir(parents=True, exist_ok=True)
    environment = {
        **run._environment(args, argv),
        "command": " ".join(["python -m benchmarks.padding", *argv]),
    }
    started = time.monotonic()
    steps = _measure(args, raw)
    print(f"measured in {time.monotonic() - started:.0f} s", flush=True)
    results = {"environment": environment, "buckets": args.buckets, "steps": steps}
    print(write(results, args.out))
    (raw / "results.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
