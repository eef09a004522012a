"""``python -m benchmarks.shared [--loops asyncio,uvloop] [--seconds 3] [--clients 1,2,4] [--callers 64] [--only ...]
[--out reports]``: prints its tables; with ``--out`` (``make bench-shared``) it writes ``reports/shared.md``, which
says whether issue 51's targets for the hop are met, and ``reports/shared/results.json`` (read by
``make benchmark-workers``'s report)."""

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

from benchmarks.provenance import regenerated_by
from benchmarks.shared import throughput, transfer
from benchmarks.shared.common import address

SIZES = [1024, 16 * 1024, 256 * 1024, 4 * 1024 * 1024, 64 * 1024 * 1024]
#: Issue 51's targets: the hop adds at most this to a lone caller's p50 (µs) ...
HOP_TARGET_US = 100.0
#: ... and one owner passes at least this many items/s with a no-op model.
THROUGHPUT_TARGET = 40_000.0
#: The loop the verdicts are on: uvicorn's when uvloop is installed, as the Keras example server's is.
VERDICT_LOOP = "uvloop"


def measure(args: argparse.Namespace, loop: str) -> dict[str, Any]:
    """One loop's tables: throughput per client count, the lone caller's latency, transfer per size."""
    result: dict[str, Any] = {"loop": loop}
    if args.only in (None, "throughput"):
        rows = []
        for n in [int(x) for x in args.clients.split(",")]:
            with address() as where:
                rows.append(
                    {
                        "clients": n,
                        "callers": args.callers,
                        **throughput.measure(where, loop, n, args.callers, args.seconds),
                    }
                )
        result["throughput"] = rows
    if args.only in (None, "latency"):
        with address() as where:
            result["latency"] = throughput.latency(where, loop, args.calls)
    if args.only in (None, "transfer"):
        with address() as where:
            measured = transfer.measure(where, loop, SIZES, args.repeat)
        result["transfer"] = [{"bytes": size, "pickled_s": p, "shm_s": s} for size, (p, s) in measured.items()]
    return result


def tables(result: dict[str, Any]) -> list[str]:
    """One loop's results as markdown tables."""
    lines: list[str] = []
    if "throughput" in result:
        lines += ["| clients | callers each | items/s | owner CPU µs/item | owner CPU busy |", "|---|---|---|---|---|"]
        for r in result["throughput"]:
            lines.append(
                f"| {r['clients']} | {r['callers']} | {r['items_per_s']:,.0f} | {r['owner_cpu_us_per_item']:.1f} "
                f"| {100 * r['owner_cpu_share']:.0f} % |"
            )
        lines.append("")
    if "latency" in result:
        r = result["latency"]
        lines += ["| one caller | p50 µs | p99 µs |", "|---|---|---|"]
        lines.append(f"| the owner's own (no hop) | {r['local_p50_us']:.0f} | {r['local_p99_us']:.0f} |")
        lines.append(f"| a client's (the hop) | {r['client_p50_us']:.0f} | {r['client_p99_us']:.0f} |")
        lines += [f"| the hop adds (p50) | {r['hop_p50_us']:.0f} | |", ""]
    if "transfer" in result:
        lines += ["| array | pickle 5 out of band, ms | shared memory, ms | ratio |", "|---|---|---|---|"]
        for r in result["transfer"]:
            ratio = r["pickled_s"] / r["shm_s"]
            lines.append(f"| {_size(r['bytes'])} | {1e3 * r['pickled_s']:.3f} | {1e3 * r['shm_s']:.3f} | {ratio:.2f} |")
        lines.append("")
    return lines


