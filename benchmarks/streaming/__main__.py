"""``python -m benchmarks.streaming``: token streaming batched continuously, in static batches, and unbatched.

1. times the model alone (``benchmarks.streaming.timing``, a process of its own);
2. starts one server per mode (``benchmarks.streaming.server``: continuous, static, single) on 127.0.0.1 and
   waits, bounded, until each answers;
3. for each stream count (1, 8, 32, 128), runs the load (``benchmarks.streaming.client``, a process of its own)
   against each mode in turn, interleaved so that load from elsewhere on a shared machine hits the modes alike;
   reads the server's /stats before and after (model steps, rows stepped) and the CPU time of both processes;
4. stops the servers and writes reports/streaming.md, reports/streaming.csv and reports/streaming.png.

Every server runs numpy on one thread (``OPENBLAS_NUM_THREADS=1``): one model thread per server, in every mode.
``--quick`` is a smoke run (1 and 8 streams, short windows); it writes its report only where ``--out`` says.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.run import _children_cpu, _free_port, _process_tree_cpu
from benchmarks.streaming import report
from benchmarks.streaming.server import MODES

__all__ = ["main"]

ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT = 60.0
# One model thread per server (numpy's BLAS would otherwise start a thread per core, and fight the others).
THREAD_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


@contextlib.contextmanager
def _servers(modes: list[str], logs: Path) -> Iterator[dict[str, tuple[subprocess.Popen[bytes], int]]]:
    servers: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
    try:
        for mode in modes:
            port = _free_port()
            command = [sys.executable, "-m", "benchmarks.streaming.server", "--mode", mode, "--port", str(port)]
            with open(logs / f"streaming-server-{mode}.log", "wb") as log:
                servers[mode] = (
                    subprocess.Popen(
                        command, cwd=ROOT, env={**os.environ, **THREAD_ENV}, stdout=log, stderr=subprocess.STDOUT
                    ),
                    port,
                )
        for mode, (process, port) in servers.items():
            _wait_ready(mode, process, port)
        yield servers
    finally:
        for process, _ in servers.values():
            if process.poll() is None:
                process.send_signal(signal.SIGINT)  # uvicorn's graceful shutdown
        for process, _ in servers.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_ready(mode: str, process: subprocess.Popen[bytes], port: int) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"the {mode} server exited with {process.returncode}")
        with contextlib.suppress(OSError, ValueError):
            _get_json(f"http://127.0.0.1:{port}/stats")
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the {mode} server did not answer in {STARTUP_TIMEOUT:.0f} s")
        time.sleep(0.2)


def _measure(
    mode: str, process: subprocess.Popen[bytes], port: int, streams: int, args: argparse.Namespace
) -> dict[str, Any]:
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "benchmarks.streaming.client", "--url", url, "--streams", str(streams)]
    command += ["--seconds", str(args.seconds), "--warmup", str(args.warmup)]
    before, server_cpu, client_cpu = _get_json(url + "/stats"), _process_tree_cpu(process.pid), _children_cpu()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=args.seconds + args.warmup + 60)
    if done.returncode != 0:
        raise RuntimeError(f"the load for {mode} at {streams} streams failed:\n{done.stderr}")
    after, server_after = _get_json(url + "/stats"), _process_tree_cpu(process.pid)
    steps = after["steps"] - before["steps"]
    return {
        "mode": mode,
        **json.loads(done.stdout),
        "rows_per_step": (after["rows"] - before["rows"]) / steps if steps else None,
        "server_cpu_s": None if server_cpu is None or server_after is None else server_after - server_cpu,
        "client_cpu_s": _children_cpu() - client_cpu,
    }


def _model_timing() -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.streaming.timing"],
        cwd=ROOT,
        env={**os.environ, **THREAD_ENV},
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    timing: dict[str, Any] = json.loads(done.stdout)
    return timing


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m benchmarks.streaming", description=__doc__.split("\n")[0])
    parser.add_argument("--streams", default="1,8,32,128", help="concurrent stream counts, comma-separated")
    parser.add_argument("--seconds", type=float, default=8.0, help="measured seconds per step (default 8)")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds of load before each measure")
    parser.add_argument("--modes", default=",".join(MODES), help="server modes, comma-separated")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 and 8 streams, 1.5 s windows")
    parser.add_argument("--out", type=Path, default=None, help="where the report goes (default reports/)")
    parser.add_argument("--report-only", action="store_true", help="render the last full run's results again")
    args = parser.parse_args(argv)
    logs = ROOT / ".cache" / "streaming"  # the servers' logs and the last run's results (git ignores .cache/)
    if args.report_only:
        last = json.loads((logs / "results.json").read_text())
        report.write(args.out or ROOT / "reports", last["rows"], last["timing"], last["environment"])
        return 0
    if args.quick:
        args.streams, args.seconds, args.warmup = "1,8", 1.5, 0.5
    counts = [int(n) for n in args.streams.split(",")]
    modes = args.modes.split(",")
    if min(counts) < 1 or args.seconds <= 0 or args.warmup < 0 or not set(modes) <= set(MODES):
        parser.error(f"streams must be >= 1, --seconds > 0, --warmup >= 0, modes among {MODES}")
    out = args.out if args.out is not None or args.quick else ROOT / "reports"
    environment = report.environment(shlex.join(["python", "-m", "benchmarks.streaming", *argv]))
    timing = _model_timing()
    print(f"model: step {timing['step_ms']} ms (rows: ms), prefill {timing['prefill_ms']}", flush=True)
    rows = []
    started = time.monotonic()
    logs.mkdir(parents=True, exist_ok=True)
    with _servers(modes, logs) as servers:
        for streams in counts:
            for mode in modes:
                row = _measure(mode, *servers[mode], streams, args)
                rows.append(row)
                print(report.line(row) + f"  ({time.monotonic() - started:.0f} s)", flush=True)
    if out is not None:
        if not args.quick:
            results = {"rows": rows, "timing": timing, "environment": environment}
            (logs / "results.json").write_text(json.dumps(results, indent=1))
        report.write(out, rows, timing, environment)
        print(f"wrote {out / 'streaming.md'}, streaming.csv, streaming.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
