"""Load-test the Keras benchmark server with locust and write reports/keras.md: what batching buys.

``python -m benchmarks.run`` (what ``make benchmark`` runs):

1. times the model alone at several batch sizes (``benchmarks.keras.timing``, its own process);
2. starts the benchmark server (``benchmarks/keras/server.py``) as a subprocess on 127.0.0.1 and waits (bounded)
   until it is healthy;
3. for each user count, runs locust headless against ``/predict``, ``/optimized_predict`` and the no-model
   ``/echo_await`` and ``/echo`` (the HTTP ceilings of an endpoint that awaits its answer and of one that does not)
   in turn: interleaved, so that load from elsewhere on a shared machine hits them alike;
4. stops the server and writes the report: reports/keras.md, its plots, ``summary.csv`` and ``results.json``
   in reports/keras/; locust's own CSV, HTML and logs and the server's log go to reports/keras/raw/, which git
   ignores.

Every locust run is a separate process (locust's gevent and TensorFlow do not share one) sending traffic to
127.0.0.1 only, for a bounded time. ``--help`` lists the options: longer steps, other user counts, several
server workers, locust's ``--processes`` when one load process is not enough.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import platform
import resource
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks import report

__all__ = ["Step", "main"]

ROOT = Path(__file__).resolve().parents[1]
LOCUSTFILE = ROOT / "benchmarks" / "keras" / "locustfile.py"
ENDPOINTS = ("/predict", "/optimized_predict", "/echo_await", "/echo")
HEALTH_TIMEOUT = 300.0  # first use trains the model (seconds) after TensorFlow's import (seconds more)


@dataclass
class Step:
    """One locust run: an endpoint at a user count, and what came of it."""

    endpoint: str
    users: int
    seconds: float
    requests: int
    failures: int
    rps: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    server_cpu_s: float | None  # CPU seconds the server spent during the step (None: no /proc)
    locust_cpu_s: float  # CPU seconds the load generator spent
    wall_s: float  # wall seconds from locust's start to its exit (the span the two CPU figures cover)
    mean_batch_size: float | None  # /optimized_predict only: items per model call during the step


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _process_tree_cpu(pid: int) -> float | None:
    """CPU seconds (user + system) of ``pid`` and its descendants, read from /proc; None where there is none."""
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = 0.0
    pending = [pid]
    try:
        while pending:
            current = pending.pop()
            with open(f"/proc/{current}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
            for task in os.listdir(f"/proc/{current}/task"):
                with contextlib.suppress(OSError), open(f"/proc/{current}/task/{task}/children") as f:
                    pending += [int(child) for child in f.read().split()]
    except OSError:
        return None if current == pid else total
    return total


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.load(response)


@contextlib.contextmanager
def _server(args: argparse.Namespace, port: int, log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    command = [
        sys.executable,
        "-m",
        "benchmarks.keras.server",
        "--port",
        str(port),
        "--workers",
        str(args.workers),
        *shlex.split(args.server_args),
    ]
    print(f"starting the server: {shlex.join(command[1:])}", flush=True)
    with open(log_path, "wb") as log:
        # Its own session: a Ctrl-C at the terminal reaches the runner only, which then stops it in order.
        proc = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + HEALTH_TIMEOUT
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited with {proc.returncode}; its log: {log_path}")
            with contextlib.suppress(OSError, ValueError):
                if _get_json(f"http://127.0.0.1:{port}/healthz", timeout=2).get("status") == "ok":
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server was not healthy after {HEALTH_TIMEOUT:.0f} s; its log: {log_path}")
            time.sleep(0.5)
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # uvicorn's graceful shutdown: drain, then the lifespan's stop
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _read_aggregated(stats_csv: Path) -> dict[str, str]:
    with open(stats_csv, newline="") as f:
        for row in csv.DictReader(f):
            if row["Name"] == "Aggregated":
                return row
    raise RuntimeError(f"no Aggregated row in {stats_csv}")


def _batch_counters(port: int) -> tuple[int, int] | None:
    with contextlib.suppress(OSError, ValueError, KeyError):
        stats = _get_json(f"http://127.0.0.1:{port}/stats")
        return int(stats["batches"]), int(stats["processed"])
    return None  # several workers: each has its own batcher, /stats answers for one of them


def _run_step(
    args: argparse.Namespace, server: subprocess.Popen[bytes], port: int, endpoint: str, users: int, out: Path
) -> Step:
    name = f"{endpoint.strip('/')}_u{users}"
    command = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(LOCUSTFILE),
        "--headless",
        "--users",
        str(users),
        "--spawn-rate",
        str(users),
        "--run-time",
        f"{args.step_seconds}s",
        "--host",
        f"http://127.0.0.1:{port}",
        "--csv",
        str(out / name),
        "--html",
        str(out / f"{name}.html"),
        "--reset-stats",  # measure the steady state, not the ramp-up
        "--only-summary",
        "--loglevel",
        "WARNING",
        "--stop-timeout",
        "10",
    ]
    if args.processes > 1:
        command += ["--processes", str(args.processes)]
    env = {**os.environ, "LOCUST_ENDPOINT": endpoint, "LOCUST_WAIT": str(args.wait)}
    counters_before = _batch_counters(port) if endpoint == "/optimized_predict" and args.workers == 1 else None
    server_cpu_before = _process_tree_cpu(server.pid)
    locust_cpu_before = _children_cpu()
    started = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.step_seconds + 120)
    wall = time.monotonic() - started
    server_cpu_after = _process_tree_cpu(server.pid)
    locust_cpu = _children_cpu() - locust_cpu_before
    (out / f"{name}.log").write_text(done.stdout + done.stderr)
    if not (out / f"{name}_stats.csv").exists():
        tail = (done.stdout + done.stderr)[-2000:]
        raise RuntimeError(f"locust wrote no statistics (exit {done.returncode}); the end of its output:\n{tail}")
    row = _read_aggregated(out / f"{name}_stats.csv")
    mean_batch = None
    if counters_before is not None and (after := _batch_counters(port)) is not None:
        batches, processed = after[0] - counters_before[0], after[1] - counters_before[1]
        mean_batch = processed / batches if batches else None
    return Step(
        endpoint=endpoint,
        users=users,
        seconds=args.step_seconds,
        requests=int(row["Request Count"]),
        failures=int(row["Failure Count"]),
        rps=float(row["Requests/s"]),
        p50_ms=float(row["50%"]),
        p95_ms=float(row["95%"]),
        p99_ms=float(row["99%"]),
        mean_ms=float(row["Average Response Time"]),
        server_cpu_s=(
            server_cpu_after - server_cpu_before
            if server_cpu_before is not None and server_cpu_after is not None
            else None
        ),
        locust_cpu_s=locust_cpu,
        wall_s=wall,
        mean_batch_size=mean_batch,
    )


def _model_timing(args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    path = out / "model_timing.json"
    command = [sys.executable, "-m", "benchmarks.keras.timing", "--json", str(path), "--reps", str(args.timing_reps)]
    print("timing the model alone: " + shlex.join(command[1:]), flush=True)
    subprocess.run(command, cwd=ROOT, check=True, timeout=600, stdout=subprocess.DEVNULL)
    with open(path) as f:
        rows: list[dict[str, Any]] = json.load(f)
    return rows


def _environment(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    versions = {}
    for package in ("tensorflow-cpu", "tensorflow", "keras", "fastapi", "uvicorn", "locust", "numpy"):
        with contextlib.suppress(Exception):
            from importlib.metadata import version

            versions[package] = version(package)
    cpu = platform.processor()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    return {
        "command": shlex.join(["python", "-m", "benchmarks.run", *argv]),
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "load_average_before": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "versions": versions,
        "server_args": f"--workers {args.workers} {args.server_args}".strip(),
        "locust": {"processes": args.processes, "wait_s": args.wait, "step_seconds": args.step_seconds},
    }


def _parse_users(text: str) -> list[int]:
    try:
        users = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--users takes comma-separated ints, got {text!r}") from None
    if not users or min(users) < 1:
        raise argparse.ArgumentTypeError(f"--users must be positive, got {text!r}")
    return users


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n")[0])
    parser.add_argument("--users", type=_parse_users, default=[8, 32, 64, 128, 256], help="user counts, rising")
    parser.add_argument("--step-seconds", type=int, default=10, help="seconds of load per step (after ramp-up)")
    parser.add_argument("--endpoints", default=",".join(ENDPOINTS), help="endpoints to load, comma-separated")
    parser.add_argument("--wait", type=float, default=0.0, help="each user's pause between requests, s")
    parser.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    parser.add_argument("--processes", type=int, default=1, help="locust processes (--processes of locust)")
    parser.add_argument("--port", type=int, default=0, help="server port (0: a free one)")
    parser.add_argument("--server-args", default="", help="more server options, e.g. '--max-batch-size 64'")
    parser.add_argument("--timing-reps", type=int, default=200, help="calls per size when timing the model")
    parser.add_argument("--out", type=Path, default=ROOT / "reports", help="where keras.md and keras/ go")
    args = parser.parse_args(argv)
    if args.step_seconds < 1 or args.workers < 1 or args.processes < 1:
        parser.error("--step-seconds, --workers and --processes must be positive")
    endpoints = [e if e.startswith("/") else "/" + e for e in args.endpoints.split(",")]
    unknown = sorted(set(endpoints) - set(ENDPOINTS))
    if unknown:
        parser.error(f"unknown endpoints {unknown}; known: {list(ENDPOINTS)}")

    data_dir = args.out / "keras"
    raw_dir = data_dir / "raw"
    raw_dir.mkdir(parents=True, exist_ok=True)
    for directory in (data_dir, raw_dir):
        for old in directory.glob("*"):
            if old.suffix in {".csv", ".html", ".log", ".json", ".png"}:
                old.unlink()
    environment = _environment(args, argv)
    timing = _model_timing(args, data_dir)
    port = args.port or _free_port()
    steps: list[Step] = []
    total = len(args.users) * len(endpoints)
    started = time.monotonic()
    with _server(args, port, raw_dir / "server.log") as server:
        for users in args.users:
            for endpoint in endpoints:
                step = _run_step(args, server, port, endpoint, users, raw_dir)
                steps.append(step)
                batch = f", {step.mean_batch_size:.1f} items/batch" if step.mean_batch_size else ""
                print(
                    f"[{len(steps):>2}/{total}] {endpoint:<18} {users:>4} users: {step.rps:>8.1f} req/s,"
                    f" p50 {step.p50_ms:.0f} ms, p95 {step.p95_ms:.0f} ms, {step.failures} failures{batch}"
                    f"  ({time.monotonic() - started:.0f} s)",
                    flush=True,
                )
    results = {"environment": environment, "model_timing": timing, "steps": [asdict(s) for s in steps]}
    (data_dir / "results.json").write_text(json.dumps(results, indent=1))
    summary = report.write(results, args.out)
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
