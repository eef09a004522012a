"""One step of load, open or closed loop, against one server: ``python -m benchmarks.openloop.generate --url URL ...``.

It prints one line of JSON: the latency percentiles (from each request's intended send time in open loop), errors,
timeouts, how late the client itself sent against the schedule (``lag``), its own CPU, and over the same window the
server's CPU (``--server-pid``), the whole machine's and the items per model call (the app's ``/stats``). The first
``--warmup`` seconds run at the same rate and are not measured.

The client is one process (uvloop when installed) with a clock thread; run it pinned with ``taskset`` to keep it off
the server's core. It says whether it **held** the schedule: its p99 lag within ``--lag-limit-ms``, or within a
tenth of the step's p99 latency where it changes that little (the timeout standing for a p99 beyond it), and its
CPU below 95 % of a core. A step it did not hold is reported as such, at the rate it was asked for.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import resource
import sys
import time
import urllib.parse
from collections.abc import Sequence
from typing import Any

from benchmarks.openloop import client, schedule
from benchmarks.openloop.stats import summary

# (imported here: an import inside a step would stall its loop)
from benchmarks.peers.load import Counts, counts_of, machine_ticks, per_call, tick_share
from benchmarks.run import _process_tree_cpu

__all__ = ["main", "run"]

CPU_LIMIT = 95.0  # % of one core: above it the client is the bottleneck, whatever its lag says


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _get_stats(host: str, port: int, path: str) -> Counts | None:
    """The app's statistics (:func:`~benchmarks.peers.load.counts_of`); None if it does not answer."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 5)
    except (OSError, TimeoutError):
        return None
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode())
        raw = await asyncio.wait_for(reader.read(), 5)
        body = json.loads(raw.split(b"\r\n\r\n", 1)[1])
        return counts_of(body)
    except (OSError, TimeoutError, ValueError, KeyError, IndexError, AttributeError):
        return None
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def _snapshot(host: str, port: int, stats_path: str, server_pid: int | None) -> dict[str, Any]:
    snap: dict[str, Any] = {"t": time.perf_counter(), "own": _own_cpu(), "ticks": machine_ticks()}
    snap["server"] = _process_tree_cpu(server_pid) if server_pid else None
    snap["stats"] = await _get_stats(host, port, stats_path) if stats_path else None
    return snap


async def _at(when: float, host: str, port: int, stats_path: str, server_pid: int | None) -> dict[str, Any]:
    await asyncio.sleep(max(0.0, when - time.perf_counter()))
    return await _snapshot(host, port, stats_path, server_pid)


