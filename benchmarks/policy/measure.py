"""The simulator's cost constants, measured on the HTTP head-to-head's server: ``python -m benchmarks.policy.measure``.

It starts :mod:`~benchmarks.policy.probe` (this package's app of ``make bench-peers``, instrumented), drives it with
wrk (the head-to-head's closed loop) at a few connection counts, and derives (:func:`derive`):

* ``read``, ``pre``, ``post``: the loop's CPU per request in each part, at one connection (one request at a time),
  scaled so that their sum is the loop's CPU per request at the most connections (the loop saturated, the batches
  full), less the per-batch part: that sum sets the simulated server's capacity;
* ``submit``: the loop's CPU while one request waits for its batch of one (the batcher, the hand-over to the model's
  thread and back), one connection;
* ``model_a``, ``model_b``: a least-squares line through every ``process_batch``'s wall time in the model's thread
  against its size, at every connection count; ``model_a`` adds the hand-over's latency, one connection: the wait's
  wall time less its CPU and the model's own time;
* ``jitter``: the spread (robust standard deviation of the logarithm) of the model's times about that line;
* ``net``: wrk's time per request at one connection less the server's own time for it (``data_received`` to the
  response): the client and the network.

Writes ``benchmarks/policy/costs.json`` (or ``--out``) with the figures it derived them from. About a minute: the
model loads, then 2 s of warm-up and ``--seconds`` of load per connection count.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.peers import load
from benchmarks.run import _free_port

__all__ = ["COSTS", "derive", "main"]

ROOT = Path(__file__).resolve().parents[2]
COSTS = Path(__file__).with_name("costs.json")
PROBE = Path(__file__).with_name("probe.py")


@contextlib.contextmanager
def _server(log: Path, taskset: str | None = None) -> Iterator[load.Step | Any]:
    port = _free_port()
    cmd = [sys.executable, "-I", str(PROBE), "--repo", str(ROOT), "--port", str(port)]
    if taskset:
        cmd = ["taskset", "-c", taskset, *cmd]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the probe server exited with {proc.returncode}; its log: {log}")
            with contextlib.suppress(OSError, ValueError):
                if load.get_json(f"{url}/healthz", timeout=2).get("status") == "ok":
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the probe server is not healthy after 300 s; its log: {log}")
            time.sleep(0.5)
        yield url, proc.pid
    finally:
        import signal

        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def measure(
    connections: list[int],
    seconds: int,
    warmup: int,
    log: Path,
    model_repeats: int,
    taskset: tuple[str | None, str | None] = (None, None),
) -> list[dict[str, Any]]:
    """The model alone (``connections`` 0), then one wrk step per connection count: wrk's figures and the probe's
    sums over the step. ``taskset``: the CPUs of the server and of wrk (``taskset -c``), as the head-to-head's
    ``--taskset-server`` and ``--taskset-load``."""
    from benchmarks.keras.model import sample_inputs

    body = json.dumps([float(v) for v in sample_inputs(1)[0]])
    steps: list[dict[str, Any]] = []
    with _server(log, taskset[0]) as (url, pid):
        load.get_json(f"{url}/probe/model?repeats=20", timeout=300)  # warm
        model = load.get_json(f"{url}/probe/model?repeats={model_repeats}", timeout=600)
        steps.append({"connections": 0, "model": model})
        for conns in connections:
            load._wrk(url, conns, warmup, 1, body, taskset[1])
            load.get_json(f"{url}/probe")  # starts the sums afresh
            step = load.run_step(
                variant="ours", rnd=0, url=url, server_pid=pid, other_pids=[], connections=conns, seconds=seconds,
                warmup=0, threads=1, body=body, taskset=taskset[1],
            )  # fmt: skip
            probe = load.get_json(f"{url}/probe")
            steps.append({"connections": conns, "wrk": vars(step), "probe": probe})
            print(f"{conns} connections: {step.rps:.0f} req/s, p50 {step.p50_ms:.2f} ms", file=sys.stderr)
    return steps


#: The quantile that stands for a wall time (the model's at a batch size, the hand-over's, the server's): the lower
#: quartile, as the machine may be shared (another user's work inflates the upper part of those times; the load of
#: the HTTP benchmark itself, wrk and the model's threads beside the loop, is in every sample alike).
QUANTILE = 0.25


def _quantile(values: list[float], q: float = QUANTILE) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares ``t = a + b n`` through each batch size's :data:`QUANTILE` of times, sizes weighted alike."""
    by_size: dict[int, list[float]] = {}
    for n, t in points:
        by_size.setdefault(n, []).append(t)
    xs = sorted(by_size)
    ys = [_quantile(by_size[n]) for n in xs]
    if len(xs) < 2:
        return ys[0], 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def derive(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """The cost constants (seconds) from :func:`measure`'s steps (module docstring)."""
    alone = [(n, t / 1e9) for n, t in next(s for s in steps if s["connections"] == 0)["model"]]
    loaded = [s for s in steps if s["connections"] > 0]
    one = next(s for s in loaded if s["connections"] == 1)
    p1 = one["probe"]
    n1 = p1["requests"]
    read, pre, post = (p1[f"{k}_cpu_ns"] / n1 / 1e9 for k in ("read", "pre", "post"))
    submit = p1["wait_cpu_ns"] / n1 / 1e9
    a, b = _fit(alone)
    wait_one = _quantile([t / 1e9 for t in p1["waits"]])
    handoff = max(0.0, wait_one - submit - (a + b))
    logs = [math.log(t / (a + b * n)) for n, t in alone if a + b * n > 0 and t > 0]
    centre = statistics.median(logs)
    jitter = 1.4826 * statistics.median(abs(v - centre) for v in logs)
    server_one = statistics.median(t / 1e9 for t in p1["servers"])
    wrk_one = one["wrk"]["p50_ms"] / 1e3
    net = max(0.0, wrk_one - server_one)
    saturated = {
        s["connections"]: {
            "loop_cpu_per_request": s["probe"]["loop_cpu_ns"] / s["probe"]["requests"] / 1e9,
            "items_per_call": s["probe"]["requests"] / max(1, len(s["probe"]["batches"])),
            "model_in_server": {n: _quantile([t / 1e9 for m, t in s["probe"]["batches"] if m == n])
                                for n in sorted({n for n, _ in s["probe"]["batches"]})[-3:]},
        }
        for s in loaded
    }  # fmt: skip
    return {
        "read": read,
        "pre": pre,
        "post": post,
        "submit": submit,
        "model_a": a + handoff,
        "model_b": b,
        "net": net,
        "jitter": jitter,
        "derived_from": {
            "quantile": QUANTILE,
            "model_alone": {"a": a, "b": b, "by_size": {n: _quantile([t for m, t in alone if m == n])
                                                        for n in sorted({n for n, _ in alone})}},
            "one_connection": {"wait": wait_one, "handoff": handoff, "wrk_p50": wrk_one, "server_p50": server_one,
                               "loop_cpu_per_request": p1["loop_cpu_ns"] / n1 / 1e9},
            "by_connections": saturated,
        },
    }  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", default="1,8,64,256", help="wrk's connection counts; 1 is needed")
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--model-repeats", type=int, default=200, help="rounds of the model alone at every size")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--taskset-server", help="CPU list for the server (taskset -c), e.g. 1")
    parser.add_argument("--taskset-load", help="CPU list for wrk (taskset -c), e.g. 0")
    parser.add_argument("--out", type=Path, default=COSTS)
    parser.add_argument("--log", type=Path, default=Path("/tmp/policy-probe.log"))
    parser.add_argument("--raw", type=Path, help="also write the raw steps here (JSON); --from-raw derives from them")
    parser.add_argument("--from-raw", type=Path, help="derive from raw steps written before, measure nothing")
    args = parser.parse_args(argv)
    connections = sorted({int(c) for c in args.connections.split(",")})
    if 1 not in connections or len(connections) < 2:
        parser.error("--connections needs 1 and at least one more count")
    started = time.monotonic()
    if args.from_raw:
        steps = json.loads(args.from_raw.read_text())
    else:
        steps = measure(connections, args.seconds, args.warmup, args.log, args.model_repeats,
                        (args.taskset_server, args.taskset_load))  # fmt: skip
        if args.raw:
            args.raw.write_text(json.dumps(steps))
    costs = derive(steps)
    revision = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    costs["measured"] = {
        "command": "python -m benchmarks.policy.measure " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "revision": revision.stdout.strip(),
        "machine": f"{platform.machine()}, {platform.processor() or platform.node()}, Linux {platform.release()}",
        "took_s": round(time.monotonic() - started, 1),
        "steps": [
            {"connections": s["connections"], **{k: s["wrk"][k] for k in ("rps", "p50_ms", "p99_ms", "items_per_call",
                                                                           "server_cpu", "machine_busy")}}
            for s in steps
            if s["connections"]
        ],
    }  # fmt: skip
    args.out.write_text(json.dumps(costs, indent=2) + "\n")
    print(json.dumps({k: v for k, v in costs.items() if not isinstance(v, dict)}, indent=2))


if __name__ == "__main__":
    main()
