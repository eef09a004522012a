"""``python -m benchmarks.admission`` (``make bench-admission``): what gets in, measured (issue 46). Early refusal
(``refuse_late``) and single flight (``dedup_key``) on the simulated server past saturation
(:mod:`benchmarks.admission.overload`), and a server's memory under 10 MB items with ``max_queue_weight``
(:mod:`benchmarks.admission.memory`); writes ``reports/admission.md``. ``--quick``: shorter runs."""

from __future__ import annotations

import argparse
import platform
import time
from datetime import UTC, datetime
from pathlib import Path

from benchmarks.policy import costs as costs_file
from benchmarks.provenance import regenerated_by, revision

from .memory import measure
from .overload import Outcome, Traffic, model_bound, run

ROOT = Path(__file__).resolve().parents[2]
LOADS = (1.1, 1.3, 2.0)
#: The targets of issue 46.
GOODPUT_RATIO, LATE_SHARE, ROWS_PER_REQUEST = 1.5, 0.01, 0.55


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.admission", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="4 virtual seconds a run instead of 12, 2 s of memory")
    p.add_argument("--out", type=Path, default=ROOT / "reports" / "admission.md")
    args = p.parse_args(argv)
    started = time.monotonic()
    command = "python -m benchmarks.admission" + (" --quick" if args.quick else "")
    duration, warmup = (4.0, 1.0) if args.quick else (12.0, 2.0)
    measured = costs_file.load(costs_file.COSTS)
    costs = model_bound(measured)
    size = 64
    capacity = size / (costs.model_a + costs.model_b * size)
    base = {"max_batch_size": size, "max_queue_time": 0, "max_queue_size": 4096}
    variants = {
        "deadline not told": {**base, "tell_deadline": False},
        "timeout=": base,
        "timeout= and refuse_late": {**base, "refuse_late": True},
    }
    lines = [
        "# What gets in: early refusal, single flight, a queue bounded by weight (`make bench-admission`)",
        "",
        regenerated_by("bench-admission", command, "ADMISSION_ARGS"),
        "",
        f"- Date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; revision {revision()}; {platform.machine()}, Python "
        f"{platform.python_version()}",
        f"- Simulated runs: {duration:g} virtual seconds each, the first {warmup:g} s not counted; seeded (the same "
        "numbers every run).",
        "",
        "## Early refusal past saturation (simulated server)",
        "",
        "The dispatch simulator's server (`benchmarks/policy/sim`: the measured event-loop costs of the HTTP "
        "benchmark's app, uvloop's millisecond clock) with a model that binds: a batch of n rows takes "
        f"{costs.model_a * 1e3:g} ms + {costs.model_b * 1e3:g} ms·n (jitter {costs.jitter:.2f}), batches of at most "
        f"{size}: capacity {capacity:.0f} requests a second. Poisson arrivals at 110, 130 and 200 % of it; each client "
        "gives up 100 ms after it sent, and tells the server (the handler calls `process(item, timeout=left)`; "
        "`deadline not told`: `process(item)`). Goodput: results that reach their client within 100 ms, a second. "
        "Ratio: to `timeout=`'s goodput. Late: answers of any kind (results, 503s, 504s) that reach their client "
        "after its 100 ms. "
        "`benchmarks/admission/overload.py`.",
        "",
        "| load | variant | goodput (/s) | ratio |  late | refused (503) | timed out (504) | rows/request |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    verdicts = []
    for load in LOADS:
        traffic = Traffic(rate=load * capacity, duration=duration, warmup=warmup)
        outs = {name: run(costs, traffic, kwargs) for name, kwargs in variants.items()}
        reference = outs["timeout="].goodput
        for name, o in outs.items():
            ratio = o.goodput / reference if reference else float("inf")
            lines.append(
                f"| {load:.0%} | {name} | {o.goodput:.0f} | {_ratio(ratio)} | {o.late_share:.2%} | "
                f"{_share(o.refused, o)} | {_share(o.timed_out, o)} | {o.rows_per_request:.2f} |"
            )
        late = outs["timeout= and refuse_late"]
        ratio = late.goodput / reference if reference else float("inf")
        verdicts.append(
            f"- {load:.0%}: goodput {_ratio(ratio)} without refusal (target ≥ {GOODPUT_RATIO}x): "
            f"{_pass(ratio >= GOODPUT_RATIO)}; late {late.late_share:.2%} (target ≤ {LATE_SHARE:.0%}): "
            f"{_pass(late.late_share <= LATE_SHARE)}"
        )
    lines += ["", "Targets:", "", *verdicts, ""]
    lines += [
        "Without refusal, the queue holds 100 ms of arrivals past saturation: every item waits its client's whole "
        "timeout behind it and most time out (504), their rows computed for nobody when they time out in flight. "
        "With `refuse_late`, an item predicted to miss its deadline is refused at once (503, with the Retry-After "
        "the prediction gives), the queue stays short and what is admitted is answered in time.",
        "",
        "### The measured server: its event loop binds",
        "",
        f"The same, with the measured model ({measured.model_a * 1e3:.2f} ms + {measured.model_b * 1e6:.1f} µs·n, "
        f"batches of 256): capacity {measured.capacity(256):.0f} requests a second, bound by the event loop's CPU per "
        "request, not by the model.",
        "",
        "| load | variant | goodput (/s) | late | refused (503) | timed out (504) | loop busy |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    loop_base = {"max_batch_size": 256, "max_queue_time": 0, "max_queue_size": 4096}
    for load in (1.1, 2.0):
        traffic = Traffic(rate=load * measured.capacity(256), duration=duration, warmup=warmup)
        for name, kwargs in (("timeout=", loop_base), ("timeout= and refuse_late", {**loop_base, "refuse_late": True})):
            o = run(measured, traffic, kwargs)
            lines.append(
                f"| {load:.0%} | {name} | {o.goodput:.0f} | {o.late_share:.2%} | {_share(o.refused, o)} | "
                f"{_share(o.timed_out, o)} | {o.loop_busy:.0%} |"
            )
    lines += [
        "",
        "No admission rule helps there: requests wait in the event loop's own backlog (read, not yet handled) before "
        "they reach the batcher, which sees each one only when its time is already spent. Refusing early needs the "
        "queue to be the batcher's: a model that binds (a GPU, a remote call). A server whose loop binds needs its "
        "load shed before the loop reads it (a proxy's or uvicorn's `--limit-concurrency`), or more workers.",
        "",
        "## Single flight at a 50 % duplicate rate (simulated server)",
        "",
        "The model-bound server; each request, with probability 0.5, repeats one of the requests the server is still "
        "working on (read, not yet answered; a new request when there is none), else is a new one: half the "
        "requests are duplicates in flight. `dedup_key` returns the request. Rows/request: the rows the model "
        "computed over the requests sent; wrong: results that are not the request's own (the model echoes it). "
        "`refuse_late` on in both (past saturation, without it both time out).",
        "",
        "| load | variant | rows/request | goodput (/s) | late | wrong |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    dedup_verdicts = []
    for load in (0.5, 1.3):
        traffic = Traffic(rate=load * capacity, duration=duration, warmup=warmup, duplicates=0.5)
        outs = {}
        for name, kwargs in (
            ("timeout=", {**base, "refuse_late": True}),
            ("timeout= and dedup_key", {**base, "refuse_late": True, "dedup": True}),
        ):
            o = outs[name] = run(costs, traffic, kwargs)
            lines.append(
                f"| {load:.0%} | {name} | {o.rows_per_request:.3f} | {o.goodput:.0f} | {o.late_share:.2%} | {o.wrong} |"
            )
        d = outs["timeout= and dedup_key"]
        ok = d.rows_per_request <= ROWS_PER_REQUEST and d.wrong == 0 and outs["timeout="].wrong == 0
        dedup_verdicts.append(
            f"- {load:.0%}: {d.rows_per_request:.3f} rows a request (target ≤ {ROWS_PER_REQUEST}), every result the "
            f"request's own in both runs: {_pass(ok)}"
        )
    lines += ["", "Targets:", "", *dedup_verdicts, ""]
    item_mb, batch, limit_mb = 10, 4, 200
    runs = measure(item_mb=item_mb, batch=batch, limit_mb=limit_mb, seconds=2.0 if args.quick else 4.0)
    lines += [
        "## A queue bounded by weight: memory under 10 MB items (a real process)",
        "",
        f"A batcher that holds each batch (at most {batch} items) for 20 ms + 20 ms·n (`asyncio.sleep`), `item_weight` "
        f"the item's length; an open loop makes {item_mb} MB items (`bytes`, written) at twice its capacity and "
        "submits each, dropping it if refused. Peak: the process's resident memory above its level before the run, "
        "sampled every 5 ms. `benchmarks/admission/memory.py`.",
        "",
        "| setting | seconds | offered | answered | refused | peak (MB) | limit + one batch (MB) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        bound = "-" if r.limit_mb is None else f"{r.limit_mb + r.batch_mb:.0f}"
        lines.append(
            f"| `{r.label}` | {r.seconds:g} | {r.offered} | {r.answered} | {r.refused} | {r.peak_mb:.0f} | {bound} |"
        )
    bounded = runs[-1]
    assert bounded.limit_mb is not None
    lines += [
        "",
        f"Target: the peak under the limit plus one batch ({bounded.limit_mb + bounded.batch_mb:.0f} MB): "
        f"{_pass(bounded.peak_mb <= bounded.limit_mb + bounded.batch_mb)} ({bounded.peak_mb:.0f} MB). The weight is "
        "held until each call resolves, so the batches in flight count in it: the limit alone bounds what the "
        "batcher holds; the one batch is the allocator's slack. Without it, the queue (in items) grows as long as the "
        "overload lasts.",
        "",
        f"Took {time.monotonic() - started:.0f} s.",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


def _ratio(ratio: float) -> str:
    return "∞" if ratio == float("inf") else f"{ratio:.1f}x"


def _share(n: int, o: Outcome) -> str:
    total = o.answered + o.refused + o.timed_out
    return f"{n / total:.0%}" if total else "-"


def _pass(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


if __name__ == "__main__":
    main()
