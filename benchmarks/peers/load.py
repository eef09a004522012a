"""One step of load: wrk against one server at one connection count, and what the machine did meanwhile.

wrk (Debian's package) is a compiled generator: one thread of it drives tens of thousands of requests a second,
far more than these servers answer, and the step records its CPU next to the server's so that a reader can see it
had CPU to spare. The figures come from ``predict.lua``'s ``done()`` hook (wrk's own latency histogram).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.run import _process_tree_cpu

__all__ = [
    "LUA",
    "Step",
    "get_json",
    "machine_ticks",
    "run_step",
    "steal_ticks",
    "tick_share",
    "wrk_path",
    "wrk_version",
]

LUA = Path(__file__).with_name("predict.lua")


@dataclass
class Step:
    """One measured step: a variant at a connection count, in one round."""

    variant: str
    round: int
    connections: int
    seconds: float  # wall seconds wrk ran
    requests: int
    rps: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float
    errors: int  # connect, read and write errors and non-2xx answers
    timeouts: int
    items_per_call: float | None  # from the app's /stats: items the model took per call during the step
    server_cpu: float | None  # % of one core: the server and its child processes
    wrk_cpu: float  # % of one core
    machine_busy: float | None  # % of all cores, the whole machine (other processes included)
    others_cpu: float | None  # % of one core: the other variants' servers, paused meanwhile
    hold_share: float | None = None  # of the model calls, those a hold kept back (this package's BatcherStats.held)


def wrk_path() -> str:
    found = shutil.which("wrk")
    if found is None:
        raise RuntimeError("wrk is not installed: `apt-get install -y wrk` (Debian) or see https://github.com/wg/wrk")
    return found


def wrk_version() -> str:
    done = subprocess.run([wrk_path(), "--version"], capture_output=True, text=True, check=False)
    return (done.stdout or done.stderr).splitlines()[0].split(" Copyright")[0].strip()


def get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.load(response)


def _cpu_ticks() -> list[int] | None:
    """The clock ticks of all CPUs since boot, by kind (/proc/stat's first line); None without /proc."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            return [int(v) for v in f.readline().split()[1:]]
    except OSError:
        return None


def machine_ticks() -> tuple[int, int] | None:
    """(busy, total) clock ticks of all CPUs since boot, from /proc/stat; None without /proc."""
    fields = _cpu_ticks()
    if fields is None:
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def steal_ticks() -> tuple[int, int] | None:
    """(steal, total) clock ticks of all CPUs since boot, from /proc/stat: the time the hypervisor gave this VM's
    CPUs to others while they had work; None without /proc or without the column."""
    fields = _cpu_ticks()
    return (fields[7], sum(fields)) if fields is not None and len(fields) > 7 else None


def tick_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share in % of the CPU time between two ``(part, total)`` tick counts (:func:`machine_ticks`,
    :func:`steal_ticks`); None if either is missing or no tick passed."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return 100.0 * (after[0] - before[0]) / (after[1] - before[1])


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _wrk(url: str, connections: int, seconds: int, threads: int, body: str, taskset: str | None) -> dict[str, Any]:
    cmd = [wrk_path(), "-t", str(min(threads, connections)), "-c", str(connections), "-d", f"{seconds}s"]
    cmd += ["--timeout", "2s", "-s", str(LUA), f"{url}/predict"]
    if taskset:
        cmd = ["taskset", "-c", taskset, *cmd]
    done = subprocess.run(
        cmd, env={**os.environ, "PEERS_BODY": body}, capture_output=True, text=True, timeout=seconds + 60, check=False
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"wrk failed (exit {done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _cpu_of(pids: list[int]) -> float | None:
    """CPU seconds of these processes and their descendants, all together."""
    total = 0.0
    for pid in pids:
        cpu = _process_tree_cpu(pid)
        if cpu is None:
            return None
        total += cpu
    return total


Counts = tuple[float, float, float | None]


def counts_of(body: Any) -> Counts:
    """From an app's ``/stats``: (model calls, items, batches a hold kept back: None for a batcher without a hold to
    count). Raises KeyError, ValueError or AttributeError on a body that is not one."""
    held = body.get("held")
    return float(body["model_calls"]), float(body["items"]), None if held is None else float(held)


def per_call(before: Counts | None, after: Counts | None) -> tuple[float | None, float | None, float | None]:
    """Between two readings of ``/stats``: (model calls, items per call, the share of the calls a hold kept back);
    None for what they do not tell (no reading, no call, or no hold to count)."""
    if before is None or after is None or after[0] <= before[0]:
        return None, None, None
    calls = after[0] - before[0]
    held = None if before[2] is None or after[2] is None else (after[2] - before[2]) / calls
    return calls, (after[1] - before[1]) / calls, held


def _stats(url: str) -> Counts | None:
    try:
        return counts_of(get_json(f"{url}/stats"))
    except (OSError, ValueError, KeyError, AttributeError):
        return None


def run_step(
    *,
    variant: str,
    rnd: int,
    url: str,
    server_pid: int,
    other_pids: list[int],
    connections: int,
    seconds: int,
    warmup: int,
    threads: int,
    body: str,
    taskset: str | None = None,
) -> Step:
    """Warm up (not measured), then measure one step."""
    if warmup > 0:
        _wrk(url, connections, warmup, threads, body, taskset)
    stats0, cpu0, ticks0, wrk0 = _stats(url), _process_tree_cpu(server_pid), machine_ticks(), _children_cpu()
    idle0 = _cpu_of(other_pids)
    started = time.monotonic()
    w = _wrk(url, connections, seconds, threads, body, taskset)
    wall = time.monotonic() - started
    stats1, cpu1, ticks1, wrk1 = _stats(url), _process_tree_cpu(server_pid), machine_ticks(), _children_cpu()
    idle1 = _cpu_of(other_pids)
    _, items_per_call, hold_share = per_call(stats0, stats1)
    busy = tick_share(ticks0, ticks1)
    duration = w["duration_us"] / 1e6
    return Step(
        variant=variant,
        round=rnd,
        connections=connections,
        seconds=duration,
        requests=w["requests"],
        rps=w["requests"] / duration if duration else 0.0,
        p50_ms=w["p50_us"] / 1000,
        p95_ms=w["p95_us"] / 1000,
        p99_ms=w["p99_us"] / 1000,
        mean_ms=w["mean_us"] / 1000,
        max_ms=w["max_us"] / 1000,
        errors=w["connect"] + w["read"] + w["write"] + w["status"],
        timeouts=w["timeout"],
        items_per_call=items_per_call,
        hold_share=hold_share,
        server_cpu=None if cpu0 is None or cpu1 is None else 100.0 * (cpu1 - cpu0) / wall,
        wrk_cpu=100.0 * (wrk1 - wrk0) / wall,
        machine_busy=busy,
        others_cpu=None if idle0 is None or idle1 is None else 100.0 * (idle1 - idle0) / wall,
    )
