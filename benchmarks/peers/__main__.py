"""``python -m benchmarks.peers``: the head-to-head. One Keras model, one FastAPI app shape, one batcher per variant.

Each variant runs in its own uvicorn process on 127.0.0.1 (the peers in their own environments under
``.cache/peers-server/``); once all answer, the rig checks that they give the same predictions for the same inputs,
then drives one at a time (the others paused), round after round (the order rotating; each round on servers started
afresh), in up to three modes:

- ``closed``: wrk at each connection count (each connection sends its next request when the last is answered);
- ``open``: the open-loop generator (:mod:`benchmarks.openloop.generate`) at fractions of the run's saturation
  (the ``ours-greedy`` variant's open-loop capacity, found by a ramp: :func:`_saturation`) and at fixed rates, for
  each arrival shape;
- ``mixed``: open-loop arrivals beside a closed-loop population, and the same arrivals alone.

``--windows K`` splits each round's closed-loop step into K windows that the variants take in turns, so that the
machine's drift from one minute to the next falls alike on all of them and each window pairs them seconds apart.

It writes ``reports/peers.md`` (``--report`` names it), the closed-loop steps' ``peers.csv`` and ``peers.png`` and
the open-loop steps' ``peers-open.csv`` and ``peers-open.png``. ``python -m benchmarks.openloop`` is this rig with
the open-loop modes only.

``--ours LABEL:key=value,...`` adds a variant of this package with other settings (``max_queue_time``,
``max_latency``, ``concurrency``, ...): ``--ours wait1ms:max_queue_time=0.001``. In the open-loop modes the variant
``ours-greedy`` (``max_queue_time=0, max_hold_time=0``, and a batch formed at once after a batch's end, not four turns
of the loop later: plain greedy dispatch) is added unless ``--ours greedy:...`` gives its settings or
``--no-greedy`` leaves it out.

The variant ``cohort`` is not a batcher but the ceiling of dispatch at one closed-loop step: it knows the step's
connection count and sends a batch the moment that many requests are in, with no timer and no turns of the loop
(``--variants ours,async-batcher-0.2.2,cohort --modes closed --connections 8``). No rule that must guess who is
coming can merge a cohort sooner, so a target against a peer can be read against the ratio the ceiling reaches.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.openloop import report as open_report
from benchmarks.openloop import schedule
from benchmarks.openloop.steps import OpenStep, closed_probe, run_open_step
from benchmarks.peers import envs, load, report
from benchmarks.peers.servers import ROOT, Server, Variant, agreement, running, train_model
from benchmarks.provenance import cpu_model, regenerated_by, revision

__all__ = ["Defaults", "main", "parse_args"]

BASE = ("none", "ours", "async-batcher-0.2.2", "batched", "fast-dynamic-batcher", "cohort")
NO_ENV = ("none", "ours", "cohort")  # they run in this interpreter
MODES = ("closed", "open", "mixed")
# "turns" is the Deadline policy's, which app_ours builds (0: the next batch forms at once after a batch's end).
GREEDY_SETTINGS: dict[str, Any] = {"max_queue_time": 0, "max_hold_time": 0, "turns": 0}


@dataclass(frozen=True)
class Defaults:
    """What differs between ``python -m benchmarks.peers`` and ``python -m benchmarks.openloop``."""

    prog: str = "python -m benchmarks.peers"
    target: str = "bench-peers"  # the make target that runs it (mk/*.mk), and the variable for its options
    variable: str = "PEERS_ARGS"
    modes: str = "closed,open,mixed"
    shapes: str = "poisson"
    report: str = "peers"
    title: str = "Head-to-head: one Keras model, one FastAPI app, one batcher per variant"


def _floats(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated numbers") from None
    if not values or not all(v > 0 and v != float("inf") for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: expected numbers > 0")
    return values


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


def parse_args(argv: Sequence[str] | None, defaults: Defaults = Defaults()) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=defaults.prog, description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smoke run: fewer steps, short ones, 1 round")
    p.add_argument("--modes", default=defaults.modes, help=f"comma-separated, of {', '.join(MODES)}")
    p.add_argument("--variants", default=",".join(BASE), help=f"comma-separated, of {', '.join(BASE)}")
    p.add_argument("--ours", type=_settings, action="append", default=[], help="LABEL:key=value,...: one more ours")
    p.add_argument(
        "--settings", type=_settings, action="append", default=[], help="VARIANT:key=value,...: override its settings"
    )
    p.add_argument("--no-greedy", action="store_true", help="no ours-greedy variant in the open-loop modes")
    p.add_argument("--rounds", type=int, help="rounds over the variants (default 2)")
    p.add_argument("--taskset-server", help="CPU list for the servers (taskset -c), e.g. 1")
    p.add_argument("--taskset-load", help="CPU list for wrk and the generator (taskset -c), e.g. 0")
    p.add_argument("--peers-dir", type=Path, default=ROOT / ".cache" / "peers-server")
    p.add_argument("--out-dir", type=Path, default=ROOT / "reports")
    p.add_argument(
        "--report", default=defaults.report, help=f"the report's name in --out-dir (default {defaults.report})"
    )
    closed = p.add_argument_group("closed loop (wrk)")
    closed.add_argument("--connections", type=_ints, help="comma-separated (default 1,8,64,256)")
    closed.add_argument("--seconds", type=int, help="measured seconds per step, whole (wrk's unit; default 10)")
    closed.add_argument("--warmup", type=int, help="warm-up seconds before each step, whole (default 3; 0: none)")
    closed.add_argument("--wrk-threads", type=int, default=1, help="wrk threads (at most the connections)")
    closed.add_argument(
        "--windows",
        type=int,
        default=1,
        help="split each round's step into this many windows of --seconds, the variants taking turns window by "
        "window (default 1: each variant's steps in one block)",
    )
    ol = p.add_argument_group("open loop and mixed (benchmarks.openloop.generate)")
    ol.add_argument("--shapes", default=defaults.shapes, help="arrival shapes: poisson, onoff, onoff:ON_MS/OFF_MS")
    ol.add_argument("--fractions", type=_floats, help="rates as fractions of the saturation (default 0.1,0.3,...)")
    ol.add_argument("--rates", type=_floats, default=[], help="fixed rates too, requests/s, e.g. 1000,3000,6000")
    ol.add_argument("--saturation", type=float, help="requests/s the fractions are of (default: measured)")
    ol.add_argument("--saturation-from", default=open_report.GREEDY, help="the variant whose maximum it is")
    ol.add_argument("--saturation-connections", type=int, default=64, help="its closed-loop probe's connections")
    ol.add_argument("--open-seconds", type=float, help="measured seconds per open-loop step (default 5)")
    ol.add_argument("--open-warmup", type=float, help="seconds at the same rate before, not measured (default 1)")
    ol.add_argument("--timeout", type=float, default=2.0, help="seconds from the intended send time to a timeout")
    ol.add_argument("--max-connections", type=int, default=512, help="the generator's cap, then requests wait")
    ol.add_argument("--slo-ms", type=float, default=25.0, help="the p99 bound of goodput (default 25)")
    ol.add_argument("--lag-limit-ms", type=float, default=1.0, help="the generator's p99 lag to hold (default 1)")
    ol.add_argument("--mixed-connections", type=int, help="mixed: closed-loop connections (default 8)")
    ol.add_argument("--mixed-fraction", type=float, default=0.3, help="mixed: the open-loop rate (default 0.3)")
    ol.add_argument("--mixed-think", type=float, default=0.0, help="mixed: the closed-loop clients' think seconds")
    args = p.parse_args(argv)
    quick = args.quick
    args.defaults = defaults
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not args.modes or set(args.modes) - set(MODES):
        p.error(f"--modes: expected some of {', '.join(MODES)}, got {args.modes}")
    try:
        args.shapes = [schedule.parse_shape(t) for t in args.shapes.split(",") if t.strip()]
    except ValueError as e:
        p.error(f"--shapes: {e}")
    args.connections = args.connections or ([1, 8] if quick else [1, 8, 64, 256])
    args.seconds = args.seconds or (1 if quick else 10)
    args.warmup = args.warmup if args.warmup is not None else (1 if quick else 3)
    args.rounds = args.rounds or (1 if quick else 2)
    args.fractions = args.fractions or ([0.3, 1.0] if quick else [0.1, 0.3, 0.5, 0.7, 0.8, 0.9, 1.0, 1.1, 1.3])
    args.open_seconds = args.open_seconds or (1.0 if quick else 5.0)
    args.open_warmup = args.open_warmup if args.open_warmup is not None else (0.5 if quick else 1.0)
    args.mixed_connections = args.mixed_connections if args.mixed_connections is not None else (4 if quick else 8)
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [n for n in names if n not in BASE]
    if bad:
        p.error(f"--variants: unknown {bad}; choose from {', '.join(BASE)}")
    overrides = dict(args.settings)
    unknown = set(overrides) - set(names)
    if unknown:
        p.error(f"--settings for variants not in the run: {sorted(unknown)}")
    if "cohort" in names:  # the ceiling of dispatch: its batch is the closed loop's whole population, known
        if args.modes != ["closed"] or len(args.connections) != 1:
            p.error("cohort: the ceiling of one closed-loop step; give --modes closed and one --connections count")
        overrides["cohort"] = {"size": args.connections[0], **overrides.get("cohort", {})}
    args.plan = [(n, n, overrides.get(n, {})) for n in names]
    args.plan += [(f"ours-{label}", "ours", settings) for label, settings in args.ours]
    wants_greedy = {"open", "mixed"} & set(args.modes) and not args.no_greedy
    if wants_greedy and open_report.GREEDY not in {n for n, _, _ in args.plan}:
        args.plan.append((open_report.GREEDY, "ours", dict(GREEDY_SETTINGS)))
    if len({n for n, _, _ in args.plan}) != len(args.plan):
        p.error("two variants share a name")
    if args.rounds < 1 or args.wrk_threads < 1 or args.seconds < 1 or args.warmup < 0 or args.windows < 1:
        p.error("--rounds, --wrk-threads, --seconds and --windows must be >= 1, --warmup >= 0")
    if args.windows > 1 and "closed" not in args.modes:
        p.error("--windows splits the closed loop's steps: give --modes closed (with or without the others)")
    if not (args.open_seconds > 0 and args.open_warmup >= 0 and args.timeout > 0 and args.max_connections >= 1):
        p.error("--open-seconds, --timeout and --max-connections must be > 0, --open-warmup >= 0")
    if args.mixed_connections < 0 or not args.mixed_fraction > 0 or args.mixed_think < 0:
        p.error("--mixed-connections and --mixed-think must be >= 0, --mixed-fraction > 0")
    if args.saturation is not None and not args.saturation > 0:
        p.error("--saturation must be > 0 requests/s")
    if args.saturation is None and {"open", "mixed"} & set(args.modes):
        if args.saturation_from not in {n for n, _, _ in args.plan}:
            p.error(f"--saturation-from {args.saturation_from!r} is not in the run; give --saturation RPS instead")
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


def _header(
    args: argparse.Namespace,
    command: str,
    infos: dict[str, dict[str, Any]],
    seconds: float,
    load_avg: str,
    steal: str,
    saturation: tuple[float, str] | None,
    open_steps: list[OpenStep],
) -> list[str]:
    ours = next((i for n, i in infos.items() if n == "ours" or n.startswith("ours-")), None)
    shared = ours or next(iter(infos.values()))
    stack = ", ".join(f"{k} {v}" for k, v in shared["versions"].items() if k != "async-batcher")
    dist = {"async-batcher-0.2.2": "async-batcher"}
    peers = ", ".join(f"{n} {i['versions'][dist.get(n, n)]}" for n, i in infos.items() if n in report.PEER_NAMES)
    mine = f"; ours: async-batcher {ours['versions'].get('async-batcher', '?')}" if ours else ""
    lines = [
        f"Command: `{command}`; the run took {seconds / 60:.1f} min",
        f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; revision {revision()}",
        f"Machine: {cpu_model()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}; "
        "the servers and the load generators share them"
        + (
            f" (taskset: servers {args.taskset_server}, load {args.taskset_load})"
            if args.taskset_server or args.taskset_load
            else " (no pinning)"
        ),
        f"Load average (1 min) before / after: {load_avg} (above 0 before: other work on the machine; compare the "
        "ratios within this report)",
        f"Hypervisor steal over the run: {steal} of the machine's CPU time (the time the host gave this VM's cores "
        "to others while they had work: a part of the drift in this machine's speed, not all of it)",
        f"Every server: Python {shared['python']}, {stack}; one uvicorn worker, uvloop, httptools{mine}",
        f"Peers (each in its own venv, same stack, versions checked): {peers or 'none in this run'}",
        f"Modes: {', '.join(args.modes)}; {args.rounds} round(s), the variants' order rotating; the variants not "
        "under load are paused (SIGSTOP)",
    ]
    if "closed" in args.modes:
        lines.append(
            f"Closed loop: `{load.wrk_version()}`, {args.wrk_threads} thread(s), `--timeout 2s`, POST of one row; "
            f"{args.warmup:g} s warm-up, then {args.seconds:g} s per step"
            + (
                f"; each round's step in {args.windows} windows, the variants taking turns window by window (the "
                "order reversed every other window; a warm-up before a variant's first window only): the CSV's "
                "`round` and the tables' rounds are windows, and a window's steps pair as a round"
                if args.windows > 1
                else ""
            )
        )
    if open_steps:
        gen_max = max(s.gen_cpu for s in open_steps)
        lagged = sum(1 for s in open_steps if not s.held)
        cv = {sh: statistics.median(s.schedule_cv for s in open_steps if s.shape == sh) for sh in _shape_names(args)}
        cvs = ", ".join(f"{sh} {v:.2f}" for sh, v in cv.items() if not math.isnan(v))
        sat = f"{_spaced(saturation[0])} req/s, {saturation[1]}" if saturation else "n/a"
        lines += [
            f"Open loop: `python -m benchmarks.openloop.generate`, one process (uvloop) and its clock thread, "
            f"keep-alive HTTP/1.1 connections opened as needed up to {args.max_connections} (then requests wait in "
            f"the generator, their latency still counted from their intended time); {args.open_warmup:g} s at the "
            f"rate before {args.open_seconds:g} s measured per step; timeout {args.timeout:g} s; goodput at p99 ≤ "
            f"{args.slo_ms:g} ms",
            f"Saturation (the rates' 100 %): {sat}; fractions {', '.join(f'{f:g}' for f in args.fractions)}"
            + (f"; fixed rates {', '.join(f'{r:g}' for r in args.rates)}" if args.rates else ""),
            f"Arrival shapes (the gaps' coefficient of variation, median over steps): {cvs}",
            f"The generator: at most {gen_max:.0f} % of one core in a step; it held the schedule (p99 lag ≤ "
            f"{args.lag_limit_ms:g} ms or ≤ a tenth of the step's p99, and CPU < 95 %) in "
            f"{len(open_steps) - lagged} of {len(open_steps)} steps" + (" (the others are marked †)" if lagged else ""),
        ]
        if "mixed" in args.modes:
            lines.append(
                f"Mixed: Poisson at {args.mixed_fraction:g} of the saturation beside {args.mixed_connections} "
                f"closed-loop connections of the generator (think time {args.mixed_think:g} s)"
            )
    return lines


def _share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> str:
    """The share of the CPU time between two ``(part, total)`` tick counts, as the header writes it."""
    share = load.tick_share(before, after)
    return "n/a" if share is None else f"{share:.1f} %"


def _shape_names(args: argparse.Namespace) -> list[str]:
    return [sh.name for sh in args.shapes]


def _describe(info: dict[str, Any]) -> str:
    settings = ", ".join(f"{k}={v}" for k, v in info["settings"].items()) or "no settings"
    return f"{report.DESCRIPTIONS[info['variant']]} Settings: {settings}."


def _order(variants: list[Variant], rnd: int) -> list[Variant]:
    return variants[rnd % len(variants) :] + variants[: rnd % len(variants)]


@contextlib.contextmanager
def _fresh(variants: list[Variant], log_dir: Path, taskset: str | None) -> Iterator[dict[str, Server]]:
    """The variants' servers started afresh (one round's), all paused: each resumes for its own steps only.

    A round never reuses an earlier round's processes: how fast a server runs differs from one process to the next
    and drifts from minute to minute within one (at 8 connections, one process served 2 231, then 1 905, 1 704,
    1 682 and 1 502 requests/s in five 5 s windows in a row; the first windows of six processes ranged from 1 444 to
    2 231), and servers kept for every round would give one draw to every round of a variant, hidden from the
    spread."""
    with running(variants, log_dir, taskset) as servers:
        for server in servers.values():
            server.pause()
        yield servers


def _closed(
    args: argparse.Namespace, variants: list[Variant], servers: dict[str, Server], body: str, rnd: int
) -> list[load.Step]:
    """One round of wrk's steps, on that round's servers: each variant's steps in one block, or with ``--windows``,
    each step split into windows that the variants take in turns (a machine whose speed drifts from one minute to
    the next then drifts alike for all: each window pairs the variants seconds apart, not minutes)."""
    steps: list[load.Step] = []
    order = _order(variants, rnd)
    if args.windows == 1:
        for v in order:
            for conns in args.connections:
                steps.append(_window(args, v, servers, body, rnd, conns, warmup=args.warmup))
        return steps
    for conns in args.connections:
        for w in range(args.windows):
            for v in order if w % 2 == 0 else order[::-1]:
                warmup = args.warmup if w == 0 else 0
                steps.append(_window(args, v, servers, body, rnd * args.windows + w, conns, warmup=warmup))
    return steps


def _window(
    args: argparse.Namespace,
    v: Variant,
    servers: dict[str, Server],
    body: str,
    rnd: int,
    conns: int,
    *,
    warmup: int,
) -> load.Step:
    """One wrk step of ``v``, its server resumed for it (the others stay paused)."""
    servers[v.name].resume()
    try:
        step = load.run_step(
            variant=v.name,
            rnd=rnd,
            url=servers[v.name].url,
            server_pid=servers[v.name].pid,
            other_pids=[s.pid for n, s in servers.items() if n != v.name],
            connections=conns,
            seconds=args.seconds,
            warmup=warmup,
            threads=args.wrk_threads,
            body=body,
            taskset=args.taskset_load,
        )
    finally:
        servers[v.name].pause()
    print(
        f"closed {'window' if args.windows > 1 else 'round'} {rnd + 1} {v.name} c={conns}: {step.rps:,.0f} req/s, "
        f"p99 {step.p99_ms:.1f} ms, "
        f"{step.items_per_call or 0:.1f}/call, server {step.server_cpu or 0:.0f} %, wrk {step.wrk_cpu:.0f} %",
        file=sys.stderr,
        flush=True,
    )
    return step


# The open-loop capacity, the rates' 100 % unless given: a ramp of Poisson steps of the reference variant, from
# RAMP_FROM of its closed-loop maximum, each RAMP_STEP times the last, up to that maximum. The capacity is the last
# rate before a step where a request failed or the median latency passed KNEE times the lowest median of the steps
# before it (a queue that grows: open-loop traffic past a server's capacity piles up, and the median leaps from
# milliseconds to hundreds). The lowest, not the first: one step's median moves 2x with the machine's noise. 5x, not
# more: this machine's speed drifts by a third from minute to minute (the host's other load), so a rate the ramp
# just kept up with at a 9x median (1 970/s, in the report of a158084) failed requests in every later round of the
# sweep; the sweep's 90 % must be a rate the reference serves.
# A closed loop's maximum is not it: its clients never send faster than they are answered, and at this rig's 64 or
# 256 connections its batches are as large as they can be; open-loop arrivals keep more connections open, and the
# server falls behind well before.
RAMP_FROM = 0.2
RAMP_STEP = 1.25
KNEE = 5.0


def _saturation(
    args: argparse.Namespace, closed: list[load.Step], variants: list[Variant], log_dir: Path, body: str
) -> tuple[float, str]:
    """The rates' 100 %: given, or the reference variant's open-loop capacity (a ramp up to its closed-loop maximum:
    from the wrk steps when they ran, else a probe with the generator's closed loop), on a server of its own."""
    ref = args.saturation_from
    if args.saturation is not None:
        return args.saturation, "given on the command line"
    reference = next(v for v in variants if v.name == ref)
    with _fresh([reference], log_dir, args.taskset_server) as servers:
        server = servers[ref]
        server.resume()
        mine = report.summarise([s for s in closed if s.variant == ref])
        if mine:
            best = max(mine.values(), key=lambda s: s.rps)
            top, how = best.rps, f"wrk, {best.connections} connections, median of the rounds"
        else:
            probe = closed_probe(
                url=server.url,
                server_pid=server.pid,
                body=body,
                connections=args.saturation_connections,
                seconds=max(args.open_seconds, 2.0),
                warmup=args.open_warmup,
                taskset=args.taskset_load,
            )
            top = float(probe["answered_rps"])
            how = (
                f"the generator's closed loop, {args.saturation_connections} connections, "
                f"{max(args.open_seconds, 2.0):g} s, generator CPU {probe['gen_cpu']:.0f} %"
            )
        if not top > 0:
            raise RuntimeError(f"{ref} answered nothing in its closed loop ({how})")
        capacity, ramp = _ramp(args, reference, server, body, top)
    shown = ", ".join(
        f"{_spaced(s.rate)}/s p50 {s.p50_ms:.1f} ms"
        + (f" ({s.errors + s.timeouts} failed)" if s.errors + s.timeouts else "")
        for s in ramp
    )
    return capacity, (
        f"{ref}'s open-loop capacity: the last rate of a Poisson ramp from {RAMP_FROM:.0%} of its closed-loop "
        f"maximum ({_spaced(top)} req/s: {how}), each step {RAMP_STEP:g}x the last, before one with a failed request "
        f"or a median latency above {KNEE:g}x the lowest before it (ramp: {shown})"
    )


def _spaced(x: float) -> str:
    """A whole number with its thousands apart, as the report writes them: 3 010."""
    return f"{x:,.0f}".replace(",", " ")


def _ramp(args: argparse.Namespace, v: Variant, server: Server, body: str, top: float) -> tuple[float, list[OpenStep]]:
    """The capacity ramp (RAMP_FROM, RAMP_STEP, KNEE): the capacity found, and the steps that found it."""
    steps: list[OpenStep] = []
    rate = RAMP_FROM * top
    while True:
        # (Rounded to three digits, but never above the maximum: 1 095.3/s is asked as 1 095/s, not 1 100/s.)
        asked = min(_round(rate), max(1.0, math.floor(top)))
        step = _open_step(
            args, v, server, body, rnd=0, shape="poisson", rate=asked, fraction=None, seed=9_000_000 + len(steps)
        )
        steps.append(step)
        if step.errors + step.timeouts or step.p50_ms > KNEE * min(s.p50_ms for s in steps[:-1] or steps):
            return (steps[-2].rate if len(steps) > 1 else step.rate), steps
        if rate >= top:
            return step.rate, steps
        rate = min(rate * RAMP_STEP, top)


def _open_step(args: argparse.Namespace, v: Variant, server: Server, body: str, **kw: Any) -> OpenStep:
    step = run_open_step(
        variant=v.name,
        url=server.url,
        server_pid=server.pid,
        body=body,
        seconds=args.open_seconds,
        warmup=args.open_warmup,
        timeout=args.timeout,
        max_connections=args.max_connections,
        lag_limit_ms=args.lag_limit_ms,
        taskset=args.taskset_load,
        **kw,
    )
    print(
        f"open round {step.round + 1} {v.name} {step.shape} {step.rate:,.0f}/s"
        + (f" + {step.mixed} closed" if step.mixed else "")
        + f": p50 {step.p50_ms:.1f} p99 {step.p99_ms:.1f} ms, {step.items_per_call or 0:.1f}/call, "
        f"{step.errors + step.timeouts} failed, lag p99 {step.lag_p99_ms:.2f} ms, gen {step.gen_cpu:.0f} %"
        + ("" if step.held else " (NOT HELD)"),
        file=sys.stderr,
        flush=True,
    )
    return step


def _round(rate: float) -> float:
    """Three significant digits (a rate of a report, not of a calculator), at least 1 a second."""
    return max(1.0, float(f"{rate:.3g}"))


def _open(
    args: argparse.Namespace,
    variants: list[Variant],
    servers: dict[str, Server],
    body: str,
    saturation: float,
    rnd: int,
) -> list[OpenStep]:
    """One round of the open-loop sweep and of the mixed scenario, on that round's servers."""
    rates = sorted({_round(f * saturation) for f in args.fractions} | set(args.rates))
    steps: list[OpenStep] = []

    def measure(v: Variant, rate: float, **kw: Any) -> None:
        steps.append(_open_step(args, v, servers[v.name], body, rnd=rnd, rate=rate, fraction=rate / saturation, **kw))

    # Each rate's variants one after the other, so that a drift of the machine's load weighs on all alike.
    if "open" in args.modes:
        for k, shape in enumerate(args.shapes):
            for i, rate in enumerate(rates):
                seed = 1_000_000 * k + 1000 * rnd + i  # the same arrivals for every variant of the round
                for v in _order(variants, rnd + i):
                    servers[v.name].resume()
                    try:
                        measure(v, rate, shape=shape.name, seed=seed)
                    finally:
                        servers[v.name].pause()
    if "mixed" in args.modes and args.mixed_connections > 0:
        rate = _round(args.mixed_fraction * saturation)
        for v in _order(variants, rnd):
            servers[v.name].resume()
            try:
                for scenario, mixed in (("alone", 0), ("mixed", args.mixed_connections)):
                    measure(
                        v,
                        rate,
                        shape="poisson",
                        seed=7_000_000 + rnd,
                        scenario=scenario,
                        mixed=mixed,
                        think=args.mixed_think,
                    )
            finally:
                servers[v.name].pause()
    return steps


def main(argv: Sequence[str] | None = None, defaults: Defaults = Defaults()) -> int:
    args = parse_args(argv, defaults)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    if "closed" in args.modes:
        load.wrk_path()  # fail before minutes of set-up, not after
    started = time.monotonic()
    load_before, steal_before = os.getloadavg()[0], load.steal_ticks()
    variants = _variants(args)
    train_model()
    log_dir = args.peers_dir / "logs"
    names = [v.name for v in variants]
    wants_open = bool({"open", "mixed"} & set(args.modes))
    saturation: tuple[float, str] | None = None
    with running(variants, log_dir, args.taskset_server) as servers:
        infos = {v.name: load.get_json(f"{servers[v.name].url}/info") for v in variants}
        agree, body = agreement(servers, names)
    closed: list[load.Step] = []
    for rnd in range(args.rounds if "closed" in args.modes else 0):
        with _fresh(variants, log_dir, args.taskset_server) as servers:
            closed += _closed(args, variants, servers, body, rnd)
    open_steps: list[OpenStep] = []
    if wants_open:
        saturation = _saturation(args, closed, variants, log_dir, body)
        print(f"saturation: {saturation[0]:,.0f} req/s ({saturation[1]})", file=sys.stderr, flush=True)
        for rnd in range(args.rounds):
            with _fresh(variants, log_dir, args.taskset_server) as servers:
                open_steps += _open(args, variants, servers, body, saturation[0], rnd)
    name = args.report
    open_name = f"{name}-open" if closed else name
    files = ([f"`{name}.csv` (closed loop)"] if closed else []) + (
        [f"`{open_name}.csv` (open loop)"] if open_steps else []
    )
    charts = ([("closed loop: requests/s, p99 and items per model call", f"{name}.png")] if closed else []) + (
        [("open loop: p99 against the rate, and items per model call", f"{open_name}.png")] if open_steps else []
    )
    command = shlex.join([*args.defaults.prog.split(), *sys.argv[1:]])
    shapes = {sh.name: sh.describe() for sh in args.shapes}
    text = report.markdown(
        title=args.defaults.title,
        regenerated=regenerated_by(args.defaults.target, command, args.defaults.variable),
        header=_header(
            args,
            command,
            infos,
            time.monotonic() - started,
            f"{load_before:.1f} / {os.getloadavg()[0]:.1f}",
            _share(steal_before, load.steal_ticks()),
            saturation,
            open_steps,
        ),
        variants=names,
        settings={n: _describe(infos[n]) for n in names},
        agreement=agree,
        closed_steps=closed,
        connections=args.connections,
        open_steps=open_steps,
        shapes=shapes,
        slo_ms=args.slo_ms,
        timeout=args.timeout,
        files=", ".join(files),
        charts=charts,
    )
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / f"{name}.md").write_text(text, encoding="utf-8")
    if closed:
        report.write_csv(args.out_dir / f"{name}.csv", closed)
        report.write_png(args.out_dir / f"{name}.png", closed, names, args.connections)
    if open_steps:
        open_report.write_csv(args.out_dir / f"{open_name}.csv", open_steps)
        open_report.write_png(args.out_dir / f"{open_name}.png", open_steps, names, args.slo_ms)
    print(f"wrote {args.out_dir / name}.md and its CSV and charts", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