def verdicts(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 51's two targets for the hop, on the verdict loop (the first loop measured if it was not)."""
    chosen = next((r for r in results if r["loop"] == VERDICT_LOOP), results[0] if results else None)
    out: list[dict[str, Any]] = []
    if chosen is None:
        return out
    if "latency" in chosen:
        hop = chosen["latency"]["hop_p50_us"]
        target = f"the hop adds <= {HOP_TARGET_US:.0f} µs to p50 at 1 caller"
        out.append(
            {
                "key": "hop",
                "target": target,
                "loop": chosen["loop"],
                "measured": f"{hop:.0f} µs",
                "met": hop <= HOP_TARGET_US,
            }
        )
    if "throughput" in chosen:
        least = min(r["items_per_s"] for r in chosen["throughput"])
        target = f">= {THROUGHPUT_TARGET:,.0f} items/s through one owner (no-op model, at every client count)"
        measured = f"{least:,.0f} items/s (the least)"
        met = least >= THROUGHPUT_TARGET
        out.append({"key": "throughput", "target": target, "loop": chosen["loop"], "measured": measured, "met": met})
    return out


def write(data: dict[str, Any], out: Path) -> str:
    """reports/shared.md from the run's data; returns its text."""
    env = data["environment"]
    lines = [
        "# The shared batcher's own cost: the hop, on a no-op model",
        "",
        regenerated_by("bench-shared", env["command"], "SHARED_BENCH_ARGS"),
        "",
        f"Generated by `{env['command']}` on {env['date']} ({env['cpus']} CPUs, load average"
        f" {env['load_average_before']} before it, Python {env['python']}). One owner process and client processes,"
        f" each a fresh interpreter, {env['seconds']} s a throughput step; wall-clock figures: on a loaded machine"
        " they are upper bounds for the latencies, lower bounds for the throughput.",
        "",
        "## Targets (issue 51)",
        "",
        f"On {VERDICT_LOOP}, the loop uvicorn runs when it is installed (as the Keras example server does); every"
        " loop's figures below.",
        "",
        "| target | loop | measured | met |",
        "|---|---|---|---|",
        *(
            f"| {v['target']} | {v['loop']} | {v['measured']} | {'yes' if v['met'] else '**no**'} |"
            for v in data["verdicts"]
        ),
        "",
    ]
    for result in data["results"]:
        lines += [f"## {result['loop']}", "", *tables(result)]
    lines += [
        "What to read in it: **throughput** is items/s through one owner with N client processes of 64 callers each"
        " (the owner's CPU per item is what one item costs it, reading, submitting, answering); **one caller** is a"
        " round trip at a time, through the owner's own batcher (no hop) and through a client (the hop over the"
        " socket and back): their difference is what sharing adds to a lone request; **transfer** compares how"
        " numpy arrays travel (pickle protocol 5, the data out of band, against a copy through shared memory)."
        ' The guide: docs/guides/scaling.md, "One batch across workers".',
    ]
    text = "\n".join(lines) + "\n"
    (out / "shared.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m benchmarks.shared")
    parser.add_argument("--loops", default="asyncio,uvloop", help="event loops, comma-separated: asyncio, uvloop")
    parser.add_argument("--loop", dest="loops", help=argparse.SUPPRESS)  # (its first spelling: one loop)
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds of a throughput step")
    parser.add_argument("--clients", default="1,2,4", help="client processes, comma-separated")
    parser.add_argument("--callers", type=int, default=64, help="callers per client process")
    parser.add_argument("--calls", type=int, default=5000, help="round trips of the latency measure")
    parser.add_argument("--repeat", type=int, default=9, help="round trips per size of the transfer measure")
    parser.add_argument("--only", choices=["throughput", "latency", "transfer"], default=None)
    parser.add_argument("--out", type=Path, default=None, help="write shared.md and shared/results.json there")
    args = parser.parse_args(argv)
    loops = [loop for loop in args.loops.split(",") if loop]
    if not loops or set(loops) - {"asyncio", "uvloop"}:
        parser.error(f"--loops takes asyncio and uvloop, got {args.loops!r}")
    recorded = [a for i, a in enumerate(argv) if a != "--out" and (i == 0 or argv[i - 1] != "--out")]
    recorded = [a for a in recorded if not a.startswith("--out=")]  # (where it writes: not how it measures)
    environment = {
        "command": shlex.join(["python", "-m", "benchmarks.shared", *recorded]),
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "cpus": os.cpu_count(),
        "load_average_before": [round(x, 1) for x in os.getloadavg()],
        "python": platform.python_version(),
        "seconds": args.seconds,
    }
    results = []
    for loop in loops:
        print(f"# shared batcher, {loop}, Python {platform.python_version()}, {platform.machine()}", flush=True)
        result = measure(args, loop)
        print("\n".join(["", *tables(result)]), flush=True)
        results.append(result)
    data = {"environment": environment, "results": results, "verdicts": verdicts(results)}
    for v in data["verdicts"]:
        print(f"target: {v['target']} ({v['loop']}): {v['measured']}: {'met' if v['met'] else 'NOT met'}")
    if args.out is not None:
        (args.out / "shared").mkdir(parents=True, exist_ok=True)
        (args.out / "shared" / "results.json").write_text(json.dumps(data, indent=1))
        write(data, args.out)
        print(f"wrote {args.out / 'shared.md'}")
    return 0


def _size(n: int) -> str:
    return f"{n // 1024 // 1024} MB" if n >= 1024 * 1024 else f"{n // 1024} KB"


if __name__ == "__main__":
    sys.exit(main())
