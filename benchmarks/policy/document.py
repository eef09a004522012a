"""reports/policy.md: every paragraph that states a finding is written from the run's own data (the fit, the
calibration, the validation against the paired real runs, the sensitivity, the verdicts); the fixed text says only
how the simulator works and what each figure means."""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from benchmarks.provenance import regenerated_by

from . import calibrate, report, sensitivity, validation
from . import costs as costs_file
from .pairs import Paired, default_policy
from .runner import ROOT, Run
from .scenarios import MAX_BATCH_SIZE
from .sim.server import Costs
from .sim.traffic import Scenario
from .variants import CONSTRUCTOR, PEERS, RECOMMENDED, Variant
from .verdicts import KEEP_UP, P99_RATIO, SERVED_RATIO, judge

__all__ = ["Context", "render"]

DEFAULTS = [RECOMMENDED.name, CONSTRUCTOR.name]


@dataclass
class Context:
    """What a run of ``python -m benchmarks.policy`` hands its report."""

    args: argparse.Namespace
    argv: list[str] | None
    costs: Costs
    cores: float
    fitted: float | None
    runs: list[Run]
    grid: list[Variant]
    candidates: list[str]
    missing: dict[str, str]
    rigs: list[tuple[calibrate.Rig, list[calibrate.Point]]]
    sims: calibrate.Sims
    modes: tuple[float, ...]
    real: list[Paired]
    checked: validation.SimCells | None
    swept: list[sensitivity.Row] | None
    took: float


def _command(argv: list[str] | None) -> str:
    given = argv if argv is not None else sys.argv[1:]
    return "python -m benchmarks.policy" + ("" if not given else " " + " ".join(given))


def _header(c: Context) -> list[str]:
    runs = c.runs
    revision = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    virtual = sum(r.result["virtual_s"] for r in runs)
    wall = sum(r.result["wall_s"] for r in runs)
    ratios = sorted(r.result["virtual_s"] / r.result["wall_s"] for r in runs)
    slowest = min(runs, key=lambda r: r.result["virtual_s"] / r.result["wall_s"])
    reads = {r.variant.name: r.result["wall_clock_reads"] for r in runs if r.result["wall_clock_reads"]}
    versions = {r.variant.kind: r.result["version"] for r in runs}
    scenarios = len({r.scenario.name for r in runs})
    command = _command(c.argv)
    lines = [
        "# Dispatch policy on a simulated server (`make bench-policy`)",
        "",
        regenerated_by("bench-policy", command, "POLICY_ARGS"),
        "",
        f"- Command: `{command}`; {len(runs)} runs in {c.took:.0f} s on {c.args.workers} worker process(es)",
        f"- Date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; revision {revision.stdout.strip()}; "
        f"{platform.machine()}, Python {platform.python_version()}",
        f"- Batchers: ours {versions.get('ours', '-')}"
        + "".join(f", {k} {v}" for k, v in versions.items() if k != "ours")
        + " (each peer in its own environment, as its README shows it: `benchmarks/policy/sim/batchers.py`)",
        f"- Scenarios: {scenarios}, {c.args.duration:g} virtual seconds each (the first {c.args.warmup:g} s not "
        f"counted), at seeds {', '.join(map(str, c.args.seeds))}: the same seed gives the same numbers",
        f"- Speed: {virtual:.0f} virtual seconds in {wall:.1f} s of wall time, {virtual / wall:.0f}x faster than real "
        f"time over all runs (per run: median {statistics.median(ratios):.0f}x, slowest {ratios[0]:.0f}x: "
        f"{slowest.variant.name} on {slowest.scenario.name})",
        "- Clocks: every batcher times itself by the event loop's clock (none patched); wall-clock reads during the "
        "runs: " + ("none" if not reads else ", ".join(f"{k} {v}" for k, v in sorted(reads.items()))),
    ]
    lines += [f"- Not run: {kind} ({why})" for kind, why in sorted(c.missing.items())]
    return lines


def _status(c: Context) -> list[str]:
    lines = ["", "## Status", ""]
    _, turns = default_policy()
    if c.checked is None:
        verdict = validation.Agreement(False, ["the validation did not run (`--no-validation`)"], 0, 0)
    else:
        verdict = validation.agreement(c.real, validation.simulated(c.checked))
    lines += validation.decision_lines(c.real, verdict, turns)
    return lines


