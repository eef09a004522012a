"""This package's batcher against Ray Serve's ``@serve.batch``, inside the same Ray Serve deployment: reports/ray.md.

``python -m benchmarks.ray_serve`` (``make bench-ray``) starts one local Ray (2 CPUs, 127.0.0.1 only) and, for
each batcher in turn, deploys examples/ray_serve/deployment.py with two replicas (same model, same batch limits)
and measures:

1. **throughput**: locust, closed loop, at a few user counts (benchmarks/run.py's step, as for reports/keras.md),
   and the mean batch size the replicas formed;
2. **a bad item**: rounds of concurrent requests with one malformed item among them: who gets an error;
3. **clients that leave**: a slower model (a sleep per model call) and a burst of requests from clients that
   give up after a timeout and disconnect: how many rows the model computed for callers already gone;
4. **a stop**: ``serve.delete`` of the app while a burst is in flight: what the callers got.

Traffic goes to 127.0.0.1 only, bounded in count and time. The results go to reports/ray/results.json, the
report to reports/ray.md (benchmarks/ray_report.py renders it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

from benchmarks import ray_report, run
from examples.ray_serve.deployment import BatchSettings, build_app
from examples.ray_serve.local import local_ray, replica_stats, wait_ready

__all__ = ["main"]

ROOT = Path(__file__).resolve().parents[1]
BATCHERS = ("package", "serve-batch")
GOOD = [0.0381, 0.0507, 0.0617, 0.0219, -0.0442, -0.0348, -0.0434, -0.0026, 0.0199, -0.0176]


def _totals(url: str, replicas: int) -> dict[str, float]:
    stats = replica_stats(url, replicas).values()
    keys = ("model_calls", "model_rows", "batches", "processed", "cancelled", "failed", "rejected")
    return {k: float(sum(s.get(k, 0) or 0 for s in stats)) for k in keys}


def _deploy(name: str, settings: BatchSettings, base: str, replicas: int) -> str:
    from ray import serve

    started = time.monotonic()
    serve.run(build_app(name, replicas=replicas, settings=settings), name=name, route_prefix=f"/{name}")
    url = f"{base}/{name}"
    wait_ready(url)
    print(f"  deployed {name} ({replicas} replicas) in {time.monotonic() - started:.0f} s", flush=True)
    return url


class _RayletTree:
    """What run._run_step reads the server's CPU from: the raylet, whose descendants are Ray's workers."""

    def __init__(self) -> None:
        pending, found = [os.getpid()], []
        while pending:  # this process's descendants, from /proc
            pid = pending.pop()
            with contextlib.suppress(OSError):  # (one that just ended)
                for task in os.listdir(f"/proc/{pid}/task"):
                    pending += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
                found.append(pid)
        self.pid = next(p for p in found if b"raylet" in Path(f"/proc/{p}/cmdline").read_bytes())


def _throughput(args: argparse.Namespace, name: str, url: str, out: Path) -> list[dict[str, Any]]:
    steps = []
    step_args = argparse.Namespace(step_seconds=args.step_seconds, processes=1, wait=0.0, workers=args.replicas)
    port = int(url.split(":")[2].split("/")[0])
    for users in args.users:
        before = _totals(url, args.replicas)
        step = run._run_step(step_args, _RayletTree(), port, f"/{name}", users, out)  # type: ignore[arg-type]
        after = _totals(url, args.replicas)
        batches = after["batches"] - before["batches"]
        row = {**asdict(step), "batcher": name}
        row["mean_batch_size"] = (after["processed"] - before["processed"]) / batches if batches else None
        steps.append(row)
        print(f"  {name:<12} {users:>4} users: {step.rps:.0f} req/s, p95 {step.p95_ms:.0f} ms", flush=True)
    return steps


async def _burst(url: str, bodies: list[Any], *, timeout: float | None = None) -> list[str]:
    """POST every body at once; each outcome: the status code, ``timeout`` (the client left) or ``error``."""
    limits = httpx.Limits(max_connections=len(bodies), max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=timeout or 60, limits=limits) as client:

        async def one(body: Any) -> str:
            try:
                return str((await client.post(url, json=body)).status_code)
            except httpx.TimeoutException:
                return "timeout"
            except httpx.HTTPError as exc:
                return f"error ({type(exc).__name__})"

        return await asyncio.gather(*(one(b) for b in bodies))


def _bad_item(url: str, rounds: int) -> dict[str, Any]:
    bodies: list[Any] = [GOOD] * 7 + [[1.0, 2.0]] + [GOOD] * 8
    good, bad = Counter[str](), Counter[str]()
    for _ in range(rounds):
        outcomes = asyncio.run(_burst(url, bodies))
        bad[outcomes[7]] += 1
        good.update(outcomes[:7] + outcomes[8:])
    return {"rounds": rounds, "good_items": dict(good), "bad_item": dict(bad)}


def _clients_leave(url: str, replicas: int, requests: int, client_timeout: float) -> dict[str, Any]:
    before = _totals(url, replicas)
    started = time.monotonic()
    outcomes = Counter(asyncio.run(_burst(url, [GOOD] * requests, timeout=client_timeout)))
    deadline = time.monotonic() + 120
    previous = None
    while time.monotonic() < deadline:  # until the replicas are done with the backlog (bounded)
        totals = _totals(url, replicas)
        if totals == previous:
            break
        previous = totals
        time.sleep(1.0)
    after = _totals(url, replicas)
    rows = after["model_rows"] - before["model_rows"]
    answered = outcomes.get("200", 0)
    return {
        "requests": requests,
        "client_timeout_s": client_timeout,
        "outcomes": dict(outcomes),
        "model_rows": rows,
        "model_calls": after["model_calls"] - before["model_calls"],
        "rows_for_callers_gone": rows - answered,
        "cancelled_seen_by_batcher": after["cancelled"] - before["cancelled"],
        "seconds": time.monotonic() - started,
    }


def _stop(name: str, url: str, requests: int, delay_before_stop: float) -> dict[str, Any]:
    from ray import serve

    timing: dict[str, float] = {}

    def delete() -> None:
        time.sleep(delay_before_stop)  # let the burst reach the replicas first
        started = time.monotonic()
        serve.delete(name)
        timing["delete_s"] = time.monotonic() - started

    stopper = threading.Thread(target=delete)
    stopper.start()
    outcomes = Counter(asyncio.run(_burst(url, [GOOD] * requests)))
    stopper.join(120)
    return {"requests": requests, "stop_after_s": delay_before_stop, "outcomes": dict(outcomes), **timing}


def _measure(args: argparse.Namespace, name: str, base: str, out: Path) -> dict[str, Any]:
    from ray import serve

    print(f"{name}:", flush=True)
    fast = BatchSettings(max_batch_size=args.max_batch_size, max_queue_time=args.max_queue_time)
    url = _deploy(name, fast, base, args.replicas)
    result: dict[str, Any] = {"throughput": _throughput(args, name, url, out)}
    result["bad_item"] = _bad_item(url, args.bad_rounds)
    serve.delete(name)
    # A slower model (a sleep per call) and small batches: a backlog builds up, as under overload.
    slow = BatchSettings(max_batch_size=8, max_queue_time=args.max_queue_time, batch_delay=args.slow_delay)
    url = _deploy(name, slow, base, args.replicas)
    result["clients_leave"] = _clients_leave(url, args.replicas, args.burst, args.client_timeout)
    result["stop"] = _stop(name, url, args.burst, args.stop_after)
    print(f"  bad item: {result['bad_item']}\n  clients leave: {result['clients_leave']}", flush=True)
    print(f"  stop: {result['stop']}", flush=True)
    return result


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    return {p: version(p) for p in ("ray", "tensorflow-cpu", "keras", "locust", "httpx") if _installed(p)}


def _installed(package: str) -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        version(package)
    except PackageNotFoundError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ray_serve", description=__doc__.split("\n")[0])
    parser.add_argument("--users", type=run._parse_users, default=[16, 64], help="locust user counts")
    parser.add_argument("--step-seconds", type=int, default=10, help="seconds of load per step")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--max-queue-time", type=float, default=0.005)
    parser.add_argument("--bad-rounds", type=int, default=5, help="rounds of 16 requests with one bad item")
    parser.add_argument("--burst", type=int, default=96, help="requests sent at once by the probes")
    parser.add_argument("--slow-delay", type=float, default=0.05, help="seconds each model call sleeps (probes)")
    parser.add_argument("--client-timeout", type=float, default=0.5, help="when the leaving clients give up")
    parser.add_argument("--stop-after", type=float, default=0.3, help="seconds into the burst the app is deleted")
    parser.add_argument("--out", type=Path, default=ROOT / "reports")
    args = parser.parse_args(argv)
    if args.step_seconds < 1 or args.replicas < 1 or args.burst < 1 or args.bad_rounds < 1:
        parser.error("--step-seconds, --replicas, --burst and --bad-rounds must be positive")

    data_dir = args.out / "ray"
    data_dir.mkdir(parents=True, exist_ok=True)
    # The replicas load the model: train it once here (its own process: no TensorFlow in this one).
    subprocess.run(
        [sys.executable, "-c", "from benchmarks.keras import model; model.load_or_train()"], cwd=ROOT, check=True
    )
    environment = {
        "command": " ".join(["python -m benchmarks.ray_serve", *argv]),
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "cpus": os.cpu_count(),
        "load_average_before": [round(x, 1) for x in os.getloadavg()],
        "python": platform.python_version(),
        "versions": _versions(),
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
    }
    results: dict[str, Any] = {"environment": environment, "batchers": {}}
    with local_ray(port=run._free_port()) as base:
        for name in BATCHERS:
            results["batchers"][name] = _measure(args, name, base, data_dir)
    for page in data_dir.glob("*.html"):  # locust's HTML pages: a megabyte each; the CSVs hold the figures
        page.unlink()
    (data_dir / "results.json").write_text(json.dumps(results, indent=1, default=str))
    print(ray_report.write(results, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
