"""The open-loop rig's steps: the generator (``benchmarks.openloop.generate``) run as a process of its own against
one server, alone or beside a closed-loop population (the mixed scenario), and a closed-loop probe of a server's
maximum (the saturation the open-loop rates are fractions of)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.peers.load import get_json

__all__ = ["GEN", "OpenStep", "closed_probe", "generator", "run_open_step", "settle"]

ROOT = Path(__file__).resolve().parents[2]
GEN = [sys.executable, "-m", "benchmarks.openloop.generate"]
MIXED_LEAD = 0.5  # seconds the closed-loop population runs before the open-loop generator starts


@dataclass
class OpenStep:
    """One measured open-loop step: a variant at a rate and an arrival shape, in one round, in the sweep or in the
    mixed scenario (``mixed`` closed-loop connections beside it; its ``alone`` step at the same rate without them).
    Latencies in ms from each request's intended send time; a failed request counts as slower than any answer (a
    percentile that lands on one is ``inf``)."""

    variant: str
    round: int
    shape: str
    rate: float  # asked for, requests/s
    fraction: float | None  # of the run's saturation
    scenario: str  # "sweep"; "alone" and "mixed": the mixed scenario's pair of steps
    mixed: int  # closed-loop connections beside it
    seconds: float
    scheduled: int  # requests in the measured window
    offered_rps: float  # scheduled / seconds (the schedule's own Poisson noise)
    answered_rps: float  # answered 2xx / seconds
    ok: int
    errors: int
    timeouts: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    p999_ms: float
    max_ms: float
    mean_ms: float  # of the answers
    lag_p50_ms: float  # how late the generator handed requests out against the schedule
    lag_p99_ms: float
    lag_max_ms: float
    wait_p99_ms: float  # waiting in the generator for a free connection (counted in the latency)
    max_waiting: int
    connections: int
    schedule_cv: float
    items_per_call: float | None
    server_cpu: float | None  # % of one core
    gen_cpu: float  # % of one core
    machine_busy: float | None  # % of all cores
    held: bool  # the generator kept to the schedule (lag and CPU within bounds)
    closed_rps: float | None = None  # the mixed scenario's closed-loop part
    closed_p99_ms: float | None = None
    closed_errors: int | None = None
    closed_gen_cpu: float | None = None
    hold_share: float | None = None  # of the model calls, those a hold kept back (this package's BatcherStats.held)


def generator(args: list[str], taskset: str | None) -> list[str]:
    cmd = [*GEN, *args]
    return ["taskset", "-c", taskset, *cmd] if taskset else cmd


def _result(proc: subprocess.Popen[str], what: str, timeout: float) -> dict[str, Any]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise RuntimeError(f"the {what} generator ran past {timeout:.0f} s; its stderr: {err[-2000:]}") from None
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"the {what} generator failed (exit {proc.returncode}): {err[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def settle(url: str, quiet: float = 0.2, limit: float = 10.0) -> None:
    """Wait until the server's model has taken no item for ``quiet`` seconds (a backlog left by a step past
    saturation finishes before the next step, or before the server is paused), at most ``limit`` seconds."""
    deadline = time.monotonic() + limit
    last = None
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError, KeyError):
            items = get_json(f"{url}/stats", timeout=2)["items"]
            if items == last:
                return
            last = items
        time.sleep(quiet)


def run_open_step(
    *,
    variant: str,
    rnd: int,
    url: str,
    server_pid: int,
    body: str,
    shape: str,
    rate: float,
    fraction: float | None,
    seed: int,
    seconds: float,
    warmup: float,
    timeout: float,
    max_connections: int,
    lag_limit_ms: float,
    scenario: str = "sweep",
    mixed: int = 0,
    think: float = 0.0,
    taskset: str | None = None,
) -> OpenStep:
    """One open-loop step (with ``mixed`` closed-loop connections beside it when > 0), then wait for the server to
    settle."""
    common = ["--url", url, "--body", body, "--timeout", f"{timeout:g}", "--server-pid", str(server_pid)]
    closed = None
    bound = warmup + seconds + timeout + 60
    if mixed:
        # Started first and measured over a window that covers the open-loop one (its warm-up includes the lead).
        closed_args = ["--mode", "closed", "--connections", str(mixed), "--think", f"{think:g}", "--stats-path", ""]
        closed_args += ["--warmup", f"{MIXED_LEAD + warmup:g}", "--seconds", f"{seconds + 0.5:g}"]
        closed = subprocess.Popen(
            generator([*common, *closed_args], taskset),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        time.sleep(MIXED_LEAD)
    open_args = ["--mode", "open", "--rate", f"{rate:g}", "--shape", shape, "--seed", str(seed)]
    open_args += ["--seconds", f"{seconds:g}", "--warmup", f"{warmup:g}", "--max-connections", str(max_connections)]
    open_args += ["--lag-limit-ms", f"{lag_limit_ms:g}"]
    try:
        proc = subprocess.Popen(
            generator([*common, *open_args], taskset),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        r = _result(proc, "open-loop", bound)
        c = _result(closed, "closed-loop", bound) if closed is not None else None
    finally:
        if closed is not None and closed.poll() is None:
            closed.kill()
            closed.wait()
    settle(url)
    return OpenStep(
        variant=variant,
        round=rnd,
        shape=r["shape"],
        rate=rate,
        fraction=fraction,
        scenario=scenario,
        mixed=mixed,
        seconds=seconds,
        scheduled=r["scheduled"],
        offered_rps=r["offered_rps"],
        answered_rps=r["answered_rps"],
        ok=r["ok"],
        errors=r["errors"],
        timeouts=r["timeouts"],
        p50_ms=r["p50_ms"],
        p90_ms=r["p90_ms"],
        p99_ms=r["p99_ms"],
        p999_ms=r["p999_ms"],
        max_ms=r["max_ms"],
        mean_ms=r["mean_ms"],
        lag_p50_ms=r["lag_p50_ms"],
        lag_p99_ms=r["lag_p99_ms"],
        lag_max_ms=r["lag_max_ms"],
        wait_p99_ms=r["wait_p99_ms"],
        max_waiting=r["max_waiting"],
        connections=r["connections"],
        schedule_cv=r["schedule_cv"],
        items_per_call=r["items_per_call"],
        server_cpu=r["server_cpu"],
        gen_cpu=r["gen_cpu"],
        machine_busy=r["machine_busy"],
        held=r["held"],
        closed_rps=None if c is None else c["answered_rps"],
        closed_p99_ms=None if c is None else c["p99_ms"],
        closed_errors=None if c is None else c["errors"] + c["timeouts"],
        closed_gen_cpu=None if c is None else c["gen_cpu"],
        hold_share=r.get("hold_share"),
    )


def closed_probe(
    *, url: str, server_pid: int, body: str, connections: int, seconds: float, warmup: float, taskset: str | None
) -> dict[str, Any]:
    """The generator's closed loop at ``connections`` against one server: its maximum, for the saturation."""
    args = ["--url", url, "--body", body, "--server-pid", str(server_pid), "--mode", "closed"]
    args += ["--connections", str(connections), "--seconds", f"{seconds:g}", "--warmup", f"{warmup:g}"]
    proc = subprocess.Popen(
        generator(args, taskset), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT
    )
    result = _result(proc, "closed-loop", warmup + seconds + 60)
    settle(url)
    return result