def _fit_error(c: Context, cores: float) -> float | None:
    fit = costs_file.provenance(c.args.costs).get("fit") or {}
    return next((row["error"] for row in fit.get("table", []) if row["cores"] == cores), None)


def _cores(c: Context) -> str:
    if c.args.cores is not None:
        fitted = f"the fitted count is {c.fitted:g}" if c.fitted is not None else "none was fitted"
        return f"Cores: {c.cores:g}, given on the command line ({fitted})."
    if c.fitted is None:
        return (f"Cores: {c.cores:g}, not fitted: `costs.json` holds no fit (`python -m benchmarks.policy.fit`, which "
                "`python -m benchmarks.policy.measure` runs): an assumption, not a measurement.")  # fmt: skip
    errors = [(n, _fit_error(c, n)) for n in (c.fitted, 1.0, 2.0)]
    shown = ", ".join(f"{e:.0%} at {n:g}" for n, e in errors if e is not None)
    return (f"Cores: {c.cores:g}, fitted to the closed loops the constants were measured with (the root mean square "
            f"of the logarithms of the simulated requests/s and p50 over the measured: {shown}).")  # fmt: skip


def _model(c: Context) -> list[str]:
    k = c.costs
    lines = [
        "",
        "## The simulated server",
        "",
        "This package's batcher, and each peer, run unchanged on an asyncio event loop whose clock is virtual "
        "(`benchmarks/policy/sim/vloop.py`): it jumps to the next timer when the loop is idle, and the server's own "
        "CPU moves it while nothing else runs, so timers fire late and the requests that arrived meanwhile are read "
        "together, as on a busy server. Each request costs the loop `read` when it arrives, `pre` when its handler "
        "runs up to `await process(item)`, `post` once the result is back; every iteration of the loop that runs a "
        "callback costs it a `turn` (a policy's turns after a batch's end are iterations); the model is the "
        "batcher's plain `def process_batch` in a one-thread executor that runs no thread: `submit` of the loop's "
        "CPU per batch, then `model_a + model_b * n` seconds in the model's thread (times a seeded lognormal factor "
        "of spread `jitter`), which holds the interpreter's lock for the share `gil` of that time. Half of `net` "
        "before a request reaches the server, half before its answer reaches its client. Latency: from the send "
        "(an open loop's intended send time) to the answer; served throughput: answers a second within the counted "
        "time.",
        "",
        "The loop and the model's thread share the cores as an OS scheduler shares runnable threads, and the lock as "
        "the interpreter does: while both have work, each runs at `min(1, cores / 2, 1 / (1 + gil))` of a core.",
        "",
        _cores(c),
        "",
        "| constant | value | what |",
        "|---|---:|---|",
        f"| read | {k.read * 1e6:.1f} µs | loop CPU to read a request (uvicorn's `data_received`) |",
        f"| pre | {k.pre * 1e6:.1f} µs | loop CPU of the handler before the batcher |",
        f"| post | {k.post * 1e6:.1f} µs | loop CPU from the result to the response written |",
        f"| submit | {k.submit * 1e6:.1f} µs | loop CPU per batch (the batcher, the hand-over to the model's thread "
        "and back) |",
        f"| turn | {k.turn * 1e6:.2f} µs | loop CPU per iteration, uvloop (`turn_asyncio` {k.turn_asyncio * 1e6:.2f} "
        "µs: asyncio's loop, for `--clock asyncio`) |",
        f"| model_a | {k.model_a * 1e3:.3f} ms | the model call's fixed time, with the hand-over's latency |",
        f"| model_b | {k.model_b * 1e6:.2f} µs | the model call's time per item |",
        f"| gil | {k.gil:.2f} | the share of the model call's time that it holds the interpreter's lock |",
        f"| net | {k.net * 1e6:.0f} µs | outside the server: the client and the network, both ways |",
        f"| jitter | {k.jitter:.3f} | the model's times' spread about `a + b·n` (standard deviation of their "
        "logarithm) |",
        "",
        f"Capacity (the scenarios' rates are fractions of it): {k.capacity(MAX_BATCH_SIZE, c.cores):.0f} requests a "
        f"second on {c.cores:g} core(s), at full batches of {MAX_BATCH_SIZE} (the loop's CPU alone would allow "
        f"{1 / (k.request_cpu + k.submit / MAX_BATCH_SIZE):.0f}/s, the model's alone "
        f"{MAX_BATCH_SIZE / (k.model_a + k.model_b * MAX_BATCH_SIZE):.0f}/s).",
    ]
    missing = [name for name in ("turn", "gil") if getattr(k, name) == 0]
    if missing:
        lines += ["", f"**Not measured**: {' and '.join(f'`{n}`' for n in missing)} (0 in `costs.json`, which predates "
                      "their measurement): `make bench-policy-measure` measures them."]  # fmt: skip
    return lines + _provenance(c)