def _window(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """What happened between two snapshots: CPU as % of one core (the machine's as % of all its cores)."""
    wall = b["t"] - a["t"]
    out: dict[str, Any] = {"gen_cpu": 100.0 * (b["own"] - a["own"]) / wall}
    out["server_cpu"] = (
        100.0 * (b["server"] - a["server"]) / wall if a["server"] is not None and b["server"] is not None else None
    )
    out["machine_busy"] = tick_share(a["ticks"], b["ticks"])
    out["model_calls"], out["items_per_call"], out["hold_share"] = per_call(a["stats"], b["stats"])
    return out


def _q(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    url = urllib.parse.urlsplit(args.url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    body = args.body.encode()
    common = {"host": host, "port": port, "path": args.path, "body": body}
    snap = (host, port, args.stats_path, args.server_pid)
    gc.collect()
    gc.freeze()
    gc.disable()  # no collector pause inside a step: what it would collect is freed by reference counting anyway
    sys.setswitchinterval(0.0002)  # the clock thread gets the interpreter within 0.2 ms of waking
    start = time.perf_counter() + 0.05
    begin, end = start + args.warmup, start + args.warmup + args.seconds
    snaps = [asyncio.ensure_future(_at(t, *snap)) for t in (begin, end)]
    out: dict[str, Any] = {"mode": args.mode, "seconds": args.seconds, "warmup": args.warmup}
    if args.mode == "open":
        shape = schedule.parse_shape(args.shape)
        offsets = schedule.offsets(shape, args.rate, args.warmup + args.seconds, args.seed)
        r = await client.open_loop(
            **common, offsets=offsets, start=start, max_connections=args.max_connections, timeout=args.timeout
        )
        a, b = await asyncio.gather(*snaps)
        window = [i for i, t in enumerate(r.intended) if begin <= t < end]
        lat = [r.done[i] - r.intended[i] for i in window if r.outcome[i] == client.OK]
        lag = [r.dispatched[i] - r.intended[i] for i in window]
        wait = [r.sent[i] - r.dispatched[i] for i in window if r.sent[i]]
        counts = {k: sum(1 for i in window if r.outcome[i] == k) for k in (1, 2, 3, 4)}
        out.update(
            shape=shape.name,
            rate=args.rate,
            seed=args.seed,
            scheduled=len(window),
            offered_rps=len(window) / args.seconds,
            schedule_cv=schedule.cv([offsets[i] for i in window]),
            lag_p50_ms=_q(lag, 0.5) * 1000,
            lag_p99_ms=_q(lag, 0.99) * 1000,
            lag_max_ms=max(lag, default=math.nan) * 1000,
            wait_p99_ms=_q(wait, 0.99) * 1000,
            waited=sum(1 for i in window if r.sent[i] - r.dispatched[i] > 0.0005 or not r.sent[i]),
            max_waiting=r.max_waiting,
            connections=r.connections,
            connect_errors=r.connect_errors,
        )
    else:
        c = await client.closed_loop(
            **common, connections=args.connections, until=end, think=args.think, timeout=args.timeout
        )
        a, b = await asyncio.gather(*snaps)
        window = [i for i, t in enumerate(c.done) if begin <= t < end]
        lat = [c.done[i] - c.sent[i] for i in window if c.outcome[i] == client.OK]
        counts = {k: sum(1 for i in window if c.outcome[i] == k) for k in (1, 2, 3, 4)}
        out.update(connections=args.connections, think=args.think, connect_errors=c.connect_errors)
    gc.enable()
    failed = counts[client.HTTP_ERROR] + counts[client.CONN_ERROR] + counts[client.TIMEOUT]
    out.update(
        ok=counts[client.OK],
        errors=counts[client.HTTP_ERROR] + counts[client.CONN_ERROR],
        timeouts=counts[client.TIMEOUT],
        answered_rps=counts[client.OK] / args.seconds,
        **summary(lat, failed),
        **_window(a, b),
    )
    # A lag small beside the latencies measured does not change them: within the limit or a tenth of the p99 (of
    # the timeout where the p99 is one: a client seconds late has not offered the rate, whatever the server did).
    p99 = min(out["p99_ms"], args.timeout * 1000)
    lag_ok = args.mode != "open" or out["lag_p99_ms"] <= max(args.lag_limit_ms, 0.1 * p99)
    out["held"] = bool(lag_ok and out["gen_cpu"] < CPU_LIMIT)
    out["loop"] = type(asyncio.get_running_loop()).__module__.split(".")[0]
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.openloop.generate", description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    p.add_argument("--path", default="/predict", help="POSTed to (default /predict)")
    p.add_argument("--body", default="[0, 0, 0, 0, 0, 0, 0, 0, 0, 0]", help="the JSON body of every request")
    p.add_argument("--mode", choices=("open", "closed"), default="open")
    p.add_argument("--rate", type=float, help="open loop: mean requests a second")
    p.add_argument("--shape", default="poisson", help="open loop: poisson, onoff or onoff:ON_MS/OFF_MS")
    p.add_argument("--seed", type=int, default=0, help="open loop: the schedule's seed")
    p.add_argument("--max-connections", type=int, default=512, help="open loop: then requests wait in the client")
    p.add_argument("--connections", type=int, default=8, help="closed loop: the clients")
    p.add_argument("--think", type=float, default=0.0, help="closed loop: seconds between an answer and the next")
    p.add_argument("--seconds", type=float, default=5.0, help="measured seconds")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds at the same load before, not measured")
    p.add_argument("--timeout", type=float, default=2.0, help="seconds from the intended send time to a timeout")
    p.add_argument("--lag-limit-ms", type=float, default=1.0, help="the p99 send lag the client may have (ms)")
    p.add_argument("--server-pid", type=int, help="the server's process, for its CPU over the window")
    p.add_argument("--stats-path", default="/stats", help="the app's statistics ('' for none)")
    args = p.parse_args(argv)
    if args.mode == "open" and (args.rate is None or not args.rate > 0):
        p.error("--rate must be > 0 in open loop")
    try:
        schedule.parse_shape(args.shape)
    except ValueError as e:
        p.error(f"--shape: {e}")
    if not (args.seconds > 0 and args.warmup >= 0 and args.timeout > 0):
        p.error("--seconds and --timeout must be > 0, --warmup >= 0")
    if args.connections < 1 or args.max_connections < 1:
        p.error("--connections and --max-connections must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import uvloop
    except ImportError:
        result = asyncio.run(run(args))
    else:
        result = uvloop.run(run(args))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
