"""``python -m benchmarks.workers [--variants 1,2,2s] [--users 1,32,64,128] [--generators locust,wrk,open]
[--open-rates auto] [--step-seconds 15] [--server-args ...] [--report-only]``: see :mod:`benchmarks.workers`."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import run
from benchmarks.workers import report, steps

ROOT = Path(__file__).resolve().parents[2]
GENERATORS = ("locust", "wrk", "open")
STARTUP_S = 20.0  # a variant's server to healthy (TensorFlow's import, the cached model's load), for the estimate
OVERHEAD_S = 3.0  # a step's start and end besides its load (locust's start-up, the warm-up second)


def _rates(text: str) -> list[float] | str:
    if text.startswith("auto"):
        return text
    try:
        rates = [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--open-rates takes 'auto', 'auto:0.5,0.9' or rates a second, got {text!r}"
        ) from None
    if not rates or min(rates) <= 0:
        raise argparse.ArgumentTypeError(f"--open-rates must be positive, got {text!r}")
    return rates


def _auto_rates(spec: str, rows: list[dict[str, Any]]) -> list[float]:
    """``auto`` (0.5 and 0.9) or ``auto:F1,F2``: fractions of the best closed-loop requests/s of the variant measured
    first (1 worker, by default)."""
    fractions = [float(f) for f in spec.partition(":")[2].split(",")] if ":" in spec else [0.5, 0.9]
    best = max((r["rps"] for r in rows if r["generator"] != "open"), default=0.0)
    if best <= 0:
        raise RuntimeError("--open-rates auto needs a closed-loop step before it (--generators with locust or wrk)")
    return [round(f * best) for f in fractions]


def _estimate(args: argparse.Namespace) -> float:
    closed = sum(g in args.generators for g in ("locust", "wrk")) * len(args.users)
    opened = ("open" in args.generators) * (len(args.open_rates) if isinstance(args.open_rates, list) else 2)
    per_variant = STARTUP_S + (closed + opened) * (args.step_seconds + OVERHEAD_S) + 10
    return per_variant * len(args.variants)


def _measure(args: argparse.Namespace, data_dir: Path) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    memory: dict[str, dict[str, Any]] = {}
    rates = args.open_rates
    for variant in args.variants:
        print(f"{variant.label}:", flush=True)
        done, seen, rates = _variant(args, variant, data_dir / f"w{variant.key}", rates)
        rows += [s.row() for s in done]
        memory[variant.key] = {"label": variant.label, "idle": seen[0], "most": max(seen, key=lambda m: m["rss_mib"])}
        print(f"  memory: {_memory_text(memory[variant.key]['most'])}", flush=True)
    return {"steps": rows, "memory": memory, "open_rates": rates if isinstance(rates, list) else []}


def _variant(
    args: argparse.Namespace, variant: steps.Variant, out: Path, rates: list[float] | str
) -> tuple[list[steps.Step], list[dict[str, Any]], list[float] | str]:
    """One variant's steps, its memory (loaded and idle, then after each step), and the open-loop rates."""
    out.mkdir(parents=True, exist_ok=True)
    done: list[steps.Step] = []
    with steps.server(args, variant, out / "server.log") as (proc, port):
        seen = [steps.memory(proc.pid)]

        def record(step: steps.Step) -> None:
            done.append(step)
            seen.append(steps.memory(proc.pid))
            _print(step)

        for users in args.users:
            if "locust" in args.generators:
                record(steps.locust_step(args, variant, proc, port, users, out))
            if "wrk" in args.generators:
                record(steps.wrk_step(args, variant, port, users))
        if "open" in args.generators:
            if not isinstance(rates, list):  # (from the first variant's closed loop)
                rates = _auto_rates(rates, [s.row() for s in done])
            for rate in rates:
                record(steps.open_step(args, variant, proc, port, rate))
    return done, seen, rates


