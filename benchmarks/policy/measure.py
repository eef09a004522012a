"""The simulator's cost constants, measured on the HTTP head-to-head's server: ``python -m benchmarks.policy.measure``
(``make bench-policy-measure``).

It first checks that the machine is quiet (:mod:`~benchmarks.policy.quiet`: it refuses a busy one, saying what it
saw), then starts :mod:`~benchmarks.policy.probe` (this package's app of ``make bench-peers``, instrumented) pinned as
the head-to-head pins (the server on CPU 1, wrk on CPU 0: ``--taskset-server``, ``--taskset-load``; ``--no-pin`` for
neither), drives it with wrk at a few connection counts, and derives (:func:`derive`):

* ``read``, ``pre``, ``post``: the loop's CPU per request in each part, measured at one connection (one request at
  a time), then scaled alike so that their sum is the loop's CPU per request at the most connections (the loop
  saturated, the batches full) less the per-batch part there (``submit`` over the items per call): the loop's CPU
  per request at one connection is dearer (a batch and its iterations for every request, the caches cold), and it
  is the saturated figure that sets the simulated server's capacity;
* ``submit``: the loop's CPU while one request waits for its batch of one (the batcher, the hand-over to the model's
  thread and back), one connection;
* ``turn``, ``turn_asyncio``: the loop's CPU for one iteration, on the server's uvloop and on asyncio's own loop
  (``GET /probe/turns``: a chain of zero-delay timers, the dispatcher's turns);
* ``gil``: the share of the model's time that it holds the interpreter's lock (``GET /probe/gil``, on a second
  server given two cores: a Python counter on the loop's thread, alone and beside the model);
* ``model_a``, ``model_b``: a least-squares line through every ``process_batch``'s wall time in the model's thread
  against its size (the model alone, before the load); ``model_a`` adds the hand-over's latency, one connection: the
  wait's wall time less its CPU and the model's own time;
* ``jitter``: the spread (robust standard deviation of the logarithm) of the model's times about that line;
* ``net``: wrk's time per request at one connection less the server's own time for it (``data_received`` to the
  response): the client and the network.

Then :mod:`~benchmarks.policy.fit` fits the simulation's core count to this run's own wrk steps (``--no-fit``: not).
Writes ``benchmarks/policy/costs.json`` (or ``--out``) with the figures it derived them from and what the quiet
check saw before and after. Two to three minutes: two servers load the model, 2 s of warm-up and ``--seconds`` of
load per connection count, then the fit's simulations.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
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

from . import fit, quiet

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
    turns: int = 20000,
    gil_seconds: float = 2.0,
    gil_taskset: str | None = None,
) -> list[dict[str, Any]]:
    """The model alone (``connections`` 0), the loop's turns, then one wrk step per connection count: wrk's figures
    and the probe's sums over the step; last, on a second server (``gil_taskset``: its CPUs, all if None), the
    model's hold on the interpreter (``gil_seconds`` 0: not measured). ``taskset``: the CPUs of the server and of
    wrk (``taskset -c``), as the head-to-head's ``--taskset-server`` and ``--taskset-load``."""
    from benchmarks.keras.model import sample_inputs

    body = json.dumps([float(v) for v in sample_inputs(1)[0]])
    steps: list[dict[str, Any]] = []
    with _server(log, taskset[0]) as (url, pid):
        load.get_json(f"{url}/probe/model?repeats=20", timeout=300)  # warm
        model = load.get_json(f"{url}/probe/model?repeats={model_repeats}", timeout=600)
        steps.append({"connections": 0, "model": model})
        load.get_json(f"{url}/probe/turns?n={max(1, turns // 10)}", timeout=300)  # warm
        steps.append({"connections": -1, "turns": load.get_json(f"{url}/probe/turns?n={turns}", timeout=300)})
        for conns in connections:
            if warmup > 0:
                load._wrk(url, conns, warmup, 1, body, taskset[1])
            load.get_json(f"{url}/probe")  # starts the sums afresh
            step = load.run_step(
                variant="ours", rnd=0, url=url, server_pid=pid, other_pids=[], connections=conns, seconds=seconds,
                warmup=0, threads=1, body=body, taskset=taskset[1],
            )  # fmt: skip
            probe = load.get_json(f"{url}/probe")
            steps.append({"connections": conns, "wrk": vars(step), "probe": probe})
            print(f"{conns} connections: {step.rps:.0f} req/s, p50 {step.p50_ms:.2f} ms", file=sys.stderr)
    if gil_seconds > 0:
        with _server(log.with_suffix(".gil.log"), gil_taskset) as (url, _):
            load.get_json(f"{url}/probe/gil?seconds=0.2", timeout=300)  # warm
            gil = load.get_json(f"{url}/probe/gil?seconds={gil_seconds}", timeout=300)
            steps.append({"connections": -2, "gil": {**gil, "cpus": gil_taskset or "all"}})
            print(f"gil: {gil['gil']:.2f} of the model's time", file=sys.stderr)
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


