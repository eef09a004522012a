"""The closed loop's paired rounds: the rounds of one run paired by connection count, several runs pooled, the
sign test and the target's factor counted (benchmarks/peers/report.py, ``python -m benchmarks.peers.paired``)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.openloop import report as open_report
from benchmarks.peers import report as peers_report
from benchmarks.peers.load import Step

ROOT = Path(__file__).resolve().parents[2]


def _step(variant: str, rnd: int, conns: int, rps: float, **changes: object) -> Step:
    step = Step(variant, rnd, conns, 10.0, int(rps * 10), rps, 1.0, 2.0, 3.0, 1.2, 9.0, 0, 0, 2.0, 95.0, 3.0, 50.0, 0.0)
    return dataclasses.replace(step, **changes)  # type: ignore[arg-type]


def test_ratios_pair_each_round_at_one_connection_count() -> None:
    steps = [
        _step("ours", 0, 1, 600.0), _step("batched", 0, 1, 300.0),
        _step("ours", 1, 1, 400.0), _step("batched", 1, 1, 500.0),
        _step("ours", 2, 1, 700.0),  # batched missed this round: no pair
        _step("batched", 3, 1, 450.0),  # ours missed this one
        _step("ours", 4, 1, 500.0), _step("batched", 4, 1, 0.0),  # served nothing: no ratio
        _step("ours", 0, 8, 900.0), _step("batched", 0, 8, 1000.0),  # another connection count
    ]  # fmt: skip
    assert peers_report.paired_ratios(steps, "ours", "batched", 1) == [2.0, 0.8]
    assert peers_report.paired_ratios(steps, "batched", "ours", 1) == [0.5, 1.25, 0.0]
    assert peers_report.paired_ratios(steps, "ours", "batched", 8) == [0.9]
    assert peers_report.paired_ratios(steps, "ours", "batched", 64) == []
    # Two runs' steps in one list would pair across runs: refused, naming the step.
    with pytest.raises(ValueError, match="two steps of ours in round 0 at 1 connections"):
        peers_report.paired_ratios([*steps, _step("ours", 0, 1, 1.0)], "ours", "batched", 1)


def test_rows_pool_runs_pairing_within_each() -> None:
    one = [
        _step("ours", 0, 1, 900.0), _step("async-batcher-0.2.2", 0, 1, 500.0), _step("cohort", 0, 1, 1000.0),
        _step("ours", 1, 1, 600.0), _step("async-batcher-0.2.2", 1, 1, 500.0), _step("cohort", 1, 1, 600.0),
    ]  # fmt: skip
    # The second run's round 0 must not pair with the first's: it has no 0.2.2 in round 0.
    two = [_step("ours", 0, 1, 400.0), _step("async-batcher-0.2.2", 1, 1, 500.0), _step("ours", 1, 1, 450.0)]
    rows = peers_report.paired_rows([one, two])
    assert rows == [
        # 1.8x, 1.2x, 0.9x: higher in 2 of 3, the 1.5x factor reached once.
        ["1", "ours", "async-batcher-0.2.2", "3", "1.20x (0.90-1.80)", "2 of 3", "1.00", "1 of 3"],
        # 0.9x and a tie: the tie tells neither, and the ceiling is no peer (no factor).
        ["1", "ours", "cohort", "2", "0.95x (0.90-1.00)", "0 of 1", "1.00", "n/a"],
    ]
    assert peers_report.paired_rows([one, two], against=["cohort"]) == rows[1:]
    assert peers_report.paired_rows([[_step("batched", 0, 1, 1.0), _step("cohort", 0, 1, 2.0)]]) == []  # none of ours


def test_the_sign_test_tells_a_run_that_always_wins_from_a_draw() -> None:
    steps = [s for r in range(9) for s in (_step("ours", r, 64, 1100.0 + r), _step("batched", r, 64, 1000.0))]
    steps += [s for r in range(8) for s in (_step("ours", r, 8, 1000.0 + (-1) ** r), _step("batched", r, 8, 1000.0))]
    rows = {row[0]: row for row in peers_report.paired_rows([steps])}
    assert rows["64"][5:] == ["9 of 9", "< 0.01", "9 of 9"]  # at 64 connections the factor is 1x
    assert rows["8"][5:] == ["4 of 8", "1.00", "0 of 8"]  # at 8 it is 1.5x


def test_the_report_section_pairs_with_the_peers_greedy_and_the_ceiling_only() -> None:
    steps = [
        _step(v, r, 8, rps)
        for r in range(2)
        for v, rps in (("ours", 1000.0), ("ours-hold", 900.0), ("batched", 800.0), ("cohort", 1100.0), ("none", 1.0))
    ]
    lines = peers_report.paired_section(steps)
    table = [line for line in lines if line.startswith("| 8 |")]
    assert [line.split(" | ")[1:3] for line in table] == [
        ["ours", "batched"], ["ours", "cohort"], ["ours-hold", "batched"], ["ours-hold", "cohort"]
    ]  # fmt: skip
    assert lines[0].startswith("## Closed loop, paired rounds")
    assert peers_report.paired_section([_step("batched", 0, 8, 1.0), _step("cohort", 0, 8, 1.0)]) == []


def test_the_closed_loop_csv_reads_back_as_written(tmp_path: Path) -> None:
    steps = [_step("ours", 0, 8, 1234.5678, items_per_call=None, hold_share=0.25), _step("cohort", 1, 8, 99.0)]
    path = tmp_path / "peers.csv"
    peers_report.write_csv(path, steps)
    back = peers_report.read_csv(path)
    assert back[0].items_per_call is None and back[0].hold_share == 0.25 and back[0].rps == 1234.5678
    assert back[1] == steps[1]
    assert open_report.read_rows(path, Step) == back


def test_the_paired_command_pools_runs_and_names_a_bad_file(tmp_path: Path) -> None:
    one = [_step("ours", 0, 1, 900.0), _step("batched", 0, 1, 450.0)]
    two = [_step("ours", 0, 1, 500.0), _step("batched", 0, 1, 1000.0)]
    for name, steps in (("one.csv", one), ("two.csv", two)):
        peers_report.write_csv(tmp_path / name, steps)
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.peers.paired", str(tmp_path / "one.csv"), str(tmp_path / "two.csv")],
        capture_output=True, text=True, timeout=60, check=True, cwd=ROOT,
    )  # fmt: skip
    assert "| 1 | ours | batched | 2 | 1.25x (0.50-2.00) | 1 of 2 | 1.00 | 1 of 2 |" in done.stdout.splitlines()
    # An open-loop report's CSV, or no file: an error naming it, not a traceback.
    (tmp_path / "open.csv").write_text("variant,round,shape\nours,0,poisson\n", encoding="utf-8")
    for bad in (tmp_path / "open.csv", tmp_path / "missing.csv"):
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.peers.paired", str(bad)],
            capture_output=True, text=True, timeout=60, check=False, cwd=ROOT,
        )  # fmt: skip
        assert done.returncode == 2 and f"{bad}: not a head-to-head's closed-loop steps" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr


def test_the_paired_command_refuses_two_runs_in_one_csv(tmp_path: Path) -> None:
    both = [_step("ours", 0, 1, 900.0), _step("batched", 0, 1, 450.0), _step("ours", 0, 1, 500.0)]
    peers_report.write_csv(tmp_path / "both.csv", both)
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.peers.paired", str(tmp_path / "both.csv")],
        capture_output=True, text=True, timeout=60, check=False, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 2 and "two steps of ours in round 0 at 1 connections" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
