"""Smoke test of the overhead benchmark on pyperf: the harness runs the direct call, the floor and ours on tiny
sizes, every shape, both event loops, through pyperf's master and worker processes; the report, CSV and chart are
built from what came back. No peers (they need PyPI), no assertion on speed: only that every benchmark ran, that
every value was checked, and that the numbers are sane.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.overhead import report, worker
from benchmarks.overhead.runner import Plan, Sizes, bench_name, run_all

pytestmark = pytest.mark.single_loop

TINY = Sizes(items=600, callers=40, bulk=1500, latency=50)
LOOPS = ["asyncio", "uvloop"]
IMPLS = ["direct", "floor", "ours"]
PLAN = Plan(
    impls=IMPLS,
    shapes=list(worker.SHAPES),
    event_loops=LOOPS,
    sizes=TINY,
    rounds=1,
    processes=1,
    values=2,
    min_time=0.002,
)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("overhead")
    record = out / "record.jsonl"
    failed = run_all(PLAN, dict.fromkeys(IMPLS, Path(sys.executable)), out / "raw", record)
    records = [json.loads(line) for line in record.read_text(encoding="utf-8").splitlines()]
    return {"out": out, "failed": failed, "cells": report.load(out / "raw", IMPLS), "records": records}


def test_every_benchmark_runs_and_every_value_is_checked(run: dict[str, Any]) -> None:
    assert run["failed"] == {}
    cells: dict[report.Key, report.Cell] = run["cells"]
    assert set(cells) == {(i, s, lp) for i in IMPLS for s in worker.SHAPES for lp in LOOPS}
    for (impl, shape, _), cell in cells.items():
        assert len(cell.values) == PLAN.processes * PLAN.values, (impl, shape, cell)
        assert all(v > 0 and math.isfinite(v) for v in cell.values)
        if impl != "ours":
            continue
        assert cell.version and cell.version != "0.2.2"  # this repository's package, not the one on PyPI
    # One record per value (warm-ups and calibration included), written after the worker checked every result.
    for r in run["records"]:
        items = {"bulk": TINY.bulk, "latency": TINY.latency}.get(r["shape"], TINY.items)
        assert r["checked"] == r["loops"] * items, r
        assert r["items"] == r["checked"], r  # every item went through the batch function exactly once
    per_bench = {(r["impl"], r["shape"], r["event_loop"]) for r in run["records"]}
    assert per_bench == set(cells)


def test_batchers_batch(run: dict[str, Any]) -> None:
    """600 items fit in three batches of at most 256; one-item batches would mean no batching at all."""
    batches = {(r["impl"], r["shape"]): r["items"] / r["batches"] for r in run["records"]}
    for impl in ("floor", "ours"):
        for shape in ("burst", "bulk"):
            assert 1 < batches[(impl, shape)] <= 256, (impl, shape)
    assert batches[("direct", "burst")] == 1.0


def test_a_second_round_appends_with_the_calibrated_loops(tmp_path: Path) -> None:
    plan = Plan(["ours"], ["steady"], ["asyncio"], TINY, rounds=2, processes=1, values=1, min_time=0.002)
    failed = run_all(plan, {"ours": Path(sys.executable)}, tmp_path, tmp_path / "record.jsonl")
    assert failed == {}
    import pyperf

    bench = pyperf.BenchmarkSuite.load(str(tmp_path / "ours.json")).get_benchmark(bench_name("steady", "asyncio"))
    runs = [r for r in bench.get_runs() if r.values]
    assert len(runs) == 2 and len({r.get_loops() for r in runs}) == 1


def test_report_chart_and_csv_from_real_runs(run: dict[str, Any], tmp_path: Path) -> None:
    cells = run["cells"]
    batches = report.load_batches(run["out"] / "record.jsonl")
    targets = report.evaluate_targets(cells, LOOPS)
    # Against the floor: measured; against the peers (not installed here): not.
    for t in targets:
        assert (t.measured is None) == ("floor" not in t.what), t
    steady = next(t for t in targets if t.what.startswith("steady ≥ 0.85") and t.loop == "asyncio")
    expected = cells[("floor", "steady", "asyncio")].mean / cells[("ours", "steady", "asyncio")].mean
    assert steady.measured == pytest.approx(expected)
    assert steady.interval is not None and steady.interval[0] <= steady.interval[1]
    text = report.markdown(
        cells=cells,
        batches=batches,
        impls=IMPLS,
        loops=LOOPS,
        out_dir=run["out"] / "raw",
        header=["test"],
        workload="tiny",
        wiring={},
        failures=[],
    )
    assert "## Targets" in text and "| ours |" in text and "Not measured" not in text
    assert "pyperf compare_to" in text and "compare_to failed" not in text
    report.write_csv(tmp_path / "overhead.csv", cells, batches)
    lines = (tmp_path / "overhead.csv").read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("impl,version,shape,event_loop,items_per_s") and len(lines) == len(cells) + 1
    for shapes in (list(worker.SHAPES), ["steady", "latency"]):  # a --shapes run has empty panels
        report.write_png(tmp_path / "overhead.png", {k: c for k, c in cells.items() if k[1] in shapes}, IMPLS, LOOPS)
        assert (tmp_path / "overhead.png").read_bytes().startswith(b"\x89PNG")


def test_worker_rejects_wrong_results() -> None:
    worker.check([0, 2, 4], range(3))
    with pytest.raises(AssertionError, match="item 1 got result 4"):
        worker.check([0, 4, 2], range(3))
    with pytest.raises(AssertionError, match="2 results for 3 items"):
        worker.check([0, 2], range(3))


def test_worker_failure_is_reported_not_hidden(tmp_path: Path) -> None:
    bad = Plan(["floor"], ["steady"], ["asyncio"], Sizes(items=601, callers=40, bulk=1, latency=1), rounds=1)
    failed = run_all(bad, {"floor": Path(sys.executable)}, tmp_path, tmp_path / "record.jsonl")
    assert "not a multiple of --callers" in failed[("floor", "steady", "asyncio")]


def test_targets_verdicts() -> None:
    """The pass/fail arithmetic, on made-up values (seconds per item: lower is faster)."""

    def c(v: float) -> report.Cell:
        return report.Cell((v, v), 1, 1, "")

    cells = {
        ("floor", "steady", "asyncio"): c(1.0),
        ("ours", "steady", "asyncio"): c(1 / 0.85),  # exactly 0.85x the floor: passes
        ("floor", "burst", "asyncio"): c(1.0),
        ("ours", "burst", "asyncio"): c(1 / 0.9),  # 0.9x: fails
        ("async-batcher-0.2.2", "steady", "asyncio"): c(2.0 / 0.85),  # 2.0x: fails
        ("aiodataloader", "steady", "asyncio"): c(1 / 0.85),  # level: not ahead, fails
    }
    verdicts = [t.verdict for t in report.evaluate_targets(cells, ["asyncio"])]
    assert verdicts == ["PASS", "FAIL", "FAIL", "FAIL", "not measured"]


def test_instruction_counts_are_per_item_and_repeatable() -> None:
    """The valgrind cross-check: the count of one run, twice, is the same to a fraction of a percent."""
    from benchmarks.overhead import instructions

    python = Path(sys.executable)
    first = instructions.per_item(python, "floor", "burst", 1000, 2, "asyncio", 0.0)
    again = instructions.per_item(python, "floor", "burst", 1000, 2, "asyncio", 0.0)
    assert 1_000 < first < 1_000_000
    assert again == pytest.approx(first, rel=0.02)