def _scaled(one: dict[str, Any], saturated: dict[str, Any], submit: float) -> tuple[float, dict[str, float]]:
    """The factor that brings one connection's read + pre + post to the saturated loop's CPU per request less its
    per-batch part (``submit`` over the items per call), and what it was derived from."""
    n1 = one["requests"]
    parts = sum(one[f"{k}_cpu_ns"] for k in ("read", "pre", "post")) / n1 / 1e9
    requests = saturated["requests"]
    per_request = saturated["loop_cpu_ns"] / requests / 1e9
    items_per_call = requests / max(1, len(saturated["batches"]))
    target = per_request - submit / items_per_call
    if not (parts > 0 and target > 0):
        raise ValueError(f"cannot scale read + pre + post ({parts!r} s) to the saturated loop ({target!r} s)")
    return target / parts, {"one_connection": parts, "saturated_loop_cpu_per_request": per_request,
                            "saturated_items_per_call": items_per_call, "target": target}  # fmt: skip


def derive(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """The cost constants (seconds) from :func:`measure`'s steps (module docstring)."""
    alone = [(n, t / 1e9) for n, t in next(s for s in steps if s["connections"] == 0)["model"]]
    loaded = [s for s in steps if s["connections"] > 0]
    one = next(s for s in loaded if s["connections"] == 1)
    most = max(loaded, key=lambda s: s["connections"])
    p1 = one["probe"]
    n1 = p1["requests"]
    submit = p1["wait_cpu_ns"] / n1 / 1e9
    scale, scaled_from = _scaled(p1, most["probe"], submit)
    read, pre, post = (p1[f"{k}_cpu_ns"] / n1 / 1e9 * scale for k in ("read", "pre", "post"))
    a, b = _fit(alone)
    wait_one = _quantile([t / 1e9 for t in p1["waits"]])
    handoff = max(0.0, wait_one - submit - (a + b))
    logs = [math.log(t / (a + b * n)) for n, t in alone if a + b * n > 0 and t > 0]
    centre = statistics.median(logs)
    jitter = 1.4826 * statistics.median(abs(v - centre) for v in logs)
    server_one = statistics.median(t / 1e9 for t in p1["servers"])
    wrk_one = one["wrk"]["p50_ms"] / 1e3
    net = max(0.0, wrk_one - server_one)
    turns = next((s["turns"] for s in steps if s["connections"] == -1), None)
    gil = next((s["gil"] for s in steps if s["connections"] == -2), None)
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
        "turn": turns["uvloop"] if turns else 0.0,
        "turn_asyncio": turns["asyncio"] if turns else 0.0,
        "gil": gil["gil"] if gil else 0.0,
        "derived_from": {
            "quantile": QUANTILE,
            "model_alone": {"a": a, "b": b, "by_size": {n: _quantile([t for m, t in alone if m == n])
                                                        for n in sorted({n for n, _ in alone})}},
            "one_connection": {"wait": wait_one, "handoff": handoff, "wrk_p50": wrk_one, "server_p50": server_one,
                               "loop_cpu_per_request": p1["loop_cpu_ns"] / n1 / 1e9,
                               "read_pre_post": {k: p1[f"{k}_cpu_ns"] / n1 / 1e9 for k in ("read", "pre", "post")}},
            "scaled": {"connections": most["connections"], "factor": scale, **scaled_from},
            "turns": turns,
            "gil": gil,
            "by_connections": saturated,
        },
    }  # fmt: skip