def _print(s: steps.Step) -> None:
    what = f"{s.generator:<6} {s.users:>4} users" if s.generator != "open" else f"open   {s.rate:>6.0f}/s"
    size = "" if s.items_per_call is None else f", {s.items_per_call:.1f} items/call"
    print(
        f"  {what}: {s.rps:>7.0f} req/s, p50 {s.p50_ms:.1f} ms, p99 {s.p99_ms:.1f} ms, {s.failures} failures{size}",
        flush=True,
    )


def _memory_text(m: dict[str, Any]) -> str:
    pss = "" if m["pss_mib"] is None else f", PSS {m['pss_mib']:.0f} MiB"
    return f"{m['processes']} processes, RSS {m['rss_mib']:.0f} MiB{pss}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    description = "The Keras example server: 1 worker, 2 batching alone, 2 sharing one batcher (reports/workers.md)."
    parser = argparse.ArgumentParser(prog="python -m benchmarks.workers", description=description)
    parser.add_argument(
        "--variants", default="1,2,2s", help="comma-separated: a worker count, 's' after it to share one batcher"
    )
    parser.add_argument(
        "--users",
        type=run._parse_users,
        default=[1, 32, 64, 128],
        help="closed-loop users (connections), comma-separated",
    )
    parser.add_argument("--generators", default=",".join(GENERATORS), help="locust, wrk, open: comma-separated")
    parser.add_argument(
        "--open-rates",
        type=_rates,
        default="auto",
        help="open-loop requests/s, comma-separated; 'auto' (0.5 and 0.9 of the first variant's best closed-loop"
        " rate) or 'auto:F1,F2' (other fractions)",
    )
    parser.add_argument("--step-seconds", type=int, default=15, help="seconds of load per step")
    parser.add_argument("--wrk-threads", type=int, default=1, help="wrk's threads (at most one per connection)")
    parser.add_argument("--server-args", default="", help="more server options, e.g. '--max-batch-size 64'")
    parser.add_argument("--out", type=Path, default=ROOT / "reports", help="where workers.md and workers/ go")
    parser.add_argument("--report-only", action="store_true", help="render the last run's results again")
    args = parser.parse_args(argv)
    if args.report_only:
        print(report.write(json.loads((args.out / "workers" / "results.json").read_text()), args.out))
        return 0
    try:
        args.variants = [steps.Variant.parse(v) for v in args.variants.split(",")]
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    args.generators = [g for g in args.generators.split(",") if g]
    if unknown := sorted(set(args.generators) - set(GENERATORS)):
        parser.error(f"unknown generators {unknown}; known: {list(GENERATORS)}")
    if args.step_seconds < 1 or args.wrk_threads < 1:
        parser.error("--step-seconds and --wrk-threads must be positive")
    if "wrk" in args.generators:
        steps.wrk_path()  # (fails now, naming the package to install, rather than after the first variant)
    data_dir = args.out / "workers"
    data_dir.mkdir(parents=True, exist_ok=True)
    print(f"about {_estimate(args) / 60:.0f} minutes", flush=True)
    environment = {
        "command": shlex.join(["python", "-m", "benchmarks.workers", *argv]),
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "cpus": os.cpu_count(),
        "load_average_before": [round(x, 1) for x in os.getloadavg()],
        "python": platform.python_version(),
        "server_args": args.server_args,
        "step_seconds": args.step_seconds,
        "wrk_threads": args.wrk_threads,
    }
    started = time.monotonic()
    results = {"environment": environment, **_measure(args, data_dir)}
    environment["minutes"] = round((time.monotonic() - started) / 60, 1)
    environment["load_average_after"] = [round(x, 1) for x in os.getloadavg()]
    for page in data_dir.glob("*/*.html"):  # locust's HTML pages: a megabyte each; the CSVs hold the figures
        page.unlink()
    (data_dir / "results.json").write_text(json.dumps(results, indent=1))
    print(report.write(results, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
