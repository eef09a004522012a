"""The schedule: pyperf, one benchmark at a time, the implementations alternating in rounds.

pyperf runs all the processes of one benchmark in a row. On a shared machine a slow patch would then land on one
implementation, so the harness cuts each benchmark into rounds: a round runs every implementation's benchmark for
one (shape, event loop) with a few processes (``pyperf ... --append``), the order of the implementations rotating
from round to round. The first round lets pyperf calibrate the loops per value; later rounds reuse them
(``--loops``), so that all the values of a benchmark time the same amount of work.

Every implementation runs in its own interpreter (``pythons``): the peers' environments have pyperf too, and
pyperf's worker processes use the interpreter that runs the master (``sys.executable``, pyperf's ``--python``
default), so one pyperf script per environment is enough; the results are combined from the JSON files.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["FULL", "QUICK", "WORKER", "Plan", "Sizes", "bench_name", "run_all", "worker_args"]

WORKER = Path(__file__).with_name("worker.py")
# (implementation, shape) pairs with nothing to measure: async-batcher 0.2.2 has no bulk path; batched and
# aiodataloader (and the floor's variants) no plain function run in an executor.
NOT_APPLICABLE = {
    ("async-batcher-0.2.2", "bulk"),
    ("batched", "executor"),
    ("aiodataloader", "executor"),
    ("floor-async", "executor"),
    ("floor-task", "executor"),
}


@dataclass(frozen=True)
class Sizes:
    items: int  # steady and burst: items per run
    callers: int  # steady: callers, each awaiting items / callers items one after another
    bulk: int  # bulk: items in the one process_many list
    latency: int  # latency: items one caller awaits one at a time, per value
    executor: int = 5000  # executor: items one caller awaits one at a time, each a batch of one in a thread


@dataclass(frozen=True)
class Plan:
    """What to run and how much: pyperf's processes, values and warm-ups per round."""

    impls: list[str]
    shapes: list[str]
    event_loops: list[str]
    sizes: Sizes
    rounds: int = 3
    processes: int = 2  # pyperf -p, per round
    values: int = 2  # pyperf -n, per process
    warmups: int = 1  # pyperf -w, per process
    min_time: float = 0.1  # pyperf --min-time: the calibration's target seconds per value
    batch_size: int = 256
    wait: float = 0.001  # max_queue_time and its equivalents; the latency and executor shapes use 0


FULL = Sizes(items=20_000, callers=1000, bulk=20_000, latency=5000, executor=5000)
QUICK = Sizes(items=1000, callers=100, bulk=2000, latency=100, executor=100)


def bench_name(shape: str, event_loop: str) -> str:
    return f"{shape}-{event_loop}"


def worker_args(impl: str, shape: str, event_loop: str, plan: Plan) -> list[str]:
    """The worker's own arguments (without pyperf's)."""
    sizes = plan.sizes
    items = {
        "steady": sizes.items,
        "burst": sizes.items,
        "bulk": sizes.bulk,
        "latency": sizes.latency,
        "executor": sizes.executor,
    }[shape]
    wait = 0.0 if shape in ("latency", "executor") else plan.wait
    args = ["--impl", impl, "--shape", shape, "--event-loop", event_loop, "--items", str(items)]
    return [*args, "--callers", str(sizes.callers), "--batch-size", str(plan.batch_size), "--wait", repr(wait)]


def _loops_of(path: Path, name: str) -> int | None:
    """The loops per value of benchmark ``name`` in a pyperf file, once a round has calibrated them."""
    if not path.exists():
        return None
    import pyperf  # type: ignore[import-untyped,unused-ignore]

    suite = pyperf.BenchmarkSuite.load(str(path))
    if name not in suite.get_benchmark_names():
        return None
    runs = [run for run in suite.get_benchmark(name).get_runs() if run.values]
    return runs[0].get_loops() if runs else None


def _tail(text: str, lines: int = 3) -> str:
    return " | ".join(text.strip().splitlines()[-lines:]) or "no output"


def run_all(
    plan: Plan,
    pythons: dict[str, Path],
    out_dir: Path,
    record: Path,
    progress: Callable[[str], None] = lambda _: None,
    timeout: float = 600.0,
) -> dict[tuple[str, str, str], str]:
    """Run the plan; pyperf's JSON goes to ``out_dir/<impl>.json``. Returns the failures, by (impl, shape, loop).

    A benchmark that fails once is not run again in later rounds (its error would only repeat).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    failed: dict[tuple[str, str, str], str] = {}
    impls = [i for i in plan.impls if i in pythons]
    for rnd in range(plan.rounds):
        started = time.monotonic()
        order = impls[rnd % len(impls) :] + impls[: rnd % len(impls)] if impls else []
        for shape in plan.shapes:
            for event_loop in plan.event_loops:
                for impl in order:
                    key = (impl, shape, event_loop)
                    if key in failed or (impl, shape) in NOT_APPLICABLE:
                        continue
                    path = out_dir / f"{impl}.json"
                    cmd = [str(pythons[impl]), "-I", str(WORKER), *worker_args(impl, shape, event_loop, plan)]
                    cmd += ["--append", str(path), "--record", str(record), "--quiet"]
                    cmd += ["-p", str(plan.processes), "-n", str(plan.values), "-w", str(plan.warmups)]
                    cmd += ["--min-time", repr(plan.min_time)]
                    loops = _loops_of(path, bench_name(shape, event_loop))
                    if loops is not None:
                        cmd += ["--loops", str(loops)]
                    try:
                        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
                    except subprocess.TimeoutExpired:
                        failed[key] = f"timed out after {timeout:.0f} s"
                    else:
                        if proc.returncode != 0:
                            failed[key] = f"exit {proc.returncode}: {_tail(proc.stderr or proc.stdout)}"
                    if key in failed:
                        progress(f"{impl} {shape} {event_loop} failed: {failed[key]}")
        progress(f"round {rnd + 1}/{plan.rounds} done in {time.monotonic() - started:.0f} s")
    return failed