def _pinning(args: argparse.Namespace) -> tuple[str | None, str | None]:
    if args.no_pin:
        return None, None
    cpus = os.cpu_count() or 1
    if cpus < 2 and (args.taskset_server is None or args.taskset_load is None):
        raise SystemExit("pinning needs two CPUs (the server on one, wrk on the other): this machine has one; "
                         "pass --no-pin to measure unpinned (the figures then say so)")  # fmt: skip
    return args.taskset_server or "1", args.taskset_load or "0"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", default="1,8,64,256", help="wrk's connection counts; 1 is needed")
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--model-repeats", type=int, default=200, help="rounds of the model alone at every size")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--turns", type=int, default=20000, help="iterations timed for a turn's cost")
    parser.add_argument(
        "--gil-seconds", type=float, default=2.0, help="seconds of each half of the GIL probe (0: none)"
    )
    parser.add_argument("--taskset-server", help="CPU list for the server (taskset -c; default 1)")
    parser.add_argument("--taskset-load", help="CPU list for wrk (taskset -c; default 0)")
    parser.add_argument("--no-pin", action="store_true", help="pin neither (the figures then say so)")
    parser.add_argument("--allow-busy", action="store_true", help="measure even where the machine is busy")
    parser.add_argument("--no-fit", action="store_true", help="leave the core count unfitted")
    parser.add_argument("--fit-duration", type=float, default=10.0, help="virtual seconds of each fit simulation")
    parser.add_argument("--workers", type=int, default=2, help="processes for the fit's simulations")
    parser.add_argument("--out", type=Path, default=COSTS)
    parser.add_argument("--log", type=Path, default=Path("/tmp/policy-probe.log"))
    parser.add_argument("--raw", type=Path, help="also write the raw steps here (JSON); --from-raw derives from them")
    parser.add_argument("--from-raw", type=Path, help="derive from raw steps written before, measure nothing")
    args = parser.parse_args(argv)
    connections = sorted({int(c) for c in args.connections.split(",")})
    if 1 not in connections or len(connections) < 2:
        parser.error("--connections needs 1 and at least one more count")
    started = time.monotonic()
    quiet_before = quiet_after = None
    taskset: tuple[str | None, str | None] = (None, None)
    if args.from_raw:
        steps = json.loads(args.from_raw.read_text())
    else:
        taskset = _pinning(args)
        if importlib.util.find_spec("tensorflow") is None or importlib.util.find_spec("uvicorn") is None:
            raise SystemExit("the probe server needs TensorFlow, Keras and uvicorn in this interpreter: run "
                             "`make bench-policy-measure` (it builds them into .venv), or pip install "
                             "-e '.[keras,fastapi,metrics]' --group bench-keras")  # fmt: skip
        load.wrk_path()
        quiet_before = quiet.require_quiet("measuring the cost constants", allow_busy=args.allow_busy)
        steps = measure(connections, args.seconds, args.warmup, args.log, args.model_repeats, taskset, args.turns,
                        args.gil_seconds)  # fmt: skip
        if args.raw:
            args.raw.write_text(json.dumps(steps))
        quiet_after = quiet.check()
        if quiet_after is not None and not quiet_after.ok:
            print(f"warning: the machine was busy after the measurement: {quiet_after.describe()}", file=sys.stderr)
    costs = derive(steps)
    revision = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    costs["measured"] = {
        "command": "python -m benchmarks.policy.measure " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "revision": revision.stdout.strip(),
        "machine": f"{platform.machine()}, {platform.processor() or platform.node()}, Linux {platform.release()}, "
                   f"{os.cpu_count()} CPUs",
        "pinned": {"server": taskset[0], "load": taskset[1]} if any(taskset) else None,
        "quiet_before": quiet_before.as_dict() if quiet_before else None,
        "quiet_after": quiet_after.as_dict() if quiet_after else None,
        "took_s": round(time.monotonic() - started, 1),
        "steps": [
            {"connections": s["connections"], **{k: s["wrk"][k] for k in ("rps", "p50_ms", "p99_ms", "items_per_call",
                                                                           "server_cpu", "machine_busy")}}
            for s in steps
            if s["connections"] > 0
        ],
    }  # fmt: skip
    args.out.write_text(json.dumps(costs, indent=2) + "\n")
    print(json.dumps({k: v for k, v in costs.items() if not isinstance(v, dict)}, indent=2))
    if not args.no_fit:
        fit.main(["--costs", str(args.out), "--duration", str(args.fit_duration), "--workers", str(args.workers)])


if __name__ == "__main__":
    main()