def _provenance(c: Context) -> list[str]:
    prov = costs_file.provenance(c.args.costs)
    measured = prov["measured"]
    pinned = measured.get("pinned")
    where = (f"pinned (the server on CPU {pinned['server']}, wrk on CPU {pinned['load']})" if pinned
             else "not pinned (or not recorded: older measurements did not say)")  # fmt: skip
    before = measured.get("quiet_before")
    if before is None:
        quiet = "no quiet check recorded (older measurements made none)"
    else:
        state = "quiet" if before["ok"] else "BUSY (measured with --allow-busy)"
        quiet = f"the machine {state} before: other processes {before['others_pct_of_core']:.1f} % of a core"
    lines = [
        "",
        f"Measured by `{measured.get('command', 'python -m benchmarks.policy.measure')}` on "
        f"{measured.get('date', '?')} (revision {measured.get('revision', '?')}; {measured.get('machine', '?')}), "
        f"{where}; {quiet}: the head-to-head's server for this package, instrumented, under wrk "
        "(`benchmarks/policy/measure.py` says how each constant is derived; `benchmarks/policy/costs.json` holds the "
        "figures).",
    ]
    if measured.get("steps"):
        lines += ["", "| wrk connections | req/s | p50 (ms) | items/call | server CPU | machine busy |",
                  "|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
        for st in measured["steps"]:
            lines.append(
                f"| {st['connections']} | {st['rps']:.0f} | {st['p50_ms']:.2f} | {st['items_per_call'] or 0:.1f} | "
                f"{st['server_cpu'] or 0:.0f} % | {st['machine_busy'] or 0:.0f} % |"
            )
    return lines


def _calibration(c: Context) -> list[str]:
    lines = ["", "## Calibration: the simulation beside the real server", ""]
    fit = costs_file.provenance(c.args.costs).get("fit") or {}
    if fit.get("table"):
        lines += ["The core count's fit (`benchmarks/policy/fit.py`): the error at each count tried.", "",
                  "| cores | error |", "|---:|---:|"]  # fmt: skip
        lines += [f"| {row['cores']:g}{' (fitted)' if row['cores'] == c.fitted else ''} | {row['error']:.1%} |"
                  for row in fit["table"]]  # fmt: skip
        lines.append("")
    if any(pts for _, pts in c.rigs):
        cal_lines, ok = calibrate.render(c.rigs, c.sims, c.modes, c.cores)
        lines += cal_lines
        lines += ["", f"Verdict on the report's mode ({c.cores:g} cores), every rig: {'PASS' if ok else 'FAIL'} "
                      "(`python -m benchmarks.policy.calibrate` reruns it)."]  # fmt: skip
    else:
        lines.append("Not run (`--no-calibration`, or no measured closed loops to compare with).")
    return lines


def _validation(c: Context) -> list[str]:
    lines = ["", "## Validation: the decision, simulated and real", ""]
    if c.checked is None:
        return [*lines, "Not run (`--no-validation`)."]
    policy, _ = default_policy()
    table, _ = validation.render(c.real, c.checked, policy)
    return [*lines, *table, "", "The real pairs: `python -m benchmarks.policy.validate` (`benchmarks/policy/"
                                "measured/turns-closed.csv`, `turns-open.csv`)."]  # fmt: skip


def _sensitivity(c: Context) -> list[str]:
    lines = ["", "## Sensitivity: the decision's simulation, each constant halved and doubled", ""]
    if c.swept is None:
        return [*lines, "Not run (`--no-sensitivity`)."]
    return [*lines, *sensitivity.render(c.swept, c.args.seeds[0])]


def _targets(c: Context, judged: list[Any], peers: list[str]) -> tuple[list[str], list[str]]:
    lines = ["", "## Targets (issue 44)", ""]
    lines += [
        f"Per scenario, against the grid (fixed settings: `max_queue_time` in {_values(c.grid, 'max_queue_time')} s "
        f"by `max_hold_time` in {_values(c.grid, 'max_hold_time')} s, `max_batch_size=256`, `max_queue_size=4096`, "
        "the policies' four turns; `greedy` is `max_queue_time=0` without a hold), the setting judged and its twin "
        f"left out of it: p99 at most {P99_RATIO}x the grid's best, judged within capacity only (where the setting "
        f"served at least {KEEP_UP:.0%} of what was sent: past it, a p99 only grows with the run's length); served "
        f"throughput at least {SERVED_RATIO}x the grid's best; no peer better. Over the seeds: PASS where met at "
        "every seed, FAIL where missed at every one, UNDECIDED else. Figures: the first seed's; ratios: the median "
        "over the seeds.",
        "",
    ]
    totals = []
    for default, kwargs in ((RECOMMENDED.name, RECOMMENDED.kwargs), (CONSTRUCTOR.name, CONSTRUCTOR.kwargs or "none")):
        table, (met, missed, undecided) = report.targets_table(judged, default, peers)
        totals.append(f"{default}: {met} met, {missed} missed, {undecided} undecided")
        lines += [f"### {default} (`{kwargs}`)", "", *table, "",
                  f"{met} targets met, {missed} missed, {undecided} undecided.", ""]  # fmt: skip
    return lines, totals


def render(c: Context) -> list[str]:
    judged = judge(c.runs)
    peers = [p.name for p in PEERS if any(r.variant.name == p.name for r in c.runs)]
    lines = [*_header(c), *_status(c), *_model(c), *_calibration(c), *_validation(c), *_sensitivity(c)]
    target_lines, totals = _targets(c, judged, peers)
    lines += target_lines
    if c.candidates:
        lines += ["## Candidates for the default", ""]
        lines += [
            "The same targets for each setting considered for the default (their `policy=` in the CSV): `greedy` "
            "at other turns (`greedy-turnsT`: `Deadline(0, turns=T)`), the same without the regather "
            "(`-noregather`), latency budgets (`budgetXms`), closed-loop holds (`holdXms-...`; `wait0ms+holdXms`: "
            "over `greedy`). Misses: the scenario, and which target (p: p99, s: served, v: a peer better; ?: "
            "undecided).",
            "",
            *report.candidates_table(judged, c.candidates, peers),
            "",
        ]
    lines += ["## Which setting serves which traffic", ""]
    lines += [
        "A setting serves a scenario where its p99 (within capacity) and served targets pass at every seed.",
        "",
        *report.conflicts(judged, c.grid),
        "",
        *report.serves_table(judged, c.grid, DEFAULTS),
        "",
        "## Per scenario",
        "",
        "The defaults, the peers, the grid's best, `greedy` and the three candidates that meet the most targets, at "
        "the first seed; every variant's figures at every seed are in the CSV.",
        "",
    ]
    top = report.leading(judged, c.candidates, peers, 3)
    for j in judged:
        x = j.first
        best = [r.variant.name for r in (x.best_p99(), x.best_served()) if r is not None]
        shown = [*DEFAULTS, *peers, *best, "greedy", *top]
        shown += [v.name for v in (x.runs[n].variant for n in x.runs) if v.role == "extra"]
        lines += [f"### {j.scenario.name}: {describe(j.scenario)}", "",
                  *report.scenario_table(x, list(dict.fromkeys(shown))), ""]  # fmt: skip
    lines.append("Totals: " + "; ".join(totals) + ".")
    return lines


def describe(s: Scenario) -> str:
    if s.kind == "open":
        what = f"{s.shape}, {s.rate:.0f} req/s"
        if s.shape == "onoff":
            what += f" ({s.on * 1e3:g} ms on in every {(s.on + s.off) * 1e3:g})"
    elif s.kind == "closed":
        what = f"{s.clients} clients, think " + (f"exponential {s.think * 1e3:g} ms" if s.think else "0")
    else:
        what = f"Poisson {s.rate:.0f} req/s + {s.clients} clients, think 0"
    return what + (f"; {s.keys} keys, Zipf {s.zipf}" if s.keys else "")


def _values(variants: list[Variant], name: str) -> list[float]:
    """The values the variants give keyword ``name`` (those that give it)."""
    return sorted({x for x in (_kw(v, name) for v in variants) if not math.isnan(x)})


def _kw(v: Variant, name: str) -> float:
    for part in v.kwargs.split(","):
        key, _, value = part.partition("=")
        if key.strip() == name:
            return float(value)
    return math.nan
