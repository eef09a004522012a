"""The steps of the workers' benchmark: a variant's server, one step of load by locust, wrk or the open-loop
generator, and what the server said and weighed meanwhile (its ``/metrics``, its processes' memory)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks import run
from benchmarks.peers.load import LUA, wrk_path

__all__ = ["BODY", "ENDPOINT", "Variant", "memory", "open_step", "server", "wrk_step"]

ROOT = Path(__file__).resolve().parents[2]
ENDPOINT = "/optimized_predict"
BODY = "[0.0381, 0.0507, 0.0617, 0.0219, -0.0442, -0.0348, -0.0434, -0.0026, 0.0199, -0.0176]"  # a diabetes row


@dataclass(frozen=True)
class Variant:
    """A way to run the server: ``1`` (one worker), ``2`` (two workers, each its own batcher), ``2s`` (two sharing)."""

    workers: int
    shared: bool

    @classmethod
    def parse(cls, text: str) -> Variant:
        shared = text.endswith("s")
        try:
            workers = int(text.removesuffix("s"))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"a variant is a worker count, 's' after it to share: got {text!r}"
            ) from None
        if workers < 1:
            raise argparse.ArgumentTypeError(f"a variant needs 1 worker or more, got {text!r}")
        return cls(workers, shared)

    @property
    def key(self) -> str:
        return f"{self.workers}{'s' if self.shared else ''}"

    @property
    def label(self) -> str:
        if self.workers == 1:
            return "1 worker" + (", shared batcher" if self.shared else "")
        return f"{self.workers} workers, " + ("sharing one batcher" if self.shared else "batching alone")

    @property
    def server_args(self) -> str:
        return "--shared" if self.shared else ""


@contextlib.contextmanager
def server(args: argparse.Namespace, variant: Variant, log: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """The variant's server on a free port, healthy (run.py's start and graceful stop)."""
    options = argparse.Namespace(workers=variant.workers, server_args=f"{variant.server_args} {args.server_args}")
    port = run._free_port()
    with run._server(options, port, log) as proc:
        yield proc, port


def batch_totals(port: int) -> tuple[float, float] | None:
    """(items, model calls) so far, from the ``async_batcher_batch_size`` histogram of ``/metrics``."""
    from prometheus_client.parser import text_string_to_metric_families

    with contextlib.suppress(OSError, ValueError, StopIteration):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics/", timeout=10) as response:
            text = response.read().decode()
        samples = [
            s for f in text_string_to_metric_families(text) if f.name == "async_batcher_batch_size" for s in f.samples
        ]
        total = sum(s.value for s in samples if s.name.endswith("_sum"))
        calls = sum(s.value for s in samples if s.name.endswith("_count"))
        return total, calls
    return None


def items_per_call(before: tuple[float, float] | None, after: tuple[float, float] | None) -> float | None:
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (uvicorn's supervisor, its workers, multiprocessing's resource tracker)."""
    found, pending = [], [pid]
    while pending:
        current = pending.pop()
        found.append(current)
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{current}/task"):
                with contextlib.suppress(OSError), open(f"/proc/{current}/task/{task}/children") as f:
                    pending += [int(child) for child in f.read().split()]
    return found


def _kib(path: str, field: str) -> int | None:
    with contextlib.suppress(OSError, ValueError), open(path) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None


def memory(pid: int) -> dict[str, Any]:
    """The server's processes and their resident memory summed, in MiB: RSS (each process's pages, the shared ones
    counted in each) and PSS (shared pages divided among their processes; ``None`` where smaps_rollup is not
    readable)."""
    pids = _tree(pid)
    rss = [_kib(f"/proc/{p}/status", "VmRSS") for p in pids]
    pss = [_kib(f"/proc/{p}/smaps_rollup", "Pss") for p in pids]
    return {
        "processes": len(pids),
        "rss_mib": sum(r for r in rss if r is not None) / 1024,
        "pss_mib": None if any(p is None for p in pss) else sum(p for p in pss if p is not None) / 1024,
    }


@dataclass
class Step:
    """One step of load against one variant."""

    variant: str
    generator: str  # locust, wrk or open
    users: int  # closed loop: users (connections); open loop: 0
    rate: float | None  # open loop: the offered requests/s
    seconds: float
    requests: int
    failures: int  # errors and timeouts
    rps: float  # answered requests/s
    p50_ms: float
    p99_ms: float
    items_per_call: float | None
    held: bool | None = None  # open loop: whether the generator kept to its schedule

    def row(self) -> dict[str, Any]:
        return asdict(self)


def locust_step(
    args: argparse.Namespace, variant: Variant, proc: subprocess.Popen[bytes], port: int, users: int, out: Path
) -> Step:
    options = argparse.Namespace(
        step_seconds=args.step_seconds, processes=1, wait=0.0, workers=variant.workers, server_args=""
    )
    before = batch_totals(port)
    step = run._run_step(options, proc, port, ENDPOINT, users, out)
    return Step(
        variant.key,
        "locust",
        users,
        None,
        step.seconds,
        step.requests,
        step.failures,
        step.rps,
        step.p50_ms,
        step.p99_ms,
        items_per_call(before, batch_totals(port)),
    )


def wrk_step(args: argparse.Namespace, variant: Variant, port: int, users: int) -> Step:
    """wrk, ``users`` connections, one thread per core at most; its figures from peers' predict.lua."""
    threads = min(users, max(1, args.wrk_threads))
    command = [wrk_path(), "-t", str(threads), "-c", str(users), "-d", f"{args.step_seconds}s", "--timeout", "2s"]
    command += ["-s", str(LUA), f"http://127.0.0.1:{port}{ENDPOINT}"]
    before = batch_totals(port)
    done = subprocess.run(
        command,
        env={**os.environ, "PEERS_BODY": BODY},
        capture_output=True,
        text=True,
        timeout=args.step_seconds + 60,
        check=False,
    )
    after = batch_totals(port)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"wrk failed (exit {done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
    w = json.loads(lines[-1])
    seconds = w["duration_us"] / 1e6
    failures = w["connect"] + w["read"] + w["write"] + w["status"] + w["timeout"]
    return Step(
        variant.key,
        "wrk",
        users,
        None,
        seconds,
        w["requests"],
        failures,
        w["requests"] / seconds,
        w["p50_us"] / 1000,
        w["p99_us"] / 1000,
        items_per_call(before, after),
    )


def open_step(
    args: argparse.Namespace, variant: Variant, proc: subprocess.Popen[bytes], port: int, rate: float
) -> Step:
    """Poisson arrivals at ``rate`` a second for a step (after a second's warm-up at the same rate)."""
    command = [sys.executable, "-m", "benchmarks.openloop.generate", "--url", f"http://127.0.0.1:{port}"]
    command += ["--path", ENDPOINT, "--body", BODY, "--mode", "open", "--rate", str(rate), "--shape", "poisson"]
    command += ["--seconds", str(args.step_seconds), "--warmup", "1", "--timeout", "2", "--stats-path", ""]
    command += ["--server-pid", str(proc.pid)]
    before = batch_totals(port)
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=args.step_seconds + 120, check=False
    )
    after = batch_totals(port)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the open-loop generator failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
    g = json.loads(lines[-1])
    return Step(
        variant.key,
        "open",
        0,
        rate,
        float(g["seconds"]),
        int(g["scheduled"]),
        int(g["errors"] + g["timeouts"]),
        float(g["answered_rps"]),
        float(g["p50_ms"]),
        float(g["p99_ms"]),
        items_per_call(before, after),
        bool(g["held"]),
    )
