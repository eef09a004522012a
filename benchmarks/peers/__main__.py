"""``python -m benchmarks.peers``: the head-to-head. One Keras model, one FastAPI app shape, one batcher per variant.

Each variant runs in its own uvicorn process on 127.0.0.1 (the peers in their own environments under
``.cache/peers-server/``); once all answer, the rig checks that they give the same predictions for the same inputs,
then drives them in turn with wrk, round after round (the order rotating), a warm-up before each step. It writes
``reports/peers.md``, ``reports/peers.csv`` and ``reports/peers.png``.

``--ours LABEL:key=value,...`` adds a variant of this package with other settings (``max_queue_time``,
``max_latency``, ``concurrency``, ...): ``--ours wait1ms:max_queue_time=0.001``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.peers import envs, load, report
from benchmarks.peers.servers import ROOT, Variant, agreement, running, train_model
from benchmarks.provenance import cpu_model, revision

__all__ = ["main", "parse_args"]

BASE = ("none", "ours", "async-batcher-0.2.2", "batched", "fast-dynamic-batcher")
NO_ENV = ("none", "ours")  # they run in this interpreter


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected integers >= 1")
    return values


def _settings(text: str) -> tuple[str, dict[str, Any]]:
    """``label:key=value,key=value`` (values read as JSON when they parse, else as strings)."""
    label, _, rest = text.partition(":")
    if not label or not all(c.isalnum() or c in "-_." for c in label):
        raise argparse.ArgumentTypeError(f"{text!r}: expected LABEL:key=value,... with a plain label")
    settings: dict[str, Any] = {}
    for pair in filter(None, rest.split(",")):
        key, eq, raw = pair.partition("=")
        if not eq or not key.isidentifier():
            raise argparse.ArgumentTypeError(f"{pair!r} in {text!r}: expected key=value")
        try:
            settings[key] = json.loads(raw)
        except ValueError:
            settings[key] = raw
    return label, settings


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.peers", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smoke run: 1 and 8 connections, 1 s steps, 1 round")
    p.add_argument("--variants", default=",".join(BASE), help=f"comma-separated, of {', '.join(BASE)}")
    p.add_argument("--ours", type=_settings, action="append", default=[], help="LABEL:key=value,...: one more ours")
    p.add_argument(
        "--settings", type=_settings, action="append", default=[], help="VARIANT:key=value,...: override its settings"
    )
    p.add_argument("--connections", type=_ints, help="comma-separated (default 1,8,64,256)")
    p.add_argument("--seconds", type=int, help="measured seconds per step, whole (wrk's unit; default 10)")
    p.add_argument("--warmup", type=int, help="warm-up seconds before each step, whole (default 3; 0: none)")
    p.add_argument("--rounds", type=int, help="rounds over the variants (default 2)")
    p.add_argument("--wrk-threads", type=int, default=1, help="wrk threads (at most the connections)")
    p.add_argument("--taskset-server", help="CPU list for the servers (taskset -c), e.g. 1")
    p.add_argument("--taskset-load", help="CPU list for wrk (taskset -c), e.g. 0")
    p.add_argument("--peers-dir", type=Path, default=ROOT / ".cache" / "peers-server")
    p.add_argument("--out-dir", type=Path, default=ROOT / "reports")
    args = p.parse_args(argv)
    quick = args.quick
    args.connections = args.connections or ([1, 8] if quick else [1, 8, 64, 256])
    args.seconds = args.seconds or (1 if quick else 10)
    args.warmup = args.warmup if args.warmup is not None else (1 if quick else 3)
    args.rounds = args.rounds or (1 if quick else 2)
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [n for n in names if n not in BASE]
    if bad:
        p.error(f"--variants: unknown {bad}; choose from {', '.join(BASE)}")
    overrides = dict(args.settings)
    unknown = set(overrides) - set(names)
    if unknown:
        p.error(f"--settings for variants not in the run: {sorted(unknown)}")
    args.plan = [(n, n, overrides.get(n, {})) for n in names]
    args.plan += [(f"ours-{label}", "ours", settings) for label, settings in args.ours]
    if len({n for n, _, _ in args.plan}) != len(args.plan):
        p.error("two variants share a name")
    if args.rounds < 1 or args.wrk_threads < 1 or args.seconds < 1 or args.warmup < 0:
        p.error("--rounds, --wrk-threads and --seconds must be >= 1, --warmup >= 0")
    return args


def _variants(args: argparse.Namespace) -> list[Variant]:
    out = []
    for name, kind, settings in args.plan:
        if kind in NO_ENV:
            python = Path(sys.executable)
        else:
            python = envs.ensure(args.peers_dir, next(p for p in envs.PEERS if p.name == kind))
        out.append(Variant(name, kind, settings, python))
    return out


def _header(args: argparse.Namespace, infos: dict[str, dict[str, Any]], seconds: float, load_avg: str) -> list[str]:
    ours = next((i for n, i in infos.items() if n == "ours" or n.startswith("ours-")), None)
    shared = ours or next(iter(infos.values()))
    stack = ", ".join(f"{k} {v}" for k, v in shared["versions"].items() if k != "async-batcher")
    dist = {"async-batcher-0.2.2": "async-batcher"}
    peers = ", ".join(f"{n} {i['versions'][dist.get(n, n)]}" for n, i in infos.items() if n in report.PEER_NAMES)
    mine = f"; ours: async-batcher {ours['versions'].get('async-batcher', '?')}" if ours else ""
    command = shlex.join(["python", "-m", "benchmarks.peers", *sys.argv[1:]])
    return [
        f"Command: `{command}`; the run took {seconds / 60:.1f} min",
        f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; revision {revision()}",
        f"Machine: {cpu_model()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}; "
        f"servers and wrk share them"
        + (
            f" (taskset: servers {args.taskset_server}, wrk {args.taskset_load})"
            if args.taskset_server or args.taskset_load
            else " (no pinning)"
        ),
        f"Load average (1 min) before / after: {load_avg}",
        f"Every server: Python {shared['python']}, {stack}; one uvicorn worker, uvloop, httptools{mine}",
        f"Peers (each in its own venv, same stack, versions checked): {peers or 'none in this run'}",
        f"Load: `{load.wrk_version()}`, {args.wrk_threads} thread(s), `--timeout 2s`, POST of one row; "
        f"{args.warmup:g} s warm-up, then {args.seconds:g} s per step; {args.rounds} round(s), variants rotating",
    ]


def _describe(info: dict[str, Any]) -> str:
    settings = ", ".join(f"{k}={v}" for k, v in info["settings"].items()) or "no settings"
    return f"{report.DESCRIPTIONS[info['variant']]} Settings: {settings}."


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    load.wrk_path()  # fail before minutes of set-up, not after
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    variants = _variants(args)
    train_model()
    log_dir = args.peers_dir / "logs"
    with running(variants, log_dir, args.taskset_server) as servers:
        infos = {v.name: load.get_json(f"{servers[v.name].url}/info") for v in variants}
        agree, body = agreement(servers, [v.name for v in variants])
        steps: list[load.Step] = []
        for server in servers.values():
            server.pause()  # each resumes for its own steps only
        for rnd in range(args.rounds):
            order = variants[rnd % len(variants) :] + variants[: rnd % len(variants)]
            for v in order:
                servers[v.name].resume()
                for conns in args.connections:
                    step = load.run_step(
                        variant=v.name,
                        rnd=rnd,
                        url=servers[v.name].url,
                        server_pid=servers[v.name].pid,
                        other_pids=[s.pid for n, s in servers.items() if n != v.name],
                        connections=conns,
                        seconds=args.seconds,
                        warmup=args.warmup,
                        threads=args.wrk_threads,
                        body=body,
                        taskset=args.taskset_load,
                    )
                    steps.append(step)
                    print(
                        f"round {rnd + 1} {v.name} c={conns}: {step.rps:,.0f} req/s, p99 {step.p99_ms:.1f} ms, "
                        f"{step.items_per_call or 0:.1f}/call, server {step.server_cpu or 0:.0f} %, "
                        f"wrk {step.wrk_cpu:.0f} %",
                        file=sys.stderr,
                        flush=True,
                    )
                servers[v.name].pause()
    names = [v.name for v in variants]
    text = report.markdown(
        steps=steps,
        variants=names,
        connections=args.connections,
        header=_header(args, infos, time.monotonic() - started, f"{load_before:.1f} / {os.getloadavg()[0]:.1f}"),
        settings={n: _describe(infos[n]) for n in names},
        agreement=agree,
    )
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "peers.md").write_text(text, encoding="utf-8")
    report.write_csv(args.out_dir / "peers.csv", steps)
    report.write_png(args.out_dir / "peers.png", steps, names, args.connections)
    print(f"wrote {args.out_dir / 'peers.md'}, peers.csv, peers.png", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
