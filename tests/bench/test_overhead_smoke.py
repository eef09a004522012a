"""Smoke test of the overhead benchmark: the worker runs ours and the floor on tiny sizes, in fresh
processes, on both loops, and the report is built from what came back. No peers (they need PyPI), no
assertion on speed: only that every run finished, checked its results and reports sane numbers.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.overhead import report, worker
from benchmarks.overhead.runner import Sizes, run_all, run_one, worker_args

pytestmark = pytest.mark.single_loop

TINY = Sizes(burst=600, steady_callers=40, steady_per_caller=3, bulk=1500, latency=50)
LOOPS = ["asyncio", "uvloop"]
IMPLS = ["direct", "floor", "ours"]


@pytest.fixture(scope="module")
def rows() -> list[dict[str, Any]]:
    python = Path(sys.executable)
    return run_all(IMPLS, list(worker.SHAPES), LOOPS, 1, TINY, dict.fromkeys(IMPLS, python))


def _expected_items(shape: str) -> int:
    return {
        "burst": TINY.burst,
        "steady": TINY.steady_callers * TINY.steady_per_caller,
        "bulk": TINY.bulk,
        "latency": TINY.latency,
    }[shape]


def test_every_run_finishes_and_checks_its_results(rows: list[dict[str, Any]]) -> None:
    # direct has no latency run of its own: the latency run times the direct call next to each batcher.
    assert len(rows) == len(IMPLS) * len(worker.SHAPES) * len(LOOPS) - len(LOOPS)
    errors = [r for r in rows if "error" in r]
    assert not errors, errors
    for r in rows:
        assert r["items"] == _expected_items(r["shape"]), r
        if r["loop"] == "uvloop":
            assert r["uvloop"], r
        if r["shape"] == "latency":
            assert r["direct_us"] > 0 and r["through_us"] > 0 and math.isfinite(r["added_us"]), r
            continue
        assert r["items_per_s"] > 0 and r["seconds"] > 0 and r["cpu_seconds"] > 0, r
        # Every item went through the batch function exactly once.
        assert r["batches"] * r["mean_batch"] == pytest.approx(r["items"]), r


def test_batchers_batch(rows: list[dict[str, Any]]) -> None:
    """600 items fit in three batches of at most 256; one-item batches would mean no batching at all."""
    for r in rows:
        if r["impl"] in ("floor", "ours") and r["shape"] in ("burst", "bulk"):
            assert 1 < r["mean_batch"] <= 256, r
            assert r["batches"] >= math.ceil(r["items"] / 256), r


def test_ours_is_this_repository(rows: list[dict[str, Any]]) -> None:
    versions = {r.get("version") for r in rows if r["impl"] == "ours"}
    assert versions and "0.2.2" not in versions, versions


def test_report_from_real_runs(rows: list[dict[str, Any]], tmp_path: Path) -> None:
    cells = report.aggregate(rows)
    targets = report.evaluate_targets(cells, LOOPS)
    by_what = {(t.what, t.loop): t for t in targets}
    # Everything but the comparison with async-batcher 0.2.2 (not installed here) was measured.
    for t in targets:
        assert (t.measured is None) == ("0.2.2" in t.what), t
        assert t.verdict in (("not measured",) if t.measured is None else ("PASS", "FAIL")), t
    assert by_what[("steady ≥ 0.8 x floor", "asyncio")].measured == pytest.approx(
        cells[("ours", "steady", "asyncio")].median / cells[("floor", "steady", "asyncio")].median
    )
    text = report.markdown(
        rows=rows,
        impls=IMPLS,
        loops=LOOPS,
        repeats=1,
        sizes_text="tiny",
        command="pytest",
        date="today",
        wiring={},
        missing={},
    )
    assert "## Targets" in text and "| ours |" in text and "Not measured" not in text
    report.write_csv(tmp_path / "overhead.csv", rows)
    lines = (tmp_path / "overhead.csv").read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("repeat,impl,version,shape,loop") and len(lines) == len(rows) + 1


@pytest.mark.parametrize("shapes", [list(worker.SHAPES), ["steady", "latency"]])
def test_chart_of_all_shapes_or_some(rows: list[dict[str, Any]], tmp_path: Path, shapes: list[str]) -> None:
    # The README's `--shapes steady` runs draw a chart with empty panels; the bulk panel's log scale must not
    # fail on them.
    cells = report.aggregate([r for r in rows if r["shape"] in shapes])
    report.write_png(tmp_path / "overhead.png", cells, IMPLS, LOOPS)
    assert (tmp_path / "overhead.png").read_bytes().startswith(b"\x89PNG")


def test_worker_rejects_wrong_results() -> None:
    worker._check([0, 2, 4], range(3))
    with pytest.raises(AssertionError, match="item 1 got result 4"):
        worker._check([0, 4, 2], range(3))
    with pytest.raises(AssertionError, match="2 results for 3 items"):
        worker._check([0, 2], range(3))


def test_worker_failure_is_reported_not_hidden() -> None:
    result = run_one(Path(sys.executable), [*worker_args("floor", "burst", "asyncio", TINY)[:-2], "--items", "0"])
    assert "error" in result and "must be at least 1" in result["error"]


def test_targets_verdicts() -> None:
    """The pass/fail arithmetic, on made-up medians."""
    cell = report.Cell

    def c(v: float) -> report.Cell:
        return cell(v, v, v, 1)

    cells = {
        ("floor", "steady", "asyncio"): c(100.0),
        ("ours", "steady", "asyncio"): c(80.0),  # exactly 0.8: passes
        ("async-batcher-0.2.2", "steady", "asyncio"): c(40.0),  # 2.0: fails
        ("floor", "burst", "asyncio"): c(100.0),
        ("ours", "burst", "asyncio"): c(89.0),  # fails
        ("ours", "bulk", "asyncio"): c(1_200_000.0),
        ("ours", "latency", "asyncio"): c(50.5),  # fails
    }
    verdicts = [(t.what.split(":")[0].split(" ≥")[0], t.verdict) for t in report.evaluate_targets(cells, ["asyncio"])]
    assert verdicts == [
        ("steady", "PASS"),
        ("steady", "FAIL"),
        ("burst", "FAIL"),
        ("process_many", "PASS"),
        ("single caller, max_queue_time=0", "FAIL"),
    ]
